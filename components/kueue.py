"""Kueue: admission and quotas, from the official chart, with queues and flavors from the plan.

Nothing bypasses a queue: the manager manages jobs without a queue name (`manageJobsWithoutQueueName`)
in every tenant namespace and only there (`managedJobsNamespaceSelector` on the tenant label, so
platform namespaces are untouched), for every workload kind the platform's tenants run (see
`FRAMEWORKS`), plain pods included. A workload without a queue name lands in the namespace's
LocalQueue named `default` (Kueue's LocalQueue defaulting), which every tenant has.

Platform-wide objects (this component): one `ResourceFlavor` per offering of the plan (pool x trust
domain, pinned to its nodes by labels and tolerations, its supply in an annotation for
`factory check`), the CPU/memory flavor, one `Cohort` per trust domain (under its organisation's
cohort when the config names one), the `Topology` of the fleet attached to the whole-GPU flavors of
pools with a GPU fabric, and the `WorkloadPriorityClass`es of the platform's tiers. Per-tenant
objects (the ClusterQueue and LocalQueue) come from `KueueTenantHook`, attached by each tenant's
stack. Quotas are computed in `ai_factory.factory.planning.quotas`.

Fair sharing is on. Preemption protects a tenant's guaranteed quota: other queues only reclaim
what a queue borrowed beyond its nominal quota (`reclaimWithinCohort: Any` under fair sharing
preempts only queues above their share), and inside its own queue a higher tier preempts a lower
one (`withinClusterQueue: LowerPriority`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib.metadata import version
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import (
    GPU_MODEL_LABEL,
    POOL_LABEL,
    ArgumentError,
    FactoryComponent,
    domain_tenants,
    helm_release,
    labels,
    namespace,
    queue_domains,
    tenant_items,
    yaml_text,
)
from ai_factory.components._topology import SchedulingTopology, pool_topology
from ai_factory.components.dra import whole_gpu_class
from ai_factory.components.kubevirt import has_dra_vms
from ai_factory.factory.checking.vms import VFIO_DEVICE_CLASS
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.planning.model import WHOLE_GPU, Plan
from ai_factory.factory.planning.placement import Offering
from ai_factory.factory.planning.quotas import CPU_FLAVOR, SUPPLY_ANNOTATION, ClusterQueueSpec, CohortSpec, ResourceGroup, planned_for, queue_plan
from ai_factory.factory.model.tenancy import TENANT_LABEL, TRUST_DOMAIN_LABEL, TenantNames
from ai_factory.components.registry import Layer
from ai_factory.factory.checking import scheduling

TOKEN = "ai-factory:scheduling:Kueue"
API_VERSION = "kueue.x-k8s.io/v1beta2"

FRAMEWORKS = (
    "batch/job",  # training and evaluation jobs
    "jobset.x-k8s.io/jobset",  # multi-node training gangs
    "leaderworkerset.x-k8s.io/leaderworkerset",  # multi-node inference (vLLM, llm-d)
    "ray.io/rayjob",  # Ray jobs; Kueue skips an integration whose CRD is not installed
    "pod",  # plain pods, among them every pod a tenant's vCluster syncs to the host
    "deployment",  # serving: vLLM and KServe raw deployments
    "statefulset",
)
"""Kueue 0.19 integrations the platform's tenants use (examples/controller_manager_config.yaml)."""

FABRICS_FOR_GANGS = ("infiniband", "roce")
"""Pools whose whole GPUs run multi-node training: their flavors get the fleet's topology."""


@dataclass(frozen=True)
class PriorityTier:
    name: str
    value: int
    description: str


PRIORITY_TIERS = (
    PriorityTier("production-inference", 1000, "Production inference: admitted first, preempts training and evaluation in its queue."),
    PriorityTier("training", 500, "Training and fine-tuning: preempts evaluation in its queue."),
    PriorityTier("evaluation", 100, "Evaluation and experiments: first to wait, first to be preempted."),
)


def manager_config(dra_device_classes: tuple[str, ...]) -> dict[str, Any]:
    """The Kueue Configuration (config.kueue.x-k8s.io/v1beta2). The chart takes the whole file as a
    string, so the upstream example's server settings are repeated as they are."""
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "controller": {
            "groupKindConcurrency": {
                "Job.batch": 5,
                "Pod": 5,
                "Workload.kueue.x-k8s.io": 10,
                "LocalQueue.kueue.x-k8s.io": 5,
                "Cohort.kueue.x-k8s.io": 1,
                "ClusterQueue.kueue.x-k8s.io": 5,
                "ResourceFlavor.kueue.x-k8s.io": 1,
            }
        },
        "clientConnection": {"qps": 300, "burst": 500},
        "manageJobsWithoutQueueName": True,
        "managedJobsNamespaceSelector": {"matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]},
        "integrations": {"frameworks": list(FRAMEWORKS)},
        "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]},
    }
    if dra_device_classes:
        # A GPU claimed through DRA counts as one `nvidia.com/gpu`: the unit of the plan's supply
        # on DRA pools. Kueue refuses a claim of a DeviceClass it has no mapping for.
        config["resources"] = {"deviceClassMappings": [{"name": WHOLE_GPU, "deviceClassNames": list(dra_device_classes)}]}
    return config


def chart_values(args: KueueArgs) -> dict[str, Any]:
    return {
        # Kueue's webhooks fail closed: with one replica down, no tenant could create a job.
        "controllerManager": {"replicas": 2, "podDisruptionBudget": {"enabled": True, "minAvailable": 1}},
        "managerConfig": {"controllerManagerConfigYaml": yaml_text(manager_config(args.dra_device_classes), sort_keys=False)},
    }


@dataclass(frozen=True)
class KueueArgs:
    chart: ChartSource
    namespace: str
    flavors: tuple[Offering, ...]
    """One per offering of the plan, in the order ClusterQueues list them."""
    flavor_topologies: tuple[tuple[str, SchedulingTopology], ...]
    """(flavor, topology) for the whole-GPU flavors of pools with a GPU fabric."""
    cohorts: tuple[CohortSpec, ...]
    dra_device_classes: tuple[str, ...]
    """The whole-GPU DeviceClasses of the DRA pools (`components.dra`), then the VFIO class of VMs' DRA GPUs."""
    domain_tenants: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Each trust domain's tenants: a domain's flavors and cohort, and its organisation's cohort,
    are ordered before those tenants' objects only. Empty: before every tenant's."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> KueueArgs:
        layer = cfg.layers.kueue
        queues = queue_plan(cfg, plan)
        return cls(
            chart=layer.chart.source("kueue"),
            namespace=layer.namespace,
            flavors=queues.flavors,
            flavor_topologies=tuple(
                (o.name, pool_topology(cfg.pool(o.pool)))
                for o in queues.flavors
                if o.kind == "whole" and cfg.pool(o.pool).topology.fabric in FABRICS_FOR_GANGS
            ),
            cohorts=queues.cohorts,
            # A VM's VFIO claim takes one of the same GPUs: counted in the same `nvidia.com/gpu` budget.
            dra_device_classes=tuple(sorted({whole_gpu_class(p.gpu.model) for p in cfg.fleet.pools if p.sharing == "dra"}))
            + ((VFIO_DEVICE_CLASS,) if has_dra_vms(cfg) else ()),
            domain_tenants=domain_tenants(cfg),
        )


def resource_groups(groups: tuple[ResourceGroup, ...]) -> list[dict[str, Any]]:
    """`resourceGroups` of a ClusterQueue or Cohort."""
    return [
        {
            "coveredResources": list(group.covered),
            "flavors": [
                {
                    "name": flavor.flavor,
                    "resources": [
                        {
                            "name": quota.resource,
                            "nominalQuota": quota.nominal,
                            **({"borrowingLimit": quota.borrowing_limit} if quota.borrowing_limit is not None else {}),
                            **({"lendingLimit": quota.lending_limit} if quota.lending_limit is not None else {}),
                        }
                        for quota in flavor.quotas
                    ],
                }
                for flavor in group.flavors
            ],
        }
        for group in groups
    ]


def flavor_spec(offering: Offering, topology: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeLabels": dict(offering.node_labels)}
    if offering.tolerations:
        spec["tolerations"] = [t.toleration() for t in offering.tolerations]
    if topology:
        spec["topologyName"] = topology
    return spec


def cluster_queue_spec(queue: ClusterQueueSpec, names: TenantNames) -> dict[str, Any]:
    return {
        "cohortName": queue.cohort,
        # Exactly the tenant's namespaces: the tenant label, which tenants cannot set on a namespace.
        "namespaceSelector": {"matchLabels": {TENANT_LABEL: names.tenant}},
        "fairSharing": {"weight": queue.fair_share_weight},
        "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
        "resourceGroups": resource_groups(queue.groups),
    }


def custom_object(component: FactoryComponent, name: str, api_version: str, kind: str, body: dict[str, Any], **options: Any) -> pulumi.CustomResource:
    """A custom resource whose fields sit beside `metadata` instead of under `spec` (a
    WorkloadPriorityClass has top-level `value` and `description`), which the SDK's
    `CustomResource` cannot express; the Kubernetes provider applies the object as given."""
    return pulumi.CustomResource(
        f"kubernetes:{api_version}:{kind}",
        component.child_name(name),
        {"apiVersion": api_version, "kind": kind, **body},
        opts=component.child(version=version("pulumi_kubernetes"), **options),
    )


class Kueue(FactoryComponent):
    namespace: pulumi.Output[str]
    release: pulumi.Output[str]

    def __init__(self, name: str, args: KueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="kueue", opts=opts)
        ns = namespace(self, args.namespace, pod_security="restricted")
        release = helm_release(self, "kueue", args.chart, namespace=ns.metadata.name, values=chart_values(args), depends_on=[ns])
        after_release = {"depends_on": [release]}  # the chart installs the CRDs
        topologies = dict(args.flavor_topologies)
        tenants_of = dict(args.domain_tenants)
        domains_of = queue_domains(args.cohorts)
        for topology in sorted({t.name: t for t in topologies.values()}.values(), key=lambda t: t.name):
            k8s.apiextensions.CustomResource(
                self.child_name(f"topology-{topology.name}"),
                api_version=API_VERSION,
                kind="Topology",
                metadata={"name": topology.name, "labels": labels(self.layer)},
                spec={"levels": [{"nodeLabel": label} for _, label in topology.levels]},
                opts=self.child(**after_release),
            )
        k8s.apiextensions.CustomResource(
            self.child_name(f"flavor-{CPU_FLAVOR}"),
            api_version=API_VERSION,
            kind="ResourceFlavor",
            metadata={"name": CPU_FLAVOR, "labels": labels(self.layer)},
            spec={},
            opts=self.child(**after_release),
        )
        for offering in args.flavors:
            topology = topologies.get(offering.name)
            flavor = k8s.apiextensions.CustomResource(
                self.child_name(f"flavor-{offering.name}"),
                api_version=API_VERSION,
                kind="ResourceFlavor",
                metadata={
                    "name": offering.name,
                    "labels": labels(
                        self.layer,
                        extra={TRUST_DOMAIN_LABEL: offering.trust_domain, POOL_LABEL: offering.pool, GPU_MODEL_LABEL: offering.gpu_model},
                    ),
                    "annotations": {SUPPLY_ANNOTATION: json.dumps(offering.supply, sort_keys=True)},
                },
                spec=flavor_spec(offering, topology.name if topology else None),
                opts=self.child(**after_release),
            )
            self.serves_domains(tenants_of, [offering.trust_domain], flavor)
        for cohort in args.cohorts:
            spec: dict[str, Any] = {}
            if cohort.parent:
                spec["parentName"] = cohort.parent
            if cohort.groups:
                spec["resourceGroups"] = resource_groups(cohort.groups)
            extra = {TRUST_DOMAIN_LABEL: cohort.trust_domain} if cohort.trust_domain else {}
            made = k8s.apiextensions.CustomResource(
                self.child_name(f"cohort-{cohort.name}"),
                api_version=API_VERSION,
                kind="Cohort",
                metadata={"name": cohort.name, "labels": labels(self.layer, extra=extra)},
                spec=spec,
                opts=self.child(**after_release),
            )
            self.serves_domains(tenants_of, domains_of.get(cohort.name, []), made)
        for tier in PRIORITY_TIERS:
            custom_object(
                self,
                f"priority-{tier.name}",
                API_VERSION,
                "WorkloadPriorityClass",
                {"metadata": {"name": tier.name, "labels": labels(self.layer)}, "value": tier.value, "description": tier.description},
                **after_release,
            )
        self.namespace = ns.metadata.name
        self.release = release.name
        self.register_outputs({"namespace": self.namespace, "release": self.release})


@dataclass(frozen=True)
class KueueTenantHook:
    """A tenant's ClusterQueue (quotas from the plan, in its trust domain's cohort) and the
    LocalQueue `default` in its namespace, which every workload of the tenant goes through."""

    queues: tuple[ClusterQueueSpec, ...]
    flavors: tuple[str, ...]
    """The flavors of the Kueue component the queues are admitted to (`for_kueue`)."""
    cohorts: tuple[str, ...]
    """Its cohorts."""
    layer: str = "kueue"

    def __post_init__(self) -> None:
        known_flavors, known_cohorts = {*self.flavors, CPU_FLAVOR}, set(self.cohorts)
        problems = []
        for i, queue in enumerate(self.queues):
            if queue.cohort not in known_cohorts:
                problems.append(f"queues[{i}].cohort: {queue.cohort!r} is not a cohort of the Kueue component ({', '.join(sorted(known_cohorts)) or 'none'})")
            for g, group in enumerate(queue.groups):
                for f, quotas in enumerate(group.flavors):
                    if quotas.flavor not in known_flavors:
                        problems.append(
                            f"queues[{i}].groups[{g}].flavors[{f}].flavor: {quotas.flavor!r} is not a flavor of the Kueue component "
                            f"({', '.join(sorted(known_flavors))})"
                        )
        if problems:
            raise ArgumentError("KueueTenantHook", problems)

    @classmethod
    def for_kueue(cls, kueue: KueueArgs, queues: tuple[ClusterQueueSpec, ...]) -> KueueTenantHook:
        """Tenants' queues on the flavors and cohorts of the Kueue component built with `kueue`."""
        return cls(queues=queues, flavors=tuple(o.name for o in kueue.flavors), cohorts=tuple(c.name for c in kueue.cohorts))

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> KueueTenantHook:
        return cls.for_kueue(KueueArgs.from_config(cfg, plan), queue_plan(cfg, plan).cluster_queues)

    def narrowed(self, tenant: str) -> KueueTenantHook:
        """Only the tenant's own queue, and of the component's flavors and cohorts those it names
        (see `TenantHook`): the fleet's every flavor made each tenant's arguments, and its cache
        key, grow with the fleet, and changed with any other trust domain's offerings."""
        queues = tenant_items(self.queues, tenant)
        return replace(
            self,
            queues=queues,
            flavors=tuple(dict.fromkeys(f.flavor for q in queues for g in q.groups for f in g.flavors if f.flavor != CPU_FLAVOR)),
            cohorts=tuple(dict.fromkeys(q.cohort for q in queues)),
        )

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        queue = planned_for(self.queues, tenant.name, "ClusterQueue")
        object_labels = labels(self.layer, tenant=names.tenant, extra=names.labels)
        cluster_queue = k8s.apiextensions.CustomResource(
            stack.child_name("cluster-queue"),
            api_version=API_VERSION,
            kind="ClusterQueue",
            metadata={"name": names.cluster_queue, "labels": object_labels},
            spec=cluster_queue_spec(queue, names),
            opts=stack.child(),
        )
        k8s.apiextensions.CustomResource(
            stack.child_name("local-queue"),
            api_version=API_VERSION,
            kind="LocalQueue",
            metadata={"name": names.local_queue, "namespace": names.namespace, "labels": object_labels},
            spec={"clusterQueue": names.cluster_queue},
            opts=stack.child(depends_on=[cluster_queue]),
        )


LAYER = Layer(
    name="kueue",
    section="kueue",
    chart="kueue",
    component=Kueue,
    args=KueueArgs.from_config,
    requires=("fleet",),
    tenant_hook=KueueTenantHook.from_config,
    checks=(
        scheduling.tenant_local_queues,
        scheduling.flavor_nodes,
        scheduling.flavor_supply,
        scheduling.flavor_trust_domains,
        scheduling.cluster_queue_namespaces,
    ),
)
