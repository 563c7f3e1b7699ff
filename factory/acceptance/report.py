"""`ai-factory accept <env> [--node N]`: per node, the gates that ran, their figures against the
thresholds, the verdict and taint, and the NetBox record the run writes.

Offline by default: nothing is touched. `--apply` goes through the Automation API: `pulumi up` of
the environment's platform stack (the fleet layer applies the verdicts' taints and labels from the
config's `results_file`), then the NetBox records are written (`ai_factory.factory.acceptance.netbox`,
the API token from `AIF_NETBOX_TOKEN`, never from a file or an argument). In a multi-cluster
environment the stacks updated are those of the clusters holding an accepted or failed node
(through `FleetStacks`, a line per cluster), and only the nodes of the clusters updated get their
records: a node whose taint did not change in its cluster is not recorded as if it had.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ai_factory.factory.acceptance import collect, gates, netbox
from ai_factory.factory.model.clusters import is_multi_cluster, pool_cluster
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.loading import ConfigError, load_stack_file, project_dir
from ai_factory.factory.model.raw import did_you_mean

TOKEN_ENV = "AIF_NETBOX_TOKEN"


def verdicts(cfg: FactoryConfig, results: Path | None, node: str | None) -> list[gates.NodeVerdict]:
    return _verdicts(cfg, _recorded(cfg, results, None), node)


def _recorded(cfg: FactoryConfig, results: Path | None, pods: Path | None) -> gates.Results:
    if not cfg.layers.provisioning.enabled:
        raise ConfigError(["layers.provisioning.enabled: acceptance runs only with the provisioning layer enabled"])
    try:
        if pods is not None:
            return collect.collected(cfg, pods, f"--pods {pods}")
        return gates.load_results(results, f"--results {results}") if results else gates.recorded_results(cfg, project_dir())
    except gates.ResultsError as err:
        raise ConfigError(err.problems) from None


def _verdicts(cfg: FactoryConfig, recorded: gates.Results, node: str | None) -> list[gates.NodeVerdict]:
    found = gates.evaluate(cfg, recorded)
    if node is not None:
        names = [v.node for v in found]
        found = [v for v in found if v.node == node]
        if not found:
            raise ConfigError([f"--node: {node!r} is not a node under acceptance{did_you_mean(node, names)}"])
    return found


def render_text(found: list[gates.NodeVerdict]) -> str:
    lines: list[str] = []
    for v in found:
        lines.append(f"{v.node} (pool {v.pool}, generation {v.generation}): {v.verdict.upper()}")
        width = max(len(g.figure) for g in v.gates)
        for g in v.gates:
            reason = f"  {g.reason}" if g.reason else ""
            lines.append(f"  {g.gate:<10} {g.status:<8} {g.figure:<{width}}  (threshold {g.threshold}){reason}")
        taint = v.taint
        lines.append(f"  taint: {taint['key']}={taint['value']}:{taint['effect']}" if taint else "  taint: none (schedulable for tenants)")
        record = netbox.record(v)
        lines.append(f"  netbox: device {record.device}: custom fields {json.dumps(record.custom_fields, sort_keys=True)}")
        lines.append(f"          journal entry ({record.journal_kind}), {len(record.journal_comments.splitlines())} lines")
        lines.append("")
    counts = {k: sum(v.verdict == k for v in found) for k in ("accepted", "failed", "pending")}
    lines.append(", ".join(f"{n} {k}" for k, n in counts.items()))
    return "\n".join(lines) + "\n"


def render_json(found: list[gates.NodeVerdict]) -> str:
    return json.dumps([{**gates.as_dict(v), "netbox": netbox.record(v).as_dict()} for v in found], indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class Applied:
    written: list[str]
    """The nodes whose NetBox records were written."""
    failed: list[str] = field(default_factory=list)
    """One line per cluster whose platform stack's update failed (its nodes not written)."""


def apply(env: str, cfg: FactoryConfig, found: list[gates.NodeVerdict], on_output: Callable[[str], Any] = print,
          session: Any = None) -> Applied:
    """Taints through the platform stack's `pulumi up` (in a multi-cluster environment, each
    concerned cluster's), then the NetBox records of the nodes whose stack was updated."""
    settings = cfg.layers.provisioning.netbox
    token = os.environ.get(TOKEN_ENV)
    problems = []
    if settings is None:
        problems.append("layers.provisioning.netbox: required by --apply (where the records go)")
    if not token:
        problems.append(f"{TOKEN_ENV}: set it to the NetBox API token (--apply reads it from the environment only)")
    if problems:
        raise ConfigError(problems)
    failed: list[str] = []
    if is_multi_cluster(cfg):
        found, failed = _update_clusters(env, cfg, found, on_output)
    else:
        from ai_factory.stacks.platform import PlatformStacks

        PlatformStacks().up(env, on_output=on_output)
    if not found:
        return Applied([], failed)
    api = netbox.connect(settings.url, token, session)
    return Applied(netbox.write(api, [netbox.record(v) for v in found]), failed)


def _update_clusters(env: str, cfg: FactoryConfig, found: list[gates.NodeVerdict],
                     on_output: Callable[[str], Any]) -> tuple[list[gates.NodeVerdict], list[str]]:
    """`pulumi up` of the clusters holding a verdict (accepted or failed) through `FleetStacks`; the
    verdicts of the nodes on the clusters updated, and a line per cluster that failed."""
    from ai_factory.factory.rendering.bundle import cluster_stack
    from ai_factory.stacks.fleet import FleetStacks

    cluster_of = {v.node: pool_cluster(cfg, v.pool) for v in found}
    targets = {cluster_of[v.node] for v in found if v.verdict in ("accepted", "failed")}
    results = FleetStacks().up(env, only=sorted(targets), on_output=on_output) if targets else []
    def nodes_on(cluster: str) -> str:
        return ", ".join(v.node for v in found if cluster_of[v.node] == cluster)

    updated = set()
    failed = []
    for r in results:
        if r.ok:
            updated.add(r.cluster)
            changes = ", ".join(f"{n} {k}" for k, n in sorted(r.result.changes.items())) or "no change"
            on_output(f"platform {r.stack}: updated ({changes})")
        else:
            failed.append(f"platform {r.stack}: {r.error}; netbox records of {nodes_on(r.cluster)} not written")
            on_output(f"platform {r.stack}: FAILED: {r.error}")
    for cluster in sorted({cluster_of[v.node] for v in found} - targets):
        on_output(f"platform {cluster_stack(env, cluster)}: not updated (no accepted or failed node); netbox records of {nodes_on(cluster)} not written")
    return [v for v in found if cluster_of[v.node] in updated], failed


def accept(env: str, node: str | None, results: Path | None, fmt: str, do_apply: bool, pods: Path | None = None, write_results: bool = False) -> int:
    cfg = load_stack_file(env)
    problems = []
    if do_apply and (results is not None or pods is not None):
        problems.append("--apply: it applies the config's layers.provisioning.acceptance.results_file (the one `pulumi up` reads); "
                        "drop --results, and collect --pods with --write-results first")
    if pods is not None and results is not None:
        problems.append("--pods: the results come from the pods or from --results, not both")
    if write_results and (pods is None or cfg.layers.provisioning.acceptance.results_file is None):
        problems.append("--write-results: needs --pods and layers.provisioning.acceptance.results_file (where to write)")
    if problems:
        raise ConfigError(problems)
    recorded = _recorded(cfg, results, pods)
    found = _verdicts(cfg, recorded, node)
    if write_results:
        target = project_dir() / cfg.layers.provisioning.acceptance.results_file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(collect.results_yaml(recorded))
        print(f"wrote {target}")
    print(render_json(found) if fmt == "json" else render_text(found), end="")
    applied = Applied([])
    if do_apply:
        from ai_factory.stacks.backend import BackendError

        try:
            applied = apply(env, cfg, found)
        except BackendError as err:  # the state backend cannot be used as set up: nothing was updated
            print(f"accept --apply: {err}", file=sys.stderr)
            return 1
    for written in applied.written:
        print(f"netbox: wrote {written}")
    for line in applied.failed:
        print(line, file=sys.stderr)
    return 1 if applied.failed or any(v.verdict == "failed" for v in found) else 0
