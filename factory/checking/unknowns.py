"""CrossGuard's unknown-checking proxy, built as the pack reads it.

`pulumi_policy.proxy.unknown_checking_proxy` copies a resource's inputs whole into proxies before
any policy runs; offline that copy of every resource's inputs was most of the time the pack took
that no policy asked for (most policies read a resource's metadata, few its Helm values). The
proxy here answers every read exactly as CrossGuard's does: maps are `Mapping`s and lists
`Sequence`s (never `dict`/`list`), a value equal to one of the engine's unknown sentinels raises
`UnknownValueError` with CrossGuard's path and message where CrossGuard's raises it, a slice of a
list is a plain list of what CrossGuard's holds, and a nested map or list is the same object each
time it is read. It wraps a nested map or list on its first read, and never copies or changes the
inputs (an assignment through it, which the pack never makes, goes to a copy as CrossGuard's does).
"""

from __future__ import annotations

import operator
from collections.abc import ItemsView, Mapping, Sequence
from typing import Any, Iterator

from pulumi_policy.proxy import (
    UNKNOWN_ARCHIVE_VALUE,
    UNKNOWN_ARRAY_VALUE,
    UNKNOWN_ASSET_VALUE,
    UNKNOWN_BOOLEAN_VALUE,
    UNKNOWN_NUMBER_VALUE,
    UNKNOWN_OBJECT_VALUE,
    UNKNOWN_STRING_VALUE,
    UnknownValueError,
)

UNKNOWN_VALUES = frozenset(
    {UNKNOWN_BOOLEAN_VALUE, UNKNOWN_NUMBER_VALUE, UNKNOWN_STRING_VALUE, UNKNOWN_ARRAY_VALUE, UNKNOWN_ASSET_VALUE, UNKNOWN_ARCHIVE_VALUE, UNKNOWN_OBJECT_VALUE}
)
"""The sentinels CrossGuard reads as values unknown during preview (`pulumi_policy.proxy._is_unknown`)."""
_TARGET = "__target"
"""The key under which CrossGuard's proxies hand out what they wrap."""


def lazy_unknown_checking_proxy(props: Any) -> Any:
    """What `unknown_checking_proxy(props)` reads as, wrapping nested values on first read."""
    if isinstance(props, list):
        return _List(props, None)
    if isinstance(props, dict):
        return _Dict(props, None)
    return props


def _path(at: tuple | None, key: Any) -> list[str]:
    """The dotted path CrossGuard's error names: every key from the top, as strings."""
    parts = [str(key)]
    while at is not None:
        at, above = at
        parts.append(str(above))
    parts.reverse()
    return parts


class _Node:
    __slots__ = ("_target", "_at", "_children", "_assigned")

    def __init__(self, target: Any, at: tuple | None):
        self._target = target
        self._at = at
        """Where the value sits: (where its parent sits, its key), None at the top. Not the parent
        itself: a proxy tree without cycles is freed as soon as it is dropped, not by a collection."""
        self._children: dict[Any, _Node] | None = None
        self._assigned: set[Any] | None = None
        """Keys assigned through the proxy: CrossGuard keeps those values as given, unwrapped."""

    def _read(self, key: Any, value: Any) -> Any:
        """What CrossGuard's proxy gives for the value under `key`."""
        if isinstance(value, (list, dict)) and (self._assigned is None or key not in self._assigned):
            children = self._children
            if children is None:
                children = self._children = {}
            else:
                child = children.get(key)
                if child is not None:
                    return child
            child = children[key] = (_List if isinstance(value, list) else _Dict)(value, (self._at, key))
            return child
        if isinstance(value, str) and value in UNKNOWN_VALUES:
            raise UnknownValueError(value, _path(self._at, key))
        return value


_PLAIN = frozenset({int, float, bool, type(None)})
"""Types of values read as they are (the rest may be unknown, or are wrapped)."""
_ABSENT = object()


class _Dict(_Node, Mapping):
    __slots__ = ()

    # `get` and `items` are Mapping's, made without a call per value: the pack reads through them
    # most (a value read through `__getitem__` and `Mapping.get` was two calls).
    def get(self, key: Any, default: Any = None) -> Any:
        if key == _TARGET:
            return {k: self._read(k, v) if isinstance(v, (list, dict)) else v for k, v in self._target.items()}
        try:
            value = self._target[key]
        except KeyError:
            return default
        if type(value) in _PLAIN or type(value) is str and value not in UNKNOWN_VALUES:
            return value
        return self._read(key, value)

    def __getitem__(self, key: Any) -> Any:
        value = self.get(key, _ABSENT)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def items(self) -> ItemsView:
        return _Items(self)

    def __setitem__(self, key: Any, value: Any) -> None:
        if self._assigned is None:
            self._target, self._assigned = dict(self._target), set()  # the inputs stay as recorded
        self._target[key] = value
        self._assigned.add(key)

    def __len__(self) -> int:
        return len(self._target)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._target)


class _Items(ItemsView):
    __slots__ = ()

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        mapping = self._mapping
        for key, value in mapping._target.items():
            if type(value) in _PLAIN or type(value) is str and value not in UNKNOWN_VALUES:
                yield key, value
            else:
                yield key, mapping._read(key, value)


class _List(_Node, Sequence):
    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:
        target = self._target
        if key == _TARGET:
            return [self[i] for i in range(len(target))]
        if isinstance(key, slice):
            # CrossGuard's slice is a plain list of its element proxies and values, read unchecked.
            return [self._read(i, target[i]) if isinstance(target[i], (list, dict)) else target[i] for i in range(len(target))[key]]
        value = target[key]
        if isinstance(value, (list, dict)):
            index = operator.index(key)
            return self._read(index + len(target) if index < 0 else index, value)
        return self._read(key, value)

    def __len__(self) -> int:
        return len(self._target)

    def __iter__(self) -> Iterator[Any]:
        for i, value in enumerate(self._target):
            yield value if type(value) in _PLAIN or type(value) is str and value not in UNKNOWN_VALUES else self._read(i, value)


MAPPINGS = frozenset({dict, _Dict})
"""Types read as `Mapping`s (the offline proxy's and plain dicts) told by their type alone:
`isinstance(value, Mapping)` goes through the ABC's check, hundreds of thousands of times a run."""
SEQUENCES = frozenset({list, tuple, _List})
"""Types read as (non-text) `Sequence`s, told by their type alone (see `MAPPINGS`)."""
