"""The root component: composes the platform's layers from one validated configuration, as the
layer registry (`ai_factory.components.registry`) declares them."""

from __future__ import annotations

from typing import Iterable, Sequence

import pulumi

from ai_factory.components._common import FactoryComponent, TenantHook
from ai_factory.components.registry import Layer, enabled_layers, tenant_hooks
from ai_factory.components.tenant_stack import CRD_GROUPS, TenantStack, tenant_stack_args
from ai_factory.factory.model.catalog import CHARTS
from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.rendering.cache import UnitCache

TOKEN = "ai-factory:index:Platform"
ROOT = "ai-factory"
"""The root component's Pulumi name: every resource's name starts with it."""


def tenant_stack_name(platform: str, tenant: str) -> str:
    """The Pulumi name of a tenant's stack component, under the platform or in a stack of its own
    (`stacks/tenants.py`), so a tenant's objects keep their names when it moves between the two."""
    return f"{platform}-tenant-{tenant}"


def own_tenant_stack(cfg: FactoryConfig, plan: Plan, tenant: Tenant, hooks: Sequence[TenantHook], units: UnitCache | None = None) -> TenantStack | None:
    """A tenant with a stack of its own (`managed_by: tenant-stack`), as that stack builds it:
    outside the platform component, named as the platform would name it. None: `units` (a
    render's cache) holds it."""
    args, name = tenant_stack_args(cfg, plan, tenant, hooks), tenant_stack_name(ROOT, tenant.name)
    if units is not None and not units.build(f"tenant:{tenant.name}", unit_key(units, "own-tenant", name, args, ()), name, ()):
        return None
    return TenantStack(name, args)


def tenant_layers(layers: Iterable[Layer], hooks: Sequence[TenantHook]) -> set[str]:
    """The layers a tenant's objects need before them: those whose hooks add objects to it, and
    those installing the CRDs of the tenant stack's own custom resources. Only these: a
    dependency on every layer cost the SDK an edge to every platform resource per tenant resource."""
    return {hook.layer for hook in hooks} | {l.name for l in layers if l.chart and set(CHARTS[l.chart].crd_groups) & set(CRD_GROUPS)}


class Platform(FactoryComponent):
    """Everything one environment runs: each enabled layer (the fleet's node labels first, then
    every layer after the layers it requires), then one `TenantStack` per tenant.

    `hooks`: what layers add to every tenant's environment (its queue, identity group, secret
    store, ...); each tenant stack attaches them all, after the layers it uses (`tenant_layers`):
    after their shared resources and what they made for that tenant, never for another
    (`FactoryComponent.ordered_before`), so a tenant's dependencies do not grow with the tenants.
    Children are named `<name>-<layer>` and `<name>-tenant-<tenant>`, so two platforms (two
    clusters, through two providers) fit in one program.
    """

    def __init__(
        self,
        name: str,
        cfg: FactoryConfig,
        plan: Plan,
        opts: pulumi.ResourceOptions | None = None,
        only_tenants: frozenset[str] | None = None,
        units: UnitCache | None = None,
    ):
        """`only_tenants`: build only these tenants' stacks (a parallel render's share).
        `units`: skip every layer and tenant stack this render cache holds (`cache.UnitCache`)."""
        super().__init__(TOKEN, name, layer="platform", opts=opts)
        self.hooks = tenant_hooks(cfg, plan)
        installed: dict[str, FactoryComponent | None] = {}
        for layer in enabled_layers(cfg):
            requires = [r for r in layer.requires if r in installed]
            args = layer.args(cfg, plan)
            component_name = self.child_name(layer.name)
            if units is not None and not units.build(f"layer:{layer.name}", unit_key(units, "layer", component_name, args, requires), component_name, [f"layer:{r}" for r in requires]):
                installed[layer.name] = None  # cached: its resources join the render afterwards
                continue
            after = [c for r in requires if (c := installed[r]) is not None]
            component = installed[layer.name] = layer.install(self, args, depends_on=after)
            if units is not None:
                units.serves(f"layer:{layer.name}", component.tenant_scopes())
        used = [layer for layer in installed if layer in tenant_layers(enabled_layers(cfg), self.hooks)]
        built = [c for layer in used if (c := installed[layer]) is not None]
        platform_managed = (t for t in cfg.tenants if t.managed_by == "platform")  # the others have stacks of their own
        for tenant in (t for t in platform_managed if only_tenants is None or t.name in only_tenants):
            args = tenant_stack_args(cfg, plan, tenant, self.hooks)
            stack_name = tenant_stack_name(name, tenant.name)
            if units is None or units.build(f"tenant:{tenant.name}", unit_key(units, "tenant", stack_name, args, used), stack_name, [f"layer:{l}" for l in used]):
                after = [r for c in built for r in c.ordered_before(tenant.name)]
                TenantStack(stack_name, args, opts=self.child(depends_on=after))
        self.layers = sorted(installed)
        self.register_outputs({"layers": self.layers})


def unit_key(units: UnitCache, kind: str, component_name: str, args: object, after: Sequence[str]) -> str:
    """A unit's cache key: its typed arguments, its name, what it is ordered after, and where the
    program runs (project and stack name its URNs)."""
    return units.key(kind, component_name, args, list(after), pulumi.get_project(), pulumi.get_stack())
