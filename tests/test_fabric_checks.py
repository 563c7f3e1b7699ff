"""The fast path's checks (`factory/checking/fabric.py`), its CrossGuard policies
(`policies/aif_policies/fabric.py`) and its admission policy, table-driven: each flags a broken
world and accepts a sound one."""

from __future__ import annotations

import copy
import json

import pulumi_kubernetes as k8s
import pytest

from ai_factory.components import network
from ai_factory.factory.checking import fabric as checks
from ai_factory.factory.rendering.bundle import Manifest, Rendered
from tests.conftest import objects, one
from tests.kyverno_engine import Request, refusals
from tests.policy_stacks import namespace as tenant_namespace
from tests.policy_stacks import stack, violations

POOL, SITE, TENANT = "ai-factory.io/pool", "ai-factory.io/site", "ai-factory.io/tenant"


# --------------------------------------------------------------------------- checks, table-driven


def nad(namespace: str, config: dict | str, resource: str = "nvidia.com/ib_vf", name: str = "rdma") -> dict:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": namespace, "annotations": {checks.RESOURCE_ANNOTATION: resource}},
        "spec": {"config": config if isinstance(config, str) else json.dumps(config)},
    }


def ib(pkey) -> dict:
    return {"type": "ib-sriov", "pkey": pkey} if pkey is not None else {"type": "ib-sriov"}


def roce(vlan) -> dict:
    return {"cniVersion": "0.3.1", "plugins": [{"type": "sriov", "vlan": vlan}, {"type": "tuning"}]}


def node(name: str, pool: str, site: str = "par1") -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {POOL: pool, SITE: site}}}


def ns(name: str, tenant: str | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {TENANT: tenant} if tenant else {}}}


def sriov_policy(name: str, selector: dict, resource: str, **extra) -> dict:
    return {"apiVersion": "sriovnetwork.openshift.io/v1", "kind": "SriovNetworkNodePolicy", "metadata": {"name": name, "namespace": "net"},
            "spec": {"nodeSelector": selector, "resourceName": resource, "numVfs": 8, "nicSelector": {"pfNames": ["x"]}, **extra}}


def pod(namespace: str, annotations: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": namespace, "annotations": annotations}, "spec": {"containers": []}}


def job(namespace: str, networks: str) -> dict:
    template = {"metadata": {"annotations": {checks.NETWORKS_ANNOTATION: networks}}, "spec": {"containers": []}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": namespace}, "spec": {"template": template}}


FLEET = [
    ns("tenant-a", "a"), ns("tenant-b", "b"), ns("net"),
    node("n1", "ib"), node("n2", "ib"), node("r1", "roce-par"), node("r2", "roce-lon", "lon1"),
    sriov_policy("ib", {POOL: "ib"}, "ib_vf"), sriov_policy("roce-par", {POOL: "roce-par"}, "par_vf"), sriov_policy("roce-lon", {POOL: "roce-lon"}, "lon_vf"),
]


def admission_policy(action: str = "Enforce") -> dict:
    spec = network.admission_policy_spec("net")
    for rule in spec["rules"]:
        rule["validate"]["failureAction"] = action
    return {"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": checks.ADMISSION_POLICY}, "spec": spec}


def exempting(*subjects: dict) -> dict:
    """The admission policy with its UPDATE rule's exemption replaced."""
    policy = admission_policy()
    rule = next(r for r in policy["spec"]["rules"] if r["name"] == checks.FIXED_NETWORKS_RULE)
    rule["exclude"] = {"any": [{"subjects": list(subjects)}]}
    return policy


def exempting_by(exclude: dict) -> dict:
    policy = admission_policy()
    next(r for r in policy["spec"]["rules"] if r["name"] == checks.FIXED_NETWORKS_RULE)["exclude"] = exclude
    return policy


def account(name: str, namespace: str, kind: str = "ServiceAccount") -> dict:
    return {"kind": kind, "name": name, "namespace": namespace}


def world(*objs: dict) -> Rendered:
    manifests = [Manifest(o, "test", None, f"test::{i}") for i, o in enumerate([*FLEET, *objs])]
    return Rendered(None, "1.34", manifests, [])


def found(check, rendered: Rendered) -> list[str]:
    return [f"{f.ref}: {f.message}" for f in check(rendered, None)]


KEY_ROWS = [
    ("the default partition", [nad("tenant-a", ib("0x7fff"))], "default partition"),
    ("no partition key", [nad("tenant-a", ib(None))], "no partition key"),
    ("a 16-bit key", [nad("tenant-a", ib("0xffff"))], "outside the 15-bit keys"),
    ("a key that is no number", [nad("tenant-a", ib("0xzz"))], "is not a number"),
    ("two tenants on one key", [nad("tenant-a", ib("0x10")), nad("tenant-b", ib(16))], "also the key of network(s) in namespace(s) tenant-b"),
    ("an untagged RoCE network", [nad("tenant-a", roce(0), "nvidia.com/par_vf")], "no VLAN"),
    ("VLAN 4095", [nad("tenant-a", roce(4095), "nvidia.com/par_vf")], "outside 2-4094"),
    ("the default VLAN 1", [nad("tenant-a", roce(1), "nvidia.com/par_vf")], "outside 2-4094"),
    ("two tenants on one VLAN of a site", [nad("tenant-a", roce(7), "nvidia.com/par_vf"), nad("tenant-b", roce(7), "nvidia.com/par_vf")], "VLAN 7 on the RoCE fabric of par1"),
    ("an unreadable config", [nad("tenant-a", "{not json")], "not a JSON CNI configuration"),
    ("two tenants' VPCs on one uplink VLAN", [nad("tenant-a", {"type": "vlan", "master": "bond0", "vlanId": 9}, name="vpc-a"),
                                             nad("tenant-b", {"type": "vlan", "master": "bond0", "vlanId": 9}, name="vpc-b")], "VLAN 9 on uplink bond0"),
]
KEY_ACCEPTS = [
    ("two tenants on two keys", [nad("tenant-a", ib("0x10")), nad("tenant-b", ib("0x11"))]),
    ("one tenant's key on two of its networks", [nad("tenant-a", ib("0x10")), nad("tenant-a", ib("0x10"), name="other")]),
    ("the lowest and highest VLANs", [nad("tenant-a", roce(2), "nvidia.com/par_vf"), nad("tenant-b", roce(4094), "nvidia.com/par_vf")]),
    ("one VLAN on two sites' fabrics", [nad("tenant-a", roce(7), "nvidia.com/par_vf"), nad("tenant-b", roce(7), "nvidia.com/lon_vf")]),
    ("a network that is not RDMA", [nad("tenant-a", {"type": "macvlan"})]),
]


@pytest.mark.parametrize(("objs", "expected"), [r[1:] for r in KEY_ROWS], ids=[r[0] for r in KEY_ROWS])
def test_fabric_keys_flags(objs, expected):
    assert any(expected in line for line in found(checks.fabric_keys, world(*objs))), found(checks.fabric_keys, world(*objs))


@pytest.mark.parametrize("objs", [r[1] for r in KEY_ACCEPTS], ids=[r[0] for r in KEY_ACCEPTS])
def test_fabric_keys_accepts(objs):
    assert found(checks.fabric_keys, world(*objs)) == []


OWN = nad("tenant-a", ib("0x10"))
ATTACH_ROWS = [
    ("an RDMA network in a platform namespace", [nad("net", ib("0x10")), admission_policy()], "outside every tenant's namespace"),
    ("a pod naming another namespace's network", [OWN, admission_policy(), pod("tenant-a", {checks.NETWORKS_ANNOTATION: "tenant-b/rdma"})], "attach network tenant-b/rdma"),
    ("a job template naming one in JSON", [OWN, admission_policy(), job("tenant-a", '[{"name": "rdma", "namespace": "tenant-b"}]')], "attach network tenant-b/rdma"),
    ("a pod replacing its pod network", [OWN, admission_policy(), pod("tenant-a", {checks.DEFAULT_NETWORK_ANNOTATION: "tenant-b/rdma"})], "replace their pod network"),
    ("an unreadable annotation", [OWN, admission_policy(), pod("tenant-a", {checks.NETWORKS_ANNOTATION: "[oops"})], "cannot be read"),
    ("tenant networks without the admission policy", [OWN], "admission policy tenant-secondary-networks is missing"),
    ("the admission policy in audit mode", [OWN, admission_policy("Audit")], "does not enforce networks-in-own-namespace"),
    ("networks editable after creation", [OWN, {**admission_policy(), "spec": {**admission_policy()["spec"], "rules": [
        r for r in admission_policy()["spec"]["rules"] if r["name"] != checks.FIXED_NETWORKS_RULE]}}], "does not enforce networks-fixed-after-create"),
    ("ib-kubernetes exempted in a tenant's namespace", [OWN, exempting(account("ib-kubernetes", "tenant-a"))], "namespace tenant-a, which a tenant can create"),
    ("an exempted namespace wildcard", [OWN, exempting(account("ib-kubernetes", "*"))], "namespace *, which a tenant can create"),
    ("another service account exempted", [OWN, exempting(account("default", "net"))], "exempts ServiceAccount net/default"),
    ("a group exempted", [OWN, exempting(account("system:authenticated", "", "Group"))], "exempts Group /system:authenticated"),
    ("an exemption by role", [OWN, {**admission_policy(), "spec": {**admission_policy()["spec"], "rules": [
        {**r, "exclude": {"any": [{"clusterRoles": ["edit"]}]}} for r in admission_policy()["spec"]["rules"]]}}], "exempts requests matching"),
    ("an exemption by `all`", [OWN, exempting_by({"all": [{"subjects": [account("ib-kubernetes", "net")]}]})], "exempts requests by"),
    ("an empty exemption", [OWN, exempting_by({"any": []})], "exempts requests by"),
    ("ib-kubernetes with a role besides", [OWN, exempting_by({"any": [{"subjects": [account("ib-kubernetes", "net")], "roles": ["x"]}]})],
     "exempts requests matching"),
    ("a second exempted block", [OWN, exempting_by({"any": [{"clusterRoles": ["edit"]}, {"subjects": [account("default", "net")]}]})],
     "exempts ServiceAccount net/default"),
]
ATTACH_ACCEPTS = [
    ("own networks by short name", [OWN, admission_policy(), pod("tenant-a", {checks.NETWORKS_ANNOTATION: "rdma@net1, rdma"})]),
    ("own network by namespace/name", [OWN, admission_policy(), job("tenant-a", "tenant-a/rdma")]),
    ("a platform pod naming any network", [OWN, admission_policy(), pod("net", {checks.NETWORKS_ANNOTATION: "tenant-a/rdma"})]),
    ("ib-kubernetes exempted in the operator's namespace", [OWN, exempting(account("ib-kubernetes", "net"))]),
]


@pytest.mark.parametrize(("objs", "expected"), [r[1:] for r in ATTACH_ROWS], ids=[r[0] for r in ATTACH_ROWS])
def test_fabric_attachments_flags(objs, expected):
    assert any(expected in line for line in found(checks.fabric_attachments, world(*objs))), found(checks.fabric_attachments, world(*objs))


def test_a_foreign_network_is_reported_once_per_reference():
    assert found(checks.fabric_attachments, world(OWN, admission_policy(), pod("tenant-a", {checks.NETWORKS_ANNOTATION: "tenant-b/rdma"}))) == [
        "Pod/tenant-a/p: tenant a's pods attach network tenant-b/rdma, of another namespace"]


@pytest.mark.parametrize("objs", [r[1] for r in ATTACH_ACCEPTS], ids=[r[0] for r in ATTACH_ACCEPTS])
def test_fabric_attachments_accepts(objs):
    assert found(checks.fabric_attachments, world(*objs)) == []


# --------------------------------------------------------------------------- DRA claims


VF_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "ib-rdma-vf"},
            "spec": {"selectors": [{"cel": {"expression": network.vf_selector("ib")}}]}}
GPU_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "h100-80gb-whole"},
             "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}
PAIRED = network.paired_claim_spec("ib", "H100-80GB", "tenant-a")


def claim(kind: str = "ResourceClaimTemplate", namespace: str = "tenant-a", **devices) -> dict:
    body = copy.deepcopy(PAIRED)
    body["devices"].update(devices)
    spec = {"spec": body} if kind == "ResourceClaimTemplate" else body
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": "pair", "namespace": namespace}, "spec": spec}


def request(name: str, device_class: str, count: int = 1, legacy: bool = False) -> dict:
    return {"name": name, "deviceClassName": device_class, "count": count} if legacy else {"name": name, "exactly": {"deviceClassName": device_class, "count": count}}


def vf_config(namespace: str) -> list[dict]:
    return [{"requests": ["nic"], "opaque": {"driver": checks.SRIOV_DRA_DRIVER, "parameters": {"kind": "VfConfig", "netAttachDefName": "rdma-ib", "netAttachDefNamespace": namespace}}}]


NOT_ALIGNED = "not constrained to one PCIe root"
CLAIM_ROWS = [
    ("a pair without constraint", [GPU_CLASS, VF_CLASS, claim(constraints=[])], NOT_ALIGNED),
    ("a pair matched on another attribute", [GPU_CLASS, VF_CLASS, claim(constraints=[{"matchAttribute": "gpu.nvidia.com/productName"}])], NOT_ALIGNED),
    ("a constraint leaving the VF out", [GPU_CLASS, VF_CLASS, claim(constraints=[{"requests": ["gpu"], "matchAttribute": checks.PCIE_ROOT}])], NOT_ALIGNED),
    ("a second VF left out", [GPU_CLASS, VF_CLASS, claim(requests=[*PAIRED["devices"]["requests"], request("nic2", "ib-rdma-vf")])], "nic, nic2 are not"),
    ("a claim (not a template)", [GPU_CLASS, VF_CLASS, claim("ResourceClaim", constraints=[])], NOT_ALIGNED),
    ("the chart's GPU class, v1beta1 requests", [VF_CLASS, claim(requests=[request("gpu", "gpu.nvidia.com", legacy=True), request("nic", "ib-rdma-vf", legacy=True)],
                                                                 constraints=[])], NOT_ALIGNED),
    ("a VF on another tenant's network", [GPU_CLASS, VF_CLASS, claim(config=vf_config("tenant-b"))], "network tenant-b/rdma-ib, of another namespace"),
    ("after the GPU driver's config", [GPU_CLASS, VF_CLASS, claim(config=[{"requests": ["gpu"], "opaque": {"driver": checks.GPU_DRA_DRIVER, "parameters": {}}},
                                                                          *vf_config("tenant-b")])], "of another namespace"),
]
CLAIM_ACCEPTS = [
    ("the rendered pair", [GPU_CLASS, VF_CLASS, claim()]),
    ("a constraint over every request", [GPU_CLASS, VF_CLASS, claim(constraints=[{"matchAttribute": checks.PCIE_ROOT}])]),
    ("GPUs alone", [GPU_CLASS, claim(requests=[request("gpu", "h100-80gb-whole", 8)], constraints=[], config=[])]),
    ("a VF alone", [VF_CLASS, claim(requests=[request("nic", "ib-rdma-vf")], constraints=[], config=[])]),
    ("a VF on its own namespace's network", [GPU_CLASS, VF_CLASS, claim(config=vf_config("tenant-a"))]),
]


@pytest.mark.parametrize(("objs", "expected"), [r[1:] for r in CLAIM_ROWS], ids=[r[0] for r in CLAIM_ROWS])
def test_claims_aligned_flags(objs, expected):
    lines = found(checks.claims_aligned, world(*objs))
    assert len(lines) == 1 and expected in lines[0], lines


@pytest.mark.parametrize("objs", [r[1] for r in CLAIM_ACCEPTS], ids=[r[0] for r in CLAIM_ACCEPTS])
def test_claims_aligned_accepts(objs):
    assert found(checks.claims_aligned, world(*objs)) == []


def nic_node_policy(selector: dict | None, **spec) -> dict:
    body = {"nodeSelector": selector, **spec} if selector is not None else dict(spec)
    return {"apiVersion": "mellanox.com/v1alpha1", "kind": "NicNodePolicy", "metadata": {"name": "p"}, "spec": body}


SELECTOR_ROWS = [
    ("two pools' nodes", [nic_node_policy({SITE: "par1"})], "selects nodes of several pools (ib, roce-par)"),
    ("no node", [nic_node_policy({POOL: "gone"})], "selects no node"),
    ("no selector", [nic_node_policy(None)], "has no nodeSelector"),
    ("VFs without their NUMA node", [sriov_policy("x", {POOL: "ib"}, "ib_vf", excludeTopology=True)], "excludeTopology"),
    ("devices exposed cluster-wide", [{"apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy", "metadata": {"name": "nic-cluster-policy"},
                                        "spec": {"rdmaSharedDevicePlugin": {"image": "x"}}}], "exposes devices cluster-wide"),
]


def test_a_selector_of_part_of_a_pool_is_flagged():
    labelled = world(nic_node_policy({POOL: "ib", "rack": "r1"}))
    labelled.manifests[3].obj["metadata"]["labels"]["rack"] = "r1"
    assert found(checks.nic_policies_select_pools, labelled) == ["NicNodePolicy/p: selects 1 of pool ib's nodes; left out: n2"]


@pytest.mark.parametrize(("objs", "expected"), [r[1:] for r in SELECTOR_ROWS], ids=[r[0] for r in SELECTOR_ROWS])
def test_nic_policies_select_pools_flags(objs, expected):
    lines = found(checks.nic_policies_select_pools, world(*objs))
    assert any(expected in line for line in lines), lines


def test_nic_policies_select_pools_accepts_one_pool_exactly():
    assert found(checks.nic_policies_select_pools, world(nic_node_policy({POOL: "ib"}))) == []


def test_dev_passes_the_fabric_checks(dev):
    for check in (checks.fabric_keys, checks.fabric_attachments, checks.nic_policies_select_pools):
        assert found(check, dev) == []


def test_a_tenant_network_moved_to_the_platform_and_a_shared_key_are_found_in_dev(dev):
    clone = Rendered(dev.config, dev.kubernetes_version, copy.deepcopy(dev.manifests), dev.inventory)
    for m in clone.manifests:
        if m.kind == "NetworkAttachmentDefinition" and m.namespace == "tenant-assistant":
            m.obj["spec"]["config"] = m.obj["spec"]["config"].replace('"vlan": 300', '"vlan": 301')
    assert [f.ref for f in checks.fabric_keys(clone, None)] == [
        "NetworkAttachmentDefinition/tenant-assistant/rdma-a100-mig", "NetworkAttachmentDefinition/tenant-search/rdma-a100-mig"]


# --------------------------------------------------------------------------- CrossGuard


def crossguard(*objs: dict) -> dict[str, dict[str, list[str]]]:
    def program() -> None:
        tenant_namespace("tenant-a", tenant="a")
        tenant_namespace("tenant-b", tenant="b")
        for i, obj in enumerate(objs):
            k8s.apiextensions.CustomResource(
                f"obj-{i}", api_version=obj["apiVersion"], kind=obj["kind"],
                metadata=obj["metadata"], spec=obj.get("spec"),
            )
    graph = stack(program)
    return {p: violations(graph, p) for p in ("fabric-keys-apart", "fabric-attachments-own", "nic-policies-one-pool", "dra-claims-aligned")}


CROSSGUARD_ROWS = [
    ("fabric-keys-apart", [nad("tenant-a", ib("0x7fff")), admission_policy()], "default partition"),
    ("fabric-keys-apart", [nad("tenant-a", ib("0x10")), nad("tenant-b", ib("0x10")), admission_policy()], "also the key"),
    ("fabric-attachments-own", [nad("net", ib("0x10"))], "outside every tenant's namespace"),
    ("fabric-attachments-own", [nad("tenant-a", ib("0x10"))], "is missing"),
    ("nic-policies-one-pool", [nic_node_policy(None)], "has no nodeSelector"),
    ("dra-claims-aligned", [GPU_CLASS, VF_CLASS, claim(constraints=[])], "not constrained to one PCIe root"),
]


@pytest.mark.parametrize(("policy", "objs", "expected"), CROSSGUARD_ROWS, ids=[f"{r[0]}-{r[2]}" for r in CROSSGUARD_ROWS])
def test_crossguard_flags(policy, objs, expected):
    messages = [m for ms in crossguard(*objs)[policy].values() for m in ms]
    assert any(expected in m for m in messages), messages


def test_crossguard_accepts_tenants_apart():
    assert all(not v for v in crossguard(nad("tenant-a", ib("0x10")), nad("tenant-b", ib("0x11")), admission_policy()).values())


# --------------------------------------------------------------------------- admission


ADMISSION_ROWS = [
    ("its own network by name", "tenant-search", {checks.NETWORKS_ANNOTATION: "rdma-h100-train"}, []),
    ("its own networks with interfaces", "tenant-search", {checks.NETWORKS_ANNOTATION: "rdma-h100-train@ib0,rdma-a100-mig"}, []),
    ("another tenant's network", "tenant-search", {checks.NETWORKS_ANNOTATION: "tenant-assistant/rdma-a100-mig"}, [checks.SHORT_FORM_RULE]),
    ("the JSON form", "tenant-search", {checks.NETWORKS_ANNOTATION: '[{"name": "rdma-a100-mig", "namespace": "tenant-assistant"}]'}, [checks.SHORT_FORM_RULE]),
    ("a replaced pod network", "tenant-search", {checks.DEFAULT_NETWORK_ANNOTATION: "kube-system/x"}, [checks.DEFAULT_NETWORK_RULE]),
    ("a platform pod", "nvidia-network-operator", {checks.NETWORKS_ANNOTATION: "tenant-search/rdma-h100-train"}, []),
]


def test_the_rendered_exemption_is_ib_kubernetes_account_alone(dev):
    rules = one(dev, "ClusterPolicy", checks.ADMISSION_POLICY)["spec"]["rules"]
    assert [r.get("exclude") for r in rules] == [None, None, {"any": [{"subjects": [
        {"kind": "ServiceAccount", "name": checks.IB_KUBERNETES_ACCOUNT, "namespace": "nvidia-network-operator"}]}]}]


GUIDS = '[{"name": "rdma-h100-train", "cni-args": {"guid": "02:00:00:00:00:00:00:05", "mellanox.infiniband.app": "configured"}}]'
IB_KUBERNETES = "system:serviceaccount:nvidia-network-operator:ib-kubernetes"
UPDATE_ROWS = [
    # (case, namespace, user, annotations before, after, refused)
    ("ib-kubernetes adding a GUID", "tenant-search", IB_KUBERNETES, "rdma-h100-train", GUIDS, []),
    ("a tenant relabelling its pod, GUIDs in place", "tenant-search", "alice", GUIDS, GUIDS, []),
    ("a tenant writing GUIDs itself", "tenant-search", "alice", "rdma-h100-train", GUIDS, [checks.FIXED_NETWORKS_RULE]),
    ("a tenant pointing at another tenant's network", "tenant-search", "alice", "rdma-h100-train", "tenant-assistant/rdma-a100-mig", [checks.FIXED_NETWORKS_RULE]),
    ("a tenant's own account named ib-kubernetes", "tenant-search", "system:serviceaccount:tenant-search:ib-kubernetes", "rdma-h100-train", GUIDS,
     [checks.FIXED_NETWORKS_RULE]),
    ("another platform account", "tenant-search", "system:serviceaccount:nvidia-network-operator:default", "rdma-h100-train", GUIDS,
     [checks.FIXED_NETWORKS_RULE]),
    ("a tenant adding a network later", "tenant-search", "alice", None, "rdma-h100-train", [checks.FIXED_NETWORKS_RULE]),
]


@pytest.mark.parametrize(("namespace", "user", "before", "after", "refused"), [r[1:] for r in UPDATE_ROWS], ids=[r[0] for r in UPDATE_ROWS])
def test_admission_of_network_updates(dev, namespace, user, before, after, refused):
    policy = one(dev, "ClusterPolicy", checks.ADMISSION_POLICY)
    labels = next(n["metadata"].get("labels") or {} for n in objects(dev, "Namespace") if n["metadata"]["name"] == namespace)

    def annotated(value):
        return pod(namespace, {checks.NETWORKS_ANNOTATION: value} if value is not None else {})

    request = Request(annotated(after), namespace_labels=labels, operation="UPDATE", username=user, old_object=annotated(before))
    assert refusals([policy], request) == [f"{checks.ADMISSION_POLICY}/{rule}" for rule in refused]


@pytest.mark.parametrize(("namespace", "annotations", "refused"), [r[1:] for r in ADMISSION_ROWS], ids=[r[0] for r in ADMISSION_ROWS])
def test_admission_of_secondary_networks(dev, namespace, annotations, refused):
    policy = one(dev, "ClusterPolicy", checks.ADMISSION_POLICY)
    labels = next(n["metadata"].get("labels") or {} for n in objects(dev, "Namespace") if n["metadata"]["name"] == namespace)
    request = Request(pod(namespace, annotations), namespace_labels=labels)
    assert refusals([policy], request) == [f"{checks.ADMISSION_POLICY}/{rule}" for rule in refused]
