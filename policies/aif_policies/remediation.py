"""Remediation: the health layer's service accounts hold least privilege.

The pack's side of the offline `remediation-rbac` (`factory/checking/health.py`), with the same
rule per RBAC rule (`rbac_problems`): a service account of a namespace the health component
creates reads no Secret outside that namespace, deletes no pod (a drain evicts through
`pods/eviction`, which honours PodDisruptionBudgets), uses no wildcard and cannot escalate, bind or
impersonate; a binding to a role the stack does not define cannot be judged and is reported. The
pack sees the bindings the stack registers (the remediation step's); those Helm renders from a
chart (Node Problem Detector's) only the offline check sees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Iterator

from pulumi_policy import PolicyResource

from ai_factory.components.health import TOKEN as HEALTH_COMPONENT
from ai_factory.factory.checking.health import rbac_problems, service_account_home
from ai_factory.factory.checking.isolation import rule_text
from ai_factory.policies.aif_policies.core import Violation, stack_policy
from ai_factory.policies.aif_policies.kube import Cluster, Obj, ancestors, as_list, as_map, cluster_of
from ai_factory.policies.aif_policies.tenancy import show, subject_key


def health_namespaces(cluster: Cluster) -> set[str]:
    """The namespaces the health component creates (its Namespace objects' ancestry says so)."""
    return {ns.name for ns in cluster.of("Namespace") if any(a.resource_type == HEALTH_COMPONENT for a in ancestors(ns.resource))}


def _role_rules(cluster: Cluster) -> tuple[dict[tuple[str | None, str], Obj], dict[str, Obj]]:
    return {(r.namespace, r.name): r for r in cluster.of("Role")}, {r.name: r for r in cluster.of("ClusterRole")}


def _cluster_role_rules(role: Obj, cluster_roles: dict[str, Obj]) -> list[Mapping[str, Any]]:
    """A ClusterRole's rules with those its aggregation rule gathers, as the API server does."""
    rules = [as_map(r) for r in as_list(role.props.get("rules"))]
    for selector in as_list(as_map(role.props.get("aggregationRule")).get("clusterRoleSelectors")):
        wanted = as_map(as_map(selector).get("matchLabels"))
        for other in cluster_roles.values():
            if other is not role and wanted and all(other.labels.get(k) == v for k, v in wanted.items()):
                rules += [as_map(r) for r in as_list(other.props.get("rules"))]
    return rules


def check_remediation_rbac(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    homes = health_namespaces(cluster)
    roles, cluster_roles = _role_rules(cluster)
    for binding in cluster.of("RoleBinding", "ClusterRoleBinding"):
        scope = binding.namespace if binding.kind == "RoleBinding" else None
        ref = as_map(binding.props.get("roleRef"))
        kind, name = str(ref.get("kind") or ""), str(ref.get("name") or "")
        role = roles.get((scope, name)) if kind == "Role" else cluster_roles.get(name)
        for subject in as_list(binding.props.get("subjects")):
            key = subject_key(as_map(subject), scope)
            home = service_account_home(key, homes)
            if home is None:
                continue
            if role is None:
                yield binding.resource, (
                    f"{binding.describe()} binds {show(key)} of the health layer to {kind} {name}, which the stack does not "
                    "define: its permissions cannot be judged; bind the remediation's service accounts to roles the stack defines."
                )
                continue
            rules = _cluster_role_rules(role, cluster_roles) if kind == "ClusterRole" else [as_map(r) for r in as_list(role.props.get("rules"))]
            for rule in rules:
                problems = rbac_problems(rule, scope, home)
                if problems:
                    yield binding.resource, (
                        f"{binding.describe()} grants {show(key)} of the health layer {kind} {name} with {', '.join(problems)}: "
                        f"{rule_text(rule)}; remediation cordons and evicts, it never deletes pods or reads tenants' Secrets."
                    )


POLICIES = [
    stack_policy(
        "remediation-rbac",
        "The health layer's service accounts read no Secret outside their namespace, delete no pod (drains evict), use no wildcard and cannot escalate.",
        check_remediation_rbac,
    ),
]
