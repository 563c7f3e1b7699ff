"""The root component: composes the platform's layers from one validated configuration."""

from __future__ import annotations

import pulumi

from ai_factory.components._common import FactoryComponent, TenantHook
from ai_factory.components.dra import DraArgs, DraClaimTemplates, DraDriver
from ai_factory.components.fleet import Fleet, FleetArgs
from ai_factory.components.gpu_operator import GpuOperator, GpuOperatorArgs, PoolDriver
from ai_factory.components.hami import Hami, HamiArgs
from ai_factory.components.kai_scheduler import KaiScheduler, KaiSchedulerArgs, KaiTenantHook
from ai_factory.components.kueue import Kueue, KueueArgs, KueueTenantHook
from ai_factory.components.tenant_stack import TenantStack, tenant_stack_args
from ai_factory.components.volcano import Volcano, VolcanoArgs, VolcanoTenantHook
from ai_factory.components.cilium import Cilium, CiliumArgs
from ai_factory.components.external_secrets import ExternalSecrets, ExternalSecretsArgs, TenantSecretsHook
from ai_factory.components.falco import Falco, FalcoArgs
from ai_factory.components.keycloak import IdentityHook, Keycloak, KeycloakArgs
from ai_factory.components.kyverno import Kyverno, KyvernoArgs, TenantAdmissionHook
from ai_factory.components.openbao import OpenBao, OpenBaoArgs
from ai_factory.components.trivy import Trivy, TrivyArgs
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.planning.model import Plan

TOKEN = "ai-factory:index:Platform"


def gpu_operator_args(cfg: FactoryConfig, plan: Plan) -> GpuOperatorArgs:
    layer = cfg.layers.gpu_operator
    return GpuOperatorArgs(
        chart=layer.chart.source("gpu-operator"),
        namespace=layer.namespace,
        drivers=tuple(PoolDriver(pool=p.name, settings=p.driver) for p in cfg.fleet.pools),
        toolkit_version=layer.toolkit_version,
        mig_configs=plan.mig_configs(),
        time_slicing_replicas=tuple(sorted({p.time_slicing_replicas for p in plan.pools if p.sharing == "time-slicing"})),
        dcgm_exporter=layer.dcgm_exporter,
        registry=layer.registry,
    )


def tenant_hooks(cfg: FactoryConfig, plan: Plan) -> list[TenantHook]:
    """Every enabled layer's per-tenant hook, in the order tenant stacks attach them. Plain data
    from the config and the plan: a tenant stack run on its own (`stacks/tenants.py`) rebuilds
    the same list from the platform contract, so a layer adds its hook here, nowhere else."""
    hooks: list[TenantHook] = []
    if "dra" in {p.sharing for p in cfg.fleet.pools}:
        hooks.append(DraClaimTemplates.from_plan(plan))
    if cfg.layers.kueue.enabled:
        hooks.append(KueueTenantHook.from_config(cfg, plan))
    if cfg.layers.kai_scheduler.enabled:
        hooks.append(KaiTenantHook.from_config(cfg, plan))
    if cfg.layers.volcano.enabled:
        hooks.append(VolcanoTenantHook.from_config(cfg, plan))
    if cfg.layers.keycloak.enabled:
        hooks.append(IdentityHook.from_config(cfg))
    if cfg.layers.external_secrets.enabled and (secrets_hook := TenantSecretsHook.from_config(cfg)):
        hooks.append(secrets_hook)
    if cfg.layers.kyverno.enabled:
        hooks.append(TenantAdmissionHook.from_config(cfg, plan))
    return hooks


class Platform(FactoryComponent):
    """Everything one environment runs: the fleet's node labels, then each enabled layer, then one
    `TenantStack` per tenant.

    `hooks`: what layers add to every tenant's environment (its queue, identity group, secret
    store, ...), from `tenant_hooks`; each tenant stack attaches them all, after every layer exists.
    """

    def __init__(self, name: str, cfg: FactoryConfig, plan: Plan, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="platform", opts=opts)
        self.hooks = tenant_hooks(cfg, plan)
        fleet = Fleet("fleet", FleetArgs.from_config(cfg, plan), opts=self.child())
        layers: list[FactoryComponent] = [fleet]
        if cfg.layers.gpu_operator.enabled:
            layers.append(GpuOperator("gpu-operator", gpu_operator_args(cfg, plan), opts=self.child(depends_on=[fleet])))
        sharing = {p.sharing for p in cfg.fleet.pools}
        if "hami" in sharing:  # the config refuses HAMi pools with the layer off
            layers.append(Hami("hami", HamiArgs.from_config(cfg, plan), opts=self.child(depends_on=[fleet])))
        if "dra" in sharing:  # likewise for DRA pools
            layers.append(DraDriver("dra", DraArgs.from_config(cfg), opts=self.child(depends_on=[fleet])))
        # Scheduling: Kueue admits; KAI Scheduler or Volcano (never both: the config refuses it) place.
        if cfg.layers.kueue.enabled:
            layers.append(Kueue("kueue", KueueArgs.from_config(cfg, plan), opts=self.child(depends_on=[fleet])))
        if cfg.layers.kai_scheduler.enabled:
            layers.append(KaiScheduler("kai-scheduler", KaiSchedulerArgs.from_config(cfg, plan), opts=self.child(depends_on=[fleet])))
        if cfg.layers.volcano.enabled:
            layers.append(Volcano("volcano", VolcanoArgs.from_config(cfg, plan), opts=self.child(depends_on=[fleet])))
        # Security: network policy, identity, secrets, admission, runtime and supply-chain scanning.
        security = cfg.layers
        if security.cilium.enabled:
            layers.append(Cilium("cilium", CiliumArgs.from_config(cfg), opts=self.child(depends_on=[fleet])))
        if security.keycloak.enabled:
            layers.append(Keycloak("keycloak", KeycloakArgs.from_config(cfg), opts=self.child(depends_on=[fleet])))
        if security.openbao.enabled:
            layers.append(OpenBao("openbao", OpenBaoArgs.from_config(cfg), opts=self.child(depends_on=[fleet])))
        if security.external_secrets.enabled:  # the config refuses it without OpenBao
            layers.append(ExternalSecrets("external-secrets", ExternalSecretsArgs.from_config(cfg), opts=self.child(depends_on=[fleet])))
        if security.kyverno.enabled:
            layers.append(Kyverno("kyverno", KyvernoArgs.from_config(cfg, plan), opts=self.child(depends_on=[fleet])))
        if security.falco.enabled:
            layers.append(Falco("falco", FalcoArgs.from_config(cfg), opts=self.child(depends_on=[fleet])))
        if security.trivy.enabled:
            layers.append(Trivy("trivy", TrivyArgs.from_config(cfg), opts=self.child(depends_on=[fleet])))
        for tenant in (t for t in cfg.tenants if t.managed_by == "platform"):  # the others have stacks of their own
            TenantStack(tenant.name, tenant_stack_args(cfg, plan, tenant, self.hooks), opts=self.child(depends_on=layers))
        self.register_outputs({})
