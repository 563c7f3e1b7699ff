"""Running recording rules through Prometheus' own rule unit-test runner, `promtool test rules`.

Tests that need promtool skip with the reason when it is absent, except under CI
(`FACTORY_REQUIRE_UPSTREAM=1`, set by `.ci/run`, which installs it), where they fail instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from ai_factory.factory.metering.rules import INTERVAL_SECONDS

SAMPLES = 60
"""Every synthetic series covers minutes 1..60 and windows end at 60m30s, between two evaluations,
so whether a range is closed or open on the left (it changed in Prometheus 3) does not matter.
Minute 0 holds no input: promtool evaluates rule groups in no fixed order, and the tenants'
constant series exist from the first evaluation of their groups on (as after a Prometheus start)."""
WINDOW = "1h"
EVAL_TIME = "60m30s"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("FACTORY_REQUIRE_UPSTREAM"):
            pytest.fail("FACTORY_REQUIRE_UPSTREAM is set but promtool is missing (.ci/run installs the `prometheus` package)")
        pytest.skip("promtool is not installed (Debian package `prometheus`); the recording-rule tests need it")
    return path


def selector(metric: str, labels: dict[str, str]) -> str:
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def values(*runs: tuple[float | None, int]) -> str:
    """promtool's expanding notation from (value, samples) runs; None is a gap. A gap after samples
    starts with a staleness marker, as Prometheus writes one when a target stops exposing a series
    (without it, the last sample would stay visible for the 5-minute lookback)."""
    parts: list[str] = []
    for value, count in runs:
        if value is None:
            parts += ["stale"] * bool(parts) + ["_"] * (count - bool(parts))
        else:
            parts.append(f"{value!r}x{count - 1}" if count > 1 else repr(value))
    return " ".join(parts)


def gpu_seconds(record: str, by: str) -> str:
    """GPU-equivalent seconds over the window: each evaluation counts for the rule interval."""
    return f"round(sum by ({by}) (sum_over_time({record}[{WINDOW}])) * {INTERVAL_SECONDS}, 0.001)"


@dataclass
class RuleTest:
    series: list[tuple[str, str]] = field(default_factory=list)
    expectations: list[tuple[str, list[tuple[dict[str, str], float]]]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)

    def add(self, metric: str, labels: dict[str, str], *runs: tuple[float | None, int]) -> None:
        self.series.append((selector(metric, labels), values(*runs)))

    def expect(self, expr: str, samples: list[tuple[dict[str, str], float]]) -> None:
        self.expectations.append((expr, samples))

    def expect_alert(self, alert: str, eval_time: str, firing: list[dict[str, str]]) -> None:
        """The labels of every alert of that name firing at that time (none: `firing` is empty);
        rules under test carry no annotations (see `without_annotations`)."""
        self.alerts.append({"eval_time": eval_time, "alertname": alert, "exp_alerts": [{"exp_labels": labels} for labels in firing]})

    def document(self, rule_file: str) -> dict[str, Any]:
        return {
            "rule_files": [rule_file],
            "evaluation_interval": f"{INTERVAL_SECONDS}s",
            "tests": [
                {
                    "interval": f"{INTERVAL_SECONDS}s",
                    "input_series": [{"series": s, "values": f"_ {v}"} for s, v in self.series],
                    "promql_expr_test": [
                        {
                            "expr": expr,
                            "eval_time": EVAL_TIME,
                            "exp_samples": [{"labels": selector("", labels), "value": value} for labels, value in samples],
                        }
                        for expr, samples in self.expectations
                    ],
                    **({"alert_rule_test": self.alerts} if self.alerts else {}),
                }
            ],
        }


def run_rule_test(groups: list[dict[str, Any]], test: RuleTest, workdir: Path) -> subprocess.CompletedProcess:
    binary = promtool()
    (workdir / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    (workdir / "test.yaml").write_text(yaml.safe_dump(test.document("rules.yaml"), sort_keys=False))
    return subprocess.run([binary, "test", "rules", "test.yaml"], cwd=workdir, capture_output=True, text=True, timeout=120)


def without_annotations(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The groups with their alerts' annotations left out: promtool compares an alert's annotations
    too, and the tests are about when alerts fire and with which labels, not about their wording."""
    return [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]} for g in groups]
