"""Eviction of the render and check cache: after a run, the entries no stack's latest render or
check refers to are gone, and only those."""

from __future__ import annotations

import copy
import json
import os
import time

import pytest

from ai_factory.factory.checking.check import run_checks
from ai_factory.factory.checking.oracles import Oracles, locate_upstream_dir
from ai_factory.factory.model.loading import validate
from ai_factory.factory.rendering.bundle import render_raw
from ai_factory.factory.rendering.cache import write_entry
from ai_factory.factory.rendering.eviction import ABANDONED_AFTER_S, evict
from tests.tenancy_env import many_tenants


def entries(directory, kind: str) -> set[str]:
    return {p.stem for p in (directory / kind).rglob("*.json")}


def review(raw, secret_sections, oracles, directory):
    rendered = render_raw(raw, secret_sections, validate(raw), stack="dev", cache=directory)
    return run_checks(rendered, oracles, cache=directory)


def stack(directory, name: str, units: list[str], parts: list[str]) -> None:
    write_entry(directory / "stacks" / f"{name}.json", {"format": 2, "units": {f"unit-{u}": u for u in units}})
    write_entry(directory / "check-runs" / f"{name}.json", {"parts": parts})
    for kind, keys in (("units", units), ("checks", parts)):
        for key in keys:
            write_entry(directory / kind / key[:2] / f"{key}.json", {"key": key})


def test_entries_another_stack_refers_to_are_kept(tmp_path):
    stack(tmp_path, "p.one", ["aa1", "bb1"], ["cc1"])
    stack(tmp_path, "p.two", ["aa2"], ["cc2", "dd2"])
    write_entry(tmp_path / "stacks" / "p.one.json", {"format": 2, "units": {"unit-aa1": "aa1"}})
    write_entry(tmp_path / "check-runs" / "p.two.json", {"parts": ["dd2"]})
    assert evict(tmp_path) == 2
    assert entries(tmp_path, "units") == {"aa1", "aa2"}
    assert entries(tmp_path, "checks") == {"cc1", "dd2"}


def test_a_plan_no_stack_refers_to_is_evicted(tmp_path):
    write_entry(tmp_path / "stacks" / "p.one.json", {"units": {}, "plan": "pp1"})
    write_entry(tmp_path / "stacks" / "p.two.json", {"units": {}, "plan": None})  # a render given its plan
    for key in ("pp1", "pp2"):
        write_entry(tmp_path / "plans" / key[:2] / f"{key}.json", {"key": key})
    assert evict(tmp_path) == 1 and entries(tmp_path, "plans") == {"pp1"}


def test_a_render_keeps_the_plan_it_used_and_evicts_the_one_it_replaced(dev_raw, tmp_path):
    raw = many_tenants(copy.deepcopy(dev_raw[0]), 2)
    render_raw(raw, dev_raw[1], validate(raw), stack="dev", cache=tmp_path)
    first = entries(tmp_path, "plans")
    next(t for t in raw["tenants"] if t["gpus"] == [{"pool": "h100", "count": 8}])["gpus"][0]["count"] = 4
    render_raw(raw, dev_raw[1], validate(raw), stack="dev", cache=tmp_path)
    evict(tmp_path)
    after = entries(tmp_path, "plans")
    assert len(first) == len(after) == 1 and after != first


@pytest.mark.parametrize("index", ["stacks", "check-runs"])
def test_an_unreadable_index_keeps_every_entry_of_its_kind(tmp_path, index):
    stack(tmp_path, "p.one", ["aa1"], ["cc1"])
    for kind in ("units", "checks"):
        write_entry(tmp_path / kind / "ee" / "ee9.json", {"key": "ee9"})
    (tmp_path / index / "p.broken.json").write_text("{not json")
    evict(tmp_path)
    kept, evicted = ("units", "checks") if index == "stacks" else ("checks", "units")
    assert "ee9" in entries(tmp_path, kept) and "ee9" not in entries(tmp_path, evicted)


def test_only_abandoned_temporary_files_are_removed(tmp_path):
    stack(tmp_path, "p.one", ["aa1"], ["cc1"])
    old, new = tmp_path / "units" / "aa" / "old.tmp", tmp_path / "units" / "aa" / "new.tmp"
    old.write_text("half")
    new.write_text("being written")
    past = time.time() - ABANDONED_AFTER_S - 60
    os.utime(old, (past, past))
    assert evict(tmp_path) == 1
    assert not old.exists() and new.exists() and entries(tmp_path, "units") == {"aa1"}


def test_a_one_tenant_change_leaves_the_entries_of_a_fresh_cache_of_the_change(dev_raw, tmp_path):
    raw = many_tenants(copy.deepcopy(dev_raw[0]), 2)
    oracles = Oracles(locate_upstream_dir())
    review(raw, dev_raw[1], oracles, tmp_path / "cache")
    changed = copy.deepcopy(raw)
    changed["tenants"][1]["quota"] = {"cpu": "77"}
    findings = review(changed, dev_raw[1], oracles, tmp_path / "cache")
    assert findings == review(changed, dev_raw[1], oracles, tmp_path / "fresh")
    for kind in ("units", "plans", "checks"):
        assert entries(tmp_path / "cache", kind) == entries(tmp_path / "fresh", kind)
    listed = json.loads((tmp_path / "cache" / "check-runs" / "ai-factory.dev.json").read_text())["parts"]
    assert sorted(listed) == sorted(entries(tmp_path / "cache", "checks"))
