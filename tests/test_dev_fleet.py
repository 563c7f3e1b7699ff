"""dev is two clusters on one site sharing the identity layer, `assistant` on both. It renders per
cluster, checks clean, and its manager's dispatch queue runs nothing on the manager's nodes."""

from __future__ import annotations

import copy

from ai_factory.factory.checking.policies import resources_from_graph
from ai_factory.factory.cli import main
from ai_factory.policies.aif_policies.gpu import check_gpu_no_cross_domain_sharing, check_gpu_quota_within_supply
from tests.conftest import REPO


def test_dev_renders_each_cluster_with_one_tenant_on_both(dev_clusters):
    assert list(dev_clusters) == ["par1-a", "par1-b"]
    tenants = {c: sorted({m.tenant for m in r.manifests if m.tenant}) for c, r in dev_clusters.items()}
    assert tenants == {"par1-a": ["assistant", "partner-acme", "search"], "par1-b": ["assistant"]}
    assert [c for c, r in dev_clusters.items() if any(m.layer == "keycloak" for m in r.manifests)] == ["par1-a"]


def test_both_clusters_trust_the_managers_identity_layer(dev_clusters):
    def issuers(rendered):
        releases = [m.obj for m in rendered.manifests if m.kind == "HelmRelease" and m.name.startswith("vcluster-")]
        args = [a for r in releases for a in r["spec"]["values"]["controlPlane"]["distro"]["k8s"]["apiServer"]["extraArgs"]]
        return {a.split("=", 1)[1] for a in args if a.startswith("--oidc-issuer-url=")}

    assert issuers(dev_clusters["par1-b"]) == issuers(dev_clusters["par1-a"]) == {dev_clusters["par1-a"].config.identity.issuer_url}


def test_the_manager_dispatches_the_tenant_to_the_worker_with_its_own_openbao_access(dev_clusters):
    manager, worker = dev_clusters["par1-a"], dev_clusters["par1-b"]
    config = next(m.obj for m in manager.manifests if m.kind == "MultiKueueConfig")
    assert config["spec"]["clusters"] == ["par1-b"]
    secret = next(m.obj for m in manager.manifests if m.kind == "ExternalSecret" and m.name == "multikueue-par1-b")
    assert secret["spec"]["data"][0]["remoteRef"]["key"] == "clusters/par1-a/platform/multikueue/par1-b"
    for cluster, rendered in dev_clusters.items():
        mounts = {m.obj["spec"]["provider"]["vault"]["auth"]["kubernetes"]["mountPath"] for m in rendered.manifests if m.kind == "SecretStore"}
        roles = {r.inputs["backend"] for r in rendered.graph.of_type("vault:kubernetes/authBackendRole:AuthBackendRole")}
        assert mounts == {f"kubernetes-{cluster}"} and roles <= {f"kubernetes-{cluster}"}, cluster
    assert not [m for m in worker.manifests if m.kind in ("MultiKueueCluster", "MultiKueueConfig")]


def _dispatch_findings(resources):
    return [m for check in (check_gpu_no_cross_domain_sharing, check_gpu_quota_within_supply) for _, m in check(resources, {}) if "multicluster" in m]


def test_the_managers_dispatch_queue_is_not_judged_against_the_managers_nodes(dev_clusters):
    resources, _ = resources_from_graph(dev_clusters["par1-a"].graph)
    assert _dispatch_findings(resources) == []
    # The same queue behind an admission check of another controller would run here: judged, and refused.
    for r in resources:
        if r.resource_type.endswith(":AdmissionCheck"):
            r.props = copy.deepcopy(r.props)
            r.props["spec"]["controllerName"] = "example.com/provisioning"
    found = _dispatch_findings(list(resources))  # another run's resources: the pack indexes a run's list once
    assert any("ClusterQueue tenant-assistant-multicluster admits tenant 'assistant'" in m for m in found), found
    assert any("ResourceFlavor multicluster: queues promise" in m for m in found), found


def test_dev_checks_clean_on_both_clusters(oracles, chart_env, capsys):
    args = ["--project-dir", str(REPO), "check", "dev", "-q", "--upstream", str(oracles.root), "--charts", str(chart_env.charts_dir)]
    status = main(args)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "0 finding(s), 0 check families not run" in out


def test_a_check_reads_and_validates_its_stack_file_once(oracles, chart_env, monkeypatch):
    """The matrix refusal, both clusters' renders and the fleet findings share one read (a
    1,000-tenant stack file costs a third of a second to read and validate)."""
    from ai_factory.factory.model import loading

    reads = []
    read_stack_file = loading.read_stack_file
    monkeypatch.setattr(loading, "read_stack_file", lambda path, *args, **kwargs: reads.append(path.name) or read_stack_file(path, *args, **kwargs))
    args = ["--project-dir", str(REPO), "check", "dev", "-q", "--upstream", str(oracles.root), "--charts", str(chart_env.charts_dir)]
    assert main(args) == 0
    assert reads == ["Pulumi.dev.yaml"]
