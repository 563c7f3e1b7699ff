"""The root component: composes the platform's layers from one validated configuration, as the
layer registry (`ai_factory.components.registry`) declares them."""

from __future__ import annotations

from typing import Sequence

import pulumi

from ai_factory.components._common import FactoryComponent, TenantHook
from ai_factory.components.registry import enabled_layers, tenant_hooks
from ai_factory.components.tenant_stack import TenantStack, tenant_stack_args
from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.planning.model import Plan

TOKEN = "ai-factory:index:Platform"
ROOT = "ai-factory"
"""The root component's Pulumi name: every resource's name starts with it."""


def tenant_stack_name(platform: str, tenant: str) -> str:
    """The Pulumi name of a tenant's stack component, under the platform or in a stack of its own
    (`stacks/tenants.py`), so a tenant's objects keep their names when it moves between the two."""
    return f"{platform}-tenant-{tenant}"


def own_tenant_stack(cfg: FactoryConfig, plan: Plan, tenant: Tenant, hooks: Sequence[TenantHook]) -> TenantStack:
    """A tenant with a stack of its own (`managed_by: tenant-stack`), as that stack builds it:
    outside the platform component, named as the platform would name it."""
    return TenantStack(tenant_stack_name(ROOT, tenant.name), tenant_stack_args(cfg, plan, tenant, hooks))


class Platform(FactoryComponent):
    """Everything one environment runs: each enabled layer (the fleet's node labels first, then
    every layer after the layers it requires), then one `TenantStack` per tenant.

    `hooks`: what layers add to every tenant's environment (its queue, identity group, secret
    store, ...); each tenant stack attaches them all, after every layer exists. Children are named
    `<name>-<layer>` and `<name>-tenant-<tenant>`, so two platforms (two clusters, through two
    providers) fit in one program.
    """

    def __init__(self, name: str, cfg: FactoryConfig, plan: Plan, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="platform", opts=opts)
        self.hooks = tenant_hooks(cfg, plan)
        installed: dict[str, FactoryComponent] = {}
        for layer in enabled_layers(cfg):
            after = [installed[r] for r in layer.requires if r in installed]
            installed[layer.name] = layer.install(self, cfg, plan, depends_on=after)
        for tenant in (t for t in cfg.tenants if t.managed_by == "platform"):  # the others have stacks of their own
            TenantStack(
                tenant_stack_name(name, tenant.name),
                tenant_stack_args(cfg, plan, tenant, self.hooks),
                opts=self.child(depends_on=list(installed.values())),
            )
        self.layers = sorted(installed)
        self.register_outputs({"layers": self.layers})
