"""Model serving: KServe (standard mode: plain Deployments and Services, no Knative, no Istio) with
vLLM, and each tenant's models (`tenants[].models`) in the tenant's own namespace.

Platform-wide (this component), in `layers.serving.namespace`: the `kserve-crd` and
`kserve-resources` charts, the controller in `Standard` deployment mode with ingress creation off
(the shared inference gateway routes to models, KServe creates no Ingress or HTTPRoute), and no
`LocalModelCache` (KServe's node-local model cache is one host path shared by every namespace: one
tenant's weights would be readable by another). When a model is disaggregated or spans nodes, also
`kserve-llmisvc-crd` + `kserve-llmisvc-resources` (the llm-d integration, with the Gateway API
Inference Extension CRDs) and the LeaderWorkerSet chart (multi-node replicas).

Per tenant with models (`ServingTenantHook`), in the tenant's namespace:
- a `ServingRuntime` `vllm` (the vLLM OpenAI server as a Pod Security restricted container);
- per model an `InferenceService` (or an `LLMInferenceService` with prefill/decode separation and an
  `InferencePool` with its endpoint picker, `router.scheduler`; a replica over several nodes is a
  LeaderWorkerSet group, `worker`). Its pods ask for exactly the GPU resource of the model's shape
  on its pool (whole `nvidia.com/gpu`, one MIG `nvidia.com/mig-<profile>`, one HAMi vGPU with
  `nvidia.com/gpumem`/`nvidia.com/gpucores`, or a claim from the tenant's ResourceClaimTemplate of
  a DRA pool), carry the tenant's Kueue queue, select the offering of their pool for the tenant's
  trust domain and tolerate only its taints;
- the source credentials, when the model names some: an `ExternalSecret` from the tenant's own
  OpenBao store (`tenants/<tenant>/<key>`), consumed as environment variables;
- the weights' download cache: a generic ephemeral volume per pod, in the tenant's namespace and
  deleted with the pod, so no cache is ever shared across tenants (nor needs ReadWriteMany);
- for a `hf://` source, a CiliumNetworkPolicy letting the model's pods reach the Hugging Face Hub
  (and nothing else beyond the tenant's baseline).

Autoscaling is on an LLM signal from vLLM's own metrics: requests waiting (`queue-depth`) or KV-cache
use (`kv-cache`) per replica. The metrics source is the platform Prometheus (`layers.metrics`), which
scrapes every tenant pod port named `metrics` (its per-tenant PodMonitor); the scaler is KEDA
through KServe (`serving.kserve.io/autoscalerClass: keda`, a Prometheus trigger): a cluster
prerequisite, like cert-manager for KServe's webhook certificates (neither has a pinned chart here).

vLLM pitfalls handled:
- HAMi: HAMi-core reports the slice as the device's memory, so `--gpu-memory-utilization` is a share
  of the slice; vLLM's start-up profiling of free memory is unreliable under HAMi's soft limits
  (Project-HAMi/HAMi #1381, HAMi-core #181, vllm-project/vllm #40937), so the KV cache is sized
  explicitly (`--kv-cache-memory-bytes`) from the model's stated headroom instead of profiled.
- MIG: vLLM parses `CUDA_VISIBLE_DEVICES` as integers and fails on `MIG-<uuid>`
  (vllm-project/vllm #41848, #6551), and reads the parent GPU's memory through NVML
  (vllm-project/vllm #41776). The container sees exactly its one MIG device, so it is pinned to
  `CUDA_VISIBLE_DEVICES=0`, and the KV cache is sized explicitly there too.
- Caches: see above; `HF_HOME` points at the pod's own ephemeral volume.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
from pydantic import ValidationError

from ai_factory.components._common import FactoryComponent, helm_release, labels, namespace, restricted_container, tenant_entry
from ai_factory.components.external_secrets import STORE_NAME, secret_prefix
from ai_factory.components.kyverno import QUEUE_LABEL
from ai_factory.components.metrics import PROMETHEUS_SERVICE, TENANT_METRICS_PORT
from ai_factory.components.registry import Layer
from ai_factory.factory.checking import serving as serving_checks
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig, KyvernoLayer, ModelResources, Pool, ServedModel, ServingLayer, Tenant
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.model.raw import as_dict, as_list
from ai_factory.factory.model.serving import (
    ModelEndpoint,
    ReplicaShape,
    cache_gib,
    endpoint,
    grant_problems,
    model_problems,
    pod_gpu_resources,
    quota_problems,
    replica_shape,
)
from ai_factory.factory.model.tenancy import TenantNames
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.planning.placement import Offering, offering_name, offerings

TOKEN = "ai-factory:serving:Serving"
KSERVE = "serving.kserve.io"
RUNTIME_NAME = "vllm"
MODEL_FORMAT = "vllm"
CONTAINER = "kserve-container"
"""The container name KServe merges a predictor's model spec into."""
PORT = 8080
"""vLLM's API port; its `/metrics` is on the same port, named `metrics` so the tenant's PodMonitor
scrapes it."""
CACHE_MOUNT = "/var/cache/models"
RUN_AS = 1000
AUTOSCALER_CLASS = "serving.kserve.io/autoscalerClass"
HF_HOSTS = ("huggingface.co", "*.huggingface.co", "*.hf.co")
"""The Hub and its storage (LFS and Xet CDNs)."""
SCALING_QUERIES = {
    "queue-depth": "sum(vllm:num_requests_waiting{{namespace=\"{ns}\",model_name=\"{served}\"}})",
    "kv-cache": "sum(vllm:kv_cache_usage_perc{{namespace=\"{ns}\",model_name=\"{served}\"}}) * 100",
}
"""Per model, the signal summed over its pods; KServe/KEDA compare it per replica (`AverageValue`)."""
LLM_D_IMAGE = "ghcr.io/llm-d/llm-d-cuda:v0.8.0"
"""The model server of llm-d's v0.20.0 presets (vLLM with NIXL for prefill/decode KV transfer),
stated on the container so admission sees it; the scheduler, sidecar and tokenizer images come
from the same registry."""
STORAGE_SECRET_ANNOTATION = f"{KSERVE}/secretName"
"""The model object's annotation naming the Secret KServe's storage initializer takes its
credentials from (`kserve.storage.storageSecretNameAnnotation` of the kserve-resources chart)."""
STORAGE_INITIALIZER = "docker.io/kserve/storage-initializer:v0.20.0"
"""KServe's downloader, run in a model's pod for s3:// and LLMInferenceService sources."""


RESTRICTED_CONTAINER = restricted_container(RUN_AS)
"""Pod Security restricted, with a read-only root: vLLM writes only to its cache volume (`HOME`,
`HF_HOME`: compile and kernel caches, weights) and to /tmp."""


# --------------------------------------------------------------------------- platform


@dataclass(frozen=True)
class ServingArgs:
    namespace: str
    crd_chart: ChartSource
    chart: ChartSource
    llmisvc_crd_chart: ChartSource
    llmisvc_chart: ChartSource
    llmisvc_configs_chart: ChartSource
    lws_chart: ChartSource
    lws_namespace: str

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> ServingArgs:
        layer = cfg.layers.serving
        return cls(
            namespace=layer.namespace,
            crd_chart=layer.crd_chart.source("kserve-crd"),
            chart=layer.chart.source("kserve-resources"),
            llmisvc_crd_chart=layer.llmisvc_crd_chart.source("kserve-llmisvc-crd"),
            llmisvc_chart=layer.llmisvc_chart.source("kserve-llmisvc-resources"),
            llmisvc_configs_chart=layer.llmisvc_configs_chart.source("kserve-runtime-configs"),
            lws_chart=layer.lws_chart.source("lws"),
            lws_namespace=layer.lws_namespace,
        )


def controller_values() -> dict[str, Any]:
    """Shared by both resources charts: standard mode, no ingress of KServe's own."""
    return {
        "deploymentMode": "Standard",
        "gateway": {"disableIngressCreation": True, "disableIstioVirtualHost": True},
    }


def kserve_values() -> dict[str, Any]:
    return {"kserve": {"controller": controller_values(), "localmodel": {"enabled": False}}}


def llmisvc_values() -> dict[str, Any]:
    # The shared objects (inferenceservice-config, the webhook issuer, the default storage
    # container) come from the kserve-resources release in the same namespace.
    return {"kserve": {"createSharedResources": False, "controller": controller_values(), "llmisvc": {"createGIECRDs": True}}}


LLMISVC_CONFIGS_VALUES = {"kserve": {"llmisvcConfigs": {"enabled": True}, "servingruntime": {"enabled": False}}}
"""The llm-d presets on, KServe's cluster-wide model-server runtimes off (tenants use their own `vllm`)."""


class Serving(FactoryComponent):
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: ServingArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="serving", opts=opts)
        ns = namespace(self, args.namespace, pod_security="restricted")
        crds = helm_release(self, "kserve-crd", args.crd_chart, namespace=ns.metadata.name, values={}, depends_on=[ns])
        helm_release(self, "kserve", args.chart, namespace=ns.metadata.name, values=kserve_values(), depends_on=[crds])
        # Installed whether or not a model needs them yet, so adding or removing a tenant's large
        # model never changes the platform.
        lws_ns = k8s.core.v1.Namespace(
            self.child_name("lws-namespace"),
            metadata=k8s.meta.v1.ObjectMetaArgs(name=args.lws_namespace, labels={**labels(self.layer), **{f"pod-security.kubernetes.io/{m}": "restricted" for m in ("enforce", "audit", "warn")}}),
            opts=self.child(),
        )
        helm_release(self, "lws", args.lws_chart, namespace=lws_ns.metadata.name, values={}, depends_on=[lws_ns])
        llm_crds = helm_release(self, "kserve-llmisvc-crd", args.llmisvc_crd_chart, namespace=ns.metadata.name, values={}, depends_on=[crds])
        helm_release(self, "kserve-llmisvc", args.llmisvc_chart, namespace=ns.metadata.name, values=llmisvc_values(), depends_on=[llm_crds])
        helm_release(self, "kserve-llmisvc-configs", args.llmisvc_configs_chart, namespace=ns.metadata.name, values=LLMISVC_CONFIGS_VALUES, depends_on=[llm_crds])
        self.namespace = ns.metadata.name
        self.register_outputs({"namespace": self.namespace})


# --------------------------------------------------------------------------- per model


@dataclass(frozen=True)
class ModelPlan:
    """Everything the serving objects of one model need, from the config and the plan."""

    model: ServedModel
    endpoint: ModelEndpoint
    shape: ReplicaShape
    pool: Pool
    offering: Offering
    """The offering of the model's pool for the tenant's trust domain: its node selector and its
    tolerations, nothing else."""
    prometheus: str | None
    """The metrics source of the autoscaler; None without the metrics layer (fixed replicas)."""


def gpu_resources(plan: ModelPlan) -> dict[str, str]:
    """Exactly the GPU resource one pod (one per node of a replica) asks for."""
    return pod_gpu_resources(plan.pool, plan.shape)


def container_resources(model: ServedModel | None, gpus: dict[str, str]) -> dict[str, Any]:
    """A model container's resources: the model's CPU and memory (`resources`, the runtime's
    defaults without a model) and exactly its GPU resource; the memory limit equals the request,
    as the planner counts it against the tenant's quota (`factory.model.serving.host_demand`)."""
    host = model.resources if model is not None else ModelResources()
    return {"requests": {"cpu": host.cpu, "memory": host.memory, **gpus}, "limits": {"memory": host.memory, **gpus}}


def dra_template(plan: ModelPlan) -> str:
    """The tenant's ResourceClaimTemplate of the pool (`components.dra`): one whole GPU per claim."""
    return f"{plan.pool.name}-gpu"


def vllm_args(plan: ModelPlan) -> list[str]:
    model, shape = plan.model, plan.shape
    source = model.source
    if source.startswith("hf://"):
        repo, _, revision = source.removeprefix("hf://").partition("@")
        where = [f"--model={repo}"] + ([f"--revision={revision}"] if revision else [])
    else:
        where = ["--model=/mnt/models"]  # KServe's storage initializer (s3) or the claim (pvc) puts it there
    args = [
        *where,
        f"--served-model-name={plan.endpoint.served_name}",
        f"--port={PORT}",
        f"--max-model-len={model.max_model_len}",
        f"--tensor-parallel-size={model.tensor_parallel}",
        f"--pipeline-parallel-size={model.pipeline_parallel}",
        f"--gpu-memory-utilization={model.gpu_memory_utilization:g}",
    ]
    if shape.sharing in ("mig", "hami"):
        per_gpu = model.memory.kv_cache_gib * 2**30 / max(1, shape.units)
        args.append(f"--kv-cache-memory-bytes={int(per_gpu)}")
    return args


def vllm_env(plan: ModelPlan) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": CACHE_MOUNT},
        {"name": "HF_HOME", "value": f"{CACHE_MOUNT}/huggingface"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": "DO_NOT_TRACK", "value": "1"},
    ]
    if plan.shape.sharing == "mig":
        env.append({"name": "CUDA_VISIBLE_DEVICES", "value": "0"})
    if not kserve_downloads(plan):
        # vLLM downloads a Hub model of an InferenceService itself; where KServe's storage
        # initializer downloads, the credentials stay in that init container alone.
        for variable in sorted(credential_properties(plan.model)):
            env.append({"name": variable, "valueFrom": {"secretKeyRef": {"name": source_secret(plan.model), "key": variable}}})
    return env


def credential_properties(model: ServedModel) -> dict[str, str]:
    """Environment variable -> property of the model's OpenBao secret; empty without credentials."""
    if model.credentials is None:
        return {}
    if model.credentials.properties:
        return dict(model.credentials.properties)
    if model.source.startswith("s3://"):
        return {"AWS_ACCESS_KEY_ID": "access_key_id", "AWS_SECRET_ACCESS_KEY": "secret_access_key"}
    return {"HF_TOKEN": "token"}


def kserve_downloads(plan: ModelPlan) -> bool:
    """KServe's storage initializer downloads the weights (an s3:// source, or any hf:// or s3://
    source of an LLMInferenceService); vLLM downloads a Hub model of an InferenceService itself,
    and a pvc:// source is mounted."""
    source = plan.model.source
    if source.startswith("pvc://"):
        return False
    return source.startswith("s3://") or plan.endpoint.kind == "LLMInferenceService"


def kserve_uri(source: str) -> str:
    """The source as KServe's storage initializer reads it: a Hub revision after `:`
    (`hf://owner/model:revision`), not the config's `@`."""
    if source.startswith("hf://"):
        repo, at, revision = source.partition("@")
        return f"{repo}:{revision}" if at else repo
    return source


def source_annotations(plan: ModelPlan) -> dict[str, str]:
    """The model object's annotations naming its credential Secret to KServe's storage initializer
    (`kserve.storage.storageSecretNameAnnotation`, the kserve-resources chart's default), which
    then reads the Secret's keys and `s3-*` annotations instead of the service account's secrets."""
    if plan.model.credentials is None or not kserve_downloads(plan):
        return {}
    return {STORAGE_SECRET_ANNOTATION: source_secret(plan.model)}


def secret_annotations(model: ServedModel) -> dict[str, str]:
    """KServe's `serving.kserve.io/s3-*` annotations of an s3:// source's credential Secret."""
    s3 = model.s3
    if s3 is None:
        return {}
    found = {f"{KSERVE}/s3-usehttps": "1" if s3.use_https else "0", f"{KSERVE}/s3-verifyssl": "1" if s3.verify_ssl else "0"}
    if s3.endpoint:
        found[f"{KSERVE}/s3-endpoint"] = s3.endpoint
    if s3.region:
        found[f"{KSERVE}/s3-region"] = s3.region
    return dict(sorted(found.items()))


def source_secret(model: ServedModel) -> str:
    return f"{model.name}-source"


def pod_labels(plan: ModelPlan, names: TenantNames) -> dict[str, str]:
    return {**names.labels, **dict(plan.endpoint.pod_labels), QUEUE_LABEL: names.local_queue}


def cache_volume(plan: ModelPlan, storage_class: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": f"{cache_gib(plan.model)}Gi"}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"name": "model-cache", "ephemeral": {"volumeClaimTemplate": {"spec": spec}}}


def volumes(plan: ModelPlan, storage_class: str | None) -> list[dict[str, Any]]:
    # vLLM's workers exchange tensors through /dev/shm (the container runtime's 64 MiB is too small).
    shm = "8Gi" if plan.model.tensor_parallel > 1 else "1Gi"
    return [cache_volume(plan, storage_class), {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}, {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}}]


def pod_placement(plan: ModelPlan) -> dict[str, Any]:
    return {
        "nodeSelector": dict(sorted(plan.offering.node_labels.items())),
        "tolerations": [t.toleration() for t in plan.offering.tolerations],
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}},
        "automountServiceAccountToken": False,
    }


def container(plan: ModelPlan) -> dict[str, Any]:
    """The predictor's model container, merged by KServe into the `vllm` runtime's."""
    gpus = gpu_resources(plan)
    spec: dict[str, Any] = {
        "name": CONTAINER,
        "args": vllm_args(plan),
        "env": vllm_env(plan),
        "resources": container_resources(plan.model, gpus),
        "securityContext": RESTRICTED_CONTAINER,
        "volumeMounts": [
            {"name": "model-cache", "mountPath": CACHE_MOUNT},
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    if plan.shape.sharing == "dra":
        spec["resources"]["claims"] = [{"name": "gpus"}]
    return spec


def dra_claims(plan: ModelPlan) -> list[dict[str, Any]]:
    return [{"name": "gpus", "resourceClaimTemplateName": dra_template(plan)}] if plan.shape.sharing == "dra" else []


def scaling_metric(plan: ModelPlan) -> tuple[str, str] | None:
    """(Prometheus query, per-replica target) of the model's signal; None when it does not scale."""
    model = plan.model
    if plan.prometheus is None or model.replicas.max == model.replicas.min:
        return None
    query = SCALING_QUERIES[model.scaling.metric].format(ns=plan.endpoint.namespace, served=plan.endpoint.served_name)
    return query, f"{model.scaling.target:g}"


def inference_service(plan: ModelPlan, names: TenantNames, storage_class: str | None) -> dict[str, Any]:
    model = plan.model
    predictor: dict[str, Any] = {
        "minReplicas": model.replicas.min,
        "maxReplicas": model.replicas.max,
        "labels": pod_labels(plan, names),
        "model": {
            "modelFormat": {"name": MODEL_FORMAT},
            "runtime": RUNTIME_NAME,
            **({} if model.source.startswith("hf://") else {"storageUri": model.source}),
            **{k: v for k, v in container(plan).items() if k in ("args", "env", "resources", "volumeMounts")},
        },
        "volumes": volumes(plan, storage_class),
        **pod_placement(plan),
    }
    if dra_claims(plan):
        predictor["resourceClaims"] = dra_claims(plan)
    annotations: dict[str, str] = source_annotations(plan)
    metric = scaling_metric(plan)
    if metric:
        query, target = metric
        annotations[AUTOSCALER_CLASS] = "keda"
        predictor["autoScaling"] = {
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"backend": "prometheus", "serverAddress": plan.prometheus, "query": query},
                        "target": {"type": "AverageValue", "averageValue": target},
                    },
                }
            ]
        }
    return {"metadata_annotations": annotations, "spec": {"predictor": predictor}}


def llm_container(plan: ModelPlan) -> dict[str, Any]:
    """The `main` container of an LLMInferenceService, merged into llm-d's preset
    (`kserve-config-llm-template`): the preset runs `vllm serve /mnt/models` on port 8000 with TLS,
    the served name and tensor parallelism from the spec, on llm-d's image (with the NIXL KV
    transfer that prefill/decode needs); this adds the GPU resource, the rest of vLLM's flags
    (`VLLM_ADDITIONAL_ARGS`, which the preset appends), credentials and a restricted context."""
    model = plan.model
    extra = [
        f"--max-model-len={model.max_model_len}",
        f"--pipeline-parallel-size={model.pipeline_parallel}",
        f"--gpu-memory-utilization={model.gpu_memory_utilization:g}",
        *(a for a in vllm_args(plan) if a.startswith("--kv-cache-memory-bytes")),
    ]
    env = [e for e in vllm_env(plan) if e["name"] not in ("HOME", "HF_HOME")]
    gpus = gpu_resources(plan)
    spec: dict[str, Any] = {
        "name": "main",
        "image": LLM_D_IMAGE,
        "env": [{"name": "VLLM_ADDITIONAL_ARGS", "value": " ".join(extra)}, *env],
        "resources": container_resources(plan.model, gpus),
        "securityContext": RESTRICTED_CONTAINER,
    }
    if plan.shape.sharing == "dra":
        spec["resources"]["claims"] = [{"name": "gpus"}]
    return spec


def llm_inference_service(plan: ModelPlan, names: TenantNames) -> dict[str, Any]:
    """The preset's volumes (home, /tmp, shared memory, the download cache) are emptyDirs of the
    pod: no cache outlives it or is shared with another tenant's pods."""
    model = plan.model
    pod: dict[str, Any] = {"containers": [llm_container(plan)], **pod_placement(plan)}
    if dra_claims(plan):
        pod["resourceClaims"] = dra_claims(plan)
    workload: dict[str, Any] = {
        "parallelism": {"tensor": model.tensor_parallel, "pipeline": model.pipeline_parallel},
        "template": pod,
    }
    if plan.shape.nodes > 1:
        # One LeaderWorkerSet group per replica: the leader's pod and a worker pod per further node.
        workload["worker"] = {k: v for k, v in pod.items()}
    spec: dict[str, Any] = {
        "model": {"uri": kserve_uri(model.source), "name": plan.endpoint.served_name},
        "replicas": model.replicas.min,
        "labels": pod_labels(plan, names),
        **workload,
        "router": {"scheduler": {}},
    }
    if plan.prometheus is not None and model.replicas.max > model.replicas.min:
        # KServe v0.20 scales an LLMInferenceService only through llm-d's Workload Variant
        # Autoscaler, which sizes it from vLLM's saturation (KV-cache use and queue depth) read
        # from the platform Prometheus, and actuates through KEDA.
        spec["scaling"] = {"minReplicas": model.replicas.min, "maxReplicas": model.replicas.max, "wva": {"keda": {}}}
        del spec["replicas"]
    if model.disaggregation:
        spec["prefill"] = {"replicas": model.disaggregation.prefill_replicas, "labels": pod_labels(plan, names), **workload}
    return spec


def serving_runtime(image: str) -> dict[str, Any]:
    return {
        "supportedModelFormats": [{"name": MODEL_FORMAT, "autoSelect": True}],
        "protocolVersions": ["v2"],
        "containers": [
            {
                "name": CONTAINER,
                "image": image,
                "command": ["vllm", "serve"],
                "ports": [{"name": TENANT_METRICS_PORT, "containerPort": PORT, "protocol": "TCP"}],
                "resources": container_resources(None, {}),
                "securityContext": RESTRICTED_CONTAINER,
                "readinessProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10},
                "startupProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10, "failureThreshold": 180},
            }
        ],
    }


def source_secret_spec(model: ServedModel, names: TenantNames) -> dict[str, Any]:
    """The ExternalSecret of a model's source credentials, from the tenant's own OpenBao store."""
    assert model.credentials is not None
    key = f"{secret_prefix(names)}{model.credentials.secret}"
    return {
        "refreshInterval": "1h",
        "secretStoreRef": {"kind": "SecretStore", "name": STORE_NAME},
        "target": {
            "name": source_secret(model),
            "creationPolicy": "Owner",
            # No template data: the Secret keeps the fetched keys, with KServe's S3 settings as
            # its annotations.
            **({"template": {"metadata": {"annotations": secret_annotations(model)}}} if model.s3 else {}),
        },
        # Keys named as the variables they become, which is also what KServe's storage
        # initializer reads S3 credentials as (`kserve.storage.s3.*Name`).
        "data": [{"secretKey": variable, "remoteRef": {"key": key, "property": prop}} for variable, prop in sorted(credential_properties(model).items())],
    }


def hub_egress_policy(plan: ModelPlan) -> dict[str, Any]:
    """The model's pods may reach the Hugging Face Hub over HTTPS (DNS answers seen by Cilium's
    proxy, which FQDN rules need), nothing more than the tenant baseline otherwise."""
    return {
        "endpointSelector": {"matchLabels": dict(plan.endpoint.pod_labels)},
        "egress": [
            {
                "toEndpoints": [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}}],
                # Every name may be looked up (the proxy only needs to see the answers); the
                # FQDN rule below is what limits where the pods connect.
                "toPorts": [{"ports": [{"port": "53", "protocol": "ANY"}], "rules": {"dns": [{"matchPattern": "*"}]}}],
            },
            {
                "toFQDNs": [{"matchPattern": h} if "*" in h else {"matchName": h} for h in HF_HOSTS],
                "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}],
            },
        ],
    }


@dataclass(frozen=True)
class ServingTenantHook:
    """Per tenant: its vLLM runtime and its models (see the module docstring)."""

    models: dict[str, tuple[ModelPlan, ...]]
    image: str
    storage_class: str | None
    layer: str = "serving"

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> ServingTenantHook | None:
        models = model_plans(cfg, plan, runtime="kserve")
        if not models:
            return None
        layer = cfg.layers.serving
        return cls(models=models, image=layer.vllm_image, storage_class=layer.cache_storage_class)

    def narrowed(self, tenant: str) -> ServingTenantHook:
        """Only the tenant's own models (see `TenantHook`)."""
        return replace(self, models=tenant_entry(self.models, tenant))

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        plans = self.models.get(tenant.name, ())
        if not plans:
            return
        own = labels(self.layer, tenant=names.tenant, extra=names.labels)

        def custom(suffix: str, api_version: str, kind: str, name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None) -> None:
            k8s.apiextensions.CustomResource(
                stack.child_name(suffix),
                api_version=api_version,
                kind=kind,
                metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=names.namespace, labels=own, annotations=annotations or None),
                spec=spec,
                opts=stack.child(),
            )

        custom("serving-runtime", f"{KSERVE}/v1alpha1", "ServingRuntime", RUNTIME_NAME, serving_runtime(self.image))
        for plan in plans:
            model = plan.model
            if model.credentials is not None:
                custom(f"model-{model.name}-source", "external-secrets.io/v1", "ExternalSecret", source_secret(model), source_secret_spec(model, names))
            if plan.endpoint.kind == "InferenceService":
                isvc = inference_service(plan, names, self.storage_class)
                custom(f"model-{model.name}", f"{KSERVE}/v1beta1", "InferenceService", model.name, isvc["spec"], isvc["metadata_annotations"])
            else:
                custom(f"model-{model.name}", f"{KSERVE}/v1alpha2", "LLMInferenceService", model.name, llm_inference_service(plan, names), source_annotations(plan))
            if model.source.startswith("hf://"):
                custom(f"model-{model.name}-hub", "cilium.io/v2", "CiliumNetworkPolicy", f"{model.name}-model-hub", hub_egress_policy(plan))


def model_plans(cfg: FactoryConfig, plan: Plan, runtime: str) -> dict[str, tuple[ModelPlan, ...]]:
    """Per tenant with models on `runtime` (`kserve` or `dynamo`), each model with its shape and
    offering (validation has accepted them)."""
    by_name = {o.name: o for o in offerings(plan)}
    metrics = cfg.layers.metrics
    prometheus = f"http://{PROMETHEUS_SERVICE}.{metrics.namespace}.svc:9090" if metrics.enabled else None
    result: dict[str, tuple[ModelPlan, ...]] = {}
    for tenant in cfg.tenants:
        found = []
        for model in (m for m in tenant.models if m.runtime == runtime):
            pool = cfg.pool(model.gpus.pool)
            found.append(
                ModelPlan(
                    model=model,
                    endpoint=endpoint(cfg, tenant, model),
                    shape=replica_shape(pool, tenant, model),
                    pool=pool,
                    offering=by_name[offering_name(pool.name, tenant.domain)],
                    prometheus=prometheus,
                )
            )
        if found:
            result[tenant.name] = tuple(found)
    return result


# --------------------------------------------------------------------------- config rules


def images_allowed(raw: dict[str, Any]) -> list[str]:
    """The images a tenant's model pods run must pass the tenant admission policy's registries
    (`layers.kyverno.allowed_registries`), or every model pod would be refused at admission."""
    layers = as_dict(raw.get("layers"))
    kyverno = as_dict(layers.get("kyverno"))
    if kyverno.get("enabled") is False:
        return []
    allowed = kyverno.get("allowed_registries", KyvernoLayer().allowed_registries)
    if not isinstance(allowed, list) or not all(isinstance(p, str) for p in allowed):
        return []  # a field error
    # Dynamo's models run Dynamo's image (`components.dynamo.runtime_image_allowed`), not KServe's.
    models = [as_dict(m) for t in as_list(raw.get("tenants")) for m in as_list(as_dict(t).get("models")) if as_dict(m).get("runtime") != "dynamo"]
    if not models:
        return []
    image = as_dict(layers.get("serving")).get("vllm_image", ServingLayer().vllm_image)
    needed = {image: "the vLLM image (`layers.serving.vllm_image`)"} if isinstance(image, str) else {}
    pools = map(as_dict, as_list(as_dict(raw.get("fleet")).get("pools")))
    per_node = {p["name"]: as_dict(p.get("gpu")).get("per_node") for p in pools if isinstance(p.get("name"), str)}

    def large(m: dict) -> bool:
        count, node = as_dict(m.get("gpus")).get("count"), per_node.get(as_dict(m.get("gpus")).get("pool"))
        return bool(m.get("disaggregation")) or (isinstance(count, int) and isinstance(node, int) and count > node)

    if any(large(m) or str(m.get("source", "")).startswith("s3://") for m in models):
        needed[STORAGE_INITIALIZER] = "KServe's storage initializer"
    if any(large(m) for m in models):
        needed[LLM_D_IMAGE] = "llm-d's scheduler and model-server presets"
    return [
        f"layers.kyverno.allowed_registries: {what} ({ref}) runs in tenants' namespaces but matches none of the allowed patterns"
        for ref, what in needed.items()
        if not any(fnmatchcase(ref, pattern) for pattern in allowed)
    ]


def models_fit(raw: dict[str, Any]) -> list[str]:
    """Every model against its pool and its tenant's grant (`factory.model.serving`): a pool the
    tenant holds no grant in, fields of another sharing mode, a slice too small for weights + KV
    cache, tensor parallelism beyond an NVLink domain, replicas at `max` beyond the grant or their
    pods beyond the tenant's CPU, memory and pod quota, credentials KServe could not read. Runs on
    the tenants and pools that are themselves valid (the others' field errors speak for them)."""
    pools: dict[str, Pool] = {}
    declared = set()
    for pool in map(as_dict, as_list(as_dict(raw.get("fleet")).get("pools"))):
        name = pool.get("name")
        declared.add(name if isinstance(name, str) else None)
        try:
            valid = Pool.model_validate(pool)
        except ValidationError:
            continue
        gpu = GPU_MODELS.get(valid.gpu.model)
        if gpu is not None and (valid.sharing != "mig" or gpu.mig_capable):  # else the pool's own error speaks
            pools.setdefault(valid.name, valid)
    problems: list[str] = []
    served: dict[str, str] = {}
    for i, entry in enumerate(as_list(raw.get("tenants"))):
        models = as_list(as_dict(entry).get("models"))
        if not models:
            continue
        try:
            tenant = Tenant.model_validate(entry, context={"plaintext_is_secret": False})
        except ValidationError:
            continue
        path = f"tenants[{i}]"
        seen: set[str] = set()
        accepted: set[int] = set()
        for j, model in enumerate(tenant.models):
            at = f"{path}.models[{j}]"
            if model.name in seen:
                problems.append(f"{at}.name: duplicate model name {model.name!r}")
                continue
            seen.add(model.name)
            if model.gpus.pool not in pools and (model.gpus.pool in declared or None in declared):
                continue  # a pool with errors of its own
            name = model.served_name or f"{tenant.name}/{model.name}"
            other = served.setdefault(name, tenant.name)
            if other != tenant.name:
                problems.append(f"{at}.served_name: {name!r} is already served by tenant {other!r}; clients name a model by it")
            found = model_problems(at, tenant, model, pools)
            problems += found
            if not found:
                accepted.add(j)
        problems += grant_problems(path, tenant, pools, accepted)
        problems += quota_problems(path, tenant, pools, accepted)
    layers = as_dict(raw.get("layers"))
    if any(as_list(as_dict(t).get("models")) for t in as_list(raw.get("tenants"))):
        if as_dict(layers.get("serving")).get("enabled") is False:
            problems.append("layers.serving.enabled: tenants declare models; the serving layer must be on")
    if any(as_dict(m).get("credentials") for t in as_list(raw.get("tenants")) for m in as_list(as_dict(t).get("models"))):
        for section in ("openbao", "external_secrets"):
            if as_dict(layers.get(section)).get("enabled") is False:
                problems.append(f"layers.{section}.enabled: models read their source credentials from OpenBao through External Secrets; it must be on")
    return problems


LAYER = Layer(
    name="serving",
    section="serving",
    chart="kserve-resources",
    component=Serving,
    args=lambda cfg, plan: ServingArgs.from_config(cfg),
    requires=("fleet", "kueue"),
    tenant_hook=ServingTenantHook.from_config,
    config_checks=(models_fit, images_allowed),
    checks=(serving_checks.model_pods, serving_checks.shared_model_caches, serving_checks.model_quota),
    # cert-manager issues KServe's webhook certificates (the charts render its Issuer and
    # Certificates, with no way around it); KEDA actuates the autoscaling.
    external_crds=("cert-manager.io", "keda.sh"),
)
