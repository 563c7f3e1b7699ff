"""Objects by label, and label-selector semantics, for the checks and the pack's policies that ask
which nodes or namespaces a flavor or selector picks."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pulumi_policy.proxy import UnknownValueError


class LabelIndex:
    """Items by label: those whose labels hold given `key: value` pairs (a flavor's `nodeLabels`,
    a selector's `matchLabels`) without testing every item, in their order. One flavor per tenant
    tested against every node made the flavor checks quadratic in the fleet's size.

    `labels_of` is read once per item. An item whose labels cannot be listed (a value unknown
    during preview, which raises) is tested by `labels_of` on every query instead, as is every
    item for an unhashable wanted value (only such a value can equal an unhashable label, which
    is not indexed) or a None one (what an absent label reads as): the answer is always exactly
    `[i for i in items if all(labels_of(i).get(k) == v for k, v in wanted.items())]`."""

    def __init__(self, items: Iterable[Any], labels_of: Callable[[Any], Mapping[str, Any]]):
        self.items = list(items)
        self._labels_of = labels_of
        self._labels: list[Mapping[str, Any] | None] = []
        self._positions: dict[tuple[str, Any], set[int]] = defaultdict(set)
        self._unindexed: set[int] = set()
        for position, item in enumerate(self.items):
            try:
                labels: dict[str, Any] | None = dict(labels_of(item))
            except UnknownValueError:  # a value a preview cannot know: tested when a query reaches it
                labels = None
                self._unindexed.add(position)
            self._labels.append(labels)
            for pair in (labels or {}).items():
                if _hashable(pair[1]):
                    self._positions[pair].add(position)

    def labels(self, position: int) -> Mapping[str, Any]:
        """The labels of the item at `position` (read once, unless they could not be listed)."""
        labels = self._labels[position]
        return labels if labels is not None else self._labels_of(self.items[position])

    def positions(self, wanted: Mapping[str, Any]) -> list[int]:
        """Positions of the items whose labels hold every `wanted` pair, ascending."""
        pairs = list(wanted.items())
        if not all(value is not None and _hashable(value) for _, value in pairs):
            return [p for p in range(len(self.items)) if self._holds(p, pairs)]
        if not pairs:
            return list(range(len(self.items)))
        sets = sorted((self._positions.get(pair, set()) for pair in pairs), key=len)
        found = set(sets[0]).intersection(*sets[1:])
        return sorted(found | {p for p in self._unindexed if self._holds(p, pairs)})

    def matching(self, wanted: Mapping[str, Any]) -> list[Any]:
        """The items whose labels hold every `wanted` pair, in their order."""
        return [self.items[p] for p in self.positions(wanted)]

    def _holds(self, position: int, pairs: list[tuple[str, Any]]) -> bool:
        labels = self.labels(position)
        return all(labels.get(key) == value for key, value in pairs)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics (a null selector selects nothing, `{}` everything)."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True
