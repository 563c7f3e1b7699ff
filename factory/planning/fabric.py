"""Tenants' keys on the RDMA fabrics: an InfiniBand partition key per tenant, unique in the fleet,
and a VLAN per tenant and RoCE fabric (one per site), unique on that fabric.

Pure, like the rest of the planner: it takes what each tenant wants on which fabric and the keys of
the previous plan (the lock), and hands out keys so that a tenant keeps its key for as long as it
keeps a network on that fabric (even when the allocation range changes later), a tenant removed
frees its key without moving anyone else's, a key given by hand is used as given, and every new
tenant takes the lowest free key of the range. The order of tenants in the config changes nothing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Literal, Mapping, Sequence

FabricKind = Literal["infiniband", "roce"]

INFINIBAND = "infiniband"
"""The fabric id of every InfiniBand pool: partition keys are unique in the whole fleet."""


def roce_fabric(site: str) -> str:
    """The fabric id of a site's RoCE pools: VLANs are unique per site's Ethernet fabric."""
    return f"roce-{site}"


@dataclass(frozen=True)
class FabricWant:
    """A tenant needs an RDMA network on one pool of a fabric."""

    tenant: str
    pool: str
    fabric: str
    kind: FabricKind
    manual: int | None = None
    """The key the tenant's config gives (`tenants[].network.pkey` / `.vlan`)."""
    manual_path: str = ""
    """Where that key is written, for messages."""


@dataclass(frozen=True)
class TenantFabricNetwork:
    """A tenant's RDMA network on one pool: its partition key (InfiniBand) or VLAN (RoCE)."""

    tenant: str
    pool: str
    fabric: str
    kind: FabricKind
    key: int
    manual: bool = False

    @property
    def shown(self) -> str:
        return f"pkey {self.key:#06x}" if self.kind == INFINIBAND else f"vlan {self.key}"


class FabricError(ValueError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def allocate(
    wants: Iterable[FabricWant],
    ranges: Mapping[FabricKind, tuple[int, int]],
    previous: Sequence[TenantFabricNetwork] = (),
) -> tuple[TenantFabricNetwork, ...]:
    """One network per wanted (tenant, pool), sorted; raises `FabricError` listing every key that
    cannot be given (a range exhausted, a hand-given key another tenant already holds)."""
    by_fabric: dict[str, list[FabricWant]] = defaultdict(list)
    for want in wants:
        by_fabric[want.fabric].append(want)
    held = {(n.fabric, n.tenant): n.key for n in previous}
    problems: list[str] = []
    networks: list[TenantFabricNetwork] = []
    for fabric, fabric_wants in sorted(by_fabric.items()):
        kind = fabric_wants[0].kind
        tenants = sorted({w.tenant for w in fabric_wants})
        manual = {w.tenant: (w.manual, w.manual_path) for w in fabric_wants if w.manual is not None}
        keys: dict[str, int] = {tenant: key for tenant, (key, _) in manual.items()}
        taken = set(keys.values())
        for tenant in tenants:
            if tenant in keys:
                continue
            kept = held.get((fabric, tenant))
            if kept is None:
                continue
            if kept in taken:
                owner = next(t for t, k in keys.items() if k == kept)
                problems.append(
                    f"{manual[owner][1]}: {_show(kind, kept)} is held by tenant {tenant!r} on {fabric} (the plan lock); "
                    "a running tenant's key never changes: give another"
                )
                continue
            keys[tenant] = kept
            taken.add(kept)
        first, last = ranges[kind]
        free = (k for k in range(first, last + 1) if k not in taken)
        for tenant in tenants:
            if tenant in keys:
                continue
            key = next(free, None)
            if key is None:
                problems.append(f"plan: no free {'partition key' if kind == INFINIBAND else 'VLAN'} left in {_show(kind, first)}-{_show(kind, last)} for tenant {tenant!r} on {fabric}")
                continue
            keys[tenant] = key
        for want in fabric_wants:
            if want.tenant in keys:
                networks.append(TenantFabricNetwork(want.tenant, want.pool, fabric, kind, keys[want.tenant], want.tenant in manual))
    if problems:
        raise FabricError(problems)
    return tuple(sorted(set(networks), key=lambda n: (n.tenant, n.pool)))


def _show(kind: FabricKind, key: int) -> str:
    return f"{key:#06x}" if kind == INFINIBAND else str(key)
