"""Volcano: batch gang scheduling, from the official chart, with one queue per tenant.

Volcano has no flavors: a tenant's queue is capped (`capability`) at exactly what the plan granted
it, every GPU resource name the fleet advertises listed (0 where nothing is granted, so no tenant
can take whole GPUs the plan gave another trust domain), and the granted GPUs are reserved for it
(`guarantee`). Borrowing is not offered under Volcano; `fair_share_weight` is the queue weight.

Volcano creates a `default` queue that takes every job naming no queue; this component writes it
with no GPU capability, so GPU work cannot bypass the tenants' queues through it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import FactoryComponent, helm_release, labels, namespace, tenant_items
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.planning.placement import advertised_resources
from ai_factory.factory.planning.quotas import VolcanoQueueSpec, planned_for, queue_plan
from ai_factory.factory.model.tenancy import TenantNames
from ai_factory.components.registry import Layer

TOKEN = "ai-factory:scheduling:Volcano"
API_VERSION = "scheduling.volcano.sh/v1beta1"
DEFAULT_QUEUE = "default"


@dataclass(frozen=True)
class VolcanoArgs:
    chart: ChartSource
    namespace: str
    gpu_resources: tuple[str, ...]
    """Every GPU resource name the fleet advertises: the default queue gets none of them."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> VolcanoArgs:
        layer = cfg.layers.volcano
        return cls(chart=layer.chart.source("volcano"), namespace=layer.namespace, gpu_resources=advertised_resources(plan))


class Volcano(FactoryComponent):
    namespace: pulumi.Output[str]
    release: pulumi.Output[str]

    def __init__(self, name: str, args: VolcanoArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="volcano", opts=opts)
        # baseline, not restricted: the chart's containers add DAC_OVERRIDE.
        ns = namespace(self, args.namespace, pod_security="baseline")
        release = helm_release(self, "volcano", args.chart, namespace=ns.metadata.name, values={}, depends_on=[ns])
        k8s.apiextensions.CustomResource(
            self.child_name("queue-default"),
            api_version=API_VERSION,
            kind="Queue",
            metadata={"name": DEFAULT_QUEUE, "labels": labels(self.layer)},
            spec={"capability": {resource: 0 for resource in args.gpu_resources}},
            opts=self.child(depends_on=[release]),
        )
        self.namespace = ns.metadata.name
        self.release = release.name
        self.register_outputs({"namespace": self.namespace, "release": self.release})


def queue_spec(queue: VolcanoQueueSpec) -> dict[str, Any]:
    return {
        "weight": queue.weight,
        "capability": dict(queue.capability),
        "guarantee": {"resource": dict(queue.guarantee)},
        # Never above its guarantee, so there is nothing to reclaim from it.
        "reclaimable": False,
    }


@dataclass(frozen=True)
class VolcanoTenantHook:
    """A tenant's Volcano queue, named like its ClusterQueue (`scheduling.volcano.sh/queue-name`)."""

    queues: tuple[VolcanoQueueSpec, ...]
    layer: str = "volcano"

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> VolcanoTenantHook:
        return cls(queue_plan(cfg, plan).volcano_queues)

    def narrowed(self, tenant: str) -> VolcanoTenantHook:
        """Only the tenant's own queue (see `TenantHook`)."""
        return replace(self, queues=tenant_items(self.queues, tenant))

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        queue = planned_for(self.queues, tenant.name, "Volcano queue")
        k8s.apiextensions.CustomResource(
            stack.child_name("volcano-queue"),
            api_version=API_VERSION,
            kind="Queue",
            metadata={"name": names.cluster_queue, "labels": labels(self.layer, tenant=names.tenant, extra=names.labels)},
            spec=queue_spec(queue),
            opts=stack.child(),
        )


LAYER = Layer(
    name="volcano",
    section="volcano",
    chart="volcano",
    component=Volcano,
    args=VolcanoArgs.from_config,
    requires=("fleet",),
    tenant_hook=VolcanoTenantHook.from_config,
)
