"""Validating pools and tenant demands, and grouping the valid demands of each pool by trust domain
the way the planner packs them."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Mapping, Sequence

from ai_factory.factory.model.gpus import GPU_MODELS, GpuModel
from ai_factory.factory.planning.model import Demand, HamiAllocation, PoolSpec, TenantSpec, hami_memory_capacity


PACKING_HEADROOM = 2
"""Shared demands (MIG, HAMi, time-slicing) of a pool beyond this many times what all its GPUs
could hold are refused before packing, so the packers' cost follows the supply; short of that,
the packers run and the shortfall is reported per tenant and resource."""


@dataclass
class PoolRequests:
    """The valid demands on one pool, grouped the way the planner packs them."""

    domain_of: dict[str, str] = dataclasses.field(default_factory=dict)
    dedicated: dict[str, int] = dataclasses.field(default_factory=dict)
    """Low-trust tenant -> whole GPUs on dedicated nodes."""
    whole: dict[str, Counter[str]] = dataclasses.field(default_factory=lambda: defaultdict(Counter))
    """Trust domain -> tenant -> whole GPUs (high and medium trust)."""
    mig: dict[str, Counter[tuple[str, str]]] = dataclasses.field(default_factory=lambda: defaultdict(Counter))
    """Trust domain -> (tenant, profile) -> instances."""
    hami: dict[tuple[str, float], list[HamiAllocation]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    """(trust domain, memory scaling) -> one allocation per vGPU."""
    time_sliced: dict[str, Counter[str]] = dataclasses.field(default_factory=lambda: defaultdict(Counter))
    """Trust domain -> tenant -> replicas."""


def check_pools(pools: Sequence[PoolSpec], problems: list[str]) -> dict[str, PoolSpec]:
    valid: dict[str, PoolSpec] = {}
    node_owner: dict[str, str] = {}
    names = Counter(p.name for p in pools)
    for pool in sorted(pools, key=lambda p: p.name):
        where = f"pool {pool.name!r}"
        before = len(problems)
        if names[pool.name] > 1:
            problems.append(f"{where}: defined {names[pool.name]} times")
            names[pool.name] = 0  # report once
        model = GPU_MODELS.get(pool.gpu_model)
        if model is None:
            problems.append(f"{where}: unknown GPU model {pool.gpu_model!r}; known: {', '.join(sorted(GPU_MODELS))}")
        elif pool.sharing == "mig" and not model.mig_capable:
            problems.append(f"{where}: sharing 'mig' needs a MIG-capable GPU, {pool.gpu_model} has no MIG")
        if pool.sharing not in ("exclusive", "mig", "time-slicing", "hami", "dra"):
            problems.append(f"{where}: unknown sharing {pool.sharing!r}")
        if pool.gpus_per_node < 1:
            problems.append(f"{where}: gpus_per_node must be at least 1, got {pool.gpus_per_node}")
        if pool.time_slicing_replicas < 1:
            problems.append(f"{where}: time_slicing_replicas must be at least 1, got {pool.time_slicing_replicas}")
        if pool.hami_split_count < 1:
            problems.append(f"{where}: hami_split_count must be at least 1, got {pool.hami_split_count}")
        for node, count in sorted(Counter(pool.nodes).items()):
            if count > 1:
                problems.append(f"{where}: node {node!r} is listed {count} times")
            elif node in node_owner:
                problems.append(f"{where}: node {node!r} is also in pool {node_owner[node]!r}")
            node_owner.setdefault(node, pool.name)
        if len(problems) == before:
            valid[pool.name] = dataclasses.replace(pool, nodes=tuple(sorted(pool.nodes)))
    return valid


# Which demand kinds each sharing mode serves. Whole GPUs in a MIG pool are MIG-disabled GPUs; HAMi
# and time-slicing advertise every GPU of a node as shared, so they serve no whole GPU.
_KINDS_BY_SHARING = {
    "exclusive": {"whole"},
    "dra": {"whole"},
    "mig": {"whole", "mig"},
    "hami": {"hami"},
    "time-slicing": {"time-sliced"},
}


def collect_requests(
    pools: Mapping[str, PoolSpec], pool_names: set[str], tenants: Sequence[TenantSpec], problems: list[str]
) -> dict[str, PoolRequests]:
    requests = {name: PoolRequests() for name in pools}
    seen: set[str] = set()
    for tenant in sorted(tenants, key=lambda t: t.name):
        if tenant.name in seen:
            problems.append(f"tenant {tenant.name!r}: defined more than once")
            continue
        seen.add(tenant.name)
        if tenant.trust not in ("high", "medium", "low"):
            problems.append(f"tenant {tenant.name!r}: unknown trust {tenant.trust!r}")
            continue
        if not tenant.trust_domain:
            problems.append(f"tenant {tenant.name!r}: empty trust domain")
            continue
        for demand in tenant.demands:
            where = f"tenant {tenant.name!r} on pool {demand.pool!r}"
            if demand.pool not in pools:
                if demand.pool not in pool_names:
                    problems.append(f"{where}: unknown pool; pools: {', '.join(sorted(pool_names))}")
                continue  # an invalid pool is reported once, with the pool
            pool = pools[demand.pool]
            kind = _demand_kind(demand, where, problems)
            if kind is None:
                continue
            if tenant.trust == "low" and kind != "whole":
                problems.append(
                    f"{where}: low-trust tenants get whole GPUs only, not {kind} (MIG, HAMi and "
                    "time-slicing are not a boundary between untrusted tenants)"
                )
                continue
            if kind not in _KINDS_BY_SHARING[pool.sharing]:
                problems.append(f"{where}: a pool with sharing {pool.sharing!r} does not serve {kind} demands")
                continue
            model = GPU_MODELS[pool.gpu_model]
            request = requests[pool.name]
            if not _add_demand(tenant, demand, kind, pool, model, request, where, problems):
                continue
            request.domain_of[tenant.name] = tenant.trust_domain
    return requests


def _demand_kind(demand: Demand, where: str, problems: list[str]) -> str | None:
    kinds = [
        kind
        for kind, present in (
            ("whole", demand.whole_gpus != 0),
            ("mig", bool(demand.mig)),
            ("hami", bool(demand.hami)),
            ("time-sliced", demand.time_sliced_replicas != 0),
        )
        if present
    ]
    if len(kinds) != 1:
        problems.append(
            f"{where}: a demand sets exactly one of whole_gpus, mig, hami, time_sliced_replicas; "
            f"this one sets {', '.join(kinds) or 'none'}"
        )
        return None
    if kinds[0] != "hami" and (demand.hami_oversubscribe or demand.hami_memory_scaling != 1.0):
        problems.append(f"{where}: hami_oversubscribe and hami_memory_scaling apply to HAMi demands only")
        return None
    return kinds[0]


def _add_demand(
    tenant: TenantSpec,
    demand: Demand,
    kind: str,
    pool: PoolSpec,
    model: GpuModel,
    request: PoolRequests,
    where: str,
    problems: list[str],
) -> bool:
    domain = tenant.trust_domain
    if kind == "whole":
        if demand.whole_gpus < 0:
            problems.append(f"{where}: whole_gpus must be positive, got {demand.whole_gpus}")
            return False
        if tenant.trust == "low":
            request.dedicated[tenant.name] = request.dedicated.get(tenant.name, 0) + demand.whole_gpus
        else:
            request.whole[domain][tenant.name] += demand.whole_gpus
        return True
    if kind == "time-sliced":
        if demand.time_sliced_replicas < 0:
            problems.append(f"{where}: time_sliced_replicas must be positive, got {demand.time_sliced_replicas}")
            return False
        request.time_sliced[domain][tenant.name] += demand.time_sliced_replicas
        return True
    if kind == "mig":
        valid = True
        for name, count in demand.mig:
            try:
                model.profile(name)
            except KeyError as error:
                problems.append(f"{where}: {error.args[0]}")
                valid = False
            if count < 1:
                problems.append(f"{where}: MIG profile {name!r} count must be positive, got {count}")
                valid = False
        if valid:
            for name, count in demand.mig:
                request.mig[domain][tenant.name, name] += count
        return valid
    # HAMi
    scaling = demand.hami_memory_scaling
    if scaling < 1.0:
        problems.append(f"{where}: hami_memory_scaling must be at least 1, got {scaling}")
        return False
    if scaling > 1.0 and not demand.hami_oversubscribe:
        problems.append(
            f"{where}: hami_memory_scaling {scaling} oversubscribes GPU memory, which stays off unless "
            "the tenant opts in with hami_oversubscribe"
        )
        return False
    capacity = hami_memory_capacity(model, scaling)
    valid = True
    for item in demand.hami:
        if item.count < 1 or item.memory_mib < 1 or not 1 <= item.cores_percent <= 100:
            problems.append(
                f"{where}: a HAMi slice needs count >= 1, memory_mib >= 1 and cores_percent in 1..100, "
                f"got {item}"
            )
            valid = False
        elif item.memory_mib > capacity:
            problems.append(
                f"{where}: a HAMi slice of {item.memory_mib} MiB does not fit on one {model.name} GPU "
                f"({capacity} MiB of nvidia.com/gpumem at memory scaling {scaling:g})"
            )
            valid = False
    # One allocation per vGPU is built below: never beyond the headroom of what the pool could hold.
    vgpus = len(pool.nodes) * pool.gpus_per_node * pool.hami_split_count
    asked = sum(item.count for item in demand.hami) + sum(len(s) for s in request.hami.values())
    if valid and asked > PACKING_HEADROOM * vgpus:
        problems.append(
            f"{where}: the pool's demands reach {asked} HAMi vGPUs, more than {PACKING_HEADROOM} times what its "
            f"GPUs could ever hold ({vgpus}); refused before planning"
        )
        valid = False
    if valid:
        for item in demand.hami:
            request.hami[domain, scaling].extend(
                [HamiAllocation(tenant.name, item.memory_mib, item.cores_percent)] * item.count
            )
    return valid
