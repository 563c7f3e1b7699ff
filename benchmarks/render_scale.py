"""Render and check environments of growing size; print resources, times and peak memory.

    python benchmarks/render_scale.py            # default sizes
    python benchmarks/render_scale.py 50 200     # tenant counts (the fleet is sized to them)

Each size runs in a fresh process so peak memory (max RSS) is that size's own.
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
    started = time.perf_counter()
    cfg = validate(raw)
    rendered = render_raw(raw, secret_sections, cfg, stack="bench")
    render_s = time.perf_counter() - started
    root, charts_dir, helm = locate_upstream_dir(), locate_chart_dir(), locate_helm()
    timings = []
    with tempfile.TemporaryDirectory() as store:
        for _ in ("cold", "warm"):
            started = time.perf_counter()
            report = check_environment(rendered, root, charts_dir, helm, Path(store))
            timings.append(round(time.perf_counter() - started, 2))
    return {
        "nodes": sum(p["nodes"] for p in raw["fleet"]["pools"]),
        "gpus": sum(p["nodes"] * p["gpu"]["per_node"] for p in raw["fleet"]["pools"]),
        "tenants": tenants,
        "resources": len(rendered.inventory),
        "objects": len(rendered.manifests),
        "charts": report.charts_rendered,
        "checked": report.objects,
        "render_s": round(render_s, 2),
        "check_s": timings,
        "findings": len(report.findings),
        "not_run": len(report.not_run),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--one":
        print(json.dumps(measure(int(argv[1]))))
        return
    print(
        f"{'nodes':>6} {'GPUs':>6} {'tenants':>7} {'resources':>9} {'objects':>8} {'charts':>6} {'checked':>8} {'render s':>9} "
        f"{'check s cold/warm':>17} {'findings':>8} {'not run':>7} {'peak MiB':>9}"
    )
    for size in argv or DEFAULT_SIZES:
        out = subprocess.run([sys.executable, __file__, "--one", size], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        cold, warm = r["check_s"]
        print(
            f"{r['nodes']:>6} {r['gpus']:>6} {r['tenants']:>7} {r['resources']:>9} {r['objects']:>8} {r['charts']:>6} {r['checked']:>8} "
            f"{r['render_s']:>9} {f'{cold}/{warm}':>17} {r['findings']:>8} {r['not_run']:>7} {r['peak_rss_mib']:>9}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
