"""Walks of objects as the checks and the pack's policies read them (plain values or CrossGuard's
proxies of a resource's inputs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Iterator


def maps_within(value: Any, skipped_key: str | None = None) -> Iterator[Mapping[str, Any]]:
    """Every map inside `value`, itself included, outermost first, in document order (not below
    `skipped_key`). A stack of the open maps' and lists' iterators, not a generator per value:
    each value is read when a recursion would read it, so a value unknown during preview raises
    where it would."""
    pending: list[Iterator[Any]] = [iter((value,))]
    while pending:
        for item in pending[-1]:
            if isinstance(item, Mapping):
                yield item
                pending.append(iter(item.values()) if skipped_key is None else (child for key, child in item.items() if key != skipped_key))
                break
            if isinstance(item, Sequence) and not isinstance(item, (str, bytes)):
                pending.append(iter(item))
                break
        else:
            pending.pop()
