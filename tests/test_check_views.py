"""The check cache of the tenant-local fleet-wide checks (`checking.views`): each such check finds
over a render what it finds over the tenants' views, and a warm check after a change gives what a
cold one gives."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from pulumi_policy import StackValidationPolicy

from ai_factory.components import registry
from ai_factory.factory.checking import check, parallel, views
from ai_factory.factory.checking import policies as policy_check
from ai_factory.factory.checking.check import run_checks
from ai_factory.factory.checking.findings import Finding, is_tenant_local
from ai_factory.factory.checking.oracles import Oracles, locate_upstream_dir
from ai_factory.factory.model.loading import validate
from ai_factory.factory.rendering.bundle import Manifest, Rendered, render_raw
from ai_factory.factory.rendering.harness import Resource
from tests.tenancy_env import many_tenants

CHANGED, UNCHANGED, REMOVED = "team-01", "team-03", "team-05"


@pytest.fixture(scope="module")
def oracles():
    return Oracles(locate_upstream_dir())


@pytest.fixture(scope="module")
def six(dev_raw):
    """Six generated tenants on dev's platform: the config and its secret sections."""
    return many_tenants(copy.deepcopy(dev_raw[0]), 6), dev_raw[1]


def rendered(raw, secret_sections, render_cache: Path) -> Rendered:
    """A render through the render cache (which records the platform's objects made for some tenants)."""
    return render_raw(raw, secret_sections, validate(raw), stack="dev", cache=render_cache)


def added(r: Rendered, tenant: str | None, obj: dict) -> None:
    """`obj` registered by `tenant`'s stack (by the platform when None), as object and resource."""
    owner = next(x for x in r.graph.resources if x.tenant == tenant and x.type == "kubernetes:core/v1:Namespace") if tenant else None
    api, kind = obj["apiVersion"], obj["kind"]
    group = api if "/" in api else f"core/{api}"
    name = f"{tenant or 'platform'}-{kind.lower()}-{obj['metadata']['name']}"
    resource = Resource(
        f"kubernetes:{group}:{kind}", name, f"urn:pulumi:dev::x::{kind}::{name}", True, False, copy.deepcopy(obj), owner.parent_urn if owner else "", False, False, [], []
    )
    resource.parent = owner.parent if owner else None
    r.graph.resources.append(resource)
    r.manifests.append(Manifest(obj, f"tenant-{tenant}" if tenant else "platform", tenant, resource.key))


def pods(name: str, namespace: str, tenant: str | None) -> dict:
    labels = {"ai-factory.io/tenant": tenant} if tenant else {}
    container = {"name": "c", "image": "docker.io/evil/miner:latest", "securityContext": {"privileged": True}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"template": {"spec": {"hostNetwork": True, "containers": [container], "volumes": [{"name": "h", "hostPath": {"path": "/dev"}}]}}},
    }


def service(name: str, namespace: str, tenant: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": {"ai-factory.io/tenant": tenant}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
    }


def peers(name: str, namespace: str, tenant: str, labels: dict) -> dict:
    """A NetworkPolicy of `tenant` admitting the pods of the namespaces with these labels."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": {"ai-factory.io/tenant": tenant}},
        "spec": {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": labels}}]}]},
    }


def binding(kind: str, name: str, namespace: str | None, tenant: str | None, role: str, *subjects: dict) -> dict:
    """A (Cluster)RoleBinding of `tenant` (the platform's when None) granting `role` to `subjects`."""
    metadata = {"name": name, "labels": {"ai-factory.io/tenant": tenant} if tenant else {}, **({"namespace": namespace} if namespace else {})}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": list(subjects),
    }


def account(namespace: str) -> dict:
    return {"kind": "ServiceAccount", "name": "default", "namespace": namespace}


def external_secret(name: str, namespace: str, tenant: str, key: str) -> dict:
    """An ExternalSecret of `tenant` reading OpenBao's `key` through its namespace's SecretStore."""
    return {
        "apiVersion": "external-secrets.io/v1",
        "kind": "ExternalSecret",
        "metadata": {"name": name, "namespace": namespace, "labels": {"ai-factory.io/tenant": tenant}},
        "spec": {"secretStoreRef": {"kind": "SecretStore", "name": "openbao"}, "data": [{"secretKey": "k", "remoteRef": {"key": key}}]},
    }


def secret_store(name: str, namespace: str, tenant: str, role: str, account_namespace: str) -> dict:
    """A SecretStore of `tenant` logging in to OpenBao as `role` with a service account of `account_namespace`."""
    auth = {"kubernetes": {"mountPath": "kubernetes", "role": role, "serviceAccountRef": {"name": "secrets", "namespace": account_namespace}}}
    return {
        "apiVersion": "external-secrets.io/v1",
        "kind": "SecretStore",
        "metadata": {"name": name, "namespace": namespace, "labels": {"ai-factory.io/tenant": tenant}},
        "spec": {"provider": {"vault": {"server": "https://openbao", "path": "secret", "auth": auth}}},
    }


def broken(r: Rendered) -> Rendered:
    """`r` with violations: in CHANGED's namespace and UNCHANGED's, one tenant's pods in another's
    namespace and its network policy admitting that namespace, unlabelled objects, a queue missing,
    a trust domain's flavors oversubscribed by one of its two tenants, a privileged platform
    agent nobody declared, bindings of another tenant's account, of cluster-admin and of a
    system group (the platform's), and secrets read, logged in for or copied across tenants."""
    r = copy.deepcopy(r)
    for tenant in (CHANGED, UNCHANGED):
        added(r, tenant, pods("miner", f"tenant-{tenant}", tenant))
        added(r, tenant, service("open", f"tenant-{tenant}", tenant))
    added(r, "team-02", pods("stray", "tenant-team-04", "team-02"))
    added(r, "team-04", pods("unlabelled", "tenant-team-04", None))
    added(r, None, pods("agent", "default", None))
    added(r, "team-02", peers("neighbours", "tenant-team-02", "team-02", {"kubernetes.io/metadata.name": "tenant-team-04"}))
    added(r, CHANGED, peers("everyone", f"tenant-{CHANGED}", CHANGED, {}))
    # RBAC: CHANGED binds UNCHANGED's account, UNCHANGED binds cluster-admin, the platform a system group.
    added(r, CHANGED, binding("RoleBinding", "borrowed", f"tenant-{CHANGED}", CHANGED, "view", account(f"tenant-{UNCHANGED}")))
    added(r, UNCHANGED, binding("RoleBinding", "root", f"tenant-{UNCHANGED}", UNCHANGED, "cluster-admin", account(f"tenant-{UNCHANGED}")))
    added(r, None, binding("ClusterRoleBinding", "masters", None, None, "view", {"kind": "Group", "name": "system:masters", "apiGroup": "rbac.authorization.k8s.io"}))
    # Secrets: CHANGED reads UNCHANGED's, UNCHANGED logs in as CHANGED, team-02 reads its own in
    # team-04's namespace, the platform copies a secret into both and serves a cluster-wide store.
    added(r, CHANGED, external_secret("borrowed", f"tenant-{CHANGED}", CHANGED, f"tenants/{UNCHANGED}/db"))
    added(r, UNCHANGED, secret_store("impostor", f"tenant-{UNCHANGED}", UNCHANGED, f"tenant-{CHANGED}", f"tenant-{CHANGED}"))
    added(r, "team-02", external_secret("stray", "tenant-team-04", "team-02", "tenants/team-02/db"))
    copier = {"namespaces": [f"tenant-{CHANGED}", f"tenant-{UNCHANGED}"], "externalSecretSpec": {}}
    added(r, None, {"apiVersion": "external-secrets.io/v1", "kind": "ClusterExternalSecret", "metadata": {"name": "everywhere"}, "spec": copier})
    added(r, None, {"apiVersion": "external-secrets.io/v1", "kind": "ClusterSecretStore", "metadata": {"name": "shared"}, "spec": {}})
    for m in r.manifests:
        if m.tenant == "team-02" and m.kind == "ClusterQueue":  # its trust domain's flavors oversubscribed, team-05's queue with it
            for spec in (m.obj["spec"], next(x for x in r.graph.resources if x.key == m.origin).inputs["spec"]):
                for group in spec["resourceGroups"]:
                    for flavor in group["flavors"]:
                        for resource in flavor["resources"]:
                            resource["nominalQuota"] = 1000
        if m.tenant == UNCHANGED and m.kind in ("ResourceQuota", "Namespace"):
            # The quota unlabelled, the namespace without its Pod Security levels.
            for labels in (m.obj["metadata"]["labels"], next(x for x in r.graph.resources if x.key == m.origin).inputs["metadata"]["labels"]):
                for key in [k for k in labels if m.kind == "ResourceQuota" or k.startswith("pod-security.kubernetes.io/")]:
                    del labels[key]
    queue = next(m for m in r.manifests if m.tenant == UNCHANGED and m.kind == "LocalQueue")
    r.manifests.remove(queue)
    r.graph.resources = [x for x in r.graph.resources if x.key != queue.origin]
    return r


def local_units(r: Rendered, oracles) -> dict[str, Callable[[Rendered], Iterable[Finding]]]:
    """Every tenant-local check, and each tenant-local stack policy of the pack on its own."""
    units = {c.__name__: (lambda c: lambda x: check._guarded(c)(x, oracles))(c) for c in check.checks(r) if is_tenant_local(c)}
    for p in policy_check.POLICIES:
        if isinstance(p, StackValidationPolicy) and is_tenant_local(p):
            units[p.name] = (lambda p: lambda x: policy_check.policies(x, oracles, (StackValidationPolicy,), lambda q: q is p))(p)
    return units


@pytest.fixture(scope="module")
def before(six, tmp_path_factory):
    """The six tenants rendered through a render cache, broken; and that cache."""
    cache = tmp_path_factory.mktemp("render")
    return broken(rendered(*six, cache)), cache


@pytest.fixture(scope="module")
def units(before, oracles):
    return local_units(before[0], oracles)


def test_the_injected_violations_are_found_by_tenant_local_checks(before, units):
    found = {f.check for run in units.values() for f in run(before[0])}
    assert {
        "tenant-pods",
        "pod-security",
        "privileged-workloads",
        "network-allow-rules",
        "tenant-labels",
        "tenant-services-internal",
        "tenant-pod-security-context",
        "tenant-objects-labelled",
        "gpu-namespaces-queued",
        "rbac-subjects",
        "tenant-secret-stores-scoped",
    } <= found


LOCAL = [
    *(c.__name__ for c in check.CHECKS if is_tenant_local(c)),
    *(f"{layer.name}:{c.__name__}" for layer in registry.layers() for c in layer.checks if is_tenant_local(c)),
    *(p.name for p in policy_check.POLICIES if isinstance(p, StackValidationPolicy) and is_tenant_local(p)),
]


@pytest.mark.parametrize("name", LOCAL)
def test_a_tenant_local_check_finds_over_the_views_what_it_finds_over_the_whole(before, units, name):
    r, run = before[0], units[name.rpartition(":")[2]]
    tenants = views.tenants_of(r)
    whole, owned = set(run(r)), views.owners(r)
    ours = {f for f in whole if not views.attributed(f, owned, tenants)}
    for tenant in [*sorted(tenants), None]:
        seen = views.view(r, {tenant} if tenant else set())
        found, seen_owned = set(run(seen)), views.owners(seen)
        assert {f for f in found if not views.attributed(f, seen_owned, tenants)} == ours, tenant
        if tenant:
            assert {f for f in found if tenant in views.attributed(f, seen_owned, tenants)} == {f for f in whole if tenant in views.attributed(f, owned, tenants)}, tenant


def changed_render(six, render_cache: Path, removed: bool) -> Rendered:
    """CHANGED's quota changed (and REMOVED offboarded), through the same render cache, broken as before."""
    raw = copy.deepcopy(six[0])
    next(t for t in raw["tenants"] if t["name"] == CHANGED)["quota"] = {"cpu": "33"}
    raw["tenants"] = [t for t in raw["tenants"] if not (removed and t["name"] == REMOVED)]
    return broken(rendered(raw, six[1], render_cache))


def entries(directory: Path) -> set[str]:
    return {p.name for p in (directory / "checks").rglob("*.json")}


@pytest.mark.parametrize(
    "removed, checked",
    [
        pytest.param(False, [frozenset({CHANGED})], id="one-tenant-changed-its-view-only"),
        pytest.param(True, [], id="a-tenant-removed-too-the-whole-as-its-namespace-went"),
    ],
)
def test_a_warm_check_after_a_change_finds_what_a_cold_one_finds(six, before, oracles, tmp_path, monkeypatch, removed, checked):
    r, render_cache = before
    run_checks(r, oracles, cache=tmp_path)
    after = changed_render(six, render_cache, removed)
    ran: list[frozenset[str]] = []
    real = views.view
    monkeypatch.setattr(views, "view", lambda rendered, tenants: ran.append(frozenset(tenants)) or real(rendered, tenants))
    warm = run_checks(after, oracles, cache=tmp_path)
    monkeypatch.undo()
    assert warm == run_checks(after, oracles)
    assert {f.check for f in warm} >= {"tenant-pods", "pod-security"} and any(UNCHANGED in f.tenants for f in warm) and any(CHANGED in f.tenants for f in warm)
    assert ran == checked


def test_an_unchanged_render_is_read_back_without_checking(before, oracles, tmp_path, monkeypatch):
    r = before[0]
    cold = run_checks(r, oracles, cache=tmp_path)
    real = check._run_group

    def fleet_wide_only(unit, oracles):
        assert not any(is_tenant_local(c) for c in unit[0]), "a tenant-local check ran again"
        return real(unit, oracles)

    monkeypatch.setattr(check, "_run_group", fleet_wide_only)
    assert run_checks(r, oracles, cache=tmp_path) == cold


def shared_units(monkeypatch) -> list[list]:
    """The units of each `parallel.Shared` made from now on."""
    shared: list[list] = []
    real_init = parallel.Shared.__init__
    monkeypatch.setattr(parallel.Shared, "__init__", lambda self, parts, work, workers=None: shared.append(list(parts)) or real_init(self, parts, work, workers))
    return shared


def test_a_cold_check_runs_the_tenant_local_checks_over_the_whole_once_as_work_shared_with_the_fleet_wide_checks(before, oracles, tmp_path, monkeypatch):
    """Units of the work the workers share (`parallel.Shared`), not after them alone."""
    r = before[0]
    shared = shared_units(monkeypatch)
    assert run_checks(r, oracles, cache=tmp_path) == run_checks(r, oracles)
    over_whole = [c for group, checked in shared[1] if checked is r for c in group]
    local = [c for c in check.checks(r) if is_tenant_local(c)]
    assert [over_whole.count(c) for c in local] == [1] * len(local) and all(checked is r for _, checked in shared[1])


def test_after_a_one_tenant_change_its_view_is_checked_as_work_shared_with_the_fleet_wide_checks(six, before, oracles, tmp_path, monkeypatch):
    r, render_cache = before
    run_checks(r, oracles, cache=tmp_path)
    after = changed_render(six, render_cache, False)
    shared = shared_units(monkeypatch)
    run_checks(after, oracles, cache=tmp_path)
    over_view = [c for group, checked in shared[1] if checked is not after for c in group]
    local = [c for c in check.checks(after) if is_tenant_local(c)]
    assert [over_view.count(c) for c in local] == [1] * len(local)
    assert not any(is_tenant_local(c) for group, checked in shared[1] if checked is after for c in group)


@pytest.mark.parametrize("warm, changed", [(False, False), (True, False), (True, True)], ids=["cold", "warm", "warm-one-tenant-changed"])
def test_a_check_through_the_cache_reports_each_check_once(six, before, oracles, tmp_path, warm, changed):
    r, done = before[0], []
    if warm:
        run_checks(r, oracles, cache=tmp_path)
    checked = changed_render(six, before[1], False) if changed else r
    run_checks(checked, oracles, on_check=lambda: done.append(1), cache=tmp_path)
    assert len(done) == len(check.checks(checked))


def test_the_packs_fleet_wide_checks_are_one_unit_of_work_taken_first(before):
    """They share the resources built for them: apart, each process taking one would build them again."""
    fleet = [c for c in check.checks(before[0]) if c not in check.PER_PART]
    groups = check.check_groups(fleet)
    assert groups[0] == tuple(c for c in fleet if c in check.PACK) and len(groups[0]) == 2
    assert [c for group in groups[1:] for c in group] == [c for c in fleet if c not in check.PACK]


def test_most_tenants_changed_checks_the_whole_render_again_with_the_platforms_findings_cached(before, units, tmp_path):
    r, run = before[0], units["tenant_pods"]
    views.write_findings(tmp_path, "platform", [])
    keys = {t: f"view-{t}" for t in views.tenants_of(r)}
    local = views.TenantLocal(r, tmp_path, "platform", keys)
    assert local.checked is r and local.findings(run(r)) == set(run(r))


def test_a_change_of_the_platform_or_oracles_checks_every_view_again(before, oracles, tmp_path):
    r = before[0]
    run_checks(r, oracles, cache=tmp_path, oracle_state="one")
    tenants = len(views.tenants_of(r))
    cached = entries(tmp_path)
    run_checks(r, oracles, cache=tmp_path, oracle_state="another")
    assert len(entries(tmp_path) - cached) == len(check.parts(r)) + tenants + 1
    platform = copy.deepcopy(r)
    agent = next(m for m in platform.manifests if m.ref == "Deployment/default/agent")
    agent.obj["spec"]["template"]["spec"]["hostPID"] = True
    next(x for x in platform.graph.resources if x.key == agent.origin).inputs["spec"]["template"]["spec"]["hostPID"] = True
    cached = entries(tmp_path)
    assert run_checks(platform, oracles, cache=tmp_path, oracle_state="another") == run_checks(platform, oracles)
    assert len(entries(tmp_path) - cached) == 1 + tenants + 1  # the platform layer's part, every view, the platform's


@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "cold-cache"])
def test_the_pack_builds_the_renders_resources_once(before, oracles, tmp_path, monkeypatch, cached):
    """Its resource policies (uncached), tenant-local stack policies and the others are three checks, over the whole render each."""
    r, built = before[0], []
    real = policy_check.resources_from_graph
    monkeypatch.setattr(policy_check, "resources_from_graph", lambda graph: built.append(graph) or real(graph))
    run_checks(r, oracles, cache=tmp_path if cached else None)
    assert sum(graph is r.graph for graph in built) == 1


def test_a_view_holds_what_the_platform_made_for_its_tenants_and_not_for_others(before):
    r = before[0]
    tenants = views.tenants_of(r)
    key, served = next((x.key, r.scopes[x.key]) for x in r.graph.resources if x.key in r.scopes and not tenants <= set(r.scopes[x.key]))
    other = min(tenants - set(served))

    def holds(seen: Rendered) -> bool:
        return any(x.key == key for x in seen.graph.resources)

    assert holds(views.view(r, {served[0]})) and not holds(views.view(r, {other}))


def test_what_the_platform_made_for_some_tenants_is_attributed_to_them(before):
    r = before[0]
    owned = views.owners(r)
    made = [(m.ref, frozenset(r.scopes[m.origin])) for m in r.manifests if not m.tenant and m.origin in r.scopes]
    assert made and all(owned[ref] >= served for ref, served in made)
