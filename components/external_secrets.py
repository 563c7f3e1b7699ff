"""External Secrets Operator: how tenants receive secrets from OpenBao, one namespace at a time.

Cluster-wide kinds are not served: the chart installs no `ClusterSecretStore`,
`ClusterExternalSecret`, `ClusterGenerator` or `ClusterPushSecret` CRD and the controller ignores
them, so no tenant can reach a store shared with others.

Per tenant (`TenantSecretsHook`, attached by the tenant's stack):
- in OpenBao, through `pulumi-vault`: a policy reading only the tenant's prefix
  `tenants/<name>/` of the KV engine, and a Kubernetes-auth role bound to the tenant's store
  service account in the tenant's namespace, with that policy only;
- in the tenant's namespace: that service account (no token mounted anywhere) and a `SecretStore`
  logging in with it, its tokens bound to OpenBao's audience.

A tenant's ExternalSecret names keys under its prefix (`tenants/<name>/db`); anything else is
denied by OpenBao.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_vault as vault

from ai_factory.components._common import FactoryComponent, helm_release, labels, namespace
from ai_factory.components.openbao import OpenBaoArgs, auth_mount, policy_name, service_address
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.model.secrets import SecretValue
from ai_factory.factory.model.tenancy import TenantNames
from ai_factory.components.registry import Layer
from ai_factory.factory.checking import secrets as secret_checks
from ai_factory.factory.model.raw import as_dict

TOKEN = "ai-factory:secrets:ExternalSecrets"
RELEASE = "external-secrets"
STORE_NAME = "openbao"
STORE_SERVICE_ACCOUNT = "openbao-secret-store"
OPENBAO_AUDIENCE = "openbao"
"""Audience of the tokens a store logs in with: usable against OpenBao only."""
ROLE_TOKEN_TTL = 900
CLUSTER_WIDE_KINDS = ("ClusterSecretStore", "ClusterExternalSecret", "ClusterGenerator", "ClusterPushSecret")


@dataclass(frozen=True)
class ExternalSecretsArgs:
    chart: ChartSource
    namespace: str

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> ExternalSecretsArgs:
        layer = cfg.layers.external_secrets
        return cls(chart=layer.chart.source("external-secrets"), namespace=layer.namespace)


def chart_values() -> dict[str, Any]:
    return {
        "installCRDs": True,
        "crds": {f"create{kind}": False for kind in CLUSTER_WIDE_KINDS},
        "processClusterStore": False,
        "processClusterExternalSecret": False,
        "processClusterGenerator": False,
        "processClusterPushSecret": False,
        "replicaCount": 2,
        "leaderElect": True,
        "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
        "webhook": {"replicaCount": 2, "podDisruptionBudget": {"enabled": True, "minAvailable": 1}},
    }


class ExternalSecrets(FactoryComponent):
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: ExternalSecretsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="external-secrets", opts=opts)
        ns = namespace(self, args.namespace, pod_security="restricted")
        helm_release(self, RELEASE, args.chart, namespace=ns.metadata.name, values=chart_values(), depends_on=[ns])
        self.namespace = ns.metadata.name
        self.register_outputs({"namespace": self.namespace})


def secret_prefix(names: TenantNames) -> str:
    """The tenant's part of the KV engine."""
    return f"tenants/{names.tenant}/"


def read_policy(kv_mount: str, prefix: str, owner: str) -> str:
    """OpenBao policy (HCL): read and list under `prefix` of the KV engine, nothing else."""
    return (
        f"# {owner}: its own secrets, read-only.\n"
        f'path "{kv_mount}/data/{prefix}*" {{\n  capabilities = ["read"]\n}}\n'
        f'path "{kv_mount}/metadata/{prefix}*" {{\n  capabilities = ["read", "list"]\n}}\n'
    )


def tenant_policy(kv_mount: str, names: TenantNames) -> str:
    return read_policy(kv_mount, secret_prefix(names), f"Tenant {names.tenant}")


def store_role(
    owner: FactoryComponent, prefix: str, role: str, namespace: pulumi.Input[str], policy: str, opts: pulumi.ResourceOptions,
    account: str = STORE_SERVICE_ACCOUNT, cluster: str | None = None,
) -> vault.kubernetes.AuthBackendRole:
    """The OpenBao policy `policy` and the Kubernetes-auth role `role` a namespaced store logs in
    with: bound to the store's service account `account` in `namespace`, OpenBao's audience only,
    short-lived tokens; on `cluster`'s own auth mount (`openbao.auth_mount`). `prefix` starts the
    children's names (`<prefix>policy`, `<prefix>role`)."""
    granted = vault.Policy(owner.child_name(f"{prefix}policy"), name=policy_name(cluster, role), policy=policy, opts=opts)
    return vault.kubernetes.AuthBackendRole(
        owner.child_name(f"{prefix}role"),
        backend=auth_mount(cluster),
        role_name=role,
        bound_service_account_names=[account],
        bound_service_account_namespaces=[namespace],
        audience=OPENBAO_AUDIENCE,
        token_policies=[granted.name],
        token_ttl=ROLE_TOKEN_TTL,
        opts=opts,
    )


def secret_store_spec(server: str, kv_mount: str, role: str, cluster: str | None = None, account: str = STORE_SERVICE_ACCOUNT) -> dict[str, Any]:
    """A store logging in to OpenBao as `role` (of `cluster`'s auth mount) with the store's service account."""
    return {
        "provider": {
            "vault": {
                "server": server,
                "path": kv_mount,
                "version": "v2",
                "auth": {
                    "kubernetes": {
                        "mountPath": auth_mount(cluster),
                        "role": role,
                        "serviceAccountRef": {"name": account, "audiences": [OPENBAO_AUDIENCE]},
                    }
                },
            }
        }
    }


@dataclass(frozen=True)
class TenantSecretsHook:
    """A tenant's path, policy and role in OpenBao, and its namespaced store."""

    server: str
    """OpenBao's in-cluster address, as the store reaches it."""
    api_address: str
    """OpenBao's address as Pulumi reaches it."""
    admin_token: SecretValue
    kv_mount: str
    cluster: str | None = None
    layer: str = "external-secrets"

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> TenantSecretsHook | None:
        """None until OpenBao's admin token is set (before, OpenBao is not initialised)."""
        openbao = OpenBaoArgs.from_config(cfg)
        if openbao.admin_token is None:
            return None
        return cls(
            server=service_address(openbao.namespace),
            api_address=openbao.pulumi_address,
            admin_token=openbao.admin_token,
            kv_mount=openbao.kv_mount,
            cluster=openbao.cluster,
        )

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        provider = vault.Provider(
            stack.child_name("openbao"),
            address=self.api_address,
            token=self.admin_token.output(),
            skip_child_token=True,
            opts=stack.child(),
        )
        on_openbao = stack.child(provider=provider)
        store_role(stack, "secrets-", names.namespace, names.namespace, tenant_policy(self.kv_mount, names), on_openbao, cluster=self.cluster)
        object_labels = labels(stack.layer, tenant=names.tenant, extra=names.labels)
        account = k8s.core.v1.ServiceAccount(
            stack.child_name("secret-store-account"),
            metadata=k8s.meta.v1.ObjectMetaArgs(name=STORE_SERVICE_ACCOUNT, namespace=names.namespace, labels=object_labels),
            automount_service_account_token=False,
            opts=stack.child(),
        )
        k8s.apiextensions.CustomResource(
            stack.child_name("secret-store"),
            api_version="external-secrets.io/v1",
            kind="SecretStore",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=STORE_NAME, namespace=names.namespace, labels=object_labels),
            spec=secret_store_spec(self.server, self.kv_mount, names.namespace, self.cluster),
            opts=stack.child(depends_on=[account]),
        )


def openbao_enabled(raw: dict[str, Any]) -> list[str]:
    """Tenants' secret stores read OpenBao."""
    layers = as_dict(raw.get("layers"))
    if as_dict(layers.get("external_secrets")).get("enabled", True) is not False and as_dict(layers.get("openbao")).get("enabled", True) is False:
        return ["layers.external_secrets.enabled: tenants' secret stores read OpenBao; enable layers.openbao or disable this layer"]
    return []


LAYER = Layer(
    name="external-secrets",
    section="external_secrets",
    chart="external-secrets",
    component=ExternalSecrets,
    args=lambda cfg, plan: ExternalSecretsArgs.from_config(cfg),
    requires=("fleet", "openbao"),
    tenant_hook=lambda cfg, plan: TenantSecretsHook.from_config(cfg),
    checks=(secret_checks.openbao_role_scope,),
    config_checks=(openbao_enabled,),
)
