"""LiteLLM: the OpenAI-compatible front door to every exposed model, one team per tenant.

- **Models.** LiteLLM's model list is generated from the tenants' exposed models
  (`ai_factory.factory.model.serving.ModelEndpoint`): each served name goes to its model's
  in-cluster OpenAI API (`hosted_vllm/`, vLLM's provider in LiteLLM).
- **Teams and keys.** Per tenant with a model to call, a LiteLLM team with its budget
  (`max_budget` per `budget_duration`), TPM/RPM limits and the models it may call (its own
  exposed models plus `shared_models`), and its virtual keys, made through LiteLLM's management
  API by a dynamic provider (`components/litellm_keys.py`) that writes the keys to the tenant's
  OpenBao path; the tenant's own SecretStore brings them into Secret `litellm-api-key` of its
  namespace. A tenant with no model to call gets no team: LiteLLM reads a team's empty model list
  as "every model".
- **Database.** Teams, keys and spend live in PostgreSQL run outside this library, as Keycloak's
  do. Its password and LiteLLM's master key go from the config (Pulumi secrets) to OpenBao
  (`platform/litellm`), and from there to LiteLLM's namespace through a SecretStore of that
  namespace that reads only that path: no secret value goes through Helm.
- **Network.** LiteLLM's namespace denies by default both ways; its pods answer tenants' pods on
  4000 and reach DNS, the database and exactly the pods of the models it routes to.

No package of the `litellm-helm` chart could be obtained (see the chart catalog), so its values
are checked against the transcription of its `values.yaml`. Its pods run under Pod Security
`baseline`: the chart's migration Job takes no security context from values.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_vault as vault

from ai_factory.components._common import FactoryComponent, helm_release, labels, namespace, tenant_entry
from ai_factory.components.cilium import DNS_PORTS, KUBE_DNS_SELECTOR
from ai_factory.components.external_secrets import STORE_NAME, STORE_SERVICE_ACCOUNT, read_policy, secret_prefix, secret_store_spec, store_role
from ai_factory.components.gateway import LITELLM_POD_LABELS, LITELLM_PORT, NAMESPACE_LABEL, POD_PORTS
from ai_factory.components.litellm_keys import LiteLLMTeam, key_property
from ai_factory.components.openbao import OpenBaoArgs, service_address
from ai_factory.components.registry import Layer
from ai_factory.factory.checking.routing import LITELLM_CHECKS, MODEL_INFO_KEY
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig, LiteLLMDatabase, TeamBudget, Tenant
from ai_factory.factory.model.raw import as_dict, as_list, did_you_mean
from ai_factory.factory.model.secrets import SecretValue
from ai_factory.factory.model.serving import ModelEndpoint, model_endpoints
from ai_factory.factory.model.tenancy import TenantNames

TOKEN = "ai-factory:serving:LiteLLM"
RELEASE = "litellm"
PLATFORM_PATH = "platform/litellm"
"""Where LiteLLM's own secrets live in OpenBao's KV engine (outside every tenant's prefix)."""
SECRETS = "litellm-secrets"
"""The Secret of LiteLLM's namespace External Secrets fills: database user and password, master key."""
TENANT_SECRET = "litellm-api-key"
TENANT_PATH = "litellm"
"""A tenant's keys in OpenBao: `tenants/<name>/litellm`."""


@dataclass(frozen=True)
class Team:
    tenant: str
    models: tuple[str, ...]
    budget: TeamBudget

    @property
    def team_id(self) -> str:
        return f"tenant-{self.tenant}"


def exposed(cfg: FactoryConfig) -> list[ModelEndpoint]:
    return [e for e in model_endpoints(cfg) if e.expose]


def teams(cfg: FactoryConfig) -> dict[str, Team]:
    """Per tenant with a model to call: its team (own exposed models first, then the shared ones)."""
    layer = cfg.layers.litellm
    endpoints = exposed(cfg)
    result = {}
    for tenant in cfg.tenants:
        own = [e.served_name for e in endpoints if e.tenant == tenant.name]
        models = tuple(dict.fromkeys([*own, *layer.shared_models]))
        if models:
            result[tenant.name] = Team(tenant.name, models, layer.budgets.get(tenant.name, layer.default_budget))
    return result


def model_list(endpoints: list[ModelEndpoint]) -> list[dict[str, Any]]:
    return [
        {
            "model_name": e.served_name,
            "litellm_params": {"model": f"hosted_vllm/{e.served_name}", "api_base": e.url},
            "model_info": {"id": f"{e.tenant}-{e.model}", MODEL_INFO_KEY: e.model},
        }
        for e in endpoints
    ]


@dataclass(frozen=True)
class LiteLLMArgs:
    chart: ChartSource
    namespace: str
    replicas: int
    master_key: SecretValue
    database: LiteLLMDatabase
    endpoints: tuple[ModelEndpoint, ...]
    tenant_namespaces: tuple[str, ...]
    """Namespaces of the tenants with a team: LiteLLM answers their pods."""
    openbao: OpenBaoArgs

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> LiteLLMArgs:
        layer = cfg.layers.litellm
        assert layer.master_key and layer.database, "validation requires them while the layer is enabled"
        return cls(
            chart=layer.chart.source("litellm"),
            namespace=layer.namespace,
            replicas=layer.replicas,
            master_key=layer.master_key,
            database=layer.database,
            endpoints=tuple(exposed(cfg)),
            tenant_namespaces=tuple(f"tenant-{t}" for t in teams(cfg)),
            openbao=OpenBaoArgs.from_config(cfg),
        )


def chart_values(args: LiteLLMArgs) -> dict[str, Any]:
    """Values name Secrets only; the proxy's config is the generated model list."""
    db = args.database
    values: dict[str, Any] = {
        "replicaCount": args.replicas,
        "podLabels": dict(LITELLM_POD_LABELS),
        "masterkeySecretName": SECRETS,
        "masterkeySecretKey": "master-key",
        "db": {
            "useExisting": True,
            "deployStandalone": False,
            "endpoint": f"{db.host}:{db.port}",
            "database": db.name,
            "secret": {"name": SECRETS, "usernameKey": "username", "passwordKey": "password"},
        },
        # The chart's default `general_settings` stay: the master key from the environment
        # (`os.environ/PROXY_MASTER_KEY`, set from `masterkeySecretName`).
        "proxy_config": {"model_list": model_list(list(args.endpoints))},
        "serviceAccount": {"create": True, "automount": False},
    }
    if args.replicas > 1:
        values["pdb"] = {"enabled": True, "minAvailable": 1}
    return values


def _database_peer(host: str) -> dict[str, Any]:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return {"toFQDNs": [{"matchName": host}]}
    return {"toCIDR": [f"{address}/{address.max_prefixlen}"]}


def network_policy_spec(args: LiteLLMArgs) -> dict[str, Any]:
    """Default deny both ways; tenants' pods in, DNS, the database and the routed models' pods out."""
    own = {"matchLabels": {NAMESPACE_LABEL: args.namespace}}
    port = {"ports": [{"port": str(LITELLM_PORT), "protocol": "TCP"}]}
    dns = {
        "toEndpoints": [{"matchLabels": dict(KUBE_DNS_SELECTOR)}],
        # The DNS proxy sees the answers, which the database's FQDN rule needs.
        "toPorts": [{"ports": [dict(p) for p in DNS_PORTS], "rules": {"dns": [{"matchName": args.database.host}, {"matchPattern": "*.svc.cluster.local"}]}}],
    }
    egress: list[dict[str, Any]] = [
        {"toEndpoints": [own]},
        dns,
        {**_database_peer(args.database.host), "toPorts": [{"ports": [{"port": str(args.database.port), "protocol": "TCP"}]}]},
    ]
    for e in args.endpoints:
        selector = {"matchLabels": {NAMESPACE_LABEL: e.namespace, **{f"k8s:{k}": v for k, v in e.pod_labels}}}
        egress.append({"toEndpoints": [selector], "toPorts": [{"ports": [{"port": str(POD_PORTS[e.kind]), "protocol": "TCP"}]}]})
    ingress: list[dict[str, Any]] = [{"fromEndpoints": [own]}]
    ingress += [{"fromEndpoints": [{"matchLabels": {NAMESPACE_LABEL: ns}}], "toPorts": [port]} for ns in args.tenant_namespaces]
    return {
        "description": "LiteLLM: tenants' pods in; DNS, its database and the models it routes to out.",
        "endpointSelector": own,
        "enableDefaultDeny": {"ingress": True, "egress": True},
        "ingress": ingress,
        "egress": egress,
    }


class LiteLLM(FactoryComponent):
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: LiteLLMArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="litellm", opts=opts)
        ns = namespace(self, args.namespace, pod_security="baseline")
        object_labels = labels(self.layer)
        k8s.apiextensions.CustomResource(
            self.child_name("isolation"),
            api_version="cilium.io/v2",
            kind="CiliumClusterwideNetworkPolicy",
            metadata={"name": f"{args.namespace}-isolation", "labels": object_labels},
            spec=network_policy_spec(args),
            opts=self.child(),
        )
        secrets = self._secrets(args, ns, object_labels)
        helm_release(self, RELEASE, args.chart, namespace=ns.metadata.name, values=chart_values(args), depends_on=[ns, *secrets])
        self.namespace = ns.metadata.name
        self.register_outputs({"namespace": self.namespace})

    def _secrets(self, args: LiteLLMArgs, ns: k8s.core.v1.Namespace, object_labels: dict[str, str]) -> list[pulumi.Resource]:
        """LiteLLM's secrets to OpenBao, and back into its namespace through its own store."""
        assert args.openbao.admin_token is not None, "validation requires it while the layer is enabled"
        provider = vault.Provider(
            self.child_name("openbao"), address=args.openbao.pulumi_address, token=args.openbao.admin_token.output(), skip_child_token=True, opts=self.child()
        )
        on_openbao = self.child(provider=provider)
        data = pulumi.Output.json_dumps(
            {"username": args.database.username, "password": args.database.password.output(), "master-key": args.master_key.output()}
        )
        path = args.openbao.platform_path(PLATFORM_PATH)
        stored = vault.kv.SecretV2(self.child_name("stored"), mount=args.openbao.kv_mount, name=path, data_json=pulumi.Output.secret(data), opts=on_openbao)
        store_role(self, "", args.namespace, args.namespace, read_policy(args.openbao.kv_mount, path, "LiteLLM"), on_openbao, cluster=args.openbao.cluster)
        meta = lambda name: {"name": name, "namespace": args.namespace, "labels": object_labels}  # noqa: E731
        account = k8s.core.v1.ServiceAccount(self.child_name("store-account"), metadata=meta(STORE_SERVICE_ACCOUNT), automount_service_account_token=False, opts=self.child(depends_on=[ns]))
        store = k8s.apiextensions.CustomResource(
            self.child_name("store"),
            api_version="external-secrets.io/v1",
            kind="SecretStore",
            metadata=meta(STORE_NAME),
            spec=secret_store_spec(service_address(args.openbao.namespace), args.openbao.kv_mount, args.namespace, args.openbao.cluster),
            opts=self.child(depends_on=[account]),
        )
        pulled = k8s.apiextensions.CustomResource(
            self.child_name("secrets"),
            api_version="external-secrets.io/v1",
            kind="ExternalSecret",
            metadata=meta(SECRETS),
            spec=external_secret_spec(SECRETS, path, ["username", "password", "master-key"]),
            opts=self.child(depends_on=[store, stored]),
        )
        return [pulled]


def external_secret_spec(target: str, key: str, properties: list[str]) -> dict[str, Any]:
    return {
        "refreshInterval": "1h",
        "secretStoreRef": {"kind": "SecretStore", "name": STORE_NAME},
        "target": {"name": target, "creationPolicy": "Owner"},
        "data": [{"secretKey": p, "remoteRef": {"key": key, "property": p}} for p in properties],
    }


@dataclass(frozen=True)
class LiteLLMHook:
    """A tenant's team and keys (through the dynamic provider) and the ExternalSecret delivering them."""

    teams: dict[str, Team]
    api_address: str
    master_key: SecretValue
    openbao_address: str
    openbao_token: SecretValue
    kv_mount: str
    layer: str = "litellm"

    @classmethod
    def from_config(cls, cfg: FactoryConfig) -> LiteLLMHook:
        args = LiteLLMArgs.from_config(cfg)
        assert args.openbao.admin_token is not None
        return cls(
            teams=teams(cfg),
            api_address=cfg.layers.litellm.api_address or f"http://{RELEASE}.{args.namespace}.svc:{LITELLM_PORT}",
            master_key=args.master_key,
            openbao_address=args.openbao.pulumi_address,
            openbao_token=args.openbao.admin_token,
            kv_mount=args.openbao.kv_mount,
        )

    def narrowed(self, tenant: str) -> LiteLLMHook:
        """Only the tenant's own team (see `TenantHook`)."""
        return replace(self, teams=tenant_entry(self.teams, tenant))

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        team = self.teams.get(names.tenant)
        if team is None:
            return
        path = f"{secret_prefix(names)}{TENANT_PATH}"
        budget = team.budget
        made = LiteLLMTeam(
            stack.child_name("litellm-team"),
            {
                "api_address": self.api_address,
                "master_key": self.master_key.output(),
                "openbao_address": self.openbao_address,
                "openbao_token": self.openbao_token.output(),
                "kv_mount": self.kv_mount,
                "secret_path": path,
                "team_id": team.team_id,
                "team_alias": names.tenant,
                "models": list(team.models),
                "max_budget": budget.max_budget,
                "budget_duration": budget.budget_duration,
                "tpm_limit": budget.tpm_limit,
                "rpm_limit": budget.rpm_limit,
                "keys": budget.keys,
            },
            opts=stack.child(),
        )
        k8s.apiextensions.CustomResource(
            stack.child_name("litellm-api-key"),
            api_version="external-secrets.io/v1",
            kind="ExternalSecret",
            metadata={"name": TENANT_SECRET, "namespace": names.namespace, "labels": labels(stack.layer, tenant=names.tenant, extra=names.labels)},
            spec=external_secret_spec(TENANT_SECRET, path, [key_property(i) for i in range(budget.keys)]),
            opts=stack.child(depends_on=[made]),
        )


def litellm_requirements(raw: dict) -> list[str]:
    """What LiteLLM needs while enabled, and names it refers to."""
    layers = as_dict(raw.get("layers"))
    layer = as_dict(layers.get("litellm"))
    if layer.get("enabled", False) is not True:
        return []
    problems = [f"layers.litellm.{key}: required while the layer is enabled" for key in ("master_key", "database") if layer.get(key) is None]
    if as_dict(layers.get("openbao")).get("admin_token") is None:
        problems.append("layers.openbao.admin_token: required by layers.litellm (its keys and database password go through OpenBao)")
    if as_dict(layers.get("external_secrets")).get("enabled", True) is False:
        problems.append("layers.external_secrets.enabled: required by layers.litellm (it delivers the keys)")
    tenants = [as_dict(t) for t in as_list(raw.get("tenants"))]
    names = {t.get("name") for t in tenants}
    for tenant in as_dict(layer.get("budgets")):
        if tenant not in names:
            problems.append(f"layers.litellm.budgets.{tenant}: unknown tenant{did_you_mean(tenant, names)}")
    served = set()
    for t in tenants:
        for m in as_list(t.get("models")):
            m = as_dict(m)
            if m.get("expose") is True:
                served.add(m.get("served_name") or f"{t.get('name')}/{m.get('name')}")
    for i, name in enumerate(as_list(layer.get("shared_models"))):
        if name not in served:
            problems.append(f"layers.litellm.shared_models[{i}]: {name!r} is no exposed model's served name{did_you_mean(name, served)}")
    return problems


LAYER = Layer(
    name="litellm",
    section="litellm",
    chart="litellm",
    component=LiteLLM,
    args=lambda cfg, plan: LiteLLMArgs.from_config(cfg),
    requires=("fleet", "cilium", "openbao", "external-secrets"),
    tenant_hook=lambda cfg, plan: LiteLLMHook.from_config(cfg),
    checks=LITELLM_CHECKS,
    config_checks=(litellm_requirements,),
)
