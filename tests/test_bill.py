"""`ai-factory bill`: FOCUS lines priced from the config, totals that reconcile, and bad input refused
with exit 2 and nothing written."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from ai_factory.factory.cli import main
from ai_factory.factory.metering.bill import FOCUS_COLUMNS
from ai_factory.factory.metering.rules import POOL_GPUS, POOL_IDLE, TENANT_ALLOCATED, TENANT_USED
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


def bill(tmp_path: Path, *, start="2025-12-01T00:00:00Z", end="2025-12-01T01:00:00Z", extra=(), edit=None) -> tuple[int, Path]:
    out = tmp_path / "bill"
    code = main(["bill", str(stack(tmp_path, edit)), "--export", str(export(tmp_path, extra)), "--start", start, "--end", end, "--out", str(out)])
    return code, out


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
