"""Offline checks of KubeVirt VMs (`components/kubevirt.py`), over rendered objects only.

* `vm_devices_permitted`: every GPU or host device a VirtualMachine asks for, itself or through its
  namespace's `VirtualMachineInstancetype`, is one the `KubeVirt` CR permits
  (`permittedHostDevices`); a VM naming a missing instance type is reported too, since its devices
  cannot be read.
* `vm_resources_quotaed`: every resource name the `KubeVirt` CR permits (what virt-launcher pods
  request) is capped in every tenant namespace's ResourceQuota, and every tenant running VMs has a
  ClusterQueue covering each name its VMs ask for (Kueue admits nothing it does not cover).

The same functions serve the policy pack (`policies/aif_policies/vms.py`) over a stack's objects.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Sequence

from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.model.tenancy import TENANT_LABEL
from ai_factory.factory.rendering.bundle import Rendered

INSTANCETYPE_KINDS = ("VirtualMachineInstancetype",)


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
    return [str(_map(d).get("deviceName")) for key in ("gpus", "hostDevices") for d in _list(devices.get(key))]


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


def covered_resources(cluster_queue_spec: Mapping[str, Any]) -> set[str]:
    return {str(r) for group in _list(cluster_queue_spec.get("resourceGroups")) for r in _list(_map(group).get("coveredResources"))}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _map(obj.get("spec"))


def _instancetypes(rendered: Rendered) -> dict[str | None, dict[str, Mapping[str, Any]]]:
    found: dict[str | None, dict[str, Mapping[str, Any]]] = {}
    for m in rendered.manifests:
        if m.kind in INSTANCETYPE_KINDS:
            found.setdefault(m.namespace, {})[m.name] = _spec(m.obj)
    return found


def _tenant_of(rendered: Rendered) -> dict[str, str]:
    return {m.name: str(_map(_map(m.obj.get("metadata")).get("labels")).get(TENANT_LABEL)) for m in rendered.manifests if m.kind == "Namespace" and _map(_map(m.obj.get("metadata")).get("labels")).get(TENANT_LABEL)}


def vm_devices_permitted(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    permitted = permitted_devices(_spec(m.obj) for m in rendered.manifests if m.kind == "KubeVirt")
    types, tenants = _instancetypes(rendered), _tenant_of(rendered)
    for m in rendered.manifests:
        if m.kind == "VirtualMachine":
            tenant = tenants.get(m.namespace or "")
            for problem in vm_problems(_spec(m.obj), types.get(m.namespace, {}), permitted):
                yield Finding("vm-devices", m.ref, problem, (tenant,) if tenant else ())


def vm_resources_quotaed(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    permitted = permitted_devices(_spec(m.obj) for m in rendered.manifests if m.kind == "KubeVirt")
    if not permitted:
        return
    tenants = _tenant_of(rendered)
    hard: dict[str, dict[str, Any]] = {ns: {} for ns in tenants}
    for m in rendered.manifests:
        if m.kind == "ResourceQuota" and m.namespace in hard:
            hard[m.namespace].update(_map(_spec(m.obj).get("hard")))
    for ns, lines in sorted(hard.items()):
        for problem in quota_problems(lines, permitted):
            yield Finding("vm-quota", f"Namespace/{ns}", problem, (tenants[ns],))
    yield from _queue_findings(rendered, tenants, permitted)


def _queue_findings(rendered: Rendered, tenants: Mapping[str, str], permitted: set[str]) -> Iterator[Finding]:
    queues = {str(_map(_map(m.obj.get("metadata")).get("labels")).get(TENANT_LABEL)): _spec(m.obj) for m in rendered.manifests if m.kind == "ClusterQueue"}
    types = _instancetypes(rendered)
    for m in rendered.manifests:
        if m.kind != "VirtualMachine" or not queues:
            continue
        tenant = tenants.get(m.namespace or "")
        names, _ = requested_devices(_spec(m.obj), types.get(m.namespace, {}))
        covered = covered_resources(queues.get(tenant or "", {}))
        for name in sorted(set(names) & permitted - covered):
            yield Finding("vm-quota", m.ref, f"asks for {name}, which tenant {tenant!r}'s ClusterQueue does not cover: Kueue would never admit it", (tenant,) if tenant else ())
