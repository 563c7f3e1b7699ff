"""Render and check environments of growing size; print resources, times and peak memory.

    python benchmarks/render_scale.py            # default sizes
    python benchmarks/render_scale.py 50 200     # tenant counts (the fleet is sized to them)

Each size runs in a fresh process so peak memory (max RSS) is that size's own. Times are wall
and CPU seconds (on a shared machine the CPU figure is the one to compare); after the table, a
least-squares line of the cold check's CPU time against the objects checked, with each size's
residual, shows whether checking stays linear. A render of many tenants runs partly in worker
processes (`render_raw`): their CPU time and peak memory are shown apart (render CPU is this
process's only).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SIZES = ["3", "10", "30", "100", "300"]


def environment(tenants: int) -> tuple[dict, set[str]]:
    """The dev environment's platform sections (layers, identity, Kubernetes) with the isolation
    tests' generated fleet and tenants (`tests/tenancy_env.py`): every third tenant low-trust on a
    dedicated H100 node, every third medium with MIG and HAMi slices, every third high sharing MIG
    GPUs two tenants per trust domain; pools sized to the demand."""
    from ai_factory.factory.model.loading import read_stack_file, stack_file
    from tests.tenancy_env import many_tenants

    raw, secret_sections = read_stack_file(stack_file("dev"))
    return many_tenants(raw, tenants), secret_sections


def measure(tenants: int) -> dict:
    """Check with chart rendering on when helm and the chart cache are there: cold (a fresh store
    of rendered charts) and warm (the same store again, as a re-check of an unchanged environment)."""
    sys.path.insert(0, str(REPO))
    from ai_factory.factory.checking.charts import check_environment
    from ai_factory.factory.model.loading import validate
    from ai_factory.factory.checking.oracles import locate_upstream_dir
    from ai_factory.factory.rendering.bundle import render_raw
    from ai_factory.factory.rendering.charts import locate_chart_dir, locate_helm

    raw, secret_sections = environment(tenants)
    started, cpu = time.perf_counter(), time.process_time()
    cfg = validate(raw)
    rendered = render_raw(raw, secret_sections, cfg, stack="bench")
    render_s, render_cpu_s = time.perf_counter() - started, time.process_time() - cpu
    root, charts_dir, helm = locate_upstream_dir(), locate_chart_dir(), locate_helm()
    timings, cpu_timings = [], []
    with tempfile.TemporaryDirectory() as store:
        for _ in ("cold", "warm"):
            started, cpu = time.perf_counter(), time.process_time()
            report = check_environment(rendered, root, charts_dir, helm, Path(store))
            timings.append(round(time.perf_counter() - started, 2))
            cpu_timings.append(round(time.process_time() - cpu, 2))
    return {
        "nodes": sum(p["nodes"] for p in raw["fleet"]["pools"]),
        "gpus": sum(p["nodes"] * p["gpu"]["per_node"] for p in raw["fleet"]["pools"]),
        "tenants": tenants,
        "resources": len(rendered.inventory),
        "objects": len(rendered.manifests),
        "charts": report.charts_rendered,
        "checked": report.objects,
        "render_s": round(render_s, 2),
        "render_cpu_s": round(render_cpu_s, 2),
        "check_s": timings,
        "check_cpu_s": cpu_timings,
        "findings": len(report.findings),
        "not_run": len(report.not_run),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "worker_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
        "worker_cpu_s": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime + resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime, 2),
    }


def linear_fit(points: list[tuple[float, float]]) -> tuple[float, float, list[float]]:
    """Least squares `y = a + b x`: (a, b, residual of each point)."""
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
    intercept = mean_y - slope * mean_x
    return intercept, slope, [y - (intercept + slope * x) for x, y in points]


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--one":
        print(json.dumps(measure(int(argv[1]))))
        return
    print(
        f"{'nodes':>6} {'GPUs':>6} {'tenants':>7} {'resources':>9} {'objects':>8} {'charts':>6} {'checked':>8} {'render s wall/cpu':>17} "
        f"{'check s cold/warm wall':>22} {'check s cold/warm cpu':>21} {'findings':>8} {'not run':>7} {'peak MiB':>9}"
    )
    points = []
    for size in argv or DEFAULT_SIZES:
        out = subprocess.run([sys.executable, __file__, "--one", size], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        cold, warm = r["check_s"]
        cold_cpu, warm_cpu = r["check_cpu_s"]
        render = f"{r['render_s']}/{r['render_cpu_s']}"
        workers = f"{r['worker_cpu_s']}, {r['worker_peak_rss_mib']}"
        points.append((r["checked"], cold_cpu))
        print(
            f"{r['nodes']:>6} {r['gpus']:>6} {r['tenants']:>7} {r['resources']:>9} {r['objects']:>8} {r['charts']:>6} {r['checked']:>8} "
            f"{render:>17} {f'{cold}/{warm}':>22} {f'{cold_cpu}/{warm_cpu}':>21} {r['findings']:>8} {r['not_run']:>7} {r['peak_rss_mib']:>9} {workers:>24}"
        )
    if len(points) > 1:
        intercept, slope, residuals = linear_fit(points)
        print(f"cold check CPU s = {intercept:.2f} + {1000 * slope:.3f} ms x objects; residuals: " + ", ".join(f"{n} objects {r:+.2f} s" for (n, _), r in zip(points, residuals)))


if __name__ == "__main__":
    main(sys.argv[1:])
