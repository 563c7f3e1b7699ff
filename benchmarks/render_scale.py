"""Render and check environments of growing size; print resources, times and peak memory.

    python benchmarks/render_scale.py            # default sizes
    python benchmarks/render_scale.py 64x16 ...  # <nodes>x<tenants>

Each size runs in a fresh process so peak memory (max RSS) is that size's own.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SIZES = ["8x3", "64x16", "256x50", "1000x100"]


def environment(nodes: int, tenants: int) -> dict:
    """A fleet of `nodes` 8-GPU nodes split over three pools, and `tenants` tenants of mixed trust
    each asking for whole GPUs on the training pool."""
    train, mig = max(1, nodes // 2), max(1, nodes // 4)
    infer = max(1, nodes - train - mig)
    pools = [
        {"name": "h100-train", "site": "dc1", "gpu": {"model": "H100-80GB", "per_node": 8}, "nodes": train,
         "topology": {"intra_node": "nvswitch", "fabric": "infiniband"}},
        {"name": "a100-mig", "site": "dc1", "gpu": {"model": "A100-80GB", "per_node": 8}, "nodes": mig, "sharing": "mig"},
        {"name": "l40s-infer", "site": "dc1", "gpu": {"model": "L40S-48GB", "per_node": 4}, "nodes": infer, "sharing": "hami"},
    ]
    trust = ["high", "medium", "low"]
    return {
        "kubernetes": {"version": "1.34"},
        "fleet": {"sites": [{"name": "dc1"}], "pools": pools},
        "tenants": [
            {"name": f"team-{i:03d}", "trust": trust[i % 3], "owners": {"groups": [f"team-{i:03d}-admins"]},
             "gpus": [{"pool": "h100-train", "count": 1}]}
            for i in range(tenants)
        ],
    }


def measure(nodes: int, tenants: int) -> dict:
    sys.path.insert(0, str(REPO))
    from factory.check import run_checks
    from factory.loading import validate
    from factory.oracles import Oracles, locate_upstream_dir
    from factory.render import render_raw

    raw = environment(nodes, tenants)
    started = time.perf_counter()
    cfg = validate(raw)
    rendered = render_raw(raw, set(), cfg, stack="bench")
    render_s = time.perf_counter() - started
    root = locate_upstream_dir()
    check_s = None
    findings = None
    if root is not None:
        started = time.perf_counter()
        findings = len(run_checks(rendered, Oracles(root)))
        check_s = time.perf_counter() - started
    return {
        "nodes": nodes,
        "gpus": sum(p["nodes"] * p["gpu"]["per_node"] for p in raw["fleet"]["pools"]),
        "tenants": tenants,
        "resources": len(rendered.inventory),
        "objects": len(rendered.manifests),
        "render_s": round(render_s, 2),
        "check_s": None if check_s is None else round(check_s, 2),
        "findings": findings,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--one":
        nodes, tenants = map(int, argv[1].split("x"))
        print(json.dumps(measure(nodes, tenants)))
        return
    print(f"{'nodes':>6} {'GPUs':>6} {'tenants':>7} {'resources':>9} {'objects':>8} {'render s':>9} {'check s':>8} {'findings':>8} {'peak MiB':>9}")
    for size in argv or DEFAULT_SIZES:
        out = subprocess.run([sys.executable, __file__, "--one", size], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['nodes']:>6} {r['gpus']:>6} {r['tenants']:>7} {r['resources']:>9} {r['objects']:>8} {r['render_s']:>9} {str(r['check_s']):>8} {str(r['findings']):>8} {r['peak_rss_mib']:>9}")


if __name__ == "__main__":
    main(sys.argv[1:])
