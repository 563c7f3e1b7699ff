"""Platform stacks: the top-level project (`Pulumi.yaml`, `__main__.py`), one stack per
environment, run through the Automation API.

    platforms = PlatformStacks(Backend())
    result = platforms.up("dev", on_output=print)
    result.changes, result.outputs["contract"]

The environment's configuration is `Pulumi.<env>.yaml` of the project, as for `pulumi up`; it is
validated (and planned) offline before the CLI runs, so a mistake fails with every problem and
its path and nothing is touched. Operations on one environment run one at a time. Every preview
and update runs the project's CrossGuard pack (`policies/`, configured by
`policies/config.<env>.json` when present), as `pulumi preview --policy-pack policies` does in
pull-request review.
"""

from __future__ import annotations

from pathlib import Path

from pulumi import automation as auto

from ai_factory.factory.model.loading import load_stack_file, project_name, stack_file
from ai_factory.factory.model.loading import project_dir as current_project
from ai_factory.factory.planning.from_config import plan_for, previous_plan
from ai_factory.factory.rendering.bundle import cluster_stack, refuse_whole_fleet
from ai_factory.stacks import backend as ops
from ai_factory.stacks.backend import Backend, KeyedLocks, OnEvent, OnOutput, PolicyPack, StackResult, check_name
from ai_factory.stacks.contract import CONTRACT_OUTPUT, ContractError, PlatformContract


POLICY_PACK_DIR = "policies"


class PlatformStacks:
    def __init__(self, backend: Backend | None = None, *, project_dir: Path | None = None, pulumi_command: auto.PulumiCommand | None = None):
        self.backend = backend or Backend()
        self.project_dir = project_dir or current_project()
        self._pulumi_command = pulumi_command
        self._locks = KeyedLocks()

    def stack_name(self, env: str, cluster: str | None = None) -> str:
        """The platform stack of `env` (of its `cluster`, in a multi-cluster environment) in the
        user's project (its Pulumi.yaml names the project)."""
        return self.backend.stack_name(project_name(self.project_dir), cluster_stack(env, cluster) if cluster else env)

    def policy_pack(self, env: str) -> PolicyPack:
        config = self.project_dir / POLICY_PACK_DIR / f"config.{env}.json"
        return PolicyPack(self.project_dir / POLICY_PACK_DIR, config if config.is_file() else None)

    def preview(self, env: str, *, on_output: OnOutput | None = None, on_event: OnEvent | None = None) -> StackResult:
        self._validate(env)
        with self._locks(env):
            return ops.preview(self._stack(env, create=True), on_output, on_event, self.policy_pack(env))

    def up(self, env: str, *, on_output: OnOutput | None = None, on_event: OnEvent | None = None) -> StackResult:
        self._validate(env)
        with self._locks(env):
            return ops.up(self._stack(env, create=True), on_output, on_event, self.policy_pack(env))

    def destroy(self, env: str, *, on_output: OnOutput | None = None, on_event: OnEvent | None = None) -> StackResult:
        """Destroy the environment but its protected resources (stateful parts): they stay, and the
        result lists them. The stack stays too, with its history."""
        check_name("environment", env)
        self.backend.check()
        with self._locks(env):
            return ops.destroy_keeping_protected(self._stack(env, create=False), on_output, on_event)

    def contract(self, env: str, cluster: str | None = None) -> PlatformContract:
        """The contract the environment's platform stack (its `cluster`'s) exported at its last update."""
        check_name("environment", env)
        self.backend.check()
        name = self.stack_name(env, cluster)
        try:
            outputs = ops.masked_outputs(self._workspace(), name)
        except auto.StackNotFoundError:
            how = f"ai-factory upgrade or FleetStacks.up of {env}" if cluster else f"ai-factory-stacks platform up {env}"
            raise ContractError(f"no platform stack {name}: deploy it first ({how})") from None
        return PlatformContract.from_output(outputs.get(CONTRACT_OUTPUT), name)

    def _validate(self, env: str) -> None:
        """Everything `pulumi up` would refuse, refused before the CLI runs (`ConfigError`)."""
        check_name("environment", env)
        self.backend.check()
        cfg = load_stack_file(env, self.project_dir)
        refuse_whole_fleet(cfg, str(stack_file(env, self.project_dir)))  # its clusters' stacks are FleetStacks'
        plan_for(cfg, previous_plan(env, self.project_dir))

    def _stack(self, env: str, *, create: bool) -> auto.Stack:
        init = auto.Stack.create_or_select if create else auto.Stack.select
        return init(self.stack_name(env), self._workspace())

    def _workspace(self) -> auto.LocalWorkspace:
        return auto.LocalWorkspace(**vars(self.backend.workspace_options(self._command(), work_dir=str(self.project_dir))))

    def _command(self) -> auto.PulumiCommand:
        if self._pulumi_command is None:
            self._pulumi_command = ops.pulumi_cli()
        return self._pulumi_command
