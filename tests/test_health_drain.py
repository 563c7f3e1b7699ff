"""The health layer's remediation step (components/_gpu_remediation.py): its decision program on
recorded node, ResourceSlice and rule objects (the state machine, row by row), its script against a
kubectl that records what it is asked (a drain evicts and never deletes; a refused drain marks
nothing), and what dev renders for it (least privilege, the DRA rule template valid for the
cluster's Kubernetes). Runs the real jq; skipped without it except in CI (.ci/run installs it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes_validate import validate as validate_object

from ai_factory.components import _gpu_remediation as step
from ai_factory.components import health
from tests.conftest import one, render
from tests.test_device_layer import device_config

NOW = 1_800_000_000
MINUTE = 60
POOLS = {"train": {"limit": 1, "dra": False}, "big": {"limit": 2, "dra": False}, "dra": {"limit": 1, "dra": True, "gpus": 2}}
"""dra: two GPUs a node, one node at once: two quarantined GPUs take the whole blast radius."""


def jq() -> str:
    path = shutil.which("jq")
    if path is None:
        if os.environ.get("FACTORY_REQUIRE_UPSTREAM"):
            pytest.fail("FACTORY_REQUIRE_UPSTREAM is set but jq is missing (.ci/run installs it)")
        pytest.skip("jq is not installed; the remediation step's tests run its real decision program")
    return path


def stamp(seconds_ago: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(NOW - seconds_ago, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, pool: str, *, fault: str | None = None, since: int = 5 * MINUTE, pci: str = "0000:c6:00", ready: bool = True,
         marked: bool | str = False, drained: bool = False, cordoned: bool = False, quarantined: tuple[str, ...] = ()) -> dict:
    """A recorded Node; `marked` True is the step's annotation on a node it cordoned, a string the
    annotation's value; `quarantined` the devices whose quarantine condition is True."""
    conditions = [{"type": "Ready", "status": "True" if ready else "Unknown"}]
    if fault:
        conditions.append({"type": fault, "status": "True", "lastTransitionTime": stamp(since), "message": f"NVRM: Xid (PCI:{pci}): 79, pid=1101, name=python"})
    if drained:
        conditions.append({"type": "GpuDrained", "status": "True"})
    conditions += [{"type": f"{step.QUARANTINED}{d}", "status": "True"} for d in quarantined]
    metadata = {"name": name, "labels": {"ai-factory.io/pool": pool}}
    if marked:
        metadata["annotations"] = {step.DRAIN_ANNOTATION: step.DRAINING if marked is True else marked}
    return {"metadata": metadata, "spec": {"unschedulable": True} if cordoned or marked else {}, "status": {"conditions": conditions}}


def slice_of(name: str, *pcis: str) -> dict:
    devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "resource.kubernetes.io/pciBusID": {"string": f"{p}.0"}}} for i, p in enumerate(pcis)]
    devices.append({"name": "gpu-0-mig-1g", "attributes": {"type": {"string": "mig"}, "resource.kubernetes.io/pciBusID": {"string": f"{pcis[0]}.0"}}})
    return {"spec": {"nodeName": name, "driver": "gpu.nvidia.com", "devices": devices}}


def rule_for(name: str, device: str) -> dict:
    return {"metadata": {"name": f"gpu-fault-{name}-{device}"}, "spec": {"deviceSelector": {"pool": name, "device": device}}}


def decide(nodes: list[dict], slices: list[dict] = (), rules: list[dict] = (), quarantine: bool = True, fault_minutes: int = 1, tmp: Path | None = None) -> list[str]:
    tmp = tmp or Path(os.environ.get("TMPDIR", "/tmp"))
    files = {}
    for key, items in (("nodes", nodes), ("slices", slices), ("rules", rules)):
        files[key] = tmp / f"decide-{os.getpid()}-{key}.json"
        files[key].write_text(json.dumps({"items": list(items)}))
    result = subprocess.run(
        [jq(), "-r", "-n", *(a for key, path in files.items() for a in ("--slurpfile", key, str(path))),
         "--argjson", "pools", json.dumps(POOLS), "--argjson", "now", str(NOW), "--argjson", "fault_seconds", str(fault_minutes * MINUTE),
         "--argjson", "quarantine", json.dumps(quarantine), step.DECIDE],
        capture_output=True, text=True, check=True,
    )
    return result.stdout.splitlines()


GPU_SLICES = [slice_of("d1", "0000:3b:00", "0000:c6:00"), slice_of("d2", "0000:3b:00", "0000:c6:00")]

STATES = [
    # (id, nodes, slices, rules, quarantine, expected actions)
    ("healthy-nothing", [node("t1", "train")], [], [], True, []),
    ("fault-drains", [node("t1", "train", fault="GpuXidFatal")], [], [], True, ["drain t1 draining"]),
    ("needs-reset-drains", [node("t1", "train", fault="GpuXidNeedsReset")], [], [], True, ["drain t1 draining"]),
    ("fault-not-held-long-enough-waits", [node("t1", "train", fault="GpuXidFatal", since=30)], [], [], True, []),
    ("drained-waits-for-the-reboot", [node("t1", "train", fault="GpuXidFatal", marked=True, drained=True)], [], [], True, []),
    ("refused-drain-retries", [node("t1", "train", fault="GpuXidFatal", marked=True)], [], [], True, ["drain t1 draining"]),
    ("healed-and-ready-released", [node("t1", "train", marked=True, drained=True)], [], [], True, ["release t1 uncordon"]),
    ("healed-not-ready-waits", [node("t1", "train", marked=True, drained=True, ready=False)], [], [], True, []),
    ("unmarked-healthy-never-uncordoned", [node("t1", "train", drained=True)], [], [], True, []),
    ("cordoned-before-fault-recorded", [node("t1", "train", fault="GpuXidFatal", cordoned=True)], [], [], True, [f"drain t1 {step.CORDONED_BEFORE}"]),
    ("cordoned-before-retry-keeps-the-record",
     [node("t1", "train", fault="GpuXidFatal", marked=step.CORDONED_BEFORE)], [], [], True, [f"drain t1 {step.CORDONED_BEFORE}"]),
    ("cordoned-before-released-stays-cordoned", [node("t1", "train", marked=step.CORDONED_BEFORE, drained=True)], [], [], True, ["release t1 keep-cordoned"]),
    ("over-blast-radius-holds", [node("t1", "train", fault="GpuXidFatal"), node("t2", "train", ready=False)], [], [], True, ["hold t1"]),
    ("over-blast-radius-continues-started-drain",
     [node("t1", "train", fault="GpuXidFatal", marked=True), node("t2", "train", fault="GpuXidFatal")], [], [], True, ["drain t1 draining", "hold t2"]),
    ("within-blast-radius-drains-both",
     [node("b1", "big", fault="GpuXidFatal"), node("b2", "big", fault="GpuXidFatal"), node("t1", "train", ready=False)], [], [], True, ["drain b1 draining", "drain b2 draining"]),
    ("other-pools-do-not-count", [node("t1", "train", fault="GpuXidFatal"), node("b1", "big", ready=False)], [], [], True, ["drain t1 draining"]),
    ("unknown-pool-ignored", [node("x1", "elsewhere", fault="GpuXidFatal")], [], [], True, []),
    ("dra-gpu-quarantined-alone", [node("d1", "dra", fault="GpuXidFatal")], GPU_SLICES, [], True, ["quarantine d1 gpu-1"]),
    ("dra-upper-case-pci-matches", [node("d1", "dra", fault="GpuXidFatal", pci="0000:C6:00")], GPU_SLICES, [], True, ["quarantine d1 gpu-1"]),
    ("dra-quarantine-not-repeated", [node("d1", "dra", fault="GpuXidFatal", quarantined=("gpu-1",))], GPU_SLICES, [rule_for("d1", "gpu-1")], True, []),
    ("dra-quarantine-recorded-where-its-condition-is-missing", [node("d1", "dra", fault="GpuXidFatal")], GPU_SLICES, [rule_for("d1", "gpu-1")], True,
     ["quarantine d1 gpu-1"]),
    ("dra-quarantined-gpus-count-proportionally",  # one GPU each on two nodes: 2 of the pool's 1 x 2 GPUs
     [node("d1", "dra", fault="GpuXidFatal", quarantined=("gpu-1",)), node("d2", "dra", fault="GpuXidFatal", pci="0000:3b:00")], GPU_SLICES,
     [rule_for("d1", "gpu-1")], True, ["quarantine d2 gpu-0"]),
    ("dra-quarantine-beyond-the-radius-holds",  # a NotReady node (2 GPUs) and a quarantined GPU: 3 > 2
     [node("d1", "dra", fault="GpuXidFatal"), node("d2", "dra", ready=False)], GPU_SLICES, [], True, ["hold d1 gpu-1"]),
    ("dra-held-quarantine-kept-beyond-the-radius",
     [node("d1", "dra", fault="GpuXidFatal", quarantined=("gpu-1",)), node("d2", "dra", ready=False)], GPU_SLICES, [rule_for("d1", "gpu-1")], True, []),
    ("dra-quarantined-gpu-holds-a-drain",  # d2's fault names no GPU of its slice: draining it (2) beside d1's GPU (1) is 3 > 2
     [node("d1", "dra", fault="GpuXidFatal", quarantined=("gpu-1",)), node("d2", "dra", fault="GpuXidFatal", pci="0000:99:00")], GPU_SLICES,
     [rule_for("d1", "gpu-1")], True, ["hold d2"]),
    ("dra-healed-unquarantined", [node("d1", "dra", quarantined=("gpu-1",))], GPU_SLICES, [rule_for("d1", "gpu-1")], True, ["unquarantine d1 gpu-1"]),
    ("dra-stale-quarantine-condition-cleared", [node("d1", "dra", quarantined=("gpu-1",))], GPU_SLICES, [], True, ["unquarantine d1 gpu-1"]),
    ("dra-unknown-gpu-drains", [node("d1", "dra", fault="GpuXidFatal", pci="0000:99:00")], GPU_SLICES, [], True, ["drain d1 draining"]),
    ("dra-without-taint-rules-drains", [node("d1", "dra", fault="GpuXidFatal")], GPU_SLICES, [], False, ["drain d1 draining"]),
    ("non-dra-pool-never-quarantined", [node("d1", "train", fault="GpuXidFatal")], GPU_SLICES, [], True, ["drain d1 draining"]),
    ("dra-fault-not-held-long-enough-waits", [node("d1", "dra", fault="GpuXidFatal", since=30)], GPU_SLICES, [], True, []),
]


@pytest.mark.parametrize("nodes, slices, rules, quarantine, expected", [s[1:] for s in STATES], ids=[s[0] for s in STATES])
def test_the_step_decides_per_node(nodes, slices, rules, quarantine, expected, tmp_path):
    assert decide(nodes, slices, rules, quarantine, tmp=tmp_path) == expected


# --------------------------------------------------------------------------- the script

FAKE_KUBECTL = '''#!{python}
"""Records each call; answers `get` from recorded objects; `drain` exits with $FAKE_DRAIN_RC."""
import json, os, sys
state = os.environ["FAKE_STATE"]
args = sys.argv[1:]
stdin = sys.stdin.read() if "-f" in args else ""
with open(os.path.join(state, "calls"), "a") as f:
    f.write(json.dumps({{"args": args, "stdin": stdin}}) + "\\n")
if args[0] == "get":
    kind = args[1].split(".")[0]
    print(open(os.path.join(state, kind + ".json")).read())
elif args[0] == "drain":
    sys.exit(int(os.environ.get("FAKE_DRAIN_RC", "0")))
'''


def run_step(tmp_path: Path, nodes: list[dict], slices: list[dict] = (), drain_rc: int = 0, rule_api: str = "resource.k8s.io/v1alpha3",
             rules: list[dict] = ()) -> list[dict]:
    jq()
    state, conf, bin_dir = tmp_path / "state", tmp_path / "conf", tmp_path / "bin"
    for d in (state, conf, bin_dir):
        d.mkdir()
    (state / "nodes.json").write_text(json.dumps({"items": nodes}))
    (state / "resourceslices.json").write_text(json.dumps({"items": list(slices)}))
    (state / "devicetaintrules.json").write_text(json.dumps({"items": list(rules)}))
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(FAKE_KUBECTL.format(python=sys.executable))
    kubectl.chmod(0o755)
    (conf / "decide.jq").write_text(step.DECIDE)
    (conf / "pools.json").write_text(json.dumps(POOLS))
    (conf / "rule.json").write_text(json.dumps(health.taint_rule(rule_api.split("/")[1], "NODE", "DEVICE", "NoExecute", step.MANAGED_BY)))
    env = {
        **{e["name"]: e["value"] for e in step.environment(1, rule_api)},
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "CONFIG_DIR": str(conf), "FAKE_STATE": str(state), "FAKE_DRAIN_RC": str(drain_rc), "TMPDIR": str(tmp_path),
    }
    subprocess.run(["bash", "-c", step.SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    return [json.loads(line) for line in (state / "calls").read_text().splitlines()]


LONG_AGO = NOW - int(time.time()) + 3600
"""`since` of a fault an hour old by the clock the script reads."""


def _verbs(calls: list[dict]) -> list[str]:
    return [" ".join(c["args"][:2]) for c in calls if c["args"][0] != "get"]


def test_a_drain_evicts_then_marks_the_node_drained(tmp_path):
    calls = run_step(tmp_path, [node("t1", "train", fault="GpuXidFatal", since=LONG_AGO)])
    assert _verbs(calls) == ["annotate node", "drain t1", "patch node"]
    assert next(c["args"][3] for c in calls if c["args"][0] == "annotate") == f"{step.DRAIN_ANNOTATION}={step.DRAINING}"  # it was schedulable: the step cordons it
    drain = next(c["args"] for c in calls if c["args"][0] == "drain")
    # Eviction (kubectl drain's default): no --disable-eviction, no --force past pods no controller owns.
    assert not {"--disable-eviction", "--force"} & set(drain) and f"--timeout={step.DRAIN_STEP_SECONDS}s" in drain
    patch = json.loads(next(c["args"] for c in calls if c["args"][0] == "patch")[-1])
    assert patch["status"]["conditions"][0]["type"] == "GpuDrained" and patch["status"]["conditions"][0]["status"] == "True"


def test_a_refused_drain_marks_nothing(tmp_path):
    calls = run_step(tmp_path, [node("t1", "train", fault="GpuXidFatal", since=LONG_AGO)], drain_rc=1)
    assert _verbs(calls) == ["annotate node", "drain t1"]


def test_a_released_node_is_unmarked_and_uncordoned(tmp_path):
    calls = run_step(tmp_path, [node("t1", "train", marked=True, drained=True)])
    assert _verbs(calls) == ["patch node", "uncordon t1", "annotate node"]
    assert json.loads(calls[-3]["args"][-1])["status"]["conditions"][0]["status"] == "False"


def test_a_node_cordoned_before_its_fault_is_drained_and_released_still_cordoned(tmp_path):
    calls = run_step(tmp_path, [node("t1", "train", fault="GpuXidFatal", since=LONG_AGO, cordoned=True)])
    assert [c["args"] for c in calls if c["args"][0] == "annotate"] == [["annotate", "node", "t1", f"{step.DRAIN_ANNOTATION}={step.CORDONED_BEFORE}", "--overwrite"]]
    (tmp_path / "after").mkdir()
    calls = run_step(tmp_path / "after", [node("t1", "train", marked=step.CORDONED_BEFORE, drained=True)])
    assert _verbs(calls) == ["patch node", "annotate node"]  # no uncordon


@pytest.mark.parametrize("version, api", [("1.34", "v1alpha3"), ("1.37", "v1")])
def test_a_dra_quarantine_applies_a_valid_rule_for_the_faulty_gpu_only(tmp_path, version, api):
    calls = run_step(tmp_path, [node("d1", "dra", fault="GpuXidFatal", since=LONG_AGO)], GPU_SLICES, rule_api=f"resource.k8s.io/{api}")
    (apply,) = [c for c in calls if c["args"][0] == "apply"]
    rule = json.loads(apply["stdin"])
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "d1", "device": "gpu-1"}
    assert rule["spec"]["taint"]["effect"] == "NoExecute" and rule["metadata"]["name"] == "gpu-fault-d1-gpu-1"
    validate_object(rule, f"{version}.0", strict=True)
    (patch,) = [json.loads(c["args"][-1])["status"]["conditions"][0] for c in calls if c["args"][0] == "patch"]
    assert (patch["type"], patch["status"]) == ("GpuQuarantined-gpu-1", "True")  # what the availability rules read
    assert not [c for c in calls if c["args"][0] == "drain"]


def test_a_healed_gpu_loses_its_rule_then_its_quarantine_condition(tmp_path):
    calls = run_step(tmp_path, [node("d1", "dra", quarantined=("gpu-1",))], GPU_SLICES, rules=[rule_for("d1", "gpu-1")])
    assert _verbs(calls) == ["delete devicetaintrules.v1alpha3.resource.k8s.io", "patch node"]
    assert calls[-2]["args"][2] == "gpu-fault-d1-gpu-1"
    patch = json.loads(calls[-1]["args"][-1])["status"]["conditions"][0]
    assert (patch["type"], patch["status"]) == ("GpuQuarantined-gpu-1", "False")


# --------------------------------------------------------------------------- rendered


def test_the_step_runs_once_a_minute_one_run_at_a_time(dev):
    spec = one(dev, "CronJob", health.STEP)["spec"]
    assert spec["schedule"] == "* * * * *" and spec["concurrencyPolicy"] == "Forbid"
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == health.STEP
    assert pod["containers"][0]["image"] == "registry.k8s.io/kubectl:v1.34.0"
    config = one(dev, "ConfigMap", health.STEP)["data"]
    assert config["decide.jq"] == step.DECIDE and json.loads(config["pools.json"]) == {
        "a100-mig": {"dra": False, "limit": 1}, "h100-train": {"dra": False, "limit": 1}, "h100-vm": {"dra": False, "limit": 1},
        "l40s-infer": {"dra": False, "limit": 1}}
    assert json.loads(config["rule.json"]) == {}  # dev has no DRA pool


def test_the_step_evicts_and_never_deletes_pods_nor_reads_secrets(dev):
    rules = one(dev, "ClusterRole", health.STEP)["rules"]
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert ("", "pods/eviction", "create") in granted
    assert not {(g, r, v) for g, r, v in granted if r in ("pods", "secrets") and v not in ("get", "list")}
    assert not {(g, r, v) for g, r, v in granted if r == "secrets"}


def test_a_dra_pool_gets_the_rule_template_of_the_clusters_version(dev_raw):
    rendered = render(device_config(dev_raw[0]))
    config = one(rendered, "ConfigMap", health.STEP)["data"]
    assert json.loads(config["pools.json"])["h100-dra"] == {"dra": True, "gpus": 4, "limit": 1}  # a quarantined GPU is 1/4 of a node
    rule = json.loads(config["rule.json"])
    assert rule["apiVersion"] == "resource.k8s.io/v1alpha3" and rule["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "ai-factory-gpu-remediation"
    env = {e["name"]: e["value"] for e in one(rendered, "CronJob", health.STEP)["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RULE_API"] == "resource.k8s.io/v1alpha3" and env["FAULT_SECONDS"] == "60"
    # The alert counts as the step does: the pool's one node, a quarantined GPU a quarter of it.
    groups = one(rendered, "PrometheusRule", "ai-factory-gpu-health")["spec"]["groups"]
    (radius,) = [r["expr"] for g in groups for r in g["rules"] if r.get("alert") == "GpuRemediationBlastRadius" and r["labels"].get("pool") == "h100-dra"]
    assert radius.endswith(" or vector(0)) / 4)) > 1") and "GpuQuarantined-gpu-" in radius
