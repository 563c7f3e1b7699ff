"""The NVIDIA DRA driver (`gpu.nvidia.com`) on the pools whose sharing is `dra`, from the official
chart (kubernetes-sigs/dra-driver-nvidia-gpu), with the DeviceClasses and ResourceClaimTemplates
tenants claim whole GPUs through.

Only DRA nodes publish devices: the kubelet plugin selects the nodes the fleet labels
`ai-factory.io/dra=enabled`, and those nodes carry `nvidia.com/gpu.deploy.device-plugin=false`, so
the GPU Operator's device plugin never advertises the same GPUs as `nvidia.com/gpu` (two allocators
would hand one GPU out twice). The rest of the GPU Operator (driver, toolkit, GFD, DCGM) still runs
there: the driver root is the operator's driver container when the operator is installed.

DeviceClasses: one per GPU model of the DRA pools, selecting whole GPUs (`type == 'gpu'`) of that
model by the driver's `productName` attribute, so a claim can never get another model's GPU. The
plan gives DRA pools whole GPUs only, so there is no MIG DeviceClass: MIG pools are served by MIG
Manager and the device plugin, whose per-profile resources tenant quotas count. VMs on DRA pools
claim the chart's own `vfio.gpu.nvidia.com` class (`components.kubevirt`), with the driver's
`PassthroughSupport` gate on only then. Which nodes (trust domain, dedicated nodes) a claim may use
is decided by pod placement (node labels, taints and the tenant's queue), as for any other GPU.

Tenants get one ResourceClaimTemplate per DRA pool the plan grants them GPUs on, in their
namespace, through a `TenantHook` (`DraClaimTemplates`) that the tenant stack attaches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import GPU_MODEL_LABEL, FactoryComponent, helm_release, labels, namespace, tenant_entry
from ai_factory.components.gpu_operator import tolerations
from ai_factory.components.kubevirt import has_dra_vms
from ai_factory.factory.checking.vms import PASSTHROUGH_GATE
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig, KubernetesSpec, Tenant
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.planning.placement import DRA_LABEL
from ai_factory.factory.model.tenancy import TenantNames
from ai_factory.components.registry import Layer
from ai_factory.factory.model.raw import as_dict, as_list

TOKEN = "ai-factory:accelerators:DraDriver"
DRIVER = "gpu.nvidia.com"
RESOURCE_API = "resource.k8s.io/v1"
GPU_OPERATOR_DRIVER_ROOT = "/run/nvidia/driver"
"""Where the GPU Operator's driver container exposes the driver on the host."""
HOST_DRIVER_ROOT = "/"

PRODUCT_NAMES: dict[str, str] = {
    # NVML product names (what the driver publishes as `productName`), lower-cased, per catalog model
    # (factory/gpus.py), as RE2 patterns anchored on both ends: SXM and PCIe boards of one model.
    "A100-40GB": "^nvidia a100-(sxm4|pcie)-40gb$",
    "A100-80GB": "^nvidia a100(-sxm4-80gb| 80gb pcie)$",
    "H100-80GB": "^nvidia h100( 80gb hbm3| pcie)$",
    "H100-94GB-NVL": "^nvidia h100 nvl$",
    "H200-141GB": "^nvidia h200( nvl)?$",
    "B200-180GB": "^nvidia b200$",
    "GB200-186GB": "^nvidia gb200$",
    "L40S-48GB": "^nvidia l40s$",
    "L4-24GB": "^nvidia l4$",
}


def whole_gpu_class(gpu_model: str) -> str:
    """Name of the DeviceClass of whole GPUs of a catalog model, e.g. `h100-80gb-whole`."""
    return f"{gpu_model.lower()}-whole"


def whole_gpu_selector(gpu_model: str) -> str:
    """CEL selecting a whole GPU (not a MIG or VFIO device) of the model, on the driver's attributes."""
    attributes = f"device.attributes['{DRIVER}']"
    return (
        f"device.driver == '{DRIVER}' && {attributes}.type == 'gpu' && "
        f"{attributes}.productName.lowerAscii().matches('{PRODUCT_NAMES[gpu_model]}')"
    )


@dataclass(frozen=True)
class DraArgs:
    chart: ChartSource
    namespace: str
    """Namespace of the driver's controller and kubelet plugin (privileged: the plugin prepares devices)."""
    gpu_models: tuple[str, ...]
    """Catalog models of the DRA pools, sorted: one whole-GPU DeviceClass each."""
    driver_root: str
    """Host path of the NVIDIA driver: the GPU Operator's driver container, or `/` for a host driver."""
    passthrough: bool = False
    """Some VM claims DRA GPUs (`kubevirt.has_dra_vms`): the driver's alpha `PassthroughSupport` gate."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> DraArgs:
        layer = cfg.layers.dra
        return cls(
            chart=layer.chart.source("dra-driver-nvidia-gpu"),
            namespace=layer.namespace,
            gpu_models=tuple(sorted({p.gpu.model for p in cfg.fleet.pools if p.sharing == "dra"})),
            driver_root=GPU_OPERATOR_DRIVER_ROOT if cfg.layers.gpu_operator.enabled else HOST_DRIVER_ROOT,
            passthrough=has_dra_vms(cfg),
        )


CHART_DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com")
"""The DeviceClasses the chart installs itself with `resources.gpus` (any GPU of the driver, MIG and
VFIO devices included). No value removes them, so every tenant quota caps each at 0: tenants claim
through the per-model classes, which their quotas cap at their ceilings."""


def chart_values(args: DraArgs) -> dict:
    """The chart values: a pure function of the arguments, so tests can read them directly."""
    values: dict[str, Any] = {
        "nvidiaDriverRoot": args.driver_root,
        # The chart gates GPU allocation behind this override (its install docs set it).
        "gpuResourcesEnabledOverride": True,
        "resourceApiVersion": RESOURCE_API,
        # The library creates no ComputeDomain (multi-node NVLink IMEX channels): nothing to run for it.
        "resources": {"gpus": {"enabled": True}, "computeDomains": {"enabled": False}},
        "kubeletPlugin": {"nodeSelector": {DRA_LABEL: "enabled"}, "tolerations": tolerations()},
    }
    if args.passthrough:
        # Alpha, only for VMs on DRA GPUs: the kubelet plugin then binds a claimed GPU to vfio-pci
        # (it mounts the host's root, /sys and /proc, in its already privileged namespace).
        values["featureGates"] = {PASSTHROUGH_GATE: True}
    return values


class DraDriver(FactoryComponent):
    namespace: pulumi.Output[str]
    release: pulumi.Output[str]
    device_classes: pulumi.Output[list[str]]

    def __init__(self, name: str, args: DraArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="dra", opts=opts)
        ns = namespace(self, args.namespace, pod_security="privileged")
        release = helm_release(
            self, "dra-driver-nvidia-gpu", args.chart, namespace=ns.metadata.name, values=chart_values(args), depends_on=[ns]
        )
        classes = [self._device_class(model) for model in args.gpu_models]
        self.namespace = ns.metadata.name
        self.release = release.name
        self.device_classes = pulumi.Output.from_input(classes)
        self.register_outputs({"namespace": self.namespace, "release": self.release, "deviceClasses": self.device_classes})

    def _device_class(self, gpu_model: str) -> str:
        name = whole_gpu_class(gpu_model)
        k8s.resource.v1.DeviceClass(
            self.child_name(f"deviceclass-{name}"),
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, labels=labels(self.layer, extra={GPU_MODEL_LABEL: gpu_model})),
            spec=k8s.resource.v1.DeviceClassSpecArgs(
                selectors=[
                    k8s.resource.v1.DeviceSelectorArgs(
                        cel=k8s.resource.v1.CELDeviceSelectorArgs(expression=whole_gpu_selector(gpu_model))
                    )
                ]
            ),
            opts=self.child(),
        )
        return name


# --------------------------------------------------------------------------- per tenant


@dataclass(frozen=True)
class ClaimTemplate:
    """A ResourceClaimTemplate a tenant's pods reference to claim one whole GPU of a DRA pool."""

    name: str
    """`<pool>-gpu`, in the tenant's namespace."""
    device_class: str


@dataclass(frozen=True)
class DraClaimTemplates:
    """TenantHook: each tenant's ResourceClaimTemplates, one per DRA pool where the plan gives it
    whole GPUs. Built from the plan alone, so a tenant stack can rebuild it on its own."""

    templates: dict[str, tuple[ClaimTemplate, ...]]
    """Per tenant name; tenants without DRA GPUs are absent."""
    layer: str = "dra"

    @classmethod
    def from_plan(cls, plan: Plan) -> DraClaimTemplates:
        templates: dict[str, list[ClaimTemplate]] = {}
        for pool in plan.pools:
            if pool.sharing != "dra":
                continue
            owners = {gpu.owner for node in pool.nodes for gpu in node.gpus if gpu.mode == "whole" and gpu.owner}
            for tenant in sorted(owners):
                templates.setdefault(tenant, []).append(ClaimTemplate(f"{pool.name}-gpu", whole_gpu_class(pool.gpu_model)))
        return cls({tenant: tuple(found) for tenant, found in sorted(templates.items())})

    def narrowed(self, tenant: str) -> DraClaimTemplates:
        """Only the tenant's own claim templates (see `TenantHook`)."""
        return replace(self, templates=tenant_entry(self.templates, tenant))

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        for template in self.templates.get(tenant.name, ()):
            k8s.resource.v1.ResourceClaimTemplate(
                stack.child_name(f"claim-{template.name}"),
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=template.name, namespace=names.namespace, labels=labels(self.layer, tenant=names.tenant, extra=names.labels)
                ),
                spec=k8s.resource.v1.ResourceClaimTemplateSpecArgs(
                    spec=k8s.resource.v1.ResourceClaimSpecArgs(
                        devices=k8s.resource.v1.DeviceClaimArgs(
                            requests=[
                                k8s.resource.v1.DeviceRequestArgs(
                                    name="gpu",
                                    exactly=k8s.resource.v1.ExactDeviceRequestArgs(
                                        device_class_name=template.device_class, allocation_mode="ExactCount", count=1
                                    ),
                                )
                            ]
                        )
                    )
                ),
                opts=stack.child(),
            )


DRA_MIN_KUBERNETES = (1, 34)
"""resource.k8s.io/v1 (DeviceClass, ResourceClaimTemplate) is served from Kubernetes 1.34."""


def kubernetes_serves_dra(raw: dict[str, Any]) -> list[str]:
    """DRA pools need a Kubernetes that serves resource.k8s.io/v1."""
    version = as_dict(raw.get("kubernetes")).get("version", KubernetesSpec().version)
    try:
        minor = tuple(int(part) for part in version.split(".")) if isinstance(version, str) else ()
    except ValueError:
        return []  # not a version: the field check of kubernetes.version reports it
    return [
        f"fleet.pools[{i}].sharing: dra needs Kubernetes >= 1.34 (resource.k8s.io/v1); kubernetes.version is {version}"
        for i, pool in enumerate(map(as_dict, as_list(as_dict(raw.get("fleet")).get("pools"))))
        if pool.get("sharing") == "dra" and minor and minor < DRA_MIN_KUBERNETES
    ]


LAYER = Layer(
    name="dra",
    section="dra",
    chart="dra-driver-nvidia-gpu",
    component=DraDriver,
    args=lambda cfg, plan: DraArgs.from_config(cfg),
    requires=("fleet",),
    sharing=("dra",),
    tenant_hook=lambda cfg, plan: DraClaimTemplates.from_plan(plan),
    privileged_namespaces={
        "dra-driver-nvidia-gpu": "NVIDIA DRA kubelet plugin: prepares GPUs on the host through kubelet's plugin socket",
    },
    config_checks=(kubernetes_serves_dra,),
)
