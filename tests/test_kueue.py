"""The Kueue layer as rendered: the pinned chart and its manager configuration, flavors pinned to
the plan's nodes, cohorts, topology, priority tiers, and each tenant's queues."""

from __future__ import annotations

import copy
import re
from collections import defaultdict

import pytest
import yaml

from ai_factory.components._common import FactoryComponent
from ai_factory.components.kueue import KueueTenantHook
from ai_factory.factory.model.catalog import CHARTS
from ai_factory.factory.rendering.harness import run_program
from ai_factory.factory.model.loading import validate
from ai_factory.factory.planning.placement import offerings
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.rendering.bundle import from_graph
from ai_factory.factory.model.tenancy import TENANT_LABEL, TRUST_DOMAIN_LABEL, tenant_names
from tests.conftest import objects, one
from tests.scheduling_env import bigger_environment


def manager_config(rendered) -> dict:
    values = one(rendered, "HelmRelease", "kueue")["spec"]["values"]
    return yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])


def by_name(rendered, kind) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects(rendered, kind)}


def test_chart_is_the_pinned_release(dev):
    source = one(dev, "OCIRepository", "kueue")["spec"]
    assert source["url"] == CHARTS["kueue"].oci_url == "oci://registry.k8s.io/kueue/charts/kueue"
    assert source["ref"]["tag"] == "0.19.2"
    assert one(dev, "HelmRelease", "kueue")["metadata"]["namespace"] == "kueue-system"


def test_jobs_without_a_queue_name_are_managed_in_tenant_namespaces_only(dev):
    config = manager_config(dev)
    assert config["manageJobsWithoutQueueName"] is True
    assert config["managedJobsNamespaceSelector"] == {"matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]}
    assert all(TENANT_LABEL in ns["metadata"]["labels"] for ns in objects(dev, "Namespace") if ns["metadata"]["name"].startswith("tenant-"))
    assert all(TENANT_LABEL not in ns["metadata"]["labels"] for ns in objects(dev, "Namespace") if not ns["metadata"]["name"].startswith("tenant-"))


def test_integrations_are_known_to_the_pinned_kueue(dev, oracles):
    example = (oracles.root / "kueue/examples/controller_manager_config.yaml").read_text()
    known = set(re.findall(r'^\s*#?\s*-\s*"([^"]+)"', example, re.MULTILINE))
    frameworks = manager_config(dev)["integrations"]["frameworks"]
    assert set(frameworks) <= known
    assert {"batch/job", "jobset.x-k8s.io/jobset", "leaderworkerset.x-k8s.io/leaderworkerset", "pod", "deployment"} <= set(frameworks)


def test_fair_sharing_is_on(dev):
    assert manager_config(dev)["fairSharing"]["preemptionStrategies"] == ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]


def test_dra_claims_count_as_whole_gpus(dev, big):
    assert "resources" not in manager_config(dev)
    mappings = manager_config(big)["resources"]["deviceClassMappings"]
    assert mappings == [{"name": "nvidia.com/gpu", "deviceClassNames": ["h200-141gb-whole"]}]
    assert "h200-141gb-whole" in by_name(big, "DeviceClass")


def test_one_flavor_per_offering_pinned_to_its_nodes(dev, dev_raw):
    cfg = validate(copy.deepcopy(dev_raw[0]))
    flavors = by_name(dev, "ResourceFlavor")
    planned = offerings(plan_for(cfg))
    assert set(flavors) == {o.name for o in planned} | {"cpu-memory"}
    assert flavors["cpu-memory"]["spec"] == {}
    for o in planned:
        spec = flavors[o.name]["spec"]
        assert spec["nodeLabels"] == o.node_labels
        assert spec.get("tolerations", []) == [t.toleration() for t in o.tolerations]
        assert flavors[o.name]["metadata"]["labels"][TRUST_DOMAIN_LABEL] == o.trust_domain


def test_shared_gpu_flavors_belong_to_one_trust_domain(big):
    for name, flavor in by_name(big, "ResourceFlavor").items():
        if name.startswith(("a100-mig", "l40s-hami", "l4-ts")):
            domain = flavor["metadata"]["labels"][TRUST_DOMAIN_LABEL]
            assert flavor["spec"]["nodeLabels"][TRUST_DOMAIN_LABEL] == domain
            assert flavor["spec"]["tolerations"] == [{"key": TRUST_DOMAIN_LABEL, "operator": "Equal", "value": domain, "effect": "NoSchedule"}]


def test_topology_goes_block_rack_nvlink_host_on_whole_gpu_training_flavors(dev, big):
    topologies = {name: [level["nodeLabel"] for level in t["spec"]["levels"]] for name, t in by_name(big, "Topology").items() if t["apiVersion"].startswith("kueue")}
    assert topologies == {
        "block-rack-host": ["ai-factory.io/block", "ai-factory.io/rack", "kubernetes.io/hostname"],
        "block-rack-nvlink-domain-host": ["ai-factory.io/block", "ai-factory.io/rack", "ai-factory.io/nvlink-domain", "kubernetes.io/hostname"],
    }
    attached = {name: f["spec"].get("topologyName") for name, f in by_name(big, "ResourceFlavor").items()}
    assert attached["h100-research"] == attached["h100-ext-a"] == "block-rack-host"
    assert attached["gb200-research"] == "block-rack-nvlink-domain-host"
    # No GPU fabric (ethernet, DRA on its defaults) or shared GPUs: no gang placement to keep.
    assert attached["l40s-eth-product"] is attached["a100-mig-research"] is attached["l40s-hami-research"] is None
    assert {f["spec"].get("topologyName") for f in objects(dev, "ResourceFlavor")} == {None, "block-rack-host"}


def test_priority_tiers_put_inference_above_training_above_evaluation(dev):
    values = {name: c["value"] for name, c in by_name(dev, "WorkloadPriorityClass").items()}
    assert values["production-inference"] > values["training"] > values["evaluation"] > 0
    assert all(isinstance(v, int) for v in values.values())


def test_cluster_queue_selects_its_tenants_namespace_and_protects_its_quota(dev):
    queue = by_name(dev, "ClusterQueue")["tenant-search"]
    spec = queue["spec"]
    assert spec["namespaceSelector"] == {"matchLabels": {TENANT_LABEL: "search"}}
    assert spec["cohortName"] == "trust-domain-internal" and queue["metadata"]["labels"][TRUST_DOMAIN_LABEL] == "internal"
    assert spec["preemption"] == {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"}
    quotas = {(f["name"], r["name"]): r for g in spec["resourceGroups"] for f in g["flavors"] for r in f["resources"]}
    assert quotas[("h100-train-internal", "nvidia.com/gpu")] == {"name": "nvidia.com/gpu", "nominalQuota": 16, "lendingLimit": 0}
    assert quotas[("a100-mig-internal", "nvidia.com/mig-1g.10gb")]["nominalQuota"] == 6
    assert quotas[("cpu-memory", "cpu")] == {"name": "cpu", "nominalQuota": "320", "borrowingLimit": 0}  # dev: search's quota holds its Slurm nodes


def test_every_tenant_has_the_default_local_queue_in_its_namespace(dev, dev_raw):
    local_queues = {(q["metadata"]["namespace"], q["metadata"]["name"]): q["spec"]["clusterQueue"] for q in objects(dev, "LocalQueue")}
    for tenant in validate(copy.deepcopy(dev_raw[0])).tenants:
        names = tenant_names(tenant)
        assert local_queues[(names.namespace, names.local_queue)] == names.cluster_queue


def test_cohorts_nest_trust_domains_under_their_organisation(dev, big):
    cohorts = by_name(big, "Cohort")
    assert cohorts["trust-domain-research"]["spec"]["parentName"] == cohorts["trust-domain-product"]["spec"]["parentName"] == "organisation-rnd"
    assert "parentName" not in cohorts["trust-domain-ops"]["spec"] and cohorts["organisation-rnd"]["spec"] == {}
    assert set(by_name(dev, "Cohort")) == {"trust-domain-internal", "trust-domain-assistant", "trust-domain-partner-acme"}


def test_rendered_quotas_equal_the_plans_supply(big, dev_raw):
    cfg = validate(bigger_environment(copy.deepcopy(dev_raw[0])))
    supply = {(o.name, r): n for o in offerings(plan_for(cfg)) for r, n in o.supply.items()}
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for holder in objects(big, "ClusterQueue") + objects(big, "Cohort"):
        for group in holder["spec"].get("resourceGroups", []):
            for flavor in group["flavors"]:
                for r in flavor["resources"]:
                    if flavor["name"] != "cpu-memory":
                        totals[flavor["name"], r["name"]] += r["nominalQuota"]
    assert {k: v for k, v in totals.items() if v} == supply


def test_the_tenant_hook_attaches_queues_to_any_component(dev_raw):
    cfg = validate(copy.deepcopy(dev_raw[0]))
    hook = KueueTenantHook.from_config(cfg, plan_for(cfg))
    tenant = cfg.tenants[1]

    def program():
        stack = FactoryComponent("ai-factory:test:Stack", "stack", layer="tenant-assistant", tenant=tenant.name)
        hook.attach(stack, tenant, tenant_names(tenant))

    rendered = from_graph(run_program(program, project="ai-factory", stack="test"), cfg)
    assert sorted((m.kind, m.name, m.namespace, m.tenant) for m in rendered.manifests) == [
        ("ClusterQueue", "tenant-assistant", None, "assistant"),
        ("LocalQueue", "default", "tenant-assistant", "assistant"),
    ]


def test_the_tenant_hook_refuses_a_tenant_it_was_not_built_for(dev_raw):
    cfg = validate(copy.deepcopy(dev_raw[0]))
    hook = KueueTenantHook.from_config(cfg, plan_for(cfg))
    stranger = cfg.tenants[0].model_copy(update={"name": "stranger"})
    with pytest.raises(KeyError, match="no ClusterQueue planned for tenant 'stranger'"):
        hook.attach(None, stranger, tenant_names(stranger))
