"""`ai-factory plan`'s printed report: the summary first (fleet and pools, then trust domains), then
one row per tenant and pool, GPU rows only on request, every column defined once; `--format json`."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections import defaultdict

import pytest
import yaml

from ai_factory.factory.cli import EXIT_BROKEN_PIPE, main
from ai_factory.factory.model.loading import load_stack_file
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.planning.planner import plan
from ai_factory.factory.planning.report import COLUMNS, report_text, tenant_uses
from tests.conftest import REPO
from tests.tenancy_env import many_tenants
from tests.test_plan_cli import stack_file
from tests.test_planner import mixed_fleet


def cells(line: str) -> list[str]:
    return re.split(r" {2,}", line.strip())


def section(text: str, title: str) -> list[str]:
    """The lines of one table, from its title to the blank line after it (not the one setting the
    fleet row apart: a row, with its columns two spaces apart, follows that one)."""
    lines = text.splitlines() + [""]
    start = lines.index(title)
    end = next(i for i in range(start, len(lines)) if not lines[i] and "  " not in (lines[i + 1 : i + 2] or [""])[0])
    return lines[start:end]


def rows(text: str, title: str) -> dict[str, list[str]]:
    """First cell -> cells, for the body rows of one table (title, header and rule skipped)."""
    return {cells(line)[0]: cells(line) for line in section(text, title)[3:] if line.strip() and not line.startswith(" ")}


@pytest.fixture(scope="module")
def dev_report():
    cfg = load_stack_file("dev")
    return cfg, plan_for(cfg)


def test_the_fleet_row_puts_every_gpu_in_exactly_one_of_used_idle_and_free(dev_report):
    text = report_text(*reversed(dev_report))
    fleet = rows(text, "Fleet and pools")["(fleet)"]
    header = cells(section(text, "Fleet and pools")[1])
    figures = dict(zip(header[3:], fleet[1:]))
    # dev: 64 GPUs; 31 serve tenants, 15 are idle on nodes owned by a domain, 18 on nodes nobody owns.
    assert (figures["GPUs"], figures["used"], figures["idle"], figures["free"]) == ("64", "31", "15", "18")
    assert (figures["nodes"], figures["free nodes"]) == ("7", "2")
    packing = dict(zip(cells(section(text, "Packing")[1])[1:], rows(text, "Packing")["(fleet)"][1:]))
    assert (packing["util"], packing["fill"]) == ("0.979", f"{30.35 / 64:.3f}")


def test_summary_comes_first_then_tenants_and_gpu_rows_only_with_gpus(dev_report):
    cfg, p = dev_report
    text = report_text(p, cfg)
    titles = [line for line in text.splitlines() if line in ("Fleet and pools", "Packing", "Trust domains", "Tenants")]
    assert titles == ["Fleet and pools", "Packing", "Trust domains", "Tenants"]
    assert "a100-mig-000       0" not in text and "pool a100-mig:" not in text
    with_gpus = report_text(p, cfg, gpus=True)
    assert with_gpus.startswith(text.split("\nGPUs changed")[0])
    for pool in p.pools:
        title = next(line for line in with_gpus.splitlines() if line.startswith(f"pool {pool.name}:"))
        assert len(section(with_gpus, title)[3:]) == len(pool.nodes) * pool.gpus_per_node


def test_a_tenant_row_per_pool_shows_grant_ceiling_placement_and_idle_cost(dev_report):
    cfg, p = dev_report
    lines = section(report_text(p, cfg), "Tenants")[3:]
    search = [cells(line) for line in lines[next(i for i, line in enumerate(lines) if line.startswith("search ")) :][:2]]
    assert search[0][:8] == ["search", "high", "internal", "a100-mig", "6 mig-1g.10gb, 2 mig-3g.40gb", "= grant", "a100-mig-001:0-1", "1.75"]
    # search alone holds internal's MIG node: its 6 idle GPUs are charged to it.
    assert search[0][8] == "6.00"
    assert search[1] == ["h100-train", "16 gpu", "= grant", "gpu-h100-02:0-7 gpu-h100-03:0-7", "16.00", "0.00"]
    assistant = cells(next(line for line in lines if "l40s-infer" in line))
    # assistant may borrow the HAMi capacity its domain holds beyond its grant.
    assert assistant[1] == "6 gpu, 150 gpucores, 73728 gpumem" and assistant[2] != "= grant"


def test_idle_cost_adds_up_to_the_idle_gpus_of_each_domain():
    pools, tenants = mixed_fleet()
    p = plan(pools, tenants)
    domain_of = {t.name: t.trust_domain for t in tenants}
    charged: dict[tuple[str, str], float] = defaultdict(float)
    for (tenant, pool), use in tenant_uses(p).items():
        charged[pool, domain_of[tenant]] += use.idle_cost
    for row in p.figures:
        assert charged[row.pool, row.trust_domain] == pytest.approx(row.idle_gpus), (row.pool, row.trust_domain)


def test_every_printed_column_is_defined_once_in_help_and_readme(dev_report, capsys):
    cfg, p = dev_report
    text = report_text(p, cfg, gpus=True)
    names = [name for name, _ in COLUMNS]
    assert len(set(names)) == len(names)
    for line in text.splitlines():
        if line.startswith(("pool ", "node ", "tenant ")) and ":" not in line:
            assert set(cells(line)) <= set(names), line
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    readme = (REPO / "README.md").read_text()
    for name, definition in COLUMNS:
        assert " ".join(definition.split()) in help_text, name
        assert readme.count(f"- `{name}`: {definition}\n") == 1, name


def test_plan_format_json_prints_the_plan_json_and_messages_on_stderr(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", str(stack_file(tmp_path)), "--out", str(out), "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert captured.out == out.read_text()
    assert json.loads(captured.out)["fleet_figures"]["free_gpus"] == 18
    assert captured.err == f"wrote {out}\n"


@pytest.fixture(scope="module")
def big_env(tmp_path_factory):
    """A stack file of dev's platform with the generated 200-tenant fleet (`tests/tenancy_env.py`)."""
    document = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())
    raw = {key.removeprefix("ai-factory:"): value for key, value in document["config"].items() if key.startswith("ai-factory:")}
    generated = many_tenants(copy.deepcopy(raw), 200)
    for name, value in generated.items():
        document["config"][f"ai-factory:{name}"] = value
    path = tmp_path_factory.mktemp("big") / "Pulumi.big.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path, generated


def test_the_first_screen_of_a_200_tenant_plan_holds_the_fleet_and_pool_summary(big_env, tmp_path, capsys):
    path, generated = big_env
    assert main(["plan", str(path), "--out", str(tmp_path / "plan.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    screen = lines[:40]
    pools = [p["name"] for p in generated["fleet"]["pools"]]
    assert screen[0] == "Fleet and pools" and "Packing" in screen and "Trust domains" in screen
    for title in ("Fleet and pools", "Packing"):
        assert list(rows("\n".join(screen), title)) == ["(fleet)", *sorted(pools)]
    tenants_at = lines.index("Tenants")
    named = [cells(line)[0] for line in lines[tenants_at + 3 :] if line and not line.startswith(" ")]
    assert named[:200] == sorted(t["name"] for t in generated["tenants"])


def test_a_reader_that_stops_early_gets_no_traceback_and_the_plan_is_written(big_env, tmp_path):
    out = tmp_path / "plan.json"
    with subprocess.Popen(
        [sys.executable, "-m", "ai_factory.factory", "plan", str(big_env[0]), "--gpus", "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as reader:
        assert reader.stdout.readline() == "Fleet and pools\n"
        reader.stdout.close()  # as `| head -1` does, long before the GPU rows
        err = reader.stderr.read()
    assert reader.returncode == EXIT_BROKEN_PIPE and "Traceback" not in err, err
    assert json.loads(out.read_text())["fleet_figures"]["gpus_used"] > 0
