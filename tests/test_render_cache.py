"""The render cache: unchanged layers and tenant stacks are read back, and what they give is the
cold render byte for byte."""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from ai_factory.components import _common
from ai_factory.factory import heap
from ai_factory.factory.checking import parallel
from ai_factory.factory.model.loading import StackEnvironment, validate
from ai_factory.factory.planning.from_config import plan_for, plan_inputs
from ai_factory.factory.rendering import bundle, program
from ai_factory.factory.rendering import cache as render_cache
from ai_factory.factory.rendering.bundle import Rendered, render_clusters, render_raw
from tests.conftest import REPO, run_main, settled


def cached_render(raw, secret_sections, directory):
    return render_raw(raw, secret_sections, validate(raw), stack="dev", cache=directory)


@pytest.fixture(scope="module")
def seeded(three_tenants, tmp_path_factory) -> tuple[Path, Rendered]:
    """A cache filled by the cached render of `three_tenants` into an empty cache, and that render:
    rendered once, copied by every test that starts from it (`seeded_copy`)."""
    raw, secret_sections, _ = three_tenants
    directory = tmp_path_factory.mktemp("seeded-render-cache")
    return directory, cached_render(raw, secret_sections, directory)


def seeded_copy(seeded, tmp_path: Path) -> Path:
    """A private copy of the seeded cache, for a test that changes it."""
    shutil.copytree(seeded[0], tmp_path, dirs_exist_ok=True)
    return tmp_path


def unit_keys(directory) -> dict[str, str]:
    return json.loads((directory / "stacks" / "ai-factory.dev.json").read_text())["units"]


def graph(rendered):
    return [(r.urn, r.parent_urn, r.dependency_urns, r.inputs, r.secret_paths) for r in rendered.graph.resources]


def test_a_render_read_back_from_the_cache_is_the_cold_render_byte_for_byte(three_tenants, seeded, tmp_path):
    raw, secret_sections, cold = three_tenants
    first = seeded[1]
    again = cached_render(raw, secret_sections, seeded_copy(seeded, tmp_path))
    assert first.files() == cold.files() and again.files() == cold.files()
    assert graph(again) == graph(cold)


def test_a_cached_render_in_worker_processes_stores_what_the_serial_one_stores(three_tenants, seeded, tmp_path):
    """Each process finishes its own objects (`bundle.finished_objects`): the files and the cache
    entries are those of the serial cached render (`seeded`), byte for byte."""
    raw, secret_sections, cold = three_tenants
    parallel = render_raw(raw, secret_sections, validate(raw), stack="dev", cache=tmp_path, workers=3)
    assert parallel.files() == cold.files() and graph(parallel) == graph(cold)
    stored = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "units").rglob("*.json")}
    assert stored == {p.relative_to(seeded[0]): p.read_bytes() for p in (seeded[0] / "units").rglob("*.json")}


def test_finished_objects_are_every_resources_objects_as_the_bundle_writes_them(three_tenants):
    _, _, cold = three_tenants
    finished = bundle.finished_objects(cold.graph.resources, bundle.stack_of(cold.graph))
    written: dict[str, list] = {}
    for m in sorted(cold.manifests, key=lambda m: m.origin):
        written.setdefault(m.origin, []).append((m.obj, m.yaml()))
    assert {key: sorted(made, key=lambda o: o[1]) for key, made in finished.items()} == {key: sorted(made, key=lambda o: o[1]) for key, made in written.items()}


def test_a_change_to_one_tenant_renders_that_tenant_again_only(three_tenants, seeded, tmp_path):
    raw, secret_sections, _ = three_tenants
    seeded_copy(seeded, tmp_path)
    before = unit_keys(tmp_path)
    changed = copy.deepcopy(raw)
    changed["tenants"][1]["quota"] = {"cpu": "77"}
    rendered = cached_render(changed, secret_sections, tmp_path)
    after = unit_keys(tmp_path)
    assert sorted(u for u in after if after[u] != before[u]) == ["tenant:team-01"]
    assert rendered.files() == render_raw(changed, secret_sections, validate(changed), stack="dev").files()


def test_a_change_of_the_library_renders_everything_again(three_tenants, seeded, tmp_path, monkeypatch):
    raw, secret_sections, cold = three_tenants
    seeded_copy(seeded, tmp_path)
    before = unit_keys(tmp_path)
    monkeypatch.setattr(render_cache, "library_digest", lambda: "another library")
    assert cached_render(raw, secret_sections, tmp_path).files() == cold.files()
    after = unit_keys(tmp_path)
    assert before.keys() == after.keys() and all(after[u] != before[u] for u in after)


def test_a_change_of_the_platform_renders_every_tenant_again(three_tenants, seeded, tmp_path):
    raw, secret_sections, _ = three_tenants
    seeded_copy(seeded, tmp_path)
    before = unit_keys(tmp_path)
    changed = copy.deepcopy(raw)
    changed["kubernetes"]["version"] = "1.35" if changed["kubernetes"].get("version") != "1.35" else "1.34"
    rendered = cached_render(changed, secret_sections, tmp_path)
    after = unit_keys(tmp_path)
    assert all(after[u] != before[u] for u in after if u.startswith("tenant:"))
    assert rendered.files() == render_raw(changed, secret_sections, validate(changed), stack="dev").files()


def test_an_unreadable_cache_entry_is_rendered_again(three_tenants, seeded, tmp_path):
    raw, secret_sections, cold = three_tenants
    seeded_copy(seeded, tmp_path)
    for entry in (tmp_path / "units").rglob("*.json"):
        entry.write_text("not json")
    assert cached_render(raw, secret_sections, tmp_path).files() == cold.files()


def test_a_cached_render_runs_its_program_only_in_another_process_while_this_one_reads_the_entries(three_tenants, seeded, tmp_path, monkeypatch):
    """What the forked run found is taken as it is: the program does not run here again."""
    raw, secret_sections, _ = three_tenants
    changed = copy.deepcopy(raw)
    changed["tenants"][1]["quota"] = {"cpu": "77"}
    run_share, ran = bundle._run_share, tmp_path / "ran-in"

    def recording(*args, **kwargs):
        with ran.open("a") as record:
            record.write(f"{os.getpid()}\n")
        return run_share(*args, **kwargs)

    monkeypatch.setattr(bundle, "_run_share", recording)
    counted: list[None] = []
    rendered = render_raw(changed, secret_sections, validate(changed), stack="dev", cache=seeded_copy(seeded, tmp_path / "cache"), on_resource=lambda: counted.append(None))
    runs = [int(pid) for pid in ran.read_text().split()]
    assert len(runs) == 1 and runs[0] != os.getpid()
    assert rendered.files() == render_raw(changed, secret_sections, validate(changed), stack="dev").files()
    # Its progress is what a run here reports: each resource the program registered.
    monkeypatch.setattr(parallel, "_forking", lambda: False)
    here: list[None] = []
    render_raw(changed, secret_sections, validate(changed), stack="dev", cache=seeded_copy(seeded, tmp_path / "here"), on_resource=lambda: here.append(None))
    assert len(counted) == len(here) > 0


def test_a_cached_render_whose_forked_program_failed_runs_it_here(three_tenants, seeded, tmp_path, monkeypatch):
    raw, secret_sections, cold = three_tenants

    def failing(*args):
        raise RuntimeError("the forked run failed")

    monkeypatch.setattr(bundle, "_probed_run", failing)
    assert cached_render(raw, secret_sections, seeded_copy(seeded, tmp_path)).files() == cold.files()


def test_an_error_of_a_cached_renders_program_is_raised_as_a_serial_render_raises_it(three_tenants, seeded, tmp_path, monkeypatch):
    raw, secret_sections, _ = three_tenants

    def malformed(*args, **kwargs):
        raise ValueError("tenant team-01 is malformed")

    monkeypatch.setattr(program, "main", malformed)
    with pytest.raises(ValueError, match="^tenant team-01 is malformed$"):
        cached_render(raw, secret_sections, seeded_copy(seeded, tmp_path))


RENDER_PATHS = [
    pytest.param(True, True, id="a cached stack, its program forked"),
    pytest.param(True, False, id="a cached stack where forking is not safe"),
    pytest.param(False, True, id="no cache"),
]


@pytest.mark.parametrize("cached, forking", RENDER_PATHS)
def test_what_a_render_does_meanwhile_runs_once_in_this_process(three_tenants, seeded, tmp_path, monkeypatch, cached, forking):
    raw, secret_sections, cold = three_tenants
    monkeypatch.setattr(parallel, "_forking", lambda: forking)
    calls: list[int] = []
    cache = seeded_copy(seeded, tmp_path) if cached else None
    rendered = render_raw(raw, secret_sections, validate(raw), stack="dev", cache=cache, meanwhile=lambda: calls.append(os.getpid()))
    assert calls == [os.getpid()] and rendered.files() == cold.files()


@pytest.mark.parametrize("cached, forking", RENDER_PATHS)
def test_a_render_whose_meanwhile_fails_registers_nothing_here(three_tenants, seeded, tmp_path, monkeypatch, cached, forking):
    raw, secret_sections, _ = three_tenants
    monkeypatch.setattr(parallel, "_forking", lambda: forking)

    def refuse() -> None:
        raise RuntimeError("refused meanwhile")

    counted: list[None] = []
    cache = seeded_copy(seeded, tmp_path) if cached else None
    with pytest.raises(RuntimeError, match="^refused meanwhile$"):
        render_raw(raw, secret_sections, validate(raw), stack="dev", cache=cache, on_resource=lambda: counted.append(None), meanwhile=refuse)
    assert counted == []


def test_a_render_reads_the_units_of_its_stacks_last_render_at_once(seeded, tmp_path):
    directory = seeded_copy(seeded, tmp_path)
    units = render_cache.UnitCache(directory, "ai-factory.dev")
    units.prefetch(units.last_keys())
    assert sorted(units._prefetched) == sorted(unit_keys(directory).values())


def test_the_units_of_a_render_by_another_library_are_not_read_ahead(seeded, tmp_path, monkeypatch):
    directory = seeded_copy(seeded, tmp_path)
    monkeypatch.setattr(render_cache, "library_digest", lambda: "another library")
    units = render_cache.UnitCache(directory, "ai-factory.dev")
    units.prefetch(units.last_keys())
    assert units._prefetched == {}


def test_a_stack_rendered_by_another_library_counts_as_never_rendered(seeded, tmp_path, monkeypatch):
    """Its next render builds every unit: in the worker processes, as a first render."""
    directory = seeded_copy(seeded, tmp_path)
    assert render_cache.UnitCache(directory, "ai-factory.dev").seen
    monkeypatch.setattr(render_cache, "library_digest", lambda: "another library")
    assert not render_cache.UnitCache(directory, "ai-factory.dev").seen


def planning(directory, raw, previous=None):
    """The plan the cache in `directory` gives for the config `raw` after `previous`, and whether it planned."""
    cfg, planned = validate(raw), []

    def planner():
        planned.append(cfg)
        return plan_for(cfg, previous)

    plan = render_cache.UnitCache(directory, "ai-factory.dev").plan((plan_inputs(cfg), previous), planner)
    return plan, bool(planned)


def test_a_plan_read_back_from_the_cache_is_the_plan_made_again(three_tenants, seeded, tmp_path):
    raw = copy.deepcopy(three_tenants[0])
    raw["tenants"][1]["quota"] = {"cpu": "77"}  # what the planner does not read
    plan, planned = planning(seeded_copy(seeded, tmp_path), raw)
    assert not planned and plan == plan_for(validate(raw))


@pytest.mark.parametrize("change", ["a tenant's GPUs", "the fleet", "previous plan", "library"])
def test_a_plan_is_made_again_when_what_it_is_made_of_changes(three_tenants, seeded, tmp_path, monkeypatch, change):
    raw = copy.deepcopy(three_tenants[0])
    if change == "a tenant's GPUs":
        next(t for t in raw["tenants"] if t["gpus"] == [{"pool": "h100", "count": 8}])["gpus"][0]["count"] = 4
    if change == "the fleet":
        raw["fleet"]["pools"][0]["nodes"] += 1
    if change == "library":
        monkeypatch.setattr(render_cache, "library_digest", lambda: "another library")
    previous = plan_for(validate(raw)) if change == "previous plan" else None
    plan, planned = planning(seeded_copy(seeded, tmp_path), raw, previous)
    assert planned and plan == plan_for(validate(raw), previous)


def test_the_planner_reads_nothing_of_the_config_but_the_plan_inputs(three_tenants, monkeypatch):
    """The plan's cache key is `plan_inputs`: a field the planner came to read beside them would
    read back a stale plan. The sections it names are keyed whole; of the config, its layers and
    its tenants, only the named fields (and what reads them: `pool`, `domain`) may be read."""
    from ai_factory.factory.model.config import FactoryConfig, Layers, Tenant

    allowed = {FactoryConfig: {"fleet", "layers", "tenants", "pool"}, Layers: {"network", "kubevirt"}, Tenant: {"name", "trust", "trust_domain", "gpus", "network", "domain"}}
    read: set[tuple[str, str]] = set()
    for model in allowed:
        plain = model.__getattribute__

        def recording(self, name, model=model, plain=plain):
            if not name.startswith("_") and type(self) is model:
                read.add((model.__name__, name))
            return plain(self, name)

        monkeypatch.setattr(model, "__getattribute__", recording)
    cfg = validate(three_tenants[0])
    plan_inputs(cfg)
    read.clear()
    plan_for(cfg, plan_for(cfg))
    assert read and read <= {(model.__name__, name) for model, names in allowed.items() for name in names}


@pytest.mark.parametrize("settled", [True, False], ids=["within-a-settled-heap", "outside"])
def test_what_a_settling_pause_builds_is_settled_only_within_a_settled_heap(settled):
    with heap.settled_heap() if settled else contextlib.nullcontext():
        before = gc.get_freeze_count()
        with heap.no_cycle_collection(settle=True):
            built = [[] for _ in range(1000)]
        assert (gc.get_freeze_count() >= before + len(built)) == settled
    assert gc.get_freeze_count() == 0


def test_tenant_stacks_built_from_narrowed_hooks_are_those_built_from_the_whole_hooks(three_tenants, monkeypatch):
    """Narrowing a hook to one tenant keeps everything that tenant's objects are built from."""
    raw, secret_sections, cold = three_tenants
    monkeypatch.setattr("ai_factory.components.tenant_stack.narrowed", lambda hook, tenant: hook)
    assert render_raw(raw, secret_sections, validate(raw), stack="dev").files() == cold.files()


@pytest.mark.parametrize(
    "value, other",
    [
        ({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}),
        ({2: "b", (1, "x"): "a"}, {(1, "x"): "a", 2: "b"}),
        (frozenset({"x", "y", "z"}), frozenset({"z", "y", "x"})),
    ],
    ids=["mappings-in-any-order", "mappings-of-other-keys-in-any-order", "sets-in-any-order"],
)
def test_equal_values_have_one_digest(value, other):
    assert render_cache.digest(value) == render_cache.digest(other)


@pytest.mark.parametrize(
    "value, other",
    [
        ((1, 2), (2, 1)),
        ({"a": 1}, {"a": 1.5}),
        ({"1": "a"}, {1: "a"}),
        ([1], [[1]]),
        ([float("nan")], [None]),
        ([float("inf")], [float("-inf")]),
        (1, 1.0),
        (True, 1),
    ],
    ids=["order", "value", "key-type", "shape", "nan-is-not-null", "infinities", "int-and-float", "bool-and-int"],
)
def test_different_values_have_different_digests(value, other):
    assert render_cache.digest(value) != render_cache.digest(other)


def test_a_value_the_cache_cannot_key_is_refused():
    with pytest.raises(TypeError, match="cannot key"):
        render_cache.digest(object())


def test_render_writes_its_cache_unless_told_not_to(tmp_path):
    for flags, directory in (([], "cache"), (["--no-cache"], "none")):
        env = {"HOME": str(tmp_path), render_cache.CACHE_ENV: str(tmp_path / directory)}
        proc = run_main("render", "dev", "--quiet", "--out", str(tmp_path / "out"), *flags, env=env)
        assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "cache" / "units").rglob("*.json"))
    assert len(list((tmp_path / "cache" / "writes").glob("*.json"))) == 2  # what each cluster's write left in its directory
    assert not (tmp_path / "none").exists()


def test_the_cache_is_in_the_project_directory_by_default(monkeypatch):
    monkeypatch.delenv(render_cache.CACHE_ENV, raising=False)
    assert render_cache.default_cache_dir() == render_cache.Path(render_cache.CACHE_DIR)  # the CLI runs in the project directory


def test_the_cache_directory_is_ignored_by_git():
    assert render_cache.CACHE_DIR + "/" in (REPO / ".gitignore").read_text().splitlines()


def test_a_hook_narrowed_to_a_tenant_holds_only_that_tenants_entries():
    queues = (_Owned("a"), _Owned("b"))
    assert _common.tenant_items(queues, "b") == (queues[1],)
    assert _common.tenant_entry({"a": 1, "b": 2}, "a") == {"a": 1}
    assert _common.tenant_entry({"a": 1}, "c") == {}


class _Owned:
    def __init__(self, tenant: str):
        self.tenant = tenant


PROGRAM_IMPORTS = """
import json, sys
from ai_factory.factory.model.loading import read_environment
from ai_factory.factory.rendering import bundle

for step in bundle.PROGRAM_WARM_UP:
    step()
before = set(sys.modules)
bundle.render_clusters(read_environment("dev"))
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_reading_a_stack_file_and_running_its_program_after_the_warm_up_imports_nothing():
    """Every module that reading dev's stack file and the program of its clusters import, every
    layer enabled, is one the process forked ahead (`program_ahead`) imported first: run in an
    interpreter that imported the bundle and nothing else."""
    ran = subprocess.run([sys.executable, "-c", PROGRAM_IMPORTS], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert json.loads(ran.stdout.splitlines()[-1]) == []


@dataclass
class ProgramRuns:
    """Where the program ran (`ran`) and which processes took the warm-up's first step
    (`warmed`), by process id, once `watch` recorded them."""

    directory: Path

    def watch(self, monkeypatch) -> None:
        main = program.main

        def recording(*args, **kwargs):
            with (self.directory / "ran-in").open("a") as record:
                record.write(f"{os.getpid()}\n")
            return main(*args, **kwargs)

        def warmed() -> None:
            (self.directory / f"warm-{os.getpid()}").write_text("")

        monkeypatch.setattr(program, "main", recording)
        monkeypatch.setattr(bundle, "PROGRAM_WARM_UP", (warmed, *bundle.PROGRAM_WARM_UP))

    def ran(self) -> list[int]:
        return [int(pid) for pid in (self.directory / "ran-in").read_text().split()]

    def warmed(self) -> set[int]:
        return {int(p.name.removeprefix("warm-")) for p in self.directory.glob("warm-*")}

    def forget(self) -> None:
        for record in [self.directory / "ran-in", *self.directory.glob("warm-*")]:
            record.unlink(missing_ok=True)


@pytest.fixture
def program_runs(tmp_path, monkeypatch) -> ProgramRuns:
    (tmp_path / "runs").mkdir()
    runs = ProgramRuns(tmp_path / "runs")
    runs.watch(monkeypatch)
    return runs


def test_a_cached_render_in_a_program_ahead_block_runs_its_program_in_the_process_forked_then(three_tenants, seeded, tmp_path, program_runs):
    raw, secret_sections, cold = three_tenants
    cache = seeded_copy(seeded, tmp_path / "cache")
    with bundle.program_ahead():
        settled(program_runs.warmed)  # else the call may come first, and that step be left to it
        rendered = cached_render(raw, secret_sections, cache)
    assert program_runs.ran() == list(program_runs.warmed()) != [os.getpid()]
    assert rendered.files() == cold.files()


def test_a_stack_is_planned_from_its_plan_lock(three_tenants, tmp_path):
    cfg = validate(three_tenants[0])
    lock = plan_for(cfg)
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "dev.json").write_text(lock.to_json())
    assert bundle.stack_plan(cfg, "dev", None, tmp_path) == plan_for(cfg, lock)
    assert bundle.stack_plan(cfg, "dev", None, tmp_path / "plans") == plan_for(cfg)


def test_a_cached_render_checks_its_plan_as_read_back_from_the_cache(three_tenants, seeded, tmp_path, monkeypatch):
    """The plan the program deploys is checked in this process before anything is registered:
    read back from the cache, as the program reads it, when the cache has it."""
    raw, secret_sections, cold = three_tenants
    monkeypatch.setattr(parallel, "_forking", lambda: False)  # the program runs here too
    planned: list[int] = []
    plan = bundle.plan_for
    monkeypatch.setattr(bundle, "plan_for", lambda *args: planned.append(os.getpid()) or plan(*args))
    environment = StackEnvironment(tmp_path / "Pulumi.dev.yaml", raw, secret_sections, validate(raw))
    assert render_clusters(environment, cache=seeded_copy(seeded, tmp_path / "cache"))["dev"].files() == cold.files()
    assert planned == []
    render_clusters(environment)
    assert planned == [os.getpid()] * 2  # without a cache: checked, then planned by the program


def test_each_cluster_checks_its_plan_as_read_back_from_the_cache(tmp_path, monkeypatch):
    """A stack per cluster (dev's): each cluster's plan checked as its program plans it, from its
    plan lock (`plans/dev-par1-a.json`), read back when the cache has it."""
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(parallel, "_forking", lambda: False)  # the programs run here too
    render_clusters("dev", cache=tmp_path)
    planned: list[object] = []
    plan = bundle.plan_for
    monkeypatch.setattr(bundle, "plan_for", lambda *args: planned.append(args) or plan(*args))
    render_clusters("dev", cache=tmp_path)
    assert planned == []


@pytest.mark.parametrize("command", [["render", "--out"], ["check", "--charts"]], ids=["render", "check"])
def test_a_command_runs_a_cached_stacks_program_in_a_process_forked_ahead(tmp_path, monkeypatch, program_runs, command):
    """Forked as the command starts (`program_ahead`), before it reads the stack file."""

    @contextlib.contextmanager
    def warmed_first():  # else the call may come first, and that step be left to it
        with ahead():
            settled(program_runs.warmed)
            yield

    ahead = bundle.program_ahead
    monkeypatch.setattr(bundle, "program_ahead", warmed_first)
    monkeypatch.delenv("FACTORY_REQUIRE_UPSTREAM", raising=False)  # CI's: the check without charts is incomplete
    (tmp_path / "empty").mkdir()
    env = {render_cache.CACHE_ENV: str(tmp_path / "cache")}
    for _ in range(2):  # the first fills the cache
        program_runs.forget()
        proc = run_main(command[0], "dev", "--quiet", command[1], str(tmp_path / "empty"), env=env)
        assert proc.returncode == (0 if command[0] == "render" else 3), proc.stderr
    assert set(program_runs.ran()) & program_runs.warmed()


@pytest.mark.parametrize("cached, workers", [(True, None), (False, 1), (False, 3), (True, 3)], ids=["cached", "serial", "workers", "workers-into-a-cache"])
def test_a_render_gives_its_graph_once_complete_and_before_finishing_its_objects(three_tenants, seeded, tmp_path, monkeypatch, cached, workers):
    raw, secret_sections, cold = three_tenants
    seen: list[tuple[str, object]] = []
    finish = bundle.from_graph
    monkeypatch.setattr(bundle, "from_graph", lambda graph, *args: seen.append(("finished", graph)) or finish(graph, *args))
    cache = seeded_copy(seeded, tmp_path) if cached and workers is None else tmp_path if cached else None
    rendered = render_raw(raw, secret_sections, validate(raw), stack="dev", cache=cache, workers=workers, on_graph=lambda graph: seen.append(("given", graph)))
    assert seen == [("given", rendered.graph), ("finished", rendered.graph)] and rendered.files() == cold.files()


def test_a_module_of_the_warm_up_is_loaded_with_its_packages_not_left_to_load_lazily():
    bundle._load("pulumi_kubernetes.flowcontrol.v1beta1")  # a group no component uses
    assert [type(sys.modules[name]) for name in ("pulumi_kubernetes.flowcontrol", "pulumi_kubernetes.flowcontrol.v1beta1")] == [types.ModuleType] * 2
