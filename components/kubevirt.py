"""KubeVirt: VMs with passthrough GPUs, on the pools marked for VMs, under the tenants' own quotas.

Platform (this component): KubeVirt's and CDI's release manifests at their pinned versions
(`catalog.MANIFESTS`; no official chart exists), applied by Pulumi as `kubernetes:yaml/v2:ConfigFile`
from the pinned URL (the provider reads it at deployment; the render never downloads it), then
the `KubeVirt` CR and the `CDI` CR. The `KubeVirt` CR permits exactly the GPUs of the pools marked
for VMs (`layers.kubevirt.pools`) as PCI host devices provided externally: the GPU Operator's
sandbox workloads (`sandboxWorkloads`, `components.gpu_operator`) run the VFIO manager and the
sandbox device plugin on the nodes the fleet layer labels `nvidia.com/gpu.workload.config:
vm-passthrough`, which are every node of those pools (the GPU Operator switches whole nodes, never
one GPU). No feature gate is on for them: GPU passthrough (`GPU`) is GA in v1.9.0, and
`HostDevices` (alpha) is not needed for `gpus`.

Quota: the plan advertises a VM pool's whole GPUs under the sandbox device plugin's resource name
(`placement.advertised_name`), so that name is in every tenant's ResourceQuota (0 without a grant)
and in the Kueue flavor of the pool, exactly as `nvidia.com/gpu` is elsewhere: a virt-launcher pod
requests it and is admitted, or not, like any tenant pod.

Per tenant in `layers.kubevirt.tenants` (`KubeVirtTenantHook`): a namespace-scoped
`VirtualMachineInstancetype` per VM pool and GPU count up to the tenant's grant there (vCPUs and
memory per GPU from the pool's settings), and its VMs, each a `VirtualMachine` on one instance type,
its root disk a DataVolume on the tenant's storage class imported by CDI, its virt-launcher pod
labelled for the tenant's LocalQueue and pinned to the nodes the plan gives the tenant's trust
domain on the pool (a low-trust tenant's are its dedicated nodes, whose taint it tolerates).

DRA pools (`sharing: dra`) marked for VMs give VMs GPUs through the NVIDIA DRA driver instead:
each such VM gets a ResourceClaimTemplate in its tenant's namespace asking for exactly its count of
whole GPUs, one request of one `vfio.gpu.nvidia.com` device per GPU (KubeVirt maps one request to
one PCI address), and its VMI's `resourceClaims` and `gpus[].claimName/requestName` name them. Only
then are the alpha gates on, each recorded with its reason on the KubeVirt CR
(`vms.GATE_EXCEPTIONS_ANNOTATION`), which the offline check and the pack accept and flag otherwise:
KubeVirt's `GPUsWithDRA`, and the DRA driver's `PassthroughSupport` (`components.dra`), without
which the driver does not bind GPUs to vfio-pci. Such a pool is not switched to `vm-passthrough`:
its GPUs serve pods and VMs alike, one claim at a time. The tenant's quota caps the VFIO class's
claims at its whole-GPU ceiling on those pools, and Kueue counts a VFIO claim as one
`nvidia.com/gpu` (`components.kueue`), the same budget as its pods' DRA GPUs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import FactoryComponent, labels, tenant_items
from ai_factory.components._topology import HOSTNAME_LABEL
from ai_factory.components.registry import Layer
from ai_factory.factory.checking import vms as vm_checks
from ai_factory.factory.model.catalog import MANIFESTS, ManifestSource
from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.model.gpus import GPU_MODELS, pci_vendor_selector, vm_resource_name
from ai_factory.factory.model.raw import as_dict, as_list, did_you_mean
from ai_factory.factory.model.tenancy import TenantNames, tenant_names
from ai_factory.factory.planning.model import WHOLE_GPU, Plan
from ai_factory.factory.planning.placement import advertised_name, allocations, domain_offerings
from ai_factory.factory.planning.quotas import GpuCeiling

TOKEN = "ai-factory:virtualization:KubeVirt"
NAMESPACE = "kubevirt"
"""Where kubevirt-operator.yaml runs virt-operator; it reconciles the KubeVirt CR of its own namespace."""
CDI_NAMESPACE = "cdi"
"""Where cdi-operator.yaml runs the CDI operator (the CDI CR itself is cluster-scoped)."""
API_VERSION = "kubevirt.io/v1"
INSTANCETYPE_API = "instancetype.kubevirt.io/v1beta1"
CDI_API = "cdi.kubevirt.io/v1beta1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
DRA_CLAIM = "gpus"
"""The name of a DRA VM's entry in its `resourceClaims`."""
GPU_COUNTS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class VmDevice:
    """A GPU VMs may be given: its PCI vendor:device and the resource the sandbox plugin advertises."""

    pool: str
    selector: str
    resource: str


def dra_vm_pools(cfg: FactoryConfig) -> frozenset[str]:
    """The pools marked for VMs whose GPUs are DRA devices."""
    kubevirt = cfg.layers.kubevirt
    return frozenset(p for p in kubevirt.pools if kubevirt.enabled and cfg.pool(p).sharing == "dra")


def has_dra_vms(cfg: FactoryConfig) -> bool:
    """Some VM claims DRA GPUs: what turns the DRA gates on, in KubeVirt and in the DRA driver."""
    pools = dra_vm_pools(cfg)
    return any(vm.pool in pools for t in cfg.layers.kubevirt.tenants for vm in t.vms)


def feature_gates(cfg: FactoryConfig) -> tuple[str, ...]:
    return (vm_checks.DRA_GPU_GATE,) if has_dra_vms(cfg) else ()


def vm_devices(cfg: FactoryConfig, plan: Plan) -> tuple[VmDevice, ...]:
    """The device-plugin GPUs VMs may be given: DRA pools' are claimed, not permitted host devices."""
    result = []
    for pool_name, settings in sorted(cfg.layers.kubevirt.pools.items()):
        pool = cfg.pool(pool_name)
        if pool.sharing == "dra":
            continue
        pci = settings.pci_device_id or GPU_MODELS[pool.gpu.model].pci_device_ids[0]
        result.append(VmDevice(pool_name, pci_vendor_selector(pci), plan.pool(pool_name).vm_resource or ""))
    return tuple(result)


def permitted_host_devices(devices: tuple[VmDevice, ...]) -> dict[str, Any]:
    """One entry per (device, resource): two pools of one GPU share it."""
    unique = sorted({(d.selector, d.resource) for d in devices})
    return {"pciHostDevices": [{"pciVendorSelector": s, "resourceName": r, "externalResourceProvider": True} for s, r in unique]}


def kubevirt_spec(devices: tuple[VmDevice, ...], gates: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "configuration": {
            "developerConfiguration": {"featureGates": list(gates)},
            "permittedHostDevices": permitted_host_devices(devices),
        },
        # Passthrough GPUs cannot be live-migrated: an update evicts the VM's pod instead.
        "workloadUpdateStrategy": {"workloadUpdateMethods": ["Evict"]},
    }


def cdi_spec() -> dict[str, Any]:
    # Imported disks keep the requested size: no filesystem overhead is added on top of the quota.
    return {"config": {"filesystemOverhead": {"global": "0"}}, "imagePullPolicy": "IfNotPresent"}


@dataclass(frozen=True)
class KubeVirtArgs:
    operator: ManifestSource
    cdi: ManifestSource
    devices: tuple[VmDevice, ...]
    feature_gates: tuple[str, ...] = ()
    """Each one of `vms.JUSTIFIED_GATES`, needed by the config (`feature_gates`)."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> KubeVirtArgs:
        return cls(
            operator=MANIFESTS["kubevirt-operator"], cdi=MANIFESTS["cdi-operator"], devices=vm_devices(cfg, plan), feature_gates=feature_gates(cfg)
        )


def gate_exceptions(gates: tuple[str, ...]) -> dict[str, Any]:
    """The KubeVirt CR's metadata recording why each of its gates is on (nothing without gates)."""
    if not gates:
        return {}
    return {"annotations": {vm_checks.GATE_EXCEPTIONS_ANNOTATION: json.dumps({g: vm_checks.JUSTIFIED_GATES[g] for g in gates}, sort_keys=True)}}


class KubeVirt(FactoryComponent):
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: KubeVirtArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="kubevirt", opts=opts)
        operator = k8s.yaml.v2.ConfigFile(self.child_name(args.operator.name), file=args.operator.url, opts=self.child())
        cdi = k8s.yaml.v2.ConfigFile(self.child_name(args.cdi.name), file=args.cdi.url, opts=self.child())
        k8s.apiextensions.CustomResource(
            self.child_name("kubevirt"),
            api_version=API_VERSION,
            kind="KubeVirt",
            metadata={"name": "kubevirt", "namespace": NAMESPACE, "labels": labels(self.layer), **gate_exceptions(args.feature_gates)},
            spec=kubevirt_spec(args.devices, args.feature_gates),
            opts=self.child(depends_on=[operator]),
        )
        k8s.apiextensions.CustomResource(
            self.child_name("cdi"),
            api_version=CDI_API,
            kind="CDI",
            metadata={"name": "cdi", "labels": labels(self.layer)},
            spec=cdi_spec(),
            opts=self.child(depends_on=[cdi]),
        )
        self.namespace = pulumi.Output.from_input(NAMESPACE)
        self.register_outputs({"namespace": self.namespace})


# --------------------------------------------------------------------------- per tenant


def instancetype_name(pool: str, gpus: int) -> str:
    return f"{pool}-{gpus}gpu"


@dataclass(frozen=True)
class InstanceType:
    name: str
    resource: str | None
    """The device-plugin name of its GPUs; None on a DRA pool, where the VM's claim gives them."""
    gpus: int
    cpus: int
    memory_gib: int

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"cpu": {"guest": self.cpus}, "memory": {"guest": f"{self.memory_gib}Gi"}}
        if self.resource:
            spec["gpus"] = [{"name": f"gpu{i}", "deviceName": self.resource} for i in range(self.gpus)]
        return spec


@dataclass(frozen=True)
class VmPlacement:
    node_labels: dict[str, str]
    tolerations: tuple[dict[str, str], ...]
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class TenantVm:
    name: str
    instancetype: str
    placement: VmPlacement
    image: str
    size_gib: int
    running: bool
    dra_gpus: int = 0
    """GPUs claimed through its ResourceClaimTemplate (`claim_template_name`); 0: its instance type's."""


@dataclass(frozen=True)
class VmTenantSpec:
    tenant: str
    storage_class: str
    instancetypes: tuple[InstanceType, ...]
    vms: tuple[TenantVm, ...]


def tenant_spec(cfg: FactoryConfig, plan: Plan, tenant: Tenant, storage_class: str, requests: list) -> VmTenantSpec:
    names = tenant_names(tenant)
    grants = {(g.pool, g.resource): g.amount for g in allocations(plan, {tenant.name: tenant.domain})[tenant.name].grants}
    own = {o.pool: o for o in domain_offerings(plan, names.trust_domain)}
    types = []
    dra = dra_vm_pools(cfg)
    for pool_name, settings in sorted(cfg.layers.kubevirt.pools.items()):
        resource = advertised_name(plan.pool(pool_name), WHOLE_GPU)
        granted = min(grants.get((pool_name, resource), 0), cfg.pool(pool_name).gpu.per_node)
        # The usual sizes, and every size one of the tenant's VMs asks for (validation bounds it by the grant).
        counts = set(GPU_COUNTS) | {r.gpus for r in requests if r.pool == pool_name}
        types += [
            InstanceType(instancetype_name(pool_name, n), None if pool_name in dra else resource, n, n * settings.cpus_per_gpu, n * settings.memory_gib_per_gpu)
            for n in sorted(counts)
            if n <= granted
        ]
    vms = []
    for request in requests:
        offering = own[request.pool]
        placement = VmPlacement(dict(offering.node_labels), tuple(t.toleration() for t in offering.tolerations), offering.nodes)
        vms.append(
            TenantVm(
                request.name, instancetype_name(request.pool, request.gpus), placement, request.disk.image, request.disk.size_gib, request.running,
                dra_gpus=request.gpus if request.pool in dra else 0,
            )
        )
    return VmTenantSpec(tenant.name, storage_class, tuple(types), tuple(vms))


def claim_template_name(vm: str) -> str:
    return f"{vm}-gpus"


def claim_template_spec(gpus: int) -> dict[str, Any]:
    """One request per GPU: KubeVirt gives a VM GPU the PCI address of one (claim, request)."""
    return {
        "spec": {
            "devices": {
                "requests": [
                    {"name": f"gpu{i}", "exactly": {"deviceClassName": vm_checks.VFIO_DEVICE_CLASS, "allocationMode": "ExactCount", "count": 1}}
                    for i in range(gpus)
                ]
            }
        }
    }


def virtual_machine(vm: TenantVm, names: TenantNames, storage_class: str) -> dict[str, Any]:
    disk = f"{vm.name}-root"
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": list(vm.placement.nodes)}]}]
            }
        }
    }
    devices: dict[str, Any] = {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}
    template_spec: dict[str, Any] = {
        "domain": {"devices": devices},
        "nodeSelector": dict(vm.placement.node_labels),
        "affinity": affinity,
        "volumes": [{"name": "root", "dataVolume": {"name": disk}}],
    }
    if vm.dra_gpus:
        devices["gpus"] = [{"name": f"gpu{i}", "claimName": DRA_CLAIM, "requestName": f"gpu{i}"} for i in range(vm.dra_gpus)]
        template_spec["resourceClaims"] = [{"name": DRA_CLAIM, "resourceClaimTemplateName": claim_template_name(vm.name)}]
    if vm.placement.tolerations:
        template_spec["tolerations"] = [dict(t) for t in vm.placement.tolerations]
    return {
        "instancetype": {"kind": "VirtualMachineInstancetype", "name": vm.instancetype},
        "runStrategy": "Always" if vm.running else "Halted",
        "dataVolumeTemplates": [
            {
                "metadata": {"name": disk, "labels": dict(names.labels)},
                "spec": {
                    "source": {"registry": {"url": vm.image}},
                    "storage": {"storageClassName": storage_class, "resources": {"requests": {"storage": f"{vm.size_gib}Gi"}}},
                },
            }
        ],
        "template": {"metadata": {"labels": {QUEUE_LABEL: names.local_queue, **names.labels}}, "spec": template_spec},
    }


@dataclass(frozen=True)
class KubeVirtTenantHook:
    tenants: tuple[VmTenantSpec, ...]
    layer: str = "kubevirt"

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> KubeVirtTenantHook:
        by_name = {t.name: t for t in cfg.tenants}
        return cls(tuple(tenant_spec(cfg, plan, by_name[t.tenant], t.storage_class, list(t.vms)) for t in cfg.layers.kubevirt.tenants))

    def narrowed(self, tenant: str) -> KubeVirtTenantHook:
        """Only the tenant's own VMs (see `TenantHook`)."""
        return replace(self, tenants=tenant_items(self.tenants, tenant))

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        spec = next((t for t in self.tenants if t.tenant == tenant.name), None)
        if spec is None:
            return
        object_labels = labels(self.layer, tenant=names.tenant, extra=names.labels)
        types = {}
        for instancetype in spec.instancetypes:
            types[instancetype.name] = k8s.apiextensions.CustomResource(
                stack.child_name(f"instancetype-{instancetype.name}"),
                api_version=INSTANCETYPE_API,
                kind="VirtualMachineInstancetype",
                metadata={"name": instancetype.name, "namespace": names.namespace, "labels": object_labels},
                spec=instancetype.spec(),
                opts=stack.child(),
            )
        for vm in spec.vms:
            needs = [types[vm.instancetype]]
            if vm.dra_gpus:
                needs.append(
                    k8s.resource.v1.ResourceClaimTemplate(
                        stack.child_name(f"claim-{claim_template_name(vm.name)}"),
                        metadata={"name": claim_template_name(vm.name), "namespace": names.namespace, "labels": object_labels},
                        spec=claim_template_spec(vm.dra_gpus),
                        opts=stack.child(),
                    )
                )
            # A VM's disk is its state: removing the VM from the config never deletes it silently.
            k8s.apiextensions.CustomResource(
                stack.child_name(f"vm-{vm.name}"),
                api_version=API_VERSION,
                kind="VirtualMachine",
                metadata={"name": vm.name, "namespace": names.namespace, "labels": object_labels},
                spec=virtual_machine(vm, names, spec.storage_class),
                opts=stack.child(depends_on=needs, protect=True, retain_on_delete=True),
            )


def vfio_ceilings(cfg: FactoryConfig, tenant: str, ceiling: GpuCeiling) -> dict[str, int]:
    """The tenant quota's line for the VFIO DeviceClass, once some VM claims DRA GPUs: its whole-GPU
    ceiling on the DRA pools where it runs VMs (0 for a tenant without), as its pods' DRA line."""
    if not has_dra_vms(cfg):
        return {}
    dra = dra_vm_pools(cfg)
    pools = {vm.pool for t in cfg.layers.kubevirt.tenants if t.tenant == tenant for vm in t.vms if vm.pool in dra}
    devices = sum(ceiling.per_offering.get((o.name, WHOLE_GPU), 0) for o in ceiling.offerings if o.pool in pools)
    return {vm_checks.VFIO_DEVICE_CLASS: devices}


# --------------------------------------------------------------------------- config rules


WHOLE_GPU_SHARING = ("exclusive", "dra")
"""The pools whose GPUs the planner gives whole, per GPU, a low-trust tenant's on nodes dedicated to it."""


def _by_name(items: Any, key: str) -> dict[str, dict]:
    return {item[key]: item for item in map(as_dict, as_list(items)) if isinstance(item.get(key), str)}


def vm_requests(raw: dict[str, Any]) -> list[str]:
    """VMs run on pools marked for VMs, exclusive GPUs of a known passthrough device, within the
    tenant's grant there; a low-trust tenant's only on an exclusive or DRA pool, where the planner
    dedicates whole nodes to it (a shared pool's nodes hold other tenants' GPUs). On a DRA pool the
    driver gives the GPUs: no PCI ID or device-plugin name applies."""
    layers = as_dict(raw.get("layers"))
    layer = as_dict(layers.get("kubevirt"))
    marked, tenants_list = as_dict(layer.get("pools")), as_list(layer.get("tenants"))
    if not marked and not tenants_list:
        return []
    if layer.get("enabled", False) is not True:
        return ["layers.kubevirt: pools or tenants given but layers.kubevirt.enabled is not true"]
    pools = _by_name(as_dict(raw.get("fleet")).get("pools"), "name")
    tenants = _by_name(raw.get("tenants"), "name")
    problems: list[str] = []
    for pool_name, settings in sorted(marked.items()):
        path = f"layers.kubevirt.pools.{pool_name}"
        if pool_name not in pools:
            problems.append(f"{path}: unknown pool {pool_name!r}{did_you_mean(pool_name, pools)}")
            continue
        sharing = pools[pool_name].get("sharing", "exclusive")
        if sharing == "dra":
            problems += [
                f"{path}.{key}: not used on a DRA pool: the DRA driver's {vm_checks.VFIO_DEVICE_CLASS} class gives VMs its GPUs"
                for key in ("pci_device_id", "resource_name")
                if as_dict(settings).get(key) is not None
            ]
        elif sharing not in WHOLE_GPU_SHARING:
            problems.append(f"{path}: pool {pool_name!r} shares GPUs by {sharing}; a VM gets whole GPUs only (sharing: exclusive or dra)")
        else:
            problems += _device_problems(path, pools[pool_name], as_dict(settings))
    seen: set[str] = set()
    for i, entry in enumerate(map(as_dict, tenants_list)):
        path, name = f"layers.kubevirt.tenants[{i}]", entry.get("tenant")
        if not isinstance(name, str) or name not in tenants:
            problems.append(f"{path}.tenant: unknown tenant {name!r}{did_you_mean(name, tenants)}")
            continue
        if name in seen:
            problems.append(f"{path}.tenant: tenant {name!r} is listed twice")
        seen.add(name)
        tenant = tenants[name]
        demands = _by_name(tenant.get("gpus"), "pool")
        asked: dict[str, int] = {}
        vm_names: set[str] = set()
        for j, vm in enumerate(map(as_dict, as_list(entry.get("vms")))):
            vm_path, pool_name, gpus = f"{path}.vms[{j}]", vm.get("pool"), vm.get("gpus", 1)
            if isinstance(vm.get("name"), str):  # another type has its field error
                if vm["name"] in vm_names:
                    problems.append(f"{vm_path}.name: VM {vm['name']!r} is defined twice")
                vm_names.add(vm["name"])
            if not isinstance(pool_name, str):
                continue
            if pool_name not in marked:
                problems.append(f"{vm_path}.pool: pool {pool_name!r} is not marked for VMs (layers.kubevirt.pools names {', '.join(sorted(marked)) or 'none'})")
                continue
            if pool_name not in demands:
                problems.append(f"{vm_path}.pool: tenant {name!r} has no GPU grant on pool {pool_name!r} (tenants[].gpus names none)")
                continue
            if isinstance(gpus, int):
                asked[pool_name] = asked.get(pool_name, 0) + gpus
                per_node = as_dict(pools.get(pool_name, {}).get("gpu")).get("per_node")
                if isinstance(per_node, int) and gpus > per_node:
                    problems.append(f"{vm_path}.gpus: {gpus} GPUs, but a node of pool {pool_name!r} has {per_node}: a VM's GPUs are on one node")
            sharing = pools[pool_name].get("sharing", "exclusive") if pool_name in pools else "exclusive"
            if tenant.get("trust") == "low" and sharing not in WHOLE_GPU_SHARING:
                problems.append(
                    f"{vm_path}.pool: tenant {name!r} is low trust and pool {pool_name!r} shares its nodes ({sharing}); "
                    "a low-trust tenant's VMs run only on nodes dedicated to it (an exclusive or DRA pool)"
                )
        for pool_name, total in sorted(asked.items()):
            count = demands[pool_name].get("count")
            if isinstance(count, int) and total > count:
                problems.append(f"{path}.vms: {total} GPUs of VMs on {pool_name!r}, the tenant's grant there is {count}")
    return problems


def _device_problems(path: str, pool: dict, settings: dict) -> list[str]:
    model = GPU_MODELS.get(as_dict(pool.get("gpu")).get("model"))
    if model is None:
        return []  # an unknown model has its own error
    pci = settings.get("pci_device_id")
    if pci is not None and pci not in model.pci_device_ids:
        return [f"{path}.pci_device_id: {pci!r} is not a {model.name} ({', '.join(model.pci_device_ids)})"]
    if vm_resource_name(pci or model.pci_device_ids[0], settings.get("resource_name")) is None:
        return [f"{path}.resource_name: required, the sandbox device plugin's name for {pci or model.pci_device_ids[0]} is not known"]
    return []


LAYER = Layer(
    name="kubevirt",
    section="kubevirt",
    component=KubeVirt,
    args=KubeVirtArgs.from_config,
    requires=("fleet",),
    tenant_hook=KubeVirtTenantHook.from_config,
    checks=(vm_checks.vm_devices_permitted, vm_checks.vm_resources_quotaed, vm_checks.vm_dra_claims),
    config_checks=(vm_requests,),
)
