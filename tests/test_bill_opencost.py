"""`ai-factory bill --opencost-url`: OpenCost's allocation API queried live, against a real HTTP
server on loopback serving OpenCost's answer (tests/contracts/opencost-1.120; OpenCost itself does
not install from a package registry); the same answer saved as a file bills the same bytes; an
OpenCost that fails, answers too much, too slowly or not at all exits 2 and writes nothing."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from ai_factory.factory.cli import main
from ai_factory.factory.metering import opencost as live
from tests.conftest import REPO
from tests.test_bill import export, rows, stack

ANSWER = REPO / "tests" / "contracts" / "opencost-1.120" / "allocation-namespace.json"
PERIOD = ("2025-12-01T00:00:00Z", "2025-12-01T01:00:00Z")


class OpenCostServer:
    """OpenCost's API on loopback: answers `status` with `body` (after `delay` seconds, and the
    body `drip` seconds after the headers) and keeps each request's path, query and headers."""

    def __init__(self) -> None:
        self.status, self.body, self.delay, self.drip, self.headers = 200, ANSWER.read_bytes(), 0.0, 0.0, {}
        self.requests: list[tuple[str, dict[str, list[str]], dict[str, str]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
                parts = urlsplit(self.path)
                server.requests.append((parts.path, parse_qs(parts.query), dict(self.headers)))
                time.sleep(server.delay)
                self.send_response(server.status)
                self.send_header("Content-Type", "application/json")
                for name, value in server.headers.items():
                    self.send_header(name, value)
                if "Content-Length" not in server.headers:
                    self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                try:
                    self.wfile.flush()
                    time.sleep(server.drip)
                    self.wfile.write(server.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, as it should on a too-large or too-slow answer

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)


@pytest.fixture
def opencost():
    server = OpenCostServer()
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def run_bill(tmp_path: Path, costs: list[str], name: str = "bill") -> tuple[int, Path]:
    out = tmp_path / name
    argv = ["bill", str(stack(tmp_path)), "--export", str(export(tmp_path)), *costs, "--start", PERIOD[0], "--end", PERIOD[1], "--out", str(out)]
    return main(argv), out


def test_the_live_answer_bills_exactly_what_the_same_answer_saved_as_a_file_bills(opencost, tmp_path):
    code_file, from_file = run_bill(tmp_path, ["--opencost", str(ANSWER)], "file")
    code_live, from_live = run_bill(tmp_path, ["--opencost-url", opencost.url], "live")
    assert (code_file, code_live) == (0, 0)
    for name in ("bill.csv", "totals.csv", "gpu-hours.svg"):
        assert (from_live / name).read_bytes() == (from_file / name).read_bytes(), name
    lines = [r for r in rows(from_live / "bill.csv") if r["ServiceName"] == "ai-factory compute (OpenCost)"]
    assert {r["SubAccountId"] for r in lines} == {"search", "assistant", "partner-acme"}
    search_cpu = next(r for r in lines if r["SubAccountId"] == "search" and r["SkuId"] == "opencost/CPU")
    assert (float(search_cpu["PricingQuantity"]), float(search_cpu["BilledCost"])) == (48.0, 1.488)


def test_the_query_asks_the_bills_period_per_namespace_accumulated_with_idle_apart(opencost, tmp_path):
    code, _ = run_bill(tmp_path, ["--opencost-url", opencost.url + "/"])
    assert code == 0
    [(path, query, _)] = opencost.requests
    assert path == "/allocation"
    assert query == {
        "window": ["2025-12-01T00:00:00Z,2025-12-01T01:00:00Z"], "aggregate": ["namespace"], "accumulate": ["true"],
        "includeIdle": ["true"], "shareIdle": ["false"],
    }


def test_the_cost_outside_every_tenant_is_reported(opencost, tmp_path, capsys):
    code, _ = run_bill(tmp_path, ["--opencost-url", opencost.url])
    assert code == 0
    # ai-factory-metrics 0.448 + kube-system 0.079 + __idle__ 7.545
    assert "8.07 of cost outside every tenant's namespace" in capsys.readouterr().out


def test_a_bearer_token_comes_from_the_environment_only(opencost, tmp_path, monkeypatch):
    run_bill(tmp_path, ["--opencost-url", opencost.url], "without")
    monkeypatch.setenv(live.TOKEN_ENV, "s3cret")
    run_bill(tmp_path, ["--opencost-url", opencost.url], "with")
    assert [headers.get("Authorization") for _, _, headers in opencost.requests] == [None, "Bearer s3cret"]


def _error_500(server):
    server.body = json.dumps({"code": 500, "status": "error", "message": "error querying Prometheus", "data": None}).encode()


def _http_400(server):
    server.status, server.body = 400, b"Invalid 'window' parameter: illegal window\n"


def _redirect(server):
    server.status, server.body, server.headers = 302, b"", {"Location": "http://127.0.0.1:1/elsewhere"}


def _not_json(server):
    server.body = b"<html>login</html>"


def _too_large_announced(server):
    server.headers = {"Content-Length": str(live.MAX_OPENCOST_BYTES + 1)}
    server.body = b""


def _foreign_namespace_window(server):
    document = json.loads(ANSWER.read_text())
    document["data"][0]["tenant-search"]["window"] = {"start": "2025-11-30T00:00:00Z", "end": "2025-12-01T01:00:00Z"}
    server.body = json.dumps(document).encode()


@pytest.mark.parametrize(
    "answer, message",
    [
        (_error_500, "not an OpenCost allocation response ({\"code\": 200, \"data\": [{\"<namespace>\": {\"cpuCost\": ..., \"window\": {...}}}]}) (OpenCost says: error querying Prometheus)"),
        (_http_400, "/allocation answered HTTP 400: Invalid 'window' parameter: illegal window"),
        (_redirect, "/allocation answered HTTP 302"),
        (_not_json, "/allocation: not an OpenCost allocation response"),
        (_too_large_announced, f"/allocation: the answer is larger than {live.MAX_OPENCOST_BYTES} bytes"),
        (_foreign_namespace_window, "data[0].tenant-search: window 2025-11-30T00:00:00Z..2025-12-01T01:00:00Z is outside the bill's period"),
    ],
)
def test_a_bad_answer_exits_2_with_the_problem_and_writes_nothing(opencost, tmp_path, capsys, answer, message):
    answer(opencost)
    code, out = run_bill(tmp_path, ["--opencost-url", opencost.url])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_an_answer_growing_past_the_bound_is_cut_off(opencost, tmp_path, capsys, monkeypatch):
    # No Content-Length announced: the bound holds on what arrives.
    monkeypatch.setattr(live, "MAX_OPENCOST_BYTES", 1000)
    opencost.headers = {"Content-Length": ""}
    code, out = run_bill(tmp_path, ["--opencost-url", opencost.url])
    assert code == 2 and "the answer is larger than 1000 bytes" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("announced", [True, False])
def test_an_answer_of_exactly_the_bound_is_read_and_one_byte_more_is_not(opencost, tmp_path, capsys, monkeypatch, announced):
    if not announced:
        opencost.headers = {"Content-Length": ""}
    monkeypatch.setattr(live, "MAX_OPENCOST_BYTES", len(opencost.body))
    assert run_bill(tmp_path, ["--opencost-url", opencost.url], "exact")[0] == 0
    monkeypatch.setattr(live, "MAX_OPENCOST_BYTES", len(opencost.body) - 1)
    code, out = run_bill(tmp_path, ["--opencost-url", opencost.url], "over")
    assert code == 2 and f"the answer is larger than {len(opencost.body) - 1} bytes" in capsys.readouterr().err
    assert not out.exists()


def test_a_url_of_exactly_the_length_bound_is_asked(opencost, tmp_path):
    url = opencost.url + "/" + "a" * (live.MAX_URL_LENGTH - len(opencost.url) - 1)
    assert len(url) == live.MAX_URL_LENGTH
    assert run_bill(tmp_path, ["--opencost-url", url])[0] == 0
    assert opencost.requests[0][0] == url.removeprefix(opencost.url) + "/allocation"


@pytest.mark.parametrize("url", ["http://opencost.monitoring:9003", "https://opencost.example.com", "http://127.0.0.1:9003/opencost/"])
def test_opencosts_base_url_over_http_or_https_has_no_problem(url):
    assert live.url_problems(url) == []


def test_an_opencost_slower_than_the_read_timeout_exits_2(opencost, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(live, "READ_TIMEOUT_SECONDS", 0.2)
    opencost.delay = 1.0
    code, out = run_bill(tmp_path, ["--opencost-url", opencost.url])
    assert code == 2 and "/allocation: no answer (ReadTimeout" in capsys.readouterr().err
    assert not out.exists()


def test_an_answer_still_arriving_at_the_deadline_exits_2(opencost, tmp_path, capsys, monkeypatch):
    # Each read is within the read timeout; the whole answer is not within the deadline.
    monkeypatch.setattr(live, "DEADLINE_SECONDS", 0.3)
    opencost.drip = 1.0
    code, out = run_bill(tmp_path, ["--opencost-url", opencost.url])
    assert code == 2 and "/allocation: the answer took longer than 0.3 s" in capsys.readouterr().err
    assert not out.exists()


def test_an_unreachable_opencost_exits_2(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out = run_bill(tmp_path, ["--opencost-url", f"http://127.0.0.1:{port}"])
    assert code == 2 and f"opencost: http://127.0.0.1:{port}/allocation: no answer (ConnectionError" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "url, message",
    [
        ("opencost.opencost:9003", "is not an http(s) URL with a host"),
        ("ftp://opencost:9003", "is not an http(s) URL with a host"),
        ("http://:9003", "is not an http(s) URL with a host"),
        ("http://opencost:99999", "is not a URL"),
        ("http://admin:pw@opencost:9003", "the URL carries credentials; give a bearer token in FACTORY_OPENCOST_TOKEN"),
        ("http://admin@opencost:9003", "the URL carries credentials"),
        ("http://opencost:9003/?window=7d", "has a query or fragment"),
        ("http://opencost/" + "a" * 2048, "more than 2048"),
    ],
)
def test_a_url_that_is_not_opencosts_base_exits_2_before_anything_is_asked(tmp_path, capsys, url, message):
    code, out = run_bill(tmp_path, ["--opencost-url", url])
    assert code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_a_saved_answer_and_a_url_together_are_refused_by_the_command_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_bill(tmp_path, ["--opencost", str(ANSWER), "--opencost-url", "http://opencost:9003"])
    assert exit_.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
