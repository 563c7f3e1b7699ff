"""KubeVirt VMs (components/kubevirt.py): a VM's GPUs are permitted and quota'd like a pod's.

No VirtualMachine asks, itself or through its namespace's instance type, for a host device the
`KubeVirt` CR does not permit (`factory.checking.vms.vm_problems`); every resource name the CR
permits is capped in every tenant namespace's ResourceQuota (`quota_problems`), so no tenant can
take VM GPUs beyond its grant (nor, once a VM claims DRA GPUs, claim VFIO devices beyond it). A
VM's DRA GPUs are claimed through a template asking exactly one `vfio.gpu.nvidia.com` device each
(`claim_problems`), and the KubeVirt CR enables only the justified feature gates, with their
recorded reason, `GPUsWithDRA` exactly when such a VM exists (`gate_problems`), as the DRA driver's
`PassthroughSupport` (`driver_gate_problems`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Iterator

from pulumi_policy import PolicyResource

from ai_factory.factory.checking.vms import (
    DRA_DRIVER_CHART,
    INSTANCETYPE_KINDS,
    claim_problems,
    dra_gpus,
    driver_gate_problems,
    gate_problems,
    permitted_devices,
    quota_problems,
    quotaed_claims,
    vm_problems,
)
from ai_factory.policies.aif_policies.core import Violation, stack_policy
from ai_factory.policies.aif_policies.kube import Cluster, as_map, chart_named, cluster_of, metadata


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
    capped = _permitted(cluster) | quotaed_claims(vm.spec for vm in cluster.of("VirtualMachine"))
    if not capped:
        return
    hard: dict[str, dict[str, Any]] = {ns: {} for tenant in cluster.tenants.values() for ns in tenant.namespaces}
    for quota in cluster.of("ResourceQuota"):
        if quota.namespace in hard:
            hard[quota.namespace].update(dict(quota.spec.get("hard") or {}))
    namespaces = {o.name: o for o in cluster.of("Namespace")}
    for ns, lines in sorted(hard.items()):
        for problem in quota_problems(lines, capped):
            yield namespaces[ns].resource, f"Namespace {ns}: {problem}"


def check_vm_dra_claims(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    templates: dict[str | None, dict[str, Mapping[str, Any]]] = {}
    for o in cluster.of("ResourceClaimTemplate"):
        templates.setdefault(o.namespace, {})[o.name] = o.spec
    vms = cluster.of("VirtualMachine")
    for vm in vms:
        for problem in claim_problems(vm.spec, templates.get(vm.namespace, {})):
            yield vm.resource, f"{vm.describe()}: {problem}"
    dra_vms = sum(1 for vm in vms if dra_gpus(vm.spec))
    for kv in cluster.of("KubeVirt"):
        for problem in gate_problems(kv.spec, as_map(metadata(kv.props).get("annotations")), dra_vms):
            yield kv.resource, f"{kv.describe()}: {problem}"
    for resource, chart in chart_named(resources, DRA_DRIVER_CHART):
        for problem in driver_gate_problems(chart.values, dra_vms):
            yield resource, f"Helm release {chart.namespace}/{chart.name}: {problem}"


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
    stack_policy(
        "vm-dra-claims",
        "A VM's DRA GPUs are each one vfio.gpu.nvidia.com device of a template in its namespace; KubeVirt's feature gates are the justified ones, GPUsWithDRA and the DRA driver's PassthroughSupport only with such VMs.",
        check_vm_dra_claims,
    ),
]
