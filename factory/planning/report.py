"""The printed capacity plan: a summary (fleet and pools, then trust domains), then one row per
tenant, one per served model, then, on request, one row per GPU. Tables are `rich` tables; every column is defined once,
in `COLUMNS`, which `ai-factory plan --help` and the README print."""

from __future__ import annotations

import io
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.model.quantity import cores, gib
from ai_factory.factory.model.serving import host_demand, replica_shape, replicas_at_max, serving_kind, weights_gib
from ai_factory.factory.planning.figures import gpu_share
from ai_factory.factory.planning.model import Figures, GpuAssignment, Plan
from ai_factory.factory.planning.placement import allocations, offerings
from ai_factory.factory.planning.quotas import gpu_ceiling

COLUMNS: tuple[tuple[str, str], ...] = (
    ("pool", "the GPU pool; `(fleet)` is every pool together"),
    ("GPU", "the pool's GPU model"),
    ("sharing", "how the pool's GPUs are shared: exclusive, mig, hami, time-slicing or dra"),
    ("trust domain", "tenants that may share physical GPUs (a low-trust tenant is a domain of its own)"),
    ("nodes", "nodes holding at least one of the row's GPUs, in use or idle"),
    ("free nodes", "nodes all of whose GPUs are free"),
    ("GPUs", "the row's GPUs: used + idle + free (every GPU is in exactly one of the three)"),
    ("used", "GPUs serving at least one tenant (whole, MIG instances, HAMi slices or time-sliced replicas)"),
    ("idle", "GPUs serving nobody but held for a trust domain, on a node it owns or that is dedicated to a low-trust tenant: no other domain may use them"),
    ("free", "GPUs serving nobody and held for no trust domain: the next plan may give them to anyone (a trust domain holds none)"),
    ("LB", "lower bound on the GPUs the row's demands need"),
    ("gap", "used - LB: GPUs used beyond the lower bound"),
    ("stranded c/m", "MIG compute / memory slices left unallocated on used MIG GPUs"),
    ("GPU-eq", "allocated GPU-equivalents: per GPU its dominant share (MIG max(compute/7, memory/8), HAMi max(memory, cores), time-sliced replicas used / replicas, whole 1)"),
    ("util", "GPU-eq / used: how fully the used GPUs are allocated"),
    ("fill", "GPU-eq / GPUs: how much of all the row's GPUs is allocated"),
    ("HAMi mem x", "largest allocated / physical memory on one HAMi GPU (above 1 only for tenants that opted in)"),
    ("tenant", "the tenant"),
    ("trust", "the tenant's trust level: high, medium or low"),
    ("grant", "what the plan granted the tenant, per pool and resource name (its queue's nominal quota)"),
    ("ceiling", "the most the tenant can ever be admitted, per pool and resource name: its grant plus what it may borrow in its trust domain"),
    ("placed", "the tenant's GPUs, per pool, as node:GPU indexes"),
    ("idle cost", "idle GPUs on the tenant's nodes charged to it: all of a dedicated node's; on a node its domain owns, a share in proportion to its GPU-eq there"),
    ("fabric", "the RDMA fabric of the tenant's network: `infiniband` (the whole fleet) or `roce-<site>`"),
    ("key", "the tenant's InfiniBand partition key or RoCE VLAN on that fabric, unique on it"),
    ("from", "`plan`: allocated by the planner and kept in the lock; `config`: given in tenants[].network"),
    ("node", "the node"),
    ("index", "the GPU's index on its node"),
    ("mode", "what the GPU does: whole, mig, hami, time-sliced or idle"),
    ("layout", "MIG instances as profile@start memory slice, HAMi slices as memory/cores, time-sliced shares as replicas"),
    ("owner", "the tenants the GPU serves"),
    ("mig config", "the mig-parted config MIG Manager applies to the node"),
    ("model", "a model the tenant serves (`tenants[].models`)"),
    ("served as", "InferenceService, or LLMInferenceService when disaggregated or spanning nodes, or DynamoGraphDeployment (`runtime: dynamo`)"),
    ("per replica", "the GPU resource one replica takes: whole GPUs, a MIG profile or a HAMi slice (memory/cores)"),
    ("replicas", "min-max replicas (decode replicas, plus prefill replicas when disaggregated)"),
    ("at max", "units of the tenant's grant the model holds at its maximum replicas; every model of a tenant fits its grant"),
    ("memory", "weights + KV-cache headroom / usable memory of one replica (its GPUs times gpu_memory_utilization)"),
    ("cpu/memory at max", "CPU requests and memory (the larger of requests and limits) of the model's pods at its maximum replicas, endpoint picker included; every model of a tenant fits its quota"),
)
"""Every column of the printed plan, with its one definition."""


def columns_help() -> str:
    """The column definitions, as `ai-factory plan --help` prints them."""
    width = max(len(name) for name, _ in COLUMNS)
    return "columns:\n" + "\n".join(f"  {name.ljust(width)}  {definition}" for name, definition in COLUMNS)


# --------------------------------------------------------------------------- per tenant


@dataclass(frozen=True)
class TenantUse:
    """What one tenant holds in one pool, as its row of the report shows it."""

    gpu_equivalents: float
    idle_cost: float
    placed: dict[str, list[int]]
    """node -> GPU indexes."""


def tenant_uses(plan: Plan) -> dict[tuple[str, str], TenantUse]:
    """Per (tenant, pool) where the tenant has GPUs: its GPU-equivalents, its share of the idle GPUs
    on its nodes, its GPUs.

    A node's idle GPUs held for a trust domain are charged to the domain's tenants on that node in
    proportion to their GPU-equivalents there, so that the charges add up to the domain's idle."""
    equivalents: dict[tuple[str, str], float] = defaultdict(float)
    idle: dict[tuple[str, str], float] = defaultdict(float)
    placed: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(dict)
    for pool in plan.pools:
        model = GPU_MODELS[pool.gpu_model]
        for node in pool.nodes:
            on_node: dict[str, float] = defaultdict(float)
            for gpu in node.gpus:
                for tenant in _tenants_of(gpu):
                    on_node[tenant] += gpu_share(model, pool, gpu, tenant)
                    placed[tenant, pool.name].setdefault(node.name, []).append(gpu.index)
            held_idle = sum(gpu.mode == "idle" and gpu.trust_domain is not None for gpu in node.gpus)
            total = sum(on_node.values())
            for tenant, share in on_node.items():
                equivalents[tenant, pool.name] += share
                if held_idle and total:
                    idle[tenant, pool.name] += held_idle * share / total
    return {key: TenantUse(round(equivalents[key], 6), round(idle[key], 6), placed[key]) for key in sorted(placed)}


def _tenants_of(gpu: GpuAssignment) -> list[str]:
    if gpu.mode == "whole":
        return [gpu.owner] if gpu.owner else []
    names = [i.tenant for i in gpu.mig] + [a.tenant for a in gpu.hami] + [s.tenant for s in gpu.time_slices]
    return sorted(set(names))


def _resources(amounts: dict[str, int]) -> str:
    return ", ".join(f"{amount} {resource.removeprefix('nvidia.com/')}" for resource, amount in sorted(amounts.items())) or "-"


def _indexes(indexes: Sequence[int]) -> str:
    """0,1,2,3,5 -> 0-3,5"""
    runs: list[list[int]] = []
    for index in sorted(indexes):
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


# --------------------------------------------------------------------------- tables


def _table(title: str, headers: Iterable[str]) -> Table:
    """On a narrow terminal names stay whole and lists wrap."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header in headers:
        name = header in _NAME_COLUMNS
        table.add_column(header, justify="left" if name or header in _LIST_COLUMNS else "right", no_wrap=name, overflow="fold")
    return table


_NAME_COLUMNS = {"pool", "GPU", "sharing", "trust domain", "tenant", "trust", "node", "mode", "mig config", "model", "served as"}
_LIST_COLUMNS = {"grant", "ceiling", "placed", "layout", "owner"}


def _capacity_cells(row: Figures, with_free: bool) -> list[str]:
    cells = [str(row.nodes_used)]
    if with_free:
        cells.append(str(row.free_nodes))
    cells += [str(row.gpus), str(row.gpus_used), str(row.idle_gpus)]
    return cells + ([str(row.free_gpus)] if with_free else [])


def _packing_cells(row: Figures) -> list[str]:
    fill = row.gpu_equivalents / row.gpus if row.gpus else 0.0
    return [
        str(row.lower_bound),
        str(row.gap),
        f"{row.stranded_compute_slices}/{row.stranded_memory_slices}",
        f"{row.gpu_equivalents:.2f}",
        f"{row.utilisation:.3f}",
        f"{fill:.3f}",
        f"{row.hami_memory_oversubscription:.2f}",
    ]


_PACKING = ("LB", "gap", "stranded c/m", "GPU-eq", "util", "fill", "HAMi mem x")


def summary_tables(plan: Plan) -> list[Table]:
    """Capacity and packing of the fleet and each pool (two tables, so each fits a terminal of 100
    columns), then both per trust domain of each pool."""
    fleet = _table("Fleet and pools", ("pool", "GPU", "sharing", "nodes", "free nodes", "GPUs", "used", "idle", "free"))
    packing = _table("Packing", ("pool", *_PACKING))
    fleet.add_row("(fleet)", "", "", *_capacity_cells(plan.fleet_figures, with_free=True), end_section=True)
    packing.add_row("(fleet)", *_packing_cells(plan.fleet_figures), end_section=True)
    pool_figures = {row.pool: row for row in plan.pool_figures}
    for pool in plan.pools:
        row = pool_figures[pool.name]
        fleet.add_row(pool.name, pool.gpu_model, pool.sharing, *_capacity_cells(row, with_free=True))
        packing.add_row(pool.name, *_packing_cells(row))
    domains = _table("Trust domains", ("pool", "trust domain", "nodes", "GPUs", "used", "idle", *_PACKING))
    for row in plan.figures:
        domains.add_row(row.pool, row.trust_domain, *_capacity_cells(row, with_free=False), *_packing_cells(row))
    return [fleet, packing, domains]


def tenant_table(plan: Plan, cfg: FactoryConfig) -> Table:
    """One row per tenant and pool it holds or may borrow GPUs in (the tenant named on its first)."""
    table = _table("Tenants", ("tenant", "trust", "trust domain", "pool", "grant", "ceiling", "placed", "GPU-eq", "idle cost"))
    uses = tenant_uses(plan)
    pool_of = {o.name: o.pool for o in offerings(plan)}
    granted = allocations(plan, {t.name: t.domain for t in cfg.tenants})
    for tenant in sorted(cfg.tenants, key=lambda t: t.name):
        grant: dict[str, dict[str, int]] = defaultdict(dict)
        for g in granted[tenant.name].grants:
            grant[g.pool][g.resource] = g.amount
        ceiling: dict[str, dict[str, int]] = defaultdict(dict)
        for (offering, resource), amount in gpu_ceiling(cfg, plan, tenant).per_offering.items():
            ceiling[pool_of[offering]][resource] = amount
        pools = sorted(set(grant) | set(ceiling)) or ["-"]
        for i, pool in enumerate(pools):
            use = uses.get((tenant.name, pool))
            table.add_row(
                *((tenant.name, tenant.trust, tenant.domain) if i == 0 else ("", "", "")),
                pool,
                _resources(grant[pool]),
                "= grant" if ceiling[pool] == grant[pool] else _resources(ceiling[pool]),
                " ".join(f"{node}:{_indexes(indexes)}" for node, indexes in use.placed.items()) if use else "-",
                f"{use.gpu_equivalents:.2f}" if use else "0.00",
                f"{use.idle_cost:.2f}" if use else "0.00",
            )
    return table


def model_table(cfg: FactoryConfig) -> Table:
    """One row per served model: its shape, replicas and what it holds of its tenant's grant."""
    table = _table("Models", ("tenant", "model", "served as", "pool", "per replica", "replicas", "at max", "memory", "cpu/memory at max"))
    for tenant in sorted(cfg.tenants, key=lambda t: t.name):
        for i, model in enumerate(tenant.models):
            pool = cfg.pool(model.gpus.pool)
            shape = replica_shape(pool, tenant, model)
            if shape.sharing == "mig":
                per_replica = f"{shape.mig_profile}"
            elif shape.sharing == "hami":
                per_replica = f"{shape.hami_memory_mib}MiB/{shape.hami_cores_percent}%"
            else:
                per_replica = f"{shape.units} GPU" + ("s" if shape.units > 1 else "") + (f" on {shape.nodes} nodes" if shape.nodes > 1 else "")
            prefill = f" +{model.disaggregation.prefill_replicas} prefill" if model.disaggregation else ""
            need = weights_gib(model) + model.memory.kv_cache_gib
            host = host_demand(pool, tenant, model)
            table.add_row(
                tenant.name if i == 0 else "",
                model.name,
                serving_kind(cfg, model),
                pool.name,
                per_replica,
                f"{model.replicas.min}-{model.replicas.max}{prefill}",
                str(shape.units * replicas_at_max(model)),
                f"{need:.1f}/{shape.memory_gib * model.gpu_memory_utilization:.1f} GiB",
                f"{cores(host.cpu)} CPU / {gib(max(host.memory, host.memory_limit))}",
            )
    return table


def fabric_table(plan: Plan) -> Table:
    """One row per tenant RDMA network: its partition key or VLAN."""
    table = _table("Fabric", ("tenant", "pool", "fabric", "key", "from"))
    for n in plan.networks:
        table.add_row(n.tenant, n.pool, n.fabric, n.shown, "config" if n.manual else "plan")
    return table


def gpu_tables(plan: Plan) -> list[Table]:
    tables = []
    for pool in plan.pools:
        gpus = len(pool.nodes) * pool.gpus_per_node
        table = _table(
            f"pool {pool.name}: {pool.gpu_model}, {pool.sharing}, {len(pool.nodes)} nodes x {pool.gpus_per_node} GPUs = {gpus} GPUs",
            ("node", "index", "mode", "layout", "owner", "trust domain", "mig config"),
        )
        for node in pool.nodes:
            for gpu in node.gpus:
                layout, owner = describe_gpu(gpu)
                table.add_row(node.name, str(gpu.index), gpu.mode, layout, owner, gpu.trust_domain or "-", node.mig_config or "-")
        tables.append(table)
    return tables


def describe_gpu(gpu: GpuAssignment) -> tuple[str, str]:
    """(layout, owners) of one GPU, as the per-GPU table prints them."""
    if gpu.mode == "mig":
        layout = " ".join(f"{i.profile}@{i.start}" for i in gpu.mig)
    elif gpu.mode == "hami":
        layout = " ".join(f"{a.memory_mib}MiB/{a.cores_percent}%" for a in gpu.hami)
        if gpu.hami_memory_scaling != 1.0:
            layout += f" (memory x{gpu.hami_memory_scaling:g})"
    elif gpu.mode == "time-sliced":
        layout = " ".join(f"{s.replicas}x" for s in gpu.time_slices)
    else:
        layout = "-"
    return layout, ",".join(_tenants_of(gpu)) or "-"


def print_report(console: Console, plan: Plan, cfg: FactoryConfig, *, gpus: bool = False) -> None:
    """The summary, the tenants and (with `gpus`) every GPU, in that order."""
    for table in summary_tables(plan):
        console.print(table)
        console.print()
    console.print(tenant_table(plan, cfg))
    if any(t.models for t in cfg.tenants):
        console.print()
        console.print(model_table(cfg))
    if plan.networks:
        console.print()
        console.print(fabric_table(plan))
    for table in gpu_tables(plan) if gpus else []:
        console.print()
        console.print(table)
    if plan.changed_gpus is not None:
        console.print()
        console.print(f"GPUs changed since the previous plan: {plan.changed_gpus}")


def report_text(plan: Plan, cfg: FactoryConfig, *, gpus: bool = False, width: int = 200) -> str:
    """The report as plain text at most `width` columns wide, without the spaces rich pads lines
    with (what `ai-factory plan` prints when its output is not a terminal)."""
    out = io.StringIO()
    print_report(Console(file=out, width=width, color_system=None, highlight=False), plan, cfg, gpus=gpus)
    return "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())
