"""Slinky: the Slurm operator once for the platform, and a Slurm cluster per tenant that asks.

Platform (this component): the `slurm-operator-crds` chart, then the `slurm-operator` chart
(the operator, restricted; its admission webhook off, see `operator_values`) in
`layers.slinky.namespace`.

Per tenant listed in `layers.slinky.clusters` (`SlinkyTenantHook`): the `slurm` chart in the
tenant's host namespace (a vCluster tenant's too: the operator watches the host), with

* NodeSets derived from the plan, never typed: for every granted pool, the tenant's GPUs node by
  node (`gpu_grants`), grouped by identical shape; each group is one NodeSet whose `replicas` is
  its node count, whose pods are pinned to exactly those nodes (required node affinity on
  `kubernetes.io/hostname`, one pod per node by the operator's own anti-affinity, `pinToNode`) and
  whose slurmd container requests and limits exactly the group's GPU resources and its share of
  the node's CPUs and memory (`layers.slinky.node_resources`, split by GPU share and rounded
  down). The node's `Gres=` is written from the same numbers as the pod's GPU limits, and gres.conf
  only auto-detects the devices the container was given, so a GRES count can never disagree with
  the devices, and two tenants' Slurm nodes on one Kubernetes node add up to at most what the plan
  gave them there, hence to at most the node. Whole GPUs are `gpu:<count>` (no type: the type is
  the pool, a partition and a feature, so Slurm's auto-detected model name can never mismatch a
  configured one); MIG instances are `gpu:<profile>:<count>` per profile. Slurm cannot express
  media-extension profiles (`+me`), time-slicing replicas, HAMi slices or DRA claims: asking for
  Slurm on such a grant is refused at validation.
* one partition per NodeSet (the first the default), whose limits (MaxNodes, MaxCPUsPerNode,
  MaxMemPerNode) are the NodeSet's own; no `all` partition.
* `topology.yaml` from the config's rack/block/NVLink model (a tree block > rack, and a block
  topology of NVLink domains where a pool has them); the fleet layer annotates each GPU node with
  its place (`TOPOLOGY_ANNOTATION`), which the operator copies onto the Slurm node.
* every pod (controller, REST API, login, slurmd) labelled for the tenant's LocalQueue, GPU pods
  selecting their offering's node labels and tolerating its taints, like every tenant pod.
* the login Service and the REST API as `ClusterIP` only: the tenant's isolation policy admits
  only its own namespace, and only the tenant's owners can port-forward into it.
* accounting, when asked: slurmdbd against the external database, its password an
  `ExternalSecret` from the tenant's OpenBao prefix.

slurmd is not privileged (Slinky 1.2.1 makes it privileged with BPF, NET_ADMIN, SYS_ADMIN and
SYS_NICE by default). What stays: root (UID 0) with the runtime's default capabilities SETUID,
SETGID, KILL, CHOWN, DAC_OVERRIDE and FOWNER, which slurmd needs to start every job step as the
submitting user and to signal and clean up after it. That rules out Pod Security `restricted`, so a
Slurm tenant needs a reviewed `baseline` exception (`layers.tenancy.pod_security_exceptions`), and
low-trust tenants (never granted one) get no Slurm. The price of dropping privileges: Slurm's cgroup
plugin is off (cgroup.conf `CgroupPlugin=disabled`, process tracking by `linuxproc`), so jobs of one
slurmd are not fenced from each other by cgroups; they are still fenced together by the pod's
limits, which are the tenant's grant.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Mapping

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import ArgumentError, FactoryComponent, helm_release, labels, namespace, tenant_items, yaml_text
from ai_factory.components._topology import HOSTNAME_LABEL
from ai_factory.components.external_secrets import STORE_NAME, secret_prefix
from ai_factory.components.registry import Layer
from ai_factory.factory.checking import slurm as slurm_checks
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig, NodeSpec, Pool, SlurmAccounting, Tenant
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.model.raw import as_dict, as_list, did_you_mean
from ai_factory.factory.model.tenancy import TenantNames, tenant_names
from ai_factory.factory.planning.model import WHOLE_GPU, Plan
from ai_factory.factory.planning.placement import domain_offerings
from ai_factory.factory.model.quantity import parse_quantity

TOKEN = "ai-factory:training:Slinky"
TOPOLOGY_ANNOTATION = "topology.slinky.slurm.net/spec"
"""Kubernetes node annotation the operator copies onto the Slurm node of a NodeSet pod (docs/usage/topology.md)."""
TREE_TOPOLOGY = "topo-tree"
NVLINK_TOPOLOGY = "topo-nvlink"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PLANNED_ANNOTATION = slurm_checks.PLANNED_ANNOTATION
ACCOUNTING_SECRET = "slurm-accounting-db"
SLINKY_IMAGES = "ghcr.io/slinkyproject"
IMAGE_TAG = "26.05-ubuntu26.04"
"""The slurm chart 1.2.1's own tag of its images (Slurm 26.05)."""
TENANT_IMAGES = (f"{SLINKY_IMAGES}/*",)
"""What a Slurm cluster runs in its tenant's namespace: the tenant admission policy allows them
(`components.kyverno`) while the layer is on, so adding or removing a tenant's cluster leaves it alone."""
SLURM_SHARING = ("exclusive", "mig")
"""Sharing modes Slurm GRES can express: whole GPUs, MIG instances (without media extensions)."""
SLURMD_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID")
"""Replace the operator's added capabilities (a non-empty `add` replaces its list under its
strategic merge): all of them in the runtime's default set, allowed by Pod Security baseline."""
SLURM_CONF = {
    "GresTypes": "gpu",
    # Unprivileged slurmd: no cgroup tree of its own to manage (see the module docstring).
    "ProctrackType": "proctrack/linuxproc",
    "TaskPlugin": "task/affinity",
}
CGROUP_CONF = "CgroupPlugin=disabled\n"
GRES_CONF = "AutoDetect=nvml\n"
"""NVML sees only the GPUs and MIG devices the device plugin gave the container."""


def topology_spec(node: NodeSpec) -> str:
    """The node's place in the clusters' topology.yaml, as the operator's annotation writes it."""
    spec = f"{TREE_TOPOLOGY}:{node.rack}"
    return f"{spec},{NVLINK_TOPOLOGY}:{node.nvlink_domain}" if node.nvlink_domain else spec


def topology_yaml(pools: list[Pool]) -> str:
    """Slurm's topology.yaml for the pools of one cluster. Switches and blocks name no nodes: Slurm
    nodes come and go with their pods, and take their switch and block from the node annotation."""
    blocks: dict[str, set[str]] = defaultdict(set)
    domains: set[str] = set()
    for pool in pools:
        for node in pool.node_specs():
            blocks[node.block].add(node.rack)
            if node.nvlink_domain:
                domains.add(node.nvlink_domain)
    switches: list[dict[str, Any]] = [{"switch": "root", "children": ",".join(sorted(blocks))}]
    for block, racks in sorted(blocks.items()):
        switches.append({"switch": block, "children": ",".join(sorted(racks))})
    switches += [{"switch": rack} for rack in sorted(set().union(*blocks.values()))]
    topologies: list[dict[str, Any]] = [{"topology": TREE_TOPOLOGY, "cluster_default": True, "tree": {"switches": switches}}]
    if domains:
        topologies.append({"topology": NVLINK_TOPOLOGY, "cluster_default": False, "block": {"blocks": [{"block": d} for d in sorted(domains)]}})
    return yaml_text(topologies, sort_keys=False)


@dataclass(frozen=True)
class SlurmNodeSet:
    """Slurm nodes of one tenant on one pool with one shape: one slurmd pod per node of `nodes`."""

    key: str
    pool: str
    nodes: tuple[str, ...]
    gpus: tuple[tuple[str, int], ...]
    """(Kubernetes resource name, count) each pod requests: the plan's grant on each node."""
    gres: tuple[str, ...]
    """The Slurm node's `Gres=` items, from the same counts."""
    cpus: int
    memory_mib: int


def node_grants(plan: Plan, tenant: str, pool: str) -> dict[str, dict[str, int]]:
    """What the plan gives `tenant` on each node of `pool`, per resource name."""
    return plan.pool(pool).node_grants(tenant)


def gpu_share(plan: Plan, tenant: str, pool: str, node: str) -> Fraction:
    """The share of the node's GPUs the plan gives `tenant`: whole GPUs, or MIG instances by the
    larger of their compute and memory slices of each GPU."""
    pool_plan = plan.pool(pool)
    model = GPU_MODELS[pool_plan.gpu_model]
    node_plan = next(n for n in pool_plan.nodes if n.name == node)
    share = Fraction(0)
    for gpu in node_plan.gpus:
        if gpu.mode == "whole" and gpu.owner == tenant:
            share += 1
        mine = [model.profile(i.profile) for i in gpu.mig if i.tenant == tenant]
        if mine:
            share += max(Fraction(sum(p.compute_slices for p in mine), 7), Fraction(sum(p.memory_slices for p in mine), 8))
    return share / pool_plan.gpus_per_node


def gres_items(pool: Pool, grants: Mapping[str, int]) -> tuple[str, ...]:
    if pool.sharing == "exclusive":
        return (f"gpu:{grants[WHOLE_GPU]}",)
    return tuple(f"gpu:{resource.removeprefix('nvidia.com/mig-')}:{count}" for resource, count in sorted(grants.items()))


def slurm_nodesets(cfg: FactoryConfig, plan: Plan, tenant: str, pools: list[str]) -> list[SlurmNodeSet]:
    result = []
    for pool_name in pools:
        pool = cfg.pool(pool_name)
        resources = cfg.layers.slinky.node_resources[pool_name]
        shapes: dict[tuple[tuple[str, int], ...], list[str]] = defaultdict(list)
        for node, grants in node_grants(plan, tenant, pool_name).items():
            shapes[tuple(grants.items())].append(node)
        for i, (shape, nodes) in enumerate(sorted(shapes.items(), key=lambda s: s[1][0])):
            # The share is the same on every node of a shape (same grants, same GPU count).
            share = gpu_share(plan, tenant, pool_name, nodes[0])
            result.append(
                SlurmNodeSet(
                    key=pool_name if len(shapes) == 1 else f"{pool_name}-{i}",
                    pool=pool_name,
                    nodes=tuple(sorted(nodes)),
                    gpus=shape,
                    gres=gres_items(pool, dict(shape)),
                    cpus=int(resources.cpus * share),
                    memory_mib=int(resources.memory_gib * 1024 * share),
                )
            )
    return result


@dataclass(frozen=True)
class SlurmClusterSpec:
    tenant: str
    values: dict[str, Any]
    accounting: SlurmAccounting | None


def slinky_image(name: str) -> dict[str, str]:
    """The chart's sidecars default to `alpine:latest` (an unpinned image from a registry tenants may
    not pull from); their scripts need only a POSIX shell and coreutils, which Slinky's images have."""
    return {"repository": f"{SLINKY_IMAGES}/{name}", "tag": IMAGE_TAG}


def _queued(names: TenantNames) -> dict[str, Any]:
    return {"labels": {QUEUE_LABEL: names.local_queue, **names.labels}}


def slurmd_security_context() -> dict[str, Any]:
    return {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"add": list(SLURMD_CAPABILITIES)},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def nodeset_values(
    nodeset: SlurmNodeSet,
    names: TenantNames,
    node_labels: Mapping[str, str],
    tolerations: list[dict[str, str]],
    planned: Mapping[str, Mapping[str, int]],
    default: bool,
) -> dict[str, Any]:
    """`planned`: the plan's grant to the tenant on each node of the NodeSet, recorded for `factory check`."""
    limits = {"cpu": str(nodeset.cpus), "memory": f"{nodeset.memory_mib}Mi", **{r: str(n) for r, n in nodeset.gpus}}
    pod_spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/os": "linux", **node_labels},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": list(nodeset.nodes)}]}]
                }
            }
        },
    }
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return {
        "replicas": len(nodeset.nodes),
        "pinToNode": True,
        "oversubscribeNode": False,
        "extraConfMap": {"Gres": list(nodeset.gres), "Features": [nodeset.pool]},
        "slurmd": {"resources": {"requests": limits, "limits": dict(limits)}, "securityContext": slurmd_security_context()},
        "logfile": {"image": slinky_image("slurmd")},
        "metadata": {**_queued(names), "annotations": {PLANNED_ANNOTATION: json.dumps(planned, sort_keys=True, separators=(",", ":"))}},
        "podSpec": pod_spec,
        "partition": partition_values(nodeset, default),
    }


def partition_values(nodeset: SlurmNodeSet, default: bool) -> dict[str, Any]:
    """The NodeSet's own partition, its limits the NodeSet's: no job can ask for more nodes, CPUs or
    memory than the tenant's grant holds (its GRES are bounded by the nodes' `Gres=`)."""
    config: dict[str, Any] = {
        "MaxNodes": str(len(nodeset.nodes)),
        "MaxCPUsPerNode": str(nodeset.cpus),
        "MaxMemPerNode": str(nodeset.memory_mib),
        "OverSubscribe": "NO",
        "MaxTime": "UNLIMITED",
    }
    if default:
        config["Default"] = "YES"
    return {"enabled": True, "configMap": config}


def cluster_values(cfg: FactoryConfig, plan: Plan, tenant: Tenant, pools: list[str], login_replicas: int, accounting: SlurmAccounting | None) -> dict[str, Any]:
    names = tenant_names(tenant)
    nodesets = slurm_nodesets(cfg, plan, tenant.name, pools)
    tenant_offerings = {o.pool: o for o in domain_offerings(plan, names.trust_domain)}
    grants = {node: g for pool in pools for node, g in node_grants(plan, tenant.name, pool).items()}
    queued = _queued(names)
    values: dict[str, Any] = {
        "clusterName": tenant.name,
        "configFiles": {"gres.conf": GRES_CONF, "cgroup.conf": CGROUP_CONF, "topology.yaml": topology_yaml([cfg.pool(p) for p in pools])},
        "controller": {"metadata": queued, "extraConfMap": dict(SLURM_CONF), "logfile": {"image": slinky_image("slurmctld")}},
        "restapi": {"metadata": queued, "service": {"spec": {"type": "ClusterIP"}}},
        "loginsets": {},
        "nodesets": {},
        "partitions": {"all": {"enabled": False}},  # one partition per NodeSet instead
    }
    if login_replicas:
        values["loginsets"]["login"] = {
            "enabled": True,
            "replicas": login_replicas,
            "metadata": queued,
            "initconf": {"image": slinky_image("login")},
            "service": {"spec": {"type": "ClusterIP"}},
        }
    for i, nodeset in enumerate(nodesets):
        offering = tenant_offerings[nodeset.pool]
        planned = {node: grants[node] for node in nodeset.nodes}
        values["nodesets"][nodeset.key] = nodeset_values(nodeset, names, offering.node_labels, [t.toleration() for t in offering.tolerations], planned, i == 0)
    if accounting:
        values["accounting"] = {
            "enabled": True,
            "metadata": queued,
            "storageConfig": {
                "host": accounting.host,
                "port": accounting.port,
                "database": accounting.database,
                "username": accounting.username,
                "passwordKeyRef": {"name": ACCOUNTING_SECRET, "key": "password"},
            },
        }
    return values


def operator_values() -> dict[str, Any]:
    pod = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}
    return {
        "crds": {"enabled": False},  # the CRDs chart owns them
        "operator": {"podSecurityContext": pod, "securityContext": container},
        # The admission webhook needs a certificate from cert-manager, which the platform does not
        # run, or one the chart generates into its release (refused: `chart-generated-keys`). It
        # validates and defaults the operator's CRs, which here come from the plan and are checked
        # against the CRDs offline; the operator copies node topology onto its pods without it.
        "webhook": {"enabled": False},
        "certManager": {"enabled": False},
    }


@dataclass(frozen=True)
class SlinkyArgs:
    crds_chart: ChartSource
    chart: ChartSource
    namespace: str

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> SlinkyArgs:
        layer = cfg.layers.slinky
        return cls(crds_chart=layer.crds_chart.source("slurm-operator-crds"), chart=layer.chart.source("slurm-operator"), namespace=layer.namespace)


class Slinky(FactoryComponent):
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: SlinkyArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="slinky", opts=opts)
        ns = namespace(self, args.namespace, pod_security="restricted")
        crds = helm_release(self, "slurm-operator-crds", args.crds_chart, namespace=ns.metadata.name, values={}, depends_on=[ns])
        helm_release(self, "slurm-operator", args.chart, namespace=ns.metadata.name, values=operator_values(), depends_on=[crds])
        self.namespace = ns.metadata.name
        self.register_outputs({"namespace": self.namespace})


@dataclass(frozen=True)
class SlinkyTenantHook:
    """The Slurm cluster of each tenant that asked for one (`layers.slinky.clusters`)."""

    chart: ChartSource
    clusters: tuple[SlurmClusterSpec, ...]
    layer: str = "slinky"

    def __post_init__(self) -> None:
        tenants = [c.tenant for c in self.clusters]
        duplicates = sorted({t for t in tenants if tenants.count(t) > 1})
        if duplicates:
            raise ArgumentError("SlinkyTenantHook", [f"clusters: tenant {t!r} has two Slurm clusters" for t in duplicates])

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> SlinkyTenantHook:
        tenants = {t.name: t for t in cfg.tenants}
        layer = cfg.layers.slinky
        return cls(
            chart=layer.cluster_chart.source("slurm"),
            clusters=tuple(
                SlurmClusterSpec(c.tenant, cluster_values(cfg, plan, tenants[c.tenant], list(c.pools), c.login_replicas, c.accounting), c.accounting)
                for c in layer.clusters
            ),
        )

    def narrowed(self, tenant: str) -> SlinkyTenantHook:
        """Only the tenant's own Slurm cluster (see `TenantHook`)."""
        return replace(self, clusters=tenant_items(self.clusters, tenant))

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        cluster = next((c for c in self.clusters if c.tenant == tenant.name), None)
        if cluster is None:
            return
        after: list[pulumi.Resource] = []
        if cluster.accounting:
            after.append(
                k8s.apiextensions.CustomResource(
                    stack.child_name("slurm-accounting-secret"),
                    api_version="external-secrets.io/v1",
                    kind="ExternalSecret",
                    metadata={"name": ACCOUNTING_SECRET, "namespace": names.namespace, "labels": labels(self.layer, tenant=names.tenant, extra=names.labels)},
                    spec={
                        "refreshInterval": "1h",
                        "secretStoreRef": {"kind": "SecretStore", "name": STORE_NAME},
                        "target": {"name": ACCOUNTING_SECRET, "creationPolicy": "Owner"},
                        "data": [
                            {
                                "secretKey": "password",
                                "remoteRef": {"key": f"{secret_prefix(names)}{cluster.accounting.password_secret}", "property": "password"},
                            }
                        ],
                    },
                    opts=stack.child(),
                )
            )
        # Stateful like the tenant's namespace (slurmctld's saved state, the accounting it feeds):
        # removing the tenant from the config never deletes it silently.
        helm_release(
            stack, f"slurm-{names.tenant}", self.chart, namespace=names.namespace, values=cluster.values, depends_on=after, protect=True, retain_on_delete=True
        )


# --------------------------------------------------------------------------- config rules


def _by_name(items: Any, key: str) -> dict[str, dict]:
    return {item[key]: item for item in map(as_dict, as_list(items)) if isinstance(item.get(key), str)}


def _gpu_fraction(pool: dict, demand: dict) -> Fraction | None:
    """At least the share of a node's GPUs the demand's Slurm nodes are given (`gpu_share`, summed
    over nodes), from the raw config: whole GPUs, or each MIG instance's larger slice fraction."""
    gpu = as_dict(pool.get("gpu"))
    model, per_node = GPU_MODELS.get(gpu.get("model")) if isinstance(gpu.get("model"), str) else None, gpu.get("per_node")
    if model is None or not isinstance(per_node, int) or per_node < 1:
        return None
    if pool.get("sharing", "exclusive") == "mig":
        try:
            profiles = [(model.profile(p), n) for p, n in as_dict(demand.get("mig")).items() if isinstance(n, int)]
        except KeyError:
            return None  # an unknown profile has its own error
        gpus = sum(n * max(Fraction(p.compute_slices, 7), Fraction(p.memory_slices, 8)) for p, n in profiles)
    else:
        gpus = Fraction(demand.get("count") if isinstance(demand.get("count"), int) else 0)
    nodes = pool.get("nodes") if isinstance(pool.get("nodes"), int) else len(as_list(pool.get("node_list")))
    # More than the pool holds has its own error (the demand's bound); it is no quota's problem.
    return gpus / per_node if gpus <= nodes * per_node else None


def _quota_problems(path: str, tenant: dict, cluster_pools: list[str], pools: dict, node_resources: dict) -> list[str]:
    """The tenant's quota must hold its Slurm nodes' CPUs and memory, or they never start."""
    demands = _by_name(tenant.get("gpus"), "pool")
    cpus, memory_gib = Fraction(0), Fraction(0)
    for pool_name in cluster_pools:
        resources, demand = as_dict(node_resources.get(pool_name)), demands.get(pool_name)
        share = _gpu_fraction(pools[pool_name], demand) if pool_name in pools and demand else None
        if share is None or not isinstance(resources.get("cpus"), int) or not isinstance(resources.get("memory_gib"), int):
            continue
        cpus += share * resources["cpus"]
        memory_gib += share * resources["memory_gib"]
    quota = as_dict(tenant.get("quota"))
    problems = []
    for key, need, default, unit in (("cpu", cpus, "64", 1), ("memory", memory_gib, "512Gi", 1 << 30)):
        try:
            have = parse_quantity(str(quota.get(key, default)))
        except ArithmeticError:
            continue  # a malformed quantity has its own error
        if need * unit > Fraction(have):
            problems.append(f"{path}.{key}: {quota.get(key, default)} cannot hold the tenant's Slurm nodes (up to {float(need):g}{'' if unit == 1 else 'Gi'} on {', '.join(cluster_pools)})")
    return problems


def slurm_requests(raw: dict[str, Any]) -> list[str]:
    """A Slurm cluster names a known tenant once, which may run slurmd (a reviewed baseline
    exception, never low trust), on pools it holds GPUs in whose grant Slurm can express and whose
    node resources are given; accounting needs the tenant's secret store."""
    layer = as_dict(as_dict(raw.get("layers")).get("slinky"))
    clusters = as_list(layer.get("clusters"))
    if not clusters:
        return []
    if layer.get("enabled", False) is not True:
        return [f"layers.slinky.clusters: {len(clusters)} cluster(s) but layers.slinky.enabled is not true"]
    pools = _by_name(as_dict(raw.get("fleet")).get("pools"), "name")
    tenants = _by_name(raw.get("tenants"), "name")
    exceptions = _by_name(as_dict(as_dict(raw.get("layers")).get("tenancy")).get("pod_security_exceptions"), "tenant")
    node_resources = as_dict(layer.get("node_resources"))
    layers = as_dict(raw.get("layers"))
    secrets_on = as_dict(layers.get("external_secrets")).get("enabled", True) is not False and as_dict(layers.get("openbao")).get("enabled", True) is not False
    problems: list[str] = []
    seen: set[str] = set()
    for i, cluster in enumerate(map(as_dict, clusters)):
        path, name = f"layers.slinky.clusters[{i}]", cluster.get("tenant")
        if not isinstance(name, str) or name not in tenants:  # a name of the wrong type has its field error
            problems.append(f"{path}.tenant: unknown tenant {name!r}{did_you_mean(name, tenants)}")
            continue
        if name in seen:
            problems.append(f"{path}.tenant: tenant {name!r} already has a Slurm cluster")
        seen.add(name)
        tenant = tenants[name]
        if tenant.get("trust") == "low":
            problems.append(f"{path}.tenant: {name!r} is low trust; slurmd runs as root (Pod Security baseline), which a low-trust tenant is never granted")
        elif name not in exceptions:
            problems.append(
                f"{path}.tenant: slurmd runs as root to start job steps as their users (Pod Security baseline): add a reviewed "
                f"layers.tenancy.pod_security_exceptions entry for {name!r}"
            )
        demands = _by_name(tenant.get("gpus"), "pool")
        for j, pool_name in enumerate(as_list(cluster.get("pools"))):
            pool_path = f"{path}.pools[{j}]"
            if not isinstance(pool_name, str):
                continue
            if pool_name not in pools:
                problems.append(f"{pool_path}: unknown pool {pool_name!r}{did_you_mean(pool_name, pools)}")
                continue
            if pool_name not in demands:
                problems.append(f"{pool_path}: tenant {name!r} has no GPU grant on pool {pool_name!r} (tenants[].gpus names none)")
                continue
            sharing = pools[pool_name].get("sharing", "exclusive")
            if sharing not in SLURM_SHARING:
                problems.append(f"{pool_path}: pool {pool_name!r} shares GPUs by {sharing}, which Slurm GRES cannot express (only whole GPUs and MIG)")
            for profile in sorted(p for p in as_dict(demands[pool_name].get("mig")) if isinstance(p, str) and "+" in p):
                problems.append(f"{pool_path}: MIG profile {profile!r} (media extensions) has no Slurm GRES type; Slurm can express the plain profiles only")
            if pool_name not in node_resources:
                problems.append(f"layers.slinky.node_resources.{pool_name}: required, pool {pool_name!r} has Slurm nodes ({pool_path})")
        problems += _quota_problems(f"tenants[{list(tenants).index(name)}].quota", tenant, [p for p in as_list(cluster.get("pools")) if isinstance(p, str)], pools, node_resources)
        if cluster.get("accounting") is not None and not secrets_on:
            problems.append(f"{path}.accounting: the database password comes from OpenBao; enable layers.openbao and layers.external_secrets")
    return problems


LAYER = Layer(
    name="slinky",
    section="slinky",
    chart="slurm-operator",
    component=Slinky,
    args=SlinkyArgs.from_config,
    requires=("fleet",),
    tenant_hook=SlinkyTenantHook.from_config,
    checks=(slurm_checks.gres_matches_plan, slurm_checks.partitions_within_trust_domain),
    config_checks=(slurm_requests,),
)
