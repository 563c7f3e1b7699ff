"""`factory check`'s isolation analysis: clean on dev and on 30 tenants of mixed trust; each check
fails on a deliberately broken variant, naming the check, the object and the tenants."""

from __future__ import annotations

import copy
import json

import pytest

from ai_factory.components.tenant_stack import DEFAULT_TOLERATIONS_ANNOTATION, NODE_SELECTOR_ANNOTATION, OWNERS_ANNOTATION, TOLERATIONS_WHITELIST_ANNOTATION
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
