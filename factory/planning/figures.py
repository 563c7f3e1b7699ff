"""Quality figures (see `Figures`) per pool and trust domain, per pool and for the fleet."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from ai_factory.factory.model.gpus import COMPUTE_SLICES, GPU_MODELS, MEMORY_SLICES, GpuModel
from ai_factory.factory.planning.demands import PoolRequests
from ai_factory.factory.planning.mig import ceil_div, mig_lower_bound
from ai_factory.factory.planning.model import Figures, GpuAssignment, PoolPlan, PoolSpec, hami_memory_capacity


def gpu_share(model: GpuModel, pool: PoolPlan, gpu: GpuAssignment, tenant: str | None = None) -> float:
    """Allocated GPU-equivalents of one GPU: its dominant allocated share (see Figures), of all its
    tenants or of `tenant` alone."""
    if gpu.mode == "whole":
        return 1.0 if tenant in (None, gpu.owner) else 0.0
    if gpu.mode == "mig":
        mig = [model.profile(i.profile) for i in gpu.mig if tenant in (None, i.tenant)]
        return max(sum(p.compute_slices for p in mig) / COMPUTE_SLICES, sum(p.memory_slices for p in mig) / MEMORY_SLICES)
    if gpu.mode == "hami":
        hami = [a for a in gpu.hami if tenant in (None, a.tenant)]
        memory = sum(a.memory_mib for a in hami) / model.memory_mib
        return min(1.0, max(memory, sum(a.cores_percent for a in hami) / 100))
    if gpu.mode == "time-sliced":
        return sum(s.replicas for s in gpu.time_slices if tenant in (None, s.tenant)) / pool.time_slicing_replicas
    return 0.0


def lower_bounds(pool: PoolSpec, request: PoolRequests) -> dict[str, int]:
    """Per trust domain with demands on the pool, the `Figures.lower_bound` of its demands: in one
    pass over them, not one per domain (every domain's figures ask)."""
    model = GPU_MODELS[pool.gpu_model]
    bounds: Counter[str] = Counter()
    for tenant, n in request.dedicated.items():
        bounds[request.domain_of[tenant]] += n
    for domain, whole in request.whole.items():
        bounds[domain] += sum(whole.values())
    for domain, instances in request.mig.items():
        classes: Counter[str] = Counter()
        for (_, profile), n in instances.items():
            classes[model.profile(profile).klass] += n
        bounds[domain] += mig_lower_bound(classes)
    for (domain, scaling), slices in request.hami.items():
        bounds[domain] += max(
            ceil_div(sum(a.memory_mib for a in slices), hami_memory_capacity(model, scaling)),
            ceil_div(sum(a.cores_percent for a in slices), 100),
            ceil_div(len(slices), pool.hami_split_count),
        )
    for domain, replicas in request.time_sliced.items():
        bounds[domain] += ceil_div(sum(replicas.values()), pool.time_slicing_replicas)
    return dict(bounds)


def domain_figures(pool_plan: PoolPlan, pool: PoolSpec, lower_bound: int, domain: str) -> Figures:
    """`lower_bound`: the domain's entry of `lower_bounds`."""
    model = GPU_MODELS[pool.gpu_model]
    held = pool_plan.domain_nodes(domain)
    used = [gpu for node in held for gpu in node.gpus if gpu.trust_domain == domain and gpu.mode != "idle"]
    idle_by_tenant: Counter[str] = Counter()
    for node in held:
        if node.dedicated_tenant is not None:
            idle_by_tenant[node.dedicated_tenant] += sum(gpu.mode == "idle" for gpu in node.gpus)
    mig = [model.profile(i.profile) for gpu in used for i in gpu.mig]
    mig_gpus = sum(gpu.mode == "mig" for gpu in used)
    equivalents = sum(gpu_share(model, pool_plan, gpu) for gpu in used)
    hami_memory = [sum(a.memory_mib for a in gpu.hami) / model.memory_mib for gpu in used if gpu.mode == "hami"]
    return Figures(
        pool=pool.name,
        trust_domain=domain,
        nodes_used=len(held),
        gpus_used=len(used),
        lower_bound=lower_bound,
        gap=len(used) - lower_bound,
        idle_gpus=sum(gpu.trust_domain == domain and gpu.mode == "idle" for node in held for gpu in node.gpus),
        free_gpus=0,
        free_nodes=0,
        idle_gpus_by_tenant=tuple(sorted((+idle_by_tenant).items())),
        stranded_compute_slices=COMPUTE_SLICES * mig_gpus - sum(p.compute_slices for p in mig),
        stranded_memory_slices=MEMORY_SLICES * mig_gpus - sum(p.memory_slices for p in mig),
        gpu_equivalents=round(equivalents, 6),
        utilisation=round(equivalents / len(used), 6) if used else 0.0,
        hami_memory_oversubscription=round(max(hami_memory, default=0.0), 6),
    )


def _free(gpu: GpuAssignment) -> bool:
    """Idle and held for no trust domain: the planner may give it to anyone."""
    return gpu.mode == "idle" and gpu.trust_domain is None


def total_figures(pool: str | None, rows: Sequence[Figures], *pool_plans: PoolPlan) -> Figures:
    """Totals over the domain `rows` of `pool_plans`; idle and free GPUs counted on the GPUs
    themselves, so that every GPU of the pools is used, idle or free."""
    nodes = [node for p in pool_plans for node in p.nodes]
    gpus = [gpu for node in nodes for gpu in node.gpus]
    gpus_used = sum(r.gpus_used for r in rows)
    lower_bound = sum(r.lower_bound for r in rows)
    equivalents = sum(r.gpu_equivalents for r in rows)
    idle_by_tenant: Counter[str] = Counter()
    for row in rows:
        idle_by_tenant.update(dict(row.idle_gpus_by_tenant))
    free_nodes = sum(all(_free(gpu) for gpu in node.gpus) for node in nodes)
    return Figures(
        pool=pool,
        trust_domain=None,
        nodes_used=len(nodes) - free_nodes,
        gpus_used=gpus_used,
        lower_bound=lower_bound,
        gap=gpus_used - lower_bound,
        idle_gpus=sum(gpu.mode == "idle" and gpu.trust_domain is not None for gpu in gpus),
        free_gpus=sum(map(_free, gpus)),
        free_nodes=free_nodes,
        idle_gpus_by_tenant=tuple(sorted(idle_by_tenant.items())),
        stranded_compute_slices=sum(r.stranded_compute_slices for r in rows),
        stranded_memory_slices=sum(r.stranded_memory_slices for r in rows),
        gpu_equivalents=round(equivalents, 6),
        utilisation=round(equivalents / gpus_used, 6) if gpus_used else 0.0,
        hami_memory_oversubscription=max((r.hami_memory_oversubscription for r in rows), default=0.0),
    )
