"""Eviction of the render and check cache: what no stack's latest run refers to is removed.

Each render of a stack lists the units and the plan it used (`stacks/<project>.<stack>.json`,
written by `cache.UnitCache.store`) and each check of one lists the parts it used
(`check-runs/<project>.<stack>.json`, `check.run_checks`). After either, every unit or check
entry that no stack's list names is deleted: the cache holds one render and one check of each
stack, so it grows with the stacks and their size, never with the number of runs. A stack's
earlier states (another branch's tenants) are rendered and checked again when they come back.

An index that cannot be read keeps every entry of its kind (nothing is evicted on a guess). An
entry removed under a concurrent run of another stack is only rendered or checked again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable

from ai_factory.factory.rendering.cache import read_entry

ABANDONED_AFTER_S = 3600
"""A temporary file older than this is what an interrupted write left behind."""


def evict(directory: Path) -> int:
    """Delete the cache entries no stack's latest render or check refers to; how many were deleted."""
    removed = 0
    for entries, indexes, listed in (("units", "stacks", _units), ("plans", "stacks", _plan), ("checks", "check-runs", _parts)):
        keep = _referenced(directory / indexes, listed)
        if keep is not None:
            removed += _remove_unreferenced(directory / entries, keep)
    return removed


def _units(index: Any) -> Iterable[str]:
    return index["units"].values()


def _plan(index: Any) -> Iterable[str]:
    return [index["plan"]] if index["plan"] is not None else []  # None: the render was given its plan


def _parts(index: Any) -> Iterable[str]:
    return index["parts"]


def _referenced(indexes: Path, listed: Any) -> set[str] | None:
    """Every key the stacks' indexes name; None when one cannot be read."""
    keep: set[str] = set()
    for path in sorted(indexes.glob("*.json")):
        try:
            keep.update(str(key) for key in listed(read_entry(path)))
        except (KeyError, TypeError, AttributeError):
            return None
    return keep


def _remove_unreferenced(entries: Path, keep: set[str]) -> int:
    # The two-hex-digit folders stay: a concurrent write may be about to create a file in one.
    removed = 0
    now = time.time()
    for path in sorted(entries.glob("*/*")):
        try:
            stale = path.suffix == ".json" and path.stem not in keep
            if stale or path.suffix == ".tmp" and now - path.stat().st_mtime > ABANDONED_AFTER_S:
                path.unlink()
                removed += 1
        except FileNotFoundError:
            pass  # removed meanwhile by another run
    return removed
