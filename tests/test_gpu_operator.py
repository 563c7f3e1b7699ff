"""The GPU Operator layer: values derived from the pools, secure toolkit settings, per-pool drivers."""

from __future__ import annotations

from ai_factory.components.gpu_operator import NODE_TAINT_KEYS
from ai_factory.factory.model.catalog import CHARTS
from tests.conftest import objects, one, render, without_models


def values(rendered):
    return one(rendered, "HelmRelease", "gpu-operator")["spec"]["values"]


def env_of(entries):
    return {e["name"]: e["value"] for e in entries}


def test_chart_is_the_pinned_release(dev):
    release = one(dev, "HelmRelease", "gpu-operator")
    assert release["spec"]["chart"]["spec"]["version"] == CHARTS["gpu-operator"].version == "v26.7.0"
    repos = [m.obj for m in dev.manifests if m.kind == "HelmRepository" and m.name == "helm-ngc-nvidia-com-nvidia" and m.namespace == "gpu-operator"]
    assert [r["spec"]["url"] for r in repos] == ["https://helm.ngc.nvidia.com/nvidia"]


def test_one_driver_per_pool_selected_by_pool_label(dev, dev_raw):
    drivers = {d["metadata"]["name"]: d["spec"] for d in objects(dev, "NVIDIADriver")}
    pools = dev_raw[0]["fleet"]["pools"]
    assert set(drivers) == {f"driver-{p['name']}" for p in pools}
    h100 = drivers["driver-h100-train"]
    assert h100["nodeSelector"] == {"ai-factory.io/pool": "h100-train"}
    assert h100["kernelModuleType"] == "open" and h100["version"] == "595.91.07"
    assert drivers["driver-a100-mig"]["kernelModuleType"] == "auto"
    assert values(dev)["driver"]["nvidiaDriverCRD"] == {"enabled": True, "deployDefaultCR": False}


def test_mig_manager_and_mixed_strategy_follow_mig_pools(dev, raw):
    assert values(dev)["migManager"]["enabled"] is True
    assert values(dev)["mig"]["strategy"] == "mixed"
    without_models(raw)
    raw["fleet"]["pools"][1]["sharing"] = "exclusive"
    raw["tenants"][0]["gpus"][1] = {"pool": "a100-mig", "count": 2}
    raw["tenants"][1]["gpus"][0] = {"pool": "a100-mig", "count": 2}
    without_mig = values(render(raw, {"layers"}))
    assert without_mig["migManager"]["enabled"] is False
    assert without_mig["mig"]["strategy"] == "single"


def test_toolkit_and_device_plugin_close_the_visible_devices_escape(dev):
    v = values(dev)
    toolkit_env = env_of(v["toolkit"]["env"])
    assert toolkit_env["ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"] == "false"
    assert toolkit_env["ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS"] == "true"
    assert toolkit_env["NVIDIA_CONTAINER_TOOLKIT_OPT_IN_FEATURES"] == "disable-cuda-compat-lib-hook"
    assert env_of(v["devicePlugin"]["env"]) == {"DEVICE_LIST_STRATEGY": "volume-mounts"}
    assert v["toolkit"]["version"] == "v1.20.0"


def test_operands_tolerate_every_platform_taint(dev):
    v = values(dev)
    for tolerations in (v["daemonsets"]["tolerations"], v["node-feature-discovery"]["worker"]["tolerations"]):
        assert {t["key"] for t in tolerations} == set(NODE_TAINT_KEYS)
    for driver in objects(dev, "NVIDIADriver"):
        assert {t["key"] for t in driver["spec"]["tolerations"]} == set(NODE_TAINT_KEYS)


def test_private_registry_credentials_are_wired_only_when_configured(dev, raw):
    assert values(dev)["toolkit"]["imagePullSecrets"] == ["registry-credentials"]
    assert all(d["spec"]["imagePullSecrets"] == ["registry-credentials"] for d in objects(dev, "NVIDIADriver"))
    del raw["layers"]["gpu_operator"]["registry"]
    public = render(raw)
    assert "imagePullSecrets" not in values(public)["toolkit"]
    assert [m for m in public.manifests if m.kind == "Secret" and m.layer == "gpu-operator"] == []


def test_operator_namespace_is_privileged_and_labelled(dev):
    ns = one(dev, "Namespace", "gpu-operator")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert ns["metadata"]["labels"]["app.kubernetes.io/part-of"] == "ai-factory"


def test_disabled_layer_renders_nothing(raw):
    raw["layers"]["gpu_operator"] = {"enabled": False}
    assert [m for m in render(raw).manifests if m.layer == "gpu-operator"] == []
