"""`ai-factory render|check|plan|diff ...` (also `python -m ai_factory.factory`): the offline tools."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ai_factory.factory.model.loading import ConfigError, stack_file, stack_name

EXIT_FINDINGS = 1
EXIT_CONFIG = 2
EXIT_NO_ORACLES = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ai-factory", description=__doc__)
    parser.add_argument(
        "--project-dir",
        type=Path,
        metavar="DIR",
        help="the Pulumi project (Pulumi.yaml, Pulumi.<env>.yaml, plans/, policies/); default: the current directory. "
        "Relative paths (--out, stack files) are then read from it, as with `git -C`",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    render = commands.add_parser("render", help="render an environment to manifests, a Flux bundle and an inventory")
    render.add_argument("env", help="environment name (reads Pulumi.<env>.yaml) or a stack file's path")
    render.add_argument("--out", type=Path, help="output directory (default: build/<env>)")

    check = commands.add_parser("check", help="validate an environment (or a rendered directory) against the upstream oracles")
    check.add_argument("target", help="environment name, a stack file's path, or a directory written by `render`")
    check.add_argument("--upstream", type=Path, help="oracle directory (default: $FACTORY_UPSTREAM_DIR or ../shared/upstream)")

    plan = commands.add_parser("plan", help="print the capacity plan of an environment and write it as JSON")
    plan.add_argument("env", help="environment name (reads Pulumi.<env>.yaml) or a stack file's path")
    plan.add_argument("--out", type=Path, help="plan JSON file (default: build/<env>/plan.json)")
    plan.add_argument(
        "--lock",
        action="store_true",
        help="also write plans/<env>.json next to the stack file: later plans and `pulumi up` start from it",
    )

    diff = commands.add_parser("diff", help="list what removing a tenant would change (only its own objects, or exit 1)")
    diff.add_argument("env", help="environment name (reads Pulumi.<env>.yaml) or a stack file's path")
    diff.add_argument("--without-tenant", required=True, metavar="NAME", help="the tenant to remove")

    args = parser.parse_args(argv)
    if args.project_dir is not None:
        if not args.project_dir.is_dir():
            parser.error(f"--project-dir {args.project_dir}: no such directory")
        os.chdir(args.project_dir)
    try:
        if args.command == "render":
            return _render(args.env, args.out or Path("build") / stack_name(stack_file(args.env)))
        if args.command == "plan":
            return _plan(args.env, args.out or Path("build") / stack_name(stack_file(args.env)) / "plan.json", args.lock)
        if args.command == "diff":
            return _diff(args.env, args.without_tenant)
        return _check(args.target, args.upstream)
    except ConfigError as err:
        print(err.render(), file=sys.stderr)
        return EXIT_CONFIG


def _render(env: str, out: Path) -> int:
    from ai_factory.factory.rendering.bundle import render_env

    started = time.perf_counter()
    rendered = render_env(env)
    rendered.write(out)
    print(f"rendered {env} in {time.perf_counter() - started:.2f}s to {out}/")
    print(rendered.summary())
    return 0


def _plan(env: str, out: Path, lock: bool) -> int:
    """Plan from the locked plan when there is one (as `pulumi up` does), so re-planning keeps
    existing tenants' GPUs; the output is a function of the config and the lock only."""
    from ai_factory.factory.model.loading import load_stack_file
    from ai_factory.factory.planning.from_config import plan_for, plan_path, previous_plan

    path = stack_file(env)
    cfg = load_stack_file(env)
    project_dir, stack = path.resolve().parent, stack_name(path)
    plan = plan_for(cfg, previous_plan(stack, project_dir))
    print(plan.render_table(), end="")
    for target in [out, plan_path(stack, project_dir)] if lock else [out]:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(plan.to_json() + "\n")
        print(f"wrote {target}")
    return 0


def _diff(env: str, tenant: str) -> int:
    from ai_factory.factory.rendering.diff import without_tenant

    removal = without_tenant(env, tenant)
    print(removal.render(env))
    return EXIT_FINDINGS if removal.unexpected else 0


def _check(target: str, upstream: Path | None) -> int:
    from ai_factory.factory.checking.check import run_checks
    from ai_factory.factory.checking.oracles import OracleError, Oracles, locate_upstream_dir
    from ai_factory.factory.rendering.bundle import load_rendered, render_env

    try:
        root = upstream or locate_upstream_dir()
    except OracleError as err:
        print(f"check: {err}", file=sys.stderr)
        return EXIT_NO_ORACLES
    if root is None or not root.is_dir():
        print("check: no upstream oracle directory (set FACTORY_UPSTREAM_DIR or pass --upstream)", file=sys.stderr)
        return EXIT_NO_ORACLES
    path = Path(target)
    rendered = load_rendered(path) if path.is_dir() else render_env(target)
    findings = run_checks(rendered, Oracles(root))
    for finding in findings:
        print(finding)
    print(f"checked {len(rendered.manifests)} objects against {root}: {len(findings)} finding(s)")
    return EXIT_FINDINGS if findings else 0
