"""Parts checked on every core (`factory/checking/parallel.py`): what forked workers give is what
this process alone gives, in the parts' order."""

from __future__ import annotations

import copy
import functools
import gc
import os
import signal
import sys
import time

import pytest

from ai_factory.factory.checking import parallel
from ai_factory.factory.checking.check import run_checks
from ai_factory.factory.rendering.bundle import Rendered
from tests.conftest import settled

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parts are checked in forked workers on Linux only")


def broken(rendered: Rendered) -> Rendered:
    """A copy with findings in a platform layer's part and in a tenant's."""
    clone = Rendered(rendered.config, rendered.kubernetes_version, copy.deepcopy(rendered.manifests), rendered.inventory, rendered.graph, kustomizations=rendered.kustomizations)
    quota = next(m for m in clone.manifests if m.kind == "ResourceQuota" and m.tenant == "team-01")
    quota.obj["spec"]["hardd"] = {}
    release = next(m for m in clone.manifests if m.kind == "HelmRelease" and m.tenant is None)
    release.obj["spec"]["values"]["notAValue"] = True
    return clone


def test_findings_checked_in_worker_processes_are_the_serial_ones(three_tenants, oracles, tmp_path, monkeypatch):
    rendered = broken(three_tenants[2])
    monkeypatch.setattr(parallel, "workers_for", lambda parts: 1)
    serial = run_checks(rendered, oracles, cache=tmp_path / "serial")
    assert {f.check for f in serial} >= {"schema", "helm-values"}
    assert {f.tenants for f in serial if f.check == "schema"} == {("team-01",)}
    monkeypatch.setattr(parallel, "workers_for", lambda parts: 3)
    assert run_checks(rendered, oracles, cache=tmp_path / "parallel") == serial
    stored = {p.relative_to(tmp_path / "parallel"): p.read_bytes() for p in (tmp_path / "parallel").rglob("*.json")}
    assert stored == {p.relative_to(tmp_path / "serial"): p.read_bytes() for p in (tmp_path / "serial").rglob("*.json")}


def test_results_come_back_in_the_parts_order_whoever_took_them(tmp_path):
    def work(i: int) -> tuple[int, int]:
        (tmp_path / str(i)).write_text("")
        return i * i, os.getpid()

    shared = parallel.Shared(range(20), work, workers=2)
    settled(lambda: len(list(tmp_path.iterdir())) == 20)  # the worker took every part: this process has not started
    results = shared.finish()
    assert [square for square, _ in results] == [i * i for i in range(20)]
    assert len({pid for _, pid in results} - {os.getpid()}) == 1


def test_each_result_is_reported_once_as_it_comes_back(tmp_path):
    def work(i: int) -> int:
        (tmp_path / str(i)).write_text("")
        return i

    shared = parallel.Shared(range(20), work, workers=2)
    settled(lambda: len(list(tmp_path.iterdir())) == 20)  # the worker took every part
    reported: list[int] = []
    assert shared.finish(on_done=reported.append) == list(range(20))
    assert sorted(reported) == list(range(20))
    reported.clear()
    assert parallel.Shared(range(20), lambda i: i, workers=1).finish(on_done=reported.append) == reported == list(range(20))


def test_a_failing_worker_fails_the_caller_with_its_traceback(tmp_path):
    caller = os.getpid()

    def work(i: int) -> int:
        if os.getpid() != caller:
            (tmp_path / "failed").write_text("")
            raise ValueError(f"part {i} is malformed")
        return i

    shared = parallel.Shared(range(5), work, workers=2)
    settled((tmp_path / "failed").exists)
    with pytest.raises(RuntimeError, match=r"(?s)a check worker failed:.*ValueError: part 0 is malformed"):
        shared.finish()


@pytest.mark.parametrize(
    "cores, parts, workers",
    [(2, 2 * parallel.PARALLEL_MIN_PARTS - 1, 1), (2, 2 * parallel.PARALLEL_MIN_PARTS, 2), (2, 10**4, 2), (1, 10**4, 1), (None, 10**4, 1)],
    ids=["too-few-parts-for-two", "enough-for-two", "one-per-core", "one-core", "cores-unknown"],
)
def test_each_process_gets_at_least_the_minimum_parts_and_a_core(monkeypatch, cores, parts, workers):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert parallel.workers_for(parts) == workers


def test_a_call_beside_runs_in_another_process_while_this_one_goes_on(tmp_path):
    def call() -> int:
        settled((tmp_path / "went-on").exists)  # returns only once this process went on
        return os.getpid()

    with parallel.beside(call) as result:
        (tmp_path / "went-on").write_text("")
        pid = result()
    assert pid not in (None, os.getpid())


def test_a_call_beside_runs_with_the_collector_off():
    assert gc.isenabled()
    with parallel.beside(gc.isenabled) as result:
        assert result() is False
    assert gc.isenabled()


def test_a_call_beside_is_reaped_once_its_result_is_read():
    with parallel.beside(os.getpid) as result:
        pid = result()
    with pytest.raises(ProcessLookupError):  # no zombie left behind
        os.kill(pid, 0)


def test_a_call_beside_that_fails_gives_none_for_the_caller_to_run_it():
    def call() -> int:
        raise ValueError("malformed")

    with parallel.beside(call) as result:
        assert result() is None


@pytest.mark.parametrize("platform, cores", [("darwin", 2), ("linux", 1), ("linux", None)], ids=["fork-unsafe", "one-core", "cores-unknown"])
def test_nothing_is_forked_beside_where_forking_is_unsafe_or_on_one_core(monkeypatch, platform, cores):
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    with parallel.beside(os.getpid) as result:
        assert result() is None


def test_a_call_beside_still_running_when_the_block_fails_is_killed(tmp_path):
    def call() -> None:
        (tmp_path / "pid.tmp").write_text(str(os.getpid()))
        os.replace(tmp_path / "pid.tmp", tmp_path / "pid")  # whole when it appears
        time.sleep(600)

    with pytest.raises(KeyError), parallel.beside(call):
        settled((tmp_path / "pid").exists)
        raise KeyError("the block failed")
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(int((tmp_path / "pid").read_text()), 0)


def write_pid(path, then=None) -> None:
    """Write this process's id to `path` (whole when it appears), then call `then`."""
    (path.parent / f"{path.name}.tmp").write_text(str(os.getpid()))
    os.replace(path.parent / f"{path.name}.tmp", path)
    if then is not None:
        then()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_call_beside_in_an_ahead_block_runs_in_the_process_forked_ahead_after_the_step_under_way(tmp_path):
    def warm() -> None:
        (tmp_path / "started").write_text("")
        settled((tmp_path / "went-on").exists)  # the block went on meanwhile
        write_pid(tmp_path / "warm")

    with parallel.ahead([warm]):
        settled((tmp_path / "started").exists)
        (tmp_path / "went-on").write_text("")
        with parallel.beside(functools.partial(os.path.exists, tmp_path / "warm"), ahead=True) as warmed_first, parallel.beside(os.getpid, ahead=True) as second:
            assert warmed_first() is True
            assert second() not in (None, os.getpid(), int((tmp_path / "warm").read_text()))  # forked when it came


def test_the_steps_of_the_warm_up_left_when_the_call_comes_are_left_to_it(tmp_path):
    def first() -> None:
        settled((tmp_path / "sent").exists)

    with parallel.ahead([first, functools.partial(write_pid, tmp_path / "second")]):
        with parallel.beside(os.getpid, ahead=True) as result:
            (tmp_path / "sent").write_text("")
            assert result() not in (None, os.getpid())
    assert not (tmp_path / "second").exists()


def test_the_process_forked_ahead_runs_the_first_call_beside(tmp_path):
    with parallel.ahead([functools.partial(write_pid, tmp_path / "warm")]):
        settled((tmp_path / "warm").exists)
        with parallel.beside(os.getpid, ahead=True) as result:
            pid = result()
    assert pid == int((tmp_path / "warm").read_text()) != os.getpid()
    assert gone(pid)


def test_only_a_call_beside_asking_for_the_process_forked_ahead_gets_it(tmp_path):
    with parallel.ahead([functools.partial(write_pid, tmp_path / "warm")]):
        settled((tmp_path / "warm").exists)
        with parallel.beside(os.getpid) as other, parallel.beside(os.getpid, ahead=True) as asking:
            pids = (other(), asking())
    spare = int((tmp_path / "warm").read_text())
    assert pids[1] == spare and pids[0] not in (None, spare, os.getpid())


def test_a_process_forked_ahead_that_no_call_took_is_killed_at_the_block_end(tmp_path):
    with parallel.ahead([functools.partial(write_pid, tmp_path / "warm", functools.partial(time.sleep, 600))]):
        settled((tmp_path / "warm").exists)
    assert gone(int((tmp_path / "warm").read_text()))


def test_a_call_the_process_forked_ahead_cannot_take_is_forked_when_it_comes(tmp_path):
    def unpicklable() -> int:  # a closure: not sent, forked
        return os.getpid()

    with parallel.ahead([functools.partial(write_pid, tmp_path / "warm")]):
        settled((tmp_path / "warm").exists)
        with parallel.beside(unpicklable, ahead=True) as result:
            pid = result()
    spare = int((tmp_path / "warm").read_text())
    assert pid not in (None, os.getpid(), spare) and gone(spare)


def fail(message: str) -> None:
    raise ValueError(message)


def test_a_step_of_the_warm_up_that_fails_leaves_its_process_to_go_on(tmp_path):
    with parallel.ahead([functools.partial(fail, "no warm-up"), functools.partial(write_pid, tmp_path / "warm")]):
        settled((tmp_path / "warm").exists)
        with parallel.beside(os.getpid, ahead=True) as result:
            assert result() == int((tmp_path / "warm").read_text()) != os.getpid()


def test_a_call_that_fails_in_the_process_forked_ahead_gives_none_for_the_caller_to_run_it():
    with parallel.ahead([]), parallel.beside(functools.partial(fail, "malformed"), ahead=True) as result:
        assert result() is None


@pytest.mark.parametrize("platform, cores", [("darwin", 2), ("linux", 1)], ids=["fork-unsafe", "one-core"])
def test_nothing_is_forked_ahead_where_forking_is_unsafe_or_on_one_core(monkeypatch, tmp_path, platform, cores):
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    with parallel.ahead([functools.partial(write_pid, tmp_path / "warm")]), parallel.beside(os.getpid, ahead=True) as result:
        assert result() is None
    assert not (tmp_path / "warm").exists()


def test_a_call_whose_process_forked_ahead_is_gone_is_forked_when_it_comes(tmp_path):
    with parallel.ahead([functools.partial(write_pid, tmp_path / "warm")]):
        settled((tmp_path / "warm").exists)
        spare = int((tmp_path / "warm").read_text())
        os.kill(spare, signal.SIGKILL)
        settled(lambda: os.waitid(os.P_PID, spare, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None)  # dead, not yet reaped
        with parallel.beside(os.getpid, ahead=True) as result:
            pid = result()
    assert pid not in (None, os.getpid(), spare) and gone(spare)
