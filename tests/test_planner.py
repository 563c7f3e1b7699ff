"""The capacity planner: MIG legality and exact packing, trust isolation, errors, stability."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import Counter
from functools import lru_cache

import pytest

from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.planning.mig import (
    MIG_CLASS_ORDER,
    mig_layout_problems,
    mig_lower_bound,
    min_mig_gpus,
    pack_mig_classes,
    place_mig,
)
from ai_factory.factory.planning.model import Demand, HamiSlice, Plan, PlanError, PoolSpec, TenantSpec
from ai_factory.factory.planning.planner import plan

H100 = GPU_MODELS["H100-80GB"]


def pool(name: str, model: str, sharing: str, nodes: int, per_node: int = 8, **options) -> PoolSpec:
    return PoolSpec(name, model, per_node, tuple(f"{name}-{i:02d}" for i in range(nodes)), sharing, **options)


def tenant(name: str, *demands: Demand, trust: str = "high", domain: str | None = None) -> TenantSpec:
    return TenantSpec(name, trust, domain or name, demands)


def mig(pool_name: str, profiles: dict[str, int]) -> Demand:
    return Demand(pool_name, mig=tuple(profiles.items()))


def all_gpus(p: Plan):
    for pool_plan in p.pools:
        for node in pool_plan.nodes:
            for gpu in node.gpus:
                yield pool_plan, node, gpu


def tenants_on(gpu) -> set[str]:
    return (
        {i.tenant for i in gpu.mig}
        | {a.tenant for a in gpu.hami}
        | {s.tenant for s in gpu.time_slices}
        | ({gpu.owner} if gpu.owner else set())
    )


# --------------------------------------------------------------------------- MIG layouts


@pytest.mark.parametrize(
    ("instances", "problem"),
    [
        ([("7g.80gb", 0)], None),
        ([("4g.40gb", 0), ("3g.40gb", 4)], None),
        ([("3g.40gb", 0), ("3g.40gb", 4)], None),
        ([("1g.10gb", s) for s in range(7)], None),
        ([("1g.10gb+me", 0)] + [("1g.10gb", s) for s in range(1, 7)], None),
        ([("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.20gb", 6)], None),
        ([("1g.20gb", s) for s in (0, 2, 4, 6)], None),
        ([("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)], None),
        ([("1g.10gb+me", 0), ("1g.10gb+me", 1)], "2 x 1g.10gb+me on one GPU, at most 1 allowed"),
        ([("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("2g.20gb", 6)], "8 compute slices, more than 7"),
        ([("4g.40gb", 0), ("4g.40gb", 4)], "8 compute slices, more than 7"),
        ([("3g.40gb", 4), ("2g.20gb", 4)], "2g.20gb@4 overlaps 3g.40gb@4 on memory slice 4"),
        ([("1g.20gb", 2), ("1g.10gb", 3)], "1g.10gb@3 overlaps 1g.20gb@2 on memory slice 3"),
        ([("7g.80gb", 0), ("1g.10gb", 6)], "overlaps 7g.80gb@0"),
        ([("3g.40gb", 2)], "3g.40gb cannot start at memory slice 2"),
        ([("1g.10gb", 7)], "1g.10gb cannot start at memory slice 7"),
        ([("3g.20gb", 0)], "no MIG profile '3g.20gb'"),
    ],
)
def test_layout_legality(instances, problem):
    problems = mig_layout_problems(H100, instances)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_a_lone_3g_starts_at_slice_4():
    assert place_mig(("c3m4", "c1m1", "c1m1")) == (("c1m1", 0), ("c1m1", 1), ("c3m4", 4))
    assert dict(place_mig(("c3m4", "c2m2", "c1m1", "c1m1")))["c3m4"] == 4


# --------------------------------------------------------------------------- exact packing

# The placement table of mig-profiles.yaml written out again, so that the brute force below
# shares no code with the planner: class -> (compute slices, memory slices, legal starts).
TABLE = {
    "c7m8": (7, 8, (0,)),
    "c4m4": (4, 4, (0,)),
    "c3m4": (3, 4, (0, 4)),
    "c2m2": (2, 2, (0, 2, 4)),
    "c1m2": (1, 2, (0, 2, 4, 6)),
    "c1m1": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "c1m1_me": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
}
CLASSES = tuple(TABLE)


def fits_one_gpu(instances: tuple[str, ...]) -> bool:
    """By trying every placement: disjoint memory ranges at legal starts, <= 7 compute, <= 1 +me."""
    if sum(TABLE[k][0] for k in instances) > 7 or instances.count("c1m1_me") > 1:
        return False

    def place(i: int, used: frozenset[int]) -> bool:
        if i == len(instances):
            return True
        _, size, starts = TABLE[instances[i]]
        return any(
            not used & set(range(s, s + size)) and place(i + 1, used | set(range(s, s + size))) for s in starts
        )

    return place(0, frozenset())


def _one_gpu_vectors() -> list[tuple[int, ...]]:
    vectors = set()
    for size in range(1, 9):
        for instances in itertools.combinations_with_replacement(CLASSES, size):
            if fits_one_gpu(instances):
                vectors.add(tuple(instances.count(k) for k in CLASSES))
    return sorted(vectors)


ONE_GPU = _one_gpu_vectors()


@lru_cache(maxsize=None)
def brute_force_gpus(demand: tuple[int, ...]) -> int:
    """Fewest GPUs: the GPU holding the first remaining class takes any feasible content."""
    if not any(demand):
        return 0
    first = next(i for i, n in enumerate(demand) if n)
    return 1 + min(
        brute_force_gpus(tuple(d - c for d, c in zip(demand, content)))
        for content in ONE_GPU
        if content[first] and all(c <= d for c, d in zip(content, demand))
    )


def as_counts(vector: tuple[int, ...]) -> dict[str, int]:
    return {k: n for k, n in zip(CLASSES, vector) if n}


def test_feasible_single_gpu_sets_match_the_reference_count():
    base = [v for v in ONE_GPU if v[CLASSES.index("c1m1_me")] == 0]
    assert len(base) == 77  # mig-profiles.yaml equivalence_for_planner


def test_placement_agrees_with_the_sum_rule_and_the_brute_force():
    for size in range(1, 9):
        for instances in itertools.combinations_with_replacement(CLASSES, size):
            by_sums = (
                sum(TABLE[k][0] for k in instances) <= 7
                and sum(TABLE[k][1] for k in instances) <= 8
                and instances.count("c1m1_me") <= 1
            )
            assert fits_one_gpu(instances) == by_sums == (place_mig(instances) is not None), instances


@pytest.mark.parametrize(
    ("demand", "slice_bound", "optimum"),
    [
        ({"c4m4": 3}, 2, 3),
        ({"c2m2": 7}, 2, 3),
        ({"c2m2": 5, "c3m4": 1, "c4m4": 2}, 3, 4),
    ],
)
def test_counter_examples_are_packed_optimally(demand, slice_bound, optimum):
    compute = sum(TABLE[k][0] * n for k, n in demand.items())
    memory = sum(TABLE[k][1] * n for k, n in demand.items())
    assert max(-(-compute // 7), -(-memory // 8)) == slice_bound
    assert min_mig_gpus(demand) == optimum == brute_force_gpus(tuple(demand.get(k, 0) for k in CLASSES))
    assert mig_lower_bound(demand) <= optimum


def test_counter_example_through_the_planner_reports_the_gap():
    demand = mig("h100", {"2g.20gb": 5, "3g.40gb": 1, "4g.40gb": 2})
    p = plan([pool("h100", "H100-80GB", "mig", 1)], [tenant("acme", demand)])
    (row,) = p.figures
    assert (row.gpus_used, row.lower_bound, row.gap) == (4, 3, 1)


def _check_packing(vector: tuple[int, ...]) -> None:
    counts = as_counts(vector)
    expected = brute_force_gpus(vector)
    assert min_mig_gpus(counts) == expected, counts
    gpus = pack_mig_classes(counts)
    assert len(gpus) == expected
    assert Counter(k for gpu in gpus for k in gpu) == Counter(counts)
    assert all(fits_one_gpu(gpu) for gpu in gpus), gpus


def test_exact_on_every_small_demand():
    for vector in itertools.product(range(2), range(3), range(3), range(4), range(3), range(4), range(3)):
        _check_packing(vector)


def test_exact_on_random_demands():
    rng = random.Random(20240611)
    for _ in range(1500):
        _check_packing(tuple(rng.randint(0, top) for top in (1, 5, 6, 7, 7, 12, 5)))


def test_planner_class_order_is_the_catalogs():
    assert set(MIG_CLASS_ORDER) == set(CLASSES) == {p.klass for p in H100.mig_profiles}


# --------------------------------------------------------------------------- trust


def mixed_fleet() -> tuple[list[PoolSpec], list[TenantSpec]]:
    pools = [
        pool("h100", "H100-80GB", "mig", 6),
        pool("l40s", "L40S-48GB", "hami", 6, per_node=4),
        pool("l4", "L4-24GB", "time-slicing", 4),
        pool("b200", "B200-180GB", "exclusive", 6, per_node=4),
    ]
    tenants = [
        tenant(
            "acme",
            mig("h100", {"1g.10gb": 9, "3g.40gb": 3}),
            Demand("h100", whole_gpus=3),
            Demand("b200", whole_gpus=3),
        ),
        tenant("acme-eval", mig("h100", {"4g.40gb": 3}), Demand("l4", time_sliced_replicas=5), domain="acme"),
        tenant(
            "beta",
            mig("h100", {"2g.20gb": 7}),
            Demand("l40s", hami=(HamiSlice(5, 20000, 30),)),
            Demand("b200", whole_gpus=2),
        ),
        tenant(
            "gamma",
            Demand("l40s", hami=(HamiSlice(3, 8000, 20),)),
            Demand("l4", time_sliced_replicas=3),
            trust="medium",
        ),
        tenant("mallory", Demand("b200", whole_gpus=3), trust="low"),
        tenant("trent", Demand("h100", whole_gpus=5), trust="low"),
    ]
    return pools, tenants


def test_trust_domains_never_share_a_gpu_or_a_shared_node():
    pools, tenants = mixed_fleet()
    domain_of = {t.name: t.trust_domain for t in tenants}
    p = plan(pools, tenants)
    for pool_plan in p.pools:
        for node in pool_plan.nodes:
            busy = [gpu for gpu in node.gpus if gpu.mode != "idle"]
            for gpu in busy:
                assert {domain_of[t] for t in tenants_on(gpu)} == {gpu.trust_domain}, (node.name, gpu)
            if any(gpu.mode in ("mig", "hami", "time-sliced") for gpu in busy):
                assert node.trust_domain is not None
                assert {gpu.trust_domain for gpu in node.gpus} == {node.trust_domain}, node.name


def test_whole_gpus_of_trusted_domains_may_share_a_node():
    p = plan(
        [pool("b200", "B200-180GB", "exclusive", 1)],
        [tenant("acme", Demand("b200", whole_gpus=3)), tenant("beta", Demand("b200", whole_gpus=5), trust="medium")],
    )
    (node,) = p.pool("b200").nodes
    assert node.trust_domain is None
    assert Counter(gpu.owner for gpu in node.gpus) == {"acme": 3, "beta": 5}


@pytest.mark.parametrize(
    "demand",
    [
        mig("h100", {"1g.10gb": 1}),
        Demand("l40s", hami=(HamiSlice(1, 1000, 10),)),
        Demand("l4", time_sliced_replicas=2),
    ],
)
def test_low_trust_tenants_get_whole_gpus_only(demand):
    pools, _ = mixed_fleet()
    with pytest.raises(PlanError) as error:
        plan(pools, [tenant("mallory", demand, trust="low")])
    assert f"tenant 'mallory' on pool '{demand.pool}': low-trust tenants get whole GPUs only" in error.value.problems[0]


def test_low_trust_tenants_get_dedicated_nodes_and_their_idle_gpus_are_reported():
    pools, tenants = mixed_fleet()
    p = plan(pools, tenants)
    for name, pool_name, count in (("mallory", "b200", 3), ("trent", "h100", 5)):
        nodes = [n for n in p.pool(pool_name).nodes if any(g.owner == name for g in n.gpus)]
        assert [n.dedicated_tenant for n in nodes] == [name]
        assert {g.owner for g in nodes[0].gpus} == {name, None}
        row = next(f for f in p.figures if f.pool == pool_name and f.trust_domain == name)
        idle = len(nodes[0].gpus) - count
        assert row.idle_gpus_by_tenant == ((name, idle),) and row.idle_gpus == idle
    assert ("mallory", 1) in p.fleet_figures.idle_gpus_by_tenant


def test_whole_gpus_of_a_domain_fill_its_own_mig_nodes_first():
    p = plan(
        [pool("h100", "H100-80GB", "mig", 2)],
        [tenant("acme", mig("h100", {"7g.80gb": 5}), Demand("h100", whole_gpus=3))],
    )
    first, second = p.pool("h100").nodes
    assert [g.mode for g in first.gpus] == ["mig"] * 5 + ["whole"] * 3
    assert first.trust_domain == "acme" and all(g.mode == "idle" for g in second.gpus)


# --------------------------------------------------------------------------- problems


def test_shortfall_names_tenant_resource_and_shortfall_and_lists_every_problem():
    pools = [
        pool("h100", "H100-80GB", "mig", 3, per_node=1),
        pool("l40s", "L40S-48GB", "hami", 1, per_node=1),
        pool("b200", "B200-180GB", "exclusive", 2, per_node=4),
    ]
    tenants = [
        tenant("acme", mig("h100", {"3g.40gb": 9})),
        tenant("beta", Demand("l40s", hami=(HamiSlice(1, 50000, 10),))),
        tenant("gamma", Demand("b200", whole_gpus=4)),
        tenant("mallory", Demand("b200", whole_gpus=6), trust="low"),
        tenant("zed", mig("nowhere", {"1g.10gb": 1})),
    ]
    with pytest.raises(PlanError) as error:
        plan(pools, tenants)
    problems = error.value.problems
    expected = [
        "tenant 'acme' on pool 'h100': needs 9 nvidia.com/mig-3g.40gb, the pool can supply 6 to trust domain 'acme' (short 3)",
        "tenant 'beta' on pool 'l40s': a HAMi slice of 50000 MiB does not fit on one L40S-48GB GPU",
        "tenant 'gamma' on pool 'b200': needs 4 nvidia.com/gpu, the pool can supply 0 to trust domain 'gamma' (short 4)",
        "tenant 'zed' on pool 'nowhere': unknown pool",
        "pool 'h100': the demands need 5 nodes of 1 GPUs, the pool has 3 (short 2)",
        "pool 'b200': the demands need 3 nodes of 4 GPUs, the pool has 2 (short 1)",
    ]
    for text in expected:
        assert any(p.startswith(text) for p in problems), (text, problems)
    assert len(problems) == len(expected)
    assert str(error.value).startswith(f"{len(expected)} planning problem(s):")


@pytest.mark.parametrize(
    ("demand", "problem"),
    [
        (mig("b200", {"1g.23gb": 1}), "a pool with sharing 'exclusive' does not serve mig demands"),
        (Demand("h100", hami=(HamiSlice(1, 1000, 10),)), "a pool with sharing 'mig' does not serve hami demands"),
        (Demand("l40s", whole_gpus=1), "a pool with sharing 'hami' does not serve whole demands"),
        (Demand("l4", whole_gpus=1), "a pool with sharing 'time-slicing' does not serve whole demands"),
        (Demand("h100", whole_gpus=1, mig=(("1g.10gb", 1),)), "sets exactly one of whole_gpus, mig, hami"),
        (Demand("h100"), "this one sets none"),
        (mig("h100", {"1g.5gb": 1}), "no MIG profile '1g.5gb'"),
        (mig("h100", {"1g.10gb": 0}), "count must be positive"),
        (Demand("b200", whole_gpus=-2), "whole_gpus must be positive"),
        (Demand("l40s", hami=(HamiSlice(1, 1000, 101),)), "cores_percent in 1..100"),
        (Demand("b200", whole_gpus=1, hami_oversubscribe=True), "apply to HAMi demands only"),
        (Demand("l40s", hami=(HamiSlice(1, 1000, 10),), hami_memory_scaling=0.5), "must be at least 1"),
    ],
)
def test_invalid_demands(demand, problem):
    pools, _ = mixed_fleet()
    with pytest.raises(PlanError) as error:
        plan(pools, [tenant("acme", demand)])
    assert any(problem in p for p in error.value.problems), error.value.problems


def test_invalid_pools():
    with pytest.raises(PlanError) as error:
        plan(
            [
                pool("l4", "L4-24GB", "mig", 1),
                PoolSpec("x", "H100-80GB", 8, ("n1", "n1"), "mig"),
                PoolSpec("y", "H100-80GB", 8, ("l4-00",), "mig"),
                pool("z", "V100", "exclusive", 1),
            ],
            [tenant("acme", Demand("l4", whole_gpus=1))],
        )
    assert error.value.problems == [
        "pool 'l4': sharing 'mig' needs a MIG-capable GPU, L4-24GB has no MIG",
        "pool 'x': node 'n1' is listed 2 times",
        "pool 'y': node 'l4-00' is also in pool 'l4'",
        "pool 'z': unknown GPU model 'V100'; known: " + ", ".join(sorted(GPU_MODELS)),
    ]


# --------------------------------------------------------------------------- HAMi


def test_hami_memory_oversubscription_is_off_by_default():
    hami_pool = [pool("l40s", "L40S-48GB", "hami", 4, per_node=4)]
    slices = (HamiSlice(6, 20000, 10),)
    with pytest.raises(PlanError) as error:
        plan(hami_pool, [tenant("acme", Demand("l40s", hami=slices, hami_memory_scaling=1.5))])
    assert "stays off unless the tenant opts in" in error.value.problems[0]

    memory = GPU_MODELS["L40S-48GB"].memory_mib
    p = plan(hami_pool, [tenant("acme", Demand("l40s", hami=slices))])
    hami_gpus = [gpu for _, _, gpu in all_gpus(p) if gpu.mode == "hami"]
    assert len(hami_gpus) == 3 and all(sum(a.memory_mib for a in g.hami) <= memory for g in hami_gpus)
    assert {g.hami_memory_scaling for g in hami_gpus} == {1.0}
    assert p.figures[0].hami_memory_oversubscription <= 1.0


def test_hami_oversubscription_only_for_the_tenant_that_opted_in():
    p = plan(
        [pool("l40s", "L40S-48GB", "hami", 4, per_node=4)],
        [
            tenant(
                "acme",
                Demand("l40s", hami=(HamiSlice(6, 20000, 10),), hami_oversubscribe=True, hami_memory_scaling=1.5),
            ),
            tenant("acme-ci", Demand("l40s", hami=(HamiSlice(2, 20000, 10),)), domain="acme"),
        ],
    )
    by_tenant = {}
    for _, node, gpu in all_gpus(p):
        for t in tenants_on(gpu):
            by_tenant.setdefault(t, set()).add((node.name, gpu.hami_memory_scaling))
    assert {scaling for _, scaling in by_tenant["acme"]} == {1.5}
    assert {scaling for _, scaling in by_tenant["acme-ci"]} == {1.0}
    # HAMi memory scaling is a node setting: the two never share a node.
    assert not {n for n, _ in by_tenant["acme"]} & {n for n, _ in by_tenant["acme-ci"]}
    (row,) = p.figures
    assert row.hami_memory_oversubscription == pytest.approx(60000 / GPU_MODELS["L40S-48GB"].memory_mib, abs=1e-6)
    assert p.supply("l40s", "acme")["nvidia.com/gpumem"] == 2 * int(46068 * 1.5) + 46068


# --------------------------------------------------------------------------- outputs


def test_same_input_gives_the_same_json_whatever_the_input_order():
    pools, tenants = mixed_fleet()
    first = plan(pools, tenants).to_json()
    assert plan(pools, tenants).to_json() == first
    shuffled = [dataclasses.replace(t, demands=tuple(reversed(t.demands))) for t in reversed(tenants)]
    reordered = [dataclasses.replace(p, nodes=tuple(reversed(p.nodes))) for p in reversed(pools)]
    assert plan(reordered, shuffled).to_json() == first


def test_json_round_trip():
    pools, tenants = mixed_fleet()
    p = plan(pools, tenants)
    assert Plan.from_json(p.to_json()) == p


def test_capacity_and_supply():
    pools, tenants = mixed_fleet()
    p = plan(pools, tenants)
    assert p.tenant_capacity("acme") == {
        ("b200", "nvidia.com/gpu"): 3,
        ("h100", "nvidia.com/gpu"): 3,
        ("h100", "nvidia.com/mig-1g.10gb"): 9,
        ("h100", "nvidia.com/mig-3g.40gb"): 3,
    }
    assert p.tenant_capacity("beta")[("l40s", "nvidia.com/gpumem")] == 100000
    assert p.tenant_capacity("gamma")[("l4", "nvidia.com/gpu")] == 3
    assert p.supply("h100", "acme") == {
        "nvidia.com/gpu": 3,
        "nvidia.com/mig-1g.10gb": 9,
        "nvidia.com/mig-3g.40gb": 3,
        "nvidia.com/mig-4g.40gb": 3,
    }
    # Quotas written from tenant capacity never exceed what the plan creates for the domain.
    for (pool_name, resource), amount in p.tenant_capacity("beta").items():
        assert amount <= p.supply(pool_name, "beta")[resource]


def test_figures():
    pools, tenants = mixed_fleet()
    p = plan(pools, tenants)
    rows = {(f.pool, f.trust_domain): f for f in p.figures}
    acme = rows["h100", "acme"]
    # 9x1g.10gb + 3x3g.40gb + 3x4g.40gb: 3 full 4g+3g GPUs, 9 1g on two: 5 GPUs, plus 3 whole.
    assert (acme.gpus_used, acme.lower_bound, acme.gap) == (8, 8, 0)
    assert (acme.stranded_compute_slices, acme.stranded_memory_slices) == (5, 7)
    assert rows["l4", "acme"].lower_bound == 2 and rows["l4", "gamma"].lower_bound == 1
    assert rows["b200", "mallory"].utilisation == 1.0
    fleet = p.fleet_figures
    assert fleet.gpus_used == sum(f.gpus_used for f in p.figures)
    assert fleet.lower_bound == sum(f.lower_bound for f in p.pool_figures)
    assert 0 < fleet.utilisation <= 1


def test_every_gpu_is_used_idle_or_free_exactly_once():
    pools, tenants = mixed_fleet()
    p = plan(pools, tenants)
    for pool_plan, row in zip(p.pools, p.pool_figures):
        gpus = [g for n in pool_plan.nodes for g in n.gpus]
        assert (row.gpus_used, row.idle_gpus, row.free_gpus) == (
            sum(g.mode != "idle" for g in gpus),
            sum(g.mode == "idle" and g.trust_domain is not None for g in gpus),
            sum(g.mode == "idle" and g.trust_domain is None for g in gpus),
        )
        assert row.gpus == len(gpus)
        domains = [f for f in p.figures if f.pool == pool_plan.name]
        assert row.idle_gpus == sum(f.idle_gpus for f in domains) and all(f.free_gpus == 0 for f in domains)
        assert row.free_nodes == sum(all(g.mode == "idle" and g.trust_domain is None for g in n.gpus) for n in pool_plan.nodes)
        assert row.nodes_used + row.free_nodes == len(pool_plan.nodes)
    assert p.fleet_figures.gpus == sum(len(pool.nodes) * pool.gpus_per_node for pool in pools)
    assert p.fleet_figures.free_gpus > 0  # l40s, l4 and b200 have room left: it must show


def test_a_domain_counts_the_nodes_it_has_gpus_on_owned_or_not():
    # Whole GPUs are owned GPU by GPU: beta holds b200 GPUs on a node no domain owns.
    pools, tenants = mixed_fleet()
    p = plan(pools, tenants)
    beta = next(f for f in p.figures if (f.pool, f.trust_domain) == ("b200", "beta"))
    held = [n for n in p.pool("b200").nodes if any(g.trust_domain == "beta" for g in n.gpus)]
    assert beta.nodes_used == len(held) >= 1
    assert all(n.trust_domain is None for n in held)


def test_mig_configs_are_legal_and_filtered_by_device():
    pools, tenants = mixed_fleet()
    p = plan(pools, tenants)
    configs = p.mig_configs()
    for node in p.pool("h100").nodes:
        assert p.node_mig_config(node.name) == node.mig_config
        entries = configs[node.mig_config]
        assert sorted(i for e in entries for i in e["devices"]) == list(range(8))
        for entry in entries:
            assert entry["device-filter"] == list(H100.pci_device_ids)
            for index in entry["devices"]:
                gpu = node.gpus[index]
                assert Counter(i.profile for i in gpu.mig) == Counter(entry.get("mig-devices", {}))
                assert entry["mig-enabled"] == (gpu.mode == "mig")
            if entry["mig-enabled"]:
                classes = [H100.profile(name).klass for name, n in entry["mig-devices"].items() for _ in range(n)]
                assert place_mig(classes) is not None
    geometries = {}
    for node in p.pool("h100").nodes:
        geometry = tuple(tuple(sorted(i.profile for i in g.mig)) for g in node.gpus)
        assert geometries.setdefault(geometry, node.mig_config) == node.mig_config
    assert len(set(geometries.values())) == len(geometries)
    assert p.node_mig_config("b200-00") is None


# --------------------------------------------------------------------------- re-planning


def test_replanning_with_one_more_tenant_keeps_existing_gpus():
    pools, tenants = mixed_fleet()
    before = Plan.from_json(plan(pools, tenants).to_json())
    newcomers = [
        tenant("delta", mig("h100", {"3g.40gb": 2}), Demand("b200", whole_gpus=1)),
        tenant("acme-batch", mig("h100", {"7g.80gb": 1}), domain="acme"),
        tenant("gamma-2", Demand("l4", time_sliced_replicas=1), domain="gamma"),
        tenant("gamma-3", Demand("l40s", hami=(HamiSlice(1, 4000, 10),)), domain="gamma"),
        tenant("beta-2", Demand("l40s", hami=(HamiSlice(1, 20000, 30),)), domain="beta"),
    ]
    for newcomer in newcomers:
        after = plan(pools, [*tenants, newcomer], previous=before)
        assert after.changed_gpus == 0, newcomer.name
        now = {(pp.name, n.name, g.index): g for pp, n, g in all_gpus(after)}
        for pp, n, g in all_gpus(before):
            if g.mode != "idle":
                assert_keeps(g, now[pp.name, n.name, g.index])
        assert newcomer.name in {t for _, _, g in all_gpus(after) for t in tenants_on(g)}


def assert_keeps(before, after) -> None:
    """Everything `before` gave its tenants is still there (new work may use spare room)."""
    assert (after.mode, after.trust_domain, after.owner, after.mig) == (
        before.mode,
        before.trust_domain,
        before.owner,
        before.mig,
    )
    assert not Counter(before.hami) - Counter(after.hami)
    assert not Counter({s.tenant: s.replicas for s in before.time_slices}) - Counter(
        {s.tenant: s.replicas for s in after.time_slices}
    )


def test_replanning_never_keeps_a_layout_at_the_cost_of_a_gpu():
    mig_pool = [pool("h100", "H100-80GB", "mig", 1)]
    before = plan(mig_pool, [tenant("acme", mig("h100", {"4g.40gb": 1}))])
    after = plan(
        mig_pool,
        [tenant("acme", mig("h100", {"4g.40gb": 1})), tenant("acme-2", mig("h100", {"3g.40gb": 1}), domain="acme")],
        previous=before,
    )
    assert after.figures[0].gpus_used == 1 and after.changed_gpus == 1


def test_replanning_moves_whole_gpus_only_when_the_pool_is_otherwise_short():
    mig_pool = [pool("h100", "H100-80GB", "mig", 2)]
    tenants = [
        tenant("acme", mig("h100", {"7g.80gb": 5}), Demand("h100", whole_gpus=3)),
        tenant("beta", Demand("h100", whole_gpus=6)),
    ]
    before = plan(mig_pool, tenants)
    assert [n.trust_domain for n in before.pool("h100").nodes] == ["acme", None]
    grown = [tenant("acme", mig("h100", {"7g.80gb": 6}), Demand("h100", whole_gpus=3)), tenants[1]]
    after = plan(mig_pool, grown, previous=before)
    # Keeping acme's three whole GPUs on its node would need a third node: one of them moves.
    assert after.changed_gpus == 1
    assert Counter(g.owner for g in after.pool("h100").nodes[1].gpus) == {"beta": 6, "acme": 1, None: 1}
    roomy = [pool("h100", "H100-80GB", "mig", 3)]
    after = plan(roomy, grown, previous=plan(roomy, tenants))
    assert after.changed_gpus == 0 and after.figures[0].nodes_used == 2


def test_replanning_the_same_demand_changes_nothing():
    pools, tenants = mixed_fleet()
    before = plan(pools, tenants)
    after = plan(pools, tenants, previous=before)
    assert after.changed_gpus == 0
    assert after.pools == before.pools
