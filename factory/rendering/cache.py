"""The render cache: each unit of the program (a layer's component, a tenant's stack) stored with
the resources it registered and the objects the bundle made of them, under a digest of
everything those resources are built from.

A unit's resources are a function of its typed arguments (a layer's from the config and plan, a
tenant's `TenantStackArgs`: its configuration, its share of the plan, the per-tenant data of every
layer hook narrowed to it), the units it is ordered after, the names it runs under (project,
stack, root component) and the library's code. The key is a digest of exactly these, so an
unchanged unit is read back instead of being registered again and only what changed runs
through the SDK. The library's code is its installed source, hashed file by file, with the
versions of the Python and Pulumi packages it runs on: any code change invalidates every unit.

What a cached unit cannot know in advance is the URNs its root component depends on (the SDK
expands a `depends_on` on a component into every custom resource under it): those are recomputed
from the merged graph (`expand`), for built and cached units alike. A tenant stack depends on its
layers' resources less those a layer made for other tenants only: each layer unit records which
of its resources are for which tenants (`FactoryComponent.tenant_scopes`), as the SDK path's
`FactoryComponent.ordered_before` reads them.

Entries are JSON (never pickle: a cache directory someone else wrote must not run code), written
atomically, one file per unit key.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import functools
import hashlib
import importlib
import importlib.metadata
import ipaddress
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePath
from typing import Any

import msgspec
from pydantic import BaseModel

from ai_factory.factory.heap import no_cycle_collection
from ai_factory.factory.model.secrets import SecretValue
from ai_factory.factory.rendering.harness import Resource

CACHE_DIR = ".factory-cache"
"""Default cache directory, under the project directory (ignored by git)."""
CACHE_ENV = "FACTORY_CACHE_DIR"
FORMAT = 4
"""Bumped when an entry changes shape, so an old entry is never read."""
PACKAGES = ("ai_factory.factory", "ai_factory.components", "ai_factory.stacks", "ai_factory.policies")
RUNTIME_DISTRIBUTIONS = ("pulumi", "pulumi-kubernetes", "pulumi-command", "pulumi-keycloak", "pulumi-vault", "pydantic", "PyYAML")


def canonical(value: Any, memo: dict[int, tuple[Any, Any]] | None = None) -> Any:
    """`value` as JSON data that is equal exactly when the values are: dataclasses and models by
    type and fields, mappings by sorted key, sets sorted. A secret counts by its placeholder's
    absence: rendered objects never hold it (the harness redacts every secret).

    `memo`: models, dataclasses and tuples already seen (by identity, alive as long as the memo),
    each standing for the digest of its own form, so the data every tenant shares (the fleet's
    offerings, the identity settings) is serialised once per render, not once per tenant."""
    kind = type(value)
    if kind in PLAIN:
        return value
    if memo is None or not isinstance(value, (BaseModel, tuple, frozenset)) and not _is_dataclass(value):
        return _canonical(value, memo)
    hit = memo.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]
    form = ["#", _sha(_canonical(value, memo))]
    memo[id(value)] = (value, form)
    return form


PLAIN = frozenset({str, int, bool, type(None)})
"""Types (exactly these, not subclasses) that are their own form."""
TEXT_VALUED = (datetime.date, datetime.time, datetime.timedelta, decimal.Decimal, PurePath, ipaddress._BaseAddress, ipaddress._BaseNetwork)
"""Values (of config fields) that their text and type say exactly."""


def _is_dataclass(value: Any) -> bool:
    return hasattr(type(value), "__dataclass_fields__") and not isinstance(value, type)


@functools.cache
def _field_names(kind: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(kind))


def _canonical(value: Any, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    # The builtin containers first (most of the data), by exact type: a subclass takes the long way.
    kind = type(value)
    if kind is list or kind is tuple:
        return [canonical(v, memo) for v in value]
    if kind is dict:
        return _mapping(value, memo)
    if kind is float:
        return value if math.isfinite(value) else ["float", repr(value)]  # JSON has no NaN nor infinity
    if isinstance(value, SecretValue):
        return ["secret"]
    if isinstance(value, BaseModel):
        return [type(value).__qualname__, {name: canonical(getattr(value, name), memo) for name in type(value).model_fields}]
    if _is_dataclass(value):
        return [type(value).__qualname__, {name: canonical(getattr(value, name), memo) for name in _field_names(type(value))}]
    if isinstance(value, enum.Enum):
        return canonical(value.value, memo)
    if isinstance(value, Mapping):
        return _mapping(value, memo)
    if isinstance(value, (set, frozenset)):
        return ["set", sorted((canonical(v, memo) for v in value), key=_sort_key)]
    if isinstance(value, (list, tuple)):
        return [canonical(v, memo) for v in value]
    if isinstance(value, float):
        return _canonical(float(value), memo)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, TEXT_VALUED):
        return [type(value).__qualname__, str(value)]
    raise TypeError(f"cannot key a cached render on a {type(value).__name__}")


def _mapping(value: Mapping, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    return ["map", sorted(([canonical(k, memo), canonical(v, memo)] for k, v in value.items()), key=_sort_key)]


def _sort_key(value: Any) -> bytes:
    return msgspec.json.encode(value, order="sorted")


def _sha(form: Any) -> str:
    return hashlib.sha256(msgspec.json.encode(form, order="sorted")).hexdigest()


def digest(*parts: Any, memo: dict[int, tuple[Any, Any]] | None = None) -> str:
    return _sha([canonical(p, memo) for p in parts])


@functools.cache
def library_digest() -> str:
    """The installed library's source (every file of its packages, by relative path and content),
    its version and the versions of what it renders with."""
    sha = hashlib.sha256()
    for package in PACKAGES:
        root = Path(importlib.import_module(package).__path__[0])
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"):
            sha.update(f"{package}/{path.relative_to(root)}\0".encode())
            sha.update(path.read_bytes())
            sha.update(b"\0")
    versions = {name: _version(name) for name in ("ai-factory", *RUNTIME_DISTRIBUTIONS)}
    sha.update(json.dumps({"python": sys.version, "versions": versions, "format": FORMAT}, sort_keys=True).encode())
    return sha.hexdigest()


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def write_record(directory: Path, out: Path) -> Path:
    """Where `Rendered.write` keeps what it wrote into `out` (`bundle.WriteRecord`), one per
    output directory."""
    return directory / "writes" / f"{hashlib.sha256(str(out.resolve()).encode()).hexdigest()}.json"


def default_cache_dir() -> Path:
    """$FACTORY_CACHE_DIR, else `.factory-cache` in the project directory (the current one)."""
    return Path(os.environ.get(CACHE_ENV) or CACHE_DIR)


@dataclasses.dataclass
class Unit:
    """One unit the program considered: its key, its root component's Pulumi name, the units it is
    ordered after, and whether this run built it."""

    key: str
    root_name: str
    after: tuple[str, ...]
    built: bool


class UnitCache:
    """What the program asks (`build`) and records for each unit of one render; then `complete`
    merges the cached units' resources into what the run registered and stores the new ones."""

    def __init__(self, directory: Path, stack: str):
        """`stack`: `<project>.<stack>`, whose last render's units the cache lists (`seen`)."""
        self.directory = directory
        self.stack = stack
        self.units: dict[str, Unit] = {}
        self._read: dict[str, _Entry] = {}
        self._scopes: dict[str, Mapping[str, tuple[str, ...]]] = {}
        self._built: dict[str, list[Resource]] = {}
        self._memo: dict[int, tuple[Any, Any]] = {}
        self._prefetched: dict[str, _Entry] = {}

    @property
    def seen(self) -> bool:
        """Whether this stack was rendered into the cache before (a later render builds few units)."""
        return self._index().is_file()

    def _index(self) -> Path:
        return self.directory / "stacks" / f"{self.stack}.json"

    def adopt(self, units: Mapping[str, Unit]) -> None:
        """Units another process considered (a render worker's share), read back as this one would."""
        for name, unit in units.items():
            self.units[name] = unit
            if not unit.built and (cached := self._load(unit.key)) is not None:
                self._read[name] = cached

    def key(self, *parts: Any) -> str:
        return digest(library_digest(), *parts, memo=self._memo)

    def build(self, unit: str, key: str, root_name: str, after: Iterable[str]) -> bool:
        """Whether the program must build this unit: its entry is missing or unreadable."""
        cached = self._load(key)
        if cached is not None:
            self._read[unit] = cached
        self.units[unit] = Unit(key, root_name, tuple(after), built=cached is None)
        return cached is None

    def _path(self, key: str) -> Path:
        return self.directory / "units" / key[:2] / f"{key}.json"

    def serves(self, unit: str, scopes: Mapping[str, tuple[str, ...]]) -> None:
        """What a layer unit built this time made for some tenants only (`tenant_scopes`)."""
        self._scopes[unit] = scopes

    def scopes(self) -> dict[str, tuple[str, ...]]:
        """What every layer unit of the render, built or cached, made for some tenants only, by resource key."""
        found = {key: tenants for cached in self._read.values() for key, tenants in cached.scopes.items()}
        for scopes in self._scopes.values():
            found.update(scopes)
        return found

    def _load(self, key: str) -> _Entry | None:
        found = self._prefetched.pop(key, None)
        return found if found is not None else self._read_entry(key)

    def prefetch(self) -> None:
        """Read the entries of the units of this stack's last render with this library at once,
        with the collector held off (read one by one as the program asks for them, each read let
        it walk the growing heap again: at 1,000 tenants a tenth of a one-tenant re-render)."""
        index = read_entry(self._index())
        units = index.get("units") if isinstance(index, dict) and index.get("library") == library_digest() else None
        if not isinstance(units, dict):
            return
        with no_cycle_collection(settle=True):
            for key in units.values():
                if isinstance(key, str) and (entry := self._read_entry(key)) is not None:
                    self._prefetched[key] = entry

    def _read_entry(self, key: str) -> _Entry | None:
        try:
            entry = _decode_entry(self._path(key).read_bytes())
        except (OSError, msgspec.DecodeError):  # absent, not JSON, or not an entry's shape
            return None
        if entry.key != key or entry.format != FORMAT:
            return None
        return entry

    def complete(self, registered: list[Resource]) -> list[Resource]:
        """Every resource of the render: those registered plus the cached units', each unit root's
        dependencies recomputed over the whole."""
        self._prefetched = {}  # what this render did not use (units whose key changed)
        resources = [*registered, *(r for cached in self._read.values() for r in cached.resources)]
        children: dict[str, list[Resource]] = {}
        for r in resources:
            children.setdefault(r.parent_urn, []).append(r)
        components = {r.name: r for r in resources if not r.custom}
        roots = {unit: components.get(u.root_name) for unit, u in self.units.items()}
        parts: dict[str, tuple[list[Resource], list[str], dict[str, list[str]]]] = {}
        for unit, u in self.units.items():
            root = roots[unit]
            if root is None:
                continue
            tenant, found = root.tenant, set()
            for a in (a for a in u.after if roots.get(a) is not None):
                if a not in parts:
                    cached, whole = self._read.get(a), expand(roots[a], children)
                    parts[a] = (whole, *_partition(whole, cached.scopes if cached is not None else self._scopes.get(a, {})))
                whole, shared, own = parts[a]
                if tenant is None:  # a layer after a layer: after all of it
                    found.update(r.urn for r in whole)
                else:
                    found.update(shared, own.get(tenant, ()))
            root.dependency_urns = sorted(found)
        self._built = {unit: _unit_resources(roots[unit], children) for unit, u in self.units.items() if u.built and roots[unit] is not None}
        return resources

    def built_keys(self) -> set[str]:
        """The keys of the resources of the units built this time (after `complete`): what `store` stores."""
        return {r.key for resources in self._built.values() for r in resources}

    def objects(self) -> dict[str, list[tuple[dict[str, Any], str]]]:
        """The finished objects of the cached units' resources (as the bundle labelled them) with
        their file texts, by resource key."""
        return {key: found for cached in self._read.values() for key, found in cached.objects.items()}

    def store(self, objects: Mapping[str, list[tuple[dict[str, Any], str]]]) -> None:
        """Store the units built this time, with their resources' finished objects and file texts
        (`objects`, by resource key), and the stack's list of units."""
        for unit, resources in self._built.items():
            key = self.units[unit].key
            own = {r.key: objects[r.key] for r in resources if r.key in objects}
            scopes = dict(self._scopes.get(unit, {}))
            write_entry(self._path(key), {"format": FORMAT, "key": key, "resources": _fields(resources), "objects": own, "scopes": scopes})
        units = {unit: u.key for unit, u in sorted(self.units.items())}
        write_entry(self._index(), {"format": FORMAT, "library": library_digest(), "units": units})


class _Entry(msgspec.Struct):
    """A unit's entry as `store` writes it."""

    format: int
    key: str
    resources: list[Resource]
    objects: dict[str, list[tuple[dict[str, Any], str]]]
    """Each resource's objects as the bundle finished them (pruned, labelled) and their file
    texts, by resource key: a cached resource's objects are not built again."""
    scopes: dict[str, tuple[str, ...]]
    """The tenants each resource a layer made for some tenants only is for, by resource key."""


_ENTRY = msgspec.json.Decoder(_Entry)
"""Decodes straight into resources, checking every field's type (an entry of another shape is
unreadable: its unit is built again)."""


def _decode_entry(data: bytes) -> _Entry:
    with no_cycle_collection():
        return _ENTRY.decode(data)


def write_entry(path: Path, entry: Any) -> None:
    """A cache entry as JSON, keys in their order (inputs read back as they were registered),
    atomically: a render interrupted, or two at once, never leave half an entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("wb", dir=path.parent, delete=False, suffix=".tmp") as out:
        out.write(msgspec.json.encode(entry))
    os.replace(out.name, path)


def read_entry(path: Path) -> Any:
    """A cache entry, None when it is absent or not JSON."""
    try:
        return msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return None


def _fields(resources: list[Resource]) -> list[dict[str, Any]]:
    """A resource's recorded fields (its links are rebuilt from URNs)."""
    return [{f.name: getattr(r, f.name) for f in dataclasses.fields(Resource) if f.name not in ("parent", "dependencies")} for r in resources]


def expand(component: Resource, children: Mapping[str, list[Resource]]) -> list[Resource]:
    """What a `depends_on` on `component` stands for, as the SDK expands it: every custom or
    remote resource under it, reached through local components only."""
    found, pending = [], list(children.get(component.urn, ()))
    while pending:
        r = pending.pop()
        if r.custom or r.remote:
            found.append(r)
        else:
            pending.extend(children.get(r.urn, ()))
    return found


def _partition(resources: Iterable[Resource], scopes: Mapping[str, Iterable[str]]) -> tuple[list[str], dict[str, list[str]]]:
    """The URNs of a layer's resources every tenant stack depends on, and by tenant those made for
    some tenants only (`FactoryComponent.ordered_before` on a built component)."""
    shared: list[str] = []
    own: dict[str, list[str]] = {}
    for r in resources:
        if r.key in scopes:
            for tenant in scopes[r.key]:
                own.setdefault(tenant, []).append(r.urn)
        else:
            shared.append(r.urn)
    return shared, own


def _unit_resources(root: Resource, children: Mapping[str, list[Resource]]) -> list[Resource]:
    found, pending = [root], list(children.get(root.urn, ()))
    while pending:
        r = pending.pop()
        found.append(r)
        pending.extend(children.get(r.urn, ()))
    return sorted(found, key=lambda r: r.urn)
