"""The platform contract: what the platform stack exports for tenant stacks, versioned.

The platform program (`ai_factory.factory.rendering.program`) exports the stack output `contract`, built here from the
validated configuration and the plan. Tenant stacks read it through a `StackReference` and never
see the platform's resources:

- where tenants connect: the cluster's API server and the OIDC issuer they sign in with;
- tenant-facing names: GPU offerings (the Kueue flavors), each registered tenant's names
  (namespace, queues, group subjects), Kueue cohort and GPU allocation, every GPU resource name
  nodes advertise;
- what a tenant program needs to rebuild the platform's tenant hooks on its own: the platform
  configuration and the plan, both plain data.

A multi-cluster environment has a platform stack per cluster (`<env>-<cluster>`): its contract
names the cluster, and its configuration is the whole environment's with `kubernetes.cluster`
set, which validates back to the cluster's view (`ai_factory.factory.model.clusters`) while
keeping what a tenant hook needs of the other clusters (MultiKueue's dispatch sums the tenant's
quotas on its workers). Its tenant-facing names, allocations and plan are the cluster's own.

Nothing in `contract` is secret: the configuration is in it with every `SecretValue` as
`[secret]` (its serialised form), so anyone who may read the platform's outputs reads it in
clear. The secret values themselves go to a second output, `contract_secrets`, exported as a
Pulumi secret: encrypted in the platform's state, decrypted only inside a tenant program (some
hooks manage live systems: the identity hook logs in to Keycloak, the secrets hook to OpenBao),
and encrypted again in the tenant's state wherever a hook uses them.

`contract_version` changes whenever a field changes meaning or goes away; a reader of another
version fails fast with a message instead of misreading the platform.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Iterable, Iterator, Mapping

from pydantic import BaseModel, ConfigDict, ValidationError

from ai_factory.components.registry import enabled_layers, layers
from ai_factory.factory.model import clusters
from ai_factory.factory.model.config import SECTIONS, FactoryConfig, Identity, Tenant
from ai_factory.factory.model.loading import ConfigError, validate
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.planning.placement import Offering, TenantAllocation, advertised_resources, allocations, offerings
from ai_factory.factory.planning.quotas import queue_plan
from ai_factory.factory.model.secrets import SecretValue
from ai_factory.factory.model.tenancy import TenantNames, tenant_names

CONTRACT_VERSION = 3
CONTRACT_OUTPUT = "contract"
"""The platform stack's output holding the contract."""
CONTRACT_SECRETS_OUTPUT = "contract_secrets"
"""The platform stack's secret output holding the configuration's secret values."""
TENANT_DECIDED = ("owners",)
"""What a tenant decides about itself. Every other field of a tenant (trust, trust domain,
isolation, GPUs, quota, borrowing, organisation, which stack builds it) is the platform team's."""


class ContractError(Exception):
    """The platform stack has no contract this library can read (not deployed, or another version)."""


class PlatformContract(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    contract_version: int = CONTRACT_VERSION
    environment: str
    """The platform stack (environment, or one cluster's stack of it) that exported the contract."""
    cluster: str | None = None
    """The cluster the stack deploys, in a multi-cluster environment."""
    layers: tuple[str, ...]
    """The layers the platform runs (registry names): a tenant program whose library lacks one
    would silently leave out its tenant hook, so it refuses instead."""
    kubernetes_version: str
    api_server: str | None
    """The host cluster's API server as tenants reach it (`kubernetes.api_server`)."""
    identity: Identity | None
    """The OIDC issuer users sign in with, and the audience and claims API servers expect."""
    offerings: tuple[Offering, ...]
    allocations: dict[str, TenantAllocation]
    """Per registered tenant, its GPU grants per offering and its dedicated nodes."""
    tenants: dict[str, TenantNames]
    """Per registered tenant, the names every layer knows it by."""
    cohorts: dict[str, str]
    """Per registered tenant, the Kueue cohort its ClusterQueue borrows in (none without Kueue)."""
    advertised_resources: tuple[str, ...]
    """Every GPU resource name the platform's nodes advertise (what tenant quotas must cover)."""
    platform_config: dict[str, Any]
    """The platform configuration, secrets as `[secret]`: tenant programs rebuild hooks from it
    (the whole environment's, for one cluster's stack)."""
    plan: dict[str, Any]
    """The capacity plan (`Plan.to_json`), for the same reason."""

    # ------------------------------------------------------------------ the stack output

    def to_output(self) -> str:
        """The contract as the stack output holds it: one JSON document. A structured output would
        not survive the engine intact (numbers become floats, null members disappear)."""
        return self.model_dump_json()

    @classmethod
    def from_output(cls, output: Any, stack: str) -> PlatformContract:
        """The contract a platform stack exported, or a `ContractError` saying what to do."""
        if output is None:
            raise ContractError(f"platform stack {stack} exports no {CONTRACT_OUTPUT!r}: deploy it first (ai-factory-stacks platform up)")
        try:
            value = json.loads(output)
        except (TypeError, ValueError):
            value = None
        version = value.get("contract_version") if isinstance(value, dict) else None
        if version != CONTRACT_VERSION:
            raise ContractError(
                f"platform stack {stack} exports contract version {version}; this library reads version {CONTRACT_VERSION}: "
                "deploy the platform and the tenants from the same release"
            )
        try:
            return cls.model_validate(value)
        except ValidationError as err:
            raise ContractError(f"platform stack {stack} exports an unreadable contract: {err}") from None

    def config(self, secrets: str) -> FactoryConfig:
        """The platform configuration, its secret values put back from `contract_secrets` (the
        engine decrypted them: as for `pulumi up`, plain strings are accepted where secrets go)."""
        raw = copy.deepcopy(self.platform_config)
        for secret in json.loads(secrets):
            *parents, last = secret["path"]
            node = raw
            for part in parents:
                node = node[part]
            node[last] = secret["value"]
        try:
            return validate(raw, decrypted_secret_sections=set(SECTIONS), source=f"platform contract of {self.environment}")
        except ConfigError as err:
            raise ContractError(err.render()) from None

    def capacity_plan(self) -> Plan:
        return Plan.from_json(json.dumps(self.plan))

    def registration(self, name: str) -> Tenant | None:
        """The tenant as the platform configuration registers it (with every demand, on every
        cluster), if it does."""
        return next((Tenant.model_validate(t) for t in self.platform_config.get("tenants", []) if t.get("name") == name), None)

    def registered_owners(self) -> dict[str, tuple[str, ...]]:
        """Owner groups per tenant, as the platform configuration registers them."""
        return {t["name"]: tuple((t.get("owners") or {}).get("groups", ())) for t in self.platform_config.get("tenants", [])}

    # ------------------------------------------------------------------ checking a tenant

    def tenant_problems(self, tenant: Tenant) -> list[str]:
        """Why the platform cannot host `tenant` as given, one `tenant.<field>: ...` line per field.

        The platform hosts in tenant stacks the tenants its configuration registers with
        `managed_by: tenant-stack` (GPUs, queues and trust domains are planned with every tenant),
        each as registered but for its owners."""
        if unknown := sorted(set(self.layers) - {l.name for l in layers()}):
            return [
                f"platform: {self.environment} runs layers this library does not have ({', '.join(unknown)}): "
                "run the tenant stack with the library release that deployed the platform"
            ]
        registered = self.registration(tenant.name)
        if registered is None:
            return [
                f"tenant.name: {tenant.name!r} is not a tenant of platform {self.environment}: its GPUs, queues and trust "
                "are planned with every other tenant's; register it in the platform config (`tenants`) and update the platform"
            ]
        if self.cluster is not None and tenant.name not in self.tenants:
            return [
                f"tenant.clusters: {tenant.name!r} is not placed on cluster {self.cluster} ({self.environment}); "
                "its stacks are those of the clusters it is on"
            ]
        if registered.managed_by != "tenant-stack":
            return [
                f"tenant.managed_by: {tenant.name!r} is built by the platform stack of {self.environment}; set its "
                "`managed_by: tenant-stack` in the platform config and update the platform to give it a stack of its own"
            ]
        given, wanted = _decided_by_platform(tenant), _decided_by_platform(registered)
        return [
            f"tenant.{field}: {_show(given[field])} differs from the platform's registration of {tenant.name!r} in {self.environment}: {_show(wanted[field])}"
            for field in sorted(given)
            if given[field] != wanted[field]
        ]


def owner_conflicts(tenant: Tenant, owners_by_tenant: Mapping[str, Iterable[str]]) -> list[str]:
    """Owner groups of `tenant` that another tenant holds. Tokens carry group names, not paths: one
    name in two tenants would open both to its members (the platform config refuses it too)."""
    holders = {group: name for name, groups in sorted(owners_by_tenant.items()) if name != tenant.name for group in groups}
    return [
        f"tenant.owners.groups[{i}]: group {group!r} already owns tenant {holders[group]!r}; an identity group administers one tenant"
        for i, group in enumerate(tenant.owners.groups)
        if group in holders
    ]


def platform_contract(cfg: FactoryConfig, plan: Plan, environment: str) -> PlatformContract:
    """The contract of one environment (or one cluster's view of it), from its validated
    configuration and its plan."""
    return PlatformContract(
        environment=environment,
        cluster=cfg.kubernetes.cluster,
        layers=tuple(l.name for l in enabled_layers(cfg)),
        kubernetes_version=cfg.kubernetes.version,
        api_server=cfg.kubernetes.api_server,
        identity=cfg.identity,
        offerings=tuple(offerings(plan)),
        allocations=allocations(plan, {t.name: t.domain for t in cfg.tenants}),
        tenants={t.name: tenant_names(t) for t in cfg.tenants},
        cohorts={q.tenant: q.cohort for q in queue_plan(cfg, plan).cluster_queues} if cfg.layers.kueue.enabled else {},
        advertised_resources=advertised_resources(plan),
        platform_config=_environment_config(cfg),
        plan=plan.to_data(),
    )


def _environment_config(cfg: FactoryConfig) -> dict[str, Any]:
    """The environment `cfg` belongs to, as plain data, deployed as `cfg`'s cluster."""
    config = clusters.environment(cfg).model_dump(mode="json")
    config["kubernetes"]["cluster"] = cfg.kubernetes.cluster
    return config


def platform_secrets(cfg: FactoryConfig) -> str:
    """The value of `contract_secrets` (to export as a Pulumi secret): every `SecretValue` of the
    configuration with its path (the whole environment's, as `platform_config`)."""
    return json.dumps([{"path": list(path), "value": secret.reveal()} for path, secret in _secret_values(clusters.environment(cfg), ())])


def _secret_values(value: Any, path: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], SecretValue]]:
    if isinstance(value, SecretValue):
        yield path, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _secret_values(getattr(value, name), (*path, name))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _secret_values(item, (*path, i))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _secret_values(item, (*path, key))


def _decided_by_platform(tenant: Tenant) -> dict[str, Any]:
    """The tenant's fields the platform decides, defaults resolved (an unset trust domain is the
    tenant's own; an unset isolation follows trust) so that equal meanings compare equal."""
    fields = tenant.model_dump(mode="json", exclude=set(TENANT_DECIDED))
    fields["trust_domain"] = tenant.domain
    fields["isolation"] = tenant.control_plane
    return fields


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
