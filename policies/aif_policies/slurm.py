"""Slurm through Slinky (components/slinky.py): a tenant's Slurm nodes are exactly its grant.

Each `slurm` chart release's NodeSets are read from its values: every NodeSet's `Gres=` equals its
slurmd's GPU limits and the plan's grant on each node it is pinned to, one pod per planned node
(`factory.checking.slurm.nodeset_problems`); and no NodeSet reaches a node the fleet layer labels
for another trust domain or dedicates to another tenant (`foreign_nodes`), so no partition spans
another trust domain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Iterator

from pulumi_policy import PolicyResource

from ai_factory.factory.checking.slurm import SLURM_CHART, foreign_nodes, nodeset_problems, nodesets
from ai_factory.policies.aif_policies.core import Violation, resource_policy, stack_policy
from ai_factory.policies.aif_policies.kube import HELM_TYPES, chart_named, describe, helm_chart, cluster_of


def check_slurm_gres_match_plan(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> Iterator[str]:
    if resource_type not in HELM_TYPES or helm_chart(resource_type, props).chart_name != SLURM_CHART:
        return
    for key, nodeset in nodesets(helm_chart(resource_type, props).values):
        for problem in nodeset_problems(nodeset):
            yield f"{describe(resource_type, props)} NodeSet {key}: {problem}"


def check_slurm_partitions_in_trust_domain(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    node_labels = {name: node.labels for name, node in cluster.nodes().items()}
    for release, chart in chart_named(resources, SLURM_CHART):
        tenant = cluster.tenant_of_namespace(chart.namespace)
        for key, nodeset in nodesets(chart.values):
            for problem in foreign_nodes(nodeset, node_labels, tenant.name if tenant else None, tenant.trust_domain if tenant else None):
                yield release, f"{describe(release.resource_type, release.props)} NodeSet {key}: {problem}"


POLICIES = [
    resource_policy(
        "slurm-gres-match-plan",
        "A Slurm NodeSet's GRES equal its slurmd's GPU limits and the plan's grant on each node it is pinned to, one pod per node.",
        check_slurm_gres_match_plan,
    ),
    stack_policy(
        "slurm-partitions-in-trust-domain",
        "No Slurm NodeSet (hence partition) reaches a node of another trust domain or one dedicated to another tenant.",
        check_slurm_partitions_in_trust_domain,
    ),
]
