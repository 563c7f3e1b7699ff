"""The one definition of a GPU-second, as Prometheus recording rules (README, "Metering").

A GPU-equivalent is the share of one physical GPU a container holds; GPU-equivalent seconds are
its integral over time. Per sharing mode (the pool's `sharing`):
- exclusive: each `nvidia.com/gpu` is 1;
- mig: an instance is its profile's share of the GPU's **memory slices** (memory slices / 8): the
  8-wide memory axis is what instances may not share (placements are memory-slice ranges), so
  the shares of one GPU add up to at most 1 and a stranded slice is idle, never billed twice;
- hami: a slice is its reserved **device memory** over the memory HAMi registers for the GPU
  (`hami_vgpu_memory_allocated_bytes / hami_gpu_memory_limit_bytes`): memory is the limit HAMi
  enforces hard (cores are a soft throttle, and optional), and HAMi never reserves more than the
  registered memory, so shares add up to at most 1;
- time-slicing: a replica (`nvidia.com/gpu.shared`) is 1 / replicas of the device;
- dra: each allocated device is 1 (a MIG partition allocated through DRA: its profile's share).
On every node the shares are then capped at the node's GPUs, split in proportion to the raw
shares (only stale or inconsistent series can exceed them, e.g. more time-sliced pods than
replicas), so that for every pool and every evaluation:

    Σ over tenants (and `_unassigned`) of allocated + idle = physical GPUs.

Over an interval the same holds for GPU-seconds (each evaluation counts for the rule interval),
up to float rounding (tolerance 1e-9 GPU-seconds per sample). Idle capacity is the pool's: it is
reported per pool (`aif:pool_gpu_equivalents:idle`), not spread over tenants.

Used GPU-equivalents (where a per-container metric exists): `DCGM_FI_PROF_GR_ENGINE_ACTIVE`
(ratio of time the graphics engine is active, per GPU or MIG instance, attributed to the pod by
the exporter) times the allocated share, capped at the allocation; exclusive, MIG and DRA only:
with time-slicing and HAMi the exporter reports the whole device, not a container.

Allocation comes from kube-state-metrics (`kube_pod_container_resource_requests` of Running
pods), HAMi's scheduler (`hami_vgpu_memory_allocated_bytes`) and, for DRA, the DCGM exporter's
pod attribution. Which node is in which pool, how many GPUs it has, which namespace is which
tenant's and each profile's share are facts of the config and the plan: the rules carry them as
constant series (`vector(n)` with labels), so the rules need no node or namespace labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.gpus import GPU_MODELS, MEMORY_SLICES
from ai_factory.factory.model.tenancy import tenant_names
from ai_factory.factory.planning.model import WHOLE_GPU, Plan

GROUP = "ai-factory-gpu-metering"
INTERVAL_SECONDS = 60
"""Every evaluation counts for this many seconds; the bill integrates samples at this step."""
UNASSIGNED = "_unassigned"
"""Tenant label of GPUs held by pods outside every tenant's namespace (not a DNS label, so no tenant
can be called that)."""

NODE_GPUS = "aif:node_gpus"
NODE_POOL = "aif:node_pool:info"
NAMESPACE_TENANT = "aif:namespace_tenant:info"
PROFILE_SHARE = "aif:mig_profile_share"
REPLICA_SHARE = "aif:pool_replica_share"
POOL_GPUS = "aif:pool_gpus"
POD_REQUESTED = "aif:pod_gpu_equivalents:requested"
POD_ALLOCATED = "aif:pod_gpu_equivalents:allocated"
POD_USED_RAW = "aif:pod_gpu_equivalents:engine_active"
POD_USED = "aif:pod_gpu_equivalents:used"
TENANT_ALLOCATED = "aif:tenant_gpu_equivalents:allocated"
TENANT_USED = "aif:tenant_gpu_equivalents:used"
POOL_IDLE = "aif:pool_gpu_equivalents:idle"

POD = "namespace, pod, node, pool, gpu_model, mode"
TENANT = "tenant, namespace, pool, gpu_model, mode"
POOL = "pool, gpu_model, mode"
RUNNING = 'on(namespace, pod) group_left() (kube_pod_status_phase{phase="Running"} == 1)'
IN_POOL = f"on(node) group_left(pool, gpu_model, mode) {NODE_POOL}"


@dataclass(frozen=True)
class MeteredNode:
    name: str
    pool: str
    gpu_model: str
    mode: str
    gpus: int


@dataclass(frozen=True)
class ProfileShare:
    gpu_model: str
    profile: str
    resource: str
    """kube-state-metrics' name of the profile's resource (`nvidia.com/mig-1g.10gb` →
    `nvidia_com_mig_1g_10gb`: every character outside [a-zA-Z0-9_] becomes `_`)."""
    share: float


@dataclass(frozen=True)
class Metering:
    """What the rules need from the config and the plan."""

    nodes: tuple[MeteredNode, ...]
    tenants: tuple[tuple[str, str], ...]
    """(tenant, host namespace); a vCluster tenant's pods are synced into that namespace."""
    replicas: tuple[tuple[str, int], ...]
    """(pool, time-slicing replicas) of the time-sliced pools."""
    profiles: tuple[ProfileShare, ...]
    whole_gpus: tuple[str, ...] = ("nvidia_com_gpu",)
    """The resources a whole GPU is requested as (kube-state-metrics spelling): `nvidia.com/gpu`,
    and each VM pool's sandbox device plugin name, which its VMs' virt-launcher pods request."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> Metering:
        nodes = tuple(
            MeteredNode(node.name, pool.name, pool.gpu_model, pool.sharing, pool.gpus_per_node)
            for pool in plan.pools
            for node in pool.nodes
        )
        return cls(
            nodes=tuple(sorted(nodes, key=lambda n: n.name)),
            tenants=tuple(sorted((t.name, tenant_names(t).namespace) for t in cfg.tenants)),
            replicas=tuple(sorted((p.name, p.time_slicing_replicas) for p in plan.pools if p.sharing == "time-slicing")),
            profiles=profile_shares(p.gpu_model for p in plan.pools if p.sharing in ("mig", "dra")),
            whole_gpus=tuple(sorted({ksm_resource(WHOLE_GPU)} | {ksm_resource(p.vm_resource) for p in plan.pools if p.vm_resource})),
        )


def profile_shares(models: Iterable[str]) -> tuple[ProfileShare, ...]:
    """Every MIG profile of the models with its share: its memory slices over the GPU's eight."""
    return tuple(
        ProfileShare(model, profile.name, ksm_resource(profile.resource_name), profile.memory_slices / MEMORY_SLICES)
        for model in sorted(set(models))
        for profile in GPU_MODELS[model].mig_profiles
    )


def ksm_resource(resource: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in resource)


def _constant(record: str, value: float | int, labels: dict[str, str]) -> dict[str, Any]:
    return {"record": record, "expr": f"vector({value!r})", "labels": dict(sorted(labels.items()))}


def _node(series: str) -> str:
    """The DCGM exporter names the node `Hostname` (4.8.2) or `hostname` (4.8.3 on)."""
    return f'label_replace(label_replace({series}, "node", "$1", "Hostname", "(.+)"), "node", "$1", "hostname", "(.+)")'


def _profile(series: str) -> str:
    return f'label_replace({series}, "profile", "$1", "GPU_I_PROFILE", "(.+)")'


def inventory_rules(metering: Metering) -> list[dict[str, Any]]:
    rules = [
        _constant(NODE_GPUS, n.gpus, {"node": n.name, "pool": n.pool, "gpu_model": n.gpu_model, "mode": n.mode})
        for n in metering.nodes
    ]
    rules += [
        _constant(PROFILE_SHARE, p.share, {"gpu_model": p.gpu_model, "profile": p.profile, "resource": p.resource})
        for p in metering.profiles
    ]
    rules += [_constant(REPLICA_SHARE, 1 / replicas, {"pool": pool}) for pool, replicas in metering.replicas]
    rules += [
        {"record": NODE_POOL, "expr": f"{NODE_GPUS} > bool 0"},
        {"record": POOL_GPUS, "expr": f"sum by ({POOL}) ({NODE_GPUS})"},
    ]
    return rules


def requested(matcher: str) -> str:
    """GPU resource requests of the containers of Running pods, `matcher` on the resource label."""
    return f"(kube_pod_container_resource_requests{{resource{matcher}}} * {RUNNING})"


def dcgm(metric: str, partitions: bool) -> str:
    """A DCGM series attributed to a pod, with a `node` label: whole GPUs (no `GPU_I_PROFILE`) or
    MIG instances (with a `profile` label)."""
    if partitions:
        return _profile(_node(metric + '{pod!="", GPU_I_PROFILE!=""}'))
    return _node(metric + '{pod!="", GPU_I_PROFILE=""}')


def in_pool(*modes: str) -> str:
    """Join a per-node series with its node's pool, GPU model and mode, keeping the given modes."""
    return IN_POOL + '{mode=~"' + "|".join(modes) + '"}'


def allocation_rules(metering: Metering) -> list[dict[str, Any]]:
    """Raw shares per pod and mode, then capped per node, then per tenant and idle per pool."""
    gpu = requested('=~"' + "|".join(metering.whole_gpus) + '"')
    shared, mig = requested('="nvidia_com_gpu_shared"'), requested('=~"nvidia_com_mig_.+"')
    hami = "hami_vgpu_memory_allocated_bytes / on(node, device_uuid) group_left() hami_gpu_memory_limit_bytes"
    devices = f"count by (namespace, pod, node, UUID) ({dcgm('DCGM_FI_DEV_FB_USED', partitions=False)})"
    partitions = f"count by (namespace, pod, node, UUID, GPU_I_ID, profile) ({dcgm('DCGM_FI_DEV_FB_USED', partitions=True)})"
    by_profile = f"on(gpu_model, profile) group_left() {PROFILE_SHARE}"
    raw = {
        "exclusive": f"sum by ({POD}) ({gpu} * {in_pool('exclusive')})",
        "time-slicing": f"sum by ({POD}) ({shared} * {in_pool('time-slicing')}) * on(pool) group_left() {REPLICA_SHARE}",
        "mig": f"sum by ({POD}) ({mig} * {in_pool('mig')} * on(gpu_model, resource) group_left() {PROFILE_SHARE})",
        "hami": f"sum by ({POD}) (({hami}) * {in_pool('hami')})",
        "dra-device": f"sum by ({POD}) ({devices} * {in_pool('dra')})",
        "dra-partition": f"sum by ({POD}) ({partitions} * {in_pool('dra')} * {by_profile})",
    }
    rules = [{"record": POD_REQUESTED, "expr": expr, "labels": {"source": source}} for source, expr in raw.items()]
    requested_by_pod = f"sum without (source) ({POD_REQUESTED})"
    rules += [
        {
            "record": POD_ALLOCATED,
            "expr": f"{requested_by_pod} * on(node) group_left() clamp_max({NODE_GPUS} / on(node) sum by (node) ({POD_REQUESTED}), 1)",
        },
        {
            "record": TENANT_ALLOCATED,
            "expr": f"sum by ({TENANT}) ({POD_ALLOCATED} * on(namespace) group_left(tenant) {NAMESPACE_TENANT})",
        },
        {
            "record": TENANT_ALLOCATED,
            "expr": (
                f"label_replace(sum by (namespace, {POOL}) ({POD_ALLOCATED} unless on(namespace) {NAMESPACE_TENANT}),"
                f' "tenant", "{UNASSIGNED}", "", "")'
            ),
        },
        # From the pods, not the tenants: the invariant then checks that attribution to tenants
        # neither drops nor double-counts a pod.
        {"record": POOL_IDLE, "expr": f"({POOL_GPUS} - on({POOL}) sum by ({POOL}) ({POD_ALLOCATED})) or {POOL_GPUS}"},
    ]
    return rules


def usage_rules() -> list[dict[str, Any]]:
    active = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    whole = f"sum by ({POD}) ({dcgm(active, partitions=False)} * {in_pool('exclusive', 'dra')})"
    partition = (
        f"sum by ({POD}) ({dcgm(active, partitions=True)} * {in_pool('mig', 'dra')}"
        f" * on(gpu_model, profile) group_left() {PROFILE_SHARE})"
    )
    engine_active = f"sum without (source) ({POD_USED_RAW})"
    return [
        {"record": POD_USED_RAW, "expr": whole, "labels": {"source": "device"}},
        {"record": POD_USED_RAW, "expr": partition, "labels": {"source": "partition"}},
        # min(engine activity, allocation), only where both exist.
        {"record": POD_USED, "expr": f"({engine_active} <= {POD_ALLOCATED}) or ({POD_ALLOCATED} and {engine_active})"},
        {
            "record": TENANT_USED,
            "expr": f"sum by ({TENANT}) ({POD_USED} * on(namespace) group_left(tenant) {NAMESPACE_TENANT})",
        },
    ]


def platform_group(metering: Metering) -> dict[str, Any]:
    """The platform's group. One group, evaluated in order: every rule sees the results of the rules
    above it at the same timestamp, which is what makes the invariant exact."""
    rules = inventory_rules(metering) + allocation_rules(metering) + usage_rules()
    return {"name": GROUP, "interval": f"{INTERVAL_SECONDS}s", "rules": rules}


def tenant_group(tenant: str, namespace: str) -> dict[str, Any]:
    """The tenant's namespace → tenant series, in a PrometheusRule of the tenant's namespace (it goes
    with the tenant). Prometheus enforces the `namespace` label of rules outside the platform's
    namespaces, so such a rule cannot claim another namespace."""
    return {
        "name": f"{GROUP}-{namespace}",
        "interval": f"{INTERVAL_SECONDS}s",
        "rules": [_constant(NAMESPACE_TENANT, 1, {"namespace": namespace, "tenant": tenant})],
    }


def rule_groups(metering: Metering) -> list[dict[str, Any]]:
    """Every group Prometheus loads: the tenants' (constants, evaluated first) and the platform's."""
    return [tenant_group(tenant, ns) for tenant, ns in metering.tenants] + [platform_group(metering)]
