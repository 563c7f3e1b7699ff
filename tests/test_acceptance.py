"""Acceptance: the gates' verdicts and taints from recorded results, the NetBox records and
topology against a recorded contract of NetBox 4.4's REST API, and `ai-factory accept`."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import jsonschema
import pytest
import requests
import yaml

from ai_factory.factory import cli
from ai_factory.factory.acceptance import gates, netbox, report
from ai_factory.factory.model.config import FactoryConfig, NodeSpec
from ai_factory.factory.model.loading import ConfigError, validate
from tests.conftest import REPO, objects, render
from tests.fake_pulumi import Deployed, FakePulumi
from tests.fleet_env import write_env

H100 = ("gpu-h100-01", "gpu-h100-02", "gpu-h100-03", "gpu-h100-04")
DEV_RESULTS = yaml.safe_load((REPO / "acceptance" / "dev-results.yaml").read_text())
CONTRACT = json.loads((REPO / "tests" / "contracts" / "netbox-4.4" / "contract.json").read_text())


@pytest.fixture(scope="module")
def cfg(dev_raw) -> FactoryConfig:
    return validate(dev_raw[0])


def h100(raw) -> dict:
    return raw["fleet"]["pools"][0]


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
    ("nic-numa", lambda r: _node(r, "gpu-h100-04")["nics"][0].update(numa_node=1), {"gpu-h100-04": "failed"}, "nics: missing ibp24s0 on NUMA 0; unexpected ibp24s0 on NUMA 1"),
    ("nic-missing", lambda r: _node(r, "gpu-h100-04")["nics"].pop(), {"gpu-h100-04": "failed"}, "missing ibp220s0 on NUMA 1"),
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
def test_recorded_results_give_each_node_its_verdict_and_taint(cfg, edit, expected, reason):
    results = copy.deepcopy(DEV_RESULTS)
    edit(results)
    found = {v.node: v for v in gates.evaluate(cfg, gates.Results.model_validate(results))}
    assert {n: v.verdict for n, v in found.items()} == {n: expected.get(n, "accepted") for n in H100}
    for node, v in found.items():
        assert v.taint == (None if v.verdict == "accepted" else {"key": gates.ACCEPTANCE_KEY, "value": v.verdict, "effect": "NoSchedule"})
    if reason:
        assert all(any(reason in r for r in found[n].reasons) for n in expected), {n: found[n].reasons for n in expected}


def test_every_node_reports_every_gate_in_order(cfg):
    assert {tuple(g.gate for g in v.gates) for v in _verdicts(cfg)} == {gates.GATES}


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


def test_an_accepted_node_takes_the_registration_taint_over_from_its_kubelet(dev):
    """The kubelet registered it tainted pending (provisioning's user data): the patch claims the
    whole atomic list, empty once accepted, and forces, so the taint goes with the verdict."""
    nodes = {o["metadata"]["name"]: o for o in objects(dev, "Node")}
    for name in H100:
        assert nodes[name]["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"
        assert "taints" in nodes[name]["spec"]
    assert not any(t["key"] == gates.ACCEPTANCE_KEY for t in nodes["gpu-h100-01"]["spec"]["taints"])
    others = [n for n, o in nodes.items() if n not in H100]
    assert others and not any("pulumi.com/patchForce" in (nodes[n]["metadata"].get("annotations") or {}) for n in others)


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


def _verdicts(cfg, edit=lambda r: None) -> list[gates.NodeVerdict]:
    results = copy.deepcopy(DEV_RESULTS)
    edit(results)
    return gates.evaluate(cfg, gates.Results.model_validate(results))


def test_records_are_written_as_the_rest_api_expects(cfg):
    session = Contract()
    api = netbox.connect(CONTRACT["base_url"], "token", session)
    written = netbox.write(api, [netbox.record(v) for v in _verdicts(cfg, _drop_gpu)])
    assert written == list(H100)
    writes = [(m, p) for m, p, _ in session.sent if m != "GET"]
    # The one existing custom field is not created again; one PATCH and one journal entry per node.
    assert writes == [("POST", "/api/extras/custom-fields/")] * 6 + [("PATCH", "/api/dcim/devices/"), ("POST", "/api/extras/journal-entries/")] * 4
    journals = [body for m, p, body in session.sent if p == "/api/extras/journal-entries/"]
    assert [(j["assigned_object_id"], j["kind"]) for j in journals] == [(101, "success"), (102, "danger"), (103, "success"), (104, "success")]
    patch = next(body for m, p, body in session.sent if m == "PATCH" and body[0]["id"] == 102)[0]["custom_fields"]
    assert patch["aif_acceptance"] == "failed" and len(patch["aif_gpus"]) == 7 and patch["aif_driver"] == "595.91.07"
    assert patch["aif_nccl"] == {"node_busbw_gbps": 481.0, "pair_busbw_gbps": {"gpu-h100-04": 349.8}}


def test_a_node_netbox_does_not_know_writes_nothing(cfg):
    session = Contract()
    api = netbox.connect(CONTRACT["base_url"], "token", session)
    records = [netbox.record(v) for v in _verdicts(cfg)]
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
        (["--apply", "--results", "x.yaml"], "--apply: it applies the config's"),
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
    applied = report.apply("dev", cfg, gates.node_verdicts(cfg), session=session)
    assert ups == ["dev"] and applied == report.Applied(list(H100))
    assert session.authorization == {"Token token-from-the-environment"}


def two_cluster_acceptance_project(directory: Path, without: tuple[str, ...] = ()) -> Path:
    """dev's two clusters with H100 nodes under acceptance on each: gpu-h100-01 and -03 stay on
    par1-a's pool, -02 and -04 (their rack pair) move to a twin pool on par1-b; NetBox configured;
    dev's results but those of the nodes `without` (pending)."""
    document = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())
    config = document["config"]
    pools = config["ai-factory:fleet"]["pools"]
    train = pools[0]
    moved = [n for n in train["node_list"] if n["name"] in ("gpu-h100-02", "gpu-h100-04")]
    train["node_list"] = [n for n in train["node_list"] if n not in moved]
    twin = {k: copy.deepcopy(v) for k, v in train.items() if k not in ("name", "cluster", "node_list", "network")}
    pools.append({**twin, "name": "h100-b", "cluster": "par1-b", "node_list": moved})
    search = config["ai-factory:tenants"][0]
    search["gpus"][0]["count"] = 8
    search["gpus"].append({"pool": "h100-b", "count": 8})
    search.pop("models")  # they need more of h100-train than is left there
    layers = config["ai-factory:layers"]
    layers["provisioning"]["pools"]["h100-b"] = copy.deepcopy(layers["provisioning"]["pools"]["h100-train"])
    layers["provisioning"]["netbox"] = {"url": CONTRACT["base_url"], "token": layers["openbao"]["admin_token"]}
    directory.mkdir()
    write_env(directory, document, name="dev")
    results = copy.deepcopy(DEV_RESULTS)
    results["nodes"] = {n: r for n, r in results["nodes"].items() if n not in without}
    (directory / "acceptance").mkdir()
    (directory / "acceptance" / "dev-results.yaml").write_text(yaml.safe_dump(results))
    return directory


@pytest.mark.parametrize(
    ("args", "without", "failing", "upped", "written", "lines", "status"),
    [
        ([], (), (), ["dev-par1-a", "dev-par1-b"], ["gpu-h100-01", "gpu-h100-03", "gpu-h100-02", "gpu-h100-04"],
         ["platform dev-par1-a: updated (1 create)", "platform dev-par1-b: updated (1 create)"], 0),
        ([], (), ("dev-par1-b",), ["dev-par1-a", "dev-par1-b"], ["gpu-h100-01", "gpu-h100-03"],
         ["platform dev-par1-a: updated (1 create)", "platform dev-par1-b: FAILED: error: the API server of par1-b is unreachable"], 1),
        ([], (), ("dev-par1-a", "dev-par1-b"), ["dev-par1-a", "dev-par1-b"], [], ["platform dev-par1-a: FAILED", "platform dev-par1-b: FAILED"], 1),
        (["--node", "gpu-h100-01"], (), ("dev-par1-b",), ["dev-par1-a"], ["gpu-h100-01"], ["platform dev-par1-a: updated (1 create)"], 0),
        ([], ("gpu-h100-02", "gpu-h100-04"), (), ["dev-par1-a"], ["gpu-h100-01", "gpu-h100-03"],
         ["platform dev-par1-b: not updated (no accepted or failed node); netbox records of gpu-h100-02, gpu-h100-04 not written"], 0),
    ],
    ids=["both-clusters-updated", "one-cluster-failing", "both-failing", "one-node-its-cluster-only", "only-pending-nodes-on-a-cluster"],
)
def test_accept_apply_updates_each_clusters_stack_and_records_only_the_updated_clusters_nodes(
        tmp_path, monkeypatch, capsys, args, without, failing, upped, written, lines, status):
    project = two_cluster_acceptance_project(tmp_path / "project", without)
    cli_ = FakePulumi({"ai-factory": lambda stack, config: Deployed(resources=[{"urn": f"urn:pulumi:{stack}::ai-factory::ai-factory:index:Platform::p", "type": "ai-factory:index:Platform"}])})
    for stack in failing:
        cli_.failing_stacks[stack] = f"error: the API server of {stack.removeprefix('dev-')} is unreachable"
    sessions: list[Contract] = []
    connect = netbox.connect

    def recorded(url, token, session=None):  # the CLI has no session to pass: the recorded contract's
        sessions.append(Contract())
        return connect(url, token, sessions[-1])

    monkeypatch.setattr(netbox, "connect", recorded)
    monkeypatch.setattr("ai_factory.stacks.backend.pulumi_cli", lambda: cli_)
    monkeypatch.setenv("AI_FACTORY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "ai-factory-dev")  # dev's published one
    monkeypatch.setenv(report.TOKEN_ENV, "token-from-the-environment")
    assert cli.main(["--project-dir", str(project), "accept", "dev", "--apply", *args]) == status
    captured = capsys.readouterr()
    assert sorted(c.stack.rsplit("/", 1)[-1] for c in cli_.operations("up")) == upped
    assert [line.removeprefix("netbox: wrote ") for line in captured.out.splitlines() if line.startswith("netbox: wrote ")] == written
    assert all(any(line in out for out in captured.out.splitlines()) for line in lines)
    patched = [body[0]["id"] for s in sessions for m, _, body in s.sent if m == "PATCH"]
    assert len(patched) == len(written)  # nothing of a failed cluster's nodes reaches NetBox
    if "dev-par1-b" in failing and "dev-par1-b" in upped:
        assert "netbox records of gpu-h100-02, gpu-h100-04 not written" in captured.err


def test_a_node_in_two_pairs_fails_on_a_low_pair_even_when_the_other_has_no_result(raw):
    h100(raw)["node_list"].pop()  # three nodes: gpu-h100-01 pairs with -03, and -02 with it
    cfg = validate(raw)
    assert gates.rack_pairs(cfg.fleet.pools[0].node_specs()) == [("gpu-h100-01", "gpu-h100-03"), ("gpu-h100-02", "gpu-h100-01")]
    results = copy.deepcopy(DEV_RESULTS)
    generation = results["nodes"]["gpu-h100-01"]["generation"]
    results["pairs"] = [{"nodes": ["gpu-h100-02", "gpu-h100-01"], "generations": [generation] * 2, "busbw_gbps": 40}]
    verdict = next(v for v in gates.evaluate(cfg, gates.Results.model_validate(results)) if v.node == "gpu-h100-01")
    assert verdict.verdict == "failed" and verdict.reasons == ["nccl-pair: with gpu-h100-02: 40 GB/s below 100"]


def test_with_the_layer_off_no_node_is_under_acceptance(raw):
    raw["layers"]["provisioning"]["enabled"] = False
    cfg = validate(raw)
    assert gates.subjects(cfg) == [] and gates.node_verdicts(cfg) == []
    assert not [o for o in objects(render(raw), "Node") if gates.ACCEPTANCE_KEY in o["metadata"]["labels"]]


def test_accept_apply_without_a_passphrase_says_so_and_updates_nothing(tmp_path, monkeypatch, capsys):
    project = two_cluster_acceptance_project(tmp_path / "project")
    cli_ = FakePulumi()
    monkeypatch.setattr("ai_factory.stacks.backend.pulumi_cli", lambda: cli_)
    for name in ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AI_FACTORY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv(report.TOKEN_ENV, "token-from-the-environment")
    assert cli.main(["--project-dir", str(project), "accept", "dev", "--apply"]) == 1
    assert "accept --apply: the passphrase secrets provider needs a passphrase" in capsys.readouterr().err
    assert cli_.calls == []
