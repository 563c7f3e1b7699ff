"""From the environment's configuration to the capacity plan (and back to config errors).

The planner itself (`ai_factory.factory.planning.planner` and the modules it uses) is pure and
knows nothing of the config model; this module is the adapter. A previous plan, when the
environment has one in `plans/<env>.json`, is passed to the planner so that re-planning keeps
existing tenants' GPUs (a MIG geometry change drains a node).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from ai_factory.factory.model.config import FactoryConfig, GpuDemand, Pool, Tenant
from ai_factory.factory.model.loading import ConfigError, project_dir
from ai_factory.factory.planning.model import Demand, HamiSlice, Plan, PlanError, PoolSpec, TenantSpec
from ai_factory.factory.planning.planner import plan

PLANS_DIR = "plans"


def pool_spec(pool: Pool) -> PoolSpec:
    return PoolSpec(
        name=pool.name,
        gpu_model=pool.gpu.model,
        gpus_per_node=pool.gpu.per_node,
        nodes=tuple(sorted(n.name for n in pool.node_specs())),
        sharing=pool.sharing,
        time_slicing_replicas=pool.time_slicing.replicas,
        hami_split_count=pool.hami.split_count,
    )


def demand(d: GpuDemand, pool: Pool) -> Demand:
    if pool.sharing == "mig":
        return Demand(pool=d.pool, mig=tuple(sorted(d.mig.items())))
    if pool.sharing == "hami":
        return Demand(
            pool=d.pool,
            hami=(HamiSlice(count=d.count, memory_mib=d.memory_mib, cores_percent=d.cores_percent),),
            hami_oversubscribe=d.memory_oversubscription > 1.0,
            hami_memory_scaling=d.memory_oversubscription,
        )
    if pool.sharing == "time-slicing":
        return Demand(pool=d.pool, time_sliced_replicas=d.count)
    return Demand(pool=d.pool, whole_gpus=d.count)


def tenant_spec(tenant: Tenant, cfg: FactoryConfig) -> TenantSpec:
    return TenantSpec(
        name=tenant.name,
        trust=tenant.trust,
        trust_domain=tenant.domain,
        demands=tuple(demand(d, cfg.pool(d.pool)) for d in tenant.gpus),
    )


def plan_path(env: str, directory: Path | None = None) -> Path:
    """The environment's plan lock, `plans/<env>.json` of the project."""
    return (directory or project_dir()) / PLANS_DIR / f"{env}.json"


MAX_PLAN_LOCK_BYTES = 256 * 1024 * 1024
"""Largest plan lock read (a fleet at the config's bounds, every GPU in use, writes well under this)."""


def previous_plan(env: str, directory: Path | None = None) -> Plan | None:
    """The environment's plan lock, if it has one; a lock that is not a plan is a config error."""
    path = plan_path(env, directory)
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_PLAN_LOCK_BYTES:
        raise ConfigError([f"{PLANS_DIR}/{path.name}: larger than {MAX_PLAN_LOCK_BYTES} bytes, not a plan lock"], source=str(path))
    try:
        return _PLAN_LOCK.validate_json(path.read_bytes())  # every field typed, as `Plan.to_json` writes it
    except ValidationError as err:
        where = err.errors()[0]
        raise ConfigError(
            [f"{PLANS_DIR}/{path.name}: not a plan lock written by `ai-factory plan --lock` "
             f"({'.'.join(map(str, where['loc'])) or 'document'}: {where['msg']}); write it again, or delete it to plan from scratch"],
            source=str(path),
        ) from None


_PLAN_LOCK = TypeAdapter(Plan)


def plan_for(cfg: FactoryConfig, previous: Plan | None = None) -> Plan:
    """The capacity plan of an environment; demands that do not fit are configuration errors."""
    try:
        return plan(
            [pool_spec(p) for p in cfg.fleet.pools],
            [tenant_spec(t, cfg) for t in cfg.tenants],
            previous=previous,
        )
    except PlanError as err:
        raise ConfigError([f"plan: {p}" for p in err.problems]) from None
