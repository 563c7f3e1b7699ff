"""Upgrade waves through the Automation API against the fake CLI: the platform first, then ring
by ring, each gated on health; a failed gate stops the upgrade before any later ring, a rerun
resumes from the failed ring; a dry run deploys nothing."""

from __future__ import annotations

import json
import threading

import pytest

from ai_factory.factory.cli import main
from ai_factory.factory.model.clusters import ring_problems
from ai_factory.factory.model.loading import ConfigError, load_stack_file
from ai_factory.factory.model.upgrades import read_state, state_path
from ai_factory.stacks.fleet import FleetStacks
from ai_factory.stacks.upgrade import GateResult, KubectlProbe, Upgrader, plan_upgrade
from tests.fake_pulumi import Deployed, FakePulumi
from tests.fleet_env import fleet_document, write_env
from tests.stacks_support import backend


def program(stack: str, config: dict[str, str]) -> Deployed:
    name = stack.rsplit("/", 1)[-1]
    return Deployed(resources=[{"urn": f"urn:pulumi:{name}::ai-factory::ai-factory:index:Platform::ai-factory", "type": "ai-factory:index:Platform"}])


def ringed_document() -> dict:
    document = fleet_document()
    config = document["config"]
    config["ai-factory:matrix"] = {"version": "2026.11"}
    rings = {"search": "canary", "assistant": "early"}  # partner-acme (low trust): the last ring, by default
    for tenant in config["ai-factory:tenants"]:
        if tenant["name"] in rings:
            tenant["ring"] = rings[tenant["name"]]
    return document


class Probe:
    """Health as the gates would read it; `failing` = {(step, cluster, gate)} fails once seen."""

    def __init__(self, failing: set[tuple[str, str, str]] = frozenset(), steps: list[str] | None = None):
        self.failing = set(failing)
        self.checked: list[tuple[str, str]] = []
        self.steps = steps

    def snapshot(self, cluster):
        return {}

    def check(self, cluster, gate, tenants, before):
        self.checked.append((cluster, gate))
        step = "platform" if not tenants else {"search": "canary", "assistant": "early", "partner-acme": "broad"}[tenants[0]]
        if (step, cluster, gate) in self.failing:
            return GateResult(False, "gpu-h100-03 nvidia.com/gpu 0/8")
        return GateResult(True)


@pytest.fixture
def project(tmp_path):
    write_env(tmp_path, ringed_document())
    return tmp_path


def upgrader(project, probe, cli=None, parallelism=2):
    cli = cli or FakePulumi({"ai-factory": program})
    fleet = FleetStacks(backend(project), project_dir=project, pulumi_command=cli, parallelism=parallelism)
    return cli, Upgrader(fleet, probe)


def upped(cli) -> list[str]:
    return [c.stack.rsplit("/", 1)[-1] for c in cli.operations("up")]


def test_the_plan_moves_the_platform_first_then_each_ring_with_its_tenants_clusters(project):
    plan = plan_upgrade("fleet", "2026.12", project)
    assert [(s.name, s.tenants, s.clusters) for s in plan.steps] == [
        ("platform", (), ("par1-a", "par1-b", "fra1-a", "ams1-a")),
        ("canary", ("search",), ("par1-a", "par1-b", "ams1-a")),
        ("early", ("assistant",), ("par1-a", "par1-b", "fra1-a")),
        ("broad", ("partner-acme",), ("par1-a",)),
    ]
    text = plan.text()
    assert "platform-wide, moved in the first step for every tenant at once (2)" in text and "volcano" in text


def test_a_dry_run_prints_the_plan_and_deploys_nothing(project, capsys):
    assert main(["--project-dir", str(project), "upgrade", "fleet", "--to", "2026.12", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "upgrade fleet: matrix 2026.11 -> 2026.12" in out and "4. broad: tenants partner-acme; clusters par1-a" in out
    assert not state_path("fleet", project).exists()


def test_a_failed_gate_stops_at_its_ring_and_touches_no_later_ring(project):
    cli, up = upgrader(project, Probe({("early", "par1-b", "gpu-allocatable")}))
    report = up.run("fleet", "2026.12")
    assert report.stopped.step == "early" and report.stopped.cluster == "par1-b" and report.stopped.reason == "gpu-allocatable"
    stacks = upped(cli)
    assert len(stacks) == 4 + 3 + 3  # platform on every cluster, canary's and early's clusters
    assert sorted(stacks[-3:]) == ["fleet-fra1-a", "fleet-par1-a", "fleet-par1-b"]
    state = read_state("fleet", project)
    assert (state.done, state.current, state.status) == (["platform", "canary"], "early", "stopped")
    assert "STOPPED at step early on cluster par1-b: gpu-allocatable" in report.text()


def test_while_stopped_the_program_deploys_the_target_with_the_stopped_rings_tenants_on_it(project):
    _, up = upgrader(project, Probe({("early", "par1-b", "gpu-allocatable")}))
    up.run("fleet", "2026.12")
    cfg = load_stack_file("fleet", project)
    assert cfg.matrix.version == "2026.12" and cfg.layers.volcano.chart.version == "1.15.1"
    assert cfg.upgrades.in_progress.done == ["canary", "early"]


def test_a_rerun_resumes_from_the_stopped_ring(project):
    cli, up = upgrader(project, Probe({("early", "par1-b", "gpu-allocatable")}))
    up.run("fleet", "2026.12")
    before = len(cli.operations("up"))
    probe = Probe()
    _, again = upgrader(project, probe, cli)
    report = again.run("fleet", "2026.12")
    assert report.stopped is None and read_state("fleet", project).status == "complete"
    assert sorted(upped(cli)[before:]) == ["fleet-fra1-a", "fleet-par1-a", "fleet-par1-a", "fleet-par1-b"]  # early, then broad
    assert {step.step for step in report.steps} == {"early", "broad"}


def test_a_failed_update_stops_before_any_ring(project):
    cli = FakePulumi({"ai-factory": program})
    cli.failures["up"] = "error: update failed: the API server of par1 refused the connection"
    _, up = upgrader(project, Probe(), cli)
    report = up.run("fleet", "2026.12")
    assert (report.stopped.step, report.stopped.reason) == ("platform", "pulumi up")
    assert report.stopped.detail.startswith("error: update failed")
    assert len(cli.operations("up")) == 4 and read_state("fleet", project).done == []


def test_clusters_are_updated_at_most_parallelism_at_a_time(project):
    cli = FakePulumi({"ai-factory": program}, delay=0.2)
    # The first update waits for a second to start, so that two run at once however loaded the
    # machine is; the delay gives a third, if one were let in, the time to overlap them.
    second, started = threading.Event(), []

    def hold(op: str, stack: str) -> None:
        if op == "up":
            started.append(stack)
            if len(started) >= 2:
                second.set()
            second.wait(timeout=60)

    cli.on_operation = hold
    fleet = FleetStacks(backend(project), project_dir=project, pulumi_command=cli, parallelism=2)
    results = fleet.up("fleet")
    assert [r.cluster for r in results] == ["par1-a", "par1-b", "fra1-a", "ams1-a"] and all(r.ok for r in results)
    calls = cli.operations("up")
    most = max(sum(1 for o in calls if o.started <= c.started < o.ended) for c in calls)
    assert most == 2
    assert "cluster: par1-b" in (project / "Pulumi.fleet-par1-b.yaml").read_text() and "par1-b-admin" in (project / "Pulumi.fleet-par1-b.yaml").read_text()


@pytest.mark.parametrize(
    "change, expected",
    [
        pytest.param(lambda c: None, None, id="accepts-a-newer-version"),
        pytest.param(lambda c: c.update({"ai-factory:matrix": {"version": "2026.12"}}), "--to: the environment already runs matrix 2026.12", id="flags-the-version-already-run"),
        pytest.param(lambda c: c["ai-factory:kubernetes"].update(version="1.33"), None, id="accepts-a-kubernetes-of-both-versions"),
    ],
)
def test_upgrade_targets(project, change, expected):
    document = ringed_document()
    change(document["config"])
    write_env(project, document)
    if expected is None:
        assert plan_upgrade("fleet", "2026.12", project).to == "2026.12"
    else:
        with pytest.raises(ConfigError, match=expected):
            plan_upgrade("fleet", "2026.12", project)


def test_an_unknown_target_is_refused_with_exit_2(project, capsys):
    assert main(["--project-dir", str(project), "upgrade", "fleet", "--to", "2030.01", "--dry-run"]) == 2
    assert "--to: '2030.01' is not a matrix version" in capsys.readouterr().err


def test_a_low_trust_tenant_in_the_first_ring_is_refused_with_exit_2(project, capsys):
    document = ringed_document()
    next(t for t in document["config"]["ai-factory:tenants"] if t["name"] == "partner-acme")["ring"] = "canary"
    write_env(project, document)
    assert main(["--project-dir", str(project), "upgrade", "fleet", "--to", "2026.12", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "(1 problem)" in err and "tenants[2].ring: a low-trust tenant is never in the first ring or the 'canary' ring ('canary')" in err


@pytest.mark.parametrize(
    "rings, ring, refused",
    [
        (["early", "canary", "broad"], "canary", True),
        (["early", "broad"], "early", True),
        (["early", "broad"], None, False),
        (["canary", "early", "broad"], "early", False),
    ],
)
def test_ring_rules_for_a_low_trust_tenant(raw, rings, ring, refused):
    raw["upgrades"] = {"rings": rings}
    acme = next(t for t in raw["tenants"] if t["name"] == "partner-acme")
    if ring:
        acme["ring"] = ring
    problems = ring_problems(raw)
    assert bool(problems) is refused, problems


NODE = {"metadata": {"name": "gpu-1"}, "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "96"}, "conditions": [{"type": "Ready", "status": "True"}]}}
WORKLOAD = {"metadata": {"name": "train", "namespace": "tenant-search"}, "status": {"conditions": [{"type": "Admitted", "status": "True"}]}}


def _kubectl(nodes, workloads):
    return lambda context, args: {"items": nodes if args[1] == "nodes" else workloads}


def _with(obj, **status):
    return {**obj, "status": {**obj["status"], **status}}


@pytest.mark.parametrize(
    "gate, nodes, workloads, expected",
    [
        pytest.param("nodes-ready", [_with(NODE, conditions=[{"type": "Ready", "status": "False"}])], [WORKLOAD], "not Ready: gpu-1", id="flags-a-node-not-ready"),
        pytest.param("gpu-allocatable", [_with(NODE, allocatable={"nvidia.com/gpu": "7"})], [WORKLOAD], "gpu-1 nvidia.com/gpu 7/8", id="flags-gpus-not-restored"),
        pytest.param("no-new-faults", [_with(NODE, conditions=[{"type": "Ready", "status": "True"}, {"type": "GpuXidFatal", "status": "True"}])], [WORKLOAD], "gpu-1: GpuXidFatal", id="flags-a-new-fault-condition"),
        pytest.param("workloads-admitted", [NODE], [_with(WORKLOAD, conditions=[{"type": "Evicted", "status": "True"}])], "tenant-search/train", id="flags-an-evicted-workload"),
        pytest.param("gpu-allocatable", [NODE], [WORKLOAD], None, id="accepts-restored-gpus"),
        pytest.param("workloads-admitted", [NODE], [_with(WORKLOAD, conditions=[{"type": "Finished", "status": "True"}])], None, id="accepts-a-finished-workload"),
    ],
)
def test_kubectl_gates(gate, nodes, workloads, expected):
    before = KubectlProbe({}, _kubectl([NODE], [WORKLOAD])).snapshot("par1-a")
    result = KubectlProbe({}, _kubectl(nodes, workloads)).check("par1-a", gate, ["search"], before)
    assert result.ok is (expected is None)
    if expected:
        assert expected in result.detail
