"""NetBox as the source of truth: acceptance results written to it, racks and cabling read from it.

Target: NetBox 4.4 REST API (`/api/`), through `pynetbox`. Where the results go, and why:
- **custom fields on the device** (`dcim.device`), the node's current state: `aif_acceptance`
  (verdict), `aif_acceptance_date`, `aif_acceptance_generation`, `aif_driver`, `aif_firmware`,
  `aif_gpus` (per-GPU serial and health) and `aif_nccl` (figures). Custom fields are filterable
  (`/api/dcim/devices/?cf_aif_acceptance=failed` lists the nodes to look at) and shown on the
  device page; each new run overwrites them;
- **a journal entry per run** on the same device (`extras.journal-entries`): kind `success`
  (accepted), `danger` (failed) or `warning` (pending), every gate's figure against its threshold
  in its comments. Journal entries are append-only history with author and time, which custom
  fields are not: the previous verdicts stay readable after a re-run.
The custom fields are created when missing (`ensure_custom_fields`), in group `ai-factory`.

Read side: a device named like each node gives its rack (`rack.name`) and block (the rack's
`location.slug`: a NetBox location groups the racks of one leaf/spine block), and its cables
(`/api/dcim/cables/?device=<name>`) the fabric links (interface, peer device, peer interface), so
the scheduling topology is read instead of typed twice (`topology_problems` compares it with the
fleet config).

NetBox itself needs Python 3.12 and PostgreSQL and cannot run on the machines that test this
library: the tests replay a recorded contract of the REST API (`tests/contracts/netbox-4.4/`),
requests and responses, and validate every payload against the request schema of each endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ai_factory.factory.acceptance.gates import NodeVerdict
from ai_factory.factory.model.config import FactoryConfig

API_VERSION = "4.4"
FIELD_GROUP = "ai-factory"
CUSTOM_FIELDS: dict[str, tuple[str, str, str]] = {
    # name: (type, label, description)
    "aif_acceptance": ("text", "Acceptance", "ai-factory acceptance verdict: accepted, failed or pending"),
    "aif_acceptance_date": ("datetime", "Acceptance date", "When the node's gates last ran"),
    "aif_acceptance_generation": ("text", "Acceptance generation", "Gate generation (driver, image, BIOS, reruns) the verdict is for"),
    "aif_driver": ("text", "NVIDIA driver", "Driver version the gates ran with"),
    "aif_firmware": ("json", "Firmware", "Firmware versions the BMC reported"),
    "aif_gpus": ("json", "GPUs", "Per GPU: index, serial, ECC mode, retired pages, DCGM health"),
    "aif_nccl": ("json", "NCCL", "All-reduce bus bandwidth (GB/s) inside the node and with each pair partner"),
}
JOURNAL_KIND = {"accepted": "success", "failed": "danger", "pending": "warning"}


@dataclass(frozen=True)
class Record:
    """What one node's acceptance writes to NetBox."""

    device: str
    custom_fields: dict[str, Any]
    journal_kind: str
    journal_comments: str

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "custom_fields": self.custom_fields,
                "journal_entry": {"assigned_object_type": "dcim.device", "kind": self.journal_kind, "comments": self.journal_comments}}


def record(verdict: NodeVerdict) -> Record:
    r = verdict.result
    fields: dict[str, Any] = {
        "aif_acceptance": verdict.verdict,
        "aif_acceptance_generation": verdict.generation,
        "aif_acceptance_date": r.date.isoformat().replace("+00:00", "Z") if r else None,
        "aif_driver": r.driver if r else None,
        "aif_firmware": dict(sorted(r.firmware.items())) if r else None,
        "aif_gpus": [{"index": g.index, "serial": g.serial, "ecc_mode": g.ecc_mode, "retired_pages": g.retired_pages, "health": g.health}
                     for g in sorted(r.gpus, key=lambda g: g.index)] if r and r.gpus is not None else None,
        "aif_nccl": {"node_busbw_gbps": r.nccl.busbw_gbps if r and r.nccl else None,
                     "pair_busbw_gbps": dict(sorted(verdict.pair_figures.items()))},
    }
    lines = [f"**ai-factory acceptance: {verdict.verdict}** (pool {verdict.pool}, generation {verdict.generation})", "",
             "| gate | status | figure | threshold | reason |", "|---|---|---|---|---|"]
    lines += [f"| {g.gate} | {g.status} | {g.figure} | {g.threshold} | {g.reason.replace('|', '/')} |" for g in verdict.gates]
    return Record(verdict.node, fields, JOURNAL_KIND[verdict.verdict], "\n".join(lines))


class NetBoxError(RuntimeError):
    """NetBox refused a request or lacks what the fleet names (one line per problem)."""


def connect(url: str, token: str, session: Any = None):
    """A pynetbox API object; `session`: a `requests.Session` (the tests' recorded contract)."""
    import pynetbox

    api = pynetbox.api(url, token=token)
    if session is not None:
        api.http_session = session
    return api


def ensure_custom_fields(api) -> list[str]:
    """Create the custom fields that do not exist yet; the names created."""
    existing = {f.name for f in api.extras.custom_fields.filter(group_name=FIELD_GROUP)}
    created = []
    for name, (kind, label, description) in CUSTOM_FIELDS.items():
        if name in existing:
            continue
        api.extras.custom_fields.create(
            name=name, type=kind, label=label, description=description, group_name=FIELD_GROUP,
            object_types=["dcim.device"], required=False, ui_visible="if-set", ui_editable="no",
        )
        created.append(name)
    return created


def write(api, records: list[Record]) -> list[str]:
    """Write each record: the device's custom fields (one PATCH), then its journal entry. Every
    device is looked up first, so a fleet node NetBox does not know writes nothing at all."""
    devices = {}
    missing = []
    for rec in records:
        device = api.dcim.devices.get(name=rec.device)
        if device is None:
            missing.append(f"netbox: no device named {rec.device!r}")
        devices[rec.device] = device
    if missing:
        raise NetBoxError("\n".join(missing))
    ensure_custom_fields(api)
    written = []
    for rec in records:
        device = devices[rec.device]
        api.dcim.devices.update([{"id": device.id, "custom_fields": rec.custom_fields}])
        api.extras.journal_entries.create(assigned_object_type="dcim.device", assigned_object_id=device.id,
                                          kind=rec.journal_kind, comments=rec.journal_comments)
        written.append(rec.device)
    return written


@dataclass(frozen=True)
class NodeTopology:
    node: str
    rack: str | None
    block: str | None
    links: tuple[tuple[str, str, str], ...]
    """(interface, peer device, peer interface) of every cable of the device."""


def _peer(terminations: list, device: str) -> list[tuple[str, str]]:
    return [(t["object"]["device"]["name"], t["object"]["name"]) for t in terminations
            if t.get("object_type") == "dcim.interface" and t.get("object", {}).get("device", {}).get("name")]


def read_topology(api, nodes: list[str]) -> dict[str, NodeTopology]:
    """Rack, block and fabric links of every node NetBox knows (absent nodes are left out)."""
    found = {}
    for node in nodes:
        device = api.dcim.devices.get(name=node)
        if device is None:
            continue
        raw = dict(device)
        rack = (raw.get("rack") or {}).get("name")
        location = (raw.get("location") or {}).get("slug")
        links = []
        for cable in api.dcim.cables.filter(device=node):
            c = dict(cable)
            a, b = c.get("a_terminations") or [], c.get("b_terminations") or []
            for mine, theirs in ((a, b), (b, a)):
                for dev, iface in _peer(mine, node):
                    if dev == node:
                        links += [(iface, peer_dev, peer_iface) for peer_dev, peer_iface in _peer(theirs, node)]
        found[node] = NodeTopology(node, rack, location, tuple(sorted(links)))
    return found


def topology_problems(cfg: FactoryConfig, topology: dict[str, NodeTopology]) -> list[str]:
    """Where the fleet config and NetBox disagree on a node's rack or block, or NetBox lacks it."""
    problems = []
    for i, pool in enumerate(cfg.fleet.pools):
        for j, node in enumerate(pool.node_list or []):
            path = f"fleet.pools[{i}].node_list[{j}]"
            known = topology.get(node.name)
            if known is None:
                problems.append(f"{path}: NetBox has no device {node.name!r}")
                continue
            if known.rack != node.rack:
                problems.append(f"{path}.rack: {node.rack!r} here, {known.rack!r} in NetBox")
            if known.block != node.block:
                problems.append(f"{path}.block: {node.block!r} here, {known.block!r} (the rack's location) in NetBox")
    return problems
