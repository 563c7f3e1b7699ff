"""MultiKueue: the jobs of a tenant placed on several clusters are dispatched from the manager
cluster to the worker clusters where it has quota (Kueue 0.19, `kueue.x-k8s.io/v1beta2`).

On the manager cluster:
- one `MultiKueueCluster` per worker cluster, connecting with a kubeconfig kept in OpenBao
  (`<kv>/clusters/<manager>/platform/multikueue/<worker>`, key `kubeconfig`), which an
  `ExternalSecret` copies into a Secret of Kueue's namespace through a namespaced `SecretStore`
  whose OpenBao role reads that prefix only (no cluster-wide store exists:
  `components/external_secrets.py`). The role is on the manager's own Kubernetes auth mount
  (`kubernetes-<manager>`), and every cluster's roles are on its own mount reading its own
  prefix (`components.openbao.auth_mount`, `platform_path`): no other cluster can read these
  kubeconfigs (`factory check` verifies it: `openbao_role_findings`);
- per multi-cluster tenant (its stack): a `MultiKueueConfig` listing its worker clusters, the
  `AdmissionCheck` naming it, a dispatch `ClusterQueue` `tenant-<name>-multicluster` whose
  quota is the sum of the tenant's quotas on those workers (a workload is admitted here only
  if some worker could take it), and the `LocalQueue` `multicluster` the tenant submits to.
On each worker, the tenant's `LocalQueue` `multicluster` (the name MultiKueue creates the
workload under) feeds the tenant's own ClusterQueue there: the worker's quota still decides.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from decimal import Decimal

import pulumi
import pulumi_kubernetes as k8s
import pulumi_vault as vault

from ai_factory.components._common import FactoryComponent, labels, tenant_entry
from ai_factory.components.external_secrets import secret_store_spec, store_role
from ai_factory.components.openbao import OpenBaoArgs, platform_path, service_address
from ai_factory.components.registry import Layer
from ai_factory.factory.checking.isolation import MULTIKUEUE_CONTROLLER
from ai_factory.factory.model.clusters import cluster_view, environment, is_multi_cluster, manager, tenant_clusters
from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.model.secrets import SecretValue
from ai_factory.factory.model.tenancy import TenantNames
from ai_factory.factory.planning.model import Plan

TOKEN = "ai-factory:scheduling:MultiKueue"
API_VERSION = "kueue.x-k8s.io/v1beta2"
CONTROLLER = MULTIKUEUE_CONTROLLER
FLAVOR = "multicluster"
"""The manager's one flavor for dispatched work: no node runs it there."""
LOCAL_QUEUE = "multicluster"
STORE = "openbao-multikueue"
STORE_ACCOUNT = "multikueue-secrets"
ROLE = "multikueue"
SECRET_PREFIX = "platform/multikueue"


def secret_name(worker: str) -> str:
    return f"multikueue-{worker}"


def dispatch_queue(names: TenantNames) -> str:
    return f"{names.cluster_queue}-multicluster"


def check_name(names: TenantNames) -> str:
    return f"multikueue-{names.cluster_queue}"


def _quantity(value: str) -> tuple[Decimal, str]:
    number, suffix = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)", value).groups()  # type: ignore[union-attr]
    return Decimal(number), suffix


def summed_quantity(values: list[str]) -> str:
    """The sum of quantities of one unit (a tenant's cpu or memory quota on each worker)."""
    suffixes = {_quantity(v)[1] for v in values}
    if len(suffixes) != 1:
        raise ValueError(f"quantities of different units: {values}")
    return f"{sum(_quantity(v)[0] for v in values).normalize():f}{suffixes.pop()}"


@dataclass(frozen=True)
class Dispatch:
    """One multi-cluster tenant, as the manager dispatches it."""

    tenant: str
    workers: tuple[str, ...]
    quota: tuple[tuple[str, int | str], ...]
    """Resource -> the sum of the tenant's quotas on its workers (cpu and memory included)."""


def worker_quotas(cfg: FactoryConfig, worker: str) -> dict[str, dict[str, int]]:
    """Each tenant's GPU quota on `worker`, by resource name as the worker's nodes advertise it
    (its own plan: each cluster's stack plans its own pools)."""
    from ai_factory.factory.planning.from_config import plan_for
    from ai_factory.factory.planning.placement import advertised_name

    view = cluster_view(environment(cfg), worker)
    plan = plan_for(view)
    result: dict[str, dict[str, int]] = {}
    for tenant in view.tenants:
        totals: Counter[str] = Counter()
        for (pool, resource), amount in plan.tenant_capacity(tenant.name).items():
            totals[advertised_name(plan.pool(pool), resource)] += amount
        result[tenant.name] = dict(sorted(totals.items()))
    return result


def multi_cluster_tenants(cfg: FactoryConfig) -> list[Tenant]:
    return [t for t in cfg.tenants if len(tenant_clusters(cfg, t)) > 1]


def on_manager(cfg: FactoryConfig) -> bool:
    head = manager(cfg)
    return head is not None and head.name == cfg.kubernetes.cluster


def needed(cfg: FactoryConfig) -> bool:
    """On every cluster of a multi-cluster environment, whether or not it has multi-cluster tenants
    yet (empty then): a tenant's arrival or removal never adds or removes the layer."""
    return is_multi_cluster(cfg) and cfg.kubernetes.cluster is not None


def dispatches(cfg: FactoryConfig) -> tuple[Dispatch, ...]:
    """The manager's dispatch of every multi-cluster tenant; none on a worker."""
    if not on_manager(cfg):
        return ()
    quotas = {w: worker_quotas(cfg, w) for w in sorted({w for t in multi_cluster_tenants(cfg) for w in tenant_clusters(cfg, t)} - {cfg.kubernetes.cluster})}
    result = []
    for tenant in multi_cluster_tenants(cfg):
        workers = tuple(w for w in tenant_clusters(cfg, tenant) if w != cfg.kubernetes.cluster)
        gpus: Counter[str] = Counter()
        for w in workers:
            gpus.update(quotas[w].get(tenant.name, {}))
        quota: list[tuple[str, int | str]] = [("cpu", summed_quantity([tenant.quota.cpu] * len(workers))), ("memory", summed_quantity([tenant.quota.memory] * len(workers)))]
        quota += sorted(gpus.items())
        result.append(Dispatch(tenant.name, workers, tuple(quota)))
    return tuple(result)


@dataclass(frozen=True)
class MultiKueueArgs:
    kueue_namespace: str
    workers: tuple[str, ...]
    """Worker clusters the manager dispatches to; empty on a worker."""
    openbao_server: str
    openbao_api: str
    admin_token: SecretValue | None
    kv_mount: str
    cluster: str | None = None

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> MultiKueueArgs:
        openbao = OpenBaoArgs.from_config(cfg)
        return cls(
            kueue_namespace=cfg.layers.kueue.namespace,
            workers=tuple(sorted({w for d in dispatches(cfg) for w in d.workers})),
            openbao_server=service_address(openbao.namespace),
            openbao_api=openbao.pulumi_address,
            admin_token=openbao.admin_token,
            kv_mount=openbao.kv_mount,
            cluster=openbao.cluster,
        )

    @property
    def secret_prefix(self) -> str:
        """Where the manager's kubeconfigs of its workers live: under the manager's own prefix,
        which no other cluster's role reads."""
        return platform_path(self.cluster, SECRET_PREFIX)


def store_policy(kv_mount: str, prefix: str = SECRET_PREFIX) -> str:
    return (
        "# MultiKueue: the worker clusters' kubeconfigs, read-only.\n"
        f'path "{kv_mount}/data/{prefix}/*" {{\n  capabilities = ["read"]\n}}\n'
    )


class MultiKueue(FactoryComponent):
    def __init__(self, name: str, args: MultiKueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="multikueue", opts=opts)
        if args.workers:
            self._manager(args)
        self.register_outputs({"workers": list(args.workers)})

    def _manager(self, args: MultiKueueArgs) -> None:
        object_labels = labels(self.layer)
        if args.admin_token is not None:
            provider = vault.Provider(self.child_name("openbao"), address=args.openbao_api, token=args.admin_token.output(), skip_child_token=True, opts=self.child())
            on_openbao = self.child(provider=provider)
            store_role(self, "", ROLE, args.kueue_namespace, store_policy(args.kv_mount, args.secret_prefix), on_openbao, account=STORE_ACCOUNT, cluster=args.cluster)
        account = k8s.core.v1.ServiceAccount(
            self.child_name("store-account"),
            metadata=k8s.meta.v1.ObjectMetaArgs(name=STORE_ACCOUNT, namespace=args.kueue_namespace, labels=object_labels),
            automount_service_account_token=False,
            opts=self.child(),
        )
        store = k8s.apiextensions.CustomResource(
            self.child_name("store"),
            api_version="external-secrets.io/v1",
            kind="SecretStore",
            metadata={"name": STORE, "namespace": args.kueue_namespace, "labels": object_labels},
            spec=secret_store_spec(args.openbao_server, args.kv_mount, ROLE, args.cluster, account=STORE_ACCOUNT),
            opts=self.child(depends_on=[account]),
        )
        k8s.apiextensions.CustomResource(
            self.child_name("flavor"), api_version=API_VERSION, kind="ResourceFlavor", metadata={"name": FLAVOR, "labels": object_labels}, spec={}, opts=self.child()
        )
        for worker in args.workers:
            secret = k8s.apiextensions.CustomResource(
                self.child_name(f"kubeconfig-{worker}"),
                api_version="external-secrets.io/v1",
                kind="ExternalSecret",
                metadata={"name": secret_name(worker), "namespace": args.kueue_namespace, "labels": object_labels},
                spec={
                    "refreshInterval": "1h",
                    "secretStoreRef": {"kind": "SecretStore", "name": STORE},
                    "target": {"name": secret_name(worker), "creationPolicy": "Owner"},
                    "data": [{"secretKey": "kubeconfig", "remoteRef": {"key": f"{args.secret_prefix}/{worker}", "property": "kubeconfig"}}],
                },
                opts=self.child(depends_on=[store]),
            )
            k8s.apiextensions.CustomResource(
                self.child_name(f"cluster-{worker}"),
                api_version=API_VERSION,
                kind="MultiKueueCluster",
                metadata={"name": worker, "labels": object_labels},
                spec={"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": secret_name(worker)}}},
                opts=self.child(depends_on=[secret]),
            )


@dataclass(frozen=True)
class MultiKueueTenantHook:
    """A multi-cluster tenant's dispatch objects (manager) or its `multicluster` queue (worker)."""

    dispatch: dict[str, Dispatch]
    """Per tenant name, on the manager; empty on a worker."""
    tenants: frozenset[str]
    """The multi-cluster tenants of this cluster."""
    layer: str = "multikueue"

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> MultiKueueTenantHook | None:
        return cls({d.tenant: d for d in dispatches(cfg)}, frozenset(t.name for t in multi_cluster_tenants(cfg)))

    def narrowed(self, tenant: str) -> MultiKueueTenantHook:
        """Only the tenant's own dispatch (see `TenantHook`)."""
        return replace(self, dispatch=tenant_entry(self.dispatch, tenant), tenants=self.tenants & {tenant})

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        if tenant.name not in self.tenants:
            return
        object_labels = labels(self.layer, tenant=names.tenant, extra=names.labels)
        dispatch = self.dispatch.get(tenant.name)
        target = names.cluster_queue
        depends: list[pulumi.Resource] = []
        if dispatch is not None:
            target = dispatch_queue(names)
            config = k8s.apiextensions.CustomResource(
                stack.child_name("multikueue-config"),
                api_version=API_VERSION,
                kind="MultiKueueConfig",
                metadata={"name": names.cluster_queue, "labels": object_labels},
                spec={"clusters": list(dispatch.workers)},
                opts=stack.child(),
            )
            check = k8s.apiextensions.CustomResource(
                stack.child_name("multikueue-check"),
                api_version=API_VERSION,
                kind="AdmissionCheck",
                metadata={"name": check_name(names), "labels": object_labels},
                spec={"controllerName": CONTROLLER, "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": names.cluster_queue}},
                opts=stack.child(depends_on=[config]),
            )
            queue = k8s.apiextensions.CustomResource(
                stack.child_name("multikueue-queue"),
                api_version=API_VERSION,
                kind="ClusterQueue",
                metadata={"name": target, "labels": object_labels},
                spec={
                    "namespaceSelector": {"matchLabels": {"ai-factory.io/tenant": names.tenant}},
                    "admissionChecksStrategy": {"admissionChecks": [{"name": check_name(names)}]},
                    "resourceGroups": [
                        {
                            "coveredResources": [r for r, _ in dispatch.quota],
                            "flavors": [{"name": FLAVOR, "resources": [{"name": r, "nominalQuota": q} for r, q in dispatch.quota]}],
                        }
                    ],
                },
                opts=stack.child(depends_on=[check]),
            )
            depends = [queue]
        k8s.apiextensions.CustomResource(
            stack.child_name("multikueue-local-queue"),
            api_version=API_VERSION,
            kind="LocalQueue",
            metadata={"name": LOCAL_QUEUE, "namespace": names.namespace, "labels": object_labels},
            spec={"clusterQueue": target},
            opts=stack.child(depends_on=depends),
        )


LAYER = Layer(
    name="multikueue",
    component=MultiKueue,
    args=MultiKueueArgs.from_config,
    section="kueue",
    requires=("kueue", "external-secrets"),
    needed=needed,
    tenant_hook=MultiKueueTenantHook.from_config,
)
