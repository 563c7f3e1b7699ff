"""The planner's data model: its inputs (pools, tenants, demands), its output `Plan` with the queries
every layer asks of it, and its JSON form (the lock); `report` prints it."""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, Sequence

import msgspec

from ai_factory.factory.model.gpus import GPU_MODELS, GpuModel
from ai_factory.factory.planning.fabric import TenantFabricNetwork


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
    vm_resource: str | None = None
    """Marked for VMs (`layers.kubevirt.pools`): its whole GPUs are advertised, requested and
    quota'd under this name (the sandbox device plugin's), never as `nvidia.com/gpu`."""


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
    vm_resource: str | None = None
    """As `PoolSpec.vm_resource`."""

    def domain_nodes(self, trust_domain: str) -> tuple[NodePlan, ...]:
        """The nodes holding at least one GPU for `trust_domain` (in use or idle), in plan order."""
        return self._nodes_by_domain.get(trust_domain, ())

    def node_grants(self, tenant: str) -> dict[str, dict[str, int]]:
        """What `tenant` is granted on each node of the pool that grants it any (`gpu_grants`), per
        resource name, nodes in plan order."""
        return {node: dict(grants) for node, grants in self._grants_by_tenant.get(tenant, {}).items()}

    # Asked per trust domain (figures, offerings) and per tenant (Slurm nodes, fabric networks):
    # index the nodes once, not once per domain or tenant.
    @cached_property
    def _grants_by_tenant(self) -> dict[str | None, dict[str, dict[str, int]]]:
        model = GPU_MODELS[self.gpu_model]
        grants: dict[str | None, dict[str, Counter[str]]] = defaultdict(dict)
        for node in self.nodes:
            for gpu in node.gpus:
                for owner, resource, amount in gpu_grants(model, gpu):
                    grants[owner].setdefault(node.name, Counter())[resource] += amount
        return {tenant: {node: dict(sorted(c.items())) for node, c in nodes.items()} for tenant, nodes in grants.items()}

    @cached_property
    def _nodes_by_domain(self) -> dict[str, tuple[NodePlan, ...]]:
        nodes: dict[str, list[NodePlan]] = defaultdict(list)
        for node in self.nodes:
            for domain in dict.fromkeys(gpu.trust_domain for gpu in node.gpus if gpu.trust_domain):
                nodes[domain].append(node)
        return {domain: tuple(held) for domain, held in nodes.items()}


@dataclass(frozen=True)
class Figures:
    """Quality figures for one (pool, trust domain), one pool (trust_domain None) or the fleet
    (pool and trust_domain None).

    Every GPU of a pool is in exactly one of `gpus_used`, `idle_gpus` and `free_gpus`. A trust
    domain's row counts the GPUs held for it (`GpuAssignment.trust_domain`); the domain rows of a
    pool add up to its row, except free GPUs, which no domain holds.

    Allocation utilisation = allocated GPU-equivalents / GPUs used, each GPU counting its dominant
    share: MIG max(Σcompute/7, Σmemory/8) of its instances, HAMi max(Σmemory/GPU memory,
    Σcores/100) (capped at 1 when memory is oversubscribed), time-sliced used replicas / replicas
    per GPU, whole 1. A GPU-level share (not a per-instance sum) so that 4g+3g counts as one GPU,
    not 1.07.
    """

    pool: str | None
    trust_domain: str | None
    nodes_used: int
    """Nodes holding at least one of the row's GPUs in use or idle (for a pool or the fleet: its
    nodes less the free ones)."""
    gpus_used: int
    lower_bound: int
    """MIG: max(LB1, LB2, LB3) of mig-profiles.yaml; whole: their count; HAMi: max(ceil(Σmem /
    GPU memory), ceil(Σcores / 100), ceil(slices / split count)); time-slicing: ceil(replicas /
    replicas per GPU); summed per domain (trust domains partition the fleet)."""
    gap: int
    idle_gpus: int
    """GPUs held idle for a trust domain: on nodes a domain owns or that are dedicated to a
    low-trust tenant, where no other domain may use them (node ownership strands them)."""
    free_gpus: int
    """Idle GPUs held for no trust domain (whole-GPU pools, unused nodes): anyone's to plan."""
    free_nodes: int
    """Nodes all of whose GPUs are free."""
    idle_gpus_by_tenant: tuple[tuple[str, int], ...]
    """Idle GPUs on nodes dedicated to low-trust tenants, attributed to them."""
    stranded_compute_slices: int
    stranded_memory_slices: int
    gpu_equivalents: float
    utilisation: float
    hami_memory_oversubscription: float
    """Largest allocated / physical memory on one HAMi GPU (0 without HAMi; above 1 only for
    tenants that opted in)."""

    @property
    def gpus(self) -> int:
        return self.gpus_used + self.idle_gpus + self.free_gpus


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
    networks: tuple[TenantFabricNetwork, ...] = ()
    """Tenants' RDMA networks, per (tenant, pool), with their partition key or VLAN
    (`ai_factory.factory.planning.fabric`); kept from the lock while the tenant keeps the network."""

    # ------------------------------------------------------------------ queries

    def pool(self, name: str) -> PoolPlan:
        pool = self._pools_by_name.get(name)
        if pool is None:
            raise KeyError(f"no pool {name!r} in the plan; pools: {', '.join(p.name for p in self.pools)}")
        return pool

    def tenant_capacity(self, tenant: str) -> dict[tuple[str, str], int]:
        """What `tenant` was granted, per (pool, resource name): whole GPUs and time-sliced
        replicas as nvidia.com/gpu, MIG instances by profile resource, HAMi vGPU slots
        (nvidia.com/gpu), memory in MiB (nvidia.com/gpumem) and cores in percent
        (nvidia.com/gpucores)."""
        return dict(self._capacity_by_tenant.get(tenant, {}))

    def dedicated_nodes(self, tenant: str) -> tuple[str, ...]:
        """The nodes dedicated to (low-trust) `tenant`, in name order."""
        return self._dedicated_by_tenant.get(tenant, ())

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
                for owner, resource, amount in gpu_grants(model, gpu):
                    capacity[owner][pool.name, resource] += amount
        return {tenant: dict(sorted(c.items())) for tenant, c in capacity.items()}

    @cached_property
    def _pools_by_name(self) -> dict[str, PoolPlan]:
        return {pool.name: pool for pool in self.pools}

    @cached_property
    def _dedicated_by_tenant(self) -> dict[str, tuple[str, ...]]:
        dedicated: dict[str, list[str]] = defaultdict(list)
        for pool in self.pools:
            for node in pool.nodes:
                if node.dedicated_tenant:
                    dedicated[node.dedicated_tenant].append(node.name)
        return {tenant: tuple(sorted(nodes)) for tenant, nodes in dedicated.items()}

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
                    domain[HAMI_MEMORY] += hami_memory_capacity(model, gpu.hami_memory_scaling)
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
                    configs[node.mig_config] = mig_parted_entries(model, node.gpus)
        return dict(sorted(configs.items()))

    # ------------------------------------------------------------------ serialisation

    def to_json(self) -> str:
        return json.dumps(self.to_data(), sort_keys=True, indent=2)

    def to_data(self) -> dict[str, Any]:
        """The plan as plain JSON data (`to_json` parsed back, keys sorted): the platform contract
        carries it. Converted in C, not by `dataclasses.asdict`, which deep-copies every GPU."""
        return msgspec.json.decode(msgspec.json.encode(self, order="sorted"))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        data = json.loads(text)
        return cls(
            pools=tuple(_pool_from_dict(p) for p in data["pools"]),
            figures=tuple(_figures_from_dict(f) for f in data["figures"]),
            pool_figures=tuple(_figures_from_dict(f) for f in data["pool_figures"]),
            fleet_figures=_figures_from_dict(data["fleet_figures"]),
            changed_gpus=data["changed_gpus"],
            networks=tuple(TenantFabricNetwork(**n) for n in data.get("networks", ())),
        )


def _pool_from_dict(data: dict[str, Any]) -> PoolPlan:
    return PoolPlan(
        name=data["name"],
        gpu_model=data["gpu_model"],
        sharing=data["sharing"],
        gpus_per_node=data["gpus_per_node"],
        time_slicing_replicas=data["time_slicing_replicas"],
        hami_split_count=data["hami_split_count"],
        vm_resource=data.get("vm_resource"),
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
            # Locks written before free GPUs were counted; a previous plan's figures are not read.
            "free_gpus": 0,
            "free_nodes": 0,
            **data,
            "idle_gpus_by_tenant": tuple((tenant, count) for tenant, count in data["idle_gpus_by_tenant"]),
        }
    )


# --------------------------------------------------------------------------- what GPUs grant
# Shared by the Plan's queries above and by the planner's modules.

Slot = tuple[str, int]  # (node, GPU index)


def gpu_grants(model: GpuModel, gpu: GpuAssignment) -> list[tuple[str, str, int]]:
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


def hami_memory_capacity(model: GpuModel, scaling: float) -> int:
    """nvidia.com/gpumem one GPU advertises at HAMi memory scaling `scaling`."""
    return int(model.memory_mib * scaling)


def mig_parted_entries(model: GpuModel, gpus: Sequence[GpuAssignment]) -> list[dict[str, Any]]:
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


def mig_config_name(pool: str, entries: list[dict[str, Any]]) -> str:
    digest = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()[:8]
    return f"{pool}-{digest}"
