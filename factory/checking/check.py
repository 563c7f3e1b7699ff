"""Offline checks over a rendered environment.

Each check is a function `(Rendered, Oracles) -> Iterable[Finding]`: the checks every render gets
(`CHECKS`), plus those each layer present in the render contributes through its registry
declaration (`Layer.checks`). A finding names the check, the object and the tenants involved.
"""

from __future__ import annotations

from typing import Callable, Iterable

from ai_factory.components.registry import checks_for, external_crds
from ai_factory.factory.checking import hardening, isolation, ordering
from ai_factory.factory.checking import policies as policy_check
from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.oracles import Oracles, is_core_api
from ai_factory.factory.rendering.bundle import Manifest, Rendered
from ai_factory.factory.rendering.charts import releases_of


Check = Callable[[Rendered, Oracles], Iterable[Finding]]


def schema(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Core kinds against the Kubernetes schema of the target version (strict); custom resources,
    Flux objects included, against their CRD (the chart's, else upstream's). Without an oracle
    directory, custom resources of kinds no chart defines are left out (`unchecked_kinds`); so are
    those of a cluster prerequisite's group (`Layer.external_crds`, e.g. the cert-manager
    certificates KServe's chart renders) when the oracle directory has no CRD for them."""
    external = external_crds({m.layer for m in rendered.manifests})
    for m in rendered.manifests:
        if m.is_remote or _unchecked_kind(m, oracles, external):  # a remote manifest is a URL, checked as a pin (bundle-order)
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


def _unchecked_kind(m: Manifest, oracles: Oracles, external: set[str]) -> bool:
    api_version = m.obj.get("apiVersion")
    if not isinstance(api_version, str) or is_core_api(api_version) or oracles.knows_kind(api_version, m.kind):
        return False
    return oracles.root is None or api_version.rpartition("/")[0] in external


def unchecked_kinds(rendered: Rendered, oracles: Oracles) -> list[str]:
    """Custom kinds `schema` could not check: no oracle directory and no chart ships their CRD."""
    return sorted({f"{m.obj.get('apiVersion')} {m.kind}" for m in rendered.manifests if _unchecked_kind(m, oracles, set())})


def unchecked_values(rendered: Rendered, oracles: Oracles) -> list[str]:
    """Releases `helm_values` could not check: neither the chart package nor the oracle has the values."""
    return sorted(r.manifest.ref for r in releases_of(rendered)[0] if not oracles.knows_values(r.pin.oracle_dir))


def rendered_files(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Every rendered file `load_rendered` could not read as Kubernetes objects, by file name."""
    for path, problem in rendered.unreadable:
        yield Finding("rendered-files", path, problem)


def _tenants(m: Manifest) -> tuple[str, ...]:
    return (m.tenant,) if m.tenant else ()


CHECKS: list[Check] = [rendered_files, schema, helm_values, *isolation.CHECKS, *hardening.CHECKS, policy_check.policies, *ordering.CHECKS]


def checks(rendered: Rendered) -> list[Check]:
    """What runs on this render: the common checks and those of the layers it holds objects of."""
    return [*CHECKS, *checks_for({m.layer for m in rendered.manifests})]


def run_checks(rendered: Rendered, oracles: Oracles, on_check: Callable[[], None] | None = None) -> list[Finding]:
    """`on_check`: called once each check has run (progress)."""
    findings: set[Finding] = set()
    for check in checks(rendered):
        # Every check guarded as the isolation checks are: an object malformed in a way no check
        # expected ends that check with a finding, never `factory check` with a traceback.
        findings.update(isolation.guarded(check)(rendered, oracles))
        if on_check is not None:
            on_check()
    return sorted(findings)
