"""Queue quotas from the plan: what Kueue, KAI Scheduler and Volcano enforce for each tenant.

Pure functions of the configuration and the `Plan` (read through `ai_factory.factory.planning.placement`), so a tenant
stack run on its own rebuilds exactly the queues the platform run would. The rules:

- One Kueue `ResourceFlavor` per `Offering` (pool x trust domain). A tenant's ClusterQueue lists
  every GPU flavor of its trust domain and no other: its nominal quota is what the plan granted it
  (0 where nothing, which still lets it borrow), so borrowing never crosses a trust domain.
- Per flavor and resource, the ClusterQueues' nominal quotas plus the trust domain's Cohort quota
  equal the offering's supply. What the plan created but granted to nobody (HAMi memory, cores and
  slots, spare time-sliced replicas) is the domain cohort's, borrowable by the domain's tenants and
  lent to nobody above it (gpu-sharing.md section 5.1: slack goes in the cohort, not in queues).
- A tenant's GPU ceiling (`gpu_ceiling`), what its namespace quota, tolerations and admission
  policy allow, is what its ClusterQueue can ever admit: per flavor of its domain, its nominal
  quota plus its borrowing limit, at most the flavor's supply (the supply where borrowing is
  unlimited); its grant when Kueue is off.
- Resource groups (a resource belongs to one group, and a pod gets one flavor per group): CPU and
  memory on a flavor with no placement; `nvidia.com/gpu` with HAMi's memory and cores (one HAMi
  pod asks for the three together) over the whole-GPU, time-sliced and HAMi flavors; the MIG
  profiles over the MIG flavors.
- KAI charges `g` GPUs per `nvidia.com/mig-<g>g.*` instance and one per `nvidia.com/gpu`
  (gpu-sharing.md section 5.2); its `quota`, `overQuotaWeight` and `limit` are always written.
- Volcano has no flavors: a tenant's queue is capped at exactly its grants, every GPU resource name
  listed (0 where nothing is granted), so no tenant can take GPUs the plan gave another domain.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence, TypeVar

from ai_factory.factory.memo import by_identity
from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.model.quantity import parse_quantity
from ai_factory.factory.planning.model import HAMI_CORES, HAMI_MEMORY, WHOLE_GPU, Plan
from ai_factory.factory.planning.placement import Offering, advertised_resources, allocations, domain_offerings, offerings
from ai_factory.factory.model.tenancy import tenant_names

SUPPLY_ANNOTATION = "ai-factory.io/supply"
"""On a GPU flavor: JSON of what the plan physically created behind it, per resource name, so the
quota check (`ai_factory.factory.checking.scheduling`) needs no configuration, also on a rendered directory."""
CPU_FLAVOR = "cpu-memory"
"""The flavor of CPU and memory quota: no node labels, so it adds no placement of its own."""
CPU_RESOURCES = ("cpu", "memory")
DEVICE_RESOURCES = (WHOLE_GPU, HAMI_CORES, HAMI_MEMORY)
"""Resources one HAMi pod asks together, and that whole GPUs share the name of."""
GROUP_KINDS = (("whole", "hami"), ("time-sliced",), ("mig",))
"""Offering kinds whose flavors share a resource group: whole GPUs and HAMi slots are both
`nvidia.com/gpu`; time-sliced replicas (`nvidia.com/gpu.shared`) and MIG profiles have their own."""
FLAVOR_ORDER = {"whole": 0, "hami": 1, "time-sliced": 2, "mig": 3}
"""Kueue tries a group's flavors in order: a plain `nvidia.com/gpu` request gets a whole GPU
before a HAMi slot (a workload picks another flavor with a nodeSelector on its pool)."""

MIG_COMPUTE_SLICES: dict[str, int] = {
    profile.resource_name: profile.compute_slices for model in GPU_MODELS.values() for profile in model.mig_profiles
}
"""The `g` of every MIG resource name: what KAI charges per instance."""


def trust_domain_queue(trust_domain: str) -> str:
    """The trust domain's Kueue Cohort and KAI parent queue."""
    return f"trust-domain-{trust_domain}"


def organisation_queue(organisation: str) -> str:
    """The organisation's Kueue Cohort and KAI parent queue."""
    return f"organisation-{organisation}"


# --------------------------------------------------------------------------- Kueue


@dataclass(frozen=True)
class Quota:
    resource: str
    nominal: int | str
    """An integer for GPU resources; a Kubernetes quantity for CPU and memory."""
    borrowing_limit: int | None = None
    """None: no limit (only meaningful inside a cohort, which every queue here has)."""
    lending_limit: int | None = None
    """None: everything idle may be lent."""


@dataclass(frozen=True)
class FlavorQuotas:
    flavor: str
    quotas: tuple[Quota, ...]
    """One per covered resource of the group, in the group's order (Kueue requires all)."""


@dataclass(frozen=True)
class ResourceGroup:
    covered: tuple[str, ...]
    flavors: tuple[FlavorQuotas, ...]


@dataclass(frozen=True)
class ClusterQueueSpec:
    tenant: str
    trust_domain: str
    cohort: str
    fair_share_weight: int
    groups: tuple[ResourceGroup, ...]


@dataclass(frozen=True)
class CohortSpec:
    name: str
    parent: str | None
    trust_domain: str | None
    """None for an organisation's cohort."""
    groups: tuple[ResourceGroup, ...] = ()
    """The domain's unallocated supply."""


# --------------------------------------------------------------------------- KAI and Volcano


@dataclass(frozen=True)
class KaiShare:
    """One resource of a KAI queue, always fully written: KAI reads an unset limit as 0."""

    quota: int
    over_quota_weight: int
    limit: int


@dataclass(frozen=True)
class KaiQueueSpec:
    name: str
    parent: str | None
    tenant: str | None
    """The tenant of a leaf queue; None for organisation and trust-domain queues."""
    trust_domain: str | None
    gpu: KaiShare
    """In GPUs as KAI charges them (see `kai_gpu_units`)."""
    cpu: KaiShare
    """In millicores."""
    memory: KaiShare
    """In megabytes (10^6 bytes)."""


@dataclass(frozen=True)
class VolcanoQueueSpec:
    tenant: str
    weight: int
    capability: tuple[tuple[str, int | str], ...]
    """Every GPU resource name the fleet advertises (0 where nothing is granted), CPU and memory."""
    guarantee: tuple[tuple[str, int], ...]
    """The GPU resources the plan granted: reserved for the tenant."""


@dataclass(frozen=True)
class QueuePlan:
    """Every queue object of the environment, as data."""

    flavors: tuple[Offering, ...]
    cohorts: tuple[CohortSpec, ...]
    cluster_queues: tuple[ClusterQueueSpec, ...]
    kai_queues: tuple[KaiQueueSpec, ...]
    volcano_queues: tuple[VolcanoQueueSpec, ...]


Q = TypeVar("Q", "ClusterQueueSpec", "KaiQueueSpec", "VolcanoQueueSpec")


def planned_for(queues: Iterable[Q], tenant: str, what: str) -> Q:
    """The queue planned for `tenant`; a tenant hook rebuilt from another configuration has none."""
    queue = next((q for q in queues if q.tenant == tenant), None)
    if queue is None:
        raise KeyError(f"no {what} planned for tenant {tenant!r}: the hook was built from another configuration")
    return queue


@by_identity(kept=1)
def queue_plan(cfg: FactoryConfig, plan: Plan) -> QueuePlan:
    """Every queue of the environment. Kueue's, KAI's and Volcano's layers and hooks and the
    platform contract all ask for it: computed once for the configuration and plan in use
    (`by_identity`)."""
    flavors = tuple(sorted(offerings(plan), key=flavor_order))
    grants = _grants(cfg, plan)
    organisation_of = {t.domain: t.organisation for t in cfg.tenants}
    # Every tenant's queue reads its own domain's flavors and every domain's cohort its own
    # queues: looked up per domain, not filtered out of the whole fleet's per tenant.
    own_flavors = {domain: domain_flavors(plan, domain) for domain in organisation_of}
    gpu_resources = advertised_resources(plan)
    cluster_queues = tuple(_cluster_queue(t, own_flavors[t.domain], grants[t.name]) for t in sorted(cfg.tenants, key=lambda t: t.name))
    own_queues: dict[str, list[ClusterQueueSpec]] = defaultdict(list)
    for q in cluster_queues:
        own_queues[q.trust_domain].append(q)
    cohorts = tuple(
        [CohortSpec(organisation_queue(org), None, None) for org in sorted({o for o in organisation_of.values() if o})]
        + [
            _domain_cohort(domain, organisation_of[domain], own_flavors[domain], own_queues[domain])
            for domain in sorted(organisation_of)
        ]
    )
    return QueuePlan(
        flavors=flavors,
        cohorts=cohorts,
        cluster_queues=cluster_queues,
        kai_queues=_kai_queues(cfg, own_flavors, grants, organisation_of),
        volcano_queues=tuple(_volcano_queue(t, grants[t.name], gpu_resources) for t in sorted(cfg.tenants, key=lambda t: t.name)),
    )


def flavor_order(offering: Offering) -> tuple[int, str]:
    """The order of flavors (`FLAVOR_ORDER`, then name) in `QueuePlan.flavors` and in a queue."""
    return FLAVOR_ORDER[offering.kind], offering.name


def domain_flavors(plan: Plan, trust_domain: str) -> tuple[Offering, ...]:
    """The flavors of one trust domain, in flavor order: what its cohort and its tenants' queues
    and ceilings are made of."""
    return tuple(sorted(domain_offerings(plan, trust_domain), key=flavor_order))


def _grants(cfg: FactoryConfig, plan: Plan) -> dict[str, dict[tuple[str, str], int]]:
    """Per tenant, its grant per (offering, resource)."""
    granted = allocations(plan, {t.name: t.domain for t in cfg.tenants})
    return {tenant: {(g.offering, g.resource): g.amount for g in a.grants} for tenant, a in granted.items()}


def _tenant_grants(plan: Plan, tenant: Tenant) -> dict[tuple[str, str], int]:
    """One tenant's grant per (offering, resource)."""
    return {(g.offering, g.resource): g.amount for g in allocations(plan, {tenant.name: tenant.domain})[tenant.name].grants}


def _gpu_groups(flavors: tuple[Offering, ...]) -> list[tuple[tuple[str, ...], list[Offering]]]:
    """The GPU resource groups of one trust domain's flavors: (covered resources, flavors)."""
    groups = []
    for kinds in GROUP_KINDS:
        members = [o for o in flavors if o.kind in kinds]
        if members:
            covered = {r for o in members for r in o.supply}
            groups.append((tuple(r for r in DEVICE_RESOURCES if r in covered) + tuple(sorted(covered - set(DEVICE_RESOURCES))), members))
    return groups


def _cluster_queue(tenant: Tenant, own: tuple[Offering, ...], grants: Mapping[tuple[str, str], int]) -> ClusterQueueSpec:
    """`own`: the flavors of the tenant's trust domain, in flavor order."""
    borrowing = tenant.borrowing

    def gpu_quota(flavor: str, resource: str) -> Quota:
        nominal = grants.get((flavor, resource), 0)
        limit = None if borrowing.limit_percent is None else nominal * borrowing.limit_percent // 100
        return Quota(resource, nominal, borrowing_limit=limit, lending_limit=nominal * borrowing.lendable_percent // 100)

    groups = [
        ResourceGroup(
            CPU_RESOURCES,
            # CPU and memory are capped by the namespace's ResourceQuota at the same figures:
            # admitting more by borrowing would only leave pods the quota then refuses.
            (FlavorQuotas(CPU_FLAVOR, (Quota("cpu", tenant.quota.cpu, borrowing_limit=0), Quota("memory", tenant.quota.memory, borrowing_limit=0))),),
        )
    ]
    for covered, members in _gpu_groups(own):
        groups.append(ResourceGroup(covered, tuple(FlavorQuotas(o.name, tuple(gpu_quota(o.name, r) for r in covered)) for o in members)))
    return ClusterQueueSpec(
        tenant=tenant.name,
        trust_domain=tenant.domain,
        cohort=trust_domain_queue(tenant.domain),
        fair_share_weight=borrowing.fair_share_weight,
        groups=tuple(groups),
    )


@dataclass(frozen=True)
class GpuCeiling:
    """The most one tenant can ever be admitted: what its namespace quota, its tolerations and its
    admission policy must allow, so that the quota it may borrow in its cohort is usable."""

    offerings: tuple[Offering, ...]
    """The offerings it may be admitted to: with Kueue, every one of its trust domain (granted or
    not: it may borrow there); without, the ones it holds grants on."""
    resources: dict[str, int]
    """Per GPU resource name, summed over those offerings (names at 0 left out)."""
    per_offering: dict[tuple[str, str], int]
    """Per (offering, GPU resource name), before summing (pairs at 0 left out)."""


def gpu_ceiling(cfg: FactoryConfig, plan: Plan, tenant: Tenant) -> GpuCeiling:
    """Per GPU resource name, the most the tenant can ever be admitted, read off its ClusterQueue
    (`_cluster_queue`): on each flavor of its trust domain and resource of the flavor's supply,
    `min(supply, nominal + borrowingLimit)`, or the whole supply where borrowing is unlimited
    (Kueue then admits it up to what the domain leaves idle, never beyond the offering).

    Without Kueue the ceiling is the grant: Volcano caps a queue at exactly its grants, and KAI's
    `limit` is one figure in GPU units across resource names (`kai_gpu_units`), which does not
    divide into per-name figures; the namespace quota then keeps the guarantee as the cap."""
    grants = _tenant_grants(plan, tenant)
    own = domain_flavors(plan, tenant.domain)
    if not cfg.layers.kueue.enabled:
        granted = {flavor for flavor, _ in grants}
        granted_totals = _sum([{r: a for (_, r), a in grants.items()}])
        return GpuCeiling(
            tuple(o for o in own if o.name in granted),
            {r: n for r, n in sorted(granted_totals.items()) if n},
            {key: n for key, n in sorted(grants.items()) if n},
        )
    supply = {o.name: o.supply for o in own}
    totals: dict[str, int] = {}
    per_offering: dict[tuple[str, str], int] = {}
    for group in _cluster_queue(tenant, own, grants).groups:
        if group.covered == CPU_RESOURCES:
            continue
        for flavor in group.flavors:
            for quota in flavor.quotas:
                available = supply[flavor.flavor].get(quota.resource, 0)
                most = available if quota.borrowing_limit is None else min(available, int(quota.nominal) + quota.borrowing_limit)
                totals[quota.resource] = totals.get(quota.resource, 0) + most
                if most:
                    per_offering[flavor.flavor, quota.resource] = most
    return GpuCeiling(own, {r: n for r, n in sorted(totals.items()) if n}, dict(sorted(per_offering.items())))


def _domain_cohort(domain: str, organisation: str | None, own: tuple[Offering, ...], queues: list[ClusterQueueSpec]) -> CohortSpec:
    """The domain's cohort, holding the supply no tenant was granted. `own`: the domain's flavors,
    `queues`: its tenants' ClusterQueues."""
    granted: dict[tuple[str, str], int] = {}
    for queue in queues:
        for group in (g for g in queue.groups if g.covered != CPU_RESOURCES):
            for flavor in group.flavors:
                for quota in flavor.quotas:
                    granted[flavor.flavor, quota.resource] = granted.get((flavor.flavor, quota.resource), 0) + int(quota.nominal)
    groups = []
    for covered, members in _gpu_groups(own):
        slack = {(o.name, r): o.supply.get(r, 0) - granted.get((o.name, r), 0) for o in members for r in covered}
        assert min(slack.values()) >= 0, f"trust domain {domain}: quotas exceed the plan's supply: {slack}"
        with_slack = [o for o in members if any(slack[o.name, r] for r in covered)]
        if with_slack:
            groups.append(
                ResourceGroup(
                    covered,
                    tuple(
                        # Lent to nobody above the domain: no other domain lists these flavors anyway.
                        FlavorQuotas(o.name, tuple(Quota(r, slack[o.name, r], lending_limit=0 if organisation else None) for r in covered))
                        for o in with_slack
                    ),
                )
            )
    return CohortSpec(
        name=trust_domain_queue(domain),
        parent=organisation_queue(organisation) if organisation else None,
        trust_domain=domain,
        groups=tuple(groups),
    )


# --------------------------------------------------------------------------- KAI


def kai_gpu_units(resources: Mapping[str, int]) -> int:
    """GPUs as KAI's queue accounting charges requests: 1 per `nvidia.com/gpu` (whole GPU or HAMi
    slot), `g` per MIG instance; HAMi memory and cores and time-sliced replicas
    (`nvidia.com/gpu.shared`) are not GPUs to KAI, which is why the config refuses HAMi and
    time-slicing pools under KAI without Kueue."""
    return sum(amount * (1 if name == WHOLE_GPU else MIG_COMPUTE_SLICES.get(name, 0)) for name, amount in resources.items())


def millicores(quantity: str) -> int:
    return int(parse_quantity(quantity) * 1000)


def megabytes(quantity: str) -> int:
    return int(parse_quantity(quantity) / 10**6)


def _kai_queues(
    cfg: FactoryConfig, own_flavors: Mapping[str, Sequence[Offering]], grants: dict[str, dict[tuple[str, str], int]], organisation_of: dict[str, str | None]
) -> tuple[KaiQueueSpec, ...]:
    """Organisation -> trust domain -> tenant. A trust domain's GPU quota and limit are its whole
    supply, slack included (an organisation's, the sum of its domains'): a domain never takes GPUs
    the plan gave another. CPU and memory are the tenants' own (the ResourceQuota's figures); their
    parents leave them unlimited, so no tenant's quota depends on its siblings'. A tenant's GPU
    limit follows its borrowing setting, within its domain's. `own_flavors`: per trust domain, its flavors."""
    domain_gpus = {domain: kai_gpu_units(_sum(o.supply for o in own_flavors.get(domain, ()))) for domain in organisation_of}
    leaves = []
    for tenant in sorted(cfg.tenants, key=lambda t: t.name):
        domain_units = domain_gpus[tenant.domain]
        units = kai_gpu_units(_sum([{r: a for (_, r), a in grants[tenant.name].items()}]))
        percent = tenant.borrowing.limit_percent
        weight = tenant.borrowing.fair_share_weight
        cpu, memory = millicores(tenant.quota.cpu), megabytes(tenant.quota.memory)
        leaves.append(
            KaiQueueSpec(
                name=tenant_names(tenant).cluster_queue,
                parent=trust_domain_queue(tenant.domain),
                tenant=tenant.name,
                trust_domain=tenant.domain,
                gpu=KaiShare(units, weight, domain_units if percent is None else min(domain_units, units + units * percent // 100)),
                cpu=KaiShare(cpu, weight, cpu),
                memory=KaiShare(memory, weight, memory),
            )
        )
    domains = []
    organisation_gpus: dict[str, int] = defaultdict(int)
    for domain, organisation in sorted(organisation_of.items()):
        domains.append(
            _parent(trust_domain_queue(domain), organisation_queue(organisation) if organisation else None, domain, domain_gpus[domain])
        )
        if organisation:
            organisation_gpus[organisation] += domain_gpus[domain]
    organisations = [_parent(organisation_queue(org), None, None, organisation_gpus[org]) for org in sorted(organisation_gpus)]
    return tuple(organisations + domains + leaves)


UNLIMITED = -1
"""KAI's `quota: -1` (deserves all it asks) and `limit: -1` (no cap)."""


def _parent(name: str, parent: str | None, domain: str | None, gpu: int) -> KaiQueueSpec:
    # GPU limit == quota, and CPU/memory deserve all: nothing over quota to share out, hence no weight.
    unlimited = KaiShare(UNLIMITED, 0, UNLIMITED)
    return KaiQueueSpec(name, parent, None, domain, KaiShare(gpu, 0, gpu), unlimited, unlimited)


def _sum(resource_maps) -> dict[str, int]:
    total: dict[str, int] = {}
    for resources in resource_maps:
        for name, amount in resources.items():
            total[name] = total.get(name, 0) + amount
    return total


# --------------------------------------------------------------------------- Volcano


def _volcano_queue(tenant: Tenant, grants: Mapping[tuple[str, str], int], gpu_resources: tuple[str, ...]) -> VolcanoQueueSpec:
    granted = _sum([{r: a for (_, r), a in grants.items()}])
    capability: list[tuple[str, int | str]] = [("cpu", tenant.quota.cpu), ("memory", tenant.quota.memory)]
    capability += [(r, granted.get(r, 0)) for r in gpu_resources]
    return VolcanoQueueSpec(
        tenant=tenant.name,
        weight=tenant.borrowing.fair_share_weight,
        capability=tuple(capability),
        guarantee=tuple((r, granted[r]) for r in gpu_resources if granted.get(r)),
    )
