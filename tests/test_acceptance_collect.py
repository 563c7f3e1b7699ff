"""Collecting the gate Jobs' results (`factory/acceptance/collect.py`): from the pods the dev
render's Jobs make, as the API lists them, to the results file and the verdicts; output that is
not the contract fails its gate with the reason; the Jobs' own scripts write the contract."""

from __future__ import annotations

import ast
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ai_factory.components import provisioning
from ai_factory.factory import cli
from ai_factory.factory.acceptance import collect, gates, nccl_tests
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.loading import validate
from tests.conftest import REPO, objects

DEV_RESULTS = gates.Results.model_validate(yaml.safe_load((REPO / "acceptance" / "dev-results.yaml").read_text()))
FINISHED = "2026-11-30T02:00:00Z"


@pytest.fixture(scope="module")
def cfg(dev_raw) -> FactoryConfig:
    return validate(dev_raw[0])


@pytest.fixture(scope="module")
def jobs(dev) -> list[dict]:
    return [j for j in objects(dev, "Job") if j["metadata"]["namespace"] == "ai-factory-acceptance"]


def message(gate: str, result: dict) -> str:
    return json.dumps({"schema": collect.CONTRACT, "gate": gate, "result": result})


def result_of(gate: str, node: str) -> dict | None:
    """What dev-results.yaml says the gate reported (its contract `result`)."""
    r = DEV_RESULTS.nodes.get(node)
    if r is None:
        return None
    if gate == "inventory":
        return {"driver": r.driver, "firmware": r.firmware, "gpus": [g.model_dump() for g in r.gpus],
                "nics": [n.model_dump() for n in r.nics or []]}
    found = {"dcgm-diag": r.dcgm_diag, "burn-in": r.burn_in, "nccl-node": r.nccl}[gate]
    return found.model_dump() if found else None


def pair_result(nodes: list[str]) -> dict | None:
    found = next((p for p in DEV_RESULTS.pairs if set(p.nodes) == set(nodes)), None)
    return {"busbw_gbps": found.busbw_gbps} if found else None


def pod(job: dict, index: int, phase: str = "Succeeded", text: str | None = None, exit_code: int = 0) -> dict:
    """A pod of the Job as the API lists it: the template's labels and annotations, the Job
    controller's labels and completion index, the kubelet's terminated state."""
    template = job["spec"]["template"]
    nodes = template["metadata"]["annotations"][gates.NODE_ANNOTATION].split(",")
    terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error", "finishedAt": FINISHED,
                  **({"message": text} if text is not None else {})}
    state = {"terminated": terminated} if phase in ("Succeeded", "Failed") else {"running": {"startedAt": FINISHED}}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"{job['metadata']['name']}-{index}-abcde", "namespace": job["metadata"]["namespace"],
            "labels": {**template["metadata"]["labels"], "batch.kubernetes.io/job-name": job["metadata"]["name"], "job-name": job["metadata"]["name"]},
            "annotations": {**template["metadata"]["annotations"], **({collect.COMPLETION_INDEX: str(index)} if len(nodes) > 1 else {})},
        },
        "spec": {**template["spec"], "nodeName": nodes[index]},
        "status": {"phase": phase, "containerStatuses": [{"name": template["spec"]["containers"][0]["name"], "state": state}]},
    }


def recorded_pods(jobs: list[dict]) -> list[dict]:
    """Every gate pod, ended with the message dev-results.yaml holds (none when it has no result)."""
    pods = []
    for job in jobs:
        gate = job["spec"]["template"]["metadata"]["labels"][gates.GATE_LABEL]
        nodes = job["spec"]["template"]["metadata"]["annotations"][gates.NODE_ANNOTATION].split(",")
        for index, node in enumerate(nodes):
            found = pair_result(nodes) if gate == "nccl-pair" else result_of(gate, node)
            pods.append(pod(job, index, text=message(gate, found)) if found is not None else pod(job, index, phase="Running"))
    return pods


def verdicts(cfg: FactoryConfig, pods: list[dict]) -> dict[str, gates.NodeVerdict]:
    current = {s.node.name: s.generation for s in gates.subjects(cfg)}
    return {v.node: v for v in gates.evaluate(cfg, collect.collect(pods, current))}


def outcome(v: gates.NodeVerdict, gate: str) -> gates.GateOutcome:
    return next(g for g in v.gates if g.gate == gate)


def test_the_dev_pods_give_the_verdicts_and_figures_of_the_results_file(cfg, jobs):
    from_file = {v.node: v for v in gates.evaluate(cfg, DEV_RESULTS)}
    from_pods = verdicts(cfg, recorded_pods(jobs))
    assert {n: (v.verdict, v.gates) for n, v in from_pods.items()} == {n: (v.verdict, v.gates) for n, v in from_file.items()}
    assert from_pods["gpu-h100-01"].verdict == "accepted"


def _edit(gate: str, node: str, *, phase: str = "Succeeded", text=None, exit_code: int = 0, result=None):
    """A change to the recorded pods: the gate's pod of that node ends otherwise."""
    def apply(pods: list[dict], jobs: list[dict]) -> list[dict]:
        job = next(j for j in jobs if j["spec"]["template"]["metadata"]["labels"][gates.GATE_LABEL] == gate
                   and node in j["spec"]["template"]["metadata"]["annotations"][gates.NODE_ANNOTATION].split(","))
        index = job["spec"]["template"]["metadata"]["annotations"][gates.NODE_ANNOTATION].split(",").index(node)
        body = text if text is not None else message(gate, result) if result is not None else None
        replaced = pod(job, index, phase=phase, text=body, exit_code=exit_code)
        return [replaced if p["metadata"]["name"] == replaced["metadata"]["name"] else p for p in pods]
    return apply


N2 = "gpu-h100-02"
GOOD_DIAG = {"level": 3, "passed": True}
MALFORMED = [
    # (case, edit, gate judged, status, reason fragment)
    ("no termination message", _edit("dcgm-diag", N2), "dcgm-diag", "failed", "no termination message"),
    ("not JSON", _edit("dcgm-diag", N2, text="PASS level 3"), "dcgm-diag", "failed", "is not JSON"),
    ("truncated at the kubelet's limit", _edit("dcgm-diag", N2, text=message("dcgm-diag", {**GOOD_DIAG, "failed_tests": ["x" * 100] * 50})),
     "dcgm-diag", "failed", "longer than 4096 bytes"),
    ("another contract version", _edit("dcgm-diag", N2, text=json.dumps({"schema": "v0", "gate": "dcgm-diag", "result": GOOD_DIAG})),
     "dcgm-diag", "failed", "termination message schema"),
    ("another gate's message", _edit("dcgm-diag", N2, text=message("burn-in", {"minutes": 60, "passed": True})), "dcgm-diag", "failed",
     "the burn-in gate's, the pod runs dcgm-diag"),
    ("a field out of bounds", _edit("dcgm-diag", N2, result={"level": 9, "passed": True}), "dcgm-diag", "failed", "result.level"),
    ("an unknown field", _edit("burn-in", N2, result={"minutes": 60, "passed": True, "extra": 1}), "burn-in", "failed", "extra"),
    ("a JSON list", _edit("nccl-node", N2, text="[]"), "nccl-node", "failed", "termination message"),
    ("a crashed pod", _edit("burn-in", N2, phase="Failed", exit_code=137), "burn-in", "failed", "exited 137 (Error), no termination message"),
    ("an inventory with a GPU index out of range", _edit("inventory", N2, result={"driver": "595.91.07", "gpus": [
        {"index": 99, "serial": "1", "pci_device_id": "0x233010DE", "ecc_mode": "enabled", "retired_pages": 0}]}), "ecc", "failed", "gpus.0.index"),
    ("an unreadable inventory fails the driver gate too", _edit("inventory", N2, text="oops"), "driver", "failed", "is not JSON"),
    ("a pair pod's unreadable output", _edit("nccl-pair", N2, text="{"), "nccl-pair", "failed", "no readable result"),
    # Not malformed: a gate that ran and failed says so in the contract.
    ("a failed diagnostic reported", _edit("dcgm-diag", N2, phase="Failed", exit_code=1, result={"level": 3, "passed": False}), "dcgm-diag", "failed",
     "failed"),
    ("a pod still running", _edit("dcgm-diag", N2, phase="Running"), "dcgm-diag", "not-run", "no result yet"),
]


@pytest.mark.parametrize(("edit", "gate", "status", "reason"), [r[1:] for r in MALFORMED], ids=[r[0] for r in MALFORMED])
def test_gate_output_that_is_not_the_contract_fails_its_gate(cfg, jobs, edit, gate, status, reason):
    found = verdicts(cfg, edit(recorded_pods(jobs), jobs))
    judged = outcome(found[N2], gate)
    assert (judged.status, reason in judged.reason) == (status, True), judged
    assert found[N2].verdict == ("failed" if status == "failed" else "pending")
    assert found["gpu-h100-01"].verdict == "accepted" or gate == "nccl-pair"


def test_an_unreadable_result_names_its_first_problem_and_counts_the_rest():
    assert collect.read_message("dcgm-diag", message("dcgm-diag", {"level": 9, "passed": "maybe"})) == (
        None, "termination message result.level: Input should be less than or equal to 4 (and 1 more)")
    assert collect.read_message("dcgm-diag", message("dcgm-diag", {"level": 9, "passed": True})) == (
        None, "termination message result.level: Input should be less than or equal to 4")
    assert collect.read_message("dcgm-diag", "[1]") == (None, "termination message (document): Input should be a valid dictionary or instance of Message")


def test_a_reason_is_bounded_like_the_results_file_field():
    _, reason = collect.read_message("burn-in", message("burn-in", {"minutes": 1, "passed": True, "x" * 3000: 1}))
    assert len(reason) == gates.MAX_REASON and reason.endswith("...")
    assert gates.NodeResult(generation="0" * 12, date=FINISHED, errors={"burn-in": reason}).errors["burn-in"] == reason


def test_a_dump_of_too_many_pods_is_refused(tmp_path):
    # An item without a kind is a pod (as in `kubectl get pods -o json`); the shortest item keeps
    # parsing tens of thousands of them cheap.
    (tmp_path / "pods.json").write_text(json.dumps({"items": [{}] * (collect.MAX_PODS + 1)}))
    with pytest.raises(gates.ResultsError, match=f"{collect.MAX_PODS + 1} pods, at most {collect.MAX_PODS}"):
        collect.load_pods(tmp_path / "pods.json", "pods.json")
    (tmp_path / "pods.json").write_text(json.dumps({"items": [{}] * collect.MAX_PODS}))
    assert len(collect.load_pods(tmp_path / "pods.json", "pods.json")) == collect.MAX_PODS


def test_a_pod_of_an_earlier_generation_does_not_count(cfg, jobs):
    pods = recorded_pods(jobs)
    for p in pods:
        if gates.GATE_LABEL in p["metadata"]["labels"] and p["metadata"]["annotations"][gates.NODE_ANNOTATION] == N2:
            p["metadata"]["annotations"][gates.GENERATION_LABEL] = "000000000000"
    assert verdicts(cfg, pods)[N2].verdict == "pending"


def test_the_collected_results_file_reads_back_as_the_same_results(cfg, jobs):
    current = {s.node.name: s.generation for s in gates.subjects(cfg)}
    pods = _edit("burn-in", N2, text="oops")(recorded_pods(jobs), jobs)
    collected = collect.collect(pods, current)
    text = collect.results_yaml(collected)
    assert collect.results_yaml(gates.Results.model_validate(yaml.safe_load(text))) == text
    assert gates.Results.model_validate(yaml.safe_load(text)) == collected
    assert collected.nodes[N2].errors == {"burn-in": "termination message is not JSON (Expecting value)"}


def test_gate_pods_carry_what_the_collector_files_them_under(jobs):
    for job in jobs:
        template = job["spec"]["template"]
        nodes = template["metadata"]["annotations"][gates.NODE_ANNOTATION].split(",")
        assert len(template["metadata"]["annotations"][gates.GENERATION_LABEL].split(",")) == len(nodes)
        assert template["spec"]["containers"][0]["terminationMessagePolicy"] == "File"


def test_accept_collects_pods_writes_the_results_file_and_refuses_a_bad_dump(tmp_path, monkeypatch, jobs, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pods.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": recorded_pods(jobs)}))
    stack = str(REPO / "Pulumi.dev.yaml")
    assert cli.main(["accept", stack, "--pods", "pods.json", "--write-results"]) == 0
    written = tmp_path / "acceptance" / "dev-results.yaml"
    assert gates.Results.model_validate(yaml.safe_load(written.read_text())).nodes.keys() == DEV_RESULTS.nodes.keys()
    (tmp_path / "bad.json").write_text(json.dumps({"kind": "Pod"}))
    assert cli.main(["accept", stack, "--pods", "bad.json"]) == 2
    err = capsys.readouterr().err
    assert "--pods bad.json: not a list of pods" in err and "Traceback" not in err
    assert cli.main(["accept", stack, "--pods", "pods.json", "--results", "x.yaml"]) == 2


# --------------------------------------------------------------------------- the Jobs' scripts


def _fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def run_script(script: str, tmp_path: Path, bin_dir: Path) -> tuple[int, str]:
    log = tmp_path / "termination-log"
    script = script.replace(provisioning.TERMINATION_LOG, str(log)).replace("/sys/class/infiniband", str(tmp_path / "ib"))
    done = subprocess.run(["sh", "-c", script], env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, capture_output=True, text=True, timeout=60)
    return done.returncode, log.read_text() if log.exists() else ""


@pytest.fixture
def bin_dir(tmp_path) -> Path:
    path = tmp_path / "bin"
    path.mkdir()
    return path


def test_the_inventory_script_writes_the_contract(tmp_path, bin_dir):
    _fake(bin_dir, "nvidia-smi", "printf '0, 1652324010000, 0x233010DE, Enabled, 0, 0, 0, 595.91.07\\n"
                                 "1, 1652324010001, 0x233010DE, Disabled, 2, 1, [N/A], 595.91.07\\n'\n")
    for nic, numa in (("ibp24s0", 0), ("ibp154s0", 1)):
        (tmp_path / "ib" / nic / "device").mkdir(parents=True)
        (tmp_path / "ib" / nic / "device" / "numa_node").write_text(f"{numa}\n")
    code, text = run_script(provisioning.INVENTORY_SCRIPT, tmp_path, bin_dir)
    result, error = collect.read_message("inventory", text)
    assert (code, error) == (0, None)
    assert result.driver == "595.91.07" and [(g.serial, g.ecc_mode, g.retired_pages) for g in result.gpus] == [
        ("1652324010000", "enabled", 0), ("1652324010001", "disabled", 3)]
    assert [(n.name, n.numa_node) for n in result.nics] == [("ibp154s0", 1), ("ibp24s0", 0)]


@pytest.mark.parametrize(("status", "passed"), [(0, True), (1, False)])
def test_the_dcgm_scripts_report_pass_or_fail_and_exit_with_it(cfg, tmp_path, bin_dir, status, passed):
    _fake(bin_dir, "dcgmi", f"echo '{{\"diag\": 1}}'; exit {status}\n")
    scripts = {j.gate: j.command[2] for j in provisioning.gate_jobs(cfg) if j.gate in ("dcgm-diag", "burn-in")}
    code, text = run_script(scripts["dcgm-diag"], tmp_path, bin_dir)
    assert code == status and collect.read_message("dcgm-diag", text) == (gates.DiagResult(level=3, passed=passed), None)
    code, text = run_script(scripts["burn-in"], tmp_path, bin_dir)
    result, error = collect.read_message("burn-in", text)
    assert (code, error, result.passed) == (status, None, passed) and result.minutes < 1


# --------------------------------------------------------------------------- the nccl-node program

NCCL_OUTPUTS = REPO / "tests" / "contracts" / "nccl-tests-2.13"


def run_program(command: tuple[str, ...], tmp_path: Path, binary: str) -> tuple[int, str, str]:
    """The Job's command, its binary and termination log moved into tmp_path."""
    log = tmp_path / "termination-log"
    program = command[2].replace(provisioning.TERMINATION_LOG, str(log))
    args = [binary if a == nccl_tests.BINARY else a for a in command[3:]]
    done = subprocess.run(["python3", "-I", "-c", program, *args], capture_output=True, text=True, timeout=60)
    return done.returncode, log.read_text() if log.exists() else "", done.stdout


def nccl_node_command(cfg) -> tuple[str, ...]:
    return next(j.command for j in provisioning.gate_jobs(cfg) if j.gate == "nccl-node" and j.nodes == (N2,))


def test_the_nccl_node_job_runs_the_images_nccl_tests_over_every_gpu_of_the_node(cfg):
    command = nccl_node_command(cfg)
    assert command[:2] == ("python3", "-c") and command[3:] == (
        "nccl-node", "150", "/opt/nccl-tests/build/all_reduce_perf", "-b", "256M", "-e", "256M", "-g", "8")
    # The standard library at the top; torch only inside the nccl-pair path (both images hold it).
    program = ast.parse(command[2])
    imported = {n.names[0].name for n in program.body if isinstance(n, ast.Import)}
    inside = {a.name.split(".")[0] for n in ast.walk(program) if isinstance(n, ast.Import) for a in n.names} - imported
    assert imported <= sys.stdlib_module_names and inside == {"torch"}
    assert not any(isinstance(n, ast.ImportFrom) for n in ast.walk(program))


@pytest.mark.parametrize(("fixture", "status", "code", "verdict", "figure", "reason"), [
    ("h100-nvswitch-8gpu.txt", 0, 0, "passed", "414.62 GB/s", ""),
    ("degraded-nvlink-8gpu.txt", 0, 1, "failed", "119.95 GB/s", "bus bandwidth 119.95 GB/s below 150"),
    ("nccl-failure.txt", 1, 1, "failed", "-", "no readable result: exited 1 (Error), the gate measured nothing: all_reduce_perf exited 1"),
], ids=["passes", "below-threshold", "failed-run"])
def test_the_nccl_node_job_gives_accept_the_figure_against_the_threshold(cfg, jobs, tmp_path, bin_dir, fixture, status, code, verdict, figure, reason):
    _fake(bin_dir, "all_reduce_perf", f"test \"$*\" = '-b 256M -e 256M -g 8' || exit 64; cat '{NCCL_OUTPUTS / fixture}'; exit {status}\n")
    exit_code, text, log = run_program(nccl_node_command(cfg), tmp_path, str(bin_dir / "all_reduce_perf"))
    assert exit_code == code and log.endswith(text + "\n") and "# Using devices" in log
    phase = "Succeeded" if code == 0 else "Failed"
    judged = outcome(verdicts(cfg, _edit("nccl-node", N2, phase=phase, text=text, exit_code=code)(recorded_pods(jobs), jobs))[N2], "nccl-node")
    assert (judged.status, judged.figure, judged.threshold) == (verdict, figure, ">= 150 GB/s (nvswitch)")
    assert reason in judged.reason


def test_accept_prints_the_collected_nccl_figure_against_the_threshold(cfg, jobs, tmp_path, monkeypatch, capsys):
    text, _ = nccl_tests.report("nccl-node", (NCCL_OUTPUTS / "degraded-nvlink-8gpu.txt").read_text(), 0)
    pods = _edit("nccl-node", N2, phase="Failed", text=text, exit_code=1)(recorded_pods(jobs), jobs)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pods.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
    assert cli.main(["accept", str(REPO / "Pulumi.dev.yaml"), "--pods", "pods.json", "--node", N2]) == 1
    out = capsys.readouterr().out
    assert "nccl-node  failed   119.95 GB/s" in out and ">= 150 GB/s (nvswitch)" in out and "bus bandwidth 119.95 GB/s below 150" in out
