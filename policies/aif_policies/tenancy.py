"""Tenancy: tenant objects are labelled, RBAC never crosses tenants, never reaches cluster scope,
and never lets a tenant edit the objects that isolate it.

A tenant is what the stack shows: a Namespace labelled `ai-factory.io/tenant=<name>` (with its
trust and trust-domain labels, `ai_factory.factory.model.tenancy.TenantNames.labels`). Its subjects are the
identity-provider users and groups (OIDC-prefixed, `ai_factory.factory.model.tenancy.OIDC_PREFIX`) its namespace
names as owners or binds, and the service accounts of its namespaces.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Iterator

from pulumi_policy import PolicyResource

from ai_factory.components.tenant_stack import OWNERS_ANNOTATION
from ai_factory.factory.model.tenancy import OIDC_PREFIX, TENANT_LABEL
from ai_factory.policies.aif_policies.core import Violation, stack_policy
from ai_factory.policies.aif_policies.kube import TENANT_STACK, Cluster, ancestors, as_list, as_map, cluster_of

PLATFORM_SUBJECTS = {
    "platformSubjects": {
        "type": "array",
        "items": {"type": "string"},
        "default": [],
        "description": "Identity-provider users or groups (with their `oidc:` prefix) the platform binds in several "
        "tenants' namespaces on purpose (an on-call group, say); they are not counted as any tenant's.",
    }
}

# --------------------------------------------------------------------------- subjects


def subject_key(subject: Mapping[str, Any], binding_namespace: str | None) -> tuple[str, str]:
    """(kind, name) of an RBAC subject; a service account's name is `namespace/name`."""
    kind = str(subject.get("kind") or "")
    name = str(subject.get("name") or "")
    if kind == "ServiceAccount":
        return kind, f"{subject.get('namespace') or binding_namespace}/{name}"
    return kind, name


def show(key: tuple[str, str]) -> str:
    return f"{key[0]} {key[1]}"


def identity_owners(cluster: Cluster, platform_subjects: set[str]) -> dict[tuple[str, str], set[str]]:
    """For each identity-provider user or group, the tenants it belongs to: those whose namespace
    names it as an owner (`OWNERS_ANNOTATION`, which holds vCluster tenants' owners too: they
    have no host RoleBinding) and those whose namespaces bind it."""
    owners: dict[tuple[str, str], set[str]] = {}
    for ns in cluster.of("Namespace"):
        tenant = cluster.namespace_tenant.get(ns.name)
        try:
            declared = json.loads(as_map(as_map(ns.props.get("metadata")).get("annotations")).get(OWNERS_ANNOTATION) or "[]")
        except (TypeError, ValueError, AttributeError):
            declared = []
        for subject in declared if tenant and isinstance(declared, list) else []:
            key = subject_key(as_map(subject), ns.name)
            if is_identity(key) and key[1] not in platform_subjects:
                owners.setdefault(key, set()).add(tenant)
    for binding in cluster.of("RoleBinding"):
        tenant = cluster.namespace_tenant.get(binding.namespace or "")
        if tenant is None:
            continue
        for subject in as_list(binding.props.get("subjects")):
            key = subject_key(as_map(subject), binding.namespace)
            if is_identity(key) and key[1] not in platform_subjects:
                owners.setdefault(key, set()).add(tenant)
    return owners


def is_identity(key: tuple[str, str]) -> bool:
    return key[0] in ("User", "Group") and key[1].startswith(OIDC_PREFIX)


EVERYONE = "(every user)"
"""Stands for all tenants in the subjects of Kubernetes' all-encompassing groups."""
ALL_USERS_GROUPS = ("system:authenticated", "system:unauthenticated", "system:serviceaccounts")
SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts:"
"""`system:serviceaccounts:<namespace>`: every service account of a namespace."""


def subject_tenants(cluster: Cluster, key: tuple[str, str], owners: dict[tuple[str, str], set[str]]) -> set[str]:
    """The tenants a subject belongs to: its namespace's tenant for a service account (or the
    group of a namespace's service accounts), the tenants that bind it for an identity-provider
    user or group, everyone for Kubernetes' all-users groups."""
    if key[0] == "ServiceAccount" or key[1].startswith(SERVICE_ACCOUNTS_GROUP):
        namespace = key[1].split("/", 1)[0] if key[0] == "ServiceAccount" else key[1].removeprefix(SERVICE_ACCOUNTS_GROUP)
        tenant = cluster.namespace_tenant.get(namespace)
        return {tenant} if tenant else set()
    if key[0] == "Group" and key[1] in ALL_USERS_GROUPS:
        return {EVERYONE}
    return set(owners.get(key, ()))


def _platform_subjects(config: Mapping[str, Any]) -> set[str]:
    return {str(s) for s in as_list(config.get("platformSubjects"))}


# --------------------------------------------------------------------------- tenant-objects-labelled


def check_tenant_objects_labelled(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    for obj in cluster.objects:
        if obj.kind.endswith("Patch"):
            continue  # a patch of an object the platform does not own (a Node)
        label = obj.labels.get(TENANT_LABEL)
        namespace_tenant = cluster.namespace_tenant.get(obj.namespace or "")
        if namespace_tenant and label != namespace_tenant:
            found = f"its {TENANT_LABEL} label says {label!r}" if label else f"it has no {TENANT_LABEL} label"
            yield obj.resource, (
                f"{obj.describe()} is in namespace {obj.namespace} of tenant {namespace_tenant!r} but {found}: label it "
                f"{TENANT_LABEL}={namespace_tenant} (TenantNames.labels, factory/tenancy.py) so that metering, the "
                "isolation checks and tenant deletion find it."
            )
        elif not label and any(a.resource_type == TENANT_STACK for a in ancestors(obj.resource)):
            yield obj.resource, (
                f"{obj.describe()} is created by a TenantStack but has no {TENANT_LABEL} label: label every object of "
                "a tenant with TenantNames.labels (factory/tenancy.py)."
            )


# --------------------------------------------------------------------------- no-cross-tenant-rbac


def check_no_cross_tenant_rbac(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    owners = identity_owners(cluster, _platform_subjects(config))
    for binding in cluster.of("RoleBinding"):
        tenant = cluster.namespace_tenant.get(binding.namespace or "")
        where = f"tenant {tenant!r}" if tenant else "the platform"
        for subject in as_list(binding.props.get("subjects")):
            key = subject_key(as_map(subject), binding.namespace)
            others = sorted(subject_tenants(cluster, key, owners) - {tenant})
            if others:
                whose = "that is every user," if others == [EVERYONE] else f"a subject of tenant(s) {', '.join(others)},"
                yield binding.resource, (
                    f"{binding.describe()} grants {show(key)}, {whose} access to "
                    f"namespace {binding.namespace} of {where}: bind each tenant's own groups and service accounts "
                    "(TenantNames.group_subjects) in its own namespaces only."
                )


# --------------------------------------------------------------------------- no-cluster-scoped-tenant-grants


def check_no_cluster_scoped_tenant_grants(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    owners = identity_owners(cluster, _platform_subjects(config))
    for binding in cluster.of("ClusterRoleBinding"):
        role = as_map(binding.props.get("roleRef")).get("name")
        label = binding.labels.get(TENANT_LABEL)
        if label:
            yield binding.resource, (
                f"{binding.describe()} (to ClusterRole {role}) belongs to tenant {label!r}: a tenant gets RoleBindings "
                "in its own namespaces, never a cluster-wide grant."
            )
        for subject in as_list(binding.props.get("subjects")):
            key = subject_key(as_map(subject), None)
            tenants = sorted(subject_tenants(cluster, key, owners) - {EVERYONE})  # cluster-wide rights of all users are the platform's call
            if tenants:
                yield binding.resource, (
                    f"{binding.describe()} grants ClusterRole {role} cluster-wide to {show(key)} of tenant(s) "
                    f"{', '.join(tenants)}: grant tenant subjects namespaced roles through RoleBindings in their own "
                    "namespaces."
                )


# --------------------------------------------------------------------------- tenant-cannot-edit-isolation

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection", "*"})
ESCALATION_VERBS = frozenset({"escalate", "bind", "impersonate"})
ISOLATION_RESOURCES = (
    # (API group, resource): what keeps a tenant in its box (RBAC good practices; MTB-PL1-BC-CPI-2, CC-TI-1).
    ("", "namespaces"),  # its labels drive Pod Security admission and network selectors
    ("", "resourcequotas"),
    ("", "limitranges"),
    ("networking.k8s.io", "networkpolicies"),
    ("cilium.io", "ciliumnetworkpolicies"),
    ("cilium.io", "ciliumclusterwidenetworkpolicies"),
    ("kueue.x-k8s.io", "localqueues"),  # pointing a LocalQueue elsewhere would change whose quota a job uses
)
BUILTIN_CLUSTER_ROLES: dict[str, list[dict[str, list[str]]]] = {
    # What the built-in roles grant that matters here (kubernetes/kubernetes bootstrap policy):
    # `admin` and `edit` write NetworkPolicies and impersonate service accounts; `view` only reads.
    "cluster-admin": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
    "admin": [
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create", "delete", "deletecollection", "patch", "update"]},
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]},
    ],
    "edit": [
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create", "delete", "deletecollection", "patch", "update"]},
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]},
    ],
    "view": [],
}


def rule_problems(rule: Mapping[str, Any]) -> Iterator[str]:
    verbs = {str(v) for v in as_list(rule.get("verbs"))}
    groups = {str(g) for g in as_list(rule.get("apiGroups"))}
    names = {str(r) for r in as_list(rule.get("resources"))}
    if verbs & ESCALATION_VERBS or "*" in verbs:
        for verb in sorted((verbs & ESCALATION_VERBS) or {"*"}):
            yield f"{verb} {', '.join(sorted(names)) or 'anything'}"
    if verbs & WRITE_VERBS:
        for group, resource in ISOLATION_RESOURCES:
            if ("*" in groups or group in groups) and ("*" in names or resource in names):
                yield f"{'/'.join(sorted(verbs & WRITE_VERBS))} {resource}{'.' + group if group else ''}"


def check_tenant_cannot_edit_isolation(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    platform_subjects = _platform_subjects(config)
    roles = {(r.namespace, r.name): r for r in cluster.of("Role")}
    cluster_roles = {r.name: r for r in cluster.of("ClusterRole")}
    for binding in cluster.of("RoleBinding"):
        tenant = cluster.namespace_tenant.get(binding.namespace or "")
        if tenant is None:
            continue
        keys = [subject_key(as_map(s), binding.namespace) for s in as_list(binding.props.get("subjects"))]
        tenant_keys = [k for k in keys if _tenant_held(cluster, k, platform_subjects)]
        if not tenant_keys:
            continue  # a platform controller's binding, not a tenant's
        who = ", ".join(show(k) for k in tenant_keys)
        ref = as_map(binding.props.get("roleRef"))
        role_kind, role_name = str(ref.get("kind") or ""), str(ref.get("name") or "")
        role = roles.get((binding.namespace, role_name)) if role_kind == "Role" else cluster_roles.get(role_name)
        if role is not None:
            rules = as_list(role.props.get("rules"))
        elif role_kind == "ClusterRole" and role_name in BUILTIN_CLUSTER_ROLES:
            rules = BUILTIN_CLUSTER_ROLES[role_name]
        else:
            yield binding.resource, (
                f"{binding.describe()} binds {who} of tenant {tenant!r} to {role_kind} {role_name}, which this stack "
                "does not define: bind tenants only to roles the platform defines, so their rules can be reviewed."
            )
            continue
        problems = sorted({p for rule in rules for p in rule_problems(as_map(rule))})
        if problems:
            yield binding.resource, (
                f"{binding.describe()} lets {who} of tenant {tenant!r} {'; '.join(problems)} through {role_kind} "
                f"{role_name}: a tenant must not edit its Namespace, quotas, limit ranges, network policies or "
                "LocalQueues, nor escalate, bind or impersonate; bind a role without these verbs."
            )


def _tenant_held(cluster: Cluster, key: tuple[str, str], platform_subjects: set[str]) -> bool:
    if key[0] == "ServiceAccount":
        return key[1].split("/", 1)[0] in cluster.namespace_tenant
    return key[1] not in platform_subjects and key[0] in ("User", "Group")


POLICIES = [
    stack_policy(
        "tenant-objects-labelled",
        "Every object of a tenant (in its namespaces, or created by its TenantStack) carries its tenant label.",
        check_tenant_objects_labelled,
        tenant_local=True,
    ),
    stack_policy(
        "no-cross-tenant-rbac",
        "No RoleBinding grants a subject of one tenant access to another tenant's or the platform's namespace.",
        check_no_cross_tenant_rbac,
        settings=PLATFORM_SUBJECTS,
    ),
    stack_policy(
        "no-cluster-scoped-tenant-grants",
        "No ClusterRoleBinding grants anything to a tenant's users, groups or service accounts.",
        check_no_cluster_scoped_tenant_grants,
        settings=PLATFORM_SUBJECTS,
    ),
    stack_policy(
        "tenant-cannot-edit-isolation",
        "Roles bound to a tenant cannot edit its Namespace, quotas, network policies or queues, nor escalate.",
        check_tenant_cannot_edit_isolation,
        settings=PLATFORM_SUBJECTS,
    ),
]
