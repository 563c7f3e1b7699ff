"""`factory check` over the union of the library's objects and what its charts really produce.

Every Helm release is rendered by the real chart (`ai_factory.factory.rendering.charts`); the
objects it produces join the library's, and every check of `check.CHECKS` runs over the union:
chart objects validate against kubernetes-validate (core kinds) and the CRDs the charts ship
(preferred over the oracle directory's copy), release values against the chart's own values.yaml
and schema, and the isolation checks see the charts' pods, bindings and policies too.

What cannot run without the oracle directory, helm or the chart cache is skipped and named, one
line per check family with how to enable it (`Report.not_run`): the result is then "clean but
incomplete", never "clean".
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ai_factory.factory.checking import parallel
from ai_factory.factory.checking.check import checks, graph_findings, run_checks, run_index, unchecked_kinds, unchecked_values
from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.views import read_findings
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.heap import settled_heap
from ai_factory.factory.rendering.bundle import Rendered, cached_stack
from ai_factory.factory.rendering.cache import read_entry, write_entry
from ai_factory.factory.rendering.harness import Graph
from ai_factory.factory.rendering.charts import (
    ChartOutput,
    StoredOutput,
    chart_facts,
    chart_file,
    chart_manifests,
    extract_chart,
    read_stored,
    releases_of,
    template_in_cluster,
)


Step = Callable[[str, int], Callable[[], None]]


@dataclass
class Report:
    findings: list[Finding]
    objects: int
    """Objects checked: the library's and the charts'."""
    charts_rendered: int
    not_run: list[str] = field(default_factory=list)
    """One line per check family that could not run, with how to enable it."""


def check_environment(
    rendered: Rendered,
    upstream: Path | None,
    charts_dir: Path | None,
    helm: str | None,
    store: Path | None = None,
    step: Step | None = None,
    cache: Path | None = None,
    read_ahead: ReadAhead | None = None,
    found: Callable[[], Mapping[str, list[Finding]] | None] | None = None,
) -> Report:
    """`step` (progress): called to start each long step, with its description and size; it returns
    the callback to call once per unit done (`ai_factory.factory.progress.Steps.step`). `cache`:
    the check cache directory (`check.run_checks`), where a check of a render with its resource
    graph also lists the chart outputs it read (`ReadAhead`). `read_ahead`: what the check would
    read, read already. `found`: as `run_checks` takes it (`GraphChecks.found`)."""
    # The render left out of the collector's passes from the start: decoding the charts' stored
    # outputs set off full passes over it (a second of a one-tenant re-check at 1,000 tenants).
    with settled_heap():
        return _check_environment(rendered, upstream, charts_dir, helm, store, step, cache, read_ahead, found)


def _check_environment(
    rendered: Rendered,
    upstream: Path | None,
    charts_dir: Path | None,
    helm: str | None,
    store: Path | None,
    step: Step | None,
    cache: Path | None,
    read_ahead: ReadAhead | None,
    found: Callable[[], Mapping[str, list[Finding]] | None] | None,
) -> Report:
    oracles = Oracles(upstream)
    releases, _ = releases_of(rendered)
    not_run: list[str] = []
    outputs: list[ChartOutput] = []
    if helm is None:
        not_run.append("chart rendering: no helm binary (run `ai-factory charts install-helm`, set FACTORY_HELM or put helm on PATH)")
    elif charts_dir is None:
        not_run.append("chart rendering: no chart cache (run `ai-factory charts pull`, or pass --charts DIR / set FACTORY_CHARTS_DIR)")
    else:
        present = sum(chart_file(charts_dir, r.pin).is_file() for r in releases)
        on_chart = step("rendering charts", present) if step is not None else None
        outputs = template_in_cluster(releases, charts_dir, helm, rendered.kubernetes_version, store, on_chart=on_chart, read_ahead=read_ahead.outputs if read_ahead else None)
        if cache is not None and rendered.graph is not None:
            write_entry(
                _outputs_index(cache, cached_stack(rendered.graph)),
                {"outputs": [str(out.stored) for out in outputs], "charts": sorted({str(out.chart) for out in outputs})},
            )
        for r in releases:
            if not chart_file(charts_dir, r.pin).is_file():
                not_run.append(
                    f"chart rendering of {r.manifest.ref}: not rendered, {chart_file(charts_dir, r.pin).name} is not in {charts_dir} "
                    f"(run `ai-factory charts pull --charts {charts_dir}`)"
                )
    findings: list[Finding] = []
    for out in outputs:
        tenants = (out.release.manifest.tenant,) if out.release.manifest.tenant else ()
        if out.error is not None:
            findings.append(Finding("chart-render", out.release.manifest.ref, f"{out.chart.name} does not template: {out.error}", tenants))
        else:
            oracles.add_crds(out.chart.name, out.crds)
    for chart, pin in sorted({out.chart: out.release.pin for out in outputs}.items(), key=lambda item: item[0]):
        oracles.use_chart(pin.oracle_dir, extract_chart(chart, store), chart.name)
    union = Rendered(
        rendered.config,
        rendered.kubernetes_version,
        [*rendered.manifests, *chart_manifests(outputs)],
        rendered.inventory,
        rendered.graph,
        kustomizations=rendered.kustomizations,
        scopes=rendered.scopes,
    )
    on_check = step("checking", len(checks(union))) if step is not None else None
    state = oracle_digest(upstream, outputs) if cache is not None else ""
    findings += run_checks(union, oracles, on_check=on_check, cache=cache, oracle_state=state, known=read_ahead.findings if read_ahead else None, found=found)
    kinds = unchecked_kinds(union, oracles)
    if kinds:
        not_run.append(
            f"custom resources of kinds no chart ships a CRD for ({', '.join(kinds)}): no oracle directory "
            "(set FACTORY_UPSTREAM_DIR or pass --upstream; ../shared/upstream is the default)"
        )
    values = unchecked_values(union, oracles)
    if values:
        not_run.append(f"Helm values of {', '.join(values)}: neither the chart cache nor an oracle directory has the chart's values")
    return Report(sorted(set(findings)), len(union.manifests), sum(1 for out in outputs if out.error is None), not_run)


@dataclass
class ReadAhead:
    """What the latest check of some stacks read (their stored chart outputs, by file, and their
    check cache entries, by key): most of what the next check of them reads, read while its render's
    program runs (`render_clusters`' meanwhile) and taken from here instead of read again."""

    outputs: dict[Path, StoredOutput] = field(default_factory=dict)
    findings: dict[str, list[Finding]] = field(default_factory=dict)

    def read(self, cache: Path, stacks: Iterable[str], upstream: Path | None) -> None:
        """Read what the latest check of each of these stacks (`cached_stacks`) read, and find
        the facts of its chart packages and oracle directory (`chart_facts`, `upstream_digest`)."""
        outputs: list[Path] = []
        for stack in stacks:
            index = read_entry(_outputs_index(cache, stack))
            outputs += [Path(path) for path in _listed(index, "outputs")]
            for chart in _listed(index, "charts"):
                with contextlib.suppress(OSError):  # gone since: the check reports it
                    chart_facts(Path(chart))
            for key in _listed(read_entry(run_index(cache, stack)), "parts"):
                if (found := read_findings(cache, key)) is not None:
                    self.findings[key] = found
        self.outputs.update(read_stored(outputs))
        if upstream is not None:
            upstream_digest(upstream)


class GraphChecks:
    """The `GRAPH_ONLY` checks of each render, run in a process forked as soon as its resource graph
    is complete (`start`, render_clusters' `on_graph`): beside the rest of the render and of the
    check, where they were the longest unit of the fleet-wide checks (a second at 1,000 tenants).
    Used as a context manager: what is still running at its end is killed."""

    def __init__(self) -> None:
        self._running: dict[str, Callable[[], dict[str, list[Finding]] | None]] = {}
        self._forked = contextlib.ExitStack()

    def __enter__(self) -> GraphChecks:
        return self

    def __exit__(self, *exc: object) -> None:
        self._forked.close()

    def start(self, graph: Graph) -> None:
        self._running[cached_stack(graph)] = self._forked.enter_context(parallel.beside(functools.partial(graph_findings, graph)))

    def found(self, rendered: Rendered) -> Callable[[], dict[str, list[Finding]] | None] | None:
        """What gives the findings of the render's `GRAPH_ONLY` checks, by check name, once they
        are found (None from it: their process failed); None when they were not started."""
        return self._running.pop(cached_stack(rendered.graph), None) if rendered.graph is not None else None


def _listed(entry: Any, field_name: str) -> list[str]:
    """The names an index entry lists under `field_name` (none when it is absent or unreadable)."""
    listed = entry.get(field_name) if isinstance(entry, dict) else None
    return [name for name in listed if isinstance(name, str)] if isinstance(listed, list) else []


def _outputs_index(cache: Path, stack: str) -> Path:
    return cache / "chart-runs" / f"{stack}.json"


_upstream: dict[tuple[Path, tuple[tuple[str, int, int], ...]], str] = {}


def upstream_digest(upstream: Path) -> str:
    """Of every file of the oracle directory (names and contents): found once per process while
    its files stay as they were (names, sizes, modification times)."""
    files = sorted(p for p in upstream.rglob("*") if p.is_file())
    identity = (upstream, tuple((str(p.relative_to(upstream)), (s := p.stat()).st_size, s.st_mtime_ns) for p in files))
    if identity not in _upstream:
        sha = hashlib.sha256()
        for path in files:
            sha.update(f"{path.relative_to(upstream)}\0".encode() + path.read_bytes() + b"\0")
        _upstream[identity] = sha.hexdigest()
    return _upstream[identity]


def oracle_digest(upstream: Path | None, outputs: list[ChartOutput]) -> str:
    """What the oracles of a check know, as a digest: every file of the oracle directory (names
    and contents), each chart's package, and the rendered output of each release whose output
    ships CRDs or is an error (the others add no schema)."""
    sha = hashlib.sha256(upstream_digest(upstream).encode() if upstream is not None else b"")
    for chart in sorted({out.chart for out in outputs}):
        sha.update(f"{chart.name}\0{chart_facts(chart).digest}\0".encode())
    for out in sorted(outputs, key=lambda o: o.origin):
        sha.update(f"{out.origin}\0{out.digest if out.crds or out.error is not None else ''}\0".encode())
    return sha.hexdigest()
