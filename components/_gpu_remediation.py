"""The health layer's remediation step (`components/health.py`): a CronJob, once a minute, that
drains a GPU-faulty node through the Eviction API before medik8s reboots it, and on a DRA pool
quarantines the faulty GPU alone.

Why a step of our own: Self Node Remediation deletes pods (it presumes the node dead) and the
medik8s CRDs offer no drain-first strategy (`remediationStrategy` is Automatic, ResourceDeletion or
OutOfServiceTaint); NVSentinel's node-drainer evicts, but NVSentinel is not in the chart cache and
needs its own datastore. `kubectl drain` evicts through `pods/eviction`, which the API server
refuses (429) while a PodDisruptionBudget would be broken, and retries until its timeout.

The decision is one jq program (`DECIDE`) over the GPU nodes, the ResourceSlices and the
quarantine rules, printing one action a line; the shell script (`SCRIPT`) only carries them out,
so the state machine is tested on recorded objects (tests/test_health_drain.py). Per node:

- faulty (a `GpuXidFatal`/`GpuXidNeedsReset` condition True for `fault_minutes`), on a DRA pool,
  and every GPU its fault conditions name (the XID line's PCI address) found in the node's
  ResourceSlice: `quarantine` - one NoExecute DeviceTaintRule per GPU (pods whose claims hold it
  have lost it already; the node's other GPUs and their pods are untouched) and the node condition
  `GpuQuarantined-<device>=True` (what kube-state-metrics shows of it), no drain, no reboot;
- otherwise faulty: `drain` - annotate (`draining` if the node was schedulable, `draining-cordoned-
  before` if it was already cordoned: a person's cordon outlives the loop), cordon, evict
  (PodDisruptionBudgets honoured, bounded per run), and once no pod is left set the node condition
  `GpuDrained=True`: that condition, not the XID one, is what the pool's NodeHealthCheck
  remediates (reboots) on. A drain still incomplete after `drain_timeout_minutes` raises
  `GpuDrainOverdue`: the node stays cordoned, unrebooted, and a person resolves what blocks it (the
  step keeps retrying);
- more of the pool unhealthy than its blast radius: `hold` - no new drain or quarantine starts (as
  the NodeHealthCheck starts no remediation), `GpuRemediationBlastRadius` fires. An unhealthy node
  counts one node; on a DRA pool a quarantined (or to be quarantined) GPU counts 1/gpus of one;
- drained by the step, no fault left and Ready (it rebooted): `release` - `GpuDrained=False`,
  uncordon unless it was cordoned before, annotation removed; the NodeHealthCheck then ends its
  remediation;
- a quarantine rule or condition whose node has no fault left (the reboot reset the GPU):
  `unquarantine` - the rule deleted, the condition False.
"""

from __future__ import annotations

import json
from typing import Any

from ai_factory.factory.planning.credits import QUARANTINE_CONDITION

DRAIN_ANNOTATION = "ai-factory.io/gpu-drain"
"""Set on a node the step drains, before it cordons it (and counted against the blast radius)."""
DRAINING = "draining"
"""The annotation's value when the node was schedulable: the step cordoned it, so it uncordons it."""
CORDONED_BEFORE = "draining-cordoned-before"
"""The value when the node was already cordoned (by a person, for a reason of theirs): released, it
stays cordoned."""
QUARANTINED = QUARANTINE_CONDITION
"""The node condition, then the device's name, True while the step's DeviceTaintRule quarantines it:
what kube-state-metrics shows of the quarantine (it exports no DeviceTaintRule), for the tenants'
availability rules and the blast radius (`components/health.py`)."""
DRAINED_CONDITION = "GpuDrained"
MANAGED_BY = {"app.kubernetes.io/managed-by": "ai-factory-gpu-remediation"}
"""The label of the quarantine rules the step writes (and alone deletes)."""
DRAIN_STEP_SECONDS = 40
"""One run's `kubectl drain --timeout` per node: runs repeat each minute, the alert bounds the total."""

DECIDE = r"""
# Inputs: $nodes, $slices, $rules (kubectl List objects, slurped), $pools ({pool: {limit, dra, gpus}}),
# $now (epoch seconds), $fault_seconds, $quarantine (whether DeviceTaintRules can be written).
def cond($n; $type): [($n.status.conditions // [])[] | select(.type == $type)] | first // {};
def faults($n): [($n.status.conditions // [])[] | select((.type == "GpuXidFatal" or .type == "GpuXidNeedsReset") and .status == "True")];
# The GPUs the node's conditions say are quarantined.
def marks($n): [($n.status.conditions // [])[] | select(.status == "True" and (.type | startswith("QUARANTINED"))) | .type | ltrimstr("QUARANTINED")];
# A PCI address as "domain:bus:device" without leading zeros in the domain, lower case: the XID line
# prints 0000:c6:00, the DRA driver's pciBusID 0000:c6:00.0.
def pcis: [ascii_downcase | scan("([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})") | "\(.[0] | sub("^0+"; "")):\(.[1]):\(.[2])"];
def gpus($node): [$slices[0].items[]? | select(.spec.nodeName == $node and .spec.driver == "gpu.nvidia.com") | .spec.devices[]?
  | (.attributes // .basic.attributes // {}) as $a | select(($a.type.string // "gpu") == "gpu")
  | {name, pci: (($a["resource.kubernetes.io/pciBusID"].string // "") | pcis | first)}];
[$nodes[0].items[] | (.metadata.labels["ai-factory.io/pool"]) as $pool | select($pools[$pool] != null)
  | .metadata.name as $name | faults(.) as $faults | ($faults | map(.message // "" | pcis[]) | unique) as $named
  | ([gpus($name)[] | select(.pci as $p | $named | index($p))] | map(.name) | unique) as $devices
  | {name: $name, pool: $pool,
     faulty: ($faults | length > 0),
     due: (($faults | length > 0) and ($now - ($faults | map(.lastTransitionTime | fromdateiso8601) | min) >= $fault_seconds)),
     ready: (cond(.; "Ready").status == "True"),
     mark: .metadata.annotations["DRAIN_ANNOTATION"],
     cordoned: (.spec.unschedulable == true),
     drained: (cond(.; "DRAINED_CONDITION").status == "True"),
     marks: marks(.),
     held: [$rules[0].items[]? | select(.spec.deviceSelector.pool == $name) | .spec.deviceSelector.device],
     devices: (if $pools[$pool].dra and $quarantine and ($named | length > 0) and ($devices | length) == ($named | length) then $devices else [] end)}
  | .marked = (.mark != null)
  | .unhealthy = ((.faulty and (.devices | length) == 0) or (.ready | not) or .marked)
  # The node's share of its pool's blast radius, in GPUs of a DRA pool (each quarantined or faulty
  # GPU one, an unhealthy node all of its GPUs), in nodes elsewhere.
  | .weight = (if .unhealthy then ($pools[$pool].gpus // 1) else (.held + .devices | unique | length) end)] as $states
| ($states | group_by(.pool) | map({key: .[0].pool, value: map(.weight) | add}) | from_entries) as $used
| ($states[] | . as $s | ($used[$s.pool] <= $pools[$s.pool].limit * ($pools[$s.pool].gpus // 1)) as $within
  | (if $s.due then $s.devices else [] end) as $wanted
  | ($wanted[] | select(. as $d | [$s.held, $s.marks] | any(index($d) | not))
     | if ($s.held | index([.])) or $within then "quarantine \($s.name) \(.)" else "hold \($s.name) \(.)" end),
    ($s.held + $s.marks | unique[] | select(. as $d | $wanted | index($d) | not) | "unquarantine \($s.name) \(.)"),
    (if $s.marked and ($s.faulty | not) and $s.ready then "release \($s.name) \(if $s.mark == "DRAINING" then "uncordon" else "keep-cordoned" end)"
     elif $s.due and ($s.devices | length) == 0 and ($s.drained | not) then
       (if $s.marked or $within then "drain \($s.name) \($s.mark // (if $s.cordoned then "CORDONED_BEFORE" else "DRAINING" end))" else "hold \($s.name)" end)
     else empty end))
""".replace("DRAIN_ANNOTATION", DRAIN_ANNOTATION).replace("DRAINED_CONDITION", DRAINED_CONDITION).replace("QUARANTINED", QUARANTINED)
DECIDE = DECIDE.replace("CORDONED_BEFORE", CORDONED_BEFORE).replace("DRAINING", DRAINING)

SCRIPT = r"""#!/bin/bash
# The health layer's remediation step: decide.jq says what to do, this carries it out.
set -uo pipefail
conf=${CONFIG_DIR:-/etc/gpu-remediation}
work=$(mktemp -d)
kubectl get nodes -l ai-factory.io/pool -o json > "$work/nodes.json" || exit 1
quarantine=false
echo '{"items": []}' > "$work/slices.json"
echo '{"items": []}' > "$work/rules.json"
if [ -n "${RULE_API:-}" ] \
  && kubectl get resourceslices -o json > "$work/slices.json" \
  && kubectl get "devicetaintrules.${RULE_API#resource.k8s.io/}.resource.k8s.io" -l "$MANAGED_BY" -o json > "$work/rules.json"; then
  quarantine=true
else
  echo '{"items": []}' > "$work/slices.json"  # DRA nodes take the drain path
fi
condition() {  # node status: node, type, True|False, reason
  kubectl patch node "$1" --subresource=status --type=strategic -p "{\"status\":{\"conditions\":[{\"type\":\"$2\",\"status\":\"$3\",\"reason\":\"$4\",\"message\":\"ai-factory GPU remediation step\",\"lastTransitionTime\":\"$(date -u +%Y-%m-%dT%H:%M:%SZ)\",\"lastHeartbeatTime\":\"$(date -u +%Y-%m-%dT%H:%M:%SZ)\"}]}}"
}
status=0
jq -r -n --slurpfile nodes "$work/nodes.json" --slurpfile slices "$work/slices.json" --slurpfile rules "$work/rules.json" \
  --argjson pools "$(cat "$conf/pools.json")" --argjson now "$(date -u +%s)" --argjson fault_seconds "$FAULT_SECONDS" \
  --argjson quarantine "$quarantine" -f "$conf/decide.jq" > "$work/actions" || exit 1
while read -r action node arg; do
  echo "$action $node $arg"
  case "$action" in
    quarantine)  # arg: the device
      jq --arg node "$node" --arg device "$arg" \
        '.metadata.name = "gpu-fault-\($node)-\($device)" | .spec.deviceSelector.pool = $node | .spec.deviceSelector.device = $device' \
        "$conf/rule.json" | kubectl apply -f - \
        && condition "$node" "$QUARANTINED_CONDITION$arg" True GpuQuarantined || status=1 ;;
    unquarantine)  # no rule to delete where the rules cannot be listed: only the condition is left
      { [ "$quarantine" != true ] || kubectl delete "devicetaintrules.${RULE_API#resource.k8s.io/}.resource.k8s.io" "gpu-fault-$node-$arg" --ignore-not-found; } \
        && condition "$node" "$QUARANTINED_CONDITION$arg" False GpuFaultCleared || status=1 ;;
    drain)  # arg: the annotation's value, written before the cordon (whether the node was cordoned already)
      kubectl annotate node "$node" "$DRAIN_ANNOTATION=$arg" --overwrite \
        && kubectl drain "$node" --ignore-daemonsets --delete-emptydir-data --timeout="${DRAIN_STEP_SECONDS}s" \
        && condition "$node" "$DRAINED_CONDITION" True DrainedForGpuFault || status=1 ;;
    release)  # arg: uncordon, or keep-cordoned for a node cordoned before the step took it
      condition "$node" "$DRAINED_CONDITION" False GpuFaultCleared \
        && { [ "$arg" != uncordon ] || kubectl uncordon "$node"; } \
        && kubectl annotate node "$node" "$DRAIN_ANNOTATION-" || status=1 ;;
  esac
done < "$work/actions"
rm -rf "$work"
exit $status
"""
"""`hold` lines are only logged. A failed action fails the Job (its retry is the next minute's run)."""


def pools_file(pools: dict[str, tuple[int, int | None]]) -> str:
    """The step's per-pool settings: the blast radius in nodes and, for a pool whose GPUs are DRA
    devices (quarantined one by one), its GPUs per node: there a quarantined GPU takes 1/gpus of a
    node's share of the radius."""
    return json.dumps(
        {name: {"limit": limit, "dra": gpus is not None, **({"gpus": gpus} if gpus is not None else {})} for name, (limit, gpus) in sorted(pools.items())},
        indent=2, sort_keys=True,
    )


def environment(fault_minutes: int, rule_api: str | None) -> list[dict[str, Any]]:
    values = {
        # kubectl keeps its discovery cache under $HOME; the root filesystem is read-only.
        "HOME": "/tmp",
        "FAULT_SECONDS": str(fault_minutes * 60),
        "DRAIN_STEP_SECONDS": str(DRAIN_STEP_SECONDS),
        "DRAIN_ANNOTATION": DRAIN_ANNOTATION,
        "DRAINED_CONDITION": DRAINED_CONDITION,
        "QUARANTINED_CONDITION": QUARANTINED,
        "MANAGED_BY": ",".join(f"{k}={v}" for k, v in MANAGED_BY.items()),
        "RULE_API": rule_api or "",
    }
    return [{"name": k, "value": v} for k, v in values.items()]


RBAC_RULES: list[dict[str, list[str]]] = [
    # Cordon, annotate, uncordon; the drained condition.
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    # kubectl drain lists the node's pods, evicts them and watches them go; it reads a pod's
    # DaemonSet to skip it. No pod is ever deleted.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"]},
    # The DRA quarantine: which device has the faulty PCI address, and its taint rule.
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"], "verbs": ["get", "list", "create", "patch", "delete"]},
]
