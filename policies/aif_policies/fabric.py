"""The fast path: tenants' RDMA networks apart on the fabric, attached only from their own
namespace, and NIC policies confined to one pool each.

The rules are `factory check`'s own (`ai_factory.factory.checking.fabric`), run over the stack's
objects: partition keys in range, never the default, never shared between namespaces; VLANs in
range, never shared on one RoCE fabric; RDMA networks only in tenant namespaces and named only
from the pod's own namespace, under the admission policy refusing the other forms; every
NicNodePolicy and SriovNetworkNodePolicy selecting exactly one pool's nodes; every DRA claim
pairing GPUs with RDMA VFs constraining them to one PCIe root.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Iterable, Iterator

from pulumi_policy import PolicyResource

from ai_factory.factory.checking.fabric import Item, alignment_problems, attachment_problems, key_problems, selector_problems
from ai_factory.policies.aif_policies.core import Violation, stack_policy
from ai_factory.policies.aif_policies.kube import Cluster, Obj, cluster_of


def _items(cluster: Cluster) -> Iterable[Item]:
    """The stack's objects as the fabric rules read them, wrapped once for the four policies."""
    return cluster.once("fabric items", lambda: (Item(o.kind, o.props, o) for o in cluster.objects))


def _nodes(cluster: Cluster) -> dict[str, Mapping[str, Any]]:
    return {name: node.labels for name, node in cluster.nodes().items()}


def _violations(problems: Iterator[tuple[Obj, str]]) -> Iterator[Violation]:
    for obj, message in problems:
        yield obj.resource, f"{obj.describe()}: {message}"


def check_fabric_keys_apart(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    yield from _violations(key_problems(_items(cluster), _nodes(cluster)))


def check_fabric_attachments_own(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    yield from _violations(attachment_problems(_items(cluster), lambda ns: t.name if (t := cluster.tenant_of_namespace(ns)) else None))


def check_nic_policies_one_pool(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    yield from _violations(selector_problems(_items(cluster), _nodes(cluster)))


def check_dra_claims_aligned(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    yield from _violations(alignment_problems(_items(cluster_of(resources))))


POLICIES = [
    stack_policy(
        "fabric-keys-apart",
        "Every tenant RDMA network has its own partition key (15-bit, not 0x7fff) or VLAN (2-4094) on its fabric.",
        check_fabric_keys_apart,
    ),
    stack_policy(
        "fabric-attachments-own",
        "RDMA networks live in tenant namespaces and tenant pods name networks of their own namespace only, under admission.",
        check_fabric_attachments_own,
        tenant_local=True,
    ),
    stack_policy(
        "nic-policies-one-pool",
        "Every NicNodePolicy and SriovNetworkNodePolicy selects exactly one pool's nodes; VFs keep their NUMA node.",
        check_nic_policies_one_pool,
    ),
    stack_policy(
        "dra-claims-aligned",
        "Every DRA claim pairing GPUs with RDMA VFs constrains them to one PCIe root, on networks of its own namespace.",
        check_dra_claims_aligned,
    ),
]
