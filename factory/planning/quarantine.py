"""Quarantine one GPU, not its node: what upstream allows per sharing mode, and the DeviceTaintRule
that does it for a DRA pool (`ai-factory quarantine`).

- exclusive, mig, time-slicing, hami (NVIDIA device plugin): the plugin's health checker marks a GPU
  with a critical XID unhealthy and withdraws it, and under MIG every instance of that GPU, from
  the node's allocatable by itself; the node's other GPUs stay allocatable and their pods run on.
  Nothing is applied; the GPU comes back when the node reboots (NVIDIA/gpu-operator#1065).
- dra (NVIDIA DRA driver, which publishes no device health): a `DeviceTaintRule` (KEP-5055,
  `resource.k8s.io` v1alpha3 behind the `DRADeviceTaints` gate up to 1.35, v1beta2 in 1.36, v1
  from 1.37) taints the one device `gpu-<index>` of the node's ResourceSlice pool (a node-local
  driver's pool is named after its node): `NoSchedule` keeps new claims off it, `NoExecute` also
  evicts the pods whose claims use it, and no other device of the node. With the driver's dynamic
  MIG, each potential partition is a device of its own (`gpu-<index>-mig-...`) that a rule names
  one by one; this function taints the whole-GPU device only.
Deleting the rule returns the GPU to service. The health layer's remediation step writes the same
rule by itself from an XID (`components/_gpu_remediation.py`); this is the by-hand path.
"""

from __future__ import annotations

from typing import Any

from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.loading import ConfigError
from ai_factory.factory.planning.credits import tenant_shares
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.planning.model import Plan

DRA_DRIVER = "gpu.nvidia.com"
TAINT_KEY = "ai-factory.io/gpu-fault"
EFFECTS = ("NoSchedule", "NoExecute")
FIRST_VERSION = {"1.33": "v1alpha3", "1.34": "v1alpha3", "1.35": "v1alpha3", "1.36": "v1beta2", "1.37": "v1"}
"""The DeviceTaintRule API of each Kubernetes minor (1.32 has none)."""


def device_taint_rule(cfg: FactoryConfig, plan: Plan, node: str, gpu: int, effect: str = "NoSchedule") -> tuple[dict[str, Any], list[str]]:
    """The DeviceTaintRule quarantining GPU `gpu` of `node` and the tenants holding it; every
    problem at once (ConfigError) when the node is unknown, the GPU is not one of it, the pool is
    not a DRA pool or the cluster's Kubernetes has no DeviceTaintRule."""
    pools = {n.name: p for p in plan.pools for n in p.nodes}
    problems = []
    pool = pools.get(node)
    if pool is None:
        close = sorted(n for n in pools if n.startswith(node.rstrip("0123456789")))[:5]
        problems.append(f"node: {node!r} is no GPU node of the plan" + (f" (nodes like it: {', '.join(close)})" if close else ""))
    else:
        plan_node = next(n for n in pool.nodes if n.name == node)
        if not any(g.index == gpu for g in plan_node.gpus):
            problems.append(f"gpu: {node} has GPUs 0..{len(plan_node.gpus) - 1}, not {gpu}")
        if pool.sharing != "dra":
            problems.append(
                f"node: {node} is in pool {pool.name} ({pool.sharing}), served by the NVIDIA device plugin, which withdraws a GPU with a "
                "critical XID from allocatable by itself: there is nothing to apply"
            )
    if effect not in EFFECTS:
        problems.append(f"effect: {effect!r} is not one of {', '.join(EFFECTS)}")
    version = FIRST_VERSION.get(cfg.kubernetes.version)
    if version is None:
        problems.append(f"kubernetes.version: {cfg.kubernetes.version} has no DeviceTaintRule (1.33 and later)")
    if problems:
        raise ConfigError(problems, "quarantine")
    assert pool is not None and version is not None
    index = next(g for n in pool.nodes if n.name == node for g in n.gpus if g.index == gpu)
    tenants = sorted(tenant_shares(GPU_MODELS[pool.gpu_model], pool, index))
    return taint_rule(version, node, f"gpu-{gpu}", effect), tenants


def taint_rule(version: str, node: str, device: str, effect: str, extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The DeviceTaintRule tainting one device of a node's ResourceSlice pool; also the template of
    the health layer's automatic quarantine (`components/health.py`), which fills node and device."""
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": f"gpu-fault-{node}-{device}",
            "labels": {"app.kubernetes.io/part-of": "ai-factory", "app.kubernetes.io/component": "health", **(extra_labels or {})},
        },
        "spec": {
            "deviceSelector": {"driver": DRA_DRIVER, "pool": node, "device": device},
            "taint": {"key": TAINT_KEY, "value": "quarantined", "effect": effect},
        },
    }
