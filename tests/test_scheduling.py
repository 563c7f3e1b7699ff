"""Scheduling as a whole: choosing Kueue, KAI Scheduler and Volcano in config, their rendered
objects against the upstream CRDs, and the cross-layer checks of `factory check`, each failing when
its rule is broken."""

from __future__ import annotations

import copy
import json
from typing import Callable

import pytest

from ai_factory.factory.checking import scheduling as checks_scheduling
from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.label_index import selects
from ai_factory.factory.model.loading import ConfigError, validate
from ai_factory.factory.rendering.bundle import Manifest, Rendered, dump_yaml
from tests.conftest import objects, one, render
from tests.scheduling_env import bigger_environment

SCHEDULING_GROUPS = ("kueue.x-k8s.io/", "scheduling.run.ai/", "kai.scheduler/", "scheduling.volcano.sh/")


def with_layers(raw: dict, **enabled: bool) -> dict:
    for layer, on in enabled.items():
        raw.setdefault("layers", {}).setdefault(layer, {})["enabled"] = on
    return raw


def without_shared_pools(raw: dict) -> dict:
    """Dev without its HAMi pool, which only Kueue can meter."""
    raw["fleet"]["pools"] = [p for p in raw["fleet"]["pools"] if p["name"] != "l40s-infer"]
    raw["tenants"][1]["gpus"] = [g for g in raw["tenants"][1]["gpus"] if g["pool"] != "l40s-infer"]
    raw["tenants"][1]["models"] = [m for m in raw["tenants"][1].get("models", []) if m["gpus"]["pool"] != "l40s-infer"]
    return raw


@pytest.fixture(scope="module")
def big_kai(dev_raw) -> Rendered:
    return render(with_layers(bigger_environment(copy.deepcopy(dev_raw[0])), kai_scheduler=True))


@pytest.fixture(scope="module")
def big_volcano(dev_raw) -> Rendered:
    return render(with_layers(bigger_environment(copy.deepcopy(dev_raw[0])), volcano=True))


def scheduling_layers(rendered: Rendered) -> set[str]:
    return {m.layer for m in rendered.manifests if m.layer in ("kueue", "kai-scheduler", "volcano")}


def scheduling_objects(rendered: Rendered) -> list[Manifest]:
    return [m for m in rendered.manifests if str(m.obj.get("apiVersion", "")).startswith(SCHEDULING_GROUPS)]


def run(rendered: Rendered) -> list[str]:
    return sorted(str(f) for check in checks_scheduling.CHECKS for f in check(rendered, None))


def broken(rendered: Rendered, kind: str, name: str, change: Callable[[dict], None]) -> Rendered:
    clone = Rendered(rendered.config, rendered.kubernetes_version, copy.deepcopy(rendered.manifests), rendered.inventory)
    matches = [m for m in clone.manifests if m.kind == kind and m.name == name]
    assert len(matches) == 1, f"{kind}/{name}"
    change(matches[0].obj)
    return clone


def dropped(rendered: Rendered, kind: str, name: str) -> Rendered:
    return Rendered(rendered.config, rendered.kubernetes_version, [m for m in rendered.manifests if not (m.kind == kind and m.name == name)], rendered.inventory)


# --------------------------------------------------------------------------- small worlds, table-driven

KUEUE = "kueue.x-k8s.io/v1beta2"
POOL, TD = "ai-factory.io/pool", "ai-factory.io/trust-domain"


def kobj(kind: str, name: str, spec: dict, namespace: str | None = None, labels: dict | None = None, annotations: dict | None = None, api: str = KUEUE) -> dict:
    metadata: dict = {"name": name, "labels": dict(labels or {})}
    if namespace:
        metadata["namespace"] = namespace
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": api, "kind": kind, "metadata": metadata, "spec": spec}


def world(*objs: dict) -> Rendered:
    return Rendered(None, "1.33", [Manifest(o, "test", o["metadata"]["labels"].get("ai-factory.io/tenant"), "test") for o in objs], [])


def check(fn, *objs: dict) -> list[str]:
    return sorted(str(f) for f in fn(world(*objs), None))


def node(name: str, labels: dict, *taints: dict) -> dict:
    return kobj("Node", name, {"taints": list(taints)}, labels=labels, api="v1")


def flavor(name: str, node_labels: dict | None = None, tolerations: list | None = None, supply: dict | str | None = None, domain: str | None = None) -> dict:
    spec = {k: v for k, v in (("nodeLabels", node_labels), ("tolerations", tolerations)) if v is not None}
    annotations = {"ai-factory.io/supply": supply if isinstance(supply, str) else json.dumps(supply)} if supply is not None else None
    return kobj("ResourceFlavor", name, spec, labels={TD: domain} if domain else {}, annotations=annotations)


def cluster_queue(tenant: str, quotas: list[tuple[str, str, object]], domain: str | None = None, selector: dict | None = "own", kind: str = "ClusterQueue") -> dict:
    groups = [{"coveredResources": sorted({r for _, r, _ in quotas}), "flavors": [{"name": f, "resources": [{"name": r, "nominalQuota": q}]} for f, r, q in quotas]}]
    spec: dict = {"resourceGroups": groups}
    if selector == "own":
        spec["namespaceSelector"] = {"matchLabels": {"ai-factory.io/tenant": tenant}}
    elif selector is not None:
        spec["namespaceSelector"] = selector
    labels = {"ai-factory.io/tenant": tenant, TD: domain or tenant} if kind == "ClusterQueue" else {TD: domain or tenant}
    return kobj(kind, f"tenant-{tenant}" if kind == "ClusterQueue" else f"trust-domain-{tenant}", spec, labels=labels)


def tenant_namespace(tenant: str) -> dict:
    return kobj("Namespace", f"tenant-{tenant}", {}, labels={"ai-factory.io/tenant": tenant}, api="v1")


@pytest.mark.parametrize(
    "selector, labels, expected",
    [
        pytest.param(None, {"a": "1"}, False, id="null-selects-nothing"),
        pytest.param({}, {"a": "1"}, True, id="empty-selects-everything"),
        pytest.param({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True, id="labels-match"),
        pytest.param({"matchLabels": {"a": "1"}}, {"a": "2"}, False, id="label-differs"),
        pytest.param({"matchLabels": {"a": "1"}}, {}, False, id="label-missing"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True, id="in"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "3"}, False, id="not-in-the-values"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False, id="in-without-the-key"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "2"}, True, id="notin-other-value"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False, id="notin-listed-value"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"b": "1"}, True, id="notin-without-the-key"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True, id="exists"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"b": "1"}, False, id="exists-missing"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"b": "1"}, True, id="does-not-exist"),
        pytest.param({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": "1"}, False, id="does-not-exist-present"),
        pytest.param({"matchLabels": {"b": "2"}, "matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {"a": "1", "b": "3"}, False, id="labels-and-expressions-both-hold"),
    ],
)
def test_selectors_follow_kubernetes_label_selector_semantics(selector, labels, expected):
    assert selects(selector, labels) is expected


@pytest.mark.parametrize(
    "tolerations, taint_effect, expected",
    [
        pytest.param([], "NoSchedule", ["every node of pool 'p' with its labels has a taint it does not tolerate"], id="untolerated-noschedule"),
        pytest.param([], "NoExecute", ["every node of pool 'p' with its labels has a taint it does not tolerate"], id="untolerated-noexecute"),
        pytest.param([], "PreferNoSchedule", [], id="preference-only"),
        pytest.param([{"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}], "NoSchedule", [], id="equal"),
        pytest.param([{"key": "k", "value": "v"}], "NoExecute", [], id="equal-by-default-any-effect"),
        pytest.param([{"key": "k", "operator": "Equal", "value": "w", "effect": "NoSchedule"}], "NoSchedule", ["every node of pool 'p' with its labels has a taint it does not tolerate"], id="key-matches-value-differs"),
        pytest.param([{"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute"}], "NoSchedule", ["every node of pool 'p' with its labels has a taint it does not tolerate"], id="other-effect"),
        pytest.param([{"key": "k", "operator": "Exists"}], "NoSchedule", [], id="exists-for-the-key"),
        pytest.param([{"key": "j", "operator": "Exists"}], "NoSchedule", ["every node of pool 'p' with its labels has a taint it does not tolerate"], id="exists-for-another-key"),
        pytest.param([{"operator": "Exists"}], "NoExecute", [], id="exists-for-every-key"),
    ],
)
def test_flavor_nodes_flags_a_flavor_whose_nodes_all_repel_it(tolerations, taint_effect, expected):
    nodes = (node("n1", {POOL: "p", "zone": "z"}, {"key": "k", "value": "v", "effect": taint_effect}), node("n2", {POOL: "p", "zone": "y"}))
    objs = (*nodes, flavor("f", {POOL: "p", "zone": "z"}, tolerations or [{"key": "x", "operator": "Exists"}]))
    assert check(checks_scheduling.flavor_nodes, *objs) == [f"flavor-nodes: ResourceFlavor/f: {e}" for e in expected]


@pytest.mark.parametrize(
    "flavor_obj, expected",
    [
        pytest.param(flavor("f", {POOL: "p"}), [], id="pool-with-nodes"),
        pytest.param(flavor("cpu"), [], id="cpu-flavor-places-nothing"),
        pytest.param(flavor("f", {"zone": "z"}), ["its node labels name no pool (ai-factory.io/pool)"], id="no-pool"),
        pytest.param(flavor("f", None, [{"key": "k", "operator": "Exists"}]), ["its node labels name no pool (ai-factory.io/pool)"], id="tolerations-only"),
        pytest.param(flavor("f", {POOL: "q"}), ["pool 'q' has no rendered node"], id="pool-without-nodes"),
        pytest.param(flavor("f", {POOL: "p", "zone": "z", "rack": "r9"}), ["node label(s) rack=r9, zone=z on no node of pool 'p'"], id="labels-on-no-node"),
        pytest.param(flavor("f", {POOL: "p", "rack": "r1"}), [], id="label-on-one-node"),
    ],
)
def test_flavor_nodes_needs_a_pool_whose_nodes_carry_the_labels(flavor_obj, expected):
    objs = (node("n1", {POOL: "p", "rack": "r1"}), node("n2", {POOL: "p", "rack": "r2"}), node("m", {POOL: "q2", "zone": "z"}), flavor_obj)
    assert check(checks_scheduling.flavor_nodes, *objs) == [f"flavor-nodes: {flavor_obj['kind']}/{flavor_obj['metadata']['name']}: {e}" for e in expected]


GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(
    "objs, expected",
    [
        pytest.param([cluster_queue("a", [("f", GPU, 8)])], [], id="at-the-supply"),
        pytest.param([cluster_queue("a", [("f", GPU, 5)]), cluster_queue("b", [("f", GPU, 3)])], [], id="two-queues-at-the-supply"),
        pytest.param([cluster_queue("a", [("f", GPU, 5)]), cluster_queue("b", [("f", GPU, 4)])],
                     ["ResourceFlavor/f: nvidia.com/gpu: quotas add up to 9 (ClusterQueue tenant-a: 5; ClusterQueue tenant-b: 4) but the plan created 8"], id="above"),
        pytest.param([cluster_queue("a", [("f", GPU, 8)]), cluster_queue("a", [("f", GPU, 1)], kind="Cohort")],
                     ["ResourceFlavor/f: nvidia.com/gpu: quotas add up to 9 (ClusterQueue tenant-a: 8; Cohort trust-domain-a: 1) but the plan created 8"], id="cohort-counts"),
        pytest.param([cluster_queue("a", [("f", GPU, 8), ("f", "nvidia.com/mig-1g.10gb", 0)])], [], id="zero-for-an-unsupplied-resource"),
        pytest.param([cluster_queue("a", [("f", "nvidia.com/mig-1g.10gb", 1)])], ["ResourceFlavor/f: nvidia.com/mig-1g.10gb: quotas add up to 1 (ClusterQueue tenant-a: 1) but the plan created 0"], id="unsupplied-resource"),
        pytest.param([cluster_queue("a", [("f", GPU, "8"), ("cpu-flavor", "cpu", "500m")])], [], id="quantities-as-strings"),
        pytest.param([cluster_queue("a", [("f", GPU, "lots")])], ["ClusterQueue/tenant-a: f/nvidia.com/gpu: unreadable quantity 'lots' [tenants: a]"], id="unreadable-quantity"),
        pytest.param([cluster_queue("a", [("gone", GPU, 1)])], ["ClusterQueue/tenant-a: holds quota on flavor 'gone', which is not rendered [tenants: a]"], id="flavor-not-rendered"),
        pytest.param([flavor("g", {POOL: "p"})], ["ResourceFlavor/g: no readable ai-factory.io/supply annotation: its quotas cannot be checked"], id="no-supply"),
        pytest.param([flavor("g", {POOL: "p"}, supply="{not json")], ["ResourceFlavor/g: no readable ai-factory.io/supply annotation: its quotas cannot be checked"], id="unreadable-supply"),
        pytest.param([flavor("g", {POOL: "p"}, supply="[8]")], ["ResourceFlavor/g: no readable ai-factory.io/supply annotation: its quotas cannot be checked"], id="supply-not-a-map"),
    ],
)
def test_flavor_supply_caps_the_quotas_on_each_gpu_flavor(objs, expected):
    flavors = (flavor("f", {POOL: "p"}, supply={GPU: 8}), flavor("cpu-flavor"))
    assert check(checks_scheduling.flavor_supply, *flavors, *objs) == [f"flavor-supply: {e}" for e in expected]


@pytest.mark.parametrize(
    "flavor_obj, expected",
    [
        pytest.param(flavor("f", {POOL: "p", TD: "a"}, [{"key": TD, "operator": "Equal", "value": "a", "effect": "NoSchedule"}], domain="a"), [], id="own-domain"),
        pytest.param(flavor("f", {POOL: "p", TD: "a"}), ["a GPU flavor without a trust domain (ai-factory.io/trust-domain label)"], id="no-domain"),
        pytest.param(flavor("f", {POOL: "p", TD: "a"}, [{"operator": "Exists"}], domain="a"), ["tolerates every taint, other trust domains' included"], id="every-taint"),
        pytest.param(flavor("f", {POOL: "p", TD: "a"}, [{"key": TD, "operator": "Exists"}], domain="a"), ["trust domain 'a', but tolerates every trust domain's taint"], id="every-domain"),
        pytest.param(flavor("f", {POOL: "p", TD: "a"}, [{"key": TD, "value": "b"}], domain="a"), ["trust domain 'a', but tolerates trust domain 'b'"], id="another-domain"),
        pytest.param(flavor("f", {POOL: "p", TD: "a"}, [{"key": "gpu", "operator": "Exists"}], domain="a"), [], id="another-key"),
        pytest.param(flavor("f", {POOL: "p"}, [{"key": TD, "value": "a"}], domain="a"), ["trust domain 'a', but reaches node nb of trust domain 'b'"], id="reaches-another-domains-node"),
    ],
)
def test_flavor_trust_domains_keep_a_gpu_flavor_to_one_domain(flavor_obj, expected):
    objs = (
        node("na", {POOL: "p", TD: "a"}, {"key": TD, "value": "a", "effect": "NoSchedule"}),
        node("nb", {POOL: "p", TD: "b"}, {"key": TD, "value": "a", "effect": "NoSchedule"}),
        node("nz", {POOL: "p", TD: "b"}, {"key": TD, "value": "b", "effect": "NoExecute"}),
        flavor_obj,
        flavor("cpu"),
        cluster_queue("a", [("f", GPU, 1), ("cpu", "cpu", 1)], domain="a"),
    )
    assert check(checks_scheduling.flavor_trust_domains, *objs) == [f"flavor-trust-domain: ResourceFlavor/f: {e}" for e in expected]


def test_flavor_trust_domains_flag_queues_and_cohorts_of_another_domain():
    objs = (flavor("f", {POOL: "p", TD: "a"}, domain="a"), cluster_queue("a", [("f", GPU, 1)], domain="a"),
            cluster_queue("b", [("f", GPU, 1)], domain="b"), cluster_queue("c", [("f", GPU, 1), ("f", "nvidia.com/gpucores", 1)], domain="c", kind="Cohort"))
    assert check(checks_scheduling.flavor_trust_domains, *objs) == [
        "flavor-trust-domain: ResourceFlavor/f: trust domain 'a', but ClusterQueue/tenant-b of trust domain 'b' holds quota on it [tenants: b]",
        "flavor-trust-domain: ResourceFlavor/f: trust domain 'a', but Cohort/trust-domain-c of trust domain 'c' holds quota on it",
    ]


def in_expression(*values: str) -> dict:
    return {"matchExpressions": [{"key": "ai-factory.io/tenant", "operator": "In", "values": list(values)}]}


@pytest.mark.parametrize(
    "selector, expected",
    [
        pytest.param("own", [], id="pinned-by-label"),
        pytest.param(in_expression("a"), [], id="pinned-by-in-expression"),
        pytest.param({"matchLabels": {"ai-factory.io/tenant": "a"}, "matchExpressions": [{"key": "ai-factory.io/tenant", "operator": "Exists"}]}, [], id="pinned-and-narrowed"),
        pytest.param(None, ["no namespaceSelector: selects no namespace"], id="no-selector"),
        pytest.param({}, ["queue of tenant 'a', but its namespaceSelector does not pin ai-factory.io/tenant: selects every tenant's namespaces (all of them if empty)"], id="empty"),
        pytest.param(in_expression("a", "b"), ["queue of tenant 'a', but its namespaceSelector does not pin ai-factory.io/tenant: selects every tenant's namespaces (all of them if empty)"], id="in-two-tenants"),
        pytest.param({"matchExpressions": [{"key": "ai-factory.io/tenant", "operator": "NotIn", "values": ["b"]}]},
                     ["queue of tenant 'a', but its namespaceSelector does not pin ai-factory.io/tenant: selects every tenant's namespaces (all of them if empty)"], id="not-in"),
        pytest.param({"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]},
                     ["queue of tenant 'a', but its namespaceSelector does not pin ai-factory.io/tenant: selects every tenant's namespaces (all of them if empty)"], id="in-on-another-key"),
        pytest.param(in_expression("b"), ["queue of tenant 'a', but its namespaceSelector pins ai-factory.io/tenant to ['b']"], id="pinned-to-another-tenant"),
        pytest.param({"matchLabels": {"ai-factory.io/tenant": "a", "team": "x"}}, ["selects none of the rendered namespaces"], id="selects-none"),
    ],
)
def test_cluster_queue_namespaces_pin_the_queues_tenant(selector, expected):
    objs = (tenant_namespace("a"), tenant_namespace("b"), cluster_queue("a", [], selector=selector))
    assert check(checks_scheduling.cluster_queue_namespaces, *objs) == [f"cluster-queue-namespaces: ClusterQueue/tenant-a: {e} [tenants: a]" for e in expected]


def local_queue(namespace: str, name: str = "default", target: str = "tenant-a") -> dict:
    return kobj("LocalQueue", name, {"clusterQueue": target}, namespace=namespace, labels={"ai-factory.io/tenant": namespace.removeprefix("tenant-")})


@pytest.mark.parametrize(
    "queues, expected",
    [
        pytest.param([local_queue("tenant-a")], [], id="default-queue"),
        pytest.param([local_queue("tenant-a"), local_queue("tenant-a", "batch")], [], id="default-and-another"),
        pytest.param([], ["Namespace/tenant-a: tenant namespace has no LocalQueue: its workloads are never admitted"], id="no-queue"),
        pytest.param([local_queue("tenant-b", target="tenant-b")], ["Namespace/tenant-a: tenant namespace has no LocalQueue: its workloads are never admitted"], id="queue-elsewhere"),
        pytest.param([local_queue("tenant-a", "batch")], ["Namespace/tenant-a: no LocalQueue named `default`: jobs that name no queue wait forever"], id="no-default-queue"),
        pytest.param([local_queue("tenant-a", target="gone")], ["LocalQueue/tenant-a/default: points to ClusterQueue 'gone', which is not rendered"], id="queue-not-rendered"),
        pytest.param([local_queue("tenant-a", target="tenant-b")], ["LocalQueue/tenant-a/default: points to ClusterQueue/tenant-b, which does not select namespace tenant-a"], id="queue-of-another-tenant"),
    ],
)
def test_tenant_local_queues_bind_every_tenant_namespace_to_its_queue(queues, expected):
    objs = (tenant_namespace("a"), kobj("Namespace", "kube-system", {}, api="v1"), cluster_queue("a", []), cluster_queue("b", []), *queues)
    assert check(checks_scheduling.tenant_local_queues, *objs) == [f"tenant-local-queue: {e} [tenants: a]" for e in expected]


def test_tenant_local_queues_are_not_demanded_without_kueue():
    assert check(checks_scheduling.tenant_local_queues, tenant_namespace("a"), kobj("Queue", "q", {}, api="scheduling.run.ai/v2")) == []


KAI = "scheduling.run.ai/v2"
FULL = {"quota": 4, "overQuotaWeight": 1, "limit": 8}


def kai_queue(name: str, parent: str | None = None, tenant: str | None = None, **resources: dict) -> dict:
    spec: dict = {"resources": {r: dict(resources.get(r, FULL)) for r in ("gpu", "cpu", "memory")}}
    if parent:
        spec["parentQueue"] = parent
    return kobj("Queue", name, spec, labels={"ai-factory.io/tenant": tenant} if tenant else {}, api=KAI)


@pytest.mark.parametrize(
    "queues, expected",
    [
        pytest.param([kai_queue("a", "root", "a")], [], id="complete"),
        *[
            pytest.param([kai_queue("a", "root", "a", **{resource: {k: v for k, v in FULL.items() if k != field}})],
                         [f"Queue/a: {resource}: {field} not set (an unset limit is 0 to KAI) [tenants: a]"], id=f"{resource}-without-{field}")
            for resource in ("gpu", "cpu", "memory")
            for field in ("quota", "overQuotaWeight", "limit")
        ],
        pytest.param([kai_queue("a", "root", "a", gpu={})], ["Queue/a: gpu: quota, overQuotaWeight, limit not set (an unset limit is 0 to KAI) [tenants: a]"], id="gpu-unset"),
        pytest.param([kai_queue("a", "elsewhere", "a")], ["Queue/a: parent queue 'elsewhere' is not rendered [tenants: a]"], id="parent-not-rendered"),
        pytest.param([kai_queue("a", "root", "a"), kai_queue("b", "root", "b")], [], id="children-fill-the-parent"),
        pytest.param([kai_queue("a", "root", "a"), kai_queue("b", "root", "b", gpu={**FULL, "quota": 5})],
                     ["Queue/root: gpu: children's quotas add up to 9, more than its 8 [tenants: a, b]"], id="children-above-the-parent"),
        pytest.param([kai_queue("a", "open", "a", gpu={**FULL, "quota": 100})], [], id="unlimited-parent"),
        pytest.param([kai_queue("a", "root", "a", gpu={**FULL, "quota": 9}), kai_queue("b", "root", "b", gpu={"overQuotaWeight": 1, "limit": 8})],
                     ["Queue/b: gpu: quota not set (an unset limit is 0 to KAI) [tenants: b]", "Queue/root: gpu: children's quotas add up to 9, more than its 8 [tenants: a, b]"],
                     id="a-child-without-quota-counts-nothing"),
        pytest.param([kai_queue("a", "closed", "a", gpu={**FULL, "quota": 1})], ["Queue/closed: gpu: children's quotas add up to 1, more than its 0 [tenants: a]"], id="parent-of-no-gpu"),
    ],
)
def test_kai_queue_shares_are_complete_and_fit_their_parent(queues, expected):
    unlimited = {**FULL, "quota": -1}
    objs = (kai_queue("root", gpu={**FULL, "quota": 8}, cpu=unlimited, memory=unlimited), kai_queue("open", gpu=unlimited, cpu=unlimited, memory=unlimited),
            kai_queue("closed", gpu={**FULL, "quota": 0}, cpu=unlimited, memory=unlimited), *queues, kobj("Queue", "volcano", {}, api="scheduling.volcano.sh/v1beta1"))
    assert check(checks_scheduling.kai_queue_shares, *objs) == [f"kai-queue-shares: {e}" for e in expected]


def test_flavor_nodes_reports_every_flavor_in_turn():
    objs = (
        node("n1", {POOL: "p", "rack": "r1"}, {"key": "k", "value": "v", "effect": "NoSchedule"}),
        flavor("cpu"), flavor("no-pool", {"zone": "z"}), flavor("empty-pool", {POOL: "q"}), flavor("no-label", {POOL: "p", "rack": "r9"}), flavor("repelled", {POOL: "p"}),
    )
    assert check(checks_scheduling.flavor_nodes, *objs) == [
        "flavor-nodes: ResourceFlavor/empty-pool: pool 'q' has no rendered node",
        "flavor-nodes: ResourceFlavor/no-label: node label(s) rack=r9 on no node of pool 'p'",
        "flavor-nodes: ResourceFlavor/no-pool: its node labels name no pool (ai-factory.io/pool)",
        "flavor-nodes: ResourceFlavor/repelled: every node of pool 'p' with its labels has a taint it does not tolerate",
    ]


def test_a_toleration_of_another_effect_does_not_hide_a_matching_one():
    tolerations = [{"key": "k", "value": "v", "effect": "NoExecute"}, {"key": "k", "value": "v", "effect": "NoSchedule"}]
    objs = (node("n1", {POOL: "p"}, {"key": "k", "value": "v", "effect": "NoSchedule"}), flavor("f", {POOL: "p"}, tolerations))
    assert check(checks_scheduling.flavor_nodes, *objs) == []


def test_flavor_trust_domains_reports_every_flavor_in_turn():
    objs = (flavor("cpu"), flavor("no-domain", {POOL: "p"}), flavor("foreign", {POOL: "p"}, [{"key": TD, "value": "b"}], domain="a"))
    assert check(checks_scheduling.flavor_trust_domains, *objs) == [
        "flavor-trust-domain: ResourceFlavor/foreign: trust domain 'a', but tolerates trust domain 'b'",
        "flavor-trust-domain: ResourceFlavor/no-domain: a GPU flavor without a trust domain (ai-factory.io/trust-domain label)",
    ]


def test_tenant_local_queues_reports_every_tenant_namespace_in_turn():
    objs = (
        kobj("Namespace", "kube-system", {}, api="v1"), tenant_namespace("a"), tenant_namespace("b"), tenant_namespace("c"),
        cluster_queue("a", []), local_queue("tenant-b", "batch", "tenant-b"), local_queue("tenant-c", target="gone"),
    )
    assert check(checks_scheduling.tenant_local_queues, *objs) == [
        "tenant-local-queue: LocalQueue/tenant-b/batch: points to ClusterQueue 'tenant-b', which is not rendered [tenants: b]",
        "tenant-local-queue: LocalQueue/tenant-c/default: points to ClusterQueue 'gone', which is not rendered [tenants: c]",
        "tenant-local-queue: Namespace/tenant-a: tenant namespace has no LocalQueue: its workloads are never admitted [tenants: a]",
        "tenant-local-queue: Namespace/tenant-b: no LocalQueue named `default`: jobs that name no queue wait forever [tenants: b]",
    ]


def test_findings_name_the_tenant_whose_stack_rendered_an_unlabelled_object():
    queue = kobj("ClusterQueue", "tenant-a", {"resourceGroups": [{"flavors": [{"name": "gone", "resources": [{"name": GPU, "nominalQuota": 1}]}]}]})
    rendered = Rendered(None, "1.33", [Manifest(queue, "test", "a", "test")], [])
    assert [f.tenants for f in checks_scheduling.flavor_supply(rendered, None)] == [("a",)]


# --------------------------------------------------------------------------- choosing the schedulers


def test_kueue_alone_is_the_default(dev):
    assert scheduling_layers(dev) == {"kueue"}
    assert {m.kind for m in scheduling_objects(dev)} == {"ResourceFlavor", "Cohort", "Topology", "WorkloadPriorityClass", "ClusterQueue", "LocalQueue"}


def test_kai_scheduler_complements_kueue(big_kai):
    assert scheduling_layers(big_kai) == {"kueue", "kai-scheduler"}
    kai_queues = {o["metadata"]["name"]: o for o in objects(big_kai, "Queue") if o["apiVersion"] == "scheduling.run.ai/v2"}
    assert {"organisation-rnd", "trust-domain-research", "tenant-vision", "tenant-docs"} <= set(kai_queues)
    assert kai_queues["tenant-vision"]["spec"]["parentQueue"] == "trust-domain-research"
    assert [m.tenant for m in big_kai.manifests if m.kind == "Queue" and m.name == "tenant-vision"] == ["vision"]


def test_kai_scheduler_replaces_kueue(raw):
    rendered = render(with_layers(without_shared_pools(raw), kueue=False, kai_scheduler=True))
    assert scheduling_layers(rendered) == {"kai-scheduler"}
    assert not [m for m in scheduling_objects(rendered) if m.obj["apiVersion"].startswith("kueue")]
    leaves = {o["metadata"]["name"]: o["spec"] for o in objects(rendered, "Queue") if "parentQueue" in o["spec"]}
    assert set(leaves) == {"tenant-search", "tenant-assistant", "tenant-partner-acme"}
    assert leaves["tenant-search"]["resources"]["gpu"] == {"quota": 16 + 6 + 2 * 3, "overQuotaWeight": 1, "limit": 28}


def test_volcano_complements_kueue_with_a_queue_per_tenant(big_volcano):
    assert scheduling_layers(big_volcano) == {"kueue", "volcano"}
    queues = {o["metadata"]["name"]: o["spec"] for o in objects(big_volcano, "Queue") if o["apiVersion"].startswith("scheduling.volcano.sh")}
    assert {"default", "tenant-vision", "tenant-ext-a", "tenant-docs"} <= set(queues)
    assert queues["tenant-ext-a"]["capability"]["nvidia.com/gpu"] == 8 and queues["tenant-ext-a"]["reclaimable"] is False
    assert set(queues["default"]["capability"].values()) == {0}  # no GPU bypasses the tenants' queues


def test_volcano_replaces_kueue(raw):
    rendered = render(with_layers(without_shared_pools(raw), kueue=False, volcano=True))
    assert scheduling_layers(rendered) == {"volcano"}
    assert one(rendered, "Queue", "tenant-search")["spec"]["capability"]["nvidia.com/mig-3g.40gb"] == 2


def test_kai_chart_values_close_the_default_queue_and_own_the_topology(big_kai):
    values = one(big_kai, "HelmRelease", "kai-scheduler")["spec"]["values"]
    assert values["defaultQueue"]["createDefaultQueue"] is False
    assert values["topologyMigration"]["enabled"] is False
    assert one(big_kai, "OCIRepository", "kai-scheduler")["spec"]["ref"]["tag"] == "v0.17.0"
    topology = next(o for o in objects(big_kai, "Topology") if o["apiVersion"] == "kai.scheduler/v1alpha1" and o["metadata"]["name"] == "block-rack-nvlink-domain-host")
    assert [level["alias"] for level in topology["spec"]["levels"]] == ["block", "rack", "nvlink-domain", "host"]


@pytest.mark.parametrize("variant", ["dev", "big", "big_kai", "big_volcano"])
def test_scheduling_objects_validate_against_the_upstream_crds(variant, request, oracles):
    rendered = request.getfixturevalue(variant)
    checked = scheduling_objects(rendered) + [m for m in rendered.manifests if m.kind == "HelmRelease" and m.layer in ("kueue", "kai-scheduler", "volcano")]
    assert checked
    errors = [e for m in checked for e in oracles.validate_object(m.obj, rendered.kubernetes_version)]
    assert errors == []


@pytest.mark.parametrize("variant", ["big_kai", "big_volcano"])
def test_scheduler_chart_values_exist_in_the_chart(variant, request, oracles):
    from ai_factory.factory.checking.check import helm_values

    rendered = request.getfixturevalue(variant)
    assert [str(f) for f in helm_values(rendered, oracles) if f.ref.startswith("HelmRelease/kai") or "volcano" in f.ref] == []


def test_removing_a_tenant_without_gpus_changes_only_its_queues(big_kai, dev_raw):
    raw = with_layers(bigger_environment(copy.deepcopy(dev_raw[0])), kai_scheduler=True)
    raw["tenants"] = [t for t in raw["tenants"] if t["name"] != "docs"]
    without = render(raw)

    def queue_files(rendered: Rendered) -> dict[str, str]:
        files = {m.path: dump_yaml(m.obj) for m in rendered.manifests if m.layer in ("kueue", "kai-scheduler")}
        assert files
        return files

    assert queue_files(without) == queue_files(big_kai)
    gone = {m.kind for m in scheduling_objects(big_kai) if m.tenant == "docs"}
    assert gone == {"ClusterQueue", "LocalQueue", "Queue"} and not [m for m in without.manifests if m.tenant == "docs"]


# --------------------------------------------------------------------------- configuration


def problems(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as err:
        validate(raw)
    return err.value.problems


def test_kai_and_volcano_cannot_both_place_pods(raw):
    assert any("KAI Scheduler and Volcano cannot both" in p for p in problems(with_layers(raw, kai_scheduler=True, volcano=True)))


def test_gpu_tenants_need_a_scheduling_layer(raw):
    assert any("no scheduling layer is on" in p for p in problems(with_layers(raw, kueue=False)))


def test_hami_and_time_slices_need_kueue(raw, dev_raw):
    assert "fleet.pools[2].sharing: HAMi slices are admitted and metered by Kueue only (KAI Scheduler and Volcano cannot); enable layers.kueue" in problems(
        with_layers(raw, kueue=False, volcano=True)
    )
    big = with_layers(bigger_environment(copy.deepcopy(dev_raw[0])), kueue=False, kai_scheduler=True)
    assert any(p.startswith("fleet.pools[5].sharing: KAI Scheduler does not count time-sliced replicas") for p in problems(big))


def test_a_trust_domain_has_one_organisation(raw):
    raw["tenants"][0]["organisation"] = "rnd"
    raw["tenants"].append({"name": "maps", "trust": "high", "trust_domain": "internal", "organisation": "ops", "owners": {"groups": ["maps"]}})
    assert "tenants: trust domain 'internal' spans organisations (ops, rnd); a trust domain belongs to one organisation" in problems(raw)


# --------------------------------------------------------------------------- cross-layer checks


@pytest.mark.parametrize("variant", ["dev", "big", "big_kai", "big_volcano"])
def test_checks_pass_on_rendered_environments(variant, request):
    assert run(request.getfixturevalue(variant)) == []


def test_a_tenant_namespace_without_local_queue_fails(dev):
    assert run(dropped(dev, "LocalQueue", "default")) == [
        f"tenant-local-queue: Namespace/tenant-{t}: tenant namespace has no LocalQueue: its workloads are never admitted [tenants: {t}]"
        for t in ("assistant", "partner-acme", "search")
    ]


def test_a_local_queue_bound_to_a_missing_queue_fails(dev):
    findings = run(dropped(dev, "ClusterQueue", "tenant-search"))
    assert "tenant-local-queue: LocalQueue/tenant-search/default: points to ClusterQueue 'tenant-search', which is not rendered [tenants: search]" in findings


def test_a_flavor_label_missing_from_its_pools_nodes_fails(dev):
    def relabel(flavor):
        flavor["spec"]["nodeLabels"]["ai-factory.io/trust-domain"] = "nobody"

    assert run(broken(dev, "ResourceFlavor", "a100-mig-internal", relabel)) == [
        "flavor-nodes: ResourceFlavor/a100-mig-internal: node label(s) ai-factory.io/trust-domain=nobody on no node of pool 'a100-mig'"
    ]


def test_a_flavor_whose_nodes_are_all_tainted_against_it_fails(dev):
    findings = run(broken(dev, "ResourceFlavor", "h100-train-partner-acme", lambda f: f["spec"].pop("tolerations")))
    assert findings == ["flavor-nodes: ResourceFlavor/h100-train-partner-acme: every node of pool 'h100-train' with its labels has a taint it does not tolerate"]


def test_quotas_above_the_supply_fail(dev):
    def overcommit(queue):
        queue["spec"]["resourceGroups"][1]["flavors"][0]["resources"][0]["nominalQuota"] = 17

    findings = run(broken(dev, "ClusterQueue", "tenant-search", overcommit))
    assert findings == [
        "flavor-supply: ResourceFlavor/h100-train-internal: nvidia.com/gpu: quotas add up to 17 (ClusterQueue tenant-search: 17) but the plan created 16"
    ]


def test_cohort_quota_counts_against_the_supply(dev):
    def add(cohort):
        cohort["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]["nominalQuota"] = 51

    findings = run(broken(dev, "Cohort", "trust-domain-assistant", add))
    assert len(findings) == 1 and "nvidia.com/gpucores: quotas add up to 201 (ClusterQueue tenant-assistant: 150; Cohort trust-domain-assistant: 51) but the plan created 200" in findings[0]


def test_a_gpu_flavor_without_its_supply_fails(dev):
    findings = run(broken(dev, "ResourceFlavor", "h100-train-internal", lambda f: f["metadata"].pop("annotations")))
    assert findings == ["flavor-supply: ResourceFlavor/h100-train-internal: no readable ai-factory.io/supply annotation: its quotas cannot be checked"]


def test_a_queue_of_another_trust_domain_on_a_flavor_fails(dev):
    def borrow_foreign(queue):
        queue["spec"]["resourceGroups"][2]["flavors"][0]["name"] = "a100-mig-internal"

    findings = run(broken(dev, "ClusterQueue", "tenant-assistant", borrow_foreign))
    assert (
        "flavor-trust-domain: ResourceFlavor/a100-mig-internal: trust domain 'internal', but ClusterQueue/tenant-assistant "
        "of trust domain 'assistant' holds quota on it [tenants: assistant]"
    ) in findings


def test_a_flavor_reaching_another_trust_domains_nodes_fails(dev):
    def widen(flavor):
        del flavor["spec"]["nodeLabels"]["ai-factory.io/trust-domain"]
        flavor["spec"]["tolerations"] = [{"key": "ai-factory.io/trust-domain", "operator": "Exists", "effect": "NoSchedule"}]

    findings = run(broken(dev, "ResourceFlavor", "a100-mig-internal", widen))
    assert findings == [
        "flavor-trust-domain: ResourceFlavor/a100-mig-internal: trust domain 'internal', but reaches node a100-mig-000 of trust domain 'assistant'",
        "flavor-trust-domain: ResourceFlavor/a100-mig-internal: trust domain 'internal', but tolerates every trust domain's taint",
    ]


def test_a_flavor_tolerating_another_domain_or_everything_fails(dev):
    def foreign(flavor):
        flavor["spec"]["tolerations"] = [
            {"key": "ai-factory.io/trust-domain", "operator": "Equal", "value": "assistant", "effect": "NoSchedule"},
            {"operator": "Exists"},
        ]

    findings = [f for f in run(broken(dev, "ResourceFlavor", "a100-mig-internal", foreign)) if f.startswith("flavor-trust-domain")]
    assert any("tolerates trust domain 'assistant'" in f for f in findings)
    assert any("tolerates every taint" in f for f in findings)


@pytest.mark.parametrize(
    "selector, message",
    [
        (None, "no namespaceSelector: selects no namespace"),
        ({}, "does not pin ai-factory.io/tenant: selects every tenant's namespaces (all of them if empty)"),
        ({"matchLabels": {"ai-factory.io/tenant": "assistant"}}, "pins ai-factory.io/tenant to ['assistant']"),
    ],
)
def test_a_cluster_queue_selecting_all_none_or_others_fails(dev, selector, message):
    def change(queue):
        if selector is None:
            del queue["spec"]["namespaceSelector"]
        else:
            queue["spec"]["namespaceSelector"] = selector

    findings = run(broken(dev, "ClusterQueue", "tenant-search", change))
    assert any(f.startswith("cluster-queue-namespaces: ClusterQueue/tenant-search:") and message in f for f in findings), findings


def test_a_cluster_queue_matching_no_namespace_fails(dev):
    def narrow(queue):
        queue["spec"]["namespaceSelector"]["matchLabels"]["team"] = "nobody"

    assert run(broken(dev, "ClusterQueue", "tenant-search", narrow)) == [
        "cluster-queue-namespaces: ClusterQueue/tenant-search: selects none of the rendered namespaces [tenants: search]",
        "tenant-local-queue: LocalQueue/tenant-search/default: points to ClusterQueue/tenant-search, which does not select namespace tenant-search [tenants: search]",
    ]


def test_kai_queue_without_an_explicit_limit_fails(big_kai):
    findings = run(broken(big_kai, "Queue", "tenant-vision", lambda q: q["spec"]["resources"]["gpu"].pop("limit")))
    assert findings == ["kai-queue-shares: Queue/tenant-vision: gpu: limit not set (an unset limit is 0 to KAI) [tenants: vision]"]


def test_kai_children_above_their_parent_fail(big_kai):
    findings = run(broken(big_kai, "Queue", "tenant-vision", lambda q: q["spec"]["resources"]["gpu"].update(quota=10_000)))
    assert len(findings) == 1 and findings[0].startswith("kai-queue-shares: Queue/trust-domain-research: gpu: children's quotas add up to")


def test_findings_name_the_check_object_and_tenants(dev):
    finding = next(f for check in checks_scheduling.CHECKS for f in check(dropped(dev, "LocalQueue", "default"), None))
    assert isinstance(finding, Finding) and finding.check == "tenant-local-queue" and finding.tenants == ("assistant",)
