"""HAMi and time-slicing: packing a trust domain's vGPU slices and replicas onto GPUs, keeping the
previous plan's GPUs where that costs none."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Iterable, Mapping, Sequence

from ai_factory.factory.model.gpus import GpuModel
from ai_factory.factory.planning.model import (
    GpuAssignment,
    HamiAllocation,
    PoolSpec,
    Slot,
    TimeSliceShare,
    hami_memory_capacity,
)


def _pack_hami(
    model: GpuModel,
    split_count: int,
    scaling: float,
    slices: Iterable[HamiAllocation],
    gpus: Sequence[Sequence[HamiAllocation]] = (),
) -> list[list[HamiAllocation]]:
    """First-fit decreasing onto `gpus` (kept from a previous plan), then onto new GPUs, under four
    size orders (dominant share, summed shares, memory, cores); the fewest GPUs wins. A heuristic:
    the figures report its gap to the lower bound.

    Identical slices are placed in one step per GPU (as many as fit: what placing them one by one
    first-fit gives), so the cost follows the number of distinct slices and of GPUs, not of vGPUs."""
    capacity = hami_memory_capacity(model, scaling)
    slices = list(slices)
    sizes = (
        lambda a: max(a.memory_mib / capacity, a.cores_percent / 100),
        lambda a: a.memory_mib / capacity + a.cores_percent / 100,
        lambda a: a.memory_mib,
        lambda a: a.cores_percent,
    )
    best: list[list[HamiAllocation]] | None = None
    for size in sizes:
        bins = [_HamiGpu(list(gpu)) for gpu in gpus]
        ordered = sorted(slices, key=lambda a: (-size(a), -a.memory_mib, -a.cores_percent, a.tenant))
        for allocation, same in itertools.groupby(ordered):
            left = sum(1 for _ in same)
            for gpu in bins:
                left -= gpu.add(allocation, left, capacity, split_count)
                if not left:
                    break
            while left:
                bins.append(_HamiGpu([]))
                placed = bins[-1].add(allocation, left, capacity, split_count)
                if not placed:  # the demand checks refuse such slices; never loop on one
                    raise ValueError(f"a HAMi slice of {allocation.memory_mib} MiB does not fit an empty {model.name}")
                left -= placed
        if best is None or len(bins) < len(best):
            best = [gpu.allocations for gpu in bins]
    return best


class _HamiGpu:
    """A GPU being packed, with its running totals."""

    def __init__(self, allocations: list[HamiAllocation]):
        self.allocations = allocations
        self.memory = sum(a.memory_mib for a in allocations)
        self.cores = sum(a.cores_percent for a in allocations)

    def add(self, allocation: HamiAllocation, most: int, capacity: int, split_count: int) -> int:
        """Place up to `most` copies of `allocation` (as many as fit); how many were placed."""
        room = min(
            split_count - len(self.allocations),
            (capacity - self.memory) // allocation.memory_mib,
            (100 - self.cores) // allocation.cores_percent,
        )
        placed = max(0, min(most, room))
        self.allocations.extend([allocation] * placed)
        self.memory += placed * allocation.memory_mib
        self.cores += placed * allocation.cores_percent
        return placed


def _hami_fits(allocations: Sequence[HamiAllocation], capacity: int, split_count: int) -> bool:
    return (
        len(allocations) <= split_count
        and sum(a.memory_mib for a in allocations) <= capacity
        and sum(a.cores_percent for a in allocations) <= 100
    )


def _pack_time_sliced(
    replicas_per_gpu: int, replicas: Mapping[str, int], gpus: Sequence[Sequence[TimeSliceShare]] = ()
) -> list[list[TimeSliceShare]]:
    """Fill the spare replicas of `gpus` (kept from a previous plan), then new GPUs one after the
    other, in tenant order: ceil(total / replicas per GPU) GPUs from scratch, the optimum. Tenants
    of one trust domain may share a GPU's replicas."""
    filled = [Counter({share.tenant: share.replicas for share in gpu}) for gpu in gpus]
    current = 0
    for tenant in sorted(replicas):
        left = replicas[tenant]
        while left:
            if current == len(filled):
                filled.append(Counter())
            take = min(left, replicas_per_gpu - sum(filled[current].values()))
            if take == 0:
                current += 1
                continue
            filled[current][tenant] += take
            left -= take
    return [[TimeSliceShare(t, n) for t, n in sorted(gpu.items())] for gpu in filled]


def hami_gpus(
    model: GpuModel,
    pool: PoolSpec,
    domain: str,
    scaling: float,
    slices: list[HamiAllocation],
    previous: list[tuple[Slot, GpuAssignment]],
) -> list[tuple[GpuAssignment, Slot | None]]:
    """The domain's HAMi GPUs of one memory scaling. Previous GPUs whose slices are all still
    wanted keep them and take new slices in their spare room, unless that costs GPUs."""
    capacity = hami_memory_capacity(model, scaling)
    remaining = Counter(slices)
    kept: list[tuple[Slot, GpuAssignment]] = []
    for slot, gpu in previous:
        held = Counter(gpu.hami)
        if all(remaining[a] >= n for a, n in held.items()) and _hami_fits(gpu.hami, capacity, pool.hami_split_count):
            remaining -= held
            kept.append((slot, gpu))
    packed = _pack_hami(model, pool.hami_split_count, scaling, remaining.elements(), [g.hami for _, g in kept])
    fresh = _pack_hami(model, pool.hami_split_count, scaling, slices)
    slots: list[Slot | None] = [slot for slot, _ in kept] + [None] * (len(packed) - len(kept))
    if len(packed) > len(fresh):
        packed, slots = fresh, [None] * len(fresh)  # keeping would cost GPUs: GPUs come first
    templates = [
        GpuAssignment(-1, "hami", domain, hami=tuple(sorted(gpu, key=_allocation_key)), hami_memory_scaling=scaling)
        for gpu in packed
    ]
    return list(zip(templates, slots))


def _allocation_key(allocation: HamiAllocation) -> tuple:
    return (allocation.tenant, -allocation.memory_mib, -allocation.cores_percent)


def time_sliced_gpus(
    replicas_per_gpu: int, domain: str, replicas: Counter[str], previous: list[tuple[Slot, GpuAssignment]]
) -> list[tuple[GpuAssignment, Slot | None]]:
    """The domain's time-sliced GPUs; previous GPUs keep their shares when that costs no GPU."""
    remaining = Counter(replicas)
    kept: list[tuple[Slot, GpuAssignment]] = []
    for slot, gpu in previous:
        held: Counter[str] = Counter()
        for share in gpu.time_slices:
            held[share.tenant] += share.replicas
        if sum(held.values()) <= replicas_per_gpu and all(remaining[t] >= n for t, n in held.items()):
            remaining -= held
            kept.append((slot, gpu))
    packed = _pack_time_sliced(replicas_per_gpu, remaining, [g.time_slices for _, g in kept])
    fresh = _pack_time_sliced(replicas_per_gpu, replicas)
    slots: list[Slot | None] = [slot for slot, _ in kept] + [None] * (len(packed) - len(kept))
    if len(packed) > len(fresh):
        packed, slots = fresh, [None] * len(fresh)
    return [
        (GpuAssignment(-1, "time-sliced", domain, time_slices=tuple(shares)), slot)
        for shares, slot in zip(packed, slots)
    ]
