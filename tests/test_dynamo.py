"""NVIDIA Dynamo (`components/dynamo.py`): the operator installed once, tenants' `runtime: dynamo`
models as DynamoGraphDeployments, the declarations refused before anything is rendered, and the
offline check and pack policy over Dynamo's objects (table-driven)."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

from ai_factory.factory.model.loading import ConfigError, validate
from ai_factory.factory.planning.report import model_table
from ai_factory.factory.rendering.bundle import Rendered
from ai_factory.factory.rendering.charts import releases_of, template_all
from tests.conftest import objects, one, render
from tests.test_bad_input import refused_render

SEARCH, ASSISTANT, PARTNER = 0, 1, 2
ON_DYNAMO = {(SEARCH, 0): "llama-8b", (SEARCH, 1): "llama-70b", (ASSISTANT, 0): "qwen-1-5b"}
"""Dev's MIG, disaggregated whole-GPU and HAMi models, moved to Dynamo; partner-acme's stays on KServe."""


def on_dynamo(raw: dict[str, Any]) -> dict[str, Any]:
    raw["layers"]["dynamo"] = {"enabled": True}
    for (tenant, index), _ in ON_DYNAMO.items():
        raw["tenants"][tenant]["models"][index]["runtime"] = "dynamo"
    return raw


@pytest.fixture(scope="module")
def dynamo_raw(dev_raw) -> tuple[dict[str, Any], set[str]]:
    return on_dynamo(copy.deepcopy(dev_raw[0])), dev_raw[1]


@pytest.fixture(scope="module")
def rendered(dynamo_raw) -> Rendered:
    return render(*dynamo_raw)


def services(rendered: Rendered, name: str) -> dict[str, dict]:
    return one(rendered, "DynamoGraphDeployment", name)["spec"]["services"]


def gpu_part(resources: dict) -> dict[str, str]:
    return {k: v for k, v in resources.items() if k.startswith("nvidia.com/")}


# --------------------------------------------------------------------------- the platform


def test_the_operator_is_installed_once_without_nats_etcd_kai_or_grove(rendered, dev):
    release = one(rendered, "HelmRelease", "dynamo-platform")
    assert release["metadata"]["namespace"] == "dynamo-system"
    values = release["spec"]["values"]
    assert values["nats"] == {"enabled": False} and values["dynamo-operator"]["nats"] == {"enabled": False}
    assert values["dynamo-operator"]["discoveryBackend"] == "kubernetes"
    assert values["global"] == {"etcd": {"install": False}, "kai-scheduler": {"install": False, "enabled": False}, "grove": {"install": False, "enabled": False}}
    assert one(rendered, "Namespace", "dynamo-system")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    assert not [m for m in dev.manifests if m.layer == "dynamo"], "dev leaves the layer off"


def test_the_operator_values_are_the_charts_own_keys(rendered, oracles):
    values = one(rendered, "HelmRelease", "dynamo-platform")["spec"]["values"]
    assert oracles.validate_values("dynamo/chart", values) == []


def test_the_real_chart_renders_the_operator_alone_under_pod_security_baseline(rendered, chart_env):
    releases = [r for r in releases_of(rendered)[0] if r.name == "dynamo-platform"]
    [output] = template_all(releases, chart_env.charts_dir, chart_env.helm, rendered.kubernetes_version, chart_env.store)
    assert output.error is None, output.error
    workloads = [d for d in output.documents if d.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job")]
    assert [w["metadata"]["name"] for w in workloads] == ["dynamo-platform-dynamo-operator-controller-manager"]
    pod = workloads[0]["spec"]["template"]["spec"]
    assert "initContainers" not in pod, "Flux applies the CRDs; no crd-apply container"
    assert pod["securityContext"] == {"runAsNonRoot": True}
    for container in pod["containers"]:
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert not [d for d in output.documents if "nats" in d["metadata"]["name"]]


# --------------------------------------------------------------------------- what a model renders


def test_each_dynamo_model_validates_against_the_upstream_crd(rendered, oracles):
    deployments = objects(rendered, "DynamoGraphDeployment")
    assert sorted(d["metadata"]["name"] for d in deployments) == sorted(ON_DYNAMO.values())
    for deployment in deployments:
        assert oracles.validate_custom_object(deployment) == []


@pytest.mark.parametrize(
    ("name", "worker", "gpus", "dynamo"),
    [
        ("llama-8b", "VllmWorker", {"nvidia.com/mig-3g.40gb": "1"}, {"gpu": "1", "gpuType": "nvidia.com/mig-3g.40gb"}),
        ("qwen-1-5b", "VllmWorker", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "12288", "nvidia.com/gpucores": "25"}, {"gpu": "1", "custom": {"nvidia.com/gpumem": "12288", "nvidia.com/gpucores": "25"}}),
        ("llama-70b", "VllmDecodeWorker", {"nvidia.com/gpu": "4"}, {"gpu": "4"}),
        ("llama-70b", "VllmPrefillWorker", {"nvidia.com/gpu": "4"}, {"gpu": "4"}),
    ],
    ids=["mig-profile", "hami-slice", "whole-gpus-decode", "whole-gpus-prefill"],
)
def test_a_dynamo_worker_asks_for_exactly_the_plans_gpu_resource(rendered, name, worker, gpus, dynamo):
    service = services(rendered, name)[worker]
    for side in ("requests", "limits"):
        assert {k: v for k, v in service["resources"][side].items() if k in ("gpu", "gpuType", "custom")} == dynamo
        assert gpu_part(service["extraPodSpec"]["mainContainer"]["resources"][side]) == gpus


def test_a_disaggregated_model_has_a_frontend_and_prefill_and_decode_workers(rendered):
    spec = one(rendered, "DynamoGraphDeployment", "llama-70b")["spec"]
    assert spec["backendFramework"] == "vllm"
    found = spec["services"]
    assert {n: (s["componentType"], s.get("subComponentType"), s["replicas"]) for n, s in found.items()} == {
        "Frontend": ("frontend", None, 1),
        "VllmPrefillWorker": ("worker", "prefill", 1),
        "VllmDecodeWorker": ("worker", "decode", 1),
    }
    assert found["VllmDecodeWorker"]["scalingAdapter"] == {"enabled": True}, "replicas 1-2: an autoscaler drives it"
    for role in ("prefill", "decode"):
        args = found[f"Vllm{role.title()}Worker"]["extraPodSpec"]["mainContainer"]["args"]
        assert f"--disaggregation-mode={role}" in args and "--tensor-parallel-size=4" in args
        assert not [a for a in args if a.startswith("--port=")]
    frontend = found["Frontend"]
    assert frontend["extraPodSpec"]["mainContainer"]["args"] == ["--http-port=8000"]
    assert not gpu_part(frontend["extraPodSpec"]["mainContainer"]["resources"]["limits"]) and "nodeSelector" not in frontend["extraPodSpec"]


def test_an_aggregated_model_has_one_worker_pinned_to_its_mig_device(rendered):
    found = services(rendered, "llama-8b")
    assert set(found) == {"Frontend", "VllmWorker"} and "subComponentType" not in found["VllmWorker"]
    env = {e["name"]: e.get("value") for e in found["VllmWorker"]["extraPodSpec"]["mainContainer"]["env"]}
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["HF_HOME"] == "/var/cache/models/huggingface"


def test_every_dynamo_pod_names_its_tenants_queue_and_tolerates_only_its_trust_domain(rendered):
    for deployment in objects(rendered, "DynamoGraphDeployment"):
        for name, service in deployment["spec"]["services"].items():
            assert service["extraPodMetadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default", name
            assert service["extraPodMetadata"]["labels"]["ai-factory.io/model"] == deployment["metadata"]["name"]
    worker = services(rendered, "qwen-1-5b")["VllmWorker"]["extraPodSpec"]
    assert worker["nodeSelector"] == {"ai-factory.io/pool": "l40s-infer", "ai-factory.io/trust-domain": "assistant"}
    assert [(t["key"], t["value"]) for t in worker["tolerations"]] == [("ai-factory.io/trust-domain", "assistant")]


def test_every_dynamo_container_runs_restricted_with_the_operators_discovery_account(rendered):
    for deployment in objects(rendered, "DynamoGraphDeployment"):
        for service in deployment["spec"]["services"].values():
            pod = service["extraPodSpec"]
            assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            context = pod["mainContainer"]["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]} and context["readOnlyRootFilesystem"] is True
            assert "serviceAccountName" not in pod and "automountServiceAccountToken" not in pod


def test_dynamo_pods_reach_the_api_server_for_discovery_and_the_hub_for_weights(rendered):
    discovery = one(rendered, "CiliumNetworkPolicy", "llama-70b-dynamo-discovery")
    assert discovery["metadata"]["namespace"] == "tenant-search"
    assert discovery["spec"]["endpointSelector"] == {"matchLabels": {"ai-factory.io/model": "llama-70b"}}
    assert discovery["spec"]["egress"] == [{"toEntities": ["kube-apiserver"], "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}, {"port": "6443", "protocol": "TCP"}]}]}]
    assert one(rendered, "CiliumNetworkPolicy", "llama-70b-model-hub")["spec"]["endpointSelector"] == discovery["spec"]["endpointSelector"]
    assert one(rendered, "ExternalSecret", "llama-70b-source")["spec"]["target"]["name"] == "llama-70b-source"


def test_a_pvc_model_reads_the_tenants_claim_read_only(dynamo_raw):
    raw = copy.deepcopy(dynamo_raw[0])
    raw["tenants"][ASSISTANT]["models"][0].update(source="pvc://qwen-weights/qwen2.5-1.5b")
    worker = services(render(raw), "qwen-1-5b")["VllmWorker"]["extraPodSpec"]
    assert {"name": "model-source", "persistentVolumeClaim": {"claimName": "qwen-weights", "readOnly": True}} in worker["volumes"]
    assert "--model=/mnt/models/qwen2.5-1.5b" in worker["mainContainer"]["args"]


def test_the_gateway_and_litellm_reach_a_dynamo_model_at_its_frontend(rendered):
    route = one(rendered, "HTTPRoute", "search-models")
    refs = [r for rule in route["spec"]["rules"] for r in rule["backendRefs"]]
    assert {"kind": "Service", "name": "llama-70b-frontend", "port": 8000, "weight": 2} in refs
    allowed = one(rendered, "CiliumClusterwideNetworkPolicy", "tenant-search-serving-models")["spec"]["ingress"][0]["toPorts"]
    assert {"port": "8000", "protocol": "TCP"} in allowed[0]["ports"]
    assert not objects(rendered, "LLMInferenceService") and not [i for i in objects(rendered, "InferenceService") if i["metadata"]["name"] in ON_DYNAMO.values()]


def test_the_plan_reserves_dynamo_replicas_at_their_maximum(dynamo_raw):
    rows = {cells[1]: cells for cells in zip(*(c.cells for c in model_table(validate(copy.deepcopy(dynamo_raw[0]))).columns))}
    assert rows["llama-70b"][2:7] == ("DynamoGraphDeployment", "h100-train", "4 GPUs", "1-2 +1 prefill", "12")


# --------------------------------------------------------------------------- refused declarations


def _model(tenant: int, index: int = 0) -> Callable[[dict], dict]:
    return lambda raw: raw["tenants"][tenant]["models"][index]


BAD: list[tuple[str, Callable[[dict], None], str]] = [
    (
        "dynamo-model-on-a-pool-not-granted",
        lambda r: _model(ASSISTANT)(r).update(gpus={"pool": "h100-train"}),
        "tenants[1].models[0].gpus.pool: tenant 'assistant' has no grant in pool 'h100-train'",
    ),
    (
        "dynamo-layer-off",
        lambda r: r["layers"]["dynamo"].update(enabled=False),
        "layers.dynamo.enabled: tenants[0].models[0].runtime, tenants[0].models[1].runtime, tenants[1].models[0].runtime ask for Dynamo; the Dynamo layer must be on",
    ),
    (
        "dynamo-worker-over-one-node",
        lambda r: _model(SEARCH, 1)(r).update(gpus={"pool": "h100-train", "count": 16}, tensor_parallel=8, pipeline_parallel=2, disaggregation=None, replicas={"min": 1, "max": 1}),
        "tenants[0].models[1].gpus.count: a Dynamo worker runs on one node; 16 GPUs are more than pool 'h100-train' has per node (8)",
    ),
    (
        "dynamo-s3-source",
        lambda r: _model(ASSISTANT)(r).update(source="s3://models-par1/qwen"),
        "tenants[1].models[0].source: a Dynamo model loads from hf:// or pvc://",
    ),
    ("unknown-runtime", lambda r: _model(ASSISTANT)(r).update(runtime="triton"), "tenants[1].models[0].runtime: must be one of 'kserve' or 'dynamo'"),
    (
        "dynamo-image-not-admitted",
        lambda r: r["layers"]["dynamo"].update(runtime_image="quay.io/me/dynamo:1.1.0"),
        "layers.kyverno.allowed_registries: Dynamo's runtime image (quay.io/me/dynamo:1.1.0, `layers.dynamo.runtime_image`)",
    ),
]


@pytest.mark.parametrize(("edit", "expected"), [(e, x) for _, e, x in BAD], ids=[i for i, _, _ in BAD])
def test_a_dynamo_model_that_cannot_be_served_is_one_problem_at_its_path(dynamo_raw, edit, expected):
    raw = copy.deepcopy(dynamo_raw[0])
    edit(raw)
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert len(err.value.problems) == 1, err.value.problems
    assert err.value.problems[0].startswith(expected), err.value.problems


def test_disaggregated_dynamo_models_need_neither_llm_ds_nor_kserves_images(dynamo_raw):
    raw = copy.deepcopy(dynamo_raw[0])
    raw["layers"]["kyverno"]["allowed_registries"] = ["nvcr.io/nvidia/*"]
    assert validate(raw).layers.kyverno.allowed_registries == ["nvcr.io/nvidia/*"]


def test_the_cli_refuses_a_dynamo_model_without_the_layer_with_exit_2_and_writes_nothing(tmp_path):
    from tests.test_bad_input import DEV_TEXT

    text = DEV_TEXT.replace("          scaling: {metric: queue-depth, target: 4}\n", "          scaling: {metric: queue-depth, target: 4}\n          runtime: dynamo\n")
    assert text != DEV_TEXT
    assert "layers.dynamo.enabled: tenants[1].models[0].runtime ask for Dynamo" in refused_render(tmp_path, text)


def test_the_workload_policies_read_a_dynamo_main_container_but_not_a_crds_schema(rendered):
    from ai_factory.policies.aif_policies.kube import containers, pod_specs

    spec = one(rendered, "DynamoGraphDeployment", "llama-8b")["spec"]
    found = list(pod_specs(spec))
    assert len(found) == 2 and all(next(containers(s))["image"].startswith("nvcr.io/nvidia/ai-dynamo/") for s in found)
    schema = {"mainContainer": {"type": "object", "properties": {"image": {"type": "string"}}}, "hostPID": {"type": "boolean"}}
    assert list(pod_specs(schema)) == []
