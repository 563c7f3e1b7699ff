"""`factory check` with the real charts: every release rendered by helm from the chart cache, and the
charts' objects checked together with the library's (issue 12 items 1-2, issue 23)."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from ai_factory.factory.checking.charts import Report, check_environment
from ai_factory.factory.cli import main
from ai_factory.factory.model.catalog import CHARTS
from ai_factory.factory.rendering import charts
from ai_factory.factory.rendering.bundle import Rendered
from ai_factory.factory.checking.isolation import DRA_QUOTA_SUFFIX
from tests.conftest import REPO, ChartEnv, render
from tests.test_device_layer import STACK as DEVICE_STACK
from tests.test_device_layer import device_config
from tests.test_isolation import find, variant


@pytest.fixture(scope="session")
def dev_report(dev, oracles, chart_env: ChartEnv) -> Report:
    return check_environment(dev, oracles.root, chart_env.charts_dir, chart_env.helm, chart_env.store)


def check(rendered: Rendered, oracles, chart_env: ChartEnv) -> Report:
    return check_environment(rendered, oracles.root, chart_env.charts_dir, chart_env.helm, chart_env.store)


def values_of(release: str):
    def edit(change):
        return lambda r: change(find(r, "HelmRelease", release)["spec"]["values"])

    return edit


def test_dev_renders_every_release_with_its_chart_and_is_clean(dev, dev_report):
    releases = [m for m in dev.manifests if m.kind == "HelmRelease"]
    assert (dev_report.charts_rendered, dev_report.not_run, dev_report.findings) == (len(releases), [], [])
    assert dev_report.objects > 4 * len(dev.manifests)  # the charts' objects were checked too


def _drop_cleanup_crd(values):
    values["crds"] = {"groups": {"kyverno": {"cleanuppolicies": False}}}


CHART_BREAKAGES = [
    (
        "a misspelt key in a chart without a values schema",
        values_of("kueue")(lambda v: v["controllerManager"].update(replicass=2)),
        "helm-values: HelmRelease/kueue-system/kueue: kueue-0.19.2.tgz: values.controllerManager.replicass: not a key of the chart's values.yaml",
    ),
    (
        "a wrong-typed value helm accepts",
        values_of("kueue")(lambda v: v["controllerManager"].update(replicas="two")),
        "schema: Deployment/kueue-system/kueue-controller-manager: spec.replicas: expected integer, got string",
    ),
    (
        "a value the chart's template refuses",
        values_of("kyverno")(_drop_cleanup_crd),
        "chart-render: HelmRelease/kyverno/kyverno: kyverno-3.9.0.tgz does not template: execution error at (kyverno/templates/validate.yaml:2:4): "
        "CRD cleanuppolicies disabled while cleanupController enabled",
    ),
]


@pytest.mark.parametrize("change, expected", [row[1:] for row in CHART_BREAKAGES], ids=[row[0] for row in CHART_BREAKAGES])
def test_chart_breakage_fails_check(dev, oracles, chart_env, change, expected):
    findings = [str(f) for f in check(variant(dev, change), oracles, chart_env).findings]
    assert expected in findings, findings


def _reopen_vcluster_policy(values):
    values["policies"]["networkPolicy"] = {"enabled": True}


def _uncap_hami_percentage(r: Rendered) -> None:
    for m in r.manifests:
        if m.kind == "ResourceQuota":
            m.obj["spec"]["hard"].pop("requests.nvidia.com/gpumem-percentage", None)


def _unprivilege_hami_namespace(r: Rendered) -> None:
    find(r, "Namespace", "hami-system")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "baseline"


UNION_HOLES = [
    (
        "the vCluster chart's network policy",
        values_of("vcluster-assistant")(_reopen_vcluster_policy),
        [
            # any pod of any namespace labelled app=loft reaches the control plane, and back
            "network-allow-rules: NetworkPolicy/tenant-assistant/vc-cp-vcluster-assistant: allows ingress of tenant assistant from every namespace "
            "(empty namespaceSelector) [tenants: assistant]",
            "network-allow-rules: NetworkPolicy/tenant-assistant/vc-cp-vcluster-assistant: allows egress of tenant assistant to every namespace "
            "(empty namespaceSelector) [tenants: assistant]",
            # the control plane reaches every pod on 443/6443, not only the host API server
            "network-allow-rules: NetworkPolicy/tenant-assistant/vc-cp-vcluster-assistant: allows egress of tenant assistant to every pod of every "
            "namespace and every address on 443,8443,6443 (rule without 'to') [tenants: assistant]",
            # every pod reaches the vCluster API server directly
            "network-allow-rules: NetworkPolicy/tenant-assistant/vc-cp-vcluster-assistant: allows ingress of tenant assistant from every pod of every "
            "namespace and every address on 8443 (rule without 'from') [tenants: assistant]",
        ],
    ),
    (
        "a HAMi resource name no tenant quota caps (only the chart's device config names it)",
        _uncap_hami_percentage,
        ["quota: ResourceQuota/tenant-search/tenant-quota: tenant search's quota does not cap requests.nvidia.com/gpumem-percentage [tenants: search]"],
    ),
    (
        "a chart's ClusterRoleBinding to a tenant's service account",
        values_of("vcluster-assistant")(lambda v: v.setdefault("rbac", {}).update(clusterRole={"enabled": True})),
        [
            "rbac-subjects: ClusterRoleBinding/vc-vcluster-assistant-v-tenant-assistant: binds ServiceAccount tenant-assistant/vc-vcluster-assistant "
            "of tenant assistant cluster-wide [tenants: assistant]"
        ],
    ),
    (
        "a chart's privileged pod in a tenant's namespace",
        values_of("vcluster-assistant")(
            lambda v: v["controlPlane"]["statefulSet"]["security"]["containerSecurityContext"].update(privileged=True, allowPrivilegeEscalation=True)
        ),
        ["tenant-pods: StatefulSet/tenant-assistant/vcluster-assistant: container syncer is privileged [tenants: assistant]"],
    ),
    (
        "a chart's privileged DaemonSet outside the platform's privileged namespaces",
        _unprivilege_hami_namespace,
        ["privileged-workloads: DaemonSet/hami-system/hami-device-plugin: container device-plugin is privileged outside the platform's privileged namespaces ("],
    ),
]


@pytest.mark.parametrize("change, expected", [row[1:] for row in UNION_HOLES], ids=[row[0] for row in UNION_HOLES])
def test_hole_in_the_union_of_library_and_chart_objects_is_a_finding(dev, oracles, chart_env, change, expected):
    findings = [str(f) for f in check(variant(dev, change), oracles, chart_env).findings]
    missing = [line for line in expected if not any(f.startswith(line) for f in findings)]
    assert not missing, findings


def test_a_recheck_of_an_unchanged_environment_renders_no_chart(dev, oracles, chart_env, dev_report, monkeypatch):
    def refuse(*args):
        raise AssertionError("helm template ran again")

    monkeypatch.setattr(charts, "_template", refuse)
    again = check(dev, oracles, chart_env)
    assert (again.charts_rendered, again.findings) == (dev_report.charts_rendered, dev_report.findings)


def test_release_whose_chart_is_not_cached_is_named_as_not_rendered(dev, oracles, chart_env, tmp_path):
    for chart in chart_env.charts_dir.glob("*.tgz"):
        if not chart.name.startswith("kueue-"):
            (tmp_path / chart.name).symlink_to(chart)
    report = check_environment(dev, oracles.root, tmp_path, chart_env.helm, chart_env.store)
    assert report.not_run == [
        f"chart rendering of HelmRelease/kueue-system/kueue: not rendered, kueue-0.19.2.tgz is not in {tmp_path} "
        f"(run `ai-factory charts pull --charts {tmp_path}`)"
    ]


def test_without_oracles_and_charts_the_other_checks_run_and_name_what_did_not(dev):
    report = check_environment(dev, None, None, None)
    assert report.findings == []
    assert [line.split(":")[0].split(" (")[0] for line in report.not_run] == [
        "chart rendering",
        "custom resources of kinds no chart ships a CRD for",
        "Helm values of HelmRelease/external-secrets/external-secrets, HelmRelease/falco/falco, HelmRelease/gpu-operator/gpu-operator, "
        "HelmRelease/hami-system/hami, HelmRelease/keycloak/keycloak, HelmRelease/kube-system/cilium, HelmRelease/kueue-system/kueue, "
        "HelmRelease/kyverno/kyverno, HelmRelease/monitoring/kube-prometheus-stack, HelmRelease/monitoring/opencost, "
        "HelmRelease/node-problem-detector/node-problem-detector, HelmRelease/openbao/openbao, HelmRelease/tenant-assistant/vcluster-assistant, "
        "HelmRelease/tenant-partner-acme/vcluster-partner-acme, HelmRelease/trivy-system/trivy-operator",
    ]


@pytest.mark.parametrize("require, status", [(None, 3), ("1", 1)], ids=["clean but incomplete", "CI refuses an incomplete check"])
def test_check_exit_status_when_a_check_family_cannot_run(tmp_path, monkeypatch, capsys, require, status):
    monkeypatch.setenv("FACTORY_HELM", str(tmp_path / "no-helm"))
    monkeypatch.delenv("FACTORY_REQUIRE_UPSTREAM", raising=False)
    if require:
        monkeypatch.setenv("FACTORY_REQUIRE_UPSTREAM", require)
    monkeypatch.chdir(REPO)
    assert main(["check", "dev"]) == status
    assert "check: not run: chart rendering: no helm binary" in capsys.readouterr().err


def test_dra_chart_device_classes_are_capped_in_every_quota_and_uncapped_ones_are_found(dev_raw, oracles, chart_env):
    """The DRA chart installs gpu.nvidia.com, mig.nvidia.com and vfio.gpu.nvidia.com itself: a claim
    through them would escape the per-model quota lines, so each tenant quota caps them at 0."""
    raw, secrets = dev_raw
    device = render(device_config(raw), secrets, stack=DEVICE_STACK)
    assert check(device, oracles, chart_env).findings == []

    def uncap(r: Rendered) -> None:
        for m in r.manifests:
            if m.kind == "ResourceQuota":
                m.obj["spec"]["hard"].pop(f"gpu.nvidia.com{DRA_QUOTA_SUFFIX}", None)

    findings = [str(f) for f in check(variant(device, uncap), oracles, chart_env).findings]
    assert f"quota: ResourceQuota/tenant-search/tenant-quota: tenant search's quota does not cap gpu.nvidia.com{DRA_QUOTA_SUFFIX} [tenants: search]" in findings


def test_pull_fetches_each_missing_pin_at_its_version_from_its_repository(tmp_path):
    """`ai-factory charts pull` as a user with network access runs it (helm itself is faked here)."""
    calls, helm, cache = tmp_path / "calls", tmp_path / "helm", tmp_path / "cache"
    helm.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'name=$(basename "$2")\n'
        'while [ "$#" -gt 0 ]; do case "$1" in --version) v=$2;; --destination) d=$2;; esac; shift; done\n'
        'touch "$d/$name-$v.tgz"\n'
    )
    helm.chmod(0o755)
    cache.mkdir()
    (cache / "hami-2.10.0.tgz").touch()
    lines = charts.pull([CHARTS["kueue"], CHARTS["vcluster"], CHARTS["hami"]], cache, str(helm))
    assert lines == [f"hami-2.10.0.tgz: already in {cache}", "kueue-0.19.2.tgz: pulled", "vcluster-0.36.1.tgz: pulled"]
    assert calls.read_text().splitlines() == [
        f"pull oci://registry.k8s.io/kueue/charts/kueue --version 0.19.2 --destination {cache}",
        f"pull vcluster --repo https://charts.loft.sh --version 0.36.1 --destination {cache}",
    ]


def test_a_crd_the_chart_ships_is_preferred_to_the_oracles_copy(dev, oracles):
    from ai_factory.factory.checking.oracles import Oracles

    queue = next(m.obj for m in dev.manifests if m.kind == "ClusterQueue")
    assert oracles.validate_custom_object(queue) == []
    schema = copy.deepcopy(oracles.crd_schema(queue["apiVersion"], "ClusterQueue"))
    schema["properties"]["spec"]["required"] = ["notAField"]
    group, version = queue["apiVersion"].split("/")
    crd = {
        "kind": "CustomResourceDefinition",
        "spec": {"group": group, "names": {"kind": "ClusterQueue"}, "versions": [{"name": version, "served": True, "schema": {"openAPIV3Schema": schema}}]},
    }
    shipped = Oracles(oracles.root)
    shipped.add_crds("kueue-test.tgz", [crd])
    assert shipped.validate_custom_object(queue) == [f"ClusterQueue/{queue['metadata']['name']}: spec.notAField: required field missing"]



def test_charts_render_with_the_apis_the_bundles_crds_serve(dev, chart_env):
    """HAMi's device-plugin ServiceMonitor exists only where the cluster serves
    monitoring.coreos.com/v1/ServiceMonitor: the dev bundle installs that CRD (the metrics layer)."""
    releases = charts.releases_of(dev)[0]
    template = lambda rs, api_versions=(): charts.template_all(rs, chart_env.charts_dir, chart_env.helm, dev.kubernetes_version, chart_env.store, api_versions=api_versions)
    served = charts.served_api_versions(template(releases))
    assert "monitoring.coreos.com/v1/ServiceMonitor" in served
    hami = next(r for r in releases if r.pin.name == "hami")
    spec = {**hami.manifest.obj["spec"], "values": {**hami.values, "prometheus": {"enabled": True}}}
    scraped = charts.Release(dataclasses.replace(hami.manifest, obj={**hami.manifest.obj, "spec": spec}), hami.pin)

    def monitors(api_versions):
        return [d for out in template([scraped], api_versions) for d in out.documents if d.get("kind") == "ServiceMonitor"]

    assert not monitors(())
    assert monitors(served)
