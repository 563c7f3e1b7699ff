"""TenantStack: one typed tenant in, a complete isolated environment out."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi_kubernetes as k8s
import pytest
import yaml

from ai_factory.components.tenant_stack import (
    DEFAULT_TOLERATIONS_ANNOTATION,
    NODE_SELECTOR_ANNOTATION,
    OWNERS_ANNOTATION,
    POD_SECURITY_EXCEPTION_ANNOTATION,
    TOLERATIONS_WHITELIST_ANNOTATION,
    TenantStack,
    tenant_stack_args,
)
from ai_factory.factory.model.catalog import CHARTS
from ai_factory.factory.rendering.harness import run_program
from ai_factory.factory.model.loading import ConfigError, validate
from ai_factory.factory.planning.placement import advertised_resources, allocations
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.planning.quotas import gpu_ceiling
from ai_factory.factory.rendering.bundle import from_graph
from tests.conftest import objects, render, without_models

TENANTS = ("search", "assistant", "partner-acme")


def in_namespace(rendered, kind: str, namespace: str) -> list[dict]:
    return [m.obj for m in rendered.manifests if m.kind == kind and m.namespace == namespace]


def the(rendered, kind: str, namespace: str) -> dict:
    (obj,) = in_namespace(rendered, kind, namespace)
    return obj


def namespace_of(rendered, tenant: str) -> dict:
    (ns,) = [m.obj for m in rendered.manifests if m.kind == "Namespace" and m.name == f"tenant-{tenant}"]
    return ns


def vcluster_values(rendered, tenant: str) -> dict:
    (release,) = [m.obj for m in rendered.manifests if m.kind == "HelmRelease" and m.name == f"vcluster-{tenant}"]
    return release["spec"]["values"]


def annotation(rendered, tenant: str, key: str):
    return json.loads(namespace_of(rendered, tenant)["metadata"]["annotations"][key])


@pytest.mark.parametrize("tenant", TENANTS)
def test_every_tenant_gets_namespace_quota_limits_policy_and_a_tokenless_default_account(dev, tenant):
    ns = f"tenant-{tenant}"
    mine = [m for m in dev.manifests if m.tenant == tenant]
    kinds = {(m.kind, m.namespace) for m in mine}
    assert {("Namespace", None), ("ResourceQuota", ns), ("LimitRange", ns), ("ServiceAccount", ns), ("CiliumClusterwideNetworkPolicy", None)} <= kinds
    assert the(dev, "LimitRange", ns)["spec"]["limits"][0]["default"]["memory"] == the(dev, "LimitRange", ns)["spec"]["limits"][0]["defaultRequest"]["memory"]
    (account,) = [o for o in in_namespace(dev, "ServiceAccount", ns) if o["metadata"]["name"] == "default"]
    assert account["automountServiceAccountToken"] is False
    for m in mine:
        assert m.path.startswith((f"manifests/tenants/tenant-{tenant}/", f"manifests/patches/tenant-{tenant}/")), m.path
        assert m.obj["metadata"]["labels"]["ai-factory.io/tenant"] == tenant, m.ref


def test_namespace_enforces_restricted_pinned_to_the_kubernetes_version_and_records_its_owners(dev):
    ns = namespace_of(dev, "assistant")["metadata"]
    for mode in ("enforce", "audit", "warn"):
        assert ns["labels"][f"pod-security.kubernetes.io/{mode}"] == "restricted"
        assert ns["labels"][f"pod-security.kubernetes.io/{mode}-version"] == "v1.34"
    assert ns["labels"]["ai-factory.io/trust"] == "medium"
    assert json.loads(ns["annotations"][OWNERS_ANNOTATION]) == [
        {"kind": "Group", "name": "oidc:assistant-admins"},
        {"kind": "User", "name": "oidc:lea@example.com"},
    ]


def test_namespace_mode_owners_get_a_namespaced_role_without_wildcards_or_isolation_writes(dev):
    role = the(dev, "Role", "tenant-search")
    rolebinding = the(dev, "RoleBinding", "tenant-search")
    assert rolebinding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-admin"}
    assert [s["name"] for s in rolebinding["subjects"]] == ["oidc:search-admins"]
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    for rule in role["rules"]:
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"]
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
        assert rule["apiGroups"][0] not in ("rbac.authorization.k8s.io", "networking.k8s.io", "cilium.io")
        if writes & set(rule["verbs"]):
            assert not {"resourcequotas", "limitranges", "localqueues", "namespaces"} & set(rule["resources"])
    assert all("oidc:search-admins" not in [s["name"] for s in b.get("subjects") or []] for b in objects(dev, "ClusterRoleBinding"))


@pytest.mark.parametrize("tenant", ["assistant", "partner-acme"])
def test_vcluster_tenants_get_no_host_rbac_and_administer_only_their_vcluster(dev, tenant):
    ns = f"tenant-{tenant}"
    assert in_namespace(dev, "Role", ns) == [] and in_namespace(dev, "RoleBinding", ns) == []
    (binding,) = yaml.safe_load_all(vcluster_values(dev, tenant)["experimental"]["deploy"]["vcluster"]["manifests"])
    owners = annotation(dev, tenant, OWNERS_ANNOTATION)
    assert binding["kind"] == "ClusterRoleBinding" and binding["roleRef"]["name"] == "cluster-admin"
    assert [{"kind": s["kind"], "name": s["name"]} for s in binding["subjects"]] == owners


def test_vcluster_is_the_pinned_chart_with_values_valid_against_its_strict_schema(dev, oracles):
    (release,) = [m.obj for m in dev.manifests if m.kind == "HelmRelease" and m.name == "vcluster-assistant"]
    assert release["spec"]["chart"]["spec"]["version"] == CHARTS["vcluster"].version == "0.36.1"
    assert oracles.validate_values(CHARTS["vcluster"].oracle_dir, release["spec"]["values"]) == []
    assert oracles.validate_values(CHARTS["vcluster"].oracle_dir, {"policies": {"podSecurityStandart": "restricted"}}) != []


def test_vcluster_is_hardened(dev):
    values = vcluster_values(dev, "assistant")
    args = values["controlPlane"]["distro"]["k8s"]["apiServer"]["extraArgs"]
    assert "--oidc-issuer-url=https://sso.par1.example.com/realms/ai-factory" in args
    assert {"--oidc-username-prefix=oidc:", "--oidc-groups-prefix=oidc:", "--oidc-client-id=kubernetes-assistant"} <= set(args)
    policies = values["policies"]
    assert policies["podSecurityStandard"] == "restricted"
    # The chart's policies open cross-tenant paths (issue 23); the stack's Cilium policy isolates it.
    assert policies["networkPolicy"] == {"enabled": False}
    # Its quota and limits are the stack's, on the namespace its pods are synced to.
    assert policies["resourceQuota"] == policies["limitRange"] == {"enabled": False}
    assert "requests.nvidia.com/mig-2g.20gb" in the(dev, "ResourceQuota", "tenant-assistant")["spec"]["hard"]
    to_host = values["sync"]["toHost"]
    for kind in ("namespaces", "persistentVolumes", "priorityClasses", "storageClasses", "networkPolicies", "serviceAccounts"):
        assert to_host[kind] == {"enabled": False}, kind
    assert values["sync"]["fromHost"]["nodes"] == {"enabled": False, "syncBackChanges": False}
    container = values["controlPlane"]["statefulSet"]["security"]["containerSecurityContext"]
    assert container["runAsNonRoot"] is True and container["runAsUser"] > 0 and container["capabilities"] == {"drop": ["ALL"]}
    assert container["allowPrivilegeEscalation"] is False


def gpu_lines(rendered, tenant: str) -> dict[str, int]:
    hard = the(rendered, "ResourceQuota", f"tenant-{tenant}")["spec"]["hard"]
    return {k.removeprefix("requests."): int(v) for k, v in hard.items() if "nvidia.com/" in k}


def test_quota_caps_every_advertised_gpu_resource_at_the_tenants_ceiling(dev, dev_raw):
    cfg = validate(dev_raw[0])
    plan = plan_for(cfg)
    grants = allocations(plan, {t.name: t.domain for t in cfg.tenants})
    for tenant in cfg.tenants:
        lines = gpu_lines(dev, tenant.name)
        assert set(lines) == set(advertised_resources(plan)), tenant.name
        assert {r: n for r, n in lines.items() if n} == gpu_ceiling(cfg, plan, tenant).resources, tenant.name
        assert all(lines[r] >= n for r, n in grants[tenant.name].resources.items()), tenant.name
        hard = the(dev, "ResourceQuota", f"tenant-{tenant.name}")["spec"]["hard"]
        assert hard["services.nodeports"] == "0"
        assert {"requests.cpu", "requests.memory", "limits.memory", "requests.storage", "count/pods", "count/persistentvolumeclaims"} <= set(hard)
    assert gpu_lines(dev, "search")["nvidia.com/mig-1g.10gb"] == 6
    assert gpu_lines(dev, "partner-acme")["nvidia.com/mig-1g.10gb"] == 0  # its domain offers none
    # Unlimited borrowing (the default): assistant's grant is 6 HAMi slots of the 16 its domain's
    # L40S offering has; its queue may borrow the 10 others, so its quota lets them run.
    assert grants["assistant"].resources["nvidia.com/gpu"] == 6
    assert gpu_lines(dev, "assistant")["nvidia.com/gpu"] == 16
    assert gpu_lines(dev, "assistant")["nvidia.com/gpumem"] == 92136


@pytest.mark.parametrize(
    ("limit_percent", "expected"),
    [
        (0, {"nvidia.com/gpu": 6, "nvidia.com/gpucores": 150, "nvidia.com/gpumem": 73728}),  # exactly its grant
        (50, {"nvidia.com/gpu": 9, "nvidia.com/gpucores": 200, "nvidia.com/gpumem": 92136}),  # grant x 1.5, at most the supply
    ],
)
def test_quota_follows_the_tenants_borrowing_limit(raw, limit_percent, expected):
    assistant = next(t for t in raw["tenants"] if t["name"] == "assistant")
    assistant["borrowing"] = {"limit_percent": limit_percent}
    rendered = render(raw, {"layers"})
    assert {r: n for r, n in gpu_lines(rendered, "assistant").items() if r in expected} == expected
    assert gpu_lines(rendered, "assistant")["nvidia.com/mig-2g.20gb"] == 3  # granted the whole offering either way
    (cq,) = [o for o in objects(rendered, "ClusterQueue") if o["metadata"]["name"] == "tenant-assistant"]
    hami = next(f for g in cq["spec"]["resourceGroups"] for f in g["flavors"] if f["name"] == "l40s-infer-assistant")
    gpu = next(r for r in hami["resources"] if r["name"] == "nvidia.com/gpu")
    assert gpu["nominalQuota"] + gpu["borrowingLimit"] == expected["nvidia.com/gpu"]


def test_quota_is_the_grant_without_kueue(raw):
    raw["layers"]["kueue"] = {"enabled": False}
    raw["layers"]["kai_scheduler"] = {"enabled": True}
    without_models(raw)
    raw["fleet"]["pools"][2] = {**raw["fleet"]["pools"][2], "sharing": "exclusive"}  # HAMi needs Kueue
    raw["tenants"][1]["gpus"][1] = {"pool": "l40s-infer", "count": 2}
    rendered = render(raw)
    cfg = validate(raw)
    grants = allocations(plan_for(cfg), {t.name: t.domain for t in cfg.tenants})
    for tenant in TENANTS:
        assert {r: n for r, n in gpu_lines(rendered, tenant).items() if n} == grants[tenant].resources, tenant


def test_network_policy_denies_by_default_and_allows_own_namespace_dns_and_platform_flows(dev, raw):
    spec = next(o["spec"] for o in objects(dev, "CiliumClusterwideNetworkPolicy") if o["metadata"]["name"] == "tenant-search-isolation")
    own = {"matchLabels": {"k8s:io.kubernetes.pod.namespace": "tenant-search"}}
    assert spec["endpointSelector"] == own
    assert spec["enableDefaultDeny"] == {"ingress": True, "egress": True}
    assert spec["egressDeny"] == [{"toCIDR": ["169.254.169.254/32", "fd00:ec2::254/128"]}]
    assert spec["ingress"] == [{"fromEndpoints": [own]}]
    assert [r.get("toEndpoints", r.get("toEntities")) for r in spec["egress"]] == [
        [own],
        [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}}],
        [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "litellm", "k8s:app.kubernetes.io/name": "litellm"}}],
    ]
    assistant = next(o["spec"] for o in objects(dev, "CiliumClusterwideNetworkPolicy") if o["metadata"]["name"] == "tenant-assistant-isolation")
    assert {"toEntities": ["kube-apiserver"]} in assistant["egress"]  # its vCluster's syncer
    raw["layers"]["tenancy"]["platform_flows"].append(
        {"name": "metrics", "direction": "ingress", "namespace": "monitoring", "pod_labels": {"app": "prometheus"}, "ports": [{"port": 9090}]}
    )
    with_scraper = render(raw, {"layers"})
    spec = next(o["spec"] for o in objects(with_scraper, "CiliumClusterwideNetworkPolicy") if o["metadata"]["name"] == "tenant-search-isolation")
    assert spec["ingress"][1] == {
        "fromEndpoints": [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "monitoring", "k8s:app": "prometheus"}}],
        "toPorts": [{"ports": [{"port": "9090", "protocol": "TCP"}]}],
    }


def test_low_trust_tenant_is_pinned_to_its_dedicated_nodes(dev, raw):
    assert namespace_of(dev, "partner-acme")["metadata"]["annotations"][NODE_SELECTOR_ANNOTATION] == "ai-factory.io/dedicated=partner-acme"
    dedicated = {"key": "ai-factory.io/dedicated", "operator": "Equal", "value": "partner-acme", "effect": "NoSchedule"}
    assert annotation(dev, "partner-acme", DEFAULT_TOLERATIONS_ANNOTATION) == [dedicated]
    nodes = [o for o in objects(dev, "Node") if o["metadata"]["labels"].get("ai-factory.io/dedicated") == "partner-acme"]
    taint = {"key": "ai-factory.io/dedicated", "value": "partner-acme", "effect": "NoSchedule"}
    assert nodes and all(taint in o["spec"]["taints"] for o in nodes)
    raw["tenants"].append({"name": "visitor", "trust": "low", "owners": {"groups": ["visitors"]}})
    without_gpus = render(raw, {"layers"})
    # No dedicated node: its pods stay pending rather than run on shared nodes.
    assert namespace_of(without_gpus, "visitor")["metadata"]["annotations"][NODE_SELECTOR_ANNOTATION] == "ai-factory.io/dedicated=visitor"


def test_tenants_may_tolerate_only_the_taints_of_their_offerings(dev):
    def taints(tenant):
        return {(t["key"], t.get("value")) for t in annotation(dev, tenant, TOLERATIONS_WHITELIST_ANNOTATION) if t["effect"] == "NoSchedule"}

    assert taints("search") == {("ai-factory.io/trust-domain", "internal")}
    assert taints("assistant") == {("ai-factory.io/trust-domain", "assistant")}
    assert taints("partner-acme") == {("ai-factory.io/dedicated", "partner-acme")}
    assert DEFAULT_TOLERATIONS_ANNOTATION not in namespace_of(dev, "search")["metadata"]["annotations"]


def test_tenants_may_tolerate_the_taints_of_every_offering_of_their_trust_domain(raw):
    # Granted whole H100s only, but its queue may borrow the domain's MIG instances: their taint
    # must pass admission, or what Kueue admits could never be created.
    raw["tenants"].append(
        {"name": "ranker", "trust": "high", "trust_domain": "internal", "owners": {"groups": ["ranker-admins"]}, "gpus": [{"pool": "h100-train", "count": 4}]}
    )
    rendered = render(raw, {"layers"})
    tolerated = {(t["key"], t.get("value")) for t in annotation(rendered, "ranker", TOLERATIONS_WHITELIST_ANNOTATION) if t["effect"] == "NoSchedule"}
    assert tolerated == {("ai-factory.io/trust-domain", "internal")}
    assert gpu_lines(rendered, "ranker")["nvidia.com/mig-1g.10gb"] == 6
    assert gpu_lines(rendered, "ranker")["nvidia.com/mig-2g.20gb"] == 0  # assistant's domain's, never its own


def test_pod_security_exception_enforces_baseline_and_records_the_review(raw):
    raw["layers"]["tenancy"]["pod_security_exceptions"].append(  # dev's own names search, for its Slurm cluster
        {"tenant": "assistant", "level": "baseline", "reason": "legacy inference image runs as root", "approved_by": "security@example.com"}
    )
    rendered = render(raw, {"layers"})
    ns = namespace_of(rendered, "assistant")["metadata"]
    assert ns["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    assert ns["annotations"][POD_SECURITY_EXCEPTION_ANNOTATION] == "legacy inference image runs as root (approved by security@example.com)"
    assert vcluster_values(rendered, "assistant")["policies"]["podSecurityStandard"] == "baseline"
    assert namespace_of(rendered, "partner-acme")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_unsafe_tenancy_settings_are_refused_with_every_problem(raw):
    del raw["identity"]
    tenancy = raw["layers"]["tenancy"]
    tenancy["pod_security_exceptions"] = [
        {"tenant": "partner-acme", "level": "baseline", "reason": "needs root to install drivers", "approved_by": "x"},
        {"tenant": "serch", "level": "baseline", "reason": "a typo in the tenant name", "approved_by": "x"},
    ]
    tenancy["platform_flows"].append({"name": "peek", "namespace": "tenant-search", "pod_labels": {"app": "x"}, "ports": [{"port": 80}]})
    tenancy["platform_flows"].append({"name": "wide", "namespace": "monitoring", "pod_labels": {}, "ports": [{"port": 80}]})
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert set(err.value.problems) >= {
        "layers.tenancy.platform_flows[1].namespace: 'tenant-search' is a tenant namespace; flows go to platform services only",
        "layers.tenancy.platform_flows[2].pod_labels: must have at least 1 item(s)",
        "layers.tenancy.pod_security_exceptions[0].tenant: a low-trust tenant runs Pod Security restricted, without exception",
        "layers.tenancy.pod_security_exceptions[1].tenant: unknown tenant 'serch' (did you mean 'search'?)",
        "tenants[1].isolation: a vCluster signs users in with OIDC; set `identity` (the issuer)",
        "tenants[2].isolation: a vCluster signs users in with OIDC; set `identity` (the issuer)",
    }


def test_namespace_and_vcluster_are_protected_and_what_confines_them_is_retained(dev):
    entries = {(e["type"], e["name"]): e for e in dev.inventory if e["tenant"] == "assistant"}

    def options(type_, name):
        entry = entries[(type_, name)]
        return entry["protect"], entry["retainOnDelete"]

    assert options("kubernetes:core/v1:Namespace", "ai-factory-tenant-assistant-namespace") == (True, True)
    assert options("kubernetes:helm.sh/v3:Release", "ai-factory-tenant-assistant-release-vcluster-assistant") == (True, True)
    for type_, name in (
        ("kubernetes:core/v1:ResourceQuota", "ai-factory-tenant-assistant-quota"),
        ("kubernetes:core/v1:LimitRange", "ai-factory-tenant-assistant-limits"),
        ("kubernetes:cilium.io/v2:CiliumClusterwideNetworkPolicy", "ai-factory-tenant-assistant-isolation"),
        ("kubernetes:core/v1:ServiceAccountPatch", "ai-factory-tenant-assistant-default-service-account"),
    ):
        assert options(type_, name) == (False, True), name
    search = {(e["type"], e["name"]): e for e in dev.inventory if e["tenant"] == "search"}
    assert not search[("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "ai-factory-tenant-search-admin-binding")]["retainOnDelete"]


@dataclass(frozen=True)
class MarkerHook:
    """A later layer's per-tenant object."""

    layer: str = "marker"

    def attach(self, stack, tenant, names) -> None:
        k8s.core.v1.ConfigMap(f"{names.tenant}-marker", metadata={"name": "marker", "namespace": names.namespace}, opts=stack.child())


def test_hooks_attach_under_the_tenant_stack_and_outputs_name_the_tenant(dev_raw):
    cfg = validate(dev_raw[0])
    plan = plan_for(cfg)
    outputs: dict[str, object] = {}

    def program():
        tenant = next(t for t in cfg.tenants if t.name == "assistant")
        stack = TenantStack(tenant.name, tenant_stack_args(cfg, plan, tenant, [MarkerHook()]))
        for name in ("namespace", "group_subjects", "local_queue", "labels", "control_plane"):
            getattr(stack, name).apply(lambda value, name=name: outputs.__setitem__(name, value))

    graph = run_program(program, project="ai-factory", stack="dev")
    marker = graph.named("kubernetes:core/v1:ConfigMap", "assistant-marker")
    assert marker.parent.type == "ai-factory:tenancy:TenantStack" and marker.tenant == "assistant"
    assert "kubernetes:core/v1:Namespace::assistant-namespace" in {d.key for d in marker.dependencies}
    (rendered_marker,) = [m for m in from_graph(graph, cfg).manifests if m.kind == "ConfigMap"]
    assert rendered_marker.path == "manifests/tenants/tenant-assistant/tenant-assistant/configmap-marker.yaml"
    assert outputs == {
        "namespace": "tenant-assistant",
        "group_subjects": ["oidc:assistant-admins"],
        "local_queue": "default",
        "labels": {"ai-factory.io/tenant": "assistant", "ai-factory.io/trust": "medium", "ai-factory.io/trust-domain": "assistant"},
        "control_plane": "vcluster",
    }


def test_gpus_claimed_through_dra_are_capped_by_the_namespace_quota(dev_raw, oracles):
    # Kubernetes counts ResourceClaim devices per DeviceClass, not under requests.nvidia.com/gpu.
    import copy

    from ai_factory.factory.checking.check import run_checks
    from tests.scheduling_env import bigger_environment

    raw = bigger_environment(copy.deepcopy(dev_raw[0]))
    rendered = render(raw, dev_raw[1])
    line = "h200-141gb-whole.deviceclass.resource.k8s.io/devices"
    ads = the(rendered, "ResourceQuota", "tenant-ads")["spec"]["hard"]
    cfg = validate(raw)
    tenant = next(t for t in cfg.tenants if t.name == "ads")
    ceiling = gpu_ceiling(cfg, plan_for(cfg), tenant)
    dra = sum(n for (offering, resource), n in ceiling.per_offering.items() if offering.startswith("h200-dra-") and resource == "nvidia.com/gpu")
    assert int(ads[line]) == dra >= 4  # its grant of 4, or more where it may borrow
    assert the(rendered, "ResourceQuota", "tenant-vision")["spec"]["hard"][line] == "0"  # another domain's DRA GPUs
    assert [str(f) for f in run_checks(rendered, oracles) if f.check in ("schema", "quota")] == []
