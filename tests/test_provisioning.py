"""Provisioning and acceptance: Metal3 hosts and firmware settings valid against the upstream CRDs
with BMC credentials only in OpenBao, the hardware facts refused with their paths when wrong, the
gates' verdicts and taints from recorded results, and the NetBox records against a recorded
contract of its REST API."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import jsonschema
import pytest
import requests
import yaml

from ai_factory.components import provisioning
from ai_factory.factory import cli
from ai_factory.factory.acceptance import gates, netbox, report
from ai_factory.factory.model.config import NodeSpec
from ai_factory.factory.model.loading import ConfigError, validate
from tests.conftest import REPO, objects, one, render

H100 = ("gpu-h100-01", "gpu-h100-02", "gpu-h100-03", "gpu-h100-04")
DEV_RESULTS = yaml.safe_load((REPO / "acceptance" / "dev-results.yaml").read_text())
CONTRACT = json.loads((REPO / "tests" / "contracts" / "netbox-4.4" / "contract.json").read_text())


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
    found = [m.obj for m in dev.manifests if m.kind in kinds or (m.kind == "SecretStore" and m.obj["metadata"]["namespace"] == "metal3-hosts")]
    assert sorted(o["kind"] for o in found).count("BareMetalHost") == 4 and len(found) == 13
    assert {o["kind"]: oracles.validate_custom_object(o) for o in found} == {k: [] for k in (*kinds, "SecretStore")}


def test_acceptance_jobs_validate_against_the_kubernetes_schema(dev, oracles):
    jobs = [o for o in objects(dev, "Job") if o["metadata"]["namespace"] == "ai-factory-acceptance"]
    assert len(jobs) == 4 * 4 + 2  # four gates per node, one per rack pair
    assert [e for job in jobs for e in oracles.validate_core_object(job, "1.34")] == []


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
    assert jobs["dcgm-diag"]["spec"]["template"]["spec"]["containers"][0]["command"] == ["dcgmi", "diag", "-r", "4", "-j"]
    burn = jobs["burn-in"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "targeted_stress.test_duration=3600;targeted_power.test_duration=3600" in burn


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
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    proc = __import__("subprocess").run([__import__("sys").executable, "-m", "ai_factory.factory", "render", str(path), "--out", str(out)],
                                        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and not out.exists()
    for expected in ("fleet.pools[0].node_list[0].bmc.address", "fleet.pools[0].node_list[1].boot_mac",
                     "fleet.pools: node 'gpu-h100-03' is listed 2 times", "layers.provisioning.pools.h100-train.image.checksum: required",
                     "layers.provisioning.acceptance.nccl: no row for gpu_model H100-80GB, scope pair, link infiniband"):
        assert expected in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- verdicts


def _node(results: dict, name: str) -> dict:
    return results["nodes"][name]


def _drop_gpu(r):
    _node(r, "gpu-h100-02")["gpus"].pop()


def _pair(r, i: int, gbps: float):
    r["pairs"][i]["busbw_gbps"] = gbps


VERDICTS: list[tuple[str, Callable[[dict], Any], dict[str, str], str]] = [
    # (id, edit of the dev results, expected verdict of the nodes that change (others accepted), reason fragment)
    ("all-pass", lambda r: None, {}, ""),
    ("missing-gpu", _drop_gpu, {"gpu-h100-02": "failed"}, "inventory: 7 GPUs found, 8 expected"),
    ("wrong-model", lambda r: _node(r, "gpu-h100-01")["gpus"][3].update(pci_device_id="0x20B510DE"), {"gpu-h100-01": "failed"}, "GPU(s) 3 are not H100-80GB"),
    ("gpu-unhealthy", lambda r: _node(r, "gpu-h100-01")["gpus"][0].update(health="failure"), {"gpu-h100-01": "failed"}, "DCGM health of GPU(s) 0 (failure)"),
    ("ecc-off", lambda r: _node(r, "gpu-h100-03")["gpus"][5].update(ecc_mode="disabled"), {"gpu-h100-03": "failed"}, "ecc: ECC disabled on GPU(s) 5"),
    ("retired-pages", lambda r: _node(r, "gpu-h100-03")["gpus"][1].update(retired_pages=2), {"gpu-h100-03": "failed"}, "retired pages GPU 1: 2"),
    ("nic-numa", lambda r: _node(r, "gpu-h100-04")["nics"][0].update(numa_node=1), {"gpu-h100-04": "failed"}, "nics: missing mlx5_0 on NUMA 0; unexpected mlx5_0 on NUMA 1"),
    ("nic-missing", lambda r: _node(r, "gpu-h100-04")["nics"].pop(), {"gpu-h100-04": "failed"}, "missing mlx5_7 on NUMA 1"),
    ("driver", lambda r: _node(r, "gpu-h100-01").update(driver="580.65.06"), {"gpu-h100-01": "failed"}, "driver 580.65.06 loaded, the pool expects 595.91.07"),
    ("diag-level", lambda r: _node(r, "gpu-h100-01")["dcgm_diag"].update(level=2), {"gpu-h100-01": "failed"}, "ran at level 2, below 3"),
    ("diag-fail", lambda r: _node(r, "gpu-h100-01").update(dcgm_diag={"level": 3, "passed": False, "failed_tests": ["memory"]}), {"gpu-h100-01": "failed"}, "dcgm-diag: failed: memory"),
    ("burn-in-short", lambda r: _node(r, "gpu-h100-02")["burn_in"].update(minutes=30), {"gpu-h100-02": "failed"}, "ran 30 min, less than 60"),
    ("nccl-node-low", lambda r: _node(r, "gpu-h100-02")["nccl"].update(busbw_gbps=149.9), {"gpu-h100-02": "failed"}, "bus bandwidth 149.9 GB/s below 150"),
    ("nccl-node-at-threshold", lambda r: _node(r, "gpu-h100-02")["nccl"].update(busbw_gbps=150), {}, ""),
    ("nccl-pair-low", lambda r: _pair(r, 0, 99), {"gpu-h100-01": "failed", "gpu-h100-03": "failed"}, "99 GB/s below 100"),
    ("no-results", lambda r: r["nodes"].pop("gpu-h100-04"), {"gpu-h100-04": "pending"}, "inventory: no result yet"),
    ("gate-not-run", lambda r: _node(r, "gpu-h100-04").pop("burn_in"), {"gpu-h100-04": "pending"}, "burn-in: no result yet"),
    ("stale-generation", lambda r: _node(r, "gpu-h100-01").update(generation="0123456789ab"), {"gpu-h100-01": "pending"}, "results are of generation 0123456789ab"),
    ("pair-missing", lambda r: r["pairs"].pop(1), {"gpu-h100-02": "pending", "gpu-h100-04": "pending"}, "no result with"),
    ("failed-wins-over-pending", lambda r: (_drop_gpu(r), _node(r, "gpu-h100-02").pop("nccl")), {"gpu-h100-02": "failed"}, "7 GPUs found"),
]


@pytest.mark.parametrize(("edit", "expected", "reason"), [v[1:] for v in VERDICTS], ids=[v[0] for v in VERDICTS])
def test_recorded_results_give_each_node_its_verdict_and_taint(dev, edit, expected, reason):
    results = copy.deepcopy(DEV_RESULTS)
    edit(results)
    found = {v.node: v for v in gates.evaluate(dev.config, gates.Results.model_validate(results))}
    assert {n: v.verdict for n, v in found.items()} == {n: expected.get(n, "accepted") for n in H100}
    for node, v in found.items():
        assert v.taint == (None if v.verdict == "accepted" else {"key": gates.ACCEPTANCE_KEY, "value": v.verdict, "effect": "NoSchedule"})
    if reason:
        assert all(any(reason in r for r in found[n].reasons) for n in expected), {n: found[n].reasons for n in expected}


def test_every_node_reports_every_gate_in_order(dev):
    assert {tuple(g.gate for g in v.gates) for v in _verdicts(dev)} == {gates.GATES}


def test_raising_a_nodes_reruns_sends_it_back_to_pending(raw):
    raw["layers"]["provisioning"]["acceptance"]["reruns"] = {"gpu-h100-03": 1}
    found = {v.node: v.verdict for v in gates.evaluate(validate(raw), gates.Results.model_validate(DEV_RESULTS))}
    # The pair results with the re-run node no longer count for its partner either.
    assert found == {"gpu-h100-01": "pending", "gpu-h100-02": "accepted", "gpu-h100-03": "pending", "gpu-h100-04": "accepted"}


def test_the_fleet_taints_and_labels_nodes_by_their_verdict(raw, tmp_path, monkeypatch):
    results = copy.deepcopy(DEV_RESULTS)
    _drop_gpu(results)
    results["nodes"].pop("gpu-h100-04")
    (tmp_path / "acceptance").mkdir()
    (tmp_path / "acceptance" / "dev-results.yaml").write_text(yaml.safe_dump(results))
    monkeypatch.chdir(tmp_path)
    nodes = {o["metadata"]["name"]: o for o in objects(render(raw), "Node")}
    taints = {n: [t for t in nodes[n].get("spec", {}).get("taints", []) if t["key"] == gates.ACCEPTANCE_KEY] for n in H100}
    assert taints == {"gpu-h100-01": [], "gpu-h100-02": [{"key": gates.ACCEPTANCE_KEY, "value": "failed", "effect": "NoSchedule"}],
                      "gpu-h100-03": [], "gpu-h100-04": [{"key": gates.ACCEPTANCE_KEY, "value": "pending", "effect": "NoSchedule"}]}
    assert {n: nodes[n]["metadata"]["labels"][gates.ACCEPTANCE_KEY] for n in H100} == {
        "gpu-h100-01": "accepted", "gpu-h100-02": "failed", "gpu-h100-03": "accepted", "gpu-h100-04": "pending"}
    assert "7 GPUs found, 8 expected" in nodes["gpu-h100-02"]["metadata"]["annotations"][gates.REASON_ANNOTATION]


def test_an_unreadable_results_file_is_a_config_problem(raw, tmp_path, monkeypatch):
    (tmp_path / "acceptance").mkdir()
    (tmp_path / "acceptance" / "dev-results.yaml").write_text("nodes: {gpu-h100-01: {generation: nope}}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        gates.node_verdicts(validate(raw))
    assert any("nodes.gpu-h100-01.generation" in p for p in err.value.problems)


def _nodes(*spec: tuple[str, str, str]) -> list[NodeSpec]:
    return [NodeSpec(name=n, rack=r, block=b) for n, r, b in spec]


@pytest.mark.parametrize(
    ("nodes", "pairs"),
    [
        (_nodes(("a", "r1", "b"), ("b", "r1", "b"), ("c", "r2", "b"), ("d", "r2", "b")), [("a", "c"), ("b", "d")]),
        (_nodes(("a", "r1", "b"), ("b", "r2", "b"), ("c", "r3", "b")), [("a", "b"), ("c", "a")]),
        (_nodes(("a", "r1", "b1"), ("b", "r2", "b2")), [("a", "b"), ("b", "a")]),
        (_nodes(("a", "r1", "b")), []),
    ],
    ids=["two-racks", "odd-count", "one-node-per-block", "single-node"],
)
def test_rack_pairs_cross_racks_and_cover_every_node(nodes, pairs):
    assert gates.rack_pairs(nodes) == pairs


# --------------------------------------------------------------------------- NetBox


class Contract(requests.Session):
    """Replays the recorded NetBox contract: an unrecorded request fails the test; every request
    body is validated against the endpoint's request schema."""

    def __init__(self):
        super().__init__()
        self.sent: list[tuple[str, str, Any]] = []
        self.authorization: set[str] = set()

    def request(self, method, url, params=None, json=None, headers=None, **kwargs):  # noqa: A002 - requests' signature
        path = url.removeprefix(CONTRACT["base_url"])
        query = {k: str(v) for k, v in (params or {}).items() if k != "limit"}
        key = f"{method} {path}"
        if key in CONTRACT["request_schemas"]:
            jsonschema.validate(json, CONTRACT["request_schemas"][key])
        exchange = next((e for e in CONTRACT["exchanges"] if (e["method"], e["path"], e["query"]) == (method, path, query)), None)
        assert exchange is not None, f"unrecorded request {method} {path} {query}"
        self.sent.append((method, path, json))
        self.authorization.add((headers or {}).get("authorization", ""))
        body = exchange["body"]
        if body == "echo":
            body = [{"id": i + 1, **item} for i, item in enumerate(json)] if isinstance(json, list) else {"id": 900, **json}
        response = requests.Response()
        response.status_code, response.url = exchange["status"], url
        response.headers["Content-Type"] = "application/json"
        response._content = __import__("json").dumps(body).encode()
        return response


def _verdicts(dev, edit=lambda r: None) -> list[gates.NodeVerdict]:
    results = copy.deepcopy(DEV_RESULTS)
    edit(results)
    return gates.evaluate(dev.config, gates.Results.model_validate(results))


def test_records_are_written_as_the_rest_api_expects(dev):
    session = Contract()
    api = netbox.connect(CONTRACT["base_url"], "token", session)
    written = netbox.write(api, [netbox.record(v) for v in _verdicts(dev, _drop_gpu)])
    assert written == list(H100)
    writes = [(m, p) for m, p, _ in session.sent if m != "GET"]
    # The one existing custom field is not created again; one PATCH and one journal entry per node.
    assert writes == [("POST", "/api/extras/custom-fields/")] * 6 + [("PATCH", "/api/dcim/devices/"), ("POST", "/api/extras/journal-entries/")] * 4
    journals = [body for m, p, body in session.sent if p == "/api/extras/journal-entries/"]
    assert [(j["assigned_object_id"], j["kind"]) for j in journals] == [(101, "success"), (102, "danger"), (103, "success"), (104, "success")]
    patch = next(body for m, p, body in session.sent if m == "PATCH" and body[0]["id"] == 102)[0]["custom_fields"]
    assert patch["aif_acceptance"] == "failed" and len(patch["aif_gpus"]) == 7 and patch["aif_driver"] == "595.91.07"
    assert patch["aif_nccl"] == {"node_busbw_gbps": 481.0, "pair_busbw_gbps": {"gpu-h100-04": 349.8}}


def test_a_node_netbox_does_not_know_writes_nothing(dev):
    session = Contract()
    api = netbox.connect(CONTRACT["base_url"], "token", session)
    records = [netbox.record(v) for v in _verdicts(dev)]
    records.append(netbox.Record("gpu-h100-99", {}, "warning", "x"))
    with pytest.raises(netbox.NetBoxError, match="no device named 'gpu-h100-99'"):
        netbox.write(api, records)
    assert [m for m, _, _ in session.sent] == ["GET"] * 5


def test_the_topology_read_from_netbox_matches_the_fleet_config(raw):
    api = netbox.connect(CONTRACT["base_url"], "token", Contract())
    topology = netbox.read_topology(api, list(H100))
    assert {n: (t.rack, t.block) for n, t in topology.items()} == {
        "gpu-h100-01": ("par1-r01", "par1-b1"), "gpu-h100-02": ("par1-r01", "par1-b1"),
        "gpu-h100-03": ("par1-r02", "par1-b1"), "gpu-h100-04": ("par1-r02", "par1-b1")}
    assert topology["gpu-h100-03"].links == (("ib0", "par1-b1-leaf-2", "p3/0"), ("ib1", "par1-b1-leaf-2", "p3/1"))
    assert netbox.topology_problems(validate(raw), topology) == []
    h100(raw)["node_list"][2]["rack"] = "par1-r09"
    assert netbox.topology_problems(validate(raw), topology) == ["fleet.pools[0].node_list[2].rack: 'par1-r09' here, 'par1-r02' in NetBox"]


# --------------------------------------------------------------------------- ai-factory accept


def test_accept_prints_gates_figures_thresholds_taint_and_record(capsys):
    assert cli.main(["accept", "dev", "--node", "gpu-h100-01"]) == 0
    out = capsys.readouterr().out
    assert "gpu-h100-01 (pool h100-train, generation " in out and ": ACCEPTED" in out
    assert "nccl-pair  passed   gpu-h100-03: 352.4 GB/s" in out and "(threshold >= 100 GB/s (infiniband))" in out
    assert "taint: none" in out and '"aif_acceptance": "accepted"' in out and "1 accepted, 0 failed, 0 pending" in out


def test_accept_exits_1_with_the_taints_when_a_node_fails(tmp_path, capsys):
    results = copy.deepcopy(DEV_RESULTS)
    _drop_gpu(results)
    path = tmp_path / "results.yaml"
    path.write_text(yaml.safe_dump(results))
    assert cli.main(["accept", "dev", "--results", str(path), "--format", "json"]) == 1
    by_node = {v["node"]: v for v in json.loads(capsys.readouterr().out)}
    assert by_node["gpu-h100-02"]["taint"] == {"key": "ai-factory.io/acceptance", "value": "failed", "effect": "NoSchedule"}
    assert by_node["gpu-h100-02"]["netbox"]["journal_entry"]["kind"] == "danger"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--node", "gpu-h100-9"], "--node: 'gpu-h100-9' is not a node under acceptance"),
        (["--results", "missing.yaml"], "--results missing.yaml: cannot read"),
        (["--apply", "--results", "x.yaml"], "--results: --apply applies the config's"),
        (["--apply"], "layers.provisioning.netbox: required by --apply"),
    ],
    ids=["unknown-node", "missing-results", "apply-with-results", "apply-without-netbox"],
)
def test_accept_refuses_bad_arguments_with_exit_2(capsys, args, expected):
    assert cli.main(["accept", "dev", *args]) == 2
    assert expected in capsys.readouterr().err


def test_accept_apply_goes_through_the_platform_stack_then_netbox(raw, monkeypatch, tmp_path):
    ups = []
    monkeypatch.setattr("ai_factory.stacks.platform.PlatformStacks.up", lambda self, env, on_output=None: ups.append(env))
    monkeypatch.setenv(report.TOKEN_ENV, "token-from-the-environment")
    raw["layers"]["provisioning"]["netbox"] = {"url": CONTRACT["base_url"], "token": raw["layers"]["openbao"]["admin_token"]}
    cfg = validate(raw)
    session = Contract()
    written = report.apply("dev", cfg, gates.node_verdicts(cfg), session=session)
    assert ups == ["dev"] and written == list(H100)
    assert session.authorization == {"Token token-from-the-environment"}
