"""Several clusters per environment: each cluster renders as its own stack, tenants land on
their clusters, MultiKueue dispatches from the manager with credentials from OpenBao, and a
tenant's quota summed over its clusters never exceeds its grant."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from ai_factory.factory.checking.fleet import fleet_findings
from ai_factory.factory.checking.isolation import CHECKS as ISOLATION_CHECKS
from ai_factory.factory.cli import main
from ai_factory.factory.model.loading import ConfigError, load_stack_file, read_stack_file, validate
from ai_factory.factory.rendering.bundle import render_clusters, render_env
from tests.fleet_env import fleet_document, write_env


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fleet")
    write_env(directory)
    return directory


@pytest.fixture(scope="module")
def renders(fleet_dir):
    here = os.getcwd()
    os.chdir(fleet_dir)
    try:
        return render_clusters("fleet")
    finally:
        os.chdir(here)


def refs(rendered, kind):
    return sorted(m.ref for m in rendered.manifests if m.kind == kind)


def test_each_cluster_renders_its_own_pools_and_tenants(renders):
    assert list(renders) == ["par1-a", "par1-b", "fra1-a", "ams1-a"]
    tenants = {c: sorted({m.tenant for m in r.manifests if m.tenant}) for c, r in renders.items()}
    assert tenants == {"par1-a": ["assistant", "partner-acme", "search"], "par1-b": ["assistant", "search"], "fra1-a": ["assistant"], "ams1-a": ["search"]}
    nodes = {c: sorted(m.name for m in r.manifests if m.kind == "Node") for c, r in renders.items()}
    assert nodes["fra1-a"] == ["l40s-infer-000", "l40s-infer-001"] and nodes["ams1-a"] == ["h100-ams-000", "h100-ams-001"]


def test_the_identity_layer_runs_on_the_manager_only(renders):
    with_keycloak = [c for c, r in renders.items() if any(m.layer == "keycloak" for m in r.manifests)]
    assert with_keycloak == ["par1-a"]


def test_the_manager_connects_to_each_worker_with_a_kubeconfig_from_openbao(renders):
    manager = renders["par1-a"]
    assert refs(manager, "MultiKueueCluster") == ["MultiKueueCluster/ams1-a", "MultiKueueCluster/fra1-a", "MultiKueueCluster/par1-b"]
    secrets = {m.name: m.obj["spec"] for m in manager.manifests if m.kind == "ExternalSecret"}
    assert secrets["multikueue-fra1-a"]["data"] == [{"secretKey": "kubeconfig", "remoteRef": {"key": "clusters/par1-a/platform/multikueue/fra1-a", "property": "kubeconfig"}}]
    assert secrets["multikueue-fra1-a"]["secretStoreRef"] == {"kind": "SecretStore", "name": "openbao-multikueue"}
    assert not [m for c, r in renders.items() if c != "par1-a" for m in r.manifests if m.kind in ("MultiKueueCluster", "ExternalSecret") and m.layer == "multikueue"]


def test_a_tenant_on_several_clusters_is_dispatched_to_its_workers_with_their_quota_summed(renders):
    manager = renders["par1-a"]
    config = next(m.obj for m in manager.manifests if m.kind == "MultiKueueConfig" and m.name == "tenant-assistant")
    assert config["spec"]["clusters"] == ["par1-b", "fra1-a"]
    dispatch = next(m.obj for m in manager.manifests if m.kind == "ClusterQueue" and m.name == "tenant-assistant-multicluster")
    assert dispatch["spec"]["admissionChecksStrategy"] == {"admissionChecks": [{"name": "multikueue-tenant-assistant"}]}
    quota = {r["name"]: r["nominalQuota"] for r in dispatch["spec"]["resourceGroups"][0]["flavors"][0]["resources"]}
    workers: Counter = Counter()
    for cluster in ("par1-b", "fra1-a"):
        queue = next(m.obj for m in renders[cluster].manifests if m.kind == "ClusterQueue" and m.name == "tenant-assistant")
        workers.update({r["name"]: r["nominalQuota"] for g in queue["spec"]["resourceGroups"] for f in g["flavors"] for r in f["resources"] if r["name"].startswith("nvidia.com/")})
    assert {k: v for k, v in quota.items() if k.startswith("nvidia.com/")} == dict(workers)
    assert quota["cpu"] == "128" and quota["memory"] == "1024Gi"
    for cluster in ("par1-b", "fra1-a"):
        local = next(m.obj for m in renders[cluster].manifests if m.kind == "LocalQueue" and m.name == "multicluster" and m.namespace == "tenant-assistant")
        assert local["spec"]["clusterQueue"] == "tenant-assistant"


def test_multikueue_objects_validate_against_the_kueue_crds(renders, oracles):
    kinds = ("MultiKueueCluster", "MultiKueueConfig", "AdmissionCheck", "ClusterQueue", "LocalQueue", "ResourceFlavor", "ExternalSecret", "SecretStore")
    for cluster, rendered in renders.items():
        for m in rendered.manifests:
            if m.kind in kinds:
                assert oracles.validate_object(m.obj, rendered.kubernetes_version) == [], (cluster, m.ref)


def test_every_cluster_passes_the_isolation_checks_and_the_fleet_checks(renders, fleet_dir, oracles):
    for cluster, rendered in renders.items():
        assert [str(f) for check in ISOLATION_CHECKS for f in check(rendered, oracles)] == [], cluster
    assert fleet_findings(load_stack_file(str(fleet_dir / "Pulumi.fleet.yaml")), renders) == []


def test_render_writes_one_directory_per_cluster(fleet_dir, tmp_path, capsys):
    assert main(["--project-dir", str(fleet_dir), "render", "fleet", "-q", "--out", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ams1-a", "fra1-a", "par1-a", "par1-b"]
    assert (tmp_path / "out" / "par1-a" / "inventory.json").is_file()


def test_a_multi_cluster_environment_is_not_rendered_as_one_cluster(fleet_dir):
    with pytest.raises(ConfigError, match="kubernetes.cluster: the environment has clusters par1-a, par1-b, fra1-a, ams1-a"):
        render_env(str(fleet_dir / "Pulumi.fleet.yaml"))


def _tenant(document, name):
    return next(t for t in document["config"]["ai-factory:tenants"] if t["name"] == name)


def _site(document, name):
    return next(s for s in document["config"]["ai-factory:fleet"]["sites"] if s["name"] == name)


@pytest.mark.parametrize(
    "change, expected",
    [
        pytest.param(lambda d: _tenant(d, "search").update(clusters=["par1-a", "par1-b", "ams1-a", "ams1-x"]), "tenants[0].clusters[3]: unknown cluster 'ams1-x' (did you mean 'ams1-a'?)", id="tenant-on-an-unknown-cluster"),
        pytest.param(lambda d: _site(d, "ams1")["clusters"][0].update(name="fra1-a"), "fleet.sites[2].clusters[0].name: duplicate cluster name 'fra1-a'", id="two-clusters-of-one-name"),
        pytest.param(lambda d: d["config"]["ai-factory:fleet"]["pools"][0].update(cluster="fra1-a"), "fleet.pools[0].cluster: 'fra1-a' is not one of site 'par1''s clusters", id="pool-on-another-sites-cluster"),
        pytest.param(lambda d: d["config"]["ai-factory:fleet"]["pools"][0].pop("cluster"), "fleet.pools[0].cluster: site 'par1' has clusters par1-a, par1-b; name the pool's", id="pool-without-its-cluster"),
        pytest.param(lambda d: _site(d, "par1")["clusters"][0].pop("role"), "fleet.sites: 0 manager clusters (none)", id="no-manager"),
        pytest.param(lambda d: _tenant(d, "assistant").update(clusters=["par1-b", "fra1-a"]), "tenants[1].clusters: a tenant on several clusters is also on the manager cluster 'par1-a'", id="multi-cluster-tenant-off-the-manager"),
        pytest.param(lambda d: _tenant(d, "search").update(clusters=["par1-a", "par1-b"]), "tenants[0].clusters: the tenant demands GPUs of cluster 'ams1-a''s pools but is not placed on it", id="tenant-off-its-pools-cluster"),
        pytest.param(lambda d: d["config"]["ai-factory:kubernetes"].update(cluster="lon1"), "kubernetes.cluster: unknown cluster 'lon1'", id="stack-of-an-unknown-cluster"),
    ],
)
def test_bad_placement_is_one_message_with_its_path(tmp_path, capsys, change, expected):
    document = fleet_document()
    change(document)
    write_env(tmp_path, document)
    assert main(["--project-dir", str(tmp_path), "render", "fleet", "-q", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "(1 problem)" in err and expected in err, err
    assert not (tmp_path / "out").exists()


def test_clusters_named_in_an_environment_without_clusters_are_refused(raw):
    raw["tenants"][0]["clusters"] = ["par1-a"]
    with pytest.raises(ConfigError, match=r"tenants\[0\].clusters: no site declares clusters"):
        validate(raw)


def test_a_clusters_contract_reads_back_as_that_clusters_view(fleet_dir):
    from ai_factory.factory.model.clusters import cluster_view
    from ai_factory.factory.planning.from_config import plan_for
    from ai_factory.stacks.contract import platform_contract, platform_secrets

    cfg = load_stack_file(str(fleet_dir / "Pulumi.fleet.yaml"))
    view = cluster_view(cfg, "fra1-a")
    back = platform_contract(view, plan_for(view), "fleet-fra1-a").config(platform_secrets(view))
    assert back.kubernetes.cluster == "fra1-a"
    assert [p.name for p in back.fleet.pools] == ["l40s-infer"] and [t.name for t in back.tenants] == ["assistant"]
