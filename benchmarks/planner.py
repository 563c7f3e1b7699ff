"""Capacity planner figures: packing quality against the lower bound and a brute-force optimum,
allocation utilisation, and planning time on fleets up to about 1,000 GPUs and 100 tenants.

    python benchmarks/planner.py          (from the repository root; about 10 s)
"""

from __future__ import annotations

import itertools
import random
import statistics
import sys
import time
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ai_factory.factory.model.gpus import GPU_MODELS, MIG_CLASSES  # noqa: E402
from ai_factory.factory.planning.mig import MIG_CLASS_ORDER, mig_lower_bound, min_mig_gpus  # noqa: E402
from ai_factory.factory.planning.model import Demand, HamiSlice, Plan, PoolSpec, TenantSpec  # noqa: E402
from ai_factory.factory.planning.planner import plan  # noqa: E402

SEED = 7


# --------------------------------------------------------------------------- MIG packing


def _fits_one_gpu(instances: tuple[str, ...]) -> bool:
    """Every placement tried: disjoint memory ranges at legal starts, <= 7 compute, <= 1 +me."""
    if sum(MIG_CLASSES[k].compute_slices for k in instances) > 7 or instances.count("c1m1_me") > 1:
        return False

    def place(i: int, used: frozenset[int]) -> bool:
        if i == len(instances):
            return True
        geometry = MIG_CLASSES[instances[i]]
        return any(
            not used & set(span) and place(i + 1, used | set(span))
            for span in (range(s, s + geometry.memory_slices) for s in geometry.placements)
        )

    return place(0, frozenset())


ONE_GPU = sorted(
    {
        tuple(instances.count(k) for k in MIG_CLASS_ORDER)
        for size in range(1, 9)
        for instances in itertools.combinations_with_replacement(MIG_CLASS_ORDER, size)
        if _fits_one_gpu(instances)
    }
)


@lru_cache(maxsize=None)
def brute_force(demand: tuple[int, ...]) -> int:
    if not any(demand):
        return 0
    first = next(i for i, n in enumerate(demand) if n)
    return 1 + min(
        brute_force(tuple(d - c for d, c in zip(demand, content)))
        for content in ONE_GPU
        if content[first] and all(c <= d for c, d in zip(content, demand))
    )


def _counts(vector: tuple[int, ...]) -> dict[str, int]:
    return {k: n for k, n in zip(MIG_CLASS_ORDER, vector) if n}


def mig_packing() -> None:
    print("== MIG packing: planner (exact) vs lower bound vs brute force")
    named = {
        "3 x 4g": {"c4m4": 3},
        "7 x 2g": {"c2m2": 7},
        "5 x 2g + 3g + 2 x 4g": {"c2m2": 5, "c3m4": 1, "c4m4": 2},
        "3g + 3 x 2g": {"c3m4": 1, "c2m2": 3},
        "5 x 1g.me": {"c1m1_me": 5},
        "4g + 3g + 2 x 1g.me": {"c4m4": 1, "c3m4": 1, "c1m1_me": 2},
        "9 x 1g(2 mem) + 2 x 3g": {"c1m2": 9, "c3m4": 2},
    }
    print(f"{'demand':<28} {'LB':>4} {'planner':>8} {'brute':>6}")
    for name, counts in named.items():
        vector = tuple(counts.get(k, 0) for k in MIG_CLASS_ORDER)
        print(f"{name:<28} {mig_lower_bound(counts):>4} {min_mig_gpus(counts):>8} {brute_force(vector):>6}")

    rng = random.Random(SEED)
    for label, media_extensions in (("base profiles", 0), ("with 1g+me", 4)):
        gaps_lb, gaps_bf, below = [], [], 0
        for _ in range(1500):
            vector = tuple(rng.randint(0, top) for top in (1, 4, 5, 6, 6, 10, media_extensions))
            counts = _counts(vector)
            if not counts:
                continue
            got, bound, optimum = min_mig_gpus(counts), mig_lower_bound(counts), brute_force(vector)
            gaps_lb.append(got - bound)
            gaps_bf.append(got - optimum)
            below += bound < optimum
        print(
            f"{len(gaps_bf)} random small demands, {label}: planner - brute force mean {statistics.mean(gaps_bf):.3f} "
            f"worst {max(gaps_bf)}; planner - LB mean {statistics.mean(gaps_lb):.3f} worst {max(gaps_lb)} "
            f"(LB below the optimum in {below})"
        )

    print(f"{'large single-domain demand':<48} {'GPUs':>6} {'LB':>6} {'ms':>8}")
    for name, counts in {
        "1,000 GPUs of mixed profiles": {
            "c7m8": 50, "c4m4": 150, "c3m4": 250, "c2m2": 600, "c1m2": 500, "c1m1": 1500, "c1m1_me": 60,
        },
        "2,000 x 4g + 2,001 x 3g + 2,000 x 1g.me": {"c4m4": 2000, "c3m4": 2001, "c1m1_me": 2000},
        "3,000 x 2g": {"c2m2": 3000},
    }.items():
        started = time.perf_counter()
        gpus = min_mig_gpus(counts)
        elapsed = (time.perf_counter() - started) * 1000
        print(f"{name:<48} {gpus:>6} {mig_lower_bound(counts):>6} {elapsed:>8.2f}")
    print()


# --------------------------------------------------------------------------- fleets


POOL_SHAPES = (
    ("h100-mig", "H100-80GB", "mig", 8),
    ("a100-mig", "A100-80GB", "mig", 8),
    ("b200", "B200-180GB", "exclusive", 4),
    ("l40s", "L40S-48GB", "hami", 4),
    ("l4", "L4-24GB", "time-slicing", 8),
)


def tenants_for(count: int, rng: random.Random) -> list[TenantSpec]:
    """`count` tenants in count/2.5 trust domains; each domain slices GPUs of one MIG pool; one
    tenant in ten is low-trust with whole GPUs on dedicated nodes."""
    domains = max(1, int(count / 2.5))
    specs = []
    for i in range(count):
        name = f"t{i:03d}"
        if i % 10 == 9:
            specs.append(TenantSpec(name, "low", name, (Demand("b200", whole_gpus=rng.randint(1, 6)),)))
            continue
        domain = i % domains
        pool_name, model = (("h100-mig", "H100-80GB"), ("a100-mig", "A100-80GB"))[domain % 2]
        mig = tuple(
            (p.name, 1 if p.media_extensions else rng.randint(1, 5))
            for p in GPU_MODELS[model].mig_profiles
            if rng.random() < 0.5
        ) or ((GPU_MODELS[model].mig_profiles[0].name, 2),)
        demands = [Demand(pool_name, mig=mig)]
        if rng.random() < 0.5:
            demands.append(Demand("b200", whole_gpus=rng.randint(1, 6)))
        if rng.random() < 0.3:
            slices = HamiSlice(rng.randint(1, 6), rng.choice([4096, 8192, 12288, 20480]), rng.choice([10, 20, 25, 50]))
            demands.append(Demand("l40s", hami=(slices,)))
        if rng.random() < 0.3:
            demands.append(Demand("l4", time_sliced_replicas=rng.randint(1, 16)))
        specs.append(TenantSpec(name, rng.choice(["high", "medium"]), f"d{domain:02d}", tuple(demands)))
    return specs


def fleet_for(specs: list[TenantSpec]) -> list[PoolSpec]:
    """Pools sized to the nodes the plan needs plus 10% headroom."""
    roomy = [
        PoolSpec(name, model, per_node, tuple(f"{name}-{i:03d}" for i in range(500)), sharing)
        for name, model, sharing, per_node in POOL_SHAPES
    ]
    used = {row.pool: row.nodes_used for row in plan(roomy, specs).pool_figures}
    return [
        PoolSpec(p.name, p.gpu_model, p.gpus_per_node, p.nodes[: used.get(p.name, 0) * 11 // 10 + 1], p.sharing)
        for p in roomy
    ]


def _timed(function, repeat: int = 3):
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - started)
    return result, best


def fleets() -> None:
    print("== Fleets: GPUs used vs lower bound, utilisation, planning time (best of 3)")
    header = (
        f"{'GPUs':>6} {'tenants':>7} {'used':>6} {'LB':>6} {'gap':>4} {'MIG gap':>7} {'HAMi gap':>8} "
        f"{'idle':>5} {'util':>6} {'plan ms':>8} {'json ms':>8} {'replan ms':>9} {'disturbed':>9}"
    )
    print(header)
    rng = random.Random(SEED)
    for tenants in (10, 30, 60, 100):
        specs = tenants_for(tenants, rng)
        pools = fleet_for(specs)
        result, seconds = _timed(lambda: plan(pools, specs))
        text, json_seconds = _timed(result.to_json)
        previous = Plan.from_json(text)
        newcomer = TenantSpec("newcomer", "high", "newcomer", (Demand("h100-mig", mig=(("3g.40gb", 3),)),))
        replanned, replan_seconds = _timed(lambda: plan(pools, [*specs, newcomer], previous=previous))
        rows = result.figures
        mig_gap = sum(r.gap for r in rows if r.pool.endswith("-mig"))
        hami_gap = sum(r.gap for r in rows if r.pool == "l40s")
        total = result.fleet_figures
        print(
            f"{sum(len(p.nodes) * p.gpus_per_node for p in pools):>6} {tenants:>7} {total.gpus_used:>6} "
            f"{total.lower_bound:>6} {total.gap:>4} {mig_gap:>7} {hami_gap:>8} {total.idle_gpus:>5} "
            f"{total.utilisation:>6.3f} {seconds * 1000:>8.1f} {json_seconds * 1000:>8.1f} "
            f"{replan_seconds * 1000:>9.1f} {replanned.changed_gpus:>9}"
        )
    print(
        "MIG gap: GPUs above the lower bound in MIG pools (the packing is exact, so this is the "
        "bound's own slack); idle: GPUs stranded on owned or dedicated nodes; disturbed: GPUs in use "
        "that re-planning with one more tenant changed"
    )
    print()


# --------------------------------------------------------------------------- HAMi heuristic


def hami_gaps() -> None:
    print("== HAMi packing (first-fit decreasing, best of four size orders) vs lower bound")
    print("   one trust domain on L40S, split count 10")
    rng = random.Random(SEED)
    gaps, utilisation = [], []
    for _ in range(300):
        slices = tuple(
            HamiSlice(
                rng.randint(1, 6),
                rng.choice([2048, 4096, 8192, 12288, 16384, 24576]),
                rng.choice([5, 10, 20, 25, 30, 50]),
            )
            for _ in range(rng.randint(1, 6))
        )
        pools = [PoolSpec("l40s", "L40S-48GB", 4, tuple(f"n{i:03d}" for i in range(60)), "hami")]
        result = plan(pools, [TenantSpec("acme", "high", "acme", (Demand("l40s", hami=slices),))])
        (row,) = result.figures
        gaps.append(row.gap)
        utilisation.append(row.utilisation)
    print(
        f"300 random demands: gap mean {statistics.mean(gaps):.3f}, worst {max(gaps)}, "
        f"zero-gap {sum(g == 0 for g in gaps)}; utilisation mean {statistics.mean(utilisation):.3f}"
    )
    print()


if __name__ == "__main__":
    started = time.perf_counter()
    mig_packing()
    fleets()
    hami_gaps()
    print(f"total {time.perf_counter() - started:.1f} s")
