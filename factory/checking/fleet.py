"""Checks across the clusters of one environment, over every cluster's render: a tenant's GPU
quotas summed over its clusters never exceed its grant (its demands), and the manager's dispatch
queue never admits more than the tenant's workers could run."""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.model.tenancy import tenant_names
from ai_factory.factory.planning.from_config import vm_resource
from ai_factory.factory.planning.model import HAMI_CORES, HAMI_MEMORY, WHOLE_GPU
from ai_factory.factory.planning.placement import SHARED_GPU
from ai_factory.factory.rendering.bundle import Rendered

GPU_PREFIX = "nvidia.com/"


def grant(cfg: FactoryConfig, tenant: Tenant) -> dict[str, int]:
    """What a tenant's demands grant it, per resource name as nodes advertise it."""
    total: Counter[str] = Counter()
    for demand in tenant.gpus:
        pool = cfg.pool(demand.pool)
        if pool.sharing == "mig":
            model = GPU_MODELS[pool.gpu.model]
            total.update({model.profile(p).resource_name: n for p, n in demand.mig.items()})
        elif pool.sharing == "hami":  # validation requires count, memory_mib and cores_percent here
            total.update({WHOLE_GPU: demand.count, HAMI_MEMORY: demand.count * demand.memory_mib, HAMI_CORES: demand.count * demand.cores_percent})
        else:  # and a count on every other pool; a VM pool's GPUs go by the sandbox device plugin's name
            total[vm_resource(pool, cfg) or (SHARED_GPU if pool.sharing == "time-slicing" else WHOLE_GPU)] += demand.count
    return dict(total)


def _gpu_quota(queue: dict[str, Any]) -> Counter[str]:
    quota: Counter[str] = Counter()
    for group in (queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                if str(resource.get("name", "")).startswith(GPU_PREFIX):
                    quota[resource["name"]] += int(resource.get("nominalQuota", 0))
    return quota


def _queue(rendered: Rendered, name: str) -> dict[str, Any] | None:
    return next((m.obj for m in rendered.of_kind("ClusterQueue") if m.name == name), None)


def fleet_findings(cfg: FactoryConfig, renders: Mapping[str, Rendered]) -> list[Finding]:
    """`cfg`: the whole environment; `renders`: each cluster's render, by cluster name."""
    from ai_factory.components.multikueue import dispatch_queue

    findings = []
    for tenant in cfg.tenants:
        names = tenant_names(tenant)
        granted = grant(cfg, tenant)
        per_cluster = {c: _gpu_quota(q) for c, r in renders.items() if (q := _queue(r, names.cluster_queue)) is not None}
        summed: Counter[str] = Counter()
        for quota in per_cluster.values():
            summed.update(quota)
        for resource, amount in sorted(summed.items()):
            if amount > granted.get(resource, 0):
                spread = ", ".join(f"{c} {q[resource]}" for c, q in per_cluster.items() if q.get(resource))
                findings.append(
                    Finding(
                        "fleet-quota",
                        f"ClusterQueue/{names.cluster_queue}",
                        f"{resource}: {amount} over the clusters ({spread}), above the tenant's grant of {granted.get(resource, 0)}",
                        (tenant.name,),
                    )
                )
        for cluster, rendered in renders.items():
            dispatch = _queue(rendered, dispatch_queue(names))
            if dispatch is None:
                continue
            workers = Counter()
            for other, quota in per_cluster.items():
                if other != cluster:
                    workers.update(quota)
            for resource, amount in sorted(_gpu_quota(dispatch).items()):
                if amount > workers.get(resource, 0):
                    findings.append(
                        Finding(
                            "fleet-dispatch",
                            f"ClusterQueue/{dispatch_queue(names)}",
                            f"cluster {cluster}: dispatches up to {amount} {resource}, more than the tenant's {workers.get(resource, 0)} on its worker clusters",
                            (tenant.name,),
                        )
                    )
    return findings
