"""Offline checks of the tenants' Slurm clusters (`components/slinky.py`), over the values of each
`slurm` chart release.

* `gres_matches_plan`: every NodeSet's `Gres=` equals its slurmd's GPU limits, which equal what the
  plan gives the tenant on each of its nodes (recorded on the NodeSet, `PLANNED_ANNOTATION`); its
  pods are pinned to exactly those nodes, one per node (replicas = nodes, no oversubscription); and
  on every node the Slurm GPUs of all tenants add up to at most the node's GPUs (with the config).
* `partitions_within_trust_domain`: no NodeSet, hence no partition, reaches a node that the fleet
  layer marked for another trust domain or dedicated to another tenant, and none is left free to
  land anywhere (no host pinning).

Both read rendered objects only (the fleet's Node patches, the tenants' Namespaces), so they run on
a rendered directory too.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Iterable, Iterator

from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.model.tenancy import LABEL_PREFIX, TENANT_LABEL, TRUST_DOMAIN_LABEL
from ai_factory.factory.rendering.bundle import Manifest, Rendered

PLANNED_ANNOTATION = f"{LABEL_PREFIX}/planned-gpus"
"""On a NodeSet: the plan's grant to its tenant on each of its nodes, `{node: {resource: count}}`."""
DEDICATED_LABEL = f"{LABEL_PREFIX}/dedicated"
SLURM_CHART = "slurm"
HOSTNAME = "kubernetes.io/hostname"
WHOLE_GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> Sequence[Any]:
    # Sequences, not lists: CrossGuard hands the policies its own read-only sequence type.
    return value if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) else ()


def slurm_releases(rendered: Rendered) -> list[Manifest]:
    """The HelmReleases of the `slurm` chart (by chart name or OCI reference)."""
    sources = {(m.namespace, m.name): m.obj for m in rendered.of_kind("HelmRepository", "OCIRepository")}
    found = []
    for m in rendered.of_kind("HelmRelease"):
        spec = _map(m.obj.get("spec"))
        if "chartRef" in spec:
            source = _map(sources.get((m.namespace, _map(spec["chartRef"]).get("name"))))
            chart = str(_map(source.get("spec")).get("url", "")).rstrip("/").rsplit("/", 1)[-1]
        else:
            chart = str(_map(_map(spec.get("chart")).get("spec")).get("chart", ""))
        if chart == SLURM_CHART:
            found.append(m)
    return found


def release_values(release: Manifest) -> Mapping[str, Any]:
    return _map(_map(release.obj.get("spec")).get("values"))


def nodesets(values: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The enabled NodeSets of a `slurm` release's values, by key."""
    for key, nodeset in sorted(_map(values.get("nodesets")).items()):
        if _map(nodeset).get("enabled", True) is not False:
            yield str(key), _map(nodeset)


def pinned_nodes(nodeset: Mapping[str, Any]) -> list[str] | None:
    """The hostnames the NodeSet's required node affinity allows, None when it pins none."""
    affinity = _map(_map(_map(_map(nodeset.get("podSpec")).get("affinity")).get("nodeAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = _list(affinity.get("nodeSelectorTerms"))
    hosts: list[str] = []
    for term in terms:
        expressions = [_map(e) for e in _list(_map(term).get("matchExpressions"))]
        pins = [e for e in expressions if e.get("key") == HOSTNAME and e.get("operator") == "In"]
        if not pins:
            return None  # a term without a host pin lets the pod land anywhere its other rules allow
        hosts += [str(v) for p in pins for v in _list(p.get("values"))]
    return sorted(set(hosts)) if terms else None


def gres_counts(nodeset: Mapping[str, Any]) -> dict[str, int] | str:
    """The Kubernetes resources a NodeSet's `Gres=` stands for, or what is wrong with it."""
    items = _list(_map(nodeset.get("extraConfMap")).get("Gres"))
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        parts = str(item).split(":")
        if parts[0] != "gpu" or len(parts) not in (2, 3) or not parts[-1].isdigit():
            return f"Gres item {item!r} is not gpu[:<type>]:<count>"
        counts[WHOLE_GPU if len(parts) == 2 else MIG_PREFIX + parts[1]] += int(parts[-1])
    return dict(counts)


def gpu_limits(nodeset: Mapping[str, Any]) -> dict[str, int]:
    limits = _map(_map(_map(nodeset.get("slurmd")).get("resources")).get("limits"))
    result = {}
    for resource, amount in limits.items():
        if str(resource) == WHOLE_GPU or str(resource).startswith(MIG_PREFIX):
            try:
                result[str(resource)] = int(str(amount))
            except ValueError:
                result[str(resource)] = -1
    return result


def planned(nodeset: Mapping[str, Any]) -> dict[str, dict[str, int]] | None:
    text = _map(_map(nodeset.get("metadata")).get("annotations")).get(PLANNED_ANNOTATION)
    try:
        data = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return {str(n): {str(r): int(c) for r, c in _map(g).items()} for n, g in _map(data).items()} if isinstance(data, Mapping) else None


def _tenant(release: Manifest, rendered: Rendered) -> tuple[str | None, str | None]:
    """The tenant and trust domain of the release's namespace."""
    for m in rendered.of_kind("Namespace"):
        if m.name == release.namespace:
            labels = _map(_map(m.obj.get("metadata")).get("labels"))
            return labels.get(TENANT_LABEL), labels.get(TRUST_DOMAIN_LABEL)
    return None, None


def nodeset_problems(nodeset: Mapping[str, Any]) -> list[str]:
    """What is wrong with one NodeSet's values by themselves: its `Gres=` against its slurmd's GPU
    limits and against the plan's grant on each of its nodes, its pinning and its replicas."""
    gres, limits, plan, hosts = gres_counts(nodeset), gpu_limits(nodeset), planned(nodeset), pinned_nodes(nodeset)
    if isinstance(gres, str):
        return [gres]
    problems = []
    if gres != limits:
        problems.append(f"Gres= stands for {gres or 'no GPUs'} but slurmd's limits are {limits or 'no GPUs'}: Slurm would hand out devices the pod does not have")
    if plan is None:
        return [*problems, f"no {PLANNED_ANNOTATION} annotation: its GRES cannot be compared with the plan"]
    if hosts != sorted(plan):
        problems.append(f"its pods may run on {', '.join(hosts) if hosts else 'any node'}, not exactly the nodes the plan gives it ({', '.join(sorted(plan))})")
    if nodeset.get("replicas") != len(plan):
        problems.append(f"{nodeset.get('replicas')} replicas for {len(plan)} planned nodes: replicas would overcommit or leave a grant unused")
    if nodeset.get("oversubscribeNode") is True:
        problems.append("oversubscribeNode lets two of its pods share a node and each claim the node's GRES")
    problems += [f"node {node}: Gres= stands for {gres} but the plan gives the tenant {grant} there" for node, grant in sorted(plan.items()) if grant != gres]
    return problems


def foreign_nodes(nodeset: Mapping[str, Any], node_labels: Mapping[str, Mapping[str, Any]], tenant: str | None, domain: str | None) -> list[str]:
    """The nodes a NodeSet (and so its partition) may reach that belong to another trust domain or
    are dedicated to another tenant, as the fleet layer labels them."""
    hosts = pinned_nodes(nodeset)
    if hosts is None:
        return ["not pinned to nodes (kubernetes.io/hostname): its partition could span any trust domain's nodes"]
    problems = []
    for host in hosts:
        labels = node_labels.get(host, {})
        owner, dedicated = labels.get(TRUST_DOMAIN_LABEL), labels.get(DEDICATED_LABEL)
        if owner and owner != domain:
            problems.append(f"node {host} belongs to trust domain {owner!r}, not the tenant's {domain!r}")
        if dedicated and dedicated != tenant:
            problems.append(f"node {host} is dedicated to tenant {dedicated!r}")
    return problems


def gres_matches_plan(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    per_node: dict[str, int] = defaultdict(int)
    holders: dict[str, list[str]] = defaultdict(list)
    for release in slurm_releases(rendered):
        tenant = _tenant(release, rendered)[0]
        tenants = (tenant,) if tenant else ()
        for key, nodeset in nodesets(release_values(release)):
            for problem in nodeset_problems(nodeset):
                yield Finding("slurm-gres", f"{release.ref} nodeset {key}", problem, tenants)
            gres = gres_counts(nodeset)
            for node in sorted(planned(nodeset) or {}):
                per_node[node] += gres.get(WHOLE_GPU, 0) if isinstance(gres, dict) else 0
                holders[node].append(f"{release.namespace}/{key}")
    if rendered.config is None:
        return
    capacity = {n.name: p.gpu.per_node for p in rendered.config.fleet.pools for n in p.node_specs()}
    for node, gpus in sorted(per_node.items()):
        if gpus > capacity.get(node, 0):
            yield Finding("slurm-gres", f"Node/{node}", f"Slurm NodeSets claim {gpus} GPUs here ({', '.join(holders[node])}), the node has {capacity.get(node, 0)}")


def partitions_within_trust_domain(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    nodes = {m.name: _map(_map(m.obj.get("metadata")).get("labels")) for m in rendered.of_kind("Node")}
    for release in slurm_releases(rendered):
        tenant, domain = _tenant(release, rendered)
        for key, nodeset in nodesets(release_values(release)):
            for problem in foreign_nodes(nodeset, nodes, tenant, domain):
                yield Finding("slurm-trust-domain", f"{release.ref} nodeset {key}", problem, (tenant,) if tenant else ())
