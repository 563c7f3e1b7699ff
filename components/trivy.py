"""Trivy Operator: vulnerability, configuration-audit and exposed-secret reports for every workload.

It scans every namespace, tenants' included (their images and their objects' configuration), and
writes each report next to the workload: a tenant's reports are in the tenant's namespace, readable
with its own RBAC. The tenant labels of scanned workloads are copied onto the operator's metrics
(`reportResourceLabels`), so vulnerability counts add up per tenant. Scan jobs and the node
collector tolerate every platform taint of GPU nodes, so GPU nodes are assessed too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from ai_factory.components._common import FactoryComponent, helm_release, namespace
from ai_factory.components.gpu_operator import tolerations as gpu_node_tolerations
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.tenancy import TENANT_LABEL, TRUST_DOMAIN_LABEL, TRUST_LABEL
from ai_factory.components.registry import Layer

TOKEN = "ai-factory:supply-chain:Trivy"
RELEASE = "trivy-operator"
REPORTED_LABELS = (TENANT_LABEL, TRUST_LABEL, TRUST_DOMAIN_LABEL)


@dataclass(frozen=True)
class TrivyArgs:
    chart: ChartSource
    namespace: str

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> TrivyArgs:
        return cls(chart=cfg.layers.trivy.chart.source("trivy-operator"), namespace=cfg.layers.trivy.namespace)


def chart_values() -> dict[str, Any]:
    return {
        "trivyOperator": {
            "scanJobTolerations": gpu_node_tolerations(),
            "reportResourceLabels": ",".join(REPORTED_LABELS),
        },
        "nodeCollector": {"tolerations": gpu_node_tolerations()},
    }


class Trivy(FactoryComponent):
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: TrivyArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="trivy", opts=opts)
        # The node collector reads the nodes' files (kubelet, kube-apiserver configuration).
        ns = namespace(self, args.namespace, pod_security="privileged")
        helm_release(self, RELEASE, args.chart, namespace=ns.metadata.name, values=chart_values(), depends_on=[ns])
        self.namespace = ns.metadata.name
        self.register_outputs({"namespace": self.namespace})


LAYER = Layer(
    name="trivy",
    section="trivy",
    chart="trivy-operator",
    component=Trivy,
    args=lambda cfg, plan: TrivyArgs.from_config(cfg),
    requires=("fleet",),
    privileged_namespaces={
        "trivy-system": "Trivy Operator's node collector: reads kubelet and API-server files on the host (hostPath, host PID)",
    },
)
