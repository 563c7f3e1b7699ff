"""The platform stacks of an environment's clusters, run through the Automation API with bounded
parallelism and one result per cluster.

    fleet = FleetStacks(Backend(), parallelism=2)
    for r in fleet.up("dev"):
        print(r.cluster, r.ok, r.error or r.result.changes)

An environment without clusters is one stack, `<env>` (what `PlatformStacks` runs). One with
clusters has a stack per cluster, `<env>-<cluster>`, whose stack file `Pulumi.<env>-<cluster>.yaml`
is written from `Pulumi.<env>.yaml` before each run (same encryption salt, so the same
passphrase decrypts its secure values) with `kubernetes.cluster` and the cluster's
`kubernetes:context` set: the environment's file stays the one place to edit. Every cluster is
validated offline before any CLI runs; a failure on one cluster is reported with it and does not
stop the others.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml
from pulumi import automation as auto

from ai_factory.factory.model.clusters import cluster_view, clusters
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.loading import load_stack_file, project_name, stack_file
from ai_factory.factory.model.loading import project_dir as current_project
from ai_factory.factory.planning.from_config import plan_for, previous_plan
from ai_factory.factory.rendering.bundle import cluster_stack
from ai_factory.stacks import backend as ops
from ai_factory.stacks.backend import Backend, KeyedLocks, OnEvent, OnOutput, PolicyPack, StackResult, check_name

MAX_PARALLELISM = 16
GENERATED = "# Written by ai-factory from Pulumi.{env}.yaml for cluster {cluster}: edit that file, not this one.\n"


@dataclass(frozen=True)
class ClusterResult:
    cluster: str
    """The cluster, or the environment's name for an environment without clusters."""
    stack: str
    result: StackResult | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class FleetStacks:
    def __init__(
        self,
        backend: Backend | None = None,
        *,
        project_dir: Path | None = None,
        pulumi_command: auto.PulumiCommand | None = None,
        parallelism: int = 2,
    ):
        if not 1 <= parallelism <= MAX_PARALLELISM:
            raise ValueError(f"parallelism must be 1..{MAX_PARALLELISM}, got {parallelism}")
        self.backend = backend or Backend()
        self.project_dir = project_dir or current_project()
        self.parallelism = parallelism
        self._pulumi_command = pulumi_command
        self._locks = KeyedLocks()
        self._command_lock = threading.Lock()

    def clusters(self, env: str) -> list[tuple[str, str]]:
        """(cluster, stack) of every cluster of `env`, in the sites' order."""
        check_name("environment", env)
        cfg = load_stack_file(env, self.project_dir)
        found = [c.name for c in clusters(cfg)]
        return [(c, cluster_stack(env, c)) for c in found] if found else [(env, env)]

    def up(self, env: str, *, only: list[str] | None = None, on_output: OnOutput | None = None, on_event: OnEvent | None = None) -> list[ClusterResult]:
        """`pulumi up` of each cluster's stack (of those in `only`, when given), at most
        `parallelism` at a time; results in the clusters' order."""
        targets = [(c, s) for c, s in self.clusters(env) if only is None or c in only]
        self._validate(env)
        self.backend.check()
        for cluster, stack in targets:
            if stack != env:
                self._write_stack_file(env, cluster, stack)

        def run(target: tuple[str, str]) -> ClusterResult:
            cluster, stack = target
            prefixed = (lambda line: on_output(f"[{cluster}] {line}")) if on_output else None
            try:
                with self._locks(stack):
                    result = ops.up(self._stack(stack), prefixed, on_event, self._policy_pack(env))
                return ClusterResult(cluster, stack, result=result)
            except auto.CommandError as err:
                return ClusterResult(cluster, stack, error=_first_error(str(err)))

        with ThreadPoolExecutor(max_workers=self.parallelism) as pool:
            return list(pool.map(run, targets))

    def _validate(self, env: str) -> None:
        """Every cluster planned offline (from its plan lock), as `pulumi up` of each would: a
        mistake fails with every problem and its path before any CLI runs (`ConfigError`)."""
        cfg = load_stack_file(env, self.project_dir)
        views = [(cluster_stack(env, c.name), cluster_view(cfg, c.name)) for c in clusters(cfg)] or [(env, cfg)]
        for stack, view in views:
            plan_for(view, previous_plan(stack, self.project_dir))

    def _write_stack_file(self, env: str, cluster: str, stack: str) -> None:
        document = yaml.safe_load(stack_file(env, self.project_dir).read_text()) or {}
        config = dict(document.get("config") or {})
        project = project_name(self.project_dir)
        kubernetes = dict(config.get(f"{project}:kubernetes") or {})
        config[f"{project}:kubernetes"] = {**kubernetes, "cluster": cluster}
        config.update(cluster_provider_config(load_stack_file(env, self.project_dir), cluster))
        document["config"] = config
        text = GENERATED.format(env=env, cluster=cluster) + yaml.safe_dump(document, sort_keys=False)
        (self.project_dir / f"Pulumi.{stack}.yaml").write_text(text)

    def _policy_pack(self, env: str) -> PolicyPack:
        config = self.project_dir / "policies" / f"config.{env}.json"
        return PolicyPack(self.project_dir / "policies", config if config.is_file() else None)

    def _stack(self, stack: str) -> auto.Stack:
        name = self.backend.stack_name(project_name(self.project_dir), stack)
        return auto.Stack.create_or_select(name, self._workspace())

    def _workspace(self) -> auto.LocalWorkspace:
        return auto.LocalWorkspace(**vars(self.backend.workspace_options(self._command(), work_dir=str(self.project_dir))))

    def _command(self) -> auto.PulumiCommand:
        with self._command_lock:
            if self._pulumi_command is None:
                self._pulumi_command = ops.pulumi_cli()
            return self._pulumi_command


def cluster_provider_config(cfg: FactoryConfig, cluster: str) -> dict[str, str]:
    """The provider settings a cluster's stacks (its platform stack, its tenants' stacks) take
    over the environment's: its `kubernetes:context`, when it names one."""
    placed = next(c for c in clusters(cfg) if c.name == cluster)
    return {"kubernetes:context": placed.cluster.context} if placed.cluster.context else {}


def _first_error(message: str) -> str:
    """The CLI's own error line out of an Automation API error (its stderr)."""
    lines = [line.strip().removeprefix("stderr:").strip() for line in message.splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith("error")]
    return (errors or lines or ["pulumi up failed"])[0][:500]
