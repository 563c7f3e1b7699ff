"""Checks of the GitOps bundle's structure: that an empty cluster can apply it in its order.

* `bundle-order`: every object is applied by one of the bundle's Flux Kustomizations, and every
  custom resource by a Kustomization that depends (transitively) on the one applying the
  release whose chart installs its CRD group (`catalog.ChartSource.crd_groups`), or the pinned
  release manifest that does (`catalog.ManifestSource.crd_groups`); a remote manifest is a pin;
* `bundle-patches`: what the program only patches (the `patches` stages) is never pruned, never
  deleted with its Kustomization, and merged into the live object rather than taking it over.

Both read only the rendered objects and Kustomizations, so they hold for a bundle edited by hand
(`factory check <dir>`) as for a fresh render.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ai_factory.components.registry import external_crds
from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.oracles import Oracles, is_core_api
from ai_factory.factory.rendering.bundle import PATCH_ANNOTATIONS, Manifest, Rendered, manifest_pin
from ai_factory.factory.rendering.charts import releases_of

FLUX_GROUP_SUFFIX = ".toolkit.fluxcd.io"
"""Flux's own kinds (HelmRelease, HelmRepository, ...): their CRDs come with Flux, before the bundle."""


def _tenants(m: Manifest) -> tuple[str, ...]:
    return (m.tenant,) if m.tenant else ()


class _Bundle:
    def __init__(self, rendered: Rendered):
        self.by_path = {k["spec"].get("path", "").removeprefix("./").rstrip("/"): k for k in rendered.kustomizations}
        self.needs = {k["metadata"]["name"]: {d["name"] for d in k["spec"].get("dependsOn") or []} for k in rendered.kustomizations}
        # By directory and by Kustomization: a fleet's objects share a few hundred directories and
        # a few Kustomizations' waits, looked up again for each of tens of thousands of objects.
        self._appliers: dict[tuple[str, ...], Mapping[str, Any] | None] = {}
        self._after: dict[str, set[str]] = {}

    def applier(self, m: Manifest) -> Mapping[str, Any] | None:
        """The Kustomization whose path holds the object's file (the deepest one)."""
        directory = tuple(m.path.split("/")[:-1])
        if directory not in self._appliers:
            self._appliers[directory] = next(
                (found for depth in range(len(directory), 0, -1) if (found := self.by_path.get("/".join(directory[:depth]))) is not None), None
            )
        return self._appliers[directory]

    def after(self, name: str) -> set[str]:
        """Every Kustomization `name` waits for, directly or not."""
        if name not in self._after:
            seen: set[str] = set()
            pending = list(self.needs.get(name, ()))
            while pending:
                current = pending.pop()
                if current not in seen:
                    seen.add(current)
                    pending.extend(self.needs.get(current, ()))
            self._after[name] = seen
        return self._after[name]


def _crd_owners(rendered: Rendered) -> dict[str, list[Manifest]]:
    owners: dict[str, list[Manifest]] = {}
    for release in releases_of(rendered)[0]:
        for group in release.pin.crd_groups:
            owners.setdefault(group, []).append(release.manifest)
    for m in rendered.manifests:
        for url in m.obj.get("resources") or [] if m.is_remote else ():
            for group in pin.crd_groups if (pin := manifest_pin(url)) else ():
                owners.setdefault(group, []).append(m)
    return owners


def bundle_order(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    bundle = _Bundle(rendered)
    owners = _crd_owners(rendered)
    prerequisites = external_crds({m.layer for m in rendered.manifests})
    installers: dict[int, str | None] = {}
    for m in rendered.manifests:
        if not m.stage:  # what a chart installs: its release's stage applies it
            continue
        applier = bundle.applier(m)
        if applier is None:
            yield Finding("bundle-order", m.ref, f"no Flux Kustomization of the bundle applies {m.path}", _tenants(m))
            continue
        if m.is_remote:
            for url in m.obj.get("resources") or []:
                if manifest_pin(url) is None:
                    yield Finding("bundle-order", m.ref, f"applies {url}, which is not a release manifest of the catalog (catalog.MANIFESTS)", _tenants(m))
            continue
        api_version = m.obj.get("apiVersion", "")
        group = api_version.rpartition("/")[0]
        if is_core_api(api_version) or group.endswith(FLUX_GROUP_SUFFIX):
            continue
        name = applier["metadata"]["name"]
        if not owners.get(group) and group not in prerequisites:
            yield Finding("bundle-order", m.ref, f"no release of the bundle installs the CRDs of {group} (catalog crd_groups)", _tenants(m))
        for release in owners.get(group, []):
            if id(release) not in installers:  # a release installs the CRDs of many objects
                installer = bundle.applier(release)
                installers[id(release)] = installer["metadata"]["name"] if installer else None
            installer_name = installers[id(release)]
            if installer_name is None or installer_name not in bundle.after(name):
                yield Finding(
                    "bundle-order",
                    m.ref,
                    f"applied by Kustomization {name}, which does not wait for {installer_name or 'no Kustomization'} "
                    f"applying {release.ref} (it installs the CRDs of {group})",
                    _tenants(m),
                )


def bundle_patches(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    bundle = _Bundle(rendered)
    for m in rendered.manifests:
        if not m.is_patch:
            continue
        annotations = (m.obj.get("metadata") or {}).get("annotations") or {}
        missing = sorted(f"{k}: {v}" for k, v in PATCH_ANNOTATIONS.items() if annotations.get(k) != v)
        if missing:
            yield Finding("bundle-patches", m.ref, f"a patch must carry {', '.join(missing)}", _tenants(m))
        applier = bundle.applier(m)
        spec = (applier or {}).get("spec") or {}
        if applier is not None and (spec.get("prune") is not False or spec.get("deletionPolicy") != "Orphan"):
            yield Finding(
                "bundle-patches",
                m.ref,
                f"Kustomization {applier['metadata']['name']} patches it, so it must set prune: false and deletionPolicy: Orphan",
                _tenants(m),
            )


CHECKS = [bundle_order, bundle_patches]
