"""Upgrade waves: `ai-factory upgrade <env> --to <matrix version>`.

The platform moves first (every layer that cannot be ringed: CRD versions, the CNI, the
controllers, node software), then the tenants ring by ring (`upgrades.rings`; a tenant's ring is
`tenants[].ring`): each step is a `pulumi up` of the clusters it touches (through `FleetStacks`,
bounded parallelism), then the named health gates (`upgrades.gates`) on each of them. The first
failed update or gate stops the upgrade and says where and why; no later ring is touched. Every
step is recorded in `upgrades/<env>.json` (`ai_factory.factory.model.upgrades`) before it runs and
after its gates pass, which is what the program deploys and what a rerun resumes from. A dry run
prints the plan and touches nothing.

Gates are probes of the live clusters (`HealthProbe`); `KubectlProbe` reads them with `kubectl`:
- `nodes-ready`: every node is Ready;
- `gpu-allocatable`: every node advertises at least the NVIDIA resources it did before the step;
- `no-new-faults`: no node condition that was not True before (a GPU XID condition, ...) is True;
- `workloads-admitted`: every workload of the step's tenants admitted before the step still is
  (or has finished): nothing was evicted by the upgrade.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from ai_factory.factory.model.clusters import clusters, tenant_clusters
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.loading import ConfigError, environment_raw, read_stack_file, stack_file, validate
from ai_factory.factory.model.matrix import Change, diff, load_matrix, matrix_problems, selected_version
from ai_factory.factory.model.upgrades import PLATFORM_STEP, Stop, UpgradeState, read_state, state_path, write_state
from ai_factory.stacks.backend import OnOutput
from ai_factory.stacks.fleet import ClusterResult, FleetStacks


@dataclass(frozen=True)
class GateResult:
    ok: bool
    detail: str = ""


class HealthProbe(Protocol):
    def snapshot(self, cluster: str) -> Any:
        """The cluster's state before a step, for the gates to compare with."""

    def check(self, cluster: str, gate: str, tenants: Sequence[str], before: Any) -> GateResult: ...


@dataclass(frozen=True)
class Step:
    name: str
    """`platform` or a ring."""
    tenants: tuple[str, ...]
    clusters: tuple[str, ...]


@dataclass
class UpgradePlan:
    env: str
    from_version: str
    to: str
    changes: list[Change]
    steps: list[Step]
    gates: list[str]
    done: list[str] = field(default_factory=list)
    """Steps a previous run completed (a resumed upgrade starts after them)."""

    def text(self) -> str:
        lines = [f"upgrade {self.env}: matrix {self.from_version} -> {self.to}"]
        deployed = [c for c in self.changes if c.kind != "tested"]  # a note on the matrix, nothing to deploy
        platform_wide = [c for c in deployed if not c.ringable]
        ringed = [c for c in deployed if c.ringable]
        lines.append(f"  platform-wide, moved in the first step for every tenant at once ({len(platform_wide)}):")
        lines += [f"  {c.line()}" for c in platform_wide] or ["    (none)"]
        lines.append(f"  ringed, moved tenant ring by tenant ring ({len(ringed)}):")
        lines += [f"  {c.line()}" for c in ringed] or ["    (none)"]
        lines.append(f"  gates after each step: {', '.join(self.gates) or '(none)'}")
        for i, step in enumerate(self.steps, 1):
            state = " (done)" if step.name in self.done else ""
            who = f"tenants {', '.join(step.tenants)}" if step.tenants else "every platform layer" if step.name == PLATFORM_STEP else "no tenants"
            lines.append(f"  {i}. {step.name}{state}: {who}; clusters {', '.join(step.clusters) or '(none)'}")
        return "\n".join(lines)


@dataclass
class StepReport:
    step: str
    updates: list[ClusterResult]
    gates: list[tuple[str, str, GateResult]] = field(default_factory=list)
    """(cluster, gate, result), in the order run."""


@dataclass
class UpgradeReport:
    plan: UpgradePlan
    steps: list[StepReport]
    state: UpgradeState | None
    """None for a dry run."""

    @property
    def stopped(self) -> Stop | None:
        return self.state.stopped if self.state else None

    def text(self) -> str:
        lines = [self.plan.text()]
        for report in self.steps:
            lines.append(f"step {report.step}:")
            for u in report.updates:
                lines.append(f"  pulumi up {u.stack}: {'ok ' + json.dumps(u.result.changes) if u.ok and u.result else 'FAILED: ' + str(u.error)}")
            for cluster, gate, result in report.gates:
                lines.append(f"  gate {gate} on {cluster}: {'pass' if result.ok else 'FAIL'}{': ' + result.detail if result.detail else ''}")
        if self.state is None:
            lines.append("dry run: nothing was deployed")
        elif self.state.stopped:
            s = self.state.stopped
            lines.append(f"STOPPED at step {s.step} on cluster {s.cluster}: {s.reason}: {s.detail}")
            lines.append(f"later steps were not started; fix the cause and run the same command again to resume from {s.step}")
        else:
            lines.append(f"upgrade to {self.plan.to} complete; set matrix.version: \"{self.plan.to}\" in Pulumi.{self.plan.env}.yaml")
        return "\n".join(lines)


def _target_config(env: str, directory, to: str) -> FactoryConfig:
    path = stack_file(env, directory)
    raw, _ = read_stack_file(path)
    raw = environment_raw(raw, env, path.resolve().parent)
    return validate({**raw, "matrix": {**(raw.get("matrix") or {}), "version": to}}, source=str(path))


def plan_upgrade(env: str, to: str, directory) -> UpgradePlan:
    """The steps from the environment's matrix version to `to`; `ConfigError` when `to` is not a
    version, is the version already run, or leaves a pin the config sets itself outside it."""
    matrix = load_matrix()
    target = matrix.get(to)
    if target is None:
        raise ConfigError([f"--to: {to!r} is not a matrix version (versions: {', '.join(matrix.names)})"], source="upgrade")
    state = read_state(env, directory)
    if state is not None and state.status != "complete" and state.to != to:
        raise ConfigError([f"upgrades/{env}.json: an upgrade to {state.to} is under way; finish it (ai-factory upgrade {env} --to {state.to}) first"], source=str(state_path(env, directory)))
    resuming = state is not None and state.status != "complete"
    from ai_factory.factory.model.loading import load_stack_file

    cfg = load_stack_file(env, directory)
    current = selected_version(cfg, matrix)
    from_version = state.from_version if resuming else current.version if current else to
    if not resuming and from_version == to:
        raise ConfigError([f"--to: the environment already runs matrix {to}"], source="upgrade")
    at_target = _target_config(env, directory, to)
    problems = matrix_problems(at_target, matrix, version=to)
    if problems:
        raise ConfigError([f"{p} (at matrix {to})" for p in problems], source=str(stack_file(env, directory)))
    every = [c.name for c in clusters(cfg)] or [env]
    rings = cfg.upgrades.rings
    steps = [Step(PLATFORM_STEP, (), tuple(every))]
    for ring in rings:
        members = [t for t in cfg.tenants if t.upgrade_ring(rings) == ring]
        on = {c for t in members for c in tenant_clusters(cfg, t)} if clusters(cfg) else ({env} if members else set())
        steps.append(Step(ring, tuple(t.name for t in members), tuple(c for c in every if c in on)))
    return UpgradePlan(env, from_version, to, diff(matrix.get(from_version) or target, target), steps, list(cfg.upgrades.gates), list(state.done) if resuming else [])


class Upgrader:
    def __init__(self, fleet: FleetStacks, probe: HealthProbe):
        self.fleet = fleet
        self.probe = probe

    def run(self, env: str, to: str, *, dry_run: bool = False, on_output: OnOutput | None = None) -> UpgradeReport:
        directory = self.fleet.project_dir
        plan = plan_upgrade(env, to, directory)
        if dry_run:
            return UpgradeReport(plan, [], None)
        state = read_state(env, directory)
        if state is None or state.status == "complete":
            state = UpgradeState(from_version=plan.from_version, to=to)
        state = state.model_copy(update={"stopped": None, "status": "running"})
        reports: list[StepReport] = []
        for step in plan.steps:
            if step.name in state.done:
                continue
            state = state.model_copy(update={"current": step.name})
            write_state(env, directory, state)  # the program deploys the step from this record
            report, stop = self._step(env, step, plan.gates, on_output)
            reports.append(report)
            if stop is not None:
                state = state.model_copy(update={"stopped": stop, "status": "stopped"})
                write_state(env, directory, state)
                return UpgradeReport(plan, reports, state)
            state = state.model_copy(update={"done": [*state.done, step.name], "current": None})
            write_state(env, directory, state)
        state = state.model_copy(update={"status": "complete", "current": None})
        write_state(env, directory, state)
        return UpgradeReport(plan, reports, state)

    def _step(self, env: str, step: Step, gates: list[str], on_output: OnOutput | None) -> tuple[StepReport, Stop | None]:
        if not step.clusters:
            return StepReport(step.name, []), None
        before = {c: self.probe.snapshot(c) for c in step.clusters}
        updates = self.fleet.up(env, only=list(step.clusters), on_output=on_output)
        report = StepReport(step.name, updates)
        failed = next((u for u in updates if not u.ok), None)
        if failed is not None:
            return report, Stop(step=step.name, cluster=failed.cluster, reason="pulumi up", detail=str(failed.error))
        for cluster in step.clusters:
            for gate in gates:
                result = self.probe.check(cluster, gate, step.tenants, before[cluster])
                report.gates.append((cluster, gate, result))
                if not result.ok:
                    return report, Stop(step=step.name, cluster=cluster, reason=gate, detail=result.detail)
        return report, None


# --------------------------------------------------------------------------- the live probe

STANDARD_CONDITIONS = frozenset({"Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"})

Kubectl = Callable[[str | None, list[str]], dict[str, Any]]


def run_kubectl(context: str | None, args: list[str]) -> dict[str, Any]:
    command = ["kubectl", *(["--context", context] if context else []), *args, "-o", "json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()[:300]}")
    return json.loads(done.stdout)


def _true_conditions(node: dict[str, Any]) -> set[str]:
    return {c.get("type", "") for c in (node.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}


def _admitted(workload: dict[str, Any]) -> bool:
    return any(c.get("type") in ("Admitted", "Finished") and c.get("status") == "True" for c in (workload.get("status") or {}).get("conditions") or [])


class KubectlProbe:
    """The gates, read from each cluster with `kubectl` (the cluster's context from
    `fleet.sites[].clusters[].context`; the current context for a one-cluster environment)."""

    def __init__(self, contexts: Mapping[str, str | None], kubectl: Kubectl = run_kubectl):
        self.contexts = contexts
        self.kubectl = kubectl

    def _nodes(self, cluster: str) -> dict[str, dict[str, Any]]:
        return {n["metadata"]["name"]: n for n in self.kubectl(self.contexts.get(cluster), ["get", "nodes"]).get("items") or []}

    def _workloads(self, cluster: str) -> list[dict[str, Any]]:
        return list(self.kubectl(self.contexts.get(cluster), ["get", "workloads.kueue.x-k8s.io", "--all-namespaces"]).get("items") or [])

    def snapshot(self, cluster: str) -> dict[str, Any]:
        nodes = self._nodes(cluster)
        return {
            "gpus": {n: {k: v for k, v in ((o.get("status") or {}).get("allocatable") or {}).items() if k.startswith("nvidia.com/")} for n, o in nodes.items()},
            "conditions": {n: _true_conditions(o) - STANDARD_CONDITIONS for n, o in nodes.items()},
            "admitted": {(w["metadata"].get("namespace"), w["metadata"]["name"]) for w in self._workloads(cluster) if _admitted(w)},
        }

    def check(self, cluster: str, gate: str, tenants: Sequence[str], before: Any) -> GateResult:
        if gate == "workloads-admitted":
            namespaces = {f"tenant-{t}" for t in tenants} if tenants else None
            now = {(w["metadata"].get("namespace"), w["metadata"]["name"]): w for w in self._workloads(cluster)}
            lost = sorted(f"{ns}/{name}" for ns, name in before["admitted"] if (namespaces is None or ns in namespaces) and (ns, name) in now and not _admitted(now[ns, name]))
            return GateResult(not lost, f"no longer admitted: {', '.join(lost[:10])}" if lost else "")
        nodes = self._nodes(cluster)
        if gate == "nodes-ready":
            down = sorted(n for n, o in nodes.items() if "Ready" not in _true_conditions(o))
            return GateResult(not down, f"not Ready: {', '.join(down[:10])}" if down else "")
        if gate == "gpu-allocatable":
            short = []
            for name, wanted in sorted(before["gpus"].items()):
                have = ((nodes.get(name) or {}).get("status") or {}).get("allocatable") or {}
                short += [f"{name} {r} {have.get(r, 0)}/{n}" for r, n in sorted(wanted.items()) if _count(have.get(r, 0)) < _count(n)]
            return GateResult(not short, f"below their allocatable before the step: {', '.join(short[:10])}" if short else "")
        if gate == "no-new-faults":
            new = sorted(f"{n}: {c}" for n, o in nodes.items() for c in (_true_conditions(o) - STANDARD_CONDITIONS) - before["conditions"].get(n, set()))
            return GateResult(not new, f"new conditions: {', '.join(new[:10])}" if new else "")
        raise ValueError(f"unknown gate {gate!r}")


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0
