"""Tenant-deletion safety: removing a tenant changes exactly its objects (`factory diff`)."""

from __future__ import annotations

import json
import copy
import dataclasses

import pytest
import yaml

from ai_factory.components.kyverno import granted_gpu_resources_rule, placement_tolerations_rule
from ai_factory.factory.cli import main
from ai_factory.factory.rendering.diff import TenantRemoval, difference, tenant_removal, without_tenant
from ai_factory.factory.rendering.bundle import Manifest, Rendered
from ai_factory.factory.model.tenancy import SERVES_TENANT_LABEL, TENANT_LABEL, TRUST_DOMAIN_LABEL
from ai_factory.factory.planning.from_config import previous_plan
from ai_factory.factory.planning.model import Plan
from tests.conftest import REPO
from tests.fleet_env import one_cluster_text

SEARCH_EVAL = """\
    # A second tenant of the `internal` trust domain.
    - name: search-eval
      trust: high
      trust_domain: internal
      owners: {groups: [search-eval-admins]}
      gpus:
        - {pool: a100-mig, mig: {1g.10gb: 1}}
"""

DEV_TEXT = one_cluster_text((REPO / "Pulumi.dev.yaml").read_text())
"""dev as one cluster: these tests answer the removal from one stack; per cluster, `test_fleet_diff`."""


@pytest.fixture
def shared_domain_stack(tmp_path):
    """dev plus a tenant that shares its trust domain with `search`, as a stack file."""
    path = tmp_path / "Pulumi.shared.yaml"
    path.write_text(DEV_TEXT + SEARCH_EVAL)
    return path


def test_removing_a_tenant_changes_only_its_objects(shared_domain_stack, capsys):
    assert main(["diff", str(shared_domain_stack), "--without-tenant", "search-eval"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[1] for line in out.splitlines() if line.startswith("  - manifests/")]
    assert listed and all(path.startswith(("manifests/tenants/tenant-search-eval/", "manifests/patches/tenant-search-eval/")) for path in listed)
    assert "manifests/tenants/tenant-search-eval/_cluster/namespace-tenant-search-eval.yaml" in listed
    assert "[protected, kept in the cluster]" in out
    assert "its grant returns to its trust domain internal (1 object(s) of that domain only):" in out
    # Re-planning returns its MIG instance to the pool: search's ceiling (its domain's supply) follows.
    assert "its trust domain's offerings change, and with them 1 object(s) of its peer tenants that follow them:" in out
    assert "manifests/tenants/tenant-search/tenant-search/resourcequota-tenant-quota.yaml (GPU ceiling of tenant search)" in out
    assert out.rstrip().endswith("no other object changes: nothing shared with another trust domain, nothing of another tenant")


def test_removing_a_registered_tenant_changes_only_its_objects(tmp_path, monkeypatch, capsys):
    # search-eval onboarded itself: it lives in the registry, not in the stack file.
    (tmp_path / "Pulumi.yaml").write_text((REPO / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.shared.yaml").write_text(DEV_TEXT)
    [entry] = yaml.safe_load(SEARCH_EVAL)
    (tmp_path / "tenants" / "shared").mkdir(parents=True)
    (tmp_path / "tenants" / "shared" / "search-eval.yaml").write_text(yaml.safe_dump(entry))
    monkeypatch.chdir(tmp_path)
    assert main(["diff", "shared", "--without-tenant", "search-eval"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[1] for line in out.splitlines() if line.startswith("  - manifests/")]
    assert "manifests/tenants/tenant-search-eval/_cluster/namespace-tenant-search-eval.yaml" in listed
    assert all(path.startswith(("manifests/tenants/tenant-search-eval/", "manifests/patches/tenant-search-eval/")) for path in listed)
    assert out.rstrip().endswith("no other object changes: nothing shared with another trust domain, nothing of another tenant")


def folded_dev_lock() -> Plan:
    """dev's cluster locks as one, the lock of dev folded into one cluster (`dev_raw`): each pool
    and fabric key is one cluster's."""
    locks = [previous_plan(f"dev-{c}", REPO) for c in ("par1-a", "par1-b")]
    return dataclasses.replace(locks[0], pools=tuple(p for lock in locks for p in lock.pools), networks=tuple(n for lock in locks for n in lock.networks))


@pytest.mark.parametrize("tenant", ["search", "partner-acme"])
def test_removing_a_dev_tenant_changes_only_its_objects_its_domains_and_released_capacity(dev_raw, tenant):
    # From the plan lock, as `pulumi up` and `factory diff` plan: planned from scratch, a peer's GPUs
    # may move to other nodes, and its Slurm nodes (pinned to them) with them.
    removal = tenant_removal(copy.deepcopy(dev_raw[0]), dev_raw[1], tenant, "dev", folded_dev_lock())
    assert removal.unexpected == []
    assert removal.removal.removed and all(m.layer == f"tenant-{tenant}" for m in removal.removal.removed if m.tenant)
    assert not any(m.tenant for m in [*removal.release.removed, *removal.release.added, *(b for b, _ in removal.release.changed)])


def _object_lines(lines: list[str]) -> list[str]:
    """A report's lines without the unified diffs indented under them."""
    return [line for line in lines if not line.startswith("    ")]


def manifest(kind: str, name: str, tenant: str | None, **spec) -> Manifest:
    return Manifest({"apiVersion": "v1", "kind": kind, "metadata": {"name": name}, "spec": spec}, f"tenant-{tenant}" if tenant else "fleet", tenant, "test")


def rendered(*manifests: Manifest) -> Rendered:
    return Rendered(None, "1.34", list(manifests), [])


def test_a_shared_or_other_tenants_object_touched_by_a_removal_is_reported():
    before = rendered(manifest("Namespace", "tenant-a", "a"), manifest("Cohort", "domain", None), manifest("ConfigMap", "b", "b", x=1))
    after = rendered(manifest("ConfigMap", "b", "b", x=2))
    removal = TenantRemoval("a", "a", difference(before, after), difference(after, after))
    assert removal.unexpected[:2] == [
        "removal deletes manifests/fleet/_cluster/cohort-domain.yaml (platform)",
        "removal changes manifests/tenant-b/_cluster/configmap-b.yaml (tenant b)",
    ]
    assert "UNEXPECTED: 2 other change(s):" in removal.render("env")


def _serving(name: str, tenant: str) -> Manifest:
    m = manifest("Service", name, None)
    m.obj["metadata"]["labels"] = {SERVES_TENANT_LABEL: tenant}
    return m


def test_a_platform_object_serving_only_the_removed_tenant_goes_with_it_and_one_serving_another_is_reported():
    before = rendered(manifest("Namespace", "tenant-a", "a"), _serving("proxy-a", "a"), _serving("proxy-b", "b"))
    removal = TenantRemoval("a", "a", difference(before, rendered()), difference(rendered(), rendered()))
    assert removal.unexpected == ["removal deletes manifests/fleet/_cluster/service-proxy-b.yaml (platform)"]
    assert "platform objects serving it only go too (1):\n  - deleted manifests/fleet/_cluster/service-proxy-a.yaml" in removal.render("env")


def _listener(tenant: str, hostname: str | None = None) -> dict:
    selector = {"matchLabels": {TENANT_LABEL: tenant, "kubernetes.io/metadata.name": f"tenant-{tenant}"}}
    return {"name": f"{tenant}-0", "hostname": hostname or f"{tenant}.inference.example.com", "allowedRoutes": {"namespaces": {"from": "Selector", "selector": selector}}}


GATEWAY_REMOVALS = [
    ("accepts the Gateway losing the removed tenant's listener", [_listener("b")], []),
    ("flags the Gateway changing another tenant's listener", [_listener("b", "b.other.example.com")], ["removal changes manifests/fleet/_cluster/gateway-inference-0.yaml (platform)"]),
    ("flags the Gateway dropping another tenant's listener", [_listener("a")], ["removal changes manifests/fleet/_cluster/gateway-inference-0.yaml (platform)"]),
]


@pytest.mark.parametrize("after_listeners, expected", [r[1:] for r in GATEWAY_REMOVALS], ids=[r[0] for r in GATEWAY_REMOVALS])
def test_a_shared_gateway_may_lose_only_the_removed_tenants_listeners(after_listeners, expected):
    before = rendered(manifest("Namespace", "tenant-a", "a"), manifest("Gateway", "inference-0", None, listeners=[_listener("a"), _listener("b")]))
    after = rendered(manifest("Gateway", "inference-0", None, listeners=after_listeners))
    removal = TenantRemoval("a", "a", difference(before, after), difference(after, after))
    assert _object_lines(removal.unexpected) == expected


def test_a_tenant_object_that_survives_its_removal_is_reported():
    mine = manifest("ConfigMap", "mine", "a")
    removal = TenantRemoval("a", "a", difference(rendered(mine), rendered(mine)), difference(rendered(mine), rendered(mine)))
    assert removal.unexpected == ["removal keeps manifests/tenant-a/_cluster/configmap-mine.yaml (tenant a)"]


def test_another_tenants_object_changed_by_re_planning_is_reported():
    without = rendered(manifest("ResourceQuota", "q", "b", hard=1), manifest("Node", "n", None, taint="a"))
    replanned = rendered(manifest("ResourceQuota", "q", "b", hard=2), manifest("Node", "n", None, taint="none"))
    removal = TenantRemoval("a", "a", difference(without, without), difference(without, replanned))
    assert removal.unexpected[0] == "re-planning changes manifests/tenant-b/_cluster/resourcequota-q.yaml (tenant b)"
    assert not any("node-n" in line for line in removal.unexpected)  # the platform's node releasing capacity is expected
    assert "  ~ changed manifests/fleet/_cluster/node-n.yaml" in removal.render("env")


def test_removing_an_unknown_tenant_is_a_config_error(capsys):
    assert main(["diff", "dev", "--without-tenant", "serch"]) == 2
    assert "--without-tenant: no tenant 'serch' in Pulumi.dev.yaml (did you mean 'search'?)" in capsys.readouterr().err


def test_only_the_gpu_lines_of_a_domain_peers_quota_may_follow_a_release():
    def quota(tenant: str, domain: str, **hard) -> Manifest:
        obj = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "labels": {TRUST_DOMAIN_LABEL: domain}}, "spec": {"hard": hard}}
        return Manifest(obj, f"tenant-{tenant}", tenant, "test")

    gpu = "requests.nvidia.com/gpu"
    before = rendered(quota("b", "d", **{gpu: "8", "requests.cpu": "4"}), quota("c", "d", **{gpu: "8", "requests.cpu": "4"}),
                      quota("e", "other", **{gpu: "8"}))
    after = rendered(quota("b", "d", **{gpu: "6", "requests.cpu": "4"}), quota("c", "d", **{gpu: "6", "requests.cpu": "2"}),
                     quota("e", "other", **{gpu: "6"}))
    removal = TenantRemoval("a", "d", difference(before, before), difference(before, after))
    assert _object_lines(removal.peers_following_domain) == ["  ~ changed manifests/tenant-b/_cluster/resourcequota-q.yaml (GPU ceiling of tenant b)"]
    changed = [line for line in removal.unexpected if line.startswith("re-planning changes")]
    assert changed == [
        "re-planning changes manifests/tenant-c/_cluster/resourcequota-q.yaml (tenant c)",
        "re-planning changes manifests/tenant-e/_cluster/resourcequota-q.yaml (tenant e)",
    ]


def test_the_committed_dev_plans_are_recognised_as_current():
    # plans/dev-<cluster>.json were recorded from scratch; re-planning from them reaches the same
    # layout, which is all that matters (not how many GPUs the re-plan changed).
    removal = without_tenant("dev", "partner-acme")
    assert list(removal.removals) == ["par1-a"] and removal.unchanged == ["par1-b"]
    notes = removal.removals["par1-a"].notes
    assert not any("plan" in note for note in notes), notes


ONE_POOL_USER = """\
  ai-factory:tenants:
    # Two tenants of one trust domain; alpha alone uses h100-train.
    - name: alpha
      trust: high
      trust_domain: internal
      owners: {groups: [alpha-admins]}
      gpus:
        - {pool: h100-train, count: 4}
    - name: beta
      trust: high
      trust_domain: internal
      owners: {groups: [beta-admins]}
      gpus:
        - {pool: a100-mig, mig: {1g.10gb: 2}}
"""


def test_removing_a_domains_only_user_of_a_pool_changes_only_what_follows_its_offerings(tmp_path, capsys):
    dev = DEV_TEXT
    path = tmp_path / "Pulumi.peers.yaml"
    document = yaml.safe_load(dev[: dev.index("  ai-factory:tenants:\n")] + ONE_POOL_USER)
    layers = document["config"]["ai-factory:layers"]
    del layers["slinky"]["clusters"], layers["tenancy"]["pod_security_exceptions"], layers["kubevirt"]["tenants"]  # they name dev's tenants
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    assert main(["diff", str(path), "--without-tenant", "alpha"]) == 0
    out = capsys.readouterr().out
    # The domain no longer offers h100-train: beta's queue drops that flavor, its policy denies the resource.
    assert "  - deleted manifests/resources/kueue/_cluster/resourceflavor-h100-train-internal.yaml" in out
    assert "its trust domain's offerings change, and with them 3 object(s) of its peer tenants that follow them:" in out
    assert "manifests/tenants/tenant-beta/_cluster/clusterqueue-tenant-beta.yaml (GPU queue flavors of tenant beta)" in out
    assert "manifests/tenants/tenant-beta/_cluster/clusterpolicy-tenant-beta-admission.yaml (admitted GPU resources and tolerations of tenant beta)" in out
    assert "manifests/tenants/tenant-beta/tenant-beta/resourcequota-tenant-quota.yaml (GPU ceiling of tenant beta)" in out
    assert "UNEXPECTED" not in out
    # The other way round the domain loses its MIG offering: alpha's pods may no longer tolerate its taint.
    assert main(["diff", str(path), "--without-tenant", "beta"]) == 0
    out = capsys.readouterr().out
    assert "manifests/tenants/tenant-alpha/_cluster/namespace-tenant-alpha.yaml (allowed tolerations of tenant alpha)" in out
    assert "UNEXPECTED" not in out


def cluster_queue(tenant: str, domain: str, *gpu_flavors: str, cohort: str | None = None, selected: str | None = None) -> Manifest:
    groups = [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": "cpu-memory", "resources": [{"name": "cpu", "nominalQuota": "8"}]}]}]
    groups += [{"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": f, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 0}]}]} for f in gpu_flavors]
    spec = {
        "cohortName": cohort or f"trust-domain-{domain}",
        "namespaceSelector": {"matchLabels": {TENANT_LABEL: selected or tenant}},
        "preemption": {"reclaimWithinCohort": "Any"},
        "resourceGroups": groups,
    }
    obj = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": f"tenant-{tenant}", "labels": {TRUST_DOMAIN_LABEL: domain}}, "spec": spec}
    return Manifest(obj, f"tenant-{tenant}", tenant, "test")


def test_only_a_domain_peers_gpu_flavors_may_follow_its_offerings():
    before = rendered(
        cluster_queue("b", "d", "h100-d", "a100-d"),
        cluster_queue("c", "d", "h100-d", "a100-d"),
        cluster_queue("e", "d", "h100-d", "a100-d"),
        cluster_queue("f", "other", "h100-other", "a100-other"),
        cluster_queue("g", "d", "h100-d", "a100-d", "h100-other"),
    )
    after = rendered(
        cluster_queue("b", "d", "a100-d"),  # the domain no longer offers h100: expected
        cluster_queue("c", "d", "a100-d", cohort="elsewhere"),
        cluster_queue("e", "d", "a100-d", selected="someone-else"),
        cluster_queue("f", "other", "a100-other"),  # another domain's queue
        cluster_queue("g", "d", "a100-d"),  # a flavor of another domain is not its domain's to drop
    )
    removal = TenantRemoval("a", "d", difference(before, before), difference(before, after), pools=("h100", "a100"))
    assert _object_lines(removal.peers_following_domain) == ["  ~ changed manifests/tenant-b/_cluster/clusterqueue-tenant-b.yaml (GPU queue flavors of tenant b)"]
    changed = [line for line in removal.unexpected if line.startswith("re-planning changes")]
    assert changed == [f"re-planning changes manifests/tenant-{t}/_cluster/clusterqueue-tenant-{t}.yaml (tenant {t})" for t in "cefg"]


def test_only_the_offered_lists_of_a_domain_peers_admission_policy_may_follow_its_offerings():
    own = {"any": [{"resources": {"kinds": ["Pod"], "namespaces": ["tenant-b"]}}]}

    def policy(tenant: str, domain: str, denied: list[str], pairs: list[str], runtime: str = "nvidia", match: dict | None = None) -> Manifest:
        rules = [{"name": "pod-security", "match": own, "validate": {"podSecurity": {"level": "restricted"}}}]
        rules += [granted_gpu_resources_rule(tenant, match or own, denied)] if denied else []
        rules += [{"name": "runtime-classes", "match": own, "validate": {"pattern": {"spec": {"=(runtimeClassName)": runtime}}}}]
        rules += [placement_tolerations_rule(tenant, own, pairs)]
        obj = {"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": f"tenant-{tenant}-admission", "labels": {TRUST_DOMAIN_LABEL: domain}}, "spec": {"rules": rules}}
        return Manifest(obj, f"tenant-{tenant}", tenant, "test")

    pairs = ["ai-factory.io/trust-domain=d"]
    before = rendered(policy("b", "d", [], pairs), policy("c", "d", ["x/mig"], pairs), policy("e", "other", ["x/mig"], pairs),
                      policy("f", "d", ["x/mig"], pairs), policy("g", "d", [], pairs))
    after = rendered(
        policy("b", "d", ["x/gpu"], []),  # the rule appears, the tolerations shrink: expected
        policy("c", "d", ["x/gpu", "x/mig"], pairs),  # expected
        policy("e", "other", ["x/gpu", "x/mig"], pairs),  # another domain's tenant
        policy("f", "d", ["x/gpu", "x/mig"], pairs, runtime="runc"),  # another rule changes
        policy("g", "d", ["x/gpu"], pairs, match={"any": [{"resources": {"kinds": ["Pod"]}}]}),  # a rule not of its own pods
    )
    removal = TenantRemoval("a", "d", difference(before, before), difference(before, after))
    assert [line.split()[2] for line in _object_lines(removal.peers_following_domain)] == [
        "manifests/tenant-b/_cluster/clusterpolicy-tenant-b-admission.yaml",
        "manifests/tenant-c/_cluster/clusterpolicy-tenant-c-admission.yaml",
    ]
    changed = [line for line in removal.unexpected if line.startswith("re-planning changes")]
    assert changed == [f"re-planning changes manifests/tenant-{t}/_cluster/clusterpolicy-tenant-{t}-admission.yaml (tenant {t})" for t in "efg"]


PARTNER_BETA = """\
    - name: partner-beta
      trust: low
      owners: {groups: [partner-beta]}
      gpus:
        - {pool: h100-train, count: 8}
"""


@pytest.fixture
def two_partners_stack(tmp_path):
    """dev plus a second low-trust tenant: each holds a dedicated H100 node."""
    path = tmp_path / "Pulumi.partners.yaml"
    path.write_text(DEV_TEXT + PARTNER_BETA)
    return path


def test_without_a_plan_lock_the_report_shows_the_re_plan_moving_other_tenants_gpus(two_partners_stack, capsys):
    # From scratch, partner-beta's dedicated node goes to the node partner-acme leaves.
    assert main(["diff", str(two_partners_stack), "--without-tenant", "partner-acme"]) == 1
    out = capsys.readouterr().out
    assert "  re-planning changes manifests/patches/fleet/_cluster/node-gpu-h100-02.yaml (trust domain partner-beta)" in out
    assert "    -    ai-factory.io/dedicated: partner-beta" in out
    assert "has no plan lock (plans/partners.json): `pulumi up` re-plans every tenant from scratch" in out
    assert "`ai-factory plan " + str(two_partners_stack) + " --lock`" in out


def test_with_the_plan_locked_the_same_removal_moves_no_other_tenant(two_partners_stack, capsys):
    assert main(["plan", str(two_partners_stack), "--lock", "--out", str(two_partners_stack.parent / "plan.json")]) == 0
    assert main(["diff", str(two_partners_stack), "--without-tenant", "partner-acme"]) == 0
    out = capsys.readouterr().out
    assert "node-gpu-h100-02" not in out
    assert out.rstrip().endswith("no other object changes: nothing shared with another trust domain, nothing of another tenant")


def test_changed_objects_are_shown_as_unified_diffs(shared_domain_stack, capsys):
    assert main(["diff", str(shared_domain_stack), "--without-tenant", "search-eval"]) == 0
    lines = capsys.readouterr().out.splitlines()
    quota = "manifests/tenants/tenant-search/tenant-search/resourcequota-tenant-quota.yaml"
    at = next(i for i, line in enumerate(lines) if line.startswith(f"  ~ changed {quota}"))
    assert lines[at + 1 : at + 3] == [f"    --- a/{quota}", f"    +++ b/{quota}"]
    changed = [line for line in lines[at + 3 :] if line.startswith(("    -", "    +"))]
    assert any(line.startswith("    -    requests.nvidia.com/mig-1g.10gb") for line in changed), lines[at:]


def test_diff_as_json_lists_every_change_with_its_diff_and_counts_them_by_tenant_and_layer(capsys):
    from ai_factory.factory.cli import main

    assert main(["diff", "dev", "--without-tenant", "search", "--format", "json"]) == 0
    fleet = json.loads(capsys.readouterr().out)
    assert (fleet["tenant"], fleet["unexpected"], sorted(fleet["clusters"]), fleet["unchanged"]) == ("search", [], ["par1-a"], ["par1-b"])
    report = fleet["clusters"]["par1-a"]
    assert (report["tenant"], report["unexpected"]) == ("search", [])
    mine = [c for c in report["changes"] if c["tenant"] == "search"]
    assert mine and all(c["change"] == "deleted" and c["layer"] == "tenant-search" for c in mine)
    changed = [c for c in report["changes"] if c["change"] == "changed"]
    assert changed and all(c["diff"][0].startswith("--- a/") for c in changed)
    group = next(g for g in report["groups"] if g["tenant"] == "search")
    assert (group["layer"], group["deleted"]) == ("tenant-search", len(mine))
    assert sum(g["deleted"] + g["added"] + g["changed"] for g in report["groups"]) == len(report["changes"])
