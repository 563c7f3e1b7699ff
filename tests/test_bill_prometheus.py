"""`ai-factory bill --prometheus`: the live source against a real Prometheus (Debian's `prometheus`,
which `.ci/run` installs), loaded with the same series as an offline export through
`promtool tsdb create-blocks-from openmetrics`; both sources must give byte-identical bills."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

from ai_factory.factory.cli import main
from ai_factory.factory.metering import prometheus as live
from ai_factory.factory.metering.bill import LITELLM_SPEND, LITELLM_TOKENS, Period, parse_time
from ai_factory.factory.planning.credits import TENANT_ENTITLED, TENANT_UNAVAILABLE
from tests.test_bill import START, counter, export, series, stack

PERIOD = ("2025-12-01T00:00:00Z", "2025-12-01T01:00:00Z")
EXTRA = [
    counter(LITELLM_SPEND, {"team_alias": "assistant", "model": "llama-3-8b"}, [(m, 0.5 * m if m < 40 else 0.1 * (m - 40)) for m in range(61)]),
    counter(LITELLM_TOKENS, {"team_alias": "assistant", "model": "llama-3-8b"}, [(m, 100.0 * m) for m in range(61)]),
    series(TENANT_ENTITLED, {"tenant": "search"}, 16.75),
    series(TENANT_UNAVAILABLE, {"tenant": "search"}, 8.0),
]


def binaries() -> tuple[str, str]:
    found = shutil.which("prometheus"), shutil.which("promtool")
    if None in found:
        if os.environ.get("FACTORY_REQUIRE_UPSTREAM"):
            pytest.fail("FACTORY_REQUIRE_UPSTREAM is set but prometheus/promtool are missing (.ci/run installs the `prometheus` package)")
        pytest.skip("prometheus and promtool are not installed (Debian package `prometheus`)")
    return found  # type: ignore[return-value]


def openmetrics(jsonl: Path, target: Path) -> None:
    """The export's series as OpenMetrics text (untyped samples, timestamps in seconds), each
    series' samples together and in time order, as the block importer wants them."""
    out = []
    for line in jsonl.read_text().splitlines():
        s = json.loads(line)
        name = s["metric"]["__name__"]
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s["metric"].items()) if k != "__name__")
        out += [f"{name}{{{labels}}} {v} {t}" for t, v in s["values"]]
    target.write_text("\n".join(out) + "\n# EOF\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A Prometheus on loopback serving the test export's series as stored blocks."""
    prometheus, promtool = binaries()
    root = tmp_path_factory.mktemp("prometheus")
    jsonl = export(root, EXTRA)
    openmetrics(jsonl, root / "series.om")
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(root / "series.om"), str(root / "data")], check=True, capture_output=True, timeout=120)
    (root / "prometheus.yml").write_text("global: {}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [prometheus, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--storage.tsdb.retention.time=100y"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                pytest.fail("prometheus did not become ready")
            time.sleep(0.3)
        yield url, jsonl
    finally:
        process.terminate()
        process.wait(timeout=30)


def run_bill(tmp_path: Path, source: list[str], name: str) -> Path:
    out = tmp_path / name
    assert main(["bill", str(stack(tmp_path)), *source, "--start", PERIOD[0], "--end", PERIOD[1], "--out", str(out)]) == 0
    return out


def test_the_live_source_bills_exactly_what_the_export_of_the_same_series_bills(server, tmp_path, monkeypatch):
    url, jsonl = server
    # Small query windows: a long period is many windows, and they must add up as one.
    monkeypatch.setattr(live, "WINDOW_STEPS", 7)
    from_export = run_bill(tmp_path, ["--export", str(jsonl)], "export")
    from_prometheus = run_bill(tmp_path, ["--prometheus", url], "live")
    files = sorted(p.name for p in from_export.iterdir())
    assert files == ["bill.csv", "credits.csv", "gpu-hours.svg", "totals.csv"]
    for name in files:
        assert (from_prometheus / name).read_bytes() == (from_export / name).read_bytes(), name


def test_an_unreachable_prometheus_exits_2_and_writes_nothing(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "bill"
    code = main(["bill", str(stack(tmp_path)), "--prometheus", f"http://127.0.0.1:{port}", "--start", PERIOD[0], "--end", PERIOD[1], "--out", str(out)])
    assert code == 2 and "query of" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("counter_series, windows", [(False, [(0, 6), (7, 13)]), (True, [(0, 7), (7, 14)])])
def test_query_windows_cover_the_period_once_and_counters_share_their_boundaries(monkeypatch, counter_series, windows):
    monkeypatch.setattr(live, "WINDOW_STEPS", 7)
    period = Period(parse_time("2025-12-01T00:00:00Z", "start"), parse_time("2025-12-01T00:14:00Z", "end"))
    assert list(live.windows(period, 60, counter_series)) == [(START + 60 * a, START + 60 * b) for a, b in windows]
