"""`ai-factory quarantine`: one faulty GPU of a DRA node out of service through a DeviceTaintRule
that validates against the cluster's Kubernetes schema, and no rule where the device plugin does it
or the input is wrong (exit 2, nothing written)."""

from __future__ import annotations

import pytest
import yaml
from kubernetes_validate import validate as validate_object

from ai_factory.factory.cli import main
from ai_factory.factory.model.loading import ConfigError, validate
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.planning.quarantine import device_taint_rule
from tests.fleet_env import fold_clusters
from tests.test_bill import stack as billing_stack
from tests.test_device_layer import device_config


@pytest.fixture(scope="module")
def device(dev_raw):
    raw = device_config(dev_raw[0])
    return validate(raw), plan_for(validate(raw)), raw


def _version(raw: dict, version: str):
    raw = {**raw, "kubernetes": {**raw.get("kubernetes", {}), "version": version}}
    return validate(raw)


@pytest.mark.parametrize("version, api", [("1.34", "v1alpha3"), ("1.36", "v1beta2"), ("1.37", "v1")])
def test_a_dra_gpu_is_tainted_alone_with_the_api_of_the_clusters_version(device, version, api):
    _, plan, raw = device
    node = next(p for p in plan.pools if p.name == "h100-dra").nodes[0]
    rule, tenants = device_taint_rule(_version(raw, version), plan, node.name, 1, "NoExecute")
    assert rule["apiVersion"] == f"resource.k8s.io/{api}"
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": node.name, "device": "gpu-1"}
    assert rule["spec"]["taint"]["effect"] == "NoExecute"
    validate_object(rule, f"{version}.0", strict=True)
    assert set(tenants) <= {"assistant", "partner-acme"} and tenants


@pytest.mark.parametrize(
    "node, gpu, effect, message",
    [
        ("gpu-h100-01", 0, "NoSchedule", "served by the NVIDIA device plugin, which withdraws a GPU"),
        ("a100-mig-000", 0, "NoSchedule", "pool a100-mig (mig)"),
        ("h100-dra-9", 0, "NoSchedule", "'h100-dra-9' is no GPU node of the plan"),
        (None, 4, "NoSchedule", "has GPUs 0..3, not 4"),
        (None, 0, "PreferNoSchedule", "effect: 'PreferNoSchedule' is not one of NoSchedule, NoExecute"),
    ],
)
def test_no_rule_where_the_device_plugin_quarantines_or_the_input_is_wrong(device, node, gpu, effect, message):
    cfg, plan, _ = device
    node = node or next(p for p in plan.pools if p.name == "h100-dra").nodes[0].name
    with pytest.raises(ConfigError) as err:
        device_taint_rule(cfg, plan, node, gpu, effect)
    assert any(message in p for p in err.value.problems), err.value.problems


def test_the_cli_writes_the_rule_and_names_the_tenants(device, tmp_path, capsys):
    _, plan, _ = device

    def with_dra_pool(config: dict) -> None:
        fold_clusters(config["ai-factory:fleet"], config.get("ai-factory:tenants") or [])  # the `device` plan is dev as one cluster
        sections = device_config({k.split(":", 1)[1]: v for k, v in config.items() if k.startswith("ai-factory:")})
        config.update({f"ai-factory:{k}": v for k, v in sections.items()})

    stack = billing_stack(tmp_path, with_dra_pool)
    node = next(p for p in plan.pools if p.name == "h100-dra").nodes[0].name
    out = tmp_path / "rule.yaml"
    assert main(["quarantine", str(stack), "--node", node, "--gpu", "0", "--out", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["spec"]["taint"]["effect"] == "NoSchedule"
    assert "tenants holding that GPU:" in capsys.readouterr().out
    assert main(["quarantine", str(stack), "--node", "gpu-h100-01", "--gpu", "0", "--out", str(tmp_path / "no.yaml")]) == 2
    assert not (tmp_path / "no.yaml").exists()
