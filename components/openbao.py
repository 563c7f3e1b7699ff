"""OpenBao: the platform's secret store, HA on integrated Raft storage, from the official chart.

Data safety: the Raft volumes come from a StorageClass with `reclaimPolicy: Retain` and the
StatefulSet keeps its claims when deleted or scaled down; the namespace, the StorageClass, the
release and the KV engine holding every tenant's secrets are `protect`ed (Pulumi refuses to delete
them) and `retain_on_delete` (removing them from the program never deletes them in the cluster or
in OpenBao).

OpenBao is configured through its API with `pulumi-vault` (OpenBao speaks Vault's API) once it is
initialised and unsealed, which is a human step: on the first deployment `admin_token` is unset
and only the server is installed; with the token, this component adds the KV v2 engine and the
Kubernetes auth method, and each tenant's stack its policy and role (`components.external_secrets`).
No agent injector: tenants receive secrets through External Secrets only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_vault as vault

from ai_factory.components._common import FactoryComponent, helm_release, labels, namespace
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.secrets import SecretValue
from ai_factory.components.registry import Layer
from ai_factory.factory.model.raw import as_dict

TOKEN = "ai-factory:secrets:OpenBao"
RELEASE = "openbao"
STORAGE_CLASS = "openbao-raft"
API_PORT = 8200
KUBERNETES_AUTH_PATH = "kubernetes"
CLUSTERS_PREFIX = "clusters/"
"""Platform secrets of one cluster of a multi-cluster environment live under `clusters/<cluster>/`."""
STATEFUL = {"protect": True, "retain_on_delete": True}
UID, GID = 100, 1000
"""The chart's defaults for the server's user and group."""


@dataclass(frozen=True)
class OpenBaoArgs:
    chart: ChartSource
    namespace: str
    replicas: int
    storage_size: str
    storage_provisioner: str
    """CSI driver of the Retain StorageClass the Raft volumes are provisioned from."""
    kv_mount: str
    api_address: str | None
    """Where Pulumi reaches the API; None: the in-cluster service."""
    admin_token: SecretValue | None
    cluster: str | None = None
    """The cluster deploying it, in a multi-cluster environment: its stores log in at a mount of
    their own (`auth_mount`) and its platform secrets live under its own prefix (`platform_path`)."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> OpenBaoArgs:
        layer = cfg.layers.openbao
        assert layer.storage_provisioner, "validation requires it while the layer is enabled"
        return cls(
            chart=layer.chart.source("openbao"),
            namespace=layer.namespace,
            replicas=layer.replicas,
            storage_size=layer.storage_size,
            storage_provisioner=layer.storage_provisioner,
            kv_mount=layer.kv_mount,
            api_address=layer.api_address,
            admin_token=layer.admin_token,
            cluster=cfg.kubernetes.cluster,
        )

    @property
    def pulumi_address(self) -> str:
        return self.api_address or service_address(self.namespace)

    @property
    def auth_mount(self) -> str:
        return auth_mount(self.cluster)

    def platform_path(self, path: str) -> str:
        return platform_path(self.cluster, path)


def auth_mount(cluster: str | None) -> str:
    """The Kubernetes auth mount a cluster's stores log in at. In a multi-cluster environment each
    cluster has its own, which accepts only that cluster's service-account tokens and holds only
    that cluster's roles: a token of one cluster never logs in as a role of another."""
    return KUBERNETES_AUTH_PATH if cluster is None else f"{KUBERNETES_AUTH_PATH}-{cluster}"


def platform_path(cluster: str | None, path: str) -> str:
    """A platform secret's KV path: under `clusters/<cluster>/` in a multi-cluster environment,
    which only that cluster's platform roles read (`policy_name`)."""
    return path if cluster is None else f"{CLUSTERS_PREFIX}{cluster}/{path}"


def policy_name(cluster: str | None, role: str) -> str:
    """Policies are global in OpenBao, roles are per mount: a cluster's policies carry its name."""
    return role if cluster is None else f"{cluster}-{role}"


def service_address(namespace_name: str) -> str:
    """The in-cluster API address (TLS is not terminated by OpenBao; see the README)."""
    return f"http://{RELEASE}.{namespace_name}.svc:{API_PORT}"


def raft_config(replicas: int) -> str:
    """Server HCL: Raft storage that joins its peers by their stable pod names."""
    joins = "".join(
        f'  retry_join {{\n    leader_api_addr = "http://{RELEASE}-{i}.{RELEASE}-internal:{API_PORT}"\n  }}\n' for i in range(replicas)
    )
    return (
        "ui = true\n"
        "disable_mlock = true\n"
        'listener "tcp" {\n'
        "  tls_disable = 1\n"
        f'  address = "[::]:{API_PORT}"\n'
        f'  cluster_address = "[::]:{API_PORT + 1}"\n'
        "}\n"
        'storage "raft" {\n'
        '  path = "/openbao/data"\n'
        f"{joins}"
        "}\n"
        'service_registration "kubernetes" {}\n'
    )


def chart_values(args: OpenBaoArgs) -> dict[str, Any]:
    return {
        "injector": {"enabled": False},
        "server": {
            "ha": {
                "enabled": True,
                "replicas": args.replicas,
                "raft": {"enabled": True, "setNodeId": True, "config": raft_config(args.replicas)},
                "disruptionBudget": {"enabled": True, "maxUnavailable": 1},
            },
            "dataStorage": {"enabled": True, "size": args.storage_size, "storageClass": STORAGE_CLASS},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "statefulSet": {
                "securityContext": {
                    "pod": {
                        "runAsNonRoot": True,
                        "runAsUser": UID,
                        "runAsGroup": GID,
                        "fsGroup": GID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "container": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            },
        },
    }


class OpenBao(FactoryComponent):
    namespace: pulumi.Output[str]
    address: pulumi.Output[str]

    def __init__(self, name: str, args: OpenBaoArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="openbao", opts=opts)
        ns = namespace(self, args.namespace, pod_security="restricted", **STATEFUL)
        storage = k8s.storage.v1.StorageClass(
            self.child_name("storage-class"),
            metadata=k8s.meta.v1.ObjectMetaArgs(name=STORAGE_CLASS, labels=labels(self.layer)),
            provisioner=args.storage_provisioner,
            reclaim_policy="Retain",
            allow_volume_expansion=True,
            volume_binding_mode="WaitForFirstConsumer",
            opts=self.child(**STATEFUL),
        )
        release = helm_release(
            self,
            RELEASE,
            args.chart,
            namespace=ns.metadata.name,
            values=chart_values(args),
            depends_on=[storage],
            **STATEFUL,
        )
        if args.admin_token is not None:
            self._configure(args, release)
        self.namespace = ns.metadata.name
        self.address = pulumi.Output.from_input(service_address(args.namespace))
        self.register_outputs({"namespace": self.namespace, "address": self.address})

    def _configure(self, args: OpenBaoArgs, release: k8s.helm.v3.Release) -> None:
        """The engine tenants' secrets live in, and the auth method their stores log in with."""
        provider = vault.Provider(
            self.child_name("provider"),
            address=args.pulumi_address,
            token=args.admin_token.output(),
            skip_child_token=True,
            opts=self.child(),
        )
        on_openbao = {"provider": provider, "depends_on": [release]}
        vault.Mount(
            self.child_name("kv"),
            path=args.kv_mount,
            type="kv",
            options={"version": "2"},
            description="Tenants' secrets, each tenant under tenants/<name>/",
            opts=self.child(**on_openbao, **STATEFUL),
        )
        auth = vault.AuthBackend(self.child_name("kubernetes-auth"), type="kubernetes", path=args.auth_mount, opts=self.child(**on_openbao))
        # OpenBao runs in the cluster: it reviews tokens with its own service account (the chart's
        # auth-delegator binding) against the in-cluster API server.
        vault.kubernetes.AuthBackendConfig(
            self.child_name("kubernetes-auth-config"),
            backend=auth.path,
            kubernetes_host="https://kubernetes.default.svc",
            opts=self.child(**on_openbao),
        )


def storage_provisioner_named(raw: dict[str, Any]) -> list[str]:
    openbao = as_dict(as_dict(raw.get("layers")).get("openbao"))
    if openbao.get("enabled", True) is not False and openbao.get("storage_provisioner") is None:
        return ["layers.openbao.storage_provisioner: required while the layer is enabled (the CSI driver of its Retain StorageClass)"]
    return []


LAYER = Layer(
    name="openbao",
    section="openbao",
    chart="openbao",
    component=OpenBao,
    args=lambda cfg, plan: OpenBaoArgs.from_config(cfg),
    requires=("fleet",),
    config_checks=(storage_provisioner_named,),
)
