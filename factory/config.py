"""The typed configuration of one environment: the single source of truth.

Read from the `ai-factory:` namespace of `Pulumi.<env>.yaml` (offline) or through `pulumi.Config`
(inside `pulumi up`); see `factory.loading`. Every model rejects unknown keys and is immutable.
Field-level rules live on the fields; rules that relate several parts of the config (a tenant
naming a pool, duplicate names, trust rules) live in `factory.loading.cross_check` so that every
problem is reported at once, with its path.

Adding a platform layer is adding a field to `Layers` (its settings model, defaults documented
here) and a component in `components/` listed in `components.LAYERS`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from factory.catalog import CHARTS, ChartSource
from factory.secrets import SecretValue

DnsLabel = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=40),
]
"""A name that is also usable as (part of) a Kubernetes object name and label value."""

Sharing = Literal["exclusive", "mig", "time-slicing", "hami", "dra"]
Trust = Literal["high", "medium", "low"]

SUPPORTED_KUBERNETES = ("1.32", "1.33", "1.34", "1.35", "1.36", "1.37")


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- kubernetes


class KubernetesSpec(Model):
    version: Literal[SUPPORTED_KUBERNETES] = "1.34"  # type: ignore[valid-type]
    """Target Kubernetes minor version. Objects are validated against its schema; 1.34 is the first
    release with DRA (resource.k8s.io/v1) generally available."""


# --------------------------------------------------------------------------- fleet


class Site(Model):
    name: DnsLabel
    """A data centre. Pools name the site they live in."""
    region: str = ""
    """Free-form location, carried onto node labels for placement and reporting."""


class NumaDomain(Model):
    """One NUMA node of a GPU server: which GPUs, NICs and CPU cores share it."""

    node: int = Field(ge=0)
    gpus: list[int] = Field(min_length=1)
    """GPU indexes (as the driver numbers them) attached to this NUMA node."""
    nics: list[str] = []
    """RDMA NIC names (e.g. `mlx5_0`) on this NUMA node, paired with its GPUs for GPUDirect RDMA."""
    cpus: str = ""
    """CPU list in cpuset syntax, e.g. `0-47`."""


class Topology(Model):
    """How a pool's GPUs and nodes are wired; the scheduler keeps gangs inside the fastest domain."""

    intra_node: Literal["pcie", "nvlink", "nvswitch"] = "pcie"
    """GPU-to-GPU link inside a node."""
    fabric: Literal["ethernet", "roce", "infiniband"] = "ethernet"
    """The node-to-node GPU fabric."""
    nodes_per_nvlink_domain: int = Field(default=1, ge=1)
    """Nodes that share one multi-node NVLink domain (e.g. 18 for a GB200 NVL72 rack); 1 = none."""
    nodes_per_rack: int = Field(default=8, ge=1)
    """Nodes per rack when nodes are given by count (explicit nodes carry their own rack)."""
    racks_per_block: int = Field(default=4, ge=1)
    """Racks per network block (leaf/spine group, or InfiniBand sub-tree) when nodes are given by count."""
    numa: list[NumaDomain] = []
    """GPU/NIC/CPU affinity per NUMA node; empty = unknown (no alignment is promised)."""


class NodeSpec(Model):
    name: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", max_length=253)]
    """The Kubernetes node name."""
    rack: DnsLabel
    block: DnsLabel = "block-0"
    nvlink_domain: DnsLabel | None = None
    """Multi-node NVLink domain; defaults to the rack when the pool has multi-node NVLink."""


class GpuSpec(Model):
    model: str
    """A GPU model of the catalog (`factory.gpus.GPU_MODELS`), e.g. `H100-80GB`."""
    per_node: int = Field(ge=1, le=16)


class DriverSettings(Model):
    """NVIDIA driver for one pool, installed by the GPU Operator through an `NVIDIADriver` resource."""

    version: str = "595.91.07"
    """Driver version (the GPU Operator chart's default for v26.7.0)."""
    kernel_module_type: Literal["auto", "open", "proprietary"] = "auto"
    use_precompiled: bool = False


class TimeSlicing(Model):
    replicas: int = Field(default=4, ge=2, le=64)
    """Time-sliced replicas advertised per GPU."""


class HamiPool(Model):
    split_count: int = Field(default=10, ge=1, le=64)
    """HAMi `deviceSplitCount`: at most this many containers on one GPU."""


class Pool(Model):
    name: DnsLabel
    site: DnsLabel
    gpu: GpuSpec
    nodes: int | None = Field(default=None, ge=1)
    """Node count; nodes are then named `<pool>-<nnn>` (the provisioning layer names them so)."""
    node_list: list[NodeSpec] | None = None
    """Explicit nodes; exclusive with `nodes`."""
    sharing: Sharing = "exclusive"
    """How GPUs of this pool are offered: whole GPUs (`exclusive`, or through DRA claims with
    `dra`), MIG instances, time-sliced replicas or HAMi soft slices. Sharing is only ever granted
    inside one trust domain; the planner decides which GPU serves which domain."""
    topology: Topology = Topology()
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
    sites: list[Site] = Field(min_length=1)
    pools: list[Pool] = Field(min_length=1)


# --------------------------------------------------------------------------- layers


class Chart(Model):
    """A pinned chart. Versions are exact: ranges would make renders non-reproducible."""

    version: Annotated[str, StringConstraints(pattern=r"^v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")]
    repository: str

    @classmethod
    def pinned(cls, product: str) -> Chart:
        source = CHARTS[product]
        return cls(version=source.version, repository=source.repository)

    def source(self, product: str) -> ChartSource:
        pin = CHARTS[product]
        return ChartSource(name=pin.name, repository=self.repository, version=self.version, oracle_dir=pin.oracle_dir)


class RegistryCredentials(Model):
    """Pull credentials for a private image registry (e.g. NGC for licensed driver images)."""

    server: str = "nvcr.io"
    username: str = "$oauthtoken"
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


class Layers(Model):
    gpu_operator: GpuOperatorLayer = GpuOperatorLayer()


# --------------------------------------------------------------------------- tenants


class Owners(Model):
    groups: list[Annotated[str, StringConstraints(min_length=1, max_length=128)]] = Field(min_length=1)
    """Identity-provider groups whose members administer the tenant."""
    users: list[str] = []


class GpuDemand(Model):
    """What a tenant is guaranteed on one pool. Which fields apply depends on the pool's sharing:
    `count` whole GPUs (exclusive, dra), `mig` instances by profile (mig), `count` replicas
    (time-slicing), or `count` vGPUs of `memory_mib` and `cores_percent` each (hami)."""

    pool: DnsLabel
    count: int | None = Field(default=None, ge=1)
    mig: dict[str, Annotated[int, Field(ge=1)]] = {}
    memory_mib: int | None = Field(default=None, ge=256)
    cores_percent: int | None = Field(default=None, ge=1, le=100)
    memory_oversubscription: float = Field(default=1.0, ge=1.0, le=4.0)
    """HAMi only: device-memory scaling on this tenant's GPUs (HAMi `deviceMemoryScaling`). 1 = no
    oversubscription, the default; above 1 the tenant opts in to sharing memory that may not be there."""


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
    gpus: list[GpuDemand] = []

    @property
    def domain(self) -> str:
        return self.trust_domain or self.name

    @property
    def control_plane(self) -> Literal["namespace", "vcluster"]:
        return self.isolation or ("namespace" if self.trust == "high" else "vcluster")


# --------------------------------------------------------------------------- environment


class FactoryConfig(Model):
    kubernetes: KubernetesSpec = KubernetesSpec()
    fleet: Fleet
    layers: Layers = Layers()
    tenants: list[Tenant] = []

    def pool(self, name: str) -> Pool:
        return next(p for p in self.fleet.pools if p.name == name)


SECTIONS: tuple[str, ...] = tuple(FactoryConfig.model_fields)
"""The top-level keys of the `ai-factory:` config namespace."""
