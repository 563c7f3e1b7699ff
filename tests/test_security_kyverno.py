"""Kyverno: every policy enforces and fails closed, and each one's intent is on its rendered rule."""

from __future__ import annotations

import pytest

from components.kyverno import ALL_CONTAINERS, ESCAPE_VARIABLES, QUEUE_LABEL, VCLUSTER_IMAGES
from factory.loading import ConfigError, validate
from factory.placement import advertised_resources
from factory.planning import plan_for
from factory.quotas import gpu_ceiling
from factory.tenancy import TENANT_LABEL
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
