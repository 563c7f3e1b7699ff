"""Tenants' models (`tenants[].models`, `components/serving.py`): what each model renders into, and
the declarations refused before anything is rendered."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

from ai_factory.factory.model.loading import ConfigError, validate
from ai_factory.factory.model.serving import model_endpoints
from ai_factory.factory.planning.report import model_table
from tests.conftest import objects, one, render
from tests.test_bad_input import refused_render

SEARCH, ASSISTANT, PARTNER = 0, 1, 2


def model(raw: dict[str, Any], tenant: int, index: int = 0) -> dict[str, Any]:
    return raw["tenants"][tenant]["models"][index]


def container_of(isvc: dict) -> dict:
    return isvc["spec"]["predictor"]["model"]


def env_of(spec: dict) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in spec["env"]}


# --------------------------------------------------------------------------- what a model renders


@pytest.mark.parametrize(
    ("namespace", "name", "limits"),
    [
        ("tenant-search", "llama-8b", {"nvidia.com/mig-3g.40gb": "1"}),
        ("tenant-assistant", "qwen-1-5b", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "12288", "nvidia.com/gpucores": "25"}),
        ("tenant-partner-acme", "mistral-7b", {"nvidia.com/gpu": "1"}),
    ],
    ids=["mig-profile", "hami-slice", "whole-gpu"],
)
def test_a_model_pod_asks_for_exactly_its_gpu_resource(dev, namespace, name, limits):
    isvc = one(dev, "InferenceService", name)
    assert isvc["metadata"]["namespace"] == namespace
    resources = container_of(isvc)["resources"]
    gpu = {k: v for k, v in resources["limits"].items() if k.startswith("nvidia.com/")}
    assert gpu == limits
    assert {k: v for k, v in resources["requests"].items() if k.startswith("nvidia.com/")} == limits


def test_a_model_pod_asks_for_its_declared_cpu_and_memory_with_the_memory_limit_at_the_request(raw):
    model(raw, ASSISTANT)["resources"] = {"cpu": "2500m", "memory": "24Gi"}
    model(raw, SEARCH, 1)["resources"] = {"cpu": "6", "memory": "32Gi"}
    rendered = render(raw)
    small = container_of(one(rendered, "InferenceService", "qwen-1-5b"))["resources"]
    large = one(rendered, "LLMInferenceService", "llama-70b")["spec"]["template"]["containers"][0]["resources"]
    for resources, cpu, memory in ((small, "2500m", "24Gi"), (large, "6", "32Gi")):
        assert (resources["requests"]["cpu"], resources["requests"]["memory"]) == (cpu, memory)
        assert resources["limits"]["memory"] == memory and "cpu" not in resources["limits"]


@pytest.mark.parametrize(
    ("name", "selector", "toleration"),
    [
        ("llama-8b", {"ai-factory.io/pool": "a100-mig", "ai-factory.io/trust-domain": "internal"}, ("ai-factory.io/trust-domain", "internal")),
        ("mistral-7b", {"ai-factory.io/pool": "h100-train", "ai-factory.io/dedicated": "partner-acme"}, ("ai-factory.io/dedicated", "partner-acme")),
    ],
    ids=["shared-pool-own-domain", "low-trust-dedicated-nodes"],
)
def test_a_model_lands_on_and_tolerates_only_its_tenants_trust_domain(dev, name, selector, toleration):
    predictor = one(dev, "InferenceService", name)["spec"]["predictor"]
    assert predictor["nodeSelector"] == selector
    assert [(t["key"], t["value"]) for t in predictor["tolerations"]] == [toleration]


def test_every_model_pod_names_its_tenants_queue_and_its_model(dev):
    for isvc in objects(dev, "InferenceService"):
        assert isvc["spec"]["predictor"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"
        assert isvc["spec"]["predictor"]["labels"]["ai-factory.io/model"] == isvc["metadata"]["name"]
    llm = one(dev, "LLMInferenceService", "llama-70b")["spec"]
    assert llm["labels"]["kueue.x-k8s.io/queue-name"] == llm["prefill"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"


def test_vllm_is_pinned_to_its_one_mig_device_and_sizes_its_kv_cache_on_slices(dev):
    mig = container_of(one(dev, "InferenceService", "llama-8b"))
    assert env_of(mig)["CUDA_VISIBLE_DEVICES"] == "0"
    assert f"--kv-cache-memory-bytes={8 * 2**30}" in mig["args"]
    hami = container_of(one(dev, "InferenceService", "qwen-1-5b"))
    assert "CUDA_VISIBLE_DEVICES" not in env_of(hami)
    assert f"--kv-cache-memory-bytes={4 * 2**30}" in hami["args"] and "--gpu-memory-utilization=0.9" in hami["args"]
    whole = container_of(one(dev, "InferenceService", "mistral-7b"))
    assert not any(a.startswith("--kv-cache-memory-bytes") for a in whole["args"])


def test_weights_are_cached_in_a_volume_of_the_pod_never_on_a_shared_node_cache(dev):
    for isvc in objects(dev, "InferenceService"):
        volumes = {v["name"]: v for v in isvc["spec"]["predictor"]["volumes"]}
        assert "volumeClaimTemplate" in volumes["model-cache"]["ephemeral"]
        assert env_of(container_of(isvc))["HF_HOME"].startswith("/var/cache/models")
    kserve = one(dev, "HelmRelease", "kserve")
    assert kserve["spec"]["values"]["kserve"]["localmodel"]["enabled"] is False
    assert not objects(dev, "LocalModelCache")


def test_source_credentials_come_from_the_tenants_own_openbao_prefix(dev):
    secret = one(dev, "ExternalSecret", "llama-8b-source")
    assert secret["metadata"]["namespace"] == "tenant-search"
    assert secret["spec"]["secretStoreRef"] == {"kind": "SecretStore", "name": "openbao"}
    assert secret["spec"]["data"] == [{"secretKey": "HF_TOKEN", "remoteRef": {"key": "tenants/search/hf-token", "property": "token"}}]
    assert env_of(container_of(one(dev, "InferenceService", "llama-8b")))["HF_TOKEN"] == {"secretKeyRef": {"name": "llama-8b-source", "key": "HF_TOKEN"}}
    assert not [m for m in objects(dev, "ExternalSecret") if m["metadata"]["name"] == "qwen-1-5b-source"]


def test_replicas_scale_on_the_models_vllm_signal_from_the_platform_prometheus(dev):
    isvc = one(dev, "InferenceService", "qwen-1-5b")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "keda"
    (metric,) = isvc["spec"]["predictor"]["autoScaling"]["metrics"]
    external = metric["external"]
    assert external["metric"] == {
        "backend": "prometheus",
        "serverAddress": "http://prometheus-operated.monitoring.svc:9090",
        "query": 'sum(vllm:num_requests_waiting{namespace="tenant-assistant",model_name="assistant/qwen-1-5b"})',
    }
    assert external["target"] == {"type": "AverageValue", "averageValue": "4"}
    assert (isvc["spec"]["predictor"]["minReplicas"], isvc["spec"]["predictor"]["maxReplicas"]) == (1, 3)


def test_a_large_model_is_disaggregated_behind_an_endpoint_picker(dev):
    spec = one(dev, "LLMInferenceService", "llama-70b")["spec"]
    assert spec["prefill"]["replicas"] == 1
    assert spec["router"] == {"scheduler": {}}
    assert spec["parallelism"] == {"tensor": 4, "pipeline": 1} == spec["prefill"]["parallelism"]
    assert spec["scaling"] == {"minReplicas": 1, "maxReplicas": 2, "wva": {"keda": {}}}
    assert "worker" not in spec  # one node per replica
    (main,) = spec["template"]["containers"]
    assert main["name"] == "main" and main["image"].startswith("ghcr.io/llm-d/") and "command" not in main  # llm-d's preset runs vLLM
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert env_of(main)["VLLM_ADDITIONAL_ARGS"] == "--max-model-len=32768 --pipeline-parallel-size=1 --gpu-memory-utilization=0.9"


def test_the_gateway_reaches_each_model_at_the_service_kserve_creates():
    from ai_factory.factory.model.loading import load_stack_file

    by_name = {e.model: e for e in model_endpoints(load_stack_file("dev"))}
    assert by_name["llama-8b"].url == "http://llama-8b-predictor.tenant-search.svc.cluster.local:80/v1"
    assert by_name["llama-70b"].url == "https://llama-70b-kserve-workload-svc.tenant-search.svc.cluster.local:8000/v1"
    assert by_name["llama-70b"].inference_pool == "llama-70b-inference-pool"
    assert by_name["qwen-1-5b"].served_name == "assistant/qwen-1-5b"


def with_dra_pool(raw: dict[str, Any]) -> None:
    raw["fleet"]["pools"].append(
        {"name": "h200-dra", "site": "par1", "gpu": {"model": "H200-141GB", "per_node": 8}, "sharing": "dra", "nodes": 2, "topology": {"intra_node": "nvswitch", "fabric": "infiniband"}}
    )
    raw["tenants"][SEARCH]["gpus"].append({"pool": "h200-dra", "count": 16})
    raw["tenants"][SEARCH]["models"].append(
        {
            "name": "llama-405b",
            "source": "s3://models-par1/llama-405b-fp8",
            "credentials": {"secret": "s3-models"},
            "gpus": {"pool": "h200-dra", "count": 16},
            "tensor_parallel": 8,
            "pipeline_parallel": 2,
            "memory": {"parameters_billion": 405, "dtype": "fp8", "kv_cache_gib": 100},
        }
    )


def test_a_replica_over_two_nodes_is_a_leader_worker_group_of_dra_claims(raw):
    with_dra_pool(raw)
    rendered = render(raw)
    spec = one(rendered, "LLMInferenceService", "llama-405b")["spec"]
    for pod in (spec["template"], spec["worker"]):
        assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "h200-dra-gpu"}]
        assert pod["containers"][0]["resources"]["claims"] == [{"name": "gpus"}]
        assert not [k for k in pod["containers"][0]["resources"]["limits"] if k.startswith("nvidia.com/")]
    assert spec["parallelism"] == {"tensor": 8, "pipeline": 2}
    assert spec["model"]["uri"] == "s3://models-par1/llama-405b-fp8"
    assert one(rendered, "HelmRelease", "lws")["metadata"]["namespace"] == "lws-system"
    secret = one(rendered, "ExternalSecret", "llama-405b-source")
    assert {(d["secretKey"], d["remoteRef"]["property"]) for d in secret["spec"]["data"]} == {("AWS_ACCESS_KEY_ID", "access_key_id"), ("AWS_SECRET_ACCESS_KEY", "secret_access_key")}


def test_the_plan_shows_each_models_share_of_its_grant(dev_raw):
    cfg = validate(copy.deepcopy(dev_raw[0]))
    rows = {cells[1]: cells for cells in zip(*(c.cells for c in model_table(cfg).columns))}
    assert rows["llama-70b"][2:7] == ("LLMInferenceService", "h100-train", "4 GPUs", "1-2 +1 prefill", "12")
    assert rows["llama-8b"][4] == "3g.40gb" and rows["qwen-1-5b"][4] == "12288MiB/25%"


def test_the_plan_shows_each_models_cpu_and_memory_at_its_maximum_replicas(dev_raw):
    cfg = validate(copy.deepcopy(dev_raw[0]))
    rows = {cells[1]: cells for cells in zip(*(c.cells for c in model_table(cfg).columns))}
    # 2 decode + 1 prefill pods of 4 CPU / 16Gi, the endpoint picker (1.256 CPU, 16.5Gi limit) and
    # the 2 decode pods' routing sidecars (100m, 512Mi each).
    assert rows["llama-70b"][8] == "13.456 CPU / 65.5Gi"
    assert rows["qwen-1-5b"][8] == "12 CPU / 48Gi"


# --------------------------------------------------------------------------- refused declarations


def _set(path: Callable[[dict], dict], **values: Any) -> Callable[[dict], None]:
    return lambda raw: path(raw).update(values)


BAD: list[tuple[str, Callable[[dict], None], str]] = [
    (
        "pool-without-grant",
        _set(lambda r: model(r, ASSISTANT), gpus={"pool": "h100-train"}),
        "tenants[1].models[0].gpus.pool: tenant 'assistant' has no grant in pool 'h100-train'",
    ),
    (
        "mig-profile-too-small",
        _set(lambda r: model(r, SEARCH)["gpus"], mig="1g.10gb"),
        "tenants[0].models[0].gpus.mig: weights 14.9 GiB + KV cache 8 GiB = 22.9 GiB do not fit a replica's 9.5 GiB",
    ),
    (
        "hami-slice-too-small",
        _set(lambda r: model(r, ASSISTANT)["gpus"], memory_mib=4096),
        "tenants[1].models[0].gpus.memory_mib: weights 2.8 GiB + KV cache 4 GiB = 6.8 GiB do not fit",
    ),
    (
        "mig-profile-not-granted",
        _set(lambda r: model(r, SEARCH)["gpus"], mig="2g.20gb"),
        "tenants[0].models[0].gpus.mig: tenant 'search' is granted no 2g.20gb instance on pool 'a100-mig'",
    ),
    (
        "tensor-parallel-over-nvlink-domain",
        _set(lambda r: model(r, SEARCH, 1), gpus={"pool": "h100-train", "count": 16}, tensor_parallel=16),
        "tenants[0].models[1].tensor_parallel: 16-way tensor parallelism spans more than one NVLink domain of pool 'h100-train'",
    ),
    (
        "parallelism-not-the-gpu-count",
        _set(lambda r: model(r, SEARCH, 1), tensor_parallel=2),
        "tenants[0].models[1].gpus.count: 4 GPU(s) per replica, but tensor x pipeline parallelism is 2 x 1 = 2",
    ),
    (
        "tensor-parallel-on-a-slice",
        _set(lambda r: model(r, ASSISTANT), tensor_parallel=2),
        "tenants[1].models[0].tensor_parallel: a replica on hami pool 'l40s-infer' runs on one HAMi slice",
    ),
    (
        "replicas-over-the-grant",
        _set(lambda r: model(r, PARTNER), replicas={"min": 1, "max": 9}),
        "tenants[2].models[0].replicas.max: models mistral-7b need 9 GPUs on pool 'h100-train' at their maximum replicas; tenant 'partner-acme' is granted 8, 1 short",
    ),
    (
        "models-together-over-the-grant",
        _set(lambda r: model(r, SEARCH, 1), replicas={"min": 1, "max": 4}),
        "tenants[0].models[1].replicas.max: models llama-70b need 20 GPUs on pool 'h100-train' at their maximum replicas; tenant 'search' is granted 16, 4 short",
    ),
    (
        "pods-cpu-over-the-quota",
        lambda r: r["tenants"][ASSISTANT].setdefault("quota", {}).update(cpu="10"),
        "tenants[1].quota.cpu: models qwen-1-5b request 12 CPU at their maximum replicas; the quota holds 10, 2 short",
    ),
    (
        "pods-memory-over-the-quota",
        _set(lambda r: model(r, SEARCH), resources={"memory": "2Ti"}),
        "tenants[0].quota.memory: models llama-8b, llama-70b take 4161.5Gi of memory (requests 4147.49Gi, limits 4161.5Gi) at their maximum replicas; the quota holds 3Ti, 1089.5Gi short",
    ),
    (
        "pods-over-the-quota",
        lambda r: r["tenants"][PARTNER].setdefault("quota", {}).update(pods=1),
        "tenants[2].quota.pods: models mistral-7b run 2 pods at their maximum replicas; the quota holds 1, 1 short",
    ),
    ("pod-cpu-out-of-bounds", _set(lambda r: model(r, SEARCH), resources={"cpu": "1000"}), "tenants[0].models[0].resources.cpu: 1000 is not between 100m and 512"),
    ("pod-memory-out-of-bounds", _set(lambda r: model(r, SEARCH), resources={"memory": "512Mi"}), "tenants[0].models[0].resources.memory: 512Mi is not between 1Gi and 8Ti"),
    ("s3-settings-for-a-hub-source", _set(lambda r: model(r, SEARCH), s3={"region": "eu-west-3"}), "tenants[0].models[0].s3: only for an s3:// source"),
    (
        "s3-settings-without-credentials",
        _set(lambda r: model(r, ASSISTANT), source="s3://models/qwen", s3={"endpoint": "minio.storage.svc:9000"}),
        "tenants[1].models[0].s3: the settings reach KServe's storage initializer as annotations of the source's credential Secret",
    ),
    ("s3-endpoint-with-a-scheme", _set(lambda r: model(r, ASSISTANT), source="s3://models/qwen", credentials={"secret": "s3"}, s3={"endpoint": "https://minio:9000"}), "tenants[1].models[0].s3.endpoint: 'https://minio:9000' does not match"),
    ("s3-endpoint-port-out-of-range", _set(lambda r: model(r, ASSISTANT), source="s3://models/qwen", credentials={"secret": "s3"}, s3={"endpoint": "minio:70000"}), "tenants[1].models[0].s3.endpoint: port 70000 is not between 1 and 65535"),
    (
        "credential-variables-kserve-does-not-read",
        _set(lambda r: model(r, ASSISTANT), source="s3://models/qwen", credentials={"secret": "s3", "properties": {"AWS_ACCESS_KEY_ID": "id", "S3_SECRET": "key"}}),
        "tenants[1].models[0].credentials.properties: a s3:// source's downloader reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY; missing AWS_SECRET_ACCESS_KEY",
    ),
    (
        "hub-token-under-another-variable",
        _set(lambda r: model(r, SEARCH, 1), credentials={"secret": "hf-token", "properties": {"HUGGING_FACE_TOKEN": "token"}}),
        "tenants[0].models[1].credentials.properties: a hf:// source's downloader reads HF_TOKEN; missing HF_TOKEN",
    ),
    ("unknown-engine", _set(lambda r: model(r, SEARCH), engine="tgi"), "tenants[0].models[0].engine: must be one of 'vllm'"),
    (
        "plaintext-credential",
        _set(lambda r: model(r, SEARCH), credentials="hf_abcdefghijklmnopqrstu"),
        "tenants[0].models[0].credentials: a plaintext credential is refused",
    ),
    (
        "credential-in-the-source",
        _set(lambda r: model(r, SEARCH), source="hf://me:hf_abcdefghijklmnop@meta-llama/Llama-3.1-8B-Instruct"),
        "tenants[0].models[0].source: holds a plaintext credential",
    ),
    (
        "served-name-of-another-tenant",
        _set(lambda r: model(r, ASSISTANT), served_name="search/llama-8b"),
        "tenants[1].models[0].served_name: 'search/llama-8b' is already served by tenant 'search'",
    ),
    (
        "model-images-not-admitted",
        lambda r: r["layers"]["kyverno"].update(allowed_registries=["nvcr.io/nvidia/*", "docker.io/kserve/storage-initializer:*"]),
        "layers.kyverno.allowed_registries: llm-d's scheduler and model-server presets (ghcr.io/llm-d/llm-d-cuda:v0.8.0) runs in tenants' namespaces",
    ),
    ("time-sliced-pool", None, "tenants[1].models[0].gpus.pool: pool 'l40s-infer' is time-sliced"),
]


def _time_sliced(raw: dict) -> None:
    raw["fleet"]["pools"][2]["sharing"] = "time-slicing"
    raw["tenants"][ASSISTANT]["gpus"][1] = {"pool": "l40s-infer", "count": 6}
    model(raw, ASSISTANT)["gpus"] = {"pool": "l40s-infer"}


BAD[-1] = (BAD[-1][0], _time_sliced, BAD[-1][2])


@pytest.mark.parametrize(("edit", "expected"), [(e, x) for _, e, x in BAD], ids=[i for i, _, _ in BAD])
def test_a_model_that_cannot_be_served_is_one_problem_at_its_path(raw, edit, expected):
    edit(raw)
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert len(err.value.problems) == 1, err.value.problems
    assert err.value.problems[0].startswith(expected), err.value.problems


def test_the_dev_models_are_accepted(raw):
    assert sum(len(t.models) for t in validate(raw).tenants) == 4


def test_the_cli_refuses_a_model_over_its_grant_with_exit_2_and_writes_nothing(tmp_path):
    from tests.test_bad_input import DEV_TEXT

    text = DEV_TEXT.replace("replicas: {min: 1, max: 3}", "replicas: {min: 1, max: 7}")
    assert text != DEV_TEXT
    stderr = refused_render(tmp_path, text)
    assert "tenants[1].models[0].replicas.max" in stderr and "1 short" in stderr


def test_an_s3_model_is_downloaded_by_kserve_with_its_credential_secret_and_s3_settings(raw, oracles):
    model(raw, ASSISTANT).update(
        source="s3://models-par1/qwen",
        credentials={"secret": "s3-models"},
        s3={"endpoint": "minio.storage.svc:9000", "region": "eu-par-1", "use_https": False},
    )
    rendered = render(raw)
    isvc = one(rendered, "InferenceService", "qwen-1-5b")
    predictor = isvc["spec"]["predictor"]
    assert predictor["model"]["storageUri"] == "s3://models-par1/qwen" and "--model=/mnt/models" in predictor["model"]["args"]
    assert isvc["metadata"]["annotations"]["serving.kserve.io/secretName"] == "qwen-1-5b-source"
    assert "serviceAccountName" not in predictor and not [a for a in objects(rendered, "ServiceAccount") if a["metadata"]["name"] == "qwen-1-5b-source"]
    # The keys stay in the initializer: vLLM reads the downloaded files only.
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(env_of(container_of(isvc)))
    target = one(rendered, "ExternalSecret", "qwen-1-5b-source")["spec"]["target"]
    assert target["template"] == {"metadata": {"annotations": {
        "serving.kserve.io/s3-endpoint": "minio.storage.svc:9000",
        "serving.kserve.io/s3-region": "eu-par-1",
        "serving.kserve.io/s3-usehttps": "0",
        "serving.kserve.io/s3-verifyssl": "1",
    }}} and "data" not in target["template"]
    for kind, name in (("InferenceService", "qwen-1-5b"), ("ExternalSecret", "qwen-1-5b-source")):
        assert oracles.validate_custom_object(one(rendered, kind, name)) == [], (kind, name)
    assert not [p for p in objects(rendered, "CiliumNetworkPolicy") if p["metadata"]["name"] == "qwen-1-5b-model-hub"]


def test_a_large_hub_models_token_reaches_kserves_storage_initializer_not_vllm(dev):
    llm = one(dev, "LLMInferenceService", "llama-70b")
    assert llm["metadata"]["annotations"] == {"serving.kserve.io/secretName": "llama-70b-source"}
    # KServe's initializer reads `hf://owner/model:revision`.
    assert llm["spec"]["model"]["uri"] == "hf://meta-llama/Llama-3.3-70B-Instruct:main"
    for part in (llm["spec"], llm["spec"]["prefill"]):
        assert "HF_TOKEN" not in {e["name"] for e in part["template"]["containers"][0]["env"]}
    assert one(dev, "ExternalSecret", "llama-70b-source")["spec"]["data"][0]["secretKey"] == "HF_TOKEN"


def test_a_hub_model_of_an_inference_service_is_downloaded_by_vllm_with_its_token(dev):
    isvc = one(dev, "InferenceService", "llama-8b")
    assert "serving.kserve.io/secretName" not in (isvc["metadata"].get("annotations") or {})
    assert "storageUri" not in isvc["spec"]["predictor"]["model"]
    assert env_of(container_of(isvc))["HF_TOKEN"] == {"secretKeyRef": {"name": "llama-8b-source", "key": "HF_TOKEN"}}


def test_a_hub_model_may_reach_the_hub_and_nothing_else(dev):
    spec = one(dev, "CiliumNetworkPolicy", "llama-8b-model-hub")["spec"]
    assert spec["endpointSelector"] == {"matchLabels": {"ai-factory.io/model": "llama-8b"}}
    dns, hub = spec["egress"]
    assert hub["toFQDNs"] == [{"matchName": "huggingface.co"}, {"matchPattern": "*.huggingface.co"}, {"matchPattern": "*.hf.co"}]
    assert hub["toPorts"] == [{"ports": [{"port": "443", "protocol": "TCP"}]}]
    assert set(dns) == {"toEndpoints", "toPorts"} and "ingress" not in spec
