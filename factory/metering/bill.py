"""`ai-factory bill`: a per-tenant GPU bill for a period, from an offline export of the metering series.

**Export format** (JSON lines): one series per line, exactly as an element of a Prometheus
range-query result (`data.result[]` of `/api/v1/query_range`):

    {"metric": {"__name__": "aif:tenant_gpu_equivalents:allocated", "tenant": "search", ...},
     "values": [[1764547200, "8"], [1764547260, "8"], ...]}

Only the series of the metering rules are read (`aif:tenant_gpu_equivalents:allocated`,
`aif:tenant_gpu_equivalents:used`, `aif:pool_gpu_equivalents:idle`, `aif:pool_gpus`); other series
are ignored. Query them at the rules' step (60 s): each sample at `t` in `[start, end)` counts for
one step, so GPU-hours = Σ samples × step / 3600.

**Output** (a directory, written whole or not at all):
- `bill.csv`: one row per tenant, pool, GPU model and sharing mode, in FOCUS (FinOps Open Cost
  and Usage Specification) columns, our own prefixed `x_` as FOCUS asks: allocated GPU-hours
  are the priced quantity, used GPU-hours and utilisation (used / allocated) are reported;
- `totals.csv`: per pool, the physical GPU-hours of the period, how many were billed to tenants,
  how many idle, and what is left unreconciled (physical - billed - idle; zero up to rounding);
- `gpu-hours.svg`: GPU-hours per tenant stacked by sharing mode, and idle per pool.
"""

from __future__ import annotations

import csv
import io
import json
import math
import mmap
import os
import shutil
import tempfile
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import astuple, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec

from ai_factory.factory.heap import no_cycle_collection
from ai_factory.factory.metering.rules import INTERVAL_SECONDS, POOL_GPUS, POOL_IDLE, TENANT_ALLOCATED, TENANT_USED, UNASSIGNED
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.loading import ConfigError
from ai_factory.factory.model.tenancy import tenant_names
from ai_factory.factory.planning.credits import TENANT_ENTITLED, TENANT_UNAVAILABLE, tenant_credit

MAX_PERIOD_DAYS = 366
MAX_EXPORT_BYTES = 8 * 1024**3
MAX_LISTED_PROBLEMS = 50
"""Problems of an export are listed up to this many (then counted), not one per bad line."""
RECONCILE_TOLERANCE_HOURS = 1e-6
MIN_STEP, MAX_STEP = 1, 3600
MIN_PART_BYTES = 32 * 1024**2
"""An export is read in parallel parts of at least this size (smaller ones in one process)."""
RELEASE_BYTES = 64 * 1024**2
"""How much of the mapped export a reader holds before handing the pages read back."""
LITELLM_SPEND = "litellm_spend_metric_total"
LITELLM_TOKENS = "litellm_total_tokens_metric_total"
LITELLM = frozenset({LITELLM_SPEND, LITELLM_TOKENS})
"""LiteLLM's Prometheus counters (its `prometheus` callback), per `team_alias`, `model`, key and user."""
AVAILABILITY = frozenset({TENANT_UNAVAILABLE, TENANT_ENTITLED})
METERING = frozenset({TENANT_ALLOCATED, TENANT_USED, POOL_IDLE, POOL_GPUS})
READ = METERING | AVAILABILITY | LITELLM

FOCUS_COLUMNS = (
    "BillingAccountId",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ChargeCategory",
    "ChargeDescription",
    "BillingCurrency",
    "ListUnitPrice",
    "ListCost",
    "BilledCost",
    "EffectiveCost",
    "PricingQuantity",
    "PricingUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "SkuId",
    "SubAccountId",
    "SubAccountName",
    "x_Pool",
    "x_GpuModel",
    "x_SharingMode",
    "x_AllocatedGpuHours",
    "x_UsedGpuHours",
    "x_Utilisation",
)
TOTAL_COLUMNS = ("pool", "gpu_model", "mode", "physical_gpu_hours", "billed_gpu_hours", "idle_gpu_hours", "unreconciled_gpu_hours", "billed_cost", "currency")


@dataclass(frozen=True)
class Period:
    start: datetime
    end: datetime

    @property
    def bounds(self) -> tuple[float, float]:
        return self.start.timestamp(), self.end.timestamp()


def parse_time(text: str, field: str) -> datetime:
    """An ISO 8601 instant; without an offset it is UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError([f"{field}: {text!r} is not an ISO 8601 date or time (e.g. 2026-11-01 or 2026-11-01T00:00:00Z)"], "bill") from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def period_problems(period: Period) -> list[str]:
    if period.end <= period.start:
        return [f"period: end {period.end.isoformat()} is not after start {period.start.isoformat()}"]
    if (period.end - period.start).days > MAX_PERIOD_DAYS:
        return [f"period: {(period.end - period.start).days} days is longer than {MAX_PERIOD_DAYS}"]
    return []


def price_problems(cfg: FactoryConfig) -> list[str]:
    prices = cfg.layers.metrics.prices.gpu_hour
    models = sorted({p.gpu.model for p in cfg.fleet.pools})
    return [
        f"layers.metrics.prices.gpu_hour: no price for GPU model {model!r} of the fleet (pools {', '.join(p.name for p in cfg.fleet.pools if p.gpu.model == model)})"
        for model in models
        if model not in prices
    ]


Key = tuple[str, str, str, str]
"""(tenant, pool, gpu_model, mode)."""
PoolKey = tuple[str, str, str]


@dataclass
class Sums:
    """What the bill integrates over the period. Gauges (GPU-equivalents) are summed samples
    (× step = GPU-seconds); LiteLLM's counters are increases."""

    allocated: dict[Key, float]
    used: dict[Key, float]
    idle: dict[PoolKey, float]
    physical: dict[PoolKey, float]
    unavailable: dict[str, float] = field(default_factory=dict)
    """Per tenant: summed GPU-equivalents the health layer saw unavailable (SLO credits)."""
    entitled: dict[str, float] = field(default_factory=dict)
    spend: dict[tuple[str, str], float] = field(default_factory=dict)
    """(tenant, model): LiteLLM's spend over the period."""
    tokens: dict[tuple[str, str], float] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> Sums:
        return cls(*(defaultdict(float) for _ in range(8)))

    def add(self, other: Sums) -> None:
        for name in SUM_FIELDS:
            mine = getattr(self, name)
            for key, value in getattr(other, name).items():
                mine[key] += value


SUM_FIELDS = ("allocated", "used", "idle", "physical", "unavailable", "entitled", "spend", "tokens")
Pools = dict[str, tuple[str, str]]
Samples = list[tuple[float, float]]


class _Series(msgspec.Struct):
    metric: dict[str, str]
    values: msgspec.Raw
    """Decoded only for the series the bill reads."""


class _Decoded(msgspec.Struct):
    metric: dict[str, str]
    values: Samples


_SERIES = msgspec.json.Decoder(_Series)
# strict=False reads Prometheus' quoted sample values ("0.25") as floats, in C: parsing the values
# is most of a bill's time. (Label values stay strict: lax mode turns nothing into a string.)
_VALUES = msgspec.json.Decoder(list[tuple[float, float]], strict=False)
_LINE = msgspec.json.Decoder(_Decoded, strict=False)
"""A whole line in one pass, which is what an export of the bill's own series holds; a line it
refuses is read again in two steps to say which part is wrong (`_line_problem`)."""
SERIES_SHAPE = 'not a range-query series ({"metric": {"__name__": ..., label: "value"}, "values": [[t, v], ...]})'
VALUES_SHAPE = 'values must be [unix time, "number"] pairs'


@dataclass(frozen=True)
class Context:
    """What a series is checked against: the config's pools and tenants, and the period."""

    pools: Pools
    tenants: frozenset[str]
    start: float
    end: float

    @classmethod
    def of(cls, cfg: FactoryConfig, period: Period) -> Context:
        return cls(
            {p.name: (p.gpu.model, p.sharing) for p in cfg.fleet.pools},
            frozenset({t.name for t in cfg.tenants} | {UNASSIGNED}),
            *period.bounds,
        )


def add_series(sums: Sums, ctx: Context, metric: dict[str, str], values: Samples) -> str | None:
    """Add one series of a known name to the sums; the problem if it does not fit the config."""
    name = metric["__name__"]
    if name in LITELLM:
        # A request without a team (the master key, a key of no team) is the platform's.
        tenant = metric.get("team_alias") or UNASSIGNED
        if tenant not in ctx.tenants:
            return f"{name} of unknown tenant {tenant!r} (label team_alias: a tenant's LiteLLM team is named after it)"
        total = counter_increase(values, ctx.start, ctx.end)
        target = sums.spend if name == LITELLM_SPEND else sums.tokens
        key: Any = (tenant, metric.get("model", ""))
    elif name in AVAILABILITY:
        tenant = metric.get("tenant", "")
        if tenant not in ctx.tenants:
            return f"{name} of unknown tenant {tenant!r}"
        total, target, key = _gauge(values, ctx), (sums.entitled if name == TENANT_ENTITLED else sums.unavailable), tenant
    else:
        pool = metric.get("pool", "")
        if pool not in ctx.pools:
            return f"{name} of unknown pool {pool!r} (the fleet's pools: {', '.join(sorted(ctx.pools))})"
        if (metric.get("gpu_model"), metric.get("mode")) != ctx.pools[pool]:
            return f"{name} says pool {pool} is {metric.get('gpu_model')}/{metric.get('mode')}; the config says {'/'.join(ctx.pools[pool])}"
        key = (pool, *ctx.pools[pool])
        if name in (TENANT_ALLOCATED, TENANT_USED):
            tenant = metric.get("tenant", "")
            if tenant not in ctx.tenants:
                return f"{name} of unknown tenant {tenant!r}"
            key = (tenant, *key)
        total = _gauge(values, ctx)
        target = {TENANT_ALLOCATED: sums.allocated, TENANT_USED: sums.used, POOL_IDLE: sums.idle, POOL_GPUS: sums.physical}[name]
    if not math.isfinite(total):
        return f"{name}: a sample is not a finite number (NaN or ±Inf), which no bill can add up"
    target[key] += total
    return None


def _gauge(values: Samples, ctx: Context) -> float:
    start, end = ctx.start, ctx.end
    return math.fsum(v for t, v in values if start <= t < end)


def counter_increase(values: Samples, start: float, end: float) -> float:
    """A counter's increase from its samples in [start, end], end included so that consecutive
    periods share their boundary sample and no increase is lost or counted twice; a drop is a
    counter reset (the process restarted), after which the counter counts from zero."""
    total, last = 0.0, None
    for t, v in sorted((t, v) for t, v in values if start <= t <= end):
        if last is not None:
            total += v - last if v >= last else v
        last = v
    return total


def _read_part(path: Path, begin: int, stop: int, ctx: Context):
    """Sums and problems of the lines in bytes [begin, stop) of the export (whole lines); problems
    carry the line's number within the part, and the part's line count comes back too."""
    sums = Sums.empty()
    problems: list[tuple[int, str]] = []
    number = 0
    # The decoded samples are millions of tuples of floats and no cycle: the cyclic collector's
    # passes over them would be a fifth of the reading's time, for nothing.
    with no_cycle_collection():
        # Lines are decoded where the file is mapped, not copied out of it; the pages read are
        # handed back as the reading goes, so the process holds at most RELEASE_BYTES of them.
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                position, released = begin, begin - begin % mmap.PAGESIZE
                while position < stop:
                    newline = mapped.find(b"\n", position, stop)
                    finish = stop if newline < 0 else newline
                    number += 1
                    problem = _add_line(sums, ctx, view[position:finish])
                    position = finish + 1
                    if problem:
                        problems.append((number, problem))
                    if position - released >= RELEASE_BYTES:
                        done = position - position % mmap.PAGESIZE
                        mapped.madvise(mmap.MADV_DONTNEED, released, done - released)
                        released = done
            finally:
                view.release()
    return sums, problems, number


def _add_line(sums: Sums, ctx: Context, line: memoryview) -> str | None:
    try:
        series = _LINE.decode(line)
    except msgspec.DecodeError:
        return _line_problem(sums, ctx, line)
    name = series.metric.get("__name__")
    if name is None:
        return SERIES_SHAPE
    return add_series(sums, ctx, series.metric, series.values) if name in READ else None


def _line_problem(sums: Sums, ctx: Context, line: memoryview) -> str | None:
    """A line the one-pass decoder refused: blank (skipped), not a series, a series the bill does
    not read (whatever its samples), or a read series whose samples are not numbers."""
    if not bytes(line).strip():
        return None
    try:
        series = _SERIES.decode(line)
        name = series.metric["__name__"]
    except (msgspec.DecodeError, KeyError):
        return SERIES_SHAPE
    if name not in READ:
        return None
    try:
        values = _VALUES.decode(series.values)
    except msgspec.DecodeError:
        return VALUES_SHAPE
    return add_series(sums, ctx, series.metric, values)


def _parts(path: Path, size: int, jobs: int) -> list[tuple[int, int]]:
    """Byte ranges of about equal size, cut after a newline."""
    cuts = [0]
    with path.open("rb") as f:
        for i in range(1, jobs):
            f.seek(max(cuts[-1], size * i // jobs))
            f.readline()
            cuts.append(min(f.tell(), size))
    cuts.append(size)
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def read_export(path: Path, cfg: FactoryConfig, period: Period, jobs: int = 1) -> Sums:
    """Sum every series the bill reads over the period; every problem at once. With `jobs` > 1,
    parts of the file are read in that many processes (results do not depend on it beyond float
    rounding far below the bill's six decimals)."""
    try:
        size = path.stat().st_size
    except OSError as err:
        raise ConfigError([f"export: cannot read {path}: {err.strerror}"], "bill") from None
    if size > MAX_EXPORT_BYTES:
        raise ConfigError([f"export: {path} is {size} bytes, more than {MAX_EXPORT_BYTES}"], "bill")
    ctx = Context.of(cfg, period)
    parts = _parts(path, size, max(1, min(jobs, size // MIN_PART_BYTES)))
    arguments = [(path, a, b, ctx) for a, b in parts]
    if len(parts) > 1:
        with ProcessPoolExecutor(len(parts)) as pool:
            results = list(pool.map(_read_part, *zip(*arguments)))
    else:
        results = [_read_part(*a) for a in arguments]
    sums = Sums.empty()
    problems: list[str] = []
    first = 0
    for part_sums, part_problems, lines in results:
        sums.add(part_sums)
        problems += [f"export line {first + n}: {message}" for n, message in part_problems]
        first += lines
    raise_problems(problems)
    return sums


def raise_problems(problems: list[str]) -> None:
    if problems:
        listed = problems[:MAX_LISTED_PROBLEMS]
        if len(problems) > len(listed):
            listed.append(f"{len(problems) - len(listed)} more problem(s) not listed")
        raise ConfigError(listed, "bill")


def _hours(samples: float, step: int) -> float:
    return samples * step / 3600


def _fmt(value: float) -> str:
    return f"{value:.6f}"


def instant(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class OpenCostCosts:
    """What OpenCost's allocation API says a tenant's namespace cost over the period."""

    cpu_core_hours: float = 0.0
    cpu_cost: float = 0.0
    ram_gib_hours: float = 0.0
    ram_cost: float = 0.0
    pv_gib_hours: float = 0.0
    pv_cost: float = 0.0
    network_gib: float = 0.0
    network_cost: float = 0.0

    def __add__(self, other: OpenCostCosts) -> OpenCostCosts:
        return OpenCostCosts(*(a + b for a, b in zip(astuple(self), astuple(other))))


@dataclass(frozen=True)
class OpenCost:
    tenants: dict[str, OpenCostCosts]
    unattributed: float
    """The cost of every other allocation (platform namespaces, `__idle__`, `__unallocated__`)."""


OPENCOST_SHAPE = 'not an OpenCost allocation response ({"code": 200, "data": [{"<namespace>": {"cpuCost": ..., "window": {...}}}]})'
OPENCOST_NUMBERS = ("cpuCoreHours", "cpuCost", "ramByteHours", "ramCost", "pvByteHours", "pvCost", "networkTransferBytes", "networkCost", "totalCost")
MAX_OPENCOST_BYTES = 256 * 1024**2
MAX_OPENCOST_MESSAGE = 200
GIB = 1024.0**3


def read_opencost(path: Path, cfg: FactoryConfig, period: Period) -> OpenCost:
    """OpenCost's `/allocation?window=<start>,<end>&aggregate=namespace` response, saved as a file
    (see `opencost_costs`)."""
    try:
        if path.stat().st_size > MAX_OPENCOST_BYTES:
            raise ConfigError([f"opencost: {path} is larger than {MAX_OPENCOST_BYTES} bytes"], "bill")
        document = json.loads(path.read_bytes())
    except OSError as err:
        raise ConfigError([f"opencost: cannot read {path}: {err.strerror}"], "bill") from None
    except ValueError:
        raise ConfigError([f"opencost: {path}: {OPENCOST_SHAPE}"], "bill") from None
    return opencost_costs(document, str(path), cfg, period)


def opencost_costs(document: Any, source: str, cfg: FactoryConfig, period: Period) -> OpenCost:
    """The tenants' costs in an allocation response read from `source` (one set with
    `accumulate=true`, or one per step: they are added up). A tenant's namespace is its
    allocation; every allocation's window must lie within the bill's period."""
    sets = document.get("data") if isinstance(document, dict) and document.get("code") == 200 else None
    if not isinstance(sets, list) or not all(isinstance(s, dict) for s in sets):
        # OpenCost wraps an error it hit in a code-500 envelope with a message.
        said = document.get("message") if isinstance(document, dict) else None
        reason = f" (OpenCost says: {said[:MAX_OPENCOST_MESSAGE]})" if isinstance(said, str) and said else ""
        raise ConfigError([f"opencost: {source}: {OPENCOST_SHAPE}{reason}"], "bill")
    tenant_of = {tenant_names(t).namespace: t.name for t in cfg.tenants}
    start, end = period.bounds
    tenants: dict[str, OpenCostCosts] = {}
    unattributed, problems = 0.0, []
    for i, allocations in enumerate(sets):
        for name, allocation in sorted(allocations.items()):
            where = f"opencost: data[{i}].{name}"
            if not isinstance(allocation, dict):
                problems.append(f"{where}: not an allocation object")
                continue
            numbers = {k: allocation.get(k, 0) for k in OPENCOST_NUMBERS}
            bad = [k for k, v in numbers.items() if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0]
            if bad:
                problems.append(f"{where}: {', '.join(bad)} must be non-negative numbers")
                continue
            window = allocation.get("window") if isinstance(allocation.get("window"), dict) else {}
            try:
                lo, hi = (parse_time(str(window[k]).replace("Z", "+00:00"), f"{where}.window.{k}").timestamp() for k in ("start", "end"))
            except (KeyError, ConfigError):
                problems.append(f"{where}: window must have ISO 8601 start and end")
                continue
            if lo < start or hi > end:
                problems.append(f"{where}: window {window['start']}..{window['end']} is outside the bill's period")
                continue
            tenant = tenant_of.get(name)
            if tenant is None:
                unattributed += numbers["totalCost"]
                continue
            costs = OpenCostCosts(
                numbers["cpuCoreHours"], numbers["cpuCost"], numbers["ramByteHours"] / GIB, numbers["ramCost"],
                numbers["pvByteHours"] / GIB, numbers["pvCost"], numbers["networkTransferBytes"] / GIB, numbers["networkCost"],
            )
            tenants[tenant] = tenants.get(tenant, OpenCostCosts()) + costs
    raise_problems(problems)
    return OpenCost(dict(sorted(tenants.items())), unattributed)


@dataclass(frozen=True)
class Bill:
    rows: list[dict[str, str]]
    totals: list[dict[str, str]]
    by_tenant_mode: dict[tuple[str, str], float]
    idle_by_pool: dict[str, float]
    credits: list[dict[str, str]] = field(default_factory=list)
    unattributed_opencost: float = 0.0

    def summary(self) -> str:
        physical = sum(float(t["physical_gpu_hours"]) for t in self.totals)
        billed = sum(float(t["billed_gpu_hours"]) for t in self.totals)
        idle = sum(float(t["idle_gpu_hours"]) for t in self.totals)
        costs: dict[str, float] = defaultdict(float)
        for r in self.rows:
            costs[r["BillingCurrency"]] += float(r["BilledCost"])
        cost = " + ".join(f"{v:.2f} {c}" for c, v in sorted(costs.items())) or "0"
        lines = [
            f"{len(self.rows)} bill line(s); physical {physical:.3f} GPU-hours = billed {billed:.3f} + idle {idle:.3f}"
            f" (unreconciled {physical - billed - idle:.6f}); billed cost {cost}"
        ]
        if self.credits:
            owed = [c for c in self.credits if float(c["credit_gpu_hours"]) > 0]
            lines.append(f"SLO credits: {len(owed)} of {len(self.credits)} tenant(s) owed {sum(float(c['credit_gpu_hours']) for c in owed):.3f} GPU-hours")
        if self.unattributed_opencost:
            lines.append(f"OpenCost: {self.unattributed_opencost:.2f} of cost outside every tenant's namespace (platform, idle), not billed")
        return "\n".join(lines)


def _line(env: str, period: Period, tenant: str, **fields: str) -> dict[str, str]:
    """A FOCUS row of the tenant's with the period's columns; every column present."""
    begin, finish = instant(period.start), instant(period.end)
    row = dict.fromkeys(FOCUS_COLUMNS, "")
    row.update(
        BillingAccountId=env, BillingPeriodStart=begin, BillingPeriodEnd=finish, ChargePeriodStart=begin, ChargePeriodEnd=finish,
        ChargeCategory="Usage", SubAccountId=tenant, SubAccountName=tenant,
    )
    row.update(fields)
    return row


def _priced(cost: float, currency: str, quantity: float, unit: str, price: float | None = None) -> dict[str, str]:
    unit_price = price if price is not None else (cost / quantity if quantity else 0.0)
    return {
        "BillingCurrency": currency, "ListUnitPrice": _fmt(unit_price), "ListCost": _fmt(cost), "BilledCost": _fmt(cost), "EffectiveCost": _fmt(cost),
        "PricingQuantity": _fmt(quantity), "PricingUnit": unit, "ConsumedQuantity": _fmt(quantity), "ConsumedUnit": unit,
    }


OPENCOST_LINES = (
    # (what, FOCUS ServiceCategory, unit, quantity field, cost field)
    ("CPU", "Compute", "Core-Hours", "cpu_core_hours", "cpu_cost"),
    ("memory", "Compute", "GiB-Hours", "ram_gib_hours", "ram_cost"),
    ("storage", "Storage", "GiB-Hours", "pv_gib_hours", "pv_cost"),
    ("network", "Networking", "GiB", "network_gib", "network_cost"),
)
LITELLM_CURRENCY = "USD"
"""LiteLLM prices tokens from its model cost map, in US dollars."""


def compute(cfg: FactoryConfig, env: str, period: Period, sums: Sums, step: int, opencost: OpenCost | None = None) -> Bill:
    prices = cfg.layers.metrics.prices
    rows = []
    gpu_cost: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for key in sorted(sums.allocated):
        tenant, pool, model, mode = key
        allocated = _hours(sums.allocated[key], step)
        used = _hours(sums.used.get(key, 0.0), step)
        price = prices.gpu_hour[model]
        gpu_cost[tenant][0] += allocated * price
        gpu_cost[tenant][1] += allocated
        rows.append(_line(
            env, period, tenant,
            ChargeDescription=f"{mode} {model} GPU-equivalent hours in pool {pool}",
            **_priced(allocated * price, prices.currency, allocated, "GPU-Hours", price),
            ResourceId=f"{env}/{pool}", ResourceName=pool, ResourceType="GPU", ServiceCategory="Compute", ServiceName="ai-factory GPU",
            SkuId=f"{model}/{mode}", x_Pool=pool, x_GpuModel=model, x_SharingMode=mode, x_AllocatedGpuHours=_fmt(allocated),
            x_UsedGpuHours=_fmt(used) if key in sums.used else "",
            x_Utilisation=_fmt(used / allocated) if key in sums.used and allocated else "",
        ))
    namespaces = {t.name: tenant_names(t).namespace for t in cfg.tenants}
    for tenant, costs in (opencost.tenants if opencost else {}).items():
        for what, category, unit, quantity, cost in OPENCOST_LINES:
            amount, count = getattr(costs, cost), getattr(costs, quantity)
            if amount or count:
                rows.append(_line(
                    env, period, tenant, ChargeDescription=f"{what} of namespace {namespaces[tenant]} (OpenCost)",
                    **_priced(amount, prices.currency, count, unit), ResourceId=f"{env}/{namespaces[tenant]}",
                    ResourceName=namespaces[tenant], ResourceType="Namespace", ServiceCategory=category,
                    ServiceName="ai-factory compute (OpenCost)", SkuId=f"opencost/{what}",
                ))
    for tenant, model in sorted(set(sums.spend) | set(sums.tokens)):
        spend, tokens = sums.spend.get((tenant, model), 0.0), sums.tokens.get((tenant, model), 0.0)
        rows.append(_line(
            env, period, tenant, ChargeDescription=f"tokens of model {model or '(none)'} through the model gateway (LiteLLM)",
            **_priced(spend, LITELLM_CURRENCY, tokens, "Tokens"), ResourceId=f"{env}/litellm/{model}", ResourceName=model,
            ResourceType="Model", ServiceCategory="AI and Machine Learning", ServiceName="ai-factory model gateway (LiteLLM)", SkuId=f"litellm/{model}",
        ))
    credit_rows = slo_credits(cfg, sums, step)
    for credit in credit_rows:
        hours = float(credit["credit_gpu_hours"])
        if hours <= 0:
            continue
        cost, billed_hours = gpu_cost.get(credit["tenant"], (0.0, 0.0))
        price = cost / billed_hours if billed_hours else 0.0
        credit["credit_cost"] = _fmt(hours * price)
        rows.append(_line(
            env, period, credit["tenant"], ChargeCategory="Credit",
            ChargeDescription=f"SLO credit: GPU availability {credit['availability']} below the {credit['trust']} target {credit['target']}",
            **_priced(-hours * price, prices.currency, hours, "GPU-Hours", price), ResourceType="GPU", ServiceCategory="Compute",
            ServiceName="ai-factory GPU", SkuId="slo-credit",
        ))
    # Each pool's tenant lines in one pass over them, added up in the same order as ever (so the
    # same figures to the last bit), not one pass per pool.
    billed_by_pool: dict[PoolKey, list[float]] = defaultdict(list)
    for key, samples in sums.allocated.items():
        billed_by_pool[key[1:]].append(_hours(samples, step))
    totals = []
    for pool_key in sorted(set(sums.physical) | set(sums.idle) | set(billed_by_pool)):
        pool, model, mode = pool_key
        billed = sum(billed_by_pool.get(pool_key, ()))
        physical, idle = _hours(sums.physical.get(pool_key, 0.0), step), _hours(sums.idle.get(pool_key, 0.0), step)
        totals.append(
            {
                "pool": pool,
                "gpu_model": model,
                "mode": mode,
                "physical_gpu_hours": _fmt(physical),
                "billed_gpu_hours": _fmt(billed),
                "idle_gpu_hours": _fmt(idle),
                "unreconciled_gpu_hours": _fmt(physical - billed - idle),
                "billed_cost": _fmt(billed * prices.gpu_hour[model]),
                "currency": prices.currency,
            }
        )
    by_tenant_mode: dict[tuple[str, str], float] = defaultdict(float)
    for (tenant, _, _, mode), samples in sums.allocated.items():
        by_tenant_mode[(tenant, mode)] += _hours(samples, step)
    idle_by_pool = {pool: _hours(v, step) for (pool, _, _), v in sorted(sums.idle.items())}
    return Bill(rows, totals, dict(by_tenant_mode), idle_by_pool, credit_rows, opencost.unattributed if opencost else 0.0)


CREDIT_COLUMNS = ("tenant", "trust", "target", "entitled_gpu_hours", "lost_gpu_hours", "availability", "credit_gpu_hours", "credit_cost", "currency")


def slo_credits(cfg: FactoryConfig, sums: Sums, step: int) -> list[dict[str, str]]:
    """Per tenant the health layer reports on, `credits.tenant_credit` of the GPU-hours it was
    entitled to and lost over the period (its availability rules integrated like the metering's);
    a credit is priced at the tenant's mean GPU-hour price in this bill."""
    trust = {t.name: t.trust for t in cfg.tenants}
    result = []
    for tenant in sorted(set(sums.entitled) - {UNASSIGNED}):
        level = trust[tenant]
        c = tenant_credit(tenant, level, getattr(cfg.layers.health.slo, level), _hours(sums.entitled[tenant], step), _hours(sums.unavailable.get(tenant, 0.0), step))
        result.append({
            "tenant": tenant, "trust": level, "target": repr(c.target), "entitled_gpu_hours": _fmt(c.entitled_gpu_hours),
            "lost_gpu_hours": _fmt(c.lost_gpu_hours), "availability": _fmt(c.availability), "credit_gpu_hours": _fmt(c.credit_gpu_hours),
            "credit_cost": _fmt(0.0), "currency": cfg.layers.metrics.prices.currency,
        })
    return result


def _csv(columns: tuple[str, ...], rows: list[dict[str, str]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def svg_chart(bill: Bill) -> str:
    """Horizontal bars: GPU-hours per tenant stacked by sharing mode, then idle per pool."""
    modes = sorted({mode for _, mode in bill.by_tenant_mode})
    colours = dict(zip(modes, ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1")))
    tenants = sorted({tenant for tenant, _ in bill.by_tenant_mode})
    bars = [(f"{t}", [(m, bill.by_tenant_mode.get((t, m), 0.0)) for m in modes]) for t in tenants]
    bars += [(f"idle {p}", [("idle", h)]) for p, h in bill.idle_by_pool.items()]
    colours["idle"] = "#bab0ac"
    widest = max((sum(h for _, h in parts) for _, parts in bars), default=0.0) or 1.0
    row, left, width = 22, 180, 560
    height = row * (len(bars) + 2) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 120}" height="{height}" font-family="sans-serif" font-size="12">']
    out.append(f'<text x="10" y="16">GPU-hours per tenant by sharing mode, and idle per pool (max {widest:.1f})</text>')
    for i, (label, parts) in enumerate(bars):
        y, x = 30 + i * row, float(left)
        out.append(f'<text x="10" y="{y + 14}">{_escape(label)}</text>')
        for mode, hours in parts:
            w = hours / widest * width
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row - 6}" fill="{colours[mode]}"><title>{_escape(mode)}: {hours:.3f}</title></rect>')
            x += w
        out.append(f'<text x="{x + 4:.2f}" y="{y + 14}">{sum(h for _, h in parts):.1f}</text>')
    legend_y = 30 + len(bars) * row + 10
    for i, mode in enumerate([*modes, "idle"]):
        out.append(f'<rect x="{left + i * 110}" y="{legend_y}" width="12" height="12" fill="{colours[mode]}"/>')
        out.append(f'<text x="{left + i * 110 + 16}" y="{legend_y + 11}">{_escape(mode)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write(bill: Bill, out: Path) -> None:
    """All files or none: written to a sibling temporary directory, then moved into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        (staging / "bill.csv").write_text(_csv(FOCUS_COLUMNS, bill.rows))
        (staging / "totals.csv").write_text(_csv(TOTAL_COLUMNS, bill.totals))
        (staging / "gpu-hours.svg").write_text(svg_chart(bill))
        if bill.credits:
            (staging / "credits.csv").write_text(_csv(CREDIT_COLUMNS, bill.credits))
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def unreconciled(bill: Bill) -> list[str]:
    return [
        f"totals: pool {t['pool']}: physical {t['physical_gpu_hours']} GPU-hours != billed {t['billed_gpu_hours']} + idle {t['idle_gpu_hours']}"
        for t in bill.totals
        if abs(float(t["unreconciled_gpu_hours"])) > RECONCILE_TOLERANCE_HOURS
    ]


def make_bill(
    cfg: FactoryConfig,
    env: str,
    start: str,
    end: str,
    out: Path,
    *,
    export: Path | None = None,
    prometheus: str | None = None,
    opencost: Path | None = None,
    opencost_url: str | None = None,
    step: int = INTERVAL_SECONDS,
    jobs: int = 2,
) -> Bill:
    """Check everything, compute, then write; a problem anywhere writes nothing (ConfigError). The
    series come from an offline `export` or a live `prometheus` URL (exactly one); OpenCost's costs,
    if wanted, from a saved response (`opencost`) or its live API (`opencost_url`, at most one)."""
    problems = price_problems(cfg)
    if (export is None) == (prometheus is None):
        problems.append("source: give exactly one of an export file or a Prometheus URL")
    if opencost is not None and opencost_url is not None:
        problems.append("opencost: give a saved response or OpenCost's URL, not both")
    if not MIN_STEP <= step <= MAX_STEP:
        problems.append(f"step: {step} s is outside {MIN_STEP}..{MAX_STEP}")
    instants = []
    for text, name in ((start, "start"), (end, "end")):
        try:
            instants.append(parse_time(text, name))
        except ConfigError as err:
            problems += err.problems
    period = Period(*instants) if len(instants) == 2 else None
    if period is not None:
        problems += period_problems(period)
    if problems or period is None:
        raise ConfigError(problems, "bill")
    # OpenCost first: a wrong URL or file fails before the series' long read.
    if opencost_url is not None:
        from ai_factory.factory.metering.opencost import query_opencost

        costs: OpenCost | None = query_opencost(opencost_url, cfg, period)
    else:
        costs = read_opencost(opencost, cfg, period) if opencost is not None else None
    if export is not None:
        sums = read_export(export, cfg, period, jobs)
    else:
        from ai_factory.factory.metering.prometheus import read_prometheus

        sums = read_prometheus(str(prometheus), cfg, period, step)
    bill = compute(cfg, env, period, sums, step, costs)
    problems = unreconciled(bill)
    if problems:
        raise ConfigError(problems, "bill (the series do not reconcile)")
    write(bill, out)
    return bill
