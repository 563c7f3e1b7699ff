"""The health layer's rendered PrometheusRule under Prometheus' own rule unit-test runner
(`promtool test rules`): when the loop's alerts fire and with which labels, and that the tenants'
unavailable GPU-equivalents, integrated over an hour, are the GPU-hours the library's credit
computation (`factory/planning/credits.py`) finds for the same node conditions.

Dev's health layer: pool h100-train (gpu-h100-01..04, 8 GPUs each) and every other pool remediate
at most one node at once; the whole loop takes 71 minutes (1 fault + 30 drain + 30 reboot + 10
healthy)."""

from __future__ import annotations

import pytest

from ai_factory.components import health
from ai_factory.factory.model.loading import validate
from ai_factory.factory.planning.credits import CORDONED, TENANT_UNAVAILABLE, ConditionEvent, Outage, credits, outages_from_conditions
from ai_factory.factory.planning.from_config import plan_for
from tests.conftest import one, render
from tests.test_credits import SHARED, shared_dra_config
from tests.promtool_support import SAMPLES, RuleTest, gpu_seconds, run_rule_test, without_annotations


@pytest.fixture(scope="module")
def groups(dev):
    return without_annotations(one(dev, "PrometheusRule", "ai-factory-gpu-health")["spec"]["groups"])


def condition(test: RuleTest, node: str, name: str, status: str, *runs) -> None:
    test.add("kube_node_status_condition", {"node": node, "condition": name, "status": status}, *runs)


def passes(groups, test: RuleTest, tmp_path) -> None:
    result = run_rule_test(groups, test, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_node_faulty_longer_than_the_loop_pages_a_person_and_only_then(groups, tmp_path):
    test = RuleTest()
    condition(test, "gpu-h100-01", "GpuXidFatal", "true", (1, 90))  # never remediated
    test.add("kube_node_spec_unschedulable", {"node": "l40s-infer-001"}, (1, 90))  # cordoned by hand
    test.add("kube_node_spec_unschedulable", {"node": "l40s-infer-000"}, (1, 20), (0, 40))  # cordoned, then back
    overdue = [{"node": "gpu-h100-01", "pool": "h100-train", "severity": "critical"}, {"node": "l40s-infer-001", "pool": "l40s-infer", "severity": "critical"}]
    test.expect_alert("GpuRemediationOverdue", "70m", [])  # pending: within the loop's 71 minutes
    test.expect_alert("GpuRemediationOverdue", "75m", overdue)
    test.expect_alert("GpuXidFault", "5m", [{"node": "gpu-h100-01", "condition": "GpuXidFatal", "severity": "warning"}])
    passes(groups, test, tmp_path)


def test_a_drain_refused_past_its_timeout_pages_a_person_and_a_drained_node_does_not(groups, tmp_path):
    test = RuleTest()
    for node in ("gpu-h100-01", "gpu-h100-02"):  # faulty and cordoned by the remediation step
        condition(test, node, "GpuXidFatal", "true", (1, SAMPLES))
        test.add("kube_node_spec_unschedulable", {"node": node}, (1, SAMPLES))
    condition(test, "gpu-h100-02", "GpuDrained", "true", (0, 9), (1, SAMPLES - 10))  # drained at minute 10
    condition(test, "gpu-h100-03", "GpuXidFatal", "true", (1, SAMPLES))  # faulty, not cordoned: held by the blast radius
    test.expect_alert("GpuDrainOverdue", "25m", [])  # pending: within the 30 minutes' drain timeout
    test.expect_alert("GpuDrainOverdue", "35m", [{"node": "gpu-h100-01", "pool": "h100-train", "severity": "critical"}])
    passes(groups, test, tmp_path)


def test_more_unhealthy_nodes_than_the_pools_limit_stops_the_loop_with_an_alert(groups, tmp_path):
    test = RuleTest()
    condition(test, "gpu-h100-01", "GpuXidNeedsReset", "true", (1, SAMPLES))
    condition(test, "gpu-h100-02", "Ready", "false", (0, 9), (1, 11), (0, 40))  # NotReady minutes 10..20
    condition(test, "a100-mig-000", "Ready", "unknown", (1, SAMPLES))  # one node of a100-mig: within its limit
    test.expect_alert("GpuRemediationBlastRadius", "5m", [])
    test.expect_alert("GpuRemediationBlastRadius", "15m", [{"pool": "h100-train", "severity": "critical"}])
    test.expect_alert("GpuRemediationBlastRadius", "30m", [])
    passes(groups, test, tmp_path)


def test_a_node_advertising_fewer_gpus_than_its_pool_raises_an_alert_after_15_minutes(groups, tmp_path):
    test = RuleTest()
    for node in ("gpu-h100-02", "gpu-h100-03", "gpu-h100-04", "l40s-infer-000"):
        test.add("kube_node_info", {"node": node}, (1, SAMPLES))
    test.add("kube_node_status_allocatable", {"node": "gpu-h100-02", "resource": "nvidia_com_gpu", "unit": "integer"}, (8, SAMPLES))
    test.add("kube_node_status_allocatable", {"node": "gpu-h100-03", "resource": "nvidia_com_gpu", "unit": "integer"}, (8, 19), (7, 41))
    # gpu-h100-04's device plugin advertises nothing at all; HAMi's node advertises its 4 x 8 slices.
    test.add("kube_node_status_allocatable", {"node": "l40s-infer-000", "resource": "nvidia_com_gpu", "unit": "integer"}, (32, SAMPLES))
    missing = lambda node: {"node": node, "pool": "h100-train", "severity": "warning"}  # noqa: E731
    test.expect_alert("GpuMissingFromAllocatable", "25m", [missing("gpu-h100-04")])
    test.expect_alert("GpuMissingFromAllocatable", "40m", [missing("gpu-h100-03"), missing("gpu-h100-04")])
    passes(groups, test, tmp_path)


def test_an_xid_the_exporter_reports_alerts_while_it_is_recent(groups, tmp_path):
    test = RuleTest()
    test.add("DCGM_FI_DEV_XID_ERRORS", {"gpu": "3", "Hostname": "gpu-h100-02"}, (0, 29), (79, 31))
    fired = [{"gpu": "3", "Hostname": "gpu-h100-02", "severity": "warning"}]
    test.expect_alert("GpuXidReported", "25m", [])
    test.expect_alert("GpuXidReported", "35m", fired)
    test.expect_alert("GpuXidReported", "50m", [])  # unchanged for 10 minutes
    passes(groups, test, tmp_path)


def test_tenants_unavailable_gpu_hours_are_what_the_credit_computation_finds(groups, dev_raw, tmp_path):
    """a100-mig-001 (search's 1.75 MIG GPU-equivalents): an XID needing a reset at minutes 11..30,
    then SNR's taint until minute 34; gpu-h100-02 (search's 8): NotReady at minutes 41..55;
    gpu-h100-01 (partner-acme's 8): the out-of-service taint at minutes 55..60. (Durations whose
    GPU-hours are exact in the credit computation's six decimals.)"""
    test = RuleTest()
    condition(test, "a100-mig-001", "GpuXidNeedsReset", "true", (0, 10), (1, 20), (0, 30))
    test.add("kube_node_spec_taint", {"node": "a100-mig-001", "key": "medik8s.io/remediation", "effect": "NoExecute", "value": "self-node-remediation"}, (None, 30), (1, 4), (None, 26))
    condition(test, "gpu-h100-02", "Ready", "false", (0, 40), (1, 15), (0, 5))
    test.add("kube_node_spec_taint", {"node": "gpu-h100-01", "key": "node.kubernetes.io/out-of-service", "effect": "NoExecute", "value": "nodeshutdown"}, (None, 54), (1, 6))
    minute = 60.0
    outages = [Outage("a100-mig-001", 11 * minute, 35 * minute), Outage("gpu-h100-02", 41 * minute, 56 * minute), Outage("gpu-h100-01", 55 * minute, 61 * minute)]
    plan = plan_for(validate(dev_raw[0]))
    trust = {"search": "high", "assistant": "medium", "partner-acme": "low"}
    expected = {c.tenant: c.lost_gpu_hours * 3600 for c in credits(plan, trust, validate(dev_raw[0]).layers.health.slo, outages, minute, 61 * minute)}
    assert expected == pytest.approx({"search": (1.75 * 24 + 8 * 15) * 60, "partner-acme": 8 * 6 * 60, "assistant": 0})
    test.expect(gpu_seconds(TENANT_UNAVAILABLE, "tenant"), [({"tenant": t}, round(v, 3)) for t, v in sorted(expected.items())])
    passes(groups, test, tmp_path)


def test_a_broken_availability_rule_fails_the_replay(groups, dev_raw, tmp_path):
    """The replay can fail: with the taint left out of a node's unavailability, search's loss
    during the healthy delay is no longer counted."""
    broken = [
        {**g, "rules": [{**r, "expr": r["expr"].split(" or (max by (node) (kube_node_spec_taint")[0]} if r.get("record") == health.UNAVAILABLE else r for r in g["rules"]]}
        for g in groups
    ]
    test = RuleTest()
    test.add("kube_node_spec_taint", {"node": "a100-mig-001", "key": "medik8s.io/remediation", "effect": "NoExecute", "value": "self-node-remediation"}, (1, SAMPLES))
    test.expect(gpu_seconds(TENANT_UNAVAILABLE, "tenant") + ' > 0', [({"tenant": "search"}, 1.75 * SAMPLES * 60)])
    passes(groups, test, tmp_path)
    assert run_rule_test(broken, test, tmp_path).returncode != 0


# --------------------------------------------------------------------------- DRA: one GPU, not the node


@pytest.fixture(scope="module")
def shared_dra(dev_raw):
    """Dev with a DRA pool h100-dra (2 nodes of 4 GPUs, one node at once) whose node h100-dra-001
    assistant (GPUs 0, 1) and search (GPUs 2, 3) share; partner-acme holds 3 GPUs of h100-dra-000."""
    raw = shared_dra_config(dev_raw[0])
    return raw, without_annotations(one(render(raw), "PrometheusRule", "ai-factory-gpu-health")["spec"]["groups"])


def test_a_quarantined_gpu_of_a_shared_dra_node_debits_its_owner_alone(shared_dra, tmp_path):
    """h100-dra-001: an XID from minute 10, its GPU 1 quarantined from minute 13 (assistant's): the
    node stays in service, search's GPUs on it lose nothing. h100-dra-000: an XID from minute 15
    naming no GPU of its slice, cordoned to be drained from minute 20: partner-acme loses its 3."""
    raw, groups = shared_dra
    test = RuleTest()
    condition(test, SHARED, "GpuXidFatal", "true", (0, 9), (1, 51))
    condition(test, SHARED, "GpuQuarantined-gpu-1", "true", (0, 12), (1, 48))
    test.add("kube_node_spec_unschedulable", {"node": SHARED}, (0, SAMPLES))
    condition(test, "h100-dra-000", "GpuXidFatal", "true", (0, 14), (1, 46))
    test.add("kube_node_spec_unschedulable", {"node": "h100-dra-000"}, (0, 19), (1, 41))
    minute = 60.0
    events = [
        ConditionEvent(10 * minute, SHARED, "GpuXidFatal", "True"), ConditionEvent(13 * minute, SHARED, "GpuQuarantined-gpu-1", "True"),
        ConditionEvent(15 * minute, "h100-dra-000", "GpuXidFatal", "True"), ConditionEvent(20 * minute, "h100-dra-000", CORDONED, "True"),
    ]
    cfg = validate(raw)
    outages = outages_from_conditions(events, healthy_delay=0, end=61 * minute, dra_nodes={"h100-dra-000", SHARED})
    trust = {"search": "high", "assistant": "medium", "partner-acme": "low"}
    expected = {c.tenant: c.lost_gpu_hours * 3600 for c in credits(plan_for(cfg), trust, cfg.layers.health.slo, outages, minute, 61 * minute)}
    assert expected == pytest.approx({"assistant": 48 * 60, "search": 0, "partner-acme": 3 * 41 * 60})
    test.expect(gpu_seconds(TENANT_UNAVAILABLE, "tenant"), [({"tenant": t}, round(v, 3)) for t, v in sorted(expected.items())])
    passes(groups, test, tmp_path)


def test_quarantined_gpus_take_their_share_of_a_dra_pools_blast_radius(shared_dra, tmp_path):
    """h100-dra may have one node's worth (4 GPUs) out: four quarantined GPUs are at the limit, a
    fifth beyond it; a quarantined GPU of a node unhealthy as a whole is not counted twice."""
    _, groups = shared_dra
    test = RuleTest()
    for gpu in range(4):
        condition(test, "h100-dra-000", f"GpuQuarantined-gpu-{gpu}", "true", (1, 30), (0, 30))
    condition(test, SHARED, "GpuQuarantined-gpu-0", "true", (0, 19), (1, 41))
    condition(test, SHARED, "Ready", "false", (0, 39), (1, 21))
    fired = [{"pool": "h100-dra", "severity": "critical"}]
    test.expect_alert("GpuRemediationBlastRadius", "15m", [])  # 4 of 4 GPUs
    test.expect_alert("GpuRemediationBlastRadius", "25m", fired)  # 5 of 4
    test.expect_alert("GpuRemediationBlastRadius", "35m", [])  # 1 of 4
    test.expect_alert("GpuRemediationBlastRadius", "45m", [])  # one whole node, its GPU in it
    passes(groups, test, tmp_path)
