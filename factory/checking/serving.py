"""Offline checks of served models (`components/serving.py`): a model's pods stay inside their
tenant's GPUs and quota, and no model cache is shared between tenants.

The generic pod checks (`isolation.tenant_pods`) look for pod specs by their `containers`; an
`InferenceService` predictor keeps its container under `model`, so the model objects get their own
check here."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.isolation import View
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.model.tenancy import TRUST_DOMAIN_LABEL
from ai_factory.factory.planning.placement import DEDICATED_LABEL
from ai_factory.factory.rendering.bundle import Manifest, Rendered

MODEL_KINDS = ("InferenceService", "LLMInferenceService")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SHARED_CACHE_KINDS = ("LocalModelCache", "LocalModelNodeGroup", "LocalModelNamespaceCache")
"""KServe's node-local model cache: weights on a host path of the node, readable by every pod KServe
mounts it into, whichever namespace."""


def _workloads(m: Manifest) -> Iterator[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    """(path, pod spec, labels its pods get) of every pod a model object makes."""
    spec = m.obj.get("spec")
    if not isinstance(spec, Mapping):
        return
    if m.kind == "InferenceService":
        predictor = spec.get("predictor")
        if isinstance(predictor, Mapping):
            yield "spec.predictor", predictor, _mapping(predictor.get("labels"))
        return
    for path, part in (("spec", spec), ("spec.prefill", spec.get("prefill"))):
        if not isinstance(part, Mapping):
            continue
        for key in ("template", "worker"):
            if isinstance(part.get(key), Mapping):
                yield f"{path}.{key}", part[key], _mapping(part.get("labels"))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _toleration_problems(toleration: Any, tenant: str, domain: str) -> Iterator[str]:
    if not isinstance(toleration, Mapping):
        return
    key, value, exists = toleration.get("key"), toleration.get("value"), toleration.get("operator") == "Exists"
    if not key and exists:
        yield "tolerates every taint"
    elif key == TRUST_DOMAIN_LABEL and (exists or value != domain):
        yield f"tolerates the shared-GPU nodes of {'every trust domain' if exists else f'trust domain {value}'} (its own is {domain})"
    elif key == DEDICATED_LABEL and (exists or value != tenant):
        yield f"tolerates the nodes dedicated to {'every tenant' if exists else f'tenant {value}'}"


def _volume_problems(volume: Any) -> Iterator[str]:
    if isinstance(volume, Mapping) and "hostPath" in volume:
        yield f"mounts host path {_mapping(volume['hostPath']).get('path')!r} (volume {volume.get('name')}): a node's files are every tenant's"


def model_pods(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Each model object is in a tenant's namespace; its pods name the tenant's Kueue queue (so
    serving is admitted against the tenant's quota), tolerate only their tenant's trust-domain and
    dedicated-node taints, and mount no host path (no node cache shared between tenants)."""
    view = View(rendered)
    for m in view.of_kind(*MODEL_KINDS):
        owner = view.tenant_at(m.namespace)
        if owner is None:
            yield Finding("model-pods", m.ref, f"serves a model from {m.namespace or 'no namespace'}, not a tenant's namespace")
            continue
        for path, pod, labels in _workloads(m):
            if not labels.get(QUEUE_LABEL):
                yield Finding("model-pods", m.ref, f"{path}: its pods name no Kueue queue ({QUEUE_LABEL}): they would not count against tenant {owner.tenant}'s quota", (owner.tenant,))
            for toleration in pod.get("tolerations") or []:
                for problem in _toleration_problems(toleration, owner.tenant, owner.trust_domain):
                    yield Finding("model-pods", m.ref, f"{path}: {problem}", (owner.tenant,))
            for volume in pod.get("volumes") or []:
                for problem in _volume_problems(volume):
                    yield Finding("model-pods", m.ref, f"{path}: {problem}", (owner.tenant,))


def shared_model_caches(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """No KServe node-local model cache exists or is switched on: it would hand one tenant's
    weights to another tenant's pods."""
    view = View(rendered)
    for m in view.of_kind(*SHARED_CACHE_KINDS):
        yield Finding("shared-model-cache", m.ref, "a KServe node-local model cache is shared by every namespace")
    for m in view.of_kind("HelmRelease"):
        values = _mapping(_mapping(m.obj.get("spec")).get("values"))
        localmodel = _mapping(_mapping(values.get("kserve")).get("localmodel"))
        if localmodel.get("enabled") is True:
            yield Finding("shared-model-cache", m.ref, "enables KServe's node-local model cache (kserve.localmodel.enabled), shared by every namespace")
