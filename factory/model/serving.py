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
  endpoint picker;
- a model on NVIDIA Dynamo (`runtime: dynamo`, a `DynamoGraphDeployment` named after the model) is
  reached at the Service the Dynamo operator creates for its frontend, `<model>-frontend`, port
  8000, plain HTTP; the frontend routes to the model's workers itself.

Every model pod carries `pod_labels`, so a network policy can name exactly one model's pods.
KServe creates no Ingress or HTTPRoute of its own (`disableIngressCreation`, and no `router.route`
on an LLMInferenceService): routes are the gateway layer's. The InferencePool CRDs
(`inference.networking.k8s.io`) come with `kserve-llmisvc-resources` (`createGIECRDs`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from ai_factory.factory.model.config import FactoryConfig, Pool, ServedModel, Tenant
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.model.quantity import cores, gib, parse_quantity
from ai_factory.factory.model.raw import did_you_mean
from ai_factory.factory.model.tenancy import DEFAULT_CONTAINER_LIMIT, DEFAULT_CONTAINER_REQUEST, LABEL_PREFIX, tenant_names
from ai_factory.factory.planning.model import HAMI_CORES, HAMI_MEMORY, WHOLE_GPU

MODEL_LABEL = f"{LABEL_PREFIX}/model"
"""On every pod of a served model: the model's name in its tenant."""

ServingKind = Literal["InferenceService", "LLMInferenceService", "DynamoGraphDeployment"]

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


DYNAMO_FRONTEND = "Frontend"
"""The frontend's key among a DynamoGraphDeployment's services; the operator names its Service
`<deployment>-frontend` (lowercased)."""
DYNAMO_PORT = 8000
"""The Dynamo frontend's HTTP port (`--http-port`)."""
DYNAMO_FRONTEND_RESOURCES = {"cpu": "2", "memory": "4Gi"}
"""The frontend pod's CPU and memory (the memory limit equals the request): it tokenizes and
routes, on no GPU."""


def serving_kind(cfg: FactoryConfig, model: ServedModel) -> ServingKind:
    return kind_on(cfg.pool(model.gpus.pool), model)


def kind_on(pool: Pool, model: ServedModel) -> ServingKind:
    """`DynamoGraphDeployment` for a model on Dynamo; on KServe, `LLMInferenceService` for a
    disaggregated model or one whose replica spans nodes."""
    if model.runtime == "dynamo":
        return "DynamoGraphDeployment"
    return "LLMInferenceService" if model.disaggregation or model.gpus.count > pool.gpu.per_node else "InferenceService"


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
    if kind == "DynamoGraphDeployment":
        return ModelEndpoint(
            tenant=tenant.name,
            model=model.name,
            namespace=names.namespace,
            kind=kind,
            object_name=model.name,
            service=f"{model.name}-{DYNAMO_FRONTEND.lower()}",
            port=DYNAMO_PORT,
            scheme="http",
            served_name=served_name(tenant, model),
            expose=model.expose,
            pod_labels=((MODEL_LABEL, model.name),),
        )
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


# --------------------------------------------------------------------------- what a replica needs

MIG_USABLE_GIB_PER_GB = 0.95
"""A MIG instance holds a little less than its name says (a `1g.10gb` shows 9728 MiB in nvidia-smi,
9.5 GiB): the fit check counts 0.95 GiB per nominal GB."""


@dataclass(frozen=True)
class ReplicaShape:
    """The GPU resource one replica (one pod per node it spans) asks for, from its pool's sharing."""

    sharing: str
    units: int
    """Units of the tenant's grant one replica takes: whole GPUs, MIG instances or HAMi vGPUs."""
    memory_gib: float
    """GPU memory of one replica, all its GPUs together."""
    nodes: int
    """Nodes one replica spans (LeaderWorkerSet group size); 1 for most."""
    mig_profile: str | None = None
    hami_memory_mib: int | None = None
    hami_cores_percent: int | None = None


def pod_gpu_resources(pool: Pool, shape: ReplicaShape) -> dict[str, str]:
    """Exactly the GPU resources one pod of a replica (one per node it spans) asks for, as requests
    and as limits: whole `nvidia.com/gpu`, one MIG instance, one HAMi vGPU with its memory and
    cores; none for a DRA pool (its pods claim from the tenant's ResourceClaimTemplate instead)."""
    if shape.sharing == "mig":
        return {GPU_MODELS[pool.gpu.model].profile(shape.mig_profile or "").resource_name: "1"}
    if shape.sharing == "hami":
        return {WHOLE_GPU: "1", HAMI_MEMORY: str(shape.hami_memory_mib), HAMI_CORES: str(shape.hami_cores_percent)}
    if shape.sharing == "dra":
        return {}
    return {WHOLE_GPU: str(shape.units // shape.nodes)}


def granted(tenant: Tenant, pool: str):
    """The tenant's demand on `pool`, None without a grant there."""
    return next((d for d in tenant.gpus if d.pool == pool), None)


def nvlink_domain_gpus(pool: Pool) -> int:
    """GPUs one NVLink/NVSwitch domain of the pool joins: a node's, times the nodes of a multi-node
    NVLink domain; 1 on a PCIe pool (no NVLink between its GPUs)."""
    if pool.topology.intra_node == "pcie":
        return 1
    return pool.gpu.per_node * pool.topology.nodes_per_nvlink_domain


def replica_shape(pool: Pool, tenant: Tenant, model: ServedModel) -> ReplicaShape:
    """What one replica asks for; the caller has checked the model against its pool (`model_problems`)."""
    gpu = GPU_MODELS[pool.gpu.model]
    gpus = model.gpus
    if pool.sharing == "mig":
        profile = gpu.profile(gpus.mig or "")
        return ReplicaShape("mig", 1, profile.memory_gb * MIG_USABLE_GIB_PER_GB, 1, mig_profile=profile.name)
    if pool.sharing == "hami":
        grant = granted(tenant, pool.name)
        memory = gpus.memory_mib or (grant.memory_mib if grant else None) or 0
        cores = gpus.cores_percent or (grant.cores_percent if grant else None) or 100
        return ReplicaShape("hami", 1, memory / 1024, 1, hami_memory_mib=memory, hami_cores_percent=cores)
    nodes = max(1, math.ceil(gpus.count / pool.gpu.per_node))
    return ReplicaShape(pool.sharing, gpus.count, gpus.count * gpu.memory_mib / 1024, nodes)


def replicas_at_max(model: ServedModel) -> int:
    """Replicas the planner reserves GPUs for: decode replicas at `max`, plus the prefill replicas."""
    return model.replicas.max + (model.disaggregation.prefill_replicas if model.disaggregation else 0)


def model_problems(path: str, tenant: Tenant, model: ServedModel, pools: dict[str, Pool]) -> list[str]:
    """Why one model cannot be served as declared, each problem with its field path (`path` is the
    model's, e.g. `tenants[0].models[1]`). Grant accounting over all of a tenant's models is
    `grant_problems`."""
    gpus = model.gpus
    pool = pools.get(gpus.pool)
    if pool is None:
        return [f"{path}.gpus.pool: unknown pool {gpus.pool!r}{did_you_mean(gpus.pool, pools)}"]
    grant = granted(tenant, pool.name)
    if grant is None:
        held = sorted(d.pool for d in tenant.gpus)
        return [f"{path}.gpus.pool: tenant {tenant.name!r} has no grant in pool {pool.name!r} (its grants: {', '.join(held) or 'none'}); add one to `gpus` first"]
    problems: list[str] = []
    sharing = pool.sharing
    if sharing == "time-slicing":
        return [f"{path}.gpus.pool: pool {pool.name!r} is time-sliced, which isolates no GPU memory between pods; serve models on whole GPUs, MIG or HAMi"]
    wanted = {"mig": {"mig"}, "hami": {"memory_mib", "cores_percent"}}.get(sharing, {"count"})
    given = {k for k in ("mig", "memory_mib", "cores_percent") if getattr(gpus, k) is not None} | ({"count"} if gpus.count != 1 else set())
    for key in sorted(given - wanted):
        problems.append(f"{path}.gpus.{key}: not used on {sharing} pool {pool.name!r} (it takes {', '.join(sorted(wanted))})")
    parallel = model.tensor_parallel * model.pipeline_parallel
    if sharing in ("mig", "hami") and parallel > 1:
        problems.append(f"{path}.tensor_parallel: a replica on {sharing} pool {pool.name!r} runs on one {'MIG instance' if sharing == 'mig' else 'HAMi slice'}, which joins no other over NVLink; tensor and pipeline parallelism must be 1")
    if sharing == "mig":
        if gpus.mig is None:
            return problems + [f"{path}.gpus.mig: required on mig pool {pool.name!r} (one of the profiles granted: {', '.join(p for p, _ in sorted(grant.mig.items()))})"]
        if gpus.mig not in {p.name for p in GPU_MODELS[pool.gpu.model].mig_profiles}:
            return problems + [f"{path}.gpus.mig: not a MIG profile of {pool.gpu.model}{did_you_mean(gpus.mig, [p.name for p in GPU_MODELS[pool.gpu.model].mig_profiles])}"]
        if gpus.mig not in grant.mig:
            return problems + [f"{path}.gpus.mig: tenant {tenant.name!r} is granted no {gpus.mig} instance on pool {pool.name!r}{did_you_mean(gpus.mig, grant.mig)}"]
    elif sharing == "hami":
        if gpus.memory_mib is not None and grant.memory_mib is not None and gpus.memory_mib > grant.memory_mib:
            problems.append(f"{path}.gpus.memory_mib: {gpus.memory_mib} MiB is more than the tenant's slices on pool {pool.name!r} ({grant.memory_mib} MiB)")
        if gpus.cores_percent is not None and grant.cores_percent is not None and gpus.cores_percent > grant.cores_percent:
            problems.append(f"{path}.gpus.cores_percent: {gpus.cores_percent}% is more than the tenant's slices on pool {pool.name!r} ({grant.cores_percent}%)")
    else:
        if parallel != gpus.count:
            problems.append(f"{path}.gpus.count: {gpus.count} GPU(s) per replica, but tensor x pipeline parallelism is {model.tensor_parallel} x {model.pipeline_parallel} = {parallel}; they must be equal")
        domain = nvlink_domain_gpus(pool)
        if model.tensor_parallel > domain:
            link = "has no NVLink between GPUs" if domain == 1 else f"joins {domain} GPUs per NVLink domain"
            problems.append(f"{path}.tensor_parallel: {model.tensor_parallel}-way tensor parallelism spans more than one NVLink domain of pool {pool.name!r} (it {link}); use pipeline parallelism across domains")
        per_node = pool.gpu.per_node
        if gpus.count > per_node and gpus.count % per_node:
            problems.append(f"{path}.gpus.count: a replica over {per_node}-GPU nodes takes whole nodes; {gpus.count} is not a multiple of {per_node}")
    if model.runtime == "dynamo" and model.source.startswith("s3://"):
        problems.append(f"{path}.source: a Dynamo model loads from hf:// or pvc:// (Dynamo has no storage initializer for s3://); copy the weights to a claim of the tenant's, or serve it on KServe")
    if model.runtime == "dynamo" and gpus.count > pool.gpu.per_node:
        # Multi-node Dynamo workers need Grove or LeaderWorkerSet with Volcano's gang scheduling,
        # which this layer does not install (`components/dynamo.py`).
        problems.append(f"{path}.gpus.count: a Dynamo worker runs on one node; {gpus.count} GPUs are more than pool {pool.name!r} has per node ({pool.gpu.per_node}); serve it on KServe (`runtime: kserve`)")
    if problems:
        return problems
    shape = replica_shape(pool, tenant, model)
    need = weights_gib(model) + model.memory.kv_cache_gib
    usable = shape.memory_gib * model.gpu_memory_utilization
    if need > usable:
        field = {"mig": "gpus.mig", "hami": "gpus.memory_mib"}.get(sharing, "gpus.count")
        problems.append(
            f"{path}.{field}: weights {weights_gib(model):.1f} GiB + KV cache {model.memory.kv_cache_gib:g} GiB = {need:.1f} GiB do not fit "
            f"a replica's {shape.memory_gib:.1f} GiB x gpu_memory_utilization {model.gpu_memory_utilization:g} = {usable:.1f} GiB on pool {pool.name!r}"
        )
    if model.credentials is not None and model.source.startswith("pvc://"):
        problems.append(f"{path}.credentials: a pvc:// source is read from the tenant's own volume; it takes no credentials")
    problems += credential_problems(path, model)
    return problems


CREDENTIAL_VARIABLES = {"hf://": ("HF_TOKEN",), "s3://": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
"""The keys a source's credential Secret must hold, by scheme: what KServe's credential builder
recognises a Secret by and hands its storage initializer (`HF_TOKEN`; the `kserve.storage.s3`
key names of the kserve-resources chart), and what vLLM reads when it downloads itself."""


def credential_problems(path: str, model: ServedModel) -> list[str]:
    problems = []
    scheme = model.source.split("://", 1)[0] + "://"
    if model.s3 is not None:
        if scheme != "s3://":
            problems.append(f"{path}.s3: only for an s3:// source")
        elif model.credentials is None:
            problems.append(f"{path}.s3: the settings reach KServe's storage initializer as annotations of the source's credential Secret; give `credentials`")
    if model.credentials is not None and model.credentials.properties:
        missing = [v for v in CREDENTIAL_VARIABLES.get(scheme, ()) if v not in model.credentials.properties]
        if missing:
            problems.append(f"{path}.credentials.properties: a {scheme} source's downloader reads {', '.join(CREDENTIAL_VARIABLES[scheme])}; missing {', '.join(missing)}")
    return problems


def grant_units(tenant: Tenant, pool: Pool) -> tuple[dict[str, int], str]:
    """What the tenant's grant on `pool` holds, by the key models count against (a MIG profile, or
    `gpus`), and the unit's name."""
    grant = granted(tenant, pool.name)
    if grant is None:
        return {}, ""
    if pool.sharing == "mig":
        return dict(grant.mig), "instances"
    return {"gpus": grant.count or 0}, "HAMi vGPUs" if pool.sharing == "hami" else "GPUs"


def grant_problems(path: str, tenant: Tenant, pools: dict[str, Pool], valid: set[int]) -> list[str]:
    """Models' replicas at their maximum must fit the tenant's grant on each pool: refused with the
    shortfall. `valid` are the indexes of models `model_problems` accepted."""
    used: dict[tuple[str, str], list[int]] = {}
    for j, model in enumerate(tenant.models):
        if j not in valid:
            continue
        pool = pools[model.gpus.pool]
        key = model.gpus.mig if pool.sharing == "mig" else "gpus"
        units = replica_shape(pool, tenant, model).units * replicas_at_max(model)
        used.setdefault((pool.name, key or ""), []).append((units, j))
    problems = []
    for (pool_name, key), entries in sorted(used.items()):
        need, indexes = sum(u for u, _ in entries), [j for _, j in entries]
        held, unit = grant_units(tenant, pools[pool_name])
        have = held.get(key, 0)
        if need > have:
            what = f"{key} {unit}" if key != "gpus" else unit
            names = ", ".join(tenant.models[j].name for j in indexes)
            problems.append(
                f"{path}.models[{indexes[-1]}].replicas.max: models {names} need {need} {what} on pool {pool_name!r} at their maximum replicas; "
                f"tenant {tenant.name!r} is granted {have}, {need - have} short"
            )
    return problems


# --------------------------------------------------------------------------- CPU and memory


@dataclass(frozen=True)
class HostDemand:
    """What pods take of a namespace's ResourceQuota besides GPUs."""

    pods: int = 0
    cpu: Decimal = Decimal(0)
    """`requests.cpu`, in cores."""
    memory: Decimal = Decimal(0)
    """`requests.memory`, in bytes."""
    memory_limit: Decimal = Decimal(0)
    """`limits.memory`, in bytes."""

    def __add__(self, other: HostDemand) -> HostDemand:
        return HostDemand(self.pods + other.pods, self.cpu + other.cpu, self.memory + other.memory, self.memory_limit + other.memory_limit)

    def times(self, n: int) -> HostDemand:
        return HostDemand(self.pods * n, self.cpu * n, self.memory * n, self.memory_limit * n)


def pod_demand(requests: dict[str, str], limits: dict[str, str]) -> HostDemand:
    """One pod of containers whose requests and memory limits are given (a limit defaulting to the
    tenant LimitRange's when unset)."""
    limit = limits.get("memory", DEFAULT_CONTAINER_LIMIT["memory"])
    return HostDemand(1, parse_quantity(requests["cpu"]), parse_quantity(requests["memory"]), parse_quantity(limit))


PICKER_POD = HostDemand(
    1,
    parse_quantity("1") + parse_quantity("256m"),
    parse_quantity("2Gi") + parse_quantity("500Mi"),
    parse_quantity("16Gi") + parse_quantity(DEFAULT_CONTAINER_LIMIT["memory"]),
)
"""The endpoint picker pod KServe runs in the tenant's namespace for each LLMInferenceService (the
`kserve-config-llm-scheduler` preset of kserve-runtime-configs v0.20.0): its scheduler container
requests 1 core and 2Gi (limit 16Gi), its tokenizer 256m and 500Mi (no limit: the LimitRange's)."""
ROUTING_SIDECAR = HostDemand(0, parse_quantity(DEFAULT_CONTAINER_REQUEST["cpu"]), parse_quantity(DEFAULT_CONTAINER_REQUEST["memory"]), parse_quantity(DEFAULT_CONTAINER_LIMIT["memory"]))
"""llm-d's routing sidecar in each decode pod of a disaggregated model (`resources: {}` in the
`kserve-config-llm-decode-template` preset): the LimitRange's defaults."""


def model_pod(model: ServedModel) -> HostDemand:
    """One pod of the model: its container's `resources` (the memory limit equals the request)."""
    return pod_demand({"cpu": model.resources.cpu, "memory": model.resources.memory}, {"memory": model.resources.memory})


def host_demand(pool: Pool, tenant: Tenant, model: ServedModel) -> HostDemand:
    """Every pod of the model at its maximum replicas: a pod per node of each decode and prefill
    replica, a Dynamo model's frontend, and for an LLMInferenceService its endpoint picker (and the decode pods' routing
    sidecars when disaggregated). KServe's storage initializer runs before the model container and
    asks less than it (`resources` bounds), so it adds nothing."""
    nodes = replica_shape(pool, tenant, model).nodes
    demand = model_pod(model).times(replicas_at_max(model) * nodes)
    if kind_on(pool, model) == "DynamoGraphDeployment":  # and its one frontend
        return demand + pod_demand(DYNAMO_FRONTEND_RESOURCES, {"memory": DYNAMO_FRONTEND_RESOURCES["memory"]})
    if kind_on(pool, model) == "LLMInferenceService":
        demand += PICKER_POD
        if model.disaggregation:
            demand += ROUTING_SIDECAR.times(model.replicas.max * nodes)
    return demand


def quota_problems(path: str, tenant: Tenant, pools: dict[str, Pool], valid: set[int]) -> list[str]:
    """The pods of all of a tenant's models at their maximum replicas must fit its ResourceQuota
    (`tenants[].quota`: CPU, memory requests and limits, pods), refused with the shortfall.
    `valid` are the indexes of models `model_problems` accepted."""
    indexes = sorted(valid)
    if not indexes:
        return []
    total = HostDemand()
    for j in indexes:
        model = tenant.models[j]
        total += host_demand(pools[model.gpus.pool], tenant, model)
    names = ", ".join(tenant.models[j].name for j in indexes)
    quota = tenant.quota
    problems = []
    cpu = parse_quantity(quota.cpu)
    if total.cpu > cpu:
        problems.append(f"{path}.quota.cpu: models {names} request {cores(total.cpu)} CPU at their maximum replicas; the quota holds {quota.cpu}, {cores(total.cpu - cpu)} short")
    memory = parse_quantity(quota.memory)
    need = max(total.memory, total.memory_limit)
    if need > memory:
        problems.append(f"{path}.quota.memory: models {names} take {gib(need)} of memory (requests {gib(total.memory)}, limits {gib(total.memory_limit)}) at their maximum replicas; the quota holds {quota.memory}, {gib(need - memory)} short")
    if total.pods > quota.pods:
        problems.append(f"{path}.quota.pods: models {names} run {total.pods} pods at their maximum replicas; the quota holds {quota.pods}, {total.pods - quota.pods} short")
    return problems
