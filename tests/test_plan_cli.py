"""`python -m factory plan`: the printed table and the JSON, deterministic, locked on request,
and a clear exit 2 when the demands do not fit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from ai_factory.factory.cli import main
from ai_factory.factory.model.loading import load_stack_file
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.planning.report import report_text
from tests.conftest import REPO, run_main
from tests.fleet_env import one_cluster


def stack_file(tmp_path: Path, edit=None, name: str = "plantest") -> Path:
    """A copy of the dev stack file as one cluster in `tmp_path` (its own project folder), optionally
    edited: these tests plan one stack; per cluster, `test_fleet_diff`."""
    document = one_cluster(yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text()))
    if edit:
        edit(document["config"])
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def run_cli(*args: str, seed: str = "0") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    return subprocess.run([sys.executable, "-m", "ai_factory.factory", "plan", *args], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def test_plan_prints_the_report_and_writes_the_plan_json(tmp_path, capsys):
    path = stack_file(tmp_path)
    out = tmp_path / "out" / "plan.json"
    assert main(["plan", str(path), "--out", str(out)]) == 0
    cfg = load_stack_file(str(path))
    expected = plan_for(cfg)
    printed = capsys.readouterr().out
    assert printed == report_text(expected, cfg) + f"wrote {out}\n"
    assert out.read_text() == expected.to_json() + "\n"
    assert Plan.from_json(out.read_text()) == expected
    assert not (tmp_path / "plans").exists()


def test_plan_is_byte_identical_across_processes(tmp_path):
    path = stack_file(tmp_path)
    runs = [run_cli(str(path), "--out", str(tmp_path / f"{seed}.json"), seed=seed) for seed in ("1", "2")]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    assert (tmp_path / "1.json").read_bytes() == (tmp_path / "2.json").read_bytes()
    assert runs[0].stdout.replace("1.json", "") == runs[1].stdout.replace("2.json", "")


def test_plan_that_does_not_fit_exits_2_naming_tenant_resource_and_shortfall(tmp_path):
    def overdemand(config):
        search = next(t for t in config["ai-factory:tenants"] if t["name"] == "search")
        # h100-train has 32 GPUs, 8 of them dedicated to partner-acme (a demand over 32 is a field
        # error: more than the pool could ever supply)
        search["gpus"][0]["count"] = 30
        config["ai-factory:layers"].pop("slinky")  # whose Slurm nodes would no longer fit search's CPU quota

    out = tmp_path / "plan.json"
    result = run_main("plan", str(stack_file(tmp_path, overdemand)), "--out", str(out))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stdout == ""
    problems = [line for line in result.stderr.splitlines() if line.startswith("  - plan:")]
    assert any("'search'" in p and "'h100-train'" in p and "nvidia.com/gpu" in p and "short" in p for p in problems), problems
    assert not out.exists()


def test_lock_writes_the_plan_that_the_next_plan_starts_from(tmp_path, capsys):
    path = stack_file(tmp_path)
    first = tmp_path / "first.json"
    assert main(["plan", str(path), "--out", str(first), "--lock"]) == 0
    locked = tmp_path / "plans" / "plantest.json"
    assert locked.read_text() == first.read_text()

    def one_more_tenant(config):
        config["ai-factory:tenants"].append(
            {"name": "newcomer", "trust": "high", "trust_domain": "internal", "owners": {"groups": ["newcomer-admins"]}, "gpus": [{"pool": "a100-mig", "mig": {"7g.80gb": 1}}]}
        )

    stack_file(tmp_path, one_more_tenant)
    second = tmp_path / "second.json"
    capsys.readouterr()
    assert main(["plan", str(path), "--out", str(second)]) == 0
    replanned = Plan.from_json(second.read_text())
    assert replanned.changed_gpus == 0
    assert "GPUs changed since the previous plan: 0" in capsys.readouterr().out
    before = Plan.from_json(first.read_text()).pool("a100-mig")
    after = replanned.pool("a100-mig")
    kept = {(n.name, g.index): g for n in before.nodes for g in n.gpus if g.mode != "idle"}
    assert all(next(g for n in after.nodes if n.name == node for g in n.gpus if g.index == index) == gpu for (node, index), gpu in kept.items())
