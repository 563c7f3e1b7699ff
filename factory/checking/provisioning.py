"""Offline check of provisioning (`components/provisioning.py`), shared by `factory check` and the
CrossGuard pack (`policies/aif_policies/provisioning.py`):

* `registration-taint`: every BareMetalHost boots with user data (`spec.userData`, a Secret of the
  render) whose kubelet configuration registers the node with the acceptance taint
  `ai-factory.io/acceptance=pending:NoSchedule` (`registerWithTaints`), so that no workload lands
  on it between its joining and its first verdict. The user data itself is secret; its Secret
  states the taints it registers (`ai-factory.io/register-with-taints`), written from the same value.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Iterable, Iterator

from ai_factory.factory.acceptance.gates import ACCEPTANCE_KEY
from ai_factory.factory.checking.fabric import Item, Problem, _findings, _items, _map, _tenant_namespaces
from ai_factory.factory.checking.findings import Finding

if TYPE_CHECKING:
    from ai_factory.factory.checking.oracles import Oracles
    from ai_factory.factory.rendering.bundle import Rendered

REGISTER_TAINTS_ANNOTATION = "ai-factory.io/register-with-taints"
PENDING_TAINT = {"key": ACCEPTANCE_KEY, "value": "pending", "effect": "NoSchedule"}


def registered_taints(secret: Item) -> list | None:
    try:
        taints = json.loads(str(_map(secret.metadata.get("annotations")).get(REGISTER_TAINTS_ANNOTATION, "")))
    except ValueError:
        return None
    return taints if isinstance(taints, list) else None


def registration_problems(items: Iterable[Item]) -> Iterator[Problem]:
    items = list(items)
    secrets = {(i.namespace, i.name): i for i in items if i.kind == "Secret"}
    for host in (i for i in items if i.kind == "BareMetalHost"):
        reference = _map(host.spec.get("userData"))
        if not reference.get("name"):
            yield host.handle, "boots without user data: its kubelet registers the node untainted, open to workloads before acceptance"
            continue
        key = (reference.get("namespace") or host.namespace, reference["name"])
        secret = secrets.get(key)
        if secret is None:
            yield host.handle, f"its user data Secret {key[0]}/{key[1]} is not part of the render"
            continue
        taints = registered_taints(secret)
        if taints is None or PENDING_TAINT not in taints:
            yield host.handle, (f"its user data ({key[0]}/{key[1]}) does not register the node with the taint "
                                f"{ACCEPTANCE_KEY}=pending:NoSchedule: workloads could land before acceptance")


def registration_taint(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    items = _items(rendered)
    return _findings("registration-taint", registration_problems(items), _tenant_namespaces(items))
