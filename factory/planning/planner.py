"""Capacity planner: which GPU of which node serves which tenant, and how that GPU is sliced.

Pure and deterministic: the same pools and tenants give the same `Plan`, byte for byte in JSON. No
Pulumi, Kubernetes or pydantic here; the configuration layer adapts to the dataclasses of `model`.

Hard rules (shared/BRIEF.md, shared/reference/gpu-sharing.md sections 2, 3 and 6):
- A GPU never serves two trust domains. A node with shared GPUs (MIG, HAMi, time-slicing) belongs
  to one trust domain as a whole, because neither the device plugin nor HAMi lets a pod choose
  which GPU of a node it gets. Whole GPUs are owned per GPU, so high- and medium-trust tenants of
  different domains may have whole GPUs on one node.
- Low-trust tenants get whole GPUs only, on nodes dedicated to them; the GPUs they did not ask for
  on those nodes stay idle and are reported against them.
- MIG pools are owned by MIG Manager, HAMi pools by HAMi; no GPU has both.
- Every MIG layout has legal, non-overlapping start slots (checked, not assumed).
- HAMi memory is never oversubscribed unless the tenant opted in.

Objective, in order: GPUs used (MIG packing is exact per pool and trust domain; stranded MIG
slices, 7 or 8 per GPU minus the demand, follow from it), then, when re-planning, GPUs whose work
is disturbed (a MIG geometry change drains the GPU), then idle GPUs on owned nodes. HAMi and
time-slicing are packed by heuristics whose gap to the lower bound the figures report.
"""

from __future__ import annotations

from typing import Sequence

from ai_factory.factory.planning.demands import check_pools, collect_requests
from ai_factory.factory.planning.figures import domain_figures, lower_bounds, total_figures
from ai_factory.factory.planning.model import Plan, PlanError, PoolSpec, TenantSpec
from ai_factory.factory.planning.ownership import plan_pool
from ai_factory.factory.planning.replan import changed_gpus


def plan(pools: Sequence[PoolSpec], tenants: Sequence[TenantSpec], previous: Plan | None = None) -> Plan:
    """Place every demand, or raise PlanError listing every problem.

    With `previous`, GPUs keep their layout and owner wherever that costs no extra GPU."""
    problems: list[str] = []
    valid_pools = check_pools(pools, problems)
    requests = collect_requests(valid_pools, {p.name for p in pools}, tenants, problems)
    previous_pools = {p.name: p for p in previous.pools} if previous is not None else {}
    pool_plans = []
    for name in sorted(valid_pools):
        pool = valid_pools[name]
        before = previous_pools.get(name)
        if before is not None and (before.gpu_model, before.gpus_per_node, before.sharing) != (
            pool.gpu_model,
            pool.gpus_per_node,
            pool.sharing,
        ):
            before = None  # another model or node shape: nothing to keep
        pool_plan = plan_pool(pool, requests[name], before, problems)
        if pool_plan is not None:
            pool_plans.append(pool_plan)
    if problems:
        raise PlanError(problems)
    figures = []
    for pool_plan in pool_plans:
        pool, request = valid_pools[pool_plan.name], requests[pool_plan.name]
        bounds = lower_bounds(pool, request)
        figures += [domain_figures(pool_plan, pool, bounds.get(domain, 0), domain) for domain in sorted(set(request.domain_of.values()))]
    pool_figures = [
        total_figures(pool_plan.name, [f for f in figures if f.pool == pool_plan.name], pool_plan)
        for pool_plan in pool_plans
    ]
    fleet_figures = total_figures(None, figures, *pool_plans)
    return Plan(
        pools=tuple(pool_plans),
        figures=tuple(figures),
        pool_figures=tuple(pool_figures),
        fleet_figures=fleet_figures,
        changed_gpus=None if previous is None else changed_gpus(previous, pool_plans),
    )
