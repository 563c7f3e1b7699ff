"""KubeVirt: the release manifests are pinned (URL and digest, never downloaded by the render), the
KubeVirt CR permits exactly the VM pools' passthrough GPUs, their resource name is in every
tenant's quota and in the Kueue flavor, a tenant's VMs run on its own trust domain's nodes with
disks on its storage class, bad VM requests are refused with their paths, and the checks and
policies fail when a VM asks for a device outside permittedHostDevices or a quota misses a name.
On a DRA pool a VM claims its GPUs (`vfio.gpu.nvidia.com`) through a template of its own, with the
DRA gates on only then, justified, and its tenant's quota capping the claims."""

from __future__ import annotations

import copy

import pytest
import yaml

from ai_factory.components import kubevirt
from ai_factory.factory.checking import vms as vm_checks
from ai_factory.factory.model.catalog import MANIFESTS
from ai_factory.factory.planning.placement import WORKLOAD_CONFIG_LABEL
from tests.conftest import one
from tests.policy_stacks import custom, namespace, stack, violations
from tests.test_bad_input import DEV_TEXT, problems, refused_render

H100 = "nvidia.com/GH100_H100_SXM5_80GB"


def test_manifest_pins_are_the_releases_recorded_upstream(oracles):
    for key, pin in MANIFESTS.items():
        source = yaml.safe_load((oracles.root / pin.oracle_dir / "SOURCE.yaml").read_text())
        text = yaml.safe_dump(source)
        assert pin.version in text and pin.digest.removeprefix("git:") in text, key
        assert pin.url.startswith("https://github.com/kubevirt/") and f"/download/{pin.version}/" in pin.url, key


def test_the_operators_are_applied_from_the_pinned_urls_without_download(dev):
    files = {r.inputs.get("file") for r in dev.graph.resources if r.type == "kubernetes:yaml/v2:ConfigFile"}
    assert files == {pin.url for pin in MANIFESTS.values()}


def test_kubevirt_permits_exactly_the_vm_pools_gpus_with_no_feature_gate(dev):
    spec = one(dev, "KubeVirt", "kubevirt")["spec"]["configuration"]
    assert spec["permittedHostDevices"] == {"pciHostDevices": [{"pciVendorSelector": "10DE:2330", "resourceName": H100, "externalResourceProvider": True}]}
    assert spec["developerConfiguration"]["featureGates"] == []
    assert "annotations" not in one(dev, "KubeVirt", "kubevirt")["metadata"]  # no gate, no exception


def test_only_the_vm_pools_nodes_are_switched_to_passthrough(dev):
    switched = {m.name for m in dev.manifests if m.kind == "Node" and WORKLOAD_CONFIG_LABEL in m.obj["metadata"].get("labels", {})}
    assert switched == {"h100-vm-000"}
    values = one(dev, "HelmRelease", "gpu-operator")["spec"]["values"]
    assert values["sandboxWorkloads"] == {"enabled": True, "defaultWorkload": "container", "mode": "kubevirt"}


def test_every_tenant_quota_caps_the_vm_gpu_name_at_its_grant(dev):
    quotas = {m.namespace: m.obj["spec"]["hard"] for m in dev.manifests if m.kind == "ResourceQuota" and m.name == "tenant-quota"}
    assert {ns: hard[f"requests.{H100}"] for ns, hard in quotas.items()} == {"tenant-search": "2", "tenant-assistant": "0", "tenant-partner-acme": "0"}
    queue = one(dev, "ClusterQueue", "tenant-search")["spec"]
    assert H100 in vm_checks.covered_resources(queue)


def test_instance_types_go_up_to_the_grant_and_the_vm_runs_on_its_domains_nodes(dev):
    types = {m.name: m.obj["spec"] for m in dev.manifests if m.kind == "VirtualMachineInstancetype" and m.namespace == "tenant-search"}
    assert sorted(types) == ["h100-vm-1gpu", "h100-vm-2gpu"]
    assert types["h100-vm-2gpu"]["gpus"] == [{"name": "gpu0", "deviceName": H100}, {"name": "gpu1", "deviceName": H100}]
    vm = one(dev, "VirtualMachine", "workstation")["spec"]
    assert vm["instancetype"] == {"kind": "VirtualMachineInstancetype", "name": "h100-vm-2gpu"}
    assert vm["dataVolumeTemplates"][0]["spec"]["storage"]["storageClassName"] == "ceph-block"
    template = vm["template"]
    assert template["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"
    hosts = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert hosts["values"] == ["h100-vm-000"]


def test_a_low_trust_tenants_vm_lands_on_its_dedicated_node(dev_raw):
    from tests.conftest import render

    raw, secrets = dev_raw
    raw = copy.deepcopy(raw)
    raw["tenants"][2]["gpus"].append({"pool": "h100-vm", "count": 8})
    raw["tenants"][0]["gpus"].pop()  # search's VM grant leaves the pool to the partner
    raw["layers"]["kubevirt"]["tenants"] = [{"tenant": "partner-acme", "storage_class": "ceph-block", "vms": [{"name": "box", "pool": "h100-vm", "gpus": 8, "disk": {"image": "docker://r/i:1"}}]}]
    rendered = render(raw, secrets)
    template = one(rendered, "VirtualMachine", "box")["spec"]["template"]["spec"]
    assert template["nodeSelector"]["ai-factory.io/dedicated"] == "partner-acme"
    assert {"key": "ai-factory.io/dedicated", "operator": "Equal", "value": "partner-acme", "effect": "NoSchedule"} in template["tolerations"]


def test_a_vm_of_an_unusual_size_gets_an_instance_type_of_its_size(raw):
    from ai_factory.factory.model.loading import validate
    from ai_factory.factory.planning.from_config import plan_for

    raw["tenants"][0]["gpus"][-1]["count"] = 3
    _vm(raw).update(gpus=3)
    cfg = validate(raw)
    hook = kubevirt.KubeVirtTenantHook.from_config(cfg, plan_for(cfg))
    assert [t.name for t in hook.tenants[0].instancetypes] == ["h100-vm-1gpu", "h100-vm-2gpu", "h100-vm-3gpu"]
    assert hook.tenants[0].vms[0].instancetype == "h100-vm-3gpu"


def test_offline_checks_accept_the_dev_render(dev):
    checks = (vm_checks.vm_devices_permitted, vm_checks.vm_resources_quotaed, vm_checks.vm_dra_claims)
    assert [f.message for check in checks for f in check(dev, None)] == []


# --------------------------------------------------------------------------- VMs on a DRA pool

VFIO = vm_checks.VFIO_DEVICE_CLASS


def _dra_vm_pool(raw: dict) -> dict:
    """Dev with its VM pool on DRA: search's 2-GPU workstation VM then claims its GPUs."""
    next(p for p in raw["fleet"]["pools"] if p["name"] == "h100-vm")["sharing"] = "dra"
    return raw


@pytest.fixture(scope="module")
def dra_vm(dev_raw):
    from tests.conftest import render

    raw, secrets = dev_raw
    return render(_dra_vm_pool(copy.deepcopy(raw)), secrets)


def test_a_dra_pools_vm_claims_exactly_its_gpus_of_the_vfio_class_on_its_domains_nodes(dra_vm, oracles):
    template = one(dra_vm, "ResourceClaimTemplate", "workstation-gpus")
    requests = template["spec"]["spec"]["devices"]["requests"]
    assert [(r["name"], r["exactly"]) for r in requests] == [(f"gpu{i}", {"deviceClassName": VFIO, "allocationMode": "ExactCount", "count": 1}) for i in range(2)]
    vm = one(dra_vm, "VirtualMachine", "workstation")
    spec = vm["spec"]["template"]["spec"]
    assert spec["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "workstation-gpus"}]
    assert spec["domain"]["devices"]["gpus"] == [{"name": f"gpu{i}", "claimName": "gpus", "requestName": f"gpu{i}"} for i in range(2)]
    assert "gpus" not in one(dra_vm, "VirtualMachineInstancetype", "h100-vm-2gpu")["spec"]  # the claim gives them
    hosts = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert hosts["values"] == ["h100-vm-000"]
    assert template["metadata"]["namespace"] == vm["metadata"]["namespace"] == "tenant-search"
    for obj in (template, vm, one(dra_vm, "VirtualMachineInstancetype", "h100-vm-2gpu"), one(dra_vm, "KubeVirt", "kubevirt")):
        assert oracles.validate_object(obj, "1.34") == [], obj["kind"]


def test_the_dra_gates_are_on_with_their_reasons_only_when_a_vm_claims_dra_gpus(dra_vm, raw, oracles):
    import json

    from ai_factory.components.dra import DraArgs
    from ai_factory.factory.model.loading import validate

    kv = one(dra_vm, "KubeVirt", "kubevirt")
    assert kv["spec"]["configuration"]["developerConfiguration"]["featureGates"] == ["GPUsWithDRA"]
    assert json.loads(kv["metadata"]["annotations"][vm_checks.GATE_EXCEPTIONS_ANNOTATION]) == {"GPUsWithDRA": vm_checks.JUSTIFIED_GATES["GPUsWithDRA"]}
    assert kv["spec"]["configuration"]["permittedHostDevices"] == {"pciHostDevices": []}
    values = one(dra_vm, "HelmRelease", "dra-driver-nvidia-gpu")["spec"]["values"]
    assert values["featureGates"] == {"PassthroughSupport": True}
    assert oracles.validate_values("nvidia-dra-driver-gpu/chart-release", values) == []
    _dra_vm_pool(raw)["layers"]["kubevirt"]["tenants"][0]["vms"] = []
    cfg = validate(raw)
    assert kubevirt.feature_gates(cfg) == () and DraArgs.from_config(cfg).passthrough is False


def test_the_dra_vms_gpus_are_quotaed_and_queued_like_its_pods_dra_gpus(dra_vm):
    quotas = {m.namespace: m.obj["spec"]["hard"] for m in dra_vm.manifests if m.kind == "ResourceQuota" and m.name == "tenant-quota"}
    assert {ns: hard[vm_checks.VFIO_QUOTA] for ns, hard in quotas.items()} == {"tenant-search": "2", "tenant-assistant": "0", "tenant-partner-acme": "0"}
    config = yaml.safe_load(one(dra_vm, "HelmRelease", "kueue")["spec"]["values"]["managerConfig"]["controllerManagerConfigYaml"])
    assert config["resources"]["deviceClassMappings"] == [{"name": "nvidia.com/gpu", "deviceClassNames": ["h100-80gb-whole", VFIO]}]
    switched = {m.name for m in dra_vm.manifests if m.kind == "Node" and WORKLOAD_CONFIG_LABEL in m.obj["metadata"].get("labels", {})}
    assert switched == set()  # its GPUs serve pods and VMs, one claim at a time


def test_offline_checks_accept_the_dra_vm_render(dra_vm):
    checks = (vm_checks.vm_devices_permitted, vm_checks.vm_resources_quotaed, vm_checks.vm_dra_claims)
    assert [f.message for check in checks for f in check(dra_vm, None)] == []


# --------------------------------------------------------------------------- bad input


def _vm(raw: dict) -> dict:
    return raw["layers"]["kubevirt"]["tenants"][0]["vms"][0]


BAD_REQUESTS = [
    ("pool-not-marked", lambda r: _vm(r).update(pool="h100-train"), "layers.kubevirt.tenants[0].vms[0].pool: pool 'h100-train' is not marked for VMs"),
    (
        "low-trust-on-a-shared-node",
        lambda r: (r["layers"]["kubevirt"]["pools"].update({"a100-mig": {}}), r["layers"]["kubevirt"]["tenants"].append(
            {"tenant": "partner-acme", "storage_class": "ceph-block", "vms": [{"name": "box", "pool": "a100-mig", "disk": {"image": "docker://r/i:1"}}]}
        ), r["tenants"][2]["gpus"].append({"pool": "a100-mig", "mig": {"1g.10gb": 1}})),
        "layers.kubevirt.tenants[1].vms[0].pool: tenant 'partner-acme' is low trust and pool 'a100-mig' shares its nodes (mig)",
    ),
    ("marked-pool-shares", lambda r: r["layers"]["kubevirt"]["pools"].update({"l40s-infer": {}}), "layers.kubevirt.pools.l40s-infer: pool 'l40s-infer' shares GPUs by hami"),
    ("no-grant", lambda r: r["tenants"][0]["gpus"].pop(), "layers.kubevirt.tenants[0].vms[0].pool: tenant 'search' has no GPU grant on pool 'h100-vm'"),
    ("above-grant", lambda r: _vm(r).update(gpus=4), "layers.kubevirt.tenants[0].vms: 4 GPUs of VMs on 'h100-vm', the tenant's grant there is 2"),
    ("unknown-device-name", lambda r: r["layers"]["kubevirt"]["pools"]["h100-vm"].update(pci_device_id="0x233110DE"), "layers.kubevirt.pools.h100-vm.resource_name: required"),
    ("device-of-another-model", lambda r: r["layers"]["kubevirt"]["pools"]["h100-vm"].update(pci_device_id="0x232110DE"), "layers.kubevirt.pools.h100-vm.pci_device_id: '0x232110DE' is not a H100-80GB"),
    ("unknown-tenant", lambda r: r["layers"]["kubevirt"]["tenants"][0].update(tenant="serch"), "layers.kubevirt.tenants[0].tenant: unknown tenant 'serch' (did you mean 'search'?)"),
    ("layer-off", lambda r: r["layers"]["kubevirt"].update(enabled=False), "layers.kubevirt: pools or tenants given"),
    ("dra-pool-with-device-id", lambda r: (_dra_vm_pool(r), r["layers"]["kubevirt"]["pools"]["h100-vm"].update(pci_device_id="0x233010DE")), "layers.kubevirt.pools.h100-vm.pci_device_id: not used on a DRA pool"),
    ("dra-pool-with-resource-name", lambda r: (_dra_vm_pool(r), r["layers"]["kubevirt"]["pools"]["h100-vm"].update(resource_name="nvidia.com/H100")), "layers.kubevirt.pools.h100-vm.resource_name: not used on a DRA pool"),
    ("vm-twice", lambda r: r["layers"]["kubevirt"]["tenants"][0]["vms"].append(copy.deepcopy(_vm(r))), "layers.kubevirt.tenants[0].vms[1].name: VM 'workstation' is defined twice"),
]


@pytest.mark.parametrize(("change", "expected"), [(c, e) for _, c, e in BAD_REQUESTS], ids=[i for i, _, _ in BAD_REQUESTS])
def test_a_bad_vm_request_is_refused_with_its_path(raw, change, expected):
    change(raw)
    assert any(p.startswith(expected) for p in problems(raw)), problems(raw)


def test_a_low_trust_tenants_vm_on_a_dra_pool_lands_on_its_dedicated_node(raw):
    from ai_factory.factory.model.loading import validate
    from ai_factory.factory.planning.from_config import plan_for

    _dra_vm_pool(raw)["tenants"][2]["gpus"].append({"pool": "h100-vm", "count": 8})
    raw["tenants"][0]["gpus"].pop()
    raw["layers"]["kubevirt"]["tenants"] = [{"tenant": "partner-acme", "storage_class": "ceph-block", "vms": [{"name": "box", "pool": "h100-vm", "gpus": 8, "disk": {"image": "docker://r/i:1"}}]}]
    cfg = validate(raw)  # accepted: the planner gives it the node whole, as on an exclusive pool
    vm = kubevirt.KubeVirtTenantHook.from_config(cfg, plan_for(cfg)).tenants[0].vms[0]
    assert vm.dra_gpus == 8 and vm.placement.node_labels["ai-factory.io/dedicated"] == "partner-acme"
    assert {"key": "ai-factory.io/dedicated", "operator": "Equal", "value": "partner-acme", "effect": "NoSchedule"} in vm.placement.tolerations


def test_the_issues_bad_vm_requests_are_reported_together_with_exit_2(tmp_path):
    document = yaml.safe_load(DEV_TEXT)
    config = document["config"]
    raw = {"layers": config["ai-factory:layers"], "tenants": config["ai-factory:tenants"]}
    for _, change, _ in BAD_REQUESTS[:2]:
        change(raw)
    stderr = refused_render(tmp_path, yaml.safe_dump(document, sort_keys=False))
    for name, _, expected in BAD_REQUESTS[:2]:
        assert expected in stderr, name


# --------------------------------------------------------------------------- checks and policies

PERMITTED = {H100}
TYPES = {"one": {"gpus": [{"name": "g", "deviceName": H100}]}, "bad": {"gpus": [{"name": "g", "deviceName": "nvidia.com/gpu"}]}}


def _vm_spec(instancetype: str | None = "one", devices: dict | None = None, kind: str = "VirtualMachineInstancetype") -> dict:
    spec: dict = {"template": {"spec": {"domain": {"devices": devices or {}}}}}
    if instancetype:
        spec["instancetype"] = {"kind": kind, "name": instancetype}
    return spec


VM_ROWS = [
    ("accepts-a-permitted-instance-type", _vm_spec(), None),
    ("accepts-a-permitted-gpu-of-its-own", _vm_spec(None, {"gpus": [{"name": "g", "deviceName": H100}]}), None),
    ("own-gpu-not-permitted", _vm_spec(None, {"gpus": [{"name": "g", "deviceName": "nvidia.com/AD102GL_L40S"}]}), "requests host device 'nvidia.com/AD102GL_L40S'"),
    ("host-device-not-permitted", _vm_spec(None, {"hostDevices": [{"name": "n", "deviceName": "mellanox.com/cx7"}]}), "requests host device 'mellanox.com/cx7'"),
    ("instance-type-not-permitted", _vm_spec("bad"), "requests host device 'nvidia.com/gpu'"),
    ("missing-instance-type", _vm_spec("gone"), "instance type 'gone' does not exist in its namespace"),
    ("cluster-instance-type", _vm_spec("one", kind="VirtualMachineClusterInstancetype"), "is not a namespaced VirtualMachineInstancetype"),
]


@pytest.mark.parametrize(("spec", "expected"), [(s, e) for _, s, e in VM_ROWS], ids=[i for i, _, _ in VM_ROWS])
def test_vm_problems(spec, expected):
    found = vm_checks.vm_problems(spec, TYPES, PERMITTED)
    assert found == [] if expected is None else any(expected in p for p in found), found


def test_a_vm_is_refused_every_device_when_nothing_is_permitted():
    assert vm_checks.vm_problems(_vm_spec(), TYPES, set()) == [f"requests host device '{H100}', which the KubeVirt CR does not permit (none)"]


PERMITTED_ROWS = [
    ("pci", {"pciHostDevices": [{"pciVendorSelector": "10DE:2330", "resourceName": H100}]}, {H100}),
    ("mediated", {"mediatedDevices": [{"mdevNameSelector": "GRID A100-1-5C", "resourceName": "nvidia.com/GRID_A100-1-5C"}]}, {"nvidia.com/GRID_A100-1-5C"}),
    ("usb", {"usb": [{"resourceName": "kubevirt.io/token", "selectors": [{"vendor": "1050", "product": "0407"}]}]}, {"kubevirt.io/token"}),
    ("entry-without-a-name", {"pciHostDevices": [{"pciVendorSelector": "10DE:2330"}]}, set()),
    ("nothing", {}, set()),
]


@pytest.mark.parametrize(("permitted", "expected"), [(p, e) for _, p, e in PERMITTED_ROWS], ids=[i for i, _, _ in PERMITTED_ROWS])
def test_permitted_devices(permitted, expected):
    assert vm_checks.permitted_devices([{"configuration": {"permittedHostDevices": permitted}}]) == expected


def _kubevirt_cr() -> None:
    custom("kubevirt", "KubeVirt", kubevirt.kubevirt_spec((kubevirt.VmDevice("p", "10DE:2330", H100),)), namespace_name="kubevirt", api_version=kubevirt.API_VERSION)


@pytest.mark.parametrize(("spec", "expected"), [(s, e) for _, s, e in VM_ROWS], ids=[i for i, _, _ in VM_ROWS])
def test_vm_devices_policy(spec, expected):
    def program():
        _kubevirt_cr()
        for name, type_spec in TYPES.items():
            custom(name, "VirtualMachineInstancetype", type_spec, namespace_name="tenant-a", api_version=kubevirt.INSTANCETYPE_API)
        custom("vm", "VirtualMachine", spec, namespace_name="tenant-a", api_version=kubevirt.API_VERSION)

    messages = [m for ms in violations(stack(program), "vm-devices-permitted").values() for m in ms]
    assert messages == [] if expected is None else any(expected in m for m in messages), messages


QUOTA_ROWS = [
    ("accepts-a-capped-name", {f"requests.{H100}": "0", "requests.nvidia.com/gpu": "0"}, None),
    ("uncapped-name", {"requests.nvidia.com/gpu": "8"}, f"its ResourceQuota does not cap {H100}"),
    ("no-quota-lines", {}, f"does not cap {H100}"),
]


@pytest.mark.parametrize(("hard", "expected"), [(h, e) for _, h, e in QUOTA_ROWS], ids=[i for i, _, _ in QUOTA_ROWS])
def test_quota_problems(hard, expected):
    found = vm_checks.quota_problems(hard, PERMITTED)
    assert found == [] if expected is None else any(expected in p for p in found), found


@pytest.mark.parametrize(("hard", "expected"), [(h, e) for _, h, e in QUOTA_ROWS], ids=[i for i, _, _ in QUOTA_ROWS])
def test_vm_quota_policy(hard, expected):
    import pulumi_kubernetes as k8s

    def program():
        _kubevirt_cr()
        namespace("tenant-a", tenant="a", domain="a", level="restricted")
        k8s.core.v1.ResourceQuota("quota", metadata={"name": "tenant-quota", "namespace": "tenant-a"}, spec={"hard": hard})

    messages = [m for ms in violations(stack(program), "vm-gpus-quotaed").values() for m in ms]
    assert messages == [] if expected is None else any(expected in m for m in messages), messages


OFFLINE_BREAKAGES = [
    ("device-not-permitted", lambda r: one(r, "VirtualMachineInstancetype", "h100-vm-2gpu")["spec"]["gpus"][0].update(deviceName="nvidia.com/gpu"), vm_checks.vm_devices_permitted, "requests host device 'nvidia.com/gpu'"),
    ("quota-line-removed", lambda r: next(m.obj for m in r.manifests if m.kind == "ResourceQuota" and m.namespace == "tenant-assistant")["spec"]["hard"].pop(f"requests.{H100}"), vm_checks.vm_resources_quotaed, f"does not cap {H100}"),
    ("queue-misses-the-name", lambda r: [g.update(coveredResources=[c for c in g["coveredResources"] if c != H100]) for g in one(r, "ClusterQueue", "tenant-search")["spec"]["resourceGroups"]], vm_checks.vm_resources_quotaed, "ClusterQueue does not cover"),
]


@pytest.mark.parametrize(("change", "check", "expected"), [(c, k, e) for _, c, k, e in OFFLINE_BREAKAGES], ids=[i for i, *_ in OFFLINE_BREAKAGES])
def test_offline_checks_flag_a_broken_render(dev, change, check, expected):
    broken = copy.deepcopy(dev)
    change(broken)
    findings = [f for f in check(broken, None) if expected in f.message]
    assert findings, [f.message for f in check(broken, None)]
    assert all(len(f.tenants) == 1 for f in findings), findings  # attributed to the tenant whose object it is


def test_without_queues_no_vm_is_held_to_a_cluster_queue(dev):
    queueless = copy.deepcopy(dev)
    queueless.manifests = [m for m in queueless.manifests if m.kind != "ClusterQueue"]
    assert list(vm_checks.vm_resources_quotaed(queueless, None)) == []


# --------------------------------------------------------------------------- DRA claims and gates

CLAIM_TEMPLATES = {
    "vm-gpus": {"spec": {"devices": {"requests": [{"name": "gpu0", "exactly": {"deviceClassName": VFIO, "allocationMode": "ExactCount", "count": 1}}]}}},
    "wrong-class": {"spec": {"devices": {"requests": [{"name": "gpu0", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}},
    "two-devices": {"spec": {"devices": {"requests": [{"name": "gpu0", "exactly": {"deviceClassName": VFIO, "count": 2}}]}}},
    "all-devices": {"spec": {"devices": {"requests": [{"name": "gpu0", "exactly": {"deviceClassName": VFIO, "allocationMode": "All"}}]}}},
    "defaults": {"spec": {"devices": {"requests": [{"name": "gpu0", "exactly": {"deviceClassName": VFIO}}]}}},
}


def _dra_vm_spec(template: str = "vm-gpus", claim: str = "gpus", request: str = "gpu0", key: str = "gpus", more: tuple[dict, ...] = ()) -> dict:
    return {
        "template": {
            "spec": {
                "domain": {"devices": {key: [{"name": "g", "claimName": claim, "requestName": request}, *more]}},
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}, {"name": "other", "resourceClaimTemplateName": "gone"}],
            }
        }
    }


CLAIM_ROWS = [
    ("accepts-one-vfio-device-per-gpu", _dra_vm_spec(), None),
    ("accepts-the-api-defaults-of-one-device", _dra_vm_spec(template="defaults"), None),
    ("accepts-a-vm-without-dra-gpus", _vm_spec(None, {"gpus": [{"name": "g", "deviceName": H100}]}), None),
    ("claim-not-in-resource-claims", _dra_vm_spec(claim="third"), "names claim 'third', which is not in its resourceClaims"),
    ("template-missing", _dra_vm_spec(template="gone"), "is not a ResourceClaimTemplate of its namespace ('gone')"),
    ("host-device-of-another-class", _dra_vm_spec(template="wrong-class", key="hostDevices"), "must be exactly one vfio.gpu.nvidia.com device"),
    ("every-gpu-after-one-without-claim", _dra_vm_spec(claim="third", more=({"name": "h", "claimName": "gpus", "requestName": "gpu9"},)), "names request 'gpu9'"),
    ("every-gpu-after-one-without-template", _dra_vm_spec(claim="other", more=({"name": "h", "claimName": "gpus", "requestName": "gpu9"},)), "names request 'gpu9'"),
    ("request-missing", _dra_vm_spec(request="gpu1"), "names request 'gpu1', which claim template 'vm-gpus' does not have"),
    ("another-device-class", _dra_vm_spec(template="wrong-class"), "must be exactly one vfio.gpu.nvidia.com device"),
    ("two-devices-for-one-gpu", _dra_vm_spec(template="two-devices"), "must be exactly one vfio.gpu.nvidia.com device"),
    ("every-device-of-the-class", _dra_vm_spec(template="all-devices"), "must be exactly one vfio.gpu.nvidia.com device"),
]


@pytest.mark.parametrize(("spec", "expected"), [(s, e) for _, s, e in CLAIM_ROWS], ids=[i for i, _, _ in CLAIM_ROWS])
def test_claim_problems(spec, expected):
    found = vm_checks.claim_problems(spec, CLAIM_TEMPLATES)
    assert found == [] if expected is None else any(expected in p for p in found), found


def test_a_dra_gpu_is_not_held_to_permitted_host_devices():
    assert vm_checks.vm_problems(_dra_vm_spec(), {}, set()) == []


REASONS = {vm_checks.GATE_EXCEPTIONS_ANNOTATION: '{"GPUsWithDRA": "VMs on DRA pools"}'}
GATE_ROWS = [
    ("accepts-no-gate-without-dra-vms", [], {}, 0, None),
    ("accepts-the-justified-gate-for-dra-vms", ["GPUsWithDRA"], REASONS, 1, None),
    ("gate-not-justifiable", ["GPUsWithDRA", "HostDevices"], REASONS, 1, "feature gate 'HostDevices' is not one the platform justifies"),
    ("reason-not-recorded", ["GPUsWithDRA"], {}, 1, "feature gate 'GPUsWithDRA' is on without its reason recorded"),
    ("reason-unreadable", ["GPUsWithDRA"], {vm_checks.GATE_EXCEPTIONS_ANNOTATION: "{"}, 1, "without its reason recorded"),
    ("gate-without-dra-vms", ["GPUsWithDRA"], REASONS, 0, "is on but no VM claims DRA GPUs"),
    ("dra-vms-without-the-gate", [], {}, 2, "2 VM(s) claim DRA GPUs but feature gate 'GPUsWithDRA' is off"),
]


@pytest.mark.parametrize(("gates", "annotations", "dra_vms", "expected"), [r[1:] for r in GATE_ROWS], ids=[r[0] for r in GATE_ROWS])
def test_gate_problems(gates, annotations, dra_vms, expected):
    found = vm_checks.gate_problems({"configuration": {"developerConfiguration": {"featureGates": gates}}}, annotations, dra_vms)
    assert found == [] if expected is None else any(expected in p for p in found), found


def _dra_policy_stack(vm_spec: dict, gates: list[str], annotations: dict) -> dict[str, list[str]]:
    import pulumi_kubernetes as k8s

    def program():
        k8s.apiextensions.CustomResource(
            "kubevirt", api_version=kubevirt.API_VERSION, kind="KubeVirt",
            metadata={"name": "kubevirt", "namespace": "kubevirt", "annotations": annotations}, spec=kubevirt.kubevirt_spec((), tuple(gates)),
        )
        for name, spec in CLAIM_TEMPLATES.items():
            k8s.resource.v1.ResourceClaimTemplate(name, metadata={"name": name, "namespace": "tenant-a"}, spec=spec)
        custom("vm", "VirtualMachine", vm_spec, namespace_name="tenant-a", api_version=kubevirt.API_VERSION)

    return violations(stack(program), "vm-dra-claims")


@pytest.mark.parametrize(("spec", "expected"), [(s, e) for _, s, e in CLAIM_ROWS], ids=[i for i, _, _ in CLAIM_ROWS])
def test_vm_dra_claims_policy(spec, expected):
    gates = ["GPUsWithDRA"] if vm_checks.dra_gpus(spec) else []
    messages = [m for ms in _dra_policy_stack(spec, gates, REASONS if gates else {}).values() for m in ms]
    assert messages == [] if expected is None else any(expected in m for m in messages), messages


@pytest.mark.parametrize(("gates", "annotations", "dra_vms", "expected"), [r[1:] for r in GATE_ROWS], ids=[r[0] for r in GATE_ROWS])
def test_vm_feature_gates_policy(gates, annotations, dra_vms, expected):
    spec = _dra_vm_spec() if dra_vms else _vm_spec(None)
    messages = [m for ms in _dra_policy_stack(spec, gates, annotations).values() for m in ms]
    # The stack holds one VM: a row's count of DRA VMs only matters as none or some.
    assert messages == [] if expected is None else any(expected.replace("2 VM(s)", "1 VM(s)") in m for m in messages), messages


DRIVER_GATE_ROWS = [
    ("accepts-the-gate-off-without-dra-vms", {}, 0, None),
    ("accepts-the-gate-on-for-dra-vms", {"featureGates": {"PassthroughSupport": True}}, 1, None),
    ("gate-on-without-dra-vms", {"featureGates": {"PassthroughSupport": True}}, 0, "alpha gate PassthroughSupport is on but no VM claims DRA GPUs"),
    ("gate-off-with-dra-vms", {"featureGates": {"PassthroughSupport": False}}, 1, "1 VM(s) claim DRA GPUs but gate PassthroughSupport is off"),
]


@pytest.mark.parametrize(("values", "dra_vms", "expected"), [r[1:] for r in DRIVER_GATE_ROWS], ids=[r[0] for r in DRIVER_GATE_ROWS])
def test_driver_gate_problems(values, dra_vms, expected):
    found = vm_checks.driver_gate_problems(values, dra_vms)
    assert found == [] if expected is None else any(expected in p for p in found), found


@pytest.mark.parametrize(("values", "dra_vms", "expected"), [r[1:] for r in DRIVER_GATE_ROWS], ids=[r[0] for r in DRIVER_GATE_ROWS])
def test_vm_driver_gate_policy(values, dra_vms, expected):
    import pulumi_kubernetes as k8s

    def program():
        k8s.helm.v3.Release("dra", name="dra-driver-nvidia-gpu", chart="oci://registry.k8s.io/dra-driver-nvidia/charts/dra-driver-nvidia-gpu", version="0.4.1", namespace="dra-driver-nvidia-gpu", values=values)
        if dra_vms:
            for name, spec in CLAIM_TEMPLATES.items():
                k8s.resource.v1.ResourceClaimTemplate(name, metadata={"name": name, "namespace": "tenant-a"}, spec=spec)
            custom("vm", "VirtualMachine", _dra_vm_spec(), namespace_name="tenant-a", api_version=kubevirt.API_VERSION)

    messages = [m for ms in violations(stack(program), "vm-dra-claims").values() for m in ms]
    assert messages == [] if expected is None else any(expected in m for m in messages), messages


def test_vm_quota_policy_demands_the_vfio_line_once_a_vm_claims_dra_gpus():
    import pulumi_kubernetes as k8s

    def program():
        namespace("tenant-a", tenant="a", domain="a", level="restricted")
        k8s.core.v1.ResourceQuota("quota", metadata={"name": "tenant-quota", "namespace": "tenant-a"}, spec={"hard": {"requests.nvidia.com/gpu": "0"}})
        custom("vm", "VirtualMachine", _dra_vm_spec(), namespace_name="tenant-a", api_version=kubevirt.API_VERSION)

    messages = [m for ms in violations(stack(program), "vm-gpus-quotaed").values() for m in ms]
    assert messages == [f"Namespace tenant-a: its ResourceQuota does not cap {vm_checks.VFIO_QUOTA} (VM GPUs); a VM could take any number"]


DRA_BREAKAGES = [
    ("claim-template-gone", lambda r: r.manifests.remove(next(m for m in r.manifests if m.kind == "ResourceClaimTemplate" and m.name == "workstation-gpus")), "is not a ResourceClaimTemplate of its namespace", ("search",)),
    ("gate-off", lambda r: one(r, "KubeVirt", "kubevirt")["spec"]["configuration"]["developerConfiguration"].update(featureGates=[]), "feature gate 'GPUsWithDRA' is off", ()),
    ("driver-gate-off", lambda r: one(r, "HelmRelease", "dra-driver-nvidia-gpu")["spec"]["values"].pop("featureGates"), "gate PassthroughSupport is off", ()),
    ("vfio-quota-line-removed", lambda r: next(m.obj for m in r.manifests if m.kind == "ResourceQuota" and m.namespace == "tenant-assistant")["spec"]["hard"].pop(vm_checks.VFIO_QUOTA), f"does not cap {vm_checks.VFIO_QUOTA}", ("assistant",)),
]


@pytest.mark.parametrize(("change", "expected", "tenants"), [r[1:] for r in DRA_BREAKAGES], ids=[r[0] for r in DRA_BREAKAGES])
def test_offline_checks_flag_a_broken_dra_vm_render(dra_vm, change, expected, tenants):
    broken = copy.deepcopy(dra_vm)
    change(broken)
    found = [f for check in (vm_checks.vm_resources_quotaed, vm_checks.vm_dra_claims) for f in check(broken, None)]
    assert [f.tenants for f in found if expected in f.message] == [tenants], [f.message for f in found]
