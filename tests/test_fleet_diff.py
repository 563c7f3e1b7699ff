"""`factory diff` in a multi-cluster environment: a tenant's removal is answered per cluster it is
on, each change under its cluster, from each cluster's plan lock; clusters it is not on are not
touched."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from ai_factory.factory.cli import main
from ai_factory.factory.rendering.diff import FleetRemoval, TenantRemoval, difference, without_tenant
from tests.fleet_env import fleet_document, one_cluster, write_env
from tests.test_diff import manifest, rendered


@pytest.fixture(scope="module")
def locked_fleet(tmp_path_factory):
    """The fleet environment with every cluster's plan locked (`ai-factory plan fleet --lock`)."""
    directory = tmp_path_factory.mktemp("fleet-diff")
    write_env(directory)
    assert main(["--project-dir", str(directory), "plan", "fleet", "--lock", "-q", "--format", "json"]) == 0
    return directory


@pytest.fixture(scope="module")
def assistant_removal(locked_fleet) -> FleetRemoval:
    here = os.getcwd()
    os.chdir(locked_fleet)
    try:
        return without_tenant("fleet", "assistant")
    finally:
        os.chdir(here)


def test_plan_lock_of_a_multi_cluster_environment_locks_each_clusters_plan(locked_fleet, capsys):
    locks = sorted(p.name for p in (locked_fleet / "plans").iterdir())
    assert locks == ["fleet-ams1-a.json", "fleet-fra1-a.json", "fleet-par1-a.json", "fleet-par1-b.json"]
    fra = json.loads((locked_fleet / "plans" / "fleet-fra1-a.json").read_text())
    assert [p["name"] for p in fra["pools"]] == ["l40s-infer"]


def test_a_tenant_on_several_clusters_is_removed_from_each_with_only_its_objects_going(assistant_removal):
    assert list(assistant_removal.removals) == ["par1-a", "par1-b", "fra1-a"]
    assert assistant_removal.unchanged == ["ams1-a"]
    assert assistant_removal.unexpected == []
    for cluster, removal in assistant_removal.removals.items():
        gone = {m.tenant for m in removal.removal.removed}
        assert gone <= {"assistant", None}, cluster
        assert not removal.notes, (cluster, removal.notes)  # each cluster's plan lock is current


def test_the_managers_connection_to_a_worker_only_the_tenant_used_goes_with_it(assistant_removal):
    manager = assistant_removal.removals["par1-a"].removal.removed
    assert sorted(m.ref for m in manager if m.layer == "multikueue") == ["ExternalSecret/kueue-system/multikueue-fra1-a", "MultiKueueCluster/fra1-a"]
    assert "    - deleted manifests/resources/multikueue/_cluster/multikueuecluster-fra1-a.yaml" in assistant_removal.render("fleet")


def test_the_report_puts_every_change_under_its_cluster(assistant_removal):
    text = assistant_removal.render("fleet")
    assert text.splitlines()[0] == "removing tenant 'assistant' from fleet: on cluster(s) par1-a, par1-b, fra1-a"
    heads = [line for line in text.splitlines() if line.startswith("cluster ")]
    assert heads == ["cluster par1-a (stack fleet-par1-a):", "cluster par1-b (stack fleet-par1-b):", "cluster fra1-a (stack fleet-fra1-a):"]
    assert "  removing tenant 'assistant' from fleet-par1-b: " in text
    assert "unchanged (the tenant is not on them, their configuration is the same without it): ams1-a" in text
    assert text.endswith("no other object changes on any cluster")
    document = json.loads(assistant_removal.to_json("fleet"))
    assert sorted(document["clusters"]) == ["fra1-a", "par1-a", "par1-b"] and document["unchanged"] == ["ams1-a"]
    assert document["clusters"]["par1-b"]["tenant"] == "assistant" and document["unexpected"] == []


def test_an_unexpected_change_is_reported_with_its_cluster():
    before = rendered(manifest("Namespace", "tenant-a", "a"), manifest("ConfigMap", "b", "b", x=1))
    after = rendered(manifest("ConfigMap", "b", "b", x=2))
    removal = TenantRemoval("a", "a", difference(before, after), difference(after, after))
    fleet = FleetRemoval("a", {"west": "env-west"}, {"west": removal}, ["east"])
    assert fleet.unexpected[0] == "west: removal changes manifests/tenant-b/_cluster/configmap-b.yaml (tenant b)"
    assert fleet.unexpected[1].startswith("    ")  # its diff, under it
    assert "UNEXPECTED: 1 other change(s) over the clusters (listed under each)" in fleet.render("env")


def test_diff_of_a_tenant_on_one_cluster_renders_that_cluster_only_and_exits_clean(locked_fleet, capsys):
    assert main(["--project-dir", str(locked_fleet), "diff", "fleet", "--without-tenant", "partner-acme"]) == 0
    out = capsys.readouterr().out
    assert "cluster par1-a (stack fleet-par1-a):" in out and "cluster par1-b" not in out
    assert "unchanged (the tenant is not on them, their configuration is the same without it): par1-b, fra1-a, ams1-a" in out


def _gateway(*tenants: str):
    m = manifest("Gateway", "inference-0", None)
    m.obj["spec"] = {"listeners": [{"name": t, "allowedRoutes": {"namespaces": {"selector": {"matchLabels": {"ai-factory.io/tenant": t}}}}} for t in tenants]}
    return m


def _multikueue(kind: str, name: str, tenant: str | None = None, **spec):
    m = manifest(kind, name, tenant, **spec)
    m.layer = "multikueue" if tenant is None else m.layer
    return m


@pytest.mark.parametrize(
    "platform_object, goes",
    [
        pytest.param(_gateway("a"), True, id="accepts-a-gateway-of-its-listeners-only"),
        pytest.param(_gateway("a", "b"), False, id="flags-a-gateway-with-another-tenants-listener"),
        pytest.param(_gateway(), False, id="flags-a-gateway-without-listeners"),
        pytest.param(_multikueue("MultiKueueCluster", "west"), True, id="accepts-the-connection-to-its-worker"),
        pytest.param(_multikueue("ExternalSecret", "multikueue-west"), True, id="accepts-its-workers-kubeconfig"),
        pytest.param(_multikueue("MultiKueueCluster", "east"), False, id="flags-the-connection-to-another-worker"),
        pytest.param(_multikueue("ExternalSecret", "multikueue-east"), False, id="flags-another-workers-kubeconfig"),
        pytest.param(manifest("MultiKueueCluster", "west", None), False, id="flags-a-worker-connection-of-another-layer"),
    ],
)
def test_a_platform_object_goes_with_the_tenant_only_if_it_served_it_alone(platform_object, goes):
    config = _multikueue("MultiKueueConfig", "tenant-a", "a", clusters=["west"])
    before = rendered(manifest("Namespace", "tenant-a", "a"), config, platform_object)
    after = rendered()
    removal = TenantRemoval("a", "a", difference(before, after), difference(after, after))
    assert (removal.unexpected == []) is goes, removal.unexpected


@pytest.fixture(scope="module")
def partly_locked_fleet(tmp_path_factory):
    """The fleet environment with every cluster's plan locked but par1-a's (`plan --lock --cluster`)."""
    directory = tmp_path_factory.mktemp("fleet-partly-locked")
    write_env(directory)
    others = ["--cluster", "par1-b", "--cluster", "fra1-a", "--cluster", "ams1-a"]
    assert main(["--project-dir", str(directory), "plan", "fleet", "--lock", "-q", "--format", "json", *others]) == 0
    return directory


def test_plan_lock_of_named_clusters_locks_those_only(partly_locked_fleet, capsys):
    locks = sorted(p.name for p in (partly_locked_fleet / "plans").iterdir())
    assert locks == ["fleet-ams1-a.json", "fleet-fra1-a.json", "fleet-par1-b.json"]
    assert sorted(p.name for p in (partly_locked_fleet / "build" / "fleet").iterdir()) == ["ams1-a", "fra1-a", "par1-b"]


@pytest.mark.parametrize(
    "asked, problem",
    [
        pytest.param(["fra1-b"], "--cluster: no cluster 'fra1-b' in Pulumi.fleet.yaml (did you mean 'fra1-a'?)", id="flags-a-misspelt-cluster"),
        pytest.param(["par1-b", "x" * 300], "--cluster: no cluster '" + "x" * 64 + "' in Pulumi.fleet.yaml (clusters: par1-a, par1-b, fra1-a, ams1-a)", id="flags-an-unknown-cluster-among-known"),
    ],
)
def test_plan_refuses_a_cluster_the_environment_does_not_declare_and_writes_nothing(tmp_path, capsys, asked, problem):
    write_env(tmp_path)
    args = [arg for name in asked for arg in ("--cluster", name)]
    assert main(["--project-dir", str(tmp_path), "plan", "fleet", "--lock", *args]) == 2
    captured = capsys.readouterr()
    assert f"  - {problem}" in captured.err.splitlines() and "Traceback" not in captured.err
    assert not (tmp_path / "plans").exists() and not (tmp_path / "build").exists()


def test_plan_refuses_a_cluster_of_an_environment_without_clusters(tmp_path, capsys):
    write_env(tmp_path, one_cluster(fleet_document()))
    assert main(["--project-dir", str(tmp_path), "plan", "fleet", "--cluster", "par1-a"]) == 2
    assert "--cluster: Pulumi.fleet.yaml declares no clusters (`fleet.sites[].clusters`): it is planned as one" in capsys.readouterr().err
    assert not (tmp_path / "build").exists()


def test_diff_advises_locking_exactly_the_cluster_whose_lock_is_missing(partly_locked_fleet, capsys):
    assert main(["--project-dir", str(partly_locked_fleet), "diff", "fleet", "--without-tenant", "partner-acme"]) == 1
    out = capsys.readouterr().out
    assert "fleet-par1-a has no plan lock (plans/fleet-par1-a.json): `pulumi up` re-plans every tenant from scratch" in out
    assert "lock the plan first (`ai-factory plan fleet --lock --cluster par1-a`, then commit it)" in out
    assert "plan fleet --lock`" not in out


def test_a_self_service_tenant_on_two_clusters_is_removed_as_offboarding_does_on_each(tmp_path, capsys):
    write_env(tmp_path)
    registry = tmp_path / "tenants" / "fleet"
    registry.mkdir(parents=True)
    twoco = {"name": "twoco", "trust": "medium", "owners": {"groups": ["twoco-admins"]},
             "gpus": [{"pool": "h100-train", "count": 8}, {"pool": "l40s-infer", "count": 1, "memory_mib": 12288, "cores_percent": 25}]}
    (registry / "twoco.yaml").write_text(yaml.safe_dump(twoco))
    assert main(["--project-dir", str(tmp_path), "plan", "fleet", "--lock", "-q", "--format", "json"]) == 0
    capsys.readouterr()
    assert main(["--project-dir", str(tmp_path), "diff", "fleet", "--without-tenant", "twoco", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert sorted(document["clusters"]) == ["fra1-a", "par1-a"] and document["unchanged"] == ["par1-b", "ams1-a"]
    for cluster, removal in document["clusters"].items():
        deleted = {c["path"] for c in removal["changes"] if c["step"] == "removal" and c["change"] == "deleted"}
        assert "manifests/tenants/tenant-twoco/_cluster/namespace-tenant-twoco.yaml" in deleted, cluster
    assert document["unexpected"] == [] and (registry / "twoco.yaml").is_file()  # the diff removes nothing
