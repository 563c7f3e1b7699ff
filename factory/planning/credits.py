"""SLO credits: GPU-hours each tenant lost to GPU faults and their remediation, and what it is owed.

Pure functions of the plan (which share of which GPU each tenant holds), node health over a period
and the SLO targets of `layers.health.slo` (availability per trust level):

- a tenant's *entitled* GPU-hours are its GPU-equivalents (`tenant_shares`) times the period;
- an *outage* makes GPUs unavailable: one GPU, or every GPU of the node; overlapping outages of a
  GPU count once, clipped to the period;
- *lost* GPU-hours are the tenant's share of each GPU times the hours that GPU was out;
- the SLO allows `(1 - target) * entitled` hours of loss; the *credit* is the loss beyond it, in
  GPU-hours: `max(0, lost - (1 - target) * entitled)`.

Outages come from node conditions (`outages_from_conditions`), as the health layer's recording
rules read them (`components/health.py`):
- a node is out from the moment a GPU fault condition is True or Ready is not True until it is
  healthy again, plus the healthy delay during which remediation keeps it tainted;
- except on a DRA pool, where the remediation step quarantines a faulty GPU alone (one
  DeviceTaintRule per GPU, recorded on the node as the condition `GpuQuarantined-gpu-<index>`,
  `components/_gpu_remediation.py`) and the node's other GPUs keep serving: there a quarantined GPU
  is out from the moment its condition turns True until it turns False, and its tenants alone lose
  it; a fault takes out the whole node only once the node is cordoned (`CORDONED`: the step drains
  it, as it does when the fault names no GPU it can quarantine) and none of its GPUs is
  quarantined. Between the fault and the step's action (`fault_minutes`, then the next minute's
  run) nothing is counted there. Ready not True takes out the whole node in every pool.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Collection, Iterable, Mapping, Sequence

from ai_factory.factory.model.config import SloTargets
from ai_factory.factory.model.gpus import GPU_MODELS, MEMORY_SLICES, GpuModel
from ai_factory.factory.planning.model import GpuAssignment, Plan, PoolPlan

FAULT_CONDITIONS = ("GpuXidFatal", "GpuXidNeedsReset")
QUARANTINE_CONDITION = "GpuQuarantined-"
"""The node condition the remediation step sets per quarantined GPU, then the device's name
(`gpu-<index>`, the NVIDIA DRA driver's)."""
DRA_DEVICE = "gpu-"
CORDONED = "Unschedulable"
"""The condition name under which a `ConditionEvent` reports the node's `spec.unschedulable`
(kube-state-metrics' `kube_node_spec_unschedulable`), status True or False."""
SECONDS_PER_HOUR = 3600.0
NODE_UNAVAILABLE = "ai_factory:node_gpu_unavailable"
GPU_QUARANTINED = "ai_factory:node_gpu_quarantined"
TENANT_UNAVAILABLE = "ai_factory:tenant_gpu_equivalents_unavailable"
TENANT_ENTITLED = "ai_factory:tenant_gpu_equivalents_entitled"
"""The health layer's recording rules of these figures (`components/health.py`), which
`ai-factory bill` integrates over its period."""


@dataclass(frozen=True)
class Outage:
    node: str
    start: float
    """Seconds (any epoch, the same as the period's)."""
    end: float
    gpu: int | None = None
    """The GPU index; None: every GPU of the node."""


@dataclass(frozen=True)
class ConditionEvent:
    """A node condition observed at `time` (seconds), as kube-state-metrics or a watch reports it."""

    time: float
    node: str
    condition: str
    status: str
    """`True`, `False` or `Unknown`."""


@dataclass(frozen=True)
class TenantCredit:
    tenant: str
    trust: str
    target: float
    entitled_gpu_hours: float
    lost_gpu_hours: float
    availability: float
    credit_gpu_hours: float


def tenant_shares(model: GpuModel, pool: PoolPlan, gpu: GpuAssignment) -> dict[str, float]:
    """Each tenant's GPU-equivalents on one GPU, as the metering rules define them
    (`factory/metering/rules.py`), so that credits and the bill count the same unit: MIG: its
    instances' memory slices / 8; HAMi: its reserved memory over the memory HAMi registers for the
    GPU (its memory times `hami_memory_scaling`), at most 1;
    time-slicing: its replicas over the GPU's."""
    shares: dict[str, float] = defaultdict(float)
    if gpu.mode == "whole" and gpu.owner:
        shares[gpu.owner] = 1.0
    elif gpu.mode == "mig":
        for i in gpu.mig:
            shares[i.tenant] += model.profile(i.profile).memory_slices / MEMORY_SLICES
    elif gpu.mode == "hami":
        for a in gpu.hami:
            shares[a.tenant] += a.memory_mib / (model.memory_mib * gpu.hami_memory_scaling)
        shares.update({tenant: min(1.0, share) for tenant, share in shares.items()})
    elif gpu.mode == "time-sliced":
        for s in gpu.time_slices:
            shares[s.tenant] += s.replicas / pool.time_slicing_replicas
    return dict(shares)


def outages_from_conditions(events: Iterable[ConditionEvent], healthy_delay: float, end: float, dra_nodes: Collection[str] = ()) -> list[Outage]:
    """Outages from a sequence of condition observations: a node is out while a fault condition is
    True (on a node of `dra_nodes`: and it is cordoned and no GPU of it quarantined) or Ready is not
    True, and `healthy_delay` seconds after; a quarantined GPU is out while its condition is True.
    Still out at `end` if never back."""
    state: dict[str, dict[str, str]] = defaultdict(dict)
    opened: dict[tuple[str, int | None], float] = {}
    outages: list[Outage] = []
    for event in sorted(events, key=lambda e: (e.time, e.node, e.condition)):
        conditions = state[event.node]
        conditions[event.condition] = event.status
        dra = event.node in dra_nodes
        quarantined = {gpu for c, s in conditions.items() if dra and s == "True" and (gpu := _quarantined_gpu(c)) is not None}
        down = quarantined | ({None} if _unhealthy(conditions, dra) else set())
        for node, gpu in sorted((k for k in opened if k[0] == event.node and k[1] not in down), key=_order):
            # Remediation's taint outlasts a node's recovery; a fault turning into a quarantine leaves none.
            delay = healthy_delay if gpu is None and not quarantined else 0
            outages.append(Outage(node, opened.pop((node, gpu)), event.time + delay, gpu))
        for gpu in down:
            opened.setdefault((event.node, gpu), event.time)
    outages += [Outage(node, start, end, gpu) for (node, gpu), start in sorted(opened.items(), key=lambda i: _order(i[0]))]
    return outages


def _order(key: tuple[str, int | None]) -> tuple[str, int]:
    """A node's whole outage before its GPUs'."""
    return key[0], -1 if key[1] is None else key[1]


def _quarantined_gpu(condition: str) -> int | None:
    """The GPU index a quarantine condition names, None for any other condition."""
    index = condition.removeprefix(QUARANTINE_CONDITION + DRA_DEVICE)
    return int(index) if index != condition and index.isdigit() else None


def _unhealthy(conditions: Mapping[str, str], dra: bool = False) -> bool:
    """The whole node is out: a GPU fault (on a DRA node: one the step drains it for), or not Ready."""
    faulty = any(conditions.get(c) == "True" for c in FAULT_CONDITIONS)
    if dra:
        faulty = faulty and conditions.get(CORDONED) == "True" and not any(s == "True" and _quarantined_gpu(c) is not None for c, s in conditions.items())
    return faulty or conditions.get("Ready", "True") != "True"


def credits(plan: Plan, trust: Mapping[str, str], slo: SloTargets, outages: Sequence[Outage], start: float, end: float) -> list[TenantCredit]:
    """Per tenant of `trust` (tenant -> trust level), sorted by name: entitled and lost GPU-hours
    over [start, end), availability and credit."""
    if end <= start:
        raise ValueError("the period must end after it starts")
    hours = (end - start) / SECONDS_PER_HOUR
    down = _down_hours(plan, outages, start, end)
    entitled: dict[str, float] = defaultdict(float)
    lost: dict[str, float] = defaultdict(float)
    for pool in plan.pools:
        model = GPU_MODELS[pool.gpu_model]
        for node in pool.nodes:
            for gpu in node.gpus:
                for tenant, share in tenant_shares(model, pool, gpu).items():
                    entitled[tenant] += share * hours
                    lost[tenant] += share * down.get((node.name, gpu.index), 0.0)
    return [tenant_credit(tenant, level, getattr(slo, level), entitled.get(tenant, 0.0), lost.get(tenant, 0.0)) for tenant, level in sorted(trust.items())]


def tenant_credit(tenant: str, trust: str, target: float, entitled: float, lost: float) -> TenantCredit:
    """The credit of `lost` GPU-hours out of `entitled` under an availability `target`."""
    return TenantCredit(
        tenant=tenant,
        trust=trust,
        target=target,
        entitled_gpu_hours=round(entitled, 6),
        lost_gpu_hours=round(lost, 6),
        availability=round(1 - lost / entitled, 6) if entitled else 1.0,
        credit_gpu_hours=round(max(0.0, lost - (1 - target) * entitled), 6),
    )


def _down_hours(plan: Plan, outages: Sequence[Outage], start: float, end: float) -> dict[tuple[str, int], float]:
    """Hours each (node, GPU index) was out within the period, overlapping outages merged."""
    gpus = {node.name: [g.index for g in node.gpus] for pool in plan.pools for node in pool.nodes}
    intervals: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for o in outages:
        lo, hi = max(o.start, start), min(o.end, end)
        if hi <= lo or o.node not in gpus:
            continue
        for index in gpus[o.node] if o.gpu is None else [o.gpu]:
            intervals[o.node, index].append((lo, hi))
    down = {}
    for key, spans in intervals.items():
        total, reach = 0.0, None
        for lo, hi in sorted(spans):
            if reach is None or lo > reach:
                total += hi - lo
                reach = hi
            elif hi > reach:
                total += hi - reach
                reach = hi
        down[key] = total / SECONDS_PER_HOUR
    return down
