"""Falco: runtime detection on every node, GPU nodes included, with rules for GPU hosts.

The chart's DaemonSet tolerates the control plane (its defaults) and every taint the platform puts
on GPU nodes (`components.gpu_operator.NODE_TAINT_KEYS`, which include the trust-domain and
dedicated-node taints of the plan), so no GPU node runs unwatched. The modern eBPF probe needs no
kernel module.

GPU-host rules (`customRules`, loaded after Falco's default rules, whose macros they use):
- an NVIDIA device node opened by a container outside the tenants' namespaces and the GPU
  platform's own (device plugin, driver, DCGM, HAMi, DRA);
- the driver, the container toolkit, CDI specs or the container runtime's configuration written
  by anything but the GPU Operator;
- crypto-miner signatures: known miner binaries, stratum URLs, connections to pool ports.

Per-tenant reporting: every rule's output carries `k8s.ns.name`, and a tenant's namespace is
`tenant-<name>`; events are JSON (`json_output`), so a log pipeline routes them by that field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from ai_factory.components._common import FactoryComponent, helm_release, namespace, yaml_text
from ai_factory.components.gpu_operator import tolerations as gpu_node_tolerations
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.components.registry import Layer

TOKEN = "ai-factory:runtime:Falco"
RELEASE = "falco"
RULES_FILE = "ai-factory-gpu-rules.yaml"
CONTROL_PLANE_TOLERATIONS = (
    # The chart's defaults, kept: the control plane is watched too.
    {"effect": "NoSchedule", "key": "node-role.kubernetes.io/master"},
    {"effect": "NoSchedule", "key": "node-role.kubernetes.io/control-plane"},
)
TENANT_NAMESPACE_PREFIX = "tenant-"
NVIDIA_HOST_PATHS = (
    "/run/nvidia",
    "/usr/local/nvidia",
    "/etc/nvidia-container-runtime",
    "/usr/bin/nvidia-container-runtime",
    "/usr/bin/nvidia-container-toolkit",
    "/usr/bin/nvidia-ctk",
    "/etc/cdi",
    "/var/run/cdi",
    "/etc/containerd/config.toml",
)
MINER_BINARIES = (
    "xmrig", "xmr-stak", "ethminer", "nbminer", "t-rex", "lolminer", "gminer", "phoenixminer",
    "nanominer", "teamredminer", "ccminer", "cgminer", "bfgminer", "minerd", "cpuminer",
)
MINER_POOL_PORTS = (3333, 4444, 5555, 7777, 14433, 14444, 45560, 45700)
EVENT_FIELDS = "namespace=%k8s.ns.name pod=%k8s.pod.name image=%container.image.repository process=%proc.name cmdline=%proc.cmdline"


@dataclass(frozen=True)
class FalcoArgs:
    chart: ChartSource
    namespace: str
    gpu_namespaces: tuple[str, ...]
    """Platform namespaces whose pods legitimately open GPU devices and write driver files."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> FalcoArgs:
        layers = cfg.layers
        device_layers = (layers.gpu_operator, layers.hami, layers.dra)
        return cls(
            chart=layers.falco.chart.source("falco"),
            namespace=layers.falco.namespace,
            gpu_namespaces=tuple(sorted({layer.namespace for layer in device_layers})),
        )


def gpu_rules(gpu_namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
    """The custom rules, as the list of Falco rule-file items."""
    gpu_platform = "k8s.ns.name in (ai_factory_gpu_namespaces)"
    return [
        {"list": "ai_factory_gpu_namespaces", "items": list(gpu_namespaces)},
        {"list": "ai_factory_nvidia_host_paths", "items": list(NVIDIA_HOST_PATHS)},
        {"list": "ai_factory_miner_binaries", "items": list(MINER_BINARIES)},
        {"list": "ai_factory_miner_pool_ports", "items": list(MINER_POOL_PORTS)},
        {"macro": "ai_factory_tenant_namespace", "condition": f'k8s.ns.name startswith "{TENANT_NAMESPACE_PREFIX}"'},
        {
            "rule": "GPU device opened outside GPU workloads",
            "desc": "A container outside the tenants' namespaces and the GPU platform's own opened an NVIDIA device node.",
            "condition": f"(open_read or open_write) and container and fd.name startswith /dev/nvidia and not ai_factory_tenant_namespace and not {gpu_platform}",
            "output": f"NVIDIA device node opened outside GPU workloads (file=%fd.name {EVENT_FIELDS})",
            "priority": "WARNING",
            "tags": ["ai_factory", "gpu", "device"],
        },
        {
            "rule": "NVIDIA driver or container toolkit modified",
            "desc": "Something other than the GPU Operator wrote to the NVIDIA driver, the container toolkit, CDI specs or the runtime configuration.",
            "condition": f"open_write and fd.name pmatch (ai_factory_nvidia_host_paths) and not {gpu_platform}",
            "output": f"NVIDIA driver, toolkit or runtime configuration modified (file=%fd.name {EVENT_FIELDS})",
            "priority": "CRITICAL",
            "tags": ["ai_factory", "gpu", "tampering"],
        },
        {
            "rule": "Crypto miner started",
            "desc": "A known miner binary or a stratum mining URL was executed.",
            "condition": 'spawned_process and (proc.name in (ai_factory_miner_binaries) or proc.cmdline contains "stratum+tcp" or proc.cmdline contains "stratum+ssl")',
            "output": f"Crypto miner started ({EVENT_FIELDS})",
            "priority": "CRITICAL",
            "tags": ["ai_factory", "gpu", "cryptomining"],
        },
        {
            "rule": "Connection to a mining pool port",
            "desc": "A container connected out to a port mining pools listen on.",
            "condition": "outbound and container and fd.sport in (ai_factory_miner_pool_ports)",
            "output": f"Outbound connection to a mining pool port (connection=%fd.name {EVENT_FIELDS})",
            "priority": "WARNING",
            "tags": ["ai_factory", "gpu", "cryptomining"],
        },
    ]


def chart_values(args: FalcoArgs) -> dict[str, Any]:
    return {
        "driver": {"kind": "modern_ebpf"},
        "tolerations": [*map(dict, CONTROL_PLANE_TOLERATIONS), *gpu_node_tolerations()],
        "customRules": {RULES_FILE: yaml_text(gpu_rules(args.gpu_namespaces), sort_keys=False, width=200)},
        "falco": {"json_output": True},
    }


class Falco(FactoryComponent):
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: FalcoArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="falco", opts=opts)
        # Falco reads every syscall of the node: privileged by nature.
        ns = namespace(self, args.namespace, pod_security="privileged")
        helm_release(self, RELEASE, args.chart, namespace=ns.metadata.name, values=chart_values(args), depends_on=[ns])
        self.namespace = ns.metadata.name
        self.register_outputs({"namespace": self.namespace})


LAYER = Layer(
    name="falco",
    section="falco",
    chart="falco",
    component=Falco,
    args=lambda cfg, plan: FalcoArgs.from_config(cfg),
    requires=("fleet",),
    privileged_namespaces={
        "falco": "Falco: its eBPF probe reads every syscall of the node (privileged, host PID and /proc)",
    },
)
