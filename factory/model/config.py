"""The typed configuration of one environment: the single source of truth.

Read from the `ai-factory:` namespace of `Pulumi.<env>.yaml` (offline) or through `pulumi.Config`
(inside `pulumi up`); see `ai_factory.factory.model.loading`. Every model rejects unknown keys and is immutable.
Field-level rules live on the fields; rules that relate several parts of the config (a tenant
naming a pool, duplicate names, trust rules) live in `ai_factory.factory.model.loading.cross_check` so that every
problem is reported at once, with its path.

Adding a platform layer is adding a field to `Layers` (its settings model, defaults documented
here) and a component in `components/` listed in `components.LAYERS`.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, StringConstraints, model_validator

from ai_factory.factory.model.catalog import CHARTS, ChartSource
from ai_factory.factory.model.quantity import parse_quantity
from ai_factory.factory.model.secrets import SecretValue

DnsLabel = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=40),
]
"""A name that is also usable as (part of) a Kubernetes object name and label value."""

Sharing = Literal["exclusive", "mig", "time-slicing", "hami", "dra"]
Trust = Literal["high", "medium", "low"]

SUPPORTED_KUBERNETES = ("1.32", "1.33", "1.34", "1.35", "1.36", "1.37")

# Bounds on every size a user can type (README, "Bad input and bounds"). The fleet's are those of
# one Kubernetes cluster (its documented scalability limit is 5,000 nodes); the others are far
# above any real environment and keep every run of the tools short and small.
MAX_FLEET_NODES = 5000
"""Nodes of all pools together (and of one pool)."""
MAX_GPUS_PER_NODE = 16
MAX_SITES = 64
MAX_POOLS = 128
MAX_CLUSTERS = 64
"""Clusters of one environment (each renders, plans and deploys as a stack of its own); its nodes
together stay within MAX_FLEET_NODES."""
MAX_TENANTS = 1000
MAX_ITEMS = 256
"""Entries of any other list or mapping: a tenant's demands and owners, flows, labels, ports, NUMA
nodes, registries, redirect URIs, exceptions, runtime classes."""
MAX_TEXT = 1024
"""Characters of a free-form string (a region, a host, a reason, a URL)."""
MAX_GPU_UNITS = MAX_FLEET_NODES * MAX_GPUS_PER_NODE * 64
"""Most units (GPUs, time-sliced replicas, HAMi vGPUs) any demand may name; each demand is also
bounded by what its pool could ever supply (`ai_factory.factory.model.loading`)."""
MAX_QUOTA_COUNT = 1_000_000
"""Largest object count of a tenant's ResourceQuota."""

Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]


class Model(BaseModel):
    # Attribute docstrings are the fields' descriptions (the tenant API's OpenAPI document shows them).
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# --------------------------------------------------------------------------- kubernetes


class KubernetesSpec(Model):
    version: Literal[SUPPORTED_KUBERNETES] = "1.34"  # type: ignore[valid-type]
    """Target Kubernetes minor version. Objects are validated against its schema; 1.34 is the first
    release with DRA (resource.k8s.io/v1) generally available."""
    api_server: Annotated[str, StringConstraints(pattern=r"^https://[^\s/]+(/[^\s]*)?$", max_length=MAX_TEXT)] | None = None
    """The host cluster's API server as tenants and their tools reach it, e.g.
    `https://api.par1.example.com:6443`; published to tenant stacks in the platform contract."""
    cluster: DnsLabel | None = None
    """The cluster of the fleet this stack deploys (`fleet.sites[].clusters`): set on each
    per-cluster stack, which then sees the cluster's pools and tenants only."""


# --------------------------------------------------------------------------- fleet


class Cluster(Model):
    """One Kubernetes cluster of a site: a platform stack of its own (`<env>-<cluster>`), with its
    own Kubernetes provider (`context`)."""

    name: DnsLabel
    """Unique across the environment's sites."""
    role: Literal["manager", "worker"] = "worker"
    """The manager runs the identity layer and MultiKueue, which dispatches the jobs of tenants
    on several clusters to the workers where they have quota. One manager per environment."""
    api_server: Annotated[str, StringConstraints(pattern=r"^https://[^\s/]+(/[^\s]*)?$", max_length=MAX_TEXT)] | None = None
    """The cluster's API server as tenants reach it (default: `kubernetes.api_server`)."""
    context: Annotated[str, StringConstraints(min_length=1, max_length=253)] | None = None
    """The kubeconfig context the cluster's stack deploys with (its `kubernetes:context`)."""


class Site(Model):
    name: DnsLabel
    """A data centre. Pools name the site they live in."""
    region: Text = ""
    """Free-form location, carried onto node labels for placement and reporting."""
    clusters: list[Cluster] = Field(default=[], max_length=MAX_CLUSTERS)
    """The site's Kubernetes clusters; none: the environment is one cluster (no per-cluster stacks)."""


class NumaDomain(Model):
    """One NUMA node of a GPU server: which GPUs, NICs and CPU cores share it."""

    node: int = Field(ge=0, le=MAX_ITEMS)
    gpus: list[Annotated[int, Field(ge=0, lt=MAX_GPUS_PER_NODE)]] = Field(min_length=1, max_length=MAX_GPUS_PER_NODE)
    """GPU indexes (as the driver numbers them) attached to this NUMA node."""
    nics: list[Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9][-_.a-zA-Z0-9]*$", max_length=15)]] = Field(default=[], max_length=MAX_ITEMS)
    """The RDMA NICs on this NUMA node, paired with its GPUs for GPUDirect RDMA, by the network
    interface name of their physical function (e.g. `ibp24s0`, `ens1f0np0`: what SR-IOV policies and
    the RDMA device plugin select on). A NIC belongs to one NUMA node only."""
    cpus: Annotated[str, StringConstraints(max_length=MAX_TEXT)] = ""
    """CPU list in cpuset syntax, e.g. `0-47`."""


class Topology(Model):
    """How a pool's GPUs and nodes are wired; the scheduler keeps gangs inside the fastest domain."""

    intra_node: Literal["pcie", "nvlink", "nvswitch"] = "pcie"
    """GPU-to-GPU link inside a node."""
    fabric: Literal["ethernet", "roce", "infiniband"] = "ethernet"
    """The node-to-node GPU fabric."""
    nodes_per_nvlink_domain: int = Field(default=1, ge=1, le=MAX_FLEET_NODES)
    """Nodes that share one multi-node NVLink domain (e.g. 18 for a GB200 NVL72 rack); 1 = none."""
    nodes_per_rack: int = Field(default=8, ge=1, le=MAX_FLEET_NODES)
    """Nodes per rack when nodes are given by count (explicit nodes carry their own rack)."""
    racks_per_block: int = Field(default=4, ge=1, le=MAX_FLEET_NODES)
    """Racks per network block (leaf/spine group, or InfiniBand sub-tree) when nodes are given by count."""
    numa: list[NumaDomain] = Field(default=[], max_length=MAX_GPUS_PER_NODE)
    """GPU/NIC/CPU affinity per NUMA node; empty = unknown (no alignment is promised)."""


# BMC drivers as the Metal3 baremetal-operator registers them (`pkg/hardwareutils/bmc/*.go`,
# `RegisterFactory(name, ..., schemes)` makes `name`, `name+http` and `name+https`), split into
# those that reach the BMC encrypted and those that do not. The address's scheme picks the driver.
BMC_SCHEMES: dict[str, str] = {
    "redfish": "Redfish, PXE/iPXE boot", "redfish+https": "Redfish, PXE/iPXE boot",
    "redfish-virtualmedia": "Redfish, virtual-media boot", "redfish-virtualmedia+https": "Redfish, virtual-media boot",
    "redfish-uefihttp": "Redfish, UEFI HTTP boot", "redfish-uefihttp+https": "Redfish, UEFI HTTP boot",
    "idrac-redfish": "Dell iDRAC (Redfish), iPXE boot", "idrac-redfish+https": "Dell iDRAC (Redfish), iPXE boot",
    "idrac-virtualmedia": "Dell iDRAC (Redfish), virtual-media boot", "idrac-virtualmedia+https": "Dell iDRAC (Redfish), virtual-media boot",
    "ilo5-redfish": "HPE iLO 5 (Redfish)", "ilo5-redfish+https": "HPE iLO 5 (Redfish)",
    "ilo5-virtualmedia": "HPE iLO 5, virtual-media boot", "ilo5-virtualmedia+https": "HPE iLO 5, virtual-media boot",
    "ilo5": "HPE iLO 5 (proliantutils)", "ilo5+https": "HPE iLO 5 (proliantutils)",
    "ilo4": "HPE iLO 4 (proliantutils)", "ilo4+https": "HPE iLO 4 (proliantutils)",
    "ilo4-virtualmedia": "HPE iLO 4, virtual-media boot", "ilo4-virtualmedia+https": "HPE iLO 4, virtual-media boot",
    "irmc": "Fujitsu iRMC",
}
"""Schemes Metal3 accepts and this library allows: the BMC is reached over TLS (Redfish and iLO
default to https; iRMC's driver speaks HTTPS)."""
BMC_INSECURE_SCHEMES: dict[str, str] = {
    "ipmi": "IPMI sends BMC credentials over RMCP+, whose RAKP handshake leaks a crackable password hash",
    "libvirt": "libvirt is Metal3's development driver (virtual machines), not a server BMC",
    **{f"{name}+http": "plain HTTP sends the BMC credentials unencrypted" for name in (
        "redfish", "redfish-virtualmedia", "redfish-uefihttp", "idrac-redfish", "idrac-virtualmedia", "ilo5-redfish", "ilo5-virtualmedia")},
}
"""Schemes Metal3 also accepts, refused here (secure by default), with why."""
_BMC_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*)(:[0-9]{1,5})?$")


def _bmc_address(address: str) -> str:
    scheme, sep, rest = address.partition("://")
    if not sep:
        raise ValueError("give the driver as the URL scheme, e.g. redfish-virtualmedia://10.0.0.5/redfish/v1/Systems/1 "
                         "(Metal3 would read a bare host as IPMI)")
    if scheme in BMC_INSECURE_SCHEMES:
        raise ValueError(f"scheme {scheme!r} is refused: {BMC_INSECURE_SCHEMES[scheme]}; use one of {', '.join(sorted(BMC_SCHEMES))}")
    if scheme not in BMC_SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not a Metal3 BMC driver; use one of {', '.join(sorted(BMC_SCHEMES))}")
    host = rest.split("/", 1)[0]
    if not _BMC_HOST.match(host):
        raise ValueError(f"{host!r} is not a host name or IP address (with an optional port)")
    return address


MAC_ADDRESS = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
"""Metal3's `bootMACAddress` pattern, anchored (the CRD's is not: it would take a longer string)."""


def _mac(value: str) -> str:
    if not MAC_ADDRESS.match(value):
        raise ValueError(f"{value!r} is not a MAC address: six hex pairs separated by colons, e.g. 0c:42:a1:5e:00:01")
    return value


class Bmc(Model):
    """How Metal3 reaches the node's baseboard management controller."""

    address: Annotated[str, StringConstraints(max_length=MAX_TEXT), AfterValidator(_bmc_address)]
    """Driver scheme, host and (Redfish) system path, e.g. `idrac-virtualmedia://10.1.0.11/redfish/v1/Systems/System.Embedded.1`."""
    credentials: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-_/a-z0-9]*[a-z0-9])?$", max_length=253)] | None = None
    """OpenBao KV key holding `username` and `password`, under `layers.provisioning.credentials_prefix`;
    defaults to the node's name. The credentials never enter the config, the state or the bundle."""
    disable_certificate_verification: bool = False
    """Off by default: skipping verification lets anyone on the BMC network capture the credentials."""


class RootDeviceHints(Model):
    """How Metal3 picks the disk the OS image is written to (Metal3 `rootDeviceHints`). GPU servers
    carry several NVMe drives; without a hint Metal3 takes the first it finds, which may hold data."""

    device_name: Annotated[str, StringConstraints(pattern=r"^/dev/\S+$", max_length=253)] | None = None
    """`/dev/nvme0n1` or a `/dev/disk/by-path/...` link."""
    serial_number: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None
    wwn: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None
    model: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None
    vendor: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None
    min_size_gigabytes: int | None = Field(default=None, ge=1, le=1_000_000)
    rotational: bool | None = None

    @model_validator(mode="after")
    def _some_hint(self) -> RootDeviceHints:
        if all(v is None for v in self.__dict__.values()):
            raise ValueError("give at least one hint (device_name, serial_number, wwn, model, vendor, min_size_gigabytes, rotational)")
        return self


class NodeSpec(Model):
    name: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", max_length=253)]
    """The Kubernetes node name."""
    rack: DnsLabel
    block: DnsLabel = "block-0"
    nvlink_domain: DnsLabel | None = None
    """Multi-node NVLink domain; defaults to the rack when the pool has multi-node NVLink."""
    bmc: Bmc | None = None
    """The node's BMC: with it (and `layers.provisioning` enabled) Metal3 provisions the node; a
    node without one is provisioned by something else and only goes through acceptance."""
    boot_mac: Annotated[str, StringConstraints(max_length=17), AfterValidator(_mac)] | None = None
    """MAC address of the NIC the node provisions through (Metal3 `bootMACAddress`)."""
    root_device_hints: RootDeviceHints | None = None

    @model_validator(mode="after")
    def _provisioning_facts(self) -> NodeSpec:
        if self.bmc is not None:
            missing = [key for key in ("boot_mac", "root_device_hints") if getattr(self, key) is None]
            if missing:
                raise ValueError(f"a node with a BMC also needs {' and '.join(missing)} (Metal3 boots that NIC and writes that disk)")
        return self


class GpuSpec(Model):
    model: Annotated[str, StringConstraints(max_length=64)]
    """A GPU model of the catalog (`ai_factory.factory.model.gpus.GPU_MODELS`), e.g. `H100-80GB`."""
    per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE)


class DriverSettings(Model):
    """NVIDIA driver for one pool, installed by the GPU Operator through an `NVIDIADriver` resource."""

    version: Annotated[str, StringConstraints(pattern=r"^[0-9][0-9A-Za-z.+-]*$", max_length=64)] = "595.91.07"
    """Driver version (the GPU Operator chart's default for v26.7.0)."""
    kernel_module_type: Literal["auto", "open", "proprietary"] = "auto"
    use_precompiled: bool = False


class TimeSlicing(Model):
    replicas: int = Field(default=4, ge=2, le=64)
    """Time-sliced replicas advertised per GPU."""


class HamiPool(Model):
    split_count: int = Field(default=10, ge=1, le=64)
    """HAMi `deviceSplitCount`: at most this many containers on one GPU."""


class PoolNetwork(Model):
    """How an RDMA pool (`topology.fabric` `roce` or `infiniband`) exposes its NICs
    (`topology.numa[].nics`) to pods, through the NVIDIA Network Operator (`components/network.py`)."""

    devices: Literal["sriov", "rdma-shared"] = "sriov"
    """`sriov`: each NIC is cut into virtual functions (SR-IOV Network Operator), one per pod
    interface, each tenant's on its own InfiniBand partition or VLAN: the only mode that keeps
    tenants' RDMA traffic apart. `rdma-shared`: every pod of the node shares the NICs' RDMA devices
    (RDMA shared device plugin), with no per-tenant partition: only for a pool serving one trust
    domain."""
    vfs_per_nic: int = Field(default=8, ge=1, le=127)
    """Virtual functions per NIC (`sriov`): at most this many pods per NIC and node."""


class Pool(Model):
    name: DnsLabel
    site: DnsLabel
    cluster: DnsLabel | None = None
    """The cluster of `site` the pool's nodes join; required when the site has several clusters."""
    gpu: GpuSpec
    nodes: int | None = Field(default=None, ge=1, le=MAX_FLEET_NODES)
    """Node count; nodes are then named `<pool>-<nnn>` (the provisioning layer names them so)."""
    node_list: list[NodeSpec] | None = Field(default=None, max_length=MAX_FLEET_NODES)
    """Explicit nodes; exclusive with `nodes`."""
    sharing: Sharing = "exclusive"
    """How GPUs of this pool are offered: whole GPUs (`exclusive`, or through DRA claims with
    `dra`), MIG instances, time-sliced replicas or HAMi soft slices. Sharing is only ever granted
    inside one trust domain; the planner decides which GPU serves which domain."""
    topology: Topology = Topology()
    network: PoolNetwork = PoolNetwork()
    driver: DriverSettings = DriverSettings()
    time_slicing: TimeSlicing = TimeSlicing()
    hami: HamiPool = HamiPool()

    def node_specs(self) -> list[NodeSpec]:
        """The pool's nodes, explicit or generated from the count, with rack/block/NVLink placement.

        Without multi-node NVLink a node has no NVLink domain; explicit nodes that omit theirs in a
        multi-node NVLink pool are taken to share one with their rack."""
        topo = self.topology
        multi_node_nvlink = topo.nodes_per_nvlink_domain > 1
        if self.node_list is not None:
            if not multi_node_nvlink:
                return list(self.node_list)
            return [n if n.nvlink_domain else n.model_copy(update={"nvlink_domain": n.rack}) for n in self.node_list]
        return [
            NodeSpec(
                name=f"{self.name}-{i:03d}",
                rack=f"{self.name}-rack-{i // topo.nodes_per_rack:02d}",
                block=f"{self.site}-block-{i // (topo.nodes_per_rack * topo.racks_per_block):02d}",
                nvlink_domain=f"{self.name}-nvl-{i // topo.nodes_per_nvlink_domain:02d}" if multi_node_nvlink else None,
            )
            for i in range(self.nodes or 0)
        ]


class Fleet(Model):
    sites: list[Site] = Field(min_length=1, max_length=MAX_SITES)
    pools: list[Pool] = Field(min_length=1, max_length=MAX_POOLS)


# --------------------------------------------------------------------------- layers


class Chart(Model):
    """A pinned chart. Versions are exact: ranges would make renders non-reproducible."""

    version: Annotated[str, StringConstraints(pattern=r"^v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$", max_length=64)]
    repository: Text

    _product: str | None = PrivateAttr(default=None)
    """The catalog key a default pin was made from (charts of one repository share versions)."""

    # A pin is its version and repository: a default pin equals the same pin read back from a
    # stack file or a contract, which knows no catalog key.
    def __eq__(self, other: object) -> bool:
        return (self.version, self.repository) == (other.version, other.repository) if isinstance(other, Chart) else NotImplemented

    def __hash__(self) -> int:
        return hash((self.version, self.repository))

    @classmethod
    def pinned(cls, product: str) -> Chart:
        source = CHARTS[product]
        chart = cls(version=source.version, repository=source.repository)
        chart._product = product
        return chart

    def source(self, product: str) -> ChartSource:
        pin = CHARTS[product]
        return ChartSource(name=pin.name, repository=self.repository, version=self.version, oracle_dir=pin.oracle_dir)


class RegistryCredentials(Model):
    """Pull credentials for a private image registry (e.g. NGC for licensed driver images)."""

    server: Text = "nvcr.io"
    username: Text = "$oauthtoken"
    password: SecretValue


MIN_CONTAINER_TOOLKIT = (1, 17, 8)
"""First NVIDIA Container Toolkit fixed for CVE-2024-0132, CVE-2025-23359 and CVE-2025-23266."""


def _safe_toolkit(version: str) -> str:
    if tuple(int(p) for p in version.lstrip("v").split(".")) < MIN_CONTAINER_TOOLKIT:
        raise ValueError(f"container toolkit {version} is affected by container-escape CVEs; use v1.17.8 or later")
    return version


class GpuOperatorLayer(Model):
    enabled: bool = True
    chart: Chart = Chart.pinned("gpu-operator")
    namespace: DnsLabel = "gpu-operator"
    toolkit_version: Annotated[str, StringConstraints(pattern=r"^v\d+\.\d+\.\d+$"), AfterValidator(_safe_toolkit)] = "v1.20.0"
    """NVIDIA Container Toolkit. Must be >= v1.17.8 (CVE-2024-0132, CVE-2025-23359, CVE-2025-23266);
    the default is the chart's."""
    dcgm_exporter: bool = True
    """GPU metrics for health and per-tenant GPU-second metering."""
    registry: RegistryCredentials | None = None
    """Credentials for the operator's images, when they come from a private registry."""


class KueueLayer(Model):
    """Kueue: admission and quotas. Every tenant workload, GPU or not, waits in the tenant's queue
    until its quota admits it; flavors, cohorts and quotas come from the plan."""

    enabled: bool = True
    """Off only when KAI Scheduler or Volcano holds the quotas, and no pool uses HAMi."""
    chart: Chart = Chart.pinned("kueue")
    namespace: DnsLabel = "kueue-system"


class KaiSchedulerLayer(Model):
    """KAI Scheduler: gang and topology-aware scheduling with hierarchical queues (organisation ->
    trust domain -> tenant) whose quotas come from the plan. With Kueue on, Kueue admits and KAI
    places; without, KAI's queues are the quotas."""

    enabled: bool = False
    chart: Chart = Chart.pinned("kai-scheduler")
    namespace: DnsLabel = "kai-scheduler"


class VolcanoLayer(Model):
    """Volcano: batch gang scheduling with one queue per tenant capped at the plan. Exclusive with
    KAI Scheduler: two schedulers placing pods on the same GPUs would each see them free."""

    enabled: bool = False
    chart: Chart = Chart.pinned("volcano")
    namespace: DnsLabel = "volcano-system"


class HamiLayer(Model):
    """HAMi soft slicing (device plugin, scheduler extender, webhook). Installed only when a pool's
    sharing is `hami`, and then only on that pool's nodes; scheduling binpacks, split counts and
    memory scaling come from the plan."""

    enabled: bool = True
    """Off is refused while a pool uses `hami` sharing: nothing else would serve those GPUs."""
    chart: Chart = Chart.pinned("hami")
    namespace: DnsLabel = "hami-system"
    """Namespace of the HAMi scheduler and device plugin (privileged: the plugin injects its CUDA shim)."""


class DraLayer(Model):
    """The NVIDIA DRA driver (`gpu.nvidia.com`). Installed only when a pool's sharing is `dra`, its
    kubelet plugin only on that pool's nodes; DeviceClasses per GPU model and per-tenant
    ResourceClaimTemplates come from the plan. Needs Kubernetes >= 1.34 (resource.k8s.io/v1)."""

    enabled: bool = True
    """Off is refused while a pool uses `dra` sharing: nothing else would serve those GPUs."""
    chart: Chart = Chart.pinned("dra-driver-nvidia-gpu")
    namespace: DnsLabel = "dra-driver-nvidia-gpu"
    """Namespace of the driver's controller and kubelet plugin (privileged: the plugin prepares devices)."""


LabelKey = Annotated[str, StringConstraints(pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", max_length=253)]
LabelValue = Annotated[str, StringConstraints(pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", max_length=63)]


class FlowPort(Model):
    port: int = Field(ge=1, le=65535)
    protocol: Literal["TCP", "UDP"] = "TCP"


class PlatformFlow(Model):
    """One connection allowed between every tenant's pods and one platform service. Tenant
    namespaces deny everything else in both directions (DNS to kube-dns excepted)."""

    name: DnsLabel
    direction: Literal["egress", "ingress"] = "egress"
    """`egress`: tenant pods connect to the service (an inference gateway); `ingress`: the service
    connects to tenant pods (an ingress gateway, a metrics scraper)."""
    namespace: DnsLabel
    """The platform namespace of the service; never a tenant namespace."""
    pod_labels: dict[LabelKey, LabelValue] = Field(min_length=1, max_length=MAX_ITEMS)
    """Labels of the service's pods: a flow names its peers, never a whole namespace."""
    ports: list[FlowPort] = Field(min_length=1, max_length=MAX_ITEMS)
    """Ports on the receiving side."""


class PodSecurityException(Model):
    """A reviewed exception to Pod Security `restricted` for one tenant's namespace."""

    tenant: DnsLabel
    level: Literal["baseline"]
    """The only level a tenant can be granted; `privileged` is for platform namespaces only."""
    reason: Annotated[str, StringConstraints(min_length=10, max_length=MAX_TEXT)]
    """Why the tenant's workloads cannot run restricted (kept with the config for review)."""
    approved_by: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT)]


class TenancyLayer(Model):
    """Tenant environments (`components/tenant_stack.py`): one per entry of `tenants`, always on."""

    chart: Chart = Chart.pinned("vcluster")
    """vCluster, the control plane of tenants whose `isolation` is `vcluster`."""
    platform_flows: list[PlatformFlow] = Field(default=[], max_length=MAX_ITEMS)
    """The platform services tenant pods may talk to, or be reached from, besides DNS."""
    pod_security_exceptions: list[PodSecurityException] = Field(default=[], max_length=MAX_ITEMS)
    """Tenants whose namespaces enforce `baseline` instead of `restricted` (never a low-trust tenant)."""


# --------------------------------------------------------------------------- security layers


class CiliumLayer(Model):
    """Cilium: the CNI and network-policy engine, with Hubble flow visibility, plus the cluster-wide
    baseline policies every tenant relies on (`components/cilium.py`). Runs in kube-system."""

    enabled: bool = True
    chart: Chart = Chart.pinned("cilium")
    hubble_ui: bool = True
    """Hubble UI for platform operators (Hubble and its relay are always on)."""
    encryption: Literal["wireguard", "none"] = "wireguard"
    """Transparent encryption of pod traffic between nodes, so tenants' flows are not readable on
    shared links."""


class KeycloakDatabase(Model):
    """The PostgreSQL database Keycloak keeps realms, users and sessions in. It runs outside this
    library (a managed database or a database operator's cluster): no PostgreSQL chart is pinned."""

    host: Annotated[str, StringConstraints(min_length=1, max_length=253)]
    port: int = Field(default=5432, ge=1, le=65535)
    name: DnsLabel = "keycloak"
    username: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT)] = "keycloak"
    password: SecretValue


class KeycloakRedirects(Model):
    """Where each platform client may send a user back after sign-in."""

    kubernetes: list[Text] = Field(default=["http://localhost:8000", "http://localhost:18000"], max_length=MAX_ITEMS)
    """kubectl's OIDC login plugin (kubelogin) listens there; shared by every tenant's vCluster client."""
    litellm: list[Text] = Field(default=[], max_length=MAX_ITEMS)
    """The LiteLLM UI's callback; empty until the gateway is exposed."""
    dashboards: list[Text] = Field(default=[], max_length=MAX_ITEMS)
    """The dashboards' callback; empty until they are exposed."""


class KeycloakLayer(Model):
    """Keycloak (codecentric `keycloakx` chart): the OIDC issuer of `identity`, serving its platform
    realm. Needs `identity`, `admin_password` and `database` while enabled."""

    enabled: bool = True
    chart: Chart = Chart.pinned("keycloak")
    namespace: DnsLabel = "keycloak"
    replicas: int = Field(default=2, ge=2, le=MAX_ITEMS)
    """Keycloak pods (a cluster sharing sessions through Infinispan); at least 2 so sign-in survives a node."""
    admin_password: SecretValue | None = None
    """Password of the bootstrap administrator (`admin`, master realm): Keycloak creates it on first
    start, and Pulumi manages the tenants' identity objects with it."""
    database: KeycloakDatabase | None = None
    redirect_uris: KeycloakRedirects = KeycloakRedirects()


class OpenBaoLayer(Model):
    """OpenBao: HA with integrated Raft storage, on volumes that outlive the release. Tenants read
    their secrets through External Secrets (`layers.external_secrets`)."""

    enabled: bool = True
    chart: Chart = Chart.pinned("openbao")
    namespace: DnsLabel = "openbao"
    replicas: Literal[3, 5] = 3
    """Raft voters: an odd number, so a majority survives the loss of one (or two) pods."""
    storage_size: Annotated[str, StringConstraints(pattern=r"^\d{1,6}(Gi|Ti)$")] = "10Gi"
    """Raft volume per pod."""
    storage_provisioner: Annotated[str, StringConstraints(min_length=1, max_length=253)] | None = None
    """CSI driver of the `Retain` StorageClass the Raft volumes come from (the cluster's block
    storage, e.g. `rook-ceph.rbd.csi.ceph.com`). Required while the layer is enabled."""
    kv_mount: DnsLabel = "secret"
    """The KV v2 engine tenants' secrets live in, each tenant under `tenants/<name>/`."""
    api_address: Annotated[str, StringConstraints(pattern=r"^https?://[^\s/]+$", max_length=MAX_TEXT)] | None = None
    """Where Pulumi reaches OpenBao's API; defaults to the in-cluster service (run Pulumi in the
    cluster, or set a port-forward or ingress address)."""
    admin_token: SecretValue | None = None
    """Token Pulumi configures OpenBao with (KV engine, Kubernetes auth, one policy and role per
    tenant). Unset on the first deployment: OpenBao is installed, the operator initialises and
    unseals it, sets this, and the next `pulumi up` wires the tenants' secret stores."""


class ExternalSecretsLayer(Model):
    """External Secrets Operator: tenants' `ExternalSecret`s read OpenBao through a `SecretStore` in
    their own namespace. Cluster-wide stores, secrets and generators are not served at all."""

    enabled: bool = True
    chart: Chart = Chart.pinned("external-secrets")
    namespace: DnsLabel = "external-secrets"


class RuntimeClasses(Model):
    """The RuntimeClasses pods of each trust level may name (none named is always allowed)."""

    high: list[DnsLabel] = Field(default=["nvidia"], max_length=MAX_ITEMS)
    medium: list[DnsLabel] = Field(default=["nvidia"], max_length=MAX_ITEMS)
    low: list[DnsLabel] = Field(default=["nvidia"], max_length=MAX_ITEMS)


class KyvernoLayer(Model):
    """Kyverno: admission policies in Enforce mode that back tenant isolation (Pod Security
    restricted, queues, GPU escapes, GPU resources and runtime classes by tenant, registries, no
    NodePort or external IPs)."""

    enabled: bool = True
    chart: Chart = Chart.pinned("kyverno")
    namespace: DnsLabel = "kyverno"
    admission_replicas: int = Field(default=3, ge=3, le=MAX_ITEMS)
    """Admission controller pods: webhooks fail closed, so at least 3 keep the API usable."""
    allowed_registries: list[Annotated[str, StringConstraints(pattern=r"^[a-z0-9][-a-z0-9.:]*[a-z0-9](/[^\s|]*)?$", max_length=MAX_TEXT)]] = Field(
        default=["nvcr.io/nvidia/*", "registry.k8s.io/*"], min_length=1, max_length=MAX_ITEMS
    )
    """Image patterns tenant pods may run (Kyverno wildcards), e.g. `registry.example.com/team-*/*`."""
    runtime_classes: RuntimeClasses = RuntimeClasses()


class FalcoLayer(Model):
    """Falco (modern eBPF) on every node, GPU nodes included, with GPU-host rules."""

    enabled: bool = True
    chart: Chart = Chart.pinned("falco")
    namespace: DnsLabel = "falco"


class TrivyLayer(Model):
    """Trivy Operator: vulnerability, configuration and exposed-secret reports for every workload,
    written next to it (tenant reports land in the tenant's namespace)."""

    enabled: bool = True
    chart: Chart = Chart.pinned("trivy-operator")
    namespace: DnsLabel = "trivy-system"


PKEY_DEFAULT = 0x7FFF
"""The default InfiniBand partition: every port is a full member, so it isolates nothing."""
PKEY_MAX = 0x7FFE
VLAN_MAX = 4094


def _parse_pkey(value: object) -> object:
    # Partition keys are written in hex (`0x0101`), as subnet managers and ib-sriov show them.
    if isinstance(value, str) and value.lower().startswith("0x"):
        try:
            return int(value, 16)
        except ValueError:
            raise ValueError(f"{value!r} is not a hexadecimal partition key") from None
    return value


def _valid_pkey(value: int) -> int:
    if value == PKEY_DEFAULT:
        raise ValueError("0x7fff is the default partition, of which every port is a member: it isolates nothing")
    if not 1 <= value <= PKEY_MAX:
        raise ValueError(f"{value:#x} is outside the 15-bit partition keys 0x0001-0x7ffe (the membership bit is not part of the key)")
    return value


def _valid_vlan(value: int) -> int:
    if not 2 <= value <= VLAN_MAX:
        raise ValueError(f"VLAN {value} is outside 2-4094 (0 and 4095 are reserved, 1 is the default VLAN of every port)")
    return value


def _ipv4_network(value: str) -> str:
    try:
        network = ipaddress.IPv4Network(value)
    except ValueError as err:
        raise ValueError(f"not an IPv4 network in CIDR notation: {err}") from None
    if network.prefixlen > 24:
        raise ValueError("a tenant RDMA network needs at least a /24")
    return value


PartitionKey = Annotated[int, BeforeValidator(_parse_pkey), AfterValidator(_valid_pkey)]
"""An InfiniBand partition key (15 bits, never the default 0x7fff), as an integer or `0x...`."""
VlanId = Annotated[int, AfterValidator(_valid_vlan)]


class KeyRange(Model):
    """The partition keys (or VLANs) the planner allocates from; keys given by hand may be outside it."""

    first: int
    last: int

    @model_validator(mode="after")
    def _ordered(self) -> KeyRange:
        if self.first > self.last:
            raise ValueError(f"first ({self.first}) is above last ({self.last})")
        return self


class PartitionKeyRange(KeyRange):
    first: PartitionKey = 0x0100
    last: PartitionKey = PKEY_MAX


class VlanRange(KeyRange):
    first: VlanId = 100
    last: VlanId = 3999


DocaVersion = Annotated[str, StringConstraints(pattern=r"^[0-9A-Za-z][-0-9A-Za-z.]*$", max_length=64)]


class NetworkLayer(Model):
    """The fast path (`components/network.py`): the NVIDIA Network Operator, with Multus, the
    container network plugins, nv-ipam, ib-kubernetes (InfiniBand), the RDMA shared device plugin or
    its bundled SR-IOV Network Operator, per pool. Installed only when a pool's fabric is RoCE or
    InfiniBand; each tenant with an RDMA network gets its own partition key or VLAN (the plan)."""

    enabled: bool = True
    """Off is refused while a pool has an RDMA fabric: its NICs would serve no pod."""
    chart: Chart = Chart.pinned("network-operator")
    namespace: DnsLabel = "nvidia-network-operator"
    driver: Literal["host", "doca"] = "host"
    """`host`: the NIC driver (MLNX_OFED/DOCA-OFED or inbox) comes with the node's OS image (the
    provisioning layer); `doca`: the operator runs the DOCA-OFED driver container on RDMA nodes."""
    doca_driver_version: DocaVersion | None = None
    """The DOCA-OFED driver container's tag (`nvcr.io/nvidia/mellanox/doca-driver`), required with
    `driver: doca`: it must match the node's kernel and the operator release's support matrix."""
    ufm_secret: DnsLabel = "ufm-credentials"
    """Secret (in `namespace`, created by the site, never by this library) holding UFM's address and
    credentials: ib-kubernetes adds each pod's GUID to its tenant's partition through UFM."""
    pkeys: PartitionKeyRange = PartitionKeyRange()
    """Partition keys the planner gives tenants on InfiniBand (unique in the fleet)."""
    vlans: VlanRange = VlanRange()
    """VLANs the planner gives tenants on RoCE (unique per site's RoCE fabric)."""
    subnet: Annotated[str, StringConstraints(max_length=18), AfterValidator(_ipv4_network)] = "100.64.0.0/10"
    """Addresses of every tenant RDMA network (nv-ipam, one pool per tenant network). Networks of
    different tenants are apart (partition, VLAN), so they reuse the range; it must not overlap the
    cluster's pod or service ranges, which share the pod's routing table."""
    per_node_addresses: int = Field(default=64, ge=8, le=4096)
    """Addresses nv-ipam gives each node of a tenant network (at least its pods on that network)."""


XidClass = Literal["fatal", "needs-reset", "informational"]
"""What an NVIDIA XID error means for its node (`components/health.py` holds the table and its source)."""


class RemediationLimit(Model):
    """At most this many nodes remediating at once: a node count or a percentage of the nodes
    (rounded down, as the remediation controller counts). Exactly one of the two. On a DRA pool,
    where a fault quarantines one GPU rather than its node, each quarantined GPU counts
    `1/gpu.per_node` of a node (the remediation step and the `GpuRemediationBlastRadius` alert)."""

    nodes: int | None = Field(default=None, ge=1, le=100_000)
    percent: int | None = Field(default=None, ge=1, le=100)

    @model_validator(mode="after")
    def _one_of(self) -> RemediationLimit:
        if (self.nodes is None) == (self.percent is None):
            raise ValueError("give exactly one of `nodes` or `percent`")
        return self

    def resolve(self, total: int) -> int:
        """The limit in nodes, out of `total`."""
        return self.nodes if self.nodes is not None else total * (self.percent or 0) // 100


class HealthRemediation(Model):
    """The remediation loop (medik8s Node Healthcheck + Self Node Remediation): how long a fault
    holds before a node is remediated, how long remediation may take before a person is paged, and
    the blast radius, per pool and per site."""

    namespace: DnsLabel = "medik8s"
    """Namespace of the medik8s operators (installed through OLM; no Helm chart exists upstream)."""
    pool_limit: RemediationLimit = RemediationLimit(nodes=1)
    """Default blast radius of every GPU pool (on a DRA pool quarantined GPUs count proportionally:
    `{nodes: 1}` on 8-GPU nodes is 8 quarantined GPUs or one unhealthy node)."""
    pools: dict[DnsLabel, RemediationLimit] = Field(default={}, max_length=1000)
    """Per-pool blast radius overriding `pool_limit`."""
    sites: dict[DnsLabel, RemediationLimit] = Field(default={}, max_length=1000)
    """Per-site blast radius: the pools of a site together never remediate more nodes at once."""
    fault_minutes: int = Field(default=1, ge=0, le=60)
    """How long a GPU fault condition holds before the node is drained (or, on a DRA pool, its
    faulty GPU quarantined)."""
    drain_timeout_minutes: int = Field(default=30, ge=1, le=720)
    """How long a drain may wait on PodDisruptionBudgets (evictions the API server refuses) before a
    person is paged; the node stays cordoned and is not rebooted meanwhile."""
    not_ready_minutes: int = Field(default=5, ge=1, le=60)
    """How long a node may be NotReady/Unknown before it is remediated."""
    reboot_timeout_minutes: int = Field(default=30, ge=5, le=240)
    """How long a reboot may take to bring the node back healthy; then remediation has failed and
    a person is paged."""
    healthy_delay_minutes: int = Field(default=10, ge=0, le=120)
    """How long a remediated node must stay healthy before it is returned to service."""


class SloTargets(Model):
    """GPU availability promised to tenants, per trust level (a fraction in (0, 1))."""

    high: float = Field(default=0.99, gt=0, lt=1)
    medium: float = Field(default=0.995, gt=0, lt=1)
    low: float = Field(default=0.995, gt=0, lt=1)


class HealthLayer(Model):
    """GPU health: Node Problem Detector on every GPU node raising conditions for NVIDIA XID errors,
    and a bounded remediation loop (`components/health.py`)."""

    enabled: bool = False
    chart: Chart = Chart.pinned("node-problem-detector")
    namespace: DnsLabel = "node-problem-detector"
    xid_classes: dict[Annotated[int, Field(ge=1, le=999)], XidClass] = Field(default={}, max_length=999)
    """Overrides of the built-in XID table (`components.health.XID_TABLE`), e.g. `{31: needs-reset}`."""
    remediation: HealthRemediation = HealthRemediation()
    slo: SloTargets = SloTargets()
GpuModelName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][-A-Za-z0-9.]*$", max_length=40)]


class GpuPrices(Model):
    """The price table of the bill: one price per GPU-equivalent hour and GPU model. A
    GPU-equivalent is the same unit in every sharing mode (see README, "Metering"), so one price
    per model prices whole GPUs, MIG instances, HAMi slices, time-slices and DRA devices alike."""

    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")] = "EUR"
    """ISO 4217 code, the bill's FOCUS `BillingCurrency`."""
    gpu_hour: dict[GpuModelName, Annotated[float, Field(ge=0, le=10_000)]] = Field(default={}, max_length=64)
    """Price of one GPU-equivalent hour per GPU model of the fleet (`fleet.pools[].gpu.model`).
    `ai-factory bill` refuses a table that misses a model of the fleet."""


class OpenCostSettings(Model):
    """OpenCost, on the same Prometheus, prices what is not a GPU: CPU, memory and storage per
    namespace (a tenant's namespace is `tenant-<name>`). Its GPU price is 0: OpenCost prices every
    GPU alike and cannot see MIG instances or HAMi slices; GPU cost is the metering rules' and the
    bill's (`prices`)."""

    enabled: bool = True
    chart: Chart = Chart.pinned("opencost")
    cpu_core_hour: Annotated[float, Field(ge=0, le=1000)] = 0.031611
    ram_gib_hour: Annotated[float, Field(ge=0, le=1000)] = 0.004237
    storage_gib_hour: Annotated[float, Field(ge=0, le=1000)] = 0.00005479452
    """OpenCost's own on-premises defaults (per vCPU, GiB of memory and GiB of volume, per hour)."""


class MetricsLayer(Model):
    """kube-prometheus-stack (Prometheus Operator, Prometheus, Alertmanager, kube-state-metrics,
    node exporter), monitors for the GPU Operator's DCGM exporter and HAMi, the GPU metering
    recording rules, and a label-enforcing query proxy per tenant (see components/metrics.py)."""

    enabled: bool = False
    chart: Chart = Chart.pinned("kube-prometheus-stack")
    namespace: DnsLabel = "monitoring"
    retention_days: int = Field(default=45, ge=2, le=3650)
    """How long Prometheus keeps series; a bill can only cover a period still retained (the default
    covers a month and its closing two weeks)."""
    storage_gib: int = Field(default=200, ge=10, le=65536)
    """Size of each Prometheus replica's volume. Prometheus stops keeping data at 85% of it
    (`retentionSize`), whichever of time and size comes first."""
    storage_class: DnsLabel | None = None
    """StorageClass of the volume; None: the cluster's default class."""
    prices: GpuPrices = GpuPrices()
    opencost: OpenCostSettings = OpenCostSettings()


class ServingLayer(Model):
    """Model serving (`components/serving.py`): KServe in standard (raw Deployment) mode without
    Knative, a vLLM ServingRuntime per tenant, and each tenant's `models` as InferenceServices in
    its namespace; disaggregated or multi-node models as LLMInferenceServices on LeaderWorkerSet.
    Needs cert-manager (KServe's webhook
    certificates) and KEDA (autoscaling) in the cluster."""

    enabled: bool = True
    namespace: DnsLabel = "kserve"
    chart: Chart = Chart.pinned("kserve-resources")
    crd_chart: Chart = Chart.pinned("kserve-crd")
    llmisvc_chart: Chart = Chart.pinned("kserve-llmisvc-resources")
    llmisvc_crd_chart: Chart = Chart.pinned("kserve-llmisvc-crd")
    llmisvc_configs_chart: Chart = Chart.pinned("kserve-runtime-configs")
    """The llm-d presets LLMInferenceServices build on; their images (`ghcr.io/llm-d/...`) run in
    tenants' namespaces, so `layers.kyverno.allowed_registries` must allow them."""
    lws_chart: Chart = Chart.pinned("lws")
    lws_namespace: DnsLabel = "lws-system"
    vllm_image: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][-a-z0-9.:/_]*(:[-A-Za-z0-9_.]+)?(@sha256:[0-9a-f]{64})?$", max_length=MAX_TEXT)] = "nvcr.io/nvidia/vllm:26.05-py3"
    """The vLLM OpenAI-compatible server image every model runs (NVIDIA's build, vLLM 0.20.1)."""
    cache_storage_class: DnsLabel | None = None
    """StorageClass of the per-model download caches (in the tenant's namespace); None: the cluster default."""


Hostname = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$", max_length=253)]
"""A fully qualified DNS name without wildcard, e.g. `team-a.inference.example.com`."""


class DynamoLayer(Model):
    """NVIDIA Dynamo (`components/dynamo.py`): the `dynamo-platform` chart's operator, installed
    once, and per tenant model with `runtime: dynamo` a `DynamoGraphDeployment` in the tenant's
    namespace (a frontend and vLLM prefill/decode workers). The alternative to KServe's
    LLMInferenceService for environments that choose Dynamo; off by default."""

    enabled: bool = False
    namespace: DnsLabel = "dynamo-system"
    chart: Chart = Chart.pinned("dynamo-platform")
    runtime_image: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][-a-z0-9.:/_]*(:[-A-Za-z0-9_.]+)?(@sha256:[0-9a-f]{64})?$", max_length=MAX_TEXT)] = (
        "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.1.0"
    )
    """The image of a Dynamo model's frontend and workers (Dynamo's vLLM runtime, the operator's
    release); it runs in tenants' namespaces, so `layers.kyverno.allowed_registries` must allow it."""


class GatewayLayer(Model):
    """The shared inference Gateway (`components/gateway.py`): Gateway API on Cilium, one HTTPS
    listener per tenant hostname that admits only that tenant's routes, and per tenant one
    HTTPRoute to its exposed models (`tenants[].models[].expose`)."""

    enabled: bool = True
    namespace: DnsLabel = "inference-gateway"
    domain: Hostname = "inference.example.com"
    """Tenants' default hostname is `<tenant>.<domain>` (overridden by `tenants[].hostnames`)."""
    tls_secret: DnsLabel = "inference-gateway-tls"
    """The TLS Secret (in `namespace`) holding a certificate for every tenant hostname, e.g. a
    wildcard for `*.<domain>` issued by cert-manager; the listeners terminate TLS with it."""


class TeamBudget(Model):
    """A tenant's LiteLLM team: what its virtual keys may spend and how fast."""

    max_budget: float = Field(default=100.0, gt=0, le=10_000_000)
    """Spend ceiling per `budget_duration`, in LiteLLM's currency (USD)."""
    budget_duration: Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]{0,3}[smhd]$")] = "30d"
    """When the spend resets (LiteLLM duration: `30s`, `12h`, `30d`, ...)."""
    tpm_limit: int = Field(default=100_000, ge=1, le=1_000_000_000)
    """Tokens per minute over all of the team's keys."""
    rpm_limit: int = Field(default=600, ge=1, le=10_000_000)
    """Requests per minute over all of the team's keys."""
    keys: int = Field(default=1, ge=1, le=16)
    """Virtual keys issued to the team, each delivered to the tenant's namespace."""


class LiteLLMDatabase(Model):
    """The PostgreSQL database LiteLLM keeps teams, keys and spend in. It runs outside this library,
    as Keycloak's does; its password goes to OpenBao and reaches LiteLLM through External Secrets."""

    host: Annotated[str, StringConstraints(min_length=1, max_length=253)]
    port: int = Field(default=5432, ge=1, le=65535)
    name: DnsLabel = "litellm"
    username: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT)] = "litellm"
    password: SecretValue


class LiteLLMLayer(Model):
    """LiteLLM (`components/litellm.py`): the OpenAI-compatible front door to every exposed model,
    one team per tenant with its budget, limits and virtual keys. Needs `database`, `master_key`
    and OpenBao's `admin_token` while enabled."""

    enabled: bool = False
    chart: Chart = Chart.pinned("litellm")
    namespace: DnsLabel = "litellm"
    replicas: int = Field(default=2, ge=1, le=MAX_ITEMS)
    master_key: SecretValue | None = None
    """LiteLLM's admin key (`sk-...`): signs the management API calls that create teams and keys."""
    database: LiteLLMDatabase | None = None
    api_address: Annotated[str, StringConstraints(pattern=r"^https?://[^\s/]+$", max_length=MAX_TEXT)] | None = None
    """Where Pulumi reaches LiteLLM's management API; defaults to the in-cluster service."""
    default_budget: TeamBudget = TeamBudget()
    budgets: dict[DnsLabel, TeamBudget] = Field(default={}, max_length=MAX_TENANTS)
    """Per-tenant budgets overriding `default_budget`."""
    shared_models: list[Annotated[str, StringConstraints(max_length=128)]] = Field(default=[], max_length=MAX_ITEMS)
    """Served names (`tenants[].models[].served_name`) of exposed models every team may call besides its own."""
CHECKSUM_LENGTHS = {"sha256": 64, "sha512": 128}


class OsImage(Model):
    """The OS image Metal3 writes to a pool's nodes. It carries the NVIDIA driver the GPU Operator
    expects (`driver_version`, checked against the pool's `driver.version`): the operator finds it
    pre-installed and does not build its own."""

    url: Annotated[str, StringConstraints(pattern=r"^(https|oci)://[^\s/]+/\S*$", max_length=MAX_TEXT)]
    """Where Ironic downloads the image: https or an OCI registry (never plain http)."""
    checksum: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}([0-9a-f]{64})?$")]
    """Hex digest of the image (sha256 or sha512, the length says which); Ironic refuses an image
    that does not match it."""
    format: Literal["qcow2", "raw"] = "qcow2"
    driver_version: Annotated[str, StringConstraints(pattern=r"^[0-9][0-9A-Za-z.+-]*$", max_length=64)]
    """The NVIDIA driver installed in the image."""

    @property
    def checksum_type(self) -> str:
        return next(kind for kind, length in CHECKSUM_LENGTHS.items() if len(self.checksum) == length)


class FirmwareSetting(Model):
    """One BIOS setting of a pool, by the name the BMC's firmware schema gives it."""

    value: Annotated[str, StringConstraints(min_length=1, max_length=128)] | Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
    reason: Annotated[str, StringConstraints(min_length=10, max_length=MAX_TEXT)]
    """Why GPU nodes of this pool need it (kept next to the setting, and in the rendered object)."""


class PoolProvisioning(Model):
    """How Metal3 builds the nodes of one pool."""

    image: OsImage
    vendor: Literal["dell", "hpe", "fujitsu", "other"]
    """Server vendor: picks the built-in BIOS profile (`components.provisioning.BIOS_PROFILES`);
    `other` has none, so every setting comes from `firmware`."""
    boot_mode: Literal["UEFI", "UEFISecureBoot"] = "UEFISecureBoot"
    """Secure Boot by default; the image's bootloader and the driver's kernel modules must be signed."""
    firmware: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]+$", max_length=128)], FirmwareSetting] = Field(default={}, max_length=MAX_ITEMS)
    """BIOS settings added to, or replacing, the built-in profile's."""


class NcclThreshold(Model):
    """The least NCCL all-reduce bus bandwidth a node (or a pair of nodes) must reach."""

    gpu_model: GpuModelName
    scope: Literal["node", "pair"]
    """`node`: all GPUs of one node (the link is the pool's `intra_node`); `pair`: every GPU of two
    nodes of one rack pair, across the fabric (the link is the pool's `fabric`)."""
    link: Literal["pcie", "nvlink", "nvswitch", "ethernet", "roce", "infiniband"]
    min_busbw_gbps: float = Field(gt=0, le=10_000)
    source: Annotated[str, StringConstraints(min_length=3, max_length=MAX_TEXT)]
    """Where the figure comes from (a benchmark, a vendor document)."""


class AcceptanceImages(Model):
    """Container images of the gates."""

    dcgm: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][-a-z0-9.:/]*:[A-Za-z0-9._-]+$", max_length=MAX_TEXT)] = "nvcr.io/nvidia/cloud-native/dcgm:4.5.3-1-ubuntu22.04"
    """DCGM (`dcgmi`, `nvidia-smi` from the host driver): inventory, ECC, diagnostics and burn-in;
    the DCGM release of the GPU Operator's exporter (4.5.3)."""
    nccl_loopback: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][-a-z0-9.:/]*:[A-Za-z0-9._-]+$", max_length=MAX_TEXT)] = "ghcr.io/nvidia/nvsentinel/preflight-nccl-loopback:v1.14.0"
    """NVSentinel's preflight NCCL loopback check image (all GPUs of one node): the gate runs its
    nccl-tests binary, not its entrypoint (`ai_factory.factory.acceptance.nccl_tests`), so another
    image must hold `python3` and `/opt/nccl-tests/build/all_reduce_perf` likewise."""
    nccl_allreduce: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][-a-z0-9.:/]*:[A-Za-z0-9._-]+$", max_length=MAX_TEXT)] = "ghcr.io/nvidia/nvsentinel/preflight-nccl-allreduce:v1.14.0"
    """NVSentinel's preflight multi-node NCCL all-reduce check image (`nvcr.io/nvidia/pytorch`):
    the `nccl-pair` gate runs its `python3` and torch, not its entrypoint
    (`ai_factory.factory.acceptance.nccl_tests`), so another image must hold `python3` with a
    torch built with NCCL likewise."""


class AcceptanceSettings(Model):
    """The gates a node passes before tenants may use it (`ai_factory.factory.acceptance`)."""

    dcgm_diag_level: Literal[1, 2, 3, 4] = 3
    """`dcgmi diag -r <level>`: 3 (long, about 15 minutes) adds the targeted stress plugin."""
    burn_in_minutes: int = Field(default=60, ge=1, le=10_080)
    """Duration of the burn-in (DCGM targeted stress and power at full load)."""
    max_retired_pages: int = Field(default=0, ge=0, le=64)
    """Retired pages (or rows remapped after uncorrectable errors) a GPU may carry and still be
    accepted. 0 by default: a new GPU that already retires memory is degrading before any tenant
    used it (NVIDIA's replacement criterion for GPUs in service is far higher)."""
    nccl: list[NcclThreshold] | None = Field(default=None, max_length=MAX_ITEMS)
    """The bus-bandwidth table; None: the built-in one (`ai_factory.factory.acceptance.thresholds`).
    A table given here replaces it and must cover every GPU model and link of the fleet."""
    reruns: dict[Annotated[str, StringConstraints(max_length=253)], Annotated[int, Field(ge=0, le=1_000_000)]] = Field(default={}, max_length=MAX_FLEET_NODES)
    """Per node, how many times its acceptance was restarted (raise it after a remediation): a new
    count is a new gate generation, so earlier results no longer count."""
    results_file: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.][-A-Za-z0-9_./]*$", max_length=MAX_TEXT)] | None = None
    """Recorded gate results (relative to the project), read by `ai-factory accept` and by the
    fleet's taints; None: no node has results yet."""
    images: AcceptanceImages = AcceptanceImages()


class NetBoxSettings(Model):
    """The NetBox the acceptance results are written to and the racks and cables are read from."""

    url: Annotated[str, StringConstraints(pattern=r"^https://[^\s/]+(/[^\s]*)?$", max_length=MAX_TEXT)]
    token: SecretValue
    """An API token allowed to read DCIM and write devices' custom fields and journal entries."""
    site: Annotated[str, StringConstraints(min_length=1, max_length=100)] | None = None
    """The NetBox site slug the fleet's racks are read from; None: every site."""


class ProvisioningLayer(Model):
    """Bare-metal provisioning with Metal3 and node acceptance (`components/provisioning.py`):
    a `BareMetalHost` and `HostFirmwareSettings` per node with a BMC, BMC credentials from OpenBao,
    and the acceptance gates every explicit node passes before tenants may use it."""

    enabled: bool = False
    namespace: DnsLabel = "metal3-hosts"
    """Namespace of the hosts and their BMC Secrets (the baremetal-operator must watch it)."""
    acceptance_namespace: DnsLabel = "ai-factory-acceptance"
    """Namespace of the gate Jobs (privileged: they drive the GPUs and NICs)."""
    credentials_prefix: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-_/a-z0-9]*[a-z0-9])?$", max_length=253)] = "platform/bmc"
    """Where BMC credentials live in OpenBao's KV engine (`layers.openbao.kv_mount`)."""
    pools: dict[DnsLabel, PoolProvisioning] = Field(default={}, max_length=MAX_POOLS)
    """Per pool whose nodes have a BMC: image, vendor and BIOS settings."""
    acceptance: AcceptanceSettings = AcceptanceSettings()
    netbox: NetBoxSettings | None = None
class SlurmNodeResources(Model):
    """What the kubelet leaves allocatable to pods on each node of one pool. A tenant's slurmd on a
    node gets the share of it its GPUs are of the node's GPUs (rounded down), so the Slurm nodes of
    every tenant on one node never add up to more than the node."""

    cpus: int = Field(ge=1, le=4096)
    memory_gib: int = Field(ge=1, le=65536)


class SlurmAccounting(Model):
    """slurmdbd against a MySQL/MariaDB database run outside this library; its password is read
    from the tenant's OpenBao prefix (`tenants/<tenant>/<password_secret>`, property `password`)
    through the tenant's SecretStore (`layers.external_secrets`)."""

    host: Annotated[str, StringConstraints(min_length=1, max_length=253)]
    port: int = Field(default=3306, ge=1, le=65535)
    database: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]{1,64}$")] = "slurm_acct_db"
    username: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,80}$")] = "slurm"
    password_secret: DnsLabel = "slurm-accounting"
    """Key under the tenant's OpenBao prefix holding the database password (property `password`)."""


class SlurmCluster(Model):
    """A tenant's Slurm cluster (the `slurm` chart in its namespace): NodeSets from its grants on
    `pools`, a controller, the REST API, login nodes and, when asked, accounting."""

    tenant: DnsLabel
    pools: list[DnsLabel] = Field(min_length=1, max_length=MAX_POOLS)
    """Pools the tenant holds GPUs in whose grant becomes Slurm nodes (all of it, node by node)."""
    login_replicas: int = Field(default=1, ge=0, le=16)
    accounting: SlurmAccounting | None = None


class SlinkyLayer(Model):
    """Slinky: the Slurm operator once for the platform (its CRDs chart first) and a Slurm cluster
    per tenant listed in `clusters` (components/slinky.py)."""

    enabled: bool = False
    chart: Chart = Chart.pinned("slurm-operator")
    crds_chart: Chart = Chart.pinned("slurm-operator-crds")
    cluster_chart: Chart = Chart.pinned("slurm")
    namespace: DnsLabel = "slinky"
    node_resources: dict[DnsLabel, SlurmNodeResources] = Field(default={}, max_length=MAX_POOLS)
    """Allocatable CPUs and memory per node of each pool a cluster uses (required for those pools)."""
    clusters: list[SlurmCluster] = Field(default=[], max_length=MAX_TENANTS)


class VmPool(Model):
    """A pool whose nodes run VMs: the GPU Operator's sandbox workloads put every node of it in
    `vm-passthrough` (the VFIO manager binds all its GPUs to vfio-pci, the sandbox device plugin
    advertises them by PCI device name), so its GPUs serve VMs only, whole. On a DRA pool instead,
    each VM claims its GPUs from the DRA driver (`vfio.gpu.nvidia.com`) and the nodes stay as they are."""

    pci_device_id: Annotated[str, StringConstraints(pattern=r"^0x[0-9A-F]{4}10DE$")] | None = None
    """The nodes' GPU, in the catalog's form (`0x233010DE`); one of the model's PCI IDs, default its first.
    Not on a DRA pool, nor `resource_name`: the driver publishes the devices."""
    resource_name: Annotated[str, StringConstraints(pattern=r"^nvidia\.com/[A-Za-z0-9_]{1,100}$")] | None = None
    """What the sandbox device plugin advertises the GPU as; default from the PCI ID
    (`components.kubevirt.VM_RESOURCE_NAMES`), required for a device not listed there."""
    cpus_per_gpu: int = Field(default=16, ge=1, le=512)
    """Guest vCPUs an instance type gives per GPU."""
    memory_gib_per_gpu: int = Field(default=128, ge=1, le=8192)
    """Guest memory an instance type gives per GPU."""


class VmDisk(Model):
    """The VM's root disk: a DataVolume CDI imports from a registry image (a containerDisk)."""

    image: Annotated[str, StringConstraints(pattern=r"^docker://[^\s]+$", max_length=MAX_TEXT)]
    size_gib: int = Field(default=100, ge=1, le=65536)


class VirtualMachineRequest(Model):
    """One VM of the tenant, on `gpus` whole GPUs of a pool marked for VMs (`layers.kubevirt.pools`)."""

    name: DnsLabel
    pool: DnsLabel
    gpus: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE)
    disk: VmDisk
    running: bool = True


class VmTenant(Model):
    """A tenant that runs VMs: its instance types, its VMs, and the storage class of their disks."""

    tenant: DnsLabel
    storage_class: DnsLabel
    vms: list[VirtualMachineRequest] = Field(default=[], max_length=MAX_ITEMS)


class KubeVirtLayer(Model):
    """KubeVirt and CDI from their release manifests (`catalog.MANIFESTS`), GPU passthrough on the
    pools marked for VMs, and per tenant in `tenants` its instance types and VMs (components/kubevirt.py)."""

    enabled: bool = False
    pools: dict[DnsLabel, VmPool] = Field(default={}, max_length=MAX_POOLS)
    tenants: list[VmTenant] = Field(default=[], max_length=MAX_TENANTS)


class Layers(Model):
    gpu_operator: GpuOperatorLayer = GpuOperatorLayer()
    kueue: KueueLayer = KueueLayer()
    kai_scheduler: KaiSchedulerLayer = KaiSchedulerLayer()
    volcano: VolcanoLayer = VolcanoLayer()
    hami: HamiLayer = HamiLayer()
    dra: DraLayer = DraLayer()
    tenancy: TenancyLayer = TenancyLayer()
    cilium: CiliumLayer = CiliumLayer()
    keycloak: KeycloakLayer = KeycloakLayer()
    openbao: OpenBaoLayer = OpenBaoLayer()
    external_secrets: ExternalSecretsLayer = ExternalSecretsLayer()
    kyverno: KyvernoLayer = KyvernoLayer()
    falco: FalcoLayer = FalcoLayer()
    trivy: TrivyLayer = TrivyLayer()
    health: HealthLayer = HealthLayer()
    metrics: MetricsLayer = MetricsLayer()
    serving: ServingLayer = ServingLayer()
    dynamo: DynamoLayer = DynamoLayer()
    network: NetworkLayer = NetworkLayer()
    gateway: GatewayLayer = GatewayLayer()
    litellm: LiteLLMLayer = LiteLLMLayer()
    provisioning: ProvisioningLayer = ProvisioningLayer()
    slinky: SlinkyLayer = SlinkyLayer()
    kubevirt: KubeVirtLayer = KubeVirtLayer()


# --------------------------------------------------------------------------- identity


class Identity(Model):
    """The OIDC provider users sign in with. Every API server the platform runs for tenants (each
    vCluster) trusts it, with usernames and groups prefixed `oidc:` (`ai_factory.factory.model.tenancy.OIDC_PREFIX`)."""

    issuer_url: Annotated[str, StringConstraints(pattern=r"^https://[^\s/]+(/[^\s]*)?$", max_length=MAX_TEXT)]
    """The issuer (for Keycloak, `https://<host>/realms/<realm>`); API servers fetch its discovery document."""
    client_id: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT)] = "kubernetes"
    """The audience tokens must carry."""
    username_claim: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT)] = "email"
    groups_claim: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT)] = "groups"
    litellm_client_id: DnsLabel = "litellm"
    """Client of the LiteLLM gateway (its UI sign-in and the JWTs it accepts)."""
    dashboards_client_id: DnsLabel = "dashboards"
    """Client of the platform dashboards (Grafana, Hubble UI behind an OIDC proxy)."""

    @property
    def realm(self) -> str | None:
        """The Keycloak realm named by the issuer (`.../realms/<realm>`), None for another issuer."""
        head, _, realm = self.issuer_url.rstrip("/").rpartition("/realms/")
        return realm if head and realm and "/" not in realm else None

    @property
    def server_url(self) -> str:
        """The issuer without its `/realms/<realm>` suffix: Keycloak's public URL."""
        return self.issuer_url.rstrip("/").rpartition("/realms/")[0]

    def vcluster_client_id(self, tenant: str) -> str:
        """The client a tenant's vCluster API server accepts (`--oidc-client-id`): one per tenant, so
        a token issued for one tenant's API server is refused by every other."""
        return f"{self.client_id}-{tenant}"


# --------------------------------------------------------------------------- tenants


class Owners(Model):
    groups: list[Annotated[str, StringConstraints(min_length=1, max_length=128)]] = Field(min_length=1, max_length=MAX_ITEMS)
    """Identity-provider groups whose members administer the tenant."""
    users: list[Annotated[str, StringConstraints(min_length=1, max_length=254)]] = Field(default=[], max_length=MAX_ITEMS)


class GpuDemand(Model):
    """What a tenant is guaranteed on one pool. Which fields apply depends on the pool's sharing:
    `count` whole GPUs (exclusive, dra), `mig` instances by profile (mig), `count` replicas
    (time-slicing), or `count` vGPUs of `memory_mib` and `cores_percent` each (hami)."""

    pool: DnsLabel
    count: int | None = Field(default=None, ge=1, le=MAX_GPU_UNITS)
    mig: dict[Annotated[str, StringConstraints(max_length=64)], Annotated[int, Field(ge=1, le=MAX_GPU_UNITS)]] = Field(default={}, max_length=MAX_ITEMS)
    memory_mib: int | None = Field(default=None, ge=256, le=1 << 24)
    cores_percent: int | None = Field(default=None, ge=1, le=100)
    rdma: bool | None = None
    """An RDMA network for this demand on the pool's fabric (its own partition key or VLAN): `None`
    (default) when the plan spreads the tenant's GPUs on the pool over several nodes, `true` always
    (multi-pod jobs inside one node too), `false` never. Only on an RDMA pool exposing SR-IOV."""
    memory_oversubscription: float = Field(default=1.0, ge=1.0, le=4.0)
    """HAMi only: device-memory scaling on this tenant's GPUs (HAMi `deviceMemoryScaling`). 1 = no
    oversubscription, the default; above 1 the tenant opts in to sharing memory that may not be there."""


Quantity = Annotated[str, StringConstraints(pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$", max_length=32)]
"""A Kubernetes resource quantity, e.g. `64`, `500m`, `512Gi`."""


class TenantQuota(Model):
    """The tenant's ResourceQuota beyond GPUs (GPU lines come from the plan). NodePorts are always 0."""

    cpu: Quantity = "64"
    """`requests.cpu`."""
    memory: Quantity = "512Gi"
    """`requests.memory` and `limits.memory`."""
    storage: Quantity = "10Ti"
    """`requests.storage` (persistent volume claims)."""
    ephemeral_storage: Quantity = "500Gi"
    """`requests.ephemeral-storage`."""
    pods: int = Field(default=200, ge=1, le=MAX_QUOTA_COUNT)
    persistent_volume_claims: int = Field(default=50, ge=0, le=MAX_QUOTA_COUNT)
    services: int = Field(default=50, ge=0, le=MAX_QUOTA_COUNT)
    load_balancers: int = Field(default=0, ge=0, le=MAX_QUOTA_COUNT)
    """`services.loadbalancers`; 0 by default: tenant services are reached through platform gateways."""
    configmaps: int = Field(default=200, ge=0, le=MAX_QUOTA_COUNT)
    secrets: int = Field(default=200, ge=0, le=MAX_QUOTA_COUNT)


class Borrowing(Model):
    """How the tenant's GPU quota is shared with the other tenants of its trust domain (never beyond
    it: every GPU flavor belongs to one trust domain). The default is a guarantee: what the plan
    gives the tenant is never lent away, and it may borrow whatever its domain leaves idle."""

    lendable_percent: int = Field(default=0, ge=0, le=100)
    """Share of each GPU quota that domain peers may borrow while the tenant leaves it idle (taken
    back by preemption when the tenant needs it). 0 = a guaranteed share that is never lent."""
    limit_percent: int | None = Field(default=None, ge=0, le=100_000)
    """How far the tenant may go beyond each GPU quota by borrowing, as a percentage of that quota
    (0 = never); None = as far as its trust domain has idle capacity."""
    fair_share_weight: int = Field(default=1, ge=1, le=1000)
    """The tenant's weight when domain peers compete for idle capacity (Kueue fair sharing, KAI
    over-quota weight, Volcano queue weight)."""


# --------------------------------------------------------------------------- serving

MAX_MODELS = 64
"""Models one tenant may declare."""

ModelSourceUri = Annotated[
    str,
    StringConstraints(
        pattern=r"^(hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*(@[A-Za-z0-9][-A-Za-z0-9_.]*)?"
        r"|s3://[a-z0-9][-a-z0-9.]{1,61}[a-z0-9](/[-A-Za-z0-9_.=/]*)?"
        r"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[-A-Za-z0-9_./]*)?)$",
        max_length=MAX_TEXT,
    ),
]
"""Where the weights come from: `hf://<org>/<model>[@<revision>]` (Hugging Face Hub; pin a
revision: a branch moves), `s3://<bucket>/<prefix>` or `pvc://<claim>/<path>` (a claim in the
tenant's own namespace). Never holds a credential: those are `credentials`."""

OpenBaoKey = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9_]*[a-z0-9])?(/[a-z0-9]([-a-z0-9_]*[a-z0-9])?){0,3}$", max_length=128)]
"""A key under the tenant's prefix of OpenBao's KV engine (`tenants/<tenant>/<key>`)."""

_PLAINTEXT_HINT = re.compile(r"(hf_[A-Za-z0-9]{8,}|AKIA[0-9A-Z]{12,}|ASIA[0-9A-Z]{12,}|://[^/@\s]*:[^/@\s]*@)")
"""Shapes of credentials typed in clear: a Hugging Face token, an AWS access key id, `user:pass@`."""


def _no_plaintext_credential(value: object) -> object:
    if isinstance(value, str) and _PLAINTEXT_HINT.search(value):
        raise ValueError(
            "holds a plaintext credential; store it in OpenBao under `tenants/<tenant>/<key>` and "
            "name that key in `credentials.secret`"
        )
    return value


class ModelCredentials(Model):
    """The source's credentials, read from OpenBao by the tenant's own SecretStore (External
    Secrets) into a Secret of the tenant's namespace; the config only ever names the key."""

    secret: OpenBaoKey
    """Key under `tenants/<tenant>/` holding the credential, e.g. `hf-token`."""
    properties: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=64)], Annotated[str, StringConstraints(pattern=r"^[-A-Za-z0-9_.]+$", max_length=128)]] = Field(
        default={}, max_length=8
    )
    """Environment variable of the model download -> property of the OpenBao secret. Default by
    scheme: `HF_TOKEN: token` for hf://, `AWS_ACCESS_KEY_ID: access_key_id` and
    `AWS_SECRET_ACCESS_KEY: secret_access_key` for s3://."""


def _port_in_range(value: str) -> str:
    _, colon, port = value.rpartition(":")
    if colon and not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port} is not between 1 and 65535")
    return value


class S3Settings(Model):
    """Where and how KServe's storage initializer reaches an `s3://` source: written as KServe's
    `serving.kserve.io/s3-*` annotations on the source's credential Secret, which KServe's
    credential builder turns into the initializer's `S3_ENDPOINT`, `AWS_ENDPOINT_URL`,
    `AWS_DEFAULT_REGION`, `S3_USE_HTTPS` and `S3_VERIFY_SSL`. Unset fields keep KServe's defaults
    (AWS S3, HTTPS, certificates verified)."""

    endpoint: Annotated[
        str,
        StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(:[0-9]{1,5})?$", max_length=253),
        AfterValidator(_port_in_range),
    ] | None = None
    """Host and optional port of an S3-compatible store, without scheme (`use_https` gives it),
    e.g. `minio.storage.svc:9000` or `s3.eu-par-1.example.com`."""
    region: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][-a-z0-9]{0,31}$")] | None = None
    """E.g. `eu-west-3`."""
    use_https: bool = True
    """Reach the endpoint over HTTPS (`s3-usehttps`); off only for an in-cluster store on plain HTTP."""
    verify_ssl: bool = True
    """Verify the endpoint's certificate (`s3-verifyssl`)."""


def _refuse_plain_credentials(value: object) -> object:
    if isinstance(value, str):
        raise ValueError(
            "a plaintext credential is refused; store it in OpenBao under `tenants/<tenant>/<key>` "
            "and give `{secret: <key>}`"
        )
    return value


class ModelGpus(Model):
    """The GPUs one replica uses, on a pool the tenant is granted (`tenants[].gpus`). Which field
    applies follows the pool's sharing, as for a demand: `count` whole GPUs (exclusive; dra: one
    claim per GPU from the tenant's ResourceClaimTemplate), one MIG instance of profile `mig`
    (mig), or one HAMi slice of `memory_mib` and `cores_percent` (hami; defaults to the tenant's
    granted slice)."""

    pool: DnsLabel
    count: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE * 64)
    """Whole GPUs per replica; equals tensor x pipeline parallelism. Above a node's GPUs the
    replica spans nodes (LeaderWorkerSet), one node per pipeline stage."""
    mig: Annotated[str, StringConstraints(max_length=64)] | None = None
    """A MIG profile of the pool's GPU model, e.g. `3g.40gb` (one instance per replica: vLLM
    runs one process per MIG device, and MIG instances share no NVLink)."""
    memory_mib: int | None = Field(default=None, ge=256, le=1 << 24)
    """HAMi slice memory; default: the tenant's granted slice on this pool."""
    cores_percent: int | None = Field(default=None, ge=1, le=100)
    """HAMi slice compute; default: the tenant's granted slice on this pool."""


class ModelMemory(Model):
    """What a replica must hold in GPU memory: its weights (declared, or `parameters_billion` x
    bytes per `dtype`) plus `kv_cache_gib` of KV-cache headroom. A model whose total does not fit
    its slice (times `gpu_memory_utilization`) is refused before anything is rendered."""

    weights_gib: float | None = Field(default=None, gt=0, le=65536)
    parameters_billion: float | None = Field(default=None, gt=0, le=100_000)
    dtype: Literal["float32", "bfloat16", "float16", "fp8", "int8", "int4"] = "bfloat16"
    """Weight precision; with `parameters_billion` it gives the weights' size."""
    kv_cache_gib: float = Field(default=2.0, gt=0, le=65536)
    """KV-cache headroom of one replica (over all its GPUs) beyond the weights; on MIG instances and
    HAMi slices vLLM is given exactly this much (`--kv-cache-memory-bytes`)."""

    @model_validator(mode="after")
    def _one_size(self) -> ModelMemory:
        if (self.weights_gib is None) == (self.parameters_billion is None):
            raise ValueError("give exactly one of `weights_gib` or `parameters_billion`")
        return self


def _between(low: str, high: str):
    """A quantity bound, e.g. cores of a pod: `low` and `high` as quantities."""

    def check(value: str) -> str:
        if not parse_quantity(low) <= parse_quantity(value) <= parse_quantity(high):
            raise ValueError(f"{value} is not between {low} and {high}")
        return value

    return AfterValidator(check)


class ModelResources(Model):
    """CPU and memory of each pod of the model besides its GPUs: vLLM's API server, tokenizer and
    the weights' loading buffers (weights are memory-mapped, not held in RAM). The memory limit
    equals the request. Every pod at the model's maximum replicas counts against the tenant's
    `quota` (its ResourceQuota); a model whose pods cannot fit it is refused."""

    cpu: Annotated[Quantity, _between("100m", "512")] = "4"
    """`requests.cpu` of a model pod, 100m to 512 cores (no CPU limit: throttling slows
    tokenisation for nothing)."""
    memory: Annotated[Quantity, _between("1Gi", "8Ti")] = "16Gi"
    """`requests.memory` and `limits.memory` of a model pod, 1Gi (KServe's storage initializer's
    own limit, so a pod's figure is its model container's) to 8Ti."""


class ModelReplicas(Model):
    min: int = Field(default=1, ge=1, le=1000)
    """Replicas always running (no scale to zero: raw deployments keep a pod to answer)."""
    max: int = Field(default=1, ge=1, le=1000)
    """The planner reserves GPUs for `max` replicas inside the tenant's grant."""

    @model_validator(mode="after")
    def _ordered(self) -> ModelReplicas:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


class ModelScaling(Model):
    """What scales replicas between `min` and `max`: an LLM signal from vLLM's own metrics
    (scraped by the platform Prometheus), not CPU."""

    metric: Literal["queue-depth", "kv-cache"] = "queue-depth"
    """`queue-depth`: requests waiting per replica (`vllm:num_requests_waiting`); `kv-cache`: KV-cache
    use per replica in percent (`vllm:kv_cache_usage_perc`)."""
    target: float = Field(default=5, gt=0, le=10_000)
    """Per-replica value above which a replica is added (requests, or percent for `kv-cache`)."""


class Disaggregation(Model):
    """Prefill/decode separation (KServe LLMInferenceService with llm-d, or Dynamo's prefill and
    decode workers): prefill replicas of the same GPU shape hand their KV cache to the decode
    replicas (`replicas`)."""

    prefill_replicas: int = Field(default=1, ge=1, le=1000)


class ServedModel(Model):
    """One model a tenant serves: a KServe InferenceService in the tenant's namespace (or an
    LLMInferenceService when it is disaggregated or spans nodes), on vLLM."""

    name: DnsLabel
    """The model's name in the tenant: its InferenceService and Service names derive from it."""
    source: Annotated[ModelSourceUri, BeforeValidator(_no_plaintext_credential)]
    """E.g. `hf://Qwen/Qwen3-8B@main`."""
    credentials: Annotated[ModelCredentials | None, BeforeValidator(_refuse_plain_credentials)] = None
    """For a gated or private source; None for a public one."""
    s3: S3Settings | None = None
    """Endpoint, region and TLS of an `s3://` source (with `credentials`); None: AWS S3 over HTTPS."""
    engine: Literal["vllm"] = "vllm"
    runtime: Literal["kserve", "dynamo"] = "kserve"
    """What serves the engine: `kserve` (an InferenceService, or an LLMInferenceService when
    disaggregated or multi-node), or `dynamo` (an NVIDIA Dynamo `DynamoGraphDeployment`, which
    needs `layers.dynamo`; its replicas stay on one node each)."""
    served_name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][-A-Za-z0-9_./:]*$", max_length=128)] | None = None
    """The name clients call (OpenAI `model`); default: `<tenant>/<name>`."""
    gpus: ModelGpus
    tensor_parallel: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE * 64)
    """Must fit inside one NVLink/NVSwitch domain of the pool."""
    pipeline_parallel: int = Field(default=1, ge=1, le=64)
    memory: ModelMemory
    gpu_memory_utilization: float = Field(default=0.9, ge=0.1, le=0.95)
    """Share of the replica's GPU memory vLLM takes (`--gpu-memory-utilization`); under HAMi vLLM
    sees the slice as the device, so it is a share of the slice."""
    max_model_len: int = Field(default=8192, ge=128, le=10_000_000)
    """Context length (vLLM `--max-model-len`)."""
    replicas: ModelReplicas = ModelReplicas()
    scaling: ModelScaling = ModelScaling()
    resources: ModelResources = ModelResources()
    disaggregation: Disaggregation | None = None
    expose: bool = False
    """Route the model through the shared inference gateway (and LiteLLM); off: reachable only
    from the tenant's own namespace."""
    cache_gib: int | None = Field(default=None, ge=1, le=65536)
    """Size of the model's download cache, a volume in the tenant's namespace only; default: the
    weights' size plus a quarter, rounded up."""
class TenantVpc(Model):
    """A VPC (overlay network) the tenant's pods join through a secondary interface. The fabric
    (VXLAN/EVPN on the leaf switches, or BlueField DPUs running OVN/OVS in their Arm cores) is
    managed outside Kubernetes; this names what Kubernetes needs to use it (see README, "Fast path")."""

    name: DnsLabel
    kind: Literal["evpn", "dpu"]
    """`evpn`: the leaf switches map `vlan` on the nodes' uplinks to the VXLAN `vni`; `dpu`: the
    nodes' BlueField DPUs map their host-facing representor to `vni`."""
    vni: int = Field(ge=1, le=16_777_215)
    """The VXLAN network identifier of the VPC, as the external fabric manager defines it."""
    vlan: VlanId
    """The VLAN the external fabric hands the VPC over on (leaf port or DPU host interface)."""
    uplink: Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9][-_.a-zA-Z0-9]*$", max_length=15)]
    """The node interface that carries `vlan` (a bond or a DPU host interface), as on every node of
    the tenant's pools."""
    subnet: Annotated[str, StringConstraints(max_length=18), AfterValidator(_ipv4_network)]
    """The VPC's addresses handed to the tenant's pods (nv-ipam), as the VPC's routing expects."""


class TenantNetwork(Model):
    """The tenant's fast-path networks. Keys are allocated by the planner and recorded in the plan
    lock; give one here only to keep a key an outside system already uses."""

    pkey: PartitionKey | None = None
    """The tenant's InfiniBand partition key (unique in the fleet)."""
    vlan: VlanId | None = None
    """The tenant's VLAN on every RoCE fabric it uses (unique per site's RoCE fabric)."""
    vpc: TenantVpc | None = None


class Tenant(Model):
    name: DnsLabel
    trust: Trust
    """`high`: trusted internal team; `medium`: internal but separately accountable; `low`: external
    or untrusted code. Low-trust tenants get whole GPUs on dedicated nodes only."""
    trust_domain: DnsLabel | None = None
    """Tenants of one trust domain may share physical GPUs. Defaults to the tenant's own name."""
    isolation: Literal["namespace", "vcluster"] | None = None
    """Control plane: `namespace` for trusted teams, a `vcluster` (own API server) otherwise.
    Defaults by trust: `high` -> namespace, `medium`/`low` -> vcluster."""
    owners: Owners
    gpus: list[GpuDemand] = Field(default=[], max_length=MAX_ITEMS)
    quota: TenantQuota = TenantQuota()
    borrowing: Borrowing = Borrowing()
    network: TenantNetwork = TenantNetwork()
    organisation: DnsLabel | None = None
    """The organisation the tenant's trust domain belongs to: its Kueue cohort and KAI queue nest
    under the organisation's, which shares fairly between its domains. All tenants of a trust
    domain name the same organisation (or none)."""
    clusters: list[DnsLabel] | None = Field(default=None, max_length=MAX_ITEMS)
    """The clusters the tenant is placed on (each gets its namespace, queue and quota there);
    default: the clusters of the pools it demands GPUs on, or the manager cluster."""
    ring: DnsLabel | None = None
    """Its upgrade ring (`upgrades.rings`); default: the last ring."""
    models: list[ServedModel] = Field(default=[], max_length=MAX_MODELS)
    """Models the tenant serves (`ai_factory.factory.model.serving`); their replicas at `max` are
    planned inside the tenant's `gpus`."""
    hostnames: list[Hostname] = Field(default=[], max_length=16)
    """Hostnames the tenant's exposed models answer at on the shared inference gateway, each owned
    by this tenant alone; default: `<tenant>.<layers.gateway.domain>`."""
    managed_by: Literal["platform", "tenant-stack"] = "platform"
    """Which stack builds the tenant's environment: the platform stack, or the tenant's own stack
    (`stacks/tenants.py`, the tenant API), so that its changes and deletion never touch the
    platform stack. Either way the platform plans the tenant with the others."""

    def upgrade_ring(self, rings: list[str]) -> str:
        return self.ring or rings[-1]

    @property
    def domain(self) -> str:
        return self.trust_domain or self.name

    @property
    def control_plane(self) -> Literal["namespace", "vcluster"]:
        return self.isolation or ("namespace" if self.trust == "high" else "vcluster")


# --------------------------------------------------------------------------- matrix


class MatrixException(Model):
    """A reviewed pin outside the matrix version (`factory/model/matrix.yaml`): one config path
    and the exact value allowed there, so a later change of that pin is refused again."""

    pin: Annotated[str, StringConstraints(pattern=r"^[a-z_]+(\[[0-9]+\]|\.[a-z_]+)*$", max_length=MAX_TEXT)]
    """The path `ai-factory check` names, e.g. `layers.kueue.chart.version` or `fleet.pools[0].sharing`."""
    value: Text
    reason: Annotated[str, StringConstraints(min_length=10, max_length=MAX_TEXT)]
    approved_by: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT)]


class MatrixSettings(Model):
    """Which version of the version-locked matrix the environment runs (`ai-factory matrix`)."""

    version: Annotated[str, StringConstraints(pattern=r"^[0-9]{4}\.[0-9]{2}(\.[0-9]+)?$", max_length=16)] | None = None
    """A matrix version, e.g. `2026.12`; None: the newest. `ai-factory upgrade --to` moves it."""
    exceptions: list[MatrixException] = Field(default=[], max_length=MAX_ITEMS)


# --------------------------------------------------------------------------- upgrades

GATES = ("nodes-ready", "gpu-allocatable", "no-new-faults", "workloads-admitted")
"""The health gates an upgrade can hold each ring to (`ai_factory.stacks.upgrade`)."""
Gate = Literal["nodes-ready", "gpu-allocatable", "no-new-faults", "workloads-admitted"]


class UpgradeProgress(Model):
    """An upgrade under way, as `ai-factory upgrade` records it in the stack's config: the
    tenants of the rings in `done` run the `to` version of the ringed charts, the others `from`."""

    from_version: Annotated[str, StringConstraints(pattern=r"^[0-9]{4}\.[0-9]{2}(\.[0-9]+)?$", max_length=16)]
    to: Annotated[str, StringConstraints(pattern=r"^[0-9]{4}\.[0-9]{2}(\.[0-9]+)?$", max_length=16)]
    done: list[DnsLabel] = Field(default=[], max_length=MAX_ITEMS)


class Upgrades(Model):
    """Upgrade waves: tenants (their vClusters, per-tenant releases and queues) move ring by ring,
    each ring held to the health gates before the next starts."""

    rings: list[DnsLabel] = Field(default=["canary", "early", "broad"], min_length=1, max_length=16)
    """In upgrade order. A low-trust tenant is never in the first ring."""
    gates: list[Gate] = Field(default=list(GATES), max_length=len(GATES))
    """The named health gates every ring must pass (`nodes-ready`: every node Ready;
    `gpu-allocatable`: each GPU node advertises again what it did before; `no-new-faults`: no GPU
    fault condition appeared; `workloads-admitted`: the ring's tenants' workloads are admitted)."""
    in_progress: UpgradeProgress | None = None


# --------------------------------------------------------------------------- environment


class SelfService(Model):
    """Tenants that may onboard themselves through the tenant API, without the platform team
    editing `tenants` (`ai_factory.factory.model.onboarding`). Off while `trust` is empty."""

    trust: list[Trust] = Field(default=[], max_length=3)
    """Trust levels a self-service tenant may declare."""
    pools: list[DnsLabel] = Field(default=[], max_length=MAX_POOLS)
    """Pools its GPU demands may name."""
    max_gpus: int = Field(default=0, ge=0, le=4096)
    """The most its demands may add up to: one per whole GPU, MIG instance, replica or slice."""


class FactoryConfig(Model):
    kubernetes: KubernetesSpec = KubernetesSpec()
    fleet: Fleet
    layers: Layers = Layers()
    identity: Identity | None = None
    """Required as soon as a tenant has its own control plane (vCluster)."""
    tenants: list[Tenant] = Field(default=[], max_length=MAX_TENANTS)
    self_service: SelfService = SelfService()
    matrix: MatrixSettings = MatrixSettings()
    upgrades: Upgrades = Upgrades()
    _environment: FactoryConfig | None = PrivateAttr(default=None)

    @property
    def environment(self) -> FactoryConfig | None:
        """The whole environment, when this config is one cluster's view of it
        (`ai_factory.factory.model.clusters.cluster_view`)."""
        return self._environment

    def pool(self, name: str) -> Pool:
        return next(p for p in self.fleet.pools if p.name == name)


SECTIONS: tuple[str, ...] = tuple(FactoryConfig.model_fields)
"""The top-level keys of the `ai-factory:` config namespace."""
