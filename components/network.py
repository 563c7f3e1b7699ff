"""The fast path: the NVIDIA Network Operator on the RDMA pools (RoCE, InfiniBand), with Multus,
nv-ipam, ib-kubernetes and, per pool, SR-IOV virtual functions or shared RDMA devices; each
tenant's RDMA networks in its own namespace, on its own partition key or VLAN.

Installed only when a pool's `topology.fabric` is `roce` or `infiniband` (a fleet of Ethernet pools
installs none of it). From the chart (`network-operator` 26.4.1): the operator, and its bundled SR-IOV
Network Operator when a pool exposes SR-IOV (NVIDIA's build, images of the same release: the
standalone sriov-network-operator chart is not installed beside it, two operators would fight over
the same policies). Node Feature Discovery is the GPU Operator's when that layer is on.

Cluster-wide (`NicClusterPolicy`, the one named `nic-cluster-policy` the operator acts on): Multus
and the container network plugins, nv-ipam, and ib-kubernetes when an InfiniBand pool exposes
SR-IOV, on every GPU node (whatever the tenants, so that a tenant's arrival or removal never
changes it). The fleet layer labels RDMA nodes `ai-factory.io/rdma: sriov|rdma-shared`.

Per pool, selecting exactly its nodes (`ai-factory.io/pool: <pool>`): a `SriovNetworkNodePolicy`
cutting each NIC of its NUMA topology into `vfs_per_nic` RDMA virtual functions (resource
`nvidia.com/<pool>_vf`), or a `NicNodePolicy` running the RDMA shared device plugin over those
NICs (resource `rdma/<pool>_shared`); plus, with `driver: doca`, a `NicNodePolicy` running the
DOCA-OFED driver container.

Per tenant network (the plan's `networks`, `ai_factory.factory.planning.fabric`): through the
tenant hook, a `NetworkAttachmentDefinition` `rdma-<pool>` in the tenant's namespace, `ib-sriov`
with the tenant's partition key (ib-kubernetes adds each pod's GUID to it through UFM) or `sriov`
with its VLAN (set on the VF by the NIC's embedded switch, out of the pod's reach); from the
platform, its addresses: an nv-ipam `IPPool` of its own in the operator's namespace, where nv-ipam
reads pools, labelled `ai-factory.io/serves-tenant`.

Admission (`tenant-secondary-networks`, Kyverno): a tenant pod names networks only in the short
form (`name[@interface]`, comma-separated), which Multus resolves in the pod's own namespace: no
`namespace/name`, no JSON form (whose `namespace` would name another tenant's), and never
`v1.multus-cni.io/default-network`; neither annotation changes once the pod exists (ib-kubernetes
would add the pod's GUID to whatever partition an edited annotation named), except by ib-kubernetes
itself, which writes the GUIDs there: its service account, by exact name in this layer's namespace,
is the one exemption. Tenants cannot create NetworkAttachmentDefinitions (their RBAC lists none),
so a tenant's namespace only holds its own networks.

GPU-NIC alignment: the SR-IOV and RDMA device plugins report each device's NUMA node, as the GPU
device plugin does, and the kubelet's Topology Manager (`single-numa-node` or `restricted` policy,
`pod` scope: node configuration of the provisioning layer) admits a pod only with its GPUs and
NICs on one NUMA node. On pools whose GPUs DRA allocates (`sharing: dra`) the Topology Manager sees
no GPU, so the VFs are DRA devices too: the bundled SR-IOV operator runs its DRA driver
(`sriovnetwork.k8snetworkplumbingwg.io`, feature gate `dynamicResourceAllocation`), a DeviceClass
`<pool>-rdma-vf` selects the pool's VFs, and each tenant with a network there gets a
ResourceClaimTemplate `<pool>-gpu-rdma`: one whole GPU and one VF constrained to one PCIe root
(`matchAttribute: resource.kubernetes.io/pcieRoot`, the standard attribute both drivers publish;
the same root implies the same NUMA node), the VF configured with the tenant's own network. A pod
takes one such claim per GPU. The gate is the operator's, for all its pools: it is set only when
every SR-IOV pool is a DRA pool; a fleet mixing both keeps the device plugin, and its DRA pools get
no alignment (README, "Fast path"). The `fabric-claims` check flags a claim pairing GPUs and NICs
without that constraint.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Mapping

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import POOL_LABEL, FactoryComponent, helm_release, labels, namespace, tenant_items
from ai_factory.components.gpu_operator import tolerations
from ai_factory.components.kyverno import POD_KINDS, TENANT_NAMESPACES, _policy_spec, _rule
from ai_factory.components.dra import whole_gpu_class
from ai_factory.components.registry import Layer
from ai_factory.factory.checking import fabric as fabric_checks
from ai_factory.factory.checking.fabric import (
    ADMISSION_POLICY,
    DEFAULT_NETWORK_ANNOTATION,
    DEFAULT_NETWORK_RULE,
    FIXED_NETWORKS_RULE,
    IB_KUBERNETES_ACCOUNT,
    NETWORKS_ANNOTATION,
    PCIE_ROOT,
    RESOURCE_ANNOTATION,
    SHORT_FORM_RULE,
    SRIOV_DRA_DRIVER,
)
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig, Tenant, TenantVpc
from ai_factory.factory.model.raw import as_dict, as_list
from ai_factory.factory.model.tenancy import SERVES_TENANT_LABEL, TenantNames
from ai_factory.factory.planning.fabric import INFINIBAND, TenantFabricNetwork
from ai_factory.factory.planning.from_config import RDMA_FABRICS, is_rdma_pool
from ai_factory.factory.planning.model import WHOLE_GPU, Plan

TOKEN = "ai-factory:network:FastPath"
RELEASE = "network-operator"
IMAGE_REPOSITORY = "nvcr.io/nvidia/mellanox"
"""Where the chart's own release takes its images (`sriov-network-operator.images`)."""
NIC_CLUSTER_POLICY = "nic-cluster-policy"
"""The only name the operator acts on."""
SRIOV_RESOURCE_PREFIX = "nvidia.com"
"""The bundled SR-IOV operator's resource prefix (chart default `sriov-network-operator.operator.resourcePrefix`)."""
RDMA_SHARED_PREFIX = "rdma"
"""The RDMA shared device plugin's default resource prefix."""
RDMA_HCA_MAX = 63
"""Pods sharing one RDMA device at most (the plugin's `rdmaHcaMax`)."""
MELLANOX_VENDOR = "15b3"
"""PCI vendor of NVIDIA (Mellanox) NICs: what a pool whose topology names no NIC exposes, all of them."""
GUID_POOL = ("02:00:00:00:00:00:00:00", "02:FF:FF:FF:FF:FF:FF:FF")
"""ib-kubernetes' GUID pool (its default range)."""
NAD_API = "k8s.cni.cncf.io/v1"
VPC_ANNOTATION = "ai-factory.io/vpc"
"""On a VPC's network: `<kind>:<vni>`, what the external fabric manager maps its VLAN to."""
CNI_VERSION = "0.3.1"
FORBIDDEN_IN_SHORT_FORM = ("/", "[", "{")
"""Characters of the cross-namespace (`ns/name`) and JSON forms (JSON escapes need the JSON form)."""


def sriov_resource(pool: str) -> str:
    """The SR-IOV resource name of a pool's VFs (letters, digits and `_` only)."""
    return f"{pool.replace('-', '_')}_vf"


def shared_resource(pool: str) -> str:
    return f"{pool.replace('-', '_')}_shared"


def network_name(pool: str) -> str:
    """The NetworkAttachmentDefinition a tenant's pods name to join its network on `pool`."""
    return f"rdma-{pool}"


def vf_device_class(pool: str) -> str:
    """The DeviceClass of a DRA pool's RDMA virtual functions."""
    return f"{pool}-rdma-vf"


def paired_claim_template(pool: str) -> str:
    """The ResourceClaimTemplate of one GPU and one VF on one PCIe root, in a tenant's namespace."""
    return f"{pool}-gpu-rdma"


def vf_selector(pool: str) -> str:
    """CEL: a VF of the SR-IOV DRA driver advertised for the pool's SriovNetworkNodePolicy (the
    operator labels each with its extended resource name, `k8s.cni.cncf.io/resourceName`)."""
    return (f"device.driver == '{SRIOV_DRA_DRIVER}' && "
            f"device.attributes['k8s.cni.cncf.io'].resourceName == '{SRIOV_RESOURCE_PREFIX}/{sriov_resource(pool)}'")


def ip_pool_name(tenant: str, pool: str) -> str:
    """`<tenant>.rdma-<pool>`: a dot never is in a tenant's name, so no two tenants' names meet."""
    return f"{tenant}.rdma-{pool}"


@dataclass(frozen=True)
class RdmaPool:
    name: str
    fabric: str
    """`roce` or `infiniband`."""
    devices: str
    """`sriov` or `rdma-shared`."""
    nics: tuple[str, ...]
    """Every NIC of the pool's NUMA topology, by NUMA node then as listed; none: every NVIDIA NIC."""
    vfs_per_nic: int
    gpu_model: str = ""
    dra: bool = False
    """Its GPUs and its VFs are DRA devices: claims pair them on one PCIe root."""


def vf_class_ceilings(cfg: FactoryConfig, plan: Plan, tenant: str, gpu_ceilings: Mapping[tuple[str, str], int], offering_pools: Mapping[str, str]) -> dict[str, int]:
    """The tenant quota's line per VF DeviceClass: as many VFs as it may hold GPUs on the pool
    (one per pair) where it has a network, 0 elsewhere (a VF claimed without its network would
    carry no partition key or VLAN)."""
    networks = {n.pool for n in plan.networks if n.tenant == tenant}
    ceilings = dict.fromkeys((vf_device_class(p) for p in sorted(dra_vf_pools(cfg))), 0)
    for (offering, resource), count in gpu_ceilings.items():
        pool = offering_pools.get(offering)
        if pool in networks and vf_device_class(pool) in ceilings and resource == WHOLE_GPU:
            ceilings[vf_device_class(pool)] += count
    return ceilings


def dra_vf_pools(cfg: FactoryConfig) -> frozenset[str]:
    """The DRA pools whose VFs the SR-IOV DRA driver serves: those exposing SR-IOV, when every pool
    exposing SR-IOV is one (the operator's `dynamicResourceAllocation` gate is for all its pools)."""
    sriov = [p for p in cfg.fleet.pools if is_rdma_pool(p) and p.network.devices == "sriov"]
    if not sriov or any(p.sharing != "dra" for p in sriov):
        return frozenset()
    return frozenset(p.name for p in sriov)


@dataclass(frozen=True)
class TenantVpcAttachment:
    """A tenant's VPC handed over on a VLAN of its pools' nodes (`tenants[].network.vpc`)."""

    tenant: str
    vpc: TenantVpc
    pools: tuple[str, ...]
    """The pools the tenant's pods run on: where the uplink must carry the VPC's VLAN."""

    @property
    def network(self) -> str:
        return f"vpc-{self.vpc.name}"

    @property
    def ip_pool(self) -> str:
        return f"{self.tenant}.vpc-{self.vpc.name}"


def vpc_attachments(cfg: FactoryConfig) -> tuple[TenantVpcAttachment, ...]:
    return tuple(
        TenantVpcAttachment(t.name, t.network.vpc, tuple(sorted({d.pool for d in t.gpus})))
        for t in sorted(cfg.tenants, key=lambda t: t.name)
        if t.network.vpc is not None
    )


@dataclass(frozen=True)
class NetworkArgs:
    chart: ChartSource
    namespace: str
    pools: tuple[RdmaPool, ...]
    driver: str
    doca_driver_version: str | None
    ufm_secret: str
    nfd: bool
    """Run the chart's Node Feature Discovery (only when the GPU Operator does not run its own)."""
    admission: bool
    """Kyverno is installed: the networks admission policy is created."""
    networks: tuple[TenantFabricNetwork, ...]
    """The plan's tenant networks: one nv-ipam pool each."""
    subnet: str
    per_node_addresses: int
    vpcs: tuple[TenantVpcAttachment, ...] = ()

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> NetworkArgs:
        layer = cfg.layers.network
        dra = dra_vf_pools(cfg)
        return cls(
            chart=layer.chart.source("network-operator"),
            namespace=layer.namespace,
            pools=tuple(
                RdmaPool(
                    name=p.name,
                    fabric=p.topology.fabric,
                    devices=p.network.devices,
                    nics=tuple(nic for domain in sorted(p.topology.numa, key=lambda d: d.node) for nic in domain.nics),
                    vfs_per_nic=p.network.vfs_per_nic,
                    gpu_model=p.gpu.model,
                    dra=p.name in dra,
                )
                for p in cfg.fleet.pools
                if is_rdma_pool(p)
            ),
            driver=layer.driver,
            doca_driver_version=layer.doca_driver_version,
            ufm_secret=layer.ufm_secret,
            nfd=not cfg.layers.gpu_operator.enabled,
            admission=cfg.layers.kyverno.enabled,
            networks=plan.networks,
            subnet=layer.subnet,
            per_node_addresses=layer.per_node_addresses,
            vpcs=vpc_attachments(cfg),
        )

    @property
    def sriov(self) -> bool:
        return any(p.devices == "sriov" for p in self.pools)

    @property
    def sriov_dra(self) -> bool:
        return any(p.dra for p in self.pools)

    @property
    def infiniband_sriov(self) -> bool:
        return any(p.devices == "sriov" and p.fabric == "infiniband" for p in self.pools)

    @property
    def image_version(self) -> str:
        """Component images of the operator's own release (the tag its chart uses)."""
        return f"network-operator-v{self.chart.version.lstrip('v')}"


def chart_values(args: NetworkArgs) -> dict[str, Any]:
    """The chart values: a pure function of the arguments, so tests can read them directly."""
    values: dict[str, Any] = {
        "nfd": {"enabled": args.nfd, "deployNodeFeatureRules": True},
        "sriovNetworkOperator": {"enabled": args.sriov},
    }
    # The bundled SR-IOV operator's config (`sriov-network-operator.sriovOperatorConfig`) keeps the
    # chart's: deployed, its daemon on a node once the node's NIC driver is ready; on a fleet whose
    # SR-IOV pools are all DRA pools, its DRA driver advertises the VFs instead of the device plugin.
    if args.sriov_dra:
        values["sriov-network-operator"] = {"sriovOperatorConfig": {"featureGates": {"dynamicResourceAllocation": True}}}
    return values


def _image(args: NetworkArgs, image: str) -> dict[str, str]:
    return {"image": image, "repository": IMAGE_REPOSITORY, "version": args.image_version}


def nic_cluster_policy(args: NetworkArgs) -> dict[str, Any]:
    # Multus and the plugins on every GPU node (pods attach RDMA networks and VPCs there): not on
    # the tenants' pools only, so that adding or removing a tenant never changes this policy.
    terms = [{"matchExpressions": [{"key": POOL_LABEL, "operator": "Exists"}]}]
    spec: dict[str, Any] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}},
        "tolerations": tolerations(),
        "secondaryNetwork": {"multus": _image(args, "multus-cni"), "cniPlugins": _image(args, "plugins")},
        "nvIpam": {**_image(args, "nvidia-k8s-ipam"), "enableWebhook": False},
    }
    if args.infiniband_sriov:
        spec["ibKubernetes"] = {
            **_image(args, "ib-kubernetes"),
            "periodicUpdateSeconds": 5,
            "pKeyGUIDPoolRangeStart": GUID_POOL[0],
            "pKeyGUIDPoolRangeEnd": GUID_POOL[1],
            "ufmSecret": args.ufm_secret,
        }
    return spec


def nic_node_policy(args: NetworkArgs, pool: RdmaPool) -> dict[str, Any] | None:
    """The pool's NicNodePolicy (DOCA driver, shared RDMA devices), None when it needs neither."""
    spec: dict[str, Any] = {"nodeSelector": {POOL_LABEL: pool.name}, "tolerations": tolerations()}
    if args.driver == "doca":
        spec["ofedDriver"] = {
            "image": "doca-driver",
            "repository": IMAGE_REPOSITORY,
            "version": args.doca_driver_version,
            # One node of the pool at a time, drained first: a driver upgrade takes its NICs down.
            "upgradePolicy": {
                "autoUpgrade": True,
                "maxParallelUpgrades": 1,
                "drain": {"enable": True, "force": True, "deleteEmptyDir": True, "timeoutSeconds": 300},
            },
        }
    if pool.devices == "rdma-shared":
        selectors = {"ifNames": list(pool.nics)} if pool.nics else {"vendors": [MELLANOX_VENDOR]}
        config = {"configList": [{"resourceName": shared_resource(pool.name), "rdmaHcaMax": RDMA_HCA_MAX, "selectors": selectors}]}
        spec["rdmaSharedDevicePlugin"] = {**_image(args, "k8s-rdma-shared-dev-plugin"), "config": json.dumps(config, sort_keys=True)}
    return spec if len(spec) > 2 else None


def sriov_node_policy(pool: RdmaPool) -> dict[str, Any]:
    return {
        "nodeSelector": {POOL_LABEL: pool.name},
        "nicSelector": {"pfNames": list(pool.nics)} if pool.nics else {"vendor": MELLANOX_VENDOR},
        "numVfs": pool.vfs_per_nic,
        "resourceName": sriov_resource(pool.name),
        "isRdma": True,
        "linkType": "ib" if pool.fabric == "infiniband" else "eth",
        "deviceType": "netdevice",
        "priority": 50,
    }


def ip_pool_spec(subnet: str, per_node: int, pools: list[str]) -> dict[str, Any]:
    return {
        "subnet": subnet,
        "perNodeBlockSize": per_node,
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": pools}]}]},
    }


def admission_policy_spec(namespace: str) -> dict[str, Any]:
    """`namespace`: the operator's, where ib-kubernetes runs."""
    annotations = "request.object.metadata.annotations"
    networks = f"{annotations}.\"{NETWORKS_ANNOTATION}\" || ''"
    tenant_pods = {"any": [{"resources": {"kinds": list(POD_KINDS), "namespaceSelector": TENANT_NAMESPACES, "operations": ["CREATE"]}}]}
    updated_tenant_pods = {"any": [{"resources": {"kinds": ["Pod"], "namespaceSelector": TENANT_NAMESPACES, "operations": ["UPDATE"]}}]}

    def changed(annotation: str) -> dict[str, Any]:
        return {
            "key": f"{{{{ request.object.metadata.annotations.\"{annotation}\" || '' }}}}",
            "operator": "NotEquals",
            "value": f"{{{{ request.oldObject.metadata.annotations.\"{annotation}\" || '' }}}}",
        }

    fixed = _rule(
        FIXED_NETWORKS_RULE,
        updated_tenant_pods,
        f"A pod's {NETWORKS_ANNOTATION} and {DEFAULT_NETWORK_ANNOTATION} are set when it is created; only ib-kubernetes adds GUIDs to them later.",
        {"deny": {"conditions": {"any": [changed(NETWORKS_ANNOTATION), changed(DEFAULT_NETWORK_ANNOTATION)]}}},
    )
    # ib-kubernetes rewrites the annotation in the JSON form with each network's GUID and partition
    # key (`cni-args`): its own service account, by exact name in the operator's namespace, where
    # tenants create nothing. A tenant's UPDATE that leaves both annotations as they are passes.
    fixed["exclude"] = {"any": [{"subjects": [{"kind": "ServiceAccount", "name": IB_KUBERNETES_ACCOUNT, "namespace": namespace}]}]}
    return _policy_spec(
        [
            _rule(
                SHORT_FORM_RULE,
                tenant_pods,
                f"Tenant pods name secondary networks in {NETWORKS_ANNOTATION} as `name` or `name@interface` only, "
                "resolved in their own namespace: no namespace/name, no JSON form.",
                {"deny": {"conditions": {"any": [{"key": f"{{{{ contains({networks}, '{c}') }}}}", "operator": "Equals", "value": True} for c in FORBIDDEN_IN_SHORT_FORM]}}},
            ),
            _rule(
                DEFAULT_NETWORK_RULE,
                tenant_pods,
                f"Tenant pods may not replace their pod network ({DEFAULT_NETWORK_ANNOTATION}).",
                {"deny": {"conditions": {"any": [{"key": f"{{{{ {annotations}.\"{DEFAULT_NETWORK_ANNOTATION}\" || '' }}}}", "operator": "NotEquals", "value": ""}]}}},
            ),
            fixed,
        ],
        # Admission only: the UPDATE rule reads who sends the request and the object before it.
        background=False,
    )


class FastPath(FactoryComponent):
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="network", opts=opts)
        ns = namespace(self, args.namespace, pod_security="privileged")
        release = helm_release(self, RELEASE, args.chart, namespace=ns.metadata.name, values=chart_values(args), depends_on=[ns])
        after = self.child(depends_on=[release])
        self._custom("nicclusterpolicy", "mellanox.com/v1alpha1", "NicClusterPolicy", NIC_CLUSTER_POLICY, None, nic_cluster_policy(args), after)
        for pool in args.pools:
            if (spec := nic_node_policy(args, pool)) is not None:
                self._custom(f"nicnodepolicy-{pool.name}", "mellanox.com/v1alpha1", "NicNodePolicy", pool.name, None, spec, after, pool.name)
            if pool.devices == "sriov":
                self._custom(
                    f"sriovpolicy-{pool.name}", "sriovnetwork.openshift.io/v1", "SriovNetworkNodePolicy", pool.name, args.namespace, sriov_node_policy(pool), after, pool.name
                )
            if pool.dra:
                k8s.resource.v1.DeviceClass(
                    self.child_name(f"deviceclass-{vf_device_class(pool.name)}"),
                    metadata=k8s.meta.v1.ObjectMetaArgs(name=vf_device_class(pool.name), labels=labels(self.layer, extra={POOL_LABEL: pool.name})),
                    spec=k8s.resource.v1.DeviceClassSpecArgs(
                        selectors=[k8s.resource.v1.DeviceSelectorArgs(cel=k8s.resource.v1.CELDeviceSelectorArgs(expression=vf_selector(pool.name)))]
                    ),
                    opts=self.child(),
                )
        # In the operator's namespace, where nv-ipam reads its pools: the platform's, each serving one tenant.
        for network in args.networks:
            spec = ip_pool_spec(args.subnet, args.per_node_addresses, [network.pool])
            self._ip_pool(ip_pool_name(network.tenant, network.pool), network.tenant, spec, args.namespace, after, network.pool)
        for vpc in args.vpcs:
            self._ip_pool(vpc.ip_pool, vpc.tenant, ip_pool_spec(vpc.vpc.subnet, args.per_node_addresses, list(vpc.pools)), args.namespace, after)
        if args.admission:
            self._custom("admission", "kyverno.io/v1", "ClusterPolicy", ADMISSION_POLICY, None, admission_policy_spec(args.namespace), self.child())
        self.namespace = ns.metadata.name
        self.register_outputs({"namespace": self.namespace})

    def _ip_pool(self, name: str, tenant: str, spec: dict, ns: str, opts: pulumi.ResourceOptions, pool: str | None = None) -> None:
        extra = {SERVES_TENANT_LABEL: tenant, **({POOL_LABEL: pool} if pool else {})}
        pool_resource = k8s.apiextensions.CustomResource(
            self.child_name(f"ippool-{name}"),
            api_version="nv-ipam.nvidia.com/v1alpha1",
            kind="IPPool",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=ns, labels=labels(self.layer, extra=extra)),
            spec=spec,
            opts=opts,
        )
        self.serves([tenant], pool_resource)  # only its tenant's networks allocate from it

    def _custom(self, suffix: str, api_version: str, kind: str, name: str, ns: str | None, spec: dict, opts: pulumi.ResourceOptions, pool: str | None = None) -> None:
        k8s.apiextensions.CustomResource(
            self.child_name(suffix),
            api_version=api_version,
            kind=kind,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=ns, labels=labels(self.layer, extra={POOL_LABEL: pool} if pool else None)),
            spec=spec,
            opts=opts,
        )


# --------------------------------------------------------------------------- per tenant


def cni_config(network: TenantFabricNetwork, ip_pool: str) -> str:
    """The CNI configuration of a tenant network: the tenant's key is set on the VF by the NIC
    (VLAN) or the subnet manager (partition), never inside the pod."""
    name = network_name(network.pool)
    ipam = {"type": "nv-ipam", "poolName": ip_pool}
    if network.kind == INFINIBAND:
        config = {"cniVersion": CNI_VERSION, "name": name, "type": "ib-sriov", "pkey": f"{network.key:#06x}", "link_state": "enable", "ipam": ipam}
    else:
        config = {"cniVersion": CNI_VERSION, "name": name, "type": "sriov", "vlan": network.key, "spoofchk": "on", "trust": "off", "link_state": "enable", "ipam": ipam}
    return json.dumps(config, sort_keys=True)


@dataclass(frozen=True)
class TenantNetworks:
    """TenantHook: each tenant's RDMA networks (the plan's), built from the plan alone."""

    networks: tuple[TenantFabricNetwork, ...]
    vpcs: tuple[TenantVpcAttachment, ...] = ()
    paired: dict[str, str] | None = None
    """DRA pools whose VFs DRA allocates -> their GPU model: a paired claim template per network there."""
    layer: str = "network"

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> TenantNetworks:
        dra = dra_vf_pools(cfg)
        return cls(plan.networks, vpc_attachments(cfg), {p.name: p.gpu.model for p in cfg.fleet.pools if p.name in dra})

    def narrowed(self, tenant: str) -> TenantNetworks:
        """Only the tenant's own networks and VPCs (see `TenantHook`)."""
        return replace(self, networks=tenant_items(self.networks, tenant), vpcs=tenant_items(self.vpcs, tenant))

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        for network in (n for n in self.networks if n.tenant == names.tenant):
            ip_pool = ip_pool_name(names.tenant, network.pool)
            resource = f"{SRIOV_RESOURCE_PREFIX}/{sriov_resource(network.pool)}"
            k8s.apiextensions.CustomResource(
                stack.child_name(f"network-{network.pool}"),
                api_version=NAD_API,
                kind="NetworkAttachmentDefinition",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=network_name(network.pool),
                    namespace=names.namespace,
                    labels=labels(self.layer, tenant=names.tenant, extra={**names.labels, POOL_LABEL: network.pool}),
                    annotations={RESOURCE_ANNOTATION: resource},
                ),
                spec={"config": cni_config(network, ip_pool)},
                opts=stack.child(),
            )
            if network.pool in (self.paired or {}):
                self._paired_claim(stack, names, network.pool, self.paired[network.pool])
        for vpc in (v for v in self.vpcs if v.tenant == names.tenant):
            # The VPC's VLAN on the uplink; the fabric (leaf switches, or the DPU) maps it to the VNI.
            config = {"cniVersion": CNI_VERSION, "name": vpc.network, "type": "vlan", "master": vpc.vpc.uplink, "vlanId": vpc.vpc.vlan,
                      "ipam": {"type": "nv-ipam", "poolName": vpc.ip_pool}}
            k8s.apiextensions.CustomResource(
                stack.child_name(f"network-{vpc.network}"),
                api_version=NAD_API,
                kind="NetworkAttachmentDefinition",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=vpc.network,
                    namespace=names.namespace,
                    labels=labels(self.layer, tenant=names.tenant, extra=names.labels),
                    annotations={VPC_ANNOTATION: f"{vpc.vpc.kind}:{vpc.vpc.vni}"},
                ),
                spec={"config": json.dumps(config, sort_keys=True)},
                opts=stack.child(),
            )


    def _paired_claim(self, stack: FactoryComponent, names: TenantNames, pool: str, gpu_model: str) -> None:
        k8s.resource.v1.ResourceClaimTemplate(
            stack.child_name(f"claim-{paired_claim_template(pool)}"),
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=paired_claim_template(pool), namespace=names.namespace,
                labels=labels(self.layer, tenant=names.tenant, extra={**names.labels, POOL_LABEL: pool}),
            ),
            spec={"spec": paired_claim_spec(pool, gpu_model, names.namespace)},
            opts=stack.child(),
        )


def paired_claim_spec(pool: str, gpu_model: str, namespace: str) -> dict[str, Any]:
    """One whole GPU and one VF on one PCIe root, the VF on the tenant's network of the pool (no
    interface name: a pod holding several pairs gets the driver's `net<N>` names)."""
    vf_config = {"apiVersion": f"{SRIOV_DRA_DRIVER}/v1alpha1", "kind": "VfConfig",
                 "netAttachDefName": network_name(pool), "netAttachDefNamespace": namespace}
    return {
        "devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": whole_gpu_class(gpu_model), "allocationMode": "ExactCount", "count": 1}},
                {"name": "nic", "exactly": {"deviceClassName": vf_device_class(pool), "allocationMode": "ExactCount", "count": 1}},
            ],
            "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": PCIE_ROOT}],
            "config": [{"requests": ["nic"], "opaque": {"driver": SRIOV_DRA_DRIVER, "parameters": vf_config}}],
        }
    }


# --------------------------------------------------------------------------- config rules


def _pools(raw: dict) -> list[dict]:
    return list(map(as_dict, as_list(as_dict(raw.get("fleet")).get("pools"))))


def _pool_named(pools: dict[str, dict], name: Any) -> dict | None:
    return pools.get(name) if isinstance(name, str) else None


def _tenants(raw: dict) -> list[dict]:
    return list(map(as_dict, as_list(raw.get("tenants"))))


def nics_named_once(raw: dict) -> list[str]:
    """A NIC sits on one NUMA node of a pool, once."""
    problems = []
    for i, pool in enumerate(_pools(raw)):
        topology = as_dict(pool.get("topology"))
        seen: dict[str, str] = {}
        for k, domain in enumerate(map(as_dict, as_list(topology.get("numa")))):
            for m, nic in enumerate(as_list(domain.get("nics"))):
                path = f"fleet.pools[{i}].topology.numa[{k}].nics[{m}]"
                if isinstance(nic, str) and nic in seen:
                    problems.append(f"{path}: NIC {nic!r} is already named at {seen[nic]}")
                elif isinstance(nic, str):
                    seen[nic] = path
    return problems


def rdma_requests_on_rdma_pools(raw: dict) -> list[str]:
    """`rdma: true` only on a pool with an RDMA fabric exposing SR-IOV; shared RDMA devices only on
    a pool serving one trust domain (they carry no per-tenant partition)."""
    pools = {p.get("name"): p for p in _pools(raw) if isinstance(p.get("name"), str)}
    problems = []
    domains: dict[str, set[str]] = defaultdict(set)
    for i, tenant in enumerate(_tenants(raw)):
        for j, demand in enumerate(map(as_dict, as_list(tenant.get("gpus")))):
            pool = _pool_named(pools, demand.get("pool"))
            if pool is None:
                continue  # an unknown pool is reported by the tenants' own rule
            fabric = as_dict(pool.get("topology")).get("fabric", "ethernet")
            devices = as_dict(pool.get("network")).get("devices", "sriov")
            if fabric in RDMA_FABRICS and devices == "rdma-shared":
                domains[pool["name"]].add(str(tenant.get("trust_domain") or tenant.get("name")))
            if demand.get("rdma") is not True:
                continue
            path = f"tenants[{i}].gpus[{j}].rdma"
            if fabric not in RDMA_FABRICS:
                problems.append(f"{path}: pool {pool['name']!r} has no RDMA fabric (its topology.fabric is {fabric})")
            elif devices != "sriov":
                problems.append(f"{path}: pool {pool['name']!r} shares its RDMA devices (network.devices: {devices}): no network of the tenant's own can be isolated there")
    for i, pool in enumerate(_pools(raw)):
        if isinstance(pool.get("name"), str) and len(domains.get(pool["name"], ())) > 1:
            problems.append(
                f"fleet.pools[{i}].network.devices: rdma-shared gives every pod of a node the same RDMA devices, with no partition between them, "
                f"but trust domains {', '.join(sorted(domains[pool['name']]))} use pool {pool['name']!r}: use sriov"
            )
    return problems


def keys_given_once(raw: dict) -> list[str]:
    """Two tenants never hold one partition key, nor one VLAN on a RoCE fabric they share."""
    pools = {p.get("name"): p for p in _pools(raw) if isinstance(p.get("name"), str)}
    problems = []
    pkeys: dict[Any, str] = {}
    vlans: dict[tuple[str, Any], str] = {}
    for i, tenant in enumerate(_tenants(raw)):
        network = as_dict(tenant.get("network"))
        pkey, vlan = network.get("pkey"), network.get("vlan")
        if isinstance(pkey, str) and pkey.lower().startswith("0x"):
            try:
                pkey = int(pkey, 16)
            except ValueError:
                pkey = None  # reported by the field's own rule
        if isinstance(pkey, int):
            if pkey in pkeys:
                problems.append(f"tenants[{i}].network.pkey: partition key {pkey:#06x} is also given at {pkeys[pkey]}")
            else:
                pkeys[pkey] = f"tenants[{i}].network.pkey"
        if not isinstance(vlan, int):
            continue
        demanded = [_pool_named(pools, d.get("pool")) for d in map(as_dict, as_list(tenant.get("gpus")))]
        sites = {p.get("site") for p in demanded if p is not None and as_dict(p.get("topology")).get("fabric") == "roce"}
        for site in sorted(s for s in sites if isinstance(s, str)):
            if (site, vlan) in vlans:
                problems.append(f"tenants[{i}].network.vlan: VLAN {vlan} is also given at {vlans[site, vlan]}, on the same RoCE fabric (site {site})")
            else:
                vlans[site, vlan] = f"tenants[{i}].network.vlan"
    return problems


def vpcs_apart(raw: dict) -> list[str]:
    """Two tenants never join one VPC (VNI), nor share the VLAN it is handed over on."""
    problems = []
    seen: dict[tuple[str, Any], str] = {}
    for i, tenant in enumerate(_tenants(raw)):
        vpc = as_dict(as_dict(tenant.get("network")).get("vpc"))
        for field in ("vni", "vlan"):
            value = vpc.get(field)
            if not isinstance(value, int):
                continue
            path = f"tenants[{i}].network.vpc.{field}"
            if (field, value) in seen:
                problems.append(f"{path}: {value} is also given at {seen[field, value]}: the two tenants would share a VPC")
            else:
                seen[field, value] = path
    return problems


def layer_settings(raw: dict) -> list[str]:
    """The DOCA driver needs its version; the layer cannot be off while a pool has an RDMA fabric."""
    layer = as_dict(as_dict(raw.get("layers")).get("network"))
    problems = []
    if layer.get("driver") == "doca" and not layer.get("doca_driver_version"):
        problems.append("layers.network.doca_driver_version: required with driver: doca (the DOCA-OFED container tag matching the nodes' kernel)")
    if layer.get("enabled", True) is False:
        problems += [
            f"fleet.pools[{i}].topology.fabric: pool {p.get('name')!r} is on {as_dict(p.get('topology'))['fabric']} but layers.network is disabled"
            for i, p in enumerate(_pools(raw))
            if as_dict(p.get("topology")).get("fabric") in RDMA_FABRICS
        ]
    return problems


def needed(cfg: FactoryConfig) -> bool:
    """An RDMA fabric in the fleet, or a tenant VPC: both need Multus."""
    return any(is_rdma_pool(p) for p in cfg.fleet.pools) or any(t.network.vpc for t in cfg.tenants)


LAYER = Layer(
    name="network",
    section="network",
    chart="network-operator",
    component=FastPath,
    args=NetworkArgs.from_config,
    requires=("fleet",),
    needed=needed,
    tenant_hook=TenantNetworks.from_config,
    checks=(fabric_checks.fabric_keys, fabric_checks.fabric_attachments, fabric_checks.nic_policies_select_pools, fabric_checks.claims_aligned),
    privileged_namespaces={
        "nvidia-network-operator": "NVIDIA Network Operator: Multus and the CNI plugins write the host's CNI directories, the "
        "SR-IOV config daemon and device plugins configure NICs and device nodes, the DOCA driver loads kernel modules",
    },
    config_checks=(nics_named_once, rdma_requests_on_rdma_pools, keys_given_once, vpcs_apart, layer_settings),
)
