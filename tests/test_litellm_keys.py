"""The dynamic provider of LiteLLM teams and keys, against a recorded contract of LiteLLM's
management API and OpenBao's KV v2 API.

Why not a real `litellm[proxy]`: it installs from PyPI and starts, but teams and keys need its
PostgreSQL schema, which it migrates with Prisma, and Prisma downloads its query and schema engines
at run time from its own binary host (`binaries.prisma.sh`), which no package registry serves; the
proxy then stops ("Database migration cannot proceed"). The contract below is LiteLLM's documented
request and response shapes for the calls the provider makes.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from ai_factory.components.litellm_keys import ApiError, LiteLLMTeamProvider

MASTER = "sk-master-test"
TOKEN = "openbao-test-token"


class Contract(BaseHTTPRequestHandler):
    """LiteLLM (`/team/*`, `/key/*`, bearer master key) and OpenBao KV v2 (`/v1/<mount>/...`, token header)."""

    calls: list[tuple[str, str, Any]] = []
    issued = 0

    def log_message(self, *args):
        pass

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def _reply(self, status: int, payload: Any = None) -> None:
        data = json.dumps(payload).encode() if payload is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        body = self._body()
        type(self).calls.append((self.command, self.path, body))
        if self.path.startswith("/v1/"):
            if self.headers.get("X-Vault-Token") != TOKEN:
                return self._reply(403, {"errors": ["permission denied"]})
            return self._reply(204) if self.command == "DELETE" else self._reply(200, {"data": {"version": 1}})
        if self.headers.get("Authorization") != f"Bearer {MASTER}":
            return self._reply(401, {"error": {"message": "Authentication Error"}})
        if self.path == "/team/new":
            return self._reply(200, {**body, "spend": 0.0})
        if self.path == "/key/generate":
            type(self).issued += 1
            return self._reply(200, {"key": f"sk-issued-{type(self).issued}", "key_alias": body["key_alias"], "token": "hashed", "team_id": body["team_id"]})
        if self.path in ("/team/update", "/key/delete", "/team/delete"):
            return self._reply(200, {"ok": True})
        return self._reply(404, {"detail": "Not Found"})

    do_POST = do_PATCH = do_DELETE = _handle


@pytest.fixture
def server():
    Contract.calls, Contract.issued = [], 0
    httpd = HTTPServer(("127.0.0.1", 0), Contract)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()


def props(address: str, **overrides: Any) -> dict[str, Any]:
    return {
        "api_address": address,
        "master_key": MASTER,
        "openbao_address": address,
        "openbao_token": TOKEN,
        "kv_mount": "secret",
        "secret_path": "tenants/search/litellm",
        "team_id": "tenant-search",
        "team_alias": "search",
        "models": ["search/llama-8b"],
        "max_budget": 100.0,
        "budget_duration": "30d",
        "tpm_limit": 1000,
        "rpm_limit": 10,
        "keys": 2,
        **overrides,
    }


def test_create_makes_the_team_with_its_budget_and_writes_every_key_to_openbao_only(server):
    result = LiteLLMTeamProvider().create(props(server))
    team, key0, key1, stored = Contract.calls
    assert team[:2] == ("POST", "/team/new")
    assert {k: team[2][k] for k in ("team_id", "models", "max_budget", "budget_duration", "tpm_limit", "rpm_limit")} == {
        "team_id": "tenant-search", "models": ["search/llama-8b"], "max_budget": 100.0, "budget_duration": "30d", "tpm_limit": 1000, "rpm_limit": 10,
    }
    assert [c[2]["key_alias"] for c in (key0, key1)] == ["tenant-search-key-0", "tenant-search-key-1"]
    assert stored == ("POST", "/v1/secret/data/tenants/search/litellm", {"data": {"key-0": "sk-issued-1", "key-1": "sk-issued-2"}})
    assert result.id == "tenant-search"
    assert "sk-issued" not in json.dumps(result.outs)
    assert result.outs["key_properties"] == ["key-0", "key-1"]


def test_a_budget_change_updates_the_team_in_place(server):
    provider = LiteLLMTeamProvider()
    old, new = props(server), props(server, max_budget=50.0)
    diff = provider.diff("tenant-search", old, new)
    assert diff.changes and not diff.replaces
    provider.update("tenant-search", old, new)
    assert Contract.calls == [("POST", "/team/update", {"team_id": "tenant-search", **{k: new[k] for k in ("team_alias", "models", "max_budget", "budget_duration", "tpm_limit", "rpm_limit")}})]


def test_more_keys_are_issued_and_merged_into_openbao_fewer_are_revoked(server):
    provider = LiteLLMTeamProvider()
    provider.update("tenant-search", props(server, keys=1), props(server, keys=2))
    assert Contract.calls[1][2]["key_alias"] == "tenant-search-key-1"
    assert Contract.calls[2] == ("PATCH", "/v1/secret/data/tenants/search/litellm", {"data": {"key-1": "sk-issued-1"}})
    Contract.calls.clear()
    provider.update("tenant-search", props(server, keys=2), props(server, keys=1))
    assert Contract.calls[1] == ("POST", "/key/delete", {"key_aliases": ["tenant-search-key-1"]})


def test_moving_the_team_replaces_it(server):
    diff = LiteLLMTeamProvider().diff("tenant-search", props(server), props(server, team_id="tenant-other"))
    assert diff.replaces == ["team_id"]


def test_delete_revokes_the_keys_the_team_and_the_stored_secret(server):
    outs = LiteLLMTeamProvider().create(props(server)).outs
    Contract.calls.clear()
    LiteLLMTeamProvider().delete("tenant-search", outs)
    assert Contract.calls == [
        ("POST", "/key/delete", {"key_aliases": ["tenant-search-key-0", "tenant-search-key-1"]}),
        ("POST", "/team/delete", {"team_ids": ["tenant-search"]}),
        ("DELETE", "/v1/secret/metadata/tenants/search/litellm", None),
    ]


def test_a_refused_call_names_the_call_and_never_the_key(server):
    with pytest.raises(ApiError) as error:
        LiteLLMTeamProvider().create(props(server, master_key="sk-wrong"))
    assert str(error.value).endswith("/team/new: HTTP 401") and "sk-wrong" not in str(error.value)
