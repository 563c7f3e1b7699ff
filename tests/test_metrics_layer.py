"""The metrics layer: Prometheus sized by the config, what tenants may see, and the dev environment's
own rendered recording rules fed synthetic series for its pools and tenants."""

from __future__ import annotations

import pytest

from ai_factory.components.metrics import MetricsArgs, chart_values, opencost_values
from ai_factory.factory.metering.rules import TENANT_ALLOCATED, POOL_IDLE
from ai_factory.factory.model.config import MetricsLayer
from ai_factory.factory.model.loading import validate
from ai_factory.factory.planning.from_config import plan_for
from tests.promtool_support import SAMPLES, RuleTest, gpu_seconds, run_rule_test

HOUR = SAMPLES * 60
MIB = 1024**2


def _args(raw, **metrics) -> MetricsArgs:
    raw["layers"]["metrics"] = {**raw["layers"]["metrics"], **metrics}
    cfg = validate(raw)
    return MetricsArgs.from_config(cfg, plan_for(cfg, None))


def test_prometheus_keeps_the_configured_days_and_stops_at_85_percent_of_its_volume(raw):
    spec = chart_values(_args(raw, retention_days=60, storage_gib=500, storage_class="fast"))["prometheus"]["prometheusSpec"]
    assert spec["retention"] == "60d"
    assert spec["retentionSize"] == "425GiB"
    claim = spec["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"]["requests"]["storage"] == "500Gi" and claim["storageClassName"] == "fast"


@pytest.mark.parametrize("field, value", [("retention_days", 1), ("storage_gib", 5), ("storage_gib", 100_000), ("retention_days", 5000)])
def test_out_of_bounds_sizes_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        MetricsLayer(**{field: value})


def test_only_platform_namespaces_escape_namespace_enforcement(raw):
    spec = chart_values(_args(raw))["prometheus"]["prometheusSpec"]
    assert spec["enforcedNamespaceLabel"] == "namespace" and spec["ignoreNamespaceSelectors"] is True
    assert {e["namespace"] for e in spec["excludedFromEnforcement"]} == {"monitoring", "gpu-operator", "hami-system"}


def test_opencost_prices_no_gpu_and_reads_the_operators_prometheus(raw):
    args = _args(raw)
    values = opencost_values(args, args.opencost)["opencost"]
    assert values["customPricing"]["costModel"]["GPU"] == 0
    assert values["prometheus"]["internal"] | {"enabled": True} == {"enabled": True, "serviceName": "prometheus-operated", "namespaceName": "monitoring", "port": 9090}


def _of(dev, kind, namespace=None):
    return [m for m in dev.manifests if m.kind == kind and (namespace is None or m.namespace == namespace)]


@pytest.mark.parametrize("tenant", ["search", "assistant", "partner-acme"])
def test_a_tenants_query_proxy_enforces_its_namespace_and_admits_only_it(dev, tenant):
    namespace = f"tenant-{tenant}"
    (proxy,) = [m for m in _of(dev, "Deployment", "monitoring") if m.name == f"prom-label-proxy-{tenant}"]
    args = proxy.obj["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--label=namespace" in args and f"--label-value={namespace}" in args
    (policy,) = [m for m in _of(dev, "CiliumNetworkPolicy", "monitoring") if m.name == f"prom-label-proxy-{tenant}"]
    sources = [e["matchLabels"] for rule in policy.obj["spec"]["ingress"] for e in rule["fromEndpoints"]]
    assert sources == [{"k8s:io.kubernetes.pod.namespace": namespace}]


@pytest.mark.parametrize("tenant", ["search", "assistant", "partner-acme"])
def test_a_tenants_workload_monitor_scrapes_only_its_namespace(dev, tenant):
    (monitor,) = _of(dev, "PodMonitor", f"tenant-{tenant}")
    assert monitor.obj["spec"]["namespaceSelector"] == {"matchNames": [f"tenant-{tenant}"]}


def _rendered_groups(dev) -> list[dict]:
    """Every group the dev environment gives Prometheus: the tenants' first (see promtool_support)."""
    rules = sorted(_of(dev, "PrometheusRule"), key=lambda m: (m.namespace == "monitoring", m.namespace))
    return [group for m in rules for group in m.obj["spec"]["groups"]]


def _pod(test: RuleTest, tenant: str, pod: str, node: str, resource: str, count: int) -> None:
    base = {"namespace": f"tenant-{tenant}", "pod": pod}
    test.add("kube_pod_container_resource_requests", {**base, "container": "main", "node": node, "resource": resource, "unit": "integer"}, (count, SAMPLES))
    test.add("kube_pod_status_phase", {**base, "phase": "Running", "uid": pod}, (1, SAMPLES))


def test_dev_rules_give_each_tenant_its_hand_computed_gpu_seconds(dev, tmp_path):
    test = RuleTest()
    _pod(test, "search", "pretrain", "gpu-h100-01", "nvidia_com_gpu", 8)
    _pod(test, "partner-acme", "finetune", "gpu-h100-03", "nvidia_com_gpu", 8)
    _pod(test, "search", "eval", "a100-mig-000", "nvidia_com_mig_1g_10gb", 6)
    _pod(test, "assistant", "rag", "a100-mig-001", "nvidia_com_mig_2g_20gb", 3)
    # A VM's virt-launcher pod asks for its GPUs under the sandbox device plugin's name.
    _pod(test, "search", "workstation", "h100-vm-000", "nvidia_com_GH100_H100_SXM5_80GB", 2)
    l40s = 46068 * MIB  # what HAMi registers for an L40S (the catalog's memory_mib)
    test.add("hami_gpu_memory_limit_bytes", {"node": "l40s-infer-000", "device_uuid": "GPU-l40s-0", "device_index": "0", "device_type": "NVIDIA-L40S"}, (l40s, SAMPLES))
    for i in range(3):
        test.add(
            "hami_vgpu_memory_allocated_bytes",
            {"namespace": "tenant-assistant", "pod": f"chat-{i}", "node": "l40s-infer-000", "container_index": "0", "device_uuid": "GPU-l40s-0"},
            (12288 * MIB, SAMPLES),
        )
    labels = {"h100-train": ("H100-80GB", "exclusive"), "a100-mig": ("A100-80GB", "mig"), "l40s-infer": ("L40S-48GB", "hami"), "h100-vm": ("H100-80GB", "exclusive")}

    def row(tenant, pool):
        model, mode = labels[pool]
        return {"tenant": tenant, "namespace": f"tenant-{tenant}", "pool": pool, "gpu_model": model, "mode": mode}

    hami_share = 3 * 12288 / 46068
    expected = {
        ("search", "h100-train"): 8.0,
        ("partner-acme", "h100-train"): 8.0,
        ("search", "a100-mig"): 6 / 8,
        ("assistant", "a100-mig"): 3 * 2 / 8,
        ("assistant", "l40s-infer"): hami_share,
        ("search", "h100-vm"): 2.0,
    }
    test.expect(
        gpu_seconds(TENANT_ALLOCATED, "tenant, namespace, pool, gpu_model, mode"),
        [(row(t, p), round(v * HOUR, 3)) for (t, p), v in sorted(expected.items())],
    )
    idle = {"a100-mig": 16 - 6 / 8 - 6 / 8, "h100-train": 32 - 16, "l40s-infer": 8 - hami_share, "h100-vm": 8 - 2}
    test.expect(
        gpu_seconds(POOL_IDLE, "pool, gpu_model, mode"),
        [({"pool": p, "gpu_model": labels[p][0], "mode": labels[p][1]}, round(v * HOUR, 3)) for p, v in sorted(idle.items())],
    )
    result = run_rule_test(_rendered_groups(dev), test, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
