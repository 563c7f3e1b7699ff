"""The fleet as Kubernetes sees it: every GPU node labelled with its pool, site and topology, and
labelled and tainted as the capacity plan assigns it.

Node objects belong to the provisioning layer; this component only server-side-applies the labels
and taints the platform selects on (`NodePatch`), so drivers, flavors and policies can target a
pool or a topology domain without a second source of truth, and a trust domain's shared GPUs (or a
low-trust tenant's dedicated node) take no one else's pods. The plan's part comes from
`ai_factory.factory.planning.placement.node_placements`: trust-domain and dedicated labels and taints, the MIG and
device-plugin configs each node selects, and the labels that hand a node to HAMi or DRA.

`spec.taints` is an atomic list under server-side apply: the patch owns the whole list, so taints
another manager put on a node conflict with it (they show up at `pulumi up`, they are not erased).
Except on nodes under acceptance: their kubelet registered them with the acceptance taint
(`registerWithTaints`, the provisioning layer's user data), which the verdict replaces, so their
patch always claims the list (empty once accepted) and takes it over from the kubelet
(`pulumi.com/patchForce`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import (
    BLOCK_LABEL,
    FABRIC_LABEL,
    GPU_MODEL_LABEL,
    NVLINK_DOMAIN_LABEL,
    POOL_LABEL,
    RACK_LABEL,
    RDMA_LABEL,
    SITE_LABEL,
    FactoryComponent,
)
from ai_factory.factory.acceptance.gates import ACCEPTANCE_KEY, GENERATION_LABEL, REASON_ANNOTATION, NodeVerdict, node_verdicts
from ai_factory.factory.model.config import FactoryConfig, Pool
from ai_factory.factory.planning.from_config import is_rdma_pool
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.planning.placement import NodePlacement, node_placements
from ai_factory.components import slinky
from ai_factory.components.registry import Layer

TOKEN = "ai-factory:fleet:Fleet"


@dataclass(frozen=True)
class FleetArgs:
    pools: tuple[Pool, ...]
    placements: tuple[NodePlacement, ...]
    """The plan's labels and taints per node (`ai_factory.factory.planning.placement.node_placements`)."""
    acceptance: tuple[NodeVerdict, ...] = ()
    """Verdicts of the nodes under acceptance (`ai_factory.factory.acceptance.gates`): a node not
    accepted carries the acceptance taint; every one carries its verdict, generation and reason."""
    slurm_topology: bool = False
    """Annotate every node with its place in the Slurm clusters' topology (`components.slinky`)."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> FleetArgs:
        return cls(
            pools=tuple(cfg.fleet.pools),
            placements=tuple(node_placements(plan)),
            acceptance=tuple(node_verdicts(cfg)),
            slurm_topology=cfg.layers.slinky.enabled,
        )


def node_labels(pool: Pool) -> dict[str, dict[str, str]]:
    """Labels per node name, derived from the pool and its topology."""
    result = {}
    for node in pool.node_specs():
        node_labels = {
            POOL_LABEL: pool.name,
            SITE_LABEL: pool.site,
            GPU_MODEL_LABEL: pool.gpu.model,
            FABRIC_LABEL: pool.topology.fabric,
            RACK_LABEL: node.rack,
            BLOCK_LABEL: node.block,
        }
        if node.nvlink_domain:
            node_labels[NVLINK_DOMAIN_LABEL] = node.nvlink_domain
        if is_rdma_pool(pool):
            node_labels[RDMA_LABEL] = pool.network.devices
        result[node.name] = node_labels
    return result


PATCH_FORCE = "pulumi.com/patchForce"
"""pulumi-kubernetes: a Patch resource that takes over fields another manager holds."""


class Fleet(FactoryComponent):
    nodes: pulumi.Output[list[str]]

    def __init__(self, name: str, args: FleetArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="fleet", opts=opts)
        placements = {p.node: p for p in args.placements}
        verdicts = {v.node: v for v in args.acceptance}
        names = []
        for pool in args.pools:
            specs = {n.name: n for n in pool.node_specs()}
            for node, topology_labels in node_labels(pool).items():
                placement = placements[node]
                taints = [t.as_dict() for t in placement.taints]
                node_labels_ = {**topology_labels, **placement.labels}
                annotations = None
                verdict = verdicts.get(node)
                if verdict is not None:
                    taints += [verdict.taint] if verdict.taint else []
                    node_labels_ |= {ACCEPTANCE_KEY: verdict.verdict, GENERATION_LABEL: verdict.generation}
                    annotations = {REASON_ANNOTATION: verdict.reason_annotation, PATCH_FORCE: "true"}
                spec = None
                if args.slurm_topology:
                    annotations = {**(annotations or {}), slinky.TOPOLOGY_ANNOTATION: slinky.topology_spec(specs[node])}
                if taints or verdict is not None:  # only these claim `spec.taints` (atomic under server-side apply)
                    spec = k8s.core.v1.NodeSpecPatchArgs(taints=[k8s.core.v1.TaintPatchArgs(**t) for t in taints])
                k8s.core.v1.NodePatch(
                    self.child_name(f"node-{node}"),
                    metadata=k8s.meta.v1.ObjectMetaPatchArgs(name=node, labels=node_labels_, annotations=annotations),
                    spec=spec,
                    opts=self.child(),
                )
                names.append(node)
        self.nodes = pulumi.Output.from_input(names)
        self.register_outputs({"nodes": self.nodes})


LAYER = Layer(name="fleet", component=Fleet, args=FleetArgs.from_config)
