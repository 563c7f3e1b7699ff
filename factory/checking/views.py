"""Tenant views of a render, and the check cache of the tenant-local fleet-wide checks.

A tenant's view is what of the render concerns it: its own objects and resources, the platform's
made for it (`Rendered.scopes`: a tenant's query proxy, its trust domain's queue), the platform's
made for no tenant in particular, and every namespace (whose namespace an object is in is part of
what it is: a tenant's pods in another's namespace). A finding is attributed to the tenants of the
object or resource it names (`owners`), else to the tenants it names; to none, it is the platform's.

A check marked `findings.tenant_local` finds over the whole render what it finds over the views:
each finding attributed to a tenant in that tenant's view, each of the platform's in every view
alike (tests/test_check_views.py holds every marked check to it). So its findings are kept per
tenant, under a digest of the tenant's view and the check context, plus the platform's under a
digest of the unscoped platform; after a change only the views of the tenants whose key moved
are checked again, as one render, and the others' findings are read back (`TenantLocal`). A change to the
unscoped platform or to a namespace moves every key: the whole render is checked again, as when
most tenants changed. Either way the findings are the whole render's. Views are of a render with
its resource graph (a rendered directory is checked whole).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec

from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.rendering.bundle import Manifest, Rendered
from ai_factory.factory.rendering.cache import read_entry, write_entry
from ai_factory.factory.rendering.harness import Graph, Resource

NAMESPACE = "kubernetes:core/v1:Namespace"
"""Every view holds every namespace: where an object is, whose namespace that is, is part of what it is."""


def owners(rendered: Rendered) -> dict[str, frozenset[str]]:
    """The tenants of each object (`Manifest.ref`) and resource (`type::name`) a finding may name:
    a tenant's own, a platform one made for some tenants; absent when it is for no tenant in particular."""
    found: dict[str, frozenset[str]] = {}

    def add(ref: str, tenants: frozenset[str]) -> None:
        found[ref] = found.get(ref, frozenset()) | tenants

    for m in rendered.manifests:
        if (tenants := _scope(rendered, m.tenant, m.origin)) is not None:
            add(m.ref, tenants)
    for r in rendered.graph.resources:
        if (tenants := _scope(rendered, r.tenant, r.key)) is not None:
            add(r.key, tenants)
    return found


def _scope(rendered: Rendered, tenant: str | None, key: str) -> frozenset[str] | None:
    if tenant:
        return frozenset((tenant,))
    served = rendered.scopes.get(key)
    return frozenset(served) if served is not None else None


def attributed(finding: Finding, owned: Mapping[str, frozenset[str]], tenants: frozenset[str] | set[str]) -> frozenset[str]:
    """The tenants among `tenants` (those with a view) a finding is attributed to: those of the
    object or resource it names, else those it names; none: the platform's."""
    return (owned.get(finding.ref) or frozenset(finding.tenants)) & tenants


def tenants_of(rendered: Rendered) -> frozenset[str]:
    """The tenants with a view: those with objects or resources, and those the platform made some for."""
    resources = rendered.graph.resources
    return frozenset(
        {m.tenant for m in rendered.manifests if m.tenant} | {t for r in resources if (t := r.tenant)} | {t for served in rendered.scopes.values() for t in served}
    )


def view(rendered: Rendered, tenants: frozenset[str] | set[str]) -> Rendered:
    """The render as these tenants see it (one render holding all their views; none: the platform
    made for no tenant in particular), in the render's order. Without the config: a tenant-local
    check reads the objects only."""

    def seen(tenant: str | None, key: str) -> bool:  # `_scope`, without a set made for each object
        if tenant:
            return tenant in tenants
        served = rendered.scopes.get(key)
        return served is None or not tenants.isdisjoint(served)

    resources = [r for r in rendered.graph.resources if r.type == NAMESPACE or seen(r.tenant, r.key)]
    return Rendered(
        None,
        rendered.kubernetes_version,
        [m for m in rendered.manifests if m.kind == "Namespace" or seen(m.tenant, m.origin)],
        [e for e in rendered.inventory if seen(e.get("tenant"), f"{e.get('type')}::{e.get('name')}")],
        Graph.subset(resources),
        whole_layers=rendered.layers(),
        scopes=rendered.scopes,
    )


def content_digest(manifests: Iterable[Manifest], resources: Iterable[Resource]) -> str:
    """A digest of objects and resources as a check reads them."""
    content = [
        [[m.obj, m.layer, m.tenant, m.origin, m.stage] for m in manifests],
        [[r.type, r.name, r.urn, r.inputs, r.parent_urn, r.protect, r.retain_on_delete, r.custom, r.tenant, r.layer] for r in resources],
    ]
    return hashlib.sha256(msgspec.json.encode(content)).hexdigest()


def platform_keys(rendered: Rendered, platform_parts: Iterable[Rendered], context: str) -> tuple[str, dict[str, list[str]]]:
    """The platform's key (the context and the unscoped platform, every namespace), and by tenant
    the digests of what the platform made for it (`tenant_keys`): the layers' parts only, known
    before the tenants' parts are digested."""
    unscoped: tuple[list[Manifest], list[Resource]] = ([], [])
    scoped: dict[str, tuple[list[Manifest], list[Resource]]] = {}
    for part in platform_parts:
        for m in part.manifests:
            (scoped.setdefault(m.origin, ([], [])) if m.origin in rendered.scopes else unscoped)[0].append(m)
        for r in part.graph.resources:
            (scoped.setdefault(r.key, ([], [])) if r.key in rendered.scopes else unscoped)[1].append(r)
    namespaces = content_digest(rendered.of_kind("Namespace"), [r for r in rendered.graph.resources if r.type == NAMESPACE])
    platform = _sha(context, content_digest(*unscoped), namespaces, "platform")
    serving: dict[str, list[str]] = {}
    for key, (manifests, resources) in scoped.items():
        made = _sha(key, content_digest(manifests, resources))
        for tenant in rendered.scopes[key]:
            serving.setdefault(tenant, []).append(made)
    return platform, serving


def tenant_keys(rendered: Rendered, platform: str, serving: Mapping[str, list[str]], tenant_digests: Mapping[str, str]) -> dict[str, str]:
    """Each tenant's key: the platform's, its own part's digest (`tenant_digests`) and the
    platform made for it (`platform_keys`). `tenant_digests` holds every tenant with objects or
    resources (`check.parts`): with the tenants the platform made some for, those are the tenants
    with a view (`tenants_of`, not walked again)."""
    tenants = {*tenant_digests, *(t for served in rendered.scopes.values() for t in served)}
    return {t: _sha(platform, tenant_digests.get(t, ""), *serving.get(t, ())) for t in tenants}


def _sha(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


class TenantLocal:
    """The tenant-local checks' findings over a render through the check cache: each tenant's read
    back under its key (`tenant_keys`), the platform's under the platform's. What must be checked
    again is `checked`: the changed tenants' views as one render, the whole render when the
    platform changed or most tenants did, None when nothing did; `findings` takes what the checks
    found over it."""

    def __init__(self, rendered: Rendered, cache: Path, platform_key: str, keys: Mapping[str, str], known: Mapping[str, list[Finding]] | None = None):
        """`known`: entries of the check cache already read, by key."""
        self.cache, self.platform_key, self.keys = cache, platform_key, keys
        self.platform = read_findings(cache, platform_key, known)
        self.cached = {t: found for t, key in keys.items() if (found := read_findings(cache, key, known)) is not None}
        changed = frozenset(keys) - frozenset(self.cached)
        self.checked: Rendered | None
        if self.platform is None or 2 * len(changed) > len(keys):
            self.checked, self.changed = rendered, frozenset(keys)
        elif changed:
            self.checked, self.changed = view(rendered, changed), changed
        else:
            self.checked, self.changed = None, frozenset()

    def findings(self, found: Iterable[Finding]) -> set[Finding]:
        """Every tenant-local finding over the render, `found` being the checks' over `checked`:
        those of the changed tenants, and the platform's when it was not cached, are stored."""
        if self.checked is None:
            return {f for found in (self.platform or [], *self.cached.values()) for f in found}
        owned = owners(self.checked)
        by_tenant: dict[str, list[Finding]] = {t: [] for t in self.changed}
        ours: list[Finding] = []
        for f in found:
            to = attributed(f, owned, self.keys.keys())
            if not to:
                ours.append(f)
            for t in to & self.changed:
                by_tenant[t].append(f)
        if self.platform is None:
            write_findings(self.cache, self.platform_key, ours)
        for t in self.changed:
            write_findings(self.cache, self.keys[t], by_tenant[t])
        # The platform's findings are those of every view: a view's are the whole's.
        return {*ours, *(f for t in self.changed for f in by_tenant[t]), *(f for t, found in self.cached.items() if t not in self.changed for f in found)}


def _path(cache: Path, key: str) -> Path:
    return cache / "checks" / key[:2] / f"{key}.json"


def read_findings(cache: Path, key: str, known: Mapping[str, list[Finding]] | None = None) -> list[Finding] | None:
    """The findings the check cache holds under `key`, None when it holds none (or unreadable ones);
    `known`: entries already read, by key."""
    if known is not None and key in known:
        return known[key]
    entry = read_entry(_path(cache, key))
    try:
        if entry["key"] == key:
            return [Finding(f["check"], f["ref"], f["message"], tuple(f["tenants"])) for f in entry["findings"]]
    except (KeyError, TypeError):
        pass  # absent or unreadable: checked again
    return None


def write_findings(cache: Path, key: str, found: Iterable[Finding]) -> None:
    write_entry(_path(cache, key), {"key": key, "findings": [{"check": f.check, "ref": f.ref, "message": f.message, "tenants": list(f.tenants)} for f in sorted(found)]})
