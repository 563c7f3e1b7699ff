"""The check cache: checks of one object at a time are cached per part of the render (a tenant, a
platform layer), and give what an uncached check gives."""

from __future__ import annotations

import copy
import dataclasses
import gc
import os
import time

import pytest

from ai_factory.factory import heap
from ai_factory.factory.checking import charts, check, views
from ai_factory.factory.checking import policies as policy_check
from ai_factory.factory.checking.check import PER_PART, graph_findings, parts, run_checks
from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.oracles import Oracles, locate_upstream_dir
from ai_factory.factory.model.loading import validate
from ai_factory.factory.rendering.bundle import Rendered, cached_stack, render_raw
from ai_factory.factory.rendering.cache import CACHE_ENV
from ai_factory.factory.rendering.harness import Graph
from tests.conftest import run_main, settled


@pytest.fixture(scope="module")
def oracles():
    return Oracles(locate_upstream_dir())


def entries(directory) -> set[str]:
    return {p.name for p in (directory / "checks").rglob("*.json")}


@pytest.mark.parametrize("check", PER_PART, ids=lambda c: c.__name__)
def test_a_per_part_check_finds_over_the_parts_what_it_finds_over_the_whole(three_tenants, oracles, check):
    rendered = three_tenants[2]
    cut = parts(rendered)
    assert {("tenant", "team-00"), ("layer", "kueue")} <= set(cut)
    assert sorted(set(check(rendered, oracles))) == sorted({f for part in cut.values() for f in check(part, oracles)})


def test_cached_findings_are_the_uncached_ones(three_tenants, oracles, tmp_path):
    rendered = three_tenants[2]
    cold = run_checks(rendered, oracles)
    assert run_checks(rendered, oracles, cache=tmp_path) == cold
    assert run_checks(rendered, oracles, cache=tmp_path) == cold


def test_a_change_to_one_tenant_checks_that_tenant_again_only(three_tenants, oracles, tmp_path):
    raw, secret_sections, rendered = three_tenants
    run_checks(rendered, oracles, cache=tmp_path)
    before = entries(tmp_path)
    changed = copy.deepcopy(raw)
    changed["tenants"][2]["quota"] = {"cpu": "33"}
    again = render_raw(changed, secret_sections, validate(changed), stack="dev")
    assert run_checks(again, oracles, cache=tmp_path) == run_checks(again, oracles)
    assert len(entries(tmp_path) - before) == 2  # its part (per-part checks) and its view (tenant-local checks)


def test_other_oracles_check_every_part_again(three_tenants, oracles, tmp_path):
    rendered = three_tenants[2]
    run_checks(rendered, oracles, cache=tmp_path, oracle_state="one")
    before = entries(tmp_path)
    run_checks(rendered, oracles, cache=tmp_path, oracle_state="another")
    assert len(entries(tmp_path) - before) == len(parts(rendered)) + len(views.tenants_of(rendered)) + 1  # every part, every view, the platform's


def test_a_rendered_directory_is_checked_whole(three_tenants, oracles, tmp_path):
    """Its resources are matched to the inventory across the whole render: no part is cached."""
    from ai_factory.factory.rendering.bundle import load_rendered

    three_tenants[2].write(tmp_path / "out")
    run_checks(load_rendered(tmp_path / "out"), oracles, cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_checks_run_with_the_heap_frozen_for_the_collector_and_release_it_after(three_tenants, oracles, monkeypatch):
    frozen_while_checking: list[int] = []

    def probe(rendered, oracles):
        with heap.settled_heap():  # an inner block (run_checks within check_environment) keeps the outer's freeze
            pass
        frozen_while_checking.append(gc.get_freeze_count())
        return []

    monkeypatch.setattr(check, "checks", lambda rendered: [probe])
    assert run_checks(three_tenants[2], oracles) == []
    assert frozen_while_checking[0] > 0 and gc.get_freeze_count() == 0


def test_the_pack_runs_without_the_collector_and_its_resources_join_the_settled_heap(three_tenants, oracles, monkeypatch):
    rendered, collecting = three_tenants[2], []
    real = policy_check.run_policies
    monkeypatch.setattr(policy_check, "run_policies", lambda *args: collecting.append(gc.isenabled()) or real(*args))
    with heap.settled_heap(), policy_check.shared(rendered):
        list(policy_check.stack_policies(rendered, oracles))
        assert collecting == [False] and gc.isenabled()
        scanned = {id(o) for o in gc.get_objects()}  # the settled heap is in no generation the collector scans
        assert not any(id(r) in scanned or id(r.opts) in scanned for r in policy_check._resources(rendered)[0])


def without_admission(rendered: Rendered, tenant: str) -> Rendered:
    """A copy whose graph lacks a tenant's admission policy (a stack policy's finding)."""
    resources = [dataclasses.replace(r) for r in rendered.graph.resources if not (r.tenant == tenant and r.inputs.get("kind") == "ClusterPolicy")]
    return Rendered(rendered.config, rendered.kubernetes_version, rendered.manifests, rendered.inventory, Graph(resources), kustomizations=rendered.kustomizations)


@pytest.mark.parametrize("check", check.GRAPH_ONLY, ids=lambda c: c.__name__)
def test_a_graph_only_check_finds_over_the_graph_alone_what_it_finds_over_the_render(three_tenants, oracles, check):
    rendered = without_admission(three_tenants[2], "team-01")
    found = list(check(rendered, oracles))
    assert found and graph_findings(rendered.graph)[check.__name__] == found


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "not-cached"])
def test_checks_found_elsewhere_are_taken_not_run_again(three_tenants, oracles, tmp_path, cached):
    rendered = without_admission(three_tenants[2], "team-01")
    elsewhere = Finding("stack-policy", "stack", "found elsewhere")
    found = run_checks(rendered, oracles, cache=tmp_path if cached else None, found=lambda: {"stack_policies": [elsewhere]})
    assert found == sorted({*run_checks(three_tenants[2], oracles), elsewhere})


def test_checks_whose_process_failed_run_here(three_tenants, oracles, tmp_path):
    rendered = without_admission(three_tenants[2], "team-01")
    assert run_checks(rendered, oracles, cache=tmp_path, found=lambda: None) == run_checks(rendered, oracles)


def test_graph_checks_run_in_another_process_and_give_the_graphs_findings(three_tenants, tmp_path, monkeypatch):
    rendered = without_admission(three_tenants[2], "team-01")
    ran = tmp_path / "ran-in"

    def recording(graph):
        ran.write_text(str(os.getpid()))
        return graph_findings(graph)

    monkeypatch.setattr(charts, "graph_findings", recording)
    with charts.GraphChecks() as graph_checks:
        graph_checks.start(rendered.graph)
        found = graph_checks.found(rendered)
        assert found is not None and found() == graph_findings(rendered.graph)
    assert int(ran.read_text()) != os.getpid()
    assert charts.GraphChecks().found(rendered) is None  # not started


def test_graph_checks_still_running_at_the_end_are_killed(three_tenants, tmp_path, monkeypatch):
    def stuck(graph):
        (tmp_path / "pid.tmp").write_text(str(os.getpid()))
        os.replace(tmp_path / "pid.tmp", tmp_path / "pid")
        time.sleep(600)

    monkeypatch.setattr(charts, "graph_findings", stuck)
    with charts.GraphChecks() as graph_checks:
        graph_checks.start(three_tenants[2].graph)
        settled((tmp_path / "pid").exists)
    with pytest.raises(ProcessLookupError):
        os.kill(int((tmp_path / "pid").read_text()), 0)


def test_the_check_command_finds_each_clusters_graph_checks_in_another_process(tmp_path, monkeypatch):
    ran = tmp_path / "ran-in"

    def recording(graph):
        with ran.open("a") as record:
            record.write(f"{os.getpid()} {cached_stack(graph)}\n")
        return graph_findings(graph)

    monkeypatch.setattr(charts, "graph_findings", recording)
    monkeypatch.delenv("FACTORY_REQUIRE_UPSTREAM", raising=False)  # CI's: the check without charts is incomplete
    (tmp_path / "empty").mkdir()
    proc = run_main("check", "dev", "--quiet", "--charts", str(tmp_path / "empty"), env={CACHE_ENV: str(tmp_path / "cache")})
    assert proc.returncode == 3, proc.stderr
    runs = [line.split() for line in ran.read_text().splitlines()]
    assert sorted(stack for _, stack in runs) == ["ai-factory.dev-par1-a", "ai-factory.dev-par1-b"]
    assert os.getpid() not in {int(pid) for pid, _ in runs}
