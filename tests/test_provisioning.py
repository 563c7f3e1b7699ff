"""Provisioning: Metal3 hosts and firmware settings valid against the upstream CRDs with BMC
credentials only in OpenBao, the gate Jobs, and the hardware facts refused with their paths when
wrong (verdicts and NetBox: tests/test_acceptance.py)."""

from __future__ import annotations

import copy
import json
from typing import Callable

import pytest
import yaml

from ai_factory.components import provisioning
from ai_factory.factory.acceptance import gates
from ai_factory.factory.model.loading import ConfigError, validate
from tests.conftest import REPO, objects, one, render
from tests.test_bad_input import refused_render

H100 = ("gpu-h100-01", "gpu-h100-02", "gpu-h100-03", "gpu-h100-04")


def problems(raw) -> list[str]:
    with pytest.raises(ConfigError) as err:
        validate(raw)
    return err.value.problems


def h100(raw) -> dict:
    return raw["fleet"]["pools"][0]


def setup(raw) -> dict:
    return raw["layers"]["provisioning"]["pools"]["h100-train"]


# --------------------------------------------------------------------------- Metal3 objects


def test_dev_metal3_and_secret_objects_validate_against_the_upstream_crds(dev, oracles):
    kinds = ("BareMetalHost", "HostFirmwareSettings", "ExternalSecret")
    found = [m.obj for m in dev.manifests if m.kind in (*kinds, "SecretStore") and m.obj["metadata"]["namespace"] == "metal3-hosts"]
    assert sorted(o["kind"] for o in found).count("BareMetalHost") == 4 and len(found) == 13
    assert {o["kind"]: oracles.validate_custom_object(o) for o in found} == {k: [] for k in (*kinds, "SecretStore")}


def test_acceptance_jobs_validate_against_the_kubernetes_schema(dev, oracles):
    jobs = [o for o in objects(dev, "Job") if o["metadata"]["namespace"] == "ai-factory-acceptance"]
    assert len(jobs) == 4 * 4 + 2  # four gates per node, one per rack pair
    assert [e for job in jobs for e in oracles.validate_core_object(job, "1.34")] == []


def test_each_pair_job_has_a_headless_service_naming_its_pods(dev, oracles):
    services = {o["metadata"]["name"]: o for o in objects(dev, "Service") if o["metadata"]["namespace"] == "ai-factory-acceptance"}
    pairs = [j for j in objects(dev, "Job") if j["metadata"]["namespace"] == "ai-factory-acceptance" and j["spec"].get("completions") == 2]
    assert len(pairs) == 2 and set(services) == {j["metadata"]["name"] for j in pairs}
    for job in pairs:
        name = job["metadata"]["name"]
        pod = job["spec"]["template"]["spec"]
        assert pod["subdomain"] == name and f"{name}-0.{name}" in pod["containers"][0]["command"]
        assert pod["volumes"] == [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]
        assert pod["containers"][0]["volumeMounts"] == [{"name": "shm", "mountPath": "/dev/shm"}]
        assert services[name]["spec"] == {"clusterIP": "None", "selector": {"job-name": name}, "publishNotReadyAddresses": True}
        assert oracles.validate_core_object(services[name], "1.34") == []


def test_a_host_carries_its_bmc_boot_mac_disk_hints_and_the_pools_image(dev):
    spec = one(dev, "BareMetalHost", "gpu-h100-03")["spec"]
    assert spec["bmc"] == {"address": "idrac-virtualmedia://10.20.2.11/redfish/v1/Systems/System.Embedded.1",
                           "credentialsName": "gpu-h100-03-bmc", "disableCertificateVerification": False}
    assert (spec["bootMACAddress"], spec["rootDeviceHints"]) == ("b8:3f:d2:10:02:01", {"model": "Dell BOSS-N1", "minSizeGigabytes": 400})
    assert spec["image"]["checksumType"] == "sha256" and "595.91.07" in spec["image"]["url"] and spec["bootMode"] == "UEFISecureBoot"


def test_bmc_credentials_come_from_openbao_and_appear_nowhere_in_the_render(dev):
    external = one(dev, "ExternalSecret", "gpu-h100-01-bmc")["spec"]
    assert external["target"]["name"] == "gpu-h100-01-bmc"
    assert [d["remoteRef"] for d in external["data"]] == [{"key": "platform/bmc/gpu-h100-01", "property": p} for p in ("username", "password")]
    assert not [m for m in dev.manifests if m.kind == "Secret" and m.name.endswith("-bmc")]
    policy = next(r.inputs["policy"] for r in dev.graph.of_type("vault:index/policy:Policy") if r.name == "ai-factory-provisioning-bmc-policy")
    assert 'path "secret/data/platform/bmc/*"' in policy and "list" not in policy


@pytest.mark.parametrize(
    ("fabric", "expected"),
    [
        ("infiniband", {"SriovGlobalEnable": "Enabled", "ProcVirtualization": "Enabled", "LogicalProc": "Enabled", "SysProfile": "PerfOptimized"}),
        ("ethernet", {"SriovGlobalEnable": "Disabled", "ProcVirtualization": "Disabled", "LogicalProc": "Enabled", "SysProfile": "PerfOptimized"}),
    ],
    ids=["rdma-fabric", "ethernet"],
)
def test_bios_settings_follow_the_pools_fabric_and_each_has_its_reason(raw, fabric, expected):
    h100(raw)["topology"]["fabric"] = fabric
    hfs = one(render(raw), "HostFirmwareSettings", "gpu-h100-01")
    assert hfs["spec"]["settings"] == expected
    reasons = json.loads(hfs["metadata"]["annotations"][provisioning.REASONS_ANNOTATION])
    assert set(reasons) == set(expected) and all(len(why) > 20 for why in reasons.values())


def test_a_pool_setting_overrides_the_vendor_profile(raw):
    setup(raw)["firmware"] = {"LogicalProc": {"value": "Disabled", "reason": "side channels between jobs of one tenant"}}
    hfs = one(render(raw), "HostFirmwareSettings", "gpu-h100-01")
    assert hfs["spec"]["settings"]["LogicalProc"] == "Disabled"
    assert json.loads(hfs["metadata"]["annotations"][provisioning.REASONS_ANNOTATION])["LogicalProc"] == "side channels between jobs of one tenant"


def test_a_node_without_a_bmc_gets_no_host_but_is_still_accepted(raw):
    del h100(raw)["node_list"][1]["bmc"]
    rendered = render(raw)
    assert {o["metadata"]["name"] for o in objects(rendered, "BareMetalHost")} == set(H100) - {"gpu-h100-02"}
    jobs = [o for o in objects(rendered, "Job") if o["metadata"]["annotations"].get(provisioning.NODE_ANNOTATION) == "gpu-h100-02"]
    assert {j["metadata"]["labels"][provisioning.GATE_LABEL] for j in jobs} == {"inventory", "dcgm-diag", "burn-in", "nccl-node"}


def test_gate_jobs_run_on_their_node_tolerating_the_acceptance_taint(dev):
    for job in (o for o in objects(dev, "Job") if o["metadata"]["namespace"] == "ai-factory-acceptance"):
        pod = job["spec"]["template"]["spec"]
        nodes = job["metadata"]["annotations"][provisioning.NODE_ANNOTATION].split(",")
        term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]
        assert term == {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}
        assert {"key": gates.ACCEPTANCE_KEY, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        assert len(job["metadata"]["name"]) <= 63 and job["spec"]["backoffLimit"] == 0
        assert (job["spec"].get("completions", 1), len(nodes)) in ((1, 1), (2, 2))


def test_the_dcgm_gate_runs_at_the_configured_level_and_burn_in_for_its_duration(raw):
    raw["layers"]["provisioning"]["acceptance"] |= {"dcgm_diag_level": 4, "burn_in_minutes": 120}
    jobs = {j["metadata"]["labels"][provisioning.GATE_LABEL]: j for j in objects(render(raw), "Job")
            if j["metadata"]["annotations"].get(provisioning.NODE_ANNOTATION) == "gpu-h100-01"}
    shell, flag, script = jobs["dcgm-diag"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert (shell, flag) == ("sh", "-c") and "dcgmi diag -r 4 -j" in script and '"level":4' in script
    burn = jobs["burn-in"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "'targeted_stress.test_duration=3600;targeted_power.test_duration=3600'" in burn


def test_a_driver_change_renames_every_gate_job(raw):
    before = {j["metadata"]["name"] for j in objects(render(raw), "Job") if j["metadata"]["namespace"] == "ai-factory-acceptance"}
    h100(raw)["driver"]["version"] = "595.100.01"
    setup(raw)["image"]["driver_version"] = "595.100.01"
    after = {j["metadata"]["name"] for j in objects(render(raw), "Job") if j["metadata"]["namespace"] == "ai-factory-acceptance"}
    assert len(after) == len(before) == 18 and not before & after


# --------------------------------------------------------------------------- bad input


def _set_node(i: int, **fields) -> Callable[[dict], None]:
    return lambda raw: h100(raw)["node_list"][i].update(fields)


BAD = [
    (_set_node(0, bmc={"address": "ftp://10.0.0.1/"}), "fleet.pools[0].node_list[0].bmc.address: scheme 'ftp' is not a Metal3 BMC driver"),
    (_set_node(0, bmc={"address": "ipmi://10.0.0.1"}), "fleet.pools[0].node_list[0].bmc.address: scheme 'ipmi' is refused"),
    (_set_node(0, bmc={"address": "redfish+http://10.0.0.1/redfish/v1/Systems/1"}), "scheme 'redfish+http' is refused: plain HTTP"),
    (_set_node(0, bmc={"address": "10.0.0.1"}), "fleet.pools[0].node_list[0].bmc.address: give the driver as the URL scheme"),
    (_set_node(0, bmc={"address": "redfish://bad_host!/x"}), "is not a host name or IP address"),
    (_set_node(1, boot_mac="b8-3f-d2-10-01-02"), "fleet.pools[0].node_list[1].boot_mac: 'b8-3f-d2-10-01-02' is not a MAC address"),
    (_set_node(1, boot_mac="b8:3f:d2:10:01"), "fleet.pools[0].node_list[1].boot_mac: 'b8:3f:d2:10:01' is not a MAC address"),
    (_set_node(2, boot_mac="B8:3F:D2:10:01:01"), "fleet.pools[0].node_list[2].boot_mac: b8:3f:d2:10:01:01 is also fleet.pools[0].node_list[0]'s"),
    (lambda raw: h100(raw)["node_list"][3].pop("boot_mac"), "fleet.pools[0].node_list[3]: a node with a BMC also needs boot_mac"),
    (_set_node(0, root_device_hints={}), "fleet.pools[0].node_list[0].root_device_hints: give at least one hint"),
    (lambda raw: setup(raw)["image"].pop("checksum"), "layers.provisioning.pools.h100-train.image.checksum: required"),
    (lambda raw: setup(raw)["image"].update(checksum="abc123"), "layers.provisioning.pools.h100-train.image.checksum: 'abc123' does not match"),
    (lambda raw: setup(raw)["image"].update(url="http://images.example.com/a.qcow2"), "layers.provisioning.pools.h100-train.image.url:"),
    (lambda raw: setup(raw)["image"].update(driver_version="580.65.06"),
     "layers.provisioning.pools.h100-train.image.driver_version: the image carries driver 580.65.06, but fleet.pools[0].driver.version is 595.91.07"),
    (lambda raw: raw["layers"]["provisioning"]["pools"].update({"h100-trian": copy.deepcopy(setup(raw))}),
     "layers.provisioning.pools.h100-trian: unknown pool (did you mean 'h100-train'?)"),
    (lambda raw: raw["layers"]["provisioning"].update(pools={}), "layers.provisioning.pools.h100-train: required: fleet.pools[0].node_list[0] declares a BMC"),
    (lambda raw: raw["layers"]["provisioning"]["acceptance"].update(nccl=[
        {"gpu_model": "H100-80GB", "scope": "pair", "link": "infiniband", "min_busbw_gbps": 100, "source": "site benchmark"}]),
     "layers.provisioning.acceptance.nccl: no row for gpu_model H100-80GB, scope node, link nvswitch (fleet.pools[0])"),
    (lambda raw: raw["layers"]["provisioning"]["acceptance"].update(reruns={"gpu-h100-09": 1}), "layers.provisioning.acceptance.reruns.gpu-h100-09: not a node"),
    (lambda raw: h100(raw)["node_list"].append(copy.deepcopy(h100(raw)["node_list"][0]) | {"boot_mac": "b8:3f:d2:10:09:09", "bmc": {"address": "redfish://10.9.9.9/"}}),
     "fleet.pools: node 'gpu-h100-01' is listed 2 times"),
    (lambda raw: raw["layers"].setdefault("external_secrets", {}).update(enabled=False), "layers.provisioning.enabled: BMC credentials come from OpenBao through External Secrets; enable layers.external_secrets"),
]


@pytest.mark.parametrize(("edit", "expected"), BAD, ids=[
    "unknown-scheme", "ipmi", "plain-http", "no-scheme", "bad-host", "mac-dashes", "mac-short", "mac-twice", "no-boot-mac",
    "no-hint", "no-checksum", "bad-checksum", "http-image", "driver-mismatch", "unknown-pool", "pool-setup-missing",
    "nccl-table-misses-model", "reruns-unknown-node", "node-twice", "external-secrets-off",
])
def test_bad_hardware_facts_are_refused_with_their_path(raw, edit, expected):
    edit(raw)
    found = problems(raw)
    assert any(expected in p for p in found), found


def test_good_facts_pass_and_an_uppercase_mac_is_accepted(raw):
    _set_node(0, boot_mac="B8:3F:D2:10:01:01")(raw)
    assert validate(raw).fleet.pools[0].node_list[0].boot_mac == "B8:3F:D2:10:01:01"


def test_every_bad_fact_at_once_is_one_report_with_exit_2_and_nothing_written(tmp_path):
    document = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())
    layers, fleet = document["config"]["ai-factory:layers"], document["config"]["ai-factory:fleet"]
    nodes = fleet["pools"][0]["node_list"]
    nodes[0]["bmc"]["address"] = "ftp://10.0.0.1/"
    nodes[1]["boot_mac"] = "b8-3f"
    nodes.append(copy.deepcopy(nodes[2]) | {"boot_mac": "b8:3f:d2:10:09:09", "bmc": {"address": "redfish://10.9.9.9/"}})
    del layers["provisioning"]["pools"]["h100-train"]["image"]["checksum"]
    layers["provisioning"]["acceptance"]["nccl"] = [{"gpu_model": "H100-80GB", "scope": "node", "link": "nvswitch", "min_busbw_gbps": 150, "source": "x" * 5}]
    stderr = refused_render(tmp_path, yaml.safe_dump(document))
    for expected in ("fleet.pools[0].node_list[0].bmc.address", "fleet.pools[0].node_list[1].boot_mac",
                     "fleet.pools: node 'gpu-h100-03' is listed 2 times", "layers.provisioning.pools.h100-train.image.checksum: required",
                     "layers.provisioning.acceptance.nccl: no row for gpu_model H100-80GB, scope pair, link infiniband"):
        assert expected in stderr, stderr


# --------------------------------------------------------------------------- registration taint


def test_a_host_boots_with_user_data_registering_the_acceptance_taint(dev):
    host = one(dev, "BareMetalHost", "gpu-h100-01")
    assert host["spec"]["userData"] == {"name": "gpu-h100-01-user-data", "namespace": "metal3-hosts"}
    secret = one(dev, "Secret", "gpu-h100-01-user-data")
    assert secret["stringData"] == {"userData": "[secret]"}  # join credentials live there: never in the bundle
    assert json.loads(secret["metadata"]["annotations"][provisioning.REGISTER_TAINTS_ANNOTATION]) == [
        {"key": gates.ACCEPTANCE_KEY, "value": "pending", "effect": "NoSchedule"}]


def _drop_in(pool) -> dict:
    text = provisioning.user_data(pool)
    assert text.startswith("#cloud-config\n")
    (written,) = yaml.safe_load(text)["write_files"]
    assert written["path"] == provisioning.KUBELET_DROP_IN
    return yaml.safe_load(written["content"])


def test_the_user_data_writes_a_kubelet_drop_in_with_register_with_taints(dev):
    ethernet = next(p for p in dev.config.fleet.pools if p.topology.fabric == "ethernet")
    assert _drop_in(ethernet) == {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "registerWithTaints": [{"key": gates.ACCEPTANCE_KEY, "value": "pending", "effect": "NoSchedule"}]}


@pytest.mark.parametrize("fabric, sharing, aligned", [
    ("infiniband", "exclusive", True), ("roce", "time-slicing", True), ("infiniband", "dra", False), ("ethernet", "exclusive", False)])
def test_rdma_pools_on_device_plugins_align_gpus_and_nics_in_the_kubelet(dev, fabric, sharing, aligned):
    pool = dev.config.fleet.pools[0]
    pool = pool.model_copy(update={"sharing": sharing, "topology": pool.topology.model_copy(update={"fabric": fabric})})
    drop_in = _drop_in(pool)
    assert (drop_in.get("topologyManagerPolicy"), drop_in.get("topologyManagerScope")) == (("restricted", "pod") if aligned else (None, None))


def test_dev_passes_the_registration_taint_check(dev):
    from ai_factory.factory.checking.provisioning import registration_taint

    assert list(registration_taint(dev, None)) == []
