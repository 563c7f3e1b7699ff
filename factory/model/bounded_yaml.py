"""YAML of stack files, read within bounds.

PyYAML shares an anchored node between its aliases, so a few hundred bytes of nested aliases
("billion laughs") load quickly into a small graph that every later walk (validation, JSON for the
engine) expands into billions of values. The document's size is therefore measured as if every
alias were expanded, on the composed node graph (each node's expanded size computed once), and a
document over `MAX_EXPANDED_NODES` is refused before anything is constructed. Nesting and file
size are bounded too, so no input reaches Python's recursion limit or fills memory.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

from ai_factory.factory.heap import no_cycle_collection

MAX_FILE_BYTES = 4 * 1024 * 1024
"""Largest stack file read (a fleet at every bound of `ai_factory.factory.model.config` fits in well under a MiB)."""
MAX_EXPANDED_NODES = 250_000
"""Most YAML nodes (scalars, sequences, mappings, map keys included) a document may hold once
every alias is expanded."""
MAX_DEPTH = 64
"""Deepest nesting of sequences and mappings (a stack file needs about 10)."""


class YamlBoundError(ValueError):
    """A document over a bound, or with a recursive alias."""


LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it: the same documents, parsed and composed
in C (five times faster on a stack or acceptance results file, which every program run reads)."""
LIBYAML_NESTING_PROBLEM = "exceeded maximum nesting depth"
_NODE_EVENTS = (yaml.ScalarEvent, yaml.AliasEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)
_COLLECTION_STARTS = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_COLLECTION_ENDS = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _check_nesting(text: str) -> None:
    """Refuse a document nested deeper than `MAX_DEPTH` nodes from its event stream, before
    anything composes it: PyYAML's own composer (where libyaml is missing) recurses in Python and
    would reach the recursion limit first, and libyaml stops only at its own 1,000 levels; the
    bound is reported as itself, at the line of the first node past it."""
    depth = 0  # collections open around the next node
    try:
        for event in yaml.parse(text, Loader=LOADER):
            if isinstance(event, _NODE_EVENTS):
                if depth >= MAX_DEPTH:
                    raise YamlBoundError(f"nested deeper than {MAX_DEPTH} levels (line {event.start_mark.line + 1})")
                depth += isinstance(event, _COLLECTION_STARTS)
            elif isinstance(event, _COLLECTION_ENDS):
                depth -= 1
    except yaml.MarkedYAMLError as err:
        # libyaml's scanner reads a run of flow collections ahead of its first event, and stops at
        # its own bound (1,000 levels), far past ours.
        if err.problem == LIBYAML_NESTING_PROBLEM and err.problem_mark is not None:
            raise YamlBoundError(f"nested deeper than {MAX_DEPTH} levels (line {err.problem_mark.line + 1})") from None
        raise


def expanded_size(root: yaml.Node) -> int:
    """The number of nodes of `root` with every alias expanded; `YamlBoundError` past the size or
    depth bound, or on a recursive alias. Each distinct node is measured once (its expanded size and
    height), so the cost is that of the graph, not of its expansion."""
    measured: dict[int, tuple[int, int]] = {}
    on_path: set[int] = set()

    def too_deep(node: yaml.Node) -> YamlBoundError:
        return YamlBoundError(f"nested deeper than {MAX_DEPTH} levels once its aliases are expanded (line {node.start_mark.line + 1})")

    def measure(node: yaml.Node, depth: int) -> tuple[int, int]:
        key = id(node)
        if key in measured:
            size, height = measured[key]
            if depth + height > MAX_DEPTH:
                raise too_deep(node)
            return size, height
        if depth > MAX_DEPTH:
            raise too_deep(node)
        if key in on_path:
            raise YamlBoundError(f"recursive alias (line {node.start_mark.line + 1}): a stack file is a tree")
        on_path.add(key)
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        size, height = 1, 1
        for child in children:
            child_size, child_height = measure(child, depth + 1)
            size, height = size + child_size, max(height, child_height + 1)
            if size > MAX_EXPANDED_NODES:
                raise YamlBoundError(
                    f"more than {MAX_EXPANDED_NODES} values once its aliases are expanded (line {node.start_mark.line + 1})"
                )
        on_path.discard(key)
        measured[key] = (size, height)
        return size, height

    return measure(root, 1)[0]


def load(text: str) -> Any:
    """One YAML document, safely, within the bounds above (`YamlBoundError`), or `yaml.YAMLError`."""
    if len(text) > MAX_FILE_BYTES:
        raise YamlBoundError(f"larger than {MAX_FILE_BYTES} bytes")
    # A tree (a recursive alias is refused): its nodes and values need no cycle collection, and the
    # collections their growth set off took a third of reading a 1,000-tenant stack file.
    with no_cycle_collection(), _composed(text) as (node, loader):
        return None if node is None else loader.construct_document(node)


def read(path: Path) -> Any:
    """`load` of a file, never reading more than the size bound."""
    return load(_read_text(path))


def compose(path: Path) -> yaml.Node | None:
    """The node graph of a file (positions included), within the same bounds as `load`."""
    with _composed(_read_text(path)) as (node, _):
        return node


@contextmanager
def _composed(text: str) -> Iterator[tuple[yaml.Node | None, yaml.SafeLoader]]:
    """The node graph of one document within the depth and size bounds, and its loader (to
    construct it with), disposed of when the block ends."""
    _check_nesting(text)
    loader = LOADER(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            expanded_size(node)
        yield node, loader
    finally:
        loader.dispose()


def _read_text(path: Path) -> str:
    with path.open("rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise YamlBoundError(f"larger than {MAX_FILE_BYTES} bytes")
    return data.decode("utf-8", errors="replace")
