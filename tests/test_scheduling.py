"""Scheduling as a whole: choosing Kueue, KAI Scheduler and Volcano in config, their rendered
objects against the upstream CRDs, and the cross-layer checks of `factory check`, each failing when
its rule is broken."""

from __future__ import annotations

import copy
from typing import Callable

import pytest

from ai_factory.factory.checking import scheduling as checks_scheduling
from ai_factory.factory.checking.findings import Finding
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
    return raw


@pytest.fixture(scope="module")
def big(dev_raw) -> Rendered:
    return render(bigger_environment(copy.deepcopy(dev_raw[0])))


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
