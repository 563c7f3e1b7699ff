"""NVIDIA GPU Operator: driver, container toolkit, device plugin, DCGM exporter, GPU Feature
Discovery and MIG Manager, from the official chart.

Installed as a `helm.v3.Release` rather than a v4 `Chart`: the chart relies on Helm hooks (CRD
upgrade and cleanup jobs) that a v4 Chart omits. Drivers are per pool: the chart's default driver
is switched to `NVIDIADriver` resources (`driver.nvidiaDriverCRD`), one per pool, selected by the
pool label, so pools of different GPU generations can run different driver branches.

The plan configures the device layer through the chart's own ConfigMaps:
- MIG Manager gets one mig-parted config per distinct node layout (`Plan.mig_configs()`, each entry
  restricted by `device-filter` to its GPU model) plus `all-disabled`; each node selects its config
  with the `nvidia.com/mig.config` label the fleet layer sets. The `mixed` strategy is used whenever
  a pool uses MIG: the plan mixes profiles and MIG-disabled GPUs on a node, and per-profile
  resources are what tenant quotas count.
- The device plugin gets one time-slicing config per replica count of the time-sliced pools,
  selected by the `nvidia.com/device-plugin.config` node label. Replicas are renamed
  `nvidia.com/gpu.shared` (`renameByDefault`), so a pod asking for a whole GPU never gets a replica
  and metering (OpenCost) can tell them apart; `failRequestsGreaterThanOne` refuses a request for
  several replicas, which would buy no more of the GPU than one (they may all be the same GPU).
- HAMi and DRA nodes carry `nvidia.com/gpu.deploy.device-plugin=false`: the operator runs no
  NVIDIA device plugin where another allocator owns the GPUs.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import (
    POOL_LABEL,
    FactoryComponent,
    helm_release,
    labels,
    namespace,
    yaml_text,
)
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import DriverSettings, FactoryConfig, RegistryCredentials
from ai_factory.factory.acceptance.gates import ACCEPTANCE_KEY
from ai_factory.factory.planning.placement import MIG_DISABLED_CONFIG, PLACEMENT_TAINT_KEYS, time_slicing_config
from ai_factory.factory.planning.model import Plan
from ai_factory.components.registry import Layer

TOKEN = "ai-factory:accelerators:GpuOperator"

NODE_TAINT_KEYS = ("nvidia.com/gpu", *PLACEMENT_TAINT_KEYS, ACCEPTANCE_KEY)
"""Taints the platform puts on GPU nodes; every GPU Operator and NFD daemon must tolerate them all
(a node under acceptance needs its driver and device plugin to run the gates)."""

TOOLKIT_ENV = (
    # Unprivileged containers must not get GPUs by setting NVIDIA_VISIBLE_DEVICES themselves.
    {"name": "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED", "value": "false"},
    {"name": "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS", "value": "true"},
    # NVIDIAScape (CVE-2025-23266): the cuda-compat hook honoured LD_PRELOAD from the image.
    {"name": "NVIDIA_CONTAINER_TOOLKIT_OPT_IN_FEATURES", "value": "disable-cuda-compat-lib-hook"},
)
DEVICE_PLUGIN_ENV = ({"name": "DEVICE_LIST_STRATEGY", "value": "volume-mounts"},)
MIG_PARTED_CONFIGMAP = "ai-factory-mig-parted"
DEVICE_PLUGIN_CONFIGMAP = "ai-factory-device-plugin"
DROP_TARGET_POD_LABELS = {"action": "labeldrop", "regex": "namespace|pod|container"}
"""Scrape relabeling for exporters that attribute series to pods (DCGM, HAMi): they name the pod
in these labels, which the scrape target's own labels of the same names would rename `exported_*`."""
DEVICE_PLUGIN_DEFAULT_CONFIG = "default"
"""Device-plugin config of every node without a `nvidia.com/device-plugin.config` label: no sharing."""


@dataclass(frozen=True)
class PoolDriver:
    """The driver one pool gets."""

    pool: str
    settings: DriverSettings


@dataclass(frozen=True)
class GpuOperatorArgs:
    chart: ChartSource
    namespace: str
    """Namespace of the operator and its operands (privileged: they load kernel modules)."""
    drivers: tuple[PoolDriver, ...]
    toolkit_version: str
    """Container toolkit image tag (the config refuses versions older than v1.17.8)."""
    mig_configs: dict[str, list[dict[str, Any]]]
    """mig-parted `mig-configs` entries per config name, one per distinct node layout of the plan
    (`Plan.mig_configs()`). Empty when no pool uses MIG; otherwise MIG Manager runs with them."""
    time_slicing_replicas: tuple[int, ...]
    """Replica counts of the time-sliced pools (one device-plugin config each); empty without any."""
    dcgm_exporter: bool
    registry: RegistryCredentials | None = None
    vm_passthrough: bool = False
    """Some pool is marked for VMs (`layers.kubevirt.pools`): sandbox workloads on, so the nodes the
    fleet layer labels `vm-passthrough` get the VFIO manager and the sandbox device plugin instead
    of the driver and the container device plugin; every other node stays `container`."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> GpuOperatorArgs:
        layer = cfg.layers.gpu_operator
        return cls(
            chart=layer.chart.source("gpu-operator"),
            namespace=layer.namespace,
            drivers=tuple(PoolDriver(pool=p.name, settings=p.driver) for p in cfg.fleet.pools),
            toolkit_version=layer.toolkit_version,
            mig_configs=plan.mig_configs(),
            time_slicing_replicas=tuple(sorted({p.time_slicing_replicas for p in plan.pools if p.sharing == "time-slicing"})),
            dcgm_exporter=layer.dcgm_exporter,
            registry=layer.registry,
            vm_passthrough=any(p.vm_resource for p in plan.pools),
        )

    @property
    def mig(self) -> bool:
        """Some pool uses MIG: run MIG Manager with the `mixed` strategy (profiles become distinct resources)."""
        return bool(self.mig_configs)


def tolerations() -> list[dict]:
    return [{"key": key, "operator": "Exists", "effect": "NoSchedule"} for key in NODE_TAINT_KEYS]


def chart_values(args: GpuOperatorArgs, pull_secret: str | None) -> dict:
    """The chart values: a pure function of the arguments, so tests can read them directly."""
    pull_secrets = [pull_secret] if pull_secret else []
    values: dict = {
        "daemonsets": {"tolerations": tolerations()},
        "driver": {
            "enabled": True,
            # Per-pool NVIDIADriver resources replace the chart's single cluster-wide driver.
            "nvidiaDriverCRD": {"enabled": True, "deployDefaultCR": False},
        },
        "toolkit": {"enabled": True, "version": args.toolkit_version, "env": list(TOOLKIT_ENV)},
        "devicePlugin": {"enabled": True, "env": list(DEVICE_PLUGIN_ENV)},
        "gfd": {"enabled": True},
        # The operator creates the exporter's ServiceMonitor; the metrics layer meters GPUs by the
        # exporter's pod attribution labels, which the target's own labels must not shadow.
        "dcgmExporter": {"enabled": args.dcgm_exporter, "serviceMonitor": {"enabled": True, "relabelings": [DROP_TARGET_POD_LABELS]}},
        "migManager": {"enabled": args.mig},
        "mig": {"strategy": "mixed" if args.mig else "single"},
        "node-feature-discovery": {"worker": {"tolerations": tolerations()}},
    }
    if args.vm_passthrough:
        values["sandboxWorkloads"] = {"enabled": True, "defaultWorkload": "container", "mode": "kubevirt"}
    if args.mig:
        values["migManager"]["config"] = {
            "create": True,
            "name": MIG_PARTED_CONFIGMAP,
            "default": MIG_DISABLED_CONFIG,
            "data": {"config.yaml": mig_parted_config(args.mig_configs)},
        }
    if args.time_slicing_replicas:
        values["devicePlugin"]["config"] = {
            "create": True,
            "name": DEVICE_PLUGIN_CONFIGMAP,
            "default": DEVICE_PLUGIN_DEFAULT_CONFIG,
            "data": device_plugin_configs(values["mig"]["strategy"], args.time_slicing_replicas),
        }
    if pull_secrets:
        for operand in ("toolkit", "devicePlugin", "gfd", "migManager"):
            values[operand]["imagePullSecrets"] = pull_secrets
    return values


def mig_parted_config(mig_configs: dict[str, list[dict[str, Any]]]) -> str:
    """The mig-parted file (`version: v1`) MIG Manager reads: the plan's configs plus `all-disabled`,
    the chart's default for nodes the plan does not label. A custom file replaces the configs MIG
    Manager would generate, so `all-disabled` must be in it."""
    configs = {MIG_DISABLED_CONFIG: [{"devices": "all", "mig-enabled": False}], **mig_configs}
    return yaml_text({"version": "v1", "mig-configs": configs}, sort_keys=True, default_flow_style=False)


def device_plugin_configs(mig_strategy: str, time_slicing_replicas: tuple[int, ...]) -> dict[str, str]:
    """Named device-plugin configs (k8s-device-plugin `version: v1`): `default` shares nothing, and
    one time-slicing config per replica count, named as the fleet labels its nodes."""
    default = {"version": "v1", "flags": {"migStrategy": mig_strategy}}
    configs = {DEVICE_PLUGIN_DEFAULT_CONFIG: default}
    for replicas in sorted(set(time_slicing_replicas)):
        time_slicing = {
            "renameByDefault": True,
            "failRequestsGreaterThanOne": True,
            "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}],
        }
        configs[time_slicing_config(replicas)] = {**default, "sharing": {"timeSlicing": time_slicing}}
    return {name: yaml_text(config, sort_keys=True, default_flow_style=False) for name, config in configs.items()}


class GpuOperator(FactoryComponent):
    namespace: pulumi.Output[str]
    release: pulumi.Output[str]

    def __init__(self, name: str, args: GpuOperatorArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="gpu-operator", opts=opts)
        ns = namespace(self, args.namespace, pod_security="privileged")
        pull_secret = self._pull_secret(args, ns) if args.registry else None
        release = helm_release(
            self,
            "gpu-operator",
            args.chart,
            namespace=ns.metadata.name,
            values=chart_values(args, pull_secret.metadata.name if pull_secret else None),
            depends_on=[ns] + ([pull_secret] if pull_secret else []),
        )
        for driver in args.drivers:
            self._driver(driver, pull_secret, release)
        self.namespace = ns.metadata.name
        self.release = release.name
        self.register_outputs({"namespace": self.namespace, "release": self.release})

    def _pull_secret(self, args: GpuOperatorArgs, ns: k8s.core.v1.Namespace) -> k8s.core.v1.Secret:
        registry = args.registry
        docker_config = registry.password.output().apply(
            lambda password: json.dumps(
                {
                    "auths": {
                        registry.server: {
                            "auth": base64.b64encode(f"{registry.username}:{password}".encode()).decode()
                        }
                    }
                },
                sort_keys=True,
            )
        )
        return k8s.core.v1.Secret(
            self.child_name("registry"),
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name="registry-credentials", namespace=ns.metadata.name, labels=labels(self.layer)
            ),
            type="kubernetes.io/dockerconfigjson",
            string_data={".dockerconfigjson": docker_config},
            opts=self.child(),
        )

    def _driver(self, driver: PoolDriver, pull_secret, release) -> None:
        settings = driver.settings
        spec: dict = {
            "driverType": "gpu",
            "default": False,
            "repository": "nvcr.io/nvidia",
            "image": "driver",
            "version": settings.version,
            "kernelModuleType": settings.kernel_module_type,
            "usePrecompiled": settings.use_precompiled,
            "nodeSelector": {POOL_LABEL: driver.pool},
            "tolerations": tolerations(),
        }
        if pull_secret is not None:
            spec["imagePullSecrets"] = [pull_secret.metadata.name]
        k8s.apiextensions.CustomResource(
            self.child_name(f"driver-{driver.pool}"),
            api_version="nvidia.com/v1alpha1",
            kind="NVIDIADriver",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"driver-{driver.pool}", labels=labels(self.layer, extra={POOL_LABEL: driver.pool})),
            spec=spec,
            opts=self.child(depends_on=[release]),
        )


LAYER = Layer(
    name="gpu-operator",
    section="gpu_operator",
    chart="gpu-operator",
    component=GpuOperator,
    args=GpuOperatorArgs.from_config,
    requires=("fleet",),
    privileged_namespaces={
        "gpu-operator": "GPU Operator operands: the driver loads kernel modules; toolkit, device plugin, MIG Manager "
        "and DCGM mount host paths and device nodes",
    },
)
