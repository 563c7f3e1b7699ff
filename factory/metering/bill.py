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
import os
import shutil
import tempfile
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ai_factory.factory.metering.rules import INTERVAL_SECONDS, POOL_GPUS, POOL_IDLE, TENANT_ALLOCATED, TENANT_USED, UNASSIGNED
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.loading import ConfigError

MAX_PERIOD_DAYS = 366
MAX_EXPORT_BYTES = 8 * 1024**3
MAX_LISTED_PROBLEMS = 50
"""Problems of an export are listed up to this many (then counted), not one per bad line."""
RECONCILE_TOLERANCE_HOURS = 1e-6
MIN_STEP, MAX_STEP = 1, 3600
MIN_PART_BYTES = 32 * 1024**2
"""An export is read in parallel parts of at least this size (smaller ones in one process)."""
READ = {TENANT_ALLOCATED, TENANT_USED, POOL_IDLE, POOL_GPUS}

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
    """GPU-equivalent samples summed over the period (× step = GPU-seconds)."""

    allocated: dict[Key, float]
    used: dict[Key, float]
    idle: dict[PoolKey, float]
    physical: dict[PoolKey, float]


Pools = dict[str, tuple[str, str]]


def _read_part(path: Path, begin: int, stop: int, pools: Pools, tenants: frozenset[str], period: tuple[float, float]):
    """Sums and problems of the lines in bytes [begin, stop) of the export (whole lines); problems
    carry the line's number within the part, and the part's line count comes back too."""
    start, end = period
    sums: dict[str, dict[tuple[str, ...], float]] = {name: defaultdict(float) for name in READ}
    problems: list[tuple[int, str]] = []
    number = 0
    with path.open("rb") as f:
        f.seek(begin)
        while f.tell() < stop:
            raw = f.readline()
            number += 1
            if not raw.strip():
                continue
            try:
                series = json.loads(raw)
                metric, values = series["metric"], series["values"]
                name = metric["__name__"]
            except (ValueError, KeyError, TypeError):
                problems.append((number, 'not a range-query series ({"metric": {"__name__": ...}, "values": [[t, v], ...]})'))
                continue
            if name not in READ:
                continue
            pool = metric.get("pool", "")
            if pool not in pools:
                problems.append((number, f"{name} of unknown pool {pool!r} (the fleet's pools: {', '.join(sorted(pools))})"))
                continue
            if (metric.get("gpu_model"), metric.get("mode")) != pools[pool]:
                problems.append((number, f"{name} says pool {pool} is {metric.get('gpu_model')}/{metric.get('mode')}; the config says {'/'.join(pools[pool])}"))
                continue
            key: tuple[str, ...] = (pool, *pools[pool])
            if name in (TENANT_ALLOCATED, TENANT_USED):
                tenant = metric.get("tenant", "")
                if tenant not in tenants:
                    problems.append((number, f"{name} of unknown tenant {tenant!r}"))
                    continue
                key = (tenant, *key)
            try:
                total = math.fsum(float(v) for t, v in values if start <= t < end)
            except (ValueError, TypeError):
                problems.append((number, 'values must be [unix time, "number"] pairs'))
                continue
            sums[name][key] += total
    return {name: dict(part) for name, part in sums.items()}, problems, number


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
    """Sum every metering series of the export over the period; every problem at once. With
    `jobs` > 1, parts of the file are read in that many processes (results do not depend on it
    beyond float rounding far below the bill's six decimals)."""
    try:
        size = path.stat().st_size
    except OSError as err:
        raise ConfigError([f"export: cannot read {path}: {err.strerror}"], "bill") from None
    if size > MAX_EXPORT_BYTES:
        raise ConfigError([f"export: {path} is {size} bytes, more than {MAX_EXPORT_BYTES}"], "bill")
    pools = {p.name: (p.gpu.model, p.sharing) for p in cfg.fleet.pools}
    tenants = frozenset({t.name for t in cfg.tenants} | {UNASSIGNED})
    parts = _parts(path, size, max(1, min(jobs, size // MIN_PART_BYTES)))
    arguments = [(path, a, b, pools, tenants, period.bounds) for a, b in parts]
    if len(parts) > 1:
        with ProcessPoolExecutor(len(parts)) as pool:
            results = list(pool.map(_read_part, *zip(*arguments)))
    else:
        results = [_read_part(*a) for a in arguments]
    sums = Sums(defaultdict(float), defaultdict(float), defaultdict(float), defaultdict(float))
    targets = {TENANT_ALLOCATED: sums.allocated, TENANT_USED: sums.used, POOL_IDLE: sums.idle, POOL_GPUS: sums.physical}
    problems: list[str] = []
    first = 0
    for part_sums, part_problems, lines in results:
        for name, values in part_sums.items():
            for key, total in values.items():
                targets[name][key] += total
        problems += [f"export line {first + n}: {message}" for n, message in part_problems]
        first += lines
    if problems:
        listed = problems[:MAX_LISTED_PROBLEMS]
        if len(problems) > len(listed):
            listed.append(f"export: {len(problems) - len(listed)} more problem(s) not listed")
        raise ConfigError(listed, "bill")
    return sums


def _hours(samples: float, step: int) -> float:
    return samples * step / 3600


def _fmt(value: float) -> str:
    return f"{value:.6f}"


def _instant(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Bill:
    rows: list[dict[str, str]]
    totals: list[dict[str, str]]
    by_tenant_mode: dict[tuple[str, str], float]
    idle_by_pool: dict[str, float]

    def summary(self) -> str:
        physical = sum(float(t["physical_gpu_hours"]) for t in self.totals)
        billed = sum(float(t["billed_gpu_hours"]) for t in self.totals)
        idle = sum(float(t["idle_gpu_hours"]) for t in self.totals)
        cost = sum(float(r["BilledCost"]) for r in self.rows)
        currency = self.totals[0]["currency"] if self.totals else ""
        return (
            f"{len(self.rows)} bill line(s); physical {physical:.3f} GPU-hours = billed {billed:.3f} + idle {idle:.3f}"
            f" (unreconciled {physical - billed - idle:.6f}); billed cost {cost:.2f} {currency}"
        )


def compute(cfg: FactoryConfig, env: str, period: Period, sums: Sums, step: int) -> Bill:
    prices = cfg.layers.metrics.prices
    begin, finish = _instant(period.start), _instant(period.end)
    rows = []
    for key in sorted(sums.allocated):
        tenant, pool, model, mode = key
        allocated = _hours(sums.allocated[key], step)
        used = _hours(sums.used.get(key, 0.0), step)
        price = prices.gpu_hour[model]
        cost = allocated * price
        rows.append(
            {
                "BillingAccountId": env,
                "BillingPeriodStart": begin,
                "BillingPeriodEnd": finish,
                "ChargePeriodStart": begin,
                "ChargePeriodEnd": finish,
                "ChargeCategory": "Usage",
                "ChargeDescription": f"{mode} {model} GPU-equivalent hours in pool {pool}",
                "BillingCurrency": prices.currency,
                "ListUnitPrice": _fmt(price),
                "ListCost": _fmt(cost),
                "BilledCost": _fmt(cost),
                "EffectiveCost": _fmt(cost),
                "PricingQuantity": _fmt(allocated),
                "PricingUnit": "GPU-Hours",
                "ConsumedQuantity": _fmt(allocated),
                "ConsumedUnit": "GPU-Hours",
                "ResourceId": f"{env}/{pool}",
                "ResourceName": pool,
                "ResourceType": "GPU",
                "ServiceCategory": "Compute",
                "ServiceName": "ai-factory GPU",
                "SkuId": f"{model}/{mode}",
                "SubAccountId": tenant,
                "SubAccountName": tenant,
                "x_Pool": pool,
                "x_GpuModel": model,
                "x_SharingMode": mode,
                "x_AllocatedGpuHours": _fmt(allocated),
                "x_UsedGpuHours": _fmt(used) if key in sums.used else "",
                "x_Utilisation": _fmt(used / allocated) if key in sums.used and allocated else "",
            }
        )
    totals = []
    for pool_key in sorted(set(sums.physical) | set(sums.idle) | {k[1:] for k in sums.allocated}):
        pool, model, mode = pool_key
        billed = sum(_hours(v, step) for k, v in sums.allocated.items() if k[1:] == pool_key)
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
    return Bill(rows, totals, dict(by_tenant_mode), idle_by_pool)


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


def make_bill(cfg: FactoryConfig, env: str, export: Path, start: str, end: str, out: Path, step: int = INTERVAL_SECONDS, jobs: int = 2) -> Bill:
    """Check everything, compute, then write; a problem anywhere writes nothing (ConfigError)."""
    problems = price_problems(cfg)
    if not MIN_STEP <= step <= MAX_STEP:
        problems.append(f"step: {step} s is outside {MIN_STEP}..{MAX_STEP}")
    instants = []
    for text, field in ((start, "start"), (end, "end")):
        try:
            instants.append(parse_time(text, field))
        except ConfigError as err:
            problems += err.problems
    period = Period(*instants) if len(instants) == 2 else None
    if period is not None:
        problems += period_problems(period)
    if problems or period is None:
        raise ConfigError(problems, "bill")
    sums = read_export(export, cfg, period, jobs)
    bill = compute(cfg, env, period, sums, step)
    problems = unreconciled(bill)
    if problems:
        raise ConfigError(problems, "bill (the export does not reconcile)")
    write(bill, out)
    return bill
