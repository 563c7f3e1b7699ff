"""The plan's indexes by tenant and trust domain, and the queue plan grouped by domain, give what a
scan of the whole plan gives, for every tenant and domain of generated environments (they replaced
such scans, which made building every tenant's arguments quadratic in the tenants)."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections import Counter

import pytest

from ai_factory.components._common import tenant_items
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.model.loading import validate
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.planning.model import gpu_grants
from ai_factory.factory.planning.placement import domain_offerings, offerings
from ai_factory.factory.planning.quotas import FLAVOR_ORDER, queue_plan
from tests.scheduling_env import bigger_environment
from tests.tenancy_env import many_tenants


@pytest.fixture(scope="module", params=["generated tenants", "bigger environment"])
def env(request, dev_raw):
    raw = copy.deepcopy(dev_raw[0])
    if request.param == "generated tenants":
        raw = many_tenants(raw, 24)
        # A low-trust tenant on two dedicated nodes, the second half idle.
        raw["tenants"][0]["gpus"][0]["count"] = 12
        raw["fleet"]["pools"][0]["nodes"] += 1
    cfg = validate(raw if request.param == "generated tenants" else bigger_environment(raw))
    return cfg, plan_for(cfg)


def domains(cfg, plan) -> list[str]:
    every = {t.domain for t in cfg.tenants} | {g.trust_domain for p in plan.pools for n in p.nodes for g in n.gpus if g.trust_domain}
    return sorted(every) + ["no-such-domain"]


def test_a_domains_offerings_are_those_of_the_fleet_in_that_domain(env):
    cfg, plan = env
    for domain in domains(cfg, plan):
        assert domain_offerings(plan, domain) == tuple(o for o in offerings(plan) if o.trust_domain == domain), domain


def test_a_pools_nodes_of_a_domain_are_those_holding_one_of_its_gpus(env):
    cfg, plan = env
    for pool in plan.pools:
        for domain in domains(cfg, plan):
            assert pool.domain_nodes(domain) == tuple(n for n in pool.nodes if any(g.trust_domain == domain for g in n.gpus)), (pool.name, domain)


def test_a_tenants_node_grants_and_dedicated_nodes_are_what_its_gpus_grant(env):
    cfg, plan = env
    assert any(plan.dedicated_nodes(t.name) for t in cfg.tenants) and any(p.node_grants(t.name) for p in plan.pools for t in cfg.tenants)
    for tenant in [t.name for t in cfg.tenants] + ["no-such-tenant"]:
        for pool in plan.pools:
            scanned: dict[str, Counter[str]] = {}
            for node in pool.nodes:
                for gpu in node.gpus:
                    for owner, resource, amount in gpu_grants(GPU_MODELS[pool.gpu_model], gpu):
                        if owner == tenant:
                            scanned.setdefault(node.name, Counter())[resource] += amount
            assert pool.node_grants(tenant) == {node: dict(sorted(c.items())) for node, c in scanned.items()}, (tenant, pool.name)
        dedicated = sorted(n.name for p in plan.pools for n in p.nodes if n.dedicated_tenant == tenant)
        assert plan.dedicated_nodes(tenant) == tuple(dedicated), tenant


def test_each_tenants_queue_lists_its_domains_flavors_in_flavor_order(env):
    cfg, plan = env
    queues = queue_plan(cfg, plan)
    assert queues.flavors == tuple(sorted(offerings(plan), key=lambda o: (FLAVOR_ORDER[o.kind], o.name)))
    for queue in queues.cluster_queues:
        listed = [f.flavor for g in queue.groups[1:] for f in g.flavors]
        own = [o.name for o in queues.flavors if o.trust_domain == queue.trust_domain]
        assert listed == own, queue.tenant


def test_the_plans_data_is_its_json_read_back(env):
    _, plan = env
    data = plan.to_data()
    assert json.dumps(data) == json.dumps(json.loads(json.dumps(dataclasses.asdict(plan), sort_keys=True)))
    assert data == json.loads(json.dumps(dataclasses.asdict(plan)))


@pytest.mark.parametrize("container", [tuple, list])
def test_a_tenants_items_are_those_naming_it_in_order(container):
    @dataclasses.dataclass(frozen=True)
    class Item:
        tenant: str
        n: int

    items = container(Item(f"t{i % 3}", i) for i in range(9))
    for tenant in ["t0", "t1", "t2", "none"]:
        assert tenant_items(items, tenant) == tuple(i for i in items if i.tenant == tenant)
