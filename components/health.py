"""GPU health: faults become node conditions, faulty nodes are remediated within a blast radius,
and a remediation that does not bring a node back pages a person.

Detection: Node Problem Detector (deliveryhero chart) on every GPU node (node affinity on the
fleet's pool label, tolerating every taint the platform puts on GPU nodes), with a kernel-log
monitor (`/dev/kmsg`) for NVIDIA XID errors. Each XID is classified by `XID_TABLE` (overridable in
`layers.health.xid_classes`):
- `fatal`: permanent condition `GpuXidFatal=True` (reason `GpuXidFatal`) and a node event;
- `needs-reset`: permanent condition `GpuXidNeedsReset=True` and a node event;
- `informational`: a node event only (reason `GpuXidInformational`), no condition.

Remediation (default and only engine: medik8s Node Healthcheck with Self Node Remediation). Chosen
over NVSentinel because the blast radius must hold per pool and per site: a `NodeHealthCheck`
stops remediating when more than its `maxUnhealthy` nodes are unhealthy, so one per pool (with
`maxUnhealthy` resolved from config) bounds each pool, and the config refuses pool limits whose sum
exceeds their site's limit; NVSentinel's circuit breaker is one cluster-wide percentage of GPU
nodes. NVSentinel also needs its own datastore (MongoDB or PostgreSQL). The medik8s operators are
installed through OLM (no Helm chart exists upstream); this layer renders their custom resources.

The loop, per node (a bounded state machine; every state has an exit):
1. healthy -> a GPU fault condition holds `fault_minutes` -> the remediation step
   (`components/_gpu_remediation.py`, a CronJob) takes it: on a DRA pool whose ResourceSlice names
   the faulty GPU, that GPU alone is quarantined (see below) and the node stays in service;
   otherwise, if at most the pool's limit of nodes is unhealthy, the step records whether the node
   was already cordoned, cordons it and drains it
   through the Eviction API (PodDisruptionBudgets honoured) -> draining; beyond the limit no drain
   starts and `GpuRemediationBlastRadius` fires (a person decides);
2. draining -> no pod left -> the step sets `GpuDrained=True` -> unhealthy (for NHC, which watches
   that condition and Ready False/Unknown for `not_ready_minutes`, never the XID ones); a drain
   refused for `drain_timeout_minutes` raises `GpuDrainOverdue`: the node stays cordoned and is not
   rebooted (no pod a PodDisruptionBudget protects is deleted) until a person resolves it;
3. unhealthy -> if at most `maxUnhealthy` nodes of the pool are unhealthy, NHC creates a
   `SelfNodeRemediation` (remediating); otherwise nothing starts and `GpuRemediationBlastRadius`
   fires;
4. remediating: SNR taints the node `medik8s.io/remediation=self-node-remediation:NoExecute`, reboots
   it (watchdog, software reboot as fallback), and once it is safe adds
   `node.kubernetes.io/out-of-service`, so pods stuck on it (a NotReady node could not be drained)
   are deleted and their volumes detached; the reboot resets every GPU of the node;
5. after the reboot NPD starts with its conditions False; the step sets `GpuDrained=False` and
   uncordons the node (not one cordoned before the fault); NHC waits `healthy_delay_minutes`, deletes the SNR object, SNR removes its
   taints: back in service;
6. remediating longer than `reboot_timeout_minutes` -> NHC marks the remediation failed and stops;
   the node keeps its taints and `GpuRemediationOverdue` pages a person. A GPU node cordoned or
   faulty for longer than the whole loop may take raises the same alert whatever did it.

The medik8s CRDs have no drain-first strategy (SNR's `remediationStrategy` is Automatic,
ResourceDeletion or OutOfServiceTaint, all of which delete pods), and the oracles hold no Node
Maintenance Operator CRD; NVSentinel's node-drainer evicts, but its chart is not packaged here:
hence the step of our own, with `kubectl drain` (eviction, retried while a budget refuses it).

Per sharing mode, what the stack allows (conditions and remediation are per node):
- exclusive (device plugin): the device plugin itself marks a GPU with a critical XID unhealthy and
  withdraws it from allocatable, so new pods avoid that GPU before the node is remediated; it does
  not give it back when the fault clears (NVIDIA/gpu-operator#1065): the reboot does.
- mig: the device plugin withdraws the MIG devices of the faulted GPU; an XID names the GPU's PCI
  address, not an instance, and a reset or reboot takes every instance of the GPU (of the node)
  down. Quarantining one instance alone is not possible.
- time-slicing, hami: every replica or slice shares the faulted GPU; per node as exclusive.
- dra: the remediation step quarantines the GPU the XID line names (its PCI address, matched to the
  device's `resource.kubernetes.io/pciBusID` in the node's ResourceSlice) with a NoExecute
  `DeviceTaintRule` (KEP-5055; the template `ai-factory quarantine` writes,
  `factory/planning/quarantine.py`): new claims avoid it, the pods whose claims hold it (they have
  lost it) are evicted, and no other GPU of the node or its pods is touched; the node is neither
  drained nor rebooted, so the GPU stays out until a person reboots the node (`GpuRemediationOverdue`
  says so) and the step deletes the rule once the node's fault conditions are False. The step
  records each quarantine as the node condition `GpuQuarantined-gpu-<index>`: the availability
  rules debit that GPU's tenants alone, and the blast radius counts it 1/gpus-per-node of a node
  (`_unhealthy_measure`). This needs the
  DeviceTaintRule API served (1.33-1.35: the `DRADeviceTaints` feature gate); where the step cannot
  list the rules, or the slice names no such GPU, the node takes the drain path. The DRA driver's own
  `NVMLDeviceHealthCheck` gate (alpha) would withdraw the device from its ResourceSlice but neither
  evicts nor returns it without a driver restart; it is left off. Dynamic MIG partitions are
  devices of their own that the step does not taint (it taints the whole-GPU device).

One `PrometheusRule` (prometheus-operator's CRD) holds three groups: the loop's alerts (node
conditions, cordons and taints through kube-state-metrics); device alerts on the DCGM exporter's
default counters and on GPUs missing from a node's allocatable; and recording rules of each
tenant's unavailable GPU-equivalents (the plan's shares on unavailable nodes), the series form of
`factory/planning/credits.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components import _gpu_remediation as step
from ai_factory.components._common import POOL_LABEL, FactoryComponent, helm_release, labels, namespace, restricted_container
from ai_factory.components.gpu_operator import tolerations as gpu_node_tolerations
from ai_factory.components.registry import Layer
from ai_factory.factory.checking import health as health_checks
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig, Pool
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.model.raw import as_dict, as_list, did_you_mean
from ai_factory.factory.planning.credits import (
    DRA_DEVICE,
    GPU_QUARANTINED,
    NODE_UNAVAILABLE as UNAVAILABLE,
    QUARANTINE_CONDITION,
    TENANT_ENTITLED,
    TENANT_UNAVAILABLE,
    tenant_shares,
)
from ai_factory.factory.metering.rules import ksm_resource
from ai_factory.factory.planning.model import WHOLE_GPU, Plan, PoolPlan
from ai_factory.factory.planning.placement import advertised_name
from ai_factory.factory.planning.quarantine import FIRST_VERSION as TAINT_RULE_VERSION, taint_rule

TOKEN = "ai-factory:health:Health"
RELEASE = "node-problem-detector"
MONITOR_FILE = "gpu-xid-monitor.json"
NHC_API = "remediation.medik8s.io/v1alpha1"
SNR_API = "self-node-remediation.medik8s.io/v1alpha1"
PROMETHEUS_API = "monitoring.coreos.com/v1"
SNR_TEMPLATE = "ai-factory-gpu-reboot"
SNR_CONFIG = "self-node-remediation-config"
"""The one SelfNodeRemediationConfig the operator reads (it creates it with defaults otherwise)."""
NHC_PREFIX = "ai-factory-gpu-"
STEP = health_checks.STEP
"""The remediation step's CronJob, service account, role and ConfigMap (components/_gpu_remediation.py)."""
KUBECTL_IMAGE = "registry.k8s.io/kubectl:v{version}.0"
"""Kubernetes' own kubectl image (bash, jq and coreutils on debian-base), at the cluster's minor."""

CONDITION_FATAL = "GpuXidFatal"
CONDITION_RESET = "GpuXidNeedsReset"
REASON_INFORMATIONAL = "GpuXidInformational"
FAULT_CONDITIONS = (CONDITION_FATAL, CONDITION_RESET)

# Source: NVIDIA's Xid catalogue for Ampere and newer (docs.nvidia.com/deploy/xid-errors/
# analyzing-xid-catalog.html), column "Resolution Bucket (Immediate Action)", as cited in
# shared/reference/security-and-reliability.md section 7.1; the ECC rows (48, 63, 64) also from
# docs.nvidia.com/deploy/dynamic-page-retirement. XIDs the catalogue marks unused, and those not
# listed here, raise nothing; `layers.health.xid_classes` adds or reclassifies them.
XID_TABLE: dict[int, tuple[str, str, str]] = {
    # xid: (class, catalogue immediate action, meaning). Mapping of buckets to classes:
    # RESTART_APP / IGNORE -> informational (the application failed or nothing is wrong; the GPU is
    # fine); RESET_GPU -> needs-reset; RESTART_BM (node reboot) and CONTACT_SUPPORT -> fatal.
    8: ("informational", "RESTART_APP", "GPU stopped processing (channel idle timeout)"),
    13: ("informational", "RESTART_APP", "graphics engine exception"),
    31: ("informational", "RESTART_APP", "GPU memory page fault"),
    43: ("informational", "RESTART_APP", "GPU stopped processing after an application error"),
    45: ("informational", "IGNORE", "preemptive cleanup after a previous error"),
    48: ("needs-reset", "RESET_GPU", "double-bit ECC error"),
    63: ("needs-reset", "RESET_GPU", "ECC page retirement or row remapping recorded (takes effect at reset)"),
    64: ("fatal", "CONTACT_SUPPORT", "ECC page retirement or row remapping failed"),
    74: ("needs-reset", "RESET_GPU", "NVLink error"),
    79: ("fatal", "RESTART_BM", "GPU has fallen off the bus"),
    92: ("informational", "IGNORE", "high single-bit ECC error rate"),
    94: ("informational", "RESTART_APP", "contained ECC error"),
    95: ("needs-reset", "RESET_GPU", "uncontained ECC error"),
    119: ("needs-reset", "RESET_GPU", "GSP RPC timeout"),
    120: ("needs-reset", "RESET_GPU", "GSP error"),
    140: ("needs-reset", "RESET_GPU", "unrecovered ECC error"),
}
XID_LINE = r"NVRM: Xid \((PCI:)?[0-9a-fA-F:.]+\): ({codes}),.*"
"""A driver XID line, e.g. `NVRM: Xid (PCI:0000:c6:00): 79, pid=1101, name=python, GPU has fallen
off the bus.` NPD anchors a rule's pattern to the whole message, hence the trailing `.*`."""
XID_154_LINE = r"NVRM: Xid \((PCI:)?[0-9a-fA-F:.]+\): 154, .*{action}.*"
"""Xid 154 states the recovery the driver requires, e.g. `GPU recovery action changed from 0x0 (None)
to 0x2 (Node Reboot Required)`: the action decides the class."""
XID_154_ACTIONS = (("Node Reboot Required", "fatal"), ("GPU Reset Required", "needs-reset"), ("Drain and Reset", "needs-reset"))
KMSG_LOOKBACK = "720h"
"""NPD replays the kernel log this far back when it starts: a restarted NPD re-raises a fault the
node has not been rebooted out of (the kernel log starts empty at boot)."""


def xid_classes(overrides: dict[int, str]) -> dict[int, str]:
    """The class of every XID the monitor knows: the table, overridden by the config."""
    return {**{xid: row[0] for xid, row in XID_TABLE.items()}, **overrides}


def xid_monitor(classes: dict[int, str]) -> dict[str, Any]:
    """The NPD system-log monitor (kmsg plugin) for XID errors, as NPD reads it."""
    by_class: dict[str, list[int]] = {}
    for xid, cls in sorted(classes.items()):
        by_class.setdefault(cls, []).append(xid)
    condition_of = {"fatal": CONDITION_FATAL, "needs-reset": CONDITION_RESET}
    rules: list[dict[str, Any]] = []
    for cls in ("fatal", "needs-reset", "informational"):
        codes = "|".join(str(x) for x in by_class.get(cls, []))
        patterns = [XID_LINE.format(codes=codes)] if codes else []
        patterns += [XID_154_LINE.format(action=a) for a, c in XID_154_ACTIONS if c == cls]
        for pattern in patterns:
            if cls in condition_of:
                rules.append({"type": "permanent", "condition": condition_of[cls], "reason": condition_of[cls], "pattern": pattern})
            else:
                rules.append({"type": "temporary", "reason": REASON_INFORMATIONAL, "pattern": pattern})
    return {
        "plugin": "kmsg",
        "logPath": "/dev/kmsg",
        "lookback": KMSG_LOOKBACK,
        "bufferSize": 10,
        "source": "gpu-xid-monitor",
        "metricsReporting": True,
        "conditions": [
            {"type": CONDITION_FATAL, "reason": "NoGpuXidFatal", "message": "no fatal GPU XID error since boot"},
            {"type": CONDITION_RESET, "reason": "NoGpuXidNeedsReset", "message": "no GPU XID error requiring a reset since boot"},
        ],
        "rules": rules,
    }


@dataclass(frozen=True)
class PoolRemediation:
    pool: str
    site: str
    nodes: tuple[str, ...]
    max_unhealthy: int
    dra: bool
    """GPUs are DRA devices: a fault quarantines the GPU alone (a DeviceTaintRule), not the node."""
    gpus_per_node: int
    allocatable: tuple[str, int] | None
    """The GPU resource (kube-state-metrics spelling) and count every node should advertise; None
    where it depends on the node's MIG layout (mig) or nothing is advertised (dra)."""


def expected_allocatable(pool: Pool, planned: PoolPlan) -> tuple[str, int] | None:
    per_node = pool.gpu.per_node
    if pool.sharing == "exclusive":  # a VM pool's GPUs go by the sandbox device plugin's name
        return ksm_resource(advertised_name(planned, WHOLE_GPU)), per_node
    if pool.sharing == "time-slicing":
        return ksm_resource(advertised_name(planned, WHOLE_GPU)), per_node * pool.time_slicing.replicas
    if pool.sharing == "hami":
        return ksm_resource(WHOLE_GPU), per_node * pool.hami.split_count
    return None


@dataclass(frozen=True)
class HealthArgs:
    chart: ChartSource
    namespace: str
    remediation_namespace: str
    classes: dict[int, str]
    pools: tuple[PoolRemediation, ...]
    site_limits: dict[str, int]
    fault_minutes: int
    not_ready_minutes: int
    reboot_timeout_minutes: int
    healthy_delay_minutes: int
    drain_timeout_minutes: int
    kubernetes: str
    """The cluster's minor: the kubectl image and the DeviceTaintRule API (none before 1.33)."""
    dcgm: bool
    """The GPU Operator's DCGM exporter runs: its default counters feed the DCGM alerts."""
    tenant_nodes: dict[str, dict[str, float]]
    """GPU-equivalents each tenant holds per node (from the plan), for the availability rules."""
    tenant_dra_gpus: dict[str, dict[tuple[str, int], float]]
    """The same per GPU of the DRA pools, whose GPUs are quarantined one by one."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> HealthArgs:
        health = cfg.layers.health
        rem = health.remediation
        limits = health_checks.pool_limits(cfg)
        pools = tuple(
            PoolRemediation(
                pool=p.name,
                site=p.site,
                nodes=tuple(n.name for n in p.node_specs()),
                max_unhealthy=limits[p.name],
                dra=p.sharing == "dra",
                gpus_per_node=p.gpu.per_node,
                allocatable=expected_allocatable(p, plan.pool(p.name)),
            )
            for p in cfg.fleet.pools
        )
        return cls(
            chart=health.chart.source("node-problem-detector"),
            namespace=health.namespace,
            remediation_namespace=rem.namespace,
            classes=xid_classes(dict(health.xid_classes)),
            pools=pools,
            site_limits=health_checks.site_limits(cfg),
            fault_minutes=rem.fault_minutes,
            not_ready_minutes=rem.not_ready_minutes,
            reboot_timeout_minutes=rem.reboot_timeout_minutes,
            healthy_delay_minutes=rem.healthy_delay_minutes,
            drain_timeout_minutes=rem.drain_timeout_minutes,
            kubernetes=cfg.kubernetes.version,
            dcgm=cfg.layers.gpu_operator.enabled and cfg.layers.gpu_operator.dcgm_exporter,
            tenant_nodes=tenant_node_shares(plan),
            tenant_dra_gpus=tenant_gpu_shares(plan, {p.name for p in cfg.fleet.pools if p.sharing == "dra"}),
        )

    @property
    def loop_minutes(self) -> int:
        """The longest a node can legitimately be faulty or cordoned by the loop."""
        return max(self.fault_minutes + self.drain_timeout_minutes, self.not_ready_minutes) + self.reboot_timeout_minutes + self.healthy_delay_minutes

    @property
    def rule_api(self) -> str | None:
        """The DeviceTaintRule apiVersion the step writes, None where no pool is DRA or Kubernetes has none."""
        version = TAINT_RULE_VERSION.get(self.kubernetes)
        return f"resource.k8s.io/{version}" if version and any(p.dra for p in self.pools) else None


def chart_values(args: HealthArgs) -> dict[str, Any]:
    return {
        "settings": {
            "custom_monitor_definitions": {MONITOR_FILE: json.dumps(xid_monitor(args.classes), indent=2, sort_keys=True)},
            # The image's kernel monitor (OOM, hung tasks, kernel oops) next to the XID monitor; the
            # chart's docker and read-only monitors are left out: nodes run containerd.
            "log_monitors": ["/config/kernel-monitor.json", f"/custom-config/{MONITOR_FILE}"],
        },
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": sorted(p.pool for p in args.pools)}]}
                    ]
                }
            }
        },
        "tolerations": gpu_node_tolerations(),
        "metrics": {"enabled": True},
    }


def node_health_check_spec(args: HealthArgs, pool: PoolRemediation) -> dict[str, Any]:
    not_ready = f"{args.not_ready_minutes}m"
    return {
        "selector": {"matchLabels": {POOL_LABEL: pool.pool}},
        "maxUnhealthy": pool.max_unhealthy,
        "unhealthyConditions": [
            # Not the XID conditions: the remediation step sets this one once the node is drained
            # by eviction, so the reboot never deletes a pod a PodDisruptionBudget protects.
            {"type": step.DRAINED_CONDITION, "status": "True", "duration": "0s"},
            {"type": "Ready", "status": "False", "duration": not_ready},
            {"type": "Ready", "status": "Unknown", "duration": not_ready},
        ],
        # One step with a timeout rather than a bare template: the timeout is what ends the loop.
        "escalatingRemediations": [
            {
                "order": 0,
                "remediationTemplate": {
                    "apiVersion": SNR_API,
                    "kind": "SelfNodeRemediationTemplate",
                    "name": SNR_TEMPLATE,
                    "namespace": args.remediation_namespace,
                },
                "timeout": f"{args.reboot_timeout_minutes}m",
            }
        ],
        "healthyDelay": f"{args.healthy_delay_minutes}m",
    }


def _node_regex(nodes: Iterable[str]) -> str:
    return "|".join(n.replace(".", "\\\\.") for n in sorted(nodes))


def _in(nodes: Iterable[str]) -> str:
    return f'node=~"{_node_regex(nodes)}"'


def alert_rules(args: HealthArgs) -> list[dict[str, Any]]:
    """Alerts of the loop. Node sets are spelled out per pool (node names come from the fleet), so
    the rules need no node-label join in kube-state-metrics."""
    faults = "|".join(FAULT_CONDITIONS)
    loop = args.loop_minutes
    rules: list[dict[str, Any]] = [
        {
            "alert": "GpuXidFault",
            "expr": f'max by (node, condition) (kube_node_status_condition{{condition=~"{faults}",status="true"}}) == 1',
            "labels": {"severity": "warning"},
            "annotations": {"summary": "GPU XID fault on {{ $labels.node }} ({{ $labels.condition }}); remediation starts within the pool's blast radius"},
        }
    ]
    for pool in args.pools:
        nodes = _node_regex(pool.nodes)
        rules.append({
            "alert": "GpuDrainOverdue",
            # Faulty and cordoned (the step drains it) yet not drained: evictions are refused.
            "expr": (
                f'(max by (node) (kube_node_status_condition{{condition=~"{faults}",status="true",node=~"{nodes}"}}) == 1)'
                f' and on (node) (max by (node) (kube_node_spec_unschedulable{{node=~"{nodes}"}}) == 1)'
                f' unless on (node) (max by (node) (kube_node_status_condition{{condition="{step.DRAINED_CONDITION}",status="true",node=~"{nodes}"}}) == 1)'
            ),
            "for": f"{args.drain_timeout_minutes}m",
            "labels": {"severity": "critical", "pool": pool.pool},
            "annotations": {"summary": (
                f"{{{{ $labels.node }}}} (pool {pool.pool}) has not drained in {args.drain_timeout_minutes} minutes: a PodDisruptionBudget "
                "(or a pod no controller owns) refuses eviction; it stays cordoned and is not rebooted until a person resolves it"
            )},
        })
        quarantined = " (on this DRA pool a faulty GPU is quarantined alone: the node needs a reboot, when convenient, to reset it)" if pool.dra else ""
        rules.append({
            "alert": "GpuRemediationOverdue",
            "expr": (
                f'(max by (node) (kube_node_status_condition{{condition=~"{faults}",status="true",node=~"{nodes}"}}) == 1)'
                f' or (max by (node) (kube_node_spec_unschedulable{{node=~"{nodes}"}}) == 1)'
            ),
            "for": f"{loop}m",
            "labels": {"severity": "critical", "pool": pool.pool},
            "annotations": {"summary": f"{{{{ $labels.node }}}} (pool {pool.pool}) has been faulty or cordoned for over {loop} minutes, longer than remediation may take: a person must act{quarantined}"},
        })
        rules.append({
            "alert": "GpuRemediationBlastRadius",
            "expr": _unhealthy_measure([pool]) + f" > {pool.max_unhealthy}",
            "labels": {"severity": "critical", "pool": pool.pool},
            "annotations": {"summary": f"more than {pool.max_unhealthy} nodes of pool {pool.pool} are unhealthy: automatic remediation has stopped"},
        })
    for site, limit in sorted(args.site_limits.items()):
        rules.append({
            "alert": "GpuRemediationBlastRadius",
            "expr": _unhealthy_measure([p for p in args.pools if p.site == site]) + f" > {limit}",
            "labels": {"severity": "critical", "site": site},
            "annotations": {"summary": f"more than {limit} GPU nodes of site {site} are unhealthy: automatic remediation is at its limit"},
        })
    return rules


def _unhealthy_measure(pools: list[PoolRemediation]) -> str:
    """What the pools' nodes take of a blast radius, in nodes, as the remediation step counts it:
    each node with a GPU fault or not Ready once; on a DRA pool a node whose faulty GPUs are
    quarantined is not unhealthy, each quarantined GPU counts 1/gpus-per-node of a node instead."""
    selector = _in(n for p in pools for n in p.nodes)
    faults = "|".join(FAULT_CONDITIONS)
    fault = f'(max by (node) (kube_node_status_condition{{condition=~"{faults}",status="true",{selector}}}) == 1)'
    dra = [p for p in pools if p.dra]
    if not dra:
        return f'count({fault} or (max by (node) (kube_node_status_condition{{condition="Ready",status!="true",{selector}}}) == 1))'
    whole = (
        f"(({fault} unless on (node) ({_quarantined_gpus(selector)}))"
        f' or (max by (node) (kube_node_status_condition{{condition="Ready",status!="true",{selector}}}) == 1))'
    )
    gpus = [f"((count({_quarantined_gpus(_in(p.nodes))} unless on (node) {whole}) or vector(0)) / {p.gpus_per_node})" for p in dra]
    return f"((count({whole}) or vector(0)) + {' + '.join(gpus)})"


def tenant_gpu_shares(plan: Plan, pools: set[str]) -> dict[str, dict[tuple[str, int], float]]:
    """GPU-equivalents per tenant per (node, GPU index) of the given pools (`credits.tenant_shares`)."""
    shares: dict[str, dict[tuple[str, int], float]] = {}
    for pool in plan.pools:
        if pool.name not in pools:
            continue
        model = GPU_MODELS[pool.gpu_model]
        for node in pool.nodes:
            for gpu in node.gpus:
                for tenant, share in tenant_shares(model, pool, gpu).items():
                    shares.setdefault(tenant, {})[node.name, gpu.index] = share
    return {t: dict(sorted(g.items())) for t, g in sorted(shares.items())}


def tenant_node_shares(plan: Plan) -> dict[str, dict[str, float]]:
    """GPU-equivalents per tenant per node: its shares of the node's GPUs summed."""
    shares: dict[str, dict[str, float]] = {}
    for tenant, gpus in tenant_gpu_shares(plan, {p.name for p in plan.pools}).items():
        per_node = shares.setdefault(tenant, {})
        for (node, _), share in gpus.items():
            per_node[node] = round(per_node.get(node, 0.0) + share, 6)
    return {t: dict(sorted(n.items())) for t, n in sorted(shares.items())}


def availability_rules(args: HealthArgs) -> list[dict[str, Any]]:
    """Recording rules tying node health to tenants: a node is unavailable (1) while a GPU fault
    condition is True, it is not Ready, or remediation taints it; a tenant loses its GPU-equivalents
    on every such node. On a DRA pool a GPU the remediation step quarantined (its
    `GpuQuarantined-gpu-<index>` condition) is out and the node is not: its tenants lose their share
    of that GPU, nobody else anything; a fault takes the node out there only once the step cordons
    it (the drain path) and no GPU of it is quarantined. `sum_over_time` of the
    tenant series over a period, in hours, is the lost GPU-hours `factory/planning/credits.py`
    computes from the same inputs."""
    faults = "|".join(FAULT_CONDITIONS)
    fault = f'(max by (node) (kube_node_status_condition{{condition=~"{faults}",status="true"}}) == 1)'
    rules: list[dict[str, Any]] = []
    dra = [n for p in args.pools if p.dra for n in p.nodes]
    if dra:
        # A DRA node's fault takes it out once the step cordons it to drain it, unless the step
        # quarantined its faulty GPUs instead.
        others = [n for p in args.pools if not p.dra for n in p.nodes]
        rules.append({"record": GPU_QUARANTINED, "expr": _quarantined_gpus()})
        fault = (
            (f'(max by (node) (kube_node_status_condition{{condition=~"{faults}",status="true",{_in(others)}}}) == 1) or ' if others else "")
            + f'((max by (node) (kube_node_status_condition{{condition=~"{faults}",status="true",{_in(dra)}}}) == 1)'
            f" and on (node) (max by (node) (kube_node_spec_unschedulable{{{_in(dra)}}}) == 1) unless on (node) {GPU_QUARANTINED})"
        )
    rules.append({
        "record": UNAVAILABLE,
        "expr": (
            f"{fault}"
            ' or (max by (node) (kube_node_status_condition{condition="Ready",status!="true"}) == 1)'
            ' or (max by (node) (kube_node_spec_taint{key=~"medik8s.io/remediation|node.kubernetes.io/out-of-service"}) == 1)'
        ),
    })
    for tenant, nodes in args.tenant_nodes.items():
        terms = [f'({share} * {UNAVAILABLE}{{node="{node}"}})' for node, share in nodes.items()]
        # A quarantined GPU of a node that is unavailable as a whole is counted there, once.
        terms += [
            f'({round(share, 6)} * ({GPU_QUARANTINED}{{node="{node}",gpu="{gpu}"}} unless on (node) {UNAVAILABLE}{{node="{node}"}}))'
            for (node, gpu), share in args.tenant_dra_gpus.get(tenant, {}).items()
        ]
        rules.append({"record": TENANT_UNAVAILABLE, "expr": f"sum({' or '.join(terms)}) or vector(0)", "labels": {"tenant": tenant}})
        rules.append({"record": TENANT_ENTITLED, "expr": f"vector({round(sum(nodes.values()), 6)})", "labels": {"tenant": tenant}})
    return rules


def _quarantined_gpus(selector: str = "") -> str:
    """1 per (node, gpu index) the remediation step has quarantined, from its node conditions."""
    condition = f"{QUARANTINE_CONDITION}{DRA_DEVICE}"
    return (
        f'max by (node, gpu) (label_replace(kube_node_status_condition{{condition=~"{condition}[0-9]+",status="true"{"," * bool(selector)}{selector}}} == 1,'
        f' "gpu", "$1", "condition", "{condition}([0-9]+)"))'
    )


def dcgm_rules(args: HealthArgs) -> list[dict[str, Any]]:
    """Alerts on the DCGM exporter's default counters (the GPU Operator's): XIDs, uncorrectable
    ECC errors remapped into spare rows, a failed row remap; and a node advertising fewer GPUs than
    its pool has. ECC double-bit, thermal/power violation and NVLink CRC counters are not in the
    default counters, so no alert is written against them."""
    rules: list[dict[str, Any]] = []
    if args.dcgm:
        rules += [
            {
                "alert": "GpuXidReported",
                "expr": "DCGM_FI_DEV_XID_ERRORS > 0 and changes(DCGM_FI_DEV_XID_ERRORS[10m]) > 0",
                "labels": {"severity": "warning"},
                "annotations": {"summary": "GPU {{ $labels.gpu }} of {{ $labels.Hostname }} reported XID {{ $value }}"},
            },
            {
                "alert": "GpuUncorrectableEccRowsRemapped",
                "expr": "increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS[1h]) > 0",
                "labels": {"severity": "warning"},
                "annotations": {"summary": "GPU {{ $labels.gpu }} of {{ $labels.Hostname }} remapped rows after uncorrectable ECC errors; a reset applies the remap"},
            },
            {
                "alert": "GpuRowRemapFailed",
                "expr": "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
                "labels": {"severity": "critical"},
                "annotations": {"summary": "GPU {{ $labels.gpu }} of {{ $labels.Hostname }} could not remap a failing memory row: replace it"},
            },
        ]
    for pool in args.pools:
        if pool.allocatable is None:
            continue
        resource, count = pool.allocatable
        nodes = _node_regex(pool.nodes)
        rules.append({
            "alert": "GpuMissingFromAllocatable",
            # A node whose device plugin advertises nothing has no series: count it as 0.
            "expr": (
                f'(max by (node) (kube_node_status_allocatable{{resource="{resource}",node=~"{nodes}"}})'
                f' or on (node) (0 * max by (node) (kube_node_info{{node=~"{nodes}"}}))) < {count}'
            ),
            "for": "15m",
            "labels": {"severity": "warning", "pool": pool.pool},
            "annotations": {"summary": f"{{{{ $labels.node }}}} (pool {pool.pool}) advertises {{{{ $value }}}} {resource}, fewer than {count}: a GPU is unhealthy or lost"},
        })
    return rules


class Health(FactoryComponent):
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: HealthArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="health", opts=opts)
        object_labels = labels("health")
        # NPD reads the kernel log and the host's /var/log: privileged by nature.
        ns = namespace(self, args.namespace, pod_security="privileged")
        helm_release(self, RELEASE, args.chart, namespace=ns.metadata.name, values=chart_values(args), depends_on=[ns])
        # SNR agents reboot their node through its watchdog: privileged as well.
        remediation_ns = k8s.core.v1.Namespace(
            self.child_name("remediation-namespace"),
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=args.remediation_namespace,
                labels={**object_labels, **{f"pod-security.kubernetes.io/{m}": "privileged" for m in ("enforce", "audit", "warn")}},
            ),
            opts=self.child(),
        )
        k8s.apiextensions.CustomResource(
            self.child_name("snr-config"),
            api_version=SNR_API,
            kind="SelfNodeRemediationConfig",
            metadata={"name": SNR_CONFIG, "namespace": args.remediation_namespace, "labels": object_labels},
            # The agents must run on every GPU node, whatever the plan tainted it with.
            spec={"customDsTolerations": gpu_node_tolerations()},
            opts=self.child(depends_on=[remediation_ns]),
        )
        template = k8s.apiextensions.CustomResource(
            self.child_name("snr-template"),
            api_version=SNR_API,
            kind="SelfNodeRemediationTemplate",
            metadata={"name": SNR_TEMPLATE, "namespace": args.remediation_namespace, "labels": object_labels},
            spec={"template": {"spec": {"remediationStrategy": "OutOfServiceTaint"}}},
            opts=self.child(depends_on=[remediation_ns]),
        )
        remediation_step(self, args, object_labels, remediation_ns)
        for pool in args.pools:
            k8s.apiextensions.CustomResource(
                self.child_name(f"nhc-{pool.pool}"),
                api_version=NHC_API,
                kind="NodeHealthCheck",
                metadata={"name": f"{NHC_PREFIX}{pool.pool}", "labels": {**object_labels, POOL_LABEL: pool.pool}},
                spec=node_health_check_spec(args, pool),
                opts=self.child(depends_on=[template]),
            )
        k8s.apiextensions.CustomResource(
            self.child_name("alerts"),
            api_version=PROMETHEUS_API,
            kind="PrometheusRule",
            metadata={"name": "ai-factory-gpu-health", "namespace": args.namespace, "labels": object_labels},
            spec={"groups": [
                {"name": "ai-factory-gpu-health", "rules": alert_rules(args)},
                {"name": "ai-factory-gpu-devices", "rules": dcgm_rules(args)},
                {"name": "ai-factory-tenant-gpu-availability", "rules": availability_rules(args)},
            ]},
            opts=self.child(depends_on=[ns]),
        )
        self.namespace = ns.metadata.name
        self.register_outputs({"namespace": self.namespace})


def remediation_step(component: FactoryComponent, args: HealthArgs, object_labels: dict[str, str], ns: k8s.core.v1.Namespace) -> None:
    """The drain-by-eviction and DRA quarantine step (components/_gpu_remediation.py): its config,
    its least-privilege service account, and the CronJob running it once a minute."""
    meta = {"namespace": args.remediation_namespace, "labels": object_labels}
    account = k8s.core.v1.ServiceAccount(
        component.child_name("step-account"), metadata={"name": STEP, **meta}, opts=component.child(depends_on=[ns])
    )
    role = k8s.rbac.v1.ClusterRole(
        component.child_name("step-role"), metadata={"name": STEP, "labels": object_labels}, rules=step.RBAC_RULES, opts=component.child()
    )
    binding = k8s.rbac.v1.ClusterRoleBinding(
        component.child_name("step-binding"),
        metadata={"name": STEP, "labels": object_labels},
        role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": STEP},
        subjects=[{"kind": "ServiceAccount", "name": STEP, "namespace": args.remediation_namespace}],
        opts=component.child(depends_on=[role, account]),
    )
    rule = taint_rule(args.rule_api.split("/")[1], "NODE", "DEVICE", "NoExecute", step.MANAGED_BY) if args.rule_api else {}
    config = k8s.core.v1.ConfigMap(
        component.child_name("step-config"),
        metadata={"name": STEP, **meta},
        data={
            "decide.jq": step.DECIDE,
            "remediate.sh": step.SCRIPT,
            "pools.json": step.pools_file({p.pool: (p.max_unhealthy, p.gpus_per_node if p.dra else None) for p in args.pools}),
            "rule.json": json.dumps(rule, indent=2, sort_keys=True),
        },
        opts=component.child(depends_on=[ns]),
    )
    container = {
        "name": "step",
        "image": KUBECTL_IMAGE.format(version=args.kubernetes),
        "command": ["/bin/bash", "/etc/gpu-remediation/remediate.sh"],
        "env": step.environment(args.fault_minutes, args.rule_api),
        "volumeMounts": [{"name": "config", "mountPath": "/etc/gpu-remediation", "readOnly": True}, {"name": "tmp", "mountPath": "/tmp"}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": restricted_container(65534),
    }
    k8s.batch.v1.CronJob(
        component.child_name("step"),
        metadata={"name": STEP, **meta},
        spec={
            "schedule": "* * * * *",
            # One run at a time; a run is bounded (drains time out per node, the deadline ends it).
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 1,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {"spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": 600,
                "template": {
                    "metadata": {"labels": object_labels},
                    "spec": {
                        "serviceAccountName": STEP,
                        "restartPolicy": "Never",
                        "containers": [container],
                        "volumes": [{"name": "config", "configMap": {"name": STEP}}, {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
                    },
                },
            }},
        },
        opts=component.child(depends_on=[config, binding]),
    )


def remediation_limits(raw: dict[str, Any]) -> list[str]:
    """Blast-radius limits name real pools and sites, allow at least one node and at most the nodes
    there are; a site's pools together stay within the site's limit (one Node Healthcheck per pool
    counts only its own pool, so a site's limit holds only if its pools' limits add up under it)."""
    problems: list[str] = []
    fleet = as_dict(raw.get("fleet"))
    pools = as_list(fleet.get("pools"))
    site_names = {name for s in map(as_dict, as_list(fleet.get("sites"))) if isinstance(name := s.get("name"), str)}
    remediation = as_dict(as_dict(as_dict(raw.get("layers")).get("health")).get("remediation"))
    path = "layers.health.remediation"
    sizes: dict[str, tuple[str, int]] = {}
    for pool in map(as_dict, pools):
        name, site = pool.get("name"), pool.get("site")
        count = pool.get("nodes") if pool.get("node_list") is None else len(as_list(pool.get("node_list")))
        if isinstance(name, str) and isinstance(site, str) and isinstance(count, int) and count >= 1:
            sizes.setdefault(name, (site, count))
    overrides = as_dict(remediation.get("pools"))
    for name in overrides:
        if name not in sizes:
            problems.append(f"{path}.pools.{name}: unknown pool{did_you_mean(name, sizes)}")
    for name in as_dict(remediation.get("sites")):
        if name not in site_names:
            problems.append(f"{path}.sites.{name}: unknown site{did_you_mean(name, site_names)}")
    default = remediation.get("pool_limit", {"nodes": 1})
    per_site: dict[str, list[tuple[str, int]]] = {}
    for name, (site, count) in sorted(sizes.items()):
        limit_path, limit = (f"{path}.pools.{name}", overrides[name]) if name in overrides else (f"{path}.pool_limit", default)
        resolved, problem = _resolve_limit(limit_path, limit, count, f"pool {name}")
        if problem:
            problems.append(problem)
        if resolved is not None:
            per_site.setdefault(site, []).append((name, resolved))
    for site, limit in sorted(as_dict(remediation.get("sites")).items()):
        members = per_site.get(site, [])
        total = sum(sizes[name][1] for name, _ in members)
        if not members:
            continue
        resolved, problem = _resolve_limit(f"{path}.sites.{site}", limit, total, f"site {site}")
        if problem:
            problems.append(problem)
        elif resolved is not None and sum(n for _, n in members) > resolved:
            listed = ", ".join(f"{name} {n}" for name, n in members)
            problems.append(
                f"{path}.sites.{site}: the pools of site {site} may remediate {sum(n for _, n in members)} nodes at once "
                f"({listed}), more than the site's limit of {resolved}; lower a pool's limit or raise the site's"
            )
    return problems


def _resolve_limit(path: str, limit: Any, total: int, where: str) -> tuple[int | None, str | None]:
    """A well-formed limit in nodes out of `total` and the problem with it, if any (malformed
    limits are the field validation's to report)."""
    limit = as_dict(limit)
    nodes, percent = limit.get("nodes"), limit.get("percent")
    if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1 and percent is None:
        if nodes > total:
            return None, f"{path}.nodes: {nodes} is above the {total} node{'s' if total != 1 else ''} of {where}"
        return nodes, None
    if isinstance(percent, int) and not isinstance(percent, bool) and 1 <= percent <= 100 and nodes is None:
        resolved = total * percent // 100
        if resolved == 0:
            return None, f"{path}.percent: {percent}% of the {total} node{'s' if total != 1 else ''} of {where} is 0 nodes: nothing could ever be remediated"
        return resolved, None
    return None, None


LAYER = Layer(
    name="health",
    section="health",
    chart="node-problem-detector",
    component=Health,
    args=HealthArgs.from_config,
    requires=("fleet",),
    checks=(health_checks.detection_coverage, health_checks.remediation_blast_radius, health_checks.remediation_rbac),
    config_checks=(remediation_limits,),
    privileged_namespaces={
        "node-problem-detector": "Node Problem Detector: reads the kernel log (/dev/kmsg) and the host's /var/log",
        "medik8s": "Self Node Remediation agents: reboot their node through its watchdog device",
    },
    # The medik8s operators come from OLM; prometheus-operator from the metrics layer or the cluster.
    external_crds=("remediation.medik8s.io", "self-node-remediation.medik8s.io", "monitoring.coreos.com"),
)
