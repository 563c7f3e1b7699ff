"""The offline render: the real program under mocks, written as a GitOps bundle and an inventory."""

from __future__ import annotations

import asyncio
import copy
import filecmp
import gc
import json
import subprocess
import sys

import pulumi
import pulumi_kubernetes as k8s
import pytest
from pulumi.runtime import resource as sdk_resource
from pulumi.runtime import rpc

from ai_factory.factory.checking import parallel
from ai_factory.factory.rendering import bundle, harness
from ai_factory.factory.rendering.harness import DuplicateResourceError, RecordingMocks, RecordingMonitor, run_program
from ai_factory.factory.model.loading import validate
from ai_factory.factory.rendering.bundle import render_raw
from tests.conftest import REPO, objects, one, render, run_main
from tests.tenancy_env import many_tenants


def test_render_is_deterministic(dev_raw, dev):
    again = render(*dev_raw)
    assert again.files() == dev.files()


def test_render_is_byte_identical_across_processes(tmp_path):
    for out in ("a", "b"):
        subprocess.run([sys.executable, "-m", "ai_factory.factory", "render", "dev", "--out", str(tmp_path / out)], cwd=REPO, check=True, capture_output=True, timeout=120)
    comparison = filecmp.dircmp(tmp_path / "a", tmp_path / "b")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files and not comparison.diff_files and not comparison.left_only and not comparison.right_only
    mismatch, errors = filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", [str(f) for f in files], shallow=False)[1:]
    assert mismatch == [] and errors == []


def test_a_render_in_worker_processes_is_the_serial_render_byte_for_byte(dev_raw):
    """Tenants split over processes (three shares, one per process), merged: the same files and
    inventory as one process, and the same resource graph (parents, dependencies)."""
    raw = many_tenants(copy.deepcopy(dev_raw[0]), 5)
    cfg = validate(raw)
    serial = render_raw(raw, dev_raw[1], cfg, stack="dev", workers=1)
    parallel = render_raw(raw, dev_raw[1], cfg, stack="dev", workers=3)
    assert len({m.tenant for m in parallel.manifests if m.tenant}) == 5
    assert parallel.files() == serial.files()
    assert [(r.urn, r.parent_urn, r.dependency_urns, r.inputs) for r in parallel.graph.resources] == [
        (r.urn, r.parent_urn, r.dependency_urns, r.inputs) for r in serial.graph.resources
    ]


def test_the_main_process_takes_as_many_more_tenants_as_a_workers_start_costs():
    """It has no interpreter to start: it takes `WORKER_START` tenants more than each worker, the
    rest dealt in turn; every tenant in one share."""
    names = [f"t{i:03}" for i in range(100)]
    shares = bundle._shares(names, 2)
    assert [len(s) for s in shares] == [(100 + bundle.WORKER_START) // 2, (100 - bundle.WORKER_START) // 2]
    assert sorted(n for share in shares for n in share) == names


def test_the_main_process_takes_as_many_fewer_tenants_as_the_platform_it_alone_builds_costs():
    """With a cache the workers leave the layers to it: its share is lighter by `platform` tenant stacks."""
    names = [f"t{i:03}" for i in range(100)]
    shares = bundle._shares(names, 2, platform=70)
    assert [len(s) for s in shares] == [(100 - 70 + bundle.WORKER_START) // 2, (100 + 70 - bundle.WORKER_START) // 2]
    assert sorted(n for share in shares for n in share) == names


def test_a_render_worker_with_a_cache_registers_no_layer(dev_raw, tmp_path):
    """The main process builds the platform; a worker its tenants' stacks only (merged and linked
    to the layers by `UnitCache.complete`, byte for byte the serial render: test_render_cache.py)."""
    raw = many_tenants(copy.deepcopy(dev_raw[0]), 2)
    cfg = validate(raw)
    config, secret_keys = bundle.program_config(raw, dev_raw[1], "ai-factory")
    share = frozenset(t.name for t in cfg.tenants[:1])
    graph = bundle._run_share("ai-factory", "dev", config, secret_keys, None, frozenset(), share, units=bundle._ShareUnits(tmp_path, ""))
    assert {r.tenant for r in graph.resources if r.custom} == set(share)


def test_every_helm_release_becomes_a_flux_release_with_its_source(dev):
    releases = objects(dev, "HelmRelease")
    assert releases, "the dev environment installs charts"
    sources = {(m.kind, m.namespace, m.name) for m in dev.manifests}
    for release in releases:
        spec, ns = release["spec"], release["metadata"]["namespace"]
        ref = spec.get("chartRef") or spec["chart"]["spec"]["sourceRef"]
        assert (ref["kind"], ns, ref["name"]) in sources


def test_layout_is_one_object_per_file_by_stage_layer_and_namespace(dev):
    files = dev.files()
    assert "manifests/crds/gpu-operator/gpu-operator/helmrelease-gpu-operator.yaml" in files
    assert "manifests/sources/gpu-operator/_cluster/namespace-gpu-operator.yaml" in files
    assert "manifests/resources/gpu-operator/_cluster/nvidiadriver-driver-h100-train.yaml" in files
    assert "manifests/tenants/tenant-search/tenant-search/resourcequota-tenant-quota.yaml" in files
    assert "manifests/patches/fleet/_cluster/node-gpu-h100-01.yaml" in files
    assert "flux/ai-factory-crds.yaml" in files
    assert "inventory.json" in files


def test_inventory_lists_every_resource_with_parent_layer_and_options(dev):
    inventory = json.loads(dev.files()["inventory.json"])["resources"]
    assert len(inventory) == len(dev.graph.resources)
    by_name = {(e["type"], e["name"]): e for e in inventory}
    release = by_name[("kubernetes:helm.sh/v3:Release", "ai-factory-gpu-operator-release-gpu-operator")]
    assert release["layer"] == "gpu-operator"
    assert release["parent"] == "ai-factory:accelerators:GpuOperator::ai-factory-gpu-operator"
    assert "kubernetes:core/v1:Namespace::ai-factory-gpu-operator-namespace" in release["dependsOn"]
    assert {"protect", "retainOnDelete", "dependsOn", "tenant"} <= set(release)


def test_every_resource_descends_from_the_platform_component(dev):
    roots = [r for r in dev.graph.resources if r.parent is None]
    assert [(r.type, r.name) for r in roots] == [("ai-factory:index:Platform", "ai-factory")]


def test_duplicate_resource_names_are_refused():
    def program():
        k8s.core.v1.Namespace("same", metadata={"name": "a"})
        k8s.core.v1.Namespace("same", metadata={"name": "b"})

    with pytest.raises(DuplicateResourceError, match="'same'"):
        run_program(program, project="p", stack="s")


_SHARED = {"a": "b"}
_CYCLE: list = []
_CYCLE.append(_CYCLE)


@pytest.mark.parametrize(
    "value",
    [
        "text",
        None,
        pulumi.UNKNOWN,
        {"a": [1, {"b": pulumi.UNKNOWN}]},
        {"a": [1, {"b": "c"}], "d": 2.0},
        [_SHARED, _SHARED, [pulumi.UNKNOWN]],
        [_CYCLE, "x"],
        [_CYCLE, pulumi.UNKNOWN],
        k8s.meta.v1.outputs.LabelSelectorRequirement(key="a", operator="In", values=["x", pulumi.UNKNOWN]),
        k8s.meta.v1.outputs.LabelSelectorRequirement(key="a", operator="In", values=["x"]),
    ],
)
def test_the_harness_finds_unknowns_as_the_sdk_does(value):
    assert harness._contains_unknowns(value) is rpc.contains_unknowns(value)


def test_a_run_leaves_the_sdk_and_the_collector_as_it_found_them():
    loop = asyncio.get_event_loop()

    def state():
        return (rpc.contains_unknowns, sdk_resource._get_stack_trace, sdk_resource._resolve_depends_on_urns, sdk_resource.create_urn, gc.isenabled(), loop._default_executor)

    before = state()

    def program():
        assert state()[:5] == (harness._contains_unknowns, harness._no_stack_trace, harness._depends_on_urns, harness._create_urn, False)
        assert isinstance(loop._default_executor, harness._InlineExecutor)
        raise RuntimeError("the program failed")

    with pytest.raises(RuntimeError, match="the program failed"):
        run_program(program, project="p", stack="s")
    assert state() == before and before[4]


@pytest.mark.parametrize("forked", [False, True], ids=["in-this-process", "in-a-process-ending-with-it"])
def test_a_run_ends_with_a_young_collection_unless_its_process_ends_with_the_run(monkeypatch, forked):
    collections: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: collections.append(generation))

    def run() -> list[int]:
        run_program(lambda: None, project="p", stack="s")
        return collections

    if forked:
        with parallel.beside(run) as result:
            assert result() == []
    else:
        assert run() == [1]


@pytest.mark.parametrize(
    "name, type_, parent",
    [
        ("a", "kubernetes:core/v1:Namespace", None),
        ("a", "kubernetes:core/v1:Namespace", ""),
        ("a-b", "kubernetes:core/v1:ConfigMap", "urn:pulumi:s::p::ai-factory:index:Platform::a"),
        ("a-b-c", "keycloak:index/group:Group", "urn:pulumi:s::p::ai-factory:index:Platform$ai-factory:tenancy:TenantStack::a-b"),
    ],
)
def test_the_harness_makes_the_urns_the_sdk_makes(name, type_, parent):
    seen = {}

    def program():
        pulumi.Output.all(harness._create_urn(name, type_, parent), harness._SDK_CREATE_URN(name, type_, parent)).apply(lambda urns: seen.update(urns=urns))

    run_program(program, project="p", stack="s")
    ours, sdks = seen["urns"]
    assert ours == sdks


def test_the_harness_resolves_depends_on_as_the_sdk_does(monkeypatch):
    class Box(pulumi.ComponentResource):
        def __init__(self, name):
            super().__init__("test:index:Box", name)
            self.inner = k8s.core.v1.Namespace(f"{name}-ns", metadata={"name": name}, opts=pulumi.ResourceOptions(parent=self))
            self.register_outputs({})

    def program():
        box = Box("box")
        lone = k8s.core.v1.Namespace("lone", metadata={"name": "lone"})
        k8s.core.v1.ConfigMap("listed", metadata={"name": "a", "namespace": "lone"}, opts=pulumi.ResourceOptions(depends_on=[box, lone, lone]))
        k8s.core.v1.ConfigMap("single", metadata={"name": "b", "namespace": "lone"}, opts=pulumi.ResourceOptions(depends_on=box))
        k8s.core.v1.ConfigMap("output", metadata={"name": "c", "namespace": "lone"}, opts=pulumi.ResourceOptions(depends_on=pulumi.Output.from_input([lone])))

    def dependencies():
        return {r.name: r.dependency_urns for r in run_program(program, project="p", stack="s").resources}

    ours = dependencies()
    monkeypatch.setattr(harness, "_depends_on_urns", harness._SDK_DEPENDS_ON_URNS)
    assert ours == dependencies() and ours["listed"] == sorted({*ours["single"], *ours["output"]})


def test_the_harness_refuses_a_dependency_cycle_as_the_sdk_does(monkeypatch):
    def program():
        box = pulumi.ComponentResource("test:index:Box", "box")
        waiting = k8s.core.v1.Namespace("waiting", metadata={"name": "waiting"}, opts=pulumi.ResourceOptions(depends_on=[box]))
        # A child of the box made after, waiting for what waits for the box: a cycle.
        k8s.core.v1.ConfigMap("inner", metadata={"name": "inner", "namespace": "waiting"}, opts=pulumi.ResourceOptions(parent=box, depends_on=[waiting]))

    def error() -> str:
        with pytest.raises(RuntimeError, match="circular dependency") as raised:
            run_program(program, project="p", stack="s")
        return str(raised.value)

    ours = error()
    monkeypatch.setattr(harness, "_depends_on_urns", harness._SDK_DEPENDS_ON_URNS)
    assert ours == error()


def test_the_harness_makes_a_childs_alias_urn_as_the_sdk_does():
    seen = {}

    def program():
        parent = pulumi.ComponentResource("test:index:Box", "box")
        pulumi.Output.all(harness._create_urn("box-a", "kubernetes:core/v1:Namespace", parent), harness._SDK_CREATE_URN("box-a", "kubernetes:core/v1:Namespace", parent)).apply(
            lambda urns: seen.update(urns=urns)
        )

    run_program(program, project="p", stack="s")
    ours, sdks = seen["urns"]
    assert ours == sdks == "urn:pulumi:s::p::pulumi:pulumi:Stack$test:index:Box$kubernetes:core/v1:Namespace::box-a"


def test_outputs_read_back_are_the_inputs_with_the_providers_defaults():
    seen = {}

    def program():
        named = k8s.core.v1.ConfigMap("named", metadata={"name": "given", "labels": {"a": "b"}}, data={"k": "v"})
        unnamed = k8s.core.v1.ConfigMap("unnamed", metadata={"labels": {"a": "b"}}, data={"k": "v"})
        pulumi.Output.all(named.metadata, named.data, named.kind, unnamed.metadata, unnamed.id).apply(lambda values: seen.update(values=values))

    run_program(program, project="p", stack="s")
    assert seen["values"] == [{"name": "given", "labels": {"a": "b"}}, {"k": "v"}, "ConfigMap", {"name": "unnamed", "labels": {"a": "b"}}, "unnamed-id"]


def test_the_harness_keeps_one_copy_of_inputs_and_copies_only_what_it_redacts():
    monitor = RecordingMonitor(RecordingMocks())

    def program():
        k8s.core.v1.ConfigMap("plain", metadata={"name": "plain", "labels": {"a": "b"}}, data={"k": "v"})
        k8s.core.v1.Secret("hidden", metadata={"name": "hidden", "labels": {"a": "b"}}, string_data={"k": pulumi.Output.secret("v")})

    run_program(program, project="p", stack="s", monitor=monitor)
    state = {urn: registration.state for urn, registration in monitor.resources.items()}
    plain, hidden = (monitor.recorded[f"kubernetes:core/v1:{kind}::{name}"] for kind, name in (("ConfigMap", "plain"), ("Secret", "hidden")))
    assert plain.inputs["data"] is state[plain.urn]["data"] and plain.inputs["metadata"]["labels"] is state[plain.urn]["metadata"]["labels"]
    assert hidden.inputs["stringData"] == {"k": "[secret]"} and hidden.secret_paths == ["stringData.k"]
    assert hidden.inputs["metadata"]["labels"] is state[hidden.urn]["metadata"]["labels"]


def test_secret_values_never_reach_the_output(raw):
    needle = "s3cr3t-ngc-api-key-value"
    from ai_factory.factory.model.loading import validate
    from ai_factory.factory.rendering.bundle import render_raw
    from ai_factory.factory.model.secrets import SecretValue

    # As inside `pulumi up`: the engine hands the program the decrypted value of a secret key.
    raw["layers"]["gpu_operator"]["registry"]["password"] = needle
    cfg = validate(raw, decrypted_secret_sections={"layers"})
    assert isinstance(cfg.layers.gpu_operator.registry.password, SecretValue)
    rendered = render_raw(raw, {"layers"}, cfg, stack="dev")
    secret = one(rendered, "Secret", "registry-credentials")
    assert secret["stringData"] == {".dockerconfigjson": "[secret]"}
    assert secret["metadata"]["annotations"]["kustomize.toolkit.fluxcd.io/reconcile"] == "disabled"
    assert all(needle not in text for text in rendered.files().values())
    assert needle not in rendered.summary()
    entry = next(e for e in rendered.inventory if e["name"] == "ai-factory-gpu-operator-registry")
    assert entry["secretInputs"] == ["stringData..dockerconfigjson"]


def test_render_prints_a_summary_per_layer(tmp_path):
    proc = run_main("render", "dev", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert f"to {tmp_path}/" in proc.stdout
    assert "layer gpu-operator" in proc.stdout and "layer fleet" in proc.stdout
