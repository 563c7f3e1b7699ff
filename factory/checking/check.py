"""Offline checks over a rendered environment.

Each check is a function `(Rendered, Oracles) -> Iterable[Finding]`: the checks every render gets
(`CHECKS`), plus those each layer present in the render contributes through its registry
declaration (`Layer.checks`). A finding names the check, the object and the tenants involved.
"""

from __future__ import annotations

from typing import Callable, Iterable

from ai_factory.components.registry import checks_for
from ai_factory.factory.checking import hardening, isolation
from ai_factory.factory.checking import policies as policy_check
from ai_factory.factory.model.catalog import CHARTS, ChartSource
from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.rendering.bundle import Manifest, Rendered


Check = Callable[[Rendered, Oracles], Iterable[Finding]]


def schema(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Core kinds against the Kubernetes schema of the target version (strict); custom resources,
    Flux objects included, against their upstream CRD."""
    for m in rendered.manifests:
        for error in oracles.validate_object(m.obj, rendered.kubernetes_version):
            # The oracle's message names the object too; the finding names it once.
            yield Finding("schema", m.ref, error.removeprefix(f"{m.ref}: "), _tenants(m))


def helm_values(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Every HelmRelease installs a catalog chart at its pinned source, with values the chart knows."""
    sources = {m.name: m.obj for m in rendered.manifests if m.kind in ("HelmRepository", "OCIRepository")}
    for m in rendered.manifests:
        if m.kind != "HelmRelease":
            continue
        pin = chart_of(m, sources)
        if pin is None:
            yield Finding("helm-values", m.ref, "installs a chart that is not in the catalog (factory/catalog.py)", _tenants(m))
            continue
        for error in oracles.validate_values(pin.oracle_dir, m.obj["spec"].get("values") or {}):
            yield Finding("helm-values", m.ref, error, _tenants(m))


def rendered_files(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """Every rendered file `load_rendered` could not read as Kubernetes objects, by file name."""
    for path, problem in rendered.unreadable:
        yield Finding("rendered-files", path, problem)


def chart_of(release: Manifest, sources: dict[str, dict]) -> ChartSource | None:
    spec = release.obj.get("spec") or {}
    if "chartRef" in spec:
        url = ((sources.get(spec["chartRef"].get("name")) or {}).get("spec") or {}).get("url", "")
        return next((c for c in CHARTS.values() if c.is_oci and c.oci_url == url), None)
    chart_spec = ((spec.get("chart") or {}).get("spec")) or {}
    url = ((sources.get((chart_spec.get("sourceRef") or {}).get("name")) or {}).get("spec") or {}).get("url", "")
    return next(
        (c for c in CHARTS.values() if c.name == chart_spec.get("chart") and c.repository.rstrip("/") == url.rstrip("/")),
        None,
    )


def _tenants(m: Manifest) -> tuple[str, ...]:
    return (m.tenant,) if m.tenant else ()


CHECKS: list[Check] = [rendered_files, schema, helm_values, *isolation.CHECKS, *hardening.CHECKS, policy_check.policies]


def checks(rendered: Rendered) -> list[Check]:
    """What runs on this render: the common checks and those of the layers it holds objects of."""
    return [*CHECKS, *checks_for({m.layer for m in rendered.manifests})]


def run_checks(rendered: Rendered, oracles: Oracles) -> list[Finding]:
    # Every check guarded as the isolation checks are: an object malformed in a way no check
    # expected ends that check with a finding, never `factory check` with a traceback.
    return sorted({f for check in checks(rendered) for f in isolation.guarded(check)(rendered, oracles)})
