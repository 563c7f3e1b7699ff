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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SIZES = ["3", "10", "30", "100", "300"]


def environment(tenants: int, spare_nodes: int = 0) -> tuple[dict, set[str]]:
    """The dev environment's platform sections (layers, identity, Kubernetes) with a generated fleet
    and `tenants` tenants: every third low-trust (8 whole H100s on a dedicated node), every third
    medium (MIG and HAMi slices in its own trust domain), every third high (MIG slices and whole
    GPUs, two tenants per trust domain). Pools are sized to the demand, plus `spare_nodes` idle
    H100 nodes."""
    from factory.loading import read_stack_file, stack_file

    raw, secret_sections = read_stack_file(stack_file("dev"))
    generated = []
    for i in range(tenants):
        name = f"team-{i:03d}"
        owners = {"groups": [f"{name}-admins"]}
        if i % 3 == 0:
            generated.append({"name": name, "trust": "low", "owners": owners, "gpus": [{"pool": "h100", "count": 8}]})
        elif i % 3 == 1:
            gpus = [{"pool": "a100-mig", "mig": {"1g.10gb": 2, "3g.40gb": 1}},
                    {"pool": "l40s-hami", "count": 2, "memory_mib": 8192, "cores_percent": 20}]
            generated.append({"name": name, "trust": "medium", "owners": owners, "gpus": gpus})
        else:
            gpus = [{"pool": "a100-mig", "mig": {"1g.10gb": 1}}, {"pool": "h100", "count": 4}]
            generated.append({"name": name, "trust": "high", "trust_domain": f"internal-{i // 6}", "owners": owners, "gpus": gpus})
    low, medium, high = (sum(1 for t in generated if t["trust"] == trust) for trust in ("low", "medium", "high"))
    raw["fleet"] = {
        "sites": [{"name": "dc1"}],
        "pools": [
            {"name": "h100", "site": "dc1", "gpu": {"model": "H100-80GB", "per_node": 8},
             "nodes": max(1, low + high + spare_nodes), "topology": {"intra_node": "nvswitch", "fabric": "infiniband"}},
            {"name": "a100-mig", "site": "dc1", "gpu": {"model": "A100-80GB", "per_node": 8}, "nodes": max(1, medium + high), "sharing": "mig"},
            {"name": "l40s-hami", "site": "dc1", "gpu": {"model": "L40S-48GB", "per_node": 4}, "nodes": max(1, medium), "sharing": "hami"},
        ],
    }
    raw["tenants"] = generated
    return raw, secret_sections


def measure(tenants: int) -> dict:
    sys.path.insert(0, str(REPO))
    from factory.check import run_checks
    from factory.loading import validate
    from factory.oracles import Oracles, locate_upstream_dir
    from factory.render import render_raw

    raw, secret_sections = environment(tenants)
    started = time.perf_counter()
    cfg = validate(raw)
    rendered = render_raw(raw, secret_sections, cfg, stack="bench")
    render_s = time.perf_counter() - started
    root = locate_upstream_dir()
    check_s = None
    findings = None
    if root is not None:
        started = time.perf_counter()
        findings = len(run_checks(rendered, Oracles(root)))
        check_s = time.perf_counter() - started
    return {
        "nodes": sum(p["nodes"] for p in raw["fleet"]["pools"]),
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
        print(json.dumps(measure(int(argv[1]))))
        return
    print(f"{'nodes':>6} {'GPUs':>6} {'tenants':>7} {'resources':>9} {'objects':>8} {'render s':>9} {'check s':>8} {'findings':>8} {'peak MiB':>9}")
    for size in argv or DEFAULT_SIZES:
        out = subprocess.run([sys.executable, __file__, "--one", size], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['nodes']:>6} {r['gpus']:>6} {r['tenants']:>7} {r['resources']:>9} {r['objects']:>8} {r['render_s']:>9} {str(r['check_s']):>8} {str(r['findings']):>8} {r['peak_rss_mib']:>9}")


if __name__ == "__main__":
    main(sys.argv[1:])
