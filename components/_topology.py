"""The fleet's network topology as topology-aware schedulers see it (Kueue TAS, KAI Scheduler).

Levels go from the coarsest to the finest: network block, rack, multi-node NVLink domain (only for
pools whose every node has one: a node missing a level's label falls out of topology-aware
placement), then the host. The fleet layer (`components/fleet.py`) puts these labels on every node.
"""

from __future__ import annotations

from dataclasses import dataclass

from ai_factory.components._common import BLOCK_LABEL, NVLINK_DOMAIN_LABEL, RACK_LABEL
from ai_factory.factory.model.config import Pool

HOSTNAME_LABEL = "kubernetes.io/hostname"
"""Always the last level: Kueue allows it only there, and respects node taints only with it."""


@dataclass(frozen=True)
class SchedulingTopology:
    name: str
    """Named after its levels, so pools wired alike share one object."""
    levels: tuple[tuple[str, str], ...]
    """(alias, node label) from the coarsest level to the host."""


def pool_topology(pool: Pool) -> SchedulingTopology:
    levels = [("block", BLOCK_LABEL), ("rack", RACK_LABEL)]
    nodes = pool.node_specs()
    if nodes and all(n.nvlink_domain for n in nodes):
        levels.append(("nvlink-domain", NVLINK_DOMAIN_LABEL))
    levels.append(("host", HOSTNAME_LABEL))
    return SchedulingTopology(name="-".join(alias for alias, _ in levels), levels=tuple(levels))
