"""`python -m factory diff <env> --without-tenant NAME`: what removing one tenant would change.

Three renders of the real program (as `pulumi up` runs it) answer it in two steps:

1. **removal** — the environment as it is, against the same config without the tenant and the
   capacity plan unchanged: exactly the tenant's objects (and Pulumi resources) must go; the only
   shared objects that may change are those of its own trust domain, which its grant returns to
   (a queue cohort holding the domain's ungranted supply; it goes with the domain's last tenant);
   nothing of another domain or another tenant may be added, removed or changed;
2. **release** — the same without the tenant, against it re-planned from the current plan (as
   `pulumi up` does, which applies both steps at once): the GPUs the tenant held return to the
   pool, so platform objects that follow the plan (node labels and taints, MIG layouts, queue
   flavors) change; no other tenant's object may, but for what of its trust-domain peers' objects
   follows the domain's offerings (`TenantRemoval.follows_domain`): the GPU lines of their
   ResourceQuotas (ceilings, `ai_factory.factory.planning.quotas.gpu_ceiling`: grant plus what the peer may borrow in
   the domain), the GPU resource groups of their ClusterQueues made only of the domain's flavors
   (`ai_factory.factory.planning.placement.offering_name(pool, domain)`), and, in their admission ClusterPolicy, the
   GPU resource names denied them and the placement tolerations allowed them. Anything else of a
   peer, and anything of a tenant of another domain, is unexpected.

Objects are compared file by file (path and content), Pulumi resources by inventory entry
(dependency edges aside: they order operations and update nothing).

In a multi-cluster environment each cluster is its own stack: the removal is answered per cluster
the tenant is on (`FleetRemoval`), each from that cluster's stack and plan lock, every change
under its cluster; a cluster the tenant is not on is not rendered when its view of the
environment is the same without the tenant (nothing there can change), and reported if not.
"""

from __future__ import annotations

import copy
import difflib
import json
from dataclasses import dataclass, field
from typing import Any, Iterator

from ai_factory.components.kyverno import (
    GPU_RESOURCES_RULE,
    POD_SECURITY_RULE,
    TOLERATIONS_RULE,
    granted_gpu_resources_rule,
    placement_tolerations_rule,
)
from ai_factory.components.tenant_stack import DEVICE_CLASS_QUOTA_SUFFIX, TOLERATIONS_WHITELIST_ANNOTATION
from ai_factory.factory.model.loading import ConfigError, environment_raw, project_dir, read_stack_file, stack_file, stack_name, validate
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.planning.placement import DEDICATED_LABEL, UNASSIGNED, offering_name
from ai_factory.factory.planning.from_config import plan_for, previous_plan
from ai_factory.factory.planning.quotas import CPU_FLAVOR
from ai_factory.factory.rendering.bundle import Manifest, Rendered, dump_yaml, render_raw
from ai_factory.factory.model.tenancy import SERVES_TENANT_LABEL, TENANT_LABEL, TRUST_DOMAIN_LABEL

DIFF_CONTEXT_LINES = 2
"""Unchanged lines shown around each change of an object's unified diff."""
MASKED = "<follows the trust domain's offerings>"
"""Stands for a list that may follow the trust domain's offerings, in a masked object."""
OFFERED_RULES = {GPU_RESOURCES_RULE: (granted_gpu_resources_rule, 0), TOLERATIONS_RULE: (placement_tolerations_rule, 1)}
"""The rules of a tenant's admission ClusterPolicy (`components.kyverno.TenantAdmissionHook`)
whose only variable part follows the offerings of its ceiling: rule name -> (its builder, the
index of the deny condition holding that list)."""


@dataclass
class Difference:
    """What changes from one render to another."""

    removed: list[Manifest] = field(default_factory=list)
    added: list[Manifest] = field(default_factory=list)
    changed: list[tuple[Manifest, Manifest]] = field(default_factory=list)
    resources_removed: list[dict[str, Any]] = field(default_factory=list)
    resources_added: list[dict[str, Any]] = field(default_factory=list)
    resources_changed: list[dict[str, Any]] = field(default_factory=list)
    remaining: list[Manifest] = field(default_factory=list)
    """Every object of the second render."""
    remaining_resources: list[dict[str, Any]] = field(default_factory=list)


def difference(before: Rendered, after: Rendered) -> Difference:
    old = {m.path: m for m in before.manifests}
    new = {m.path: m for m in after.manifests}
    result = Difference(
        removed=[old[p] for p in sorted(old.keys() - new.keys())],
        added=[new[p] for p in sorted(new.keys() - old.keys())],
        changed=[(old[p], new[p]) for p in sorted(old.keys() & new.keys()) if dump_yaml(old[p].obj) != dump_yaml(new[p].obj)],
        remaining=list(after.manifests),
        remaining_resources=list(after.inventory),
    )
    old_entries = {_key(e): e for e in before.inventory}
    new_entries = {_key(e): e for e in after.inventory}
    result.resources_removed = [old_entries[k] for k in sorted(old_entries.keys() - new_entries.keys())]
    result.resources_added = [new_entries[k] for k in sorted(new_entries.keys() - old_entries.keys())]
    result.resources_changed = [
        old_entries[k] for k in sorted(old_entries.keys() & new_entries.keys()) if _without_edges(old_entries[k]) != _without_edges(new_entries[k])
    ]
    return result


def _extended_quota_key(key: str) -> bool:
    """A quota line of an extended (GPU) resource: `requests.<domain>/<name>`."""
    return key.startswith("requests.") and "/" in key


def _key(entry: dict[str, Any]) -> str:
    return f"{entry['type']}::{entry['name']}"


def _without_edges(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "dependsOn"}


def _without_gpu_lines(obj: dict[str, Any]) -> dict[str, Any]:
    """A ResourceQuota without its GPU lines (`spec.hard["requests.<gpu resource>"]`, and the
    devices of each DRA DeviceClass)."""
    obj = copy.deepcopy(obj)
    hard = (obj.get("spec") or {}).get("hard") or {}
    for key in [k for k in hard if _extended_quota_key(k) or k.endswith(DEVICE_CLASS_QUOTA_SUFFIX)]:
        del hard[key]
    return obj


def _without_tolerations_whitelist(obj: dict[str, Any]) -> dict[str, Any]:
    """A tenant Namespace without the tolerations its pods may carry (they follow its domain's offerings)."""
    obj = copy.deepcopy(obj)
    ((obj.get("metadata") or {}).get("annotations") or {}).pop(TOLERATIONS_WHITELIST_ANNOTATION, None)
    return obj


def _without_flavors(obj: dict[str, Any], flavors: set[str]) -> dict[str, Any]:
    """A ClusterQueue without the resource groups made only of `flavors` (covered resources,
    flavors and quotas); every other group and field is kept as is."""

    def only_those(group: Any) -> bool:
        listed = group.get("flavors") if isinstance(group, dict) else None
        return bool(listed) and isinstance(listed, list) and all(isinstance(f, dict) and f.get("name") in flavors for f in listed)

    obj = copy.deepcopy(obj)
    spec = obj.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("resourceGroups"), list):
        spec["resourceGroups"] = [g for g in spec["resourceGroups"] if not only_those(g)]
    return obj


def _masked_offered_rule(rule: Any, tenant: str) -> dict[str, Any] | None:
    """`rule` with its list masked, if it is exactly what its builder (`OFFERED_RULES`) makes of
    that list for `tenant` and the pods it matches; None otherwise."""
    if not isinstance(rule, dict) or rule.get("name") not in OFFERED_RULES:
        return None
    build, index = OFFERED_RULES[rule["name"]]
    try:
        match, values = rule["match"], rule["validate"]["foreach"][0]["deny"]["conditions"]["any"][index]["value"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(values, list) or rule != build(tenant, match, values):
        return None
    return build(tenant, match, [MASKED])


def _without_offered_lists(obj: dict[str, Any], tenant: str) -> dict[str, Any]:
    """A tenant's admission ClusterPolicy with the lists that follow its offerings masked: the GPU
    resource names denied it (the rule goes altogether: there is none when it may be admitted every
    advertised one; it must match the tenant's pods, as its Pod Security rule does) and the placement
    tolerations allowed it. Every other rule and field is kept as is."""
    obj = copy.deepcopy(obj)
    spec = obj.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("rules"), list):
        return obj
    own = next((r.get("match") for r in spec["rules"] if isinstance(r, dict) and r.get("name") == POD_SECURITY_RULE), None)
    rules = []
    for rule in spec["rules"]:
        masked = _masked_offered_rule(rule, tenant)
        if masked is None:
            rules.append(rule)
        elif not (rule["name"] == GPU_RESOURCES_RULE and own is not None and rule["match"] == own):
            rules.append(masked)
    spec["rules"] = rules
    return obj


def _listener_tenant(listener: Any) -> Any:
    """The tenant whose namespaces a Gateway listener admits routes from, if one."""
    if not isinstance(listener, dict):
        return None
    return (((listener.get("allowedRoutes") or {}).get("namespaces") or {}).get("selector") or {}).get("matchLabels", {}).get(TENANT_LABEL)


def _owner(tenant: str | None) -> str:
    return f"tenant {tenant}" if tenant else "platform"


def _object_diff(before: Manifest, after: Manifest) -> list[str]:
    """What changes in an object, as a unified diff of its rendered file (indented under its line)."""
    lines = difflib.unified_diff(
        dump_yaml(before.obj).splitlines(), dump_yaml(after.obj).splitlines(), f"a/{before.path}", f"b/{after.path}", lineterm="", n=DIFF_CONTEXT_LINES
    )
    return [f"    {line}" for line in lines]


@dataclass
class TenantRemoval:
    tenant: str
    domain: str | None
    """The tenant's trust domain, as its Namespace says."""
    removal: Difference
    release: Difference
    notes: list[str] = field(default_factory=list)
    pools: tuple[str, ...] = ()
    """The fleet's pools: the trust domain's GPU flavors are `placement.offering_name(pool, domain)`."""

    def _of_domain(self, m: Manifest) -> bool:
        """A platform object of the tenant's trust domain only (its queue cohort, ...): the
        tenant's grant returns to it, and it goes with the domain's last tenant."""
        labels = (m.obj.get("metadata") or {}).get("labels") or {}
        return m.tenant is None and self.domain is not None and labels.get(TRUST_DOMAIN_LABEL) == self.domain

    def _other_domains(self, *objects: Manifest) -> list[str]:
        """The trust domains (and dedicated tenants) other than the removed tenant's that platform
        objects are labelled for: a node or queue flavor of another domain that re-planning changes
        moves capacity of another tenant."""
        ours = {self.domain, self.tenant, UNASSIGNED, None}
        labels = [(m.obj.get("metadata") or {}).get("labels") or {} for m in objects if not m.tenant]
        return sorted({str(value) for label in labels for value in (label.get(TRUST_DOMAIN_LABEL), label.get(DEDICATED_LABEL))} - {str(v) for v in ours})

    def _releases(self, *objects: Manifest) -> bool:
        """A platform object that follows the plan releasing the tenant's GPUs (and of no other domain)."""
        return not objects[0].tenant and not self._other_domains(*objects)
    def _serves_tenant(self, m: Manifest) -> bool:
        """A platform object that exists for this tenant only (`SERVES_TENANT_LABEL`): it goes with it."""
        labels = (m.obj.get("metadata") or {}).get("labels") or {}
        return m.tenant is None and labels.get(SERVES_TENANT_LABEL) == self.tenant

    def _goes_with_tenant(self, m: Manifest) -> bool:
        return self._of_domain(m) or self._serves_only_it(m)

    def _serves_only_it(self, m: Manifest) -> bool:
        return self._serves_tenant(m) or self._only_its_listeners(m) or self._its_worker_connection(m)

    def _only_its_listeners(self, m: Manifest) -> bool:
        """A shared Gateway every listener of which admits this tenant's routes alone: it goes
        with its last listener."""
        listeners = (m.obj.get("spec") or {}).get("listeners") or []
        return m.kind == "Gateway" and not m.tenant and bool(listeners) and all(_listener_tenant(l) == self.tenant for l in listeners)

    @property
    def _dispatched_to(self) -> set[str]:
        """The worker clusters the tenant's MultiKueueConfig dispatched to (on the manager)."""
        return {str(c) for m in self.removal.removed if m.kind == "MultiKueueConfig" and m.tenant == self.tenant for c in (m.obj.get("spec") or {}).get("clusters") or []}

    def _its_worker_connection(self, m: Manifest) -> bool:
        """The manager's connection (MultiKueueCluster, its kubeconfig's ExternalSecret) to a worker
        the tenant dispatched to, dropped with it: no other tenant dispatches there any more."""
        from ai_factory.components.multikueue import secret_name

        if m.tenant or m.layer != "multikueue":
            return False
        return (m.kind == "MultiKueueCluster" and m.name in self._dispatched_to) or (m.kind == "ExternalSecret" and m.name in {secret_name(w) for w in self._dispatched_to})

    def _sheds_its_listeners(self, before: Manifest, after: Manifest) -> bool:
        """A shared Gateway whose only change is losing the listeners that admit this tenant's
        routes alone (a Gateway holds its listeners; each tenant hostname is one of them)."""
        if before.kind != "Gateway" or after.kind != "Gateway" or before.tenant:
            return False

        def others(obj: dict[str, Any]) -> dict[str, Any]:
            spec = dict(obj.get("spec") or {})
            spec["listeners"] = [l for l in spec.get("listeners") or [] if _listener_tenant(l) != self.tenant]
            return {**obj, "spec": spec}

        return others(before.obj) == after.obj

    @property
    def _domain_flavors(self) -> set[str]:
        """The GPU flavors (offerings) the tenant's trust domain may have, one per pool."""
        if self.domain is None:
            return set()
        return {offering_name(pool, self.domain) for pool in self.pools} - {CPU_FLAVOR}

    def follows_domain(self, before: Manifest, after: Manifest) -> str | None:
        """What an object of another tenant of the same trust domain follows, if only what follows
        the domain's offerings (which re-planning changes) changes in it; None otherwise:
        - a ResourceQuota: its GPU lines (its ceilings, `ai_factory.factory.planning.quotas.gpu_ceiling`);
        - its Namespace: the tolerations its pods may carry;
        - a ClusterQueue: its resource groups made only of the domain's GPU flavors;
        - its admission ClusterPolicy: the GPU resource names denied it, the placement
          tolerations allowed it."""
        labels = (before.obj.get("metadata") or {}).get("labels") or {}
        if not before.tenant or before.tenant == self.tenant or self.domain is None or labels.get(TRUST_DOMAIN_LABEL) != self.domain:
            return None
        masks = {
            "ResourceQuota": ("GPU ceiling", _without_gpu_lines),
            "Namespace": ("allowed tolerations", _without_tolerations_whitelist),
            "ClusterQueue": ("GPU queue flavors", lambda obj: _without_flavors(obj, self._domain_flavors)),
            "ClusterPolicy": ("admitted GPU resources and tolerations", lambda obj: _without_offered_lists(obj, before.tenant)),
        }
        if before.kind != after.kind or before.kind not in masks:
            return None
        what, mask = masks[before.kind]
        return what if mask(before.obj) == mask(after.obj) else None

    @property
    def peers_following_domain(self) -> list[str]:
        """One line per object of a peer tenant that follows the domain's offerings, its diff under it."""
        return [
            line
            for before, after in self.release.changed
            if (what := self.follows_domain(before, after))
            for line in (f"  ~ changed {before.path} ({what} of tenant {before.tenant})", *_object_diff(before, after))
        ]

    @property
    def returned_to_domain(self) -> list[str]:
        removed = [f"  - deleted {m.path}" for m in self.removal.removed if self._of_domain(m)]
        return removed + [line for b, a in self.removal.changed if self._of_domain(b) for line in (f"  ~ changed {b.path}", *_object_diff(b, a))]

    @property
    def unexpected(self) -> list[str]:
        """Every change that is not the tenant's objects (and the platform objects serving it only)
        going, its grant returning to its trust domain, or the plan releasing its GPUs into platform
        objects; one line each (an object's
        diff follows its line). Must be empty."""
        t, removal, release = self.tenant, self.removal, self.release
        domain_origins = {m.origin for m in [*removal.removed, *(b for b, _ in removal.changed)] if self._goes_with_tenant(m)}
        domain_origins |= {b.origin for b, a in removal.changed if self._sheds_its_listeners(b, a)}
        lines = [f"removal deletes {m.path} ({_owner(m.tenant)})" for m in removal.removed if m.tenant != t and not self._goes_with_tenant(m)]
        lines += [f"removal keeps {m.path} (tenant {t})" for m in removal.remaining if m.tenant == t]
        lines += [f"removal keeps Pulumi resource {_key(e)} (tenant {t})" for e in removal.remaining_resources if e.get("tenant") == t]
        lines += [f"removal adds {m.path} ({_owner(m.tenant)})" for m in removal.added]
        for before, after in removal.changed:
            if before.tenant != t and not self._of_domain(before) and not self._sheds_its_listeners(before, after):  # the tenant's own: reported as kept
                lines += [f"removal changes {before.path} ({_owner(before.tenant)})", *_object_diff(before, after)]
        for verb, entries in (("deletes", removal.resources_removed), ("changes", removal.resources_changed)):
            lines += [
                f"removal {verb} Pulumi resource {_key(e)} ({_owner(e.get('tenant'))})"
                for e in entries
                if e.get("tenant") != t and _key(e) not in domain_origins
            ]
        lines += [f"removal adds Pulumi resource {_key(e)}" for e in removal.resources_added]
        lines += [f"re-planning deletes {m.path} (tenant {m.tenant})" for m in release.removed if m.tenant]
        lines += [f"re-planning adds {m.path} (tenant {m.tenant})" for m in release.added if m.tenant]
        for before, after in release.changed:
            if before.tenant and not self.follows_domain(before, after):
                lines += [f"re-planning changes {before.path} (tenant {before.tenant})", *_object_diff(before, after)]
        for verb, objects in (("deletes", release.removed), ("adds", release.added)):
            lines += [f"re-planning {verb} {m.path} (trust domain {', '.join(others)})" for m in objects if (others := self._other_domains(m))]
        for before, after in release.changed:
            if others := self._other_domains(before, after):
                lines += [f"re-planning changes {before.path} (trust domain {', '.join(others)})", *_object_diff(before, after)]
        for verb, entries in (("deletes", release.resources_removed), ("adds", release.resources_added), ("changes", release.resources_changed)):
            lines += [f"re-planning {verb} Pulumi resource {_key(e)} (tenant {e['tenant']})" for e in entries if e.get("tenant")]
        return lines

    def _changed_objects(self) -> Iterator[tuple[str, str, Manifest, Manifest | None]]:
        """(step, change, object, its new version when changed) for every object either step changes."""
        for step, difference in (("removal", self.removal), ("re-planning", self.release)):
            for change, objects in (("deleted", difference.removed), ("added", difference.added)):
                yield from ((step, change, m, None) for m in objects)
            yield from ((step, "changed", before, after) for before, after in difference.changed)

    def changes(self) -> list[dict[str, Any]]:
        """Every object the removal and the re-planning change, each with its unified diff."""
        return [
            {"step": step, "change": change, "path": m.path, "tenant": m.tenant, "layer": m.layer, "diff": [line[4:] for line in _object_diff(m, after)] if after else []}
            for step, change, m, after in self._changed_objects()
        ]

    def groups(self) -> list[dict[str, Any]]:
        """The changes counted per (tenant, layer): one summary line each (no diff is computed)."""
        counts: dict[tuple[str, str], dict[str, int]] = {}
        for _, change, m, _ in self._changed_objects():
            counts.setdefault((m.tenant or "", m.layer), {"deleted": 0, "added": 0, "changed": 0})[change] += 1
        return [{"tenant": t or None, "layer": layer, **n} for (t, layer), n in sorted(counts.items())]

    def to_json(self, env: str) -> str:
        return json.dumps(
            {
                "environment": env,
                "tenant": self.tenant,
                "trust_domain": self.domain,
                "groups": self.groups(),
                "changes": self.changes(),
                "unexpected": self.unexpected,
                "notes": self.notes,
            },
            indent=2,
            sort_keys=True,
        ) + "\n"

    def render(self, env: str) -> str:
        mine = [m for m in self.removal.removed if m.tenant == self.tenant]
        resources = [e for e in self.removal.resources_removed if e.get("tenant") == self.tenant]
        entries = {_key(e): e for e in resources}
        lines = [f"removing tenant {self.tenant!r} from {env}: {len(mine)} objects go ({len(resources)} Pulumi resources)"]
        for m in mine:
            entry = entries.get(m.origin) or {}
            marks = [word for word, on in (("protected", entry.get("protect")), ("kept in the cluster", entry.get("retainOnDelete"))) if on]
            lines.append(f"  - {m.path}  {m.ref}" + (f"  [{', '.join(marks)}]" if marks else ""))
        if any(e.get("protect") for e in resources):
            lines.append("  protected resources stop `pulumi up` until unprotected (`pulumi state unprotect`): off-boarding is deliberate")
        if any(e.get("retainOnDelete") for e in resources):
            lines.append("  resources kept in the cluster only leave the Pulumi state: delete the namespace once its volumes are backed up")
        serving = [f"  - deleted {m.path}" for m in self.removal.removed if self._serves_only_it(m)]
        if serving:
            lines.append(f"platform objects serving it only go too ({len(serving)}):")
            lines += serving
        returned = self.returned_to_domain
        if returned:
            count = sum(not line.startswith("    ") for line in returned)
            lines.append(f"its grant returns to its trust domain {self.domain} ({count} object(s) of that domain only):")
            lines += returned
        released = [
            *([f"  - deleted {m.path}"] for m in self.release.removed if self._releases(m)),
            *([f"  + added {m.path}"] for m in self.release.added if self._releases(m)),
            *([f"  ~ changed {b.path}", *_object_diff(b, a)] for b, a in self.release.changed if self._releases(b, a)),
        ]
        lines.append(f"re-planning without it releases its GPUs ({len(released)} platform object(s) change; `pulumi up` does both at once):")
        lines += [line for entry in released for line in entry] or ["  nothing"]
        peers = self.peers_following_domain
        if peers:
            count = sum(not line.startswith("    ") for line in peers)
            lines.append(f"its trust domain's offerings change, and with them {count} object(s) of its peer tenants that follow them:")
            lines += peers
        lines += [f"note: {n}" for n in self.notes]
        lines.append("changes by tenant and layer:")
        for g in self.groups():
            lines.append(f"  {g['tenant'] or 'platform'} / {g['layer']}: {g['deleted']} deleted, {g['added']} added, {g['changed']} changed")
        unexpected = self.unexpected
        if unexpected:
            lines.append(f"UNEXPECTED: {sum(not line.startswith(' ') for line in unexpected)} other change(s):")
            lines += [f"  {line}" for line in unexpected]
        else:
            lines.append("no other object changes: nothing shared with another trust domain, nothing of another tenant")
        return "\n".join(lines)


@dataclass
class FleetRemoval:
    """A tenant's removal from a multi-cluster environment: one `TenantRemoval` per cluster it is
    on (and per cluster whose view it changes), by cluster in the sites' order."""

    tenant: str
    stacks: dict[str, str]
    """Cluster -> its stack (`<env>-<cluster>`)."""
    removals: dict[str, TenantRemoval]
    unchanged: list[str]
    """Clusters whose configuration is the same without the tenant: nothing there changes."""

    @property
    def unexpected(self) -> list[str]:
        return [line if line.startswith(" ") else f"{cluster}: {line}" for cluster, r in self.removals.items() for line in r.unexpected]

    def render(self, env: str) -> str:
        lines = [f"removing tenant {self.tenant!r} from {env}: on cluster(s) {', '.join(self.removals) or 'none'}"]
        for cluster, removal in self.removals.items():
            lines.append(f"cluster {cluster} (stack {self.stacks[cluster]}):")
            lines += [f"  {line}" for line in removal.render(self.stacks[cluster]).splitlines()]
        if self.unchanged:
            lines.append(f"unchanged (the tenant is not on them, their configuration is the same without it): {', '.join(self.unchanged)}")
        unexpected = self.unexpected
        lines.append(
            f"UNEXPECTED: {sum(not l.startswith(' ') for l in unexpected)} other change(s) over the clusters (listed under each)"
            if unexpected
            else "no other object changes on any cluster"
        )
        return "\n".join(lines)

    def to_json(self, env: str) -> str:
        return json.dumps(
            {
                "environment": env,
                "tenant": self.tenant,
                "clusters": {c: json.loads(r.to_json(self.stacks[c])) for c, r in self.removals.items()},
                "unchanged": self.unchanged,
                "unexpected": self.unexpected,
            },
            indent=2,
            sort_keys=True,
        ) + "\n"


def without_tenant(env: str, tenant: str) -> TenantRemoval | FleetRemoval:
    """`tenant_removal` for an environment's stack file, planned from its recorded plan; for each
    cluster of a multi-cluster environment, from that cluster's stack and plan lock."""
    from ai_factory.factory.model.clusters import clusters
    from ai_factory.factory.rendering.bundle import cluster_stack

    path = stack_file(env)
    raw, secret_sections = read_stack_file(path)
    stack = stack_name(path)
    cfg = validate(environment_raw(raw, stack, project_dir()), source=str(path))
    names = [t.name for t in cfg.tenants]
    if tenant not in names:
        close = difflib.get_close_matches(tenant, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (tenants: {', '.join(names) or 'none'})"
        raise ConfigError([f"--without-tenant: no tenant {tenant!r} in {path.name}{hint}"], source=str(path))
    if not clusters(cfg):
        return _noted(tenant_removal(raw, secret_sections, tenant, stack, previous_plan(stack, path.resolve().parent)), env, stack, cfg, path)
    offboarded = _offboarded(raw, tenant)
    reduced = config_without_tenant(raw, tenant)
    stacks, removals, unchanged = {}, {}, []
    for placed in clusters(cfg):
        kubernetes = {**(raw.get("kubernetes") or {}), "cluster": placed.name}
        cluster_raw, own = {**raw, "kubernetes": kubernetes}, cluster_stack(stack, placed.name)
        view = validate(environment_raw(cluster_raw, own, project_dir()), source=str(path))
        without = validate(environment_raw({**reduced, "kubernetes": kubernetes}, own, project_dir(), offboarded), source=str(path))
        if view.model_dump() == without.model_dump():
            unchanged.append(placed.name)
            continue
        stacks[placed.name] = own
        removal = tenant_removal(cluster_raw, secret_sections, tenant, own, previous_plan(own, path.resolve().parent))
        removals[placed.name] = _noted(removal, env, own, view, path, placed.name)
    return FleetRemoval(tenant, stacks, removals, unchanged)


def _noted(result: TenantRemoval, env: str, stack: str, cfg, path, cluster: str | None = None) -> TenantRemoval:
    """`result` with what a plan lock missing or out of date means for it, and the command that
    locks it (that cluster's only, in a multi-cluster environment)."""
    recorded = previous_plan(stack, path.resolve().parent)
    lock = f"ai-factory plan {env} --lock" + (f" --cluster {cluster}" if cluster else "")
    if recorded is None:
        moved = ", which moves other tenants' GPUs (UNEXPECTED below)" if result.unexpected else ""
        result.notes.append(
            f"{stack} has no plan lock (plans/{stack}.json): `pulumi up` re-plans every tenant from scratch (the "
            f"re-planning above){moved}; lock the plan first (`{lock}`, then commit it) so that "
            "re-planning keeps every other tenant's GPUs where they are"
        )
    elif recorded.pools != plan_for(cfg, recorded).pools:  # the layout, not how it was reached
        result.notes.append(f"the plan lock of {stack} is not the current plan; lock it again first (`{lock}`)")
    return result


def _offboarded(raw: dict[str, Any], tenant: str) -> frozenset[str]:
    """`{tenant}` when it is a tenant of the self-service registry (not of the stack file): its
    removal is its registry file's."""
    return frozenset() if tenant in {t.get("name") for t in raw.get("tenants") or [] if isinstance(t, dict)} else frozenset({tenant})


TENANT_KEYED = (("tenancy", "pod_security_exceptions"), ("slinky", "clusters"), ("kubevirt", "tenants"))
"""Lists of `layers` whose entries name a tenant in `tenant`: they go with it."""


def config_without_tenant(raw: dict[str, Any], tenant: str) -> dict[str, Any]:
    """The config sections `raw` without `tenant` and the layers' entries naming it."""
    reduced = copy.deepcopy(raw)
    reduced["tenants"] = [t for t in raw["tenants"] if t.get("name") != tenant]
    for section, key in TENANT_KEYED:
        settings = (reduced.get("layers") or {}).get(section) or {}
        if isinstance(settings.get(key), list):
            settings[key] = [e for e in settings[key] if not (isinstance(e, dict) and e.get("tenant") == tenant)]
    return reduced


def tenant_removal(raw: dict[str, Any], secret_sections: set[str], tenant: str, stack: str, recorded: Plan | None = None) -> TenantRemoval:
    """Render the config sections `raw` as they are (planned from the plan lock `recorded`, as
    `pulumi up` does), without `tenant` with that plan unchanged, and without it re-planned as
    `pulumi up` would: from the lock, or from scratch when there is none (every tenant's GPUs may
    then move, and the report shows it). A tenant of the self-service registry is removed as
    offboarding does: its registry file goes, the stack file stays."""
    directory = project_dir()  # where the program reads the registry
    cfg = validate(environment_raw(raw, stack, directory))
    current = plan_for(cfg, recorded)
    offboarded = _offboarded(raw, tenant)
    reduced_raw = config_without_tenant(raw, tenant)
    reduced_cfg = validate(environment_raw(reduced_raw, stack, directory, offboarded), source=f"the configuration without tenant {tenant}")
    full = render_raw(raw, secret_sections, cfg, stack, plan=current)
    without = render_raw(reduced_raw, secret_sections, reduced_cfg, stack, plan=current, offboarded=offboarded)
    replanned = render_raw(reduced_raw, secret_sections, reduced_cfg, stack, plan=plan_for(reduced_cfg, recorded), offboarded=offboarded)
    domains = [(m.obj["metadata"].get("labels") or {}).get(TRUST_DOMAIN_LABEL) for m in full.manifests if m.kind == "Namespace" and m.tenant == tenant]
    domain = next((d for d in domains if d), None)
    pools = tuple(p.name for p in cfg.fleet.pools)
    return TenantRemoval(tenant, domain, difference(full, without), difference(without, replanned), pools=pools)
