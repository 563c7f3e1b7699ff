"""Capacity planner: which GPU of which node serves which tenant, and how that GPU is sliced.

Pure and deterministic: the same pools and tenants give the same `Plan`, byte for byte in JSON. No
Pulumi, Kubernetes or pydantic here; the configuration layer adapts to the dataclasses below.

Hard rules (shared/BRIEF.md, shared/reference/gpu-sharing.md sections 2, 3 and 6):
- A GPU never serves two trust domains. A node with shared GPUs (MIG, HAMi, time-slicing) belongs
  to one trust domain as a whole, because neither the device plugin nor HAMi lets a pod choose
  which GPU of a node it gets. Whole GPUs are owned per GPU, so high- and medium-trust tenants of
  different domains may have whole GPUs on one node.
- Low-trust tenants get whole GPUs only, on nodes dedicated to them; the GPUs they did not ask for
  on those nodes stay idle and are reported against them.
- MIG pools are owned by MIG Manager, HAMi pools by HAMi; no GPU has both.
- Every MIG layout has legal, non-overlapping start slots (checked, not assumed).
- HAMi memory is never oversubscribed unless the tenant opted in.

Objective, in order: GPUs used (MIG packing is exact per pool and trust domain; stranded MIG
slices, 7 or 8 per GPU minus the demand, follow from it), then, when re-planning, GPUs whose work
is disturbed (a MIG geometry change drains the GPU), then idle GPUs on owned nodes. HAMi and
time-slicing are packed by heuristics whose gap to the lower bound the figures report.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable, Literal, Mapping, Sequence

from ai_factory.factory.model.gpus import COMPUTE_SLICES, GPU_MODELS, MEMORY_SLICES, MIG_CLASSES, GpuModel

Sharing = Literal["exclusive", "mig", "time-slicing", "hami", "dra"]
Trust = Literal["high", "medium", "low"]
GpuMode = Literal["whole", "mig", "hami", "time-sliced", "idle"]

WHOLE_GPU = "nvidia.com/gpu"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_CORES = "nvidia.com/gpucores"


# =========================================================================== inputs


@dataclass(frozen=True)
class PoolSpec:
    name: str
    gpu_model: str
    gpus_per_node: int
    nodes: tuple[str, ...]
    """Explicit node names; the planner uses them in sorted order."""
    sharing: Sharing
    time_slicing_replicas: int = 4
    hami_split_count: int = 10


@dataclass(frozen=True)
class HamiSlice:
    """`count` vGPUs of `memory_mib` and `cores_percent` each; every vGPU lands on one GPU."""

    count: int
    memory_mib: int
    cores_percent: int


@dataclass(frozen=True)
class Demand:
    """One tenant demand on one pool; exactly one of whole_gpus, mig, hami, time_sliced_replicas."""

    pool: str
    whole_gpus: int = 0
    mig: tuple[tuple[str, int], ...] = ()
    """(profile name, count) pairs, e.g. (("1g.10gb", 4), ("3g.40gb", 1))."""
    hami: tuple[HamiSlice, ...] = ()
    time_sliced_replicas: int = 0
    hami_oversubscribe: bool = False
    """The tenant accepts HAMi device-memory oversubscription on its GPUs."""
    hami_memory_scaling: float = 1.0
    """HAMi `deviceMemoryScaling` for this tenant's GPUs; above 1 only with hami_oversubscribe."""


@dataclass(frozen=True)
class TenantSpec:
    name: str
    trust: Trust
    trust_domain: str
    demands: tuple[Demand, ...]


class PlanError(ValueError):
    """Every reason the demands cannot be planned, each naming tenant, pool, resource and shortfall."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(f"{len(problems)} planning problem(s):\n" + "\n".join(f"  - {p}" for p in problems))


# =========================================================================== outputs


@dataclass(frozen=True)
class MigInstance:
    profile: str
    start: int
    tenant: str


@dataclass(frozen=True)
class HamiAllocation:
    tenant: str
    memory_mib: int
    cores_percent: int


@dataclass(frozen=True)
class TimeSliceShare:
    tenant: str
    replicas: int


@dataclass(frozen=True)
class GpuAssignment:
    index: int
    mode: GpuMode
    trust_domain: str | None
    """Domain the GPU serves; on an owned node its idle GPUs carry the node's domain."""
    owner: str | None = None
    """Tenant of a whole GPU."""
    mig: tuple[MigInstance, ...] = ()
    hami: tuple[HamiAllocation, ...] = ()
    hami_memory_scaling: float = 1.0
    time_slices: tuple[TimeSliceShare, ...] = ()


@dataclass(frozen=True)
class NodePlan:
    name: str
    trust_domain: str | None
    """Owning domain: a domain with shared GPUs here, or a low-trust tenant's domain; None for a
    node of whole GPUs owned GPU by GPU (or an unused node)."""
    dedicated_tenant: str | None
    """The low-trust tenant this node is dedicated to."""
    mig_config: str | None
    """mig-parted config for the `nvidia.com/mig.config` label (MIG pools only)."""
    gpus: tuple[GpuAssignment, ...]


@dataclass(frozen=True)
class PoolPlan:
    name: str
    gpu_model: str
    sharing: Sharing
    gpus_per_node: int
    time_slicing_replicas: int
    hami_split_count: int
    nodes: tuple[NodePlan, ...]


@dataclass(frozen=True)
class Figures:
    """Quality figures for one (pool, trust domain), one pool (trust_domain None) or the fleet
    (pool and trust_domain None).

    Allocation utilisation = allocated GPU-equivalents / GPUs used, each GPU counting its dominant
    share: MIG max(Σcompute/7, Σmemory/8) of its instances, HAMi max(Σmemory/GPU memory,
    Σcores/100) (capped at 1 when memory is oversubscribed), time-sliced used replicas / replicas
    per GPU, whole 1. A GPU-level share (not a per-instance sum) so that 4g+3g counts as one GPU,
    not 1.07.
    """

    pool: str | None
    trust_domain: str | None
    nodes_used: int
    """Nodes the domain owns (shared or dedicated); pool and fleet rows: nodes with a GPU in use."""
    gpus_used: int
    lower_bound: int
    """MIG: max(LB1, LB2, LB3) of mig-profiles.yaml; whole: their count; HAMi: max(ceil(Σmem /
    GPU memory), ceil(Σcores / 100), ceil(slices / split count)); time-slicing: ceil(replicas /
    replicas per GPU); summed per domain (trust domains partition the fleet)."""
    gap: int
    idle_gpus: int
    """GPUs left idle on the used nodes (node ownership and dedicated nodes strand them)."""
    idle_gpus_by_tenant: tuple[tuple[str, int], ...]
    """Idle GPUs on nodes dedicated to low-trust tenants, attributed to them."""
    stranded_compute_slices: int
    stranded_memory_slices: int
    gpu_equivalents: float
    utilisation: float
    hami_memory_oversubscription: float
    """Largest allocated / physical memory on one HAMi GPU (0 without HAMi; above 1 only for
    tenants that opted in)."""


@dataclass(frozen=True)
class Plan:
    pools: tuple[PoolPlan, ...]
    figures: tuple[Figures, ...]
    """One row per (pool, trust domain), sorted."""
    pool_figures: tuple[Figures, ...]
    fleet_figures: Figures
    changed_gpus: int | None
    """GPUs in use in the previous plan whose MIG layout, owner or allocations the new plan
    changes (None when planned from scratch); new work in a GPU's spare room does not count."""

    # ------------------------------------------------------------------ queries

    def pool(self, name: str) -> PoolPlan:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no pool {name!r} in the plan; pools: {', '.join(p.name for p in self.pools)}")

    def tenant_capacity(self, tenant: str) -> dict[tuple[str, str], int]:
        """What `tenant` was granted, per (pool, resource name): whole GPUs and time-sliced
        replicas as nvidia.com/gpu, MIG instances by profile resource, HAMi vGPU slots
        (nvidia.com/gpu), memory in MiB (nvidia.com/gpumem) and cores in percent
        (nvidia.com/gpucores)."""
        return dict(self._capacity_by_tenant.get(tenant, {}))

    def supply(self, pool: str, trust_domain: str) -> dict[str, int]:
        """What the plan physically creates for `trust_domain` in `pool`: resources advertised by
        the GPUs assigned to it (idle GPUs excluded: no quota may be written against them).
        Queue quotas of the domain's tenants must never add up to more than this."""
        self.pool(pool)  # an unknown pool is an error, not an empty supply
        return dict(self._supply_by_domain.get((pool, trust_domain), {}))

    # Every layer asks these per tenant or per offering: index the GPUs once per plan (a frozen
    # dataclass still has a __dict__, which is where cached_property keeps the index).
    @cached_property
    def _capacity_by_tenant(self) -> dict[str, dict[tuple[str, str], int]]:
        capacity: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
        for pool in self.pools:
            model = GPU_MODELS[pool.gpu_model]
            for gpu in (gpu for node in pool.nodes for gpu in node.gpus):
                for owner, resource, amount in _grants(model, gpu):
                    capacity[owner][pool.name, resource] += amount
        return {tenant: dict(sorted(c.items())) for tenant, c in capacity.items()}

    @cached_property
    def _supply_by_domain(self) -> dict[tuple[str, str], dict[str, int]]:
        supply: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        for pool_plan in self.pools:
            model = GPU_MODELS[pool_plan.gpu_model]
            for gpu in (gpu for node in pool_plan.nodes for gpu in node.gpus):
                domain = supply[pool_plan.name, gpu.trust_domain]
                if gpu.mode == "whole":
                    domain[WHOLE_GPU] += 1
                elif gpu.mode == "mig":
                    domain.update(model.profile(i.profile).resource_name for i in gpu.mig)
                elif gpu.mode == "hami":
                    domain[WHOLE_GPU] += pool_plan.hami_split_count
                    domain[HAMI_MEMORY] += _hami_memory_capacity(model, gpu.hami_memory_scaling)
                    domain[HAMI_CORES] += 100
                elif gpu.mode == "time-sliced":
                    domain[WHOLE_GPU] += pool_plan.time_slicing_replicas
        return {key: dict(sorted(c.items())) for key, c in supply.items()}

    def node_mig_config(self, node: str) -> str | None:
        for pool in self.pools:
            for node_plan in pool.nodes:
                if node_plan.name == node:
                    return node_plan.mig_config
        raise KeyError(f"no node {node!r} in the plan")

    def mig_configs(self) -> dict[str, list[dict[str, Any]]]:
        """mig-parted v1 `mig-configs` entries per config name (gpu-sharing.md section 2.1): GPUs
        with identical geometry grouped by index, every entry restricted by `device-filter` to the
        pool's GPU model so a config can never be applied to another model."""
        configs: dict[str, list[dict[str, Any]]] = {}
        for pool in self.pools:
            model = GPU_MODELS[pool.gpu_model]
            for node in pool.nodes:
                if node.mig_config is not None:
                    configs[node.mig_config] = _mig_parted_entries(model, node.gpus)
        return dict(sorted(configs.items()))

    # ------------------------------------------------------------------ serialisation

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=2)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        data = json.loads(text)
        return cls(
            pools=tuple(_pool_from_dict(p) for p in data["pools"]),
            figures=tuple(_figures_from_dict(f) for f in data["figures"]),
            pool_figures=tuple(_figures_from_dict(f) for f in data["pool_figures"]),
            fleet_figures=_figures_from_dict(data["fleet_figures"]),
            changed_gpus=data["changed_gpus"],
        )

    # ------------------------------------------------------------------ report

    def render_table(self) -> str:
        lines: list[str] = []
        for pool in self.pools:
            gpus = len(pool.nodes) * pool.gpus_per_node
            lines.append(
                f"pool {pool.name}: {pool.gpu_model}, {pool.sharing}, {len(pool.nodes)} nodes x "
                f"{pool.gpus_per_node} GPUs = {gpus} GPUs"
            )
            rows = [("node", "gpu", "mode", "layout", "owner", "domain", "mig config")]
            for node in pool.nodes:
                for gpu in node.gpus:
                    layout, owner = _describe_gpu(gpu)
                    rows.append(
                        (
                            node.name,
                            str(gpu.index),
                            gpu.mode,
                            layout,
                            owner,
                            gpu.trust_domain or "-",
                            node.mig_config or "-",
                        )
                    )
            lines.extend(_table(rows))
            lines.append("")
        rows = [
            (
                "pool",
                "trust domain",
                "nodes",
                "GPUs",
                "LB",
                "gap",
                "idle",
                "stranded c/m",
                "GPU-eq",
                "util",
                "HAMi mem x",
            )
        ]
        for row in (*self.figures, *self.pool_figures, self.fleet_figures):
            rows.append(
                (
                    row.pool or "(fleet)",
                    row.trust_domain or ("(all)" if row.pool else "-"),
                    str(row.nodes_used),
                    str(row.gpus_used),
                    str(row.lower_bound),
                    str(row.gap),
                    str(row.idle_gpus)
                    + ("".join(f" ({t}: {n})" for t, n in row.idle_gpus_by_tenant) if row.trust_domain else ""),
                    f"{row.stranded_compute_slices}/{row.stranded_memory_slices}",
                    f"{row.gpu_equivalents:.2f}",
                    f"{row.utilisation:.3f}",
                    f"{row.hami_memory_oversubscription:.2f}",
                )
            )
        lines.extend(_table(rows))
        if self.changed_gpus is not None:
            lines.append(f"GPUs changed since the previous plan: {self.changed_gpus}")
        return "\n".join(lines) + "\n"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def _describe_gpu(gpu: GpuAssignment) -> tuple[str, str]:
    if gpu.mode == "mig":
        layout = " ".join(f"{i.profile}@{i.start}" for i in gpu.mig)
        owner = ",".join(sorted({i.tenant for i in gpu.mig}))
    elif gpu.mode == "hami":
        layout = " ".join(f"{a.memory_mib}MiB/{a.cores_percent}%" for a in gpu.hami)
        if gpu.hami_memory_scaling != 1.0:
            layout += f" (memory x{gpu.hami_memory_scaling:g})"
        owner = ",".join(sorted({a.tenant for a in gpu.hami}))
    elif gpu.mode == "time-sliced":
        layout = " ".join(f"{s.replicas}x" for s in gpu.time_slices)
        owner = ",".join(s.tenant for s in gpu.time_slices)
    else:
        layout, owner = "-", gpu.owner or "-"
    return layout, owner


def _pool_from_dict(data: dict[str, Any]) -> PoolPlan:
    return PoolPlan(
        name=data["name"],
        gpu_model=data["gpu_model"],
        sharing=data["sharing"],
        gpus_per_node=data["gpus_per_node"],
        time_slicing_replicas=data["time_slicing_replicas"],
        hami_split_count=data["hami_split_count"],
        nodes=tuple(
            NodePlan(
                name=node["name"],
                trust_domain=node["trust_domain"],
                dedicated_tenant=node["dedicated_tenant"],
                mig_config=node["mig_config"],
                gpus=tuple(
                    GpuAssignment(
                        index=gpu["index"],
                        mode=gpu["mode"],
                        trust_domain=gpu["trust_domain"],
                        owner=gpu["owner"],
                        mig=tuple(MigInstance(**i) for i in gpu["mig"]),
                        hami=tuple(HamiAllocation(**a) for a in gpu["hami"]),
                        hami_memory_scaling=gpu["hami_memory_scaling"],
                        time_slices=tuple(TimeSliceShare(**s) for s in gpu["time_slices"]),
                    )
                    for gpu in node["gpus"]
                ),
            )
            for node in data["nodes"]
        ),
    )


def _figures_from_dict(data: dict[str, Any]) -> Figures:
    return Figures(
        **{
            **data,
            "idle_gpus_by_tenant": tuple((tenant, count) for tenant, count in data["idle_gpus_by_tenant"]),
        }
    )


# =========================================================================== MIG geometry

# Classes from largest to smallest; count vectors below follow this order.
MIG_CLASS_ORDER = ("c7m8", "c4m4", "c3m4", "c2m2", "c1m2", "c1m1", "c1m1_me")

# A lone 3g goes to start 4: at start 0 it takes memory 0-3, and the 1g instances that could use
# the 7th compute slice only start at 0..6, so one slice would be stranded
# (mig-profiles.yaml strand_compute_with_3g_at_0).
_START_PREFERENCE = {"c3m4": (4, 0)}


def mig_lower_bound(counts: Mapping[str, int]) -> int:
    """max(LB1, LB2, LB3) of mig-profiles.yaml for a demand given as instances per class.

    It can sit one below the optimum (3x4g, 7x2g, {5x2g, 1x3g, 2x4g}); `min_mig_gpus` is exact."""
    compute = sum(MIG_CLASSES[k].compute_slices * n for k, n in counts.items())
    memory = sum(MIG_CLASSES[k].memory_slices * n for k, n in counts.items())
    n7, n4, n3 = counts.get("c7m8", 0), counts.get("c4m4", 0), counts.get("c3m4", 0)
    return max(
        _ceil_div(compute, COMPUTE_SLICES),
        _ceil_div(memory, MEMORY_SLICES),
        n7 + n4 + _ceil_div(max(0, n3 - n4), 2),
        max((_ceil_div(n, MIG_CLASSES[k].max_count) for k, n in counts.items()), default=0),
    )


def min_mig_gpus(counts: Mapping[str, int]) -> int:
    """The exact minimum number of GPUs that hold the MIG instances `counts` (per class)."""
    return _solve(counts)[0]


def pack_mig_classes(counts: Mapping[str, int]) -> list[tuple[str, ...]]:
    """An optimal packing: one tuple of instance classes per GPU, fullest GPUs first."""
    total, split = _solve(counts)
    gpus = _build_gpus(counts, total, split)
    assert len(gpus) == total
    return gpus


def place_mig(classes: Sequence[str]) -> tuple[tuple[str, int], ...] | None:
    """Legal start slots for the instance classes of one GPU, as (class, start) pairs in start
    order, or None when they do not fit on one GPU."""
    if sum(MIG_CLASSES[k].compute_slices for k in classes) > COMPUTE_SLICES:
        return None
    if any(n > MIG_CLASSES[k].max_count for k, n in Counter(classes).items()):
        return None
    order = sorted(classes, key=lambda k: (-MIG_CLASSES[k].memory_slices, -MIG_CLASSES[k].compute_slices, k))
    used = [False] * MEMORY_SLICES
    starts: list[int] = []

    def place_from(i: int) -> bool:
        if i == len(order):
            return True
        geometry = MIG_CLASSES[order[i]]
        for start in _START_PREFERENCE.get(order[i], geometry.placements):
            span = range(start, start + geometry.memory_slices)
            if any(used[j] for j in span):
                continue
            for j in span:
                used[j] = True
            starts.append(start)
            if place_from(i + 1):
                return True
            starts.pop()
            for j in span:
                used[j] = False
        return False

    if not place_from(0):
        return None
    return tuple(sorted(zip(order, starts), key=lambda pair: (pair[1], pair[0])))


def mig_layout_problems(model: GpuModel, instances: Sequence[tuple[str, int]]) -> list[str]:
    """Why (profile, start) instances are not a legal layout of one `model` GPU (empty if legal)."""
    problems: list[str] = []
    occupied: dict[int, str] = {}
    compute = 0
    profiles = []
    for name, start in instances:
        try:
            profile = model.profile(name)
        except KeyError as error:
            problems.append(error.args[0])
            continue
        profiles.append(profile)
        compute += profile.compute_slices
        if start not in profile.placements:
            problems.append(f"{name} cannot start at memory slice {start} (legal starts: {profile.placements})")
            continue
        for slice_index in range(start, start + profile.memory_slices):
            if slice_index in occupied:
                problems.append(
                    f"{name}@{start} overlaps {occupied[slice_index]} on memory slice {slice_index}"
                )
                break
            occupied[slice_index] = f"{name}@{start}"
    if compute > COMPUTE_SLICES:
        problems.append(f"the instances use {compute} compute slices, more than {COMPUTE_SLICES}")
    memory = sum(p.memory_slices for p in profiles)
    if memory > MEMORY_SLICES:
        problems.append(f"the instances use {memory} memory slices, more than {MEMORY_SLICES}")
    for profile, count in sorted(Counter(profiles).items(), key=lambda item: item[0].name):
        if count > profile.max_count:
            problems.append(f"{count} x {profile.name} on one GPU, at most {profile.max_count} allowed")
    return problems


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# The exact packer. A GPU is described by its large instances (4g and 3g) and the "hole" they leave
# for the small ones (2g, 1g with two memory slices, 1g, 1g+me):
#   4g+3g (full) | 4g + hole(3 compute, 4 memory) | 3g+3g (full: 1 compute slice left, no memory)
#   3g + hole(4, 4) | empty hole(7, 8)          and every 7g alone on its GPU.
# In a hole with compute c and memory m (m - c is 1 for the odd holes 3/4 and 7/8, 0 for 4/4), small
# instances fit iff they fit in c "units" where a 2g costs 2, a 1g costs 1, and a two-memory-slice
# 1g costs 2 except the first one in an odd hole, which costs 1 (it uses the spare memory slice).
# For given counts of the five GPU kinds, feasibility is then a handful of aggregate inequalities
# (two-unit items by a greedy that fills free slots first; the 1g+me limit of one per GPU by Hall's
# condition), so the search is over the number of 3g+3g GPUs only: the number of 4g+3g GPUs can
# be taken as small as the GPU count allows, since it affects only the 1g+me conditions, and only
# for the worse. tests/test_planner.py checks the result against an independent brute force.


def _solve(counts: Mapping[str, int]) -> tuple[int, tuple[int, int, int] | None]:
    """(minimum GPUs, (4g+3g GPUs, 3g+3g GPUs, cheap two-slice 1g) for the non-7g part)."""
    unknown = set(counts) - set(MIG_CLASS_ORDER)
    if unknown:
        raise ValueError(f"unknown MIG classes {sorted(unknown)}")
    n7, n4, n3, n2, n12, n11, nme = (counts.get(k, 0) for k in MIG_CLASS_ORDER)
    rest = {k: n for k, n in counts.items() if k != "c7m8" and n}
    if not rest:
        return n7, None
    # Fitting in k GPUs is monotone in k: gallop up from the lower bound, then bisect.
    failed = mig_lower_bound(rest) - 1
    step = 1
    while (split := _find_split(failed + step, n4, n3, n2, n12, n11, nme)) is None:
        failed += step
        step *= 2
    fits, fitting_split = failed + step, split
    while fits - failed > 1:
        mid = (failed + fits) // 2
        split = _find_split(mid, n4, n3, n2, n12, n11, nme)
        if split is None:
            failed = mid
        else:
            fits, fitting_split = mid, split
    return n7 + fits, fitting_split


def _find_split(k: int, n4: int, n3: int, n2: int, n12: int, n11: int, nme: int) -> tuple[int, int, int] | None:
    # Fewest 3g+3g GPUs first: such a GPU strands a compute slice.
    for pairs33 in range(n3 // 2 + 1):
        pairs43_min = max(0, n4 + n3 - k - pairs33)
        pairs43_max = min(n4, n3 - 2 * pairs33)
        if pairs43_min > pairs43_max:
            continue
        cheap = _cheap_range(k, pairs43_min, pairs33, n4, n3, n2, n12, n11, nme)
        if cheap is None:
            continue
        cheap_1g2 = cheap[1]
        # Pair as many 4g with 3g as the 1g+me conditions allow (full GPUs, fewer distinct
        # geometries); feasibility only gets harder as the pairs grow, so bisect.
        low, high = pairs43_min, pairs43_max
        while low < high:
            mid = (low + high + 1) // 2
            bounds = _cheap_range(k, mid, pairs33, n4, n3, n2, n12, n11, nme)
            if bounds is not None and bounds[0] <= cheap_1g2 <= bounds[1]:
                low = mid
            else:
                high = mid - 1
        return low, pairs33, cheap_1g2
    return None


def _cheap_range(
    k: int, pairs43: int, pairs33: int, n4: int, n3: int, n2: int, n12: int, n11: int, nme: int
) -> tuple[int, int] | None:
    """Feasible numbers of two-slice 1g placed in the cheap slot of an odd hole, or None."""
    holes3 = n4 - pairs43  # 4g + hole(3, 4)
    holes4 = n3 - pairs43 - 2 * pairs33  # 3g + hole(4, 4)
    holes7 = k - n4 - n3 + pairs43 + pairs33  # empty GPU: hole(7, 8)
    if min(holes3, holes4, holes7) < 0:
        return None
    holes = holes3 + holes4 + holes7
    odd_holes = holes3 + holes7
    units = 3 * holes3 + 4 * holes4 + 7 * holes7
    pair_slots = holes3 + 2 * holes4 + 3 * holes7
    # Two-unit items placed here leave every hole's room for 1g+me and the cheap 1g intact.
    free_pair_slots = 2 * holes7 + holes4
    # Room for "special" one-unit items (cheap 1g: odd holes only; 1g+me: one per hole) before any
    # two-unit item: min(units, 2) in an odd hole, min(units, 1) in an even one.
    special_room = 2 * odd_holes + holes4
    small = n2 + n12
    if nme > holes or small - free_pair_slots + nme > special_room:
        return None
    low = max(
        0,
        small - pair_slots,
        2 * small + n11 + nme - units,
        small - free_pair_slots - odd_holes - (holes - nme),
    )
    high = min(n12, odd_holes, special_room - nme)
    return (low, high) if low <= high else None


@dataclass
class _Hole:
    base: tuple[str, ...]
    units: int
    odd: bool
    small: list[str] = dataclasses.field(default_factory=list)

    def add(self, klass: str, cost: int) -> None:
        assert self.units >= cost
        self.small.append(klass)
        self.units -= cost


def _build_gpus(counts: Mapping[str, int], total: int, split: tuple[int, int, int] | None) -> list[tuple[str, ...]]:
    n7, n4, n3, n2, n12, n11, nme = (counts.get(k, 0) for k in MIG_CLASS_ORDER)
    gpus: list[tuple[str, ...]] = [("c7m8",)] * n7
    if split is None:
        return gpus
    pairs43, pairs33, cheap_1g2 = split
    k = total - n7
    gpus += [("c4m4", "c3m4")] * pairs43 + [("c3m4", "c3m4")] * pairs33
    holes7 = [_Hole((), 7, True) for _ in range(k - n4 - n3 + pairs43 + pairs33)]
    holes4 = [_Hole(("c3m4",), 4, False) for _ in range(n3 - pairs43 - 2 * pairs33)]
    holes3 = [_Hole(("c4m4",), 3, True) for _ in range(n4 - pairs43)]
    holes = holes7 + holes4 + holes3
    # Two-unit items: slots that keep special room first (see _cheap_range), then the rest.
    slots = [h for h in holes7 for _ in (0, 1)] + holes4 + holes7 + holes3 + holes4
    pair_items = ["c2m2"] * n2 + ["c1m2"] * (n12 - cheap_1g2)
    assert len(pair_items) <= len(slots)
    for klass, hole in zip(pair_items, slots):
        hole.add(klass, 2)
    # 1g+me where it costs no cheap slot first.
    me_order = (
        [h for h in holes if not h.odd and h.units >= 1]
        + [h for h in holes if h.odd and h.units >= 2]
        + [h for h in holes if h.odd and h.units == 1]
    )
    assert len(me_order) >= nme
    for hole in me_order[:nme]:
        hole.add("c1m1_me", 1)
    cheap_holes = [h for h in holes if h.odd and h.units >= 1]
    assert len(cheap_holes) >= cheap_1g2
    for hole in cheap_holes[:cheap_1g2]:
        hole.add("c1m2", 1)
    remaining = n11
    for hole in holes:
        take = min(remaining, hole.units)
        for _ in range(take):
            hole.add("c1m1", 1)
        remaining -= take
    assert remaining == 0
    gpus += [hole.base + tuple(hole.small) for hole in holes]
    return sorted((_canonical(g) for g in gpus), key=_fullness_key)


def _canonical(classes: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(classes, key=MIG_CLASS_ORDER.index))


def _fullness_key(classes: tuple[str, ...]) -> tuple:
    compute = sum(MIG_CLASSES[k].compute_slices for k in classes)
    memory = sum(MIG_CLASSES[k].memory_slices for k in classes)
    return (-compute, -memory, tuple(-classes.count(k) for k in MIG_CLASS_ORDER))


def _mig_parted_entries(model: GpuModel, gpus: Sequence[GpuAssignment]) -> list[dict[str, Any]]:
    groups: dict[tuple[tuple[str, int], ...], list[int]] = defaultdict(list)
    for gpu in gpus:
        groups[tuple(sorted(Counter(i.profile for i in gpu.mig).items()))].append(gpu.index)
    entries = []
    for geometry, indexes in sorted(groups.items(), key=lambda item: item[1][0]):
        entry: dict[str, Any] = {"device-filter": list(model.pci_device_ids), "devices": indexes}
        if geometry:
            entry["mig-enabled"] = True
            entry["mig-devices"] = dict(geometry)
        else:
            entry["mig-enabled"] = False
        entries.append(entry)
    return entries


def _mig_config_name(pool: str, entries: list[dict[str, Any]]) -> str:
    digest = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()[:8]
    return f"{pool}-{digest}"


# =========================================================================== HAMi and time-slicing


def _hami_memory_capacity(model: GpuModel, scaling: float) -> int:
    return int(model.memory_mib * scaling)


def _pack_hami(
    model: GpuModel,
    split_count: int,
    scaling: float,
    slices: Iterable[HamiAllocation],
    gpus: Sequence[Sequence[HamiAllocation]] = (),
) -> list[list[HamiAllocation]]:
    """First-fit decreasing onto `gpus` (kept from a previous plan), then onto new GPUs, under four
    size orders (dominant share, summed shares, memory, cores); the fewest GPUs wins. A heuristic:
    the figures report its gap to the lower bound."""
    capacity = _hami_memory_capacity(model, scaling)
    slices = list(slices)
    sizes = (
        lambda a: max(a.memory_mib / capacity, a.cores_percent / 100),
        lambda a: a.memory_mib / capacity + a.cores_percent / 100,
        lambda a: a.memory_mib,
        lambda a: a.cores_percent,
    )
    best: list[list[HamiAllocation]] | None = None
    for size in sizes:
        bins = [list(gpu) for gpu in gpus]
        for allocation in sorted(slices, key=lambda a: (-size(a), -a.memory_mib, -a.cores_percent, a.tenant)):
            for gpu in bins:
                if _hami_fits(gpu + [allocation], capacity, split_count):
                    gpu.append(allocation)
                    break
            else:
                bins.append([allocation])
        if best is None or len(bins) < len(best):
            best = bins
    return best


def _hami_fits(allocations: Sequence[HamiAllocation], capacity: int, split_count: int) -> bool:
    return (
        len(allocations) <= split_count
        and sum(a.memory_mib for a in allocations) <= capacity
        and sum(a.cores_percent for a in allocations) <= 100
    )


def _pack_time_sliced(
    replicas_per_gpu: int, replicas: Mapping[str, int], gpus: Sequence[Sequence[TimeSliceShare]] = ()
) -> list[list[TimeSliceShare]]:
    """Fill the spare replicas of `gpus` (kept from a previous plan), then new GPUs one after the
    other, in tenant order: ceil(total / replicas per GPU) GPUs from scratch, the optimum. Tenants
    of one trust domain may share a GPU's replicas."""
    filled = [Counter({share.tenant: share.replicas for share in gpu}) for gpu in gpus]
    current = 0
    for tenant in sorted(replicas):
        left = replicas[tenant]
        while left:
            if current == len(filled):
                filled.append(Counter())
            take = min(left, replicas_per_gpu - sum(filled[current].values()))
            if take == 0:
                current += 1
                continue
            filled[current][tenant] += take
            left -= take
    return [[TimeSliceShare(t, n) for t, n in sorted(gpu.items())] for gpu in filled]


# =========================================================================== planning

Slot = tuple[str, int]  # (node, GPU index)


@dataclass
class _PoolRequests:
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


def plan(pools: Sequence[PoolSpec], tenants: Sequence[TenantSpec], previous: Plan | None = None) -> Plan:
    """Place every demand, or raise PlanError listing every problem.

    With `previous`, GPUs keep their layout and owner wherever that costs no extra GPU."""
    problems: list[str] = []
    valid_pools = _check_pools(pools, problems)
    requests = _collect_requests(valid_pools, {p.name for p in pools}, tenants, problems)
    previous_pools = {p.name: p for p in previous.pools} if previous is not None else {}
    pool_plans = []
    for name in sorted(valid_pools):
        pool = valid_pools[name]
        before = previous_pools.get(name)
        if before is not None and (before.gpu_model, before.gpus_per_node, before.sharing) != (
            pool.gpu_model,
            pool.gpus_per_node,
            pool.sharing,
        ):
            before = None  # another model or node shape: nothing to keep
        pool_plan = _plan_pool(pool, requests[name], before, problems)
        if pool_plan is not None:
            pool_plans.append(pool_plan)
    if problems:
        raise PlanError(problems)
    figures = [
        _domain_figures(pool_plan, valid_pools[pool_plan.name], requests[pool_plan.name], domain)
        for pool_plan in pool_plans
        for domain in sorted(set(requests[pool_plan.name].domain_of.values()))
    ]
    pool_figures = [
        _total_figures(pool_plan.name, [f for f in figures if f.pool == pool_plan.name], pool_plan)
        for pool_plan in pool_plans
    ]
    fleet_figures = _total_figures(None, figures, *pool_plans)
    return Plan(
        pools=tuple(pool_plans),
        figures=tuple(figures),
        pool_figures=tuple(pool_figures),
        fleet_figures=fleet_figures,
        changed_gpus=None if previous is None else _changed_gpus(previous, pool_plans),
    )


# --------------------------------------------------------------------------- validation


def _check_pools(pools: Sequence[PoolSpec], problems: list[str]) -> dict[str, PoolSpec]:
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


def _collect_requests(
    pools: Mapping[str, PoolSpec], pool_names: set[str], tenants: Sequence[TenantSpec], problems: list[str]
) -> dict[str, _PoolRequests]:
    requests = {name: _PoolRequests() for name in pools}
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
    request: _PoolRequests,
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
    capacity = _hami_memory_capacity(model, scaling)
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
    if valid:
        for item in demand.hami:
            request.hami[domain, scaling].extend(
                [HamiAllocation(tenant.name, item.memory_mib, item.cores_percent)] * item.count
            )
    return valid


# --------------------------------------------------------------------------- one pool


class _Previous:
    """The previous plan of one pool, indexed for keeping what can be kept."""

    def __init__(self, before: PoolPlan | None, pool: PoolSpec):
        self.gpus: dict[Slot, GpuAssignment] = {}
        self.node_group: dict[str, tuple[int, str, str]] = {}
        self.node_domain: dict[str, str | None] = {}
        self.busy: Counter[str] = Counter()
        if before is None:
            return
        current = set(pool.nodes)
        for node in before.nodes:
            if node.name not in current:
                continue
            self.node_domain[node.name] = node.trust_domain
            for gpu in node.gpus:
                self.gpus[node.name, gpu.index] = gpu
                self.busy[node.name] += gpu.mode != "idle"
            shared = [g for g in node.gpus if g.mode in ("mig", "hami", "time-sliced")]
            if node.dedicated_tenant is not None:
                self.node_group[node.name] = (0, node.dedicated_tenant, "")
            elif node.trust_domain is not None and shared:
                node_class = _node_class(shared[0].mode, shared[0].hami_memory_scaling)
                self.node_group[node.name] = (1, node.trust_domain, node_class)

    def shared_gpus(self, domain: str, node_class: str) -> list[tuple[Slot, GpuAssignment]]:
        return sorted(
            (slot, gpu)
            for slot, gpu in self.gpus.items()
            if gpu.trust_domain == domain
            and gpu.mode in ("mig", "hami", "time-sliced")
            and _node_class(gpu.mode, gpu.hami_memory_scaling) == node_class
        )

    def whole_slots(self, tenant: str) -> list[Slot]:
        return sorted(slot for slot, gpu in self.gpus.items() if gpu.mode == "whole" and gpu.owner == tenant)

    def nodes_for(self, group: _Group) -> list[str]:
        """Nodes worth keeping for `group`, most of its previous GPUs first: its own previous
        nodes, or for whole GPUs shared GPU by GPU any node where its tenants had whole GPUs."""
        if group.key[0] == 2:
            held = Counter(s[0] for s, gpu in self.gpus.items() if gpu.mode == "whole" and gpu.owner in group.whole)
        else:
            held = Counter({node: self.busy[node] for node, key in self.node_group.items() if key == group.key})
        return sorted(held, key=lambda node: (-held[node], node))

    def geometry(self, slot: Slot) -> tuple | None:
        gpu = self.gpus.get(slot)
        return None if gpu is None else _geometry(gpu)


def _node_class(mode: str, hami_memory_scaling: float) -> str:
    """GPUs of one node class can share a node: HAMi memory scaling is a per-node setting."""
    return f"hami x{hami_memory_scaling:g}" if mode == "hami" else mode


def _geometry(gpu: GpuAssignment) -> tuple:
    return (gpu.mode, tuple(sorted(i.profile for i in gpu.mig)), gpu.hami_memory_scaling)


def _plan_pool(pool: PoolSpec, request: _PoolRequests, before: PoolPlan | None, problems: list[str]) -> PoolPlan | None:
    model = GPU_MODELS[pool.gpu_model]
    per_node = pool.gpus_per_node
    previous = _Previous(before, pool)
    groups: dict[tuple[int, str, str], _Group] = {}

    def group(key: tuple[int, str, str]) -> _Group:
        return groups.setdefault(key, _Group(key))

    for tenant, count in sorted(request.dedicated.items()):
        group((0, tenant, "")).whole[tenant] = count
    for domain, mig in sorted(request.mig.items()):
        group((1, domain, "mig")).gpus = _mig_gpus(model, domain, mig, previous.shared_gpus(domain, "mig"))
    for (domain, scaling), slices in sorted(request.hami.items()):
        node_class = _node_class("hami", scaling)
        group((1, domain, node_class)).gpus = _hami_gpus(
            model, pool, domain, scaling, slices, previous.shared_gpus(domain, node_class)
        )
    for domain, replicas in sorted(request.time_sliced.items()):
        group((1, domain, "time-sliced")).gpus = _time_sliced_gpus(
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
            candidates = previous.nodes_for(g) if take_previous else pool.nodes
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
            slot = free.take(_geometry(gpu))
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
            config = _mig_config_name(pool.name, _mig_parted_entries(model, gpus))
        nodes.append(NodePlan(name, domain, dedicated, config, gpus))
    return PoolPlan(
        name=pool.name,
        gpu_model=pool.gpu_model,
        sharing=pool.sharing,
        gpus_per_node=per_node,
        time_slicing_replicas=pool.time_slicing_replicas,
        hami_split_count=pool.hami_split_count,
        nodes=tuple(nodes),
    )


def _size_groups(
    groups: dict[tuple[int, str, str], _Group],
    request: _PoolRequests,
    previous: _Previous,
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
            g.need_nodes = _ceil_div(sum(g.whole.values()), per_node)
        else:
            g.whole = Counter()
            g.need_nodes = _ceil_div(len(g.gpus), per_node)
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
                own.need_nodes = _ceil_div(len(own.gpus) + sum(staying.values()), per_node)
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
        need = _ceil_div(sum(shared_whole.values()), per_node)
        groups[2, "", ""] = _Group((2, "", ""), whole=shared_whole, need_nodes=need)


def _whole(index: int, tenant: str, request: _PoolRequests) -> GpuAssignment:
    return GpuAssignment(index, "whole", request.domain_of[tenant], owner=tenant)


class _FreeSlots:
    """A group's free slots in node order; a GPU takes a slot that had its geometry if one is left
    (re-planning then changes fewer GPUs), else the first free one."""

    def __init__(self, slots: list[Slot], previous: _Previous):
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


def _mig_gpus(
    model: GpuModel, domain: str, demand: Counter[tuple[str, str]], previous: list[tuple[Slot, GpuAssignment]]
) -> list[tuple[GpuAssignment, Slot | None]]:
    """The domain's MIG GPUs: an exact packing that keeps as many previous GPUs as possible
    without using more GPUs than the optimum."""
    klass = {p.name: p.klass for p in model.mig_profiles}

    def classes(instances: Counter[tuple[str, str]]) -> Counter[str]:
        counts: Counter[str] = Counter()
        for (_, profile), n in instances.items():
            counts[klass[profile]] += n
        return counts

    optimum = min_mig_gpus(classes(demand))
    remaining = Counter(demand)
    candidates = []
    for slot, gpu in previous:
        held = Counter((i.tenant, i.profile) for i in gpu.mig)
        if all(remaining[key] >= n for key, n in held.items()):
            remaining -= held
            candidates.append((slot, gpu, held))
    candidates.sort(key=lambda c: (_fullness_key(_canonical(klass[i.profile] for i in c[1].mig)), c[0]))

    def rest_after(kept: int) -> Counter[tuple[str, str]]:
        rest = Counter(demand)
        for _, _, held in candidates[:kept]:
            rest -= held
        return rest

    # kept + optimum(rest) never decreases as more GPUs are kept: bisect the longest prefix.
    low, high = 0, len(candidates)
    while low < high:
        mid = (low + high + 1) // 2
        if mid + min_mig_gpus(classes(rest_after(mid))) == optimum:
            low = mid
        else:
            high = mid - 1
    rest = rest_after(low)
    new = _assign_mig(model, domain, pack_mig_classes(classes(rest)), rest)
    return [(gpu, slot) for slot, gpu, _ in candidates[:low]] + [(gpu, None) for gpu in new]


def _assign_mig(
    model: GpuModel, domain: str, layouts: list[tuple[str, ...]], demand: Counter[tuple[str, str]]
) -> list[GpuAssignment]:
    """Place each layout and give its instances to tenants, in tenant order, so a tenant's
    instances stay on as few GPUs as possible."""
    profile = {p.klass: p.name for p in model.mig_profiles}
    queues: dict[str, list[str]] = defaultdict(list)
    for (tenant, name), n in sorted(demand.items(), reverse=True):
        queues[name].extend([tenant] * n)  # reversed, popped from the end
    gpus = []
    for layout in layouts:
        placed = place_mig(layout)
        assert placed is not None, layout
        instances = tuple(MigInstance(profile[k], start, queues[profile[k]].pop()) for k, start in placed)
        problems = mig_layout_problems(model, [(i.profile, i.start) for i in instances])
        assert not problems, problems
        gpus.append(GpuAssignment(-1, "mig", domain, mig=instances))
    return gpus


def _hami_gpus(
    model: GpuModel,
    pool: PoolSpec,
    domain: str,
    scaling: float,
    slices: list[HamiAllocation],
    previous: list[tuple[Slot, GpuAssignment]],
) -> list[tuple[GpuAssignment, Slot | None]]:
    """The domain's HAMi GPUs of one memory scaling. Previous GPUs whose slices are all still
    wanted keep them and take new slices in their spare room, unless that costs GPUs."""
    capacity = _hami_memory_capacity(model, scaling)
    remaining = Counter(slices)
    kept: list[tuple[Slot, GpuAssignment]] = []
    for slot, gpu in previous:
        held = Counter(gpu.hami)
        if all(remaining[a] >= n for a, n in held.items()) and _hami_fits(gpu.hami, capacity, pool.hami_split_count):
            remaining -= held
            kept.append((slot, gpu))
    packed = _pack_hami(model, pool.hami_split_count, scaling, remaining.elements(), [g.hami for _, g in kept])
    fresh = _pack_hami(model, pool.hami_split_count, scaling, slices)
    slots: list[Slot | None] = [slot for slot, _ in kept] + [None] * (len(packed) - len(kept))
    if len(packed) > len(fresh):
        packed, slots = fresh, [None] * len(fresh)  # keeping would cost GPUs: GPUs come first
    templates = [
        GpuAssignment(-1, "hami", domain, hami=tuple(sorted(gpu, key=_allocation_key)), hami_memory_scaling=scaling)
        for gpu in packed
    ]
    return list(zip(templates, slots))


def _allocation_key(allocation: HamiAllocation) -> tuple:
    return (allocation.tenant, -allocation.memory_mib, -allocation.cores_percent)


def _time_sliced_gpus(
    replicas_per_gpu: int, domain: str, replicas: Counter[str], previous: list[tuple[Slot, GpuAssignment]]
) -> list[tuple[GpuAssignment, Slot | None]]:
    """The domain's time-sliced GPUs; previous GPUs keep their shares when that costs no GPU."""
    remaining = Counter(replicas)
    kept: list[tuple[Slot, GpuAssignment]] = []
    for slot, gpu in previous:
        held: Counter[str] = Counter()
        for share in gpu.time_slices:
            held[share.tenant] += share.replicas
        if sum(held.values()) <= replicas_per_gpu and all(remaining[t] >= n for t, n in held.items()):
            remaining -= held
            kept.append((slot, gpu))
    packed = _pack_time_sliced(replicas_per_gpu, remaining, [g.time_slices for _, g in kept])
    fresh = _pack_time_sliced(replicas_per_gpu, replicas)
    slots: list[Slot | None] = [slot for slot, _ in kept] + [None] * (len(packed) - len(kept))
    if len(packed) > len(fresh):
        packed, slots = fresh, [None] * len(fresh)
    return [
        (GpuAssignment(-1, "time-sliced", domain, time_slices=tuple(shares)), slot)
        for shares, slot in zip(packed, slots)
    ]


def _grants(model: GpuModel, gpu: GpuAssignment) -> list[tuple[str, str, int]]:
    """(tenant, resource name, amount) granted by one GPU."""
    if gpu.mode == "whole":
        return [(gpu.owner, WHOLE_GPU, 1)]
    grants = [(i.tenant, model.profile(i.profile).resource_name, 1) for i in gpu.mig]
    for a in gpu.hami:
        grants += [
            (a.tenant, WHOLE_GPU, 1),
            (a.tenant, HAMI_MEMORY, a.memory_mib),
            (a.tenant, HAMI_CORES, a.cores_percent),
        ]
    grants += [(s.tenant, WHOLE_GPU, s.replicas) for s in gpu.time_slices]
    return grants


def _shortfall(pool: PoolSpec, model: GpuModel, request: _PoolRequests, groups: list[_Group]) -> list[str]:
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
            for tenant, resource, amount in _grants(model, gpu):
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


# --------------------------------------------------------------------------- figures


def _gpu_share(model: GpuModel, pool: PoolPlan, gpu: GpuAssignment) -> float:
    """Allocated GPU-equivalents of one GPU: its dominant allocated share (see Figures)."""
    if gpu.mode == "whole":
        return 1.0
    if gpu.mode == "mig":
        compute = sum(model.profile(i.profile).compute_slices for i in gpu.mig)
        memory = sum(model.profile(i.profile).memory_slices for i in gpu.mig)
        return max(compute / COMPUTE_SLICES, memory / MEMORY_SLICES)
    if gpu.mode == "hami":
        memory = sum(a.memory_mib for a in gpu.hami) / model.memory_mib
        return min(1.0, max(memory, sum(a.cores_percent for a in gpu.hami) / 100))
    if gpu.mode == "time-sliced":
        return sum(s.replicas for s in gpu.time_slices) / pool.time_slicing_replicas
    return 0.0


def _lower_bound(pool: PoolSpec, model: GpuModel, request: _PoolRequests, domain: str) -> int:
    bound = sum(n for tenant, n in request.dedicated.items() if request.domain_of[tenant] == domain)
    bound += sum(request.whole.get(domain, Counter()).values())
    if domain in request.mig:
        classes: Counter[str] = Counter()
        for (_, profile), n in request.mig[domain].items():
            classes[model.profile(profile).klass] += n
        bound += mig_lower_bound(classes)
    for (slice_domain, scaling), slices in sorted(request.hami.items()):
        if slice_domain == domain:
            bound += max(
                _ceil_div(sum(a.memory_mib for a in slices), _hami_memory_capacity(model, scaling)),
                _ceil_div(sum(a.cores_percent for a in slices), 100),
                _ceil_div(len(slices), pool.hami_split_count),
            )
    if domain in request.time_sliced:
        bound += _ceil_div(sum(request.time_sliced[domain].values()), pool.time_slicing_replicas)
    return bound


def _domain_figures(pool_plan: PoolPlan, pool: PoolSpec, request: _PoolRequests, domain: str) -> Figures:
    model = GPU_MODELS[pool.gpu_model]
    owned = [node for node in pool_plan.nodes if node.trust_domain == domain]
    used = [gpu for node in pool_plan.nodes for gpu in node.gpus if gpu.trust_domain == domain and gpu.mode != "idle"]
    idle_by_tenant: Counter[str] = Counter()
    for node in owned:
        if node.dedicated_tenant is not None:
            idle_by_tenant[node.dedicated_tenant] += sum(gpu.mode == "idle" for gpu in node.gpus)
    mig = [model.profile(i.profile) for gpu in used for i in gpu.mig]
    mig_gpus = sum(gpu.mode == "mig" for gpu in used)
    lower_bound = _lower_bound(pool, model, request, domain)
    equivalents = sum(_gpu_share(model, pool_plan, gpu) for gpu in used)
    hami_memory = [sum(a.memory_mib for a in gpu.hami) / model.memory_mib for gpu in used if gpu.mode == "hami"]
    return Figures(
        pool=pool.name,
        trust_domain=domain,
        nodes_used=len(owned),
        gpus_used=len(used),
        lower_bound=lower_bound,
        gap=len(used) - lower_bound,
        idle_gpus=sum(gpu.mode == "idle" for node in owned for gpu in node.gpus),
        idle_gpus_by_tenant=tuple(sorted((+idle_by_tenant).items())),
        stranded_compute_slices=COMPUTE_SLICES * mig_gpus - sum(p.compute_slices for p in mig),
        stranded_memory_slices=MEMORY_SLICES * mig_gpus - sum(p.memory_slices for p in mig),
        gpu_equivalents=round(equivalents, 6),
        utilisation=round(equivalents / len(used), 6) if used else 0.0,
        hami_memory_oversubscription=round(max(hami_memory, default=0.0), 6),
    )


def _total_figures(pool: str | None, rows: Sequence[Figures], *pool_plans: PoolPlan) -> Figures:
    """Totals over `rows`; nodes and idle GPUs counted on the pools' used nodes."""
    used_nodes = [node for p in pool_plans for node in p.nodes if any(g.mode != "idle" for g in node.gpus)]
    gpus_used = sum(r.gpus_used for r in rows)
    lower_bound = sum(r.lower_bound for r in rows)
    equivalents = sum(r.gpu_equivalents for r in rows)
    idle_by_tenant: Counter[str] = Counter()
    for row in rows:
        idle_by_tenant.update(dict(row.idle_gpus_by_tenant))
    return Figures(
        pool=pool,
        trust_domain=None,
        nodes_used=len(used_nodes),
        gpus_used=gpus_used,
        lower_bound=lower_bound,
        gap=gpus_used - lower_bound,
        idle_gpus=sum(g.mode == "idle" for node in used_nodes for g in node.gpus),
        idle_gpus_by_tenant=tuple(sorted(idle_by_tenant.items())),
        stranded_compute_slices=sum(r.stranded_compute_slices for r in rows),
        stranded_memory_slices=sum(r.stranded_memory_slices for r in rows),
        gpu_equivalents=round(equivalents, 6),
        utilisation=round(equivalents / gpus_used, 6) if gpus_used else 0.0,
        hami_memory_oversubscription=max((r.hami_memory_oversubscription for r in rows), default=0.0),
    )


def _changed_gpus(previous: Plan, pool_plans: Sequence[PoolPlan]) -> int:
    """GPUs in use in the previous plan that the new plan disturbs (see _disturbs)."""
    now = {(p.name, node.name, gpu.index): gpu for p in pool_plans for node in p.nodes for gpu in node.gpus}
    return sum(
        _disturbs(gpu, now.get((pool.name, node.name, gpu.index)))
        for pool in previous.pools
        for node in pool.nodes
        for gpu in node.gpus
        if gpu.mode != "idle"
    )


def _disturbs(before: GpuAssignment, after: GpuAssignment | None) -> bool:
    """A change that moves or stops work: the GPU is gone, changes mode, domain, owner or MIG
    layout (a MIG geometry change drains the GPU), HAMi memory scaling, or loses an allocation.
    New HAMi slices or replicas in a GPU's spare room disturb nobody."""
    if after is None or (before.mode, before.trust_domain, before.owner, before.mig, before.hami_memory_scaling) != (
        after.mode,
        after.trust_domain,
        after.owner,
        after.mig,
        after.hami_memory_scaling,
    ):
        return True
    if Counter(before.hami) - Counter(after.hami):
        return True
    replicas_after = {share.tenant: share.replicas for share in after.time_slices}
    return any(share.replicas > replicas_after.get(share.tenant, 0) for share in before.time_slices)
