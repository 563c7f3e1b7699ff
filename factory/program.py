"""The Pulumi program of the platform project: what `pulumi up` runs, and what `factory render`
runs in-process under mocks."""

from __future__ import annotations

import pulumi

from factory.loading import ConfigError, load_pulumi_config
from factory.planning import plan_for, previous_plan
from factory.platform import Platform


def main() -> None:
    try:
        cfg = load_pulumi_config()
        plan = plan_for(cfg, previous_plan(pulumi.get_stack()))
    except ConfigError as err:
        # A user mistake: a message, not a traceback, and nothing registered.
        raise pulumi.RunError(err.render()) from None
    Platform("ai-factory", cfg, plan)
