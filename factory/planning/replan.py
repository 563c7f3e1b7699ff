"""Re-planning from a previous plan (the lock): what each node and GPU held, and which GPUs in use
the new plan disturbs."""

from __future__ import annotations

from collections import Counter
from typing import Container, Sequence

from ai_factory.factory.planning.model import GpuAssignment, Plan, PoolPlan, PoolSpec, Slot


class Previous:
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
                node_class = node_class_of(shared[0].mode, shared[0].hami_memory_scaling)
                self.node_group[node.name] = (1, node.trust_domain, node_class)

    def shared_gpus(self, domain: str, node_class: str) -> list[tuple[Slot, GpuAssignment]]:
        return sorted(
            (slot, gpu)
            for slot, gpu in self.gpus.items()
            if gpu.trust_domain == domain
            and gpu.mode in ("mig", "hami", "time-sliced")
            and node_class_of(gpu.mode, gpu.hami_memory_scaling) == node_class
        )

    def whole_slots(self, tenant: str) -> list[Slot]:
        return sorted(slot for slot, gpu in self.gpus.items() if gpu.mode == "whole" and gpu.owner == tenant)

    def nodes_for(self, group: tuple[int, str, str], tenants: Container[str]) -> list[str]:
        """Nodes worth keeping for the node group `group` (see ownership), most of its previous GPUs
        first: its own previous nodes, or for whole GPUs shared GPU by GPU any node where its
        `tenants` had whole GPUs."""
        if group[0] == 2:
            held = Counter(s[0] for s, gpu in self.gpus.items() if gpu.mode == "whole" and gpu.owner in tenants)
        else:
            held = Counter({node: self.busy[node] for node, key in self.node_group.items() if key == group})
        return sorted(held, key=lambda node: (-held[node], node))

    def geometry(self, slot: Slot) -> tuple | None:
        gpu = self.gpus.get(slot)
        return None if gpu is None else gpu_geometry(gpu)


def node_class_of(mode: str, hami_memory_scaling: float) -> str:
    """GPUs of one node class can share a node: HAMi memory scaling is a per-node setting."""
    return f"hami x{hami_memory_scaling:g}" if mode == "hami" else mode


def gpu_geometry(gpu: GpuAssignment) -> tuple:
    return (gpu.mode, tuple(sorted(i.profile for i in gpu.mig)), gpu.hami_memory_scaling)


def changed_gpus(previous: Plan, pool_plans: Sequence[PoolPlan]) -> int:
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
