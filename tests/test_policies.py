"""Each policy of the CrossGuard pack stays quiet on dev and fires on a broken stack: the real
program with a broken config or component where the config can express the break, otherwise a
small stack of real resources registered under mocks (tests/policy_stacks.py). Every violating
stack also holds a compliant resource that must not be reported."""

from __future__ import annotations

import json

import pulumi
import pulumi_kubernetes as k8s
import pytest
from pulumi_policy import PolicyResource
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, UnknownValueError, unknown_checking_proxy

import ai_factory.components.fleet
import ai_factory.components.gpu_operator
import ai_factory.components.kueue
import ai_factory.components.openbao
import ai_factory.components.tenant_stack
from ai_factory.components.tenant_stack import POD_SECURITY_EXCEPTION_ANNOTATION
from ai_factory.factory.planning.placement import DEDICATED_LABEL, DEVICE_PLUGIN_CONFIG_LABEL, DEVICE_PLUGIN_DEPLOY_LABEL, MIG_CONFIG_LABEL, POOL_LABEL, NodePlacement
from ai_factory.factory.planning.quotas import SUPPLY_ANNOTATION
from ai_factory.factory.model.tenancy import TENANT_LABEL, TRUST_DOMAIN_LABEL
from ai_factory.policies.aif_policies import POLICIES
from ai_factory.policies.aif_policies import admission as admission_policies
from ai_factory.policies.aif_policies import gpu as gpu_policies
from ai_factory.policies.aif_policies import security as security_policies
from ai_factory.factory.checking.unknowns import lazy_unknown_checking_proxy
from ai_factory.policies.aif_policies.kube import Cluster, known
from tests.conftest import render, without_models
from tests.policy_stacks import (
    all_violations,
    custom,
    deployment,
    group,
    namespace,
    node,
    release,
    role_binding,
    stack,
    tenant_labels,
    violations,
)

NAMES = [p.name for p in POLICIES]


@pytest.fixture(scope="module")
def dev_violations(dev) -> dict[str, dict[str, list[str]]]:
    return all_violations(dev)


@pytest.mark.parametrize("policy", NAMES)
def test_dev_passes_the_policy(dev_violations, policy):
    assert dev_violations.get(policy, {}) == {}


# --------------------------------------------------------------------------- tenancy


def test_tenant_object_without_its_tenant_label_is_reported():
    def program():
        namespace("tenant-a", tenant="a")
        k8s.core.v1.ConfigMap("labelled", metadata={"name": "labelled", "namespace": "tenant-a", "labels": {TENANT_LABEL: "a"}})
        k8s.core.v1.ConfigMap("unlabelled", metadata={"name": "unlabelled", "namespace": "tenant-a"})
        k8s.core.v1.ConfigMap("mislabelled", metadata={"name": "mislabelled", "namespace": "tenant-a", "labels": {TENANT_LABEL: "b"}})
        owner = pulumi.ComponentResource("ai-factory:tenancy:TenantStack", "a")
        k8s.rbac.v1.ClusterRole("orphan", metadata={"name": "orphan"}, rules=[], opts=pulumi.ResourceOptions(parent=owner))

    found = violations(stack(program), "tenant-objects-labelled")
    assert set(found) == {
        "kubernetes:core/v1:ConfigMap::unlabelled",
        "kubernetes:core/v1:ConfigMap::mislabelled",
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole::orphan",
    }
    assert "has no ai-factory.io/tenant label" in found["kubernetes:core/v1:ConfigMap::unlabelled"][0]
    assert "label says 'b'" in found["kubernetes:core/v1:ConfigMap::mislabelled"][0]
    assert "created by a TenantStack" in found["kubernetes:rbac.authorization.k8s.io/v1:ClusterRole::orphan"][0]


def cross_tenant_stack():
    namespace("tenant-a", tenant="a", owners=("a-admins",))
    namespace("tenant-b", tenant="b", trust="medium", owners=("b-admins",))
    namespace("kueue-system", level="restricted")
    labels = tenant_labels("a")
    role_binding("own", "tenant-a", ("Role", "tenant-admin"), [group("a-admins")], labels)
    role_binding("foreign-group", "tenant-a", ("Role", "tenant-admin"), [group("b-admins")], labels)
    role_binding("foreign-account", "tenant-a", ("Role", "tenant-admin"), [{"kind": "ServiceAccount", "name": "default", "namespace": "tenant-b"}], labels)
    role_binding("platform-controller", "tenant-a", ("Role", "tenant-admin"), [{"kind": "ServiceAccount", "name": "kueue", "namespace": "kueue-system"}], labels)
    role_binding("everyone", "tenant-a", ("Role", "tenant-admin"), [{"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"}], labels)
    role_binding("foreign-accounts", "tenant-a", ("Role", "tenant-admin"), [{"kind": "Group", "name": "system:serviceaccounts:tenant-b", "apiGroup": "rbac.authorization.k8s.io"}], labels)
    role_binding("into-platform", "kueue-system", ("Role", "reader"), [group("a-admins")])
    k8s.rbac.v1.Role("tenant-admin", metadata={"name": "tenant-admin", "namespace": "tenant-a", "labels": labels}, rules=[])


def test_rolebinding_to_another_tenants_subject_is_reported():
    found = violations(stack(cross_tenant_stack), "no-cross-tenant-rbac")
    rb = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding::"
    assert set(found) == {rb + "foreign-group", rb + "foreign-account", rb + "foreign-accounts", rb + "everyone", rb + "into-platform"}
    assert "Group system:authenticated, that is every user," in found[rb + "everyone"][0]
    assert "Group oidc:b-admins, a subject of tenant(s) b" in found[rb + "foreign-group"][0]
    assert "ServiceAccount tenant-b/default" in found[rb + "foreign-account"][0]
    assert "namespace kueue-system of the platform" in found[rb + "into-platform"][0]


def test_platform_subjects_setting_exempts_a_group_bound_for_several_tenants():
    found = violations(stack(cross_tenant_stack), "no-cross-tenant-rbac", {"no-cross-tenant-rbac": {"platformSubjects": ["oidc:b-admins"]}})
    assert "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding::foreign-group" not in found


def test_cluster_role_binding_to_a_tenant_subject_is_reported():
    def program():
        namespace("tenant-a", tenant="a", trust="medium", owners=("a-admins",))  # a vCluster tenant: owners only on its namespace
        for name, subjects, labels in (
            ("platform-admins", [group("platform-admins")], {}),
            ("tenant-group", [group("a-admins")], {}),
            ("tenant-account", [{"kind": "ServiceAccount", "name": "runner", "namespace": "tenant-a"}], {}),
            ("tenant-owned", [], tenant_labels("a")),
        ):
            k8s.rbac.v1.ClusterRoleBinding(
                name,
                metadata={"name": name, "labels": labels},
                role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                subjects=subjects,
            )

    found = violations(stack(program), "no-cluster-scoped-tenant-grants")
    crb = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding::"
    assert set(found) == {crb + "tenant-group", crb + "tenant-account", crb + "tenant-owned"}
    assert "to Group oidc:a-admins of tenant(s) a" in found[crb + "tenant-group"][0]


def test_tenant_role_that_can_edit_its_quota_is_reported(raw, monkeypatch):
    rules = ai_factory.components.tenant_stack.TENANT_ADMIN_RULES + (("", ("resourcequotas",), ("patch",)),)
    monkeypatch.setattr(ai_factory.components.tenant_stack, "TENANT_ADMIN_RULES", rules)
    found = violations(render(raw), "tenant-cannot-edit-isolation")
    assert list(found) == ["kubernetes:rbac.authorization.k8s.io/v1:RoleBinding::ai-factory-tenant-search-admin-binding"]
    assert "lets Group oidc:search-admins of tenant 'search' patch resourcequotas through Role tenant-admin" in found[
        "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding::ai-factory-tenant-search-admin-binding"
    ][0]


def test_tenant_bound_to_builtin_edit_or_an_unknown_role_is_reported():
    def program():
        namespace("tenant-a", tenant="a", owners=("a-admins",))
        labels = tenant_labels("a")
        k8s.rbac.v1.Role("reader", metadata={"name": "reader", "namespace": "tenant-a", "labels": labels},
                         rules=[{"apiGroups": [""], "resources": ["pods", "resourcequotas"], "verbs": ["get", "list"]}])
        k8s.rbac.v1.Role("escalator", metadata={"name": "escalator", "namespace": "tenant-a", "labels": labels},
                         rules=[{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]}])
        role_binding("reads", "tenant-a", ("Role", "reader"), [group("a-admins")], labels)
        role_binding("edits", "tenant-a", ("ClusterRole", "edit"), [group("a-admins")], labels)
        role_binding("escalates", "tenant-a", ("Role", "escalator"), [group("a-admins")], labels)
        role_binding("unknown", "tenant-a", ("ClusterRole", "somebody-elses"), [group("a-admins")], labels)

    found = violations(stack(program), "tenant-cannot-edit-isolation")
    rb = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding::"
    assert set(found) == {rb + "edits", rb + "escalates", rb + "unknown"}
    assert "networkpolicies.networking.k8s.io" in found[rb + "edits"][0]
    assert "escalate roles" in found[rb + "escalates"][0]
    assert "which this stack does not define" in found[rb + "unknown"][0]


# --------------------------------------------------------------------------- GPU sharing


@pytest.fixture
def broken_fleet(monkeypatch):
    """Patch the fleet layer's placements with `edit(placement) -> placement`."""

    def patch(edit):
        real = ai_factory.components.fleet.node_placements
        monkeypatch.setattr(ai_factory.components.fleet, "node_placements", lambda plan: [edit(p) for p in real(plan)])

    return patch


def test_shared_gpu_node_without_its_trust_domain_taint_is_reported(raw, broken_fleet):
    broken_fleet(lambda p: NodePlacement(p.node, p.pool, p.labels, ()))
    found = violations(render(raw), "gpu-no-cross-domain-sharing")
    assert set(found) == {f"kubernetes:core/v1:NodePatch::ai-factory-fleet-node-{n}" for n in ("a100-mig-000", "a100-mig-001", "l40s-infer-000", "l40s-infer-001")}
    assert "is not tainted ai-factory.io/trust-domain=assistant:NoSchedule" in found["kubernetes:core/v1:NodePatch::ai-factory-fleet-node-a100-mig-000"][0]


def test_shared_gpus_reachable_from_another_trust_domain_are_reported():
    def program():
        namespace("tenant-a", tenant="a", domain="red")
        namespace("tenant-b", tenant="b", domain="blue")
        taint = lambda d: [{"key": TRUST_DOMAIN_LABEL, "value": d, "effect": "NoSchedule"}]  # noqa: E731
        node("mig-red", {POOL_LABEL: "mig", MIG_CONFIG_LABEL: "layout", TRUST_DOMAIN_LABEL: "red"}, taint("red"))
        node("mig-blue", {POOL_LABEL: "mig", MIG_CONFIG_LABEL: "layout", TRUST_DOMAIN_LABEL: "blue"}, taint("blue"))
        custom("mig-red", "ResourceFlavor", {"nodeLabels": {POOL_LABEL: "mig", TRUST_DOMAIN_LABEL: "red"}})
        custom("mig-any", "ResourceFlavor", {"nodeLabels": {POOL_LABEL: "mig"}})
        group_of = lambda flavor: [{"coveredResources": ["nvidia.com/mig-1g.10gb"], "flavors": [{"name": flavor, "resources": [{"name": "nvidia.com/mig-1g.10gb", "nominalQuota": 1}]}]}]  # noqa: E731
        custom("tenant-a", "ClusterQueue", {"namespaceSelector": {"matchLabels": {TENANT_LABEL: "a"}}, "resourceGroups": group_of("mig-red")})
        custom("tenant-b", "ClusterQueue", {"namespaceSelector": {"matchLabels": {TENANT_LABEL: "b"}}, "resourceGroups": group_of("mig-red")})
        custom("spill", "Cohort", {"resourceGroups": group_of("mig-any")})
        sliced = "version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]\n"
        release("gpu-operator", "gpu-operator", "gpu-operator", {"devicePlugin": {"config": {"data": {"sliced-4": sliced, "default": "version: v1\n"}}}},
                version="v26.7.0", repo="https://helm.ngc.nvidia.com/nvidia")
        node("sliced", {POOL_LABEL: "l4", DEVICE_PLUGIN_CONFIG_LABEL: "sliced-4"})
        node("plain", {POOL_LABEL: "l4", DEVICE_PLUGIN_CONFIG_LABEL: "default"})

    found = violations(stack(program), "gpu-no-cross-domain-sharing")
    assert set(found) == {
        "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue::clusterqueue-tenant-b",
        "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor::resourceflavor-mig-any",
        "kubernetes:core/v1:NodePatch::node-sliced",
    }
    assert "shares its GPUs (time-slicing config sliced-4) but has no ai-factory.io/trust-domain label" in found["kubernetes:core/v1:NodePatch::node-sliced"][0]
    assert "admits tenant 'b' (trust domain 'blue') to ResourceFlavor mig-red" in found["kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue::clusterqueue-tenant-b"][0]
    assert "trust domains blue, red" in found["kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor::resourceflavor-mig-any"][0]


def test_low_trust_tenant_on_shared_or_foreign_gpus_is_reported():
    def program():
        namespace("tenant-acme", tenant="acme", trust="low")
        k8s.core.v1.ResourceQuota(
            "acme-quota",
            metadata={"name": "quota", "namespace": "tenant-acme", "labels": tenant_labels("acme", "low")},
            spec={"hard": {"requests.nvidia.com/gpu": "8", "requests.nvidia.com/mig-1g.10gb": "2", "requests.nvidia.com/gpumem": "0"}},
        )
        dedicated = [{"key": DEDICATED_LABEL, "value": "acme", "effect": "NoSchedule"}]
        node("h100-1", {POOL_LABEL: "h100", DEDICATED_LABEL: "acme"}, dedicated)
        node("h100-2", {POOL_LABEL: "h100"})
        node("h100-3", {POOL_LABEL: "h100-spare", DEDICATED_LABEL: "acme"})  # dedicated but not tainted
        node("mig-1", {POOL_LABEL: "mig", MIG_CONFIG_LABEL: "layout", TRUST_DOMAIN_LABEL: "acme"}, [{"key": TRUST_DOMAIN_LABEL, "value": "acme", "effect": "NoSchedule"}])
        custom("h100-acme", "ResourceFlavor", {"nodeLabels": {POOL_LABEL: "h100", DEDICATED_LABEL: "acme"}})
        custom("h100-all", "ResourceFlavor", {"nodeLabels": {POOL_LABEL: "h100"}})
        custom("mig-acme", "ResourceFlavor", {"nodeLabels": {POOL_LABEL: "mig"}})
        gpus = lambda flavor, resource: {"coveredResources": [resource], "flavors": [{"name": flavor, "resources": [{"name": resource, "nominalQuota": 1}]}]}  # noqa: E731
        for name, flavor, resource in (("own", "h100-acme", "nvidia.com/gpu"), ("foreign", "h100-all", "nvidia.com/gpu"), ("shared", "mig-acme", "nvidia.com/mig-1g.10gb")):
            custom(f"acme-{name}", "ClusterQueue", {"namespaceSelector": {"matchLabels": {TENANT_LABEL: "acme"}}, "resourceGroups": [gpus(flavor, resource)]})

    found = violations(stack(program), "low-trust-whole-gpus")
    cq = "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue::clusterqueue-acme-"
    assert set(found) == {
        "kubernetes:core/v1:ResourceQuota::acme-quota",
        cq + "foreign",
        cq + "shared",
        "kubernetes:core/v1:NodePatch::node-mig-1",
        "kubernetes:core/v1:NodePatch::node-h100-3",
    }
    assert "2 of nvidia.com/mig-1g.10gb" in found["kubernetes:core/v1:ResourceQuota::acme-quota"][0]
    assert "not dedicated to it (h100-2)" in found[cq + "foreign"][0]
    assert "is not tainted ai-factory.io/dedicated=acme" in found["kubernetes:core/v1:NodePatch::node-h100-3"][0]


MIG_FILE = """
version: v1
mig-configs:
  legal:
    - device-filter: ["0x20B210DE"]
      devices: [0, 1]
      mig-enabled: true
      mig-devices: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
    - device-filter: ["0x20B210DE"]
      devices: [2]
      mig-enabled: false
  three-halves:
    - device-filter: ["0x20B210DE"]
      devices: [0]
      mig-enabled: true
      mig-devices: {"3g.40gb": 3}
  unfiltered:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  wrong-model:
    - device-filter: ["0x233010DE"]
      devices: [0]
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
"""


def test_illegal_mig_layouts_are_reported():
    def program():
        k8s.core.v1.ConfigMap("mig-parted", metadata={"name": "mig-parted", "namespace": "gpu-operator"}, data={"config.yaml": MIG_FILE})

    messages = violations(stack(program), "mig-layouts-legal")["kubernetes:core/v1:ConfigMap::mig-parted"]
    assert len(messages) == 3 and not any("'legal'" in m for m in messages)
    three, unfiltered, wrong = sorted(messages)
    assert "'three-halves'" in three and "3g.40gb x3 does not fit on one A100-80GB (compute 9/7, memory 12/8" in three
    assert "'unfiltered'" in unfiltered and "has no device-filter" in unfiltered
    assert "'wrong-model'" in wrong and "no MIG profile '1g.5gb'" in wrong


def test_hami_node_also_served_by_the_nvidia_device_plugin_is_reported(raw, broken_fleet):
    def keep_device_plugin(p: NodePlacement) -> NodePlacement:
        return NodePlacement(p.node, p.pool, {k: v for k, v in p.labels.items() if k != DEVICE_PLUGIN_DEPLOY_LABEL}, p.taints)

    broken_fleet(keep_device_plugin)
    found = violations(render(raw), "hami-device-plugin-disjoint")
    assert set(found) == {"kubernetes:core/v1:NodePatch::ai-factory-fleet-node-l40s-infer-000", "kubernetes:core/v1:NodePatch::ai-factory-fleet-node-l40s-infer-001"}
    assert "label it nvidia.com/gpu.deploy.device-plugin=false" in found["kubernetes:core/v1:NodePatch::ai-factory-fleet-node-l40s-infer-000"][0]


def test_gpu_namespace_outside_a_queue_is_reported(raw, monkeypatch):
    real = ai_factory.components.kueue.manager_config

    def without_default_queueing(*args, **kwargs):
        return {k: v for k, v in real(*args, **kwargs).items() if k != "manageJobsWithoutQueueName"}

    monkeypatch.setattr(ai_factory.components.kueue, "manager_config", without_default_queueing)
    monkeypatch.setattr(ai_factory.components.kueue.KueueTenantHook, "attach", lambda self, stack, tenant, names: None)
    found = violations(render(raw), "gpu-namespaces-queued")
    assert set(found) == {
        "kubernetes:helm.sh/v3:Release::ai-factory-kueue-release-kueue",
        *(f"kubernetes:core/v1:Namespace::ai-factory-tenant-{t}-namespace" for t in ("search", "assistant", "partner-acme")),
    }
    assert "jobs without a queue name bypass Kueue" in found["kubernetes:helm.sh/v3:Release::ai-factory-kueue-release-kueue"][0]
    assert "has no Kueue LocalQueue" in found["kubernetes:core/v1:Namespace::ai-factory-tenant-search-namespace"][0]


def test_tenants_queued_by_kai_scheduler_instead_of_kueue_pass(raw):
    raw["layers"]["kueue"] = {"enabled": False}
    raw["layers"]["kai_scheduler"] = {"enabled": True}
    without_models(raw)
    raw["fleet"]["pools"][2] = {**raw["fleet"]["pools"][2], "sharing": "exclusive"}  # HAMi needs Kueue
    raw["tenants"][1]["gpus"][1] = {"pool": "l40s-infer", "count": 2}
    rendered = render(raw)
    assert any(r.type == "kubernetes:scheduling.run.ai/v2:Queue" for r in rendered.graph.resources)
    assert violations(rendered, "gpu-namespaces-queued") == {}


def test_local_queue_on_a_queue_that_does_not_select_its_namespace_is_reported():
    def program():
        namespace("tenant-a", tenant="a")
        namespace("tenant-idle", tenant="idle")
        k8s.core.v1.ResourceQuota("idle-quota", metadata={"name": "quota", "namespace": "tenant-idle", "labels": tenant_labels("idle")},
                                  spec={"hard": {"requests.nvidia.com/gpu": "0", "requests.cpu": "4"}})
        custom("tenant-b", "ClusterQueue", {"namespaceSelector": {"matchLabels": {TENANT_LABEL: "b"}}})
        custom("default", "LocalQueue", {"clusterQueue": "tenant-b"}, namespace_name="tenant-a", labels=tenant_labels("a"))

    found = violations(stack(program), "gpu-namespaces-queued")
    assert list(found) == ["kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue::localqueue-default"]
    assert "whose namespaceSelector does not select tenant-a" in found["kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue::localqueue-default"][0]


def test_queue_quotas_above_a_flavors_supply_are_reported():
    def program():
        namespace("tenant-a", tenant="a", domain="internal")
        namespace("tenant-b", tenant="b", domain="internal")
        namespace("tenant-c", tenant="c", domain="inference")
        supply = lambda s: {SUPPLY_ANNOTATION: s}  # noqa: E731
        internal, inference = {TRUST_DOMAIN_LABEL: "internal"}, {TRUST_DOMAIN_LABEL: "inference"}
        custom("h100", "ResourceFlavor", {"nodeLabels": {POOL_LABEL: "h100"}}, labels=internal, annotations=supply('{"nvidia.com/gpu": 8}'))
        custom("l40s", "ResourceFlavor", {"nodeLabels": {POOL_LABEL: "l40s"}}, labels=inference, annotations=supply('{"nvidia.com/gpu": 4}'))
        # The annotation claims 8 instances; the node's mig-parted layout makes 2 GPUs x 1.
        custom("mig", "ResourceFlavor", {"nodeLabels": {POOL_LABEL: "mig"}}, annotations=supply('{"nvidia.com/mig-3g.40gb": 8}'))
        node("mig-1", {POOL_LABEL: "mig", MIG_CONFIG_LABEL: "halves"})
        k8s.core.v1.ConfigMap("mig-parted", metadata={"name": "mig-parted", "namespace": "gpu-operator"}, data={"config.yaml": (
            "version: v1\nmig-configs:\n  halves:\n    - device-filter: ['0x20B210DE']\n      devices: [0, 1]\n"
            "      mig-enabled: true\n      mig-devices: {'3g.40gb': 1}\n")})

        def queue(name, flavor, resource, amount):
            groups = [{"coveredResources": [resource], "flavors": [{"name": flavor, "resources": [{"name": resource, "nominalQuota": amount}]}]}]
            custom(name, "ClusterQueue", {"namespaceSelector": {"matchLabels": {TENANT_LABEL: name}}, "resourceGroups": groups})

        queue("a", "h100", "nvidia.com/gpu", 6)
        queue("b", "h100", "nvidia.com/gpu", 4)
        queue("c", "l40s", "nvidia.com/gpu", 4)
        queue("d", "mig", "nvidia.com/mig-3g.40gb", 3)

        def quota(tenant, domain, gpus):
            k8s.core.v1.ResourceQuota(f"{tenant}-quota", metadata={"name": "quota", "namespace": f"tenant-{tenant}", "labels": tenant_labels(tenant, domain=domain)},
                                      spec={"hard": {"requests.nvidia.com/gpu": str(gpus)}})

        # Ceilings (grant plus borrowing): a and b may each reach all 8 of their domain's H100s, 16
        # in total on 12 GPUs in the fleet, and that is fine; c's 6 exceeds its domain's 4 L40S.
        quota("a", "internal", 8)
        quota("b", "internal", 8)
        quota("c", "inference", 6)

    found = violations(stack(program), "gpu-quota-within-supply")
    assert set(found) == {
        "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor::resourceflavor-h100",
        "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor::resourceflavor-mig",
        "kubernetes:core/v1:ResourceQuota::c-quota",
    }
    assert "queues promise 10 nvidia.com/gpu (ClusterQueue a: 6, ClusterQueue b: 4) but its nodes supply 8" in found[
        "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor::resourceflavor-h100"][0]
    assert "promise 3 nvidia.com/mig-3g.40gb (ClusterQueue d: 3) but its nodes supply 2" in found[
        "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor::resourceflavor-mig"][0]
    assert "ResourceQuota tenant-c/quota of tenant 'c' allows 6 nvidia.com/gpu but the flavors of its trust domain 'inference' supply 4" in found[
        "kubernetes:core/v1:ResourceQuota::c-quota"][0]


# --------------------------------------------------------------------------- GPU sharing, table-driven
# Rows are small sets of PolicyResources (what CrossGuard hands a stack policy) and the resources
# a policy reports, each with a phrase of its message.

def res(kind: str, name: str, api: str = "core/v1", namespace: str | None = None, labels: dict | None = None, spec: dict | None = None,
        annotations: dict | None = None, **props) -> PolicyResource:
    metadata: dict = {"name": name, "labels": dict(labels or {})}
    if namespace:
        metadata["namespace"] = namespace
    if annotations:
        metadata["annotations"] = annotations
    body = {"metadata": metadata, **({"spec": spec} if spec is not None else {}), **props}
    return PolicyResource(f"kubernetes:{api}:{kind}", body, f"urn:pulumi:t::p::{kind}::{name}", name, None, None, None, [], {})


def chart(name: str, chart_name: str, values: dict, namespace: str | None = None, version: str = "1.0.0") -> PolicyResource:
    props = {"name": name, "chart": chart_name, "namespace": namespace or name, "version": version, "values": values}
    return PolicyResource("kubernetes:helm.sh/v3:Release", props, f"urn:pulumi:t::p::Release::{name}", name, None, None, None, [], {})


def tenant_space(tenant: str, trust: str = "high", domain: str | None = None) -> PolicyResource:
    return res("Namespace", f"tenant-{tenant}", labels=tenant_labels(tenant, trust, domain))


def gpu_node(name: str, labels: dict, *taints: tuple[str, str, str]) -> PolicyResource:
    return res("NodePatch", name, labels=labels, spec={"taints": [{"key": k, "value": v, "effect": e} for k, v, e in taints]})


def flavor_res(name: str, node_labels: dict, supply: dict | None = None, domain: str | None = None) -> PolicyResource:
    return res("ResourceFlavor", name, "kueue.x-k8s.io/v1beta2", labels={TRUST_DOMAIN_LABEL: domain} if domain else {}, spec={"nodeLabels": node_labels},
               annotations={SUPPLY_ANNOTATION: json.dumps(supply)} if supply is not None else None)


def queue_res(tenant: str, groups: list[tuple[list[str], str, dict]], kind: str = "ClusterQueue") -> PolicyResource:
    """groups: (covered resources, flavor, {resource: nominal quota})."""
    spec: dict = {"resourceGroups": [{"coveredResources": covered, "flavors": [{"name": f, "resources": [{"name": r, "nominalQuota": q} for r, q in quotas.items()]}]}
                                     for covered, f, quotas in groups]}
    if kind == "ClusterQueue":
        spec["namespaceSelector"] = {"matchLabels": {TENANT_LABEL: tenant}}
    return res(kind, f"q-{tenant}", "kueue.x-k8s.io/v1beta2", spec=spec)


def quota_res(tenant: str, hard: dict) -> PolicyResource:
    return res("ResourceQuota", f"quota-{tenant}", namespace=f"tenant-{tenant}", labels={TENANT_LABEL: tenant}, spec={"hard": hard})


def reported(check, *resources: PolicyResource) -> list[tuple[str, str]]:
    return sorted((r.name if r is not None else "stack", m) for r, m in check(list(resources), {}))


def assert_reports(found: list[tuple[str, str]], expected: list[tuple[str, str]]) -> None:
    """Exactly the expected resources are reported, each message holding its phrase."""
    assert [name for name, _ in found] == [name for name, _ in expected], found
    for (name, message), (_, phrase) in zip(found, expected):
        assert phrase in message, (name, message)


DOMAIN_TAINT = (TRUST_DOMAIN_LABEL, "red", "NoSchedule")
SLICED = "version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]\n"
SINGLE = "version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 1}]\n"
PAIRS = "version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n"
MPS = "version: v1\nsharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n"
MIG_PARTED = "version: v1\nmig-configs:\n  halves:\n    - devices: [1]\n      mig-enabled: false\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {3g.40gb: 2, 1g.10gb: 0}\n  whole:\n    - devices: all\n      mig-enabled: false\n"
OPERATOR = chart("gpu-operator", "gpu-operator", {"devicePlugin": {"config": {"data": {"sliced": SLICED, "pairs": PAIRS, "single": SINGLE, "mps": MPS}}}, "migManager": {"config": {"data": {"config.yaml": MIG_PARTED}}}})


@pytest.mark.parametrize(
    "labels, taints, expected",
    [
        pytest.param({}, [], [], id="whole-gpus"),
        pytest.param({MIG_CONFIG_LABEL: "halves", TRUST_DOMAIN_LABEL: "red"}, [DOMAIN_TAINT], [], id="mig-labelled-and-tainted"),
        pytest.param({MIG_CONFIG_LABEL: "halves", TRUST_DOMAIN_LABEL: "red"}, [(TRUST_DOMAIN_LABEL, "red", "NoExecute")], [], id="noexecute-taint"),
        pytest.param({MIG_CONFIG_LABEL: "halves", TRUST_DOMAIN_LABEL: "red"}, [(TRUST_DOMAIN_LABEL, "red", "PreferNoSchedule")], ["is not tainted ai-factory.io/trust-domain=red"], id="preference-taint"),
        pytest.param({MIG_CONFIG_LABEL: "halves", TRUST_DOMAIN_LABEL: "red"}, [(TRUST_DOMAIN_LABEL, "blue", "NoSchedule")], ["is not tainted ai-factory.io/trust-domain=red"], id="tainted-for-another-domain"),
        pytest.param({MIG_CONFIG_LABEL: "halves"}, [], ["shares its GPUs (MIG config halves) but has no ai-factory.io/trust-domain label"], id="mig-without-domain"),
        pytest.param({MIG_CONFIG_LABEL: "unknown"}, [], ["shares its GPUs (MIG config unknown)"], id="unknown-mig-config"),
        pytest.param({MIG_CONFIG_LABEL: "whole"}, [], [], id="mig-config-enabling-nothing"),
        pytest.param({MIG_CONFIG_LABEL: "all-disabled"}, [], [], id="mig-disabled"),
        pytest.param({"ai-factory.io/hami": "enabled"}, [], ["shares its GPUs (HAMi)"], id="hami-label"),
        pytest.param({"gpu": "on"}, [], ["shares its GPUs (HAMi)"], id="hami-default-node-selector"),
        pytest.param({DEVICE_PLUGIN_CONFIG_LABEL: "sliced"}, [], ["shares its GPUs (time-slicing config sliced)"], id="time-slices"),
        pytest.param({DEVICE_PLUGIN_CONFIG_LABEL: "mps"}, [], ["shares its GPUs (time-slicing config mps)"], id="mps"),
        pytest.param({DEVICE_PLUGIN_CONFIG_LABEL: "pairs"}, [], ["shares its GPUs (time-slicing config pairs)"], id="two-replicas"),
        pytest.param({DEVICE_PLUGIN_CONFIG_LABEL: "missing"}, [], ["shares its GPUs (time-slicing config missing)"], id="unknown-plugin-config"),
        pytest.param({DEVICE_PLUGIN_CONFIG_LABEL: "single"}, [], [], id="one-replica"),
    ],
)
def test_gpu_no_cross_domain_sharing_labels_and_taints_every_shared_node(labels, taints, expected):
    resources = (OPERATOR, chart("hami", "hami", {}), gpu_node("a-whole", {}), gpu_node("n", labels, *taints))
    assert_reports(reported(gpu_policies.check_gpu_no_cross_domain_sharing, *resources), [("n", e) for e in expected])


def test_gpu_no_cross_domain_sharing_keeps_flavors_and_queues_to_one_domain():
    resources = (
        OPERATOR, tenant_space("a", domain="red"), tenant_space("b", domain="blue"),
        gpu_node("red-1", {"pool": "mig", MIG_CONFIG_LABEL: "halves", TRUST_DOMAIN_LABEL: "red"}, DOMAIN_TAINT),
        gpu_node("blue-1", {"pool": "mig", MIG_CONFIG_LABEL: "halves", TRUST_DOMAIN_LABEL: "blue"}, (TRUST_DOMAIN_LABEL, "blue", "NoSchedule")),
        gpu_node("whole", {"pool": "h100"}),
        flavor_res("cpu", {}), flavor_res("mig-red", {"pool": "mig", TRUST_DOMAIN_LABEL: "red"}), flavor_res("mig-any", {"pool": "mig"}), flavor_res("h100", {"pool": "h100"}),
        queue_res("a", [(["cpu", "nvidia.com/mig-3g.40gb"], "mig-red", {"nvidia.com/mig-3g.40gb": 1}), (["cpu"], "cpu", {"cpu": 1})]),
        queue_res("b", [(["nvidia.com/mig-3g.40gb"], "mig-red", {"nvidia.com/mig-3g.40gb": 1}), (["nvidia.com/gpu"], "h100", {"nvidia.com/gpu": 1})]),
        queue_res("c", [(["cpu"], "mig-any", {"cpu": 1})]),
        res("ClusterQueue", "closed", "kueue.x-k8s.io/v1beta2", spec={"resourceGroups": [{"coveredResources": ["nvidia.com/mig-3g.40gb"], "flavors": [{"name": "mig-red"}]}]}),
    )
    assert_reports(reported(gpu_policies.check_gpu_no_cross_domain_sharing, *resources), [
        ("q-b", "admits tenant 'b' (trust domain 'blue') to ResourceFlavor mig-red, whose shared GPUs serve trust domain(s) red"),
    ])
    resources += (queue_res("d", [(["nvidia.com/mig-3g.40gb"], "mig-any", {"nvidia.com/mig-3g.40gb": 1})], kind="Cohort"),
                  gpu_node("loose", {"pool": "mig2", MIG_CONFIG_LABEL: "halves"}), gpu_node("red-2", {"pool": "mig2", MIG_CONFIG_LABEL: "halves", TRUST_DOMAIN_LABEL: "red"}, DOMAIN_TAINT),
                  flavor_res("mig2", {"pool": "mig2"}), queue_res("e", [(["nvidia.com/mig-3g.40gb"], "mig2", {"nvidia.com/mig-3g.40gb": 1})], kind="Cohort"))
    assert_reports(reported(gpu_policies.check_gpu_no_cross_domain_sharing, *resources), [
        ("loose", "has no ai-factory.io/trust-domain label"),
        ("mig-any", "selects shared-GPU nodes of trust domains blue, red"),
        ("mig2", "selects shared-GPU nodes of trust domains (none), red"),
        ("q-b", "admits tenant 'b'"),
    ])


@pytest.mark.parametrize(
    "hard, expected",
    [
        pytest.param({"requests.nvidia.com/gpu": "8", "requests.cpu": "4"}, [], id="whole-gpus"),
        pytest.param({"requests.nvidia.com/mig-1g.10gb": "2"}, ["gives low-trust tenant 'x' 2 of nvidia.com/mig-1g.10gb"], id="mig"),
        pytest.param({"requests.nvidia.com/gpumem": "4096"}, ["4096 of nvidia.com/gpumem"], id="hami-memory"),
        pytest.param({"requests.nvidia.com/gpucores": "30"}, ["30 of nvidia.com/gpucores"], id="hami-cores"),
        pytest.param({"requests.nvidia.com/gpu.shared": "1"}, ["1 of nvidia.com/gpu.shared"], id="time-slices"),
        pytest.param({"requests.nvidia.com/gpumem": "0", "requests.nvidia.com/mig-1g.10gb": 0}, [], id="shares-capped-at-zero"),
    ],
)
def test_low_trust_whole_gpus_flags_quotas_for_shares_of_a_gpu(hard, expected):
    resources = (tenant_space("x", "low"), tenant_space("y"), quota_res("y", {"requests.nvidia.com/gpumem": "4096"}), quota_res("x", hard))
    assert_reports(reported(gpu_policies.check_low_trust_whole_gpus, *resources), [("quota-x", e) for e in expected])


@pytest.mark.parametrize(
    "covered, flavor_name, expected",
    [
        pytest.param(["nvidia.com/gpu"], "own", [], id="own-dedicated-nodes"),
        pytest.param(["cpu", "nvidia.com/gpu"], "own", [], id="mixed-group-on-own-nodes"),
        pytest.param(["cpu", "nvidia.com/gpu"], "all-h100", ["selects nodes not dedicated to it (h100-other)"], id="mixed-group-on-foreign-nodes"),
        pytest.param(["nvidia.com/gpu"], "mig", ["on shared-GPU nodes (mig-1)"], id="shared-nodes"),
        pytest.param(["cpu"], "all-h100", [], id="cpu-only-group"),
        pytest.param(["nvidia.com/gpu"], "gone", [], id="flavor-not-rendered"),
    ],
)
def test_low_trust_whole_gpus_flags_queues_on_shared_or_foreign_nodes(covered, flavor_name, expected):
    resources = (
        OPERATOR, tenant_space("x", "low"), tenant_space("y"),
        gpu_node("h100-own", {"pool": "h100", DEDICATED_LABEL: "x"}, (DEDICATED_LABEL, "x", "NoSchedule")),
        gpu_node("h100-other", {"pool": "h100"}),
        gpu_node("mig-1", {"pool": "mig", MIG_CONFIG_LABEL: "halves", DEDICATED_LABEL: "y"}),
        flavor_res("own", {"pool": "h100", DEDICATED_LABEL: "x"}), flavor_res("all-h100", {"pool": "h100"}), flavor_res("mig", {"pool": "mig"}),
        queue_res("x", [(covered, flavor_name, {r: 1 for r in covered})]),
        queue_res("y", [(["nvidia.com/gpu"], "all-h100", {"nvidia.com/gpu": 1})]),
    )
    assert_reports(reported(gpu_policies.check_low_trust_whole_gpus, *resources), [("q-x", e) for e in expected])


@pytest.mark.parametrize(
    "node_obj, expected",
    [
        pytest.param(gpu_node("n", {DEDICATED_LABEL: "x"}, (DEDICATED_LABEL, "x", "NoSchedule")), [], id="dedicated-and-tainted"),
        pytest.param(gpu_node("n", {DEDICATED_LABEL: "x"}, (DEDICATED_LABEL, "x", "NoExecute")), [], id="noexecute-taint"),
        pytest.param(gpu_node("n", {DEDICATED_LABEL: "x"}), ["is dedicated to low-trust tenant 'x' but is not tainted ai-factory.io/dedicated=x"], id="untainted"),
        pytest.param(gpu_node("n", {DEDICATED_LABEL: "y"}), [], id="dedicated-to-a-trusted-tenant"),
        pytest.param(gpu_node("n", {DEDICATED_LABEL: "x", MIG_CONFIG_LABEL: "halves"}, (DEDICATED_LABEL, "x", "NoSchedule")), ["serves low-trust tenant 'x' but shares its GPUs (MIG config halves)"], id="dedicated-and-shared"),
        pytest.param(gpu_node("n", {TRUST_DOMAIN_LABEL: "x", "ai-factory.io/hami": "enabled"}), ["serves low-trust tenant 'x' but shares its GPUs (HAMi)"], id="domain-node-shared"),
        pytest.param(gpu_node("n", {TRUST_DOMAIN_LABEL: "y", "ai-factory.io/hami": "enabled"}), [], id="trusted-domain-shared"),
        pytest.param(gpu_node("n", {TRUST_DOMAIN_LABEL: "zone-z", "ai-factory.io/hami": "enabled"}), ["serves low-trust tenant 'z' but shares its GPUs (HAMi)"], id="domain-named-otherwise"),
    ],
)
def test_low_trust_whole_gpus_flags_shared_or_untainted_nodes_of_low_trust_tenants(node_obj, expected):
    resources = (OPERATOR, tenant_space("x", "low"), tenant_space("y"), tenant_space("z", "low", domain="zone-z"), node_obj)
    assert_reports(reported(gpu_policies.check_low_trust_whole_gpus, *resources), [("n", e) for e in expected])


@pytest.mark.parametrize(
    "entry, expected",
    [
        pytest.param({"devices": "all", "mig-enabled": False}, [], id="all-devices"),
        pytest.param({"devices": [0, 1], "mig-enabled": False}, [], id="gpu-indexes"),
        pytest.param({"devices": [], "mig-enabled": False}, ["devices [] is neither `all` nor a list of GPU indexes"], id="no-devices"),
        pytest.param({"devices": "0", "mig-enabled": False}, ["devices '0' is neither `all` nor a list of GPU indexes"], id="index-as-text"),
        pytest.param({"devices": [True], "mig-enabled": False}, ["devices [True] is neither `all` nor a list of GPU indexes"], id="boolean-index"),
        pytest.param({"devices": [0, "1"], "mig-enabled": False}, ["devices [0, '1'] is neither `all` nor a list of GPU indexes"], id="one-index-as-text"),
        pytest.param({"devices": [0], "mig-enabled": True, "device-filter": "0x20B210DE", "mig-devices": {"1g.10gb": 7}}, [], id="filter-as-one-string"),
        pytest.param({"devices": [0], "mig-enabled": True, "device-filter": ["0x20b210de"], "mig-devices": {"7g.80gb": 1}}, [], id="filter-in-lower-case"),
        pytest.param({"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 1}}, ["has no device-filter"], id="no-filter"),
        pytest.param({"devices": [0], "mig-enabled": True, "device-filter": ["0xFFFF10DE"], "mig-devices": {"1g.10gb": 1}}, ["device-filter 0XFFFF10DE is no GPU model of the catalog"], id="unknown-model"),
        pytest.param({"devices": [0], "mig-enabled": True, "device-filter": ["0x20B210DE"], "mig-devices": {"1g.10gb": -1}}, ["count -1 of 1g.10gb is not a whole number"], id="negative-count"),
        pytest.param({"devices": [0], "mig-enabled": True, "device-filter": ["0x20B210DE"], "mig-devices": {"1g.10gb": True}}, ["count True of 1g.10gb is not a whole number"], id="boolean-count"),
        pytest.param({"devices": [0], "mig-enabled": True, "device-filter": ["0x20B210DE"], "mig-devices": {"1g.10gb": 0}}, [], id="zero-count"),
        pytest.param({"devices": [0], "mig-enabled": True, "device-filter": ["0x20B210DE"], "mig-devices": {"1g.10gb": 8}}, ["1g.10gb x8 does not fit on one A100-80GB (compute 8/7, memory 8/8"], id="one-too-many"),
        pytest.param({"devices": [0], "mig-enabled": True, "device-filter": ["0x20B210DE"], "mig-devices": {"9g.99gb": 1}}, ["no MIG profile '9g.99gb'"], id="unknown-profile"),
        pytest.param({"devices": [0], "mig-enabled": True, "device-filter": ["0x26B910DE"], "mig-devices": {"1g.10gb": 1}}, ["L40S-48GB has no MIG"], id="model-without-mig"),
        pytest.param({"devices": [0], "mig-enabled": True, "device-filter": ["0x20B210DE"], "mig-devices": {"1g.10gb": -1, "9g.99gb": 1, "2g.20gb": "x"}},
                     ["count -1 of 1g.10gb", "no MIG profile '9g.99gb'", "count 'x' of 2g.20gb"], id="every-problem-of-a-layout"),
    ],
)
def test_mig_layouts_legal_checks_each_entry(entry, expected):
    found = list(gpu_policies.mig_entry_problems(entry))
    assert len(found) == len(expected), found
    for problem, phrase in zip(found, expected):
        assert phrase in problem


def test_mig_layouts_legal_gives_each_gpu_one_layout_and_reads_only_mig_parted_files():
    text = "version: v1\nmig-configs:\n  twice:\n    - devices: [0, 1]\n      mig-enabled: false\n    - devices: [1]\n      mig-enabled: false\n"
    config_map = {"metadata": {"name": "m", "namespace": "gpu-operator"}, "data": {"config.yaml": text}}
    assert [m for m in gpu_policies.check_mig_layouts_legal("kubernetes:core/v1:ConfigMap", config_map, {}) if "GPU 1 is in entries 0 and 1" in m]
    assert len(list(gpu_policies.check_mig_layouts_legal("kubernetes:core/v1:ConfigMap", config_map, {}))) == 1
    other = {"metadata": {"name": "c"}, "data": {"config.yaml": "key: value\n"}}
    assert list(gpu_policies.check_mig_layouts_legal("kubernetes:core/v1:ConfigMap", other, {})) == []
    broken = {"name": "gpu-operator", "chart": "gpu-operator", "values": {"migManager": {"config": {"data": {"config.yaml": "mig-configs: [1]"}}}}}
    assert ["is not a mig-parted file" in m for m in gpu_policies.check_mig_layouts_legal("kubernetes:helm.sh/v3:Release", broken, {})] == [True]


@pytest.mark.parametrize(
    "operator_values, node_labels, hami_values, expected",
    [
        pytest.param({}, {"ai-factory.io/hami": "enabled", DEVICE_PLUGIN_DEPLOY_LABEL: "false"}, {"devicePlugin": {"nvidiaNodeSelector": {"ai-factory.io/hami": "enabled"}}}, [], id="disjoint"),
        pytest.param({}, {"ai-factory.io/hami": "enabled"}, {"devicePlugin": {"nvidiaNodeSelector": {"ai-factory.io/hami": "enabled"}}}, [("n", "label it nvidia.com/gpu.deploy.device-plugin=false")], id="both-plugins"),
        pytest.param(None, {"ai-factory.io/hami": "enabled"}, {"devicePlugin": {"nvidiaNodeSelector": {"ai-factory.io/hami": "enabled"}}}, [], id="hami-without-the-gpu-operator"),
        pytest.param({"devicePlugin": {"enabled": False}}, {"ai-factory.io/hami": "enabled"}, {"devicePlugin": {"nvidiaNodeSelector": {"ai-factory.io/hami": "enabled"}}}, [], id="operator-plugin-off"),
        pytest.param({}, {"gpu": "on"}, {}, [("n", "runs HAMi's device plugin and the GPU Operator's")], id="hami-default-selector"),
        pytest.param({}, {"ai-factory.io/hami": "enabled", DEVICE_PLUGIN_DEPLOY_LABEL: "false", MIG_CONFIG_LABEL: "halves"}, {"devicePlugin": {"nvidiaNodeSelector": {"ai-factory.io/hami": "enabled"}}},
                     [("n", "MIG Manager applies MIG config halves")], id="hami-and-mig"),
        pytest.param({}, {"ai-factory.io/hami": "enabled", DEVICE_PLUGIN_DEPLOY_LABEL: "false", MIG_CONFIG_LABEL: "all-disabled"}, {"devicePlugin": {"nvidiaNodeSelector": {"ai-factory.io/hami": "enabled"}}}, [], id="hami-and-mig-disabled"),
        pytest.param({}, {}, {"devicePlugin": {"nvidiaNodeSelector": {}}}, [("hami", "runs HAMi's device plugin on every node")], id="hami-everywhere"),
        pytest.param({}, {"other": "node"}, {"devicePlugin": {"nvidiaNodeSelector": {"ai-factory.io/hami": "enabled"}}}, [], id="node-not-selected"),
    ],
)
def test_hami_device_plugin_disjoint_from_the_nvidia_plugin_and_mig(operator_values, node_labels, hami_values, expected):
    resources = [chart("hami", "hami", hami_values), gpu_node("a-cpu", {"role": "cpu"}), gpu_node("n", node_labels)]
    if operator_values is not None:
        resources.append(chart("gpu-operator", "gpu-operator", operator_values))
    assert_reports(reported(gpu_policies.check_hami_device_plugin_disjoint, *resources), expected)


def test_hami_device_plugin_disjoint_checks_every_hami_release():
    resources = (chart("hami-a", "hami", {"devicePlugin": {"nvidiaNodeSelector": {}}}), chart("hami-b", "hami", {"devicePlugin": {"nvidiaNodeSelector": {"ai-factory.io/hami": "enabled"}}}),
                 chart("gpu-operator", "gpu-operator", {}), gpu_node("n", {"ai-factory.io/hami": "enabled"}))
    assert_reports(reported(gpu_policies.check_hami_device_plugin_disjoint, *resources), [("hami-a", "on every node"), ("n", "two allocators")])


@pytest.mark.parametrize(
    "extra, expected",
    [
        pytest.param([res("LocalQueue", "default", "kueue.x-k8s.io/v1beta2", "tenant-a", spec={"clusterQueue": "q-a"})], [], id="queued"),
        pytest.param([], [("tenant-a", "may use GPUs but has no Kueue LocalQueue")], id="no-local-queue"),
        pytest.param([quota_res("a", {"requests.nvidia.com/gpu": "0", "requests.nvidia.com/mig-1g.10gb": "0", "requests.cpu": "4"})], [], id="gpus-capped-at-zero"),
        pytest.param([quota_res("a", {"requests.nvidia.com/gpu": "0", "requests.nvidia.com/mig-1g.10gb": "1"})], [("tenant-a", "has no Kueue LocalQueue")], id="one-gpu-line-open"),
        pytest.param([quota_res("a", {"requests.cpu": "0"})], [("tenant-a", "has no Kueue LocalQueue")], id="quota-without-gpu-lines"),
        pytest.param([res("LocalQueue", "default", "kueue.x-k8s.io/v1beta2", "tenant-a", spec={"clusterQueue": "gone"})], [("default", "points at ClusterQueue 'gone', which this stack does not define")], id="queue-not-defined"),
        pytest.param([res("LocalQueue", "default", "kueue.x-k8s.io/v1beta2", "tenant-a", spec={"clusterQueue": "open"})], [("default", "points at ClusterQueue open, which admits every namespace")], id="queue-admits-all"),
        pytest.param([res("LocalQueue", "default", "kueue.x-k8s.io/v1beta2", "tenant-a", spec={"clusterQueue": "closed"})], [("default", "which has no namespaceSelector and so admits nothing")], id="queue-admits-nothing"),
        pytest.param([res("LocalQueue", "default", "kueue.x-k8s.io/v1beta2", "tenant-a", spec={"clusterQueue": "q-b"})], [("default", "whose namespaceSelector does not select tenant-a")], id="queue-of-another-tenant"),
        pytest.param([res("LocalQueue", "default", "kueue.x-k8s.io/v1beta2", "tenant-a", spec={"clusterQueue": "q-a"}), res("LocalQueue", "extra", "kueue.x-k8s.io/v1beta2", "tenant-a", spec={"clusterQueue": "gone"})],
                     [("extra", "points at ClusterQueue 'gone'")], id="every-local-queue"),
    ],
)
def test_gpu_namespaces_queued_through_their_own_cluster_queue(extra, expected):
    manager = "manageJobsWithoutQueueName: true\n"
    resources = (
        res("Namespace", "kube-system"), tenant_space("a"), quota_res("b", {"requests.nvidia.com/gpu": "4"}),
        chart("kueue", "kueue", {"managerConfig": {"controllerManagerConfigYaml": manager}}),
        queue_res("a", []), queue_res("b", []), res("ClusterQueue", "open", "kueue.x-k8s.io/v1beta2", spec={"namespaceSelector": {}}),
        res("ClusterQueue", "closed", "kueue.x-k8s.io/v1beta2", spec={}), *extra,
    )
    assert_reports(reported(gpu_policies.check_gpu_namespaces_queued, *resources), expected)


@pytest.mark.parametrize(
    "resources, expected",
    [
        pytest.param([res("Queue", "tenant-a", "scheduling.run.ai/v2", labels={TENANT_LABEL: "a"})], [], id="kai-queue"),
        pytest.param([res("Queue", "tenant-a", "scheduling.volcano.sh/v1beta1", labels={TENANT_LABEL: "a"})], [], id="volcano-queue"),
        pytest.param([res("Queue", "tenant-b", "scheduling.run.ai/v2", labels={TENANT_LABEL: "b"})], [("tenant-a", "has no queue (Kueue LocalQueue, KAI Scheduler or Volcano Queue)")], id="another-tenants-queue"),
        pytest.param([res("Queue", "tenant-a", "example.com/v1", labels={TENANT_LABEL: "a"})], [("tenant-a", "has no queue (Kueue LocalQueue")], id="queue-of-another-api"),
        pytest.param([res("Queue", "tenant-a", "scheduling.run.ai/v2", labels={TENANT_LABEL: "a"}), chart("kueue", "kueue", {})],
                     [("kueue", "does not set manageJobsWithoutQueueName: true"), ("tenant-a", "has no Kueue LocalQueue")], id="kueue-installed"),
        pytest.param([chart("kueue", "kueue", {"managerConfig": {"controllerManagerConfigYaml": "manageJobsWithoutQueueName: false"}}),
                      res("LocalQueue", "default", "kueue.x-k8s.io/v1beta2", "tenant-a", spec={"clusterQueue": "q-a"}), queue_res("a", [])],
                     [("kueue", "does not set manageJobsWithoutQueueName: true")], id="kueue-without-default-queueing"),
    ],
)
def test_gpu_namespaces_queued_by_kai_or_volcano_without_kueue(resources, expected):
    assert_reports(reported(gpu_policies.check_gpu_namespaces_queued, tenant_space("a"), *resources), expected)


H100 = {"pool": "h100"}


@pytest.mark.parametrize(
    "objects, expected",
    [
        pytest.param([queue_res("a", [(["nvidia.com/gpu"], "h100", {"nvidia.com/gpu": 8})])], [], id="at-the-supply"),
        pytest.param([queue_res("a", [(["nvidia.com/gpu"], "h100", {"nvidia.com/gpu": 5})]), queue_res("b", [(["nvidia.com/gpu"], "h100", {"nvidia.com/gpu": 4})], kind="Cohort")],
                     [("h100", "queues promise 9 nvidia.com/gpu (ClusterQueue q-a: 5, Cohort q-b: 4) but its nodes supply 8")], id="queue-and-cohort-above"),
        pytest.param([queue_res("a", [(["nvidia.com/gpu"], "h100", {"nvidia.com/gpu": "8500m"})])], [("h100", "promise 8.5 nvidia.com/gpu (ClusterQueue q-a: 8.5)")], id="fractional"),
        pytest.param([queue_res("a", [(["cpu"], "cpu", {"cpu": 1000})])], [], id="cpu-is-not-counted"),
        pytest.param([queue_res("a", [(["nvidia.com/gpu"], "bare", {"nvidia.com/gpu": 100})])], [], id="flavor-without-a-supply"),
        pytest.param([queue_res("a", [(["nvidia.com/gpu"], "bare", {"nvidia.com/gpu": 100}), (["nvidia.com/gpu"], "h100", {"nvidia.com/gpu": 9})])], [("h100", "queues promise 9")], id="flavor-after-one-without-a-supply"),
        pytest.param([queue_res("a", [(["nvidia.com/gpu"], "gone", {"nvidia.com/gpu": 100})])], [], id="flavor-not-rendered"),
        pytest.param([quota_res("a", {"requests.nvidia.com/gpu": "8"})], [], id="tenant-at-its-domains-supply"),
        pytest.param([quota_res("a", {"requests.nvidia.com/gpu": "9", "requests.cpu": "100"})], [("quota-a", "allows 9 nvidia.com/gpu but the flavors of its trust domain 'red' supply 8")], id="tenant-above"),
        pytest.param([quota_res("a", {"requests.nvidia.com/gpu": "8500m"})], [("quota-a", "allows 8.5 nvidia.com/gpu")], id="tenant-fractional"),
        pytest.param([quota_res("a", {"requests.nvidia.com/mig-1g.10gb": "1"})], [("quota-a", "allows 1 nvidia.com/mig-1g.10gb but the flavors of its trust domain 'red' supply 0")], id="tenant-unsupplied-resource"),
        pytest.param([tenant_space("c", domain="green"), quota_res("c", {"requests.nvidia.com/gpu": "1"})], [("quota-c", "its trust domain 'green' supply 0")], id="domain-without-flavors"),
        pytest.param([tenant_space("c", domain="green"), quota_res("c", {"requests.nvidia.com/gpu": "0"})], [], id="domain-without-flavors-capped-at-zero"),
        pytest.param([tenant_space("d", domain="white"), quota_res("d", {"requests.nvidia.com/gpu": "100"})], [], id="domain-flavor-without-a-supply"),
        pytest.param([tenant_space("d", domain="white"), quota_res("d", {"requests.nvidia.com/gpu": "100"}), quota_res("a", {"requests.nvidia.com/gpu": "9"})], [("quota-a", "allows 9")], id="tenant-after-an-unknown-domain"),
        pytest.param([quota_res("b", {"requests.nvidia.com/gpu": "12"})], [], id="domain-by-node-labels-summed"),
    ],
)
def test_gpu_quota_within_supply_of_flavors_and_trust_domains(objects, expected):
    resources = (
        tenant_space("a", domain="red"), tenant_space("b", domain="blue"),
        flavor_res("h100", H100, {"nvidia.com/gpu": 8}, domain="red"), flavor_res("cpu", {}, None),
        flavor_res("blue-1", {TRUST_DOMAIN_LABEL: "blue"}, {"nvidia.com/gpu": 4}), flavor_res("blue-2", {TRUST_DOMAIN_LABEL: "blue"}, {"nvidia.com/gpu": 8}),
        flavor_res("bare", {"pool": "x"}, None), flavor_res("white", {}, None, domain="white"),
        res("ResourceQuota", "platform", namespace="kube-system", spec={"hard": {"requests.nvidia.com/gpu": "100"}}),
        *objects,
    )
    assert_reports(reported(gpu_policies.check_gpu_quota_within_supply, *resources), expected)


def test_gpu_quota_within_supply_is_silent_when_no_flavor_carries_a_supply():
    resources = (tenant_space("a"), flavor_res("cpu", {}, None), quota_res("a", {"requests.nvidia.com/gpu": "8"}))
    assert reported(gpu_policies.check_gpu_quota_within_supply, *resources) == []


def test_gpu_quota_within_supply_counts_mig_instances_from_the_node_layouts():
    resources = (
        OPERATOR, gpu_node("m1", {"pool": "mig", MIG_CONFIG_LABEL: "halves"}), gpu_node("m2", {"pool": "mig", MIG_CONFIG_LABEL: "halves"}),
        flavor_res("mig", {"pool": "mig"}, {"nvidia.com/mig-3g.40gb": 100, "nvidia.com/gpu": 1}),
        queue_res("a", [(["nvidia.com/mig-3g.40gb"], "mig", {"nvidia.com/mig-3g.40gb": 5})]),
        queue_res("b", [(["nvidia.com/gpu"], "mig", {"nvidia.com/gpu": 1})]),
        queue_res("c", [(["nvidia.com/mig-1g.10gb"], "mig", {"nvidia.com/mig-1g.10gb": 1})]),
    )
    assert_reports(reported(gpu_policies.check_gpu_quota_within_supply, *resources), [
        ("mig", "promise 1 nvidia.com/mig-1g.10gb (ClusterQueue q-c: 1) but its nodes supply 0"),
        ("mig", "promise 5 nvidia.com/mig-3g.40gb (ClusterQueue q-a: 5) but its nodes supply 4"),
    ])


# --------------------------------------------------------------------------- security


def test_privileged_namespace_outside_the_allow_list_is_reported(raw):
    raw["layers"]["gpu_operator"]["namespace"] = "nvidia"
    rendered = render(raw)
    found = violations(rendered, "namespace-pod-security")
    assert list(found) == ["kubernetes:core/v1:Namespace::ai-factory-gpu-operator-namespace"]
    assert "Namespace nvidia outside the reviewed allow-list enforces Pod Security 'privileged'" in found["kubernetes:core/v1:Namespace::ai-factory-gpu-operator-namespace"][0]
    assert violations(rendered, "namespace-pod-security", {"namespace-pod-security": {"privilegedNamespaces": ["nvidia"]}}) == {}


def test_namespace_without_pod_security_or_with_an_unreviewed_tenant_exception_is_reported():
    def program():
        namespace("team", level=None)
        namespace("tenant-a", tenant="a", level="baseline")
        namespace("tenant-b", tenant="b", level="baseline", annotations={POD_SECURITY_EXCEPTION_ANNOTATION: "legacy image (approved by sec)"})
        namespace("tenant-c", tenant="c", level="privileged")
        release("app", "app", "apps", {}, repo="https://charts.example.com")
        k8s.helm.v3.Release("self-made", name="self-made", chart="app", version="1.0.0", namespace="made", create_namespace=True)

    found = violations(stack(program), "namespace-pod-security")
    assert set(found) == {
        "kubernetes:core/v1:Namespace::team-namespace",
        "kubernetes:core/v1:Namespace::tenant-a-namespace",
        "kubernetes:core/v1:Namespace::tenant-c-namespace",
        "kubernetes:helm.sh/v3:Release::self-made",
    }
    assert "pod-security.kubernetes.io/enforce is missing" in found["kubernetes:core/v1:Namespace::team-namespace"][0]
    assert "without a reviewed exception" in found["kubernetes:core/v1:Namespace::tenant-a-namespace"][0]
    assert "of tenant 'c' enforces Pod Security 'privileged'" in found["kubernetes:core/v1:Namespace::tenant-c-namespace"][0]


def test_privileged_or_host_access_outside_the_allow_list_is_reported():
    def program():
        deployment("privileged", "team", {"image": "app:1.0", "securityContext": {"privileged": True, "capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}}})
        deployment("host", "tenant-a", {"image": "app:1.0", "ports": [{"containerPort": 80, "hostPort": 8080}]},
                   {"hostNetwork": True, "volumes": [{"name": "root", "hostPath": {"path": "/"}}]})
        deployment("plain", "tenant-a", {"image": "app:1.0", "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}})
        deployment("driver", "gpu-operator", {"image": "driver:1.0", "securityContext": {"privileged": True}}, {"hostPID": True})
        release("chart", "app", "team", {"agent": {"hostNetwork": True}}, repo="https://charts.example.com")

    found = violations(stack(program), "no-privileged-outside-allowlist")
    assert set(found) == {"kubernetes:apps/v1:Deployment::privileged", "kubernetes:apps/v1:Deployment::host", "kubernetes:helm.sh/v3:Release::chart"}
    assert "privileged container privileged; capabilities SYS_ADMIN added" in found["kubernetes:apps/v1:Deployment::privileged"][0]
    assert "hostNetwork; hostPath volume root (/); hostPort 8080" in found["kubernetes:apps/v1:Deployment::host"][0]
    assert "values.agent.hostNetwork: true" in found["kubernetes:helm.sh/v3:Release::chart"][0]


def test_gpu_escape_variables_and_mounts_are_reported():
    def program():
        deployment("picks-gpus", "tenant-a", {"image": "cuda:12.4", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]})
        deployment("lifts-limits", "tenant-a", {"image": "cuda:12.4", "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"}],
                                                "volumeMounts": [{"name": "list", "mountPath": "/var/run/nvidia-container-devices/all"}]})
        deployment("honest", "tenant-a", {"image": "cuda:12.4", "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]})
        deployment("device-plugin", "gpu-operator", {"image": "plugin:1.0", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]})
        k8s.core.v1.ConfigMap("preload", metadata={"name": "preload", "namespace": "tenant-a"}, data={"LD_PRELOAD": "/tmp/x.so"})
        release("serving", "vllm-stack", "tenant-a", {"servingEngineSpec": {"env": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]}}, repo="https://charts.example.com")

    found = violations(stack(program), "no-gpu-escape-variables")
    assert set(found) == {
        "kubernetes:apps/v1:Deployment::picks-gpus",
        "kubernetes:apps/v1:Deployment::lifts-limits",
        "kubernetes:core/v1:ConfigMap::preload",
        "kubernetes:helm.sh/v3:Release::serving",
    }
    assert "(env NVIDIA_VISIBLE_DEVICES in container picks-gpus)" in found["kubernetes:apps/v1:Deployment::picks-gpus"][0]
    assert "env CUDA_DEVICE_MEMORY_LIMIT_0 in container lifts-limits; mount /var/run/nvidia-container-devices/all" in found["kubernetes:apps/v1:Deployment::lifts-limits"][0]
    assert "servingEngineSpec.env[0] sets CUDA_DISABLE_CONTROL" in found["kubernetes:helm.sh/v3:Release::serving"][0]


def test_gpu_operator_below_the_version_floor_is_reported(raw):
    raw["layers"]["gpu_operator"]["chart"] = {"version": "v25.0.0", "repository": "https://helm.ngc.nvidia.com/nvidia"}
    found = violations(render(raw), "gpu-operator-secure-toolkit")
    assert found == {"kubernetes:helm.sh/v3:Release::ai-factory-gpu-operator-release-gpu-operator": [
        "Helm release gpu-operator/gpu-operator (chart gpu-operator): chart version 'v25.0.0' is older than v25.3.1 "
        "(container-escape CVEs); pin v25.3.1 or later."
    ]}


def test_gpu_operator_without_the_toolkit_settings_is_reported(raw, monkeypatch):
    monkeypatch.setattr(ai_factory.components.gpu_operator, "TOOLKIT_ENV", ())
    monkeypatch.setattr(ai_factory.components.gpu_operator, "DEVICE_PLUGIN_ENV", ({"name": "DEVICE_LIST_STRATEGY", "value": "envvar"},))
    rendered = render(raw)
    messages = violations(rendered, "gpu-operator-secure-toolkit")["kubernetes:helm.sh/v3:Release::ai-factory-gpu-operator-release-gpu-operator"]
    assert [m.split(": ", 1)[1].split(" ")[0] for m in messages] == ["toolkit.env", "devicePlugin.env", "toolkit.env"]
    assert "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false" in messages[0]
    assert "DEVICE_LIST_STRATEGY is envvar" in messages[1]
    assert "disable-cuda-compat-lib-hook" in messages[2]
    relaxed = violations(rendered, "gpu-operator-secure-toolkit", {"gpu-operator-secure-toolkit": {"allowCudaCompatLibHook": True}})
    assert len(relaxed["kubernetes:helm.sh/v3:Release::ai-factory-gpu-operator-release-gpu-operator"]) == 2


def test_unpinned_images_are_reported():
    def program():
        deployment("latest", "team", {"image": "nginx:latest"})
        deployment("untagged", "team", {"image": "registry.example.com:5000/busybox"})
        deployment("tagged", "team", {"image": "nginx:1.27.1"})
        deployment("digest", "team", {"image": "nginx@sha256:" + "a" * 64})
        pattern = {"spec": {"containers": [{"image": "ghcr.io/acme/*"}]}}  # an admission rule describes pods, it runs none
        custom("registries", "ClusterPolicy", {"rules": [{"name": "registries", "validate": {"pattern": pattern}}]}, api_version="kyverno.io/v1")
        release("chart", "app", "team", {"server": {"image": {"repository": "ghcr.io/acme/app", "tag": "latest"}}, "sidecar": {"image": {"repository": "ghcr.io/acme/side"}}},
                repo="https://charts.example.com")

    graph = stack(program)
    found = violations(graph, "images-pinned")
    assert set(found) == {"kubernetes:apps/v1:Deployment::latest", "kubernetes:apps/v1:Deployment::untagged", "kubernetes:helm.sh/v3:Release::chart"}
    assert "image 'registry.example.com:5000/busybox' (spec.template.spec.containers[0].image) has no tag" in found["kubernetes:apps/v1:Deployment::untagged"][0]
    assert "image 'ghcr.io/acme/app:latest' (values.server.image.tag) uses the tag latest" in found["kubernetes:helm.sh/v3:Release::chart"][0]
    strict = violations(graph, "images-pinned", {"images-pinned": {"requireDigest": True}})
    assert "kubernetes:apps/v1:Deployment::tagged" in strict and "kubernetes:apps/v1:Deployment::digest" not in strict


def test_plaintext_credentials_are_reported():
    def program():
        release("identity", "keycloakx", "keycloak", {"auth": {"adminPassword": "hunter2", "existingSecret": "keycloak-admin"}, "db": {"passwordSecretKey": "password"}},
                repo="https://codecentric.github.io/helm-charts")
        release("tidy", "keycloakx", "keycloak", {"auth": {"existingSecret": "keycloak-admin"}}, repo="https://codecentric.github.io/helm-charts")
        k8s.core.v1.ConfigMap("key", metadata={"name": "key", "namespace": "apps"}, data={"tls.key": "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----"})
        k8s.core.v1.ConfigMap("settings", metadata={"name": "settings", "namespace": "apps"}, data={"app.yaml": "server:\n  port: 80\nstorage:\n  accessKey: AKIAABCDEFGHIJKLMNOP\n"})
        k8s.core.v1.ConfigMap("leak", metadata={"name": "leak", "namespace": "apps"}, data={"url": pulumi.Output.secret("postgres://u:p@db")})
        k8s.core.v1.ConfigMap("dsn", metadata={"name": "dsn", "namespace": "apps"}, data={"DATABASE_URL": "postgres://app:hunter2hunter2@db:5432/x"})
        k8s.core.v1.ConfigMap("dsn-ref", metadata={"name": "dsn-ref", "namespace": "apps"},
                              data={"DATABASE_URL": "postgres://app:${DB_PASSWORD}@db:5432/x", "docs": "https://example.com/a@b"})
        deployment("env", "apps", {"image": "app:1.0", "env": [{"name": "API_TOKEN", "value": "s3cr3t"}, {"name": "LOG_LEVEL", "value": "debug"},
                                                              {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]})

    found = violations(stack(program), "no-plaintext-secrets")
    assert set(found) == {f"kubernetes:{t}::{n}" for t, n in (("helm.sh/v3:Release", "identity"), ("core/v1:ConfigMap", "key"), ("core/v1:ConfigMap", "settings"),
                                                               ("core/v1:ConfigMap", "leak"), ("core/v1:ConfigMap", "dsn"), ("apps/v1:Deployment", "env"))}
    assert "data.DATABASE_URL (a password in a URL)" in found["kubernetes:core/v1:ConfigMap::dsn"][0]
    assert "(values.auth.adminPassword)" in found["kubernetes:helm.sh/v3:Release::identity"][0]
    assert "data.tls.key (a private key)" in found["kubernetes:core/v1:ConfigMap::key"][0]
    assert "data.app.yaml.storage.accessKey" in found["kubernetes:core/v1:ConfigMap::settings"][0]
    assert "data.url (a Pulumi secret)" in found["kubernetes:core/v1:ConfigMap::leak"][0]
    assert "(env API_TOKEN of container env)" in found["kubernetes:apps/v1:Deployment::env"][0]


# --------------------------------------------------------------------------- security, table-driven

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
RELEASE = "kubernetes:helm.sh/v3:Release"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
NAMESPACE = "kubernetes:core/v1:Namespace"


def settings(*groups: dict) -> dict:
    return {k: v["default"] for group in groups for k, v in group.items()}


def workload(pod: dict, namespace: str = "apps", containers: list | None = None) -> dict:
    spec = {"containers": containers if containers is not None else [{"name": "main", "image": "app:1.0"}], **pod}
    return {"metadata": {"name": "w", "namespace": namespace}, "spec": {"template": {"spec": spec}}}


def one_container(**fields) -> dict:
    return workload({}, containers=[{"name": "main", "image": "app:1.0", **fields}])


def ns_props(name: str, level: str | None, tenant: str | None = None, exception: str | None = None) -> dict:
    labels = {"pod-security.kubernetes.io/enforce": level} if level else {}
    if tenant:
        labels[TENANT_LABEL] = tenant
    annotations = {POD_SECURITY_EXCEPTION_ANNOTATION: exception} if exception else {}
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations}}


@pytest.mark.parametrize(
    "resource_type, props, config, expected",
    [
        pytest.param(NAMESPACE, ns_props("apps", "restricted"), {}, [], id="restricted"),
        pytest.param(NAMESPACE, ns_props("apps", "baseline"), {}, [], id="platform-baseline"),
        pytest.param(NAMESPACE, ns_props("apps", None), {}, ["label pod-security.kubernetes.io/enforce is missing"], id="missing"),
        pytest.param(NAMESPACE, ns_props("apps", "strict"), {}, ["label pod-security.kubernetes.io/enforce is 'strict'"], id="unknown-level"),
        *[pytest.param(NAMESPACE, ns_props(name, "privileged"), {}, [], id=f"privileged-reviewed-{name}") for name in ("kube-system", "gpu-operator", "hami-system", "dra-driver-nvidia-gpu", "falco", "trivy-system")],
        pytest.param(NAMESPACE, ns_props("apps", "privileged"), {}, ["Namespace apps outside the reviewed allow-list enforces Pod Security 'privileged'"], id="privileged-unreviewed"),
        pytest.param(NAMESPACE, ns_props("apps", "privileged"), {"privilegedNamespaces": ["apps"]}, [], id="privileged-by-setting"),
        pytest.param(NAMESPACE, ns_props("falco", "privileged", tenant="a"), {}, ["Namespace falco of tenant 'a' enforces Pod Security 'privileged'"], id="privileged-tenant"),
        pytest.param(NAMESPACE, ns_props("tenant-a", "baseline", tenant="a"), {}, ["Namespace tenant-a of tenant 'a' enforces Pod Security 'baseline' without a reviewed exception"], id="tenant-baseline"),
        pytest.param(NAMESPACE, ns_props("tenant-a", "baseline", tenant="a", exception="CUDA IPC"), {}, [], id="tenant-baseline-by-exception"),
        pytest.param(NAMESPACE, ns_props("tenant-a", "restricted", tenant="a"), {}, [], id="tenant-restricted"),
        pytest.param(RELEASE, {"name": "app", "chart": "app", "namespace": "apps", "createNamespace": True}, {}, ["creates its namespace apps (createNamespace)"], id="chart-creating-its-namespace"),
        pytest.param(RELEASE, {"name": "app", "chart": "app", "namespace": "apps"}, {}, [], id="chart-in-an-existing-namespace"),
        pytest.param("kubernetes:helm.sh/v4:Chart", {"name": "app", "chart": "app", "namespace": "apps", "createNamespace": True}, {}, [], id="chart-v4-creates-nothing"),
        pytest.param(CONFIG_MAP, ns_props("apps", None), {}, [], id="not-a-namespace"),
    ],
)
def test_namespace_pod_security_levels(resource_type, props, config, expected):
    found = list(security_policies.check_namespace_pod_security(resource_type, props, {**settings(security_policies.PRIVILEGED_SETTINGS), **config}))
    assert len(found) == len(expected), found
    for message, phrase in zip(found, expected):
        assert phrase in message


@pytest.mark.parametrize(
    "props, expected",
    [
        pytest.param(workload({}), [], id="plain"),
        *[pytest.param(workload({key: True}), [key], id=key) for key in ("hostNetwork", "hostPID", "hostIPC")],
        pytest.param(workload({"hostNetwork": False, "hostPID": False}), [], id="host-namespaces-off"),
        pytest.param(workload({"volumes": [{"name": "logs", "hostPath": {"path": "/var/log"}}, {"name": "tmp", "emptyDir": {}}]}), ["hostPath volume logs (/var/log)"], id="host-path"),
        pytest.param(one_container(securityContext={"privileged": True}), ["privileged container main"], id="privileged"),
        pytest.param(one_container(securityContext={"privileged": False}), [], id="unprivileged"),
        pytest.param(one_container(securityContext={"windowsOptions": {"hostProcess": True}}), ["host-process container main"], id="host-process"),
        *[pytest.param(one_container(securityContext={"capabilities": {"add": [cap]}}), [], id=f"baseline-{cap}") for cap in ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT")],
        pytest.param(one_container(securityContext={"capabilities": {"add": ["cap_chown", "NET_ADMIN"]}}), ["capabilities NET_ADMIN added to container main"], id="net-admin"),
        pytest.param(one_container(securityContext={"capabilities": {"add": ["CAP_SYS_ADMIN"]}}), ["capabilities SYS_ADMIN added to container main"], id="sys-admin"),
        pytest.param(one_container(ports=[{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81}]), ["hostPort 8080 on container main"], id="host-port"),
        pytest.param(workload({}, "gpu-operator", [{"name": "driver", "securityContext": {"privileged": True}}]), [], id="reviewed-namespace"),
    ],
)
def test_no_privileged_outside_allowlist_for_workloads(props, expected):
    found = list(security_policies.check_no_privileged_outside_allowlist(DEPLOYMENT, props, settings(security_policies.PRIVILEGED_SETTINGS)))
    if not expected:
        assert found == []
    else:
        (message,) = found
        assert f"({'; '.join(expected)}) in namespace apps" in message


@pytest.mark.parametrize(
    "namespace, values, expected",
    [
        pytest.param("apps", {"securityContext": {"privileged": True}}, "values.securityContext.privileged: true", id="privileged-value"),
        pytest.param("apps", {"agents": [{"hostNetwork": True}]}, "values.agents[0].hostNetwork: true", id="host-network-in-a-list"),
        pytest.param("apps", {"hostPID": "true", "privileged": False}, None, id="not-literally-true"),
        pytest.param("falco", {"driver": {"privileged": True}}, None, id="reviewed-namespace"),
        pytest.param("apps", {"hostIPC": True}, "values.hostIPC: true", id="host-ipc"),
        pytest.param("apps", {"collector": {"hostPID": True}}, "values.collector.hostPID: true", id="host-pid"),
    ],
)
def test_no_privileged_outside_allowlist_for_chart_values(namespace, values, expected):
    found = list(security_policies.check_no_privileged_outside_allowlist(RELEASE, {"name": "x", "chart": "x", "namespace": namespace, "values": values}, settings(security_policies.PRIVILEGED_SETTINGS)))
    assert [expected in m for m in found] == ([True] if expected else [])


@pytest.mark.parametrize(
    "variable, escapes",
    [*[pytest.param(v, True, id=v) for v in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES", "LD_PRELOAD",
                                                 "CUDA_DISABLE_CONTROL", "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_SHARED_CACHE", "CUDA_OVERSUBSCRIBE", "GPU_CORE_UTILIZATION_POLICY")],
     pytest.param("CUDA_DEVICE_MEMORY_LIMIT_0", True, id="memory-limit-of-one-device"),
     pytest.param("CUDA_VISIBLE_DEVICES", False, id="cuda-visible-devices"),
     pytest.param("NVIDIA_VISIBLE", False, id="prefix-of-an-escape")],
)
def test_gpu_escape_variables_in_env_config_maps_and_values(variable, escapes):
    allowed = settings(security_policies.PRIVILEGED_SETTINGS)
    check = security_policies.check_no_gpu_escape_variables
    cases = [
        (DEPLOYMENT, one_container(env=[{"name": variable, "value": "x"}])),
        (CONFIG_MAP, {"metadata": {"name": "c", "namespace": "apps"}, "data": {variable: "x"}}),
        ("kubernetes:core/v1:Secret", {"metadata": {"name": "s", "namespace": "apps"}, "stringData": {variable: "x"}}),
        (RELEASE, {"name": "x", "chart": "x", "namespace": "apps", "values": {"extraEnv": [{"name": variable, "value": "x"}]}}),
        (RELEASE, {"name": "x", "chart": "x", "namespace": "apps", "values": {"worker": {"ENV": {variable: "x"}}}}),
    ]
    assert [bool(list(check(t, props, allowed))) for t, props in cases] == [escapes] * len(cases)
    reviewed = [(CONFIG_MAP, {"metadata": {"name": "c", "namespace": "hami-system"}, "data": {variable: "x"}}),
                (RELEASE, {"name": "x", "chart": "x", "namespace": "hami-system", "values": {"env": [{"name": variable}]}}),
                (DEPLOYMENT, {**one_container(env=[{"name": variable, "value": "x"}]), "metadata": {"name": "w", "namespace": "gpu-operator"}})]
    assert [list(check(t, props, allowed)) for t, props in reviewed] == [[], [], []]


@pytest.mark.parametrize(
    "path, escapes",
    [*[pytest.param(p, True, id=p) for p in ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices", "/etc/ld.so.preload", "/usr/local/vgpu", "/usr/local/nvidia",
                                                 "/run/nvidia", "/dev/nvidia")],
     pytest.param("/run/nvidia/driver", True, id="under-run-nvidia"),
     pytest.param("/run/nvidia/", True, id="trailing-slash"),
     pytest.param("/dev/nvidia0", True, id="a-device-node"),
     pytest.param("/var/run/nvidia-container-devices/all", True, id="device-list"),
     pytest.param("/run/nvidia-container-devices/all", True, id="device-list-under-run"),
     pytest.param("/usr/local/nvidia/lib64", True, id="driver-libraries"),
     pytest.param("/run/nvidia-persistenced", True, id="anything-under-run-nvidia"),
     pytest.param("/etc/ld.so.preload.d", False, id="sibling-of-the-preload-file"),
     pytest.param("/usr/local/cuda", False, id="cuda-toolkit"),
     pytest.param("/", False, id="root"),
     pytest.param("/data", False, id="data")],
)
def test_gpu_escape_mounts(path, escapes):
    props = one_container(volumeMounts=[{"name": "v", "mountPath": path}])
    found = list(security_policies.check_no_gpu_escape_variables(DEPLOYMENT, props, settings(security_policies.PRIVILEGED_SETTINGS)))
    assert [f"mount {path} in container main" in m for m in found] == ([True] if escapes else [])


def test_admission_rules_patterns_are_not_workloads():
    pattern = {"metadata": {"name": "p"}, "spec": {"rules": [{"validate": {"pattern": {"spec": {"containers": [{"name": "*", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "x"}, {"name": "PASSWORD", "value": "hunter2"}], "securityContext": {"privileged": True}}]}}}}]}}
    allowed = settings(security_policies.PRIVILEGED_SETTINGS)
    for check in (security_policies.check_no_gpu_escape_variables, security_policies.check_no_privileged_outside_allowlist):
        assert list(check("kubernetes:kyverno.io/v1:ClusterPolicy", pattern, allowed)) == []
    assert list(security_policies.check_no_plaintext_secrets("kubernetes:kyverno.io/v1:ClusterPolicy", pattern, {})) == []
    assert list(security_policies.check_no_plaintext_secrets("kubernetes:example.com/v1:Runner", pattern["spec"]["rules"][0]["validate"]["pattern"], {}))


SECURE_TOOLKIT = {
    "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED": "false",
    "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS": "true",
    "NVIDIA_CONTAINER_TOOLKIT_OPT_IN_FEATURES": "other,disable-cuda-compat-lib-hook",
}


def operator_props(strategy: str | None = "volume-mounts", toolkit_env: dict | None = None, version: str = "v25.10.0", **toolkit) -> dict:
    """The GPU Operator's release; `toolkit` sets keys of its `toolkit` values (`toolkit_version` is `toolkit.version`)."""
    toolkit = {("version" if k == "toolkit_version" else k): v for k, v in toolkit.items()}
    env = toolkit_env if toolkit_env is not None else SECURE_TOOLKIT
    plugin_env = [{"name": "DEVICE_LIST_STRATEGY", "value": strategy}] if strategy is not None else []
    values = {"toolkit": {"env": [{"name": k, "value": v} for k, v in env.items()], **toolkit}, "devicePlugin": {"env": plugin_env}}
    return {"name": "gpu-operator", "chart": "gpu-operator", "namespace": "gpu-operator", "version": version, "values": values}


@pytest.mark.parametrize(
    "props, config, expected",
    [
        pytest.param(operator_props(), {}, [], id="secure"),
        pytest.param(operator_props("cdi-cri"), {}, [], id="cdi-cri"),
        pytest.param(operator_props("cdi-annotations"), {}, [], id="cdi-annotations"),
        pytest.param(operator_props("cdi-cri, cdi-annotations"), {}, [], id="two-safe-strategies"),
        pytest.param(operator_props("volume-mounts,envvar"), {}, ["DEVICE_LIST_STRATEGY is volume-mounts,envvar"], id="one-unsafe-strategy"),
        pytest.param(operator_props("envvar"), {}, ["DEVICE_LIST_STRATEGY is envvar"], id="envvar"),
        pytest.param(operator_props(None), {}, ["DEVICE_LIST_STRATEGY is unset (envvar)"], id="strategy-unset"),
        pytest.param(operator_props(toolkit_env={**SECURE_TOOLKIT, "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS": "false"}), {}, ["must set ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS=true"], id="volume-mounts-not-accepted"),
        pytest.param(operator_props("cdi-cri", toolkit_env={k: v for k, v in SECURE_TOOLKIT.items() if "VOLUME" not in k}), {}, [], id="cdi-needs-no-volume-mounts"),
        pytest.param(operator_props(toolkit_env={k: v for k, v in SECURE_TOOLKIT.items() if "UNPRIVILEGED" not in k}), {}, ["must set ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false"], id="envvar-accepted"),
        pytest.param(operator_props(toolkit_env={k: v for k, v in SECURE_TOOLKIT.items() if "OPT_IN" not in k}), {}, ["must include disable-cuda-compat-lib-hook"], id="compat-hook-on"),
        pytest.param(operator_props(toolkit_env={k: v for k, v in SECURE_TOOLKIT.items() if "OPT_IN" not in k}), {"allowCudaCompatLibHook": True}, [], id="compat-hook-allowed"),
        pytest.param(operator_props(version="v25.3.0"), {}, ["chart version 'v25.3.0' is older than v25.3.1"], id="old-chart"),
        pytest.param(operator_props(version="v25.3.1"), {}, [], id="chart-at-the-floor"),
        pytest.param(operator_props(version="v24.9.0"), {"minOperatorVersion": "v24.1.0"}, [], id="floor-by-setting"),
        pytest.param(operator_props(version="latest"), {}, ["chart version 'latest' is older than"], id="unreadable-chart-version"),
        pytest.param(operator_props(version="=v26.3.0"), {}, ["chart version '=v26.3.0'"], id="chart-version-not-exact"),
        pytest.param(operator_props(version="v26.3.0-rc.1"), {}, [], id="prerelease"),
        pytest.param(operator_props(toolkit_version="v1.17.7"), {}, ["toolkit.version 'v1.17.7' is older than v1.17.8"], id="old-toolkit"),
        pytest.param(operator_props(toolkit_version="v1.17.8"), {}, [], id="toolkit-at-the-floor"),
        pytest.param(operator_props(enabled=False), {}, ["toolkit.enabled is false"], id="toolkit-off"),
        pytest.param({**operator_props(), "chart": "other"}, {}, [], id="another-chart"),
    ],
)
def test_gpu_operator_secure_toolkit(props, config, expected):
    found = list(security_policies.check_gpu_operator_secure_toolkit(RELEASE, props, {**settings(security_policies.TOOLKIT_SETTINGS), **config}))
    assert len(found) == len(expected), found
    for message, phrase in zip(found, expected):
        assert phrase in message


@pytest.mark.parametrize(
    "image, require_digest, problem",
    [
        pytest.param("registry.example.com:5000/team/app:1.2.3", False, None, id="tagged-behind-a-port"),
        pytest.param("registry.example.com:5000/team/app", False, "has no tag (it means latest)", id="port-is-no-tag"),
        pytest.param("app:latest", False, "uses the tag latest", id="latest"),
        pytest.param("app", False, "has no tag (it means latest)", id="untagged"),
        pytest.param("app:1.0", True, "is not pinned by digest", id="tag-when-a-digest-is-required"),
        pytest.param("app@sha256:" + "a" * 64, True, None, id="digest"),
        pytest.param("app@sha256:" + "a" * 63, True, "is not pinned by digest", id="short-digest"),
    ],
)
def test_images_pinned_to_a_version_or_digest(image, require_digest, problem):
    assert security_policies.image_problem(image, require_digest) == problem


@pytest.mark.parametrize(
    "values, expected",
    [
        pytest.param({"image": {"repository": "org/app", "tag": "1.0"}}, [], id="repository-and-tag"),
        pytest.param({"image": {"repository": "org/app", "tag": "latest"}}, ["image 'org/app:latest' (values.image.tag) uses the tag latest"], id="repository-latest"),
        pytest.param({"image": {"repository": "org/app", "tag": ""}}, [], id="chart-default-tag"),
        pytest.param({"image": {"repository": "org/app", "tag": 1.21}}, [], id="numeric-tag"),
        pytest.param({"image": {"repository": "org/app", "digest": "sha256:" + "b" * 64}}, [], id="repository-and-digest"),
        pytest.param({"image": {"repository": "org/app", "tag": "sha256:" + "c" * 64}}, [], id="digest-as-tag"),
        pytest.param({"sidecar": {"image": "org/side"}}, ["image 'org/side' (values.sidecar.image) has no tag"], id="full-reference"),
        pytest.param({"podSecurity": {"version": "latest"}}, [], id="a-lone-version"),
        pytest.param({"tool": {"tag": "latest"}}, ["image ':latest' (values.tool.tag) uses the tag latest"], id="a-lone-latest-tag"),
        pytest.param({"images": [{"image": "org/a", "version": "2.0"}]}, [], id="image-and-version-in-a-list"),
    ],
)
def test_images_pinned_in_chart_values(values, expected):
    found = list(security_policies.check_images_pinned(RELEASE, {"name": "x", "chart": "x", "values": values}, settings(security_policies.IMAGE_SETTINGS)))
    assert len(found) == len(expected), found
    for message, phrase in zip(found, expected):
        assert phrase in message


@pytest.mark.parametrize(
    "image, expected",
    [
        pytest.param({"repository": "org/app", "digest": "sha256:" + "d" * 64}, [], id="digest"),
        pytest.param({"repository": "org/app", "tag": "sha256:" + "e" * 64}, [], id="digest-in-the-tag"),
        pytest.param({"repository": "org/app", "tag": "1.0"}, ["image 'org/app:1.0' (values.image.tag) is not pinned by digest"], id="tag"),
        pytest.param({"repository": "org/app", "digest": "sha512:abc"}, ["image 'org/app@sha512:abc' (values.image.digest) is not pinned by digest"], id="digest-of-another-algorithm"),
    ],
)
def test_images_pinned_by_digest_when_required(image, expected):
    found = list(security_policies.check_images_pinned(RELEASE, {"name": "x", "chart": "x", "values": {"image": image}}, {"requireDigest": True}))
    assert [any(e in m for e in expected) for m in found] == [True] * len(expected)


def test_images_pinned_in_workloads_and_nothing_else():
    props = workload({}, containers=[{"name": "a", "image": "app:1.0"}, {"name": "b", "image": "app"}])
    props["metadata"].update(labels={"tag": "latest"}, annotations={"image": "org/notes"})  # metadata names no image
    assert [m.endswith("image 'app' (spec.template.spec.containers[1].image) has no tag (it means latest); pin an exact version or a digest.") for m in security_policies.check_images_pinned(DEPLOYMENT, props, {"requireDigest": False})] == [True]
    deny_latest = {"metadata": {"name": "p"}, "spec": {"rules": [{"validate": {"pattern": {"spec": {"containers": [{"image": "!*:latest"}]}}}}]}}
    assert list(security_policies.check_images_pinned("kubernetes:kyverno.io/v1:ClusterPolicy", deny_latest, {"requireDigest": False})) == []


@pytest.mark.parametrize(
    "key, holds",
    [
        *[pytest.param(k, True, id=k) for k in ("password", "dbPassword", "admin_passwd", "passphrase", "apiToken", "API_KEY", "accessKey", "aws_secret_access_key",
                                                  "secretKey", "privateKey", "clientSecret", "sharedSecret", "credentials", "awsCredential", ".dockerconfigjson",
                                                  "master_key")],
        *[pytest.param(k, False, id=k) for k in ("passwordSecretKey", "tokenSecretName", "existingSecret", "existingPassword", "createCredentials", "useToken", "enablePassword",
                                                   "generatePassword", "autoToken", "requireToken", "allowToken", "skipPassword", "tokenTTL", "username",
                                                   "secretKeyRef", "credentialsSecretKey", "masterkeySecretKey")],
    ],
)
def test_credential_keys(key, holds):
    assert security_policies.credential_key(key) is holds


@pytest.mark.parametrize(
    "value, what",
    [
        pytest.param("-----BEGIN EC PRIVATE KEY-----\nMHc\n", "a private key", id="private-key"),
        pytest.param("id AKIAABCDEFGHIJKLMNOP", "an AWS access key", id="aws-key"),
        pytest.param("ghp_" + "a" * 36, "a GitHub token", id="github-token"),
        pytest.param("nvapi-" + "b" * 20, "an NGC API key", id="ngc-key"),
        pytest.param("xoxb-1234567890-abc", "a Slack token", id="slack-token"),
        pytest.param("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig", "a JSON web token", id="jwt"),
        pytest.param("https://user:hunter2@example.com/x", "a password in a URL", id="url-password"),
        pytest.param("https://user:${PASSWORD}@example.com/x", None, id="url-placeholder"),
        pytest.param("https://example.com/a@b", None, id="url-without-password"),
        pytest.param("xoxb-short", None, id="short-slack-like"),
        pytest.param("AKIAABCDEFGHIJKLMNO", None, id="short-aws-like"),
        pytest.param("plain text", None, id="plain"),
    ],
)
def test_credential_patterns_in_values(value, what):
    found = list(security_policies.secrets_in({"note": value}, "data"))
    assert found == ([f"data.note ({what})"] if what else [])


@pytest.mark.parametrize(
    "value, expected",
    [
        pytest.param({"password": "hunter2"}, ["values.password"], id="credential-key"),
        pytest.param({"password": ""}, [], id="empty"),
        pytest.param({"password": "${DB_PASSWORD}"}, [], id="placeholder"),
        pytest.param({"password": "{{ .Values.x }}"}, [], id="template"),
        pytest.param({"password": "$(DB_PASSWORD)"}, [], id="variable"),
        pytest.param({"password": 1234}, [], id="not-text"),
        pytest.param({"env": [{"name": "DB_PASSWORD", "value": "hunter2"}]}, ["values.env[0] (DB_PASSWORD)"], id="env-entry"),
        pytest.param({"env": [{"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db"}}}]}, [], id="env-reference"),
        pytest.param({"env": [{"name": "LOG_LEVEL", "value": "debug"}]}, [], id="env-harmless"),
        pytest.param({"url": "[secret]"}, ["values.url (a Pulumi secret)"], id="pulumi-secret"),
        pytest.param({"config": "auth:\n  token: abc123\n"}, ["values.config.auth.token"], id="embedded-yaml"),
        pytest.param({"config": '{"apiKey": "abc"}'}, ["values.config.apiKey"], id="embedded-json"),
        pytest.param({"list": ["ghp_" + "a" * 36]}, ["values.list[0] (a GitHub token)"], id="in-a-list"),
        pytest.param({"tokens": '["ghp_' + "a" * 36 + '"]'}, ["values.tokens[0] (a GitHub token)"], id="embedded-json-list"),
        pytest.param({"url": "[secret]:abc"}, ["values.url (a Pulumi secret)"], id="pulumi-secret-with-a-suffix"),
    ],
)
def test_plaintext_secrets_in_values(value, expected):
    assert list(security_policies.secrets_in(value, "values")) == expected


def test_plaintext_secrets_checked_in_charts_config_maps_and_env_but_not_secrets():
    check = security_policies.check_no_plaintext_secrets
    env = one_container(env=[{"name": "API_TOKEN", "value": "s3cr3t"}, {"name": "MODE", "value": "fast"}])
    assert ["(env API_TOKEN of container main)" in m for m in check(DEPLOYMENT, env, {})] == [True]
    assert list(check("kubernetes:core/v1:Secret", {"metadata": {"name": "s"}, "stringData": {"password": "x"}}, {})) == []
    assert ["(binaryData.password)" in m for m in check(CONFIG_MAP, {"metadata": {"name": "c"}, "binaryData": {"password": "eA=="}}, {})] == [True]
    assert ["(values.auth.password)" in m for m in check(RELEASE, {"name": "x", "chart": "x", "values": {"auth": {"password": "x"}}}, {})] == [True]
    assert list(check(NAMESPACE, {"metadata": {"name": "n", "annotations": {"password": "x"}}}, {})) == []


# --------------------------------------------------------------------------- reliability


def test_stateful_platform_parts_without_protection_are_reported(raw, monkeypatch):
    monkeypatch.setattr(ai_factory.components.openbao, "STATEFUL", {})
    found = violations(render(raw), "stateful-resources-protected")
    assert set(found) == {
        "kubernetes:helm.sh/v3:Release::ai-factory-openbao-release-openbao",
        "kubernetes:core/v1:Namespace::ai-factory-openbao-namespace",
        "vault:index/mount:Mount::ai-factory-openbao-kv",  # the KV engine: every tenant's secrets
    }
    assert "holds OpenBao's integrated Raft storage (every tenant's secrets) but is not protected" in found["kubernetes:helm.sh/v3:Release::ai-factory-openbao-release-openbao"][0]


def test_volumes_not_retained_or_on_a_deleting_storage_class_are_reported():
    def program():
        namespace("data", protect=True, retain_on_delete=True)
        k8s.storage.v1.StorageClass("fast", metadata={"name": "fast"}, provisioner="csi.example.com", reclaim_policy="Delete")
        k8s.storage.v1.StorageClass("kept", metadata={"name": "kept"}, provisioner="csi.example.com", reclaim_policy="Retain")
        k8s.core.v1.PersistentVolumeClaim(
            "scratch", metadata={"name": "scratch", "namespace": "data"},
            spec={"storageClassName": "fast", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            opts=pulumi.ResourceOptions(protect=True),
        )
        k8s.core.v1.PersistentVolumeClaim(
            "safe", metadata={"name": "safe", "namespace": "data"},
            spec={"storageClassName": "kept", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            opts=pulumi.ResourceOptions(protect=True, retain_on_delete=True),
        )

    found = violations(stack(program), "stateful-resources-protected")
    assert set(found) == {"kubernetes:core/v1:PersistentVolumeClaim::scratch", "kubernetes:storage.k8s.io/v1:StorageClass::fast"}
    assert "is protected but not retained on delete" in found["kubernetes:core/v1:PersistentVolumeClaim::scratch"][0]
    assert "has reclaimPolicy Delete" in found["kubernetes:storage.k8s.io/v1:StorageClass::fast"][0]


def test_chart_from_an_unknown_repository_is_reported(raw):
    raw["layers"]["gpu_operator"]["chart"] = {"version": "v26.7.0", "repository": "https://charts.example.com/nvidia"}
    rendered = render(raw)
    found = violations(rendered, "charts-pinned")
    assert list(found) == ["kubernetes:helm.sh/v3:Release::ai-factory-gpu-operator-release-gpu-operator"]
    assert "repository https://charts.example.com/nvidia is not a repository of the catalog" in found["kubernetes:helm.sh/v3:Release::ai-factory-gpu-operator-release-gpu-operator"][0]
    mirror = {"charts-pinned": {"additionalRepositories": ["https://charts.example.com/nvidia/"]}}
    assert violations(rendered, "charts-pinned", mirror) == {}


def test_chart_version_range_or_local_chart_is_reported():
    def program():
        release("ranged", "hami", "hami-system", {}, version="^2.10", repo="https://project-hami.github.io/HAMi/")
        release("local", "./charts/app", "apps", {}, version="1.0.0")
        release("pinned", "hami", "hami-system", {}, version="2.10.0", repo="https://project-hami.github.io/HAMi/")

    found = violations(stack(program), "charts-pinned")
    assert set(found) == {"kubernetes:helm.sh/v3:Release::ranged", "kubernetes:helm.sh/v3:Release::local"}
    assert "version '^2.10' is not an exact chart version" in found["kubernetes:helm.sh/v3:Release::ranged"][0]
    assert "comes from no repository" in found["kubernetes:helm.sh/v3:Release::local"][0]


def test_unbounded_node_health_checks_are_reported():
    pool = {"matchLabels": {POOL_LABEL: "a"}}
    step = {"order": 0, "timeout": "30m", "remediationTemplate": {"kind": "SelfNodeRemediationTemplate", "name": "r", "namespace": "m"}}
    api = "remediation.medik8s.io/v1alpha1"

    def program():
        custom("bounded", "NodeHealthCheck", {"selector": pool, "maxUnhealthy": 1, "escalatingRemediations": [step]}, api_version=api)
        custom("percent", "NodeHealthCheck", {"selector": pool, "maxUnhealthy": "20%", "escalatingRemediations": [step]}, api_version=api)
        custom("min-healthy", "NodeHealthCheck", {"selector": pool, "minHealthy": "51%", "escalatingRemediations": [step]}, api_version=api)
        custom("unlimited", "NodeHealthCheck", {"selector": pool, "escalatingRemediations": [step]}, api_version=api)
        custom("blocked", "NodeHealthCheck", {"selector": pool, "maxUnhealthy": "0%", "escalatingRemediations": [step]}, api_version=api)
        custom("everything", "NodeHealthCheck", {"selector": {}, "maxUnhealthy": 1, "escalatingRemediations": [step]}, api_version=api)
        custom("endless", "NodeHealthCheck", {"selector": pool, "maxUnhealthy": 1, "remediationTemplate": step["remediationTemplate"]}, api_version=api)

    found = violations(stack(program), "remediation-bounded")
    key = "kubernetes:remediation.medik8s.io/v1alpha1:NodeHealthCheck::nodehealthcheck-"
    assert set(found) == {key + n for n in ("min-healthy", "unlimited", "blocked", "everything", "endless")}
    assert "minHealthy bounds the healthy nodes" in found[key + "min-healthy"][0]
    assert "no maxUnhealthy" in found[key + "unlimited"][0]
    assert "allows no remediation at all" in found[key + "blocked"][0]
    assert "selects every node" in found[key + "everything"][0]
    assert "never ends" in found[key + "endless"][0]


@pytest.mark.parametrize(
    "selector, expected",
    [
        pytest.param({}, ["tenant-a", "tenant-b", "tenant-c"], id="empty-selects-all"),
        pytest.param({"matchLabels": {TENANT_LABEL: "a"}}, ["tenant-a"], id="match-labels"),
        pytest.param({"matchLabels": {TENANT_LABEL: "a", TRUST_DOMAIN_LABEL: "x"}}, ["tenant-a"], id="match-labels-all-of"),
        pytest.param({"matchLabels": {TENANT_LABEL: "a", TRUST_DOMAIN_LABEL: "y"}}, [], id="match-labels-one-differs"),
        pytest.param({"matchLabels": {TENANT_LABEL: ["a"]}}, [], id="unhashable-value-matches-nothing"),
        pytest.param({"matchExpressions": [{"key": TRUST_DOMAIN_LABEL, "operator": "In", "values": ["x"]}]}, ["tenant-a", "tenant-b"], id="expression"),
        pytest.param({"matchLabels": {TRUST_DOMAIN_LABEL: "x"}, "matchExpressions": [{"key": TENANT_LABEL, "operator": "NotIn", "values": ["a"]}]},
                     ["tenant-b"], id="labels-and-expression"),
    ],
)
def test_namespaces_selected_by_a_label_selector(selector, expected):
    cluster = Cluster([tenant_space("a", domain="x"), tenant_space("b", domain="x"), tenant_space("c", domain="z"), res("Namespace", "kube-system")])
    assert cluster.namespaces_selected(selector, cluster.namespace_tenant) == expected


STEP_POOLS = [
    # (id, pools.json, problem or None)
    ("accepts a node count per pool", {"a": {"limit": 1, "dra": False}, "d": {"limit": 2, "dra": True, "gpus": 4}}, None),
    ("flags a limit of zero", {"a": {"limit": 0, "dra": False}}, "pools.json, pool a: limit 0 is not a node count of at least 1"),
    ("flags a limit jq would compare as a string", {"a": {"limit": "1", "dra": False}}, "pools.json, pool a: limit '1' is not a node count"),
    ("flags a pool without a limit", {"a": {"dra": False}}, "pools.json, pool a: limit None is not a node count"),
    ("flags GPUs per node that are no count", {"d": {"limit": 1, "dra": True, "gpus": 0}}, "pools.json, pool d: gpus 0 is not a GPU count"),
]


@pytest.mark.parametrize("pools, problem", [r[1:] for r in STEP_POOLS], ids=[r[0] for r in STEP_POOLS])
def test_the_remediation_steps_bounds_are_checked(pools, problem):
    def program():
        k8s.core.v1.ConfigMap("step", metadata={"name": "ai-factory-gpu-remediation", "namespace": "medik8s"}, data={"pools.json": json.dumps(pools)})

    messages = [m for ms in violations(stack(program), "remediation-bounded").values() for m in ms]
    assert (len(messages) == 1 and problem in messages[0]) if problem else messages == [], messages


# --------------------------------------------------------------------------- admission-policies-enforced: rule matches


PROTECTED = {"tenant-a": {TENANT_LABEL: "a"}, "tenant-b": {TENANT_LABEL: "b"}}
ONE = {"tenant-a": PROTECTED["tenant-a"]}
"""A tenant's own policy protects its one namespace."""
BY_LABEL = {"resources": {"namespaceSelector": {"matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]}}}


@pytest.mark.parametrize(
    "match, missed",
    [
        pytest.param({"any": [BY_LABEL]}, [], id="accepts-the-tenant-label"),
        pytest.param({"all": [BY_LABEL]}, [], id="accepts-all-blocks"),
        pytest.param(BY_LABEL, [], id="accepts-a-bare-block"),
        pytest.param({"any": [{"resources": {"namespaceSelector": {"matchLabels": {TENANT_LABEL: "a"}}}}]}, ["tenant-b"], id="flags-one-tenants-label"),
        pytest.param({"any": [{"resources": {"namespaces": ["tenant-a"]}}]}, ["tenant-b"], id="flags-a-name-list"),
        pytest.param({"any": [{"resources": {"namespaces": ["tenant-*"]}}]}, [], id="accepts-a-name-pattern"),
        pytest.param({"any": [{"resources": {"namespaces": ["tenant-?"]}}]}, [], id="accepts-a-one-character-pattern"),
        pytest.param({"any": [{"resources": {"namespaces": ["tenant-[a]"]}}]}, ["tenant-b"], id="flags-a-set-pattern-missing-one"),
        pytest.param({"any": [{"resources": {"namespaces": ["tenant-"]}}]}, ["tenant-a", "tenant-b"], id="flags-a-name-prefix"),
        pytest.param({"any": [{"resources": {"namespaces": ["tenant-a", "tenant-b"]}}]}, [], id="accepts-any-listed-name"),
        pytest.param({"all": [{"resources": {"namespaces": ["tenant-a"]}}]}, ["tenant-b"], id="flags-an-all-block"),
        pytest.param({"any": [{"resources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tenant-b"}}}}]}, ["tenant-a"], id="flags-a-name-label"),
        pytest.param({"any": [{"resources": {"namespaces": ["tenant-a"]}}, {"resources": {"namespaces": ["tenant-b"]}}]}, [], id="accepts-blocks-together"),
        pytest.param({"any": [{"resources": {"namespaces": ["tenant-a"], "namespaceSelector": {"matchLabels": {TENANT_LABEL: "b"}}}}]}, ["tenant-a", "tenant-b"], id="flags-name-and-label-disagreeing"),
    ],
)
def test_admission_rule_match_covers_the_tenant_namespaces(match, missed):
    assert admission_policies.unmatched_namespaces(unknown_checking_proxy({"match": match}), PROTECTED) == missed


@pytest.mark.parametrize(
    "match, protected, raises",
    [
        pytest.param({"any": [{"resources": {"namespaces": [UNKNOWN_STRING_VALUE]}}]}, PROTECTED, True, id="flags-an-unknown-name"),
        pytest.param(UNKNOWN_STRING_VALUE, PROTECTED, True, id="flags-an-unknown-match"),
        pytest.param(UNKNOWN_STRING_VALUE, {}, False, id="accepts-an-unknown-match-asked-about-nothing"),
        pytest.param({"any": [BY_LABEL, {"resources": {"namespaces": [UNKNOWN_STRING_VALUE]}}]}, PROTECTED, False, id="accepts-an-unknown-block-never-reached"),
        pytest.param({"any": [{"resources": {"namespaces": ["tenant-a"]}}, {"resources": {"namespaces": [UNKNOWN_STRING_VALUE]}}]}, PROTECTED, True, id="flags-an-unknown-block-reached"),
        pytest.param({"any": [BY_LABEL, {"resources": {"namespaces": [UNKNOWN_STRING_VALUE]}}]}, ONE, False, id="accepts-an-unknown-block-one-namespace-never-reaches"),
        pytest.param({"any": [{"resources": {"namespaces": ["tenant-b"]}}, {"resources": {"namespaces": [UNKNOWN_STRING_VALUE]}}]}, ONE, True, id="flags-an-unknown-block-one-namespace-reaches"),
        pytest.param(UNKNOWN_STRING_VALUE, ONE, True, id="flags-an-unknown-match-asked-about-one-namespace"),
    ],
)
def test_admission_rule_match_fails_where_crossguard_reads_an_unknown(match, protected, raises):
    rule = unknown_checking_proxy({"match": match})
    if raises:
        with pytest.raises(UnknownValueError):
            admission_policies.unmatched_namespaces(rule, protected)
    else:
        admission_policies.unmatched_namespaces(rule, protected)


def plain(value) -> bool:
    """Whether `value` holds no proxy: dicts, lists and scalars all the way down."""
    if isinstance(value, dict):
        return all(plain(v) for v in value.values())
    if isinstance(value, list):
        return all(plain(v) for v in value)
    return isinstance(value, (str, int, float, bool, type(None)))


PROXIES = [pytest.param(unknown_checking_proxy, id="crossguard"), pytest.param(lazy_unknown_checking_proxy, id="offline")]


@pytest.mark.parametrize("proxy", PROXIES)
@pytest.mark.parametrize(
    "value",
    [
        pytest.param("text", id="text"),
        pytest.param([1, "a", {"b": [2, True]}], id="a-list-of-maps"),
        pytest.param({"m": {"n": ["o"]}}, id="nested-maps"),
        pytest.param([], id="an-empty-list"),
    ],
)
def test_known_reads_a_proxied_value_whole_into_plain_containers(proxy, value):
    read = known(proxy({"v": value}))
    assert read == {"v": value} and plain(read)


@pytest.mark.parametrize("proxy", PROXIES)
@pytest.mark.parametrize(
    "value",
    [pytest.param([1, UNKNOWN_STRING_VALUE], id="in-a-list"), pytest.param({"n": {"o": UNKNOWN_STRING_VALUE}}, id="in-a-nested-map")],
)
def test_known_raises_where_a_read_of_the_value_would(proxy, value):
    with pytest.raises(UnknownValueError):
        known(proxy({"v": value}))


def test_admission_rule_match_with_an_unknown_value_is_read_as_crossguard_reads_it():
    # tenant-a's labels fail the selector's matchLabels before its unknown matchExpressions are read
    selector = {"matchLabels": {TENANT_LABEL: "b"}, "matchExpressions": [UNKNOWN_STRING_VALUE]}
    rule = unknown_checking_proxy({"match": {"any": [{"resources": {"namespaceSelector": selector}}]}})
    assert admission_policies.unmatched_namespaces(rule, {"tenant-a": PROTECTED["tenant-a"]}) == ["tenant-a"]


def test_admission_tenant_labels_unknown_during_preview_fail_the_policy_where_a_rule_reads_them():
    resources = [
        res("Namespace", "tenant-a", labels={TENANT_LABEL: "a"}),
        res("Namespace", "tenant-b", labels={TENANT_LABEL: "b", "zone": UNKNOWN_STRING_VALUE}),
        res("ClusterPolicy", "tenant-a-admission", "kyverno.io/v1", spec={"rules": [{"name": "r", "match": {"any": [{"resources": {"namespaces": ["tenant-a"]}}]}}]}),
    ]
    proxied = [PolicyResource(r.resource_type, unknown_checking_proxy(r.props), r.urn, r.name, None, None, None, [], {}) for r in resources]
    assert [m for _, m in admission_policies.check_admission_policies_enforced(proxied, {}) if "does not match" in m] == []
    resources[2].props["spec"]["rules"][0]["match"] = {"any": [{"resources": {"namespaces": ["tenant-b"]}}]}
    proxied = [PolicyResource(r.resource_type, unknown_checking_proxy(r.props), r.urn, r.name, None, None, None, [], {}) for r in resources]
    assert [m for _, m in admission_policies.check_admission_policies_enforced(proxied, {}) if "rule r does not match the tenant namespace(s) tenant-a" in m] != []
    resources[2].props["spec"]["rules"][0]["match"] = {"any": [BY_LABEL]}
    resources[2].props["metadata"]["name"] = "tenant-b-admission"
    proxied = [PolicyResource(r.resource_type, unknown_checking_proxy(r.props), r.urn, r.name, None, None, None, [], {}) for r in resources]
    with pytest.raises(UnknownValueError):
        list(admission_policies.check_admission_policies_enforced(proxied, {}))
