"""The fleet as Kubernetes sees it: every GPU node labelled with its pool, site and topology.

Node objects belong to the provisioning layer; this component only server-side-applies the labels
the platform selects on (`NodePatch`), so drivers, flavors and policies can target a pool or a
topology domain without a second source of truth.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components._common import (
    BLOCK_LABEL,
    FABRIC_LABEL,
    GPU_MODEL_LABEL,
    NVLINK_DOMAIN_LABEL,
    POOL_LABEL,
    RACK_LABEL,
    SITE_LABEL,
    FactoryComponent,
)
from factory.config import FactoryConfig, Pool

TOKEN = "ai-factory:fleet:Fleet"


@dataclass(frozen=True)
class FleetArgs:
    pools: tuple[Pool, ...]

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> FleetArgs:
        return cls(pools=tuple(cfg.fleet.pools))


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
        result[node.name] = node_labels
    return result


class Fleet(FactoryComponent):
    nodes: pulumi.Output[list[str]]

    def __init__(self, name: str, args: FleetArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="fleet", opts=opts)
        names = []
        for pool in args.pools:
            for node, node_labels_ in node_labels(pool).items():
                k8s.core.v1.NodePatch(
                    f"node-{node}",
                    metadata=k8s.meta.v1.ObjectMetaPatchArgs(name=node, labels=node_labels_),
                    opts=self.child(),
                )
                names.append(node)
        self.nodes = pulumi.Output.from_input(names)
        self.register_outputs({"nodes": self.nodes})
