"""Slurm through Slinky: NodeSets are the plan's grant node by node (GRES = slurmd's GPU limits =
the plan, one pod per planned node, every tenant's Slurm GPUs on a node adding up to what the plan
gave them there), slurmd passes Pod Security baseline, Slurm's pods are queued and placed like any
tenant pod, login and REST endpoints stay inside the tenant, bad requests are refused with their
paths, and the checks and policies fail when any of it is broken."""

from __future__ import annotations

import copy
import re
import subprocess
import json
from collections import defaultdict

import pytest
import yaml

from ai_factory.components import slinky
from ai_factory.factory.checking import slurm as slurm_checks
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.planning.placement import DEDICATED_LABEL
from ai_factory.factory.model.tenancy import TRUST_DOMAIN_LABEL
from ai_factory.policies.aif_policies.security import BASELINE_CAPABILITIES
from tests.conftest import one, render
from tests.policy_stacks import namespace, node, release, stack, violations
from tests.test_bad_input import DEV_TEXT, problems, refused_render
from tests.test_scheduling import broken

SLURM_CHART = "oci://ghcr.io/slinkyproject/charts/slurm"


def slurm_values(rendered, tenant: str) -> dict:
    return one(rendered, "HelmRelease", f"slurm-{tenant}")["spec"]["values"]


def slurm_nodes(rendered) -> dict[tuple[str, str], dict[str, int]]:
    """(tenant, node) -> the GPU resources of that tenant's slurmd there, from the NodeSets' pinning."""
    found: dict[tuple[str, str], dict[str, int]] = {}
    for m in rendered.manifests:
        if m.kind == "HelmRelease" and m.name.startswith("slurm-") and m.namespace and m.namespace.startswith("tenant-"):
            for _, nodeset in slurm_checks.nodesets(m.obj["spec"]["values"]):
                for host in slurm_checks.pinned_nodes(nodeset):
                    assert (m.namespace, host) not in found, "two slurmd pods of one tenant on one node"
                    found[m.namespace.removeprefix("tenant-"), host] = slurm_checks.gres_counts(nodeset)
    return found


def with_slurm_tenants(raw: dict) -> dict:
    """Several Slurm tenants of different trust domains on the whole-GPU pool, two of them on the
    same node GPU by GPU, and uneven grants (12 GPUs on 8-GPU nodes)."""
    raw = copy.deepcopy(raw)
    raw["tenants"] += [
        {"name": "vision", "trust": "high", "owners": {"groups": ["vision-admins"]}, "quota": {"cpu": "200", "memory": "2Ti"}, "gpus": [{"pool": "h100-train", "count": 4}]},
        {"name": "speech", "trust": "high", "owners": {"groups": ["speech-admins"]}, "quota": {"cpu": "200", "memory": "2Ti"}, "gpus": [{"pool": "h100-train", "count": 4}]},
    ]
    raw["tenants"][0]["gpus"][0]["count"] = 12  # search: one full node and half of another
    exceptions = raw["layers"]["tenancy"]["pod_security_exceptions"]
    exceptions += [{**exceptions[0], "tenant": t} for t in ("vision", "speech")]
    raw["layers"]["slinky"]["clusters"] += [{"tenant": t, "pools": ["h100-train"], "login_replicas": 0} for t in ("vision", "speech")]
    return raw


@pytest.fixture(scope="module")
def multi(dev_raw):
    raw, secrets = dev_raw
    return render(with_slurm_tenants(raw), secrets)


# --------------------------------------------------------------------------- NodeSets from the plan


def test_every_tenants_slurm_gres_on_a_node_is_its_grant_there_and_never_more_than_the_node(multi):
    cfg = multi.config
    plan = plan_for(cfg)  # the multi-tenant variant has no lock: planned from scratch, as rendered
    found = slurm_nodes(multi)
    planned = {
        (c.tenant, node): grants for c in cfg.layers.slinky.clusters for pool in c.pools for node, grants in slinky.node_grants(plan, c.tenant, pool).items()
    }
    assert found == planned
    per_node: dict[str, int] = defaultdict(int)
    for (_, host), gres in found.items():
        per_node[host] += gres.get("nvidia.com/gpu", 0)
    capacity = {n.name: p.gpu.per_node for p in cfg.fleet.pools for n in p.node_specs()}
    assert all(gpus <= capacity[host] for host, gpus in per_node.items())
    assert any(len({t for t, h in found if h == host}) > 1 for host in per_node), "the variant must put two Slurm tenants on one node"


def test_an_uneven_grant_gets_one_nodeset_per_shape_with_replicas_equal_to_its_nodes(multi):
    nodesets = dict(slurm_checks.nodesets(slurm_values(multi, "search")))
    h100 = {k: v for k, v in nodesets.items() if k.startswith("h100-train")}
    shapes = sorted((slurm_checks.gres_counts(v)["nvidia.com/gpu"], v["replicas"], len(slurm_checks.pinned_nodes(v))) for v in h100.values())
    assert shapes == [(4, 1, 1), (8, 1, 1)]


def test_slurm_node_cpus_and_memory_are_the_gpu_share_of_the_node_and_add_up_to_at_most_the_node(multi):
    resources = multi.config.layers.slinky.node_resources["h100-train"]
    cpus: dict[str, int] = defaultdict(int)
    for tenant in ("search", "vision", "speech"):
        for _, nodeset in slurm_checks.nodesets(slurm_values(multi, tenant)):
            limits = nodeset["slurmd"]["resources"]["limits"]
            assert nodeset["slurmd"]["resources"]["requests"] == limits  # Guaranteed: slurmd's CPUs= and RealMemory= are these
            if nodeset["extraConfMap"]["Features"] == ["h100-train"]:
                gpus = int(limits["nvidia.com/gpu"])
                assert int(limits["cpu"]) == resources.cpus * gpus // 8
                assert limits["memory"] == f"{resources.memory_gib * 1024 * gpus // 8}Mi"
                for host in slurm_checks.pinned_nodes(nodeset):
                    cpus[host] += int(limits["cpu"])
    assert cpus and max(cpus.values()) <= resources.cpus


def test_mig_grants_become_gres_per_profile_matching_the_device_plugin_resources(dev):
    nodeset = dict(slurm_checks.nodesets(slurm_values(dev, "search")))["a100-mig"]
    assert nodeset["extraConfMap"]["Gres"] == ["gpu:1g.10gb:6", "gpu:3g.40gb:2"]
    limits = nodeset["slurmd"]["resources"]["limits"]
    assert {k: v for k, v in limits.items() if k.startswith("nvidia.com/")} == {"nvidia.com/mig-1g.10gb": "6", "nvidia.com/mig-3g.40gb": "2"}


def test_partition_limits_are_the_nodesets_own(dev):
    for _, nodeset in slurm_checks.nodesets(slurm_values(dev, "search")):
        limits = nodeset["slurmd"]["resources"]["limits"]
        config = nodeset["partition"]["configMap"]
        assert nodeset["partition"]["enabled"] is True
        assert (config["MaxNodes"], config["MaxCPUsPerNode"], config["MaxMemPerNode"], config["OverSubscribe"]) == (
            str(nodeset["replicas"]),
            limits["cpu"],
            limits["memory"].removesuffix("Mi"),
            "NO",
        )
    assert slurm_values(dev, "search")["partitions"] == {"all": {"enabled": False}}


def test_topology_comes_from_the_racks_blocks_and_nvlink_domains(dev):
    topology = yaml.safe_load(slurm_values(dev, "search")["configFiles"]["topology.yaml"])
    switches = {s["switch"]: s.get("children") for s in topology[0]["tree"]["switches"]}
    assert switches["par1-b1"] == "par1-r01,par1-r02" and "par1-r01" in switches
    node_patch = one(dev, "Node", "gpu-h100-03")
    assert node_patch["metadata"]["annotations"][slinky.TOPOLOGY_ANNOTATION] == "topo-tree:par1-r02"
    cfg = dev.config.model_copy(deep=True)
    pool = cfg.fleet.pools[0].model_copy(update={"topology": cfg.fleet.pools[0].topology.model_copy(update={"nodes_per_nvlink_domain": 2})})
    nvlink = yaml.safe_load(slinky.topology_yaml([pool]))
    assert nvlink[1] == {"topology": "topo-nvlink", "cluster_default": False, "block": {"blocks": [{"block": "par1-r01"}, {"block": "par1-r02"}]}}
    assert slinky.topology_spec(pool.node_specs()[0]) == "topo-tree:par1-r01,topo-nvlink:par1-r01"


# --------------------------------------------------------------------------- privileges, queues, reachability


def test_slurmd_is_unprivileged_with_baseline_capabilities_only(dev):
    for _, nodeset in slurm_checks.nodesets(slurm_values(dev, "search")):
        context = nodeset["slurmd"]["securityContext"]
        assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["add"] and set(context["capabilities"]["add"]) <= BASELINE_CAPABILITIES
    assert slurm_values(dev, "search")["configFiles"]["cgroup.conf"] == "CgroupPlugin=disabled\n"


def test_every_slurm_pod_names_the_tenants_queue_and_gpu_pods_select_its_offering(dev):
    values = slurm_values(dev, "search")
    for part in (values["controller"], values["restapi"], values["accounting"], values["loginsets"]["login"], *dict(slurm_checks.nodesets(values)).values()):
        assert part["metadata"]["labels"][slinky.QUEUE_LABEL] == "default"
        assert part["metadata"]["labels"][TRUST_DOMAIN_LABEL] == "internal"
    mig = dict(slurm_checks.nodesets(values))["a100-mig"]["podSpec"]
    assert mig["nodeSelector"][TRUST_DOMAIN_LABEL] == "internal"
    assert mig["tolerations"] == [{"key": TRUST_DOMAIN_LABEL, "operator": "Equal", "value": "internal", "effect": "NoSchedule"}]


def test_login_and_rest_endpoints_are_cluster_internal(dev):
    values = slurm_values(dev, "search")
    assert values["loginsets"]["login"]["service"]["spec"]["type"] == "ClusterIP"
    assert values["restapi"]["service"]["spec"]["type"] == "ClusterIP"


def test_accounting_password_comes_from_the_tenants_openbao_prefix(dev):
    secret = one(dev, "ExternalSecret", slinky.ACCOUNTING_SECRET)
    assert secret["metadata"]["namespace"] == "tenant-search"
    assert secret["spec"]["secretStoreRef"] == {"kind": "SecretStore", "name": "openbao"}
    assert secret["spec"]["data"] == [{"secretKey": "password", "remoteRef": {"key": "tenants/search/slurm-accounting", "property": "password"}}]
    assert slurm_values(dev, "search")["accounting"]["storageConfig"]["passwordKeyRef"] == {"name": slinky.ACCOUNTING_SECRET, "key": "password"}


def test_the_operator_runs_restricted_without_a_chart_generated_key(dev):
    values = one(dev, "HelmRelease", "slurm-operator")["spec"]["values"]
    assert values["certManager"] == {"enabled": False} and values["crds"] == {"enabled": False} and values["webhook"] == {"enabled": False}
    assert values["operator"]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert one(dev, "Namespace", "slinky")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


# --------------------------------------------------------------------------- bad input


def _cluster(raw: dict) -> dict:
    return raw["layers"]["slinky"]["clusters"][0]


BAD_REQUESTS = [
    ("no-grant", lambda r: _cluster(r)["pools"].append("l40s-infer"), "layers.slinky.clusters[0].pools[2]: tenant 'search' has no GPU grant on pool 'l40s-infer'"),
    (
        "mig-media-extensions",
        lambda r: r["tenants"][0]["gpus"][1]["mig"].update({"1g.10gb+me": 1}),
        "layers.slinky.clusters[0].pools[1]: MIG profile '1g.10gb+me' (media extensions) has no Slurm GRES type",
    ),
    (
        "sharing-slurm-cannot-express",
        lambda r: r["layers"]["slinky"]["clusters"].append({"tenant": "assistant", "pools": ["l40s-infer"]}),
        "layers.slinky.clusters[1].pools[0]: pool 'l40s-infer' shares GPUs by hami, which Slurm GRES cannot express",
    ),
    (
        "low-trust",
        lambda r: r["layers"]["slinky"]["clusters"].append({"tenant": "partner-acme", "pools": ["h100-train"]}),
        "layers.slinky.clusters[1].tenant: 'partner-acme' is low trust",
    ),
    ("no-exception", lambda r: r["layers"]["tenancy"].pop("pod_security_exceptions"), "layers.slinky.clusters[0].tenant: slurmd runs as root"),
    ("no-node-resources", lambda r: r["layers"]["slinky"]["node_resources"].pop("a100-mig"), "layers.slinky.node_resources.a100-mig: required"),
    ("quota-too-small", lambda r: r["tenants"][0].pop("quota"), "tenants[0].quota.cpu: 64 cannot hold the tenant's Slurm nodes (up to 205 on h100-train, a100-mig)"),
    ("unknown-tenant", lambda r: _cluster(r).update(tenant="serch"), "layers.slinky.clusters[0].tenant: unknown tenant 'serch' (did you mean 'search'?)"),
    ("twice", lambda r: r["layers"]["slinky"]["clusters"].append(copy.deepcopy(_cluster(r))), "layers.slinky.clusters[1].tenant: tenant 'search' already has a Slurm cluster"),
    ("layer-off", lambda r: r["layers"]["slinky"].update(enabled=False), "layers.slinky.clusters: 1 cluster(s) but layers.slinky.enabled is not true"),
    ("accounting-without-openbao", lambda r: r["layers"].update(external_secrets={"enabled": False}), "layers.slinky.clusters[0].accounting: the database password comes from OpenBao"),
]


@pytest.mark.parametrize(("change", "expected"), [(c, e) for _, c, e in BAD_REQUESTS], ids=[i for i, _, _ in BAD_REQUESTS])
def test_a_bad_slurm_request_is_refused_with_its_path(raw, change, expected):
    change(raw)
    assert any(p.startswith(expected) for p in problems(raw)), problems(raw)


def test_the_issues_bad_slurm_requests_are_reported_together_with_exit_2(tmp_path):
    document = yaml.safe_load(DEV_TEXT)  # `secure:` values stay as they are written
    config = document["config"]
    raw = {"layers": config["ai-factory:layers"], "tenants": config["ai-factory:tenants"]}
    for name, change, _ in BAD_REQUESTS[:4]:
        change(raw)
    stderr = refused_render(tmp_path, yaml.safe_dump(document, sort_keys=False))
    for name, _, expected in BAD_REQUESTS[:4]:
        assert expected.split(": ", 1)[1] in stderr, name  # their indexes shift: clusters are appended
    assert "layers.slinky.clusters[2].tenant: 'partner-acme' is low trust" in stderr


# --------------------------------------------------------------------------- checks and policies


def _hosts(*hosts: str) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(hosts)}]}]}}}


def good_nodeset() -> dict:
    return {
        "replicas": 2,
        "oversubscribeNode": False,
        "extraConfMap": {"Gres": ["gpu:4"]},
        "slurmd": {"resources": {"limits": {"cpu": "8", "memory": "1024Mi", "nvidia.com/gpu": "4"}}},
        "metadata": {"annotations": {slurm_checks.PLANNED_ANNOTATION: json.dumps({"n1": {"nvidia.com/gpu": 4}, "n2": {"nvidia.com/gpu": 4}})}},
        "podSpec": {"affinity": _hosts("n1", "n2")},
    }


def _set(path: str, value):
    def change(nodeset: dict) -> None:
        *parents, last = path.split(".")
        target = nodeset
        for key in parents:
            target = target[key]
        target[last] = value

    return change


NODESET_ROWS = [
    ("accepts-the-plan", lambda n: None, None),
    ("accepts-mig-profiles", lambda n: n.update(
        extraConfMap={"Gres": ["gpu:1g.10gb:2"]},
        slurmd={"resources": {"limits": {"nvidia.com/mig-1g.10gb": "2"}}},
        metadata={"annotations": {slurm_checks.PLANNED_ANNOTATION: json.dumps({"n1": {"nvidia.com/mig-1g.10gb": 2}, "n2": {"nvidia.com/mig-1g.10gb": 2}})}},
    ), None),
    ("gres-above-limits", _set("extraConfMap.Gres", ["gpu:5"]), "Gres= stands for {'nvidia.com/gpu': 5} but slurmd's limits are {'nvidia.com/gpu': 4}"),
    ("limits-above-gres", lambda n: n["slurmd"]["resources"]["limits"].update({"nvidia.com/gpu": "8"}), "but slurmd's limits are {'nvidia.com/gpu': 8}"),
    ("gres-of-another-type", _set("extraConfMap.Gres", ["gpu:1g.10gb:4"]), "Gres= stands for {'nvidia.com/mig-1g.10gb': 4}"),
    ("malformed-gres", _set("extraConfMap.Gres", ["gpu"]), "Gres item 'gpu' is not gpu[:<type>]:<count>"),
    ("more-replicas-than-nodes", _set("replicas", 3), "3 replicas for 2 planned nodes"),
    ("oversubscribed-node", _set("oversubscribeNode", True), "oversubscribeNode lets two of its pods share a node"),
    ("not-pinned", _set("podSpec", {}), "its pods may run on any node"),
    ("pinned-beyond-the-plan", _set("podSpec.affinity", _hosts("n1", "n2", "n3")), "its pods may run on n1, n2, n3, not exactly the nodes the plan gives it (n1, n2)"),
    ("gres-above-the-grant", lambda n: n["metadata"]["annotations"].update({slurm_checks.PLANNED_ANNOTATION: json.dumps({"n1": {"nvidia.com/gpu": 4}, "n2": {"nvidia.com/gpu": 2}})}), "node n2: Gres= stands for {'nvidia.com/gpu': 4} but the plan gives the tenant {'nvidia.com/gpu': 2} there"),
    ("no-plan-recorded", _set("metadata", {}), "no ai-factory.io/planned-gpus annotation"),
]


@pytest.mark.parametrize(("change", "expected"), [(c, e) for _, c, e in NODESET_ROWS], ids=[i for i, _, _ in NODESET_ROWS])
def test_nodeset_problems(change, expected):
    nodeset = good_nodeset()
    change(nodeset)
    found = slurm_checks.nodeset_problems(nodeset)
    assert found == [] if expected is None else any(expected in p for p in found), found


@pytest.mark.parametrize(("change", "expected"), [(c, e) for _, c, e in NODESET_ROWS], ids=[i for i, _, _ in NODESET_ROWS])
def test_slurm_gres_policy(change, expected):
    nodeset = good_nodeset()
    change(nodeset)
    found = violations(stack(lambda: release("slurm-a", SLURM_CHART, "tenant-a", {"nodesets": {"gpus": nodeset}})), "slurm-gres-match-plan")
    messages = [m for ms in found.values() for m in ms]
    assert messages == [] if expected is None else any(expected in m for m in messages), messages


TRUST_ROWS = [
    ("accepts-whole-gpu-nodes-shared-gpu-by-gpu", {}, None),
    ("accepts-its-own-domains-node", {TRUST_DOMAIN_LABEL: "internal"}, None),
    ("another-domains-node", {TRUST_DOMAIN_LABEL: "other"}, "node n2 belongs to trust domain 'other', not the tenant's 'internal'"),
    ("another-tenants-dedicated-node", {DEDICATED_LABEL: "partner-acme", TRUST_DOMAIN_LABEL: "partner-acme"}, "node n2 is dedicated to tenant 'partner-acme'"),
]


@pytest.mark.parametrize(("labels", "expected"), [(l, e) for _, l, e in TRUST_ROWS], ids=[i for i, _, _ in TRUST_ROWS])
def test_slurm_trust_domain_policy(labels, expected):
    def program():
        namespace("tenant-a", tenant="a", domain="internal", level="baseline")
        node("n1", {"ai-factory.io/pool": "p"})
        node("n2", {"ai-factory.io/pool": "p", **labels})
        release("slurm-a", SLURM_CHART, "tenant-a", {"nodesets": {"gpus": good_nodeset()}})

    messages = [m for ms in violations(stack(program), "slurm-partitions-in-trust-domain").values() for m in ms]
    assert messages == [] if expected is None else any(expected in m for m in messages), messages


def test_offline_checks_accept_the_dev_render(dev):
    assert list(slurm_checks.gres_matches_plan(dev, None)) == []
    assert list(slurm_checks.partitions_within_trust_domain(dev, None)) == []


def _h100(values: dict) -> dict:
    return values["nodesets"]["h100-train"]


OFFLINE_BREAKAGES = [
    ("gres-off-by-one", lambda v: _h100(v)["extraConfMap"].update(Gres=["gpu:7"]), "slurm-gres", "Gres= stands for {'nvidia.com/gpu': 7} but slurmd's limits are {'nvidia.com/gpu': 8}"),
    ("replicas-overcommit", lambda v: _h100(v).update(replicas=3), "slurm-gres", "3 replicas for 2 planned nodes"),
    (
        "node-overcommitted-consistently",
        lambda v: (
            _h100(v)["extraConfMap"].update(Gres=["gpu:9"]),
            _h100(v)["slurmd"]["resources"]["limits"].update({"nvidia.com/gpu": "9"}),
            _h100(v)["metadata"]["annotations"].update({slurm_checks.PLANNED_ANNOTATION: json.dumps({"gpu-h100-02": {"nvidia.com/gpu": 9}, "gpu-h100-03": {"nvidia.com/gpu": 9}})}),
        ),
        "slurm-gres",
        "Slurm NodeSets claim 9 GPUs here (tenant-search/h100-train), the node has 8",
    ),
    ("unpinned", lambda v: _h100(v).update(podSpec={}), "slurm-trust-domain", "not pinned to nodes"),
]


@pytest.mark.parametrize(("change", "check", "expected"), [(c, k, e) for _, c, k, e in OFFLINE_BREAKAGES], ids=[i for i, *_ in OFFLINE_BREAKAGES])
def test_offline_checks_flag_a_broken_nodeset(dev, change, check, expected):
    bad = broken(dev, "HelmRelease", "slurm-search", lambda obj: change(obj["spec"]["values"]))
    found = [*slurm_checks.gres_matches_plan(bad, None), *slurm_checks.partitions_within_trust_domain(bad, None)]
    assert any(f.check == check and expected in f.message for f in found), [str(f) for f in found]
    assert all(f.tenants == ("search",) for f in found if f.ref.startswith("HelmRelease/"))


def test_a_nodeset_on_a_node_outside_the_fleet_claims_more_than_it_has(dev):
    def ghost(values: dict) -> None:
        nodeset = _h100(values)
        nodeset["podSpec"]["affinity"] = _hosts("ghost-001", "ghost-002")
        nodeset["metadata"]["annotations"][slurm_checks.PLANNED_ANNOTATION] = json.dumps({n: {"nvidia.com/gpu": 8} for n in ("ghost-001", "ghost-002")})

    bad = broken(dev, "HelmRelease", "slurm-search", lambda obj: ghost(obj["spec"]["values"]))
    assert [str(f) for f in slurm_checks.gres_matches_plan(bad, None)] == [
        f"slurm-gres: Node/{n}: Slurm NodeSets claim 8 GPUs here (tenant-search/h100-train), the node has 0" for n in ("ghost-001", "ghost-002")
    ]


def test_a_slurm_release_outside_any_rendered_namespace_is_still_checked(dev):
    moved = broken(dev, "HelmRelease", "slurm-search", lambda obj: obj["metadata"].update(namespace="elsewhere"))
    moved = broken(moved, "HelmRelease", "slurm-search", lambda obj: _h100(obj["spec"]["values"]).update(podSpec={}))
    found = [str(f) for f in slurm_checks.partitions_within_trust_domain(moved, None)]
    assert found == [
        # no tenant namespace: a node owned by a trust domain is another's
        "slurm-trust-domain: HelmRelease/elsewhere/slurm-search nodeset a100-mig: node a100-mig-001 belongs to trust domain 'internal', not the tenant's None",
        "slurm-trust-domain: HelmRelease/elsewhere/slurm-search nodeset h100-train: not pinned to nodes (kubernetes.io/hostname): its partition could span any trust domain's nodes",
    ]


def test_offline_trust_check_flags_a_node_of_another_domain(dev):
    bad = broken(dev, "Node", "gpu-h100-02", lambda obj: obj["metadata"]["labels"].update({DEDICATED_LABEL: "partner-acme"}))
    found = [str(f) for f in slurm_checks.partitions_within_trust_domain(bad, None)]
    assert found == ["slurm-trust-domain: HelmRelease/tenant-search/slurm-search nodeset h100-train: node gpu-h100-02 is dedicated to tenant 'partner-acme' [tenants: search]"]


def test_the_multi_tenant_render_is_clean(multi):
    assert [str(f) for f in (*slurm_checks.gres_matches_plan(multi, None), *slurm_checks.partitions_within_trust_domain(multi, None))] == []


def test_every_image_a_slurm_cluster_runs_is_slinkys_pinned_and_admitted(dev, chart_env, tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(slurm_values(dev, "search")))
    rendered = subprocess.run(
        [chart_env.helm, "template", "slurm-search", str(chart_env.charts_dir / "slurm-1.2.1.tgz"), "--namespace", "tenant-search", "--values", str(values)],
        capture_output=True, text=True, check=True,
    ).stdout
    images = set(re.findall(r"^\s+image: (\S+)$", rendered, flags=re.M))
    assert images and all(i.startswith("ghcr.io/slinkyproject/") and i.endswith(f":{slinky.IMAGE_TAG}") for i in images), images
    policy = one(dev, "ClusterPolicy", "tenant-image-registries")
    assert "ghcr.io/slinkyproject/*" in json.dumps(policy)
