"""The Pulumi program of the platform project: what `pulumi up` runs, and what `factory render`
runs in-process under mocks."""

from __future__ import annotations

import pulumi

from ai_factory.factory.model.loading import ConfigError, load_pulumi_config
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.rendering.bundle import refuse_whole_fleet, stack_plan
from ai_factory.factory.rendering.cache import UnitCache
from ai_factory.factory.rendering.platform import ROOT, Platform, own_tenant_stack
from ai_factory.stacks.contract import CONTRACT_OUTPUT, CONTRACT_SECRETS_OUTPUT, platform_contract, platform_secrets


def main(
    plan: Plan | None = None,
    *,
    with_tenant_stacks: bool = False,
    only_tenants: frozenset[str] | None = None,
    offboarded: frozenset[str] = frozenset(),
    units: UnitCache | None = None,
) -> None:
    """`plan`: deploy this capacity plan instead of planning from the recorded `plans/<stack>.json`
    (`factory diff` renders a tenant's removal with the plan unchanged, then re-planned).
    `with_tenant_stacks`: also build the tenants that have stacks of their own, as their stacks do
    (`factory render` shows the environment whole; `pulumi up` of the platform leaves them out).
    `only_tenants`: build these tenants' stacks only (a parallel render's share; the platform
    itself is built whole, from every tenant's configuration).
    `offboarded`: registered tenants to leave out, as if their registry files were gone.
    `units`: a render's cache; the layers and tenant stacks it holds are not built again, nor the
    plan it holds."""
    try:
        cfg = load_pulumi_config(offboarded)
        refuse_whole_fleet(cfg, f"stack {pulumi.get_stack()}")
        if plan is None:
            plan = stack_plan(cfg, pulumi.get_stack(), units)
    except ConfigError as err:
        # A user mistake: a message, not a traceback, and nothing registered.
        raise pulumi.RunError(err.render()) from None
    platform = Platform(ROOT, cfg, plan, only_tenants=only_tenants, units=units)
    if with_tenant_stacks:
        for tenant in (t for t in cfg.tenants if t.managed_by == "tenant-stack" and (only_tenants is None or t.name in only_tenants)):
            own_tenant_stack(cfg, plan, tenant, platform.hooks, units)
    # What tenant stacks read through a StackReference (stacks/contract.py): the contract in
    # clear, the configuration's secret values as a secret.
    pulumi.export(CONTRACT_OUTPUT, platform_contract(cfg, plan, pulumi.get_stack()).to_output())
    pulumi.export(CONTRACT_SECRETS_OUTPUT, pulumi.Output.secret(platform_secrets(cfg)))
