"""The acceptance gates, the results they record and the verdict they give each node.

Every explicit node (`node_list`) of the fleet goes through acceptance while
`layers.provisioning` is enabled; pools given by a count have no node identities to accept. Per
node, in order (`components/provisioning.py` runs them as Jobs pinned to the node):

1. `inventory`: the GPUs the driver sees equal the pool's model (PCI device ID) and count;
2. `ecc`: ECC mode enabled on every GPU, retired pages (or remapped rows) at most
   `max_retired_pages`;
3. `nics`: the RDMA NICs and their NUMA nodes equal the pool's `topology.numa` (skipped when the
   pool declares none);
4. `driver`: the driver loaded is the pool's `driver.version`;
5. `dcgm-diag`: `dcgmi diag -r <dcgm_diag_level>` passes, at that level or above;
6. `burn-in`: DCGM targeted stress and power for `burn_in_minutes`, passed, at least that long;
7. `nccl-node`: all-reduce over the node's GPUs at least the table's `node` figure (2+ GPUs);
8. `nccl-pair`: all-reduce across each rack pair the node is in (`pairs`), at least the `pair`
   figure of the pool's fabric (pools of 2+ nodes).

A gate with no result (or a result of an earlier generation) has not run: the node is `pending`.
Any failed gate makes it `failed`; all passed (or skipped) makes it `accepted`. A node that is not
accepted carries the taint `ai-factory.io/acceptance=<verdict>:NoSchedule`, which tenants cannot
tolerate (`components/kyverno.py` allows them only the placement and node-lifecycle taints).

No figure, no pass: the NCCL gates pass on a measured bus bandwidth at least the table's row,
never on an exit code alone, and no row of the table (built-in or a site's) waives that. An exit
code does not say the threshold held: NVSentinel's preflight images exit non-zero when their
health event cannot reach NVSentinel's platform connector, and zero after a failed test under its
`STORE_ONLY` processing strategy; and the NetBox record of an accepted node carries its NCCL
figures. So neither gate runs its image's entrypoint: `nccl-node` runs the loopback image's
nccl-tests, and `nccl-pair` an all-reduce over `torch.distributed` and NCCL across both nodes with
the torch of `preflight-nccl-allreduce` (whose own entrypoint starts only inside NVSentinel's
preflight webhook: gang ConfigMap, `POD_NAME`, platform connector); both report the figure
(`nccl_tests`).

The gate generation of a node hashes what its acceptance depends on: the driver version, the OS
image and BIOS settings of its pool, and its `reruns` count. A driver change or a new image gives a
new generation (the Jobs are renamed and run again; earlier results stop counting); so does
raising `reruns`, the step after a remediation (`components/health.py` reboots faulty nodes; a
node that came back is re-accepted before it is trusted again).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from ai_factory.factory.acceptance import thresholds
import yaml

from ai_factory.factory.model import bounded_yaml
from ai_factory.factory.model.config import MAX_FLEET_NODES, MAX_GPUS_PER_NODE, MAX_ITEMS, FactoryConfig, NodeSpec, Pool
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.model.tenancy import LABEL_PREFIX

ACCEPTANCE_KEY = f"{LABEL_PREFIX}/acceptance"
"""Label (the verdict) and taint key (while not accepted) on every node under acceptance."""
REASON_ANNOTATION = f"{LABEL_PREFIX}/acceptance-reason"
GENERATION_LABEL = f"{LABEL_PREFIX}/acceptance-generation"
"""Node label of its verdict's generation; on a gate pod, an annotation: the generation(s) of the node(s) it tests."""
GATE_LABEL = f"{LABEL_PREFIX}/gate"
NODE_ANNOTATION = f"{LABEL_PREFIX}/node"
"""On a gate Job and its pods: the node(s) it tests, comma-separated."""
MAX_REASON = 1024
GATES = ("inventory", "ecc", "nics", "driver", "dcgm-diag", "burn-in", "nccl-node", "nccl-pair")

Verdict = Literal["accepted", "failed", "pending"]
Short = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuResult(_Model):
    index: int = Field(ge=0, lt=MAX_GPUS_PER_NODE)
    serial: Short
    pci_device_id: Annotated[str, StringConstraints(pattern=r"^0x[0-9A-Fa-f]{8}$")]
    """`nvidia-smi --query-gpu=pci.device_id`, e.g. `0x233010DE`."""
    ecc_mode: Literal["enabled", "disabled"]
    retired_pages: int = Field(ge=0, le=1_000_000)
    health: Literal["healthy", "warning", "failure"] = "healthy"
    """DCGM's health watch of the GPU (`dcgmi health -c`)."""


class NicResult(_Model):
    name: Short
    numa_node: int = Field(ge=0, le=MAX_ITEMS)


class DiagResult(_Model):
    level: int = Field(ge=1, le=4)
    passed: bool
    failed_tests: list[Short] = Field(default=[], max_length=MAX_ITEMS)


class BurnInResult(_Model):
    minutes: float = Field(ge=0, le=100_000)
    passed: bool


class NcclResult(_Model):
    busbw_gbps: float = Field(ge=0, le=100_000)


JOB_GATES = ("inventory", "dcgm-diag", "burn-in", "nccl-node", "nccl-pair")
"""The gates' Jobs: `inventory` gives the `inventory`, `ecc`, `nics` and `driver` gates."""
Reason = Annotated[str, StringConstraints(min_length=1, max_length=MAX_REASON)]


class NodeResult(_Model):
    generation: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{12}$")]
    date: datetime.datetime
    driver: Short | None = None
    """None until the inventory Job reported."""
    firmware: dict[Short, Short] = Field(default={}, max_length=MAX_ITEMS)
    """Firmware versions as the BMC reports them, e.g. `{bios: 2.19.1, bmc: 7.10.30.00}`."""
    gpus: list[GpuResult] | None = Field(default=None, max_length=MAX_GPUS_PER_NODE)
    nics: list[NicResult] | None = Field(default=None, max_length=MAX_ITEMS)
    dcgm_diag: DiagResult | None = None
    burn_in: BurnInResult | None = None
    nccl: NcclResult | None = None
    errors: dict[Literal["inventory", "dcgm-diag", "burn-in", "nccl-node"], Reason] = Field(default={}, max_length=4)
    """Jobs that ended without a readable result (`ai_factory.factory.acceptance.collect`): their
    gates failed, with this reason."""


class PairResult(_Model):
    nodes: list[Annotated[str, StringConstraints(max_length=253)]] = Field(min_length=2, max_length=2)
    generations: list[Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{12}$")]] = Field(min_length=2, max_length=2)
    """The two nodes' generations when the test ran, in `nodes` order."""
    busbw_gbps: float = Field(default=0, ge=0, le=100_000)
    error: Reason | None = None
    """The Job ended without a readable result: the pair's gate failed, with this reason."""


class Results(_Model):
    nodes: dict[Annotated[str, StringConstraints(max_length=253)], NodeResult] = Field(default={}, max_length=MAX_FLEET_NODES)
    pairs: list[PairResult] = Field(default=[], max_length=MAX_FLEET_NODES)


class ResultsError(ValueError):
    """A results file that cannot be read, one `path: message` line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def load_results(path: Path, source: str) -> Results:
    try:
        raw = bounded_yaml.read(path)
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise ResultsError([f"{source}: cannot read: {err}"]) from None
    if raw is None:
        raise ResultsError([f"{source}: no such file or empty"])
    try:
        return Results.model_validate(raw)
    except ValidationError as err:
        raise ResultsError([f"{source}:{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]) from None


@dataclass(frozen=True)
class Subject:
    """A node under acceptance, with what its gates compare against."""

    node: NodeSpec
    pool: Pool
    generation: str
    pairs: tuple[tuple[str, str], ...]
    """The rack pairs it is tested in (both orders of a pair list the same tuple)."""


def generation(cfg: FactoryConfig, pool: Pool, node: str) -> str:
    prov = cfg.layers.provisioning
    setup = prov.pools.get(pool.name)
    basis = {
        "driver": pool.driver.version,
        "image": setup.image.checksum if setup else None,
        "firmware": {k: v.value for k, v in sorted(setup.firmware.items())} if setup else None,
        "reruns": prov.acceptance.reruns.get(node, 0),
    }
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:12]


def rack_pairs(nodes: list[NodeSpec]) -> list[tuple[str, str]]:
    """Pairs crossing racks: per block, nodes taken round-robin over its racks and paired in that
    order, so consecutive nodes sit in different racks whenever the block has two; an odd node out
    pairs with the block's first node, a block of one with the pool's first node elsewhere."""
    by_block: dict[str, dict[str, list[str]]] = {}
    for n in sorted(nodes, key=lambda n: (n.block, n.rack, n.name)):
        by_block.setdefault(n.block, {}).setdefault(n.rack, []).append(n.name)
    pairs: list[tuple[str, str]] = []
    leftovers: list[str] = []
    for racks in by_block.values():
        order: list[str] = []
        queues = [list(q) for q in racks.values()]
        while any(queues):
            order += [q.pop(0) for q in queues if q]
        pairs += [(order[i], order[i + 1]) for i in range(0, len(order) - 1, 2)]
        if len(order) % 2:
            if len(order) > 1:
                pairs.append((order[-1], order[0]))
            else:
                leftovers.append(order[0])
    all_names = [n.name for n in sorted(nodes, key=lambda n: (n.block, n.rack, n.name))]
    for name in leftovers:
        partner = next((other for other in all_names if other != name), None)
        if partner:
            pairs.append((name, partner))
    return pairs


def subjects(cfg: FactoryConfig) -> list[Subject]:
    """Every node under acceptance, in fleet order."""
    if not cfg.layers.provisioning.enabled:
        return []
    result = []
    for pool in cfg.fleet.pools:
        if pool.node_list is None:
            continue
        nodes = pool.node_specs()
        pairs = rack_pairs(nodes)
        for node in nodes:
            result.append(Subject(node=node, pool=pool, generation=generation(cfg, pool, node.name),
                                  pairs=tuple(p for p in pairs if node.name in p)))
    return result


@dataclass(frozen=True)
class GateOutcome:
    gate: str
    status: Literal["passed", "failed", "not-run", "skipped"]
    figure: str
    threshold: str
    reason: str = ""


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    pool: str
    generation: str
    verdict: Verdict
    gates: tuple[GateOutcome, ...]
    result: NodeResult | None
    """The node's result of the current generation, if any."""
    pair_figures: dict[str, float] = field(default_factory=dict)
    """Bus bandwidth per partner node."""

    @property
    def reasons(self) -> list[str]:
        return [f"{g.gate}: {g.reason}" for g in self.gates if g.status in ("failed", "not-run")]

    @property
    def taint(self) -> dict[str, str] | None:
        if self.verdict == "accepted":
            return None
        return {"key": ACCEPTANCE_KEY, "value": self.verdict, "effect": "NoSchedule"}

    @property
    def reason_annotation(self) -> str:
        text = "; ".join(self.reasons) or "all gates passed"
        return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def _not_run(gate: str, threshold: str, why: str = "no result yet") -> GateOutcome:
    return GateOutcome(gate, "not-run", "-", threshold, why)


def evaluate(cfg: FactoryConfig, results: Results) -> list[NodeVerdict]:
    """The verdict of every node under acceptance, from the recorded results."""
    table = thresholds.table(cfg)
    settings = cfg.layers.provisioning.acceptance
    verdicts = []
    everyone = subjects(cfg)
    generations = {s.node.name: s.generation for s in everyone}
    for subject in everyone:
        pool, name = subject.pool, subject.node.name
        recorded = results.nodes.get(name)
        stale = recorded is not None and recorded.generation != subject.generation
        current = None if recorded is None or stale else recorded
        why_missing = (f"results are of generation {recorded.generation}, the node's is {subject.generation} "
                       "(driver, image or BIOS changed, or acceptance restarted)") if stale else "no result yet"
        gates = list(_node_gates(pool, current, settings, table, why_missing))
        pair_gate, figures = _pair_gate(subject, results, table, generations)
        gates.append(pair_gate)
        statuses = {g.status for g in gates}
        verdict: Verdict = "failed" if "failed" in statuses else "pending" if "not-run" in statuses else "accepted"
        verdicts.append(NodeVerdict(name, pool.name, subject.generation, verdict, tuple(gates), current, figures))
    return verdicts


def _node_gates(pool: Pool, r: NodeResult | None, settings, table, why_missing: str):
    for outcome in _gates_of_results(pool, r, settings, table, why_missing):
        error = r.errors.get(INVENTORY_JOB.get(outcome.gate, outcome.gate)) if r else None
        if error and outcome.status != "skipped":
            yield GateOutcome(outcome.gate, "failed", "-", outcome.threshold, f"no readable result: {error}")
        else:
            yield outcome


INVENTORY_JOB = {"ecc": "inventory", "nics": "inventory", "driver": "inventory"}
"""Gates judged from another gate's Job."""


def _gates_of_results(pool: Pool, r: NodeResult | None, settings, table, why_missing: str):
    model = GPU_MODELS[pool.gpu.model]
    want_ids = {i.upper() for i in model.pci_device_ids}
    per_node = pool.gpu.per_node
    inventory_threshold = f"{per_node} x {model.name}"
    if r is None or r.gpus is None:
        yield _not_run("inventory", inventory_threshold, why_missing)
        yield _not_run("ecc", f"enabled, <= {settings.max_retired_pages} retired pages", why_missing)
    else:
        wrong = [g.index for g in r.gpus if g.pci_device_id.upper() not in want_ids]
        problems = []
        if len(r.gpus) != per_node:
            problems.append(f"{len(r.gpus)} GPUs found, {per_node} expected")
        if wrong:
            problems.append(f"GPU(s) {', '.join(map(str, wrong))} are not {model.name}")
        unhealthy = [f"{g.index} ({g.health})" for g in r.gpus if g.health != "healthy"]
        if unhealthy:
            problems.append(f"DCGM health of GPU(s) {', '.join(unhealthy)}")
        yield GateOutcome("inventory", "failed" if problems else "passed", f"{len(r.gpus)} GPUs", inventory_threshold, "; ".join(problems))
        ecc_off = [g.index for g in r.gpus if g.ecc_mode != "enabled"]
        retired = [(g.index, g.retired_pages) for g in r.gpus if g.retired_pages > settings.max_retired_pages]
        problems = []
        if ecc_off:
            problems.append(f"ECC disabled on GPU(s) {', '.join(map(str, ecc_off))}")
        if retired:
            problems.append("retired pages " + ", ".join(f"GPU {i}: {n}" for i, n in retired))
        worst = max((g.retired_pages for g in r.gpus), default=0)
        yield GateOutcome("ecc", "failed" if problems else "passed", f"max {worst} retired pages",
                          f"enabled, <= {settings.max_retired_pages} retired pages", "; ".join(problems))
    declared = {(nic, numa.node) for numa in pool.topology.numa for nic in numa.nics}
    if not declared:
        yield GateOutcome("nics", "skipped", "-", "no NUMA topology declared")
    elif r is None or r.nics is None:
        yield _not_run("nics", f"{len(declared)} NICs as topology.numa", why_missing)
    else:
        found = {(n.name, n.numa_node) for n in r.nics}
        problems = [f"missing {n} on NUMA {m}" for n, m in sorted(declared - found)] + [f"unexpected {n} on NUMA {m}" for n, m in sorted(found - declared)]
        yield GateOutcome("nics", "failed" if problems else "passed", f"{len(found)} NICs", f"{len(declared)} NICs as topology.numa", "; ".join(problems))
    if r is None or r.driver is None:
        yield _not_run("driver", pool.driver.version, why_missing)
    else:
        ok = r.driver == pool.driver.version
        yield GateOutcome("driver", "passed" if ok else "failed", r.driver, pool.driver.version, "" if ok else f"driver {r.driver} loaded, the pool expects {pool.driver.version}")
    level = settings.dcgm_diag_level
    if r is None or r.dcgm_diag is None:
        yield _not_run("dcgm-diag", f"level {level} passed", why_missing)
    else:
        d = r.dcgm_diag
        problems = []
        if d.level < level:
            problems.append(f"ran at level {d.level}, below {level}")
        if not d.passed:
            problems.append("failed" + (f": {', '.join(d.failed_tests)}" if d.failed_tests else ""))
        yield GateOutcome("dcgm-diag", "failed" if problems else "passed", f"level {d.level} {'pass' if d.passed else 'fail'}", f"level {level} passed", "; ".join(problems))
    minutes = settings.burn_in_minutes
    if r is None or r.burn_in is None:
        yield _not_run("burn-in", f"{minutes} min passed", why_missing)
    else:
        b = r.burn_in
        problems = []
        if b.minutes < minutes:
            problems.append(f"ran {b.minutes:g} min, less than {minutes}")
        if not b.passed:
            problems.append("failed")
        yield GateOutcome("burn-in", "failed" if problems else "passed", f"{b.minutes:g} min {'pass' if b.passed else 'fail'}", f"{minutes} min passed", "; ".join(problems))
    if pool.gpu.per_node < 2:
        yield GateOutcome("nccl-node", "skipped", "-", "one GPU per node")
    else:
        row = table[(pool.gpu.model, "node", pool.topology.intra_node)]
        limit = f">= {row.min_busbw_gbps:g} GB/s ({pool.topology.intra_node})"
        if r is None or r.nccl is None:
            yield _not_run("nccl-node", limit, why_missing)
        else:
            ok = r.nccl.busbw_gbps >= row.min_busbw_gbps
            yield GateOutcome("nccl-node", "passed" if ok else "failed", f"{r.nccl.busbw_gbps:g} GB/s", limit,
                              "" if ok else f"bus bandwidth {r.nccl.busbw_gbps:g} GB/s below {row.min_busbw_gbps:g}")


def _pair_gate(subject: Subject, results: Results, table, generations: dict[str, str]) -> tuple[GateOutcome, dict[str, float]]:
    """A pair result counts only when both nodes were at their current generation."""
    pool, name = subject.pool, subject.node.name
    if not subject.pairs:
        return GateOutcome("nccl-pair", "skipped", "-", "a pool of one node"), {}
    row = table[(pool.gpu.model, "pair", pool.topology.fabric)]
    limit = f">= {row.min_busbw_gbps:g} GB/s ({pool.topology.fabric})"
    figures: dict[str, float] = {}
    missing, low = [], []
    for a, b in subject.pairs:
        partner = b if a == name else a
        found = next((p for p in results.pairs if set(p.nodes) == {a, b}
                      and all(p.generations[i] == generations[n] for i, n in enumerate(p.nodes))), None)
        if found is None:
            missing.append(partner)
            continue
        if found.error:
            low.append(f"with {partner}: no readable result: {found.error}")
            continue
        figures[partner] = found.busbw_gbps
        if found.busbw_gbps < row.min_busbw_gbps:
            low.append(f"with {partner}: {found.busbw_gbps:g} GB/s below {row.min_busbw_gbps:g}")
    figure = ", ".join(f"{p}: {v:g} GB/s" for p, v in sorted(figures.items())) or "-"
    if low:
        return GateOutcome("nccl-pair", "failed", figure, limit, "; ".join(low)), figures
    if missing:
        return GateOutcome("nccl-pair", "not-run", figure, limit, f"no result with {', '.join(missing)} at this generation"), figures
    return GateOutcome("nccl-pair", "passed", figure, limit), figures


def recorded_results(cfg: FactoryConfig, project: Path) -> Results:
    """The results file the config names; none yet (no file, or none named) is no results: every
    node is pending, which fails closed (tainted) however the file went missing."""
    path = cfg.layers.provisioning.acceptance.results_file
    if path is None or not (project / path).exists():
        return Results()
    return load_results(project / path, f"layers.provisioning.acceptance.results_file ({path})")


def node_verdicts(cfg: FactoryConfig, project: Path | None = None) -> list[NodeVerdict]:
    """The verdicts from the config's results file, read relative to the project (the current
    directory, as for the `pulumi` CLI); a file that cannot be read is a config problem."""
    from ai_factory.factory.model.loading import ConfigError, project_dir

    if not cfg.layers.provisioning.enabled:
        return []
    try:
        return evaluate(cfg, recorded_results(cfg, project or project_dir()))
    except ResultsError as err:
        raise ConfigError(err.problems) from None


def as_dict(v: NodeVerdict) -> dict[str, Any]:
    return {
        "node": v.node,
        "pool": v.pool,
        "generation": v.generation,
        "verdict": v.verdict,
        "taint": v.taint,
        "gates": [{"gate": g.gate, "status": g.status, "figure": g.figure, "threshold": g.threshold, **({"reason": g.reason} if g.reason else {})} for g in v.gates],
    }
