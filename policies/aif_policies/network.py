"""Tenant network exposure: egress only to what the platform flows declare, and no Service that
opens a tenant to the outside.

A policy applies to a tenant when it selects the tenant's pods: a `CiliumNetworkPolicy` or
`NetworkPolicy` in its namespace, a `CiliumClusterwideNetworkPolicy` whose endpoint selector names
its namespace, or names none (then it selects every namespace). The platform flows a tenant is
given are pod selectors (`toEndpoints`); an address block in a tenant's egress may reach neither
the whole Internet (`0.0.0.0/0`, `::/0`, whatever it excepts) nor the private, shared or
link-local ranges, where the cluster's nodes, load balancers and other tenants live; a DNS name
pattern must name a domain (not `*`, nor a wildcard over a top-level domain).

References: shared/reference/security-and-reliability.md (section 3; checks 23-27 of its last
section); CVE-2020-8554 (externalIPs).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any, Iterator

from pulumi_policy import PolicyResource

from ai_factory.policies.aif_policies.core import Violation, stack_policy
from ai_factory.policies.aif_policies.kube import Cluster, Obj, Tenant, as_list, as_map, cluster_of

NAMESPACE_KEYS = ("k8s:io.kubernetes.pod.namespace", "io.kubernetes.pod.namespace", "any:io.kubernetes.pod.namespace")
INTERNAL_RANGES = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8", "fc00::/7", "fe80::/10", "::1/128")
)
"""Private (RFC 1918, RFC 4193), shared (RFC 6598), link-local and loopback ranges."""


def _selected_namespaces(selector: Mapping[str, Any]) -> set[str] | None:
    """The namespaces a Cilium endpoint selector is limited to, None when it names none (all)."""
    labels = as_map(selector.get("matchLabels"))
    for key in NAMESPACE_KEYS:
        if key in labels:
            return {str(labels[key])}
    for expression in as_list(selector.get("matchExpressions")):
        expression = as_map(expression)
        if expression.get("key") in NAMESPACE_KEYS and expression.get("operator") == "In":
            return {str(v) for v in as_list(expression.get("values"))}
    return None


def tenant_egress(cluster: Cluster) -> Iterator[tuple[Obj, Tenant, Mapping[str, Any], str]]:
    """(policy, tenant, egress rule, policy dialect) for every egress rule applying to a tenant."""
    for policy in cluster.of("CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy"):
        for spec in [policy.spec, *(as_map(s) for s in as_list(policy.props.get("specs")))]:
            if not spec or "nodeSelector" in spec:
                continue
            namespaces = {policy.namespace} if policy.kind == "CiliumNetworkPolicy" else _selected_namespaces(as_map(spec.get("endpointSelector")))
            # The tenants owning one of the namespaces, in tenant order, found by namespace: a
            # policy per tenant tested against every tenant was quadratic in the fleet.
            if namespaces is None:
                tenants = list(cluster.tenants.values())
            else:
                tenants = [cluster.tenants[t] for t in sorted({cluster.namespace_tenant[n] for n in namespaces if n in cluster.namespace_tenant})]
            for tenant in tenants:
                for rule in as_list(spec.get("egress")):
                    yield policy, tenant, as_map(rule), "cilium"
    for policy in cluster.of("NetworkPolicy"):
        tenant = cluster.tenant_of_namespace(policy.namespace)
        if tenant is not None:
            for rule in as_list(policy.spec.get("egress")):
                yield policy, tenant, as_map(rule), "kubernetes"


def _blocks(rule: Mapping[str, Any], dialect: str) -> list[str]:
    if dialect == "kubernetes":
        return [str(as_map(as_map(peer).get("ipBlock")).get("cidr")) for peer in as_list(rule.get("to")) if "ipBlock" in as_map(peer)]
    return [str(c) for c in as_list(rule.get("toCIDR"))] + [str(as_map(s).get("cidr")) for s in as_list(rule.get("toCIDRSet"))]


def cidr_problem(cidr: str) -> str | None:
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return f"{cidr}, which is not an address block"
    if network.prefixlen == 0:
        return f"{cidr}, the whole Internet (whatever it excepts)"
    internal = [str(r) for r in INTERNAL_RANGES if r.version == network.version and network.overlaps(r)]
    if internal:
        return f"{cidr}, inside the internal range {', '.join(internal)} (nodes, load balancers, other tenants)"
    return None


def fqdn_problem(pattern: str) -> str | None:
    """A `toFQDNs` pattern that names no domain: `*`, or a wildcard over a top-level domain."""
    if "*" not in pattern:
        return None
    fixed = [label for label in pattern.strip(".").split(".") if "*" not in label]
    return None if len(fixed) >= 2 and "*" not in pattern.split(".", 1)[-1] else f"the DNS pattern {pattern!r}, which names no domain"


CILIUM_PEERS = ("toEndpoints", "toCIDR", "toCIDRSet", "toEntities", "toFQDNs", "toServices", "toGroups", "toNodes", "toRequires")


def open_rule(rule: Mapping[str, Any], dialect: str) -> bool:
    """An egress rule naming no destination: it allows every one (only ports, or nothing, left)."""
    if dialect == "kubernetes":
        return not as_list(rule.get("to"))
    return not any(as_list(rule.get(peer)) for peer in CILIUM_PEERS)


def check_tenant_egress_bounded(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    for policy, tenant, rule, dialect in tenant_egress(cluster_of(resources)):
        problems = [p for p in map(cidr_problem, _blocks(rule, dialect)) if p]
        if open_rule(rule, dialect):
            problems.append("every destination (an egress rule naming none)")
        for fqdn in as_list(rule.get("toFQDNs")):
            fqdn = as_map(fqdn)
            problem = fqdn_problem(str(fqdn.get("matchPattern"))) if "matchPattern" in fqdn else None
            problems += [problem] if problem else []
        for problem in problems:
            yield policy.resource, (
                f"{policy.describe()} lets tenant {tenant.name} send to {problem}: a tenant's egress goes to its own "
                "namespace, DNS and the platform flows it was given, named by pod selector."
            )


def check_tenant_services_internal(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    for service in cluster.of("Service"):
        tenant = cluster.tenant_of_namespace(service.namespace)
        if tenant is None:
            continue
        kind = service.spec.get("type")
        if kind in ("LoadBalancer", "NodePort"):
            yield service.resource, f"{service.describe()} of tenant {tenant.name} is of type {kind}: tenants expose services through the platform's gateway only."
        if as_list(service.spec.get("externalIPs")):
            yield service.resource, f"{service.describe()} of tenant {tenant.name} sets externalIPs, which intercepts traffic to those addresses (CVE-2020-8554)."


POLICIES = [
    stack_policy(
        "tenant-egress-bounded",
        "No tenant egress to the whole Internet, to private, shared or link-local ranges, or to a DNS pattern naming no domain.",
        check_tenant_egress_bounded,
        tenant_local=True,
    ),
    stack_policy(
        "tenant-services-internal",
        "No LoadBalancer or NodePort Service and no externalIPs in a tenant namespace.",
        check_tenant_services_internal,
        tenant_local=True,
    ),
]
