"""Tenants' served models as the other layers meet them: one `ModelEndpoint` per model.

A tenant declares its models in `tenants[].models` (`ai_factory.factory.model.config.ServedModel`);
the serving layer (`components/serving.py`) turns each into a KServe object in the tenant's
namespace, and the gateway, LiteLLM and network isolation reach it only through this typed
object, never by re-typing KServe's naming rules:

- a model served by an `InferenceService` (KServe standard/raw deployment) is reached at the
  Service `<model>-predictor`, port 80, plain HTTP, which KServe creates in front of its pods;
- a model served by an `LLMInferenceService` (disaggregated prefill/decode, or spanning nodes) is
  reached at the Service `<model>-kserve-workload-svc`, port 8000, HTTPS (KServe's own
  certificate), and is scheduled through the `InferencePool` `<model>-inference-pool` with its
  endpoint picker.

Every model pod carries `pod_labels`, so a network policy can name exactly one model's pods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ai_factory.factory.model.config import FactoryConfig, ServedModel, Tenant
from ai_factory.factory.model.tenancy import LABEL_PREFIX, tenant_names

MODEL_LABEL = f"{LABEL_PREFIX}/model"
"""On every pod of a served model: the model's name in its tenant."""

ServingKind = Literal["InferenceService", "LLMInferenceService"]

DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
"""Bytes per parameter of each weight precision."""


@dataclass(frozen=True)
class ModelEndpoint:
    """Where one tenant's model is served, as the gateway, LiteLLM and network policies reach it."""

    tenant: str
    model: str
    """The model's name in its tenant (`tenants[].models[].name`)."""
    namespace: str
    """The tenant's namespace on the host cluster, where the model's objects and pods live."""
    kind: ServingKind
    object_name: str
    """Name of the KServe object (`InferenceService` or `LLMInferenceService`)."""
    service: str
    """The Service in `namespace` in front of the model's pods."""
    port: int
    scheme: Literal["http", "https"]
    served_name: str
    """The name clients ask for (OpenAI `model`)."""
    expose: bool
    """Whether the shared inference gateway (and LiteLLM) route to it."""
    pod_labels: tuple[tuple[str, str], ...]
    """Labels every pod of this model carries, and no other pod of its namespace."""
    inference_pool: str | None = None
    """The model's `InferencePool` (Gateway API Inference Extension), LLMInferenceService only."""

    @property
    def url(self) -> str:
        """The in-cluster base URL of the model's OpenAI-compatible API."""
        return f"{self.scheme}://{self.service}.{self.namespace}.svc.cluster.local:{self.port}/v1"


def serving_kind(cfg: FactoryConfig, model: ServedModel) -> ServingKind:
    """`LLMInferenceService` for a disaggregated model or one whose replica spans nodes."""
    per_node = cfg.pool(model.gpus.pool).gpu.per_node
    return "LLMInferenceService" if model.disaggregation or model.gpus.count > per_node else "InferenceService"


def served_name(tenant: Tenant, model: ServedModel) -> str:
    return model.served_name or f"{tenant.name}/{model.name}"


def weights_gib(model: ServedModel) -> float:
    """The weights' size: declared, or parameters times the bytes of their precision."""
    memory = model.memory
    if memory.weights_gib is not None:
        return memory.weights_gib
    return (memory.parameters_billion or 0) * 1e9 * DTYPE_BYTES[memory.dtype] / 2**30


def cache_gib(model: ServedModel) -> int:
    """Size of the model's download cache: declared, or its weights plus a quarter."""
    return model.cache_gib or max(1, math.ceil(weights_gib(model) * 1.25))


def endpoint(cfg: FactoryConfig, tenant: Tenant, model: ServedModel) -> ModelEndpoint:
    names = tenant_names(tenant)
    kind = serving_kind(cfg, model)
    large = kind == "LLMInferenceService"
    return ModelEndpoint(
        tenant=tenant.name,
        model=model.name,
        namespace=names.namespace,
        kind=kind,
        object_name=model.name,
        service=f"{model.name}-kserve-workload-svc" if large else f"{model.name}-predictor",
        port=8000 if large else 80,
        scheme="https" if large else "http",
        served_name=served_name(tenant, model),
        expose=model.expose,
        pod_labels=((MODEL_LABEL, model.name),),
        inference_pool=f"{model.name}-inference-pool" if large else None,
    )


def model_endpoints(cfg: FactoryConfig) -> tuple[ModelEndpoint, ...]:
    """Every tenant's models, tenants and models in config order."""
    return tuple(endpoint(cfg, tenant, model) for tenant in cfg.tenants for model in tenant.models)
