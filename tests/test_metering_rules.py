"""The GPU metering recording rules under `promtool test rules`, on synthetic series per sharing mode.

One fleet of five one-mode nodes and three tenants (a, b, c), an hour of series at one-minute
resolution; every expectation is computed by hand from the definition (README, "Metering").
"""

from __future__ import annotations

import copy

import pytest

from ai_factory.factory.metering.rules import (
    POD_ALLOCATED,
    POOL_GPUS,
    POOL_IDLE,
    TENANT_ALLOCATED,
    TENANT_USED,
    UNASSIGNED,
    Metering,
    MeteredNode,
    profile_shares,
    rule_groups,
)
from tests.promtool_support import SAMPLES, WINDOW, RuleTest, gpu_seconds, run_rule_test

GIB = 1024**3
HOUR = SAMPLES * 60
NODES = (
    MeteredNode("ex-1", "train", "H100-80GB", "exclusive", 4),
    MeteredNode("mig-1", "tune", "A100-80GB", "mig", 1),
    MeteredNode("hami-1", "infer", "L40S-48GB", "hami", 1),
    MeteredNode("ts-1", "shared", "L40S-48GB", "time-slicing", 1),
    MeteredNode("dra-1", "claims", "H100-80GB", "dra", 2),
    MeteredNode("spare-1", "spare", "H100-80GB", "exclusive", 2),
)
METERING = Metering(
    nodes=NODES,
    tenants=(("a", "tenant-a"), ("b", "tenant-b"), ("c", "tenant-c")),
    replicas=(("shared", 4),),
    profiles=profile_shares(["A100-80GB", "H100-80GB"]),
)
POOLS = {n.pool: n for n in NODES}


def pod(test: RuleTest, namespace: str, name: str, node: str, resource: str, count: float, *runs) -> None:
    """A pod of one container requesting `count` of `resource`, Running during `runs`."""
    test.add(
        "kube_pod_container_resource_requests",
        {"namespace": namespace, "pod": name, "container": "main", "node": node, "resource": resource, "unit": "integer"},
        *[(count if v is not None else None, n) for v, n in runs],
    )
    test.add("kube_pod_status_phase", {"namespace": namespace, "pod": name, "phase": "Running", "uid": name}, *runs)


def hami_slice(test: RuleTest, namespace: str, name: str, memory_gib: int) -> None:
    test.add(
        "hami_vgpu_memory_allocated_bytes",
        {"namespace": namespace, "pod": name, "node": "hami-1", "container_index": "0", "device_uuid": "GPU-hami-0"},
        (memory_gib * GIB, SAMPLES),
    )


def dcgm(test: RuleTest, metric: str, value: float, gpu: str, node: str, namespace: str = "", name: str = "", profile: str = "") -> None:
    labels = {"gpu": gpu, "UUID": f"GPU-{node}-{gpu}", "Hostname": node, "modelName": "NVIDIA H100 80GB HBM3"}
    if name:
        labels |= {"namespace": namespace, "pod": name, "container": "main"}
    if profile:
        labels |= {"GPU_I_PROFILE": profile, "GPU_I_ID": gpu}
    test.add(metric, labels, (value, SAMPLES))


def fleet() -> RuleTest:
    test = RuleTest()
    always = ((1, SAMPLES),)
    # Whole GPUs: a holds two for the hour; b's job restarts as a new pod after a 10-minute gap;
    # a pod outside every tenant holds one; a Pending pod holds nothing.
    pod(test, "tenant-a", "a-train", "ex-1", "nvidia_com_gpu", 2, *always)
    pod(test, "tenant-b", "b-job-1", "ex-1", "nvidia_com_gpu", 1, (1, 20), (None, 40))
    pod(test, "tenant-b", "b-job-2", "ex-1", "nvidia_com_gpu", 1, (None, 30), (1, 30))
    pod(test, "default", "stray", "ex-1", "nvidia_com_gpu", 1, *always)
    test.add("kube_pod_container_resource_requests", {"namespace": "tenant-b", "pod": "b-wait", "container": "main", "node": "", "resource": "nvidia_com_gpu", "unit": "integer"}, (1, SAMPLES))
    test.add("kube_pod_status_phase", {"namespace": "tenant-b", "pod": "b-wait", "phase": "Pending", "uid": "b-wait"}, (1, SAMPLES))
    for gpu in ("0", "1"):
        dcgm(test, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.5, gpu, "ex-1", "tenant-a", "a-train")
    # MIG: one A100 with a's 3g.40gb (4/8) and b's two 1g.10gb (1/8 each); 1/8 + 1/8 idle.
    pod(test, "tenant-a", "a-tune", "mig-1", "nvidia_com_mig_3g_40gb", 1, *always)
    pod(test, "tenant-b", "b-eval", "mig-1", "nvidia_com_mig_1g_10gb", 2, *always)
    dcgm(test, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.8, "1", "mig-1", "tenant-a", "a-tune", profile="3g.40gb")
    # HAMi: one L40S shared by three pods (12 + 12 GiB of c, 12 GiB of a) of the 48 GiB registered.
    hami_slice(test, "tenant-c", "c-1", 12)
    hami_slice(test, "tenant-c", "c-2", 12)
    hami_slice(test, "tenant-a", "a-inf", 12)
    test.add("hami_gpu_memory_limit_bytes", {"node": "hami-1", "device_uuid": "GPU-hami-0", "device_index": "0", "device_type": "NVIDIA-L40S"}, (48 * GIB, SAMPLES))
    # Time-slicing: four replicas, five Running pods (stale series): the GPU is split five ways.
    for namespace, name in (("tenant-c", "c-ts-1"), ("tenant-c", "c-ts-2"), ("tenant-c", "c-ts-3"), ("tenant-b", "b-ts-1"), ("tenant-b", "b-ts-2")):
        pod(test, namespace, name, "ts-1", "nvidia_com_gpu_shared", 1, *always)
    # DRA: b's claim holds one of the two devices; the other reports no pod.
    dcgm(test, "DCGM_FI_DEV_FB_USED", 1024, "0", "dra-1", "tenant-b", "b-claim")
    dcgm(test, "DCGM_FI_DEV_FB_USED", 0, "1", "dra-1")
    return test


ALLOCATED = {
    ("a", "train"): 2.0,
    ("b", "train"): 50 / 60,
    (UNASSIGNED, "train"): 1.0,
    ("a", "tune"): 0.5,
    ("b", "tune"): 0.25,
    ("c", "infer"): 0.5,
    ("a", "infer"): 0.25,
    ("c", "shared"): 0.6,
    ("b", "shared"): 0.4,
    ("b", "claims"): 1.0,
}
"""GPU-equivalents averaged over the hour, per (tenant, pool)."""
USED = {("a", "train"): 1.0, ("a", "tune"): 0.4}
IDLE = {"train": 4 - 2 - 50 / 60 - 1, "tune": 0.25, "infer": 0.25, "shared": 0.0, "claims": 1.0, "spare": 2.0}


def _labels(tenant: str, pool: str) -> dict[str, str]:
    node = POOLS[pool]
    namespace = "default" if tenant == UNASSIGNED else f"tenant-{tenant}"
    return {"tenant": tenant, "namespace": namespace, "pool": pool, "gpu_model": node.gpu_model, "mode": node.mode}


def _pool_labels(pool: str) -> dict[str, str]:
    return {"pool": pool, "gpu_model": POOLS[pool].gpu_model, "mode": POOLS[pool].mode}


def _seconds(equivalents: float) -> float:
    return round(equivalents * HOUR, 3)


def invariant(test: RuleTest) -> None:
    """Per pool over the hour: tenants + idle = physical GPUs × time, and idle is never negative."""
    tenants = f"sum by (pool) (sum_over_time({TENANT_ALLOCATED}[{WINDOW}]))"
    idle = f"sum by (pool) (sum_over_time({POOL_IDLE}[{WINDOW}]))"
    physical = f"sum by (pool) (sum_over_time({POOL_GPUS}[{WINDOW}]))"
    test.expect(f"abs(({tenants} or {physical} * 0) + on(pool) {idle} - on(pool) {physical}) <= bool 1e-9", [({"pool": p}, 1) for p in sorted(POOLS)])
    test.expect(f"min by (pool) (min_over_time({POOL_IDLE}[{WINDOW}])) >= bool -1e-12", [({"pool": p}, 1) for p in sorted(POOLS)])


def expectations(test: RuleTest) -> RuleTest:
    test.expect(gpu_seconds(TENANT_ALLOCATED, "tenant, namespace, pool, gpu_model, mode"), [(_labels(t, p), _seconds(v)) for (t, p), v in sorted(ALLOCATED.items())])
    test.expect(gpu_seconds(TENANT_USED, "tenant, namespace, pool, gpu_model, mode"), [(_labels(t, p), _seconds(v)) for (t, p), v in sorted(USED.items())])
    test.expect(gpu_seconds(POOL_IDLE, "pool, gpu_model, mode"), [(_pool_labels(p), _seconds(v)) for p, v in sorted(IDLE.items())])
    invariant(test)
    return test


def test_gpu_seconds_per_tenant_pool_and_mode_match_the_definition(tmp_path):
    result = run_rule_test(rule_groups(METERING), expectations(fleet()), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _mutate(record: str, old: str, new: str):
    def apply(groups):
        groups = copy.deepcopy(groups)
        changed = 0
        for rule in groups[-1]["rules"]:
            if rule["record"] == record and old in rule["expr"]:
                rule["expr"] = rule["expr"].replace(old, new)
                changed += 1
        assert changed, f"mutation of {record} matched no rule"
        return groups

    return apply


def _drop(record: str):
    def apply(groups):
        groups = copy.deepcopy(groups)
        rules = groups[-1]["rules"]
        kept = [r for r in rules if r["record"] != record]
        assert len(kept) < len(rules)
        groups[-1]["rules"] = kept
        return groups

    return apply


@pytest.mark.parametrize(
    "mutation",
    [
        pytest.param(_mutate(POD_ALLOCATED, "clamp_max(", "(0 * 1 + "), id="no-cap-per-node"),
        pytest.param(_drop(TENANT_ALLOCATED), id="no-tenant-series"),
        pytest.param(_mutate(TENANT_ALLOCATED, "unless on(namespace)", "and on(namespace)"), id="unassigned-counted-twice"),
        pytest.param(_mutate(POOL_IDLE, f"or {POOL_GPUS}", f"or {POOL_GPUS} * 0"), id="idle-of-an-unused-pool"),
        pytest.param(_mutate(POOL_IDLE, f"{POOL_GPUS} - on", f"{POOL_GPUS} * 2 - on"), id="idle-of-twice-the-gpus"),
    ],
)
def test_a_rule_that_breaks_the_invariant_fails_the_invariant_test(tmp_path, mutation):
    test = RuleTest(series=fleet().series)
    invariant(test)
    assert run_rule_test(rule_groups(METERING), test, tmp_path).returncode == 0
    result = run_rule_test(mutation(rule_groups(METERING)), test, tmp_path)
    assert result.returncode != 0, "the invariant test passed on rules that break it"
