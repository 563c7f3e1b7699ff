"""Kyverno: every policy enforces and fails closed, and each one's intent is on its rendered rule."""

from __future__ import annotations

import pytest

from ai_factory.components.kyverno import ALL_CONTAINERS, DEDICATED_SELECTOR, ESCAPE_VARIABLES, QUEUE_LABEL, TOLERATIONS, VCLUSTER_IMAGES
from ai_factory.components.tenant_stack import NODE_LIFECYCLE_TOLERATIONS, allowed_tolerations, tenant_stack_args
from ai_factory.factory.model.loading import ConfigError, validate
from ai_factory.factory.planning.placement import DEDICATED_LABEL, PLACEMENT_TAINT_KEYS, advertised_resources
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.planning.quotas import gpu_ceiling
from ai_factory.factory.model.tenancy import TENANT_LABEL
from tests.conftest import objects, one, render

PLATFORM_POLICIES = ("tenant-gpu-queue", "tenant-gpu-escape-env", "tenant-gpu-device-mounts", "tenant-image-registries", "tenant-service-exposure")


def rules(rendered, policy: str) -> dict[str, dict]:
    return {r["name"]: r for r in one(rendered, "ClusterPolicy", policy)["spec"]["rules"]}


def conditions(rule: dict) -> list[dict]:
    return [c for each in rule["validate"]["foreach"] for c in each["deny"]["conditions"]["any"]]


def test_every_policy_enforces_fails_closed_and_scans_existing_objects(dev):
    policies = objects(dev, "ClusterPolicy")
    assert {p["metadata"]["name"] for p in policies} >= {*PLATFORM_POLICIES, "tenant-search-admission"}
    for policy in policies:
        spec = policy["spec"]
        assert (spec["failurePolicy"], spec["background"]) == ("Fail", True)
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
        assert rule["match"]["any"][0]["resources"] == {"kinds": ["Pod"], "namespaces": [f"tenant-{tenant}"]}
        assert rule["validate"]["podSecurity"] == {"level": "restricted", "version": "latest"}


def test_a_pod_security_exception_lowers_only_its_tenant_to_baseline(raw):
    raw["layers"]["tenancy"]["pod_security_exceptions"] = [
        {"tenant": "assistant", "level": "baseline", "reason": "legacy CUDA images run as root", "approved_by": "security-team"}
    ]
    rendered = render(raw)
    assert rules(rendered, "tenant-assistant-admission")["pod-security"]["validate"]["podSecurity"]["level"] == "baseline"
    assert rules(rendered, "tenant-search-admission")["pod-security"]["validate"]["podSecurity"]["level"] == "restricted"


def test_gpu_pods_and_jobs_must_name_a_queue(dev, dev_raw):
    gpu = list(advertised_resources(plan_for(validate(dev_raw[0]))))
    policy = one(dev, "ClusterPolicy", "tenant-gpu-queue")
    assert policy["metadata"]["annotations"] == {"pod-policies.kyverno.io/autogen-controllers": "none"}
    pod, job = rules(dev, "tenant-gpu-queue")["gpu-pods-carry-a-queue"], rules(dev, "tenant-gpu-queue")["gpu-jobs-carry-a-queue"]
    for rule, kind in ((pod, "Pod"), (job, "Job")):
        assert rule["match"]["any"][0]["resources"]["kinds"] == [kind]
        assert rule["validate"]["pattern"] == {"metadata": {"labels": {QUEUE_LABEL: "?*"}}}
        requests_gpu, unowned = rule["preconditions"]["all"]
        assert (requests_gpu["operator"], requests_gpu["value"]) == ("AnyIn", gpu)
        assert ".resources.[limits, requests]" in requests_gpu["key"] and "initContainers, containers" in requests_gpu["key"]
        assert (unowned["operator"], unowned["value"]) == ("Equals", 0)
    assert "kind=='Job'" in pod["preconditions"]["all"][1]["key"]  # a Job's pods: the Job carries the queue
    assert "spec.template.spec" in job["preconditions"]["all"][0]["key"]


def test_gpu_escape_variables_are_denied_in_every_container(dev):
    rule = rules(dev, "tenant-gpu-escape-env")["no-gpu-escape-variables"]
    assert rule["validate"]["foreach"][0]["list"] == ALL_CONTAINERS
    (condition,) = conditions(rule)
    assert condition["key"] == "{{ element.env[].name || `[]` }}" and condition["operator"] == "AnyIn"
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
    advertised = set(advertised_resources(plan))
    for tenant in cfg.tenants:
        rule = rules(dev, f"tenant-{tenant.name}-admission")["granted-gpu-resources"]
        limits, requests = conditions(rule)
        assert limits["key"].startswith("{{ keys(element.resources.limits") and requests["key"].startswith("{{ keys(element.resources.requests")
        allowed = {r for r, n in gpu_ceiling(cfg, plan, tenant).resources.items() if n > 0}
        assert set(limits["value"]) == set(requests["value"]) == advertised - allowed
    forbidden = set(conditions(rules(dev, "tenant-partner-acme-admission")["granted-gpu-resources"])[0]["value"])
    assert "nvidia.com/gpu" not in forbidden and {"nvidia.com/gpumem", "nvidia.com/mig-1g.10gb"} <= forbidden


def test_tenants_may_request_gpu_resources_they_can_only_borrow(raw):
    # Granted whole H100s only: the MIG instances of its trust domain are borrowable, so allowed;
    # another domain's MIG profiles and HAMi resources stay forbidden.
    raw["tenants"].append(
        {"name": "ranker", "trust": "high", "trust_domain": "internal", "owners": {"groups": ["ranker-admins"]}, "gpus": [{"pool": "h100-train", "count": 4}]}
    )
    rendered = render(raw)
    forbidden = set(conditions(rules(rendered, "tenant-ranker-admission")["granted-gpu-resources"])[0]["value"])
    assert not {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"} & forbidden
    assert {"nvidia.com/mig-2g.20gb", "nvidia.com/gpumem"} <= forbidden
    raw["tenants"][-1]["borrowing"] = {"limit_percent": 0}
    forbidden = set(conditions(rules(render(raw), "tenant-ranker-admission")["granted-gpu-resources"])[0]["value"])
    assert "nvidia.com/mig-1g.10gb" in forbidden and "nvidia.com/gpu" not in forbidden


def test_runtime_classes_follow_the_trust_level(dev, raw):
    assert rules(dev, "tenant-partner-acme-admission")["runtime-classes"]["validate"]["pattern"] == {"spec": {"=(runtimeClassName)": "nvidia"}}
    raw["layers"]["kyverno"]["runtime_classes"] = {"high": ["nvidia", "nvidia-cdi"], "low": []}
    rendered = render(raw)
    assert rules(rendered, "tenant-search-admission")["runtime-classes"]["validate"]["pattern"] == {"spec": {"=(runtimeClassName)": "nvidia | nvidia-cdi"}}
    assert rules(rendered, "tenant-partner-acme-admission")["runtime-classes"]["validate"]["pattern"] == {"spec": {"X(runtimeClassName)": "null"}}


def test_images_come_only_from_the_allowed_registries(dev, dev_raw):
    allowed = " | ".join([*dev_raw[0]["layers"]["kyverno"]["allowed_registries"], *VCLUSTER_IMAGES])
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
    """The rendered `placement-tolerations` rule applied to a pod's tolerations, reading every
    expression it uses (and failing on any other)."""
    (each,) = rule["validate"]["foreach"]
    assert each["list"] == TOLERATIONS
    (guard,) = each["preconditions"]["any"]
    assert (guard["key"], guard["operator"]) == ("{{ element.key || '' }}", "AnyIn")
    expressions = {
        "{{ element.key || '' }}": lambda t: t.get("key") or "",
        "{{ element.operator || 'Equal' }}": lambda t: t.get("operator") or "Equal",
        "{{ element.key || '' }}={{ element.value || '' }}": lambda t: f"{t.get('key') or ''}={t.get('value') or ''}",
    }
    operators = {"NotEquals": lambda key, value: key != value, "AnyNotIn": lambda key, value: key not in value}
    for toleration in tolerations:
        if expressions[guard["key"]](toleration) not in guard["value"]:
            continue
        if any(operators[c["operator"]](expressions[c["key"]](toleration), c["value"]) for c in each["deny"]["conditions"]["any"]):
            return False
    return True


def test_tenants_may_tolerate_only_their_placement_taints(dev, dev_raw):
    cfg = validate(dev_raw[0])
    plan = plan_for(cfg)
    for tenant in cfg.tenants:
        rule = rules(dev, f"tenant-{tenant.name}-admission")["placement-tolerations"]
        assert rule["match"]["any"][0]["resources"] == {"kinds": ["Pod"], "namespaces": [f"tenant-{tenant.name}"]}
        (each,) = rule["validate"]["foreach"]
        assert set(each["preconditions"]["any"][0]["value"]) == {"", *PLACEMENT_TAINT_KEYS}
        operator, pair = each["deny"]["conditions"]["any"]
        assert (operator["operator"], operator["value"]) == ("NotEquals", "Equal")
        # Exactly the stack's PodTolerationRestriction whitelist, without the node-lifecycle pairs.
        whitelist = [t for t in allowed_tolerations(tenant_stack_args(cfg, plan, tenant, ())) if t not in NODE_LIFECYCLE_TOLERATIONS]
        assert pair["operator"] == "AnyNotIn" and pair["value"] == [f"{t['key']}={t['value']}" for t in whitelist]
        assert whitelist and {t["key"] for t in whitelist} <= set(PLACEMENT_TAINT_KEYS)
    acme = rules(dev, "tenant-partner-acme-admission")["placement-tolerations"]
    assert acme["validate"]["foreach"][0]["deny"]["conditions"]["any"][1]["value"] == [f"{DEDICATED_LABEL}=partner-acme"]


def test_foreign_wildcard_and_empty_key_tolerations_are_denied(dev):
    acme, search = (rules(dev, f"tenant-{t}-admission")["placement-tolerations"] for t in ("partner-acme", "search"))
    own = {"key": DEDICATED_LABEL, "operator": "Equal", "value": "partner-acme", "effect": "NoSchedule"}
    ordinary = [
        *NODE_LIFECYCLE_TOLERATIONS,
        {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert admits_tolerations(acme, [])
    assert admits_tolerations(acme, [own, *ordinary])
    assert admits_tolerations(search, [{"key": "ai-factory.io/trust-domain", "value": "internal", "effect": "NoSchedule"}, *ordinary])
    for foreign in (
        {"key": "ai-factory.io/trust-domain", "operator": "Equal", "value": "internal", "effect": "NoSchedule"},
        {"key": "ai-factory.io/trust-domain", "operator": "Equal", "value": "unassigned", "effect": "NoSchedule"},
        {"key": DEDICATED_LABEL, "operator": "Equal", "value": "someone-else"},
        {"key": DEDICATED_LABEL, "operator": "Exists"},
        {"key": "ai-factory.io/trust-domain", "operator": "Exists", "effect": "NoSchedule"},
        {"operator": "Exists"},
        {"key": "", "operator": "Exists", "effect": "NoSchedule"},
    ):
        assert not admits_tolerations(acme, [own, foreign]), foreign
    assert not admits_tolerations(search, [own])  # another tenant's dedicated nodes


def test_only_low_trust_tenants_must_select_their_dedicated_nodes(dev):
    rule = rules(dev, "tenant-partner-acme-admission")["dedicated-nodes"]
    assert rule["match"]["any"][0]["resources"] == {"kinds": ["Pod"], "namespaces": ["tenant-partner-acme"]}
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
