"""The live OpenCost source of `ai-factory bill --opencost-url`: OpenCost's allocation API
(`GET <url>/allocation`, port 9003 of the `opencost` service in chart 2.5.17 / OpenCost 1.120)
asked for exactly the bill's period, one accumulated set per namespace, idle included and not
shared out (`bill.opencost_costs` reports it as cost outside every tenant):

    /allocation?window=<start>,<end>&aggregate=namespace&accumulate=true&includeIdle=true&shareIdle=false

The answer is read through requests with a connect and a read timeout, within an overall
deadline, and at most `bill.MAX_OPENCOST_BYTES` of (decompressed) body; a redirect is not
followed (it would carry the token elsewhere). Every failure is a `ConfigError` naming the
endpoint. The bearer token, when OpenCost sits behind an authenticating proxy, comes from the
environment (`TOKEN_ENV`), never from the command line; a URL carrying credentials is refused.
"""

from __future__ import annotations

import json
import os
import time
from urllib.parse import urlsplit

import requests

from ai_factory.factory.metering.bill import MAX_OPENCOST_BYTES, MAX_OPENCOST_MESSAGE, OPENCOST_SHAPE, OpenCost, Period, instant, opencost_costs
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.loading import ConfigError

ALLOCATION_PATH = "/allocation"
CONNECT_TIMEOUT_SECONDS = 10
READ_TIMEOUT_SECONDS = 120
"""OpenCost computes a window's allocations from Prometheus when asked: a month takes a while."""
DEADLINE_SECONDS = 300
MAX_URL_LENGTH = 2048
CHUNK_BYTES = 64 * 1024
TOKEN_ENV = "FACTORY_OPENCOST_TOKEN"


def url_problems(url: str) -> list[str]:
    if len(url) > MAX_URL_LENGTH:
        return [f"opencost: the URL is {len(url)} characters, more than {MAX_URL_LENGTH}"]
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (an out-of-range or non-numeric port raises here)
    except ValueError as err:
        return [f"opencost: {url!r} is not a URL ({err})"]
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [f"opencost: {url!r} is not an http(s) URL with a host (e.g. http://opencost.opencost:9003)"]
    if parts.username is not None or parts.password is not None:
        return [f"opencost: the URL carries credentials; give a bearer token in {TOKEN_ENV} instead"]
    if parts.query or parts.fragment:
        return [f"opencost: {url!r} has a query or fragment; give OpenCost's base URL (the bill asks {ALLOCATION_PATH} itself)"]
    return []


def allocation_query(period: Period) -> dict[str, str]:
    return {
        "window": f"{instant(period.start)},{instant(period.end)}",
        "aggregate": "namespace",
        "accumulate": "true",
        "includeIdle": "true",
        "shareIdle": "false",
    }


def query_opencost(url: str, cfg: FactoryConfig, period: Period) -> OpenCost:
    """OpenCost's costs per tenant over the period, as `bill.read_opencost` reads them from a file."""
    problems = url_problems(url)
    if problems:
        raise ConfigError(problems, "bill")
    endpoint = url.rstrip("/") + ALLOCATION_PATH
    token = os.environ.get(TOKEN_ENV)
    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        with requests.get(
            endpoint, params=allocation_query(period), headers=headers, stream=True, allow_redirects=False,
            timeout=(CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS),
        ) as response:
            body = _body(response, endpoint)
    except requests.RequestException as err:
        raise ConfigError([f"opencost: {endpoint}: no answer ({type(err).__name__}: {err})"], "bill") from None
    if response.status_code != 200:
        excerpt = body[:MAX_OPENCOST_MESSAGE].decode("utf-8", "replace").strip()
        raise ConfigError([f"opencost: {endpoint} answered HTTP {response.status_code}: {excerpt or response.reason}"], "bill")
    try:
        document = json.loads(body)
    except ValueError:
        raise ConfigError([f"opencost: {endpoint}: {OPENCOST_SHAPE}"], "bill") from None
    return opencost_costs(document, endpoint, cfg, period)


def _body(response: requests.Response, endpoint: str) -> bytes:
    """The whole body, refused past the size bound (announced or received) or the deadline."""
    too_big = ConfigError([f"opencost: {endpoint}: the answer is larger than {MAX_OPENCOST_BYTES} bytes"], "bill")
    announced = response.headers.get("Content-Length", "")
    if announced.isdigit() and int(announced) > MAX_OPENCOST_BYTES:
        raise too_big
    deadline = time.monotonic() + DEADLINE_SECONDS
    chunks, size = [], 0
    for chunk in response.iter_content(CHUNK_BYTES):
        size += len(chunk)
        if size > MAX_OPENCOST_BYTES:
            raise too_big
        if time.monotonic() > deadline:
            raise ConfigError([f"opencost: {endpoint}: the answer took longer than {DEADLINE_SECONDS} s"], "bill")
        chunks.append(chunk)
    return b"".join(chunks)
