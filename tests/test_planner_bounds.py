"""The planner's cost follows the supply: shared demands far beyond what a pool's GPUs could ever
hold are refused before any packing, and identical HAMi slices are packed in one step per GPU."""

from __future__ import annotations

import random
import time

import pytest

from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.planning.model import Demand, HamiAllocation, HamiSlice, PlanError, PoolSpec, TenantSpec, hami_memory_capacity
from ai_factory.factory.planning.planner import plan
from ai_factory.factory.planning.sharing import _pack_hami

L40S = GPU_MODELS["L40S-48GB"]


def pool(name: str, model: str, sharing: str, nodes: int, per_node: int = 8, **options) -> PoolSpec:
    return PoolSpec(name, model, per_node, tuple(f"{name}-{i:03d}" for i in range(nodes)), sharing, **options)


def plan_problems(pools, tenants) -> list[str]:
    with pytest.raises(PlanError) as err:
        plan(pools, tenants)
    return err.value.problems


@pytest.mark.parametrize(
    ("shared_pool", "demand", "expected"),
    [
        (pool("l40s", "L40S-48GB", "hami", 2, per_node=4, hami_split_count=8), Demand("l40s", hami=(HamiSlice(10**7, 256, 1),)),
         "tenant 't' on pool 'l40s': the pool's demands reach 10000000 HAMi vGPUs, more than 2 times what its GPUs could ever hold (64); refused before planning"),
        (pool("l40s", "L40S-48GB", "hami", 2, per_node=4, hami_split_count=8), Demand("l40s", hami=(HamiSlice(64, 40000, 1),)),
         "pool 'l40s': the demands ask for 2560000 MiB of HAMi GPU memory in all (t 2560000), more than 2 times what its 8 GPUs could ever hold (368544); refused before planning"),
        (pool("a100", "A100-80GB", "mig", 2), Demand("a100", mig=(("3g.40gb", 10**7),)),
         "pool 'a100': the demands ask for 30000000 MIG compute slices in all (t 30000000), more than 2 times what its 16 GPUs could ever hold (112); refused before planning"),
        (pool("t4", "L40S-48GB", "time-slicing", 2, per_node=4), Demand("t4", time_sliced_replicas=10**9),
         "pool 't4': the demands ask for 1000000000 time-sliced replicas in all (t 1000000000), more than 2 times what its 8 GPUs could ever hold (32); refused before planning"),
    ],
    ids=["hami-vgpus", "hami-memory", "mig", "time-slicing"],
)
def test_shared_demands_beyond_the_pool_are_refused_before_packing(shared_pool, demand, expected):
    started = time.perf_counter()
    found = plan_problems([shared_pool], [TenantSpec("t", "high", "t", (demand,))])
    assert time.perf_counter() - started < 1
    assert expected in found, found


def _first_fit_one_by_one(capacity, split_count, slices, size):
    """First-fit decreasing placing each vGPU separately (the reference)."""
    bins: list[list[HamiAllocation]] = []
    for allocation in sorted(slices, key=lambda a: (-size(a), -a.memory_mib, -a.cores_percent, a.tenant)):
        for gpu in bins:
            if (len(gpu) < split_count and sum(a.memory_mib for a in gpu) + allocation.memory_mib <= capacity
                    and sum(a.cores_percent for a in gpu) + allocation.cores_percent <= 100):
                gpu.append(allocation)
                break
        else:
            bins.append([allocation])
    return bins


@pytest.mark.parametrize("seed", range(5))
def test_packing_identical_slices_at_once_gives_the_one_by_one_first_fit(seed):
    rng = random.Random(seed)
    capacity = hami_memory_capacity(L40S, 1.0)
    kinds = [HamiAllocation(f"t{i % 3}", rng.choice([2048, 6000, 12288, 20000]), rng.choice([5, 10, 25, 40])) for i in range(6)]
    slices = [kind for kind in kinds for _ in range(rng.randint(1, 12))]
    sizes = (
        lambda a: max(a.memory_mib / capacity, a.cores_percent / 100),
        lambda a: a.memory_mib / capacity + a.cores_percent / 100,
        lambda a: a.memory_mib,
        lambda a: a.cores_percent,
    )
    references = [_first_fit_one_by_one(capacity, 8, slices, size) for size in sizes]
    best = min(references, key=len)  # the first of the fewest, as the packer keeps it
    assert _pack_hami(L40S, 8, 1.0, slices) == best


def test_packing_a_pool_full_of_identical_slices_is_quick():
    slices = [HamiAllocation("t", 4096, 10)] * 80_000  # 10 per GPU: 8,000 GPUs
    started = time.perf_counter()
    packed = _pack_hami(L40S, 10, 1.0, slices)
    assert time.perf_counter() - started < 5
    assert len(packed) == 8_000
