"""The fast path (`components/network.py`): installed only where an RDMA fabric is, its values and
objects are the chart's and the CRDs', each tenant's partition key or VLAN is its own and stays
put, bad input is refused with every path, and the fabric checks (offline and CrossGuard) and the
admission policy fail when isolation is broken."""

from __future__ import annotations

import json

import pytest
import yaml
from pydantic import TypeAdapter

from ai_factory.components import network
from ai_factory.components._common import RDMA_LABEL
from ai_factory.factory.checking import fabric as checks
from ai_factory.factory.model.loading import ConfigError, validate
from ai_factory.factory.planning.fabric import FabricError, FabricWant, allocate
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.planning.report import report_text
from tests.conftest import REPO, objects, one, render, without_dev_tenants_settings, without_models
from tests.test_bad_input import DEV_TEXT, refused_render

POOL = "ai-factory.io/pool"


def plan_of(raw: dict) -> Plan:
    return plan_for(validate(raw))


def networks_of(plan: Plan) -> dict[tuple[str, str], str]:
    return {(n.tenant, n.pool): n.shown for n in plan.networks}


# --------------------------------------------------------------------------- layer and objects


def test_a_fleet_of_ethernet_pools_installs_none_of_the_fast_path(raw):
    raw["tenants"][2].pop("network")
    for pool in raw["fleet"]["pools"]:
        pool["topology"]["fabric"] = "ethernet"
    for tenant in raw["tenants"]:
        for demand in tenant["gpus"]:
            demand.pop("rdma", None)
    rendered = render(raw)
    assert not [m.ref for m in rendered.manifests if m.layer == "network" or m.kind in ("NetworkAttachmentDefinition", "IPPool")]
    assert "network" not in {e["layer"] for e in rendered.inventory}


def test_dev_exposes_each_rdma_pool_by_sriov_on_exactly_its_nodes(dev):
    policies = {o["metadata"]["name"]: o["spec"] for o in objects(dev, "SriovNetworkNodePolicy")}
    assert sorted(policies) == ["a100-mig", "h100-train"]
    assert policies["h100-train"]["nodeSelector"] == {POOL: "h100-train"}
    assert policies["h100-train"]["linkType"] == "ib" and policies["a100-mig"]["linkType"] == "eth"
    assert policies["h100-train"]["nicSelector"]["pfNames"][:4] == ["ibp24s0", "ibp64s0", "ibp79s0", "ibp94s0"]
    assert "ibKubernetes" in one(dev, "NicClusterPolicy", "nic-cluster-policy")["spec"]


def test_shared_rdma_devices_come_from_a_node_policy_of_the_pool(raw):
    raw["fleet"]["pools"][0]["network"] = {"devices": "rdma-shared"}
    raw["tenants"][2]["gpus"] = []  # one trust domain left on the pool
    without_models(raw)  # partner-acme's model used its grant there
    rendered = render(raw)
    spec = one(rendered, "NicNodePolicy", "h100-train")["spec"]
    assert spec["nodeSelector"] == {POOL: "h100-train"}
    config = json.loads(spec["rdmaSharedDevicePlugin"]["config"])
    assert config["configList"][0]["selectors"]["ifNames"][0] == "ibp24s0"
    assert not [n for n in objects(rendered, "NetworkAttachmentDefinition") if "h100" in n["metadata"]["name"]]


def test_a_pool_naming_no_nic_exposes_every_nvidia_nic(raw):
    del raw["fleet"]["pools"][1]["topology"]["numa"]
    assert one(render(raw), "SriovNetworkNodePolicy", "a100-mig")["spec"]["nicSelector"] == {"vendor": network.MELLANOX_VENDOR}


def test_a_tenant_vpc_is_a_vlan_network_on_its_uplink_with_its_own_addresses(dev):
    config = json.loads(one(dev, "NetworkAttachmentDefinition", "vpc-acme")["spec"]["config"])
    assert (config["type"], config["master"], config["vlanId"]) == ("vlan", "bond0", 1042)
    pool = one(dev, "IPPool", "partner-acme.vpc-acme")["spec"]
    assert pool["subnet"] == "10.42.0.0/22" and pool["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["h100-train"]


def test_a_fleet_without_rdma_but_with_a_vpc_installs_multus_for_it(raw):
    for pool in raw["fleet"]["pools"]:
        pool["topology"]["fabric"] = "ethernet"
    for tenant in raw["tenants"]:
        for demand in tenant["gpus"]:
            demand.pop("rdma", None)
    rendered = render(raw)
    terms = one(rendered, "NicClusterPolicy", "nic-cluster-policy")["spec"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": POOL, "operator": "Exists"}]}]
    assert [n["metadata"]["name"] for n in objects(rendered, "NetworkAttachmentDefinition")] == ["vpc-acme"]
    assert not objects(rendered, "SriovNetworkNodePolicy")


def test_chart_values_are_keys_of_the_pinned_chart(oracles, raw):
    for driver in ("host", "doca"):
        raw["layers"]["network"].update(driver=driver, doca_driver_version="doca3.1.0-25.07-0.9.7.0-0")
        cfg = validate(raw)
        args = network.NetworkArgs.from_config(cfg, plan_for(cfg))
        assert oracles.validate_values("network-operator/chart-release", network.chart_values(args)) == []


def test_fast_path_objects_validate_against_the_upstream_crds(dev, oracles):
    kinds = ("NicClusterPolicy", "NicNodePolicy", "SriovNetworkNodePolicy", "IPPool", "NetworkAttachmentDefinition")
    found = [m.obj for m in dev.manifests if m.kind in kinds]
    assert {o["kind"] for o in found} >= {"NicClusterPolicy", "SriovNetworkNodePolicy", "IPPool", "NetworkAttachmentDefinition"}
    for obj in found:
        assert oracles.knows_kind(obj["apiVersion"], obj["kind"]), obj["kind"]
        assert oracles.validate_custom_object(obj) == [], obj["metadata"]["name"]


def test_sriov_node_policies_use_only_fields_of_both_sriov_operators_crds(dev, oracles):
    """The NVIDIA build's CRD and upstream's differ; our policies stay inside both."""
    for folder in ("network-operator", "sriov-network-operator"):
        crd = yaml.safe_load((oracles.root / folder / "crds" / "sriovnetworknodepolicy.yaml").read_text())
        fields = set(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])
        for policy in objects(dev, "SriovNetworkNodePolicy"):
            assert set(policy["spec"]) <= fields, folder


def test_tenant_networks_carry_the_tenants_keys_in_their_namespaces(dev):
    nads = {(n["metadata"]["namespace"], n["metadata"]["name"]): json.loads(n["spec"]["config"]) for n in objects(dev, "NetworkAttachmentDefinition")}
    assert nads[("tenant-search", "rdma-h100-train")]["type"] == "ib-sriov"
    assert nads[("tenant-search", "rdma-h100-train")]["pkey"] == "0x0100"
    assert {nads[("tenant-search", "rdma-a100-mig")]["vlan"], nads[("tenant-assistant", "rdma-a100-mig")]["vlan"]} == {300, 301}
    assert not [k for k in nads if k[0] == "tenant-partner-acme" and k[1].startswith("rdma-")]  # its 8 GPUs are on one node
    assert {c["ipam"]["poolName"] for c in nads.values()} == {p["metadata"]["name"] for p in objects(dev, "IPPool")}


# --------------------------------------------------------------------------- keys


def want(tenant: str, fabric: str = "infiniband", manual: int | None = None, pool: str = "ib") -> FabricWant:
    return FabricWant(tenant, pool, fabric, "infiniband" if fabric == "infiniband" else "roce", manual, f"tenants[{tenant}].network.pkey")


RANGES = {"infiniband": (0x100, 0x103), "roce": (100, 101)}


def keys(networks) -> dict[str, int]:
    return {n.tenant: n.key for n in networks}


def test_removing_a_tenant_frees_its_key_and_moves_no_other():
    before = allocate([want("a"), want("b"), want("c")], RANGES)
    assert keys(before) == {"a": 0x100, "b": 0x101, "c": 0x102}
    after = allocate([want("a"), want("c"), want("d")], RANGES, before)
    assert keys(after) == {"a": 0x100, "c": 0x102, "d": 0x101}


def test_keys_do_not_depend_on_the_order_of_tenants():
    assert allocate([want("b"), want("a")], RANGES) == allocate([want("a"), want("b")], RANGES)


def test_a_locked_key_is_kept_when_the_range_moves():
    before = allocate([want("a")], RANGES)
    assert keys(allocate([want("a"), want("b")], {**RANGES, "infiniband": (0x200, 0x2ff)}, before)) == {"a": 0x100, "b": 0x200}


def test_vlans_are_unique_per_fabric_not_across_fabrics():
    networks = allocate([want("a", "roce-par1"), want("b", "roce-par1"), want("a", "roce-lon1")], RANGES)
    assert {(n.fabric, n.tenant): n.key for n in networks} == {("roce-par1", "a"): 100, ("roce-par1", "b"): 101, ("roce-lon1", "a"): 100}


def test_a_key_given_by_hand_wins_but_never_takes_a_running_tenants():
    assert keys(allocate([want("a"), want("b", manual=0x100)], RANGES)) == {"a": 0x101, "b": 0x100}
    before = allocate([want("a")], RANGES)
    with pytest.raises(FabricError) as err:
        allocate([want("a"), want("b", manual=0x100)], RANGES, before)
    assert err.value.problems == ["tenants[b].network.pkey: 0x0100 is held by tenant 'a' on infiniband (the plan lock); a running tenant's key never changes: give another"]


def test_an_exhausted_range_is_a_planning_problem():
    with pytest.raises(FabricError) as err:
        allocate([want(t, "roce-par1") for t in "abc"], RANGES)
    assert err.value.problems == ["plan: no free VLAN left in 100-101 for tenant 'c' on roce-par1"]


def test_the_plan_lock_records_and_restores_keys(raw):
    planned = plan_of(raw)
    assert networks_of(planned) == {("assistant", "a100-mig"): "vlan 300", ("search", "a100-mig"): "vlan 301", ("search", "h100-train"): "pkey 0x0100"}
    restored = TypeAdapter(Plan).validate_json(planned.to_json())
    assert restored.networks == planned.networks == Plan.from_json(planned.to_json()).networks
    raw["tenants"] = [t for t in raw["tenants"] if t["name"] != "assistant"]
    replanned = plan_for(validate(raw), restored)
    assert networks_of(replanned) == {("search", "a100-mig"): "vlan 301", ("search", "h100-train"): "pkey 0x0100"}


def test_the_plan_report_shows_each_tenants_key(raw):
    text = report_text(plan_of(raw), validate(raw))
    assert "search      h100-train   infiniband   pkey 0x0100   plan" in text


def test_the_committed_dev_locks_hold_the_keys():
    locks = {c: TypeAdapter(Plan).validate_json((REPO / "plans" / f"dev-{c}.json").read_bytes()) for c in ("par1-a", "par1-b")}
    assert {n.shown for n in locks["par1-a"].networks} == {"pkey 0x0100", "vlan 300", "vlan 301"}  # the RDMA pools are par1-a's
    assert locks["par1-b"].networks == ()


# --------------------------------------------------------------------------- bad input


def test_bad_fabric_input_is_refused_with_every_path(raw):
    raw["tenants"][0]["network"] = {"pkey": "0x0105"}
    raw["tenants"][1]["network"] = {"pkey": 0x105, "vlan": 4095}
    raw["tenants"][2]["network"] = {"pkey": "0x7fff"}
    raw["fleet"]["pools"][1]["topology"]["numa"][1]["nics"].append("ens1f0np0")
    raw["tenants"][1]["gpus"][1]["rdma"] = True
    raw["tenants"].append({"name": "late", "trust": "high", "owners": {"groups": ["g"]}, "network": {"pkey": 0x8000}})
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert sorted(err.value.problems) == sorted([
        "tenants[1].network.vlan: VLAN 4095 is outside 2-4094 (0 and 4095 are reserved, 1 is the default VLAN of every port)",
        "tenants[2].network.pkey: 0x7fff is the default partition, of which every port is a member: it isolates nothing",
        "tenants[3].network.pkey: 0x8000 is outside the 15-bit partition keys 0x0001-0x7ffe (the membership bit is not part of the key)",
        "tenants[1].network.pkey: partition key 0x0105 is also given at tenants[0].network.pkey",
        "fleet.pools[1].topology.numa[1].nics[2]: NIC 'ens1f0np0' is already named at fleet.pools[1].topology.numa[0].nics[0]",
        "tenants[1].gpus[1].rdma: pool 'l40s-infer' has no RDMA fabric (its topology.fabric is ethernet)",
    ])


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda r: r["tenants"][0].update(network={"vlan": 7}) or r["tenants"][1].update(network={"vlan": 7}),
         "tenants[1].network.vlan: VLAN 7 is also given at tenants[0].network.vlan, on the same RoCE fabric (site par1)"),
        (lambda r: r["fleet"]["pools"][1].update(network={"devices": "rdma-shared"}),
         "tenants[0].gpus[1].rdma: pool 'a100-mig' shares its RDMA devices (network.devices: rdma-shared): no network of the tenant's own can be isolated there"),
        (lambda r: r["fleet"]["pools"][0].update(network={"devices": "rdma-shared"}),
         "fleet.pools[0].network.devices: rdma-shared gives every pod of a node the same RDMA devices, with no partition between them, "
         "but trust domains internal, partner-acme use pool 'h100-train': use sriov"),
        (lambda r: r["tenants"][0].update(network={"vpc": {**r["tenants"][2]["network"]["vpc"], "vlan": 5}}),
         "tenants[2].network.vpc.vni: 10042 is also given at tenants[0].network.vpc.vni: the two tenants would share a VPC"),
        (lambda r: r["layers"]["network"].update(driver="doca"),
         "layers.network.doca_driver_version: required with driver: doca (the DOCA-OFED container tag matching the nodes' kernel)"),
        (lambda r: r["layers"]["network"].update(enabled=False),
         "fleet.pools[0].topology.fabric: pool 'h100-train' is on infiniband but layers.network is disabled"),
    ],
    ids=["same-vlan-same-fabric", "same-vpc", "rdma-on-shared-devices", "shared-devices-two-domains", "doca-without-version", "layer-off"],
)
def test_a_fabric_rule_names_its_path(raw, change, expected):
    change(raw)
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert expected in err.value.problems


def test_the_cli_refuses_a_shared_partition_key_with_exit_2_and_writes_nothing(tmp_path):
    text = DEV_TEXT.replace("      owners: {groups: [search-admins]}", "      owners: {groups: [search-admins]}\n      network: {pkey: 0x0200}")
    text = text.replace("      owners: {groups: [assistant-admins], users: [lea@example.com]}", "      owners: {groups: [assistant-admins], users: [lea@example.com]}\n      network: {pkey: 0x200}")
    assert "tenants[1].network.pkey: partition key 0x0200 is also given at tenants[0].network.pkey" in refused_render(tmp_path, text)


def test_the_fleet_labels_rdma_nodes_with_how_their_nics_are_exposed(dev):
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in objects(dev, "Node")}
    assert labels["gpu-h100-01"][RDMA_LABEL] == "sriov" and labels["a100-mig-000"][RDMA_LABEL] == "sriov"
    assert RDMA_LABEL not in labels["l40s-infer-000"]


def three_sites(raw: dict) -> dict:
    """Three sites, InfiniBand and RoCE pools in each, six multi-node tenants (two per site)."""
    numa = [{"node": 0, "gpus": [0, 1, 2, 3], "nics": ["nic0", "nic1"]}, {"node": 1, "gpus": [4, 5, 6, 7], "nics": ["nic2", "nic3"]}]
    sites = ["par1", "lon1", "fra1"]
    raw["fleet"] = {
        "sites": [{"name": s} for s in sites],
        "pools": [
            {"name": name, "site": site, "gpu": {"model": "H100-80GB", "per_node": 8}, "nodes": 4,
             "topology": {"fabric": fabric, "numa": numa}}
            for site in sites for name, fabric in ((f"ib-{site}", "infiniband"), (f"roce-{site}", "roce"))
        ],
    }
    raw["fleet"]["pools"][0]["name"] = "h100-train"  # the self-service pool of dev's config
    raw["tenants"] = [
        {"name": f"t{i}", "trust": "high", "owners": {"groups": [f"t{i}"]},
         "gpus": [{"pool": raw["fleet"]["pools"][2 * (i // 2)]["name"], "count": 16}, {"pool": f"roce-{sites[i // 2]}", "count": 16}]}
        for i in range(6)
    ]
    raw.pop("self_service", None)
    return without_dev_tenants_settings(raw)


def test_three_sites_keep_every_tenant_apart_and_removal_moves_no_key(raw):
    raw = three_sites(raw)
    planned = plan_of(raw)
    pkeys = [n.key for n in planned.networks if n.kind == "infiniband"]
    vlans = [(n.fabric, n.key) for n in planned.networks if n.kind == "roce"]
    assert len(pkeys) == len(set(pkeys)) == 6 and len(vlans) == len(set(vlans)) == 6
    rendered = render(raw)
    for check in (checks.fabric_keys, checks.fabric_attachments, checks.nic_policies_select_pools):
        assert list(check(rendered, None)) == []
    before = {(n.tenant, n.pool): n.key for n in planned.networks}
    raw["tenants"] = [t for t in raw["tenants"] if t["name"] != "t2"]
    after = {(n.tenant, n.pool): n.key for n in plan_for(validate(raw), planned).networks}
    assert after == {k: v for k, v in before.items() if k[0] != "t2"}


# --------------------------------------------------------------------------- GPU-NIC alignment on DRA pools


def dra_sites(raw: dict, pools: str = "all") -> dict:
    """Three sites of DRA pools: all of them, or only the InfiniBand ones."""
    raw = three_sites(raw)
    for pool in raw["fleet"]["pools"]:
        if pools == "all" or pool["topology"]["fabric"] == "infiniband":
            pool["sharing"] = "dra"
    return raw


def test_dra_pools_pair_each_tenants_gpu_and_vf_on_one_pcie_root(raw, oracles):
    raw = dra_sites(raw)
    cfg = validate(raw)
    args = network.NetworkArgs.from_config(cfg, plan_for(cfg))
    values = network.chart_values(args)
    assert values["sriov-network-operator"] == {"sriovOperatorConfig": {"featureGates": {"dynamicResourceAllocation": True}}}
    rendered = render(raw)
    classes = {o["metadata"]["name"]: o for o in objects(rendered, "DeviceClass") if o["metadata"]["name"].endswith("-rdma-vf")}
    assert sorted(classes) == sorted(f"{p['name']}-rdma-vf" for p in raw["fleet"]["pools"])
    assert classes["roce-lon1-rdma-vf"]["spec"]["selectors"][0]["cel"]["expression"] == (
        "device.driver == 'sriovnetwork.k8snetworkplumbingwg.io' && device.attributes['k8s.cni.cncf.io'].resourceName == 'nvidia.com/roce_lon1_vf'")
    templates = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects(rendered, "ResourceClaimTemplate")
                 if o["metadata"]["name"].endswith("-gpu-rdma")}
    assert sorted(templates) == sorted((f"tenant-{n.tenant}", f"{n.pool}-gpu-rdma") for n in plan_for(cfg).networks)
    devices = templates["tenant-t2", "ib-lon1-gpu-rdma"]["spec"]["spec"]["devices"]
    assert [(r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"]) for r in devices["requests"]] == [
        ("gpu", "h100-80gb-whole", 1), ("nic", "ib-lon1-rdma-vf", 1)]
    assert devices["constraints"] == [{"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    assert devices["config"][0]["opaque"]["parameters"] == {
        "apiVersion": "sriovnetwork.k8snetworkplumbingwg.io/v1alpha1", "kind": "VfConfig",
        "netAttachDefName": "rdma-ib-lon1", "netAttachDefNamespace": "tenant-t2"}
    assert oracles.validate_values("network-operator/chart", values) == []
    for obj in [*classes.values(), *templates.values()]:
        assert oracles.validate_core_object(obj, "1.34") == [], obj["metadata"]["name"]
    from ai_factory.factory.checking.check import run_checks

    assert [f for f in run_checks(rendered, oracles) if f.check != "chart-rendering"] == []
    quotas = {o["metadata"]["namespace"]: o["spec"]["hard"] for o in objects(rendered, "ResourceQuota")}
    # A VF per GPU it may hold where it has a network, none elsewhere (a bare VF has no key).
    t2 = {k.removesuffix(".deviceclass.resource.k8s.io/devices"): int(v) for k, v in quotas["tenant-t2"].items() if k.endswith(".deviceclass.resource.k8s.io/devices")}
    assert t2["ib-lon1-rdma-vf"] + t2["roce-lon1-rdma-vf"] == t2["h100-80gb-whole"] == 32 and t2["ib-lon1-rdma-vf"] == 16
    assert t2["h100-train-rdma-vf"] == t2["roce-fra1-rdma-vf"] == 0


def test_a_fleet_mixing_dra_and_device_plugin_sriov_pools_keeps_the_device_plugin(raw):
    """The SR-IOV operator's DRA gate is for all its pools: RoCE pools on the device plugin keep it on."""
    raw = dra_sites(raw, pools="infiniband")
    cfg = validate(raw)
    assert "sriov-network-operator" not in network.chart_values(network.NetworkArgs.from_config(cfg, plan_for(cfg)))
    rendered = render(raw)
    assert not [o for o in objects(rendered, "DeviceClass") if o["metadata"]["name"].endswith("-rdma-vf")]
    assert not [o for o in objects(rendered, "ResourceClaimTemplate") if o["metadata"]["name"].endswith("-gpu-rdma")]


def test_dev_has_no_dra_pool_and_no_paired_claims(dev):
    assert not [o for o in objects(dev, "ResourceClaimTemplate") if o["metadata"]["name"].endswith("-gpu-rdma")]
    assert "sriov-network-operator" not in json.dumps([m.obj for m in dev.manifests if m.kind == "SriovOperatorConfig"])
