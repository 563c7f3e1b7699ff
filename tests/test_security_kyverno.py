"""Kyverno: every policy enforces and fails closed, and each one's intent is on its rendered rule."""

from __future__ import annotations

import pytest

from ai_factory.components import slinky
from ai_factory.components.kyverno import (
    ALL_CONTAINERS,
    DEDICATED_SELECTOR,
    ESCAPE_VARIABLES,
    MAX_TOLERATION_SECONDS,
    PLATFORM_POLICY_NAMES,
    QUEUE_LABEL,
    STANDARD_TOLERATION_KEYS,
    TOLERATIONS,
    VCLUSTER_IMAGES,
)
from ai_factory.components.tenant_stack import NODE_LIFECYCLE_TOLERATIONS, allowed_tolerations, tenant_stack_args
from ai_factory.factory.model.loading import ConfigError, validate
from ai_factory.factory.planning.placement import DEDICATED_LABEL, PLACEMENT_TAINT_KEYS, advertised_resources
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.planning.quotas import gpu_ceiling
from ai_factory.factory.model.tenancy import TENANT_LABEL
from tests.conftest import objects, one, render
from tests.kyverno_engine import Request, validate_denies

PLATFORM_POLICIES = PLATFORM_POLICY_NAMES
OWN_PODS = ["Pod", "Pod/ephemeralcontainers"]


def rules(rendered, policy: str) -> dict[str, dict]:
    return {r["name"]: r for r in one(rendered, "ClusterPolicy", policy)["spec"]["rules"]}


def conditions(rule: dict) -> list[dict]:
    return [c for each in rule["validate"]["foreach"] for c in each["deny"]["conditions"]["any"]]


def test_every_policy_enforces_fails_closed_and_scans_existing_objects(dev):
    policies = objects(dev, "ClusterPolicy")
    assert {p["metadata"]["name"] for p in policies} >= {*PLATFORM_POLICIES, "tenant-search-admission"}
    for policy in policies:
        spec = policy["spec"]
        # Only the nodeName rule skips background scans (every scheduled pod has a nodeName), and the
        # secondary networks policy, whose UPDATE rule exempts ib-kubernetes by who sends the request.
        assert (spec["failurePolicy"], spec["background"]) == ("Fail", policy["metadata"]["name"] not in ("tenant-node-name", "tenant-secondary-networks"))
        assert spec["webhookTimeoutSeconds"] <= 10
        assert {r["validate"]["failureAction"] for r in spec["rules"]} == {"Enforce"}


def test_platform_policies_select_tenant_namespaces_by_their_label(dev):
    for name in PLATFORM_POLICIES:
        for rule in rules(dev, name).values():
            (match,) = rule["match"]["any"]
            assert match["resources"]["namespaceSelector"] == {"matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]}


def test_each_tenant_runs_pod_security_restricted_in_its_own_namespace(dev):
    for tenant in ("search", "assistant", "partner-acme"):
        rule = rules(dev, f"tenant-{tenant}-admission")["pod-security"]
        assert rule["match"]["any"][0]["resources"] == {"kinds": OWN_PODS, "namespaces": [f"tenant-{tenant}"]}
        # search runs a Slurm cluster under its reviewed baseline exception (Pulumi.dev.yaml)
        assert rule["validate"]["podSecurity"] == {"level": "baseline" if tenant == "search" else "restricted", "version": "latest"}


def test_a_pod_security_exception_lowers_only_its_tenant_to_baseline(raw):
    raw["layers"]["tenancy"]["pod_security_exceptions"].append(
        {"tenant": "assistant", "level": "baseline", "reason": "legacy CUDA images run as root", "approved_by": "security-team"}
    )
    rendered = render(raw)
    assert rules(rendered, "tenant-assistant-admission")["pod-security"]["validate"]["podSecurity"]["level"] == "baseline"
    assert rules(rendered, "tenant-partner-acme-admission")["pod-security"]["validate"]["podSecurity"]["level"] == "restricted"


def test_gpu_pods_jobs_and_cronjobs_must_name_a_queue_whoever_owns_them(dev, dev_raw):
    gpu = list(advertised_resources(plan_for(validate(dev_raw[0]))))
    policy = one(dev, "ClusterPolicy", "tenant-gpu-queue")
    assert policy["metadata"]["annotations"] == {"pod-policies.kyverno.io/autogen-controllers": "none"}
    queue = rules(dev, "tenant-gpu-queue")
    expected = {
        "gpu-pods-carry-a-queue": (OWN_PODS, {"metadata": {"labels": {QUEUE_LABEL: "?*"}}}, "request.object.spec.["),
        "gpu-jobs-carry-a-queue": (["Job"], {"metadata": {"labels": {QUEUE_LABEL: "?*"}}}, "request.object.spec.template.spec.["),
        "gpu-cronjobs-carry-a-queue": (["CronJob"], {"spec": {"jobTemplate": {"metadata": {"labels": {QUEUE_LABEL: "?*"}}}}}, "request.object.spec.jobTemplate.spec.template.spec.["),
    }
    assert set(queue) == set(expected)
    for name, (kinds, pattern, pod_spec) in expected.items():
        rule = queue[name]
        assert rule["match"]["any"][0]["resources"]["kinds"] == kinds
        assert rule["validate"]["pattern"] == pattern
        (requests_gpu,) = rule["preconditions"]["all"]  # what is requested, never ownerReferences
        assert (requests_gpu["operator"], requests_gpu["value"]) == ("AnyIn", gpu)
        assert f"{pod_spec}ephemeralContainers, initContainers, containers][].resources.[limits, requests]" in requests_gpu["key"]


def test_tenant_pods_may_not_set_their_node(dev):
    (rule,) = one(dev, "ClusterPolicy", "tenant-node-name")["spec"]["rules"]
    assert rule["match"]["any"][0]["resources"]["operations"] == ["CREATE"]
    assert rule["validate"]["deny"]["conditions"]["any"] == [{"key": "{{ request.object.spec.nodeName || '' }}", "operator": "NotEquals", "value": ""}]


def test_gpu_escape_variables_are_denied_in_every_container(dev):
    rule = rules(dev, "tenant-gpu-escape-env")["no-gpu-escape-variables"]
    assert rule["validate"]["foreach"][0]["list"] == ALL_CONTAINERS
    condition, imported = conditions(rule)
    assert condition["key"] == "{{ element.env[].name || `[]` }}" and condition["operator"] == "AnyIn"
    assert imported == {"key": "{{ length(element.envFrom || `[]`) }}", "operator": "GreaterThan", "value": 0}
    assert {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "LD_PRELOAD", "CUDA_DISABLE_CONTROL", "CUDA_DEVICE_MEMORY_LIMIT*", "CUDA_DEVICE_SM_LIMIT"} <= set(condition["value"])
    assert "CUDA_VISIBLE_DEVICES" not in condition["value"]  # ordinary device ordering inside the allocation
    assert condition["value"] == list(ESCAPE_VARIABLES)


def test_device_list_driver_and_host_path_mounts_are_denied(dev):
    policy = rules(dev, "tenant-gpu-device-mounts")
    (condition,) = conditions(policy["no-gpu-device-mounts"])
    assert condition["key"] == "{{ element.volumeMounts[].mountPath || `[]` }}"
    assert {"/var/run/nvidia-container-devices*", "/dev/nvidia*", "/etc/ld.so.preload"} <= set(condition["value"])
    assert policy["no-host-path"]["validate"]["pattern"] == {"spec": {"=(volumes)": [{"X(hostPath)": "null"}]}}


def test_tenants_may_request_only_the_gpu_resources_of_their_ceiling(dev, dev_raw):
    cfg = validate(dev_raw[0])
    plan = plan_for(cfg)
    for tenant in cfg.tenants:
        rule = rules(dev, f"tenant-{tenant.name}-admission")["granted-gpu-resources"]
        limits, requests = conditions(rule)
        assert limits["key"].startswith("{{ keys(element.resources.limits") and requests["key"].startswith("{{ keys(element.resources.requests")
        assert (limits["operator"], requests["operator"]) == ("AnyNotIn", "AnyNotIn")  # an allow-list
        allowed = {r for r, n in gpu_ceiling(cfg, plan, tenant).resources.items() if n > 0}
        assert set(limits["value"]) == set(requests["value"]) == allowed
    granted = set(conditions(rules(dev, "tenant-partner-acme-admission")["granted-gpu-resources"])[0]["value"])
    assert granted == {"nvidia.com/gpu"}


def test_tenants_may_request_gpu_resources_they_can_only_borrow(raw):
    # Granted whole H100s only: the MIG instances of its trust domain are borrowable, so allowed;
    # another domain's MIG profiles and HAMi resources stay forbidden.
    raw["tenants"].append(
        {"name": "ranker", "trust": "high", "trust_domain": "internal", "owners": {"groups": ["ranker-admins"]}, "gpus": [{"pool": "h100-train", "count": 4}]}
    )
    rendered = render(raw)
    granted = set(conditions(rules(rendered, "tenant-ranker-admission")["granted-gpu-resources"])[0]["value"])
    assert {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"} <= granted
    assert not {"nvidia.com/mig-2g.20gb", "nvidia.com/gpumem"} & granted
    raw["tenants"][-1]["borrowing"] = {"limit_percent": 0}
    granted = set(conditions(rules(render(raw), "tenant-ranker-admission")["granted-gpu-resources"])[0]["value"])
    assert "nvidia.com/mig-1g.10gb" not in granted and "nvidia.com/gpu" in granted


def test_runtime_classes_follow_the_trust_level(dev, raw):
    assert rules(dev, "tenant-partner-acme-admission")["runtime-classes"]["validate"]["pattern"] == {"spec": {"=(runtimeClassName)": "nvidia"}}
    raw["layers"]["kyverno"]["runtime_classes"] = {"high": ["nvidia", "nvidia-cdi"], "low": []}
    rendered = render(raw)
    assert rules(rendered, "tenant-search-admission")["runtime-classes"]["validate"]["pattern"] == {"spec": {"=(runtimeClassName)": "nvidia | nvidia-cdi"}}
    assert rules(rendered, "tenant-partner-acme-admission")["runtime-classes"]["validate"]["pattern"] == {"spec": {"X(runtimeClassName)": "null"}}


def test_images_come_only_from_the_allowed_registries(dev, dev_raw):
    allowed = " | ".join([*dev_raw[0]["layers"]["kyverno"]["allowed_registries"], *slinky.TENANT_IMAGES, *VCLUSTER_IMAGES])  # dev has a Slurm tenant
    pattern = rules(dev, "tenant-image-registries")["allowed-registries"]["validate"]["pattern"]["spec"]
    assert pattern == {"=(ephemeralContainers)": [{"image": allowed}], "=(initContainers)": [{"image": allowed}], "containers": [{"image": allowed}]}


def test_tenant_services_get_no_node_port_and_no_external_ips(dev):
    policy = rules(dev, "tenant-service-exposure")
    assert policy["no-node-port"]["validate"]["pattern"] == {"spec": {"=(type)": "!NodePort"}}
    assert policy["no-external-ips"]["validate"]["pattern"] == {"spec": {"X(externalIPs)": "null"}}
    assert {r["match"]["any"][0]["resources"]["kinds"][0] for r in policy.values()} == {"Service"}


def test_webhooks_fail_closed_but_spare_kube_system_and_kyverno_with_three_replicas(dev, raw):
    values = one(dev, "HelmRelease", "kyverno")["spec"]["values"]
    (excluded,) = values["config"]["webhooks"]["namespaceSelector"]["matchExpressions"]
    assert excluded == {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kyverno"]}
    assert values["features"]["forceFailurePolicyIgnore"]["enabled"] is False
    assert values["admissionController"]["replicas"] == 3
    raw["layers"]["kyverno"]["admission_replicas"] = 2
    with pytest.raises(ConfigError, match="admission_replicas: must be >= 3"):
        validate(raw)


def test_removing_a_tenant_removes_only_its_admission_policy(dev, raw):
    raw["tenants"] = [t for t in raw["tenants"] if t["name"] != "partner-acme"]
    without = {p["metadata"]["name"]: p for p in objects(render(raw), "ClusterPolicy")}
    before = {p["metadata"]["name"]: p for p in objects(dev, "ClusterPolicy")}
    assert set(before) - set(without) == {"tenant-partner-acme-admission"}
    assert all(without[name] == before[name] for name in without)


def admits_tolerations(rule: dict, tolerations: list[dict]) -> bool:
    """The rendered `placement-tolerations` rule applied to a pod's tolerations (`tests/kyverno_engine.py`)."""
    assert all(each["list"] == TOLERATIONS for each in rule["validate"]["foreach"])
    request = Request({"kind": "Pod", "metadata": {"namespace": "t"}, "spec": {"containers": [], "tolerations": tolerations}})
    return not validate_denies(rule["validate"], request, request.context())


def test_tenants_may_tolerate_only_their_placement_taints(dev, dev_raw):
    cfg = validate(dev_raw[0])
    plan = plan_for(cfg)
    for tenant in cfg.tenants:
        rule = rules(dev, f"tenant-{tenant.name}-admission")["placement-tolerations"]
        assert rule["match"]["any"][0]["resources"] == {"kinds": OWN_PODS, "namespaces": [f"tenant-{tenant.name}"]}
        each, others = rule["validate"]["foreach"]
        assert set(each["preconditions"]["any"][0]["value"]) == {"", *PLACEMENT_TAINT_KEYS}
        operator, pair = each["deny"]["conditions"]["any"]
        assert (operator["operator"], operator["value"]) == ("NotEquals", "Equal")
        # Exactly the stack's PodTolerationRestriction whitelist, without the node-lifecycle pairs.
        whitelist = [t for t in allowed_tolerations(tenant_stack_args(cfg, plan, tenant, ())) if t not in NODE_LIFECYCLE_TOLERATIONS]
        assert pair["operator"] == "AnyNotIn" and pair["value"] == [f"{t['key']}={t['value']}" for t in whitelist]
        assert whitelist and {t["key"] for t in whitelist} <= set(PLACEMENT_TAINT_KEYS)
        # Every other taint: only the node-lifecycle ones, NoExecute, for bounded seconds.
        assert others["preconditions"]["all"] == [{"key": "{{ element.key || '' }}", "operator": "AnyNotIn", "value": ["", *PLACEMENT_TAINT_KEYS]}]
        key, operator, effect, seconds = others["deny"]["conditions"]["any"]
        assert (key["operator"], key["value"]) == ("AnyNotIn", list(STANDARD_TOLERATION_KEYS))
        assert (operator["value"], effect["value"], seconds["operator"], seconds["value"]) == ("Exists", "NoExecute", "GreaterThan", MAX_TOLERATION_SECONDS)
    acme = rules(dev, "tenant-partner-acme-admission")["placement-tolerations"]
    assert acme["validate"]["foreach"][0]["deny"]["conditions"]["any"][1]["value"] == [f"{DEDICATED_LABEL}=partner-acme"]


def test_foreign_wildcard_empty_key_and_unlisted_tolerations_are_denied(dev):
    acme, search = (rules(dev, f"tenant-{t}-admission")["placement-tolerations"] for t in ("partner-acme", "search"))
    own = {"key": DEDICATED_LABEL, "operator": "Equal", "value": "partner-acme", "effect": "NoSchedule"}
    lifecycle = [{**t, "tolerationSeconds": MAX_TOLERATION_SECONDS} for t in NODE_LIFECYCLE_TOLERATIONS]
    assert admits_tolerations(acme, [])
    assert admits_tolerations(acme, [own, *lifecycle])
    assert admits_tolerations(search, [{"key": "ai-factory.io/trust-domain", "value": "internal", "effect": "NoSchedule"}, *lifecycle])
    for refused in (
        {"key": "ai-factory.io/trust-domain", "operator": "Equal", "value": "internal", "effect": "NoSchedule"},
        {"key": "ai-factory.io/trust-domain", "operator": "Equal", "value": "unassigned", "effect": "NoSchedule"},
        {"key": DEDICATED_LABEL, "operator": "Equal", "value": "someone-else"},
        {"key": DEDICATED_LABEL, "operator": "Exists"},
        {"key": "ai-factory.io/trust-domain", "operator": "Exists", "effect": "NoSchedule"},
        {"operator": "Exists"},
        {"key": "", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        {**NODE_LIFECYCLE_TOLERATIONS[0]},  # for ever
        {**NODE_LIFECYCLE_TOLERATIONS[1], "tolerationSeconds": MAX_TOLERATION_SECONDS + 1},
    ):
        assert not admits_tolerations(acme, [own, refused]), refused
    assert not admits_tolerations(search, [own])  # another tenant's dedicated nodes


def test_only_low_trust_tenants_must_select_their_dedicated_nodes(dev):
    rule = rules(dev, "tenant-partner-acme-admission")["dedicated-nodes"]
    assert rule["match"]["any"][0]["resources"] == {"kinds": OWN_PODS, "namespaces": ["tenant-partner-acme"]}
    (condition,) = rule["validate"]["deny"]["conditions"]["any"]
    assert condition == {"key": DEDICATED_SELECTOR, "operator": "NotEquals", "value": "partner-acme"}
    assert condition["key"] == "{{ request.object.spec.nodeSelector.\"ai-factory.io/dedicated\" || '' }}"
    for tenant in ("search", "assistant"):  # high and medium trust
        assert "dedicated-nodes" not in rules(dev, f"tenant-{tenant}-admission")


def test_a_low_trust_tenants_vcluster_control_plane_runs_on_its_dedicated_nodes(dev):
    values = one(dev, "HelmRelease", "vcluster-partner-acme")["spec"]["values"]["controlPlane"]
    pinned = {"nodeSelector": {DEDICATED_LABEL: "partner-acme"}, "tolerations": [{"key": DEDICATED_LABEL, "operator": "Equal", "value": "partner-acme", "effect": "NoSchedule"}]}
    assert values["statefulSet"]["scheduling"] == pinned and values["coredns"]["deployment"] == pinned
    assert "scheduling" not in one(dev, "HelmRelease", "vcluster-assistant")["spec"]["values"]["controlPlane"]["statefulSet"]
