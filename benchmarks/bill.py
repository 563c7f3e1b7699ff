"""`ai-factory bill` at scale: 200 tenants x 30 days at one-minute resolution, from an offline export.

    python benchmarks/bill.py [TENANTS] [DAYS]      (from the repository root)

Writes a synthetic export (each tenant, added to dev's own: allocated and used series on one of
the dev pools; per pool: idle and physical series that reconcile) to a temporary folder, then times
the CLI on it in a process of its own and prints its wall time, its CPU time (user + system, all its
processes: the figure to compare on a shared machine) and its peak memory per process.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ai_factory.factory.metering.rules import POOL_GPUS, POOL_IDLE, TENANT_ALLOCATED, TENANT_USED  # noqa: E402

START = 1_764_547_200  # 2025-12-01T00:00:00Z
POOLS = (("h100-train", "H100-80GB", "exclusive"), ("a100-mig", "A100-80GB", "mig"), ("l40s-infer", "L40S-48GB", "hami"))


def stack_file(folder: Path, tenants: int) -> Path:
    document = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())
    # Added to dev's own tenants, which other sections of dev name (they have no series here).
    document["config"]["ai-factory:tenants"] += [
        {"name": f"t{i:03d}", "trust": "high", "trust_domain": "internal", "owners": {"groups": [f"t{i:03d}-admins"]}} for i in range(tenants)
    ]
    path = folder / "Pulumi.benchbill.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def write_export(path: Path, tenants: int, samples: int) -> int:
    """Allocation 0.25 per tenant on its pool, used 0.1; the rest of each pool idle."""
    times = [START + 60 * i for i in range(samples)]
    per_pool: dict[str, int] = {}
    count = 0
    with path.open("w") as out:

        def line(name: str, labels: dict[str, str], value: str) -> None:
            nonlocal count
            out.write(json.dumps({"metric": {"__name__": name, **labels}, "values": [[t, value] for t in times]}) + "\n")
            count += samples

        for i in range(tenants):
            pool, model, mode = POOLS[i % len(POOLS)]
            per_pool[pool] = per_pool.get(pool, 0) + 1
            labels = {"tenant": f"t{i:03d}", "namespace": f"tenant-t{i:03d}", "pool": pool, "gpu_model": model, "mode": mode}
            line(TENANT_ALLOCATED, labels, "0.25")
            line(TENANT_USED, labels, "0.1")
        for pool, model, mode in POOLS:
            gpus = 1000
            labels = {"pool": pool, "gpu_model": model, "mode": mode}
            line(POOL_IDLE, labels, repr(gpus - 0.25 * per_pool.get(pool, 0)))
            line(POOL_GPUS, labels, str(gpus))
    return count


def main() -> None:
    tenants = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    days = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    samples = days * 24 * 60
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        export = root / "export.jsonl"
        count = write_export(export, tenants, samples)
        stack = stack_file(root, tenants)
        end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(START + samples * 60))
        command = [sys.executable, "-m", "ai_factory.factory", "bill", str(stack), "--export", str(export)]
        command += ["--start", "2025-12-01T00:00:00Z", "--end", end, "--out", str(root / "bill")]
        started = time.perf_counter()
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak_mib, cpu = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
        if result.returncode:
            sys.exit(result.stderr)
        lines = len((root / "bill" / "bill.csv").read_text().splitlines()) - 1
        print(f"tenants {tenants}  days {days}  samples {count:,}  export {export.stat().st_size / 2**20:,.0f} MiB")
        print(f"bill: {elapsed:.1f} s wall, {cpu:.1f} s CPU (all processes), peak {peak_mib:,.0f} MiB per process, {lines} lines")
        print(result.stdout.strip())


if __name__ == "__main__":
    main()
