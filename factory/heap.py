"""The cyclic garbage collector, held off where a process builds or reads large data that holds no
reference cycle: reference counting frees such data alone, and the collector's full passes over
every live container, set off by that growth, cost a large share of a render, a check or a bill."""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def no_cycle_collection(settle: bool = False) -> Iterator[None]:
    """The collector paused for the block: for building data with no reference cycles (decoded
    cache entries, a render's objects and files, a bill's samples). Its passes were about a sixth
    of a one-tenant re-render at 300 tenants, and a fifth of reading a usage export.

    `settle`: within a `settled_heap` block, what this block built joins the settled objects
    when it ends (else the first collection after it walked all of it: half a second for a
    1,000-tenant render's objects)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if settle and _settled:
            gc.freeze()
        if collecting:
            gc.enable()


_ending = False
"""Whether this process exits once its current call is done (`ending_process`)."""


def ending_process() -> None:
    """This process exits once the call it runs is done (a call forked beside another process, a
    render worker's share): the collector is off for good, and `collect_young` collects nothing.
    What the call allocates is freed with the process; a collection would only delay its result
    (the young collection that ends a program run was 0.09 s of the program forked beside a
    1,000-tenant re-render, its longest part)."""
    global _ending
    _ending = True
    gc.disable()


def collect_young() -> None:
    """Collect the young generations: what a block run with the collector off left of its cycles,
    before the process goes on (`ending_process`: nothing, it does not)."""
    if not _ending:
        gc.collect(1)


_settled = 0
"""How many `settled_heap` blocks are open (in any thread: the heap is the process's)."""
_settling = threading.Lock()


@contextmanager
def settled_heap() -> Iterator[None]:
    """Within this block the objects that exist when it opens (the render, the oracles) are left
    out of the collector's scans (`gc.freeze`): checks allocate millions of short-lived objects,
    and each full collection they set off walked the whole render again (a third of a warm
    check's time at 300 tenants). An object dropped meanwhile is still freed by its reference
    count (only a cycle waits); the objects are handed back to the collector when the outermost
    block closes."""
    global _settled
    with _settling:
        gc.freeze()
        _settled += 1
    try:
        yield
    finally:
        with _settling:
            _settled -= 1
            if not _settled:
                gc.unfreeze()
