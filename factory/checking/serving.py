"""Offline checks of served models (`components/serving.py`, `components/dynamo.py`): a model's
pods stay inside their tenant's GPUs and quota (its CPU and memory at the model's maximum replicas
too), and no model cache is shared between tenants.

The generic pod checks (`isolation.tenant_pods`) look for pod specs by their `containers`; an
`InferenceService` predictor keeps its container under `model`, so the model objects get their own
check here."""

from __future__ import annotations

import re
from decimal import Decimal
from collections.abc import Mapping
from typing import Any, Iterable, Iterator

from ai_factory.factory.checking.findings import Finding, tenant_local
from ai_factory.factory.checking.isolation import View
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.model.quantity import cores, gib, parse_quantity
from ai_factory.factory.model.serving import PICKER_POD, ROUTING_SIDECAR, HostDemand
from ai_factory.factory.model.tenancy import DEFAULT_CONTAINER_LIMIT, DEFAULT_CONTAINER_REQUEST
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.serving import pod_gpu_resources, replica_shape
from ai_factory.factory.model.tenancy import TRUST_DOMAIN_LABEL
from ai_factory.factory.planning.model import WHOLE_GPU
from ai_factory.factory.planning.placement import DEDICATED_LABEL
from ai_factory.factory.rendering.bundle import Manifest, Rendered

MODEL_KINDS = ("InferenceService", "LLMInferenceService", "DynamoGraphDeployment")
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
    if m.kind == "DynamoGraphDeployment":
        for name, service in sorted(_mapping(spec.get("services")).items()):
            if isinstance(service, Mapping):
                yield f"spec.services.{name}", _mapping(service.get("extraPodSpec")), _mapping(_mapping(service.get("extraPodMetadata")).get("labels"))
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


@tenant_local
def model_pods(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Each model object is in a tenant's namespace; its pods name the tenant's Kueue queue (so
    serving is admitted against the tenant's quota), tolerate only their tenant's trust-domain and
    dedicated-node taints, and mount no host path (no node cache shared between tenants)."""
    view = View.of(rendered)
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
    view = View.of(rendered)
    for m in view.of_kind(*SHARED_CACHE_KINDS):
        yield Finding("shared-model-cache", m.ref, "a KServe node-local model cache is shared by every namespace")
    for m in view.of_kind("HelmRelease"):
        values = _mapping(_mapping(m.obj.get("spec")).get("values"))
        localmodel = _mapping(_mapping(values.get("kserve")).get("localmodel"))
        if localmodel.get("enabled") is True:
            yield Finding("shared-model-cache", m.ref, "enables KServe's node-local model cache (kserve.localmodel.enabled), shared by every namespace")


# --------------------------------------------------------------------------- CPU and memory

_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def _amount(value: Any) -> Decimal | None:
    """A quantity as rendered (string or number); None when unreadable (the schema check reports it)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    if isinstance(value, str) and _QUANTITY.match(value):
        return parse_quantity(value)
    return None


def _count(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _container(container: Any) -> HostDemand:
    """One container as the tenant namespace's quota counts it: an unset request is its limit or
    the LimitRange's default, an unset memory limit the LimitRange's."""
    resources = _mapping(_mapping(container).get("resources"))
    requests, limits = _mapping(resources.get("requests")), _mapping(resources.get("limits"))

    def request(name: str) -> Decimal:
        given = _amount(requests.get(name, limits.get(name, DEFAULT_CONTAINER_REQUEST[name])))
        return given if given is not None else Decimal(0)

    limit = _amount(limits.get("memory", DEFAULT_CONTAINER_LIMIT["memory"]))
    return HostDemand(0, request("cpu"), request("memory"), limit if limit is not None else Decimal(0))


def _pod(pod: Mapping[str, Any]) -> HostDemand:
    total = HostDemand(1)
    for container in pod.get("containers") or []:
        total += _container(container)
    return total


def model_demand(kind: str, spec: Any) -> HostDemand:
    """Every pod a rendered model object runs at its maximum replicas, as its namespace's quota
    counts them: an InferenceService's predictor at `maxReplicas`; an LLMInferenceService's decode
    (at `scaling.maxReplicas`) and prefill replicas of one pod per pipeline stage when it has
    workers, its endpoint picker (`router.scheduler`) and, with prefill, the decode pods' routing
    sidecars (KServe's presets, `factory.model.serving`)."""
    spec = _mapping(spec)
    if kind == "DynamoGraphDeployment":
        return _dynamo_demand(spec)
    if kind == "InferenceService":
        # KServe: `minReplicas` defaults to 1, a `maxReplicas` below it (0: unset) is the minimum.
        predictor = _mapping(spec.get("predictor"))
        minimum = _count(predictor.get("minReplicas"), 1)
        return (HostDemand(1) + _container(predictor.get("model"))).times(max(minimum, _count(predictor.get("maxReplicas"), minimum)))
    scaling = _mapping(spec.get("scaling"))
    decode = _pods(spec, spec, _count(scaling.get("maxReplicas"), _count(spec.get("replicas"), 1)))
    total = _pod(_mapping(spec.get("template"))).times(decode)
    prefill = spec.get("prefill")
    if isinstance(prefill, Mapping):
        total += _pod(_mapping(prefill.get("template"))).times(_pods(spec, prefill, _count(prefill.get("replicas"), 1)))
        total += ROUTING_SIDECAR.times(decode)
    if "scheduler" in _mapping(spec.get("router")):
        total += PICKER_POD
    return total


def _dynamo_demand(spec: Mapping[str, Any]) -> HostDemand:
    """A DynamoGraphDeployment's components at their `replicas`, each pod its main container: no
    autoscaler moves a Dynamo worker past what the object states."""
    total = HostDemand()
    for service in _mapping(spec.get("services")).values():
        service = _mapping(service)
        main = _mapping(_mapping(service.get("extraPodSpec")).get("mainContainer"))
        total += (HostDemand(1) + _container(main)).times(_count(service.get("replicas"), 1))
    return total


def _pods(spec: Mapping[str, Any], part: Mapping[str, Any], replicas: int) -> int:
    """Pods of `replicas` replicas of a part: one per pipeline stage when it has workers
    (LeaderWorkerSet groups), else one."""
    if not isinstance(part.get("worker"), Mapping):
        return replicas
    parallelism = _mapping(part.get("parallelism", spec.get("parallelism")))
    return replicas * (_count(parallelism.get("pipeline"), 1) or 1)


def quota_shortfalls(hard: Mapping[str, Any], demand: HostDemand) -> list[str]:
    """What a demand takes beyond a ResourceQuota's `hard` CPU, memory and pod lines (a line the
    quota does not set limits nothing)."""
    problems = []
    for key, need, show in (
        ("requests.cpu", demand.cpu, cores),
        ("requests.memory", demand.memory, gib),
        ("limits.memory", demand.memory_limit, gib),
    ):
        have = _amount(hard.get(key))
        if have is not None and need > have:
            problems.append(f"{key} {show(need)} over the quota's {hard[key]} ({show(need - have)} short)")
    pods = _amount(hard.get("count/pods", hard.get("pods")))
    if pods is not None and demand.pods > pods:
        problems.append(f"{demand.pods} pods over the quota's {pods:f} ({demand.pods - pods:f} short)")
    return problems


def model_quota(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """The pods of a tenant namespace's models at their maximum replicas fit its ResourceQuota's
    CPU, memory and pods: a model that cannot scale to its maximum would stall below it, and
    its tenant's other pods would be refused meanwhile."""
    view = View.of(rendered)
    demands: dict[str, tuple[HostDemand, list[str]]] = {}
    for m in view.of_kind(*MODEL_KINDS):
        if view.tenant_at(m.namespace) is None:
            continue  # model_pods reports it
        total, names = demands.get(m.namespace or "", (HostDemand(), []))
        demands[m.namespace or ""] = (total + model_demand(m.kind, m.obj.get("spec")), [*names, m.ref])
    for ns, (demand, refs) in sorted(demands.items()):
        owner = view.tenant_at(ns)
        for quota in view.in_namespace("ResourceQuota", ns):
            hard = _mapping(_mapping(quota.obj.get("spec")).get("hard"))
            for problem in quota_shortfalls(hard, demand):
                yield Finding("model-quota", quota.ref, f"the models of tenant {owner.tenant} ({', '.join(refs)}) at their maximum replicas take {problem}", (owner.tenant,))
# --------------------------------------------------------------------------- Dynamo

GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
"""Whole GPUs, HAMi's `nvidia.com/gpumem`/`gpucores` and MIG instances."""


def gpus_of(resources: Any) -> dict[str, str]:
    """The GPU part of a Kubernetes resource list."""
    return {str(k): str(v) for k, v in _mapping(resources).items() if str(k).startswith(GPU_RESOURCE_PREFIXES)}


def dynamo_gpus(side: Any) -> dict[str, str]:
    """The GPU part of a Dynamo `resources.requests`/`limits`, as the operator names them."""
    side = _mapping(side)
    found = gpus_of(side.get("custom"))
    if side.get("gpu") not in (None, ""):
        found[str(side.get("gpuType") or WHOLE_GPU)] = str(side["gpu"])
    return found


def _planned_gpus(cfg: FactoryConfig | None, tenant: str, model: str) -> dict[str, str] | None:
    """What the plan gives one worker pod of the tenant's Dynamo model; None when the render
    carries no config, or the config declares no such model (reported apart)."""
    if cfg is None:
        return None
    owner = next((t for t in cfg.tenants if t.name == tenant), None)
    served = next((m for m in owner.models if m.name == model and m.runtime == "dynamo"), None) if owner else None
    pool = next((p for p in cfg.fleet.pools if served and p.name == served.gpus.pool), None)
    if owner is None or served is None or pool is None:
        return None
    return pod_gpu_resources(pool, replica_shape(pool, owner, served))


def dynamo_workers(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Each DynamoGraphDeployment serves a Dynamo model its tenant declares; each worker asks for
    exactly the GPUs the plan gives one of the model's pods, as requests and as limits, in Dynamo's
    `resources` and on its main container alike; no other component asks for a GPU."""
    view = View.of(rendered)
    cfg = rendered.config
    for m in view.of_kind("DynamoGraphDeployment"):
        owner = view.tenant_at(m.namespace)
        if owner is None:
            continue  # `model_pods` reports it
        tenants = (owner.tenant,)
        planned = _planned_gpus(cfg, owner.tenant, m.name)
        if cfg is not None and planned is None:
            yield Finding("dynamo-workers", m.ref, f"no Dynamo model {m.name} of tenant {owner.tenant} is declared: nothing planned its GPUs", tenants)
            continue
        for name, service in sorted(_mapping(_mapping(m.obj.get("spec")).get("services")).items()):
            service = _mapping(service)
            resources = _mapping(service.get("resources"))
            main = _mapping(_mapping(_mapping(service.get("extraPodSpec")).get("mainContainer")).get("resources"))
            asked = {
                "resources.requests": dynamo_gpus(resources.get("requests")),
                "resources.limits": dynamo_gpus(resources.get("limits")),
                "extraPodSpec.mainContainer.resources.requests": gpus_of(main.get("requests")),
                "extraPodSpec.mainContainer.resources.limits": gpus_of(main.get("limits")),
            }
            where = f"spec.services.{name}"
            if service.get("componentType") != "worker":
                for path, gpus in asked.items():
                    if gpus:
                        yield Finding("dynamo-workers", m.ref, f"{where}.{path}: a {service.get('componentType') or 'component'} asks for GPUs ({listed_gpus(gpus)}); only workers run the model", tenants)
                continue
            expected = planned if planned is not None else asked["resources.limits"]
            for path, gpus in asked.items():
                if gpus != expected:
                    why = "the plan gives one of its pods" if planned is not None else "its Dynamo limits state"
                    yield Finding("dynamo-workers", m.ref, f"{where}.{path}: asks for {listed_gpus(gpus)}, not the {listed_gpus(expected)} {why}", tenants)


def listed_gpus(gpus: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(gpus.items())) or "no GPU"
