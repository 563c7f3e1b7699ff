"""Cilium: the CNI and network-policy engine, with Hubble, and the cluster-wide baseline policies
every tenant relies on.

Each tenant's own isolation (default deny both ways, its namespace, DNS, the platform flows) is a
`CiliumClusterwideNetworkPolicy` of the tenant stack. Default deny also drops what the platform
itself needs to reach a pod, so this layer adds, once for all endpoints, the allows that must
survive any tenant's policy. Both baseline policies only add allows: `enableDefaultDeny` is off,
so they never put an endpoint into default deny by themselves.

- `cluster-health-checks`: Cilium's health probes (entity `health`) reach every endpoint, so a
  tenant's default deny does not show up as an unreachable node. (Kubelet probes come from the
  node itself, which Cilium always lets in: the agent's `allow-localhost` default; `host` is not
  opened to tenant pods otherwise.)
- `kube-dns-from-cluster`: kube-dns answers every pod of the cluster on port 53, even if kube-system
  is later put under default deny.

Cilium runs in kube-system (its chart's RBAC, priority classes and node-init assume so) and
tolerates every taint by default (its chart's `tolerations: [{operator: Exists}]`), GPU nodes
included. Its CRDs are created by the Cilium operator, so the policies wait for the release.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import FactoryComponent, helm_release, labels
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.components.registry import Layer

TOKEN = "ai-factory:network:Cilium"
NAMESPACE = "kube-system"
ENDPOINT_NAMESPACE_LABEL = "k8s:io.kubernetes.pod.namespace"
"""The label Cilium gives every endpoint: its pod's namespace."""
KUBE_DNS_SELECTOR = {ENDPOINT_NAMESPACE_LABEL: "kube-system", "k8s:k8s-app": "kube-dns"}
"""kube-dns (CoreDNS) pods, as a Cilium endpoint selector's `matchLabels`."""
DNS_PORTS = ({"port": "53", "protocol": "UDP"}, {"port": "53", "protocol": "TCP"})
HUBBLE_METRICS = (
    "dns",
    # Per-namespace (so per-tenant) context on drops and flows.
    "drop:sourceContext=namespace;destinationContext=namespace",
    "flow:sourceContext=namespace;destinationContext=namespace",
    "tcp",
    "icmp",
)
ADDITIVE = {"ingress": False, "egress": False}
"""`enableDefaultDeny` of a baseline policy: it allows, and never denies by itself."""


@dataclass(frozen=True)
class CiliumArgs:
    chart: ChartSource
    hubble_ui: bool
    """Hubble UI for operators (Hubble and Hubble Relay are always on)."""
    encryption: str
    """`wireguard` (pod traffic between nodes encrypted) or `none`."""
    gateway_api: bool = False
    """Serve Gateway API (the shared inference Gateway, `components/gateway.py`)."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> CiliumArgs:
        layer = cfg.layers.cilium
        return cls(chart=layer.chart.source("cilium"), hubble_ui=layer.hubble_ui, encryption=layer.encryption, gateway_api=cfg.layers.gateway.enabled)


def chart_values(args: CiliumArgs) -> dict[str, Any]:
    values: dict[str, Any] = {
        "hubble": {
            "enabled": True,
            "relay": {"enabled": True},
            "ui": {"enabled": args.hubble_ui},
            "metrics": {"enabled": list(HUBBLE_METRICS)},
            # Hubble's mTLS certificates made in the cluster by Cilium's certgen job: with the
            # chart's default (`helm`) the CA and keys would be generated into the release itself,
            # held in helm-controller's release storage and replaced on every upgrade.
            "tls": {"auto": {"enabled": True, "method": "cronJob"}},
        },
        # Endpoints are unrestricted until a policy selects them; every tenant is selected by its own.
        "policyEnforcementMode": "default",
    }
    if args.gateway_api:
        values["gatewayAPI"] = {"enabled": True}
    if args.encryption == "wireguard":
        values["encryption"] = {"enabled": True, "type": "wireguard"}
    return values


def baseline_policies() -> dict[str, dict[str, Any]]:
    """Name -> spec of the cluster-wide policies every tenant relies on."""
    return {
        "cluster-health-checks": {
            "description": "Cilium health checks reach every endpoint, whatever its own policy denies.",
            "endpointSelector": {},
            "enableDefaultDeny": dict(ADDITIVE),
            "ingress": [{"fromEntities": ["health"]}],
        },
        "kube-dns-from-cluster": {
            "description": "kube-dns answers every pod of the cluster on port 53.",
            "endpointSelector": {"matchLabels": dict(KUBE_DNS_SELECTOR)},
            "enableDefaultDeny": dict(ADDITIVE),
            "ingress": [{"fromEntities": ["cluster"], "toPorts": [{"ports": [dict(p) for p in DNS_PORTS]}]}],
        },
    }


class Cilium(FactoryComponent):
    release: pulumi.Output[str]

    def __init__(self, name: str, args: CiliumArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="cilium", opts=opts)
        release = helm_release(self, "cilium", args.chart, namespace=NAMESPACE, values=chart_values(args))
        for policy, spec in baseline_policies().items():
            k8s.apiextensions.CustomResource(
                self.child_name(policy),
                api_version="cilium.io/v2",
                kind="CiliumClusterwideNetworkPolicy",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=policy, labels=labels(self.layer)),
                spec=spec,
                opts=self.child(depends_on=[release]),
            )
        self.release = release.name
        self.register_outputs({"release": self.release})


LAYER = Layer(
    name="cilium",
    section="cilium",
    chart="cilium",
    component=Cilium,
    args=lambda cfg, plan: CiliumArgs.from_config(cfg),
    requires=("fleet",),
)
