"""`factory check`'s isolation analysis: clean on dev and on 30 tenants of mixed trust; each check
fails on a deliberately broken variant, naming the check, the object and the tenants."""

from __future__ import annotations

import copy
import json

import pytest

from ai_factory.components.tenant_stack import (
    DEFAULT_TOLERATIONS_ANNOTATION,
    NODE_SELECTOR_ANNOTATION,
    OWNERS_ANNOTATION,
    POD_SECURITY_EXCEPTION_ANNOTATION,
    TOLERATIONS_WHITELIST_ANNOTATION,
)
from ai_factory.factory.checking import isolation
from ai_factory.factory.checking.check import CHECKS, run_checks
from ai_factory.factory.rendering.bundle import Manifest, Rendered, load_rendered
from tests.conftest import render
from tests.tenancy_env import many_tenants


@pytest.fixture(scope="module")
def many(dev_raw) -> Rendered:
    return render(many_tenants(copy.deepcopy(dev_raw[0])), dev_raw[1])


def variant(rendered: Rendered, change) -> Rendered:
    clone = copy.deepcopy(Rendered(rendered.config, rendered.kubernetes_version, rendered.manifests, rendered.inventory))
    change(clone)
    return clone


def find(rendered: Rendered, kind: str, name: str, namespace: str | None = None) -> dict:
    (obj,) = [m.obj for m in rendered.manifests if m.kind == kind and m.name == name and namespace in (None, m.namespace)]
    return obj


def add(rendered: Rendered, obj: dict, tenant: str | None = None) -> None:
    rendered.manifests.append(Manifest(obj, f"tenant-{tenant}" if tenant else "platform", tenant, "test"))


def found(rendered: Rendered, oracles, check: str) -> list[str]:
    return sorted(str(f) for c in isolation.CHECKS for f in c(rendered, oracles) if f.check == check)


def meta(name: str, namespace: str | None = None, tenant: str | None = None) -> dict:
    result: dict = {"name": name, "labels": {"ai-factory.io/tenant": tenant} if tenant else {}}
    if namespace:
        result["namespace"] = namespace
    return result


def binding(kind: str, name: str, namespace: str | None, role: tuple[str, str], *subjects: tuple[str, str], tenant=None) -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta(name, namespace, tenant),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role[0], "name": role[1]},
        "subjects": [{"kind": k, "name": n, "apiGroup": "rbac.authorization.k8s.io"} for k, n in subjects],
    }


def policy(rendered: Rendered, tenant: str) -> dict:
    return find(rendered, "CiliumClusterwideNetworkPolicy", f"tenant-{tenant}-isolation")["spec"]


# --------------------------------------------------------------------------- small worlds, table-driven
# Each row is a handful of objects and the exact findings of one check: rows that flag and rows
# that accept, so that a check that flags too much or too little fails a row.

PSS = {f"pod-security.kubernetes.io/{k}": v for k, v in (("enforce", "restricted"), ("enforce-version", "v1.33"), ("audit", "restricted"), ("warn", "restricted"))}


def tenant_ns(tenant: str, trust: str = "high", domain: str | None = None, labels: dict | None = None, annotations: dict | None = None, owners: tuple = ()) -> dict:
    """A tenant's Namespace as TenantStack labels and annotates it (Pod Security restricted, owners)."""
    owned = json.dumps([{"kind": "Group", "name": f"oidc:{o}"} for o in owners or (f"{tenant}-admins",)])
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": f"tenant-{tenant}",
            "labels": {"ai-factory.io/tenant": tenant, "ai-factory.io/trust": trust, "ai-factory.io/trust-domain": domain or tenant, **PSS, **(labels or {})},
            "annotations": {OWNERS_ANNOTATION: owned, **(annotations or {})},
        },
    }


def platform_ns(name: str, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}


def world(*objs: dict, inventory: list | None = None) -> Rendered:
    manifests = [Manifest(o, "test", (o.get("metadata") or {}).get("labels", {}).get("ai-factory.io/tenant"), "test") for o in objs]
    return Rendered(None, "1.33", manifests, list(inventory or []))


def findings(check, *objs: dict, inventory: list | None = None) -> list[str]:
    """One check's findings, unguarded: a crash fails the row."""
    return sorted(str(f) for f in check(world(*objs, inventory=inventory), None))


def obj(kind: str, name: str, namespace: str | None = None, api: str = "v1", **fields) -> dict:
    tenant = namespace.removeprefix("tenant-") if namespace and namespace.startswith("tenant-") else None
    return {"apiVersion": api, "kind": kind, "metadata": meta(name, namespace, tenant), **fields}


def role(rules: list, name: str = "r", namespace: str = "tenant-a") -> dict:
    return obj("Role", name, namespace, "rbac.authorization.k8s.io/v1", rules=rules)


def rule(groups: list, resources: list, verbs: list) -> dict:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


def a_binds(role_ref: tuple[str, str] = ("Role", "r"), namespace: str | None = "tenant-a", subject: str = "oidc:a-admins") -> dict:
    kind = "RoleBinding" if namespace else "ClusterRoleBinding"
    return binding(kind, "rb", namespace, role_ref, ("Group", subject), tenant=namespace.removeprefix("tenant-") if namespace else None)


A_CAN = "rbac-access: RoleBinding/tenant-a/rb: tenant a (Group oidc:a-admins) can"


@pytest.mark.parametrize(
    "rules, expected",
    [
        pytest.param([rule([""], ["resourcequotas"], ["deletecollection"])], [f"{A_CAN} deletecollection resourcequotas (its quota) in its own namespace tenant-a [tenants: a]"], id="deletecollection-is-a-write"),
        pytest.param([rule([""], ["resourcequotas/status"], ["update"])], [f"{A_CAN} update resourcequotas (its quota) in its own namespace tenant-a [tenants: a]"], id="subresource-update"),
        pytest.param([rule([""], ["limitranges"], ["patch"])], [f"{A_CAN} patch limitranges (its limits) in its own namespace tenant-a [tenants: a]"], id="patch-limits"),
        pytest.param([rule(["rbac.authorization.k8s.io"], ["roles"], ["create"])], [f"{A_CAN} create roles (RBAC) in its own namespace tenant-a [tenants: a]"], id="create-roles"),
        pytest.param([rule(["rbac.authorization.k8s.io"], ["rolebindings"], ["delete"])], [f"{A_CAN} delete rolebindings (RBAC) in its own namespace tenant-a [tenants: a]"], id="delete-rolebindings"),
        pytest.param([rule(["networking.k8s.io"], ["networkpolicies"], ["create", "get"])], [f"{A_CAN} create networkpolicies (network policy) in its own namespace tenant-a [tenants: a]"], id="create-networkpolicies"),
        pytest.param([rule(["cilium.io"], ["ciliumnetworkpolicies"], ["*"])], [f"{A_CAN} * ciliumnetworkpolicies (network policy) in its own namespace tenant-a [tenants: a]"], id="wildcard-verb-cilium"),
        pytest.param([rule(["kueue.x-k8s.io"], ["localqueues"], ["update"])], [f"{A_CAN} update localqueues (its queue binding) in its own namespace tenant-a [tenants: a]"], id="update-localqueue"),
        pytest.param([rule(["*"], ["limitranges"], ["patch"])], [f"{A_CAN} patch limitranges (its limits) in its own namespace tenant-a [tenants: a]"], id="any-api-group"),
        pytest.param(
            [rule([""], ["*"], ["create"])],
            [f"{A_CAN} create limitranges (its limits) in its own namespace tenant-a [tenants: a]", f"{A_CAN} create resourcequotas (its quota) in its own namespace tenant-a [tenants: a]"],
            id="any-core-resource",
        ),
        pytest.param([rule(["example.com"], ["roles", "networkpolicies", "resourcequotas"], ["create"])], [], id="same-names-in-another-group"),
        pytest.param([rule([""], ["configmaps", "resourcequotas"], ["create"])], [f"{A_CAN} create resourcequotas (its quota) in its own namespace tenant-a [tenants: a]"], id="one-of-several-resources"),
        pytest.param([rule(["", "rbac.authorization.k8s.io", "kueue.x-k8s.io"], ["resourcequotas", "roles", "localqueues"], ["get", "list", "watch"])], [], id="reads-only"),
        pytest.param([rule([""], ["resourcequotasx", "configmaps"], ["create"])], [], id="other-resources"),
        pytest.param([{"apiGroups": [""], "resources": ["resourcequotas"]}], [], id="rule-without-verbs"),
    ],
)
def test_rbac_access_flags_writes_to_the_isolation_objects_of_its_own_namespace(rules, expected):
    assert findings(isolation.rbac_access, tenant_ns("a"), role(rules), a_binds()) == expected


def test_rbac_access_flags_grants_outside_the_tenants_namespace_and_unknown_roles():
    reader = rule([""], ["pods"], ["get"])
    cluster_reader = obj("ClusterRole", "reader", api="rbac.authorization.k8s.io/v1", rules=[reader])
    platform_role = role([reader], "r", "kube-system")
    b_role = role([reader], "r", "tenant-b")
    objs = (tenant_ns("a"), tenant_ns("b"), platform_ns("kube-system"), cluster_reader, platform_role, b_role)
    assert findings(isolation.rbac_access, *objs, a_binds(("ClusterRole", "reader"), None)) == [
        "rbac-access: ClusterRoleBinding/rb: tenant a (Group oidc:a-admins) can get on core/pods in every namespace and on cluster-scoped "
        "resources (its Namespace included) [tenants: a]"
    ]
    assert findings(isolation.rbac_access, *objs, a_binds(("Role", "r"), "kube-system")) == [
        "rbac-access: RoleBinding/kube-system/rb: tenant a (Group oidc:a-admins) can get on core/pods in a platform namespace kube-system [tenants: a]"
    ]
    assert findings(isolation.rbac_access, *objs, a_binds(("Role", "r"), "tenant-b")) == [
        "rbac-access: RoleBinding/tenant-b/rb: tenant a (Group oidc:a-admins) can get on core/pods in tenant b's namespace tenant-b [tenants: a, b]"
    ]
    assert findings(isolation.rbac_access, *objs, a_binds(("Role", "missing"))) == [
        "rbac-access: RoleBinding/tenant-a/rb: binds tenant a (Group oidc:a-admins) to Role/tenant-a/missing, which is not in the rendered "
        "set: its permissions cannot be evaluated [tenants: a]"
    ]
    assert findings(isolation.rbac_access, *objs, a_binds(("Role", "r"), "tenant-a", subject="oidc:nobody")) == []


def test_rbac_access_judges_every_grant_in_turn():
    writer = role([rule([""], ["resourcequotas"], ["patch"])], "writer")
    idle = role([{"apiGroups": [""], "resources": ["pods"]}], "idle")
    bindings = [binding("RoleBinding", n, "tenant-a", ("Role", r), ("Group", "oidc:a-admins"), tenant="a") for n, r in (("a1", "missing"), ("a2", "idle"), ("a3", "writer"))]
    assert findings(isolation.rbac_access, tenant_ns("a"), writer, idle, *bindings) == [
        "rbac-access: RoleBinding/tenant-a/a1: binds tenant a (Group oidc:a-admins) to Role/tenant-a/missing, which is not in the rendered set: its permissions "
        "cannot be evaluated [tenants: a]",
        "rbac-access: RoleBinding/tenant-a/a3: tenant a (Group oidc:a-admins) can patch resourcequotas (its quota) in its own namespace tenant-a [tenants: a]",
    ]


def test_rbac_access_follows_aggregated_cluster_roles():
    def cluster_role(name, labels, rules, aggregate=None):
        role = obj("ClusterRole", name, api="rbac.authorization.k8s.io/v1", rules=rules)
        role["metadata"]["labels"] = labels
        if aggregate is not None:
            role["aggregationRule"] = {"clusterRoleSelectors": [{"matchLabels": aggregate}]}
        return role

    objs = (
        tenant_ns("a"),
        cluster_role("agg", {}, [], aggregate={"agg": "yes", "tier": "a"}),
        cluster_role("writer", {"agg": "yes", "tier": "a"}, [rule([""], ["resourcequotas"], ["patch"])]),
        cluster_role("half", {"agg": "yes"}, [rule([""], ["limitranges"], ["patch"])]),
        cluster_role("empty-selector", {}, [], aggregate={}),
    )
    assert findings(isolation.rbac_access, *objs, a_binds(("ClusterRole", "agg"))) == [f"{A_CAN} patch resourcequotas (its quota) in its own namespace tenant-a [tenants: a]"]
    assert findings(isolation.rbac_access, *objs, a_binds(("ClusterRole", "empty-selector"))) == []


@pytest.mark.parametrize(
    "rules, expected",
    [
        pytest.param([rule(["*"], ["pods"], ["get"])], ["wildcard apiGroups: get on */pods"], id="any-group"),
        pytest.param([rule([""], ["*"], ["get"])], ["wildcard resources: get on core/*"], id="any-resource"),
        pytest.param([rule([""], ["pods"], ["*"])], ["wildcard verbs: * on core/pods"], id="any-verb"),
        pytest.param([rule(["rbac.authorization.k8s.io"], ["roles"], ["escalate"])], ["verb escalate: escalate on rbac.authorization.k8s.io/roles"], id="escalate"),
        pytest.param([rule(["rbac.authorization.k8s.io"], ["clusterroles"], ["bind"])], ["verb bind: bind on rbac.authorization.k8s.io/clusterroles"], id="bind"),
        pytest.param([rule([""], ["users", "groups"], ["impersonate"])], ["verb impersonate: impersonate on core/users,groups"], id="impersonate"),
        pytest.param([rule([""], ["pods", "services"], ["get", "create"]), rule(["apps"], ["deployments"], ["update"])], [], id="named-everything"),
    ],
)
def test_rbac_rules_flag_wildcards_and_escalation(rules, expected):
    prefix = "rbac-rules: RoleBinding/tenant-a/rb: grants tenant a (Group oidc:a-admins) Role/tenant-a/r with "
    assert findings(isolation.rbac_rules, tenant_ns("a"), role(rules), a_binds()) == [f"{prefix}{e} [tenants: a]" for e in expected]


@pytest.mark.parametrize(
    "labels, annotations, trust, expected",
    [
        pytest.param({}, {}, "high", [], id="restricted-pinned-audited-warned"),
        pytest.param({"pod-security.kubernetes.io/warn": None}, {}, "high", ["no pod-security.kubernetes.io/{warn} label"], id="no-warn"),
        pytest.param({"pod-security.kubernetes.io/audit": None}, {}, "high", ["no pod-security.kubernetes.io/{audit} label"], id="no-audit"),
        pytest.param({"pod-security.kubernetes.io/enforce-version": None}, {}, "high", ["no pod-security.kubernetes.io/{enforce-version} label"], id="no-version"),
        pytest.param(
            {f"pod-security.kubernetes.io/{k}": None for k in ("enforce", "enforce-version", "audit", "warn")}, {}, "high",
            ["enforces nothing instead of restricted", "no pod-security.kubernetes.io/{enforce-version,audit,warn} label"], id="no-labels",
        ),
        pytest.param({"pod-security.kubernetes.io/enforce": "privileged"}, {}, "high", ["enforces privileged instead of restricted"], id="privileged"),
        pytest.param({"pod-security.kubernetes.io/enforce": "baseline"}, {POD_SECURITY_EXCEPTION_ANNOTATION: "CUDA IPC, reviewed"}, "high", [], id="baseline-by-exception"),
        pytest.param(
            {"pod-security.kubernetes.io/enforce": "baseline"}, {}, "high",
            ["enforces baseline without a reviewed exception (ai-factory.io/pod-security-exception)"], id="baseline-without-exception",
        ),
        pytest.param(
            {"pod-security.kubernetes.io/enforce": "baseline"}, {POD_SECURITY_EXCEPTION_ANNOTATION: "reviewed"}, "low",
            ["a low-trust tenant enforces baseline"], id="baseline-for-low-trust",
        ),
    ],
)
def test_pod_security_flags_tenant_namespaces_below_restricted_or_unpinned(labels, annotations, trust, expected):
    namespace = tenant_ns("a", trust=trust, annotations=annotations)
    for key, value in labels.items():
        namespace["metadata"]["labels"][key] = value
    namespace["metadata"]["labels"] = {k: v for k, v in namespace["metadata"]["labels"].items() if v is not None}
    assert findings(isolation.pod_security, namespace, platform_ns("kube-system")) == [f"pod-security: Namespace/tenant-a: {e} [tenants: a]" for e in expected]


def pod(spec: dict, namespace: str = "tenant-a", kind: str = "Pod") -> dict:
    return obj(kind, "p", namespace, spec=spec)


def container(**fields) -> dict:
    return {"name": "main", "image": "example/app:1", **fields}


@pytest.mark.parametrize(
    "spec, expected",
    [
        pytest.param({"containers": [container()]}, [], id="plain"),
        pytest.param({"hostNetwork": True, "containers": [container()]}, ["sets hostNetwork"], id="host-network"),
        pytest.param({"hostPID": True, "containers": [container()]}, ["sets hostPID"], id="host-pid"),
        pytest.param({"hostIPC": True, "containers": [container()]}, ["sets hostIPC"], id="host-ipc"),
        pytest.param({"hostIPC": False, "hostPID": False, "containers": [container()]}, [], id="host-namespaces-off"),
        pytest.param({"containers": [container(securityContext={"privileged": True})]}, ["container main is privileged"], id="privileged"),
        pytest.param({"initContainers": [container(name="init", securityContext={"privileged": True})], "containers": [container()]}, ["container init is privileged"], id="privileged-init"),
        pytest.param({"containers": [container()], "ephemeralContainers": [container(name="debug", env=[{"name": "LD_PRELOAD", "value": "x"}])]},
                     ["container debug sets LD_PRELOAD, which bypasses GPU allocation or HAMi limits"], id="ephemeral-escape-variable"),
        pytest.param({"containers": [container(env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}])]}, [], id="harmless-variable"),
        pytest.param({"containers": [container(envFrom=[{"configMapRef": {"name": "env"}, "prefix": "NVIDIA_"}])]},
                     ["container main imports variables with envFrom, which admission refuses (a ConfigMap or Secret could set GPU escape variables)", "container main sets NVIDIA_VISIBLE_DEVICES, which bypasses GPU allocation or HAMi limits"], id="escape-variable-through-a-prefix"),
        pytest.param({"containers": [container(envFrom=[{"configMapRef": {"name": "other-env"}}])]}, ["container main imports variables with envFrom, which admission refuses (a ConfigMap or Secret could set GPU escape variables)"], id="config-map-of-another-namespace"),
        pytest.param({"containers": [container(volumeMounts=[{"name": "v", "mountPath": "/run/nvidia/driver"}])]}, ["container main mounts /run/nvidia/driver"], id="driver-mount"),
        pytest.param({"containers": [container(volumeMounts=[{"name": "v", "mountPath": "/data"}])]}, [], id="data-mount"),
        pytest.param({"containers": [container()], "volumes": [{"name": "v", "hostPath": {"path": "/var/log"}}, {"name": "w", "emptyDir": {}}]},
                     ["volume v is a hostPath (/var/log)"], id="host-path"),
    ],
)
def test_tenant_pods_flag_host_access_and_gpu_escapes(spec, expected):
    env = obj("ConfigMap", "env", "tenant-a", data={"VISIBLE_DEVICES": "all"})
    other = obj("ConfigMap", "other-env", "kube-system", data={"LD_PRELOAD": "/x.so"})
    platform_pod = pod({"hostNetwork": True, "containers": [container()]}, "kube-system")
    assert findings(isolation.tenant_pods, tenant_ns("a"), env, other, platform_pod, pod(spec, kind="Deployment")) == [
        f"tenant-pods: Deployment/tenant-a/p: {e} [tenants: a]" for e in expected
    ]


PRIVILEGED = {"containers": [container(securityContext={"privileged": True})]}


@pytest.mark.parametrize(
    "workload, expected",
    [
        pytest.param(pod(PRIVILEGED, "monitoring", kind="DaemonSet"), ["DaemonSet/monitoring/p: container main is privileged"], id="flags a privileged pod outside the allow-list"),
        pytest.param(pod({"hostPID": True, "containers": [container()]}, None, kind="Job"), ["Job/p: sets hostPID"], id="flags host access of an object without namespace"),
        pytest.param(pod(PRIVILEGED, "kube-system", kind="DaemonSet"), [], id="accepts a node agent in kube-system"),
        pytest.param(pod(PRIVILEGED, "gpu-operator", kind="DaemonSet"), [], id="accepts a namespace the platform made privileged"),
        pytest.param(pod(PRIVILEGED, "tenant-a", kind="Deployment"), [], id="accepts a tenant's pod (tenant_pods judges it)"),
        pytest.param(
            obj("CustomResourceDefinition", "p", api="apiextensions.k8s.io/v1", spec={"versions": [{"schema": {"openAPIV3Schema": PRIVILEGED}}]}),
            [],
            id="accepts a CRD whose schema describes privileged containers",
        ),
    ],
)
def test_privileged_workloads_run_only_in_the_platforms_privileged_namespaces(workload, expected):
    privileged = obj("Namespace", "gpu-operator", metadata={"name": "gpu-operator", "labels": {"pod-security.kubernetes.io/enforce": "privileged"}})
    agent = obj("DaemonSet", "cilium", "kube-system", "apps/v1", spec={"template": {"spec": PRIVILEGED}})  # allowed, and read before the row's
    allowed = "gpu-operator, kube-system"
    assert findings(isolation.privileged_workloads, tenant_ns("a"), privileged, agent, workload) == [
        f"privileged-workloads: {e} outside the platform's privileged namespaces ({allowed})" for e in expected
    ]


def cluster_policy(name: str, *specs: dict, single: bool = True) -> dict:
    body = {"spec": specs[0]} if single else {"specs": list(specs)}
    return {"apiVersion": "cilium.io/v2", "kind": "CiliumClusterwideNetworkPolicy", "metadata": {"name": name}, **body}


NS_KEY = "k8s:io.kubernetes.pod.namespace"
DNS_EGRESS = {"toEndpoints": [{"matchLabels": {NS_KEY: "kube-system", "k8s:k8s-app": "kube-dns"}}], "toPorts": [{"ports": [{"port": "53", "protocol": "UDP"}]}]}
METADATA_DENY = {"toCIDR": ["169.254.169.254/32", "fd00:ec2::254/128"]}


def isolation_spec(selector: dict | None = None, **changes) -> dict:
    spec = {
        "endpointSelector": selector if selector is not None else {"matchLabels": {NS_KEY: "tenant-a"}},
        "enableDefaultDeny": {"ingress": True, "egress": True},
        "ingress": [{"fromEndpoints": [{"matchLabels": {NS_KEY: "tenant-a"}}]}],
        "egress": [DNS_EGRESS],
        "egressDeny": [METADATA_DENY],
    }
    spec.update(changes)
    return {k: v for k, v in spec.items() if v is not None}


DENY_GAPS = {
    "ingress": "no cluster-wide Cilium policy denies ingress by default for tenant-a (namespaced policies can be deleted by the tenant)",
    "egress": "no cluster-wide Cilium policy denies egress by default for tenant-a (namespaced policies can be deleted by the tenant)",
    "dns": "no cluster-wide Cilium policy lets tenant-a reach kube-dns on port 53",
    "v4": "egress of tenant-a to the cloud metadata address 169.254.169.254 is not denied",
    "v6": "egress of tenant-a to the cloud metadata address fd00:ec2::254 is not denied",
}


@pytest.mark.parametrize(
    "policies, gaps",
    [
        pytest.param([isolation_spec()], [], id="complete"),
        pytest.param([isolation_spec({"matchExpressions": [{"key": NS_KEY, "operator": "In", "values": ["tenant-a", "tenant-b"]}]})], [], id="namespace-in-expression"),
        pytest.param([isolation_spec({"matchLabels": {"k8s:io.cilium.k8s.namespace.labels.ai-factory.io/tenant": "a"}})], [], id="namespace-label-selector"),
        pytest.param([isolation_spec({})], [], id="every-endpoint"),
        pytest.param([isolation_spec(), isolation_spec({"matchLabels": {NS_KEY: "tenant-b"}}, enableDefaultDeny={"ingress": False, "egress": False})], [], id="other-policy-for-another-namespace"),
        pytest.param([isolation_spec({"matchLabels": {NS_KEY: "tenant-b"}})], list(DENY_GAPS), id="another-namespace-only"),
        pytest.param([{**isolation_spec({}), "nodeSelector": {}}], list(DENY_GAPS), id="host-policy-is-no-tenant-default-deny"),
        pytest.param([{**isolation_spec({}), "nodeSelector": {}}, isolation_spec()], [], id="host-policy-before-the-default-deny"),
        pytest.param([isolation_spec({"matchLabels": {NS_KEY: "tenant-a", "app": "web"}}), isolation_spec()], [], id="pod-policy-before-the-default-deny"),
        pytest.param([isolation_spec({"matchLabels": {NS_KEY: "tenant-a", "app": "web"}})], list(DENY_GAPS), id="selects-some-pods-only"),
        pytest.param([isolation_spec({"matchExpressions": [{"key": "app", "operator": "Exists"}]})], list(DENY_GAPS), id="expression-selects-some-pods-only"),
        pytest.param([isolation_spec(enableDefaultDeny={"ingress": False, "egress": True})], ["ingress"], id="ingress-default-deny-off"),
        pytest.param([isolation_spec(enableDefaultDeny=None, ingress=None)], ["ingress"], id="no-ingress-rule-no-default-deny"),
        pytest.param([isolation_spec(enableDefaultDeny=None)], [], id="rules-imply-default-deny"),
        pytest.param([isolation_spec(egress=[{**DNS_EGRESS, "toPorts": [{"ports": [{"port": "5353"}]}]}])], ["dns"], id="dns-on-the-wrong-port"),
        pytest.param([isolation_spec(egress=[{**DNS_EGRESS, "toEndpoints": [{"matchLabels": {NS_KEY: "kube-system", "k8s:k8s-app": "coredns"}}]}])], ["dns"], id="dns-to-other-pods"),
        pytest.param([isolation_spec(egress=[{**DNS_EGRESS, "toEndpoints": [{"matchLabels": {"k8s-app": "kube-dns", "io.kubernetes.pod.namespace": "kube-system"}}]}])], [], id="dns-unprefixed-labels"),
        pytest.param([isolation_spec(egressDeny=[{"toCIDR": ["10.0.0.0/8"]}])], ["v4", "v6"], id="harmless-cidr-denied"),
        pytest.param([isolation_spec(egressDeny=[{"toCIDRSet": [{"cidr": "169.254.0.0/16"}, {"cidr": "::/0"}]}])], [], id="covering-cidr-sets"),
        pytest.param([isolation_spec(egressDeny=[{"toCIDRSet": [{"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}]}, {"toCIDR": ["fd00:ec2::254/128"]}])], ["v4"], id="metadata-excepted"),
        pytest.param([isolation_spec(egressDeny=[{"toCIDR": ["not-a-cidr"]}, {"toCIDR": ["fd00:ec2::254/128"]}])], ["v4"], id="unreadable-cidr"),
        pytest.param([isolation_spec(egressDeny=None), {"endpointSelector": {}, "egressDeny": [METADATA_DENY]}], [], id="deny-in-a-second-policy"),
    ],
)
def test_network_default_deny_needs_one_cluster_policy_over_the_whole_namespace(policies, gaps):
    objs = [tenant_ns("a"), tenant_ns("b"), platform_ns("kube-system")]
    objs += [cluster_policy(f"p{i}", spec) for i, spec in enumerate(policies)]
    gaps_b = findings(isolation.network_default_deny, *objs)
    assert [f for f in gaps_b if "tenant-a" in f.split(": ")[1]] == sorted(f"network-default-deny: Namespace/tenant-a: {DENY_GAPS[g]} [tenants: a]" for g in gaps)


def test_network_default_deny_reads_every_spec_of_a_policy():
    specs = cluster_policy("p", isolation_spec(egressDeny=None), {"endpointSelector": {}, "egressDeny": [METADATA_DENY]}, single=False)
    assert findings(isolation.network_default_deny, tenant_ns("a"), platform_ns("kube-system"), specs) == []


ALLOWS = "network-allow-rules: CiliumClusterwideNetworkPolicy/p: allows"


@pytest.mark.parametrize(
    "direction, peer, expected",
    [
        pytest.param("egress", {"toEntities": ["world"]}, ["egress of tenant a to entity 'world'"], id="world"),
        pytest.param("egress", {"toEntities": ["host", "kube-apiserver"]}, ["egress of tenant a to entity 'host'"], id="host-not-apiserver"),
        pytest.param("ingress", {"fromEntities": ["remote-node"]}, ["ingress of tenant a from entity 'remote-node'"], id="remote-node"),
        pytest.param("egress", {"toEntities": ["cluster"]}, ["egress of tenant a to entity 'cluster'"], id="cluster"),
        pytest.param("ingress", {"fromEntities": ["unmanaged"]}, ["ingress of tenant a from entity 'unmanaged'"], id="unmanaged"),
        pytest.param("egress", {"toEntities": ["all"]}, ["egress of tenant a to entity 'all'"], id="all"),
        pytest.param("egress", {"toEntities": ["kube-apiserver"]}, [], id="apiserver"),
        pytest.param("egress", {"toCIDR": ["10.0.0.0/8"]}, [], id="harmless-cidr"),
        pytest.param("egress", {"toCIDR": ["169.254.0.0/16"]}, ["egress of tenant a to 169.254.0.0/16, which covers the cloud metadata address"], id="metadata-cidr"),
        pytest.param("egress", {"toCIDRSet": [{"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}]}, [], id="metadata-excepted"),
        pytest.param("ingress", {"fromCIDRSet": [{"cidr": "::/0"}]}, ["ingress of tenant a from ::/0, which covers the cloud metadata address"], id="ipv6-everything"),
        pytest.param("egress", {"toEndpoints": [{"matchLabels": {NS_KEY: "tenant-a"}}]}, [], id="own-namespace"),
        pytest.param("egress", {"toEndpoints": [{"matchLabels": {NS_KEY: "tenant-b"}}]}, ["egress of tenant a to tenant b's namespace tenant-b"], id="other-tenant"),
        pytest.param("ingress", {"fromEndpoints": [{"matchLabels": {"io.cilium.k8s.namespace.labels.ai-factory.io/tenant": "b"}}]}, ["ingress of tenant a from tenant b's namespace tenant-b"], id="other-tenant-by-label"),
        pytest.param("ingress", {"fromEndpoints": [{"matchLabels": {"app": "scraper"}}]}, ["ingress of tenant a from pods of every namespace (selector without a namespace)"], id="no-namespace"),
        pytest.param("egress", {"toEndpoints": [{"matchLabels": {NS_KEY: "monitoring", "app": "prometheus"}}]}, [], id="named-platform-pods"),
        pytest.param("egress", {"toEndpoints": [{"matchLabels": {NS_KEY: "monitoring"}}]}, ["egress of tenant a to every pod of platform namespace monitoring"], id="whole-platform-namespace"),
        pytest.param("egress", {"toEndpoints": [{"matchExpressions": [{"key": NS_KEY, "operator": "In", "values": ["tenant-a", "tenant-b"]}]}]}, ["egress of tenant a to tenant b's namespace tenant-b"], id="expression-in"),
        pytest.param("egress", {"toEndpoints": [{"matchExpressions": [{"key": NS_KEY, "operator": "NotIn", "values": ["tenant-b"]}]}]}, ["egress of tenant a to pods of every namespace (selector without a namespace)"], id="expression-not-in"),
    ],
)
def test_network_allow_rules_admit_only_the_tenant_and_named_platform_pods(direction, peer, expected):
    spec = {"endpointSelector": {"matchLabels": {NS_KEY: "tenant-a"}}, direction: [peer]}
    host = {"nodeSelector": {}, direction: [peer]}
    objs = (tenant_ns("a"), tenant_ns("b"), platform_ns("monitoring"), cluster_policy("p", spec), cluster_policy("host", host))
    assert findings(isolation.network_allow_rules, *objs) == [f"{ALLOWS} {e} [tenants: {'a, b' if 'tenant b' in e else 'a'}]" for e in expected]


def test_network_allow_rules_read_every_spec_and_selector_of_a_policy():
    host = {"nodeSelector": {}, "egress": [{"toEntities": ["world"]}]}
    spec = {"endpointSelector": {"matchLabels": {NS_KEY: "tenant-a"}},
            "egress": [{"toEndpoints": [{"matchLabels": {"app": "x"}}, {"matchLabels": {NS_KEY: "tenant-b"}}, {"matchLabels": {"any:io.kubernetes.pod.namespace": "tenant-b"}}]}]}
    assert findings(isolation.network_allow_rules, tenant_ns("a"), tenant_ns("b"), cluster_policy("p", host, spec, single=False)) == [
        f"{ALLOWS} egress of tenant a to pods of every namespace (selector without a namespace) [tenants: a]",
        f"{ALLOWS} egress of tenant a to tenant b's namespace tenant-b [tenants: a, b]",
        f"{ALLOWS} egress of tenant a to tenant b's namespace tenant-b [tenants: a, b]",
    ]


def test_network_allow_rules_of_a_namespaced_cilium_policy_apply_to_its_namespace():
    policy = obj("CiliumNetworkPolicy", "p", "tenant-a", "cilium.io/v2", spec={"endpointSelector": {}, "egress": [{"toEndpoints": [{}]}, {"toEntities": ["all"]}]})
    assert findings(isolation.network_allow_rules, tenant_ns("a"), tenant_ns("b"), policy) == [
        "network-allow-rules: CiliumNetworkPolicy/tenant-a/p: allows egress of tenant a to entity 'all' [tenants: a]"
    ]


@pytest.mark.parametrize(
    "direction, peer, expected",
    [
        pytest.param("egress", {"ipBlock": {"cidr": "169.254.0.0/16"}}, ["egress of tenant a to 169.254.0.0/16, which covers the cloud metadata address"], id="metadata-block"),
        pytest.param("egress", {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}}, [], id="metadata-excepted"),
        pytest.param("egress", {"ipBlock": {"cidr": "10.0.0.0/8"}}, [], id="harmless-block"),
        pytest.param("ingress", {"podSelector": {}}, [], id="own-namespace"),
        pytest.param("ingress", {"namespaceSelector": {}}, ["ingress of tenant a from every namespace (empty namespaceSelector)"], id="empty-namespace-selector"),
        pytest.param("egress", {"namespaceSelector": {"matchLabels": {"ai-factory.io/tenant": "b"}}}, ["egress of tenant a to tenant b's namespace tenant-b"], id="other-tenant"),
        pytest.param("egress", {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}, ["egress of tenant a to every pod of platform namespace monitoring"], id="whole-platform-namespace"),
        pytest.param("egress", {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}, "podSelector": {"matchLabels": {"app": "prometheus"}}}, [], id="named-platform-pods"),
        pytest.param("egress", {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}, "podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}, [], id="platform-pods-by-expression"),
        pytest.param("egress", {"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}]}},
                     ["egress of tenant a to every pod of platform namespace monitoring"], id="namespaces-by-expression"),
        pytest.param("egress", {"namespaceSelector": {"matchExpressions": [{"key": "ai-factory.io/tenant", "operator": "DoesNotExist"}]}, "podSelector": {"matchLabels": {"app": "x"}}},
                     [], id="platform-namespaces-by-expression"),
    ],
)
def test_network_allow_rules_of_tenant_network_policies(direction, peer, expected):
    key = "from" if direction == "ingress" else "to"
    netpol = obj("NetworkPolicy", "np", "tenant-a", "networking.k8s.io/v1", spec={"podSelector": {}, direction: [{key: [peer]}]})
    platform = obj("NetworkPolicy", "np", "monitoring", "networking.k8s.io/v1", spec={"podSelector": {}, direction: [{key: [{"namespaceSelector": {}}]}]})
    objs = (tenant_ns("a"), tenant_ns("b"), platform_ns("monitoring"), platform, netpol)
    assert findings(isolation.network_allow_rules, *objs) == [
        f"network-allow-rules: NetworkPolicy/tenant-a/np: allows {e} [tenants: {'a, b' if 'tenant b' in e else 'a'}]" for e in expected
    ]


BASE_HARD = {
    "requests.cpu": "8", "requests.memory": "32Gi", "limits.memory": "32Gi", "requests.storage": "1Ti", "requests.ephemeral-storage": "100Gi",
    "count/pods": "100", "count/persistentvolumeclaims": "10", "count/services": "10", "count/secrets": "50", "count/configmaps": "50",
    "services.loadbalancers": "0", "services.nodeports": "0",
}


def quota_of(namespace: str, hard: dict, **spec) -> dict:
    return obj("ResourceQuota", "q", namespace, spec={"hard": hard, **spec})


def limits(namespace: str) -> dict:
    return obj("LimitRange", "l", namespace, spec={"limits": []})


def without(mapping: dict, *keys: str, **extra) -> dict:
    return {**{k: v for k, v in mapping.items() if k not in keys}, **extra}


@pytest.mark.parametrize(
    "hard_a, hard_b, expected",
    [
        pytest.param(BASE_HARD, BASE_HARD, [], id="complete"),
        pytest.param(without(BASE_HARD, "count/pods", pods="100"), BASE_HARD, [], id="pods-for-count-pods"),
        pytest.param(
            without(BASE_HARD, "count/persistentvolumeclaims", "count/services", "count/secrets", "count/configmaps",
                    persistentvolumeclaims="1", services="1", secrets="1", configmaps="1"), BASE_HARD, [], id="short-object-counts",
        ),
        pytest.param(without(BASE_HARD, "count/pods"), BASE_HARD, ["a: does not cap count/pods"], id="pods-uncapped"),
        pytest.param(
            without(BASE_HARD, *BASE_HARD), BASE_HARD,
            ["a: does not cap " + ", ".join(k for k in BASE_HARD)], id="nothing-capped",
        ),
        pytest.param(without(BASE_HARD, **{"requests.nvidia.com/gpu": "8"}), BASE_HARD, ["b: does not cap requests.nvidia.com/gpu"], id="gpu-key-demanded-from-all"),
        pytest.param(without(BASE_HARD, **{"gpu.deviceclass.resource.k8s.io/devices": "2"}), BASE_HARD, ["b: does not cap gpu.deviceclass.resource.k8s.io/devices"], id="dra-key-demanded-from-all"),
        pytest.param(
            without(BASE_HARD, **{"requests.hugepages-2Mi": "1Gi", "requests.example.kubernetes.io/thing": "1", "requests.x.k8s.io/y": "1", "limits.nvidia.com/gpu": "1"}),
            BASE_HARD, [], id="non-gpu-keys-are-not-demanded",
        ),
        pytest.param(without(BASE_HARD, **{"services.nodeports": "2"}), BASE_HARD, ["a: allows 2 NodePort(s)"], id="nodeports"),
        pytest.param(without(BASE_HARD, **{"services.nodeports": "0m"}), without(BASE_HARD, **{"services.nodeports": 0}), [], id="zero-nodeports-spelt-otherwise"),
        pytest.param(without(BASE_HARD, **{"services.nodeports": "0.0"}), without(BASE_HARD, **{"services.nodeports": " 0 "}), [], id="zero-nodeports-as-decimals"),
    ],
)
def test_quota_caps_every_base_and_gpu_resource_of_every_tenant(hard_a, hard_b, expected):
    objs = (tenant_ns("a"), tenant_ns("b"), quota_of("tenant-a", hard_a), quota_of("tenant-b", hard_b), limits("tenant-a"), limits("tenant-b"))
    assert findings(isolation.quota, *objs) == [
        f"quota: ResourceQuota/tenant-{e[0]}/q: tenant {e[0]}'s quota {e[3:]} [tenants: {e[0]}]" for e in sorted(expected)
    ]


def test_quota_flags_a_namespace_without_quota_or_limits_and_node_ports_of_tenants_only():
    scoped = quota_of("tenant-a", BASE_HARD, scopes=["BestEffort"])
    services = [obj("Service", n, ns, spec={"type": t, "ports": [{"port": 80}]}) for n, ns, t in (("web", "tenant-b", "ClusterIP"), ("expose", "tenant-b", "NodePort"), ("plain", "tenant-b", None), ("ingress", "kube-system", "NodePort"))]
    objs = (tenant_ns("a"), tenant_ns("b"), platform_ns("kube-system"), scoped, quota_of("tenant-b", BASE_HARD), limits("tenant-a"), *services)
    assert findings(isolation.quota, *objs) == [
        "quota: Namespace/tenant-a: no ResourceQuota in tenant-a [tenants: a]",
        "quota: Namespace/tenant-b: no LimitRange in tenant-b [tenants: b]",
        "quota: Service/tenant-b/expose: tenant b exposes a NodePort [tenants: b]",
    ]


def test_quota_demands_the_gpu_resources_of_cluster_queues_and_vcluster_quotas():
    queue = obj("ClusterQueue", "cq", api="kueue.x-k8s.io/v1beta2", spec={"resourceGroups": [{"coveredResources": ["cpu", "nvidia.com/mig-1g.10gb"]}]})
    objs = (tenant_ns("a"), quota_of("tenant-a", BASE_HARD), limits("tenant-a"), queue, vcluster("a", {"policies": {"resourceQuota": {"quota": {"requests.amd.com/gpu": 1}}}}))
    assert findings(isolation.quota, *objs) == [
        "quota: ResourceQuota/tenant-a/q: tenant a's quota does not cap requests.amd.com/gpu, requests.nvidia.com/mig-1g.10gb [tenants: a]"
    ]


def vcluster(tenant: str, values: dict, namespace: str | None = None) -> dict:
    from ai_factory.factory.model.catalog import CHARTS

    return obj("HelmRelease", f"vcluster-{tenant}", namespace or f"tenant-{tenant}", "helm.toolkit.fluxcd.io/v2",
               spec={"chart": {"spec": {"chart": CHARTS["vcluster"].name}}, "values": values})


def hardened_values(tenant: str, **overrides) -> dict:
    values = {
        "policies": {"resourceQuota": {"enabled": False}, "networkPolicy": {"enabled": False}, "podSecurityStandard": "restricted"},
        "controlPlane": {"distro": {"k8s": {"apiServer": {"extraArgs": [
            "--oidc-issuer-url=https://id.example.com", f"--oidc-client-id=vcluster-{tenant}", "--oidc-username-prefix=oidc:", "--oidc-groups-prefix=oidc:",
        ]}}}},
    }
    for path, value in overrides.items():
        node = values
        *parents, last = path.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return values


@pytest.mark.parametrize(
    "overrides, expected",
    [
        pytest.param({}, [], id="hardened"),
        *[
            pytest.param({path.replace(".", "__"): True}, [what], id=path.split(".")[-2])
            for path, what in (
                ("sync.toHost.namespaces.enabled", "syncs namespaces to the host"),
                ("sync.toHost.persistentVolumes.enabled", "syncs persistent volumes to the host"),
                ("sync.toHost.storageClasses.enabled", "syncs storage classes to the host"),
                ("sync.toHost.priorityClasses.enabled", "syncs priority classes to the host"),
                ("sync.toHost.networkPolicies.enabled", "syncs network policies (extra allow rules) to the host"),
                ("sync.fromHost.nodes.syncBackChanges", "lets the vCluster change host nodes' labels and taints"),
                ("integrations.externalSecrets.sync.fromHost.clusterStores.enabled", "imports the host's ClusterSecretStores"),
            )
        ],
        pytest.param({"sync__toHost__priorityClasses__enabled": False}, [], id="priority-classes-off"),
        pytest.param({"policies__resourceQuota__enabled": True}, ["its chart quota does not cap requests.nvidia.com/gpu"], id="chart-quota-without-gpus"),
        pytest.param({"policies__resourceQuota": {}}, ["its chart quota does not cap requests.nvidia.com/gpu"], id="chart-quota-auto"),
        pytest.param({"policies__resourceQuota": {"enabled": True, "quota": {"requests.nvidia.com/gpu": 4}}}, [], id="chart-quota-with-gpus"),
        pytest.param({"policies__networkPolicy__enabled": True}, ["its chart network policy is on: it admits pods of every namespace (`app: loft`) and every pod on 8443"], id="chart-network-policy-on"),
        pytest.param({"policies__networkPolicy": {}}, [], id="chart-network-policy-default"),
        pytest.param({"policies__podSecurityStandard": "baseline"}, ["its Pod Security standard is 'baseline', not the namespace's 'restricted'"], id="pod-security"),
        pytest.param({"controlPlane__distro__k8s__apiServer__extraArgs": ["--oidc-issuer-url=x", "--oidc-client-id=y", "--oidc-username-prefix=", "--oidc-groups-prefix=oidc:"]},
                     ["its API server lacks --oidc-username-prefix=oidc:"], id="oidc-username-unprefixed"),
        pytest.param({"controlPlane__statefulSet__persistence__volumeClaim__retentionPolicy": "Delete"}, ["its data volume is deleted with it"], id="volume-deleted"),
        pytest.param({"controlPlane__statefulSet__persistence__volumeClaim__retentionPolicy": "Retain"}, [], id="volume-retained"),
    ],
)
def test_vcluster_hardening_flags_each_loosened_setting(overrides, expected):
    objs = (tenant_ns("a"), quota_of("tenant-a", without(BASE_HARD, **{"requests.nvidia.com/gpu": 8})), vcluster("a", hardened_values("a", **overrides)))
    assert findings(isolation.vcluster_hardening, *objs) == sorted(f"vcluster-hardening: HelmRelease/tenant-a/vcluster-a: {e} [tenants: a]" for e in expected)


def test_vcluster_hardening_flags_a_shared_oidc_client_and_a_release_outside_tenants():
    shared = hardened_values("b", controlPlane__distro__k8s__apiServer__extraArgs=hardened_values("a")["controlPlane"]["distro"]["k8s"]["apiServer"]["extraArgs"])
    objs = (tenant_ns("a"), tenant_ns("b"), platform_ns("tools"), vcluster("a", hardened_values("a")), vcluster("b", shared), vcluster("c", hardened_values("c"), "tools"))
    assert findings(isolation.vcluster_hardening, *objs) == [
        "vcluster-hardening: HelmRelease/tenant-a/vcluster-a: its API server accepts the same OIDC client as tenant b's (--oidc-client-id=vcluster-a): "
        "a token for one works on the other [tenants: a, b]",
        "vcluster-hardening: HelmRelease/tenant-b/vcluster-b: its API server accepts the same OIDC client as tenant a's (--oidc-client-id=vcluster-a): "
        "a token for one works on the other [tenants: a, b]",
        "vcluster-hardening: HelmRelease/tools/vcluster-c: it is installed in tools, which is no tenant's namespace",
    ]


def inventory_entry(tenant: str, kind: str = "kubernetes:core/v1:Namespace", protect: bool = True, retain: bool = True) -> dict:
    return {"type": kind, "name": f"{tenant}-{kind.rsplit(':', 1)[-1].lower()}", "tenant": tenant, "protect": protect, "retainOnDelete": retain}


RELEASE = "kubernetes:helm.sh/v3:Release"


@pytest.mark.parametrize(
    "inventory, expected",
    [
        pytest.param([inventory_entry("a"), inventory_entry("a", RELEASE)], [], id="protected-and-retained"),
        pytest.param([inventory_entry("a", retain=False)], ["tenant a's namespace (a-namespace) is not protected and retained on delete"], id="namespace-not-retained"),
        pytest.param([inventory_entry("a", protect=False)], ["tenant a's namespace (a-namespace) is not protected and retained on delete"], id="namespace-not-protected"),
        pytest.param([inventory_entry("a"), inventory_entry("a", RELEASE, protect=False)], ["tenant a's release (vCluster, Slurm) (a-release) is not protected and retained on delete"], id="vcluster-not-protected"),
        pytest.param([inventory_entry("a"), inventory_entry("a", "kubernetes:core/v1:ConfigMap", protect=False)], [], id="other-resources-need-no-protection"),
        pytest.param([inventory_entry("b")], ["the inventory has no namespace resource of tenant a: its protection cannot be proven"], id="namespace-missing-from-the-inventory"),
        pytest.param([inventory_entry("a", RELEASE)], ["the inventory has no namespace resource of tenant a: its protection cannot be proven"], id="only-the-release"),
    ],
)
def test_tenant_protection_needs_the_namespace_and_vcluster_protected_and_retained(inventory, expected):
    assert findings(isolation.tenant_protection, tenant_ns("a"), inventory=inventory) == [f"tenant-protection: Namespace/tenant-a: {e} [tenants: a]" for e in expected]


def placement_rule(namespace: str = "tenant-a", pairs: tuple = ("ai-factory.io/trust-domain=a",), kinds_per_entry: tuple = (["Pod"],), action: str = "Enforce",
                   guarded: tuple = ("", "ai-factory.io/trust-domain", "ai-factory.io/dedicated"), only_equal: bool = True) -> dict:
    """A tenant's Kyverno rule as components/kyverno.py writes it: pods' tolerations of placement keys are Equal and listed."""
    from ai_factory.components.kyverno import TOLERATION_KEY, TOLERATION_OPERATOR, TOLERATION_PAIR

    denied = [{"key": TOLERATION_PAIR, "operator": "AnyNotIn", "value": list(pairs)}]
    containers = {"list": "request.object.spec.containers", "deny": {"conditions": {"any": [{"key": "{{ element.name }}", "operator": "Equals", "value": "x"}]}}}
    if only_equal:
        denied.insert(0, {"key": TOLERATION_OPERATOR, "operator": "NotEquals", "value": "Equal"})
    return {
        "name": "placement-tolerations",
        "match": {"any": [{"resources": {"kinds": kinds, "namespaces": [namespace]}} for kinds in kinds_per_entry]},
        "validate": {"failureAction": action, "foreach": [containers, {
            "list": "request.object.spec.tolerations || `[]`",
            "preconditions": {"any": [{"key": TOLERATION_KEY, "operator": "AnyIn", "value": list(guarded)}]},
            "deny": {"conditions": {"any": denied}},
        }]},
    }


def pinning_rule(tenant: str = "a", namespace: str = "tenant-a") -> dict:
    from ai_factory.components.kyverno import DEDICATED_SELECTOR

    return {
        "name": "dedicated-nodes",
        "match": {"any": [{"resources": {"kinds": ["Pod"], "namespaces": [namespace]}}]},
        "validate": {"failureAction": "Enforce", "deny": {"conditions": {"any": [{"key": DEDICATED_SELECTOR, "operator": "NotEquals", "value": tenant}]}}},
    }


def kyverno(*rules: dict) -> dict:
    return {"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "tenant-a-admission"}, "spec": {"rules": list(rules)}}


TD, DED = "ai-factory.io/trust-domain", "ai-factory.io/dedicated"


def whitelisted(*tolerations: dict, trust: str = "high", selector: str | None = None, defaults: list | None = None) -> dict:
    annotations = {TOLERATIONS_WHITELIST_ANNOTATION: json.dumps(list(tolerations or [{"key": DED, "operator": "Equal", "value": "a"}]))}
    if selector is not None:
        annotations[NODE_SELECTOR_ANNOTATION] = selector
    if defaults is not None:
        annotations[DEFAULT_TOLERATIONS_ANNOTATION] = json.dumps(defaults)
    return tenant_ns("a", trust=trust, annotations=annotations)


B_PLACED = tenant_ns("b", annotations={TOLERATIONS_WHITELIST_ANNOTATION: json.dumps([{"key": "ai-factory.io/trust-domain", "operator": "Equal", "value": "b"}])})
PLACE = "gpu-placement: Namespace/tenant-a:"
NO_WHITELIST = (f"{PLACE} no toleration whitelist (scheduler.alpha.kubernetes.io/tolerationsWhitelist or a Kyverno rule): tenant a's pods may "
                "tolerate any node's taints [tenants: a]")
NOT_PINNED = f"{PLACE} untrusted tenant a's pods are not pinned to its dedicated nodes (scheduler.alpha.kubernetes.io/node-selector or a Kyverno rule) [tenants: a]"
UNTRUSTED_SHARED = f"{PLACE} untrusted tenant a may tolerate shared-GPU nodes (ai-factory.io/trust-domain) [tenants: a]"


@pytest.mark.parametrize(
    "objs, expected",
    [
        pytest.param([whitelisted({"key": TD, "operator": "Equal", "value": "a"})], [], id="own-trust-domain"),
        pytest.param([whitelisted({"key": DED, "operator": "Equal", "value": "a"}, {"key": "gpu", "operator": "Exists"})], [], id="own-dedicated-nodes-and-other-keys"),
        pytest.param([whitelisted({"operator": "Exists"})], [f"{PLACE} tenant a's pods may tolerate every taint [tenants: a]"], id="every-taint"),
        pytest.param([whitelisted({"key": TD, "operator": "Exists"})], [f"{PLACE} tenant a (domain a) may tolerate the shared-GPU nodes of every trust domain [tenants: a]"], id="every-trust-domain"),
        pytest.param([whitelisted({"key": TD, "operator": "Exists", "value": "a"})], [f"{PLACE} tenant a (domain a) may tolerate the shared-GPU nodes of trust domain a [tenants: a]"], id="exists-ignores-the-value"),
        pytest.param([whitelisted({"key": TD, "operator": "Equal", "value": "b"})], [f"{PLACE} tenant a (domain a) may tolerate the shared-GPU nodes of trust domain b [tenants: a, b]"], id="another-trust-domain"),
        pytest.param([whitelisted({"key": DED, "operator": "Equal", "value": "b"})], [f"{PLACE} tenant a may tolerate the nodes dedicated to tenant b [tenants: a, b]"], id="another-tenants-nodes"),
        pytest.param([whitelisted({"key": DED, "operator": "Exists"})], [f"{PLACE} tenant a may tolerate the nodes dedicated to every tenant [tenants: a]"], id="every-tenants-nodes"),
        pytest.param([whitelisted(defaults=[{"key": TD, "operator": "Equal", "value": "b"}])], [f"{PLACE} tenant a (domain a) may tolerate the shared-GPU nodes of trust domain b [tenants: a, b]"], id="default-tolerations"),
        pytest.param([tenant_ns("a")], [NO_WHITELIST], id="no-whitelist"),
        pytest.param([tenant_ns("a", annotations={TOLERATIONS_WHITELIST_ANNOTATION: "not json"})], [NO_WHITELIST], id="unreadable-whitelist"),
        pytest.param([tenant_ns("a", annotations={TOLERATIONS_WHITELIST_ANNOTATION: "[1]"})], [NO_WHITELIST], id="whitelist-of-non-tolerations"),
        pytest.param([tenant_ns("a"), kyverno(placement_rule())], [], id="kyverno-rule"),
        pytest.param([tenant_ns("a"), kyverno(placement_rule(kinds_per_entry=(["Deployment"], ["Pod"])))], [], id="kyverno-rule-with-several-match-entries"),
        pytest.param([tenant_ns("a"), kyverno(placement_rule(kinds_per_entry=(["Deployment"],)))], [NO_WHITELIST], id="kyverno-rule-not-on-pods"),
        pytest.param([tenant_ns("a"), kyverno(placement_rule(namespace="tenant-b", pairs=("ai-factory.io/trust-domain=b",)))], [NO_WHITELIST], id="kyverno-rule-of-another-namespace"),
        pytest.param([tenant_ns("a"), kyverno(placement_rule(action="Audit"))], [NO_WHITELIST], id="kyverno-rule-in-audit"),
        pytest.param([tenant_ns("a"), kyverno(placement_rule(guarded=("", TD)))], [NO_WHITELIST], id="kyverno-rule-missing-a-placement-key"),
        pytest.param([tenant_ns("a"), kyverno(placement_rule(guarded=(TD, DED)))], [NO_WHITELIST], id="kyverno-rule-missing-the-empty-key"),
        pytest.param([tenant_ns("a"), kyverno(placement_rule(only_equal=False))], [NO_WHITELIST], id="kyverno-rule-allowing-exists"),
        pytest.param([tenant_ns("a"), kyverno(placement_rule(pairs=("ai-factory.io/trust-domain=b",)))], [f"{PLACE} tenant a (domain a) may tolerate the shared-GPU nodes of trust domain b [tenants: a, b]"], id="kyverno-rule-allowing-another-domain"),
        pytest.param([whitelisted({"key": DED, "operator": "Equal", "value": "a"}, trust="low", selector="ai-factory.io/dedicated=a")], [], id="untrusted-pinned"),
        pytest.param([whitelisted(trust="low", selector="zone=z1, ai-factory.io/dedicated=a")], [], id="untrusted-pinned-among-other-labels"),
        pytest.param([whitelisted(trust="low", selector="ai-factory.io/dedicated=b")], [NOT_PINNED], id="untrusted-pinned-elsewhere"),
        pytest.param([whitelisted(trust="low")], [NOT_PINNED], id="untrusted-not-pinned"),
        pytest.param([tenant_ns("a", trust="low"), kyverno(placement_rule(pairs=()), pinning_rule())], [], id="untrusted-pinned-by-kyverno"),
        pytest.param([tenant_ns("a", trust="low"), kyverno(placement_rule(pairs=()), pinning_rule("b"))], [NOT_PINNED], id="untrusted-pinned-by-kyverno-elsewhere"),
        pytest.param([whitelisted({"key": TD, "operator": "Equal", "value": "a"}, trust="low", selector="ai-factory.io/dedicated=a")], [UNTRUSTED_SHARED], id="untrusted-tolerating-shared-gpus"),
    ],
)
def test_gpu_placement_flags_tolerations_beyond_the_tenants_own_nodes(objs, expected):
    assert findings(isolation.gpu_placement, B_PLACED, *objs) == expected


def gpu_node(name: str, labels: dict, taints: list | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {"taints": taints or []}}


def taint(key: str, value: str, effect: str = "NoSchedule") -> dict:
    return {"key": key, "value": value, "effect": effect}


@pytest.mark.parametrize(
    "node, expected",
    [
        pytest.param(gpu_node("n", {DED: "a"}, [taint(DED, "a")]), [], id="dedicated-and-tainted"),
        pytest.param(gpu_node("n", {DED: "a"}), ["node dedicated to tenant a is not tainted for it: other tenants' pods can land there [tenants: a]"], id="dedicated-untainted"),
        pytest.param(gpu_node("n", {DED: "a"}, [taint(DED, "b")]), ["node dedicated to tenant a is not tainted for it: other tenants' pods can land there [tenants: a]"], id="tainted-for-another"),
        pytest.param(gpu_node("n", {DED: "a", TD: "b"}, [taint(DED, "a")]), ["node dedicated to tenant a also serves trust domain b [tenants: a, b]"], id="dedicated-and-shared"),
        pytest.param(gpu_node("n", {DED: "a", TD: "a"}, [taint(DED, "a")]), [], id="dedicated-in-its-own-domain"),
        pytest.param(gpu_node("n", {DED: "a", "nvidia.com/mig.config": "all-1g.10gb"}, [taint(DED, "a")]),
                     ["untrusted tenant a is placed on a shared-GPU node (MIG, HAMi or time-slicing) [tenants: a]"], id="untrusted-on-mig"),
        pytest.param(gpu_node("n", {DED: "a", "nvidia.com/mig.config": "all-disabled"}, [taint(DED, "a")]), [], id="untrusted-mig-disabled"),
        pytest.param(gpu_node("n", {TD: "a", "ai-factory.io/hami": "enabled"}), ["untrusted tenant a is placed on a shared-GPU node (MIG, HAMi or time-slicing) [tenants: a]"], id="untrusted-domain-on-hami"),
        pytest.param(gpu_node("n", {TD: "a", "ai-factory.io/hami": "disabled"}), [], id="hami-disabled"),
        pytest.param(gpu_node("n", {TD: "a", "nvidia.com/device-plugin.config": "sliced"}), ["untrusted tenant a is placed on a shared-GPU node (MIG, HAMi or time-slicing) [tenants: a]"], id="untrusted-on-time-slices"),
        pytest.param(gpu_node("n", {TD: "b", "ai-factory.io/hami": "enabled"}), [], id="trusted-on-hami"),
        pytest.param(gpu_node("n", {"ai-factory.io/hami": "enabled"}), [], id="shared-node-of-no-domain"),
    ],
)
def test_gpu_placement_flags_nodes_that_mix_tenants(node, expected):
    objs = (whitelisted(trust="low", selector="ai-factory.io/dedicated=a"), B_PLACED, node)
    assert findings(isolation.gpu_placement, *objs) == [f"gpu-placement: Node/n: {e}" for e in expected]


def test_gpu_placement_compares_a_trust_domain_label_that_is_no_string_as_it_is():
    # Malformed (the schema check reports it), yet still the same domain on the namespace and the node.
    objs = (tenant_ns("c", trust="low", domain=["x"]), B_PLACED, gpu_node("n", {TD: ["x"], "ai-factory.io/hami": "enabled"}))
    placed = [f for f in findings(isolation.gpu_placement, *objs) if f.startswith("gpu-placement: Node/n:")]
    assert placed == ["gpu-placement: Node/n: untrusted tenant c is placed on a shared-GPU node (MIG, HAMi or time-slicing) [tenants: c]"]


SUBJECTS = "rbac-subjects:"


@pytest.mark.parametrize(
    "binding_obj, expected",
    [
        pytest.param(a_binds(), [], id="own-owners-in-own-namespace"),
        pytest.param(a_binds(subject="oidc:b-admins"), ["RoleBinding/tenant-a/rb: binds Group oidc:b-admins of tenant b into tenant a's environment [tenants: a, b]"], id="another-tenants-owners"),
        pytest.param(a_binds(subject="oidc:stranger"), ["RoleBinding/tenant-a/rb: binds Group oidc:stranger, which belongs to no tenant, into tenant a's environment [tenants: a]"], id="nobodys-group"),
        pytest.param(a_binds(subject="system:masters"), ["RoleBinding/tenant-a/rb: binds system group system:masters [tenants: a]"], id="system-masters"),
        pytest.param(a_binds(subject="system:authenticated"), ["RoleBinding/tenant-a/rb: binds system group system:authenticated [tenants: a]"], id="every-user"),
        pytest.param(a_binds(subject="system:unauthenticated", namespace=None), ["ClusterRoleBinding/rb: binds system group system:unauthenticated"], id="system-group-cluster-wide"),
        pytest.param(a_binds(subject="system:serviceaccounts:tenant-a", namespace=None), ["ClusterRoleBinding/rb: binds Group system:serviceaccounts:tenant-a of tenant a cluster-wide [tenants: a]"], id="tenant-accounts-cluster-wide"),
        pytest.param(a_binds(subject="oidc:a-admins", namespace="kube-system"), ["RoleBinding/kube-system/rb: binds Group oidc:a-admins of tenant a in a platform namespace kube-system [tenants: a]"], id="owners-in-a-platform-namespace"),
        pytest.param(a_binds(subject="oidc:a-admins", namespace="tenant-b"), ["RoleBinding/tenant-b/rb: binds Group oidc:a-admins of tenant a into tenant b's environment [tenants: a, b]"], id="owners-in-another-tenant"),
        pytest.param(a_binds(subject="oidc:platform-admins", namespace=None), [], id="platform-group-cluster-wide"),
        pytest.param(a_binds(("ClusterRole", "cluster-admin"), namespace=None, subject="oidc:platform-admins"), ["ClusterRoleBinding/rb: binds ClusterRole cluster-admin"], id="cluster-admin"),
        pytest.param(a_binds(("ClusterRole", "cluster-admin")), ["RoleBinding/tenant-a/rb: binds ClusterRole cluster-admin [tenants: a]"], id="cluster-admin-in-a-tenant"),
    ],
)
def test_rbac_subjects_bind_tenants_only_into_their_own_namespace(binding_obj, expected):
    objs = (tenant_ns("a"), tenant_ns("b"), platform_ns("kube-system"), binding_obj)
    assert findings(isolation.rbac_subjects, *objs) == [f"{SUBJECTS} {e}" for e in expected]


def test_rbac_subjects_inside_a_vcluster_are_its_owners_only():
    inner = [
        binding("ClusterRoleBinding", "admins", None, ("ClusterRole", "cluster-admin"), ("ServiceAccount", "kube-system/robot"), ("Group", "system:masters"),
                ("Group", "oidc:b-admins"), ("Group", "oidc:a-admins"), ("Group", "oidc:nobody")),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
    ]
    import yaml

    release = vcluster("a", {"experimental": {"deploy": {"vcluster": {"manifests": yaml.safe_dump_all(inner)}}}})
    broken = vcluster("b", {"experimental": {"deploy": {"vcluster": {"manifests": "kind: [unclosed"}}}})
    inside = "rbac-subjects: HelmRelease/tenant-a/vcluster-a: inside tenant a's vCluster, binds"
    assert findings(isolation.rbac_subjects, tenant_ns("a"), tenant_ns("b"), release, broken) == [
        f"{inside} Group oidc:b-admins of tenant b into tenant a's environment [tenants: a, b]",
        f"{inside} Group oidc:nobody, which belongs to no tenant, into tenant a's environment [tenants: a]",
        f"{inside} system group system:masters [tenants: a]",
    ]


def test_rbac_subjects_accept_platform_accounts_and_flag_tenant_accounts_elsewhere():
    def account_binding(namespace, account_namespace):
        rb = a_binds(namespace=namespace)
        rb["subjects"] = [{"kind": "ServiceAccount", "name": "runner", **({"namespace": account_namespace} if account_namespace else {})}]
        return rb

    objs = (tenant_ns("a"), tenant_ns("b"), platform_ns("kueue-system"))
    assert findings(isolation.rbac_subjects, *objs, account_binding("tenant-a", "kueue-system")) == []
    assert findings(isolation.rbac_subjects, *objs, account_binding("tenant-a", None)) == []
    assert findings(isolation.rbac_subjects, *objs, account_binding("kueue-system", "tenant-b")) == [
        "rbac-subjects: RoleBinding/kueue-system/rb: binds ServiceAccount tenant-b/runner of tenant b in a platform namespace kueue-system [tenants: b]"
    ]


def test_rbac_subjects_flag_unreadable_unprefixed_and_shared_owners():
    unreadable = tenant_ns("c")
    unreadable["metadata"]["annotations"][OWNERS_ANNOTATION] = "[{\"name\": \"x\"}]"
    objs = (tenant_ns("a", owners=("shared",)), tenant_ns("b", owners=("shared",)), unreadable, tenant_ns("e", owners=("shared",)))
    unprefixed = tenant_ns("d")
    unprefixed["metadata"]["annotations"][OWNERS_ANNOTATION] = json.dumps([{"kind": "User", "name": "d@example.com"}, {"kind": "ServiceAccount", "name": "tenant-d/ci"}])
    assert findings(isolation.rbac_subjects, *objs, unprefixed) == [
        "rbac-subjects: Namespace/tenant-a: owner Group oidc:shared is shared by tenants a, b, e [tenants: a, b, e]",
        "rbac-subjects: Namespace/tenant-b: owner Group oidc:shared is shared by tenants a, b, e [tenants: a, b, e]",
        "rbac-subjects: Namespace/tenant-c: ai-factory.io/owners is not a JSON list of {kind, name} subjects [tenants: c]",
        "rbac-subjects: Namespace/tenant-d: owner User d@example.com lacks the 'oidc:' prefix of the API servers' OIDC settings [tenants: d]",
        "rbac-subjects: Namespace/tenant-e: owner Group oidc:shared is shared by tenants a, b, e [tenants: a, b, e]",
    ]


@pytest.mark.parametrize(
    "account, expected",
    [
        pytest.param({"automountServiceAccountToken": False}, [], id="token-not-mounted"),
        pytest.param({"automountServiceAccountToken": True}, ["the default service account of tenant-a mounts its API token into every pod"], id="token-mounted"),
        pytest.param({}, ["the default service account of tenant-a mounts its API token into every pod"], id="token-mounted-by-default"),
        pytest.param(None, ["the default service account of tenant-a mounts its API token into every pod"], id="no-default-account"),
    ],
)
def test_service_account_token_of_the_default_account_stays_unmounted(account, expected):
    objs = [tenant_ns("a"), obj("ServiceAccount", "default", "kube-system", automountServiceAccountToken=True), obj("ServiceAccount", "other", "tenant-a")]
    if account is not None:
        objs.append(obj("ServiceAccount", "default", "tenant-a", **account))
    assert findings(isolation.service_account_token, *objs) == [f"service-account-token: Namespace/tenant-a: {e} [tenants: a]" for e in expected]


@pytest.mark.parametrize(
    "extra, expected",
    [
        pytest.param(obj("ConfigMap", "c", "tenant-a"), [], id="labelled-in-its-namespace"),
        pytest.param({**obj("ConfigMap", "c", "tenant-a"), "metadata": meta("c", "tenant-a", "b")}, ["ConfigMap/tenant-a/c: in tenant a's namespace but carries tenant label 'b' [tenants: a, b]"], id="another-tenants-label"),
        pytest.param({**obj("ConfigMap", "c", "tenant-a"), "metadata": meta("c", "tenant-a")}, ["ConfigMap/tenant-a/c: in tenant a's namespace but has no tenant label [tenants: a]"], id="unlabelled"),
        pytest.param({**obj("ConfigMap", "c", "kube-system"), "metadata": meta("c", "kube-system", "a")}, ["ConfigMap/kube-system/c: tenant a's object lives in platform namespace kube-system [tenants: a]"], id="in-a-platform-namespace"),
        pytest.param({**obj("ClusterRole", "c"), "metadata": meta("c", None, "a")}, [], id="cluster-scoped"),
        pytest.param(obj("ConfigMap", "c", "kube-system"), [], id="platform-object"),
    ],
)
def test_tenant_labels_keep_each_object_with_its_tenant(extra, expected):
    assert findings(isolation.tenant_labels, tenant_ns("a"), platform_ns("kube-system"), extra) == [f"tenant-labels: {e}" for e in expected]



def test_a_malformed_object_ends_one_analysis_with_a_finding():
    broken = binding("RoleBinding", "rb", "tenant-a", ("Role", "r"), tenant="a")
    broken["subjects"] = ["not-a-subject"]
    rendered = world(tenant_ns("a"), broken)
    stopped = [str(f) for c in isolation.CHECKS for f in c(rendered, None) if f.ref == "-"]
    assert stopped == [
        f"{check}: -: analysis stopped at a malformed object (AttributeError: 'str' object has no attribute 'get'); fix the schema findings first"
        for check in ("rbac-subjects", "rbac-rules", "rbac-access")
    ]

# --------------------------------------------------------------------------- clean environments


def test_isolation_checks_are_registered_in_factory_check():
    assert set(isolation.CHECKS) <= set(CHECKS)


def test_dev_passes_every_isolation_check(dev, oracles):
    assert [str(f) for c in isolation.CHECKS for f in c(dev, oracles)] == []


def test_thirty_tenants_of_mixed_trust_pass_every_check(many, oracles):
    tenants = {m.name for m in many.manifests if m.kind == "Namespace" and m.tenant}
    assert len(tenants) == 30
    assert run_checks(many, oracles) == []


def test_a_rendered_directory_is_analysed_without_the_config(dev, oracles, tmp_path):
    dev.write(tmp_path)
    assert [str(f) for c in isolation.CHECKS for f in c(load_rendered(tmp_path), oracles)] == []
    path = tmp_path / "manifests/tenants/tenant-partner-acme/_cluster/ciliumclusterwidenetworkpolicy-tenant-partner-acme-isolation.yaml"
    path.write_text(path.read_text().replace("169.254.169.254/32", "192.0.2.1/32"))
    assert found(load_rendered(tmp_path), oracles, "network-default-deny") == [
        "network-default-deny: Namespace/tenant-partner-acme: egress of tenant-partner-acme to the cloud metadata address "
        "169.254.169.254 is not denied [tenants: partner-acme]"
    ]


# --------------------------------------------------------------------------- A. RBAC


def test_cross_tenant_role_binding_is_caught(dev, oracles):
    broken = variant(dev, lambda r: add(r, binding("RoleBinding", "help", "tenant-search", ("Role", "tenant-admin"), ("Group", "oidc:assistant-admins"), tenant="search"), "search"))
    subjects = found(broken, oracles, "rbac-subjects")
    assert subjects == [
        "rbac-subjects: RoleBinding/tenant-search/help: binds Group oidc:assistant-admins of tenant assistant into tenant search's environment "
        "[tenants: assistant, search]"
    ]
    (access,) = found(broken, oracles, "rbac-access")
    assert access.startswith("rbac-access: RoleBinding/tenant-search/help: tenant assistant (Group oidc:assistant-admins) can ")
    assert access.endswith("in tenant search's namespace tenant-search [tenants: assistant, search]")


def test_service_account_of_another_tenant_bound_in_a_namespace_is_caught(dev, oracles):
    account = {"kind": "ServiceAccount", "name": "default", "namespace": "tenant-assistant"}
    rb = binding("RoleBinding", "robot", "tenant-search", ("Role", "tenant-admin"), tenant="search")
    rb["subjects"] = [account]
    broken = variant(dev, lambda r: add(r, rb, "search"))
    assert found(broken, oracles, "rbac-subjects") == [
        "rbac-subjects: RoleBinding/tenant-search/robot: binds ServiceAccount tenant-assistant/default of tenant assistant into "
        "tenant search's environment [tenants: assistant, search]"
    ]


def test_tenant_bound_cluster_wide_is_caught(dev, oracles):
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta("reader"),
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]}

    def change(r):
        add(r, role)
        add(r, binding("ClusterRoleBinding", "search-reader", None, ("ClusterRole", "reader"), ("Group", "oidc:search-admins")))

    broken = variant(dev, change)
    assert found(broken, oracles, "rbac-subjects") == [
        "rbac-subjects: ClusterRoleBinding/search-reader: binds Group oidc:search-admins of tenant search cluster-wide [tenants: search]"
    ]
    assert found(broken, oracles, "rbac-access") == [
        "rbac-access: ClusterRoleBinding/search-reader: tenant search (Group oidc:search-admins) can get on core/nodes in every namespace "
        "and on cluster-scoped resources (its Namespace included) [tenants: search]"
    ]


def test_binding_to_a_role_outside_the_rendered_set_cannot_be_proven(dev, oracles):
    broken = variant(dev, lambda r: add(r, binding("RoleBinding", "edit", "tenant-search", ("ClusterRole", "edit"), ("Group", "oidc:search-admins"), tenant="search"), "search"))
    assert found(broken, oracles, "rbac-access") == [
        "rbac-access: RoleBinding/tenant-search/edit: binds tenant search (Group oidc:search-admins) to ClusterRole/edit, which is not in "
        "the rendered set: its permissions cannot be evaluated [tenants: search]"
    ]


def test_tenant_role_that_can_write_its_quota_is_caught(dev, oracles):
    rule = {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["get", "update"]}
    broken = variant(dev, lambda r: find(r, "Role", "tenant-admin", "tenant-search")["rules"].append(rule))
    assert found(broken, oracles, "rbac-access") == [
        "rbac-access: RoleBinding/tenant-search/tenant-admin: tenant search (Group oidc:search-admins) can update resourcequotas "
        "(its quota) in its own namespace tenant-search [tenants: search]"
    ]


def test_tenant_role_with_wildcards_or_escalation_is_caught(dev, oracles):
    rules = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get"]}, {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["bind"]}]
    broken = variant(dev, lambda r: find(r, "Role", "tenant-admin", "tenant-search")["rules"].extend(rules))
    assert found(broken, oracles, "rbac-rules") == [
        "rbac-rules: RoleBinding/tenant-search/tenant-admin: grants tenant search (Group oidc:search-admins) Role/tenant-search/tenant-admin "
        "with verb bind: bind on rbac.authorization.k8s.io/roles [tenants: search]",
        "rbac-rules: RoleBinding/tenant-search/tenant-admin: grants tenant search (Group oidc:search-admins) Role/tenant-search/tenant-admin "
        "with wildcard apiGroups, wildcard resources: get on */* [tenants: search]",
    ]


def test_owner_group_without_the_oidc_prefix_is_caught(dev, oracles):
    def change(r):
        annotations = find(r, "Namespace", "tenant-search")["metadata"]["annotations"]
        annotations[OWNERS_ANNOTATION] = json.dumps([{"kind": "Group", "name": "search-admins"}])

    assert found(variant(dev, change), oracles, "rbac-subjects") == [
        "rbac-subjects: Namespace/tenant-search: owner Group search-admins lacks the 'oidc:' prefix of the API servers' OIDC settings "
        "[tenants: search]",
        "rbac-subjects: RoleBinding/tenant-search/tenant-admin: binds Group oidc:search-admins, which belongs to no tenant, into tenant "
        "search's environment [tenants: search]",
    ]


def test_binding_a_system_group_is_caught(dev, oracles):
    broken = variant(dev, lambda r: find(r, "RoleBinding", "tenant-admin", "tenant-search")["subjects"].append({"kind": "Group", "name": "system:authenticated"}))
    assert found(broken, oracles, "rbac-subjects") == [
        "rbac-subjects: RoleBinding/tenant-search/tenant-admin: binds system group system:authenticated [tenants: search]"
    ]


def test_vcluster_admin_binding_of_another_tenants_group_is_caught(dev, oracles):
    def change(r):
        values = find(r, "HelmRelease", "vcluster-assistant")["spec"]["values"]
        manifests = values["experimental"]["deploy"]["vcluster"]["manifests"]
        values["experimental"]["deploy"]["vcluster"]["manifests"] = manifests.replace("oidc:assistant-admins", "oidc:partner-acme")

    assert found(variant(dev, change), oracles, "rbac-subjects") == [
        "rbac-subjects: HelmRelease/tenant-assistant/vcluster-assistant: inside tenant assistant's vCluster, binds Group oidc:partner-acme "
        "of tenant partner-acme into tenant assistant's environment [tenants: assistant, partner-acme]"
    ]


def test_default_service_account_mounting_its_token_is_caught(dev, oracles):
    def change(r):
        (account,) = [m.obj for m in r.manifests if m.kind == "ServiceAccount" and m.name == "default" and m.namespace == "tenant-assistant"]
        account["automountServiceAccountToken"] = True

    assert found(variant(dev, change), oracles, "service-account-token") == [
        "service-account-token: Namespace/tenant-assistant: the default service account of tenant-assistant mounts its API token into "
        "every pod [tenants: assistant]"
    ]


def test_objects_outside_their_tenant_are_caught(dev, oracles):
    def change(r):
        find(r, "Role", "tenant-admin", "tenant-search")["metadata"]["labels"].pop("ai-factory.io/tenant")
        add(r, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("leak", "kube-system", "assistant")}, "assistant")

    assert found(variant(dev, change), oracles, "tenant-labels") == [
        "tenant-labels: ConfigMap/kube-system/leak: tenant assistant's object lives in platform namespace kube-system [tenants: assistant]",
        "tenant-labels: Role/tenant-search/tenant-admin: in tenant search's namespace but has no tenant label [tenants: search]",
    ]


# --------------------------------------------------------------------------- B. pod security and tenant pods


def test_tenant_namespace_below_restricted_is_caught(dev, oracles):
    def change(r):
        find(r, "Namespace", "tenant-search")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "privileged"
        find(r, "Namespace", "tenant-assistant")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "baseline"

    assert found(variant(dev, change), oracles, "pod-security") == [
        "pod-security: Namespace/tenant-assistant: enforces baseline without a reviewed exception (ai-factory.io/pod-security-exception) "
        "[tenants: assistant]",
        "pod-security: Namespace/tenant-search: enforces privileged instead of restricted [tenants: search]",
    ]


def test_tenant_pod_reaching_past_the_gpu_allocation_is_caught(dev, oracles):
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta("trainer", "tenant-search", "search"),
        "spec": {"template": {"spec": {
            "containers": [{
                "name": "main",
                "image": "example/trainer:1",
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                "envFrom": [{"configMapRef": {"name": "trainer-env"}}],
                "volumeMounts": [{"name": "devices", "mountPath": "/var/run/nvidia-container-devices/all"}],
            }],
            "volumes": [{"name": "devices", "hostPath": {"path": "/dev"}}],
        }}},
    }
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("trainer-env", "tenant-search", "search"), "data": {"CUDA_DISABLE_CONTROL": "true"}}

    def change(r):
        add(r, deployment, "search")
        add(r, config_map, "search")

    assert found(variant(dev, change), oracles, "tenant-pods") == [
        "tenant-pods: Deployment/tenant-search/trainer: container main imports variables with envFrom, which admission refuses (a ConfigMap "
        "or Secret could set GPU escape variables) [tenants: search]",
        "tenant-pods: Deployment/tenant-search/trainer: container main mounts /var/run/nvidia-container-devices/all [tenants: search]",
        "tenant-pods: Deployment/tenant-search/trainer: container main sets CUDA_DISABLE_CONTROL, which bypasses GPU allocation or HAMi "
        "limits [tenants: search]",
        "tenant-pods: Deployment/tenant-search/trainer: container main sets NVIDIA_VISIBLE_DEVICES, which bypasses GPU allocation or HAMi "
        "limits [tenants: search]",
        "tenant-pods: Deployment/tenant-search/trainer: volume devices is a hostPath (/dev) [tenants: search]",
    ]


# --------------------------------------------------------------------------- C. network


def test_missing_default_deny_is_caught(dev, oracles):
    def change(r):
        policy(r, "partner-acme")["enableDefaultDeny"]["egress"] = False
        r.manifests = [m for m in r.manifests if m.name != "tenant-assistant-isolation"]

    assert found(variant(dev, change), oracles, "network-default-deny") == [
        "network-default-deny: Namespace/tenant-assistant: egress of tenant-assistant to the cloud metadata address 169.254.169.254 is not "
        "denied [tenants: assistant]",
        "network-default-deny: Namespace/tenant-assistant: egress of tenant-assistant to the cloud metadata address fd00:ec2::254 is not "
        "denied [tenants: assistant]",
        "network-default-deny: Namespace/tenant-assistant: no cluster-wide Cilium policy denies egress by default for tenant-assistant "
        "(namespaced policies can be deleted by the tenant) [tenants: assistant]",
        "network-default-deny: Namespace/tenant-assistant: no cluster-wide Cilium policy denies ingress by default for tenant-assistant "
        "(namespaced policies can be deleted by the tenant) [tenants: assistant]",
        "network-default-deny: Namespace/tenant-assistant: no cluster-wide Cilium policy lets tenant-assistant reach kube-dns on port 53 "
        "[tenants: assistant]",
        "network-default-deny: Namespace/tenant-partner-acme: no cluster-wide Cilium policy denies egress by default for "
        "tenant-partner-acme (namespaced policies can be deleted by the tenant) [tenants: partner-acme]",
    ]


def test_allow_rule_into_another_tenant_is_caught(dev, oracles):
    rule = {"toEndpoints": [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "tenant-assistant"}}]}
    broken = variant(dev, lambda r: policy(r, "search")["egress"].append(rule))
    assert found(broken, oracles, "network-allow-rules") == [
        "network-allow-rules: CiliumClusterwideNetworkPolicy/tenant-search-isolation: allows egress of tenant search to tenant assistant's "
        "namespace tenant-assistant [tenants: assistant, search]"
    ]


def test_open_entities_and_selectors_spanning_namespaces_are_caught(dev, oracles):
    rules = [{"toEntities": ["cluster"]}, {"fromEndpoints": [{"matchLabels": {"app": "scraper"}}]}, {"toCIDR": ["169.254.0.0/16"]}]

    def change(r):
        policy(r, "search")["egress"] += [rules[0], rules[2]]
        policy(r, "search")["ingress"].append(rules[1])

    assert found(variant(dev, change), oracles, "network-allow-rules") == [
        "network-allow-rules: CiliumClusterwideNetworkPolicy/tenant-search-isolation: allows egress of tenant search to 169.254.0.0/16, "
        "which covers the cloud metadata address [tenants: search]",
        "network-allow-rules: CiliumClusterwideNetworkPolicy/tenant-search-isolation: allows egress of tenant search to entity 'cluster' "
        "[tenants: search]",
        "network-allow-rules: CiliumClusterwideNetworkPolicy/tenant-search-isolation: allows ingress of tenant search from pods of every "
        "namespace (selector without a namespace) [tenants: search]",
    ]


def test_empty_namespace_selector_in_a_tenant_network_policy_is_caught(dev, oracles):
    netpol = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta("open", "tenant-search", "search"),
        "spec": {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}], "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ai-factory.io/tenant": "assistant"}}}]}]},
    }
    assert found(variant(dev, lambda r: add(r, netpol, "search")), oracles, "network-allow-rules") == [
        "network-allow-rules: NetworkPolicy/tenant-search/open: allows egress of tenant search to tenant assistant's namespace "
        "tenant-assistant [tenants: assistant, search]",
        "network-allow-rules: NetworkPolicy/tenant-search/open: allows ingress of tenant search from every namespace (empty "
        "namespaceSelector) [tenants: search]",
    ]


# --------------------------------------------------------------------------- D. quotas


def test_quota_missing_a_mig_resource_is_caught(dev, oracles):
    def change(r):
        (quota,) = [m.obj for m in r.manifests if m.kind == "ResourceQuota" and m.namespace == "tenant-assistant"]
        del quota["spec"]["hard"]["requests.nvidia.com/mig-1g.10gb"]
        quota["spec"]["hard"]["services.nodeports"] = "3"

    assert found(variant(dev, change), oracles, "quota") == [
        "quota: ResourceQuota/tenant-assistant/tenant-quota: tenant assistant's quota allows 3 NodePort(s) [tenants: assistant]",
        "quota: ResourceQuota/tenant-assistant/tenant-quota: tenant assistant's quota does not cap requests.nvidia.com/mig-1g.10gb "
        "[tenants: assistant]",
    ]


def test_vcluster_chart_quota_missing_a_gpu_resource_is_caught(dev, oracles):
    def change(r):
        values = find(r, "HelmRelease", "vcluster-partner-acme")["spec"]["values"]
        hard = dict(find_quota(r, "tenant-partner-acme"))
        del hard["requests.nvidia.com/gpumem"]
        values["policies"]["resourceQuota"] = {"enabled": True, "quota": hard}

    assert found(variant(dev, change), oracles, "vcluster-hardening") == [
        "vcluster-hardening: HelmRelease/tenant-partner-acme/vcluster-partner-acme: its chart quota does not cap "
        "requests.nvidia.com/gpumem [tenants: partner-acme]"
    ]


def find_quota(rendered: Rendered, namespace: str) -> dict:
    (quota,) = [m.obj for m in rendered.manifests if m.kind == "ResourceQuota" and m.namespace == namespace]
    return quota["spec"]["hard"]


# --------------------------------------------------------------------------- E. GPU placement


def test_untrusted_tenant_placed_on_a_shared_gpu_node_is_caught(dev, oracles):
    def change(r):
        node = find(r, "Node", "a100-mig-000")
        node["metadata"]["labels"]["ai-factory.io/trust-domain"] = "partner-acme"
        node["spec"]["taints"] = [{"key": "ai-factory.io/trust-domain", "value": "partner-acme", "effect": "NoSchedule"}]

    assert found(variant(dev, change), oracles, "gpu-placement") == [
        "gpu-placement: Node/a100-mig-000: untrusted tenant partner-acme is placed on a shared-GPU node (MIG, HAMi or time-slicing) "
        "[tenants: partner-acme]"
    ]


def test_tenant_tolerating_another_trust_domain_is_caught(dev, oracles):
    def change(r):
        annotations = find(r, "Namespace", "tenant-partner-acme")["metadata"]["annotations"]
        allowed = json.loads(annotations[TOLERATIONS_WHITELIST_ANNOTATION])
        allowed.append({"key": "ai-factory.io/trust-domain", "operator": "Equal", "value": "internal", "effect": "NoSchedule"})
        annotations[TOLERATIONS_WHITELIST_ANNOTATION] = json.dumps(allowed)

    assert found(variant(dev, change), oracles, "gpu-placement") == [
        "gpu-placement: Namespace/tenant-partner-acme: tenant partner-acme (domain partner-acme) may tolerate the shared-GPU nodes of trust "
        "domain internal [tenants: partner-acme, search]",
        "gpu-placement: Namespace/tenant-partner-acme: untrusted tenant partner-acme may tolerate shared-GPU nodes "
        "(ai-factory.io/trust-domain) [tenants: partner-acme]",
    ]


def drop_kyverno_rule(rendered: Rendered, tenant: str, rule: str) -> None:
    spec = find(rendered, "ClusterPolicy", f"tenant-{tenant}-admission")["spec"]
    assert rule in [r["name"] for r in spec["rules"]]
    spec["rules"] = [r for r in spec["rules"] if r["name"] != rule]


def test_untrusted_tenant_not_pinned_to_its_dedicated_nodes_is_caught(dev, oracles):
    def change(r):
        find(r, "Namespace", "tenant-partner-acme")["metadata"]["annotations"].pop(NODE_SELECTOR_ANNOTATION)
        drop_kyverno_rule(r, "partner-acme", "dedicated-nodes")
        del find(r, "Node", "gpu-h100-01")["spec"]["taints"]

    assert found(variant(dev, change), oracles, "gpu-placement") == [
        "gpu-placement: Namespace/tenant-partner-acme: untrusted tenant partner-acme's pods are not pinned to its dedicated nodes "
        "(scheduler.alpha.kubernetes.io/node-selector or a Kyverno rule) [tenants: partner-acme]",
        "gpu-placement: Node/gpu-h100-01: node dedicated to tenant partner-acme is not tainted for it: other tenants' pods can land "
        "there [tenants: partner-acme]",
    ]


def test_tenant_without_a_toleration_whitelist_is_caught(dev, oracles):
    def change(r):
        find(r, "Namespace", "tenant-search")["metadata"]["annotations"].pop(TOLERATIONS_WHITELIST_ANNOTATION)
        drop_kyverno_rule(r, "search", "placement-tolerations")

    assert found(variant(dev, change), oracles, "gpu-placement") == [
        "gpu-placement: Namespace/tenant-search: no toleration whitelist (scheduler.alpha.kubernetes.io/tolerationsWhitelist or a Kyverno "
        "rule): tenant search's pods may tolerate any node's taints [tenants: search]"
    ]


def test_either_the_plugin_annotations_or_the_kyverno_rules_place_a_tenant(dev, oracles):
    # Without the PodNodeSelector / PodTolerationRestriction annotations (plugins not enabled, as
    # on most managed services), the tenant's Kyverno rules are the enforcement: dev stays clean.
    def without_annotations(r):
        annotations = find(r, "Namespace", "tenant-partner-acme")["metadata"]["annotations"]
        for key in (NODE_SELECTOR_ANNOTATION, TOLERATIONS_WHITELIST_ANNOTATION, DEFAULT_TOLERATIONS_ANNOTATION):
            annotations.pop(key)

    assert found(variant(dev, without_annotations), oracles, "gpu-placement") == []

    # ... and without the Kyverno rules the annotations still are.
    def without_kyverno(r):
        for rule in ("dedicated-nodes", "placement-tolerations"):
            drop_kyverno_rule(r, "partner-acme", rule)

    assert found(variant(dev, without_kyverno), oracles, "gpu-placement") == []

    # Neither: a low-trust tenant's pods can go anywhere.
    def neither(r):
        without_annotations(r)
        without_kyverno(r)

    assert found(variant(dev, neither), oracles, "gpu-placement") == [
        "gpu-placement: Namespace/tenant-partner-acme: no toleration whitelist (scheduler.alpha.kubernetes.io/tolerationsWhitelist or a "
        "Kyverno rule): tenant partner-acme's pods may tolerate any node's taints [tenants: partner-acme]",
        "gpu-placement: Namespace/tenant-partner-acme: untrusted tenant partner-acme's pods are not pinned to its dedicated nodes "
        "(scheduler.alpha.kubernetes.io/node-selector or a Kyverno rule) [tenants: partner-acme]",
    ]


def test_kyverno_rule_allowing_another_trust_domain_or_in_audit_mode_is_caught(dev, oracles):
    def foreign(r):
        without = find(r, "Namespace", "tenant-partner-acme")["metadata"]["annotations"]
        without.pop(TOLERATIONS_WHITELIST_ANNOTATION)
        (rule,) = [x for x in find(r, "ClusterPolicy", "tenant-partner-acme-admission")["spec"]["rules"] if x["name"] == "placement-tolerations"]
        rule["validate"]["foreach"][0]["deny"]["conditions"]["any"][1]["value"].append("ai-factory.io/trust-domain=internal")

    assert found(variant(dev, foreign), oracles, "gpu-placement") == [
        "gpu-placement: Namespace/tenant-partner-acme: tenant partner-acme (domain partner-acme) may tolerate the shared-GPU nodes of trust "
        "domain internal [tenants: partner-acme, search]",
        "gpu-placement: Namespace/tenant-partner-acme: untrusted tenant partner-acme may tolerate shared-GPU nodes "
        "(ai-factory.io/trust-domain) [tenants: partner-acme]",
    ]

    def audit(r):
        find(r, "Namespace", "tenant-partner-acme")["metadata"]["annotations"].pop(NODE_SELECTOR_ANNOTATION)
        (rule,) = [x for x in find(r, "ClusterPolicy", "tenant-partner-acme-admission")["spec"]["rules"] if x["name"] == "dedicated-nodes"]
        rule["validate"]["failureAction"] = "Audit"

    assert found(variant(dev, audit), oracles, "gpu-placement") == [
        "gpu-placement: Namespace/tenant-partner-acme: untrusted tenant partner-acme's pods are not pinned to its dedicated nodes "
        "(scheduler.alpha.kubernetes.io/node-selector or a Kyverno rule) [tenants: partner-acme]"
    ]


# --------------------------------------------------------------------------- vCluster and H. deletion safety


def test_vcluster_loosened_is_caught(dev, oracles):
    def change(r):
        values = find(r, "HelmRelease", "vcluster-assistant")["spec"]["values"]
        values["sync"]["toHost"]["namespaces"]["enabled"] = True
        values["policies"]["networkPolicy"]["enabled"] = True
        values["policies"]["podSecurityStandard"] = "privileged"
        values["controlPlane"]["distro"]["k8s"]["apiServer"]["extraArgs"] = []

    assert found(variant(dev, change), oracles, "vcluster-hardening") == [
        f"vcluster-hardening: HelmRelease/tenant-assistant/vcluster-assistant: {problem} [tenants: assistant]"
        for problem in (
            "its API server lacks --oidc-client-id=",
            "its API server lacks --oidc-groups-prefix=oidc:",
            "its API server lacks --oidc-issuer-url=",
            "its API server lacks --oidc-username-prefix=oidc:",
            "its Pod Security standard is 'privileged', not the namespace's 'restricted'",
            "its chart network policy is on: it admits pods of every namespace (`app: loft`) and every pod on 8443",
            "syncs namespaces to the host",
        )
    ]


def test_vclusters_sharing_an_oidc_audience_are_caught(dev, oracles):
    def change(r):
        for tenant in ("assistant", "partner-acme"):
            args = find(r, "HelmRelease", f"vcluster-{tenant}")["spec"]["values"]["controlPlane"]["distro"]["k8s"]["apiServer"]["extraArgs"]
            args[:] = ["--oidc-client-id=kubernetes" if a.startswith("--oidc-client-id=") else a for a in args]

    assert found(variant(dev, change), oracles, "vcluster-hardening") == [
        f"vcluster-hardening: HelmRelease/tenant-{tenant}/vcluster-{tenant}: its API server accepts the same OIDC client as tenant "
        f"{other}'s (--oidc-client-id=kubernetes): a token for one works on the other [tenants: assistant, partner-acme]"
        for tenant, other in (("assistant", "partner-acme"), ("partner-acme", "assistant"))
    ]


def test_unprotected_tenant_namespace_is_caught(dev, oracles):
    def change(r):
        (entry,) = [e for e in r.inventory if e["type"] == "kubernetes:core/v1:Namespace" and e["tenant"] == "search"]
        entry["protect"] = False

    assert found(variant(dev, change), oracles, "tenant-protection") == [
        "tenant-protection: Namespace/tenant-search: tenant search's namespace (ai-factory-tenant-search-namespace) is not protected and retained on "
        "delete [tenants: search]"
    ]
