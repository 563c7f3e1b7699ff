"""From the plan to what the cluster enforces: node labels and taints, offerings (the Kueue
flavors), and what each tenant is granted on which offering.

Pure functions of the `Plan`; every layer that pins work to GPUs reads them here:
- the fleet layer labels and taints the nodes (`node_placements`);
- the scheduling layer makes one flavor per `Offering` and one quota per `Grant`;
- the tenant stack writes quotas and placement rules from the `TenantAllocation`.

Trust is enforced at the node: a node whose GPUs are shared (MIG, HAMi, time-slicing) belongs to
one trust domain and is tainted for it; a node of a low-trust tenant is dedicated to it and
tainted for it; a node of a shared pool that the plan gives to nobody is tainted `unassigned`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Literal

from ai_factory.factory.memo import by_identity
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.planning.model import HAMI_CORES, HAMI_MEMORY, WHOLE_GPU, Plan, PoolPlan
from ai_factory.factory.model.tenancy import LABEL_PREFIX, TRUST_DOMAIN_LABEL, TenantNames

POOL_LABEL = f"{LABEL_PREFIX}/pool"
DEDICATED_LABEL = f"{LABEL_PREFIX}/dedicated"
PLACEMENT_TAINT_KEYS = (TRUST_DOMAIN_LABEL, DEDICATED_LABEL)
"""The keys of the taints that keep tenants on their own GPU nodes: a tenant may tolerate them only
with the values `tolerable_taints` gives it."""
HAMI_LABEL = f"{LABEL_PREFIX}/hami"
HAMI_DEVICE_PLUGIN_LABEL = ("gpu", "hami")
"""Selects the nodes HAMi's device plugin runs on. The chart fixes the selector's key (`gpu`; its
default `gpu=on` is what HAMi's docs have users put on every GPU node), so the value is one only the
fleet layer sets, and only on HAMi nodes."""
DRA_LABEL = f"{LABEL_PREFIX}/dra"
UNASSIGNED = "unassigned"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
"""MIG Manager applies the mig-parted config this label names."""
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
"""The NVIDIA device plugin picks its per-node config (time-slicing) by this label."""
WORKLOAD_CONFIG_LABEL = "nvidia.com/gpu.workload.config"
"""GPU Operator sandbox workloads: `vm-passthrough` binds every GPU of the node to vfio-pci for VMs
(the granularity is the node, never one GPU)."""
VM_PASSTHROUGH = "vm-passthrough"
DEVICE_PLUGIN_DEPLOY_LABEL = "nvidia.com/gpu.deploy.device-plugin"
"""GPU Operator: `false` keeps the NVIDIA device plugin off a node (HAMi's plugin or the DRA
driver serves its GPUs; two allocators on one GPU would hand it out twice)."""
MIG_DISABLED_CONFIG = "all-disabled"
HAMI_RESOURCES = {
    "resourceName": WHOLE_GPU,
    "resourceMem": HAMI_MEMORY,
    "resourceMemPercentage": "nvidia.com/gpumem-percentage",
    "resourceCores": HAMI_CORES,
    "resourcePriority": "nvidia.com/priority",
}
"""Every NVIDIA resource name HAMi registers, by the chart value that names it: the HAMi layer sets
exactly these values and every tenant quota caps each name (`advertised_resources`), so no name
the scheduler admits escapes quota. The plan only grants memory (MiB) and cores; a tenant's
percentage and priority lines are therefore 0, and its admission policy refuses them."""
SHARED_GPU = "nvidia.com/gpu.shared"
"""What the device plugin advertises time-sliced replicas as (`renameByDefault: true`), so a pod
asking for a whole `nvidia.com/gpu` can never get a replica."""
SHARED_SHARING = ("mig", "hami", "time-slicing")

OfferingKind = Literal["whole", "mig", "hami", "time-sliced"]


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str = "NoSchedule"

    def toleration(self) -> dict[str, str]:
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect}

    def as_dict(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "effect": self.effect}


@dataclass(frozen=True)
class NodePlacement:
    node: str
    pool: str
    labels: dict[str, str]
    """Labels the plan puts on the node, beyond the fleet's pool/topology labels."""
    taints: tuple[Taint, ...]


@dataclass(frozen=True)
class Offering:
    """One tenant-facing GPU offering: a pool's GPUs, shared one way, for one trust domain.
    It is one Kueue `ResourceFlavor`; it never spans two trust domains."""

    name: str
    pool: str
    gpu_model: str
    kind: OfferingKind
    trust_domain: str
    node_labels: dict[str, str]
    """Selects exactly the nodes whose GPUs the offering covers."""
    tolerations: tuple[Taint, ...]
    nodes: tuple[str, ...]
    supply: dict[str, int]
    """What the plan physically created for the domain here, per resource name."""


@dataclass(frozen=True)
class Grant:
    offering: str
    pool: str
    resource: str
    amount: int


@dataclass(frozen=True)
class TenantAllocation:
    """What one tenant may use: its grants per offering, and the nodes dedicated to it (low trust)."""

    tenant: str
    grants: tuple[Grant, ...] = ()
    dedicated_nodes: tuple[str, ...] = field(default=())

    @property
    def offerings(self) -> tuple[str, ...]:
        return tuple(sorted({g.offering for g in self.grants}))

    @property
    def resources(self) -> dict[str, int]:
        """Total grant per resource name, across offerings."""
        totals: dict[str, int] = defaultdict(int)
        for g in self.grants:
            totals[g.resource] += g.amount
        return dict(sorted(totals.items()))


def offering_kind(pool: PoolPlan) -> OfferingKind:
    return {"mig": "mig", "hami": "hami", "time-slicing": "time-sliced"}.get(pool.sharing, "whole")


def offering_name(pool: str, trust_domain: str) -> str:
    return f"{pool}-{trust_domain}"


def time_slicing_config(replicas: int) -> str:
    return f"time-sliced-{replicas}"


def node_placements(plan: Plan) -> list[NodePlacement]:
    placements = []
    for pool in plan.pools:
        shared = pool.sharing in SHARED_SHARING
        for node in pool.nodes:
            labels: dict[str, str] = {}
            taints: list[Taint] = []
            if node.dedicated_tenant:
                labels[DEDICATED_LABEL] = node.dedicated_tenant
                taints.append(Taint(DEDICATED_LABEL, node.dedicated_tenant))
            if node.trust_domain and (shared or node.dedicated_tenant):
                labels[TRUST_DOMAIN_LABEL] = node.trust_domain
                if shared:
                    taints.append(Taint(TRUST_DOMAIN_LABEL, node.trust_domain))
            elif shared:
                labels[TRUST_DOMAIN_LABEL] = UNASSIGNED
                taints.append(Taint(TRUST_DOMAIN_LABEL, UNASSIGNED))
            if pool.vm_resource:
                labels[WORKLOAD_CONFIG_LABEL] = VM_PASSTHROUGH
            if pool.sharing == "mig":
                labels[MIG_CONFIG_LABEL] = node.mig_config or MIG_DISABLED_CONFIG
            elif pool.sharing == "hami":
                labels[HAMI_LABEL] = "enabled"
                labels[HAMI_DEVICE_PLUGIN_LABEL[0]] = HAMI_DEVICE_PLUGIN_LABEL[1]
                labels[DEVICE_PLUGIN_DEPLOY_LABEL] = "false"
            elif pool.sharing == "dra":
                labels[DRA_LABEL] = "enabled"
                labels[DEVICE_PLUGIN_DEPLOY_LABEL] = "false"
            elif pool.sharing == "time-slicing":
                labels[DEVICE_PLUGIN_CONFIG_LABEL] = time_slicing_config(pool.time_slicing_replicas)
            placements.append(NodePlacement(node.name, pool.name, labels, tuple(taints)))
    return placements


def offerings(plan: Plan) -> list[Offering]:
    """One offering per (pool, trust domain) that the plan gives GPUs to, in name order.

    Every tenant's stack, queue and admission rule asks for them; they are computed once for the
    plan in use (`by_identity`)."""
    return list(_indexed_offerings(plan)[0])


def domain_offerings(plan: Plan, trust_domain: str) -> tuple[Offering, ...]:
    """The offerings of one trust domain, in the order of `offerings`: what one tenant's stack and
    queue ask for, without a scan of every domain's (indexed with the offerings)."""
    return _indexed_offerings(plan)[1].get(trust_domain, ())


@by_identity(kept=1)
def _indexed_offerings(plan: Plan) -> tuple[tuple[Offering, ...], dict[str, tuple[Offering, ...]]]:
    every = tuple(_offerings(plan))
    by_domain: dict[str, list[Offering]] = defaultdict(list)
    for o in every:
        by_domain[o.trust_domain].append(o)
    return every, {domain: tuple(own) for domain, own in by_domain.items()}


def _offerings(plan: Plan) -> list[Offering]:
    result = []
    for pool in plan.pools:
        domains = sorted({g.trust_domain for n in pool.nodes for g in n.gpus if g.trust_domain and g.mode != "idle"})
        for domain in domains:
            nodes = [n for n in pool.domain_nodes(domain) if any(g.trust_domain == domain and g.mode != "idle" for g in n.gpus)]
            dedicated = sorted({n.dedicated_tenant for n in nodes if n.dedicated_tenant})
            labels = {POOL_LABEL: pool.name}
            tolerations: tuple[Taint, ...] = ()
            if dedicated:
                # A low-trust tenant is its own trust domain, so one tenant per dedicated offering.
                labels[DEDICATED_LABEL] = dedicated[0]
                tolerations = (Taint(DEDICATED_LABEL, dedicated[0]),)
            elif pool.sharing in SHARED_SHARING:
                labels[TRUST_DOMAIN_LABEL] = domain
                tolerations = (Taint(TRUST_DOMAIN_LABEL, domain),)
            result.append(
                Offering(
                    name=offering_name(pool.name, domain),
                    pool=pool.name,
                    gpu_model=pool.gpu_model,
                    kind=offering_kind(pool),
                    trust_domain=domain,
                    node_labels=labels,
                    tolerations=tolerations,
                    nodes=tuple(n.name for n in nodes),
                    supply={advertised_name(pool, r): n for r, n in plan.supply(pool.name, domain).items()},
                )
            )
    return result


def allocations(plan: Plan, tenant_domains: dict[str, str]) -> dict[str, TenantAllocation]:
    """Per tenant (name → trust domain), its grants on the offerings of its domain."""
    result = {}
    for tenant, domain in sorted(tenant_domains.items()):
        grants = tuple(
            Grant(offering_name(pool, domain), pool, advertised_name(plan.pool(pool), resource), amount)
            for (pool, resource), amount in sorted(plan.tenant_capacity(tenant).items())
        )
        result[tenant] = TenantAllocation(tenant, grants, plan.dedicated_nodes(tenant))
    return result


def dedicated_taint(names: TenantNames) -> Taint:
    """The taint of the nodes dedicated to a (low-trust) tenant."""
    return Taint(DEDICATED_LABEL, names.tenant)


def tolerable_taints(names: TenantNames, tenant_offerings: Iterable[Offering]) -> tuple[Taint, ...]:
    """The placement taints (`PLACEMENT_TAINT_KEYS`) a tenant's pods may tolerate, in (key, value)
    order: those of the offerings it may be admitted to (`quotas.GpuCeiling.offerings`: with
    Kueue, all of its trust domain's) and, for a low-trust tenant, its dedicated nodes'. The one
    rule for both enforcements: the tenant stack's namespace annotations (`PodTolerationRestriction`)
    and the tenant's Kyverno admission policy."""
    taints = {t for o in tenant_offerings for t in o.tolerations}
    if names.trust == "low":
        taints.add(dedicated_taint(names))
    return tuple(sorted(taints, key=lambda t: (t.key, t.value)))


def advertised_resources(plan: Plan) -> tuple[str, ...]:
    """Every GPU resource name the platform's nodes can advertise (whole GPUs, each MIG profile of
    every MIG pool's model, every name HAMi registers, time-sliced replicas): what tenant quotas must cover."""
    names = {WHOLE_GPU}
    for pool in plan.pools:
        if pool.vm_resource:
            names.add(pool.vm_resource)
        elif pool.sharing == "mig":
            names |= {p.resource_name for p in GPU_MODELS[pool.gpu_model].mig_profiles}
        elif pool.sharing == "hami":
            names |= set(HAMI_RESOURCES.values())
        elif pool.sharing == "time-slicing":
            names.add(SHARED_GPU)
    return tuple(sorted(names))


def advertised_name(pool: PoolPlan, resource: str) -> str:
    """The name nodes advertise a planned resource under: the plan counts time-sliced replicas and a
    VM pool's GPUs as `nvidia.com/gpu`; the device plugin renames replicas, the sandbox device
    plugin advertises passthrough GPUs by device name."""
    if resource != WHOLE_GPU:
        return resource
    return pool.vm_resource or (SHARED_GPU if pool.sharing == "time-slicing" else resource)
