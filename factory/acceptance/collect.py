"""The gate Jobs' results, collected from their pods into the results file `ai-factory accept` and
the fleet layer read.

The contract: each gate container ends by writing one JSON document, its **termination message**
(`/dev/termination-log`, `terminationMessagePolicy: File`), which the kubelet keeps in the pod's
status (`containerStatuses[].state.terminated.message`) after the container is gone, with no
volume, no API access and no write permission for the Job:

    {"schema": "ai-factory.io/gate-result/v1", "gate": "<gate>", "result": {...}}

at most `MAX_MESSAGE` bytes (the kubelet's limit per container: a longer one is truncated, and so
unreadable). `result` per gate, the results file's fields (`gates.NodeResult`):

* `inventory`: `driver`, `gpus[]` (`index`, `serial`, `pci_device_id`, `ecc_mode`, `retired_pages`,
  `health`), `nics[]` (`name`, `numa_node`), `firmware` (optional);
* `dcgm-diag`: `level`, `passed`, `failed_tests`; `burn-in`: `minutes`, `passed`;
* `nccl-node`, `nccl-pair`: `busbw_gbps` (each pod of a pair's Job reports; the lower counts).

A gate that ran but measured nothing writes `"error": "<why>"` in place of `result` (the NCCL
gates' program, `nccl_tests`, when nccl-tests printed no figure, the all-reduce found wrong values,
its peer never came or it failed): its gates fail with that reason.

Which node and generation a pod tested comes from its Job's pod template (`ai-factory.io/node`,
`ai-factory.io/acceptance-generation`, the completion index of a pair's pod), never from the
message. A pod of another generation than the node's current one is ignored (an earlier Job still
listed); a pod still pending or running gives nothing (the gate is pending). A pod that ended
without a message, with a message that is not the contract (not JSON, too long, another gate, a
field out of its bounds), is recorded as an error of that Job: its gates fail, with the reason,
so a broken gate never passes and never crashes the collector.

Input: the pods of the acceptance namespace as the API lists them (`kubectl get pods -n
<acceptance_namespace> -l ai-factory.io/gate -o json`): a `List` (or `PodList`) of at most
`MAX_PODS` pods.
"""

from __future__ import annotations

import datetime
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import Field, ValidationError, model_validator

from ai_factory.factory.acceptance import gates, nccl_tests
from ai_factory.factory.acceptance.gates import (
    GATE_LABEL,
    GENERATION_LABEL,
    MAX_REASON,
    NODE_ANNOTATION,
    BurnInResult,
    DiagResult,
    GpuResult,
    NcclResult,
    NicResult,
    NodeResult,
    PairResult,
    Reason,
    Results,
    ResultsError,
    Short,
    _Model,
)
from ai_factory.factory.model import bounded_yaml
from ai_factory.factory.model.config import MAX_FLEET_NODES, MAX_GPUS_PER_NODE, MAX_ITEMS, FactoryConfig

CONTRACT = nccl_tests.CONTRACT
"""Spelt in the `nccl-node` gate's program, which runs in its image without this package."""
MAX_MESSAGE = 4096
MAX_PODS = 8 * MAX_FLEET_NODES
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


class InventoryOutput(_Model):
    driver: Short
    gpus: list[GpuResult] = Field(max_length=MAX_GPUS_PER_NODE)
    nics: list[NicResult] = Field(default=[], max_length=MAX_ITEMS)
    firmware: dict[Short, Short] = Field(default={}, max_length=MAX_ITEMS)


OUTPUTS: dict[str, type[_Model]] = {
    "inventory": InventoryOutput, "dcgm-diag": DiagResult, "burn-in": BurnInResult, "nccl-node": NcclResult, "nccl-pair": NcclResult,
}


class Message(_Model):
    schema_: Literal["ai-factory.io/gate-result/v1"] = Field(alias="schema")
    gate: Literal["inventory", "dcgm-diag", "burn-in", "nccl-node", "nccl-pair"]
    result: dict[str, Any] | None = None
    error: Reason | None = None
    """A gate that ran but measured nothing says why, in place of its result."""

    @model_validator(mode="after")
    def _one_of(self) -> Message:
        if (self.result is None) == (self.error is None):
            raise ValueError("exactly one of result and error")
        return self




NO_MESSAGE = "no termination message"


def _short(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def read_message(gate: str, message: Any) -> tuple[_Model | None, str | None]:
    """The gate's result from a termination message, or (None, why it is not the contract)."""
    if not isinstance(message, str) or not message.strip():
        return None, NO_MESSAGE
    if len(message.encode()) > MAX_MESSAGE:
        return None, f"termination message longer than {MAX_MESSAGE} bytes"
    try:
        document = json.loads(message)
    except ValueError as err:
        return None, f"termination message is not JSON ({err.msg})"
    try:
        parsed = Message.model_validate(document)
    except ValidationError as err:
        return None, _invalid(err, ())
    if parsed.gate != gate:
        return None, f"termination message is the {parsed.gate} gate's, the pod runs {gate}"
    if parsed.error is not None:
        return None, _short(f"the gate measured nothing: {parsed.error}")
    try:
        return OUTPUTS[gate].model_validate(parsed.result), None
    except ValidationError as err:
        return None, _invalid(err, ("result",))


def _invalid(err: ValidationError, prefix: tuple[str, ...]) -> str:
    errors = err.errors()
    where = ".".join(str(p) for p in (*prefix, *errors[0]["loc"])) or "(document)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return _short(f"termination message {where}: {errors[0]['msg']}{more}")


@dataclass(frozen=True)
class PodOutcome:
    gate: str
    job: str
    nodes: tuple[str, ...]
    generations: tuple[str, ...]
    finished: datetime.datetime
    result: _Model | None
    error: str | None
    index: str = "0"
    """Its completion index: which pod of a pair's Job."""


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def pod_outcome(pod: Mapping[str, Any]) -> PodOutcome | None:
    """What a gate pod ended with; None for a pod that is no gate's or has not ended."""
    metadata = _map(pod.get("metadata"))
    labels, annotations = _map(metadata.get("labels")), _map(metadata.get("annotations"))
    gate = labels.get(GATE_LABEL)
    nodes = tuple(str(annotations.get(NODE_ANNOTATION, "")).split(","))
    generations = tuple(str(annotations.get(GENERATION_LABEL, "")).split(","))
    if gate not in OUTPUTS or len(nodes) != len(generations) or not all(nodes):
        return None
    status = _map(pod.get("status"))
    if status.get("phase") not in ("Succeeded", "Failed"):
        return None
    statuses = [_map(c) for c in status.get("containerStatuses") or [] if isinstance(c, Mapping)]
    terminated = _map(_map(statuses[0].get("state")).get("terminated")) if statuses else {}
    try:
        finished = datetime.datetime.fromisoformat(str(terminated.get("finishedAt", "")).replace("Z", "+00:00"))
    except ValueError:
        finished = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    result, error = read_message(gate, terminated.get("message"))
    if error and status.get("phase") == "Failed":
        error = f"exited {terminated.get('exitCode', '?')} ({terminated.get('reason') or status.get('reason') or 'failed'}), {error}"
    job = str(labels.get(JOB_NAME_LABEL) or labels.get("job-name") or "")
    return PodOutcome(gate, job, nodes, generations, finished, result, error, str(annotations.get(COMPLETION_INDEX, "0")))


def collect(pods: list[Mapping[str, Any]], current: Mapping[str, str]) -> Results:
    """The results of the nodes under acceptance (`current`: node -> its gate generation) from
    their gate pods."""
    per_node: dict[str, dict[str, PodOutcome]] = defaultdict(dict)
    per_pair: dict[tuple[str, ...], list[PodOutcome]] = defaultdict(list)
    for pod in pods:
        outcome = pod_outcome(pod)
        if outcome is None or any(current.get(n) != g for n, g in zip(outcome.nodes, outcome.generations)):
            continue
        if outcome.gate == "nccl-pair":
            per_pair[outcome.nodes].append(outcome)
            continue
        (node,) = outcome.nodes[:1]
        kept = per_node[node].get(outcome.gate)
        if kept is None or outcome.finished > kept.finished:
            per_node[node][outcome.gate] = outcome
    nodes = {node: _node_result(node, current[node], found) for node, found in sorted(per_node.items()) if len(found)}
    pairs = [_pair_result(nodes_, found) for nodes_, found in sorted(per_pair.items())]
    return Results(nodes=nodes, pairs=[p for p in pairs if p is not None])


def _node_result(node: str, generation: str, found: dict[str, PodOutcome]) -> NodeResult:
    fields: dict[str, Any] = {"generation": generation, "date": max(o.finished for o in found.values())}
    errors: dict[str, str] = {}
    for gate, outcome in sorted(found.items()):
        if outcome.error:
            errors[gate] = outcome.error
        elif gate == "inventory":
            inventory = outcome.result
            fields.update(driver=inventory.driver, gpus=inventory.gpus, nics=inventory.nics, firmware=inventory.firmware)
        else:
            fields[{"dcgm-diag": "dcgm_diag", "burn-in": "burn_in", "nccl-node": "nccl"}[gate]] = outcome.result
    return NodeResult(**fields, errors=errors)


def _pair_result(nodes: tuple[str, ...], found: list[PodOutcome]) -> PairResult | None:
    """Both pods of the pair's Job (completion indexes 0 and 1, the latest of each) must have
    ended; the lower bandwidth counts."""
    by_index: dict[str, PodOutcome] = {}
    for outcome in sorted(found, key=lambda o: o.finished):
        by_index[outcome.index] = outcome
    if len(nodes) != 2 or set(by_index) != {"0", "1"}:
        return None
    found = [by_index["0"], by_index["1"]]
    generations = list(found[0].generations)
    errors = sorted({o.error for o in found if o.error})
    if errors:
        return PairResult(nodes=list(nodes), generations=generations, error=_short("; ".join(errors)))
    return PairResult(nodes=list(nodes), generations=generations, busbw_gbps=min(o.result.busbw_gbps for o in found))


def load_pods(path: Path, source: str) -> list[Mapping[str, Any]]:
    """The pods of a `kubectl get pods -o json` dump (bounded like every file the tools read)."""
    try:
        document = bounded_yaml.read(path)
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise ResultsError([f"{source}: cannot read: {err}"]) from None
    items = _map(document).get("items")
    if not isinstance(items, list):
        raise ResultsError([f"{source}: not a list of pods (`kubectl get pods -o json`): no items"])
    if len(items) > MAX_PODS:
        raise ResultsError([f"{source}.items: {len(items)} pods, at most {MAX_PODS}"])
    return [i for i in items if isinstance(i, Mapping) and i.get("kind", "Pod") == "Pod"]


def collected(cfg: FactoryConfig, path: Path, source: str) -> Results:
    return collect(load_pods(path, source), {s.node.name: s.generation for s in gates.subjects(cfg)})


def results_yaml(results: Results) -> str:
    """The results file's text: deterministic, read back by `gates.load_results`."""
    data = results.model_dump(mode="json", exclude_defaults=True)
    return "# Collected from the gate Jobs' pods by `ai-factory accept --pods`.\n" + yaml.safe_dump(data, sort_keys=True)
