"""Queue quotas from the plan (`ai_factory.factory.planning.quotas`): they add up to the supply, stay in their trust
domain and follow the tenants' borrowing settings, for Kueue, KAI Scheduler and Volcano."""

from __future__ import annotations

import copy
from collections import defaultdict

import pytest

from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.loading import validate
from ai_factory.factory.planning.placement import advertised_resources, offerings
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.planning.quotas import CPU_FLAVOR, CPU_RESOURCES, KaiShare, megabytes, millicores, queue_plan
from tests.scheduling_env import bigger_environment


@pytest.fixture(scope="module")
def dev_cfg(dev_raw) -> FactoryConfig:
    return validate(copy.deepcopy(dev_raw[0]))


@pytest.fixture(scope="module")
def big_cfg(dev_raw) -> FactoryConfig:
    return validate(bigger_environment(copy.deepcopy(dev_raw[0])))


def quota_totals(queues) -> dict[tuple[str, str], int]:
    """Nominal quota per (flavor, resource), over every ClusterQueue and Cohort."""
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for holder in (*queues.cluster_queues, *queues.cohorts):
        for group in holder.groups:
            for flavor in group.flavors:
                for quota in flavor.quotas:
                    if flavor.flavor != CPU_FLAVOR:
                        totals[flavor.flavor, quota.resource] += quota.nominal
    return dict(totals)


@pytest.mark.parametrize("env", ["dev_cfg", "big_cfg"])
def test_quotas_add_up_to_the_supply_of_every_flavor(env, request):
    cfg = request.getfixturevalue(env)
    plan = plan_for(cfg)
    supply = {(o.name, r): n for o in offerings(plan) for r, n in o.supply.items()}
    totals = quota_totals(queue_plan(cfg, plan))
    assert {k: v for k, v in totals.items() if v} == supply


def test_a_queue_lists_the_flavors_of_its_trust_domain_only(big_cfg):
    queues = queue_plan(big_cfg, plan_for(big_cfg))
    domain_of = {o.name: o.trust_domain for o in queues.flavors}
    for queue in queues.cluster_queues:
        listed = {f.flavor for g in queue.groups for f in g.flavors} - {CPU_FLAVOR}
        assert listed == {name for name, domain in domain_of.items() if domain == queue.trust_domain}, queue.tenant
    research = {f.flavor for q in queues.cluster_queues if q.tenant == "nlp" for g in q.groups for f in g.flavors}
    assert "h100-research" in research  # nlp has no H100, but may borrow its domain's idle ones


def test_unallocated_supply_is_the_trust_domains_cohort_quota(big_cfg):
    queues = queue_plan(big_cfg, plan_for(big_cfg))
    research = next(c for c in queues.cohorts if c.name == "trust-domain-research")
    slack = {(f.flavor, q.resource): q.nominal for g in research.groups for f in g.flavors for q in f.quotas}
    assert slack[("l40s-hami-research", "nvidia.com/gpu")] == 10 - 5  # one GPU, 10 slots, 5 granted
    assert slack[("l40s-hami-research", "nvidia.com/gpumem")] == 46068 - 5 * 8192
    assert slack[("l4-ts-research", "nvidia.com/gpu.shared")] == 2 * 4 - 6
    assert research.parent == "organisation-rnd"
    assert all(q.lending_limit == 0 for g in research.groups for f in g.flavors for q in f.quotas)


def test_a_guaranteed_share_is_never_lent_by_default(dev_cfg):
    for queue in queue_plan(dev_cfg, plan_for(dev_cfg)).cluster_queues:
        gpu_quotas = [q for g in queue.groups if g.covered != CPU_RESOURCES for f in g.flavors for q in f.quotas]
        assert gpu_quotas and all(q.lending_limit == 0 and q.borrowing_limit is None for q in gpu_quotas), queue.tenant


def test_borrowing_settings_become_lending_and_borrowing_limits(big_cfg):
    queues = {q.tenant: q for q in queue_plan(big_cfg, plan_for(big_cfg)).cluster_queues}
    search = {(f.flavor, q.resource): q for g in queues["search"].groups for f in g.flavors for q in f.quotas}
    mig = search[("a100-mig-product", "nvidia.com/mig-2g.20gb")]
    assert (mig.nominal, mig.lending_limit, mig.borrowing_limit) == (4, 2, 4)  # lend 50%, borrow up to 100%
    assert queues["search"].fair_share_weight == 3
    ops = [q for g in queues["ops"].groups if g.covered != CPU_RESOURCES for f in g.flavors for q in f.quotas]
    assert all(q.borrowing_limit == 0 for q in ops)
    assert {(q.nominal, q.lending_limit) for q in ops if q.resource == "nvidia.com/gpu"} == {(4, 1)}


def test_cpu_and_memory_quotas_come_from_the_tenant_and_are_not_borrowed(big_cfg):
    queue = next(q for q in queue_plan(big_cfg, plan_for(big_cfg)).cluster_queues if q.tenant == "ext-b")
    cpu_group = queue.groups[0]
    assert cpu_group.covered == CPU_RESOURCES
    assert [(q.resource, q.nominal, q.borrowing_limit) for q in cpu_group.flavors[0].quotas] == [("cpu", "500m", 0), ("memory", "64Gi", 0)]


def test_kai_charges_a_mig_instance_its_g_gpus(big_cfg):
    kai = {q.name: q for q in queue_plan(big_cfg, plan_for(big_cfg)).kai_queues}
    vision = kai["tenant-vision"]
    assert vision.gpu.quota == 16 + 10 * 1 + 2 * 3  # whole H100s, 1g.10gb and 3g.40gb instances
    assert vision.parent == "trust-domain-research" and kai["trust-domain-research"].parent == "organisation-rnd"


def test_kai_writes_every_share_and_caps_a_domain_at_its_supply(big_cfg):
    queues = queue_plan(big_cfg, plan_for(big_cfg)).kai_queues
    kai = {q.name: q for q in queues}
    for queue in queues:
        children = [q for q in queues if q.parent == queue.name]
        if children:
            assert queue.gpu.limit == queue.gpu.quota >= sum(c.gpu.quota for c in children)
            assert queue.cpu == queue.memory == KaiShare(-1, 0, -1)  # the tenants' own figures rule
        else:
            assert all(share.limit >= share.quota >= 0 for share in (queue.gpu, queue.cpu, queue.memory))
    assert kai["tenant-vision"].gpu.limit == kai["trust-domain-research"].gpu.quota  # borrows up to its domain
    assert kai["tenant-ops"].gpu.limit == kai["tenant-ops"].gpu.quota  # limit_percent 0
    assert kai["tenant-search"].gpu.limit == 2 * kai["tenant-search"].gpu.quota  # limit_percent 100
    assert (kai["tenant-ext-b"].cpu.quota, kai["tenant-ext-b"].memory.quota) == (500, megabytes("64Gi"))


def test_volcano_caps_each_gpu_resource_at_the_grant(big_cfg):
    plan = plan_for(big_cfg)
    volcano = {q.tenant: q for q in queue_plan(big_cfg, plan).volcano_queues}
    docs = dict(volcano["docs"].capability)
    assert set(advertised_resources(plan)) <= set(docs) and all(docs[r] == 0 for r in advertised_resources(plan))
    vision = dict(volcano["vision"].capability)
    assert (vision["nvidia.com/gpu"], vision["nvidia.com/mig-3g.40gb"], vision["cpu"]) == (16, 2, "64")
    assert dict(volcano["vision"].guarantee) == {"nvidia.com/gpu": 16, "nvidia.com/mig-1g.10gb": 10, "nvidia.com/mig-3g.40gb": 2}


def test_quantities_convert_to_kai_units():
    assert (millicores("500m"), millicores("64"), millicores("1.5")) == (500, 64000, 1500)
    assert (megabytes("1G"), megabytes("1Gi"), megabytes("512Gi")) == (1000, 1073, 549755)
