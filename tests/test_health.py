"""The health layer: XID lines become the right node conditions, the blast radius of config is what
the NodeHealthChecks allow, bad limits are refused with their path, and the layer's checks fail
when detection or the blast radius is broken."""

from __future__ import annotations

import copy
import json
import re

import promql_parser
import pytest

from ai_factory.components import health
from ai_factory.factory.checking import health as health_checks
from ai_factory.factory.model.config import SloTargets
from ai_factory.factory.planning.credits import credits
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.model.loading import ConfigError, validate
from ai_factory.factory.rendering.bundle import Manifest, Rendered
from tests.conftest import REPO, objects, one, render, run_main
from tests.test_scheduling import broken, dropped

NPD = ("HelmRelease", "node-problem-detector")
SNR_CONFIG = ("SelfNodeRemediationConfig", health.SNR_CONFIG)
STEP = ("ConfigMap", health.STEP)


def nhc(pool: str) -> tuple[str, str]:
    return "NodeHealthCheck", f"{health.NHC_PREFIX}{pool}"


# --------------------------------------------------------------------------- detection


def classify(monitor: dict, line: str) -> str | None:
    """What NPD does with a kernel line: the condition a permanent rule sets, the reason of a
    temporary one (an event), None when no rule matches. NPD anchors patterns to the whole line."""
    for rule in monitor["rules"]:
        if re.fullmatch(rule["pattern"], line):
            return rule.get("condition") or rule["reason"]
    return None


XID_LINES = [
    ("NVRM: Xid (PCI:0000:c6:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus.", "GpuXidFatal"),
    ("NVRM: Xid (PCI:0000:3b:00): 64, pid='<unknown>', name=<unknown>, Row remapper error", "GpuXidFatal"),
    ("NVRM: Xid (PCI:0000:3b:00): 48, pid=2211, name=python, An uncorrectable double bit error", "GpuXidNeedsReset"),
    ("NVRM: Xid (PCI:0000:3b:00): 74, pid=2211, name=python, NVLink: fatal error detected on link 3", "GpuXidNeedsReset"),
    ("NVRM: Xid (PCI:0000:3b:00): 95, pid=2211, name=python, Uncontained: FBHUB. RST: Yes, D-RST: No", "GpuXidNeedsReset"),
    ("NVRM: Xid (0000:03:00): 63, Row remapping event", "GpuXidNeedsReset"),
    ("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "GpuXidFatal"),
    ("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "GpuXidNeedsReset"),
    ("NVRM: Xid (PCI:0000:3b:00): 13, pid=2211, name=python, Graphics Exception: ESR 0x50", "GpuXidInformational"),
    ("NVRM: Xid (PCI:0000:3b:00): 31, pid=2211, name=python, Ch 00000008, intr 10000000. MMU Fault", "GpuXidInformational"),
    ("NVRM: Xid (PCI:0000:3b:00): 94, pid=2211, name=python, Contained: SM (0x1). RST: No, D-RST: No", "GpuXidInformational"),
    # Unlisted XIDs raise nothing; 7 must not match 79, nor 4 match 48.
    ("NVRM: Xid (PCI:0000:3b:00): 7, pid=2211, name=python", None),
    ("NVRM: Xid (PCI:0000:3b:00): 4, pid=2211, name=python", None),
    ("NVRM: GPU at PCI:0000:3b:00: GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7", None),
]


@pytest.mark.parametrize("line, expected", XID_LINES, ids=[e or "nothing" for _, e in XID_LINES])
def test_xid_lines_raise_their_class(line, expected):
    assert classify(health.xid_monitor(health.xid_classes({})), line) == expected


def test_xid_class_override_moves_an_xid():
    monitor = health.xid_monitor(health.xid_classes({31: "needs-reset", 79: "informational"}))
    assert classify(monitor, "NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=x, MMU Fault") == "GpuXidNeedsReset"
    assert classify(monitor, "NVRM: Xid (PCI:0000:c6:00): 79, pid=1, name=x, GPU has fallen off the bus.") == "GpuXidInformational"


def test_every_table_row_names_a_known_class_and_bucket():
    assert {row[0] for row in health.XID_TABLE.values()} <= {"fatal", "needs-reset", "informational"}
    assert {row[1] for row in health.XID_TABLE.values()} <= {"RESTART_APP", "IGNORE", "RESET_GPU", "RESTART_BM", "CONTACT_SUPPORT"}


def test_rendered_monitor_is_the_one_npd_loads(dev):
    values = one(dev, *NPD)["spec"]["values"]
    monitor = json.loads(values["settings"]["custom_monitor_definitions"][health.MONITOR_FILE])
    assert monitor == health.xid_monitor(health.xid_classes({}))
    assert f"/custom-config/{health.MONITOR_FILE}" in values["settings"]["log_monitors"]


# --------------------------------------------------------------------------- remediation


@pytest.fixture(scope="module")
def tuned(dev_raw) -> Rendered:
    """Dev with a blast radius of half the training pool and five nodes for the site."""
    raw = copy.deepcopy(dev_raw[0])
    raw["layers"]["health"]["remediation"] = {"pools": {"h100-train": {"percent": 50}}, "sites": {"par1": {"nodes": 5}}}
    return render(raw)


def _limits(rendered: Rendered) -> dict[str, int]:
    return {o["spec"]["selector"]["matchLabels"]["ai-factory.io/pool"]: o["spec"]["maxUnhealthy"] for o in objects(rendered, "NodeHealthCheck")}


def test_each_pool_has_one_node_health_check_at_its_limit(dev, tuned):
    assert _limits(dev) == {"h100-train": 1, "a100-mig": 1, "l40s-infer": 1, "h100-vm": 1}  # the default: one node
    assert _limits(tuned) == {"h100-train": 2, "a100-mig": 1, "l40s-infer": 1, "h100-vm": 1}  # half of h100-train's 4


def test_remediation_is_bounded_by_a_timeout_and_returns_nodes(dev):
    spec = one(dev, *nhc("h100-train"))["spec"]
    (step,) = spec["escalatingRemediations"]
    assert step["timeout"] == "30m" and step["remediationTemplate"]["kind"] == "SelfNodeRemediationTemplate"
    assert spec["healthyDelay"] == "10m"
    # A GPU fault reboots a node only once the remediation step has drained it by eviction.
    assert {(c["type"], c["status"]) for c in spec["unhealthyConditions"]} == {
        ("GpuDrained", "True"), ("Ready", "False"), ("Ready", "Unknown")}


def test_overdue_alert_fires_after_the_whole_loop(dev):
    rules = _rules(dev, "ai-factory-gpu-health")
    overdue = {r["labels"]["pool"]: r["for"] for r in rules if r["alert"] == "GpuRemediationOverdue"}
    # 1 min fault + 30 min drain timeout + 30 min reboot timeout + 10 min healthy delay.
    assert overdue == {"h100-train": "71m", "a100-mig": "71m", "l40s-infer": "71m", "h100-vm": "71m"}


def test_blast_radius_alerts_carry_the_limits(tuned):
    rules = _rules(tuned, "ai-factory-gpu-health")
    radius = {r["labels"].get("pool") or r["labels"]["site"]: r["expr"].rsplit(" > ", 1)[1] for r in rules if r["alert"] == "GpuRemediationBlastRadius"}
    assert radius == {"h100-train": "2", "a100-mig": "1", "l40s-infer": "1", "h100-vm": "1", "par1": "5"}


def _rules(rendered: Rendered, group: str) -> list[dict]:
    groups = one(rendered, "PrometheusRule", "ai-factory-gpu-health")["spec"]["groups"]
    return next(g["rules"] for g in groups if g["name"] == group)


def test_every_rendered_expression_is_promql(dev):
    groups = one(dev, "PrometheusRule", "ai-factory-gpu-health")["spec"]["groups"]
    exprs = [r["expr"] for g in groups for r in g["rules"]]
    assert len(exprs) > 10
    for expr in exprs:
        promql_parser.parse(expr)  # raises on a syntax error


def test_gpu_missing_from_allocatable_per_sharing_mode(dev):
    counts = {r["labels"]["pool"]: r["expr"].rsplit(" < ", 1)[1] for r in _rules(dev, "ai-factory-gpu-devices") if r["alert"] == "GpuMissingFromAllocatable"}
    # Whole GPUs: 8 per node; HAMi: 4 GPUs x split count 8; MIG depends on the node's layout.
    assert counts == {"h100-train": "8", "l40s-infer": "32", "h100-vm": "8"}
    # A VM pool's GPUs are advertised by the sandbox device plugin, under the device's name.
    [vm] = [r["expr"] for r in _rules(dev, "ai-factory-gpu-devices") if r["alert"] == "GpuMissingFromAllocatable" and r["labels"]["pool"] == "h100-vm"]
    assert 'resource="nvidia_com_GH100_H100_SXM5_80GB"' in vm


def test_availability_rules_agree_with_the_credit_computation(dev, dev_raw):
    rules = _rules(dev, "ai-factory-tenant-gpu-availability")
    entitled = {r["labels"]["tenant"]: float(r["expr"][len("vector("):-1]) for r in rules if r["record"] == health.TENANT_ENTITLED}
    computed = {c.tenant: c.entitled_gpu_hours for c in credits(plan_for(validate(dev_raw[0])), {t: "high" for t in entitled}, SloTargets(), [], 0, 3600)}
    assert entitled == pytest.approx(computed) and entitled["search"] == 19.75
    search = next(r["expr"] for r in rules if r.get("labels", {}).get("tenant") == "search" and r["record"] == health.TENANT_UNAVAILABLE)
    assert '1.75 * ai_factory:node_gpu_unavailable{node="a100-mig-001"}' in search and "gpu-h100-01" not in search


# --------------------------------------------------------------------------- bad input


def _health(raw: dict) -> dict:
    health = raw["layers"].setdefault("health", {})
    health.setdefault("remediation", {}).setdefault("pools", {})
    health["remediation"].setdefault("sites", {})
    return health


BAD_INPUT = [
    ("pool limit 0", lambda h: h["remediation"]["pools"].update({"a100-mig": {"nodes": 0}}),
     "layers.health.remediation.pools.a100-mig.nodes: must be >= 1"),
    ("pool limit above the pool", lambda h: h["remediation"]["pools"].update({"a100-mig": {"nodes": 3}}),
     "layers.health.remediation.pools.a100-mig.nodes: 3 is above the 2 nodes of pool a100-mig"),
    ("percentage of no node", lambda h: h["remediation"]["pools"].update({"a100-mig": {"percent": 10}}),
     "layers.health.remediation.pools.a100-mig.percent: 10% of the 2 nodes of pool a100-mig is 0 nodes"),
    ("both nodes and percent", lambda h: h["remediation"]["pools"].update({"a100-mig": {"nodes": 1, "percent": 50}}),
     "layers.health.remediation.pools.a100-mig: give exactly one of `nodes` or `percent`"),
    ("unknown pool", lambda h: h["remediation"]["pools"].update({"a100": {"nodes": 1}}),
     "layers.health.remediation.pools.a100: unknown pool (did you mean 'a100-mig'?)"),
    ("site limit 0", lambda h: h["remediation"]["sites"].update({"par1": {"nodes": 0}}),
     "layers.health.remediation.sites.par1.nodes: must be >= 1"),
    ("site limit above the site", lambda h: h["remediation"]["sites"].update({"par1": {"nodes": 10}}),
     "layers.health.remediation.sites.par1.nodes: 10 is above the 9 nodes of site par1"),
    ("pools over the site", lambda h: h["remediation"]["sites"].update({"par1": {"nodes": 2}}),
     "layers.health.remediation.sites.par1: the pools of site par1 may remediate 4 nodes at once"),
    ("SLO target 1", lambda h: h.setdefault("slo", {}).update({"high": 1}), "layers.health.slo.high: Input should be less than 1"),
    ("SLO target 0", lambda h: h.setdefault("slo", {}).update({"low": 0}), "layers.health.slo.low: must be > 0"),
    ("drain timeout 0", lambda h: h["remediation"].update({"drain_timeout_minutes": 0}),
     "layers.health.remediation.drain_timeout_minutes: must be >= 1"),
    ("unknown XID class", lambda h: h.setdefault("xid_classes", {}).update({79: "reboot"}),
     "layers.health.xid_classes[79]: must be one of 'fatal', 'needs-reset' or 'informational'"),
]


@pytest.mark.parametrize("change, message", [r[1:] for r in BAD_INPUT], ids=[r[0] for r in BAD_INPUT])
def test_bad_health_config_names_its_path(raw, change, message):
    change(_health(raw))
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems


def test_bad_blast_radius_exits_2_without_traceback(tmp_path):
    text = (REPO / "Pulumi.dev.yaml").read_text().replace(
        "    health:\n      enabled: true\n", "    health:\n      enabled: true\n      remediation: {pools: {h100-train: {nodes: 0}}}\n", 1)
    (tmp_path / "Pulumi.broken.yaml").write_text(text)
    proc = run_main("render", str(tmp_path / "Pulumi.broken.yaml"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "layers.health.remediation.pools.h100-train.nodes: must be >= 1" in proc.stderr
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- checks


def _add_node(rendered: Rendered, name: str, labels: dict, taints: list) -> Rendered:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}}
    return Rendered(rendered.config, rendered.kubernetes_version, [*rendered.manifests, Manifest(node, "fleet", None, "test")], rendered.inventory)


def _npd_values(change):
    return lambda obj: change(obj["spec"]["values"])


COVERAGE = [
    ("accepts dev", lambda r: r, []),
    ("flags a pool NPD does not select",
     lambda r: broken(r, *NPD, _npd_values(lambda v: v["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"].remove("a100-mig"))),
     ["Node/a100-mig-000: no Node Problem Detector", "Node/a100-mig-001: no Node Problem Detector"]),
    ("flags a taint NPD does not tolerate",
     lambda r: broken(r, *NPD, _npd_values(lambda v: v.update(tolerations=[t for t in v["tolerations"] if t["key"] != "ai-factory.io/dedicated"]))),
     ["Node/gpu-h100-01: no Node Problem Detector"]),
    ("flags a node selector leaving nodes out",
     lambda r: broken(r, *NPD, _npd_values(lambda v: v.update(nodeSelector={"ai-factory.io/pool": "h100-train"}))),
     ["Node/a100-mig-000: no Node Problem Detector", "Node/l40s-infer-001: no Node Problem Detector"]),
    ("flags a GPU node with an unknown taint",
     lambda r: _add_node(r, "gpu-h100-05", {"ai-factory.io/pool": "h100-train", "ai-factory.io/site": "par1"}, [{"key": "example.com/maintenance", "effect": "NoExecute"}]),
     ["Node/gpu-h100-05: no Node Problem Detector", "Node/gpu-h100-05: no Self Node Remediation agent"]),
    ("flags a pool no NodeHealthCheck selects", lambda r: dropped(r, *nhc("l40s-infer")),
     ["Node/l40s-infer-000: no NodeHealthCheck", "Node/l40s-infer-001: no NodeHealthCheck"]),
    ("flags SNR agents kept off tainted nodes", lambda r: broken(r, *SNR_CONFIG, lambda o: o["spec"].update(customDsTolerations=[])),
     ["Node/a100-mig-000: no Self Node Remediation agent", "Node/gpu-h100-01: no Self Node Remediation agent"]),
    ("flags every node without NPD", lambda r: dropped(r, *NPD), ["Node/gpu-h100-01: no Node Problem Detector"]),
    ("flags a pool the remediation step leaves out",
     lambda r: broken(r, *STEP, lambda o: o["data"].update({"pools.json": json.dumps({"h100-train": {"limit": 1, "dra": False}, "a100-mig": {"limit": 1, "dra": False}})})),
     ["Node/l40s-infer-000: the remediation step does not take", "Node/l40s-infer-001: the remediation step does not take"]),
    ("flags a render without the remediation step", lambda r: dropped(r, *STEP), ["Node/gpu-h100-01: the remediation step does not take"]),
    ("flags a pools list in another ConfigMap", lambda r: broken(r, *STEP, lambda o: o["metadata"].update(name="other")), ["Node/gpu-h100-01: the remediation step does not take"]),
    ("flags an unreadable step config", lambda r: broken(r, *STEP, lambda o: o["data"].update({"pools.json": "["})), ["Node/a100-mig-000: the remediation step does not take"]),
]


@pytest.mark.parametrize("change, expected", [r[1:] for r in COVERAGE], ids=[r[0] for r in COVERAGE])
def test_detection_coverage(dev, change, expected):
    found = [str(f) for f in health_checks.detection_coverage(change(dev), None)]
    assert all(any(e in f for f in found) for e in expected), found
    assert bool(found) == bool(expected), found


def _with_site_limit(rendered: Rendered, raw: dict, nodes: int) -> Rendered:
    """The render judged against a config whose site limit is lower than its objects were made for."""
    raw = copy.deepcopy(raw)
    raw["layers"]["health"]["remediation"] = {"sites": {"par1": {"nodes": nodes}}}
    return Rendered(validate(raw), rendered.kubernetes_version, rendered.manifests, rendered.inventory)


def _step_pool(pool: str, **settings) -> "callable":
    """Change one pool's settings in the remediation step's pools.json."""
    def change(obj: dict) -> None:
        pools = json.loads(obj["data"]["pools.json"])
        pools[pool].update(settings)
        obj["data"]["pools.json"] = json.dumps(pools)
    return change


BLAST_RADIUS = [
    ("accepts dev", lambda r, raw: r, []),
    ("flags a step draining more nodes than the pool's limit", lambda r, raw: broken(r, *STEP, _step_pool("h100-train", limit=2)),
     ["ConfigMap/medik8s/ai-factory-gpu-remediation (pools.json, pool h100-train): the remediation step may take 2 nodes at once, above the pool's limit of 1"]),
    ("flags a step limit that is no count", lambda r, raw: broken(r, *STEP, _step_pool("a100-mig", limit="1")),
     ["(pools.json, pool a100-mig): limit '1' is not a node count of at least 1"]),
    ("flags a step limit of zero", lambda r, raw: broken(r, *STEP, _step_pool("a100-mig", limit=0)), ["(pools.json, pool a100-mig): limit 0 is not a node count"]),
    ("flags GPUs per node that are no count", lambda r, raw: broken(r, *STEP, _step_pool("a100-mig", gpus=0)),
     ["(pools.json, pool a100-mig): gpus 0 is not a GPU count of at least 1"]),
    ("flags a DRA pool counting a GPU for less than its share", lambda r, raw: broken(r, *STEP, _step_pool("h100-train", dra=True, gpus=9)),
     ["(pools.json, pool h100-train): counts a quarantined GPU as 1/9 of a node, but the pool's nodes have 8 GPUs"]),
    ("accepts a DRA pool counting a GPU as its share", lambda r, raw: broken(r, *STEP, _step_pool("h100-train", dra=True, gpus=8)), []),
    ("accepts a DRA pool counting a GPU for more than its share", lambda r, raw: broken(r, *STEP, _step_pool("h100-train", dra=True, gpus=4)), []),
    ("reads pools.json from the step's ConfigMap alone",
     lambda r, raw: _with(r, [Manifest({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": health.STEP, "namespace": "medik8s"},
                                        "data": {"pools.json": json.dumps({"h100-train": {"limit": 0}})}}, "health", None, "test")]), []),
    ("flags maxUnhealthy above the pool's limit", lambda r, raw: broken(r, *nhc("h100-train"), lambda o: o["spec"].update(maxUnhealthy=3)),
     ["ai-factory-gpu-h100-train: may remediate 3 nodes at once, above the limit of its pools (h100-train 1)"]),
    ("flags a percentage above the limit", lambda r, raw: broken(r, *nhc("a100-mig"), lambda o: o["spec"].update(maxUnhealthy="100%")),
     ["ai-factory-gpu-a100-mig: may remediate 2 nodes at once"]),
    ("flags minHealthy instead of maxUnhealthy",
     lambda r, raw: broken(r, *nhc("a100-mig"), lambda o: (o["spec"].pop("maxUnhealthy"), o["spec"].update(minHealthy="51%"))),
     ["ai-factory-gpu-a100-mig: bounds healthy nodes (minHealthy)"]),
    ("flags no bound at all", lambda r, raw: broken(r, *nhc("a100-mig"), lambda o: o["spec"].pop("maxUnhealthy")),
     ["ai-factory-gpu-a100-mig: sets no maxUnhealthy"]),
    ("flags a bound that is no count", lambda r, raw: broken(r, *nhc("a100-mig"), lambda o: o["spec"].update(maxUnhealthy="half")),
     ["ai-factory-gpu-a100-mig: maxUnhealthy 'half' is not a node count or a percentage"]),
    ("flags a selector spanning pools", lambda r, raw: broken(r, *nhc("a100-mig"), lambda o: o["spec"].update(selector={})),
     ["Node/gpu-h100-01: selected by 2 NodeHealthChecks", "Node/l40s-infer-000: selected by 2 NodeHealthChecks"]),
    ("flags a bound of zero", lambda r, raw: broken(r, *nhc("a100-mig"), lambda o: o["spec"].update(maxUnhealthy=0)),
     ["ai-factory-gpu-a100-mig: maxUnhealthy 0 allows no remediation at all"]),
    ("accepts objects at the site's limit", lambda r, raw: _with_site_limit(r, raw, 4), []),
    ("counts a check at most its nodes of the site",
     lambda r, raw: _with_site_limit(broken(r, *nhc("a100-mig"), lambda o: o["spec"].update(maxUnhealthy=5)), raw, 4),
     ["site/par1: NodeHealthChecks may remediate 5 nodes of the site at once"]),
    ("flags objects above the site's limit",
     lambda r, raw: _with_site_limit(broken(r, *nhc("h100-train"), lambda o: o["spec"].update(maxUnhealthy=2)), raw, 4),
     ["site/par1: NodeHealthChecks may remediate 5 nodes of the site at once"]),
]


@pytest.mark.parametrize("change, expected", [r[1:] for r in BLAST_RADIUS], ids=[r[0] for r in BLAST_RADIUS])
def test_remediation_blast_radius(dev, dev_raw, change, expected):
    found = [str(f) for f in health_checks.remediation_blast_radius(change(dev, dev_raw[0]), None)]
    assert all(any(e in f for f in found) for e in expected), found
    assert bool(found) == bool(expected), found


# The RBAC Node Problem Detector's chart binds its service account to (its kind of rules: read
# nodes, patch their status, write events); `RBAC` rows change it or add bindings beside it.
NPD_ACCOUNT = {"kind": "ServiceAccount", "name": "node-problem-detector", "namespace": "node-problem-detector"}
NPD_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
]
DRAIN_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
]


def _rbac(name: str, rules: list[dict] | None, subject: dict, namespace: str | None = None, role_kind: str = "ClusterRole") -> list[Manifest]:
    """A role (unless None) and its binding: cluster-wide, or in `namespace`."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": role_kind, "metadata": {"name": name, **({"namespace": namespace} if role_kind == "Role" else {})}, "rules": rules}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        "subjects": [subject],
    }
    return [Manifest(o, "health", None, "chart:test") for o in ([role] if rules is not None else []) + [binding]]


def _with(rendered: Rendered, *objects: list[Manifest]) -> Rendered:
    extra = [m for group in objects for m in group]
    return Rendered(rendered.config, rendered.kubernetes_version, [*rendered.manifests, *extra], rendered.inventory)


SNR_ACCOUNT = {"kind": "ServiceAccount", "name": "self-node-remediation-controller-manager", "namespace": "medik8s"}
TENANT_ACCOUNT = {"kind": "ServiceAccount", "name": "runner", "namespace": "tenant-search"}
RBAC = [
    ("accepts NPD's rules", [_rbac("npd", NPD_RULES, NPD_ACCOUNT)], []),
    ("accepts a drain that evicts", [_rbac("drain", DRAIN_RULES, SNR_ACCOUNT)], []),
    ("accepts reading Secrets of its own namespace", [_rbac("own", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}], SNR_ACCOUNT, "medik8s", "Role")], []),
    ("ignores accounts of other namespaces", [_rbac("tenant", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}], TENANT_ACCOUNT)], []),
    ("flags reading Secrets cluster-wide",
     [_rbac("npd", [*NPD_RULES, {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}], NPD_ACCOUNT)],
     ["ClusterRoleBinding/npd: grants ServiceAccount node-problem-detector/node-problem-detector ClusterRole/npd with reads Secrets in every namespace"]),
    ("flags reading a tenant's Secrets",
     [_rbac("peek", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["watch"]}], SNR_ACCOUNT, "tenant-search")],
     ["RoleBinding/tenant-search/peek: grants ServiceAccount medik8s/self-node-remediation-controller-manager ClusterRole/peek with reads Secrets in namespace tenant-search"]),
    ("flags deleting pods instead of evicting them",
     [_rbac("drain", [*DRAIN_RULES, {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}], SNR_ACCOUNT)],
     ["deletes pods in every namespace: a drain must evict"]),
    ("flags deleting pods by collection", [_rbac("drain", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["deletecollection"]}], SNR_ACCOUNT)],
     ["deletes pods in every namespace"]),
    ("flags wildcards", [_rbac("drain", [{"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}], SNR_ACCOUNT)], ["with wildcard resources, reads Secrets in every namespace"]),
    ("flags a wildcard API group", [_rbac("drain", [{"apiGroups": ["*"], "resources": ["nodes"], "verbs": ["get"]}], SNR_ACCOUNT)], ["with wildcard apiGroups: get on */nodes"]),
    ("flags a wildcard verb", [_rbac("drain", [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["*"]}], SNR_ACCOUNT)], ["with wildcard verbs: * on core/nodes"]),
    ("flags escalation", [_rbac("drain", [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind", "escalate"]}], SNR_ACCOUNT)],
     ["with verb bind, verb escalate"]),
    ("flags the namespace's service-account group", [_rbac("all", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}], {"kind": "Group", "name": "system:serviceaccounts:medik8s"})],
     ["grants Group system:serviceaccounts:medik8s ClusterRole/all with reads Secrets"]),
    ("flags a role it cannot see, and goes on", [_rbac("missing", None, NPD_ACCOUNT), _rbac("peek", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}], SNR_ACCOUNT)],
     ["binds ServiceAccount node-problem-detector/node-problem-detector to ClusterRole/missing, which is not in the rendered set", "ClusterRole/peek with reads Secrets"]),
]


@pytest.mark.parametrize("added, expected", [r[1:] for r in RBAC], ids=[r[0] for r in RBAC])
def test_remediation_rbac(dev, added, expected):
    found = [str(f) for f in health_checks.remediation_rbac(_with(dev, *added), None)]
    assert all(any(e in f for f in found) for e in expected), found
    assert len(found) == len(expected), found
