"""Tenant isolation, proven offline over the rendered object set.

Implements the static checks of sections A–E and H of `../shared/reference/security-and-reliability.md`
("Static checks our CI can run"). Everything is read from the rendered objects and the inventory,
never from the config, so `factory check <rendered dir>` proves the same as an in-process render:

* a tenant is a Namespace labelled `ai-factory.io/tenant` (its trust and trust domain are labels
  too); every other namespace is the platform's;
* the subjects a tenant owns are those its Namespace's `ai-factory.io/owners` annotation lists (a
  tenant cannot edit its Namespace), plus the service accounts of its namespace;
* RBAC is evaluated offline: every binding naming a tenant's subject is resolved to the rules of
  its Role/ClusterRole (aggregated ClusterRoles included) and the grant is judged by scope.

Each check yields `Finding`s naming the check, the object and the tenants involved; `CHECKS` is
registered in `ai_factory.factory.checking.check`.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
import ipaddress
import json
from fnmatch import fnmatchcase
from dataclasses import dataclass
from collections.abc import Hashable, Mapping
from typing import Any, Callable, Iterable, Iterator

import yaml

from ai_factory.components.kyverno import DEDICATED_SELECTOR, ESCAPE_VARIABLES, FORBIDDEN_MOUNTS, TOLERATION_KEY, TOLERATION_OPERATOR, TOLERATION_PAIR
from ai_factory.components.tenant_stack import (
    CLOUD_METADATA_CIDRS,
    DEFAULT_TOLERATIONS_ANNOTATION,
    NODE_SELECTOR_ANNOTATION,
    OWNERS_ANNOTATION,
    POD_SECURITY_EXCEPTION_ANNOTATION,
    TOLERATIONS_WHITELIST_ANNOTATION,
)
from ai_factory.factory.model.catalog import CHARTS
from ai_factory.factory.model.bounded_yaml import LOADER
from ai_factory.factory.checking.findings import Finding, tenant_local
from ai_factory.factory.checking.label_index import LabelIndex, selects
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.planning.placement import (
    DEDICATED_LABEL,
    DEVICE_PLUGIN_CONFIG_LABEL,
    HAMI_LABEL,
    MIG_CONFIG_LABEL,
    MIG_DISABLED_CONFIG,
    PLACEMENT_TAINT_KEYS,
)
from ai_factory.factory.rendering.bundle import Manifest, Rendered
from ai_factory.factory.rendering.charts import CHART_ORIGIN
from ai_factory.factory.model.tenancy import OIDC_PREFIX, TENANT_LABEL, TRUST_DOMAIN_LABEL, TRUST_LABEL

Subject = tuple[str, str]
"""(kind, name); a ServiceAccount's name is `<namespace>/<name>`."""

SYSTEM_GROUPS = ("system:masters", "system:authenticated", "system:unauthenticated")
SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts:"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection", "*"})
ESCALATION_VERBS = frozenset({"escalate", "bind", "impersonate"})
ISOLATION_OBJECTS = {
    ("", "resourcequotas"): "its quota",
    ("", "limitranges"): "its limits",
    ("rbac.authorization.k8s.io", "roles"): "RBAC",
    ("rbac.authorization.k8s.io", "rolebindings"): "RBAC",
    ("networking.k8s.io", "networkpolicies"): "network policy",
    ("cilium.io", "ciliumnetworkpolicies"): "network policy",
    ("kueue.x-k8s.io", "localqueues"): "its queue binding",
}
"""Objects in a tenant's own namespace that the platform owns: the tenant may read, never write them."""
NAMESPACE_KEYS = ("k8s:io.kubernetes.pod.namespace", "io.kubernetes.pod.namespace", "any:io.kubernetes.pod.namespace")
NAMESPACE_LABEL_PREFIXES = ("k8s:io.cilium.k8s.namespace.labels.", "io.cilium.k8s.namespace.labels.")
OPEN_ENTITIES = frozenset({"all", "cluster", "world", "host", "remote-node", "unmanaged"})
"""Cilium entities that reach beyond the tenant and the platform services it was given."""
BASE_QUOTA = (
    ("requests.cpu",),
    ("requests.memory",),
    ("limits.memory",),
    ("requests.storage",),
    ("requests.ephemeral-storage",),
    ("count/pods", "pods"),
    ("count/persistentvolumeclaims", "persistentvolumeclaims"),
    ("count/services", "services"),
    ("count/secrets", "secrets"),
    ("count/configmaps", "configmaps"),
    ("services.loadbalancers",),
    ("services.nodeports",),
)
"""Keys every tenant quota must set (alternatives on one line), reference check 29."""
DRA_QUOTA_SUFFIX = ".deviceclass.resource.k8s.io/devices"


# --------------------------------------------------------------------------- the rendered set, read once


def metadata_map(obj: Mapping[str, Any], key: str) -> Mapping[str, str]:
    """An object's labels or annotations; malformed ones (the schema check reports them) read as none."""
    metadata = obj.get("metadata")
    value = metadata.get(key) if isinstance(metadata, Mapping) else None
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class TenantNamespace:
    tenant: str
    namespace: str
    trust: str
    trust_domain: str
    manifest: Manifest

    @property
    def annotations(self) -> Mapping[str, str]:
        return metadata_map(self.manifest.obj, "annotations")

    @property
    def labels(self) -> Mapping[str, str]:
        return metadata_map(self.manifest.obj, "labels")


class View:
    """Tenants, namespaces and subjects of a rendered environment."""

    _shared: dict[int, tuple[Rendered, View]] | None = None
    """The views of a `shared` run, by render."""

    @classmethod
    def of(cls, rendered: Rendered) -> View:
        """The view of a render: within `shared`, built once for every check of the run."""
        if cls._shared is None:
            return cls(rendered)
        hit = cls._shared.get(id(rendered))
        if hit is None or hit[0] is not rendered:
            hit = cls._shared[id(rendered)] = (rendered, cls(rendered))
        return hit[1]

    @classmethod
    @contextmanager
    def shared(cls) -> Iterator[None]:
        """Checks run in this block share one view per render (`run_checks`: nothing changes a
        render while its checks run; each check building its own was a twentieth of the time)."""
        outer, cls._shared = cls._shared, {}
        try:
            yield
        finally:
            cls._shared = outer

    def __init__(self, rendered: Rendered):
        self.rendered, self.manifests = rendered, rendered.manifests
        # Indexed once by (kind, namespace), as the render is by kind: checks ask per tenant, and a
        # rescan of every object per tenant made the checks quadratic in the environment's size.
        self._by_namespace: dict[tuple[str, str | None], list[Manifest]] = {}
        for kind in rendered.kinds():
            for m in rendered.of_kind(kind):
                self._by_namespace.setdefault((kind, m.namespace), []).append(m)
        self._pod_rules: dict[str, list[Mapping[str, Any]]] | None = None
        self.namespace_labels: dict[str, dict[str, str]] = {}
        self.tenant_namespaces: dict[str, TenantNamespace] = {}
        for m in self.of_kind("Namespace"):
            labels = dict(metadata_map(m.obj, "labels"))
            self.namespace_labels[m.name] = {**labels, "kubernetes.io/metadata.name": m.name}
            if TENANT_LABEL in labels:
                tenant = labels[TENANT_LABEL]
                self.tenant_namespaces[m.name] = TenantNamespace(
                    tenant, m.name, labels.get(TRUST_LABEL, ""), labels.get(TRUST_DOMAIN_LABEL, tenant), m
                )
        self._namespaces = LabelIndex(self.namespace_labels, self.namespace_labels.__getitem__)
        # By trust domain once: `tenants_of_domain` is asked about every node's domain.
        by_domain: dict[str, set[str]] = {}
        for t in self.tenant_namespaces.values():
            if isinstance(t.trust_domain, Hashable):
                by_domain.setdefault(t.trust_domain, set()).add(t.tenant)
        self._domain_tenants = {domain: sorted(tenants) for domain, tenants in by_domain.items()}
        self.owners: dict[Subject, set[str]] = {}
        self.unreadable_owners: list[TenantNamespace] = []
        for t in self.tenant_namespaces.values():
            try:
                listed = json.loads(t.annotations.get(OWNERS_ANNOTATION, "[]"))
                subjects = [(s["kind"], s["name"]) for s in listed]
            except (ValueError, TypeError, KeyError):
                self.unreadable_owners.append(t)
                continue
            for subject in subjects:
                self.owners.setdefault(subject, set()).add(t.tenant)

    def namespaces_labelled(self, label: str, value: Any) -> set[str]:
        """The namespaces whose label `label` is `value`."""
        return {self._namespaces.items[p] for p in self._namespaces.positions({label: value})}

    def of_kind(self, *kinds: str) -> list[Manifest]:
        """Objects of these kinds, in render order."""
        return self.rendered.of_kind(*kinds)

    def in_namespace(self, kind: str, namespace: str | None) -> list[Manifest]:
        """Objects of one kind in one namespace, in render order."""
        return list(self._by_namespace.get((kind, namespace), ()))

    def enforced_pod_rules(self, namespace: str) -> list[Mapping[str, Any]]:
        """The validate rules of Kyverno ClusterPolicies that enforce on Pods of one namespace, in
        policy and rule order (every policy is read once, for all namespaces)."""
        if self._pod_rules is None:
            self._pod_rules = {}
            for m in self.of_kind("ClusterPolicy"):
                for rule in (m.obj.get("spec") or {}).get("rules") or []:
                    if (rule.get("validate") or {}).get("failureAction") != "Enforce":
                        continue
                    matched = [(f.get("resources") or {}) for f in ((rule.get("match") or {}).get("any") or [])]
                    selected = dict.fromkeys(ns for r in matched if "Pod" in (r.get("kinds") or []) for ns in (r.get("namespaces") or []) if isinstance(ns, str))
                    for ns in selected:
                        self._pod_rules.setdefault(ns, []).append(rule)
        return list(self._pod_rules.get(namespace, ()))

    def tenant_at(self, namespace: str | None) -> TenantNamespace | None:
        return self.tenant_namespaces.get(namespace or "")

    def tenants_of_domain(self, domain: str) -> list[str]:
        if isinstance(domain, Hashable):
            return list(self._domain_tenants.get(domain, ()))
        # A label value that is no string (malformed, as the schema check reports): compared with each.
        return sorted({t.tenant for t in self.tenant_namespaces.values() if t.trust_domain == domain})

    def subject_tenants(self, subject: Subject) -> set[str]:
        kind, name = subject
        if kind == "ServiceAccount":
            owner = self.tenant_at(name.split("/", 1)[0])
            return {owner.tenant} if owner else set()
        if kind == "Group" and name.startswith(SERVICE_ACCOUNTS_GROUP):
            owner = self.tenant_at(name.removeprefix(SERVICE_ACCOUNTS_GROUP))
            return {owner.tenant} if owner else set()
        return set(self.owners.get(subject, set()))

    def is_platform_service_account(self, subject: Subject) -> bool:
        return subject[0] == "ServiceAccount" and self.tenant_at(subject[1].split("/", 1)[0]) is None

    def owner_phrase(self, namespace: str) -> str:
        owner = self.tenant_at(namespace)
        return f"tenant {owner.tenant}'s namespace" if owner else "a platform namespace"

    def tenant_of(self, m: Manifest) -> str | None:
        """The tenant an object belongs to: its label, else the tenant of its namespace."""
        labels = metadata_map(m.obj, "labels")
        owner = self.tenant_at(m.namespace)
        return labels.get(TENANT_LABEL) or (owner.tenant if owner else None)


def _subject(raw: Mapping[str, Any], binding_namespace: str | None) -> Subject:
    if raw.get("kind") == "ServiceAccount":
        return ("ServiceAccount", f"{raw.get('namespace') or binding_namespace}/{raw.get('name')}")
    return (str(raw.get("kind")), str(raw.get("name")))


def _show(subject: Subject) -> str:
    return f"{subject[0]} {subject[1]}"


def _finding(check: str, m: Manifest, message: str, *tenants: str | None) -> Finding:
    return Finding(check, m.ref, message, tuple(sorted({t for t in tenants if t})))


# --------------------------------------------------------------------------- A. tenancy and RBAC


@tenant_local
def tenant_labels(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """A1, A14: every object in a tenant's namespace carries its tenant label; a tenant's objects
    live in its namespace (or are cluster-scoped), never in another tenant's or the platform's."""
    view = View.of(rendered)
    for m in view.manifests:
        if m.origin.startswith(CHART_ORIGIN):
            continue  # helm labels a chart's objects itself; they belong to the release's tenant
        labelled = metadata_map(m.obj, "labels").get(TENANT_LABEL)
        home = view.tenant_at(m.namespace)
        if home and labelled != home.tenant:
            what = f"carries tenant label {labelled!r}" if labelled else "has no tenant label"
            yield _finding("tenant-labels", m, f"in tenant {home.tenant}'s namespace but {what}", home.tenant, labelled)
        elif labelled and m.namespace and not home:
            yield _finding("tenant-labels", m, f"tenant {labelled}'s object lives in platform namespace {m.namespace}", labelled)


@tenant_local
def rbac_subjects(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """A2, A3, A10, A12: bindings in a tenant's namespace name only that tenant's subjects (or
    platform service accounts); no tenant subject is bound outside its namespace or cluster-wide;
    nobody is bound to cluster-admin or as a system group; owners carry the OIDC prefix and
    belong to one tenant. Bindings seeded inside a tenant's vCluster name only its owners."""
    view = View.of(rendered)
    for t in view.unreadable_owners:
        yield _finding("rbac-subjects", t.manifest, f"{OWNERS_ANNOTATION} is not a JSON list of {{kind, name}} subjects", t.tenant)
    for (kind, name), tenants in sorted(view.owners.items()):
        if kind in ("Group", "User") and not name.startswith(OIDC_PREFIX):
            for t in sorted(tenants):
                ns = next(n for n in view.tenant_namespaces.values() if n.tenant == t)
                yield _finding("rbac-subjects", ns.manifest, f"owner {kind} {name} lacks the {OIDC_PREFIX!r} prefix of the API servers' OIDC settings", t)
        if len(tenants) > 1:
            for t in sorted(tenants):
                ns = next(n for n in view.tenant_namespaces.values() if n.tenant == t)
                yield _finding("rbac-subjects", ns.manifest, f"owner {kind} {name} is shared by tenants {', '.join(sorted(tenants))}", *tenants)
    for m in view.of_kind("RoleBinding", "ClusterRoleBinding"):
        yield from _binding_subject_findings(view, m, m.obj, m.namespace if m.kind == "RoleBinding" else None, home=view.tenant_at(m.namespace))
    for release, home in _vcluster_releases(view):
        for inner in _embedded_manifests(release):
            if inner.get("kind") in ("RoleBinding", "ClusterRoleBinding"):
                # Inside the tenant's own API server every binding is the tenant's.
                yield from _binding_subject_findings(view, release, inner, None, home=home, inside_vcluster=True)


def _binding_subject_findings(
    view: View, m: Manifest, binding: Mapping[str, Any], scope: str | None, home: TenantNamespace | None, inside_vcluster: bool = False
) -> Iterator[Finding]:
    where = f"inside tenant {home.tenant}'s vCluster, " if inside_vcluster and home else ""
    role_ref = binding.get("roleRef") or {}
    if role_ref.get("name") == "cluster-admin" and not inside_vcluster:
        yield _finding("rbac-subjects", m, "binds ClusterRole cluster-admin", home.tenant if home else None)
    for raw in binding.get("subjects") or []:
        subject = _subject(raw, scope)
        owners = view.subject_tenants(subject)
        if subject[1] in SYSTEM_GROUPS:
            yield _finding("rbac-subjects", m, f"{where}binds system group {subject[1]}", home.tenant if home else None)
            continue
        if inside_vcluster and subject[0] == "ServiceAccount":
            continue  # an account of the virtual cluster, not of the host namespace of that name
        if inside_vcluster or scope is not None and home:
            expected = home.tenant if home else None
            if owners - {expected}:
                others = ", ".join(sorted(owners - {expected}))
                yield _finding("rbac-subjects", m, f"{where}binds {_show(subject)} of tenant {others} into tenant {expected}'s environment", expected, *owners)
            elif not owners and not view.is_platform_service_account(subject):
                yield _finding("rbac-subjects", m, f"{where}binds {_show(subject)}, which belongs to no tenant, into tenant {expected}'s environment", expected)
        elif owners:
            place = "cluster-wide" if scope is None else f"in {view.owner_phrase(scope)} {scope}"
            yield _finding("rbac-subjects", m, f"binds {_show(subject)} of tenant {', '.join(sorted(owners))} {place}", *owners)


@dataclass(frozen=True)
class Grant:
    binding: Manifest
    tenant: str
    subject: Subject
    scope: str | None
    """Namespace of a RoleBinding; None for a ClusterRoleBinding (every namespace + cluster scope)."""
    role: str
    rules: tuple[Mapping[str, Any], ...] | None
    """None: the role is not in the rendered set."""


def tenant_grants(view: View) -> list[Grant]:
    """Every (binding, tenant subject) pair with the rules it grants."""
    return [
        Grant(binding, tenant, subject, scope, role, rules)
        for binding, subject, scope, role, rules in bound_rules(view)
        for tenant in sorted(view.subject_tenants(subject))
    ]


def bound_rules(view: View) -> Iterator[tuple[Manifest, Subject, str | None, str, tuple[Mapping[str, Any], ...] | None]]:
    """(binding, subject, scope, role, rules) of every subject of every binding: the rules its
    Role or ClusterRole (aggregated ClusterRoles included) grants, None when the role is not in the
    rendered set; the scope is the RoleBinding's namespace, None for a ClusterRoleBinding."""
    roles: dict[tuple[str | None, str], list[Mapping[str, Any]]] = {}
    for m in view.of_kind("Role"):
        roles[(m.namespace, m.name)] = list(m.obj.get("rules") or [])
    cluster_roles = {m.name: m.obj for m in view.of_kind("ClusterRole")}

    def cluster_role_rules(name: str) -> list[Mapping[str, Any]] | None:
        role = cluster_roles.get(name)
        if role is None:
            return None
        rules = list(role.get("rules") or [])
        for selector in (role.get("aggregationRule") or {}).get("clusterRoleSelectors") or []:
            wanted = selector.get("matchLabels") or {}
            for other in cluster_roles.values():
                other_labels = metadata_map(other, "labels")
                if other is not role and wanted and all(other_labels.get(k) == v for k, v in wanted.items()):
                    rules += list(other.get("rules") or [])
        return rules

    for m in view.of_kind("RoleBinding", "ClusterRoleBinding"):
        scope = m.namespace if m.kind == "RoleBinding" else None
        ref = m.obj.get("roleRef") or {}
        if ref.get("kind") == "Role":
            rules = roles.get((scope, ref.get("name", "")))
            role = f"Role/{scope}/{ref.get('name')}"
        else:
            rules = cluster_role_rules(ref.get("name", ""))
            role = f"ClusterRole/{ref.get('name')}"
        for raw in m.obj.get("subjects") or []:
            yield m, _subject(raw, scope), scope, role, None if rules is None else tuple(rules)


def _covers(rule: Mapping[str, Any], group: str, resource: str) -> bool:
    groups = rule.get("apiGroups") or []
    resources = rule.get("resources") or []
    return (group in groups or "*" in groups) and any(r in ("*", resource) or r.startswith(f"{resource}/") for r in resources)


def rule_text(rule: Mapping[str, Any]) -> str:
    groups = ",".join(g or "core" for g in rule.get("apiGroups") or []) or "-"
    return f"{','.join(rule.get('verbs') or [])} on {groups}/{','.join(rule.get('resources') or rule.get('nonResourceURLs') or [])}"


@tenant_local
def rbac_rules(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """A9: no role granted to a tenant has a wildcard verb, resource or API group, or `escalate`,
    `bind` or `impersonate`."""
    view = View.of(rendered)
    for g in tenant_grants(view):
        for rule in g.rules or ():
            wildcard = [part for part in ("apiGroups", "resources", "verbs") if "*" in (rule.get(part) or [])]
            escalation = sorted(ESCALATION_VERBS & set(rule.get("verbs") or []))
            if wildcard or escalation:
                problem = ", ".join([*(f"wildcard {p}" for p in wildcard), *(f"verb {v}" for v in escalation)])
                yield _finding("rbac-rules", g.binding, f"grants tenant {g.tenant} ({_show(g.subject)}) {g.role} with {problem}: {rule_text(rule)}", g.tenant)


def rbac_access(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """A4–A8, offline RBAC evaluation: a tenant's subjects can do nothing cluster-wide or on
    cluster-scoped resources (its own Namespace included), nothing in other tenants' or platform
    namespaces, and cannot write its quota, limits, RBAC, network policies or queue binding."""
    view = View.of(rendered)
    for g in tenant_grants(view):
        home = view.tenant_at(g.scope)
        who = f"tenant {g.tenant} ({_show(g.subject)})"
        if g.rules is None:
            yield _finding("rbac-access", g.binding, f"binds {who} to {g.role}, which is not in the rendered set: its permissions cannot be evaluated", g.tenant)
            continue
        rules = [r for r in g.rules if r.get("verbs")]
        if not rules:
            continue
        granted = "; ".join(rule_text(r) for r in rules)
        if g.scope is None:
            yield _finding("rbac-access", g.binding, f"{who} can {granted} in every namespace and on cluster-scoped resources (its Namespace included)", g.tenant)
        elif not home or home.tenant != g.tenant:
            yield _finding("rbac-access", g.binding, f"{who} can {granted} in {view.owner_phrase(g.scope)} {g.scope}", g.tenant, home.tenant if home else None)
        else:
            for (group, resource), what in ISOLATION_OBJECTS.items():
                for rule in rules:
                    verbs = sorted(WRITE_VERBS & set(rule.get("verbs") or []))
                    if verbs and _covers(rule, group, resource):
                        yield _finding(
                            "rbac-access", g.binding, f"{who} can {','.join(verbs)} {resource} ({what}) in its own namespace {g.scope}", g.tenant
                        )


@tenant_local
def service_account_token(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """A13: each tenant namespace's `default` service account does not mount its token."""
    view = View.of(rendered)
    defaults = {m.namespace: m for m in view.of_kind("ServiceAccount") if m.name == "default"}
    for ns, t in sorted(view.tenant_namespaces.items()):
        account = defaults.get(ns)
        if account is None or account.obj.get("automountServiceAccountToken") is not False:
            yield _finding("service-account-token", t.manifest, f"the default service account of {ns} mounts its API token into every pod", t.tenant)


# --------------------------------------------------------------------------- B. pod security


@tenant_local
def pod_security(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """B15: tenant namespaces enforce `restricted` (or `baseline` under a recorded, reviewed
    exception), with a pinned version, audited and warned."""
    view = View.of(rendered)
    for t in view.tenant_namespaces.values():
        labels = t.labels
        enforce = labels.get("pod-security.kubernetes.io/enforce")
        exception = t.annotations.get(POD_SECURITY_EXCEPTION_ANNOTATION)
        if enforce == "baseline" and not exception:
            yield _finding("pod-security", t.manifest, f"enforces baseline without a reviewed exception ({POD_SECURITY_EXCEPTION_ANNOTATION})", t.tenant)
        elif enforce == "baseline" and t.trust == "low":
            yield _finding("pod-security", t.manifest, "a low-trust tenant enforces baseline", t.tenant)
        elif enforce not in ("restricted", "baseline"):
            yield _finding("pod-security", t.manifest, f"enforces {enforce or 'nothing'} instead of restricted", t.tenant)
        missing = [k for k in ("enforce-version", "audit", "warn") if not labels.get(f"pod-security.kubernetes.io/{k}")]
        if missing:
            yield _finding("pod-security", t.manifest, f"no pod-security.kubernetes.io/{{{','.join(missing)}}} label", t.tenant)


def _pod_specs(value: Any) -> Iterator[Mapping[str, Any]]:
    """Every pod spec inside an object (Pod, workload templates, custom resources' templates, and
    Dynamo's `extraPodSpec` with its `mainContainer`), outermost first, in document order."""
    # A walk of the maps and lists alone: a generator for every value, strings and numbers
    # included, made this the isolation checks' largest cost.
    pending = [value]
    while pending:
        node = pending.pop()
        if isinstance(node, Mapping):
            if isinstance(node.get("containers"), list) or _main_container(node) is not None:
                yield node
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        pending.extend(reversed([child for child in children if isinstance(child, (Mapping, list))]))


@tenant_local
def tenant_pods(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """E35, E36 and the host-escape controls of B: no tenant pod template sets the NVIDIA/HAMi
    escape variables (directly or from a rendered ConfigMap), mounts the device-list, driver or
    preload paths (the lists the Kyverno layer enforces at admission), uses hostPath, host
    namespaces or privileged containers."""
    view = View.of(rendered)
    config_maps = {(m.namespace, m.name): m.obj.get("data") or {} for m in view.of_kind("ConfigMap")}
    for m in view.manifests:
        tenant = view.tenant_of(m)
        if not tenant:
            continue
        for spec in _pod_specs(m.obj.get("spec")):
            for problem in _pod_problems(spec, m.namespace, config_maps):
                yield _finding("tenant-pods", m, problem, tenant)


def _main_container(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container a Dynamo `extraPodSpec` adds to the pod its operator builds: one naming its
    image (a CRD's schema of the field, also a mapping, names none)."""
    main = spec.get("mainContainer")
    return main if isinstance(main, Mapping) and isinstance(main.get("image"), str) else None


def _containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    main = [m] if (m := _main_container(spec)) is not None else []
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []), *(spec.get("ephemeralContainers") or []), *main]


def _host_access(spec: Mapping[str, Any]) -> Iterator[str]:
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            yield f"sets {flag}"
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            yield f"volume {volume.get('name')} is a hostPath ({(volume['hostPath'] or {}).get('path')})"
    for c in _containers(spec):
        if (c.get("securityContext") or {}).get("privileged"):
            yield f"container {c.get('name')} is privileged"


def _pod_problems(spec: Mapping[str, Any], namespace: str | None, config_maps: Mapping[tuple, Mapping]) -> Iterator[str]:
    yield from _host_access(spec)
    for c in _containers(spec):
        name = c.get("name")
        variables = [e.get("name", "") for e in c.get("env") or []]
        if c.get("envFrom"):
            yield f"container {name} imports variables with envFrom, which admission refuses (a ConfigMap or Secret could set GPU escape variables)"
        for source in c.get("envFrom") or []:
            ref = (source.get("configMapRef") or {}).get("name")
            variables += [f"{source.get('prefix', '')}{key}" for key in config_maps.get((namespace, ref), {})]
        for variable in sorted(set(variables)):
            if any(fnmatchcase(variable, pattern) for pattern in ESCAPE_VARIABLES):
                yield f"container {name} sets {variable}, which bypasses GPU allocation or HAMi limits"
        for mount in c.get("volumeMounts") or []:
            path = mount.get("mountPath", "")
            if any(fnmatchcase(path, pattern) for pattern in FORBIDDEN_MOUNTS):
                yield f"container {name} mounts {path}"


SCHEMA_KINDS = ("CustomResourceDefinition",)
"""Kinds whose spec is a schema: the pods it describes (a `containers` property) run nowhere, and
walking the charts' CRDs for them was nine tenths of `privileged_workloads` at 1,000 tenants."""
PRIVILEGED_SYSTEM_NAMESPACES = ("kube-system",)
"""Namespaces the platform does not create but runs privileged node agents in (Cilium)."""


@tenant_local
def privileged_workloads(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """A pod template with host access (privileged containers, host namespaces, hostPath) runs only
    in the platform's allow-list: a namespace the platform creates with Pod Security `privileged`,
    or kube-system. Elsewhere Pod Security refuses it, or it is a node agent nobody declared.
    Tenant namespaces are `tenant_pods`' concern."""
    view = View.of(rendered)
    allowed = set(PRIVILEGED_SYSTEM_NAMESPACES) | {
        ns for ns, labels in view.namespace_labels.items() if labels.get("pod-security.kubernetes.io/enforce") == "privileged"
    }
    for m in view.manifests:
        if view.tenant_at(m.namespace) or m.namespace in allowed or m.kind in SCHEMA_KINDS:
            continue
        for spec in _pod_specs(m.obj.get("spec")):
            for problem in _host_access(spec):
                yield _finding("privileged-workloads", m, f"{problem} outside the platform's privileged namespaces ({', '.join(sorted(allowed))})")


# --------------------------------------------------------------------------- C. network isolation


def _policy_specs(m: Manifest) -> list[Mapping[str, Any]]:
    return [s for s in [m.obj.get("spec"), *(m.obj.get("specs") or [])] if isinstance(s, Mapping)]


def _endpoint_scope(selector: Mapping[str, Any], view: View, default_namespace: str | None) -> tuple[set[str] | None, bool]:
    """(namespaces the Cilium endpoint selector can match, None = all; whether it also narrows pods)."""
    namespaces: set[str] | None = None
    narrows_pods = False

    def narrow(allowed: set[str]) -> None:
        nonlocal namespaces
        namespaces = allowed if namespaces is None else namespaces & allowed

    for key, value in (selector.get("matchLabels") or {}).items():
        if key in NAMESPACE_KEYS:
            narrow({value})
        elif key.startswith(NAMESPACE_LABEL_PREFIXES):
            narrow(view.namespaces_labelled(key.split(".labels.", 1)[1], value))
        else:
            narrows_pods = True
    for expression in selector.get("matchExpressions") or []:
        if expression.get("key") in NAMESPACE_KEYS:
            if expression.get("operator") == "In":
                narrow(set(expression.get("values") or []))
        else:
            narrows_pods = True
    if namespaces is None and default_namespace:
        namespaces = {default_namespace}
    return namespaces, narrows_pods


def _default_deny(spec: Mapping[str, Any], direction: str) -> bool:
    explicit = (spec.get("enableDefaultDeny") or {}).get(direction)
    if explicit is not None:
        return bool(explicit)
    return bool(spec.get(direction) or spec.get(f"{direction}Deny"))


def _cidrs(rule: Mapping[str, Any], prefix: str) -> list[tuple[str, list[str]]]:
    cidrs = [(c, []) for c in rule.get(f"{prefix}CIDR") or []]
    return cidrs + [(r["cidr"], list(r.get("except") or [])) for r in rule.get(f"{prefix}CIDRSet") or [] if "cidr" in r]


def _covers_address(cidr: str, excepted: list[str], address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
        if ip not in ipaddress.ip_network(cidr, strict=False):
            return False
        return not any(ip in ipaddress.ip_network(e, strict=False) for e in excepted)
    except ValueError:
        return False


def _dns_allowed(spec: Mapping[str, Any], view: View) -> bool:
    for rule in spec.get("egress") or []:
        for selector in rule.get("toEndpoints") or []:
            namespaces, _ = _endpoint_scope(selector, view, None)
            dns = (selector.get("matchLabels") or {}).get("k8s:k8s-app") or (selector.get("matchLabels") or {}).get("k8s-app")
            ports = {p.get("port") for to in rule.get("toPorts") or [] for p in to.get("ports") or []}
            if namespaces == {"kube-system"} and dns == "kube-dns" and "53" in ports:
                return True
    return False


@tenant_local
def network_default_deny(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """C23, C26, C28: every tenant namespace is selected, as a whole, by a cluster-scoped Cilium
    policy (which no tenant can delete) that denies by default in both directions, allows DNS, and
    denies the cloud metadata address."""
    view = View.of(rendered)
    if not view.tenant_namespaces:
        return
    # Each policy's scope is read once (per tenant, every policy of every tenant was read again).
    everywhere: list[int] = []
    selecting: dict[str, list[int]] = {}
    specs_in_order = [s for m in view.of_kind("CiliumClusterwideNetworkPolicy") for s in _policy_specs(m)]
    for position, spec in enumerate(specs_in_order):
        if "nodeSelector" in spec:
            continue  # a host policy
        namespaces, narrows_pods = _endpoint_scope(spec.get("endpointSelector") or {}, view, None)
        if narrows_pods:
            continue
        for ns in namespaces if namespaces is not None else ():
            selecting.setdefault(ns, []).append(position)
        if namespaces is None:
            everywhere.append(position)
    for ns, t in sorted(view.tenant_namespaces.items()):
        specs = [specs_in_order[p] for p in sorted({*everywhere, *selecting.get(ns, ())})]
        for direction in ("ingress", "egress"):
            if not any(_default_deny(s, direction) for s in specs):
                yield _finding(
                    "network-default-deny", t.manifest, f"no cluster-wide Cilium policy denies {direction} by default for {ns} (namespaced policies can be deleted by the tenant)", t.tenant
                )
        if not any(_dns_allowed(s, view) for s in specs):
            yield _finding("network-default-deny", t.manifest, f"no cluster-wide Cilium policy lets {ns} reach kube-dns on port 53", t.tenant)
        for address in CLOUD_METADATA_CIDRS:
            ip = address.split("/")[0]
            denied = any(_covers_address(c, e, ip) for s in specs for rule in s.get("egressDeny") or [] for c, e in _cidrs(rule, "to"))
            if not denied:
                yield _finding("network-default-deny", t.manifest, f"egress of {ns} to the cloud metadata address {ip} is not denied", t.tenant)


@tenant_local
def network_allow_rules(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """C25, C26: allow rules of every policy that selects a tenant's pods admit only its own
    namespace and named platform pods: no other tenant's namespace, no selector spanning every
    namespace (empty namespaceSelector, Cilium selector without a namespace), no whole platform
    namespace, no open entity (all, cluster, world, host, remote-node), no CIDR covering the cloud
    metadata address."""
    view = View.of(rendered)
    for m in view.of_kind("CiliumClusterwideNetworkPolicy", "CiliumNetworkPolicy"):
        default_ns = m.namespace if m.kind == "CiliumNetworkPolicy" else None
        for spec in _policy_specs(m):
            if "nodeSelector" in spec:
                continue
            subjects, _ = _endpoint_scope(spec.get("endpointSelector") or {}, view, default_ns)
            tenants = [t for ns, t in sorted(view.tenant_namespaces.items()) if subjects is None or ns in subjects]
            for t in tenants:
                for direction, prefix, peers in (("ingress", "from", "fromEndpoints"), ("egress", "to", "toEndpoints")):
                    for rule in spec.get(direction) or []:
                        yield from _cilium_rule_findings(view, m, t, direction, prefix, rule, peers, default_ns)
    for m in view.of_kind("NetworkPolicy"):
        t = view.tenant_at(m.namespace)
        if t is None:
            continue
        for direction, key in (("ingress", "from"), ("egress", "to")):
            for rule in (m.obj.get("spec") or {}).get(direction) or []:
                if not rule.get(key):
                    # Cilium adds Kubernetes allow rules to the cluster-wide default deny: a rule
                    # without peers opens the selected pods to (or towards) every pod and address.
                    ports = ",".join(str(p.get("port", "all")) for p in rule.get("ports") or []) or "every port"
                    message = f"allows {direction} of tenant {t.tenant} {key} every pod of every namespace and every address on {ports} (rule without {key!r})"
                    yield _finding("network-allow-rules", m, message, t.tenant)
                for peer in rule.get(key) or []:
                    yield from _network_policy_peer_findings(view, m, t, direction, peer)


def _cilium_rule_findings(
    view: View, m: Manifest, t: TenantNamespace, direction: str, prefix: str, rule: Mapping[str, Any], peers: str, default_ns: str | None
) -> Iterator[Finding]:
    for entity in sorted(OPEN_ENTITIES & set(rule.get(f"{prefix}Entities") or [])):
        yield _finding("network-allow-rules", m, f"allows {direction} of tenant {t.tenant} {prefix} entity {entity!r}", t.tenant)
    for selector in rule.get(peers) or []:
        namespaces, narrows_pods = _endpoint_scope(selector, view, default_ns)
        if namespaces is None:
            yield _finding("network-allow-rules", m, f"allows {direction} of tenant {t.tenant} {prefix} pods of every namespace (selector without a namespace)", t.tenant)
            continue
        yield from _peer_namespace_findings(view, m, t, direction, prefix, namespaces, narrows_pods)
    for cidr, excepted in _cidrs(rule, prefix):
        for address in CLOUD_METADATA_CIDRS:
            if _covers_address(cidr, excepted, address.split("/")[0]):
                yield _finding("network-allow-rules", m, f"allows {direction} of tenant {t.tenant} {prefix} {cidr}, which covers the cloud metadata address", t.tenant)


def _peer_namespace_findings(
    view: View, m: Manifest, t: TenantNamespace, direction: str, prefix: str, namespaces: set[str], narrows_pods: bool
) -> Iterator[Finding]:
    for ns in sorted(namespaces - {t.namespace}):
        other = view.tenant_at(ns)
        if other:
            yield _finding("network-allow-rules", m, f"allows {direction} of tenant {t.tenant} {prefix} tenant {other.tenant}'s namespace {ns}", t.tenant, other.tenant)
        elif not narrows_pods:
            yield _finding("network-allow-rules", m, f"allows {direction} of tenant {t.tenant} {prefix} every pod of platform namespace {ns}", t.tenant)


def _network_policy_peer_findings(view: View, m: Manifest, t: TenantNamespace, direction: str, peer: Mapping[str, Any]) -> Iterator[Finding]:
    prefix = "from" if direction == "ingress" else "to"
    if "ipBlock" in peer:
        block = peer["ipBlock"] or {}
        for address in CLOUD_METADATA_CIDRS:
            if _covers_address(block.get("cidr", ""), list(block.get("except") or []), address.split("/")[0]):
                yield _finding("network-allow-rules", m, f"allows {direction} of tenant {t.tenant} {prefix} {block.get('cidr')}, which covers the cloud metadata address", t.tenant)
        return
    if "namespaceSelector" not in peer:
        return  # the policy's own namespace
    selector = peer.get("namespaceSelector") or {}
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        yield _finding("network-allow-rules", m, f"allows {direction} of tenant {t.tenant} {prefix} every namespace (empty namespaceSelector)", t.tenant)
        return
    namespaces = {ns for ns, labels in view.namespace_labels.items() if selects(selector, labels)}
    pod_selector = peer.get("podSelector") or {}
    yield from _peer_namespace_findings(view, m, t, direction, prefix, namespaces, bool(pod_selector.get("matchLabels") or pod_selector.get("matchExpressions")))


# --------------------------------------------------------------------------- D. quotas


def _gpu_quota_key(key: str) -> bool:
    if key.endswith(DRA_QUOTA_SUFFIX):
        return True
    if not key.startswith("requests."):
        return False
    resource = key.removeprefix("requests.")
    return "/" in resource and not resource.split("/")[0].endswith(("kubernetes.io", "k8s.io"))


def _unscoped_quotas(view: View, namespace: str) -> list[Manifest]:
    return [
        m
        for m in view.in_namespace("ResourceQuota", namespace)
        if not (m.obj.get("spec") or {}).get("scopes") and not (m.obj.get("spec") or {}).get("scopeSelector")
    ]


def _vcluster_quota(release: Manifest) -> Mapping[str, Any]:
    return (((release.obj.get("spec") or {}).get("values") or {}).get("policies") or {}).get("resourceQuota", {}).get("quota") or {}


MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"


def gpu_quota_keys(view: View) -> set[str]:
    """The GPU resource names the platform advertises, as the rendered set shows them: every GPU
    line of a tenant quota (vCluster quotas included) and every GPU resource a Kueue ClusterQueue
    covers. Each tenant's quota must cap all of them, so one omission anywhere shows."""
    keys = {k for t in view.tenant_namespaces for q in _unscoped_quotas(view, t) for k in (q.obj["spec"].get("hard") or {}) if _gpu_quota_key(k)}
    keys |= {k for release, _ in _vcluster_releases(view) for k in _vcluster_quota(release) if _gpu_quota_key(k)}
    dispatching = {m.name for m in view.of_kind("AdmissionCheck") if (m.obj.get("spec") or {}).get("controllerName") == MULTIKUEUE_CONTROLLER}
    for queue in view.of_kind("ClusterQueue"):
        spec = queue.obj.get("spec") or {}
        checks = {c.get("name") for c in (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []}
        if checks and checks <= dispatching:
            continue  # MultiKueue runs its workloads on the worker clusters, whose quotas cap them
        for group in spec.get("resourceGroups") or []:
            keys |= {f"requests.{r}" for r in group.get("coveredResources") or [] if _gpu_quota_key(f"requests.{r}")}
    keys |= {f"requests.{r}" for r in registered_gpu_resources(view)}
    keys |= {f"{m.name}{DRA_QUOTA_SUFFIX}" for m in view.of_kind("DeviceClass")}
    return keys


HAMI_DEVICE_CONFIG = "device-config.yaml"


def registered_gpu_resources(view: View) -> set[str]:
    """The NVIDIA resource names HAMi's rendered device config registers (count, memory, memory
    percentage, cores, priority): its scheduler admits each, so each needs a quota line."""
    names: set[str] = set()
    for m in view.of_kind("ConfigMap"):
        text = (m.obj.get("data") or {}).get(HAMI_DEVICE_CONFIG)
        if not isinstance(text, str):
            continue
        try:
            nvidia = (yaml.safe_load(text) or {}).get("nvidia") or {}
        except (yaml.YAMLError, AttributeError):
            continue
        names |= {str(v) for k, v in nvidia.items() if str(k).startswith("resource") and str(k).endswith("Name") and "/" in str(v)}
    return names


def _quantity_is_zero(value: Any) -> bool:
    return str(value).strip() in ("0", "0.0", "0m")


@tenant_local
def quota(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """C27, D29, D30: every tenant namespace has a ResourceQuota capping CPU, memory, storage,
    object counts, no NodePort, and every GPU resource name; a LimitRange; no NodePort Service."""
    view = View.of(rendered)
    gpu_keys = gpu_quota_keys(view)
    limit_ranges = {m.namespace for m in view.of_kind("LimitRange")}
    for ns, t in sorted(view.tenant_namespaces.items()):
        quotas = _unscoped_quotas(view, ns)
        hard: dict[str, Any] = {}
        for q in quotas:
            hard.update(q.obj["spec"].get("hard") or {})
        if not quotas:
            yield _finding("quota", t.manifest, f"no ResourceQuota in {ns}", t.tenant)
            continue
        missing = [keys[0] for keys in BASE_QUOTA if not any(k in hard for k in keys)]
        missing += sorted(gpu_keys - set(hard))
        if missing:
            yield _finding("quota", quotas[0], f"tenant {t.tenant}'s quota does not cap {', '.join(missing)}", t.tenant)
        if "services.nodeports" in hard and not _quantity_is_zero(hard["services.nodeports"]):
            yield _finding("quota", quotas[0], f"tenant {t.tenant}'s quota allows {hard['services.nodeports']} NodePort(s)", t.tenant)
        if ns not in limit_ranges:
            yield _finding("quota", t.manifest, f"no LimitRange in {ns}", t.tenant)
    for m in view.of_kind("Service"):
        t = view.tenant_at(m.namespace)
        if t and (m.obj.get("spec") or {}).get("type") == "NodePort":
            yield _finding("quota", m, f"tenant {t.tenant} exposes a NodePort", t.tenant)


# --------------------------------------------------------------------------- E. GPU placement


def _tolerations(t: TenantNamespace, annotation: str) -> list[Mapping[str, Any]] | None:
    try:
        value = json.loads(t.annotations[annotation])
    except (KeyError, ValueError):
        return None
    return value if isinstance(value, list) and all(isinstance(v, Mapping) for v in value) else None


def _node_is_shared(labels: Mapping[str, str]) -> bool:
    mig = labels.get(MIG_CONFIG_LABEL)
    return labels.get(HAMI_LABEL) == "enabled" or DEVICE_PLUGIN_CONFIG_LABEL in labels or bool(mig and mig != MIG_DISABLED_CONFIG)


def _conditions(block: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    conditions = (block or {}).get("conditions", block) or {}
    return list(conditions.get("any") or []) if isinstance(conditions, Mapping) else []


def _kyverno_toleration_pairs(rules: list[Mapping[str, Any]]) -> list[tuple[str, str]] | None:
    """The (key, value) placement tolerations a tenant's Kyverno rule lets its pods carry; None when
    no rule restricts them (one iterating the pod's tolerations that checks every placement key and
    the empty key, and denies any operator but Equal and any pair outside its list)."""
    for rule in rules:
        for each in (rule.get("validate") or {}).get("foreach") or []:
            if "spec.tolerations" not in str(each.get("list", "")):
                continue
            guarded = {str(k) for c in _conditions(each.get("preconditions")) if c.get("key") == TOLERATION_KEY and c.get("operator") == "AnyIn" for k in c.get("value") or []}
            denied = _conditions(each.get("deny"))
            operator_only_equal = any(c.get("key") == TOLERATION_OPERATOR and c.get("operator") == "NotEquals" and c.get("value") == "Equal" for c in denied)
            pairs = [c.get("value") for c in denied if c.get("key") == TOLERATION_PAIR and c.get("operator") == "AnyNotIn"]
            if guarded >= {"", *PLACEMENT_TAINT_KEYS} and operator_only_equal and pairs and isinstance(pairs[0], list):
                return [(key, value) for key, _, value in (str(p).partition("=") for p in pairs[0])]
    return None


def _kyverno_pinned(rules: list[Mapping[str, Any]], tenant: str) -> bool:
    """A tenant's Kyverno rule denies every pod whose nodeSelector does not select its dedicated nodes."""
    for rule in rules:
        for c in _conditions((rule.get("validate") or {}).get("deny")):
            if c.get("key") == DEDICATED_SELECTOR and c.get("operator") == "NotEquals" and c.get("value") == tenant:
                return True
    return False


def gpu_placement(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """E39, E40: a tenant's pods may only tolerate its own trust domain's and dedicated nodes'
    taints (so they can never reach another domain's shared GPUs); a low-trust tenant's pods are
    pinned to nodes dedicated to it; a node dedicated to, or shared by, a low-trust tenant is
    never a shared-GPU node of another domain and carries its taint. Either enforcement counts: the
    namespace annotations of the `PodTolerationRestriction`/`PodNodeSelector` admission plugins, or
    the tenant's Kyverno rules (which hold where the plugins are not enabled); what either allows
    is checked."""
    view = View.of(rendered)
    low_trust = {t.tenant for t in view.tenant_namespaces.values() if t.trust == "low"}
    for t in sorted(view.tenant_namespaces.values(), key=lambda t: t.tenant):
        kyverno = view.enforced_pod_rules(t.namespace)
        annotated = _tolerations(t, TOLERATIONS_WHITELIST_ANNOTATION)
        pairs = _kyverno_toleration_pairs(kyverno)
        if not annotated and pairs is None:
            yield _finding(
                "gpu-placement",
                t.manifest,
                f"no toleration whitelist ({TOLERATIONS_WHITELIST_ANNOTATION} or a Kyverno rule): tenant {t.tenant}'s pods may tolerate any node's taints",
                t.tenant,
            )
        allowed = [*(annotated or []), *({"key": k, "operator": "Equal", "value": v} for k, v in pairs or [])]
        for toleration in [*allowed, *(_tolerations(t, DEFAULT_TOLERATIONS_ANNOTATION) or [])]:
            yield from _toleration_findings(view, t, toleration)
        if t.trust == "low":
            selector = t.annotations.get(NODE_SELECTOR_ANNOTATION, "")
            pinned = f"{DEDICATED_LABEL}={t.tenant}" in [s.strip() for s in selector.split(",")] or _kyverno_pinned(kyverno, t.tenant)
            if not pinned:
                yield _finding(
                    "gpu-placement",
                    t.manifest,
                    f"untrusted tenant {t.tenant}'s pods are not pinned to its dedicated nodes ({NODE_SELECTOR_ANNOTATION} or a Kyverno rule)",
                    t.tenant,
                )
            foreign = [tol for tol in allowed if tol.get("key") == TRUST_DOMAIN_LABEL]
            if foreign:
                yield _finding("gpu-placement", t.manifest, f"untrusted tenant {t.tenant} may tolerate shared-GPU nodes ({TRUST_DOMAIN_LABEL})", t.tenant)
    for node in view.of_kind("Node"):
        labels = metadata_map(node.obj, "labels")
        taints = {(x.get("key"), x.get("value"), x.get("effect")) for x in (node.obj.get("spec") or {}).get("taints") or []}
        dedicated = labels.get(DEDICATED_LABEL)
        domain = labels.get(TRUST_DOMAIN_LABEL)
        if dedicated and (DEDICATED_LABEL, dedicated, "NoSchedule") not in taints:
            yield _finding("gpu-placement", node, f"node dedicated to tenant {dedicated} is not tainted for it: other tenants' pods can land there", dedicated)
        if dedicated and domain and domain != dedicated:
            yield _finding("gpu-placement", node, f"node dedicated to tenant {dedicated} also serves trust domain {domain}", dedicated, *view.tenants_of_domain(domain))
        untrusted = sorted(low_trust & ({dedicated} | set(view.tenants_of_domain(domain or ""))))
        if untrusted and _node_is_shared(labels):
            yield _finding("gpu-placement", node, f"untrusted tenant {', '.join(untrusted)} is placed on a shared-GPU node (MIG, HAMi or time-slicing)", *untrusted)


def _toleration_findings(view: View, t: TenantNamespace, toleration: Mapping[str, Any]) -> Iterator[Finding]:
    key, value = toleration.get("key"), toleration.get("value")
    if not key and toleration.get("operator") == "Exists":
        yield _finding("gpu-placement", t.manifest, f"tenant {t.tenant}'s pods may tolerate every taint", t.tenant)
    elif key == TRUST_DOMAIN_LABEL and (toleration.get("operator") == "Exists" or value != t.trust_domain):
        others = [o for o in view.tenants_of_domain(value or "") if o != t.tenant] if value else []
        target = f"trust domain {value}" if value else "every trust domain"
        yield _finding("gpu-placement", t.manifest, f"tenant {t.tenant} (domain {t.trust_domain}) may tolerate the shared-GPU nodes of {target}", t.tenant, *others)
    elif key == DEDICATED_LABEL and (toleration.get("operator") == "Exists" or value != t.tenant):
        target = f"tenant {value}" if value else "every tenant"
        yield _finding("gpu-placement", t.manifest, f"tenant {t.tenant} may tolerate the nodes dedicated to {target}", t.tenant, value if value else None)


# --------------------------------------------------------------------------- D34: vCluster hardening


def _vcluster_releases(view: View) -> list[tuple[Manifest, TenantNamespace | None]]:
    name = CHARTS["vcluster"].name
    return [
        (m, view.tenant_at(m.namespace))
        for m in view.of_kind("HelmRelease")
        if (((m.obj.get("spec") or {}).get("chart") or {}).get("spec") or {}).get("chart") == name
    ]


def _embedded_manifests(release: Manifest) -> list[Mapping[str, Any]]:
    values = (release.obj.get("spec") or {}).get("values") or {}
    text = (((values.get("experimental") or {}).get("deploy") or {}).get("vcluster") or {}).get("manifests") or ""
    try:
        return [d for d in yaml.load_all(text, Loader=LOADER) if isinstance(d, Mapping)]
    except yaml.YAMLError:
        return []


def _get(values: Mapping[str, Any], path: str, default: Any = None) -> Any:
    node: Any = values
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


VCLUSTER_OFF = (
    ("sync.toHost.namespaces.enabled", "syncs namespaces to the host"),
    ("sync.toHost.persistentVolumes.enabled", "syncs persistent volumes to the host"),
    ("sync.toHost.storageClasses.enabled", "syncs storage classes to the host"),
    ("sync.toHost.priorityClasses.enabled", "syncs priority classes to the host"),
    ("sync.toHost.networkPolicies.enabled", "syncs network policies (extra allow rules) to the host"),
    ("sync.fromHost.nodes.syncBackChanges", "lets the vCluster change host nodes' labels and taints"),
    ("integrations.externalSecrets.sync.fromHost.clusterStores.enabled", "imports the host's ClusterSecretStores"),
)
"""(values path, what it does when true): chart defaults are false, so absent is fine."""


@tenant_local
def vcluster_hardening(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """D34 and part 1 of the issue: each tenant vCluster syncs nothing cluster-scoped to the host,
    has no chart quota missing a GPU resource, the chart's network policy off,
    Pod Security set to the namespace's level, OIDC with the prefix and an audience of its own for
    its API server, and keeps its data volume on deletion."""
    view = View.of(rendered)
    gpu_keys = gpu_quota_keys(view)
    audiences: dict[str, list[str]] = {}
    for release, home in _vcluster_releases(view):
        for arg in _get((release.obj.get("spec") or {}).get("values") or {}, "controlPlane.distro.k8s.apiServer.extraArgs", []) or []:
            # Only tenants' clients: a release outside every tenant namespace is reported as such.
            if str(arg).startswith("--oidc-client-id=") and home:
                audiences.setdefault(str(arg), []).append(home.tenant)
    for release, home in _vcluster_releases(view):
        tenant = home.tenant if home else None
        values = (release.obj.get("spec") or {}).get("values") or {}
        problems = [what for path, what in VCLUSTER_OFF if _get(values, path) is True]
        # Off, the namespace's own ResourceQuota (check `quota`) is the vCluster's; on (or `auto`),
        # the chart's is a second one that must cap every GPU resource too.
        missing = sorted(gpu_keys - set(_vcluster_quota(release)))
        if _get(values, "policies.resourceQuota.enabled", "auto") is not False and missing:
            problems.append(f"its chart quota does not cap {', '.join(missing)}")
        if _get(values, "policies.networkPolicy.enabled") is True:
            # The chart's rules admit every namespace's `app: loft` pods and every pod on the API
            # server port; values can add rules, never remove those. The tenant's Cilium policy
            # isolates the namespace instead (`network_default_deny`, `network_allow_rules`).
            problems.append("its chart network policy is on: it admits pods of every namespace (`app: loft`) and every pod on 8443")
        level = home.labels.get("pod-security.kubernetes.io/enforce") if home else "restricted"
        if _get(values, "policies.podSecurityStandard") != level:
            problems.append(f"its Pod Security standard is {_get(values, 'policies.podSecurityStandard')!r}, not the namespace's {level!r}")
        api_args = _get(values, "controlPlane.distro.k8s.apiServer.extraArgs", []) or []
        for flag in ("--oidc-issuer-url=", "--oidc-client-id=", f"--oidc-username-prefix={OIDC_PREFIX}", f"--oidc-groups-prefix={OIDC_PREFIX}"):
            if not any(str(a).startswith(flag) for a in api_args):
                problems.append(f"its API server lacks {flag}")
        for arg in api_args:
            sharing = sorted(t for t in audiences.get(str(arg), []) if t != tenant)
            if sharing:
                message = f"its API server accepts the same OIDC client as tenant {', '.join(sharing)}'s ({arg}): a token for one works on the other"
                yield _finding("vcluster-hardening", release, message, tenant, *sharing)
        if _get(values, "controlPlane.statefulSet.persistence.volumeClaim.retentionPolicy") == "Delete":
            problems.append("its data volume is deleted with it")
        if home is None:
            problems.append(f"it is installed in {release.namespace}, which is no tenant's namespace")
        for problem in problems:
            yield _finding("vcluster-hardening", release, problem, tenant)


# --------------------------------------------------------------------------- H. deletion safety


@tenant_local
def tenant_protection(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """H52, H56: a tenant's namespace (its volumes go with it) and its vCluster (its state) are
    protected and retained on delete, and are the tenant's own Pulumi resources."""
    view = View.of(rendered)
    by_tenant: dict[str, list[Mapping[str, Any]]] = {}
    for entry in rendered.inventory:
        if entry.get("tenant"):
            by_tenant.setdefault(entry["tenant"], []).append(entry)
    stateful = {"kubernetes:core/v1:Namespace": "namespace", "kubernetes:helm.sh/v3:Release": "release (vCluster, Slurm)"}
    for t in view.tenant_namespaces.values():
        entries = [e for e in by_tenant.get(t.tenant, []) if e.get("type") in stateful]
        if not any(e["type"] == "kubernetes:core/v1:Namespace" for e in entries):
            yield _finding("tenant-protection", t.manifest, f"the inventory has no namespace resource of tenant {t.tenant}: its protection cannot be proven", t.tenant)
        for e in entries:
            if not (e.get("protect") and e.get("retainOnDelete")):
                yield _finding("tenant-protection", t.manifest, f"tenant {t.tenant}'s {stateful[e['type']]} ({e['name']}) is not protected and retained on delete", t.tenant)


Check = Callable[[Rendered, Oracles], Iterable[Finding]]


def guarded(check: Check) -> Check:
    """A malformed object (which the schema check reports) ends one analysis with a finding, not
    `factory check` with a traceback."""
    name = check.__name__.replace("_", "-")

    @functools.wraps(check)
    def run(rendered: Rendered, oracles: Oracles) -> Iterator[Finding]:
        try:
            yield from check(rendered, oracles)
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            yield Finding(name, "-", f"analysis stopped at a malformed object ({type(error).__name__}: {error}); fix the schema findings first")

    return run


CHECKS: list[Check] = [
    guarded(check)
    for check in (
        tenant_labels,
        rbac_subjects,
        rbac_rules,
        rbac_access,
        service_account_token,
        pod_security,
        tenant_pods,
        privileged_workloads,
        network_default_deny,
        network_allow_rules,
        quota,
        gpu_placement,
        vcluster_hardening,
        tenant_protection,
    )
]
