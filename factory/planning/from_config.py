"""From the environment's configuration to the capacity plan (and back to config errors).

The planner itself (`ai_factory.factory.planning.planner` and the modules it uses) is pure and
knows nothing of the config model; this module is the adapter. A previous plan, when the
environment has one in `plans/<env>.json`, is passed to the planner so that re-planning keeps
existing tenants' GPUs (a MIG geometry change drains a node) and their fabric keys.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ai_factory.factory.model.config import FactoryConfig, GpuDemand, Pool, Tenant
from ai_factory.factory.model.gpus import GPU_MODELS, vm_resource_name
from ai_factory.factory.model.loading import ConfigError, project_dir
from ai_factory.factory.planning.fabric import INFINIBAND, FabricError, FabricWant, allocate, roce_fabric
from ai_factory.factory.planning.model import Demand, HamiSlice, Plan, PlanError, PoolSpec, TenantSpec
from ai_factory.factory.planning.planner import plan

PLANS_DIR = "plans"


def pool_spec(pool: Pool, cfg: FactoryConfig) -> PoolSpec:
    return PoolSpec(
        name=pool.name,
        gpu_model=pool.gpu.model,
        gpus_per_node=pool.gpu.per_node,
        nodes=tuple(sorted(n.name for n in pool.node_specs())),
        sharing=pool.sharing,
        time_slicing_replicas=pool.time_slicing.replicas,
        hami_split_count=pool.hami.split_count,
        vm_resource=vm_resource(pool, cfg),
    )


def vm_resource(pool: Pool, cfg: FactoryConfig) -> str | None:
    """The resource name a VM pool's GPUs are advertised as; None for a pool not marked for VMs (or
    a device unknown, refused at validation), and for a DRA pool, whose VMs claim their GPUs."""
    vm_pool = cfg.layers.kubevirt.pools.get(pool.name) if cfg.layers.kubevirt.enabled else None
    if vm_pool is None or pool.sharing == "dra":
        return None
    return vm_resource_name(vm_pool.pci_device_id or GPU_MODELS[pool.gpu.model].pci_device_ids[0], vm_pool.resource_name)


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


def plan_inputs(cfg: FactoryConfig) -> tuple[Any, ...]:
    """Everything of `cfg` that `plan_for` reads (the fleet, the network and KubeVirt layers, each
    tenant's name, trust, GPU demands and fabric keys, in order): what the render cache keys a plan
    on, so that a change of a tenant's quota or of any other section plans nothing again. Whatever
    `plan_for` or the functions it calls come to read of the config must be added here."""
    return cfg.fleet, cfg.layers.network, cfg.layers.kubevirt, [(t.name, t.trust, t.trust_domain, t.gpus, t.network) for t in cfg.tenants]


def plan_for(cfg: FactoryConfig, previous: Plan | None = None) -> Plan:
    """The capacity plan of an environment, with its tenants' fabric keys; demands that do not fit
    and keys that cannot be given are configuration errors."""
    try:
        planned = plan(
            [pool_spec(p, cfg) for p in cfg.fleet.pools],
            [tenant_spec(t, cfg) for t in cfg.tenants],
            previous=previous,
        )
    except PlanError as err:
        raise ConfigError([f"plan: {p}" for p in err.problems]) from None
    ranges = {"infiniband": (cfg.layers.network.pkeys.first, cfg.layers.network.pkeys.last), "roce": (cfg.layers.network.vlans.first, cfg.layers.network.vlans.last)}
    try:
        networks = allocate(fabric_wants(cfg, planned), ranges, previous.networks if previous else ())
    except FabricError as err:
        raise ConfigError(err.problems) from None
    return dataclasses.replace(planned, networks=networks)


RDMA_FABRICS = ("infiniband", "roce")


def is_rdma_pool(pool: Pool) -> bool:
    return pool.topology.fabric in RDMA_FABRICS


def fabric_wants(cfg: FactoryConfig, planned: Plan) -> list[FabricWant]:
    """The RDMA networks tenants need: per demand on an RDMA pool exposing SR-IOV, when it asks for
    one (`rdma: true`) or, by default, when the plan spreads the tenant's GPUs there over several
    nodes (its jobs then talk across nodes). Shared RDMA devices carry no per-tenant network."""
    if not cfg.layers.network.enabled:
        return []
    wants = []
    for i, tenant in enumerate(cfg.tenants):
        for d in tenant.gpus:
            pool = cfg.pool(d.pool)
            if not is_rdma_pool(pool) or pool.network.devices != "sriov" or d.rdma is False:
                continue
            if d.rdma is None and len(_nodes_of(planned, pool.name, tenant.name)) < 2:
                continue
            ib = pool.topology.fabric == "infiniband"
            field = "pkey" if ib else "vlan"
            wants.append(
                FabricWant(
                    tenant=tenant.name,
                    pool=pool.name,
                    fabric=INFINIBAND if ib else roce_fabric(pool.site),
                    kind="infiniband" if ib else "roce",
                    manual=getattr(tenant.network, field),
                    manual_path=f"tenants[{i}].network.{field}",
                )
            )
    return wants


def _nodes_of(planned: Plan, pool: str, tenant: str) -> set[str]:
    return set(planned.pool(pool).node_grants(tenant))
