"""Security layers (Cilium, Keycloak, OpenBao, External Secrets, Kyverno, Falco, Trivy): pinned
charts, values valid upstream and carrying each layer's decisions, stateful parts protected."""

from __future__ import annotations

import copy

import pytest
import yaml

from ai_factory.components.gpu_operator import NODE_TAINT_KEYS
from ai_factory.factory.model.catalog import CHARTS
from ai_factory.factory.checking.check import helm_values, schema
from ai_factory.factory.model.loading import validate
from ai_factory.factory.planning.placement import node_placements
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.rendering.bundle import Rendered
from tests.conftest import objects, one, render, without_models

SECURITY_LAYERS = ("cilium", "keycloak", "openbao", "external-secrets", "kyverno", "falco", "trivy")
RELEASES = {
    "cilium": "cilium",
    "keycloak": "keycloak",
    "openbao": "openbao",
    "external-secrets": "external-secrets",
    "kyverno": "kyverno",
    "falco": "falco",
    "trivy-operator": "trivy-operator",
}
HOOK_KINDS = ("SecretStore", "ClusterPolicy", "ServiceAccount")


def values(rendered: Rendered, release: str) -> dict:
    return one(rendered, "HelmRelease", release)["spec"]["values"]


def security_manifests(rendered: Rendered) -> list:
    """The layers' objects and what their hooks add to tenant environments."""
    return [m for m in rendered.manifests if m.layer in SECURITY_LAYERS or (m.tenant and m.kind in HOOK_KINDS)]


@pytest.mark.parametrize(("product", "release"), sorted(RELEASES.items()))
def test_each_layer_installs_its_pinned_chart(dev, product, release):
    chart = one(dev, "HelmRelease", release)["spec"]["chart"]["spec"]
    assert (chart["chart"], chart["version"]) == (CHARTS[product].name, CHARTS[product].version)


def test_security_objects_pass_the_schema_and_values_oracles(dev, oracles):
    mine = security_manifests(dev)
    assert {m.layer for m in mine} >= set(SECURITY_LAYERS)
    subset = Rendered(dev.config, dev.kubernetes_version, mine, [])
    assert [str(f) for check in (schema, helm_values) for f in check(subset, oracles)] == []


def test_a_misspelt_cilium_value_fails_although_its_schema_allows_unknown_keys(dev, oracles):
    mine = copy.deepcopy([m for m in dev.manifests if m.layer == "cilium"])
    release = next(m for m in mine if m.kind == "HelmRelease")
    release.obj["spec"]["values"]["hubbel"] = {"enabled": True}
    release.obj["spec"]["values"]["hubble"]["relay"]["enabeld"] = True
    findings = [str(f) for f in helm_values(Rendered(None, dev.kubernetes_version, mine, []), oracles)]
    assert any("values.hubbel" in f for f in findings) and any("values.hubble.relay.enabeld" in f for f in findings)


def test_cilium_runs_hubble_and_encrypts_pod_traffic(dev, raw):
    v = values(dev, "cilium")
    assert v["hubble"]["enabled"] and v["hubble"]["relay"]["enabled"] and v["hubble"]["ui"]["enabled"]
    assert v["encryption"] == {"enabled": True, "type": "wireguard"}
    raw["layers"]["cilium"] = {"encryption": "none", "hubble_ui": False}
    plain = values(render(raw), "cilium")
    assert "encryption" not in plain and plain["hubble"]["ui"]["enabled"] is False


def test_cilium_baseline_policies_only_add_allows(dev):
    baseline = {m.name: m.obj["spec"] for m in dev.manifests if m.layer == "cilium" and m.kind == "CiliumClusterwideNetworkPolicy"}
    assert set(baseline) == {"cluster-health-checks", "kube-dns-from-cluster"}
    for spec in baseline.values():
        assert spec["enableDefaultDeny"] == {"ingress": False, "egress": False}
        assert "egress" not in spec and "ingressDeny" not in spec
    assert baseline["cluster-health-checks"]["ingress"] == [{"fromEntities": ["health"]}]
    dns = baseline["kube-dns-from-cluster"]
    assert dns["endpointSelector"]["matchLabels"]["k8s:k8s-app"] == "kube-dns"
    assert {p["port"] for rule in dns["ingress"] for ports in rule["toPorts"] for p in ports["ports"]} == {"53"}


def test_openbao_is_ha_on_raft_with_volumes_that_outlive_it(dev):
    server = values(dev, "openbao")["server"]
    ha = server["ha"]
    assert ha["enabled"] and ha["raft"]["enabled"] and ha["replicas"] == 3
    assert [f"openbao-{i}.openbao-internal" in ha["raft"]["config"] for i in range(3)] == [True] * 3
    assert ha["disruptionBudget"] == {"enabled": True, "maxUnavailable": 1}
    storage_class = one(dev, "StorageClass", server["dataStorage"]["storageClass"])
    assert storage_class["reclaimPolicy"] == "Retain" and storage_class["provisioner"] == "rook-ceph.rbd.csi.ceph.com"
    assert server["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert values(dev, "openbao")["injector"] == {"enabled": False}


def test_external_secrets_serves_no_cluster_wide_kind(dev):
    v = values(dev, "external-secrets")
    assert v["crds"] == {"createClusterSecretStore": False, "createClusterExternalSecret": False, "createClusterGenerator": False, "createClusterPushSecret": False}
    assert [v[k] for k in ("processClusterStore", "processClusterExternalSecret", "processClusterGenerator", "processClusterPushSecret")] == [False] * 4
    assert objects(dev, "ClusterSecretStore") == [] and objects(dev, "ClusterExternalSecret") == []


def test_falco_and_trivy_tolerate_every_taint_the_plan_puts_on_gpu_nodes(dev, dev_raw):
    taint_keys = {t.key for p in node_placements(plan_for(validate(dev_raw[0]))) for t in p.taints}
    assert taint_keys and taint_keys <= set(NODE_TAINT_KEYS)
    for tolerations in (
        values(dev, "falco")["tolerations"],
        values(dev, "trivy-operator")["trivyOperator"]["scanJobTolerations"],
        values(dev, "trivy-operator")["nodeCollector"]["tolerations"],
    ):
        tolerated = {t["key"] for t in tolerations if t.get("operator") == "Exists"}
        assert set(NODE_TAINT_KEYS) <= tolerated
    assert {"node-role.kubernetes.io/control-plane"} <= {t["key"] for t in values(dev, "falco")["tolerations"]}


def test_falco_gpu_rules_watch_devices_toolkit_and_miners_and_name_the_namespace(dev):
    v = values(dev, "falco")
    items = yaml.safe_load(v["customRules"]["ai-factory-gpu-rules.yaml"])
    rules = {i["rule"]: i for i in items if "rule" in i}
    lists = {i["list"]: i["items"] for i in items if "list" in i}
    assert set(rules) == {
        "GPU device opened outside GPU workloads",
        "NVIDIA driver or container toolkit modified",
        "Crypto miner started",
        "Connection to a mining pool port",
    }
    assert "fd.name startswith /dev/nvidia" in rules["GPU device opened outside GPU workloads"]["condition"]
    assert {"gpu-operator", "hami-system"} <= set(lists["ai_factory_gpu_namespaces"])
    assert {"/usr/local/nvidia", "/etc/nvidia-container-runtime", "/run/nvidia"} <= set(lists["ai_factory_nvidia_host_paths"])
    assert "xmrig" in lists["ai_factory_miner_binaries"] and "stratum+tcp" in rules["Crypto miner started"]["condition"]
    assert all("namespace=%k8s.ns.name" in r["output"] for r in rules.values())
    assert v["driver"]["kind"] == "modern_ebpf" and v["falco"]["json_output"] is True


def test_trivy_metrics_carry_the_tenant_labels(dev):
    assert values(dev, "trivy-operator")["trivyOperator"]["reportResourceLabels"].split(",")[0] == "ai-factory.io/tenant"


def test_stateful_resources_are_protected_and_retained(dev):
    inventory = {(e["type"], e["name"]): e for e in dev.inventory}
    stateful = [
        ("kubernetes:core/v1:Namespace", "ai-factory-openbao-namespace"),
        ("kubernetes:storage.k8s.io/v1:StorageClass", "ai-factory-openbao-storage-class"),
        ("kubernetes:helm.sh/v3:Release", "ai-factory-openbao-release-openbao"),
        ("vault:index/mount:Mount", "ai-factory-openbao-kv"),
        ("kubernetes:core/v1:Namespace", "ai-factory-keycloak-namespace"),
        ("kubernetes:core/v1:Secret", "ai-factory-keycloak-database"),
    ]
    assert [(key, inventory[key]["protect"], inventory[key]["retainOnDelete"]) for key in stateful] == [(key, True, True) for key in stateful]


def test_disabled_layers_render_nothing(raw):
    without_models(raw)
    for layer in ("cilium", "keycloak", "openbao", "external_secrets", "kyverno", "falco", "trivy"):
        raw["layers"][layer] = {"enabled": False}
    raw["layers"]["provisioning"] = {"enabled": False}  # its BMC credentials need OpenBao
    raw["layers"]["slinky"]["clusters"][0].pop("accounting")  # its database password comes from OpenBao
    rendered = render(raw)
    assert [m.ref for m in security_manifests(rendered) if not (m.kind == "ServiceAccount" and m.name == "default")] == []
    assert not [r for r in rendered.graph.resources if r.type.startswith(("vault:", "keycloak:", "pulumi:providers:vault", "pulumi:providers:keycloak"))]


def test_external_secrets_without_openbao_is_refused(raw):
    from ai_factory.factory.model.loading import ConfigError

    raw["layers"]["openbao"] = {"enabled": False}
    with pytest.raises(ConfigError, match="layers.external_secrets.enabled: tenants' secret stores read OpenBao"):
        validate(raw)
