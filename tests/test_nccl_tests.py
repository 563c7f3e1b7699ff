"""The NCCL gates' program (`factory/acceptance/nccl_tests.py`). `nccl-pair`: the bus bandwidth of
its timed all-reduces, and the Job's command run as its two pods over gloo (torch's CPU build;
skipped without torch, required in CI). `nccl-node`: nccl-tests' output, in the
format v2.13 prints (`tests/contracts/nccl-tests-2.13/`), read into the gate result contract, and
the program run in-process over a fake `all_reduce_perf`. The Job's command itself, run as its
image runs it and collected through `accept --pods`, is tested in `tests/test_acceptance_collect.py`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ai_factory.components import provisioning
from ai_factory.factory.acceptance import collect, gates, nccl_tests
from ai_factory.factory.model.loading import validate
from tests.conftest import REPO

NCCL_OUTPUTS = REPO / "tests" / "contracts" / "nccl-tests-2.13"
HEALTHY = (NCCL_OUTPUTS / "h100-nvswitch-8gpu.txt").read_text()

READS = [
    # (case, all_reduce_perf output, its exit status, figure or None, reason fragment)
    ("a healthy node", HEALTHY, 0, 414.62, None),
    ("degraded NVLink: the figure, below the threshold", (NCCL_OUTPUTS / "degraded-nvlink-8gpu.txt").read_text(), 0, 119.95, None),
    ("wrong values found by the data check", (NCCL_OUTPUTS / "wrong-values-8gpu.txt").read_text(), 0, None, "found 48 wrong values"),
    ("a failed run", (NCCL_OUTPUTS / "nccl-failure.txt").read_text(), 1, None, "exited 1: .. gpu-h100-01 pid 42: Test failure common.cu:891"),
    ("no summary, exit 0", HEALTHY.split("# Out of bounds")[0], 0, None, "no '# Avg bus bandwidth' line"),
    ("a figure without the data check's line", HEALTHY.replace("# Out of bounds values : 0 OK\n", ""), 0, None, "no '# Out of bounds values' line"),
    ("garbage", "\x00\x01 segfault \ufffd\n" * 10, 0, None, "no '# Avg bus bandwidth' line"),
    ("no output", "", 0, None, "no '# Avg bus bandwidth' line"),
    ("a figure that is not a number", HEALTHY.replace(": 414.62", ": -nan"), 0, None, "is '-nan', not a figure in GB/s"),
    ("an infinite figure", HEALTHY.replace(": 414.62", ": inf"), 0, None, "is 'inf', not a figure"),
    ("a negative figure", HEALTHY.replace(": 414.62", ": -0.5"), 0, None, "is '-0.5', not a figure"),
    ("a figure too long to quote", HEALTHY.replace(": 414.62", ": " + "9" * 40), 0, None, f"is '{'9' * 32}', not a figure"),
    ("one wrong value", HEALTHY.replace("values : 0 OK", "values : 1 FAILED"), 0, None, "found 1 wrong values"),
    ("the last data check counts", (NCCL_OUTPUTS / "wrong-values-8gpu.txt").read_text() + HEALTHY, 0, 414.62, None),
    ("the last data check's count is told", HEALTHY + (NCCL_OUTPUTS / "wrong-values-8gpu.txt").read_text(), 0, None, "found 48 wrong values"),
    ("the last figure counts, even when it is none", HEALTHY + HEALTHY.replace(": 414.62", ": nan"), 0, None, "is 'nan'"),
    ("a figure past the bound", HEALTHY.replace(": 414.62", ": 100001"), 0, None, "is '100001', not a figure"),
    ("the bound itself", HEALTHY.replace(": 414.62", ": 100000"), 0, 100000.0, None),
    ("zero", HEALTHY.replace(": 414.62", ": 0"), 0, 0.0, None),
    ("a figure but a non-zero exit", HEALTHY, 139, None, "exited 139: #"),
    ("the last summary counts", HEALTHY + HEALTHY.replace(": 414.62", ": 12.5"), 0, 12.5, None),
    ("an older nccl-tests, no '#'", HEALTHY.replace("# Out of", " Out of").replace("# Avg", " Avg"), 0, 414.62, None),
]


@pytest.mark.parametrize(("output", "status", "figure", "reason"), [r[1:] for r in READS], ids=[r[0] for r in READS])
def test_the_nccl_node_program_reads_the_figure_of_nccl_tests_or_says_why_not(output, status, figure, reason):
    text, value = nccl_tests.report("nccl-node", output, status)
    result, error = collect.read_message("nccl-node", text)
    assert value == figure and (result.busbw_gbps if result else None) == figure
    assert (error is None) == (reason is None) and (reason is None or "the gate measured nothing: " in error and reason in error), error
    assert len(text.encode()) <= collect.MAX_MESSAGE


def test_a_long_reason_is_cut_to_fit_the_termination_message():
    text, _ = nccl_tests.report("nccl-node", "x" * 100_000, 1)
    error = json.loads(text)["error"]
    assert len(error) == nccl_tests.MAX_ERROR and error.endswith("...") and len(text) < collect.MAX_MESSAGE
    fits = "x" * (nccl_tests.MAX_ERROR - len("all_reduce_perf exited 1: "))
    assert json.loads(nccl_tests.report("nccl-node", fits, 1)[0])["error"] == "all_reduce_perf exited 1: " + fits



def test_a_message_holds_a_result_or_an_error_not_both():
    both = json.dumps({"schema": collect.CONTRACT, "gate": "nccl-node", "result": {"busbw_gbps": 1}, "error": "x"})
    neither = json.dumps({"schema": collect.CONTRACT, "gate": "nccl-node"})
    assert [collect.read_message("nccl-node", m)[1] for m in (both, neither)] == [
        "termination message (document): Value error, exactly one of result and error"] * 2




def _binary(tmp_path: Path, output: str, status: int = 0) -> str:
    (tmp_path / "out.txt").write_text(output)
    path = tmp_path / "all_reduce_perf"
    path.write_text(f"#!/bin/sh\ntest \"$*\" = '-g 8' || exit 64\ncat '{tmp_path / 'out.txt'}'\nexit {status}\n")
    path.chmod(0o755)
    return str(path)


RUNS = [
    # (case, output, exit status, minimum GB/s, the program's exit code, figure)
    ("meets the minimum", HEALTHY, 0, 150, 0, 414.62),
    ("at the minimum", HEALTHY, 0, 414.62, 0, 414.62),
    ("below the minimum", HEALTHY, 0, 414.63, 1, 414.62),
    ("no figure", "garbage\n", 0, 1, 1, None),
    ("the binary failed", HEALTHY, 1, 1, 1, None),
]


@pytest.mark.parametrize(("output", "status", "minimum", "code", "figure"), [r[1:] for r in RUNS], ids=[r[0] for r in RUNS])
def test_the_program_writes_the_message_prints_the_output_and_exits_with_the_verdict(tmp_path, monkeypatch, capsys, output, status, minimum, code, figure):
    monkeypatch.setattr(nccl_tests, "TERMINATION_LOG", str(tmp_path / "termination-log"))
    assert nccl_tests.main(["nccl-node", str(minimum), _binary(tmp_path, output, status), "-g", "8"]) == code
    written = (tmp_path / "termination-log").read_text()
    result, _ = collect.read_message("nccl-node", written)
    assert (result.busbw_gbps if result else None) == figure
    assert capsys.readouterr().out == output + "\n" + written + "\n"


def test_the_program_keeps_the_end_of_a_huge_output(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(nccl_tests, "TERMINATION_LOG", str(tmp_path / "termination-log"))
    noise = "gpu-h100-01:42:42 [0] NCCL INFO Channel 00/32 : 0 1 2 3 4 5 6 7 via P2P/CUMEM\n"
    huge = noise * (3 * nccl_tests.MAX_OUTPUT // len(noise)) + HEALTHY
    assert nccl_tests.main(["nccl-node", "150", _binary(tmp_path, huge), "-g", "8"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(huge[-nccl_tests.MAX_OUTPUT:] + "\n") and len(printed) < nccl_tests.MAX_OUTPUT + collect.MAX_MESSAGE
    assert collect.read_message("nccl-node", (tmp_path / "termination-log").read_text()) == (gates.NcclResult(busbw_gbps=414.62), None)


def test_the_program_reports_a_binary_it_cannot_run(tmp_path, monkeypatch):
    monkeypatch.setattr(nccl_tests, "TERMINATION_LOG", str(tmp_path / "termination-log"))
    assert nccl_tests.main(["nccl-node", "1", str(tmp_path / "missing"), "-g", "8"]) == 1
    assert collect.read_message("nccl-node", (tmp_path / "termination-log").read_text())[1] == (
        f"the gate measured nothing: all_reduce_perf exited 127: cannot run {tmp_path / 'missing'}: No such file or directory")


# --------------------------------------------------------------------------- the nccl-pair program

MIB_256 = 256 << 20


@pytest.fixture(scope="module")
def dev_cfg(dev_raw):
    return validate(dev_raw[0])


def pair_command(cfg) -> tuple[str, ...]:
    return next(j.command for j in provisioning.gate_jobs(cfg) if j.gate == "nccl-pair")


def test_the_nccl_pair_job_meets_at_rank_0_of_its_job_over_nccl_at_nccl_nodes_message_size(dev_cfg):
    job = next(j for j in provisioning.gate_jobs(dev_cfg) if j.gate == "nccl-pair")
    assert job.command[:3] == ("python3", "-c", provisioning.NCCL_NODE_PROGRAM) and job.command[3:] == (
        "nccl-pair", "100", "nccl", f"{job.name}-0.{job.name}", "29500", str(MIB_256), "2", "8", "1800")
    assert job.image == dev_cfg.layers.provisioning.acceptance.images.nccl_allreduce and job.env == {}
PAIR_FIGURES = [
    # (case, bytes, mean seconds of the slowest rank, ranks, wrong values, figure or None, reason fragment)
    ("16 ranks: algbw scaled by 2(n-1)/n", MIB_256, 0.004, 16, 0, MIB_256 / 0.004 / 1e9 * 30 / 16, None),
    ("2 ranks: busbw is algbw", MIB_256, 0.004, 2, 0, MIB_256 / 0.004 / 1e9, None),
    ("wrong values from the data check", MIB_256, 0.004, 16, 3, None, "gave 3 wrong values"),
    ("no time", MIB_256, 0.0, 16, 0, None, "took 0.0 s, not a duration"),
    ("a negative time", MIB_256, -1.0, 16, 0, None, "took -1.0 s"),
    ("not a number", MIB_256, float("nan"), 16, 0, None, "took nan s"),
    ("forever", MIB_256, float("inf"), 16, 0, None, "took inf s"),
    ("faster than any link", MIB_256, 1e-9, 16, 0, None, "past 100000, not a measurement"),
]


@pytest.mark.parametrize(("size", "seconds", "ranks", "wrong", "figure", "reason"), [r[1:] for r in PAIR_FIGURES], ids=[r[0] for r in PAIR_FIGURES])
def test_the_pair_figure_is_nccl_tests_bus_bandwidth_of_the_slowest_rank(size, seconds, ranks, wrong, figure, reason):
    value, error = nccl_tests.pair_bus_bandwidth(size, seconds, ranks, wrong)
    assert value == pytest.approx(figure) if figure is not None else value is None
    assert (error is None) == (reason is None) and (reason is None or reason in error), error


@pytest.fixture
def torch():
    """torch's CPU build runs the pair program over gloo; CI installs it (FACTORY_REQUIRE_TORCH)."""
    try:
        import torch
    except ImportError:
        if os.environ.get("FACTORY_REQUIRE_TORCH"):
            pytest.fail("FACTORY_REQUIRE_TORCH is set but torch is not installed")
        pytest.skip("torch is not installed (pip install torch==2.13.0)")
    return torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pair_pods(command: tuple[str, ...], tmp_path: Path, indexes=(0, 1), **swap) -> list[tuple[int, str, str]]:
    """The Job's command run as its two pods would (completion indexes `indexes`), over gloo on this
    machine: its arguments swapped by name (`swap`), each pod's termination log in tmp_path."""
    names = ("gate", "minimum", "backend", "address", "port", "bytes", "nodes", "per_node", "timeout")
    args = dict(zip(names, command[3:], strict=True)) | {"backend": "gloo", "address": "127.0.0.1", "port": str(_free_port())} | swap
    pods = []
    for index in indexes:
        log = tmp_path / f"termination-log-{index}"
        program = command[2].replace(nccl_tests.TERMINATION_LOG, str(log))
        pods.append((log, subprocess.Popen([sys.executable, "-I", "-c", program, *args.values()], env={"JOB_COMPLETION_INDEX": str(index)},
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    done = []
    for log, pod in pods:
        out, _ = pod.communicate(timeout=120)
        done.append((pod.returncode, log.read_text() if log.exists() else "", out))
    return done


def test_the_pair_program_measures_an_all_reduce_across_both_pods(torch, dev_cfg, tmp_path):
    command = pair_command(dev_cfg)
    pods = _pair_pods(command, tmp_path, bytes=str(4 << 20), per_node="2", minimum="0.0001")
    figures = [collect.read_message("nccl-pair", text) for _, text, _ in pods]
    assert [code for code, _, _ in pods] == [0, 0] and all(error is None for _, error in figures), pods
    # One collective, timed by its slowest rank: both pods report the same figure.
    assert figures[0] == figures[1] and 0 < figures[0][0].busbw_gbps < 1000


def test_a_pair_figure_below_the_minimum_fails_the_job(torch, dev_cfg, tmp_path):
    pods = _pair_pods(pair_command(dev_cfg), tmp_path, bytes=str(1 << 20), per_node="1", minimum="99999")
    assert [code for code, _, _ in pods] == [1, 1] and all(collect.read_message("nccl-pair", t)[0] is not None for _, t, _ in pods)


def test_a_pod_whose_peer_never_comes_says_so(torch):
    port = _free_port()
    assert nccl_tests.pair(1, 2, 1, "gloo", "127.0.0.1", port, 4096, 6.0) == (None, (
        f"rank 1: DistNetworkError: The client socket has timed out after 2000ms while trying to connect to (127.0.0.1, {port})."))


def test_a_rank_0_that_does_not_resolve_is_waited_for_then_reported(torch):
    start = time.monotonic()
    assert nccl_tests.pair(1, 2, 1, "gloo", "rank-0.invalid", 1, 4, 1.0) == (None, "rank 0 at rank-0.invalid does not resolve: "
                                                                            f"{_resolve_error('rank-0.invalid')}")
    assert time.monotonic() - start >= 1.0


def _resolve_error(name: str) -> str:
    try:
        socket.getaddrinfo(name, None)
    except OSError as err:
        return str(err)
    raise AssertionError(f"{name} resolves")


def test_ranks_still_running_at_the_deadline_are_stopped_and_reported(torch, monkeypatch):
    monkeypatch.setattr(nccl_tests, "ITERATIONS", 10**9)
    assert nccl_tests.pair(0, 1, 2, "gloo", "127.0.0.1", _free_port(), 4096, 3.0) == (None, "2 of 2 ranks still running after 3 s")


def test_a_rank_that_dies_without_a_word_is_reported(torch, monkeypatch):
    monkeypatch.setattr(nccl_tests, "_all_reduce", lambda *args: os._exit(3))
    assert nccl_tests.pair(0, 1, 2, "gloo", "127.0.0.1", _free_port(), 4096, 30.0) == (
        None, "2 of 2 ranks ended without a result (exit codes [3])")


def test_an_image_without_torch_is_reported(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    assert nccl_tests.pair(0, 2, 8, "nccl", "127.0.0.1", 29500, 4096, 30.0) == (
        None, "cannot import torch.distributed: import of torch.distributed halted; None in sys.modules")


def test_the_ranks_of_one_pod_give_one_figure(torch):
    value, error = nccl_tests.pair(0, 1, 2, "gloo", "127.0.0.1", _free_port(), 1 << 16, 30.0)
    assert error is None and 0 < value < nccl_tests.MAX_BUSBW


@pytest.mark.parametrize(("minimum", "code"), [("0", 0), ("99999", 1)], ids=["meets the minimum", "below the minimum"])
def test_the_pair_program_writes_its_figure_and_exits_with_the_verdict(torch, tmp_path, monkeypatch, capsys, minimum, code):
    monkeypatch.setattr(nccl_tests, "TERMINATION_LOG", str(tmp_path / "termination-log"))
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "0")
    assert nccl_tests.main(["nccl-pair", minimum, "gloo", "127.0.0.1", str(_free_port()), str(1 << 16), "1", "2", "30"]) == code
    written = (tmp_path / "termination-log").read_text()
    result, error = collect.read_message("nccl-pair", written)
    assert error is None and 0 < result.busbw_gbps and capsys.readouterr().out == "\n" + written + "\n"
