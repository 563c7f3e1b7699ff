"""The example programs of `examples/`, run as a user would run them (under the SDK's mocks), and
what makes components reusable: two instances side by side, providers passed on, arguments checked."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from ai_factory.components._common import ArgumentError
from ai_factory.components.kueue import KueueArgs, KueueTenantHook
from ai_factory.components.registry import layers
from ai_factory.components.tenant_stack import TenantStack, tenant_stack_args
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.planning.quotas import queue_plan
from ai_factory.factory.rendering.bundle import render_env
from ai_factory.factory.rendering.harness import run_program

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def in_dir(monkeypatch):
    def enter(path: Path) -> None:
        monkeypatch.chdir(path)

    return enter


def test_the_platform_example_renders_from_its_own_project_and_namespace(in_dir):
    in_dir(EXAMPLES / "platform")
    rendered = render_env("lab")
    assert {m.tenant for m in rendered.manifests if m.tenant} == {"speech", "vision"}
    assert {r.name for r in rendered.graph.of_type("ai-factory:index:Platform")} == {"ai-factory"}
    assert {r.urn.split("::")[1] for r in rendered.graph.resources} == {"gpu-platform"}


def test_the_components_example_builds_two_clusters_through_their_own_providers(in_dir, tmp_path):
    in_dir(tmp_path)
    graph = run_program(lambda: runpy.run_path(str(EXAMPLES / "components" / "__main__.py")), project="example", stack="dev")
    providers = {r.name: r.urn for r in graph.of_type("pulumi:providers:kubernetes")}
    assert set(providers) == {"east", "west"}
    for cluster in ("east", "west"):
        kueue = graph.named("ai-factory:scheduling:Kueue", f"{cluster}-kueue")
        children = [r for r in graph.resources if kueue in r.ancestors() and r.custom]
        assert children and all(r.provider.startswith(providers[cluster] + "::") for r in children)
    tenants = [r for r in graph.resources if r.tenant in ("vision", "speech") and r.custom]
    assert {r.inputs["metadata"]["name"] for r in tenants if r.type.endswith(":ClusterQueue")} == {"tenant-vision", "tenant-speech"}
    assert all(r.provider.startswith(providers["east"] + "::") for r in tenants)


def test_every_layer_and_a_tenant_stack_can_be_instantiated_twice_in_one_program(dev_raw):
    from ai_factory.factory.model.loading import validate

    cfg = validate(dev_raw[0])
    plan = plan_for(cfg)
    tenant = cfg.tenants[0]

    def program():
        for layer in layers():
            for copy in ("first", "second"):
                layer.component(f"{copy}-{layer.name}", layer.args(cfg, plan))
        for copy in ("first", "second"):
            TenantStack(f"{copy}-tenant", tenant_stack_args(cfg, plan, tenant, []))

    graph = run_program(program, project="ai-factory", stack="dev")  # a duplicate name would raise
    assert {r.name.split("-", 1)[0] for r in graph.resources} == {"first", "second"}


def test_a_tenant_queue_on_a_flavor_its_kueue_lacks_is_refused_when_the_hook_is_built(dev_raw):
    from ai_factory.factory.model.loading import validate

    cfg = validate(dev_raw[0])
    plan = plan_for(cfg)
    kueue = KueueArgs.from_config(cfg, plan)
    queues = queue_plan(cfg, plan).cluster_queues
    foreign = KueueArgs(**{**vars(kueue), "flavors": kueue.flavors[:1]})
    with pytest.raises(ArgumentError) as refused:
        KueueTenantHook.for_kueue(foreign, queues)
    missing = {o.name for o in kueue.flavors[1:]} & {q.flavor for queue in queues for g in queue.groups for q in g.flavors}
    assert missing and all(f"{name!r} is not a flavor of the Kueue component" in str(refused.value) for name in missing)
    assert "queues[0].groups[" in str(refused.value)
    assert KueueTenantHook.for_kueue(kueue, queues).queues == queues
