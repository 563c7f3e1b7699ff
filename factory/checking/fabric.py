"""Offline checks of the fast path (`components/network.py`), shared by `factory check` (over a
render) and the CrossGuard pack (`policies/aif_policies/fabric.py`, over a stack):

* `fabric-keys`: every tenant network (a NetworkAttachmentDefinition of type `ib-sriov`, `sriov`,
  or `vlan` for a VPC) carries a partition key within the 15-bit range and not the default 0x7fff,
  or a VLAN within 2-4094; no two namespaces share a partition key, a VLAN on one RoCE fabric (the
  sites of the nodes its SR-IOV resource comes from), nor a VLAN on one uplink;
* `fabric-attachments`: every RDMA network lives in a tenant's namespace; no object of a tenant
  names a network of another namespace (`k8s.v1.cni.cncf.io/networks`, short or JSON form) or
  replaces its pod network; the admission policy that refuses those forms is there, enforcing;
* `fabric-node-policies`: every NicNodePolicy and SriovNetworkNodePolicy selects exactly the nodes
  of one pool, and no SR-IOV policy hides its VFs' NUMA node (GPU-NIC alignment); the
  NicClusterPolicy exposes no devices cluster-wide;
* `fabric-claims`: a DRA claim (ResourceClaim or ResourceClaimTemplate) asking for GPUs and RDMA
  VFs constrains them all to one PCIe root (`matchAttribute` on `resource.kubernetes.io/pcieRoot`,
  which both drivers publish), and configures its VFs with networks of its own namespace only.

The rules read plain objects (`Item`): each caller wraps its own and gets back (its handle, message).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.tree import maps_within
from ai_factory.factory.model.tenancy import LABEL_PREFIX, TENANT_LABEL

if TYPE_CHECKING:
    from ai_factory.factory.checking.oracles import Oracles
    from ai_factory.factory.rendering.bundle import Rendered

POOL_LABEL = f"{LABEL_PREFIX}/pool"
SITE_LABEL = f"{LABEL_PREFIX}/site"
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
DEFAULT_NETWORK_ANNOTATION = "v1.multus-cni.io/default-network"
RESOURCE_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"
ADMISSION_POLICY = "tenant-secondary-networks"
SHORT_FORM_RULE = "networks-in-own-namespace"
DEFAULT_NETWORK_RULE = "no-default-network-override"
FIXED_NETWORKS_RULE = "networks-fixed-after-create"
IB_KUBERNETES_ACCOUNT = "ib-kubernetes"
"""The service account the Network Operator runs ib-kubernetes as: it patches each InfiniBand pod's
networks annotation with the pod's GUID, the one writer the admission policy lets change it."""
PKEY_DEFAULT = 0x7FFF
RDMA_TYPES = ("ib-sriov", "sriov", "vlan")
"""Tenant networks kept apart by a key: InfiniBand partition, SR-IOV VLAN, a VPC's hand-over VLAN."""
NODE_POLICY_KINDS = ("NicNodePolicy", "SriovNetworkNodePolicy")
GPU_DRA_DRIVER = "gpu.nvidia.com"
SRIOV_DRA_DRIVER = "sriovnetwork.k8snetworkplumbingwg.io"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
"""The standard attribute (KEP-5491) of a device's PCIe root complex, published by the NVIDIA GPU and
the SR-IOV DRA drivers alike: the one both sides of a GPU-NIC pair can be matched on."""
CHART_DEVICE_CLASSES = {"gpu.nvidia.com": GPU_DRA_DRIVER, "mig.nvidia.com": GPU_DRA_DRIVER, "vfio.gpu.nvidia.com": GPU_DRA_DRIVER}
"""DeviceClasses the GPU driver's chart installs (not in a render): by name, their driver."""
CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
DEVICE_PLUGINS = ("rdmaSharedDevicePlugin", "sriovDevicePlugin")


@dataclass(frozen=True)
class Item:
    kind: str
    obj: Mapping[str, Any]
    """The whole object (metadata, spec)."""
    handle: Any
    """What the caller reports a problem on."""

    @property
    def metadata(self) -> Mapping[str, Any]:
        return _map(self.obj.get("metadata"))

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str | None:
        return self.metadata.get("namespace")

    @property
    def labels(self) -> Mapping[str, Any]:
        return _map(self.metadata.get("labels"))

    @property
    def spec(self) -> Mapping[str, Any]:
        return _map(self.obj.get("spec"))

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}" if self.namespace else f"{self.kind}/{self.name}"


Problem = tuple[Any, str]


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) else ()


def cni_plugin(nad: Item) -> tuple[Mapping[str, Any] | None, str | None]:
    """The RDMA plugin entry of a NetworkAttachmentDefinition's CNI config (a single plugin or a
    `plugins` list), or (None, why it cannot be read)."""
    try:
        config = json.loads(nad.spec.get("config") or "")
    except (TypeError, ValueError):
        return None, "its spec.config is not a JSON CNI configuration"
    entries = [config, *_list(_map(config).get("plugins"))]
    found = [e for e in entries if isinstance(e, Mapping) and e.get("type") in RDMA_TYPES]
    return (found[0], None) if found else (None, None)


def parse_pkey(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value, 16) if value.lower().startswith("0x") else int(value)
        except ValueError:
            return None
    return None


def pkey_problem(value: Any) -> str | None:
    if value is None:
        return "no partition key: its pods join the default partition 0x7fff, with every port of the fabric"
    pkey = parse_pkey(value)
    if pkey is None:
        return f"partition key {value!r} is not a number"
    if pkey == PKEY_DEFAULT:
        return "partition key 0x7fff is the default partition, of which every port is a member"
    if not 1 <= pkey < PKEY_DEFAULT:
        return f"partition key {value!r} is outside the 15-bit keys 0x0001-0x7ffe"
    return None


def vlan_problem(value: Any) -> str | None:
    if value in (None, 0):
        return "no VLAN: its VFs are untagged, on the fabric's native VLAN with every other untagged port"
    if not isinstance(value, int) or isinstance(value, bool) or not 2 <= value <= 4094:
        return f"VLAN {value!r} is outside 2-4094"
    return None


def rdma_networks(items: Iterable[Item]) -> Iterator[tuple[Item, Mapping[str, Any] | None, str | None]]:
    for nad in items:
        if nad.kind == "NetworkAttachmentDefinition":
            plugin, unreadable = cni_plugin(nad)
            if plugin is not None or unreadable:
                yield nad, plugin, unreadable


def matches(node_selector: Any, labels: Mapping[str, Any]) -> bool:
    """A `nodeSelector` map (every key equal); an empty map selects every node."""
    return all(labels.get(k) == v for k, v in _map(node_selector).items())


def _resource_sites(items: list[Item], nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, set[str]]:
    """SR-IOV resource name (without prefix) -> the sites of the nodes its policies select."""
    sites: dict[str, set[str]] = defaultdict(set)
    for policy in items:
        if policy.kind == "SriovNetworkNodePolicy":
            for labels in nodes.values():
                if matches(policy.spec.get("nodeSelector"), labels) and labels.get(SITE_LABEL):
                    sites[str(policy.spec.get("resourceName"))].add(str(labels[SITE_LABEL]))
    return sites


def key_problems(items: Iterable[Item], nodes: Mapping[str, Mapping[str, Any]]) -> Iterator[Problem]:
    items = list(items)
    resource_sites = _resource_sites(items, nodes)
    pkeys: dict[int, list[Item]] = defaultdict(list)
    vlans: dict[tuple[str, int], list[Item]] = defaultdict(list)
    for nad, plugin, unreadable in rdma_networks(items):
        if unreadable:
            yield nad.handle, unreadable
            continue
        if plugin.get("type") == "vlan":
            problem = vlan_problem(plugin.get("vlanId"))
            if problem:
                yield nad.handle, problem
            else:
                vlans[f"uplink {plugin.get('master')}", plugin["vlanId"]].append(nad)
            continue
        if plugin.get("type") == "ib-sriov":
            problem = pkey_problem(plugin.get("pkey"))
            if problem:
                yield nad.handle, problem
            else:
                pkeys[parse_pkey(plugin["pkey"])].append(nad)
        else:
            problem = vlan_problem(plugin.get("vlan"))
            if problem:
                yield nad.handle, problem
                continue
            resource = str(_map(nad.metadata.get("annotations")).get(RESOURCE_ANNOTATION, "")).rsplit("/", 1)[-1]
            for fabric in sorted(resource_sites.get(resource) or {f"resource {resource or '(none)'}"}):
                vlans[fabric, plugin["vlan"]].append(nad)
    for pkey, holders in sorted(pkeys.items()):
        yield from _shared(holders, f"partition key {pkey:#06x}")
    for (fabric, vlan), holders in sorted(vlans.items()):
        yield from _shared(holders, f"VLAN {vlan} on {fabric}" if fabric.startswith("uplink ") else f"VLAN {vlan} on the RoCE fabric of {fabric}")


def _shared(holders: list[Item], what: str) -> Iterator[Problem]:
    namespaces = sorted({str(h.namespace) for h in holders})
    if len(namespaces) > 1:
        for h in holders:
            others = [n for n in namespaces if n != h.namespace]
            yield h.handle, f"{what} is also the key of network(s) in namespace(s) {', '.join(others)}: their pods reach each other"


def network_references(value: Any) -> list[tuple[str | None, str]] | None:
    """(namespace or None, name) of each network an annotation names; None when unreadable."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.startswith("["):
        try:
            listed = json.loads(text)
        except ValueError:
            return None
        if not isinstance(listed, list) or not all(isinstance(e, Mapping) for e in listed):
            return None
        return [(e.get("namespace"), str(e.get("name"))) for e in listed]
    found = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        namespace, _, name = entry.rpartition("/")
        found.append((namespace or None, name.split("@", 1)[0]))
    return found


def _annotation_sets(node: Any) -> Iterator[Mapping[str, Any]]:
    """Every `metadata.annotations` of an object and of the pod templates it holds, outermost first."""
    for value in maps_within(node):
        if annotations := _map(_map(value.get("metadata")).get("annotations")):
            yield annotations


def attachment_problems(items: Iterable[Item], tenant_of: Callable[[str | None], str | None]) -> Iterator[Problem]:
    items = list(items)
    networks = list(rdma_networks(items))
    for nad, _, _ in networks:
        if tenant_of(nad.namespace) is None:
            yield nad.handle, "an RDMA network outside every tenant's namespace: whoever may attach it shares its partition or VLAN"
    for item in items:
        tenant = tenant_of(item.namespace)
        if tenant is None:
            continue
        for notes in _annotation_sets(item.obj):
            if DEFAULT_NETWORK_ANNOTATION in notes:
                yield item.handle, f"tenant {tenant}'s pods replace their pod network ({DEFAULT_NETWORK_ANNOTATION})"
            if NETWORKS_ANNOTATION not in notes:
                continue
            references = network_references(notes[NETWORKS_ANNOTATION])
            if references is None:
                yield item.handle, f"its {NETWORKS_ANNOTATION} annotation cannot be read as a list of networks"
                continue
            for namespace, name in references:
                if namespace not in (None, item.namespace):
                    yield item.handle, f"tenant {tenant}'s pods attach network {namespace}/{name}, of another namespace"
    if networks and any(tenant_of(n.namespace) for n, _, _ in networks):
        policy = next((i for i in items if i.kind == "ClusterPolicy" and i.name == ADMISSION_POLICY), None)
        rules = {str(_map(r).get("name")): _map(r) for r in _list(policy.spec.get("rules"))} if policy else {}
        missing = [
            rule for rule in (SHORT_FORM_RULE, DEFAULT_NETWORK_RULE, FIXED_NETWORKS_RULE)
            if _map(rules.get(rule, {}).get("validate")).get("failureAction") != "Enforce"
        ]
        if policy is None or missing or policy.spec.get("failurePolicy") != "Fail":
            what = "is missing" if policy is None else f"does not enforce {', '.join(missing) or 'failing closed (failurePolicy Fail)'}"
            handle = policy.handle if policy else networks[0][0].handle
            yield handle, f"tenants have RDMA networks but the admission policy {ADMISSION_POLICY} {what}: a pod could name another tenant's network"
        for name, rule in sorted(rules.items()):
            for reach in exemption_problems(rule.get("exclude"), tenant_of):
                yield policy.handle, f"rule {name} exempts {reach}: only ib-kubernetes' own service account may change a pod's networks"


def exemption_problems(exclude: Any, tenant_of: Callable[[str | None], str | None]) -> Iterator[str]:
    """What an admission rule's `exclude` lets through beyond ib-kubernetes' service account in a
    platform namespace: another subject, a role, a wildcard, or a tenant's namespace (where a
    tenant can create a service account of that name)."""
    if exclude is None:
        return
    blocks = _list(_map(exclude).get("any"))
    if set(_map(exclude)) - {"any"} or not blocks:
        yield f"requests by {json.dumps(exclude, sort_keys=True)}"
        return
    for block in map(_map, blocks):
        subjects = _list(block.get("subjects"))
        if set(block) - {"subjects"} or not subjects:
            yield f"requests matching {json.dumps(dict(block), sort_keys=True)}"
            continue
        for subject in map(_map, subjects):
            namespace = subject.get("namespace")
            if subject.get("kind") != "ServiceAccount" or subject.get("name") != IB_KUBERNETES_ACCOUNT or not isinstance(namespace, str):
                yield f"{subject.get('kind')} {subject.get('namespace', '')}/{subject.get('name')}"
            elif any(c in namespace for c in "*?") or tenant_of(namespace) is not None:
                yield f"service account {IB_KUBERNETES_ACCOUNT} of namespace {namespace}, which a tenant can create"


def selector_problems(items: Iterable[Item], nodes: Mapping[str, Mapping[str, Any]]) -> Iterator[Problem]:
    pools: dict[str, set[str]] = defaultdict(set)
    for node, labels in nodes.items():
        if labels.get(POOL_LABEL):
            pools[str(labels[POOL_LABEL])].add(node)
    for policy in items:
        if policy.kind == "NicClusterPolicy":
            for plugin in DEVICE_PLUGINS:
                if plugin in policy.spec:
                    yield policy.handle, f"exposes devices cluster-wide ({plugin}): devices are a pool's, in its NicNodePolicy"
        if policy.kind not in NODE_POLICY_KINDS:
            continue
        if policy.kind == "SriovNetworkNodePolicy" and policy.spec.get("excludeTopology") is True:
            yield policy.handle, "excludeTopology hides its VFs' NUMA node: the Topology Manager cannot put them next to the pod's GPUs"
        selector = policy.spec.get("nodeSelector")
        if not _map(selector):
            yield policy.handle, "has no nodeSelector: it configures every node's NICs, not one pool's"
            continue
        selected = {n for n, labels in nodes.items() if matches(selector, labels)}
        if not selected:
            yield policy.handle, "its nodeSelector selects no node of the fleet"
            continue
        of_pools = sorted({str(nodes[n].get(POOL_LABEL)) for n in selected})
        if len(of_pools) > 1:
            yield policy.handle, f"selects nodes of several pools ({', '.join(of_pools)}), not exactly one pool's"
        elif selected != pools.get(of_pools[0], set()):
            missing = sorted(pools.get(of_pools[0], set()) - selected)
            yield policy.handle, f"selects {len(selected)} of pool {of_pools[0]}'s nodes; left out: {', '.join(missing) or 'none'}"


def class_drivers(items: Iterable[Item]) -> dict[str, str]:
    """DeviceClass name -> the DRA driver its selectors require (GPU or SR-IOV), for the classes a
    claim may name: the chart's, and those of the render."""
    drivers = dict(CHART_DEVICE_CLASSES)
    for item in items:
        if item.kind != "DeviceClass":
            continue
        expressions = " ".join(str(_map(_map(s).get("cel")).get("expression", "")) for s in _list(item.spec.get("selectors")))
        for driver in (GPU_DRA_DRIVER, SRIOV_DRA_DRIVER):
            if f"device.driver == '{driver}'" in expressions or f'device.driver == "{driver}"' in expressions:
                drivers[item.name] = driver
    return drivers


def claim_devices(item: Item) -> Mapping[str, Any]:
    """`spec.devices` of a claim, `spec.spec.devices` of a template."""
    spec = _map(item.spec.get("spec")) if item.kind == "ResourceClaimTemplate" else item.spec
    return _map(spec.get("devices"))


def alignment_problems(items: Iterable[Item]) -> Iterator[Problem]:
    items = list(items)
    drivers = class_drivers(items)
    for claim in (i for i in items if i.kind in CLAIM_KINDS):
        devices = claim_devices(claim)
        by_driver: dict[str, list[str]] = defaultdict(list)
        for request in map(_map, _list(devices.get("requests"))):
            # v1 nests the class under `exactly`; v1beta1 has it on the request.
            device_class = _map(request.get("exactly")).get("deviceClassName") or request.get("deviceClassName")
            if device_class in drivers:
                by_driver[drivers[device_class]].append(str(request.get("name")))
        gpus, nics = by_driver.get(GPU_DRA_DRIVER, []), by_driver.get(SRIOV_DRA_DRIVER, [])
        if gpus and nics:
            paired = set(gpus + nics)
            aligned = any(
                c.get("matchAttribute") == PCIE_ROOT and (not _list(c.get("requests")) or paired <= set(map(str, _list(c.get("requests")))))
                for c in map(_map, _list(devices.get("constraints")))
            )
            if not aligned:
                yield claim.handle, (f"GPU request(s) {', '.join(gpus)} and RDMA VF request(s) {', '.join(nics)} are not constrained to one PCIe root "
                                     f"(a constraint matchAttribute {PCIE_ROOT} over all of them): the VF may sit on another NUMA node than the GPU")
        for entry in map(_map, _list(devices.get("config"))):
            opaque = _map(entry.get("opaque"))
            if opaque.get("driver") != SRIOV_DRA_DRIVER:
                continue
            network_ns = _map(opaque.get("parameters")).get("netAttachDefNamespace")
            if network_ns not in (None, "", claim.namespace):
                name = _map(opaque.get("parameters")).get("netAttachDefName")
                yield claim.handle, f"configures its VFs with network {network_ns}/{name}, of another namespace"


# --------------------------------------------------------------------------- over a render


def _items(rendered: Rendered) -> list[Item]:
    return [Item(m.kind, m.obj, m) for m in rendered.manifests]


def _nodes(items: Iterable[Item]) -> dict[str, Mapping[str, Any]]:
    return {i.name: i.labels for i in items if i.kind == "Node"}


def _findings(check: str, problems: Iterable[Problem], tenant_of: Callable[[str | None], str | None]) -> Iterator[Finding]:
    for manifest, message in problems:
        tenant = manifest.tenant or tenant_of(manifest.namespace)
        yield Finding(check, manifest.ref, message, (tenant,) if tenant else ())


def _tenant_namespaces(items: Iterable[Item]) -> Callable[[str | None], str | None]:
    owners = {i.name: str(i.labels[TENANT_LABEL]) for i in items if i.kind == "Namespace" and i.labels.get(TENANT_LABEL)}
    return lambda namespace: owners.get(namespace or "")


def fabric_keys(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    items = _items(rendered)
    return _findings("fabric-keys", key_problems(items, _nodes(items)), _tenant_namespaces(items))


def fabric_attachments(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    items = _items(rendered)
    tenant_of = _tenant_namespaces(items)
    return _findings("fabric-attachments", attachment_problems(items, tenant_of), tenant_of)


def nic_policies_select_pools(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    items = _items(rendered)
    return _findings("fabric-node-policies", selector_problems(items, _nodes(items)), _tenant_namespaces(items))


def claims_aligned(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    items = _items(rendered)
    return _findings("fabric-claims", alignment_problems(items), _tenant_namespaces(items))
