"""A review after a one-tenant change: render and check a generated environment cold into a fresh
render and check cache, then again after one tenant's quota changed; print the CPU and wall
seconds, the wall seconds of writing the rendered tree (the cached steps over one tree, as
`ai-factory render` writes over its last output), peak memory and what the cache rebuilt, with the
machine's load average.

    python benchmarks/tenant_change.py            # 1,000 tenants
    python benchmarks/tenant_change.py 200        # another size
    python benchmarks/tenant_change.py 200 --verify   # also a cold render of the changed
                                                      # environment, compared byte for byte
    python benchmarks/tenant_change.py 1000 --cli     # also the review through the CLI

With `--cli`, the same review as a user runs it: the environment written as a stack file of a
scratch project, then `ai-factory render` and `ai-factory check` (charts rendered by helm when
the chart cache and helm are there), cold and after the change, each command's wall seconds
and peak RSS (its own process; render workers apart) printed.

Each step runs in a fresh process (its peak RSS is its own; workers apart). The render's
workers and the check's (forked, sharing the process's memory until they write it) show their CPU
seconds beside each step, and the largest worker's peak RSS (a forked worker's counts the pages it
shares) last; "render+check s" is the wall time of the two, the figure the issue's cold goals are
set in. Checks run without chart rendering (no helm needed); the oracle directory is the default
one. Steps run with Python's bytecode cache (`__pycache__`, as an installed library has it),
whatever PYTHONDONTWRITEBYTECODE says: the cold step writes it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def environment(tenants: int, changed: bool) -> tuple[dict, set[str]]:
    sys.path.insert(0, str(REPO))
    from benchmarks.render_scale import environment as generated

    raw, secret_sections = generated(tenants)
    if changed:
        raw["tenants"][1]["quota"] = {"cpu": "77"}
    return raw, secret_sections


def step(tenants: int, changed: bool, cache: str | None, out: str | None, tree: str | None) -> dict:
    from ai_factory.factory.checking.charts import check_environment
    from ai_factory.factory.checking.oracles import locate_upstream_dir
    from ai_factory.factory.model.loading import validate
    from ai_factory.factory.rendering.bundle import render_raw
    from ai_factory.factory.rendering.cache import write_record

    raw, secret_sections = environment(tenants, changed)
    started, cpu = time.perf_counter(), time.process_time()
    rendered = render_raw(raw, secret_sections, validate(raw), stack="bench", cache=Path(cache) if cache else None)
    files = rendered.files()
    render_s, render_cpu = time.perf_counter() - started, time.process_time() - cpu
    render_workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    if tree:
        # As `ai-factory render` writes, with its write record in the cache; the files are the
        # render's (render_s counts them).
        rendered.write(Path(tree), record=write_record(Path(cache), Path(tree)) if cache else None, files=files)
    write_s = time.perf_counter() - started
    started, cpu = time.perf_counter(), time.process_time()
    report = check_environment(rendered, locate_upstream_dir(), None, None, cache=Path(cache) if cache else None)
    check_s, check_cpu = time.perf_counter() - started, time.process_time() - cpu
    if out:
        Path(out).write_text(json.dumps(files, sort_keys=True))
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    check_workers_cpu = workers.ru_utime + workers.ru_stime - render_workers.ru_utime - render_workers.ru_stime
    return {
        "resources": len(rendered.inventory),
        "objects": len(rendered.manifests),
        "render_s": round(render_s, 2),
        "render_cpu_s": round(render_cpu, 2),
        "write_s": round(write_s, 2),
        "worker_cpu_s": round(render_workers.ru_utime + render_workers.ru_stime, 2),
        "check_s": round(check_s, 2),
        "check_cpu_s": round(check_cpu, 2),
        "check_worker_cpu_s": round(check_workers_cpu, 2),
        "render_check_s": round(render_s + check_s, 2),
        "findings": len(report.findings),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "worker_peak_rss_mib": round(workers.ru_maxrss / 1024),
    }


def stack_file_text(raw: dict) -> str:
    """`raw` as a stack file of this project: dev's, its secrets (`secure:` ciphertexts of the dev
    passphrase) kept where the generated environment keeps them."""
    import yaml

    from ai_factory.factory.model.loading import _replace_secure
    from ai_factory.factory.model.secrets import SecretValue, offline_placeholder

    document = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())
    project = "ai-factory:"
    ciphertexts: dict[str, str] = {}  # by config path, as the stack file reader finds them
    for key, value in document["config"].items():
        if key.startswith(project):
            _replace_secure(value, key.removeprefix(project), ciphertexts)
    secure = {offline_placeholder(path): {"secure": ciphertext} for path, ciphertext in ciphertexts.items()}

    def restore(value):
        if isinstance(value, SecretValue):
            return secure[value]
        if isinstance(value, dict):
            return {key: restore(child) for key, child in value.items()}
        if isinstance(value, list):
            return [restore(child) for child in value]
        return value

    others = {key: value for key, value in document["config"].items() if not key.startswith(project)}
    document["config"] = {**others, **{project + section: restore(value) for section, value in raw.items()}}
    return yaml.dump(document, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)


def command(project: Path, name: str, cache: Path) -> dict:
    """`ai-factory <name> bench` in `project`: its wall seconds, peak RSS and exit status."""
    from ai_factory.factory.checking.oracles import locate_upstream_dir
    from ai_factory.factory.rendering.charts import locate_chart_dir

    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    environment["FACTORY_CACHE_DIR"] = str(cache)
    for variable, found in (("FACTORY_UPSTREAM_DIR", locate_upstream_dir()), ("FACTORY_CHARTS_DIR", locate_chart_dir(None))):
        if found is not None:
            environment[variable] = str(found)  # as the repository's own checks find them
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-m", "ai_factory.factory", name, "bench", "-q"], cwd=project, env=environment, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        errors.seek(0)
        message = errors.read().decode(errors="replace")
    status = os.waitstatus_to_exitcode(status)
    if status not in (0, 3):  # 3: clean, but a check family could not run (no helm or chart cache)
        raise RuntimeError(f"ai-factory {name} bench exited {status}:\n{message[-4000:]}")
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024), "complete": status == 0}


def cli_review(tenants: int) -> None:
    print("\nas a user runs it (`ai-factory render` then `check`, each its own process):")
    print(f"{'step':<28} {'render s':>8} {'peak MiB':>8} {'check s':>7} {'peak MiB':>8} {'render+check s':>14}")
    with tempfile.TemporaryDirectory() as scratch:
        project, cache = Path(scratch) / "project", Path(scratch) / "cache"
        project.mkdir()
        shutil.copy(REPO / "Pulumi.yaml", project)
        for label, changed in (("cold (empty cache)", False), ("one tenant changed (cached)", True)):
            (project / "Pulumi.bench.yaml").write_text(stack_file_text(environment(tenants, changed)[0]))
            render, check = command(project, "render", cache), command(project, "check", cache)
            incomplete = "" if check["complete"] else "  (check incomplete: no helm or chart cache)"
            print(
                f"{label:<28} {render['wall_s']:>8} {render['peak_rss_mib']:>8} {check['wall_s']:>7} {check['peak_rss_mib']:>8} "
                f"{round(render['wall_s'] + check['wall_s'], 2):>14}{incomplete}"
            )


def units_built(cache: Path, before: dict[str, str]) -> list[str]:
    after = json.loads((cache / "stacks" / "ai-factory.bench.json").read_text())["units"]
    return sorted(u for u, key in after.items() if before.get(u) != key)


def run(tenants: int, changed: bool, cache: Path | None, out: Path | None, tree: Path) -> dict:
    command = [sys.executable, __file__, "--step", str(tenants), "1" if changed else "0", str(cache or ""), str(out or ""), str(tree)]
    # With Python's bytecode cache, as an installed library runs: where PYTHONDONTWRITEBYTECODE is
    # set (this project's machines set it), every step compiled the hundred-odd library modules a
    # render and a check import from source, about 0.5 s of a one-tenant review.
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    result = subprocess.run(command, capture_output=True, text=True, check=True, cwd=REPO, env=environment)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--step":
        print(json.dumps(step(int(argv[1]), argv[2] == "1", argv[3] or None, argv[4] or None, argv[5] or None)))
        return
    tenants = int(next((a for a in argv if a.isdigit()), "1000"))
    print(f"{tenants} generated tenants; load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    print(
        f"{'step':<28} {'resources':>9} {'objects':>8} {'render s wall/cpu':>18} {'write s':>7} {'workers cpu':>11} {'check s wall/cpu':>17} "
        f"{'workers cpu':>11} {'render+check s':>14} {'findings':>8} {'peak MiB':>8} {'workers MiB':>11}"
    )
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(scratch) / "cache"
        rows = [("cold (empty cache)", False, cache, Path(scratch) / "cold.json")]
        rows.append(("one tenant changed (cached)", True, cache, Path(scratch) / "changed.json"))
        if "--verify" in argv:
            rows.append(("one tenant changed (no cache)", True, None, Path(scratch) / "reference.json"))
        before: dict[str, str] = {}
        for label, changed, directory, out in rows:
            # The cached steps write over one tree, as `ai-factory render` over its last output.
            r = run(tenants, changed, directory, out, Path(scratch) / ("tree" if directory is not None else "reference-tree"))
            render, check = f"{r['render_s']}/{r['render_cpu_s']}", f"{r['check_s']}/{r['check_cpu_s']}"
            print(
                f"{label:<28} {r['resources']:>9} {r['objects']:>8} {render:>18} {r['write_s']:>7} {r['worker_cpu_s']:>11} "
                f"{check:>17} {r['check_worker_cpu_s']:>11} {r['render_check_s']:>14} {r['findings']:>8} {r['peak_rss_mib']:>8} {r['worker_peak_rss_mib']:>11}"
            )
            if directory is not None:
                built = units_built(cache, before)
                print(f"{'':<28} units rendered: {len(built)}" + (f" ({', '.join(built)})" if len(built) <= 5 else ""))
                before = json.loads((cache / "stacks" / "ai-factory.bench.json").read_text())["units"]
        if "--verify" in argv:
            same = (Path(scratch) / "changed.json").read_text() == (Path(scratch) / "reference.json").read_text()
            print(f"cached render of the change is the cold one byte for byte: {same}")
    if "--cli" in argv:
        cli_review(tenants)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main(sys.argv[1:])
