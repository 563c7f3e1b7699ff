"""KubeVirt VMs (components/kubevirt.py): a VM's GPUs are permitted and quota'd like a pod's.

No VirtualMachine asks, itself or through its namespace's instance type, for a host device the
`KubeVirt` CR does not permit (`factory.checking.vms.vm_problems`); every resource name the CR
permits is capped in every tenant namespace's ResourceQuota (`quota_problems`), so no tenant can
take VM GPUs beyond its grant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Iterator

from pulumi_policy import PolicyResource

from ai_factory.factory.checking.vms import INSTANCETYPE_KINDS, permitted_devices, quota_problems, vm_problems
from ai_factory.policies.aif_policies.core import Violation, stack_policy
from ai_factory.policies.aif_policies.kube import Cluster, cluster_of


def _permitted(cluster: Cluster) -> set[str]:
    return permitted_devices(o.spec for o in cluster.of("KubeVirt"))


def check_vm_devices_permitted(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    permitted = _permitted(cluster)
    types: dict[str | None, dict[str, Mapping[str, Any]]] = {}
    for o in cluster.of(*INSTANCETYPE_KINDS):
        types.setdefault(o.namespace, {})[o.name] = o.spec
    for vm in cluster.of("VirtualMachine"):
        for problem in vm_problems(vm.spec, types.get(vm.namespace, {}), permitted):
            yield vm.resource, f"{vm.describe()}: {problem}"


def check_vm_gpus_quotaed(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    permitted = _permitted(cluster)
    if not permitted:
        return
    hard: dict[str, dict[str, Any]] = {ns: {} for tenant in cluster.tenants.values() for ns in tenant.namespaces}
    for quota in cluster.of("ResourceQuota"):
        if quota.namespace in hard:
            hard[quota.namespace].update(dict(quota.spec.get("hard") or {}))
    namespaces = {o.name: o for o in cluster.of("Namespace")}
    for ns, lines in sorted(hard.items()):
        for problem in quota_problems(lines, permitted):
            yield namespaces[ns].resource, f"Namespace {ns}: {problem}"


POLICIES = [
    stack_policy(
        "vm-devices-permitted",
        "No VirtualMachine requests a host device (GPU) outside the KubeVirt CR's permittedHostDevices.",
        check_vm_devices_permitted,
    ),
    stack_policy(
        "vm-gpus-quotaed",
        "Every GPU resource name KubeVirt permits (what virt-launcher pods request) is capped in every tenant's ResourceQuota.",
        check_vm_gpus_quotaed,
    ),
]
