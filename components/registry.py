"""The layer registry: one `Layer` declaration per layer, in the layer's own module (`LAYER = Layer(...)`).

A declaration names the layer's config section (`cfg.layers.<section>`), its chart pin (a key of
`ai_factory.factory.model.catalog.CHARTS`), what it requires (the layers it is installed after,
the sharing modes of the fleet that call for it), how its component's typed arguments are built
from the config and the plan, its per-tenant hook and the offline checks it contributes. The root
component (`ai_factory.factory.rendering.platform`), the tenant hooks (also rebuilt by tenant
stacks from the platform contract), `depends_on` ordering and `factory check` all read `layers()`.

Adding a layer is one new module in `components/` declaring `LAYER` (with its cross-section config
rules and privileged namespaces, if any), plus its config section (a field of `Layers` in
`ai_factory.factory.model.config`) and, for a new chart, its row in the version table
`ai_factory.factory.model.catalog.CHARTS`; nothing else is edited.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import pulumi

from ai_factory.components._common import FactoryComponent, TenantHook
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.planning.model import Plan

if TYPE_CHECKING:
    from ai_factory.factory.checking.findings import Finding
    from ai_factory.factory.checking.oracles import Oracles
    from ai_factory.factory.rendering.bundle import Rendered

    Check = Callable[[Rendered, Oracles], Iterable[Finding]]

ConfigCheck = Callable[[dict[str, Any]], list[str]]


class RegistryError(Exception):
    """A layer declaration that cannot be right (a programming error, not a user's)."""


@dataclass(frozen=True)
class Layer:
    name: str
    """The layer's name: the inventory's `layer`, the component's Pulumi name under the root
    component (`<platform>-<name>`), the key other layers name in `requires`."""
    component: type[FactoryComponent]
    args: Callable[[FactoryConfig, Plan], Any]
    """The component's typed arguments from the config and the plan (usually `XArgs.from_config`)."""
    section: str | None = None
    """Attribute of `cfg.layers` holding the layer's settings; with an `enabled` field, it switches
    the layer. None: the layer is always on (the fleet's node labels)."""
    chart: str | None = None
    """The pinned chart the layer installs (a key of `CHARTS`), None for a layer of plain objects."""
    requires: tuple[str, ...] = ()
    """Layers installed before this one (Pulumi `depends_on`)."""
    sharing: tuple[str, ...] = ()
    """Installed only when a pool of the fleet uses one of these sharing modes (empty: always)."""
    needed: Callable[[FactoryConfig], bool] | None = None
    """Installed only when this holds of the config (hardware the fleet has, e.g. an RDMA fabric;
    MultiKueue: a cluster of several); None: always."""
    tenant_hook: Callable[[FactoryConfig, Plan], TenantHook | None] | None = None
    """What the layer adds to every tenant's environment; None when it has nothing to add yet."""
    checks: tuple[Check, ...] = ()
    """Offline checks over a render; `factory check` runs them when the render holds the layer."""
    external_crds: tuple[str, ...] = ()
    """CRD groups the layer's objects need that no chart of the bundle installs (operators the
    cluster gets from OLM or its add-ons): a prerequisite of the cluster, named in the README."""
    config_checks: tuple[ConfigCheck, ...] = ()
    """Rules relating the layer's config section to the rest of the config, over the raw document
    (`ai_factory.factory.model.raw`), run by validation with every other rule: one problem per
    string, starting with its field path."""
    privileged_namespaces: Mapping[str, str] = field(default_factory=dict)
    """Namespaces whose pods must break Pod Security baseline (kernel modules, host paths, device
    nodes), each with why: the reviewed allow-list of the policy pack and of `factory check`."""

    def enabled(self, cfg: FactoryConfig) -> bool:
        settings = getattr(cfg.layers, self.section) if self.section else None
        if not getattr(settings, "enabled", True):
            return False
        if self.needed is not None and not self.needed(cfg):
            return False
        return not self.sharing or any(p.sharing in self.sharing for p in cfg.fleet.pools)

    def hook(self, cfg: FactoryConfig, plan: Plan) -> TenantHook | None:
        return self.tenant_hook(cfg, plan) if self.tenant_hook and self.enabled(cfg) else None

    def install(self, parent: FactoryComponent, args: Any, depends_on: Sequence[pulumi.Resource]) -> FactoryComponent:
        """The layer's component (from its `args(cfg, plan)`) as a child of the root component, named after it."""
        return self.component(parent.child_name(self.name), args, opts=parent.child(depends_on=list(depends_on)))


def _discover() -> tuple[Layer, ...]:
    """Every `LAYER` declared by a module of this package, dependencies first, then by name."""
    declared: dict[str, Layer] = {}
    # This package is imported before any of its modules, so its path is known here.
    for module in sorted(pkgutil.iter_modules(sys.modules[__package__].__path__), key=lambda m: m.name):
        if module.name.startswith("_") or module.name == "registry":
            continue
        layer = getattr(importlib.import_module(f"{__package__}.{module.name}"), "LAYER", None)
        if isinstance(layer, Layer):
            if layer.name in declared:
                raise RegistryError(f"two modules declare layer {layer.name!r}")
            declared[layer.name] = layer
    ordered: list[Layer] = []
    placed: set[str] = set()
    while len(ordered) < len(declared):
        ready = [l for n, l in sorted(declared.items()) if n not in placed and set(l.requires) <= placed]
        if not ready:
            missing = {n: sorted(set(l.requires) - placed) for n, l in declared.items() if n not in placed}
            raise RegistryError(f"layers with unknown or circular requirements: {missing}")
        ordered.append(ready[0])
        placed.add(ready[0].name)
    return tuple(ordered)


@functools.cache
def layers() -> tuple[Layer, ...]:
    """Every declared layer, in install order. Discovered on first use, not at import: discovery
    imports every layer module, and each of them imports this one."""
    return _discover()


def layer(name: str) -> Layer:
    found = next((l for l in layers() if l.name == name), None)
    if found is None:
        raise KeyError(f"no layer {name!r}; layers: {', '.join(l.name for l in layers())}")
    return found


def enabled_layers(cfg: FactoryConfig) -> tuple[Layer, ...]:
    return tuple(l for l in layers() if l.enabled(cfg))


def tenant_hooks(cfg: FactoryConfig, plan: Plan) -> list[TenantHook]:
    """Every enabled layer's per-tenant hook, in registry order. Plain data from the config and the
    plan: a tenant stack run on its own (`stacks/tenants.py`) rebuilds the same list from the
    platform contract."""
    return [hook for l in layers() if (hook := l.hook(cfg, plan)) is not None]


def external_crds(layer_names: Iterable[str]) -> set[str]:
    """The CRD groups the named layers expect the cluster to have already."""
    present = set(layer_names)
    return {group for l in layers() if l.name in present for group in l.external_crds}


def privileged_namespaces() -> dict[str, str]:
    """Every layer's privileged namespaces with why, whether or not the layer is enabled (the pack
    reviews a stack without knowing its config)."""
    return {namespace: why for l in layers() for namespace, why in sorted(l.privileged_namespaces.items())}


def checks_for(layer_names: Iterable[str]) -> list[Check]:
    """The checks contributed by the named layers (those present in a render), in registry order."""
    present = set(layer_names)
    return [check for l in layers() if l.name in present for check in l.checks]
