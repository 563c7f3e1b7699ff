"""Work over a render's parts on every core: forked workers and this process each take the next
part not yet taken until none is left, and the results come back in the parts' order (what a
part gives does not depend on who took it, so the whole is the serial one).

A fork, not a fresh interpreter: the workers start with the render and the oracles already in
memory (shared until written), where a new process would import the library and receive every
part pickled. What the workers run must need nothing of this process but memory: pure Python
over the parts (the per-part checks), no thread, lock or open connection of the parent's. Where
`os.fork` is missing, or unsafe (macOS: system libraries may not survive it), everything runs
here. `beside` forks one call (a cached render's program) beside other work of this process;
`ahead` forks its process earlier, to import what the call needs while this one reads its input.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import select
import signal
import sys
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Generic, Iterable, Iterator, Sequence, TypeVar

from ai_factory.factory.heap import ending_process

Part = TypeVar("Part")
Result = TypeVar("Result")

PARALLEL_MIN_PARTS = 40
"""Parts per process below which the work stays in this one: a fork and its pages copied as the
worker writes (a part's reference counts) cost more than a few parts' checks."""

_INDEX = 8
"""Bytes of the shared next-part counter."""


def _forking() -> bool:
    return hasattr(os, "fork") and sys.platform.startswith("linux")


def _forking_beside() -> bool:
    """Whether a call may run in a process of its own beside this one: forking is safe and there
    is a second core."""
    return _forking() and (os.cpu_count() or 1) >= 2


def _fork() -> int:
    """`os.fork`, without Python 3.12's warning of forking a process that has other threads (a
    caller's): the child runs none of their code and needs none of their locks."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def workers_for(parts: int) -> int:
    """Processes to share `parts` parts between, this one included: one per core, each with at
    least `PARALLEL_MIN_PARTS`; one where forking is not safe."""
    if not _forking():
        return 1
    return max(1, min(os.cpu_count() or 1, parts // PARALLEL_MIN_PARTS))


@dataclass
class _Spare:
    """A process forked ahead (`ahead`): it reads its call from `memory` once `go` gives the
    call's length, and writes its result to `result`."""

    pid: int
    memory: int
    go: int
    result: int


_spares: list[_Spare] = []


@contextmanager
def ahead(warm_up: Iterable[Callable[[], object]]) -> Iterator[None]:
    """A process forked now that takes the steps of `warm_up` in order (imports what a later call
    needs) while this one goes on: the block's first `beside(..., ahead=True)` sends it its call,
    pickled, instead of forking then. The call starts as soon as it comes, after the step under
    way: the steps left are left to the call. Killed at the block's end if no call took it;
    nothing is forked where `beside` forks nothing."""
    if not _forking_beside():
        yield
        return
    memory = os.memfd_create("call")
    go_read, go_write = os.pipe()
    result_read, result_write = os.pipe()
    pid = _fork()
    if pid == 0:  # the spare: never returns into the caller's code
        try:
            os.close(go_write)
            os.close(result_read)
            ending_process()
            for step in warm_up:
                if select.select([go_read], [], [], 0)[0]:  # the call came, or the block ended
                    break
                with contextlib.suppress(Exception):  # a step that failed leaves the call to do it
                    step()
            length = int.from_bytes(os.read(go_read, _INDEX) or bytes(_INDEX), "little")
            if length:  # else the block ended without a call
                _answer(lambda: pickle.loads(os.pread(memory, length, 0))(), result_write)
        finally:
            os._exit(0)
    for fd in (go_read, result_write):
        os.close(fd)
    spare = _Spare(pid, memory, go_write, result_read)
    _spares.append(spare)
    try:
        yield
    finally:
        if spare in _spares:  # no call took it
            _spares.remove(spare)
            for fd in (memory, go_write, result_read):
                os.close(fd)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _answer(call: Callable[[], object], out: int) -> None:
    """A forked process's answer: its call's result pickled, nothing when the call failed (the
    caller runs it again and raises what it raises)."""
    try:
        outcome = pickle.dumps(call(), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:
        outcome = b""
    with os.fdopen(out, "wb") as pipe:
        pipe.write(outcome)


def _send(spare: _Spare, call: Callable[[], Result]) -> bool:
    """`call` given to a spare process; False (and the spare killed) when it cannot be pickled or
    the spare is gone."""
    try:
        payload = pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(os.dup(spare.memory), "wb") as memory:
            memory.write(payload)
        os.write(spare.go, len(payload).to_bytes(_INDEX, "little"))
        sent = True
    except Exception:  # what pickling raises (a closure, a lock...), or the spare's pipe closed
        sent = False
    os.close(spare.memory)
    os.close(spare.go)
    if not sent:
        os.close(spare.result)
        os.kill(spare.pid, signal.SIGKILL)
        os.waitpid(spare.pid, 0)
    return sent


@contextmanager
def beside(call: Callable[[], Result], ahead: bool = False) -> Iterator[Callable[[], Result | None]]:
    """`call` run in a process forked for it while this one does other work in the block; the
    function the block gets waits for its result. None when the forked call failed (the caller
    does it itself: its error is then raised as a serial run raises it), and on one core or
    where forking is not safe (then nothing is forked). A forked process still running when the
    block ends (the block failed) is killed. `ahead`: in an `ahead` block, the call goes to the
    process forked there (pickled: one that cannot be is forked here)."""
    if not _forking_beside():
        yield lambda: None
        return
    spare = _spares.pop() if ahead and _spares else None
    if spare is not None and _send(spare, call):
        pid, read = spare.pid, spare.result
    else:
        read, write = os.pipe()
        pid = _fork()
        if pid == 0:  # the forked process: never returns into the caller's code
            try:
                os.close(read)
                ending_process()
                _answer(call, write)
            finally:
                os._exit(0)
        os.close(write)
    joined = False

    def result() -> Result | None:
        nonlocal joined
        joined = True
        try:
            with os.fdopen(read, "rb") as pipe:
                data = pipe.read()
        finally:
            os.waitpid(pid, 0)
        return pickle.loads(data) if data else None

    try:
        yield result
    finally:
        if not joined:
            os.close(read)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


class Shared(Generic[Part, Result]):
    """`work` over `parts`: started (forked) on creation, `finish` does this process's share and
    returns every part's result in order. Start it before other work of this process (the
    fleet-wide checks) so that the workers run beside that too: this process joins in after."""

    def __init__(self, parts: Sequence[Part], work: Callable[[Part], Result], workers: int | None = None):
        self.parts, self.work = parts, work
        self.results: dict[int, Result] = {}
        # The next part to take, in memory the workers share, under a lock that is a pipe holding
        # one byte: whoever reads it holds the lock (no semaphore, no helper process).
        self._next = mmap.mmap(-1, _INDEX)
        self._lock_read, self._lock_write = os.pipe()
        os.write(self._lock_write, b".")
        self._workers: list[tuple[int, int]] = []  # (pid, read end of its result pipe)
        try:
            for _ in range(1, workers if workers is not None else workers_for(len(parts))):
                self._workers.append(self._fork())
        except BaseException:
            self._stop()
            raise

    def _fork(self) -> tuple[int, int]:
        read, write = os.pipe()
        pid = _fork()
        if pid == 0:  # the worker: never returns into the caller's code
            status = 1
            try:
                os.close(read)
                try:
                    outcome: tuple[bool, object] = (True, self._take_all())
                except BaseException:
                    outcome = (False, traceback.format_exc())
                with os.fdopen(write, "wb") as out:
                    pickle.dump(outcome, out, protocol=pickle.HIGHEST_PROTOCOL)
                status = 0
            finally:
                os._exit(status)
        os.close(write)
        return pid, read

    def _take(self) -> int | None:
        os.read(self._lock_read, 1)
        try:
            i = int.from_bytes(self._next[:_INDEX], "little")
            if i < len(self.parts):
                self._next[:_INDEX] = (i + 1).to_bytes(_INDEX, "little")
        finally:
            os.write(self._lock_write, b".")
        return i if i < len(self.parts) else None

    def _take_all(self, on_done: Callable[[int], None] | None = None) -> dict[int, Result]:
        done = {}
        while (i := self._take()) is not None:
            done[i] = self.work(self.parts[i])
            if on_done is not None:
                on_done(i)
        return done

    def finish(self, on_done: Callable[[int], None] | None = None) -> list[Result]:
        """`on_done`: called with each part's index once its result is here (progress): as this
        process does its own, then for each worker's when it has joined."""
        try:
            self.results.update(self._take_all(on_done))
            while self._workers:
                pid, read = self._workers[0]
                with os.fdopen(read, "rb") as result:
                    data = result.read()
                self._workers.pop(0)
                _, status = os.waitpid(pid, 0)
                ok, value = pickle.loads(data) if data else (False, f"exited with status {status} and no result")
                if not ok:
                    raise RuntimeError(f"a check worker failed:\n{value}")
                self.results.update(value)  # type: ignore[arg-type]
                for i in value if on_done is not None else ():  # type: ignore[union-attr]
                    on_done(i)
        finally:
            self._stop()
        return [self.results[i] for i in range(len(self.parts))]

    def _stop(self) -> None:
        """Workers still running (this process failed first) killed; the lock's pipe closed."""
        for pid, read in self._workers:
            os.close(read)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        self._workers = []
        os.close(self._lock_read)
        os.close(self._lock_write)
        self._next.close()
