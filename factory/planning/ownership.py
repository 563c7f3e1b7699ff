"""One pool: which nodes each low-trust tenant, trust domain and the whole GPUs own, and which GPU
slot of those nodes each GPU takes."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from dataclasses import dataclass

from ai_factory.factory.model.gpus import COMPUTE_SLICES, GPU_MODELS, MEMORY_SLICES, GpuModel
from ai_factory.factory.planning.demands import PACKING_HEADROOM, PoolRequests
from ai_factory.factory.planning.mig import ceil_div, mig_gpus
from ai_factory.factory.planning.model import (
    WHOLE_GPU,
    GpuAssignment,
    NodePlan,
    PoolPlan,
    PoolSpec,
    Slot,
    gpu_grants,
    hami_memory_capacity,
    mig_config_name,
    mig_parted_entries,
)
from ai_factory.factory.planning.replan import Previous, gpu_geometry, node_class_of
from ai_factory.factory.planning.sharing import hami_gpus, time_sliced_gpus


@dataclass
class _Group:
    """Tenants that get whole nodes together: a low-trust tenant, a trust domain's shared GPUs of
    one node class, or the pool's whole GPUs owned GPU by GPU."""

    key: tuple[int, str, str]
    """(0, tenant, "") dedicated | (1, domain, node class) shared | (2, "", "") whole."""
    gpus: list[tuple[GpuAssignment, Slot | None]] = dataclasses.field(default_factory=list)
    """Shared GPUs with the slot they held in the previous plan, if kept."""
    whole: Counter[str] = dataclasses.field(default_factory=Counter)
    """Tenant -> whole GPUs placed on this group's nodes."""
    need_nodes: int = 0
    nodes: list[str] = dataclasses.field(default_factory=list)

    @property
    def trust_domain(self) -> str | None:
        return self.key[1] if self.key[0] == 1 else None


def plan_pool(pool: PoolSpec, request: PoolRequests, before: PoolPlan | None, problems: list[str]) -> PoolPlan | None:
    model = GPU_MODELS[pool.gpu_model]
    per_node = pool.gpus_per_node
    beyond = beyond_capacity(pool, model, request)
    if beyond:
        problems.extend(beyond)
        return None  # packing what can never fit would cost time in the size of the demand
    previous = Previous(before, pool)
    groups: dict[tuple[int, str, str], _Group] = {}

    def group(key: tuple[int, str, str]) -> _Group:
        return groups.setdefault(key, _Group(key))

    for tenant, count in sorted(request.dedicated.items()):
        group((0, tenant, "")).whole[tenant] = count
    for domain, mig in sorted(request.mig.items()):
        group((1, domain, "mig")).gpus = mig_gpus(model, domain, mig, previous.shared_gpus(domain, "mig"))
    for (domain, scaling), slices in sorted(request.hami.items()):
        node_class = node_class_of("hami", scaling)
        group((1, domain, node_class)).gpus = hami_gpus(
            model, pool, domain, scaling, slices, previous.shared_gpus(domain, node_class)
        )
    for domain, replicas in sorted(request.time_sliced.items()):
        group((1, domain, "time-sliced")).gpus = time_sliced_gpus(
            pool.time_slicing_replicas, domain, replicas, previous.shared_gpus(domain, "time-sliced")
        )
    # Keeping whole GPUs where they were (churn) ranks above packing nodes tighter; when that does
    # not fit the pool, size the groups tightly instead.
    _size_groups(groups, request, previous, per_node, keep_whole_in_place=before is not None)
    if before is not None and sum(g.need_nodes for g in groups.values()) > len(pool.nodes):
        _size_groups(groups, request, previous, per_node, keep_whole_in_place=False)

    order = sorted(groups)
    taken: set[str] = set()
    for take_previous in (True, False):
        for key in order:
            g = groups[key]
            candidates = previous.nodes_for(g.key, g.whole) if take_previous else pool.nodes
            for node in candidates:
                if len(g.nodes) == g.need_nodes:
                    break
                if node not in taken:
                    g.nodes.append(node)
                    taken.add(node)
    if any(len(g.nodes) < g.need_nodes for g in groups.values()):
        problems.extend(_shortfall(pool, model, request, [groups[k] for k in order]))
        return None

    assignments: dict[Slot, GpuAssignment] = {}
    node_owner: dict[str, tuple[str | None, str | None]] = {}
    for key in order:
        g = groups[key]
        g.nodes.sort()
        own_nodes = set(g.nodes)
        domain = request.domain_of[key[1]] if key[0] == 0 else g.trust_domain
        for node in g.nodes:
            node_owner[node] = (domain, key[1] if key[0] == 0 else None)
        # Kept GPUs and whole GPUs stay in their previous slot when it is on this group's nodes.
        pending = []
        for gpu, slot in g.gpus:
            if slot is not None and slot[0] in own_nodes and slot not in assignments:
                assignments[slot] = dataclasses.replace(gpu, index=slot[1])
            else:
                pending.append(gpu)
        whole_left = Counter(g.whole)
        for tenant in sorted(whole_left):
            for slot in previous.whole_slots(tenant):
                if whole_left[tenant] and slot[0] in own_nodes and slot not in assignments:
                    assignments[slot] = _whole(slot[1], tenant, request)
                    whole_left[tenant] -= 1
        free = _FreeSlots([(n, i) for n in g.nodes for i in range(per_node) if (n, i) not in assignments], previous)
        for gpu in pending:
            slot = free.take(gpu_geometry(gpu))
            assignments[slot] = dataclasses.replace(gpu, index=slot[1])
        for tenant in sorted(whole_left):
            for _ in range(whole_left[tenant]):
                slot = free.take(None)
                assignments[slot] = _whole(slot[1], tenant, request)

    nodes = []
    for name in pool.nodes:
        domain, dedicated = node_owner.get(name, (None, None))
        gpus = tuple(assignments.get((name, i), GpuAssignment(i, "idle", domain)) for i in range(per_node))
        config = None
        if pool.sharing == "mig":
            config = mig_config_name(pool.name, mig_parted_entries(model, gpus))
        nodes.append(NodePlan(name, domain, dedicated, config, gpus))
    return PoolPlan(
        name=pool.name,
        gpu_model=pool.gpu_model,
        sharing=pool.sharing,
        gpus_per_node=per_node,
        time_slicing_replicas=pool.time_slicing_replicas,
        hami_split_count=pool.hami_split_count,
        nodes=tuple(nodes),
        vm_resource=pool.vm_resource,
    )


def _size_groups(
    groups: dict[tuple[int, str, str], _Group],
    request: PoolRequests,
    previous: Previous,
    per_node: int,
    keep_whole_in_place: bool,
) -> None:
    """Nodes each group needs. Whole GPUs of high- and medium-trust tenants go on idle GPUs of their
    own domain's MIG nodes (MIG disabled there), the rest on nodes of whole GPUs owned GPU by GPU.
    With keep_whole_in_place, whole GPUs stay on the kind of node they had in the previous plan,
    and a domain takes one more node rather than push its whole GPUs out."""
    groups.pop((2, "", ""), None)
    for g in groups.values():
        if g.key[0] == 0:
            g.need_nodes = ceil_div(sum(g.whole.values()), per_node)
        else:
            g.whole = Counter()
            g.need_nodes = ceil_div(len(g.gpus), per_node)
    shared_whole: Counter[str] = Counter()
    for domain, tenants in sorted(request.whole.items()):
        own = groups.get((1, domain, "mig"))
        was_on_own_nodes: Counter[str] = Counter()
        was_elsewhere: Counter[str] = Counter()
        for slot, gpu in previous.gpus.items():
            if gpu.mode == "whole" and gpu.owner in tenants:
                node_domain = previous.node_domain.get(slot[0])
                (was_on_own_nodes if node_domain == domain else was_elsewhere)[gpu.owner] += 1
        colocated: Counter[str] = Counter()
        if own is not None:
            staying = Counter({t: min(n, was_on_own_nodes[t]) for t, n in tenants.items()})
            if keep_whole_in_place:
                own.need_nodes = ceil_div(len(own.gpus) + sum(staying.values()), per_node)
                newcomers = tenants - was_on_own_nodes - was_elsewhere
                preferences = (staying, newcomers)
            else:
                preferences = (staying, tenants)
            room = own.need_nodes * per_node - len(own.gpus)
            for preference in preferences:
                for tenant in sorted(tenants):
                    take = min(tenants[tenant] - colocated[tenant], preference[tenant], room)
                    colocated[tenant] += take
                    room -= take
            own.whole = +colocated
        shared_whole += tenants - colocated
    if shared_whole:
        need = ceil_div(sum(shared_whole.values()), per_node)
        groups[2, "", ""] = _Group((2, "", ""), whole=shared_whole, need_nodes=need)


def _whole(index: int, tenant: str, request: PoolRequests) -> GpuAssignment:
    return GpuAssignment(index, "whole", request.domain_of[tenant], owner=tenant)


class _FreeSlots:
    """A group's free slots in node order; a GPU takes a slot that had its geometry if one is left
    (re-planning then changes fewer GPUs), else the first free one."""

    def __init__(self, slots: list[Slot], previous: Previous):
        self._order = slots
        self._next = 0
        self._taken: set[Slot] = set()
        self._by_geometry: dict[tuple, list[Slot]] = defaultdict(list)
        for slot in reversed(slots):
            geometry = previous.geometry(slot)
            if geometry is not None:
                self._by_geometry[geometry].append(slot)

    def take(self, geometry: tuple | None) -> Slot:
        same = self._by_geometry.get(geometry) if geometry is not None else None
        while same:
            slot = same.pop()
            if slot not in self._taken:
                self._taken.add(slot)
                return slot
        while self._order[self._next] in self._taken:
            self._next += 1
        slot = self._order[self._next]
        self._taken.add(slot)
        return slot


def beyond_capacity(pool: PoolSpec, model: GpuModel, request: PoolRequests) -> list[str]:
    """Shared demands (MIG slices, HAMi memory and cores, time-sliced replicas) beyond
    `PACKING_HEADROOM` times what every GPU of the pool together could hold, checked on the
    demands' totals, so the packers only ever run on demands the supply bounds (HAMi vGPUs are
    bounded as they are collected, `demands._add_demand`)."""
    gpus = len(pool.nodes) * pool.gpus_per_node
    totals: list[tuple[str, Counter[str], int]] = []
    compute: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    for instances in request.mig.values():
        for (tenant, profile), n in instances.items():
            compute[tenant] += n * model.profile(profile).compute_slices
            memory[tenant] += n * model.profile(profile).memory_slices
    totals += [("MIG compute slices", compute, gpus * COMPUTE_SLICES), ("MIG memory slices", memory, gpus * MEMORY_SLICES)]
    gpumem: Counter[str] = Counter()
    cores: Counter[str] = Counter()
    for slices in request.hami.values():
        for allocation, n in Counter(slices).items():
            gpumem[allocation.tenant] += n * allocation.memory_mib
            cores[allocation.tenant] += n * allocation.cores_percent
    most_memory = max((hami_memory_capacity(model, scaling) for _, scaling in request.hami), default=0)
    totals += [
        ("MiB of HAMi GPU memory", gpumem, gpus * most_memory),
        ("percent of HAMi GPU cores", cores, gpus * 100),
    ]
    replicas: Counter[str] = Counter()
    for shares in request.time_sliced.values():
        replicas.update(shares)
    totals.append(("time-sliced replicas", replicas, gpus * pool.time_slicing_replicas))
    lines = []
    for what, by_tenant, bound in totals:
        total = sum(by_tenant.values())
        if total > PACKING_HEADROOM * bound:
            named = sorted(by_tenant.items())
            listed = ", ".join(f"{t} {n}" for t, n in named[:10]) + (f" and {len(named) - 10} more" if len(named) > 10 else "")
            lines.append(
                f"pool {pool.name!r}: the demands ask for {total} {what} in all ({listed}), more than {PACKING_HEADROOM} "
                f"times what its {gpus} GPUs could ever hold ({bound}); refused before planning"
            )
    return lines


def _shortfall(pool: PoolSpec, model: GpuModel, request: PoolRequests, groups: list[_Group]) -> list[str]:
    """Every tenant and resource the pool cannot supply, granting nodes in the planner's order."""
    needed_nodes = sum(g.need_nodes for g in groups)
    lines = [
        f"pool {pool.name!r}: the demands need {needed_nodes} nodes of {pool.gpus_per_node} GPUs, the pool has "
        f"{len(pool.nodes)} (short {needed_nodes - len(pool.nodes)}); nodes go first to whoever held them in the "
        "previous plan, then to low-trust tenants, trust domains with shared GPUs and whole GPUs, in name order"
    ]
    for g in groups:
        if len(g.nodes) >= g.need_nodes:
            continue
        available = len(g.nodes) * pool.gpus_per_node
        needed: Counter[tuple[str, str]] = Counter()
        supplied: Counter[tuple[str, str]] = Counter()
        for position, (gpu, _) in enumerate(g.gpus):
            for tenant, resource, amount in gpu_grants(model, gpu):
                needed[tenant, resource] += amount
                if position < available:
                    supplied[tenant, resource] += amount
        room = max(0, available - len(g.gpus))
        for tenant in sorted(g.whole):
            needed[tenant, WHOLE_GPU] += g.whole[tenant]
            supplied[tenant, WHOLE_GPU] += min(g.whole[tenant], room)
            room -= min(g.whole[tenant], room)
        where = " on dedicated nodes" if g.key[0] == 0 else ""
        for tenant, resource in sorted(needed):
            need, have = needed[tenant, resource], supplied[tenant, resource]
            if have < need:
                lines.append(
                    f"tenant {tenant!r} on pool {pool.name!r}: needs {need} {resource}{where}, the pool can supply "
                    f"{have} to trust domain {request.domain_of[tenant]!r} (short {need - have})"
                )
    return lines
