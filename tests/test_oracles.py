"""The oracles bite: each valid case passes, and each broken variant fails naming its path.

Most tests run against the real oracle directory (the `oracles` fixture skips them when it is
absent); the tests of file-format handling build a tiny oracle directory of their own.
"""

from __future__ import annotations

import copy
import datetime
import json
import pathlib
from typing import Any

import pytest
import yaml

from ai_factory.factory.checking import oracles as oracles_module
from ai_factory.factory.checking.oracles import OracleError, Oracles, cached_crd_index, is_core_api, locate_upstream_dir

KUBERNETES = "1.34"


def cluster_queue() -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "gpu-queue", "labels": {"team": "a"}},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "h100",
                            "resources": [
                                {"name": "cpu", "nominalQuota": "64"},
                                {"name": "nvidia.com/gpu", "nominalQuota": 8},
                            ],
                        }
                    ],
                }
            ],
        },
    }


def gpu_quota(cq: dict[str, Any]) -> dict[str, Any]:
    return cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]


GPU_QUOTA_PATH = "spec.resourceGroups[0].flavors[0].resources[1].nominalQuota"


# ---- custom resources --------------------------------------------------------------------------


def test_valid_cluster_queue_passes(oracles: Oracles) -> None:
    assert oracles.validate_custom_object(cluster_queue()) == []
    assert oracles.validate_object(cluster_queue(), KUBERNETES) == []


def test_misspelt_field_fails_naming_its_path(oracles: Oracles) -> None:
    cq = cluster_queue()
    cq["spec"]["namespaceSelectr"] = cq["spec"].pop("namespaceSelector")
    assert oracles.validate_custom_object(cq) == ["ClusterQueue/gpu-queue: spec.namespaceSelectr: unknown field"]

    cq = cluster_queue()
    gpu_quota(cq)["nominalQouta"] = gpu_quota(cq).pop("nominalQuota")
    errors = oracles.validate_custom_object(cq)
    misspelt = "spec.resourceGroups[0].flavors[0].resources[1].nominalQouta"
    assert f"ClusterQueue/gpu-queue: {misspelt}: unknown field" in errors


def test_wrong_type_fails(oracles: Oracles) -> None:
    cq = cluster_queue()
    cq["spec"]["cohortName"] = 5
    cq["spec"]["resourceGroups"][0]["coveredResources"] = "cpu"
    assert oracles.validate_custom_object(cq) == [
        "ClusterQueue/gpu-queue: spec.cohortName: expected string, got integer",
        "ClusterQueue/gpu-queue: spec.resourceGroups[0].coveredResources: expected array, got string",
    ]


def test_unknown_kind_or_unserved_version_has_no_upstream_crd(oracles: Oracles) -> None:
    cq = cluster_queue()
    cq["kind"] = "ClusterQueu"
    assert oracles.validate_object(cq, KUBERNETES) == [
        "ClusterQueu/gpu-queue: no upstream CRD for kueue.x-k8s.io/v1beta2 ClusterQueu"
    ]
    cq = cluster_queue()
    cq["apiVersion"] = "kueue.x-k8s.io/v1alpha1"
    assert oracles.validate_custom_object(cq) == [
        "ClusterQueue/gpu-queue: no upstream CRD for kueue.x-k8s.io/v1alpha1 ClusterQueue"
        " (served versions: v1beta1, v1beta2)"
    ]
    assert oracles.crd_schema("kueue.x-k8s.io/v1alpha1", "ClusterQueue") is None


def test_metadata_is_checked_as_object_meta(oracles: Oracles) -> None:
    cq = cluster_queue()
    cq["metadata"]["labels"]["gpus"] = 8
    cq["metadata"]["lables"] = {}
    assert oracles.validate_custom_object(cq) == [
        "ClusterQueue/gpu-queue: metadata.labels.gpus: expected string, got integer",
        "ClusterQueue/gpu-queue: metadata.lables: unknown field",
    ]


def test_int_or_string_accepts_both_and_nothing_else(oracles: Oracles) -> None:
    quota = oracles.crd_schema("kueue.x-k8s.io/v1beta2", "ClusterQueue")["properties"]["spec"]["properties"][
        "resourceGroups"
    ]["items"]["properties"]["flavors"]["items"]["properties"]["resources"]["items"]["properties"]["nominalQuota"]
    assert quota["x-kubernetes-int-or-string"] is True and "type" not in quota

    for accepted in (8, "8", "500m", "1Gi"):
        cq = cluster_queue()
        gpu_quota(cq)["nominalQuota"] = accepted
        assert oracles.validate_custom_object(cq) == [], accepted
    cq = cluster_queue()
    gpu_quota(cq)["nominalQuota"] = True
    assert oracles.validate_custom_object(cq) == [
        f"ClusterQueue/gpu-queue: {GPU_QUOTA_PATH}: expected integer or string, got boolean"
    ]
    cq = cluster_queue()
    gpu_quota(cq)["nominalQuota"] = "eight"  # the quantity pattern still applies to strings
    (error,) = oracles.validate_custom_object(cq)
    assert error.startswith(f"ClusterQueue/gpu-queue: {GPU_QUOTA_PATH}: 'eight' does not match")


def helm_release() -> dict[str, Any]:
    return {
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": {"name": "gpu-operator", "namespace": "gpu-operator"},
        "spec": {
            "interval": "10m",
            "chart": {
                "spec": {
                    "chart": "gpu-operator",
                    "version": "v26.7.0",
                    "sourceRef": {"kind": "HelmRepository", "name": "nvidia"},
                }
            },
            "install": {"crds": "CreateReplace"},
            "values": {"driver": {"enabled": False}, "anything": [{"goes": {"here": 1}}]},
        },
    }


def test_preserve_unknown_fields_accepts_anything_below_but_not_beside(oracles: Oracles) -> None:
    values_schema = oracles.crd_schema("helm.toolkit.fluxcd.io/v2", "HelmRelease")["properties"]["spec"]["properties"][
        "values"
    ]
    assert values_schema["x-kubernetes-preserve-unknown-fields"] is True

    assert oracles.validate_custom_object(helm_release()) == []
    release = helm_release()
    release["spec"]["valuse"] = release["spec"].pop("values")
    assert oracles.validate_custom_object(release) == [
        "HelmRelease/gpu-operator/gpu-operator: spec.valuse: unknown field"
    ]


def test_flux_sources_validate(oracles: Oracles) -> None:
    helm_repository = {
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "HelmRepository",
        "metadata": {"name": "nvidia", "namespace": "flux-system"},
        "spec": {"interval": "1h", "url": "https://helm.ngc.nvidia.com/nvidia"},
    }
    oci_repository = {
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "OCIRepository",
        "metadata": {"name": "kueue", "namespace": "flux-system"},
        "spec": {
            "interval": "1h",
            "url": "oci://registry.k8s.io/kueue/charts/kueue",
            "ref": {"tag": "0.19.2"},
            "layerSelector": {"mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip", "operation": "copy"},
        },
    }
    release_from_oci = {
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": {"name": "kueue", "namespace": "kueue-system"},
        "spec": {
            "interval": "10m",
            "chartRef": {"kind": "OCIRepository", "name": "kueue", "namespace": "flux-system"},
            "values": {"enableCertManager": False},
        },
    }
    for obj in (helm_repository, oci_repository, release_from_oci):
        assert oracles.validate_object(obj, KUBERNETES) == [], obj["kind"]

    broken = copy.deepcopy(oci_repository)
    del broken["spec"]["url"]
    broken["spec"]["ref"]["tagg"] = "0.19.2"
    broken["spec"]["layerSelector"]["operation"] = "unpack"
    errors = oracles.validate_object(broken, KUBERNETES)
    assert errors[:2] == [
        "OCIRepository/flux-system/kueue: spec.layerSelector.operation: 'unpack' is not one of ['extract', 'copy']",
        "OCIRepository/flux-system/kueue: spec.ref.tagg: unknown field",
    ]
    assert errors[2:] == ["OCIRepository/flux-system/kueue: spec.url: required field missing"]


def test_go_regexp_flags_are_translated(oracles: Oracles) -> None:
    """Kueue writes `^(?i)[a-z]...`, which Python only accepts at the start of a pattern."""
    check = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": "prov"},
        "spec": {
            "controllerName": "kueue.x-k8s.io/provisioning-request",
            "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": "prov"},
        },
    }
    assert oracles.validate_custom_object(check) == []
    check["spec"]["parameters"]["kind"] = "9Config"
    (error,) = oracles.validate_custom_object(check)
    assert error.startswith("AdmissionCheck/prov: spec.parameters.kind: '9Config' does not match")


def test_openapi_boolean_exclusive_minimum(oracles: Oracles) -> None:
    """KAI's goMemLimitRatio says `minimum: 0, exclusiveMinimum: true` (OpenAPI 3.0 form)."""
    shard = {
        "apiVersion": "kai.scheduler/v1",
        "kind": "SchedulingShard",
        "metadata": {"name": "default"},
        "spec": {"goMemLimitRatio": 0.9},
    }
    assert oracles.validate_custom_object(shard) == []
    shard["spec"]["goMemLimitRatio"] = 0
    (error,) = oracles.validate_custom_object(shard)
    assert error.startswith("SchedulingShard/default: spec.goMemLimitRatio: 0 is less than or equal to")


def test_embedded_resource_allows_object_meta(oracles: Oracles) -> None:
    request = {
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeploymentRequest",
        "metadata": {"name": "llama", "namespace": "team-a"},
        "spec": {
            "model": "meta-llama/Llama-3.1-8B",
            "overrides": {
                "dgd": {
                    "apiVersion": "nvidia.com/v1alpha1",
                    "kind": "DynamoGraphDeployment",
                    "metadata": {"name": "llama", "labels": {"team": "a"}},
                    "spec": {"anything": True},
                }
            },
        },
    }
    assert oracles.validate_custom_object(request) == []
    request["spec"]["overrides"]["dgd"]["metadata"]["labels"]["team"] = ["a"]
    assert oracles.validate_custom_object(request) == [
        "DynamoGraphDeploymentRequest/team-a/llama: spec.overrides.dgd.metadata.labels.team: expected string, got array"
    ]


def test_same_kind_in_two_products_passes_against_either(oracles: Oracles) -> None:
    """network-operator bundles its own copy of the sriov CRDs: its SriovNetworkNodePolicy has
    devlinkParams, upstream's SriovNetwork has status.conditions."""
    policy = {
        "apiVersion": "sriovnetwork.openshift.io/v1",
        "kind": "SriovNetworkNodePolicy",
        "metadata": {"name": "ib", "namespace": "network-operator"},
        "spec": {
            "nicSelector": {"vendor": "15b3"},
            "nodeSelector": {"feature.node.kubernetes.io/network-sriov.capable": "true"},
            "numVfs": 8,
            "resourceName": "mlnxnics",
            "devlinkParams": {"params": []},
        },
    }
    network = {
        "apiVersion": "sriovnetwork.openshift.io/v1",
        "kind": "SriovNetwork",
        "metadata": {"name": "net", "namespace": "network-operator"},
        "spec": {"resourceName": "mlnxnics", "vlan": 4094},
        "status": {"conditions": []},
    }
    assert oracles.validate_custom_object(policy) == []
    assert oracles.validate_custom_object(network) == []
    network["spec"]["vlan"] = 4095
    # Neither copy accepts it; the errors against the first copy (network-operator's) are reported.
    assert oracles.validate_custom_object(network) == [
        "SriovNetwork/network-operator/net: spec.vlan: 4095 is greater than the maximum of 4094",
        "SriovNetwork/network-operator/net: status.conditions: unknown field",
    ]


# ---- file formats, on an oracle directory of our own ----------------------------------------------


def crd(kind: str, spec_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{kind.lower()}s.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": kind, "plural": f"{kind.lower()}s"},
            "scope": "Namespaced",
            "versions": [
                {"name": "v1alpha1", "served": False, "schema": {"openAPIV3Schema": {"type": "object"}}},
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                            },
                        }
                    },
                },
            ],
        },
    }


def custom(kind: str, spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": kind, "metadata": {"name": "x"}, "spec": spec}


def test_multi_document_and_compact_json_crd_files(tmp_path: pathlib.Path) -> None:
    crds = tmp_path / "product" / "crds"
    crds.mkdir(parents=True)
    nullable = {"type": "object", "properties": {"size": {"type": "integer", "nullable": True}}}
    checked = {
        "type": "object",
        "properties": {"empty": {"type": "object"}, "rule": {"type": "string"}},
        "x-kubernetes-validations": [{"rule": "self.rule == 'never'", "message": "CEL is not evaluated"}],
    }
    (crds / "two.yaml").write_text(yaml.safe_dump_all([crd("Alpha", nullable), crd("Beta", checked)]))
    (crds / "gamma.yaml").write_text("# Source: compact JSON\n" + json.dumps(crd("Gamma", {"type": "string"})))
    oracles = Oracles(tmp_path)

    assert oracles.validate_custom_object(custom("Alpha", {"size": None})) == []
    assert oracles.validate_custom_object(custom("Alpha", {"size": "1"})) == [
        "Alpha/x: spec.size: expected integer, got string"
    ]
    assert oracles.validate_custom_object(custom("Beta", {"empty": {}, "rule": "whatever"})) == []
    # The API server prunes every field of a bare `type: object`; setting one is a silent loss.
    assert oracles.validate_custom_object(custom("Beta", {"empty": {"lost": 1}})) == [
        "Beta/x: spec.empty.lost: unknown field"
    ]
    assert oracles.validate_custom_object(custom("Gamma", "text")) == []
    assert oracles.crd_schema("example.com/v1", "Gamma")["properties"]["spec"] == {"type": "string"}
    assert oracles.validate_custom_object({**custom("Gamma", "text"), "apiVersion": "example.com/v1alpha1"}) == [
        "Gamma/x: no upstream CRD for example.com/v1alpha1 Gamma (served versions: v1)"
    ]


def test_the_crd_index_is_reused_from_disk_only_for_the_same_oracle_content(tmp_path: pathlib.Path, monkeypatch) -> None:
    root, cache = tmp_path / "oracles", tmp_path / "cache"
    crds = root / "product" / "crds"
    crds.mkdir(parents=True)
    (crds / "alpha.yaml").write_text(yaml.safe_dump(crd("Alpha", {"type": "string"})))
    built = cached_crd_index(root, cache)
    assert built == {("example.com", "Alpha"): [(crds / "alpha.yaml", "v1alpha1", False), (crds / "alpha.yaml", "v1", True)]}
    assert len(list(cache.iterdir())) == 1
    parsed = []
    monkeypatch.setattr(oracles_module, "_read_crds", lambda path: parsed.append(path) or oracles_module._load_documents(path.read_text()))
    assert cached_crd_index(root, cache) == built
    assert parsed == []  # same content: read from the cache, nothing parsed
    (crds / "beta.yaml").write_text(yaml.safe_dump(crd("Beta", {"type": "string"})))
    assert set(cached_crd_index(root, cache)) == {("example.com", "Alpha"), ("example.com", "Beta")}
    assert parsed == [crds / "alpha.yaml", crds / "beta.yaml"]
    assert len(list(cache.iterdir())) == 2


def test_same_kind_defined_twice_passes_against_either(tmp_path: pathlib.Path) -> None:
    for product, field in (("a", "onlyInA"), ("b", "onlyInB")):
        folder = tmp_path / product / "crds"
        folder.mkdir(parents=True)
        spec = {"type": "object", "properties": {field: {"type": "string"}}}
        (folder / "thing.yaml").write_text(yaml.safe_dump(crd("Thing", spec)))
    oracles = Oracles(tmp_path)
    assert oracles.crd_schema("example.com/v1", "Thing")["properties"]["spec"]["properties"] == {
        "onlyInA": {"type": "string"}
    }
    assert oracles.validate_custom_object(custom("Thing", {"onlyInA": "x"})) == []
    assert oracles.validate_custom_object(custom("Thing", {"onlyInB": "x"})) == []
    # Neither accepts it: the errors against the first definition (by path) are reported.
    assert oracles.validate_custom_object(custom("Thing", {"onlyInC": "x"})) == ["Thing/x: spec.onlyInC: unknown field"]


# ---- built-in objects ---------------------------------------------------------------------------


def resource_quota(hard: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "quota", "namespace": "team-a"},
        "spec": {"hard": hard},
    }


def test_core_resource_quota(oracles: Oracles) -> None:
    valid = resource_quota({"requests.nvidia.com/gpu": 8, "limits.memory": "512Gi"})
    assert oracles.validate_core_object(valid, KUBERNETES) == []
    assert oracles.validate_object(valid, "1.34.0") == []
    assert oracles.validate_object(resource_quota("x"), KUBERNETES) == [
        "ResourceQuota/team-a/quota: spec.hard: expected object, got string"
    ]
    assert oracles.validate_object(resource_quota({"requests.nvidia.com/gpu": True}), KUBERNETES) == [
        'ResourceQuota/team-a/quota: spec.hard["requests.nvidia.com/gpu"]: expected string or number, got boolean'
    ]


def test_core_validation_is_strict(oracles: Oracles) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    assert oracles.validate_object(namespace, KUBERNETES) == []
    assert oracles.validate_object({**namespace, "labels": {"a": "b"}}, KUBERNETES) == [
        "Namespace/team-a: labels: unknown field"
    ]


def test_core_kind_missing_from_the_kubernetes_version(oracles: Oracles) -> None:
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"}, "spec": {}}
    assert oracles.validate_object(device_class, "1.34") == []
    assert oracles.validate_object(device_class, "1.33") == [
        "DeviceClass/gpu: Kubernetes 1.33 has no resource.k8s.io/v1 DeviceClass"
    ]
    with pytest.raises(ValueError, match="no schemas for Kubernetes 1.99"):
        oracles.validate_object(device_class, "1.99")


@pytest.mark.parametrize(
    "api_version",
    [
        "v1",
        "apps/v1",
        "batch/v1",
        "policy/v1",
        "autoscaling/v2",
        "rbac.authorization.k8s.io/v1",
        "resource.k8s.io/v1",
        "networking.k8s.io/v1",
        "scheduling.k8s.io/v1",
        "node.k8s.io/v1",
        "admissionregistration.k8s.io/v1",
        "storage.k8s.io/v1",
        "coordination.k8s.io/v1",
        "apiextensions.k8s.io/v1",
    ],
)
def test_builtin_groups_are_core(api_version: str) -> None:
    assert is_core_api(api_version)


@pytest.mark.parametrize(
    "api_version",
    [
        "gateway.networking.k8s.io/v1",
        "inference.networking.k8s.io/v1",
        "kueue.x-k8s.io/v1beta2",
        "leaderworkerset.x-k8s.io/v1",
        "helm.toolkit.fluxcd.io/v2",
        "nvidia.com/v1",
        "resource.nvidia.com/v1beta1",
    ],
)
def test_crd_groups_are_not_core(api_version: str) -> None:
    assert not is_core_api(api_version)


def test_no_oracle_crd_group_is_core(oracles: Oracles) -> None:
    groups = {
        crd_entry["group"]
        for source in oracles.root.glob("*/SOURCE.yaml")
        for crd_entry in (yaml.safe_load(source.read_text()) or {}).get("crds") or []
        if isinstance(crd_entry, dict) and crd_entry.get("group")
    }
    assert len(groups) > 30
    assert sorted(group for group in groups if is_core_api(f"{group}/v1")) == []


# ---- Helm values ----------------------------------------------------------------------------------


def test_gpu_operator_values_keys(oracles: Oracles) -> None:
    assert oracles.validate_values("gpu-operator/chart", {"driver": {"enabled": True}}) == []
    assert oracles.validate_values("gpu-operator/chart", {"driver": {"enabeld": True}}) == [
        "gpu-operator/chart: values.driver.enabeld: not a key of the chart's values.yaml"
    ]
    assert oracles.validate_values("gpu-operator/chart", {"driver": {"enabled": {"really": True}}}) == [
        "gpu-operator/chart: values.driver.enabled: "
        "the chart's values.yaml has a scalar default here (True), got object"
    ]


def test_keys_only_in_comments_are_not_keys(oracles: Oracles) -> None:
    """values.yaml shows `#version: ""` under operator; comments are not keys."""
    assert "#version:" in (oracles.root / "gpu-operator/chart/values.yaml").read_text()
    assert oracles.validate_values("gpu-operator/chart", {"operator": {"version": "v26.7.0"}}) == [
        "gpu-operator/chart: values.operator.version: not a key of the chart's values.yaml"
    ]


def test_empty_map_default_is_free_form(oracles: Oracles) -> None:
    defaults = yaml.safe_load((oracles.root / "gpu-operator/chart/values.yaml").read_text())
    assert defaults["daemonsets"]["labels"] == {}
    free_form = {"daemonsets": {"labels": {"team": "a", "any.domain/key": "b"}, "tolerations": [{"anything": 1}]}}
    assert oracles.validate_values("gpu-operator/chart", free_form) == []


def test_subchart_values_are_checked_against_the_subchart(oracles: Oracles) -> None:
    """node-feature-discovery's master.replicaCount is only in the subchart's own values.yaml,
    which also ships a values.schema.json."""
    chart = "gpu-operator/chart"
    assert oracles.validate_values(chart, {"node-feature-discovery": {"master": {"replicaCount": 2}}}) == []
    assert oracles.validate_values(chart, {"node-feature-discovery": {"master": {"replicaCont": 2}}}) == [
        f"{chart}: values.node-feature-discovery.master.replicaCont: "
        "not a key of the node-feature-discovery subchart's values.yaml"
    ]
    assert oracles.validate_values(chart, {"node-feature-discovery": {"master": {"replicaCount": "two"}}}) == [
        f"{chart}: values.node-feature-discovery.master.replicaCount: expected integer, got string "
        f"({chart}/charts/node-feature-discovery/values.schema.json)"
    ]


def test_vcluster_schema_rejects_unknown_keys(oracles: Oracles) -> None:
    chart = "vcluster/chart-release"
    assert oracles.validate_values(chart, {"controlPlane": {"distro": {"k8s": {"enabled": True}}}}) == []
    # Declared by values.schema.json but absent from values.yaml: the schema vouches for it.
    assert oracles.validate_values(chart, {"sync": {"toHost": {"pods": {"patches": []}}}}) == []
    assert oracles.validate_values(chart, {"controlPlane": {"distro": {"k8s": {"enabeld": True}}}}) == [
        f"{chart}: values.controlPlane.distro.k8s.enabeld: unknown field ({chart}/values.schema.json)"
    ]


def test_cilium_misspelt_top_level_key_fails_by_key_path(oracles: Oracles) -> None:
    schema = json.loads((oracles.root / "cilium/chart/values.schema.json").read_text())
    assert "additionalProperties" not in schema  # so the schema alone would let the typo through
    assert oracles.validate_values("cilium/chart", {"kubeProxyReplacement": True}) == []
    assert oracles.validate_values("cilium/chart", {"kubeProxyReplacment": True}) == [
        "cilium/chart: values.kubeProxyReplacment: not a key of the chart's values.yaml"
    ]
    (error,) = oracles.validate_values("cilium/chart", {"kubeProxyReplacement": 1})
    assert error.startswith("cilium/chart: values.kubeProxyReplacement: expected string or boolean, got integer")


def test_every_chart_accepts_its_own_defaults(oracles: Oracles) -> None:
    for values_file in sorted(oracles.root.glob("*/chart*/values.yaml")):
        chart = values_file.parent.relative_to(oracles.root).as_posix()
        defaults = yaml.safe_load(values_file.read_text()) or {}
        assert oracles.validate_values(chart, defaults) == [], chart


def test_missing_chart_is_an_oracle_error(oracles: Oracles) -> None:
    with pytest.raises(OracleError, match="no values.yaml"):
        oracles.validate_values("no-such-product/chart", {})


# ---- locating the oracle directory -----------------------------------------------------------------


def test_locate_upstream_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("FACTORY_UPSTREAM_DIR", str(tmp_path))
    assert locate_upstream_dir() == tmp_path
    monkeypatch.setenv("FACTORY_UPSTREAM_DIR", str(tmp_path / "missing"))
    with pytest.raises(OracleError):
        locate_upstream_dir()
    with pytest.raises(OracleError):
        Oracles(tmp_path / "missing")


def test_served_schemas_are_reused_from_disk_only_for_the_same_crd_files(tmp_path: pathlib.Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    crds = tmp_path / "oracles" / "product" / "crds"
    crds.mkdir(parents=True)
    (crds / "alpha.yaml").write_text(yaml.safe_dump(crd("Alpha", {"type": "string"})))
    wrong = Oracles(tmp_path / "oracles").validate_custom_object(custom("Alpha", 1))
    assert wrong and "spec" in wrong[0]
    parsed = []
    monkeypatch.setattr(oracles_module, "_read_crds", lambda path: parsed.append(path) or oracles_module._load_documents(path.read_text()))
    assert Oracles(tmp_path / "oracles").validate_custom_object(custom("Alpha", 1)) == wrong
    assert parsed == []  # same files: the schema read from the cache, no CRD parsed
    (crds / "alpha.yaml").write_text(yaml.safe_dump(crd("Alpha", {"type": "integer"})))
    assert Oracles(tmp_path / "oracles").validate_custom_object(custom("Alpha", 1)) == []
    assert parsed == [crds / "alpha.yaml"]


def test_a_crd_schema_json_cannot_hold_is_parsed_again_not_cached(tmp_path: pathlib.Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    crds = tmp_path / "oracles" / "product" / "crds"
    crds.mkdir(parents=True)
    (crds / "alpha.yaml").write_text(yaml.safe_dump(crd("Alpha", {"type": "string", "default": datetime.date(2026, 1, 1)})))
    assert Oracles(tmp_path / "oracles").validate_custom_object(custom("Alpha", "text")) == []
    assert not (tmp_path / "cache" / "ai-factory" / "crd-schemas").exists()
