"""The shared inference Gateway: Gateway API on Cilium, one listener per tenant hostname, and per
tenant one HTTPRoute to its exposed models.

Why Cilium's Gateway API implementation: Cilium is already the CNI and policy engine of every
cluster (`components/cilium.py`); its per-node Envoy serves the Gateway with no second data plane
to run, patch and isolate, and the traffic it forwards carries the reserved `ingress` identity,
which the model pods' policies admit by name. Cilium does not implement `InferencePool` backends;
the models that need an endpoint picker (disaggregated or multi-node, `LLMInferenceService`) get
their `InferencePool` and picker from KServe (`ai_factory.factory.model.serving`), and are reached
through LiteLLM; the standalone picker chart (`llm-d-router-standalone` v0.10.0) is not used
because neither its picker container nor its pod takes a security context from any value (the
templates read only `$proxy.securityContext`, the Envoy sidecar's; see README, "Routing and
LiteLLM", for the template lines), so Pod Security `restricted` refuses it in a tenant's namespace,
where the chart must put it (its InferencePool and `--pool-namespace` are the release's namespace).

Isolation of routes: each tenant hostname is a listener of its own whose `allowedRoutes` admit
only namespaces labelled with that tenant (a label the tenant cannot set: it cannot edit its
Namespace), so a route of another tenant never attaches to it, whatever hostname it names; a
tenant's hostnames are its own (config validation refuses one another tenant owns). Routes and
their backends share the tenant's namespace, so no `ReferenceGrant` is needed, and none is made.

Routing per tenant (`HTTPRoute` `<tenant>-models`): a request naming a model in the header the
Inference Extension's body-based router sets (`X-Gateway-Model-Name`, which a client may also
set) goes to that model; models a tenant serves under one served name (a new version beside the
old) split that name's traffic by weight, in proportion to their maximum replicas.

A Gateway holds at most 64 listeners (the Gateway API CRD's bound): tenants' listeners fill
`inference-0`, `inference-1`, ... in config order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import FactoryComponent, labels, namespace
from ai_factory.components.registry import Layer
from ai_factory.components.serving import PORT as SERVING_PORT
from ai_factory.factory.checking.routing import GATEWAY_CHECKS
from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.model.raw import as_dict, as_list
from ai_factory.factory.model.serving import DYNAMO_PORT, ModelEndpoint, endpoint
from ai_factory.factory.model.tenancy import TENANT_LABEL, TenantNames

TOKEN = "ai-factory:serving:Gateway"
GATEWAY_CLASS = "cilium"
"""The GatewayClass the Cilium operator creates when its Gateway API support is on."""
GATEWAY_PREFIX = "inference"
MAX_LISTENERS = 64
MODEL_HEADER = "X-Gateway-Model-Name"
"""The header the Inference Extension's body-based router copies the OpenAI `model` into."""
POD_PORTS = {"InferenceService": SERVING_PORT, "LLMInferenceService": 8000, "DynamoGraphDeployment": DYNAMO_PORT}
"""The port a model's pods serve on (vLLM in the serving layer's runtime; KServe's llm-d preset
serves on 8000; Dynamo's frontend). Cilium applies policies after service translation, so they
name the pod's port."""
NAMESPACE_LABEL = "k8s:io.kubernetes.pod.namespace"
GATEWAY_ENTITY = "ingress"
"""Cilium's reserved identity of traffic its Gateway API Envoy forwards."""
LITELLM_NAMESPACE_DEFAULT = "litellm"
LITELLM_POD_LABELS = {"app.kubernetes.io/name": "litellm"}
"""Labels of LiteLLM's pods (its chart's `nameOverride`), in LiteLLM's namespace."""
LITELLM_PORT = 4000


def tenant_hostnames(tenant: Tenant, domain: str) -> list[str]:
    return list(tenant.hostnames) or [f"{tenant.name}.{domain}"]


@dataclass(frozen=True)
class Routed:
    endpoint: ModelEndpoint
    weight: int
    """Its share of its served name's traffic: its maximum replicas."""


def routed(cfg: FactoryConfig) -> list[Routed]:
    """The models the Gateway routes to: exposed models behind a plain Service (KServe's
    InferenceService, Dynamo's frontend)."""
    found = [Routed(endpoint(cfg, t, m), m.replicas.max) for t in cfg.tenants for m in t.models]
    return [r for r in found if r.endpoint.expose and r.endpoint.kind != "LLMInferenceService"]


def pod_selector(endpoints: list[ModelEndpoint], namespace: str) -> dict[str, Any]:
    """A Cilium endpoint selector of exactly these models' pods in `namespace`."""
    keys = sorted({k for e in endpoints for k, _ in e.pod_labels})
    return {
        "matchLabels": {NAMESPACE_LABEL: namespace},
        "matchExpressions": [{"key": f"k8s:{k}", "operator": "In", "values": sorted({v for e in endpoints for kk, v in e.pod_labels if kk == k})} for k in keys],
    }


def litellm_peer(litellm_namespace: str) -> dict[str, Any]:
    return {"matchLabels": {NAMESPACE_LABEL: litellm_namespace, **{f"k8s:{k}": v for k, v in LITELLM_POD_LABELS.items()}}}


@dataclass(frozen=True)
class Listener:
    tenant: str
    namespace: str
    hostname: str
    name: str
    gateway: str


def listeners(cfg: FactoryConfig) -> list[Listener]:
    """One listener per hostname of every tenant with a routed model, in config order."""
    serving = {r.endpoint.tenant for r in routed(cfg)}
    flat = [
        (t, f"tenant-{t.name}", host, f"{t.name}-{i}")
        for t in cfg.tenants
        if t.name in serving
        for i, host in enumerate(tenant_hostnames(t, cfg.layers.gateway.domain))
    ]
    return [Listener(t.name, ns, host, name, f"{GATEWAY_PREFIX}-{i // MAX_LISTENERS}") for i, (t, ns, host, name) in enumerate(flat)]


@dataclass(frozen=True)
class GatewayArgs:
    namespace: str
    tls_secret: str
    listeners: tuple[Listener, ...]

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> GatewayArgs:
        layer = cfg.layers.gateway
        return cls(namespace=layer.namespace, tls_secret=layer.tls_secret, listeners=tuple(listeners(cfg)))


def listener_spec(listener: Listener, tls_secret: str) -> dict[str, Any]:
    return {
        "name": listener.name,
        "hostname": listener.hostname,
        "port": 443,
        "protocol": "HTTPS",
        "tls": {"mode": "Terminate", "certificateRefs": [{"kind": "Secret", "name": tls_secret}]},
        "allowedRoutes": {
            "kinds": [{"kind": "HTTPRoute"}],
            "namespaces": {"from": "Selector", "selector": {"matchLabels": {TENANT_LABEL: listener.tenant, "kubernetes.io/metadata.name": listener.namespace}}},
        },
    }


def gateway_specs(args: GatewayArgs) -> dict[str, dict[str, Any]]:
    """Gateway name -> spec, each with at most `MAX_LISTENERS` listeners."""
    specs: dict[str, dict[str, Any]] = {}
    for listener in args.listeners:
        spec = specs.setdefault(listener.gateway, {"gatewayClassName": GATEWAY_CLASS, "listeners": []})
        spec["listeners"].append(listener_spec(listener, args.tls_secret))
    return specs


class Gateway(FactoryComponent):
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: GatewayArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="gateway", opts=opts)
        # No pod runs here (Cilium's Envoy runs on the nodes): restricted costs nothing.
        ns = namespace(self, args.namespace, pod_security="restricted")
        for gateway, spec in gateway_specs(args).items():
            k8s.apiextensions.CustomResource(
                self.child_name(gateway),
                api_version="gateway.networking.k8s.io/v1",
                kind="Gateway",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=gateway, namespace=ns.metadata.name, labels=labels(self.layer)),
                spec=spec,
                opts=self.child(depends_on=[ns]),
            )
        self.namespace = ns.metadata.name
        self.register_outputs({"namespace": self.namespace})


# --------------------------------------------------------------------------- per tenant


def route_rules(models: list[Routed]) -> list[dict[str, Any]]:
    """One rule per served name; its models share the traffic by weight (their maximum replicas)."""
    by_name: dict[str, list[Routed]] = {}
    for r in models:
        by_name.setdefault(r.endpoint.served_name, []).append(r)
    return [
        {
            "matches": [{"path": {"type": "PathPrefix", "value": "/v1/"}, "headers": [{"type": "Exact", "name": MODEL_HEADER, "value": served}]}],
            "backendRefs": [{"kind": "Service", "name": r.endpoint.service, "port": r.endpoint.port, "weight": r.weight} for r in group],
        }
        for served, group in sorted(by_name.items())
    ]


def route_spec(listeners_of_tenant: list[Listener], gateway_namespace: str, models: list[Routed]) -> dict[str, Any]:
    return {
        "parentRefs": [{"name": l.gateway, "namespace": gateway_namespace, "sectionName": l.name} for l in listeners_of_tenant],
        "hostnames": [l.hostname for l in listeners_of_tenant],
        "rules": route_rules(models),
    }


def serving_policy_specs(names: TenantNames, endpoints: list[ModelEndpoint], litellm_namespace: str | None) -> dict[str, dict[str, Any]]:
    """Additive allows on top of the tenant's default deny: its exposed models' pods accept the
    Gateway and LiteLLM on vLLM's port; its pods may call LiteLLM."""
    ports = [{"ports": [{"port": str(p), "protocol": "TCP"}]} for p in sorted({POD_PORTS[e.kind] for e in endpoints})]
    ingress: list[dict[str, Any]] = [{"fromEntities": [GATEWAY_ENTITY], "toPorts": ports}]
    specs: dict[str, dict[str, Any]] = {}
    if litellm_namespace:
        ingress.append({"fromEndpoints": [litellm_peer(litellm_namespace)], "toPorts": ports})
    if endpoints:
        specs["models"] = (
            {
                "description": f"Tenant {names.tenant}'s exposed models accept the inference gateway and LiteLLM.",
                "endpointSelector": pod_selector(endpoints, names.namespace),
                "enableDefaultDeny": {"ingress": False, "egress": False},
                "ingress": ingress,
            }
        )
    if litellm_namespace:
        specs["litellm"] = (
            {
                "description": f"Tenant {names.tenant}'s pods may call LiteLLM.",
                "endpointSelector": {"matchLabels": {NAMESPACE_LABEL: names.namespace}},
                "enableDefaultDeny": {"ingress": False, "egress": False},
                "egress": [{"toEndpoints": [litellm_peer(litellm_namespace)], "toPorts": [{"ports": [{"port": str(LITELLM_PORT), "protocol": "TCP"}]}]}],
            }
        )
    return specs


@dataclass(frozen=True)
class GatewayHook:
    """A tenant's HTTPRoute to its exposed models and the policy admitting the gateway and LiteLLM."""

    gateway_namespace: str
    listeners: tuple[Listener, ...]
    models: tuple[Routed, ...]
    """Every routed model of the environment; a tenant's are picked by its name."""
    litellm_namespace: str | None
    """LiteLLM's namespace while that layer is on."""
    layer: str = "gateway"

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> GatewayHook:
        litellm = cfg.layers.litellm
        return cls(
            gateway_namespace=cfg.layers.gateway.namespace,
            listeners=tuple(listeners(cfg)),
            models=tuple(routed(cfg)),
            litellm_namespace=litellm.namespace if litellm.enabled else None,
        )

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        own = [r for r in self.models if r.endpoint.tenant == names.tenant]
        object_labels = labels(stack.layer, tenant=names.tenant, extra=names.labels)
        mine = [l for l in self.listeners if l.tenant == names.tenant]
        if own and mine:
            k8s.apiextensions.CustomResource(
                stack.child_name("models-route"),
                api_version="gateway.networking.k8s.io/v1",
                kind="HTTPRoute",
                metadata={"name": f"{names.tenant}-models", "namespace": names.namespace, "labels": object_labels},
                spec=route_spec(mine, self.gateway_namespace, own),
                opts=stack.child(),
            )
        for suffix, spec in serving_policy_specs(names, [r.endpoint for r in own], self.litellm_namespace).items():
            k8s.apiextensions.CustomResource(
                stack.child_name(f"serving-{suffix}"),
                api_version="cilium.io/v2",
                kind="CiliumClusterwideNetworkPolicy",
                metadata={"name": f"{names.namespace}-serving-{suffix}", "labels": object_labels},
                spec=spec,
                opts=stack.child(retain_on_delete=True),
            )


# --------------------------------------------------------------------------- config rules


def hostnames_owned_once(raw: dict) -> list[str]:
    """A hostname belongs to one tenant: naming another tenant's (declared or default) is refused."""
    gateway = as_dict(as_dict(raw.get("layers")).get("gateway"))
    if gateway.get("enabled", True) is False:
        return []
    domain = gateway.get("domain", "inference.example.com")
    owner: dict[str, str] = {}
    problems = []
    tenants = [as_dict(t) for t in as_list(raw.get("tenants"))]
    for t in tenants:
        name = t.get("name")
        if isinstance(name, str) and not as_list(t.get("hostnames")):
            owner.setdefault(f"{name}.{domain}", name)
    for i, t in enumerate(tenants):
        for j, host in enumerate(as_list(t.get("hostnames"))):
            if not isinstance(host, str):
                continue
            held = owner.setdefault(host, str(t.get("name")))
            if held != t.get("name"):
                problems.append(f"tenants[{i}].hostnames[{j}]: {host!r} is already owned by tenant {held!r}; a hostname routes to one tenant only")
    return problems


LAYER = Layer(
    name="gateway",
    section="gateway",
    component=Gateway,
    args=lambda cfg, plan: GatewayArgs.from_config(cfg),
    requires=("fleet", "cilium"),
    tenant_hook=lambda cfg, plan: GatewayHook.from_config(cfg),
    checks=GATEWAY_CHECKS,
    external_crds=("gateway.networking.k8s.io",),
    config_checks=(hostnames_owned_once,),
)
