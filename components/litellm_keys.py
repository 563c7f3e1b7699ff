"""A tenant's LiteLLM team and virtual keys, created through LiteLLM's management API by a Pulumi
dynamic provider, the keys written straight to OpenBao.

The keys never enter Pulumi: `create` asks LiteLLM for them (`POST /key/generate`) and writes them
to the tenant's path of OpenBao's KV engine in the same call; the resource's outputs are the team
id, the keys' aliases and that path, nothing else. The tenant's namespace receives them through its
own SecretStore (External Secrets). The credentials the provider acts with (LiteLLM's master key,
OpenBao's token) are secret inputs, encrypted in state.

The calls follow LiteLLM's management API (`/team/new`, `/team/update`, `/team/delete`,
`/key/generate`, `/key/delete`, bearer master key) and OpenBao's KV v2 API
(`/v1/<mount>/data/<path>`, `/v1/<mount>/metadata/<path>`, `X-Vault-Token`).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Mapping

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

TIMEOUT_SECONDS = 30
REPLACE_ON = ("team_id", "api_address", "openbao_address", "kv_mount", "secret_path")
"""Inputs naming where the team and its keys live: changing one makes a new team elsewhere."""
SECRET_INPUTS = ("master_key", "openbao_token")
OUTPUTS = ("key_aliases", "key_properties")
TEAM_FIELDS = ("team_alias", "models", "max_budget", "budget_duration", "tpm_limit", "rpm_limit")


class ApiError(Exception):
    """A call LiteLLM or OpenBao refused; the message never holds a key."""


def _call(method: str, url: str, headers: Mapping[str, str], body: Mapping[str, Any] | None = None) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            text = response.read()
    except urllib.error.HTTPError as error:
        raise ApiError(f"{method} {url.split('?')[0]}: HTTP {error.code}") from None
    except OSError as error:
        raise ApiError(f"{method} {url.split('?')[0]}: {error}") from None
    return json.loads(text) if text else {}


def key_alias(team_id: str, index: int) -> str:
    return f"{team_id}-key-{index}"


def key_property(index: int) -> str:
    """The property of the OpenBao secret holding key `index`."""
    return f"key-{index}"


class LiteLLMTeamProvider(ResourceProvider):
    """Team and keys of one tenant (inputs: see `LiteLLMTeam`)."""

    def _litellm(self, props: Mapping[str, Any], path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return _call("POST", f"{props['api_address'].rstrip('/')}{path}", {"Authorization": f"Bearer {props['master_key']}"}, body)

    def _openbao(self, props: Mapping[str, Any], method: str, area: str, body: Mapping[str, Any] | None = None) -> None:
        url = f"{props['openbao_address'].rstrip('/')}/v1/{props['kv_mount']}/{area}/{props['secret_path']}"
        _call(method, url, {"X-Vault-Token": props["openbao_token"]}, body)

    def _team_body(self, props: Mapping[str, Any]) -> dict[str, Any]:
        return {"team_id": props["team_id"], **{k: props[k] for k in TEAM_FIELDS}}

    def _issue_keys(self, props: Mapping[str, Any], indexes: range) -> dict[str, str]:
        keys = {}
        for i in indexes:
            issued = self._litellm(
                props, "/key/generate", {"team_id": props["team_id"], "key_alias": key_alias(props["team_id"], i), "models": props["models"]}
            )
            keys[key_property(i)] = issued["key"]
        return keys

    def _outputs(self, props: Mapping[str, Any]) -> dict[str, Any]:
        """The inputs (delete acts with them; the credentials among them stay secret outputs) and
        where the keys are; never a key."""
        count = int(props["keys"])
        return {
            **{k: v for k, v in props.items() if k not in OUTPUTS},
            "team_id": props["team_id"],
            "key_aliases": [key_alias(props["team_id"], i) for i in range(count)],
            "secret_path": props["secret_path"],
            "key_properties": [key_property(i) for i in range(count)],
        }

    def create(self, props: dict[str, Any]) -> CreateResult:
        self._litellm(props, "/team/new", self._team_body(props))
        keys = self._issue_keys(props, range(int(props["keys"])))
        self._openbao(props, "POST", "data", {"data": keys})
        return CreateResult(id_=props["team_id"], outs=self._outputs(props))

    def diff(self, id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = sorted(k for k in {*REPLACE_ON, *TEAM_FIELDS, "keys", "master_key", "openbao_token"} if olds.get(k) != news.get(k))
        replaces = [k for k in changed if k in REPLACE_ON]
        return DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=True)

    def update(self, id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        self._litellm(news, "/team/update", self._team_body(news))
        before, after = int(olds["keys"]), int(news["keys"])
        if after > before:
            # OpenBao's KV v2 `patch` merges; the keys issued before stay as they are.
            added = self._issue_keys(news, range(before, after))
            url = f"{news['openbao_address'].rstrip('/')}/v1/{news['kv_mount']}/data/{news['secret_path']}"
            _call("PATCH", url, {"X-Vault-Token": news["openbao_token"], "Content-Type": "application/merge-patch+json"}, {"data": added})
        elif after < before:
            self._litellm(news, "/key/delete", {"key_aliases": [key_alias(news["team_id"], i) for i in range(after, before)]})
        return UpdateResult(outs=self._outputs(news))

    def delete(self, id: str, props: dict[str, Any]) -> None:
        self._litellm(props, "/key/delete", {"key_aliases": list(props.get("key_aliases") or [])})
        self._litellm(props, "/team/delete", {"team_ids": [props["team_id"]]})
        self._openbao(props, "DELETE", "metadata")


class LiteLLMTeam(pulumi.dynamic.Resource):
    """One tenant's LiteLLM team with `keys` virtual keys, delivered to OpenBao at `secret_path`."""

    key_aliases: pulumi.Output[list[str]]
    key_properties: pulumi.Output[list[str]]

    def __init__(self, name: str, props: Mapping[str, Any], opts: pulumi.ResourceOptions | None = None):
        options = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=list(SECRET_INPUTS)))
        super().__init__(LiteLLMTeamProvider(), name, {**dict.fromkeys(OUTPUTS), **props}, options)
