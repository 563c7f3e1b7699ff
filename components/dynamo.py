"""NVIDIA Dynamo: the alternative to KServe's LLMInferenceService for environments that choose it
(`layers.dynamo`, off by default), per model with `runtime: dynamo`.

Platform-wide (this component), in `layers.dynamo.namespace`: the `dynamo-platform` chart, which
is the cluster-wide Dynamo operator (its subchart `dynamo-operator`) and its CRDs, once. Of the
chart's other parts:
- NATS: off. With the operator, workers and frontends find each other through the Kubernetes API
  (`discoveryBackend: kubernetes`: a `DynamoWorkerMetadata` per worker and the EndpointSlices of
  the model's own namespace) and talk over direct TCP; NATS only carries KV-cache events for
  KV-aware routing. One NATS of the chart is a single unauthenticated bus shared by every
  namespace: one tenant's pods would read and publish another tenant's KV events.
- etcd: off (not needed with Kubernetes discovery, and dropped from the packaged chart).
- KAI Scheduler and Grove: neither installed nor integrated. KAI has a layer of its own
  (`components/kai_scheduler.py`), and the operator's integration would give model pods KAI's
  scheduler and queues instead of the tenant's Kueue queue, which is what counts serving against
  the tenant's quota; Grove (multi-node workers, dropped from the packaged chart) is a
  cluster-wide operator this layer does not run, so a Dynamo model's replica stays on one node
  (validation refuses more).
The operator's namespace enforces Pod Security `baseline`, not `restricted`: the chart sets
`runAsNonRoot` on the pod and takes only `allowPrivilegeEscalation` and `capabilities` of the
container's security context from values (set to false and drop ALL), so no seccomp profile can
be stated, which restricted requires. Nothing in it needs more than baseline: no privileged
namespace. Its webhook certificates come from its built-in certificate controller (no
cert-manager).

Per tenant with Dynamo models (`DynamoTenantHook`), in the tenant's namespace, per model a
`DynamoGraphDeployment` named after the model: a `Frontend` (Dynamo's OpenAI-compatible HTTP
server on port 8000, behind the Service `<model>-frontend`, which routes to the workers), and vLLM
workers, aggregated (`VllmWorker`) or, with `disaggregation`, `VllmPrefillWorker` and
`VllmDecodeWorker` handing the KV cache over through NIXL. Every pod carries the tenant's labels,
its Kueue queue and the model's label; workers ask for exactly the plan's GPU resource (as the
KServe pods do, `factory.model.serving.pod_gpu_resources`), select the offering of their pool for
the tenant's trust domain and tolerate only its taints; every container runs restricted with a
read-only root. The operator gives each deployment a service account of its own with a Role over
its namespace's discovery objects; its pods therefore reach the API server (a
CiliumNetworkPolicy per model), and the `hf://` weights' download gets the same Hub egress as a
KServe model. Weights and caches live in a per-pod ephemeral volume, never shared.

Replicas: decode (or aggregated) workers at `replicas.min`; a model that may grow gets the
operator's scaling adapter (`DynamoGraphDeploymentScalingAdapter`), the scale subresource an
autoscaler drives; the planner reserves GPUs for `replicas.max` plus the prefill replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import FactoryComponent, helm_release, labels, namespace, tenant_entry
from ai_factory.components.registry import Layer
from ai_factory.components.serving import (
    CACHE_MOUNT,
    RESTRICTED_CONTAINER,
    ModelPlan,
    cache_volume,
    container_resources,
    dra_claims,
    gpu_resources,
    hub_egress_policy,
    model_plans,
    pod_labels,
    pod_placement,
    source_secret,
    source_secret_spec,
    vllm_args,
    vllm_env,
)
from ai_factory.factory.checking import serving as serving_checks
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import DynamoLayer, FactoryConfig, KyvernoLayer, Tenant
from ai_factory.factory.model.raw import as_dict, as_list
from ai_factory.factory.model.serving import DYNAMO_FRONTEND, DYNAMO_FRONTEND_RESOURCES, DYNAMO_PORT
from ai_factory.factory.model.tenancy import TenantNames
from ai_factory.factory.planning.model import WHOLE_GPU, Plan

TOKEN = "ai-factory:serving:Dynamo"
API_VERSION = "nvidia.com/v1alpha1"
KIND = "DynamoGraphDeployment"
"""The frontend: HTTP server, tokenizer and router; no GPU."""
MODELS_MOUNT = "/mnt/models"
NIXL = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
"""vLLM's KV transfer between prefill and decode workers (NIXL, over UCX)."""
API_SERVER_PORTS = ("443", "6443")
"""The API server's Service port and its usual endpoint port (Cilium matches after translation)."""


# --------------------------------------------------------------------------- platform


@dataclass(frozen=True)
class DynamoArgs:
    namespace: str
    chart: ChartSource

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> DynamoArgs:
        layer = cfg.layers.dynamo
        return cls(namespace=layer.namespace, chart=layer.chart.source("dynamo-platform"))


def platform_values() -> dict[str, Any]:
    """Only the operator (see the module docstring for each part left off)."""
    return {
        "global": {
            "etcd": {"install": False},
            "kai-scheduler": {"install": False, "enabled": False},
            "grove": {"install": False, "enabled": False},
        },
        "nats": {"enabled": False},
        "dynamo-operator": {
            "discoveryBackend": "kubernetes",
            # Flux applies the chart's CRDs on install and upgrade (`crds: CreateReplace`): one owner.
            "upgradeCRD": False,
            "nats": {"enabled": False},
            "controllerManager": {"manager": {"containerSecurityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}},
        },
    }


class Dynamo(FactoryComponent):
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: DynamoArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="dynamo", opts=opts)
        ns = namespace(self, args.namespace, pod_security="baseline")
        helm_release(self, "dynamo-platform", args.chart, namespace=ns.metadata.name, values=platform_values(), depends_on=[ns])
        self.namespace = ns.metadata.name
        self.register_outputs({"namespace": self.namespace})


# --------------------------------------------------------------------------- per model


def worker_resources(plan: ModelPlan) -> dict[str, Any]:
    """A worker container's resources, as on a KServe model's: also stated on the main container
    (which the operator merges over the one it builds), so admission and every pod check read the
    pod's real resources."""
    resources = container_resources(plan.model, gpu_resources(plan))
    if plan.shape.sharing == "dra":
        resources["claims"] = [{"name": claim["name"]} for claim in dra_claims(plan)]
    return resources


def dynamo_resources(plan: ModelPlan) -> dict[str, Any]:
    """A worker's `resources` in Dynamo's form: the operator turns `gpu`/`gpuType` into that one
    extended resource and `custom` into the others, as requests and as limits alike."""
    gpus = gpu_resources(plan)
    side: dict[str, Any] = {}
    others = dict(gpus)
    whole = next((name for name in gpus if name == WHOLE_GPU or name.startswith("nvidia.com/mig-")), None)
    if whole is not None:
        side["gpu"] = others.pop(whole)
        if whole != WHOLE_GPU:
            side["gpuType"] = whole
    if others:
        side["custom"] = others
    host = plan.model.resources
    resources: dict[str, Any] = {"requests": {"cpu": host.cpu, "memory": host.memory, **side}, "limits": {"memory": host.memory, **side}}
    if "claims" in worker_resources(plan):
        resources["claims"] = worker_resources(plan)["claims"]
    return resources


def model_source(plan: ModelPlan) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """(vLLM's `--model`/`--revision` flags, extra volumes, their mounts): a `pvc://` source is the
    tenant's own claim, read-only at /mnt/models; `hf://` is downloaded into the pod's cache."""
    source = plan.model.source
    if source.startswith("pvc://"):
        claim, _, path = source.removeprefix("pvc://").partition("/")
        volume = {"name": "model-source", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        mount = {"name": "model-source", "mountPath": MODELS_MOUNT, "readOnly": True}
        return [f"--model={MODELS_MOUNT}/{path}".rstrip("/")], [volume], [mount]
    return [a for a in vllm_args(plan) if a.startswith(("--model=", "--revision="))], [], []


def worker_args(plan: ModelPlan, role: str | None) -> list[str]:
    """vLLM's engine flags as the KServe pods get them, less the API server's own (`--port`: the
    frontend serves HTTP) and with the source as Dynamo reads it; a prefill or decode role adds
    the KV transfer."""
    where, _, _ = model_source(plan)
    engine = [a for a in vllm_args(plan) if not a.startswith(("--model=", "--revision=", "--port="))]
    args = [*where, *engine]
    if role is not None:
        args += [f"--disaggregation-mode={role}", f"--kv-transfer-config={NIXL}"]
    return args


def pod_spec(plan: ModelPlan, container: dict[str, Any], volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """A component's `extraPodSpec`: the pool's placement and the restricted pod context. The
    service account is left to the operator, which gives each deployment its own for discovery."""
    spec = {k: v for k, v in pod_placement(plan).items() if k != "automountServiceAccountToken"}
    return {**spec, "volumes": volumes, "mainContainer": container}


def worker(plan: ModelPlan, names: TenantNames, image: str, storage_class: str | None, role: str | None, replicas: int) -> dict[str, Any]:
    _, source_volumes, source_mounts = model_source(plan)
    container = {
        "image": image,
        "command": ["python3", "-m", "dynamo.vllm"],
        "args": worker_args(plan, role),
        "env": vllm_env(plan),
        "resources": worker_resources(plan),
        "securityContext": RESTRICTED_CONTAINER,
        "volumeMounts": [{"name": "model-cache", "mountPath": CACHE_MOUNT}, {"name": "tmp", "mountPath": "/tmp"}, *source_mounts],
    }
    volumes = [cache_volume(plan, storage_class), {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}}, *source_volumes]
    spec: dict[str, Any] = {
        "componentType": "worker",
        "replicas": replicas,
        "resources": dynamo_resources(plan),
        # vLLM's workers exchange tensors through /dev/shm (the runtime's 64 MiB is too small).
        "sharedMemory": {"size": "8Gi" if plan.model.tensor_parallel > 1 else "1Gi"},
        "extraPodMetadata": {"labels": pod_labels(plan, names)},
        "extraPodSpec": pod_spec(plan, container, volumes),
    }
    if role is not None:
        spec["subComponentType"] = role
    if dra_claims(plan):
        spec["extraPodSpec"]["resourceClaims"] = dra_claims(plan)
    return spec


def frontend_resources() -> dict[str, Any]:
    return {"requests": dict(DYNAMO_FRONTEND_RESOURCES), "limits": {"memory": DYNAMO_FRONTEND_RESOURCES["memory"]}}


def frontend(plan: ModelPlan, names: TenantNames, image: str) -> dict[str, Any]:
    """No GPU, so no GPU pool's placement; the tokenizer is fetched from the model's source too
    (the same credentials and Hub egress), into the pod's own cache."""
    container = {
        "image": image,
        "command": ["python3", "-m", "dynamo.frontend"],
        "args": [f"--http-port={DYNAMO_PORT}"],
        "env": [e for e in vllm_env(plan) if e["name"] != "CUDA_VISIBLE_DEVICES"],
        "resources": frontend_resources(),
        "securityContext": RESTRICTED_CONTAINER,
        "volumeMounts": [{"name": "model-cache", "mountPath": CACHE_MOUNT}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    pod = pod_placement(plan)
    return {
        "componentType": "frontend",
        "replicas": 1,
        "resources": frontend_resources(),
        "extraPodMetadata": {"labels": pod_labels(plan, names)},
        "extraPodSpec": {
            "securityContext": pod["securityContext"],
            "volumes": [{"name": "model-cache", "emptyDir": {"sizeLimit": "4Gi"}}, {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
            "mainContainer": container,
        },
    }


def graph_deployment(plan: ModelPlan, names: TenantNames, image: str, storage_class: str | None) -> dict[str, Any]:
    model = plan.model
    scales = model.replicas.max > model.replicas.min
    services: dict[str, Any] = {DYNAMO_FRONTEND: frontend(plan, names, image)}
    if model.disaggregation is None:
        services["VllmWorker"] = worker(plan, names, image, storage_class, None, model.replicas.min)
        grows = "VllmWorker"
    else:
        services["VllmPrefillWorker"] = worker(plan, names, image, storage_class, "prefill", model.disaggregation.prefill_replicas)
        services["VllmDecodeWorker"] = worker(plan, names, image, storage_class, "decode", model.replicas.min)
        grows = "VllmDecodeWorker"
    if scales:
        services[grows]["scalingAdapter"] = {"enabled": True}
    return {"backendFramework": "vllm", "services": services}


def api_server_policy(plan: ModelPlan) -> dict[str, Any]:
    """Dynamo's Kubernetes discovery: the model's pods read and write their namespace's discovery
    objects through the API server (the tenant baseline lets only vCluster syncers reach it)."""
    return {
        "endpointSelector": {"matchLabels": dict(plan.endpoint.pod_labels)},
        "egress": [{"toEntities": ["kube-apiserver"], "toPorts": [{"ports": [{"port": p, "protocol": "TCP"} for p in API_SERVER_PORTS]}]}],
    }


@dataclass(frozen=True)
class DynamoTenantHook:
    """Per tenant: its Dynamo models (see the module docstring)."""

    models: dict[str, tuple[ModelPlan, ...]]
    image: str
    storage_class: str | None
    layer: str = "dynamo"

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> DynamoTenantHook | None:
        models = model_plans(cfg, plan, runtime="dynamo")
        if not models:
            return None
        return cls(models=models, image=cfg.layers.dynamo.runtime_image, storage_class=cfg.layers.serving.cache_storage_class)

    def narrowed(self, tenant: str) -> DynamoTenantHook:
        """Only the tenant's own models (see `TenantHook`)."""
        return replace(self, models=tenant_entry(self.models, tenant))

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        own = labels(self.layer, tenant=names.tenant, extra=names.labels)

        def custom(suffix: str, api_version: str, kind: str, name: str, spec: dict[str, Any]) -> None:
            k8s.apiextensions.CustomResource(
                stack.child_name(suffix),
                api_version=api_version,
                kind=kind,
                metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=names.namespace, labels=own),
                spec=spec,
                opts=stack.child(),
            )

        for plan in self.models.get(tenant.name, ()):
            model = plan.model
            if model.credentials is not None:
                custom(f"model-{model.name}-source", "external-secrets.io/v1", "ExternalSecret", source_secret(model), source_secret_spec(model, names))
            custom(f"model-{model.name}", API_VERSION, KIND, model.name, graph_deployment(plan, names, self.image, self.storage_class))
            custom(f"model-{model.name}-discovery", "cilium.io/v2", "CiliumNetworkPolicy", f"{model.name}-dynamo-discovery", api_server_policy(plan))
            if model.source.startswith("hf://"):
                custom(f"model-{model.name}-hub", "cilium.io/v2", "CiliumNetworkPolicy", f"{model.name}-model-hub", hub_egress_policy(plan))


# --------------------------------------------------------------------------- config rules


def dynamo_models(raw: dict[str, Any]) -> list[str]:
    """Paths of the models that ask for Dynamo."""
    return [
        f"tenants[{i}].models[{j}]"
        for i, t in enumerate(as_list(raw.get("tenants")))
        for j, m in enumerate(as_list(as_dict(t).get("models")))
        if as_dict(m).get("runtime") == "dynamo"
    ]


def layer_on_for_models(raw: dict[str, Any]) -> list[str]:
    """A model on Dynamo needs the layer that installs Dynamo's operator: one message naming them all."""
    paths = dynamo_models(raw)
    if not paths or as_dict(as_dict(raw.get("layers")).get("dynamo")).get("enabled") is True:
        return []
    return [f"layers.dynamo.enabled: {', '.join(f'{p}.runtime' for p in paths)} ask for Dynamo; the Dynamo layer must be on"]


def runtime_image_allowed(raw: dict[str, Any]) -> list[str]:
    """Dynamo's runtime image runs in tenants' namespaces: the tenant admission policy's registries
    (`layers.kyverno.allowed_registries`) must allow it, or every model pod would be refused."""
    layers = as_dict(raw.get("layers"))
    kyverno = as_dict(layers.get("kyverno"))
    if not dynamo_models(raw) or kyverno.get("enabled") is False:
        return []
    allowed = kyverno.get("allowed_registries", KyvernoLayer().allowed_registries)
    image = as_dict(layers.get("dynamo")).get("runtime_image", DynamoLayer().runtime_image)
    if not isinstance(allowed, list) or not all(isinstance(p, str) for p in allowed) or not isinstance(image, str):
        return []  # a field error
    if any(fnmatchcase(image, pattern) for pattern in allowed):
        return []
    return [f"layers.kyverno.allowed_registries: Dynamo's runtime image ({image}, `layers.dynamo.runtime_image`) runs in tenants' namespaces but matches none of the allowed patterns"]


LAYER = Layer(
    name="dynamo",
    section="dynamo",
    chart="dynamo-platform",
    component=Dynamo,
    args=lambda cfg, plan: DynamoArgs.from_config(cfg),
    requires=("fleet", "kueue"),
    tenant_hook=DynamoTenantHook.from_config,
    config_checks=(layer_on_for_models, runtime_image_allowed),
    checks=(serving_checks.dynamo_workers,),
)
