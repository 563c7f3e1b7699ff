"""`ai-factory bill`: FOCUS lines priced from the config, totals that reconcile, and bad input refused
with exit 2 and nothing written."""

from __future__ import annotations

import csv
import gc
import json
import os
from pathlib import Path

import pytest
import yaml

from ai_factory.factory.cli import main
from ai_factory.factory.metering import bill as metering
from ai_factory.factory.metering.bill import FOCUS_COLUMNS, LITELLM_SPEND, LITELLM_TOKENS, counter_increase
from ai_factory.factory.metering.rules import POOL_GPUS, POOL_IDLE, TENANT_ALLOCATED, TENANT_USED
from ai_factory.factory.model.loading import load_stack_file
from ai_factory.factory.planning.credits import TENANT_ENTITLED, TENANT_UNAVAILABLE
from tests.conftest import REPO

START = 1_764_547_200  # 2025-12-01T00:00:00Z
POOLS = {"h100-train": ("H100-80GB", "exclusive", 32), "a100-mig": ("A100-80GB", "mig", 16), "l40s-infer": ("L40S-48GB", "hami", 8)}
ALLOCATED = {("search", "h100-train"): 16.0, ("partner-acme", "h100-train"): 8.0, ("assistant", "a100-mig"): 0.75, ("assistant", "l40s-infer"): 0.8}
USED = {("search", "h100-train"): 4.0}
PRICES = {"H100-80GB": 2.90, "A100-80GB": 1.60, "L40S-48GB": 0.95}


def series(name: str, labels: dict[str, str], value: float, minutes: int = 60, offset: int = 0) -> dict:
    return {"metric": {"__name__": name, **labels}, "values": [[START + 60 * (offset + i), repr(value)] for i in range(minutes)]}


def pool_labels(pool: str) -> dict[str, str]:
    model, mode, _ = POOLS[pool]
    return {"pool": pool, "gpu_model": model, "mode": mode}


def export(tmp_path: Path, extra: list[dict] = ()) -> Path:
    lines = []
    for (tenant, pool), value in ALLOCATED.items():
        labels = {"tenant": tenant, "namespace": f"tenant-{tenant}", **pool_labels(pool)}
        lines.append(series(TENANT_ALLOCATED, labels, value))
        # A sample after the period: not billed.
        lines.append(series(TENANT_ALLOCATED, labels, value, minutes=1, offset=60))
        if (tenant, pool) in USED:
            lines.append(series(TENANT_USED, labels, USED[tenant, pool]))
    for pool, (_, _, gpus) in POOLS.items():
        billed = sum(v for (_, p), v in ALLOCATED.items() if p == pool)
        lines.append(series(POOL_IDLE, pool_labels(pool), gpus - billed))
        lines.append(series(POOL_GPUS, pool_labels(pool), gpus))
    lines.append(series("up", {"job": "dcgm"}, 1))
    lines += list(extra)
    path = tmp_path / "export.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def stack(tmp_path: Path, edit=None) -> Path:
    document = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())
    if edit:
        edit(document["config"])
    path = tmp_path / "Pulumi.billtest.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def bill(tmp_path: Path, *, start="2025-12-01T00:00:00Z", end="2025-12-01T01:00:00Z", extra=(), edit=None, opencost=None) -> tuple[int, Path]:
    out = tmp_path / "bill"
    argv = ["bill", str(stack(tmp_path, edit)), "--export", str(export(tmp_path, extra)), "--start", start, "--end", end, "--out", str(out)]
    if opencost is not None:
        (tmp_path / "opencost.json").write_text(json.dumps(opencost))
        argv += ["--opencost", str(tmp_path / "opencost.json")]
    return main(argv), out


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_each_tenant_pool_line_prices_its_allocated_gpu_hours_in_focus_columns(tmp_path):
    code, out = bill(tmp_path)
    assert code == 0
    lines = rows(out / "bill.csv")
    assert tuple(lines[0]) == FOCUS_COLUMNS
    got = {(r["SubAccountId"], r["x_Pool"]): r for r in lines}
    assert set(got) == set(ALLOCATED)
    for (tenant, pool), value in ALLOCATED.items():
        line = got[tenant, pool]
        assert float(line["PricingQuantity"]) == pytest.approx(value)
        assert float(line["BilledCost"]) == pytest.approx(value * PRICES[POOLS[pool][0]])
        assert line["BillingCurrency"] == "EUR" and line["PricingUnit"] == "GPU-Hours"
    search = got["search", "h100-train"]
    assert float(search["x_UsedGpuHours"]) == pytest.approx(4.0) and float(search["x_Utilisation"]) == pytest.approx(0.25)
    assert got["assistant", "l40s-infer"]["x_UsedGpuHours"] == ""


def test_totals_reconcile_physical_with_billed_plus_idle_per_pool(tmp_path):
    code, out = bill(tmp_path)
    assert code == 0
    for total in rows(out / "totals.csv"):
        gpus = POOLS[total["pool"]][2]
        assert float(total["physical_gpu_hours"]) == pytest.approx(gpus)
        assert float(total["billed_gpu_hours"]) + float(total["idle_gpu_hours"]) == pytest.approx(gpus)
        assert abs(float(total["unreconciled_gpu_hours"])) < 1e-9
    assert (out / "gpu-hours.svg").read_text().startswith("<svg")


def test_the_same_export_gives_byte_identical_files(tmp_path):
    outputs = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        code, out = bill(tmp_path / run)
        assert code == 0
        outputs.append({p.name: p.read_bytes() for p in out.iterdir()})
    assert outputs[0] == outputs[1] and set(outputs[0]) == {"bill.csv", "totals.csv", "gpu-hours.svg"}


def _drop_price(config):
    del config["ai-factory:layers"]["metrics"]["prices"]["gpu_hour"]["L40S-48GB"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"edit": _drop_price}, "no price for GPU model 'L40S-48GB'"),
        ({"start": "2025-12-02", "end": "2025-12-01"}, "is not after start"),
        ({"start": "yesterday"}, "start: 'yesterday' is not an ISO 8601"),
        ({"end": "2027-12-01"}, "longer than 366"),
        ({"extra": [series(TENANT_ALLOCATED, {"tenant": "mallory", "namespace": "tenant-mallory", **pool_labels("h100-train")}, 1)]}, "unknown tenant 'mallory'"),
        ({"extra": [series(POOL_IDLE, {"pool": "b200-x", "gpu_model": "B200", "mode": "exclusive"}, 1)]}, "unknown pool 'b200-x'"),
        ({"extra": [series(POOL_GPUS, {"pool": "h100-train", "gpu_model": "A100-80GB", "mode": "exclusive"}, 1)]}, "the config says H100-80GB/exclusive"),
        ({"extra": [series(POOL_GPUS, pool_labels("a100-mig"), 1)]}, "physical 17.000000 GPU-hours != billed"),
    ],
)
def test_bad_input_exits_2_with_the_problem_and_writes_nothing(tmp_path, capsys, kwargs, message):
    code, out = bill(tmp_path, **kwargs)
    assert code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_malformed_export_line_is_named(tmp_path, capsys):
    path = export(tmp_path)
    path.write_text(path.read_text() + "not json\n")
    code = main(["bill", str(stack(tmp_path)), "--export", str(path), "--start", "2025-12-01", "--end", "2025-12-01T01:00", "--out", str(tmp_path / "bill")])
    assert code == 2
    assert f"export line {len(path.read_text().splitlines())}: not a range-query series" in capsys.readouterr().err


@pytest.mark.parametrize(
    "line, message",
    [
        ({"metric": {"__name__": TENANT_USED, "tenant": "search", **pool_labels("h100-train")}, "values": [[START, "lots"]]}, 'values must be [unix time, "number"] pairs'),
        ({"metric": {"__name__": TENANT_USED}, "values": [[START, "1", "2"]]}, 'values must be [unix time, "number"] pairs'),
        ({"metric": {"tenant": "search"}, "values": [[START, "1"]]}, "not a range-query series"),
        ({"metric": {"__name__": POOL_GPUS, "pool": 7}, "values": [[START, "1"]]}, "not a range-query series"),
    ],
)
def test_a_line_that_is_not_a_series_of_numbers_is_named_by_its_number(tmp_path, capsys, line, message):
    code, out = bill(tmp_path, extra=[line])
    assert code == 2
    assert f"export line {len((tmp_path / 'export.jsonl').read_text().splitlines())}: {message}" in capsys.readouterr().err
    assert not out.exists()


def counter(name: str, labels: dict[str, str], points: list[tuple[int, float]]) -> dict:
    """A counter sampled at the given minutes of the period."""
    return {"metric": {"__name__": name, **labels}, "values": [[START + 60 * m, repr(v)] for m, v in points]}


@pytest.mark.parametrize(
    "points, increase",
    [
        ([(0, 5.0), (30, 7.0), (60, 11.0)], 6.0),  # the sample at the period's end is its last
        ([(0, 5.0), (30, 9.0), (40, 2.0), (60, 3.0)], 4.0 + 2.0 + 1.0),  # reset at minute 40
        ([(-1, 1.0), (0, 5.0), (61, 20.0)], 0.0),  # samples outside the period do not count
        ([(10, 3.0)], 0.0),
    ],
)
def test_a_counter_increases_by_its_deltas_over_the_period_restarting_at_resets(points, increase):
    values = [(START + 60.0 * m, v) for m, v in points]
    assert counter_increase(values, START, START + 3600) == pytest.approx(increase)


def test_litellm_spend_and_tokens_are_a_line_per_tenant_and_model_in_dollars(tmp_path):
    team = {"team_alias": "assistant", "team": "uuid-1", "model": "llama-3-8b", "hashed_api_key": "k1"}
    other_key = {**team, "hashed_api_key": "k2"}
    code, out = bill(tmp_path, extra=[
        counter(LITELLM_SPEND, team, [(0, 1.0), (60, 3.5)]),
        counter(LITELLM_SPEND, other_key, [(0, 0.0), (30, 1.0), (31, 0.25), (60, 0.5)]),  # restarted at 31
        counter(LITELLM_TOKENS, team, [(0, 100.0), (60, 4100.0)]),
        counter(LITELLM_SPEND, {"model": "llama-3-8b"}, [(0, 0.0), (60, 2.0)]),  # no team: the platform's
    ])
    assert code == 0
    lines = [r for r in rows(out / "bill.csv") if r["ServiceName"] == "ai-factory model gateway (LiteLLM)"]
    got = {r["SubAccountId"]: r for r in lines}
    assert set(got) == {"assistant", "_unassigned"}
    assistant = got["assistant"]
    assert float(assistant["BilledCost"]) == pytest.approx(2.5 + 1.0 + 0.5) and assistant["BillingCurrency"] == "USD"
    assert (float(assistant["PricingQuantity"]), assistant["PricingUnit"], assistant["ResourceName"]) == (4000.0, "Tokens", "llama-3-8b")


def test_litellm_spend_of_a_team_that_is_no_tenant_is_refused(tmp_path, capsys):
    code, out = bill(tmp_path, extra=[counter(LITELLM_SPEND, {"team_alias": "mallory", "model": "m"}, [(0, 0.0), (60, 1.0)])])
    assert code == 2 and "litellm_spend_metric_total of unknown tenant 'mallory'" in capsys.readouterr().err
    assert not out.exists()


def allocation(cpu_hours=10.0, cpu=0.31, ram_gib_hours=40.0, ram=0.17, pv_gib_hours=100.0, pv=0.005, net_gib=2.0, net=0.0, start="2025-12-01T00:00:00Z", end="2025-12-01T01:00:00Z"):
    gib = 1024**3
    return {
        "cpuCoreHours": cpu_hours, "cpuCost": cpu, "ramByteHours": ram_gib_hours * gib, "ramCost": ram, "pvByteHours": pv_gib_hours * gib,
        "pvCost": pv, "networkTransferBytes": net_gib * gib, "networkCost": net, "gpuCost": 0, "totalCost": cpu + ram + pv + net,
        "window": {"start": start, "end": end},
    }


def test_opencost_prices_each_tenants_cpu_memory_storage_and_network_from_its_namespace(tmp_path, capsys):
    response = {"code": 200, "data": [{"tenant-search": allocation(), "kube-system": allocation(cpu=1.0), "__idle__": allocation(cpu=2.0)}]}
    code, out = bill(tmp_path, opencost=response)
    assert code == 0
    lines = {r["SkuId"]: r for r in rows(out / "bill.csv") if r["ServiceName"] == "ai-factory compute (OpenCost)"}
    # Network cost 0 with 2 GiB moved is still a line: what was consumed is reported.
    assert set(lines) == {"opencost/CPU", "opencost/memory", "opencost/storage", "opencost/network"}
    assert {r["SubAccountId"] for r in lines.values()} == {"search"}
    cpu, ram = lines["opencost/CPU"], lines["opencost/memory"]
    assert (float(cpu["BilledCost"]), float(cpu["PricingQuantity"]), cpu["PricingUnit"], cpu["BillingCurrency"]) == (0.31, 10.0, "Core-Hours", "EUR")
    assert (float(ram["PricingQuantity"]), ram["PricingUnit"], ram["ResourceName"]) == (40.0, "GiB-Hours", "tenant-search")
    assert "3.35 of cost outside every tenant's namespace" in capsys.readouterr().out


@pytest.mark.parametrize(
    "response, message",
    [
        ({"code": 500, "data": []}, "not an OpenCost allocation response"),
        ({"code": 200, "data": [{"tenant-search": allocation(cpu=-1.0)}]}, "data[0].tenant-search: cpuCost, totalCost must be non-negative numbers"),
        ({"code": 200, "data": [{"tenant-search": allocation(end="2025-12-01T02:00:00Z")}]}, "is outside the bill's period"),
        ({"code": 200, "data": [{"tenant-search": {**allocation(), "window": {}}}]}, "window must have ISO 8601 start and end"),
    ],
)
def test_a_bad_opencost_response_exits_2_and_writes_nothing(tmp_path, capsys, response, message):
    code, out = bill(tmp_path, opencost=response)
    assert code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_slo_credits_are_the_loss_beyond_the_target_priced_at_the_tenants_gpu_hour(tmp_path):
    # search (high, 99 %): entitled 16.75 GPU-equivalents for the hour, 8 of them out for 30 minutes.
    availability = [
        series(TENANT_ENTITLED, {"tenant": "search"}, 16.75),
        {"metric": {"__name__": TENANT_UNAVAILABLE, "tenant": "search"}, "values": [[START + 60 * i, "8" if i < 30 else "0"] for i in range(60)]},
        series(TENANT_ENTITLED, {"tenant": "partner-acme"}, 8.0),
        series(TENANT_UNAVAILABLE, {"tenant": "partner-acme"}, 0.0),
    ]
    code, out = bill(tmp_path, extra=availability)
    assert code == 0
    credits = {c["tenant"]: c for c in rows(out / "credits.csv")}
    search, acme = credits["search"], credits["partner-acme"]
    assert float(search["lost_gpu_hours"]) == pytest.approx(4.0) and float(search["availability"]) == pytest.approx(1 - 4 / 16.75)
    assert float(search["credit_gpu_hours"]) == pytest.approx(4.0 - 0.01 * 16.75)
    assert float(acme["credit_gpu_hours"]) == 0
    credit_lines = [r for r in rows(out / "bill.csv") if r["ChargeCategory"] == "Credit"]
    assert [r["SubAccountId"] for r in credit_lines] == ["search"]
    # search's only GPU line in this export is 16 H100-hours at 2.90.
    assert float(credit_lines[0]["BilledCost"]) == pytest.approx(-(4.0 - 0.1675) * 2.90, abs=1e-6)


def test_a_sample_that_is_not_a_finite_number_is_refused(tmp_path, capsys):
    nan = {"metric": {"__name__": TENANT_USED, "tenant": "search", "namespace": "tenant-search", **pool_labels("h100-train")}, "values": [[START, "NaN"]]}
    code, out = bill(tmp_path, extra=[nan])
    assert code == 2 and "not a finite number" in capsys.readouterr().err
    assert not out.exists()


EXPECTED = REPO / "tests" / "expected" / "bill-dev"


def rich_export_lines() -> list[dict | str]:
    """Every kind of line an export holds: tenants' and pools' series, samples outside the period,
    LiteLLM's counters (with a reset), availability, a series the bill does not read (with samples
    that are no numbers), blank lines."""
    return [
        counter(LITELLM_SPEND, {"team_alias": "assistant", "model": "llama-3-8b"}, [(m, 0.5 * m if m < 40 else 0.1 * (m - 40)) for m in range(61)]),
        counter(LITELLM_TOKENS, {"team_alias": "assistant", "model": "llama-3-8b"}, [(m, 100.0 * m) for m in range(61)]),
        series(TENANT_ENTITLED, {"tenant": "search"}, 16.75),
        {"metric": {"__name__": TENANT_UNAVAILABLE, "tenant": "search"}, "values": [[START + 60 * i, "8" if i < 30 else "0"] for i in range(60)]},
        {"metric": {"__name__": "node_info", "node": "gpu-1"}, "values": [[START, "up"], [START + 60, None]]},
        "",
        "   ",
    ]


def test_the_bill_of_a_rich_export_is_byte_for_byte_the_recorded_one(tmp_path):
    """The recorded files were written before the export reader was made cheaper (one decoding
    pass, no cyclic GC, the file mapped): the same bytes prove it reads the same. Rewrite them
    (FACTORY_WRITE_EXPECTED=1) only when the bill's format changes on purpose."""
    lines = rich_export_lines()
    path = export(tmp_path, [line for line in lines if isinstance(line, dict)])
    path.write_text(path.read_text() + "".join(line + "\n" for line in lines if isinstance(line, str)))
    out = tmp_path / "bill"
    answer = REPO / "tests" / "contracts" / "opencost-1.120" / "allocation-namespace.json"
    argv = ["bill", str(stack(tmp_path)), "--export", str(path), "--opencost", str(answer), "--start", "2025-12-01T00:00:00Z", "--end", "2025-12-01T01:00:00Z"]
    assert main([*argv, "--out", str(out)]) == 0
    files = sorted(p.name for p in out.iterdir())
    if os.environ.get("FACTORY_WRITE_EXPECTED"):
        EXPECTED.mkdir(parents=True, exist_ok=True)
        for name in files:
            (EXPECTED / name).write_bytes((out / name).read_bytes())
    assert files == sorted(p.name for p in EXPECTED.iterdir()) == ["bill.csv", "credits.csv", "gpu-hours.svg", "totals.csv"]
    for name in files:
        assert (out / name).read_bytes() == (EXPECTED / name).read_bytes(), name


def test_an_export_read_in_parts_sums_and_numbers_its_lines_as_read_whole(tmp_path, monkeypatch):
    cfg = load_stack_file(str(stack(tmp_path)))
    period = metering.Period(metering.parse_time("2025-12-01T00:00:00Z", "start"), metering.parse_time("2025-12-01T01:00:00Z", "end"))
    path = export(tmp_path, [line for line in rich_export_lines() if isinstance(line, dict)])
    whole = metering.read_export(path, cfg, period, jobs=1)
    # Parts as small as can be, each handing its pages back after every line.
    monkeypatch.setattr(metering, "MIN_PART_BYTES", 1)
    monkeypatch.setattr(metering, "RELEASE_BYTES", 1)
    parts = metering.read_export(path, cfg, period, jobs=3)
    for name in metering.SUM_FIELDS:
        assert getattr(parts, name) == pytest.approx(getattr(whole, name)), name
    path.write_text(path.read_text() + "{}\n")
    with pytest.raises(metering.ConfigError) as refused:
        metering.read_export(path, cfg, period, jobs=3)
    assert refused.value.problems == [f"export line {len(path.read_text().splitlines())}: {metering.SERIES_SHAPE}"]


@pytest.mark.parametrize("collecting", [True, False])
def test_reading_an_export_leaves_the_cyclic_collector_as_it_found_it(tmp_path, collecting):
    cfg = load_stack_file(str(stack(tmp_path)))
    period = metering.Period(metering.parse_time("2025-12-01T00:00:00Z", "start"), metering.parse_time("2025-12-01T01:00:00Z", "end"))
    was = gc.isenabled()
    (gc.enable if collecting else gc.disable)()
    try:
        metering.read_export(export(tmp_path), cfg, period)
        assert gc.isenabled() is collecting
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("edit", [lambda text: text.removesuffix("\n"), lambda text: "\n" + text], ids=["no-final-newline", "blank-first-line"])
def test_an_export_without_a_final_newline_or_with_a_blank_first_line_bills_the_same(tmp_path, edit):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    code, out = bill(tmp_path / "a")
    path = export(tmp_path / "b")
    path.write_text(edit(path.read_text()))
    again = tmp_path / "b" / "bill"
    argv = ["bill", str(stack(tmp_path / "b")), "--export", str(path), "--start", "2025-12-01T00:00:00Z", "--end", "2025-12-01T01:00:00Z", "--out", str(again)]
    assert (code, main(argv)) == (0, 0)
    assert (again / "bill.csv").read_bytes() == (out / "bill.csv").read_bytes()
