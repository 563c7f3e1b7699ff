"""Cross-layer checks of scheduling and quotas over a rendered environment (`factory check`).

They read only rendered objects, so they run on a rendered directory too, where no configuration
is at hand: the fleet's Node patches (labels and taints the plan put on each node), the Kueue
flavors (each GPU flavor carries the supply the plan created behind it in the
`ai-factory.io/supply` annotation, written from `Offering.supply`), cohorts, ClusterQueues and
LocalQueues, the tenants' Namespaces and KAI queues.

A GPU flavor is a ResourceFlavor that places pods (node labels or tolerations); the CPU/memory
flavor places nothing and is shared by every queue.
"""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable, Mapping

from ai_factory.factory.checking.findings import Finding, tenant_local
from ai_factory.factory.checking.isolation import View
from ai_factory.factory.checking.label_index import LabelIndex, selects
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.planning.placement import POOL_LABEL
from ai_factory.factory.model.quantity import parse_quantity
from ai_factory.factory.planning.quotas import SUPPLY_ANNOTATION
from ai_factory.factory.rendering.bundle import Manifest, Rendered
from ai_factory.factory.model.tenancy import TENANT_LABEL, TRUST_DOMAIN_LABEL

KUEUE_GROUP = "kueue.x-k8s.io/"
KAI_QUEUE_API = "scheduling.run.ai/v2"
KAI_RESOURCES = ("gpu", "cpu", "memory")
KAI_FIELDS = ("quota", "overQuotaWeight", "limit")
DEFAULT_LOCAL_QUEUE = "default"
"""Kueue gives a job that names no queue to the LocalQueue of this name in its namespace."""


# --------------------------------------------------------------------------- reading objects


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    """An object's labels; {} when malformed (the schema check reports that)."""
    labels = _mapping(_mapping(obj.get("metadata")).get("labels"))
    return {k: v for k, v in labels.items() if isinstance(v, str)}


def _spec(m: Manifest) -> dict[str, Any]:
    return _mapping(m.obj.get("spec"))


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _of(rendered: Rendered, kind: str, api_prefix: str = "") -> list[Manifest]:
    # From the render's objects by kind, indexed once for every check of a run (`View.shared`):
    # each check scanning every object for its few kinds was most of their time at 1,000 tenants.
    return [m for m in View.of(rendered).of_kind(kind) if str(m.obj.get("apiVersion", "")).startswith(api_prefix)]


def _tenants(*manifests: Manifest) -> tuple[str, ...]:
    return tuple(sorted({t for m in manifests if (t := m.tenant or _labels(m.obj).get(TENANT_LABEL))}))


def tolerates(tolerations: list[dict[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value") == taint.get("value"):
            return True
    return False


def _is_gpu_flavor(flavor: Manifest) -> bool:
    return bool(_spec(flavor).get("nodeLabels") or _spec(flavor).get("tolerations"))


def _nodes(rendered: Rendered) -> LabelIndex:
    """The rendered Nodes by label: each flavor's nodes are found without testing every node."""
    return LabelIndex(_of(rendered, "Node"), lambda n: _labels(n.obj))


def _reachable(flavor: Manifest, nodes: LabelIndex, taints: dict[int, Any]) -> list[int]:
    """Positions in `nodes` of the nodes whose labels the flavor selects and whose scheduling
    taints it tolerates. `taints`: each node's, read on first use and kept for the check's other
    flavors (read again for each of a thousand flavors, they were most of the check's time)."""
    spec = _spec(flavor)
    tolerations = spec.get("tolerations") or []
    found = []
    for p in nodes.positions(spec.get("nodeLabels") or {}):
        if p not in taints:
            taints[p] = _spec(nodes.items[p]).get("taints") or []
        if all(tolerates(tolerations, t) for t in taints[p] if t.get("effect") in ("NoSchedule", "NoExecute")):
            found.append(p)
    return found


def _quota_users(rendered: Rendered) -> list[Manifest]:
    """ClusterQueues and Cohorts: the objects that hold quota on flavors."""
    return _of(rendered, "ClusterQueue", KUEUE_GROUP) + _of(rendered, "Cohort", KUEUE_GROUP)


def _quotas(user: Manifest) -> Iterable[tuple[str, str, Any]]:
    """(flavor, resource, nominal quota) of a ClusterQueue or Cohort."""
    for group in _spec(user).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                yield flavor.get("name"), resource.get("name"), resource.get("nominalQuota")


def _amount(value: Any) -> Decimal | None:
    try:
        return Decimal(value) if isinstance(value, (int, float)) else parse_quantity(str(value))
    except (InvalidOperation, ValueError):
        return None


# --------------------------------------------------------------------------- checks


def tenant_local_queues(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """With Kueue on, every tenant namespace (all may ask for GPUs) has its LocalQueue `default`,
    bound to an existing ClusterQueue that selects the namespace: Kueue manages every job of a
    tenant namespace and gives one without a queue name to the LocalQueue named `default`."""
    if not any(str(m.obj.get("apiVersion", "")).startswith(KUEUE_GROUP) for m in rendered.manifests):
        return
    cluster_queues = {m.name: m for m in _of(rendered, "ClusterQueue", KUEUE_GROUP)}
    local_queues = defaultdict(list)
    for m in _of(rendered, "LocalQueue", KUEUE_GROUP):
        local_queues[m.namespace].append(m)
    for ns in _of(rendered, "Namespace"):
        labels = _labels(ns.obj)
        if TENANT_LABEL not in labels:
            continue
        tenants = _tenants(ns)
        queues = local_queues.get(ns.name, [])
        if not queues:
            yield Finding("tenant-local-queue", ns.ref, "tenant namespace has no LocalQueue: its workloads are never admitted", tenants)
            continue
        if not any(q.name == DEFAULT_LOCAL_QUEUE for q in queues):
            yield Finding("tenant-local-queue", ns.ref, "no LocalQueue named `default`: jobs that name no queue wait forever", tenants)
        for q in queues:
            target = cluster_queues.get(_spec(q).get("clusterQueue"))
            if target is None:
                yield Finding("tenant-local-queue", q.ref, f"points to ClusterQueue {_spec(q).get('clusterQueue')!r}, which is not rendered", tenants)
            elif not selects(_spec(target).get("namespaceSelector"), labels):
                yield Finding("tenant-local-queue", q.ref, f"points to {target.ref}, which does not select namespace {ns.name}", tenants)


@tenant_local
def flavor_nodes(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Every GPU flavor names a pool, each of its node labels exists on the nodes of that pool, and
    some node of the pool carries them all and has no taint the flavor does not tolerate."""
    nodes, taints = _nodes(rendered), {}
    for flavor in _of(rendered, "ResourceFlavor", KUEUE_GROUP):
        if not _is_gpu_flavor(flavor):
            continue
        wanted = _spec(flavor).get("nodeLabels") or {}
        pool = wanted.get(POOL_LABEL)
        if pool is None:
            yield Finding("flavor-nodes", flavor.ref, f"its node labels name no pool ({POOL_LABEL})")
            continue
        if not nodes.positions({POOL_LABEL: pool}):
            yield Finding("flavor-nodes", flavor.ref, f"pool {pool!r} has no rendered node")
            continue
        missing = [f"{k}={v}" for k, v in sorted(wanted.items()) if not nodes.positions({POOL_LABEL: pool, k: v})]
        if missing:
            yield Finding("flavor-nodes", flavor.ref, f"node label(s) {', '.join(missing)} on no node of pool {pool!r}")
        elif not _reachable(flavor, nodes, taints):
            yield Finding("flavor-nodes", flavor.ref, f"every node of pool {pool!r} with its labels has a taint it does not tolerate")


def flavor_supply(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Per GPU flavor and resource, the nominal quotas of all ClusterQueues and Cohorts add up to no
    more than the supply the plan created behind the flavor (more is over-admission: Kueue admits
    work no node can run). Quota on a flavor that is not rendered is reported too."""
    flavors = {m.name: m for m in _of(rendered, "ResourceFlavor", KUEUE_GROUP)}
    totals: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    holders: dict[tuple[str, str], list[str]] = defaultdict(list)
    for user in _quota_users(rendered):
        for flavor, resource, nominal in _quotas(user):
            if flavor not in flavors:
                yield Finding("flavor-supply", user.ref, f"holds quota on flavor {flavor!r}, which is not rendered", _tenants(user))
                continue
            amount = _amount(nominal)
            if amount is None:
                yield Finding("flavor-supply", user.ref, f"{flavor}/{resource}: unreadable quantity {nominal!r}", _tenants(user))
                continue
            totals[flavor, resource] += amount
            if amount:
                holders[flavor, resource].append(f"{user.kind} {user.name}: {amount}")
    by_flavor: dict[str, list[tuple[str, Decimal]]] = defaultdict(list)
    for (flavor_name, resource), total in sorted(totals.items()):
        by_flavor[flavor_name].append((resource, total))
    for name, flavor in sorted(flavors.items()):
        if not _is_gpu_flavor(flavor):
            continue
        raw = ((flavor.obj.get("metadata") or {}).get("annotations") or {}).get(SUPPLY_ANNOTATION)
        try:
            supply = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            supply = None
        if not isinstance(supply, dict):
            yield Finding("flavor-supply", flavor.ref, f"no readable {SUPPLY_ANNOTATION} annotation: its quotas cannot be checked")
            continue
        for resource, total in by_flavor.get(name, []):
            if total > Decimal(supply.get(resource, 0)):
                yield Finding(
                    "flavor-supply",
                    flavor.ref,
                    f"{resource}: quotas add up to {total} ({'; '.join(holders[name, resource])}) but the plan created {supply.get(resource, 0)}",
                )


def flavor_trust_domains(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """No GPU flavor mixes trust domains: it declares its trust domain, only queues and cohorts of
    that domain hold quota on it, it tolerates no other domain's taint (nor every taint), and no
    node it can reach belongs to another domain."""
    nodes, taints = _nodes(rendered), {}
    users = defaultdict(list)
    for user in _quota_users(rendered):
        # Each user once per flavor, by its flavors' names: testing membership in the list of a
        # flavor every queue holds (the CPU one) was quadratic, and a user equal to another gives
        # the same findings.
        for flavor in dict.fromkeys(f for f, _, _ in _quotas(user)):
            users[flavor].append(user)
    for flavor in _of(rendered, "ResourceFlavor", KUEUE_GROUP):
        if not _is_gpu_flavor(flavor):
            continue
        domain = _labels(flavor.obj).get(TRUST_DOMAIN_LABEL)
        if not domain:
            yield Finding("flavor-trust-domain", flavor.ref, f"a GPU flavor without a trust domain ({TRUST_DOMAIN_LABEL} label)")
            continue
        for user in users[flavor.name]:
            theirs = _labels(user.obj).get(TRUST_DOMAIN_LABEL)
            if theirs != domain:
                yield Finding(
                    "flavor-trust-domain",
                    flavor.ref,
                    f"trust domain {domain!r}, but {user.ref} of trust domain {theirs!r} holds quota on it",
                    _tenants(user),
                )
        for t in _spec(flavor).get("tolerations") or []:
            if t.get("operator") == "Exists" and not t.get("key"):
                yield Finding("flavor-trust-domain", flavor.ref, "tolerates every taint, other trust domains' included")
            elif t.get("key") == TRUST_DOMAIN_LABEL and t.get("operator") == "Exists":
                yield Finding("flavor-trust-domain", flavor.ref, f"trust domain {domain!r}, but tolerates every trust domain's taint")
            elif t.get("key") == TRUST_DOMAIN_LABEL and t.get("value") != domain:
                yield Finding("flavor-trust-domain", flavor.ref, f"trust domain {domain!r}, but tolerates trust domain {t.get('value')!r}")
        for p in _reachable(flavor, nodes, taints):
            theirs = nodes.labels(p).get(TRUST_DOMAIN_LABEL)
            if theirs and theirs != domain:
                yield Finding("flavor-trust-domain", flavor.ref, f"trust domain {domain!r}, but reaches node {nodes.items[p].name} of trust domain {theirs!r}")


def cluster_queue_namespaces(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Every ClusterQueue selects exactly its tenant's namespaces: never all (a selector that does
    not pin the tenant label to its own tenant, which tenants cannot set on a namespace), never
    another tenant's, never none (no selector, or one no rendered namespace matches)."""
    namespaces = LabelIndex(_of(rendered, "Namespace"), lambda ns: _labels(ns.obj))
    for queue in _of(rendered, "ClusterQueue", KUEUE_GROUP):
        tenant = _labels(queue.obj).get(TENANT_LABEL)
        tenants = _tenants(queue)
        selector = _spec(queue).get("namespaceSelector")
        if selector is None:
            yield Finding("cluster-queue-namespaces", queue.ref, "no namespaceSelector: selects no namespace", tenants)
            continue
        pinned = {v for k, v in (selector.get("matchLabels") or {}).items() if k == TENANT_LABEL}
        pinned |= {
            v
            for e in selector.get("matchExpressions") or []
            if e.get("key") == TENANT_LABEL and e.get("operator") == "In" and len(e.get("values") or []) == 1
            for v in e["values"]
        }
        if pinned != {tenant}:
            what = f"pins {TENANT_LABEL} to {sorted(pinned)}" if pinned else f"does not pin {TENANT_LABEL}: selects every tenant's namespaces (all of them if empty)"
            yield Finding("cluster-queue-namespaces", queue.ref, f"queue of tenant {tenant!r}, but its namespaceSelector {what}", tenants)
            continue
        candidates = namespaces.matching(selector.get("matchLabels") or {})
        if namespaces.items and not any(selects(selector, _labels(ns.obj)) for ns in candidates):
            yield Finding("cluster-queue-namespaces", queue.ref, "selects none of the rendered namespaces", tenants)


def kai_queue_shares(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Every KAI queue writes quota, overQuotaWeight and limit for GPU, CPU and memory (KAI reads an
    unset limit as 0), names an existing parent, and its children's quotas fit in its own."""
    queues = {m.name: m for m in _of(rendered, "Queue", KAI_QUEUE_API)}
    children = defaultdict(list)
    for queue in queues.values():
        resources = _spec(queue).get("resources") or {}
        for resource in KAI_RESOURCES:
            missing = [f for f in KAI_FIELDS if f not in (resources.get(resource) or {})]
            if missing:
                yield Finding("kai-queue-shares", queue.ref, f"{resource}: {', '.join(missing)} not set (an unset limit is 0 to KAI)", _tenants(queue))
        parent = _spec(queue).get("parentQueue")
        if parent and parent not in queues:
            yield Finding("kai-queue-shares", queue.ref, f"parent queue {parent!r} is not rendered", _tenants(queue))
        elif parent:
            children[parent].append(queue)
    for name, members in sorted(children.items()):
        parent_resources = _spec(queues[name]).get("resources") or {}
        for resource in KAI_RESOURCES:
            quota = (parent_resources.get(resource) or {}).get("quota")
            total = sum(((_spec(q).get("resources") or {}).get(resource) or {}).get("quota") or 0 for q in members)
            if isinstance(quota, (int, float)) and quota >= 0 and total > quota:
                yield Finding("kai-queue-shares", queues[name].ref, f"{resource}: children's quotas add up to {total}, more than its {quota}", _tenants(*members))


CHECKS = [tenant_local_queues, flavor_nodes, flavor_supply, flavor_trust_domains, cluster_queue_namespaces, kai_queue_shares]
