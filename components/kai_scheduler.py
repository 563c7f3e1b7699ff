"""KAI Scheduler: gang and topology-aware placement with hierarchical queues, from the official
chart (kai-scheduler/KAI-Scheduler, formerly NVIDIA/KAI-Scheduler).

Queues form a tree: organisation (when the config names one) -> trust domain -> tenant. Only
leaves take work; a pod names its leaf with the `kai.scheduler/queue` label and runs with
`schedulerName: kai-scheduler`. Quotas come from the plan (`ai_factory.factory.planning.quotas`): `quota`,
`overQuotaWeight` and `limit` are written for GPU, CPU and memory on every queue, because KAI
reads an unset limit as 0; a MIG instance costs its `g` GPUs there. A trust domain's queue is
capped at the GPUs the plan gave the domain, so over-quota work never takes another domain's GPUs.

The chart's default queues are not created: their unlimited `default-queue` would take any pod
without a queue label. The chart's migration of Kueue Topologies is off: this component writes
the KAI `Topology` objects of the fleet itself (one per distinct set of levels; a workload names
one with the `kai.scheduler/topology` annotation and a level by its alias: block, rack,
nvlink-domain, host).

With Kueue on, Kueue admits and KAI places (both hold the same quotas); without, KAI's queues are
the quotas.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import FactoryComponent, domain_tenants, helm_release, labels, namespace, queue_domains, tenant_items
from ai_factory.components._topology import SchedulingTopology, pool_topology
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.planning.quotas import KaiQueueSpec, planned_for, queue_plan
from ai_factory.factory.model.tenancy import TRUST_DOMAIN_LABEL, TenantNames
from ai_factory.components.registry import Layer
from ai_factory.factory.checking import scheduling

TOKEN = "ai-factory:scheduling:KaiScheduler"
QUEUE_API_VERSION = "scheduling.run.ai/v2"
TOPOLOGY_API_VERSION = "kai.scheduler/v1alpha1"


def chart_values() -> dict[str, Any]:
    return {
        "defaultQueue": {"createDefaultQueue": False},
        "topologyMigration": {"enabled": False},
    }


def queue_spec(queue: KaiQueueSpec) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "displayName": queue.tenant or queue.name,
        "resources": {
            resource: {"quota": share.quota, "overQuotaWeight": share.over_quota_weight, "limit": share.limit}
            for resource, share in (("gpu", queue.gpu), ("cpu", queue.cpu), ("memory", queue.memory))
        },
    }
    if queue.parent:
        spec["parentQueue"] = queue.parent
    return spec


@dataclass(frozen=True)
class KaiSchedulerArgs:
    chart: ChartSource
    namespace: str
    topologies: tuple[SchedulingTopology, ...]
    parent_queues: tuple[KaiQueueSpec, ...]
    """Organisation and trust-domain queues; tenants' leaves come from `KaiTenantHook`."""
    domain_tenants: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Each trust domain's tenants: a domain's queue, and its organisation's, are ordered before
    those tenants' objects only. Empty: before every tenant's."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> KaiSchedulerArgs:
        layer = cfg.layers.kai_scheduler
        topologies = {t.name: t for t in map(pool_topology, cfg.fleet.pools)}
        return cls(
            chart=layer.chart.source("kai-scheduler"),
            namespace=layer.namespace,
            topologies=tuple(topologies[name] for name in sorted(topologies)),
            parent_queues=tuple(q for q in queue_plan(cfg, plan).kai_queues if q.tenant is None),
            domain_tenants=domain_tenants(cfg),
        )


class KaiScheduler(FactoryComponent):
    namespace: pulumi.Output[str]
    release: pulumi.Output[str]

    def __init__(self, name: str, args: KaiSchedulerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="kai-scheduler", opts=opts)
        # baseline, not restricted: the chart sets no security context on KAI's own pods.
        ns = namespace(self, args.namespace, pod_security="baseline")
        release = helm_release(self, "kai-scheduler", args.chart, namespace=ns.metadata.name, values=chart_values(), depends_on=[ns])
        after_release = {"depends_on": [release]}  # the chart installs the CRDs
        for topology in args.topologies:
            k8s.apiextensions.CustomResource(
                self.child_name(f"topology-{topology.name}"),
                api_version=TOPOLOGY_API_VERSION,
                kind="Topology",
                metadata={"name": topology.name, "labels": labels(self.layer)},
                spec={"levels": [{"nodeLabel": label, "alias": alias} for alias, label in topology.levels]},
                opts=self.child(**after_release),
            )
        created: dict[str, pulumi.Resource] = {}
        tenants_of, domains_of = dict(args.domain_tenants), queue_domains(args.parent_queues)
        for queue in args.parent_queues:  # parents first: organisations, then trust domains
            extra = {TRUST_DOMAIN_LABEL: queue.trust_domain} if queue.trust_domain else {}
            parent = [created[queue.parent]] if queue.parent else []
            created[queue.name] = k8s.apiextensions.CustomResource(
                self.child_name(f"queue-{queue.name}"),
                api_version=QUEUE_API_VERSION,
                kind="Queue",
                metadata={"name": queue.name, "labels": labels(self.layer, extra=extra)},
                spec=queue_spec(queue),
                opts=self.child(depends_on=[release, *parent]),
            )
            self.serves_domains(tenants_of, domains_of.get(queue.name, []), created[queue.name])
        self.namespace = ns.metadata.name
        self.release = release.name
        self.register_outputs({"namespace": self.namespace, "release": self.release})


@dataclass(frozen=True)
class KaiTenantHook:
    """A tenant's leaf queue, under its trust domain's queue, named like its ClusterQueue; the
    tenant's pods select it with the `kai.scheduler/queue` label."""

    queues: tuple[KaiQueueSpec, ...]
    layer: str = "kai-scheduler"

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> KaiTenantHook:
        return cls(tuple(q for q in queue_plan(cfg, plan).kai_queues if q.tenant))

    def narrowed(self, tenant: str) -> KaiTenantHook:
        """Only the tenant's own queue (see `TenantHook`)."""
        return replace(self, queues=tenant_items(self.queues, tenant))

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        queue = planned_for(self.queues, tenant.name, "KAI queue")
        k8s.apiextensions.CustomResource(
            stack.child_name("kai-queue"),
            api_version=QUEUE_API_VERSION,
            kind="Queue",
            metadata={"name": names.cluster_queue, "labels": labels(self.layer, tenant=names.tenant, extra=names.labels)},
            spec=queue_spec(queue),
            opts=stack.child(),
        )


LAYER = Layer(
    name="kai-scheduler",
    section="kai_scheduler",
    chart="kai-scheduler",
    component=KaiScheduler,
    args=KaiSchedulerArgs.from_config,
    requires=("fleet",),
    tenant_hook=KaiTenantHook.from_config,
    checks=(scheduling.kai_queue_shares,),
)
