"""Metrics and GPU metering: kube-prometheus-stack, monitors for the GPU exporters, the metering
recording rules, and what each tenant sees.

- **Prometheus Operator, Prometheus, Alertmanager, kube-state-metrics, node exporter** from the
  kube-prometheus-stack chart; Grafana is off (no dashboards are shipped yet). Prometheus keeps
  `retention_days` of series on a `storage_gib` volume and stops at 85% of it. It selects every
  ServiceMonitor, PodMonitor and PrometheusRule of every namespace.
- **GPU metrics: the GPU Operator's DCGM exporter** (`layers.gpu_operator.dcgm_exporter`; the
  operator creates its ServiceMonitor, which components/gpu_operator.py configures so the
  exporter's pod attribution labels survive). HAMi's scheduler (allocations per container) and
  device plugin are scraped through ServiceMonitors this layer puts in HAMi's namespace.
- **Recording rules** (`ai_factory.factory.metering.rules`): the platform's PrometheusRule here;
  each tenant's namespace → tenant rule in its own namespace (tenant hook).
- **Tenants see their own series only.** Prometheus enforces the `namespace` label
  (`enforcedNamespaceLabel`) on every monitor and rule outside the platform's namespaces: whatever
  a tenant's workloads expose, their series carry the tenant's namespace. Tenants never reach
  Prometheus: each tenant gets its own prom-label-proxy, in this layer's namespace, started with
  `--label=namespace --label-value=<its namespace>`, which rewrites every query to that
  namespace; a CiliumNetworkPolicy lets only the tenant's namespace reach it, and the tenant's own
  policy lets its pods reach that proxy and nothing else of the layer. The proxy is a platform
  object (the tenant cannot change its arguments), labelled `ai-factory.io/serves-tenant`: it goes
  with the tenant (`ai-factory diff --without-tenant`).
- **OpenCost** (`opencost`) on the same Prometheus prices CPU, memory and storage per namespace
  with custom on-premises prices; its GPU price is 0, since GPUs are priced from the metering
  rules (per model, and per MIG/HAMi/time-slice share, which OpenCost cannot see). The two meet
  at the namespace: a tenant's OpenCost allocation (`aggregate=namespace`, `tenant-<name>`) and
  its bill lines (`SubAccountId`) are the same tenant.
- **Tenants' workloads** are discovered by a PodMonitor in the tenant's namespace scraping every
  pod port named `metrics`; monitors only ever select targets in their own namespace
  (`ignoreNamespaceSelectors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import FactoryComponent, helm_release, labels, namespace, restricted_container
from ai_factory.components.gpu_operator import DROP_TARGET_POD_LABELS
from ai_factory.components.registry import Layer
from ai_factory.components.tenant_stack import NAMESPACE_LABEL
from ai_factory.factory.metering.rules import Metering, platform_group, tenant_group
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig, OpenCostSettings, Tenant
from ai_factory.factory.model.tenancy import SERVES_TENANT_LABEL, TenantNames, tenant_names
from ai_factory.factory.planning.model import Plan

TOKEN = "ai-factory:observability:Metrics"
MONITORING = "monitoring.coreos.com/v1"
RELEASE = "kube-prometheus-stack"
PROMETHEUS_SERVICE = "prometheus-operated"
"""The headless Service the operator creates for every Prometheus."""
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus"}
"""Set by the operator on every Prometheus pod."""
PROXY_IMAGE = "quay.io/prometheuscommunity/prom-label-proxy:v0.14.0"
PROXY_PORT = 8080
PROXY_LABELS = {"app.kubernetes.io/name": "prom-label-proxy"}
ENFORCED_LABEL = "namespace"
TENANT_METRICS_PORT = "metrics"
"""The pod port name a tenant's workloads expose metrics on."""
RETENTION_SIZE_PERCENT = 85
"""Of the volume; Prometheus needs headroom for compaction and the WAL."""


@dataclass(frozen=True)
class MetricsArgs:
    chart: ChartSource
    namespace: str
    retention_days: int
    storage_gib: int
    storage_class: str | None
    metering: Metering
    gpu_operator_namespace: str | None
    """Where the DCGM exporter's ServiceMonitor lives (None: no exporter)."""
    hami_namespace: str | None
    """Where HAMi runs (None: no HAMi pool)."""
    tenants: tuple[TenantNames, ...]
    """Every tenant, for its query proxy."""
    opencost: OpenCostSettings | None
    opencost_chart: ChartSource | None

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> MetricsArgs:
        layer = cfg.layers.metrics
        gpu_operator = cfg.layers.gpu_operator
        hami = any(p.sharing == "hami" for p in cfg.fleet.pools) and cfg.layers.hami.enabled
        return cls(
            chart=layer.chart.source("kube-prometheus-stack"),
            namespace=layer.namespace,
            retention_days=layer.retention_days,
            storage_gib=layer.storage_gib,
            storage_class=layer.storage_class,
            metering=Metering.from_config(cfg, plan),
            gpu_operator_namespace=gpu_operator.namespace if gpu_operator.enabled and gpu_operator.dcgm_exporter else None,
            hami_namespace=cfg.layers.hami.namespace if hami else None,
            tenants=tuple(tenant_names(t) for t in sorted(cfg.tenants, key=lambda t: t.name)),
            opencost=layer.opencost if layer.opencost.enabled else None,
            opencost_chart=layer.opencost.chart.source("opencost") if layer.opencost.enabled else None,
        )

    @property
    def platform_namespaces(self) -> tuple[str, ...]:
        """Namespaces whose monitors and rules are the platform's: exempt from namespace enforcement,
        since their series (GPU exporters, kube-state-metrics) name other namespaces' pods."""
        found = [self.namespace, self.gpu_operator_namespace, self.hami_namespace]
        return tuple(sorted({n for n in found if n}))


def chart_values(args: MetricsArgs) -> dict[str, Any]:
    """The chart values: a pure function of the arguments, so tests can read them directly."""
    volume: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": f"{args.storage_gib}Gi"}}}
    if args.storage_class:
        volume["storageClassName"] = args.storage_class
    excluded = [
        {"group": "monitoring.coreos.com", "resource": resource, "namespace": ns}
        for ns in args.platform_namespaces
        for resource in ("servicemonitors", "podmonitors", "prometheusrules")
    ]
    return {
        "grafana": {"enabled": False},
        # Needs the host's PID and network namespaces: not in a reviewed privileged namespace yet.
        "nodeExporter": {"enabled": False},
        # Receivers hold credentials: the configuration Secret is the site's (from OpenBao through an
        # ExternalSecret), never rendered into the bundle; until it exists the operator runs Alertmanager
        # with an empty configuration.
        "alertmanager": {"enabled": True, "alertmanagerSpec": {"useExistingSecret": True}},
        "prometheus": {
            "prometheusSpec": {
                "retention": f"{args.retention_days}d",
                "retentionSize": f"{args.storage_gib * RETENTION_SIZE_PERCENT // 100}GiB",
                "storageSpec": {"volumeClaimTemplate": {"spec": volume}},
                # Select every monitor and rule, not only those carrying the release's labels.
                "serviceMonitorSelectorNilUsesHelmValues": False,
                "podMonitorSelectorNilUsesHelmValues": False,
                "ruleSelectorNilUsesHelmValues": False,
                "ignoreNamespaceSelectors": True,
                "enforcedNamespaceLabel": ENFORCED_LABEL,
                "excludedFromEnforcement": excluded,
            }
        },
    }


def opencost_values(args: MetricsArgs, settings: OpenCostSettings) -> dict[str, Any]:
    """OpenCost in the layer's namespace (its ServiceMonitor is then a platform one), reading the
    operator's Prometheus; custom (on-premises) prices, GPUs at 0 (see `OpenCostSettings`)."""
    return {
        "opencost": {
            "prometheus": {"internal": {"enabled": True, "serviceName": PROMETHEUS_SERVICE, "namespaceName": args.namespace, "port": 9090}},
            "customPricing": {
                "enabled": True,
                "provider": "custom",
                "costModel": {
                    "description": "ai-factory: CPU, memory and storage; GPUs are priced by the metering rules",
                    "CPU": settings.cpu_core_hour,
                    "RAM": settings.ram_gib_hour,
                    "GPU": 0,
                    "storage": settings.storage_gib_hour,
                },
            },
            "metrics": {"serviceMonitor": {"enabled": True}},
            "ui": {"enabled": False},
        }
    }


def hami_service_monitors(args: MetricsArgs) -> list[tuple[str, str]]:
    """(component label, port name) of HAMi's metrics Services, as its chart names them."""
    return [("hami-scheduler", "monitor"), ("hami-device-plugin", "monitorport")] if args.hami_namespace else []


class Metrics(FactoryComponent):
    namespace: pulumi.Output[str]
    release: pulumi.Output[str]

    def __init__(self, name: str, args: MetricsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="metrics", opts=opts)
        ns = namespace(self, args.namespace, pod_security="baseline")
        release = helm_release(self, RELEASE, args.chart, namespace=ns.metadata.name, values=chart_values(args), depends_on=[ns])
        after_release = {"depends_on": [release]}  # the chart installs the monitoring CRDs
        if args.opencost is not None and args.opencost_chart is not None:
            helm_release(self, "opencost", args.opencost_chart, namespace=ns.metadata.name, values=opencost_values(args, args.opencost), **after_release)
        k8s.apiextensions.CustomResource(
            self.child_name("gpu-metering-rules"),
            api_version=MONITORING,
            kind="PrometheusRule",
            metadata={"name": "gpu-metering", "namespace": args.namespace, "labels": labels(self.layer)},
            spec={"groups": [platform_group(args.metering)]},
            opts=self.child(**after_release),
        )
        for component, port in hami_service_monitors(args):
            k8s.apiextensions.CustomResource(
                self.child_name(component),
                api_version=MONITORING,
                kind="ServiceMonitor",
                metadata={"name": component, "namespace": args.hami_namespace, "labels": labels(self.layer)},
                spec={
                    "selector": {"matchLabels": {"app.kubernetes.io/component": component, "app.kubernetes.io/instance": "hami"}},
                    "endpoints": [{"port": port, "path": "/metrics", "relabelings": [DROP_TARGET_POD_LABELS]}],
                },
                opts=self.child(**after_release),
            )
        for names in args.tenants:
            self._query_proxy(args.namespace, names, ns)
        self.namespace = ns.metadata.name
        self.release = release.name
        self.register_outputs({"namespace": self.namespace, "release": self.release})

    def _query_proxy(self, layer_namespace: str, names: TenantNames, ns: k8s.core.v1.Namespace) -> None:
        """The tenant's prom-label-proxy: a platform object (the tenant cannot change what it
        enforces) serving that tenant only, so it goes with the tenant, and only that tenant's
        objects are ordered after it (`serves`)."""
        name = proxy_name(names)
        served = labels(self.layer, extra=proxy_selector(names))
        meta = {"name": name, "namespace": layer_namespace, "labels": served}
        ingress = k8s.apiextensions.CustomResource(
            self.child_name(f"{name}-ingress"),
            api_version="cilium.io/v2",
            kind="CiliumNetworkPolicy",
            metadata=meta,
            spec={
                "description": f"Only tenant {names.tenant}'s namespace reaches its query proxy.",
                "endpointSelector": {"matchLabels": {f"k8s:{k}": v for k, v in sorted(proxy_selector(names).items())}},
                "ingress": [{"fromEndpoints": [{"matchLabels": {NAMESPACE_LABEL: names.namespace}}], "toPorts": PROXY_PORTS}],
            },
            opts=self.child(depends_on=[ns]),
        )
        deployment = k8s.apps.v1.Deployment(
            self.child_name(name),
            metadata=meta,
            spec={
                "replicas": 2,
                "selector": {"matchLabels": proxy_selector(names)},
                "template": {
                    "metadata": {"labels": served},
                    "spec": {"automountServiceAccountToken": False, "containers": [proxy_container(layer_namespace, names)]},
                },
            },
            opts=self.child(depends_on=[ns]),
        )
        service = k8s.core.v1.Service(
            self.child_name(f"{name}-service"),
            metadata=meta,
            spec={"selector": proxy_selector(names), "ports": [{"name": "http", "port": PROXY_PORT, "targetPort": "http", "protocol": "TCP"}]},
            opts=self.child(depends_on=[ns]),
        )
        for resource in (ingress, deployment, service):
            self.serves([names.tenant], resource)


def proxy_name(names: TenantNames) -> str:
    return f"prom-label-proxy-{names.tenant}"


def proxy_selector(names: TenantNames) -> dict[str, str]:
    return {**PROXY_LABELS, SERVES_TENANT_LABEL: names.tenant}


def proxy_endpoint(layer_namespace: str, names: TenantNames) -> dict[str, str]:
    """The Cilium endpoint labels of the tenant's query proxy."""
    return {NAMESPACE_LABEL: layer_namespace, **{f"k8s:{k}": v for k, v in sorted(proxy_selector(names).items())}}


PROXY_PORTS = [{"ports": [{"port": str(PROXY_PORT), "protocol": "TCP"}]}]


def proxy_container(layer_namespace: str, names: TenantNames) -> dict[str, Any]:
    return {
        "name": "prom-label-proxy",
        "image": PROXY_IMAGE,
        "args": [
            f"--insecure-listen-address=0.0.0.0:{PROXY_PORT}",
            f"--upstream=http://{PROMETHEUS_SERVICE}.{layer_namespace}.svc:9090",
            f"--label={ENFORCED_LABEL}",
            f"--label-value={names.namespace}",
            "--enable-label-apis",
            "--error-on-replace",
        ],
        "ports": [{"name": "http", "containerPort": PROXY_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": restricted_container(65534),
    }


@dataclass(frozen=True)
class MetricsTenantHook:
    """Per tenant, in its namespace: its namespace → tenant rule, the PodMonitor of its workloads and
    the network policy letting Prometheus scrape them and them reach the tenant's query proxy."""

    namespace: str
    layer: str = "metrics"

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> MetricsTenantHook:
        return cls(cfg.layers.metrics.namespace)

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        own = labels(self.layer, tenant=names.tenant, extra=names.labels)

        def custom(suffix: str, kind: str, api_version: str, metadata: dict[str, Any], spec: dict[str, Any]) -> None:
            k8s.apiextensions.CustomResource(
                stack.child_name(suffix), api_version=api_version, kind=kind, metadata=metadata, spec=spec, opts=stack.child()
            )

        custom(
            "metering-rule",
            "PrometheusRule",
            MONITORING,
            {"name": "gpu-metering-tenant", "namespace": names.namespace, "labels": own},
            {"groups": [tenant_group(names.tenant, names.namespace)]},
        )
        custom(
            "workload-monitor",
            "PodMonitor",
            MONITORING,
            {"name": "workloads", "namespace": names.namespace, "labels": own},
            {
                "selector": {},
                "namespaceSelector": {"matchNames": [names.namespace]},
                "podMetricsEndpoints": [{"port": TENANT_METRICS_PORT}],
            },
        )
        prometheus = {NAMESPACE_LABEL: self.namespace, **{f"k8s:{k}": v for k, v in PROMETHEUS_POD_LABELS.items()}}
        custom(
            "metrics-flows",
            "CiliumNetworkPolicy",
            "cilium.io/v2",
            {"name": "metrics", "namespace": names.namespace, "labels": own},
            {
                "description": f"Prometheus scrapes tenant {names.tenant}'s pods; they query its own label-enforcing proxy.",
                "endpointSelector": {},
                "ingress": [{"fromEndpoints": [{"matchLabels": prometheus}]}],
                "egress": [{"toEndpoints": [{"matchLabels": proxy_endpoint(self.namespace, names)}], "toPorts": PROXY_PORTS}],
            },
        )


LAYER = Layer(
    name="metrics",
    section="metrics",
    chart="kube-prometheus-stack",
    component=Metrics,
    args=MetricsArgs.from_config,
    requires=("fleet", "gpu-operator", "hami"),
    tenant_hook=MetricsTenantHook.from_config,
)
