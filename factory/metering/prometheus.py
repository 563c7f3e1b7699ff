"""The live source of `ai-factory bill`: the series the bill reads, queried from Prometheus' HTTP
API (`/api/v1/query_range`, through prometheus-api-client) instead of an offline export.

Each series name is one range query at the bill's step, evaluated at `start`, `start + step`, ...:
gauges before `end`, LiteLLM's counters up to `end` included (see `bill.counter_increase`).
Prometheus refuses a range query of more than 11,000 points per series, so a long period is asked
for in windows of `WINDOW_STEPS` points; a counter's windows share their boundary point, so that
increases add up across windows exactly as over one.

The bearer token, when the endpoint needs one, comes from the environment (`TOKEN_ENV`), never from
the command line (a command line is visible to every user of the machine).
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Iterator

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect

from ai_factory.factory.metering.bill import LITELLM, READ, Context, Period, Sums, add_series, raise_problems
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.loading import ConfigError

WINDOW_STEPS = 10_000
"""Points per series and query, below Prometheus' limit of 11,000."""
TIMEOUT_SECONDS = 120
TOKEN_ENV = "FACTORY_PROMETHEUS_TOKEN"


def windows(period: Period, step: int, counter: bool) -> Iterator[tuple[int, int]]:
    """(first, last) evaluation instants of each query, in Unix seconds."""
    start, end = (int(b) for b in period.bounds)
    last = end if counter else end - 1
    points = range(start, last + 1, step)
    # A counter's last point is in the window before it already (but a one-point period is one).
    for i in range(0, max(1, len(points) - counter), WINDOW_STEPS):
        chunk = points[i : i + WINDOW_STEPS + (1 if counter else 0)]
        yield chunk[0], chunk[-1]


def read_prometheus(url: str, cfg: FactoryConfig, period: Period, step: int, client: PrometheusConnect | None = None) -> Sums:
    """Sum every series the bill reads over the period, as `bill.read_export` does for a file."""
    token = os.environ.get(TOKEN_ENV)
    prometheus = client or PrometheusConnect(url, headers={"Authorization": f"Bearer {token}"} if token else None, timeout=TIMEOUT_SECONDS)
    ctx = Context.of(cfg, period)
    sums = Sums.empty()
    problems: dict[str, None] = {}
    for name in sorted(READ):
        for first, last in windows(period, step, counter=name in LITELLM):
            try:
                result = prometheus.custom_query_range(name, _utc(first), _utc(last), str(step))
            except (requests.RequestException, PrometheusApiClientException) as err:
                raise ConfigError([f"prometheus: {url}: query of {name} failed: {err}"], "bill") from None
            for series in result:
                try:
                    metric = {"__name__": name, **series["metric"]}
                    values = [(float(t), float(v)) for t, v in series["values"]]
                except (KeyError, TypeError, ValueError):
                    problems[f"prometheus: {name}: an answer that is not a range-query series"] = None
                    continue
                problem = add_series(sums, ctx, metric, values)
                if problem:
                    problems[f"prometheus: {problem}"] = None
    raise_problems(list(problems))
    return sums


def _utc(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)
