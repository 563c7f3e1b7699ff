"""HAMi: soft GPU slicing (memory and compute limits per container) on the pools the plan gives to
HAMi, from the official chart.

Where HAMi runs, nothing else allocates GPUs:
- its device plugin runs only on the nodes of HAMi pools, selected by `gpu=hami` (the chart fixes
  the selector's key, `gpu`, so `ai-factory.io/hami=enabled` cannot be the selector; the fleet puts
  both labels on the same nodes);
- those nodes carry `nvidia.com/gpu.deploy.device-plugin=false`: no NVIDIA device plugin there;
- it runs in `hami-core` mode, never MIG, so HAMi and MIG Manager never own the same GPU.

Per-node settings come from the plan through the chart's device-plugin node configuration
(`devicePlugin.nodeConfiguration.config`, one `nodeconfig` entry per HAMi node):
- `devicesplitcount` is the split count of the node's pool, so pools may differ; the chart-wide
  `deviceSplitCount` is the smallest of them, for any node the list would miss.
- `devicememoryscaling` is 1 unless the plan put an opted-in tenant's slices on the node's GPUs
  (`tenants[].gpus[].memory_oversubscription`): the planner keeps each scaling on nodes of its own,
  a node serves one trust domain, and the config refuses a domain whose tenants disagree on a
  pool's scaling, so only tenants that opted in hold quota on an oversubscribed node. The
  chart-wide `deviceMemoryScaling` stays 1.
Scheduling binpacks nodes and GPUs, which is what the plan's packing assumes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi

from ai_factory.components._common import FactoryComponent, helm_release, namespace
from ai_factory.components.gpu_operator import tolerations
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.planning.model import NodePlan, Plan
from ai_factory.factory.planning.placement import HAMI_DEVICE_PLUGIN_LABEL, HAMI_RESOURCES
from ai_factory.components.registry import Layer
from ai_factory.factory.model.raw import as_dict, as_list

TOKEN = "ai-factory:accelerators:Hami"
OPERATING_MODE = "hami-core"
"""HAMi's own slicing; its `mig` mode would have HAMi re-slice GPUs that MIG Manager owns."""
DEVICE_LIST_STRATEGY = "volume-mounts"
"""The container toolkit refuses NVIDIA_VISIBLE_DEVICES from unprivileged containers (see
components/gpu_operator.py), so HAMi hands devices over as volume mounts, as the NVIDIA plugin does."""


@dataclass(frozen=True)
class HamiNode:
    """One node HAMi serves, with the settings the plan gives it."""

    name: str
    split_count: int
    """At most this many containers per GPU (the pool's `hami.split_count`)."""
    memory_scaling: float
    """Device-memory scaling of the node's GPUs: 1, or what an opted-in tenant accepted."""


@dataclass(frozen=True)
class HamiArgs:
    chart: ChartSource
    namespace: str
    """Namespace of the scheduler and device plugin (privileged: the plugin injects HAMi's CUDA shim)."""
    nodes: tuple[HamiNode, ...]
    """Every node of the HAMi pools, in name order; at least one."""
    wait_for_gpu_operator_toolkit: bool
    """The GPU Operator installs the container toolkit: the device plugin waits until it is ready."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> HamiArgs:
        layer = cfg.layers.hami
        return cls(
            chart=layer.chart.source("hami"),
            namespace=layer.namespace,
            nodes=hami_nodes(plan),
            wait_for_gpu_operator_toolkit=cfg.layers.gpu_operator.enabled,
        )


def hami_nodes(plan: Plan) -> tuple[HamiNode, ...]:
    nodes = [
        HamiNode(node.name, pool.hami_split_count, node_memory_scaling(node))
        for pool in plan.pools
        if pool.sharing == "hami"
        for node in pool.nodes
    ]
    return tuple(sorted(nodes, key=lambda n: n.name))


def node_memory_scaling(node: NodePlan) -> float:
    """The plan gives all HAMi GPUs of a node one scaling; idle GPUs carry none of their own."""
    return next((gpu.hami_memory_scaling for gpu in node.gpus if gpu.mode == "hami"), 1.0)


def node_configuration(nodes: tuple[HamiNode, ...]) -> str:
    """The device plugin's `config.json`: one entry per node, matched by node name."""
    entries = [
        {
            "name": node.name,
            "operatingmode": OPERATING_MODE,
            "devicesplitcount": node.split_count,
            "devicememoryscaling": node.memory_scaling,
        }
        for node in nodes
    ]
    return json.dumps({"nodeconfig": entries}, sort_keys=True)


def chart_values(args: HamiArgs) -> dict:
    """The chart values: a pure function of the arguments, so tests can read them directly."""
    return {
        # Pinned, not left to the chart's defaults: tenant quotas cap exactly these names.
        **HAMI_RESOURCES,
        "scheduler": {
            "defaultSchedulerPolicy": {"nodeSchedulerPolicy": "binpack", "gpuSchedulerPolicy": "binpack"},
            # The upstream kube-scheduler image, not the chart's default mirror.
            "kubeScheduler": {"image": {"registry": "registry.k8s.io", "repository": "kube-scheduler"}},
        },
        "devicePlugin": {
            "nvidiaNodeSelector": {HAMI_DEVICE_PLUGIN_LABEL[0]: HAMI_DEVICE_PLUGIN_LABEL[1]},
            "tolerations": tolerations(),
            "deviceSplitCount": min(node.split_count for node in args.nodes),
            "deviceMemoryScaling": 1,
            "deviceListStrategy": DEVICE_LIST_STRATEGY,
            "gpuOperatorToolkitReady": {"enabled": args.wait_for_gpu_operator_toolkit},
            "nodeConfiguration": {"config": node_configuration(args.nodes)},
        },
    }


class Hami(FactoryComponent):
    namespace: pulumi.Output[str]
    release: pulumi.Output[str]

    def __init__(self, name: str, args: HamiArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="hami", opts=opts)
        ns = namespace(self, args.namespace, pod_security="privileged")
        release = helm_release(self, "hami", args.chart, namespace=ns.metadata.name, values=chart_values(args), depends_on=[ns])
        self.namespace = ns.metadata.name
        self.release = release.name
        self.register_outputs({"namespace": self.namespace, "release": self.release})


def domains_agree_on_memory_scaling(raw: dict[str, Any]) -> list[str]:
    """HAMi scales device memory per node, and a HAMi node serves its whole trust domain: tenants of
    one domain on one HAMi pool must agree on `memory_oversubscription`, or a tenant that did not
    opt in could be placed in memory that is not there."""
    pools = {p["name"]: p for p in map(as_dict, as_list(as_dict(raw.get("fleet")).get("pools"))) if isinstance(p.get("name"), str)}
    scalings: dict[tuple[str, str], dict[str, Any]] = {}
    for tenant in map(as_dict, as_list(raw.get("tenants"))):
        domain = tenant.get("trust_domain") or tenant.get("name")
        for demand in map(as_dict, as_list(tenant.get("gpus"))):
            pool = demand.get("pool")
            if isinstance(pool, str) and isinstance(domain, str) and as_dict(pools.get(pool)).get("sharing") == "hami":
                scalings.setdefault((pool, domain), {})[str(tenant.get("name"))] = demand.get("memory_oversubscription", 1.0)
    return [
        f"tenants: trust domain {domain!r} asks for different HAMi memory oversubscription on pool {pool!r} "
        f"({', '.join(f'{name}: {value}' for name, value in sorted(by_tenant.items()))}); HAMi sets it per node "
        "and a node serves its whole trust domain, so the domain's tenants must agree"
        for (pool, domain), by_tenant in sorted(scalings.items())
        if len({float(v) for v in by_tenant.values() if isinstance(v, (int, float))}) > 1  # others are field errors
    ]


LAYER = Layer(
    name="hami",
    section="hami",
    chart="hami",
    component=Hami,
    args=HamiArgs.from_config,
    requires=("fleet",),
    sharing=("hami",),
    privileged_namespaces={
        "hami-system": "HAMi device plugin: mounts its CUDA shim and /etc/ld.so.preload into GPU containers",
    },
    config_checks=(domains_agree_on_memory_scaling,),
)
