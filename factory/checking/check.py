"""Offline checks over a rendered environment.

Each check is a function `(Rendered, Oracles) -> Iterable[Finding]`: the checks every render gets
(`CHECKS`), plus those each layer present in the render contributes through its registry
declaration (`Layer.checks`). A finding names the check, the object and the tenants involved.

Checks of one object at a time (`PER_PART`: the schema, the Helm values, the pack's resource
policies) give, over a render, the union of what they give over its parts (`parts`: each
tenant's objects and resources, and each platform layer's). With a check cache their findings
are stored per part under a digest of the part's content, the oracles, the pack configuration
and the library, and only changed parts are checked again. Every other check reads across
tenants and layers (isolation, scheduling, ordering, the pack's stack policies); those marked
tenant-local (`findings.tenant_local`) find over the render what they find over each tenant's
view, and are cached per tenant (`views`); the others run over the whole render every time.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ai_factory.components.registry import checks_for, external_crds
from ai_factory.factory.checking import hardening, isolation, ordering, parallel, views
from ai_factory.factory.checking import policies as policy_check
from ai_factory.factory.checking.findings import Finding, is_tenant_local
from ai_factory.factory.checking.oracles import Oracles, is_core_api
from ai_factory.factory.heap import settled_heap
from ai_factory.factory.rendering.bundle import Manifest, Rendered, cached_stack
from ai_factory.factory.rendering.cache import digest, library_digest, write_entry
from ai_factory.factory.rendering.charts import releases_of
from ai_factory.factory.rendering.eviction import evict
from ai_factory.factory.rendering.harness import Graph


Check = Callable[[Rendered, Oracles], Iterable[Finding]]


def schema(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Core kinds against the Kubernetes schema of the target version (strict); custom resources,
    Flux objects included, against their CRD (the chart's, else upstream's). Without an oracle
    directory, custom resources of kinds no chart defines are left out (`unchecked_kinds`); so are
    those of a cluster prerequisite's group (`Layer.external_crds`, e.g. the cert-manager
    certificates KServe's chart renders) when the oracle directory has no CRD for them."""
    external = external_crds(rendered.layers())
    for m in rendered.manifests:
        if m.is_remote or _unchecked_kind(m.obj.get("apiVersion"), m.kind, oracles, external):  # a remote manifest is a URL, checked as a pin (bundle-order)
            continue
        for error in oracles.validate_object(m.obj, rendered.kubernetes_version):
            # The oracle's message names the object too; the finding names it once.
            yield Finding("schema", m.ref, error.removeprefix(f"{m.ref}: "), _tenants(m))


def helm_values(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Every HelmRelease installs a catalog chart at its pinned source, with values the chart knows
    (the chart package's values.yaml and schema when it is cached, else the oracle's)."""
    releases, unknown = releases_of(rendered)
    for m in unknown:
        yield Finding("helm-values", m.ref, "installs a chart that is not in the catalog (factory/catalog.py)", _tenants(m))
    for release in releases:
        m, pin = release.manifest, release.pin
        if not oracles.knows_values(pin.oracle_dir):
            continue  # reported by `unchecked_values`
        for error in oracles.validate_values(pin.oracle_dir, m.obj["spec"].get("values") or {}):
            yield Finding("helm-values", m.ref, error, _tenants(m))


def _unchecked_kind(api_version: Any, kind: str, oracles: Oracles, external: set[str]) -> bool:
    if not isinstance(api_version, str) or is_core_api(api_version) or oracles.knows_kind(api_version, kind):
        return False
    return oracles.root is None or api_version.rpartition("/")[0] in external


def unchecked_kinds(rendered: Rendered, oracles: Oracles) -> list[str]:
    """Custom kinds `schema` could not check: no oracle directory and no chart ships their CRD
    (each kind of each API version asked about once)."""
    kinds = {(api_version, m.kind) for m in rendered.manifests if isinstance(api_version := m.obj.get("apiVersion"), str)}
    return sorted(f"{api_version} {kind}" for api_version, kind in kinds if _unchecked_kind(api_version, kind, oracles, set()))


def unchecked_values(rendered: Rendered, oracles: Oracles) -> list[str]:
    """Releases `helm_values` could not check: neither the chart package nor the oracle has the values."""
    return sorted(r.manifest.ref for r in releases_of(rendered)[0] if not oracles.knows_values(r.pin.oracle_dir))


def rendered_files(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Every rendered file `load_rendered` could not read as Kubernetes objects, by file name."""
    for path, problem in rendered.unreadable:
        yield Finding("rendered-files", path, problem)


def _tenants(m: Manifest) -> tuple[str, ...]:
    return (m.tenant,) if m.tenant else ()


CHECKS: list[Check] = [
    rendered_files,
    schema,
    helm_values,
    *isolation.CHECKS,
    *hardening.CHECKS,
    policy_check.resource_policies,
    policy_check.stack_policies,
    policy_check.tenant_stack_policies,
    *ordering.CHECKS,
]
PER_PART: tuple[Check, ...] = (schema, helm_values, policy_check.resource_policies)
"""Checks whose findings over a render are the union of their findings over its `parts`
(tests/test_check_cache.py holds them to it)."""
GRAPH_ONLY: tuple[Check, ...] = (policy_check.stack_policies,)
"""Fleet-wide checks that read nothing of a render with its resource graph but the graph (and the
pack's configuration): their findings can be had as soon as the graph is complete, beside the
rest of the render (`graph_findings`; tests/test_check_cache.py holds them to it)."""
PACK: tuple[Check, ...] = (policy_check.resource_policies, policy_check.stack_policies, policy_check.tenant_stack_policies)
"""The pack's checks: each builds the render's resources as CrossGuard sees them, unless another
did in the same process (`policies.shared`)."""


def checks(rendered: Rendered) -> list[Check]:
    """What runs on this render: the common checks and those of the layers it holds objects of."""
    return [*CHECKS, *checks_for({m.layer for m in rendered.manifests})]


def graph_findings(graph: Graph) -> dict[str, list[Finding]]:
    """Each `GRAPH_ONLY` check's findings over a render of this resource graph, by check name."""
    alone = Rendered(None, "", [], [], graph)
    return {check.__name__: list(_guarded(check)(alone, Oracles(None))) for check in GRAPH_ONLY}


def run_checks(
    rendered: Rendered,
    oracles: Oracles,
    on_check: Callable[[], None] | None = None,
    cache: Path | None = None,
    oracle_state: str = "",
    known: Mapping[str, list[Finding]] | None = None,
    found: Callable[[], Mapping[str, list[Finding]] | None] | None = None,
) -> list[Finding]:
    """`on_check`: called once each check has run (progress). `cache`: the check cache directory,
    for the `PER_PART` checks and the tenant-local ones (`views`) of a render with its resource
    graph (a rendered directory's resources are matched to their inventory across the whole, so
    it is checked whole); `oracle_state`: a digest of what the oracles know (`oracle_digest`);
    `known`: entries of the check cache already read, by key (`charts.ReadAhead`); `found`: gives
    the `GRAPH_ONLY` checks' findings, found elsewhere (`charts.GraphChecks`), by check name: asked
    once the other checks have run; those it has none of (it gives None: their process failed)
    run here then.

    With a cache the parts, then the fleet-wide checks and the changed tenants' views, are work
    shared with forked workers (`_run_by_part`): after a one-tenant change the parts are mostly
    read back, and the fleet-wide checks are most of the time, which one process alone spent
    while the other core waited."""
    every = checks(rendered)
    elsewhere = [c for c in every if c in GRAPH_ONLY] if found is not None else []
    every = [c for c in every if c not in elsewhere]
    # One block for the tenant-local checks too: run over the whole render, they reuse its view and
    # the stack policies' resources.
    with settled_heap(), isolation.View.shared(), policy_check.shared(rendered):  # the per-part checks too: digesting and checking parts allocate as much
        if cache is not None and rendered.graph is not None:
            findings = _run_by_part(rendered, oracles, every, cache, oracle_state, on_check, known or {})
        else:
            findings = set()
            for check in every:
                findings.update(_guarded(check)(rendered, oracles))
                if on_check is not None:
                    on_check()
        if elsewhere:
            given = (found() if found is not None else None) or {}
            for check in elsewhere:
                findings.update(given[check.__name__] if check.__name__ in given else _guarded(check)(rendered, oracles))
                if on_check is not None:
                    on_check()
    return sorted(findings)


def _run_by_part(
    rendered: Rendered,
    oracles: Oracles,
    every: list[Check],
    cache: Path,
    oracle_state: str,
    on_check: Callable[[], None] | None,
    known: Mapping[str, list[Finding]],
) -> set[Finding]:
    """Two rounds of work shared with forked workers (`parallel.Shared`): the parts (`_part_findings`)
    and the platform's keys, which say which tenants' views must be checked again; then the
    fleet-wide checks and those views. In one round, the views waited for the rest and ran alone."""
    local = [c for c in every if is_tenant_local(c)]
    # What every part's key holds besides its content, digested once for all of them.
    context = digest(library_digest(), oracle_state, rendered.kubernetes_version, sorted(rendered.layers()), policy_check.pack_config(rendered))
    cut = parts(rendered)
    order = by_size(cut)
    workers = parallel.workers_for(len(cut))
    layers = [part for (kind, _), part in cut.items() if kind == "layer"]
    first: list[Callable[[], object]] = [
        functools.partial(views.platform_keys, rendered, layers, digest(context, [c.__name__ for c in local])),
        *(functools.partial(_part_findings, cut[name], oracles, cache, digest(context, [c.__name__ for c in PER_PART]), known) for name in order),
    ]
    (platform, serving), *found_by_part = parallel.Shared(first, _call, workers).finish()
    findings: set[Finding] = set()
    keys, own = [], {}
    for (kind, name), (key, found, content) in zip(order, found_by_part):
        keys.append(key)
        findings.update(found)
        if kind == "tenant":
            own[name] = content
    tenant_keys = views.tenant_keys(rendered, platform, serving, own)
    tenant_local = views.TenantLocal(rendered, cache, platform, tenant_keys, known)
    # The whole render checked again (a cold check, a platform change): the tenant-local checks run
    # with the fleet-wide ones, the pack's sharing the resources built for it.
    whole = tenant_local.checked is rendered
    groups = check_groups([*(c for c in every if c not in PER_PART and c not in local), *(local if whole else [])])
    view = tenant_local.checked if not whole else None
    second = [*((group, rendered) for group in groups), *((group, view) for group in (check_groups(local) if view is not None else []))]

    def done(i: int) -> None:  # progress: a group's checks have run; the parts' and views' are counted at the end
        for _ in groups[i] if on_check is not None and i < len(groups) else ():
            on_check()

    over_checked: set[Finding] = set()
    for (group, checked), found in zip(second, parallel.Shared(second, functools.partial(_run_group, oracles=oracles), workers).finish(on_done=done)):
        for check, of_check in zip(group, found):
            (over_checked if check in local else findings).update(of_check)
    findings.update(tenant_local.findings(over_checked))
    keys += [platform, *tenant_keys.values()]
    write_entry(run_index(cache, cached_stack(rendered.graph)), {"parts": keys})
    evict(cache)
    for _ in [*PER_PART, *([] if whole else local)] if on_check is not None else ():
        on_check()
    return findings


def run_index(cache: Path, stack: str) -> Path:
    """Where the check cache lists the parts the latest check of a stack (`cached_stack`) used:
    what eviction keeps, and what the next check reads ahead (`charts.ReadAhead`)."""
    return cache / "check-runs" / f"{stack}.json"


def check_groups(fleet: list[Check]) -> list[tuple[Check, ...]]:
    """Checks as units of shared work, the pack's first and together (they share the resources
    built for it, most of their time; they are the longest unit, taken first so no process is
    left running it alone), then each other check on its own."""
    pack = tuple(c for c in fleet if c in PACK)
    return [*([pack] if pack else []), *((c,) for c in fleet if c not in PACK)]


def _call(unit: Callable[[], object]) -> object:
    return unit()


def _run_group(unit: tuple[tuple[Check, ...], Rendered], oracles: Oracles) -> list[list[Finding]]:
    """Each check's findings of a group run over a render (the whole, or changed tenants' views)."""
    group, rendered = unit
    return [list(_guarded(check)(rendered, oracles)) for check in group]


def _guarded(check: Check) -> Check:
    # Every check guarded as the isolation checks are: an object malformed in a way no check
    # expected ends that check with a finding, never `factory check` with a traceback.
    return isolation.guarded(check)


def parts(rendered: Rendered) -> dict[tuple[str, str], Rendered]:
    """The render cut by tenant (its objects and resources, whatever their layer) and, for the
    platform, by layer; each part knows the whole render's layers (`Rendered.layers`)."""
    manifests: dict[tuple[str, str], list[Manifest]] = {}
    for m in rendered.manifests:
        manifests.setdefault(_part_of(m.tenant, m.layer), []).append(m)
    resources: dict[tuple[str, str], list] = {}
    for r in rendered.graph.resources if rendered.graph is not None else ():
        resources.setdefault(_part_of(r.tenant, r.layer), []).append(r)
    layers = rendered.layers()
    return {
        part: Rendered(
            rendered.config,
            rendered.kubernetes_version,
            manifests.get(part, []),
            [],
            Graph.subset(resources.get(part, [])),
            whole_layers=layers,
        )
        for part in sorted(set(manifests) | set(resources))
    }


def by_size(found: dict[tuple[str, str], Rendered]) -> list[tuple[str, str]]:
    """The parts' names, largest part first, then in part order: shared between processes, the
    last ones taken are the quickest (no process is left checking a big one alone)."""
    return sorted(found, key=lambda name: (-len(found[name].manifests) - len(found[name].graph.resources), name))


def _part_of(tenant: str | None, layer: str) -> tuple[str, str]:
    return ("tenant", tenant) if tenant else ("layer", layer)


def _part_findings(part: Rendered, oracles: Oracles, cache: Path, context: str, known: Mapping[str, list[Finding]]) -> tuple[str, list[Finding], str]:
    """The part's key in the check cache, its findings and the digest of its content."""
    content = views.content_digest(part.manifests, part.graph.resources)
    key = digest(context, content)
    found = views.read_findings(cache, key, known)
    if found is None:
        found = sorted({f for check in PER_PART for f in _guarded(check)(part, oracles)})
        views.write_findings(cache, key, found)
    return key, found, content
