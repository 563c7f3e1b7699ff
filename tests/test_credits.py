"""SLO credits over the dev plan, against figures worked out by hand from it:
partner-acme (low, 99.5 %) holds the 8 whole H100s of gpu-h100-01; search (high, 99 %) the 16 of
gpu-h100-02/03 plus two MIG GPUs of a100-mig-001 (memory slices / 8: 4x1g.10gb+3g.40gb = 1 GPU,
2x1g.10gb+3g.40gb = 6/8 = 0.75); gpu-h100-04 is idle."""

from __future__ import annotations

import pytest

from ai_factory.factory.model.config import SloTargets
from ai_factory.factory.model.loading import validate
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.planning.credits import ConditionEvent, Outage, credits, outages_from_conditions, tenant_shares
from ai_factory.factory.planning.model import GpuAssignment, HamiAllocation, MigInstance
from ai_factory.factory.planning.from_config import plan_for
from tests.test_device_layer import device_config

H = 3600.0
PERIOD = (0.0, 100 * H)
TRUST = {"partner-acme": "low", "search": "high"}


@pytest.fixture(scope="module")
def plan(dev_raw):
    return plan_for(validate(dev_raw[0]))


def by_tenant(plan, outages, slo=SloTargets()):
    return {c.tenant: c for c in credits(plan, TRUST, slo, outages, *PERIOD)}


def test_no_outage_no_credit(plan):
    result = by_tenant(plan, [])
    assert result["partner-acme"].entitled_gpu_hours == 800 and result["search"].entitled_gpu_hours == 1975  # with its 2 VM GPUs
    assert all(c.lost_gpu_hours == 0 and c.credit_gpu_hours == 0 and c.availability == 1 for c in result.values())


def test_node_outage_beyond_the_slo_is_credited(plan):
    acme = by_tenant(plan, [Outage("gpu-h100-01", 0, 10 * H)])["partner-acme"]
    # 8 GPUs x 10 h lost; the 99.5 % SLO allows 0.5 % of 800 GPU-hours.
    assert (acme.lost_gpu_hours, acme.availability, acme.credit_gpu_hours) == (80, 0.9, 76)


def test_loss_within_the_slo_earns_nothing(plan):
    search = by_tenant(plan, [Outage("a100-mig-001", 0, 10 * H)])["search"]
    assert search.lost_gpu_hours == 17.5 and search.credit_gpu_hours == 0  # allowance 17.75


def test_mig_and_whole_losses_add_up(plan):
    search = by_tenant(plan, [Outage("a100-mig-001", 0, 10 * H), Outage("gpu-h100-02", 50 * H, 60 * H)])["search"]
    assert search.lost_gpu_hours == 97.5 and search.credit_gpu_hours == 77.75  # the 1 % SLO allows 19.75 of 1975


def test_overlapping_outages_count_once_and_are_clipped_to_the_period(plan):
    acme = by_tenant(plan, [Outage("gpu-h100-01", -5 * H, 5 * H), Outage("gpu-h100-01", 2 * H, 8 * H)])["partner-acme"]
    assert acme.lost_gpu_hours == 64  # [0, 8 h) x 8 GPUs


def test_one_gpu_outage_costs_one_gpu(plan):
    acme = by_tenant(plan, [Outage("gpu-h100-01", 0, 10 * H, gpu=3)])["partner-acme"]
    assert acme.lost_gpu_hours == 10 and acme.credit_gpu_hours == 6


def test_an_idle_node_costs_nobody(plan):
    assert all(c.lost_gpu_hours == 0 for c in by_tenant(plan, [Outage("gpu-h100-04", 0, 50 * H)]).values())


def test_target_comes_from_the_tenants_trust_level(plan):
    acme = by_tenant(plan, [Outage("gpu-h100-01", 0, 10 * H)], SloTargets(low=0.9))["partner-acme"]
    assert acme.target == 0.9 and acme.credit_gpu_hours == 0


def test_conditions_become_outages_until_healthy_plus_delay():
    events = [
        ConditionEvent(10, "n1", "GpuXidFatal", "True"),
        ConditionEvent(20, "n1", "Ready", "Unknown"),
        ConditionEvent(30, "n1", "GpuXidFatal", "False"),  # still not Ready
        ConditionEvent(40, "n1", "Ready", "True"),
        ConditionEvent(50, "n2", "GpuXidNeedsReset", "True"),  # never recovers
        ConditionEvent(60, "n3", "GpuXidFatal", "False"),  # healthy all along
    ]
    assert outages_from_conditions(events, healthy_delay=5, end=100) == [Outage("n1", 10, 45), Outage("n2", 50, 100)]


def test_empty_period_is_refused(plan):
    with pytest.raises(ValueError, match="must end after it starts"):
        credits(plan, TRUST, SloTargets(), [], 10, 10)


@pytest.mark.parametrize(
    "gpu, shares",
    [
        # 3x2g.20gb: 6 of 7 compute slices but 6 of 8 memory slices; the metering counts memory.
        (GpuAssignment(0, "mig", "internal", mig=tuple(MigInstance("2g.20gb", 2 * i, "a") for i in range(3))), {"a": 0.75}),
        # HAMi: memory over what HAMi registers (scaled 2x: 160 GiB for an 80 GiB GPU), cores ignored.
        (GpuAssignment(0, "hami", "internal", hami=(HamiAllocation("a", 40960, 90), HamiAllocation("b", 81920, 10)), hami_memory_scaling=2.0), {"a": 0.25, "b": 0.5}),
    ],
)
def test_credits_count_gpu_equivalents_as_the_metering_rules_do(plan, gpu, shares):
    pool = next(p for p in plan.pools if p.sharing == "mig")
    model = GPU_MODELS["A100-80GB"]
    assert model.memory_mib == 81920
    assert tenant_shares(model, pool, gpu) == pytest.approx(shares)


# --------------------------------------------------------------------------- DRA: one GPU, not the node

SHARED = "h100-dra-001"
"""Of `shared_dra_config`'s plan: assistant holds its GPUs 0 and 1, search its GPUs 2 and 3."""
M = 60.0


def shared_dra_config(dev_config: dict) -> dict:
    """Dev with a DRA pool (test_device_layer) whose node h100-dra-001 two tenants of one trust
    domain share."""
    raw = device_config(dev_config)
    tenants = {t["name"]: t for t in raw["tenants"]}
    tenants["assistant"]["trust_domain"] = "internal"
    tenants["search"]["gpus"].append({"pool": "h100-dra", "count": 2})
    return raw


@pytest.fixture(scope="module")
def shared(dev_raw):
    return plan_for(validate(shared_dra_config(dev_raw[0])))


def test_the_shared_dra_node_is_shared(shared):
    pool = next(p for p in shared.pools if p.name == "h100-dra")
    owners = {g.index: g.owner for n in pool.nodes if n.name == SHARED for g in n.gpus}
    assert owners == {0: "assistant", 1: "assistant", 2: "search", 3: "search"}


DRA_EVENTS = [
    # (id, events on the shared node, outages, GPU-hours lost by assistant and search over [0, 60 min))
    ("a quarantined GPU costs its owner that GPU alone",
     [(10, "GpuXidFatal", "True"), (12, "GpuQuarantined-gpu-1", "True")], [Outage(SHARED, 12 * M, 60 * M, 1)], (0.8, 0)),
    ("the quarantine ends when its condition does",
     [(10, "GpuXidNeedsReset", "True"), (12, "GpuQuarantined-gpu-2", "True"), (29, "GpuXidNeedsReset", "False"), (30, "GpuQuarantined-gpu-2", "False")],
     [Outage(SHARED, 12 * M, 30 * M, 2)], (0, 0.3)),
    ("a fault the step drains the node for costs everyone on it",
     [(10, "GpuXidFatal", "True"), (12, "Unschedulable", "True")], [Outage(SHARED, 12 * M, 60 * M)], (1.6, 1.6)),
    ("a node cordoned by hand counts whole until the step quarantines its GPU",
     [(5, "Unschedulable", "True"), (9, "GpuXidFatal", "True"), (12, "GpuQuarantined-gpu-0", "True")],
     [Outage(SHARED, 9 * M, 12 * M), Outage(SHARED, 12 * M, 60 * M, 0)], (2 * 0.05 + 0.8, 2 * 0.05)),
    ("a node not Ready costs everyone, its quarantined GPU once",
     [(10, "GpuXidFatal", "True"), (12, "GpuQuarantined-gpu-1", "True"), (30, "Ready", "False")],
     [Outage(SHARED, 30 * M, 60 * M), Outage(SHARED, 12 * M, 60 * M, 1)], (0.8 + 0.5, 1.0)),
    ("a fault not yet acted on costs nobody", [(10, "GpuXidFatal", "True")], [], (0, 0)),
]


@pytest.mark.parametrize("events, outages, lost", [r[1:] for r in DRA_EVENTS], ids=[r[0] for r in DRA_EVENTS])
def test_dra_outages_are_per_gpu(shared, events, outages, lost):
    found = outages_from_conditions([ConditionEvent(t * M, SHARED, c, s) for t, c, s in events], healthy_delay=0, end=60 * M, dra_nodes={SHARED})
    assert found == outages
    result = {c.tenant: c.lost_gpu_hours for c in credits(shared, {"assistant": "medium", "search": "high"}, SloTargets(), found, 0, 60 * M)}
    assert (result["assistant"], result["search"]) == pytest.approx(lost)


def test_outside_the_dra_pools_a_fault_takes_the_whole_node_and_quarantines_are_not_read():
    events = [ConditionEvent(10, "n1", "GpuXidFatal", "True"), ConditionEvent(20, "n1", "GpuQuarantined-gpu-1", "True"), ConditionEvent(30, "n1", "GpuXidFatal", "False")]
    assert outages_from_conditions(events, healthy_delay=0, end=100) == [Outage("n1", 10, 30)]
