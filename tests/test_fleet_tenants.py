"""Tenant stacks in a multi-cluster environment: a tenant on several clusters has a stack per
cluster, built against that cluster's platform stack and provider, from that cluster's contract."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from ai_factory.factory.model.clusters import cluster_view
from ai_factory.factory.model.loading import ConfigError, load_stack_file
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.stacks.contract import CONTRACT_OUTPUT, CONTRACT_SECRETS_OUTPUT, platform_contract, platform_secrets
from ai_factory.stacks.fleet import FleetStacks
from ai_factory.stacks.platform import PlatformStacks
from ai_factory.stacks.tenants import PLATFORM_KEY, TENANT_KEY, TenantStacks
from tests.fake_pulumi import Deployed, FakePulumi
from tests.fleet_env import fleet_document, write_env
from tests.stacks_support import backend, tenant_program

ORG = "organization"


def self_service_fleet() -> dict:
    """The fleet environment, `assistant` (on par1-a, par1-b, fra1-a) built by stacks of its own."""
    document = fleet_document()
    for tenant in document["config"]["ai-factory:tenants"]:
        if tenant["name"] in ("assistant", "partner-acme"):
            tenant["managed_by"] = "tenant-stack"
    return document


@functools.cache
def contracts(project: str) -> dict[str, tuple[str, str]]:
    cfg = load_stack_file("fleet", Path(project))
    found = {}
    for cluster in ("par1-a", "par1-b", "fra1-a", "ams1-a"):
        view = cluster_view(cfg, cluster)
        found[f"fleet-{cluster}"] = (platform_contract(view, plan_for(view), f"fleet-{cluster}").to_output(), platform_secrets(view))
    return found


@pytest.fixture
def fleet(tmp_path):
    write_env(tmp_path, self_service_fleet())

    def platform(stack: str, config: dict[str, str]) -> Deployed:
        contract, secrets = contracts(str(tmp_path))[stack.rsplit("/", 1)[-1]]
        return Deployed(outputs={CONTRACT_OUTPUT: contract, CONTRACT_SECRETS_OUTPUT: secrets}, secret_outputs=frozenset({CONTRACT_SECRETS_OUTPUT}))

    cli = FakePulumi({"ai-factory": platform, "ai-factory-tenant": tenant_program})
    FleetStacks(backend(tmp_path), project_dir=tmp_path, pulumi_command=cli).up("fleet")
    platforms = PlatformStacks(backend(tmp_path), project_dir=tmp_path, pulumi_command=cli)
    return cli, TenantStacks(platforms.backend, platforms=platforms, project_dir=tmp_path, pulumi_command=cli)


def assistant() -> dict:
    return next(t for t in self_service_fleet()["config"]["ai-factory:tenants"] if t["name"] == "assistant")


def test_a_tenant_on_several_clusters_gets_a_stack_per_cluster_against_its_platform_and_provider(fleet, tmp_path):
    cli, tenants = fleet
    result = tenants.create("fleet", assistant())
    assert list(result.clusters) == ["par1-a", "par1-b", "fra1-a"]
    assert result.stack == ", ".join(f"{ORG}/ai-factory-tenant/fleet-{c}.assistant" for c in ("par1-a", "par1-b", "fra1-a"))
    assert result.changes == {"create": 12}  # 4 resources of the fake tenant program on each
    settings = {name.rsplit("/", 1)[-1]: s.config for name, s in cli.stacks.items() if "/ai-factory-tenant/" in name}
    assert sorted(settings) == ["fleet-fra1-a.assistant", "fleet-par1-a.assistant", "fleet-par1-b.assistant"]
    for cluster in ("par1-a", "par1-b", "fra1-a"):
        assert settings[f"fleet-{cluster}.assistant"][PLATFORM_KEY] == f"{ORG}/ai-factory/fleet-{cluster}"
    contexts = {name: config.get("kubernetes:context") for name, config in settings.items()}
    # par1's clusters name their contexts; fra1-a's stack keeps the environment's.
    assert contexts == {"fleet-par1-a.assistant": "par1-a-admin", "fleet-par1-b.assistant": "par1-b-admin", "fleet-fra1-a.assistant": "dev-admin"}
    assert [(t.name, t.cluster) for t in tenants.list("fleet")] == [("assistant", "par1-a"), ("assistant", "par1-b"), ("assistant", "fra1-a")]


def test_deleting_a_tenant_on_several_clusters_deletes_its_stack_on_each_and_only_those(fleet, tmp_path):
    cli, tenants = fleet
    tenants.create("fleet", assistant())
    tenants.create("fleet", next(t for t in self_service_fleet()["config"]["ai-factory:tenants"] if t["name"] == "partner-acme"))
    result = tenants.delete("fleet", "assistant")
    assert list(result.clusters) == ["par1-a", "par1-b", "fra1-a"]
    destroyed = sorted(c.stack.rsplit("/", 1)[-1] for c in cli.operations("destroy"))
    assert destroyed == ["fleet-fra1-a.assistant", "fleet-par1-a.assistant", "fleet-par1-b.assistant"]
    assert [k.reason for k in result.kept].count("protected") == 3 and not result.removed  # its namespace, on each cluster


def test_a_clusters_contract_refuses_a_tenant_that_is_not_on_it(tmp_path):
    write_env(tmp_path, self_service_fleet())
    cfg = load_stack_file("fleet", tmp_path)
    view = cluster_view(cfg, "fra1-a")
    contract = platform_contract(view, plan_for(view), "fleet-fra1-a")
    partner = next(t for t in cfg.tenants if t.name == "partner-acme")
    assert contract.tenant_problems(partner) == [
        "tenant.clusters: 'partner-acme' is not placed on cluster fra1-a (fleet-fra1-a); its stacks are those of the clusters it is on"
    ]
    assert contract.tenant_problems(next(t for t in cfg.tenants if t.name == "assistant")) == []


def test_a_tenant_the_platform_changed_is_refused_on_every_cluster_before_any_stack(fleet, tmp_path):
    cli, tenants = fleet
    before = len(cli.calls)
    with pytest.raises(ConfigError) as err:
        tenants.create("fleet", {**assistant(), "trust": "low"})
    assert sorted(p for p in err.value.problems if p.startswith("tenant.trust")) == [
        f"tenant.trust: \"low\" differs from the platform's registration of 'assistant' in fleet-{c}: \"medium\"" for c in ("fra1-a", "par1-a", "par1-b")
    ]
    assert not [c for c in cli.calls[before:] if c.args[:2] == ["stack", "init"]]


def run_tenant_program(project, cluster: str):
    from ai_factory.factory.rendering.harness import run_program
    from ai_factory.stacks.tenants import tenant_program as program
    from tests.test_stacks_program import monitor_with_platform

    contract, secrets = contracts(str(project))[f"fleet-{cluster}"]
    monitor = monitor_with_platform({CONTRACT_OUTPUT: contract, CONTRACT_SECRETS_OUTPUT: secrets})
    config = {TENANT_KEY: json.dumps(assistant()), PLATFORM_KEY: f"{ORG}/ai-factory/fleet-{cluster}"}
    return run_program(program, project="ai-factory-tenant", stack=f"fleet-{cluster}.assistant", config=config, monitor=monitor)


def test_the_tenant_program_builds_the_tenant_with_the_clusters_share_only(tmp_path):
    write_env(tmp_path, self_service_fleet())
    # assistant's model runs on l40s-infer, fra1-a's pool; its MIG demand is par1-b's.
    models = {c: sorted(r.name for r in run_tenant_program(tmp_path, c).resources if "qwen-1-5b" in r.name) for c in ("par1-b", "fra1-a")}
    assert models["par1-b"] == [] and models["fra1-a"]
    graph = run_tenant_program(tmp_path, "par1-b")
    quota = next(r.inputs for r in graph.resources if r.type == "kubernetes:core/v1:ResourceQuota")
    assert int(quota["spec"]["hard"]["requests.nvidia.com/mig-2g.20gb"]) >= 3
    queues = {r.inputs["metadata"]["name"]: r.inputs["spec"]["clusterQueue"] for r in graph.resources if r.type.endswith(":LocalQueue")}
    assert queues["multicluster"] == "tenant-assistant"  # the worker's own ClusterQueue takes the dispatched work


def test_the_one_stack_platform_api_refuses_a_multi_cluster_environment_before_any_cli(tmp_path):
    write_env(tmp_path)
    cli = FakePulumi()
    with pytest.raises(ConfigError, match=r"kubernetes.cluster: the environment has clusters par1-a, par1-b, fra1-a, ams1-a; each is deployed by its own stack"):
        PlatformStacks(backend(tmp_path), project_dir=tmp_path, pulumi_command=cli).up("fleet")
    assert cli.calls == []
