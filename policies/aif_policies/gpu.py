"""GPU sharing: trust decides sharing (shared/BRIEF.md, "Decisions").

A physical GPU is shared only inside one trust domain, low-trust tenants get whole GPUs on nodes
of their own, MIG layouts are legal for their GPU model, HAMi and the NVIDIA device plugin never
serve the same node, GPU work goes through Kueue, and queue quotas never promise more than the
fleet has. The stack shows all of it: node labels and taints (the fleet layer's `NodePatch`es,
`ai_factory.factory.planning.placement.node_placements`), the GPU Operator's MIG and device-plugin configs (its chart
values), HAMi's node selector (its chart values), Kueue flavors and queues, tenant quotas.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Iterator

import json

import yaml
from pulumi_policy import PolicyResource

from ai_factory.factory.checking.isolation import MULTIKUEUE_CONTROLLER
from ai_factory.factory.checking.label_index import LabelIndex
from ai_factory.factory.model.gpus import COMPUTE_SLICES, GPU_MODELS, MEMORY_SLICES, GpuModel
from ai_factory.factory.planning.placement import (
    DEDICATED_LABEL,
    DEVICE_PLUGIN_CONFIG_LABEL,
    DEVICE_PLUGIN_DEPLOY_LABEL,
    HAMI_LABEL,
    MIG_CONFIG_LABEL,
    MIG_DISABLED_CONFIG,
)
from ai_factory.factory.planning.mig import place_mig
from ai_factory.factory.planning.quotas import SUPPLY_ANNOTATION
from ai_factory.factory.model.tenancy import TENANT_LABEL, TRUST_DOMAIN_LABEL
from ai_factory.policies.aif_policies.core import Violation, resource_policy, stack_policy
from ai_factory.policies.aif_policies.kube import (
    HELM_TYPES,
    Cluster,
    Obj,
    as_list,
    as_map,
    chart_named,
    describe,
    gpu_resource,
    group_of,
    helm_chart,
    kind_of,
    quantity,
    selects,
    cluster_of,
)

HAMI_DEFAULT_NODE_SELECTOR = {"gpu": "on"}
"""HAMi 2.10.0's `devicePlugin.nvidiaNodeSelector` default (its chart values.yaml)."""
SHARED_RESOURCE_PREFIXES = ("nvidia.com/mig-", "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpu.shared")
"""Resource names that are a part of a GPU: MIG instances, HAMi memory and cores, time-sliced replicas."""
MODELS_BY_PCI_ID: dict[str, list[GpuModel]] = defaultdict(list)
for _model in GPU_MODELS.values():
    for _pci in _model.pci_device_ids:
        MODELS_BY_PCI_ID[_pci.upper()].append(_model)


# --------------------------------------------------------------------------- device configs


def mig_parted_files(resource_type: str, props: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """The mig-parted files (`config.yaml` with `mig-configs`) a resource carries: in the GPU
    Operator's `migManager.config.data`, or in a ConfigMap MIG Manager is pointed at."""
    if resource_type in HELM_TYPES:
        chart = helm_chart(resource_type, props)
        if chart.chart_name == "gpu-operator":
            data = as_map(as_map(as_map(chart.values.get("migManager")).get("config")).get("data"))
            if "config.yaml" in data:
                yield "values migManager.config.data.config.yaml", data["config.yaml"]
    elif kind_of(resource_type) == "ConfigMap":
        text = as_map(props.get("data")).get("config.yaml")
        if isinstance(text, str) and "mig-configs" in text:
            yield "data.config.yaml", text


def _load_yaml(text: Any) -> Any:
    try:
        return yaml.safe_load(text) if isinstance(text, str) else None
    except yaml.YAMLError:
        return None


def mig_configs(cluster: Cluster) -> dict[str, Sequence[Any]]:
    """mig-parted configs by name, from every resource that carries a mig-parted file."""
    configs: dict[str, Sequence[Any]] = {}
    for r in cluster.resources:
        for _, text in mig_parted_files(r.resource_type, r.props):
            configs.update({str(k): as_list(v) for k, v in as_map(as_map(_load_yaml(text)).get("mig-configs")).items()})
    return configs


def device_plugin_configs(cluster: Cluster) -> dict[str, Mapping[str, Any]]:
    """The NVIDIA device plugin's named configs (GPU Operator `devicePlugin.config.data`)."""
    configs: dict[str, Mapping[str, Any]] = {}
    for _, chart in chart_named(cluster.resources, "gpu-operator"):
        data = as_map(as_map(as_map(chart.values.get("devicePlugin")).get("config")).get("data"))
        configs.update({str(name): as_map(_load_yaml(text)) for name, text in data.items()})
    return configs


def hami_node_selectors(cluster: Cluster) -> list[tuple[PolicyResource, Mapping[str, Any]]]:
    selectors = []
    for resource, chart in chart_named(cluster.resources, "hami"):
        plugin = as_map(chart.values.get("devicePlugin"))
        selector = plugin.get("nvidiaNodeSelector") if "nvidiaNodeSelector" in plugin else HAMI_DEFAULT_NODE_SELECTOR
        selectors.append((resource, as_map(selector)))
    return selectors


class Fleet:
    """Each GPU node's sharing and trust domain, as its labels and the device configs make it."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.nodes = cluster.nodes()
        self._by_label = LabelIndex(self.nodes.values(), lambda node: node.labels)
        self.mig = mig_configs(cluster)
        self.device_plugin = device_plugin_configs(cluster)
        self.hami = hami_node_selectors(cluster)
        self._sharing: dict[int, str | None] = {}

    def sharing(self, node: Obj) -> str | None:
        """How a node's GPUs are shared between pods (`MIG config <name>`, `HAMi`, `time-slicing
        config <name>`), None when every GPU is whole. Read once per node for all the policies of
        a run (a node was read again for every flavor and queue asking about it)."""
        if id(node) not in self._sharing:
            self._sharing[id(node)] = self._sharing_of(node)
        return self._sharing[id(node)]

    def _sharing_of(self, node: Obj) -> str | None:
        node_labels = node.labels
        mig = node_labels.get(MIG_CONFIG_LABEL)
        if mig and mig != MIG_DISABLED_CONFIG:
            entries = self.mig.get(str(mig))
            if entries is None or any(as_map(e).get("mig-enabled") for e in entries):
                return f"MIG config {mig}"
        if node_labels.get(HAMI_LABEL) == "enabled" or any(selects({"matchLabels": s}, node_labels) for _, s in self.hami if s):
            return "HAMi"
        plugin_config = node_labels.get(DEVICE_PLUGIN_CONFIG_LABEL)
        if plugin_config:
            config = self.device_plugin.get(str(plugin_config))
            sharing = as_map(as_map(config).get("sharing"))
            if config is None or sharing.get("mps") or any(
                (quantity(as_map(r).get("replicas")) or 0) > 1 for r in as_list(as_map(sharing.get("timeSlicing")).get("resources"))
            ):
                return f"time-slicing config {plugin_config}"
        return None

    def domain(self, node: Obj) -> str | None:
        value = node.labels.get(TRUST_DOMAIN_LABEL)
        return str(value) if value else None

    def selected(self, node_labels: Mapping[str, Any]) -> list[Obj]:
        """The nodes a flavor's `nodeLabels` select."""
        return self._by_label.matching(node_labels)


_last_fleet: tuple[Cluster, Fleet] | None = None


def fleet_of(cluster: Cluster) -> Fleet:
    """The fleet of a stack's index, built once for the GPU policies of a run (`cluster_of`)."""
    global _last_fleet
    if _last_fleet is None or _last_fleet[0] is not cluster:
        _last_fleet = (cluster, Fleet(cluster))
    return _last_fleet[1]


def gpu_flavors(queue: Obj) -> list[str]:
    """The flavors a ClusterQueue (or Cohort) offers GPU resources from."""
    names = []
    for group in as_list(queue.spec.get("resourceGroups")):
        group = as_map(group)
        if any(gpu_resource(str(r)) for r in as_list(group.get("coveredResources"))):
            names += [str(as_map(f).get("name")) for f in as_list(group.get("flavors"))]
    return names


def nominal_quotas(queue: Obj) -> Iterator[tuple[str, str, Fraction]]:
    """(flavor, resource, nominal quota) of every GPU resource a ClusterQueue or Cohort lists."""
    for group in as_list(queue.spec.get("resourceGroups")):
        for flavor in as_list(as_map(group).get("flavors")):
            for resource in as_list(as_map(flavor).get("resources")):
                resource = as_map(resource)
                amount = quantity(resource.get("nominalQuota"))
                if gpu_resource(str(resource.get("name"))) and amount:
                    yield str(as_map(flavor).get("name")), str(resource.get("name")), amount


def dispatch_queues(cluster: Cluster) -> set[str]:
    """ClusterQueues whose every admission check is MultiKueue's: a manager cluster's dispatch
    queues, whose workloads run on the worker clusters (and are placed by the workers' own
    flavors and quotas), never on this cluster's nodes."""
    dispatching = {c.name for c in cluster.of("AdmissionCheck") if c.spec.get("controllerName") == MULTIKUEUE_CONTROLLER}
    queues = set()
    for queue in cluster.of("ClusterQueue"):
        checks = {str(as_map(c).get("name")) for c in as_list(as_map(queue.spec.get("admissionChecksStrategy")).get("admissionChecks"))}
        checks |= {str(c) for c in as_list(queue.spec.get("admissionChecks"))}
        if checks and checks <= dispatching:
            queues.add(queue.name)
    return queues


def queue_namespaces(cluster: Cluster, queue: Obj) -> list[str]:
    """The tenant namespaces a ClusterQueue admits from (an absent selector admits none)."""
    if "namespaceSelector" not in queue.spec:
        return []
    selector = queue.spec.get("namespaceSelector")
    return cluster.namespaces_selected(selector, cluster.namespace_tenant)


def _taints(node: Obj) -> list[Mapping[str, Any]]:
    return [as_map(t) for t in as_list(node.spec.get("taints"))]


def _tainted(node: Obj, key: str, value: str) -> bool:
    return any(t.get("key") == key and t.get("value") == value and t.get("effect") in ("NoSchedule", "NoExecute") for t in _taints(node))


# --------------------------------------------------------------------------- gpu-no-cross-domain-sharing


def check_gpu_no_cross_domain_sharing(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    fleet = fleet_of(cluster)
    for node in fleet.nodes.values():
        sharing = fleet.sharing(node)
        domain = fleet.domain(node)
        if sharing is None:
            continue
        if domain is None:
            yield node.resource, (
                f"Node {node.name} shares its GPUs ({sharing}) but has no {TRUST_DOMAIN_LABEL} label: a shared GPU "
                "serves one trust domain; label and taint the node for it (ai_factory.factory.planning.placement.node_placements)."
            )
        elif not _tainted(node, TRUST_DOMAIN_LABEL, domain):
            yield node.resource, (
                f"Node {node.name} shares its GPUs ({sharing}) with trust domain {domain!r} but is not tainted "
                f"{TRUST_DOMAIN_LABEL}={domain}:NoSchedule, so pods of other trust domains can land on it."
            )
    flavor_domains: dict[str, set[str]] = {}
    remote = dispatch_queues(cluster)
    local_queues = [q for q in cluster.of("ClusterQueue", "Cohort") if not (q.kind == "ClusterQueue" and q.name in remote)]
    used_for_gpus = {name for queue in local_queues for name in gpu_flavors(queue)}
    for flavor in cluster.of("ResourceFlavor"):
        if flavor.name not in used_for_gpus:
            continue  # a CPU/memory flavor places no GPU work
        shared = [n for n in fleet.selected(as_map(flavor.spec.get("nodeLabels"))) if fleet.sharing(n)]
        domains = {fleet.domain(n) or "(none)" for n in shared}
        flavor_domains[flavor.name] = domains
        if len(domains) > 1:
            yield flavor.resource, (
                f"{flavor.describe()} selects shared-GPU nodes of trust domains {', '.join(sorted(domains))}: a flavor "
                f"of shared GPUs must pin one trust domain with its nodeLabels ({TRUST_DOMAIN_LABEL})."
            )
    for queue in (q for q in local_queues if q.kind == "ClusterQueue"):
        for namespace in queue_namespaces(cluster, queue):
            tenant = cluster.tenant_of_namespace(namespace)
            for flavor in gpu_flavors(queue):
                foreign = sorted(flavor_domains.get(flavor, set()) - {tenant.trust_domain or "(none)"})
                if foreign:
                    yield queue.resource, (
                        f"{queue.describe()} admits tenant {tenant.name!r} (trust domain {tenant.trust_domain!r}) to "
                        f"ResourceFlavor {flavor}, whose shared GPUs serve trust domain(s) {', '.join(foreign)}: give each "
                        "trust domain its own flavors (ai_factory.factory.planning.placement.offerings)."
                    )


# --------------------------------------------------------------------------- low-trust-whole-gpus


def check_low_trust_whole_gpus(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    fleet = fleet_of(cluster)
    low = {t.name: t for t in cluster.tenants.values() if t.trust == "low"}
    for quota in cluster.of("ResourceQuota"):
        tenant = cluster.tenant_of_namespace(quota.namespace)
        if tenant is None or tenant.name not in low:
            continue
        for key, value in as_map(quota.spec.get("hard")).items():
            resource = gpu_resource(str(key))
            if resource and resource.startswith(SHARED_RESOURCE_PREFIXES) and (quantity(value) or 0) > 0:
                yield quota.resource, (
                    f"{quota.describe()} gives low-trust tenant {tenant.name!r} {value} of {resource}, a share of a GPU: "
                    "low-trust tenants get whole GPUs (nvidia.com/gpu) on nodes dedicated to them."
                )
    flavors = {f.name: f for f in cluster.of("ResourceFlavor")}
    for queue in cluster.of("ClusterQueue"):
        tenants = sorted({cluster.namespace_tenant[ns] for ns in queue_namespaces(cluster, queue)} & set(low))
        for tenant in tenants:
            for name in gpu_flavors(queue):
                flavor = flavors.get(name)
                nodes = fleet.selected(as_map(flavor.spec.get("nodeLabels"))) if flavor else []
                shared = sorted(n.name for n in nodes if fleet.sharing(n))
                foreign = sorted(n.name for n in nodes if n.labels.get(DEDICATED_LABEL) != tenant)
                if shared:
                    yield queue.resource, (
                        f"{queue.describe()} gives low-trust tenant {tenant!r} ResourceFlavor {name} on shared-GPU nodes "
                        f"({', '.join(shared)}): low-trust tenants get whole GPUs only."
                    )
                elif foreign:
                    yield queue.resource, (
                        f"{queue.describe()} gives low-trust tenant {tenant!r} ResourceFlavor {name}, which selects nodes "
                        f"not dedicated to it ({', '.join(foreign)}): pin it to {DEDICATED_LABEL}={tenant} nodes."
                    )
    low_domains = {t.trust_domain or t.name: t.name for t in low.values()}
    for node in fleet.nodes.values():
        tenant = node.labels.get(DEDICATED_LABEL)
        owner = tenant if tenant in low else low_domains.get(fleet.domain(node) or "")
        sharing = fleet.sharing(node)
        if owner and sharing:
            yield node.resource, (
                f"Node {node.name} serves low-trust tenant {owner!r} but shares its GPUs ({sharing}): a low-trust "
                "tenant's nodes serve whole GPUs."
            )
        if tenant in low and not _tainted(node, DEDICATED_LABEL, str(tenant)):
            yield node.resource, (
                f"Node {node.name} is dedicated to low-trust tenant {tenant!r} but is not tainted "
                f"{DEDICATED_LABEL}={tenant}:NoSchedule, so other tenants' pods can land next to it."
            )


# --------------------------------------------------------------------------- mig-layouts-legal


def mig_entry_problems(entry: Mapping[str, Any]) -> Iterator[str]:
    devices = entry.get("devices")
    if devices != "all" and not (as_list(devices) and all(isinstance(d, int) and not isinstance(d, bool) for d in as_list(devices))):
        yield f"devices {devices!r} is neither `all` nor a list of GPU indexes"
    if not entry.get("mig-enabled"):
        return
    pci_ids = [str(p).upper() for p in ([entry["device-filter"]] if isinstance(entry.get("device-filter"), str) else as_list(entry.get("device-filter")))]
    if not pci_ids:
        yield "has no device-filter, so it could be applied to another GPU model; add the model's PCI device IDs"
        return
    models = {m.name: m for p in pci_ids for m in MODELS_BY_PCI_ID.get(p, [])}
    unknown = [p for p in pci_ids if p not in MODELS_BY_PCI_ID]
    if unknown:
        yield f"device-filter {', '.join(unknown)} is no GPU model of the catalog (factory/gpus.py)"
    counts = {str(k): v for k, v in as_map(entry.get("mig-devices")).items()}
    for model in models.values():
        yield from mig_layout_problems(model, counts)


def mig_layout_problems(model: GpuModel, counts: Mapping[str, Any]) -> Iterator[str]:
    """Why one GPU of `model` cannot hold these instances (per profile name), if it cannot."""
    if not model.mig_capable:
        yield f"{model.name} has no MIG"
        return
    classes = []
    for name, count in counts.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            yield f"count {count!r} of {name} is not a whole number"
            continue
        try:
            profile = model.profile(name)
        except KeyError as error:
            yield error.args[0]
            continue
        classes += [profile.klass] * count
    if classes and place_mig(classes) is None:
        profiles = {model.profile(n).klass: model.profile(n) for n in counts if n in {p.name for p in model.mig_profiles}}
        compute = sum(profiles[k].compute_slices for k in classes)
        memory = sum(profiles[k].memory_slices for k in classes)
        layout = ", ".join(f"{n} x{c}" for n, c in counts.items())
        yield (
            f"{layout} does not fit on one {model.name} (compute {compute}/{COMPUTE_SLICES}, memory {memory}/"
            f"{MEMORY_SLICES} slices, legal start slots and per-profile maximums; shared/reference/mig-profiles.yaml)"
        )


def check_mig_layouts_legal(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> Iterator[str]:
    for where, text in mig_parted_files(resource_type, props):
        name = describe(resource_type, props)
        document = _load_yaml(text)
        if not isinstance(as_map(document).get("mig-configs"), Mapping):
            yield f"{name}: {where} is not a mig-parted file (`version: v1` with a `mig-configs` map)."
            continue
        for config_name, entries in document["mig-configs"].items():
            seen: dict[int, int] = {}
            for i, entry in enumerate(as_list(entries)):
                entry = as_map(entry)
                for problem in mig_entry_problems(entry):
                    yield f"{name}: MIG config {config_name!r}, entry {i}: {problem}."
                for device in as_list(entry.get("devices")):
                    if device in seen:
                        yield f"{name}: MIG config {config_name!r}: GPU {device} is in entries {seen[device]} and {i}; give each GPU one layout."
                    seen.setdefault(device, i)


# --------------------------------------------------------------------------- hami-device-plugin-disjoint


def check_hami_device_plugin_disjoint(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    fleet = fleet_of(cluster)
    operator_plugin = any(
        as_map(chart.values.get("devicePlugin")).get("enabled", True) is not False
        for _, chart in chart_named(resources, "gpu-operator")
    )
    for release, selector in fleet.hami:
        if not selector:
            yield release, (
                f"{describe(release.resource_type, release.props)} runs HAMi's device plugin on every node "
                "(devicePlugin.nvidiaNodeSelector is empty): select the HAMi nodes only (ai-factory.io/hami=enabled)."
            )
            continue
        for node in fleet.nodes.values():
            if not selects({"matchLabels": selector}, node.labels):
                continue
            if operator_plugin and node.labels.get(DEVICE_PLUGIN_DEPLOY_LABEL) != "false":
                yield node.resource, (
                    f"Node {node.name} runs HAMi's device plugin and the GPU Operator's NVIDIA device plugin: two "
                    f"allocators would hand out the same GPUs; label it {DEVICE_PLUGIN_DEPLOY_LABEL}=false."
                )
            mig = node.labels.get(MIG_CONFIG_LABEL)
            if mig and mig != MIG_DISABLED_CONFIG:
                yield node.resource, (
                    f"Node {node.name} runs HAMi's device plugin and MIG Manager applies MIG config {mig} to it: "
                    "a GPU is owned by HAMi or by MIG Manager, never both."
                )


# --------------------------------------------------------------------------- gpu-namespaces-queued


def may_use_gpus(cluster: Cluster, namespace: str) -> bool:
    """A tenant namespace may use GPUs unless one of its quotas caps every GPU line it has at 0."""
    for quota in cluster.in_namespace("ResourceQuota", namespace):
        lines = [quantity(v) for k, v in as_map(quota.spec.get("hard")).items() if gpu_resource(str(k))]
        if lines and all(v == 0 for v in lines):
            return False
    return True


SCHEDULER_QUEUE_GROUPS = ("scheduling.run.ai", "scheduling.volcano.sh")
"""KAI Scheduler and Volcano: their `Queue`s hold the quotas when Kueue is not installed."""


def check_gpu_namespaces_queued(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    queues = {q.name: q for q in cluster.of("ClusterQueue")}
    kueue = bool(queues) or bool(chart_named(resources, "kueue"))
    scheduler_queues = {
        str(q.labels.get(TENANT_LABEL)) for q in cluster.of("Queue") if group_of(q.resource.resource_type) in SCHEDULER_QUEUE_GROUPS
    }
    for ns in cluster.of("Namespace"):
        tenant = cluster.namespace_tenant.get(ns.name)
        if tenant is None or not may_use_gpus(cluster, ns.name):
            continue
        local_queues = cluster.in_namespace("LocalQueue", ns.name)
        if not local_queues and (kueue or tenant not in scheduler_queues):
            queue_kind = "Kueue LocalQueue" if kueue else "queue (Kueue LocalQueue, KAI Scheduler or Volcano Queue)"
            yield ns.resource, (
                f"Namespace {ns.name} of tenant {tenant!r} may use GPUs but has no {queue_kind}: GPU work must be "
                "admitted through the tenant's queue (TenantNames.local_queue), or its quota must cap GPUs at 0."
            )
        for local in local_queues:
            target = str(local.spec.get("clusterQueue") or "")
            queue = queues.get(target)
            if queue is None:
                problem = f"points at ClusterQueue {target!r}, which this stack does not define"
            elif "namespaceSelector" not in queue.spec:
                problem = f"points at ClusterQueue {target}, which has no namespaceSelector and so admits nothing"
            elif not as_map(queue.spec.get("namespaceSelector")):
                problem = f"points at ClusterQueue {target}, which admits every namespace"
            elif not selects(queue.spec["namespaceSelector"], ns.labels):
                problem = f"points at ClusterQueue {target}, whose namespaceSelector does not select {ns.name}"
            else:
                continue
            yield local.resource, f"{local.describe()} of tenant {tenant!r} {problem}: select exactly the tenant's namespaces."
    for release, chart in chart_named(resources, "kueue"):
        text = as_map(chart.values.get("managerConfig")).get("controllerManagerConfigYaml")
        manager = as_map(_load_yaml(text))
        if manager.get("manageJobsWithoutQueueName") is not True:
            yield release, (
                f"{describe(release.resource_type, release.props)} does not set manageJobsWithoutQueueName: true in "
                "managerConfig.controllerManagerConfigYaml, so jobs without a queue name bypass Kueue's quotas."
            )


# --------------------------------------------------------------------------- gpu-quota-within-supply


def physical_mig_supply(fleet: Fleet, node_labels: Mapping[str, Any]) -> dict[str, Fraction] | None:
    """MIG instances per resource name that the mig-parted configs create on the nodes a flavor
    selects; None when the flavor selects no MIG node or a layout cannot be counted."""
    supply: dict[str, Fraction] = defaultdict(Fraction)
    nodes = [n for n in fleet.selected(node_labels) if n.labels.get(MIG_CONFIG_LABEL)]
    for node in nodes:
        entries = fleet.mig.get(str(node.labels[MIG_CONFIG_LABEL]))
        if entries is None:
            return None
        for entry in map(as_map, entries):
            devices = as_list(entry.get("devices"))
            if not entry.get("mig-enabled"):
                continue
            if not devices:
                return None  # `devices: all`: the GPU count is not in the stack
            for profile, count in as_map(entry.get("mig-devices")).items():
                supply["nvidia.com/mig-" + str(profile).replace("+", ".")] += len(devices) * (quantity(count) or 0)
    return dict(supply) if nodes else None


def flavor_supply(fleet: Fleet, flavor: Obj) -> dict[str, Fraction] | None:
    """What a flavor's nodes offer per resource: the plan's figure the flavor carries
    (`ai_factory.factory.planning.quotas.SUPPLY_ANNOTATION`), with MIG instances counted from the node configs."""
    annotation = as_map(as_map(flavor.props.get("metadata")).get("annotations")).get(SUPPLY_ANNOTATION)
    try:
        supply = {str(k): quantity(v) or Fraction(0) for k, v in json.loads(annotation).items()} if annotation else None
    except (TypeError, ValueError, AttributeError):
        supply = None
    physical = physical_mig_supply(fleet, as_map(flavor.spec.get("nodeLabels")))
    if physical is not None:
        supply = {**{k: v for k, v in (supply or {}).items() if not k.startswith("nvidia.com/mig-")}, **physical}
    return supply


def check_gpu_quota_within_supply(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    fleet = fleet_of(cluster)
    promised: dict[tuple[str, str], list[tuple[str, Fraction]]] = defaultdict(list)
    remote = dispatch_queues(cluster)  # their quota is the workers' (`factory check`'s fleet-dispatch compares them)
    for queue in cluster.of("ClusterQueue", "Cohort"):
        if queue.kind == "ClusterQueue" and queue.name in remote:
            continue
        for flavor, resource, amount in nominal_quotas(queue):
            promised[flavor, resource].append((f"{queue.kind} {queue.name}", amount))
    supplies = {f.name: (f, flavor_supply(fleet, f)) for f in cluster.of("ResourceFlavor")}
    for (flavor_name, resource), parts in sorted(promised.items()):
        flavor, supply = supplies.get(flavor_name, (None, None))
        if supply is None:
            continue  # no supply figure: nothing to compare with
        total, available = sum(a for _, a in parts), supply.get(resource, Fraction(0))
        if total > available:
            who = ", ".join(f"{q}: {_number(a)}" for q, a in parts)
            yield flavor.resource, (
                f"ResourceFlavor {flavor_name}: queues promise {_number(total)} {resource} ({who}) but its nodes supply "
                f"{_number(available)}: nominal quotas above supply admit work that can never run; quota at most what the "
                "plan created (factory/quotas.py)."
            )
    # Tenant quotas: each tenant's line against its own trust domain's supply. Lines are ceilings
    # (grant plus what the tenant's queue may borrow in its domain's cohort), so their sum across
    # tenants legitimately exceeds the fleet; no single one may exceed what its domain has.
    if all(s is None for _, s in supplies.values()):
        return  # no flavor carries a supply (no Kueue): nothing to compare with
    domain_supplies: dict[str, list[dict[str, Fraction] | None]] = defaultdict(list)
    for flavor, supply in supplies.values():
        domain = flavor_domain(flavor)
        if domain:
            domain_supplies[domain].append(supply)
    for quota in cluster.of("ResourceQuota"):
        tenant = cluster.tenant_of_namespace(quota.namespace)
        if tenant is None:
            continue
        domain = tenant.trust_domain or tenant.name
        known = domain_supplies.get(domain, [])
        if any(s is None for s in known):
            continue  # a flavor of the domain without a supply figure
        for key, value in sorted(as_map(quota.spec.get("hard")).items()):
            resource, amount = gpu_resource(str(key)), quantity(value)
            if not resource or not amount:
                continue
            available = sum((s.get(resource, Fraction(0)) for s in known if s is not None), Fraction(0))
            if amount > available:
                yield quota.resource, (
                    f"ResourceQuota {quota.namespace}/{quota.name} of tenant {tenant.name!r} allows {_number(amount)} {resource} "
                    f"but the flavors of its trust domain {domain!r} supply {_number(available)}: a tenant can be admitted at "
                    "most its domain's GPUs (grant plus borrowing, ai_factory.factory.planning.quotas.gpu_ceiling)."
                )


def flavor_domain(flavor: Obj) -> str | None:
    """The trust domain a ResourceFlavor serves: its trust-domain label, else its nodeLabels'."""
    value = flavor.labels.get(TRUST_DOMAIN_LABEL) or as_map(flavor.spec.get("nodeLabels")).get(TRUST_DOMAIN_LABEL)
    return str(value) if value else None


def _number(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


POLICIES = [
    stack_policy(
        "gpu-no-cross-domain-sharing",
        "A shared GPU (MIG, HAMi, time-slicing) serves one trust domain: its node is labelled and tainted for it, "
        "and only that domain's queues reach it.",
        check_gpu_no_cross_domain_sharing,
    ),
    stack_policy(
        "low-trust-whole-gpus",
        "Low-trust tenants get whole GPUs only, on nodes dedicated and tainted for them.",
        check_low_trust_whole_gpus,
    ),
    resource_policy(
        "mig-layouts-legal",
        "Every MIG layout is legal for its GPU model and restricted to it by a device filter.",
        check_mig_layouts_legal,
    ),
    stack_policy(
        "hami-device-plugin-disjoint",
        "HAMi's device plugin never runs on a node served by the NVIDIA device plugin or MIG Manager.",
        check_hami_device_plugin_disjoint,
    ),
    stack_policy(
        "gpu-namespaces-queued",
        "Every tenant namespace that may use GPUs has a LocalQueue on a ClusterQueue selecting it (without Kueue, a "
        "KAI Scheduler or Volcano queue of its tenant), and Kueue manages jobs without a queue name.",
        check_gpu_namespaces_queued,
        tenant_local=True,
    ),
    stack_policy(
        "gpu-quota-within-supply",
        "Queue quotas per flavor never exceed the GPUs the fleet supplies, and no tenant's quota exceeds the GPUs "
        "of its trust domain's flavors.",
        check_gpu_quota_within_supply,
    ),
]
