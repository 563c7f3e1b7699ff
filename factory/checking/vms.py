"""Offline checks of KubeVirt VMs (`components/kubevirt.py`), over rendered objects only.

* `vm_devices_permitted`: every GPU or host device a VirtualMachine asks for, itself or through its
  namespace's `VirtualMachineInstancetype`, is one the `KubeVirt` CR permits
  (`permittedHostDevices`); a VM naming a missing instance type is reported too, since its devices
  cannot be read.
* `vm_resources_quotaed`: every resource name the `KubeVirt` CR permits (what virt-launcher pods
  request) is capped in every tenant namespace's ResourceQuota, and every tenant running VMs has a
  ClusterQueue covering each name its VMs ask for (Kueue admits nothing it does not cover); with
  VMs on DRA GPUs, the VFIO DeviceClass's claim count (`VFIO_QUOTA`) is capped there too.
* `vm_dra_claims`: a VM's DRA GPUs (`gpus[].claimName`) name one of its `resourceClaims`, whose
  ResourceClaimTemplate exists in its namespace and asks, for that request, exactly one device of
  `vfio.gpu.nvidia.com`; the `KubeVirt` CR's feature gates are the justified ones only
  (`JUSTIFIED_GATES`, each with its reason recorded in `GATE_EXCEPTIONS_ANNOTATION`), and
  `GPUsWithDRA` is on exactly when some VM claims DRA GPUs, as is the DRA driver's
  `PassthroughSupport` (without it no GPU is bound to vfio-pci for a VM's claim).

The same functions serve the policy pack (`policies/aif_policies/vms.py`) over a stack's objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Iterable, Iterator

from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.model.tenancy import LABEL_PREFIX, TENANT_LABEL
from ai_factory.factory.rendering.bundle import Rendered

INSTANCETYPE_KINDS = ("VirtualMachineInstancetype",)
VFIO_DEVICE_CLASS = "vfio.gpu.nvidia.com"
"""The NVIDIA DRA driver's DeviceClass of GPUs bound to vfio-pci (its chart creates it)."""
VFIO_QUOTA = f"{VFIO_DEVICE_CLASS}.deviceclass.resource.k8s.io/devices"
DRA_GPU_GATE = "GPUsWithDRA"
JUSTIFIED_GATES: Mapping[str, str] = {
    DRA_GPU_GATE: "VMs on DRA pools: their GPUs are ResourceClaims (spec.resourceClaims, gpus[].claimName), alpha in KubeVirt v1.9.0",
}
"""The only KubeVirt feature gates the platform may enable, each for a reason; none is on by default."""
GATE_EXCEPTIONS_ANNOTATION = f"{LABEL_PREFIX}/feature-gate-exceptions"
"""On the KubeVirt CR: JSON {gate: reason} of the gates it enables, the reviewed exception."""
DRA_DRIVER_CHART = "dra-driver-nvidia-gpu"
PASSTHROUGH_GATE = "PassthroughSupport"
"""The DRA driver chart's alpha gate (`featureGates.PassthroughSupport`) for `vfio.gpu.nvidia.com` devices."""


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) else ()


def permitted_devices(kubevirt_specs: Iterable[Mapping[str, Any]]) -> set[str]:
    """The resource names the KubeVirt CRs permit: PCI, mediated and USB host devices."""
    names: set[str] = set()
    for spec in kubevirt_specs:
        permitted = _map(_map(spec.get("configuration")).get("permittedHostDevices"))
        for key in ("pciHostDevices", "mediatedDevices", "usb"):
            names |= {str(_map(d).get("resourceName")) for d in _list(permitted.get(key)) if _map(d).get("resourceName")}
    return names


def _device_names(devices: Mapping[str, Any]) -> list[str]:
    """Device-plugin devices only: a DRA device (`claimName`) is its claim's, not permittedHostDevices'."""
    return [str(_map(d).get("deviceName")) for key in ("gpus", "hostDevices") for d in _list(devices.get(key)) if not _map(d).get("claimName")]


def requested_devices(vm_spec: Mapping[str, Any], instancetypes: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """The device names a VirtualMachine asks for (its own and its instance type's), and what
    could not be read. `instancetypes`: the specs of its namespace's instance types, by name."""
    template = _map(_map(vm_spec.get("template")).get("spec"))
    names = _device_names(_map(_map(template.get("domain")).get("devices")))
    problems = []
    ref = _map(vm_spec.get("instancetype"))
    if ref:
        kind, name = ref.get("kind", "VirtualMachineClusterInstancetype"), str(ref.get("name"))
        if kind not in INSTANCETYPE_KINDS:
            problems.append(f"instance type {kind}/{name} is not a namespaced VirtualMachineInstancetype of the tenant")
        elif name not in instancetypes:
            problems.append(f"instance type {name!r} does not exist in its namespace: its devices cannot be checked")
        else:
            names += _device_names(instancetypes[name])
    return names, problems


def vm_problems(vm_spec: Mapping[str, Any], instancetypes: Mapping[str, Mapping[str, Any]], permitted: set[str]) -> list[str]:
    names, problems = requested_devices(vm_spec, instancetypes)
    for name in sorted(set(names) - permitted):
        problems.append(f"requests host device {name!r}, which the KubeVirt CR does not permit ({', '.join(sorted(permitted)) or 'none'})")
    return problems


def quota_problems(hard: Mapping[str, Any], resources: Iterable[str]) -> list[str]:
    """The VM-capable names a namespace's ResourceQuota lines leave uncapped."""
    capped = {str(k).removeprefix("requests.") for k in hard}
    return [f"its ResourceQuota does not cap {r} (VM GPUs); a VM could take any number" for r in sorted(set(resources) - capped)]


def quotaed_claims(vm_specs: Iterable[Mapping[str, Any]]) -> set[str]:
    """The DRA quota line VMs need capped: the VFIO class's, once some VM claims DRA GPUs."""
    return {VFIO_QUOTA} if any(dra_gpus(spec) for spec in vm_specs) else set()


def covered_resources(cluster_queue_spec: Mapping[str, Any]) -> set[str]:
    return {str(r) for group in _list(cluster_queue_spec.get("resourceGroups")) for r in _list(_map(group).get("coveredResources"))}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _map(obj.get("spec"))


def _instancetypes(rendered: Rendered) -> dict[str | None, dict[str, Mapping[str, Any]]]:
    found: dict[str | None, dict[str, Mapping[str, Any]]] = {}
    for m in rendered.of_kind(*INSTANCETYPE_KINDS):
        found.setdefault(m.namespace, {})[m.name] = _spec(m.obj)
    return found


def _tenant_of(rendered: Rendered) -> dict[str, str]:
    return {m.name: str(_map(_map(m.obj.get("metadata")).get("labels")).get(TENANT_LABEL)) for m in rendered.of_kind("Namespace") if _map(_map(m.obj.get("metadata")).get("labels")).get(TENANT_LABEL)}


def vm_devices_permitted(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    permitted = permitted_devices(_spec(m.obj) for m in rendered.of_kind("KubeVirt"))
    types, tenants = _instancetypes(rendered), _tenant_of(rendered)
    for m in rendered.of_kind("VirtualMachine"):
        tenant = tenants.get(m.namespace or "")
        for problem in vm_problems(_spec(m.obj), types.get(m.namespace, {}), permitted):
            yield Finding("vm-devices", m.ref, problem, (tenant,) if tenant else ())


def vm_resources_quotaed(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    permitted = permitted_devices(_spec(m.obj) for m in rendered.of_kind("KubeVirt"))
    capped = permitted | quotaed_claims(_spec(m.obj) for m in rendered.of_kind("VirtualMachine"))
    if not capped:
        return
    tenants = _tenant_of(rendered)
    hard: dict[str, dict[str, Any]] = {ns: {} for ns in tenants}
    for m in rendered.of_kind("ResourceQuota"):
        if m.namespace in hard:
            hard[m.namespace].update(_map(_spec(m.obj).get("hard")))
    for ns, lines in sorted(hard.items()):
        for problem in quota_problems(lines, capped):
            yield Finding("vm-quota", f"Namespace/{ns}", problem, (tenants[ns],))
    yield from _queue_findings(rendered, tenants, permitted)


def _queue_findings(rendered: Rendered, tenants: Mapping[str, str], permitted: set[str]) -> Iterator[Finding]:
    queues = {str(_map(_map(m.obj.get("metadata")).get("labels")).get(TENANT_LABEL)): _spec(m.obj) for m in rendered.of_kind("ClusterQueue")}
    types = _instancetypes(rendered)
    for m in rendered.of_kind("VirtualMachine") if queues else ():
        tenant = tenants.get(m.namespace or "")
        names, _ = requested_devices(_spec(m.obj), types.get(m.namespace, {}))
        covered = covered_resources(queues.get(tenant or "", {}))
        for name in sorted(set(names) & permitted - covered):
            yield Finding("vm-quota", m.ref, f"asks for {name}, which tenant {tenant!r}'s ClusterQueue does not cover: Kueue would never admit it", (tenant,) if tenant else ())


# --------------------------------------------------------------------------- DRA GPUs of VMs


def _template_devices(vm_spec: Mapping[str, Any]) -> Mapping[str, Any]:
    return _map(_map(_map(_map(vm_spec.get("template")).get("spec")).get("domain")).get("devices"))


def dra_gpus(vm_spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The VM's GPUs and host devices that a ResourceClaim provides."""
    devices = _template_devices(vm_spec)
    return [_map(d) for key in ("gpus", "hostDevices") for d in _list(devices.get(key)) if _map(d).get("claimName")]


def claim_problems(vm_spec: Mapping[str, Any], templates: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What is wrong with a VM's DRA GPUs. `templates`: its namespace's ResourceClaimTemplate specs by name."""
    claims = {str(_map(c).get("name")): _map(c) for c in _list(_map(_map(vm_spec.get("template")).get("spec")).get("resourceClaims"))}
    problems = []
    for gpu in dra_gpus(vm_spec):
        name, claim_name, request = gpu.get("name"), str(gpu.get("claimName")), gpu.get("requestName")
        claim = claims.get(claim_name)
        if claim is None:
            problems.append(f"GPU {name!r} names claim {claim_name!r}, which is not in its resourceClaims")
            continue
        template_name = claim.get("resourceClaimTemplateName")
        if template_name not in templates:
            problems.append(f"claim {claim_name!r} is not a ResourceClaimTemplate of its namespace ({template_name!r}): its devices cannot be checked")
            continue
        requests = {str(_map(r).get("name")): _map(_map(r).get("exactly")) for r in _list(_map(_map(_map(templates[template_name]).get("spec")).get("devices")).get("requests"))}
        exactly = requests.get(str(request))
        if exactly is None:
            problems.append(f"GPU {name!r} names request {request!r}, which claim template {template_name!r} does not have")
        elif exactly.get("deviceClassName") != VFIO_DEVICE_CLASS or exactly.get("allocationMode", "ExactCount") != "ExactCount" or exactly.get("count", 1) != 1:
            problems.append(f"GPU {name!r}'s request {request!r} must be exactly one {VFIO_DEVICE_CLASS} device (whole GPU bound to vfio-pci)")
    return list(dict.fromkeys(problems))  # a claim's problem once, however many GPUs name it


def gate_problems(kubevirt_spec: Mapping[str, Any], annotations: Mapping[str, Any], dra_vms: int) -> list[str]:
    """The KubeVirt CR's feature gates against what is justified and needed (`dra_vms`: how many VMs claim DRA GPUs)."""
    gates = [str(g) for g in _list(_map(_map(kubevirt_spec.get("configuration")).get("developerConfiguration")).get("featureGates"))]
    try:
        recorded = _map(json.loads(str(annotations.get(GATE_EXCEPTIONS_ANNOTATION, "{}"))))
    except ValueError:
        recorded = {}
    problems = []
    for gate in gates:
        if gate not in JUSTIFIED_GATES:
            problems.append(f"feature gate {gate!r} is not one the platform justifies ({', '.join(sorted(JUSTIFIED_GATES))}): gates stay minimal")
        elif not recorded.get(gate):
            problems.append(f"feature gate {gate!r} is on without its reason recorded in {GATE_EXCEPTIONS_ANNOTATION}")
    if DRA_GPU_GATE in gates and not dra_vms:
        problems.append(f"feature gate {DRA_GPU_GATE!r} is on but no VM claims DRA GPUs")
    if dra_vms and DRA_GPU_GATE not in gates:
        problems.append(f"{dra_vms} VM(s) claim DRA GPUs but feature gate {DRA_GPU_GATE!r} is off: KubeVirt would refuse them")
    return problems


def driver_gate_problems(values: Mapping[str, Any], dra_vms: int) -> list[str]:
    """The DRA driver release's `PassthroughSupport`: on exactly when some VM claims DRA GPUs."""
    on = _map(values.get("featureGates")).get(PASSTHROUGH_GATE) is True
    if on and not dra_vms:
        return [f"alpha gate {PASSTHROUGH_GATE} is on but no VM claims DRA GPUs"]
    if dra_vms and not on:
        return [f"{dra_vms} VM(s) claim DRA GPUs but gate {PASSTHROUGH_GATE} is off: no GPU is bound to vfio-pci for them"]
    return []


def vm_dra_claims(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    tenants = _tenant_of(rendered)
    templates: dict[str | None, dict[str, Mapping[str, Any]]] = {}
    for m in rendered.of_kind("ResourceClaimTemplate"):
        templates.setdefault(m.namespace, {})[m.name] = _spec(m.obj)
    dra_vms = 0
    for m in rendered.of_kind("VirtualMachine"):
        dra_vms += bool(dra_gpus(_spec(m.obj)))
        tenant = tenants.get(m.namespace or "")
        for problem in claim_problems(_spec(m.obj), templates.get(m.namespace, {})):
            yield Finding("vm-dra", m.ref, problem, (tenant,) if tenant else ())
    sources = rendered.oci_sources()
    for m in rendered.of_kind("KubeVirt", "HelmRelease"):
        if m.kind == "KubeVirt":
            for problem in gate_problems(_spec(m.obj), _map(_map(m.obj.get("metadata")).get("annotations")), dra_vms):
                yield Finding("vm-dra", m.ref, problem)
        elif m.kind == "HelmRelease" and rendered.release_chart(m, sources) == DRA_DRIVER_CHART:
            for problem in driver_gate_problems(_map(_spec(m.obj).get("values")), dra_vms):
                yield Finding("vm-dra", m.ref, problem)
