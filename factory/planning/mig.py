"""MIG geometry: the exact packing of MIG instances onto the fewest GPUs, legal start slots, layout
checks, and the MIG GPUs of one trust domain (keeping previous GPUs where that costs none)."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ai_factory.factory.model.gpus import COMPUTE_SLICES, MEMORY_SLICES, MIG_CLASSES, GpuModel
from ai_factory.factory.planning.model import GpuAssignment, MigInstance, Slot


# Classes from largest to smallest; count vectors below follow this order.
MIG_CLASS_ORDER = ("c7m8", "c4m4", "c3m4", "c2m2", "c1m2", "c1m1", "c1m1_me")

# A lone 3g goes to start 4: at start 0 it takes memory 0-3, and the 1g instances that could use
# the 7th compute slice only start at 0..6, so one slice would be stranded
# (mig-profiles.yaml strand_compute_with_3g_at_0).
_START_PREFERENCE = {"c3m4": (4, 0)}


def mig_lower_bound(counts: Mapping[str, int]) -> int:
    """max(LB1, LB2, LB3) of mig-profiles.yaml for a demand given as instances per class.

    It can sit one below the optimum (3x4g, 7x2g, {5x2g, 1x3g, 2x4g}); `min_mig_gpus` is exact."""
    compute = sum(MIG_CLASSES[k].compute_slices * n for k, n in counts.items())
    memory = sum(MIG_CLASSES[k].memory_slices * n for k, n in counts.items())
    n7, n4, n3 = counts.get("c7m8", 0), counts.get("c4m4", 0), counts.get("c3m4", 0)
    return max(
        ceil_div(compute, COMPUTE_SLICES),
        ceil_div(memory, MEMORY_SLICES),
        n7 + n4 + ceil_div(max(0, n3 - n4), 2),
        max((ceil_div(n, MIG_CLASSES[k].max_count) for k, n in counts.items()), default=0),
    )


def min_mig_gpus(counts: Mapping[str, int]) -> int:
    """The exact minimum number of GPUs that hold the MIG instances `counts` (per class)."""
    return _solve(counts)[0]


def pack_mig_classes(counts: Mapping[str, int]) -> list[tuple[str, ...]]:
    """An optimal packing: one tuple of instance classes per GPU, fullest GPUs first."""
    total, split = _solve(counts)
    gpus = _build_gpus(counts, total, split)
    assert len(gpus) == total
    return gpus


def place_mig(classes: Sequence[str]) -> tuple[tuple[str, int], ...] | None:
    """Legal start slots for the instance classes of one GPU, as (class, start) pairs in start
    order, or None when they do not fit on one GPU."""
    if sum(MIG_CLASSES[k].compute_slices for k in classes) > COMPUTE_SLICES:
        return None
    if any(n > MIG_CLASSES[k].max_count for k, n in Counter(classes).items()):
        return None
    order = sorted(classes, key=lambda k: (-MIG_CLASSES[k].memory_slices, -MIG_CLASSES[k].compute_slices, k))
    used = [False] * MEMORY_SLICES
    starts: list[int] = []

    def place_from(i: int) -> bool:
        if i == len(order):
            return True
        geometry = MIG_CLASSES[order[i]]
        for start in _START_PREFERENCE.get(order[i], geometry.placements):
            span = range(start, start + geometry.memory_slices)
            if any(used[j] for j in span):
                continue
            for j in span:
                used[j] = True
            starts.append(start)
            if place_from(i + 1):
                return True
            starts.pop()
            for j in span:
                used[j] = False
        return False

    if not place_from(0):
        return None
    return tuple(sorted(zip(order, starts), key=lambda pair: (pair[1], pair[0])))


def mig_layout_problems(model: GpuModel, instances: Sequence[tuple[str, int]]) -> list[str]:
    """Why (profile, start) instances are not a legal layout of one `model` GPU (empty if legal)."""
    problems: list[str] = []
    occupied: dict[int, str] = {}
    compute = 0
    profiles = []
    for name, start in instances:
        try:
            profile = model.profile(name)
        except KeyError as error:
            problems.append(error.args[0])
            continue
        profiles.append(profile)
        compute += profile.compute_slices
        if start not in profile.placements:
            problems.append(f"{name} cannot start at memory slice {start} (legal starts: {profile.placements})")
            continue
        for slice_index in range(start, start + profile.memory_slices):
            if slice_index in occupied:
                problems.append(
                    f"{name}@{start} overlaps {occupied[slice_index]} on memory slice {slice_index}"
                )
                break
            occupied[slice_index] = f"{name}@{start}"
    if compute > COMPUTE_SLICES:
        problems.append(f"the instances use {compute} compute slices, more than {COMPUTE_SLICES}")
    memory = sum(p.memory_slices for p in profiles)
    if memory > MEMORY_SLICES:
        problems.append(f"the instances use {memory} memory slices, more than {MEMORY_SLICES}")
    for profile, count in sorted(Counter(profiles).items(), key=lambda item: item[0].name):
        if count > profile.max_count:
            problems.append(f"{count} x {profile.name} on one GPU, at most {profile.max_count} allowed")
    return problems


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# The exact packer. A GPU is described by its large instances (4g and 3g) and the "hole" they leave
# for the small ones (2g, 1g with two memory slices, 1g, 1g+me):
#   4g+3g (full) | 4g + hole(3 compute, 4 memory) | 3g+3g (full: 1 compute slice left, no memory)
#   3g + hole(4, 4) | empty hole(7, 8)          and every 7g alone on its GPU.
# In a hole with compute c and memory m (m - c is 1 for the odd holes 3/4 and 7/8, 0 for 4/4), small
# instances fit iff they fit in c "units" where a 2g costs 2, a 1g costs 1, and a two-memory-slice
# 1g costs 2 except the first one in an odd hole, which costs 1 (it uses the spare memory slice).
# For given counts of the five GPU kinds, feasibility is then a handful of aggregate inequalities
# (two-unit items by a greedy that fills free slots first; the 1g+me limit of one per GPU by Hall's
# condition), so the search is over the number of 3g+3g GPUs only: the number of 4g+3g GPUs can
# be taken as small as the GPU count allows, since it affects only the 1g+me conditions, and only
# for the worse. tests/test_planner.py checks the result against an independent brute force.


def _solve(counts: Mapping[str, int]) -> tuple[int, tuple[int, int, int] | None]:
    """(minimum GPUs, (4g+3g GPUs, 3g+3g GPUs, cheap two-slice 1g) for the non-7g part)."""
    unknown = set(counts) - set(MIG_CLASS_ORDER)
    if unknown:
        raise ValueError(f"unknown MIG classes {sorted(unknown)}")
    n7, n4, n3, n2, n12, n11, nme = (counts.get(k, 0) for k in MIG_CLASS_ORDER)
    rest = {k: n for k, n in counts.items() if k != "c7m8" and n}
    if not rest:
        return n7, None
    # Fitting in k GPUs is monotone in k: gallop up from the lower bound, then bisect.
    failed = mig_lower_bound(rest) - 1
    step = 1
    while (split := _find_split(failed + step, n4, n3, n2, n12, n11, nme)) is None:
        failed += step
        step *= 2
    fits, fitting_split = failed + step, split
    while fits - failed > 1:
        mid = (failed + fits) // 2
        split = _find_split(mid, n4, n3, n2, n12, n11, nme)
        if split is None:
            failed = mid
        else:
            fits, fitting_split = mid, split
    return n7 + fits, fitting_split


def _find_split(k: int, n4: int, n3: int, n2: int, n12: int, n11: int, nme: int) -> tuple[int, int, int] | None:
    # Fewest 3g+3g GPUs first: such a GPU strands a compute slice.
    for pairs33 in range(n3 // 2 + 1):
        pairs43_min = max(0, n4 + n3 - k - pairs33)
        pairs43_max = min(n4, n3 - 2 * pairs33)
        if pairs43_min > pairs43_max:
            continue
        cheap = _cheap_range(k, pairs43_min, pairs33, n4, n3, n2, n12, n11, nme)
        if cheap is None:
            continue
        cheap_1g2 = cheap[1]
        # Pair as many 4g with 3g as the 1g+me conditions allow (full GPUs, fewer distinct
        # geometries); feasibility only gets harder as the pairs grow, so bisect.
        low, high = pairs43_min, pairs43_max
        while low < high:
            mid = (low + high + 1) // 2
            bounds = _cheap_range(k, mid, pairs33, n4, n3, n2, n12, n11, nme)
            if bounds is not None and bounds[0] <= cheap_1g2 <= bounds[1]:
                low = mid
            else:
                high = mid - 1
        return low, pairs33, cheap_1g2
    return None


def _cheap_range(
    k: int, pairs43: int, pairs33: int, n4: int, n3: int, n2: int, n12: int, n11: int, nme: int
) -> tuple[int, int] | None:
    """Feasible numbers of two-slice 1g placed in the cheap slot of an odd hole, or None."""
    holes3 = n4 - pairs43  # 4g + hole(3, 4)
    holes4 = n3 - pairs43 - 2 * pairs33  # 3g + hole(4, 4)
    holes7 = k - n4 - n3 + pairs43 + pairs33  # empty GPU: hole(7, 8)
    if min(holes3, holes4, holes7) < 0:
        return None
    holes = holes3 + holes4 + holes7
    odd_holes = holes3 + holes7
    units = 3 * holes3 + 4 * holes4 + 7 * holes7
    pair_slots = holes3 + 2 * holes4 + 3 * holes7
    # Two-unit items placed here leave every hole's room for 1g+me and the cheap 1g intact.
    free_pair_slots = 2 * holes7 + holes4
    # Room for "special" one-unit items (cheap 1g: odd holes only; 1g+me: one per hole) before any
    # two-unit item: min(units, 2) in an odd hole, min(units, 1) in an even one.
    special_room = 2 * odd_holes + holes4
    small = n2 + n12
    if nme > holes or small - free_pair_slots + nme > special_room:
        return None
    low = max(
        0,
        small - pair_slots,
        2 * small + n11 + nme - units,
        small - free_pair_slots - odd_holes - (holes - nme),
    )
    high = min(n12, odd_holes, special_room - nme)
    return (low, high) if low <= high else None


@dataclass
class _Hole:
    base: tuple[str, ...]
    units: int
    odd: bool
    small: list[str] = dataclasses.field(default_factory=list)

    def add(self, klass: str, cost: int) -> None:
        assert self.units >= cost
        self.small.append(klass)
        self.units -= cost


def _build_gpus(counts: Mapping[str, int], total: int, split: tuple[int, int, int] | None) -> list[tuple[str, ...]]:
    n7, n4, n3, n2, n12, n11, nme = (counts.get(k, 0) for k in MIG_CLASS_ORDER)
    gpus: list[tuple[str, ...]] = [("c7m8",)] * n7
    if split is None:
        return gpus
    pairs43, pairs33, cheap_1g2 = split
    k = total - n7
    gpus += [("c4m4", "c3m4")] * pairs43 + [("c3m4", "c3m4")] * pairs33
    holes7 = [_Hole((), 7, True) for _ in range(k - n4 - n3 + pairs43 + pairs33)]
    holes4 = [_Hole(("c3m4",), 4, False) for _ in range(n3 - pairs43 - 2 * pairs33)]
    holes3 = [_Hole(("c4m4",), 3, True) for _ in range(n4 - pairs43)]
    holes = holes7 + holes4 + holes3
    # Two-unit items: slots that keep special room first (see _cheap_range), then the rest.
    slots = [h for h in holes7 for _ in (0, 1)] + holes4 + holes7 + holes3 + holes4
    pair_items = ["c2m2"] * n2 + ["c1m2"] * (n12 - cheap_1g2)
    assert len(pair_items) <= len(slots)
    for klass, hole in zip(pair_items, slots):
        hole.add(klass, 2)
    # 1g+me where it costs no cheap slot first.
    me_order = (
        [h for h in holes if not h.odd and h.units >= 1]
        + [h for h in holes if h.odd and h.units >= 2]
        + [h for h in holes if h.odd and h.units == 1]
    )
    assert len(me_order) >= nme
    for hole in me_order[:nme]:
        hole.add("c1m1_me", 1)
    cheap_holes = [h for h in holes if h.odd and h.units >= 1]
    assert len(cheap_holes) >= cheap_1g2
    for hole in cheap_holes[:cheap_1g2]:
        hole.add("c1m2", 1)
    remaining = n11
    for hole in holes:
        take = min(remaining, hole.units)
        for _ in range(take):
            hole.add("c1m1", 1)
        remaining -= take
    assert remaining == 0
    gpus += [hole.base + tuple(hole.small) for hole in holes]
    return sorted((_canonical(g) for g in gpus), key=_fullness_key)


def _canonical(classes: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(classes, key=MIG_CLASS_ORDER.index))


def _fullness_key(classes: tuple[str, ...]) -> tuple:
    compute = sum(MIG_CLASSES[k].compute_slices for k in classes)
    memory = sum(MIG_CLASSES[k].memory_slices for k in classes)
    return (-compute, -memory, tuple(-classes.count(k) for k in MIG_CLASS_ORDER))


def mig_gpus(
    model: GpuModel, domain: str, demand: Counter[tuple[str, str]], previous: list[tuple[Slot, GpuAssignment]]
) -> list[tuple[GpuAssignment, Slot | None]]:
    """The domain's MIG GPUs: an exact packing that keeps as many previous GPUs as possible
    without using more GPUs than the optimum."""
    klass = {p.name: p.klass for p in model.mig_profiles}

    def classes(instances: Counter[tuple[str, str]]) -> Counter[str]:
        counts: Counter[str] = Counter()
        for (_, profile), n in instances.items():
            counts[klass[profile]] += n
        return counts

    optimum = min_mig_gpus(classes(demand))
    remaining = Counter(demand)
    candidates = []
    for slot, gpu in previous:
        held = Counter((i.tenant, i.profile) for i in gpu.mig)
        if all(remaining[key] >= n for key, n in held.items()):
            remaining -= held
            candidates.append((slot, gpu, held))
    candidates.sort(key=lambda c: (_fullness_key(_canonical(klass[i.profile] for i in c[1].mig)), c[0]))

    def rest_after(kept: int) -> Counter[tuple[str, str]]:
        rest = Counter(demand)
        for _, _, held in candidates[:kept]:
            rest -= held
        return rest

    # kept + optimum(rest) never decreases as more GPUs are kept: bisect the longest prefix.
    low, high = 0, len(candidates)
    while low < high:
        mid = (low + high + 1) // 2
        if mid + min_mig_gpus(classes(rest_after(mid))) == optimum:
            low = mid
        else:
            high = mid - 1
    rest = rest_after(low)
    new = _assign_mig(model, domain, pack_mig_classes(classes(rest)), rest)
    return [(gpu, slot) for slot, gpu, _ in candidates[:low]] + [(gpu, None) for gpu in new]


def _assign_mig(
    model: GpuModel, domain: str, layouts: list[tuple[str, ...]], demand: Counter[tuple[str, str]]
) -> list[GpuAssignment]:
    """Place each layout and give its instances to tenants, in tenant order, so a tenant's
    instances stay on as few GPUs as possible."""
    profile = {p.klass: p.name for p in model.mig_profiles}
    queues: dict[str, list[str]] = defaultdict(list)
    for (tenant, name), n in sorted(demand.items(), reverse=True):
        queues[name].extend([tenant] * n)  # reversed, popped from the end
    gpus = []
    for layout in layouts:
        placed = place_mig(layout)
        assert placed is not None, layout
        instances = tuple(MigInstance(profile[k], start, queues[profile[k]].pop()) for k, start in placed)
        problems = mig_layout_problems(model, [(i.profile, i.start) for i in instances])
        assert not problems, problems
        gpus.append(GpuAssignment(-1, "mig", domain, mig=instances))
    return gpus
