"""Offline checks of the health layer (`components/health.py`): every GPU node is watched and can be
remediated, no remediation object can act on more nodes at once than the blast radius allows, and
the layer's own service accounts hold least privilege.

GPU nodes are the rendered `Node` objects (the fleet layer labels every GPU node it knows). The
limits come from the render's config when there is one (`factory check <env>`); a render read back
from a directory has none, and then only what the objects say by themselves is checked.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Iterable

from ai_factory.factory.checking.findings import Finding, tenant_local
from ai_factory.factory.checking.isolation import ESCALATION_VERBS, SERVICE_ACCOUNTS_GROUP, View, bound_rules, rule_text
from ai_factory.factory.checking.label_index import selects
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.checking.scheduling import tolerates
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.tenancy import LABEL_PREFIX
from ai_factory.factory.rendering.bundle import Manifest, Rendered

POOL_LABEL = f"{LABEL_PREFIX}/pool"
SITE_LABEL = f"{LABEL_PREFIX}/site"
NPD_CHART = "node-problem-detector"
NHC = ("remediation.medik8s.io/", "NodeHealthCheck")
SNR_CONFIG = ("self-node-remediation.medik8s.io/", "SelfNodeRemediationConfig")
SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")
STEP = "ai-factory-gpu-remediation"
"""The remediation step's ConfigMap (components/_gpu_remediation.py): its `pools.json` lists the
pools it drains; a GPU fault on a node of another pool would never be remediated."""


def pool_limits(cfg: FactoryConfig) -> dict[str, int]:
    """Nodes each pool may have remediating at once (`layers.health.remediation`)."""
    rem = cfg.layers.health.remediation
    return {p.name: rem.pools.get(p.name, rem.pool_limit).resolve(len(p.node_specs())) for p in cfg.fleet.pools}


def site_limits(cfg: FactoryConfig) -> dict[str, int]:
    """Nodes each site with a limit may have remediating at once."""
    sizes: dict[str, int] = defaultdict(int)
    for p in cfg.fleet.pools:
        sizes[p.site] += len(p.node_specs())
    return {site: limit.resolve(sizes[site]) for site, limit in sorted(cfg.layers.health.remediation.sites.items()) if site in sizes}


@tenant_local
def detection_coverage(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    """Every GPU node runs Node Problem Detector (the release's node affinity and node selector pick
    it, its tolerations cover the node's taints), is selected by a NodeHealthCheck, is drained by the
    remediation step (the NodeHealthCheck reboots only drained nodes), and runs a Self Node
    Remediation agent (the SelfNodeRemediationConfig tolerates its taints)."""
    nodes = _nodes(rendered)
    sources = rendered.oci_sources()
    releases = [m for m in rendered.of_kind("HelmRelease") if rendered.release_chart(m, sources) == NPD_CHART]
    checks = _of(rendered, *NHC)
    snr_configs = _of(rendered, *SNR_CONFIG)
    stepped = {pool for m in rendered.of_kind("ConfigMap") if m.name == STEP for pool in _step_settings(m)}
    for node in nodes:
        labels, taints = _labels(node.obj), _taints(node.obj)
        if not any(_schedules(_values(r), labels, taints) for r in releases):
            yield Finding("health-coverage", node.ref, "no Node Problem Detector runs on this GPU node (node affinity, node selector or tolerations leave it out)")
        if not any(selects(_spec(c).get("selector"), labels) for c in checks):
            yield Finding("health-coverage", node.ref, "no NodeHealthCheck selects this GPU node: its faults would never be remediated")
        elif labels.get(POOL_LABEL) not in stepped:
            yield Finding("health-coverage", node.ref, "the remediation step does not take this GPU node's pool: a GPU fault would never be drained, so never remediated")
        if checks and not any(all(tolerates(_spec(c).get("customDsTolerations") or [], t) for t in taints) for c in snr_configs):
            yield Finding("health-coverage", node.ref, "no Self Node Remediation agent can run on this GPU node (SelfNodeRemediationConfig does not tolerate its taints)")


def remediation_blast_radius(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    """Every NodeHealthCheck bounds concurrent remediations with `maxUnhealthy` (not `minHealthy`,
    which bounds healthy nodes), no node is counted by two of them, and - against the config - each
    allows at most the smallest limit of the pools it selects, and those selecting a site's nodes
    together at most the site's limit; the remediation step's own bound per pool is a node count
    within the pool's limit, and on a DRA pool counts a quarantined GPU no less than its share of
    a node."""
    nodes = _nodes(rendered)
    checks = _of(rendered, *NHC)
    cfg = rendered.config
    pools = pool_limits(cfg) if cfg and cfg.layers.health.enabled else None
    sites = site_limits(cfg) if cfg and cfg.layers.health.enabled else None
    selected_by: dict[str, list[str]] = defaultdict(list)
    per_site: dict[str, list[tuple[Manifest, int]]] = defaultdict(list)
    for check in checks:
        spec = _spec(check)
        selected = [n for n in nodes if selects(spec.get("selector"), _labels(n.obj))]
        for n in selected:
            selected_by[n.name].append(check.name)
        allowed = _resolve(spec.get("maxUnhealthy"), len(selected))
        if spec.get("maxUnhealthy") is None:
            reason = "bounds healthy nodes (minHealthy), not remediating ones" if spec.get("minHealthy") is not None else "sets no maxUnhealthy (the controller then defaults to minHealthy 51%: half the pool at once)"
            yield Finding("remediation-blast-radius", check.ref, f"{reason}: set maxUnhealthy to the pool's limit")
            allowed = len(selected)
        elif allowed is None:
            yield Finding("remediation-blast-radius", check.ref, f"maxUnhealthy {spec.get('maxUnhealthy')!r} is not a node count or a percentage")
            allowed = len(selected)
        elif allowed == 0:
            # The pack's `remediation-bounded` refuses it too: the loop would never start.
            yield Finding("remediation-blast-radius", check.ref, "maxUnhealthy 0 allows no remediation at all: a faulty node would stay unremediated")
        if pools is not None:
            selected_pools = sorted({p for n in selected if (p := _labels(n.obj).get(POOL_LABEL))})
            limit = min((pools[p] for p in selected_pools if p in pools), default=None)
            if limit is not None and allowed > limit:
                names = ", ".join(f"{p} {pools[p]}" for p in selected_pools if p in pools)
                yield Finding("remediation-blast-radius", check.ref, f"may remediate {allowed} nodes at once, above the limit of its pools ({names})")
        for site in sorted({s for n in selected if (s := _labels(n.obj).get(SITE_LABEL))}):
            in_site = sum(1 for n in selected if _labels(n.obj).get(SITE_LABEL) == site)
            per_site[site].append((check, min(allowed, in_site)))
    per_node = {p.name: p.gpu.per_node for p in cfg.fleet.pools} if cfg else {}
    for config in (m for m in rendered.of_kind("ConfigMap") if m.name == STEP):
        for pool, settings in sorted(_step_settings(config).items()):
            yield from _step_radius(config, pool, settings, (pools or {}).get(pool), per_node.get(pool))
    for node, names in sorted(selected_by.items()):
        if len(names) > 1:
            yield Finding("remediation-blast-radius", f"Node/{node}", f"selected by {len(names)} NodeHealthChecks ({', '.join(sorted(names))}): each counts it, so their limits add up")
    for site, members in sorted(per_site.items()):
        limit = (sites or {}).get(site)
        total = sum(n for _, n in members)
        if limit is not None and total > limit:
            listed = ", ".join(f"{c.name} {n}" for c, n in members)
            yield Finding("remediation-blast-radius", f"site/{site}", f"NodeHealthChecks may remediate {total} nodes of the site at once ({listed}), above its limit of {limit}")


def _step_radius(config: Manifest, pool: str, settings: Any, limit: int | None, gpus_per_node: int | None) -> Iterable[Finding]:
    """The remediation step's own bound for one pool (`pools.json`): by itself (`step_bound_problems`),
    and against the config: at most the pool's limit; on a DRA pool, where a quarantined GPU counts
    1/gpus of a node, at most the pool's GPUs per node (more would let more GPUs out at once than
    the limit's nodes hold)."""
    where = f"{config.ref} (pools.json, pool {pool})"
    problems = step_bound_problems(settings)
    for problem in problems:
        yield Finding("remediation-blast-radius", where, problem)
    if problems:
        return
    if limit is not None and settings["limit"] > limit:
        yield Finding("remediation-blast-radius", where, f"the remediation step may take {settings['limit']} nodes at once, above the pool's limit of {limit}")
    gpus = settings.get("gpus", 1)
    if settings.get("dra") and gpus_per_node is not None and gpus > gpus_per_node:
        yield Finding(
            "remediation-blast-radius", where,
            f"counts a quarantined GPU as 1/{gpus} of a node, but the pool's nodes have {gpus_per_node} GPUs: more GPUs could be out at once than its limit allows",
        )


def step_bound_problems(settings: Any) -> list[str]:
    """What makes one pool's entry of the remediation step's `pools.json` no bound at all: a limit
    that is not a node count of at least 1 (jq compares a string above every number), GPUs per node
    that are not a count. Shared with the pack's `remediation-bounded`."""
    settings = settings if isinstance(settings, dict) else {}
    limit, gpus = settings.get("limit"), settings.get("gpus", 1)
    problems = []
    if not _count(limit):
        problems.append(f"limit {limit!r} is not a node count of at least 1: the step would drain without bound")
    if not _count(gpus):
        problems.append(f"gpus {gpus!r} is not a GPU count of at least 1: quarantined GPUs would not be counted against the limit")
    return problems


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


READ_VERBS = frozenset({"get", "list", "watch", "*"})
DELETE_VERBS = frozenset({"delete", "deletecollection", "*"})


def remediation_rbac(rendered: Rendered, oracles: Oracles | None) -> Iterable[Finding]:
    """Least privilege of the service accounts of the health layer's namespaces (Node Problem
    Detector's, the remediation operators'), over every binding that names them, the charts' too:
    they read no Secret outside their own namespace (tenants' credentials included), delete no
    pod (a drain evicts through `pods/eviction`, which honours PodDisruptionBudgets), use no
    wildcard and cannot escalate, bind or impersonate; a role that is not rendered cannot be
    judged and is a finding. The medik8s operators' own roles come with OLM, outside the render."""
    view = View.of(rendered)
    homes = {m.name for m in rendered.of_kind("Namespace") if m.layer == "health"}
    for binding, subject, scope, role, rules in bound_rules(view):
        home = service_account_home(subject, homes)
        if home is None:
            continue
        who = f"{subject[0]} {subject[1]}"
        if rules is None:
            yield Finding("remediation-rbac", binding.ref, f"binds {who} to {role}, which is not in the rendered set: its permissions cannot be judged")
            continue
        for rule in rules:
            problems = rbac_problems(rule, scope, home)
            if problems:
                yield Finding("remediation-rbac", binding.ref, f"grants {who} {role} with {', '.join(problems)}: {rule_text(rule)}")


def rbac_problems(rule: Mapping[str, Any], scope: str | None, home: str) -> list[str]:
    """What one RBAC rule, bound in `scope` (None: cluster-wide) to a service account of the health
    namespace `home`, grants beyond least privilege; shared with the pack's `remediation-rbac`."""
    where = "in every namespace" if scope is None else f"in namespace {scope}"
    verbs = set(rule.get("verbs") or [])
    problems = [f"wildcard {part}" for part in ("apiGroups", "resources", "verbs") if "*" in (rule.get(part) or [])]
    problems += [f"verb {v}" for v in sorted(ESCALATION_VERBS & verbs)]
    if verbs & READ_VERBS and _names(rule, "", "secrets") and scope != home:
        problems.append(f"reads Secrets {where} (tenants' credentials included)")
    if verbs & DELETE_VERBS and _names(rule, "", "pods"):
        problems.append(f"deletes pods {where}: a drain must evict (create pods/eviction), which honours PodDisruptionBudgets")
    return problems


def service_account_home(subject: tuple[str, str], homes: set[str]) -> str | None:
    """The health namespace a service account (or a namespace's service-account group) lives in."""
    kind, name = subject
    if kind == "ServiceAccount":
        namespace = name.split("/", 1)[0]
    elif kind == "Group" and name.startswith(SERVICE_ACCOUNTS_GROUP):
        namespace = name.removeprefix(SERVICE_ACCOUNTS_GROUP)
    else:
        return None
    return namespace if namespace in homes else None


def _names(rule: Mapping[str, Any], group: str, resource: str) -> bool:
    """The rule covers the resource itself (not only subresources such as pods/eviction)."""
    groups, resources = rule.get("apiGroups") or [], rule.get("resources") or []
    return (group in groups or "*" in groups) and (resource in resources or "*" in resources)


def _step_settings(config: Manifest) -> dict[str, Any]:
    return step_settings(config.obj.get("data"))


def step_settings(data: Any) -> dict[str, Any]:
    """The remediation step's `pools.json` from its ConfigMap's data: {pool: {limit, dra, gpus}};
    empty when unreadable."""
    try:
        pools = json.loads(str((data if isinstance(data, Mapping) else {}).get("pools.json") or "{}"))
    except ValueError:
        return {}
    return pools if isinstance(pools, dict) else {}


def _resolve(value: Any, total: int) -> int | None:
    """`maxUnhealthy` in nodes, as the controller scales it (a percentage rounds down)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.endswith("%") and value[:-1].isdigit():
        return total * min(int(value[:-1]), 100) // 100
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _schedules(values: Mapping[str, Any], labels: Mapping[str, str], taints: list[Mapping[str, Any]]) -> bool:
    """Whether a DaemonSet with the chart's `nodeSelector`, `affinity` and `tolerations` values runs
    on a node with these labels and taints."""
    if any(labels.get(k) != v for k, v in (values.get("nodeSelector") or {}).items()):
        return False
    required = (((values.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if terms is not None and not any(selects({"matchExpressions": t.get("matchExpressions") or []}, labels) for t in terms):
        return False
    return all(tolerates(values.get("tolerations") or [], t) for t in taints)


def _values(release: Manifest) -> Mapping[str, Any]:
    return _spec(release).get("values") or {}


def _nodes(rendered: Rendered) -> list[Manifest]:
    return sorted(View.of(rendered).of_kind("Node"), key=lambda m: m.name)


def _of(rendered: Rendered, api_prefix: str, kind: str) -> list[Manifest]:
    return [m for m in View.of(rendered).of_kind(kind) if str(m.obj.get("apiVersion", "")).startswith(api_prefix)]


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(((obj.get("metadata") or {}).get("labels")) or {})


def _taints(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [t for t in ((obj.get("spec") or {}).get("taints") or []) if t.get("effect") in SCHEDULING_EFFECTS]


def _spec(m: Manifest | None) -> dict[str, Any]:
    spec = m.obj.get("spec") if m else None
    return spec if isinstance(spec, dict) else {}
