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

The capacity plan is stored as well (`plans/`), under a digest of what the planner reads of the
config (`plan_inputs`), the previous plan and the library: a change the planner does not read (a
tenant's quota) plans nothing again.

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
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePath
from typing import Any, NamedTuple

import msgspec
from pydantic import BaseModel

from ai_factory.factory.heap import no_cycle_collection
from ai_factory.factory.model.secrets import SecretValue
from ai_factory.factory.planning.model import Plan
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

    `memo`: models, dataclasses and frozensets already seen (by identity, alive as long as the
    memo), each standing for the digest of its own form, so the data every tenant shares (the fleet's
    offerings, the identity settings) is serialised once per render, not once per tenant."""
    kind = type(value)
    if kind in PLAIN:
        return value
    form_of, memoized = _FORMS.get(kind) or _form_of(kind)
    if memo is None or not memoized:
        return form_of(value, memo)
    hit = memo.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]
    form = ["#", _sha(form_of(value, memo))]
    memo[id(value)] = (value, form)
    return form


PLAIN = frozenset({str, int, bool, type(None)})
"""Types (exactly these, not subclasses) that are their own form."""
TEXT_VALUED = (datetime.date, datetime.time, datetime.timedelta, decimal.Decimal, PurePath, ipaddress._BaseAddress, ipaddress._BaseNetwork)
"""Values (of config fields) that their text and type say exactly."""

_FORMS: dict[type, tuple[Callable[[Any, Any], Any], bool]] = {}
"""Each type's form builder and whether its values are memoized, found once per type (the keys
of a 1,000-tenant render walk about 200,000 values, most of a few dozen types)."""


def _form_of(kind: type) -> tuple[Callable[[Any, Any], Any], bool]:
    # The builtin containers first (most of the data), by exact type: a subclass takes the long way.
    if kind is list or kind is tuple:
        form_of = _sequence
    elif kind is dict:
        form_of = _mapping
    elif kind is float:
        form_of = _float
    elif issubclass(kind, SecretValue):
        form_of = _secret
    elif issubclass(kind, BaseModel):
        form_of = functools.partial(_typed_fields, kind.__qualname__, tuple(kind.model_fields))
    elif _is_dataclass(kind):
        form_of = functools.partial(_typed_fields, kind.__qualname__, tuple(f.name for f in dataclasses.fields(kind)))
    elif issubclass(kind, enum.Enum):
        form_of = _enum
    elif issubclass(kind, Mapping):
        form_of = _mapping
    elif issubclass(kind, (set, frozenset)):
        form_of = _set
    elif issubclass(kind, (list, tuple)):
        form_of = _sequence
    elif issubclass(kind, float):
        form_of = _float
    elif issubclass(kind, str):
        form_of = _text
    elif issubclass(kind, int):
        form_of = _integer
    elif issubclass(kind, TEXT_VALUED):
        form_of = _text_valued
    else:
        form_of = _refused
    found = _FORMS[kind] = (form_of, issubclass(kind, (BaseModel, frozenset)) or _is_dataclass(kind))
    return found


def _is_dataclass(kind: type) -> bool:
    return hasattr(kind, "__dataclass_fields__") and not issubclass(kind, type)


def _sequence(value: Any, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    return [canonical(v, memo) for v in value]


def _mapping(value: Mapping, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    if all(type(k) is str for k in value):  # most mappings: ordered by their keys alone, each told apart
        return ["map", [[k, canonical(value[k], memo)] for k in sorted(value)]]
    return ["map", sorted(([canonical(k, memo), canonical(v, memo)] for k, v in value.items()), key=_sort_key)]


def _float(value: float, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    value = float(value)
    return value if math.isfinite(value) else ["float", repr(value)]  # JSON has no NaN nor infinity


def _secret(value: SecretValue, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    return ["secret"]


def _typed_fields(qualname: str, names: tuple[str, ...], value: Any, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    return [qualname, {name: canonical(getattr(value, name), memo) for name in names}]


def _enum(value: enum.Enum, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    return canonical(value.value, memo)


def _set(value: Any, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    return ["set", sorted((canonical(v, memo) for v in value), key=_sort_key)]


def _text(value: str, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    return str(value)


def _integer(value: int, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    return int(value)


def _text_valued(value: Any, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    return [type(value).__qualname__, str(value)]


def _refused(value: Any, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    raise TypeError(f"cannot key a cached render on a {type(value).__name__}")


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
        self._plan_key: str | None = None
        self._planned: Plan | None = None

    @property
    def seen(self) -> bool:
        """Whether this stack was rendered into the cache before by this library: a later render
        builds few units. After a library change it builds every one, as a first render does (in
        one process, a 1,000-tenant render took 53 s and 1.9 GiB against 40 s and 1.1 GiB)."""
        return bool(self.last_keys())

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
        built = not self._found(unit, key)
        self.units[unit] = Unit(key, root_name, tuple(after), built=built)
        return built

    def _found(self, unit: str, key: str) -> bool:
        cached = self._load(key)
        if cached is not None:
            self._read[unit] = cached
        return cached is not None

    def _path(self, key: str, kind: str = "units") -> Path:
        return self.directory / kind / key[:2] / f"{key}.json"

    def plan(self, inputs: Any, planner: Callable[[], Plan]) -> Plan:
        """The capacity plan `planner` makes from `inputs` (what it reads: `plan_inputs` and the
        previous plan), read back when this library planned from the same inputs before: at 1,000
        tenants planning was 0.2 s of a one-tenant re-render, re-planning after a plan lock 0.8 s.
        `store` stores one planned this time; a plan `planner` refuses is never stored."""
        key = self._plan_key = self.key("plan", inputs)
        try:
            entry = _PLAN_ENTRY.decode(self._path(key, "plans").read_bytes())
        except (OSError, msgspec.DecodeError):  # absent, not JSON, or not a plan's shape
            entry = None
        if entry is not None and entry.key == key and entry.format == FORMAT:
            return entry.plan
        planned = self._planned = planner()
        return planned

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

    def last_keys(self) -> list[str]:
        """The entry keys of the units of this stack's last render with this library (none when
        there was none, or with another library, whose entries no unit's key names)."""
        index = read_entry(self._index())
        units = index.get("units") if isinstance(index, dict) and index.get("library") == library_digest() else None
        return [key for key in units.values() if isinstance(key, str)] if isinstance(units, dict) else []

    def prefetch(self, keys: Iterable[str]) -> None:
        """Read these entries (`last_keys`) at once, with the collector held off (read one by one
        as the program asks for them, each read let it walk the growing heap again: at 1,000
        tenants a tenth of a one-tenant re-render)."""
        with no_cycle_collection(settle=True):
            for key in keys:
                if (entry := self._read_entry(key)) is not None:
                    self._prefetched[key] = entry

    def probing(self) -> ProbingUnits:
        """A cache for the program run in a process forked beside this one's `prefetch`: it counts
        a unit as cached when its entry exists, and this process reads it (`take`)."""
        return ProbingUnits(self.directory, self.stack)

    def take(self, probe: Probe) -> bool:
        """What a run with a `probing` cache found, as if this cache had run it: False, and nothing
        taken, when an entry it counted as cached cannot be read here (the program runs again)."""
        cached = [name for name, unit in probe.units.items() if not unit.built]
        read = {name: entry for name in cached if (entry := self._load(probe.units[name].key)) is not None}
        if len(read) < len(cached):
            return False
        self.units, self._read, self._scopes, self._plan_key, self._planned = probe.units, read, probe.scopes, probe.plan_key, probe.planned
        return True

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
        if self._planned is not None:
            write_entry(self._path(self._plan_key, "plans"), {"format": FORMAT, "key": self._plan_key, "plan": self._planned})
        units = {unit: u.key for unit, u in sorted(self.units.items())}
        write_entry(self._index(), {"format": FORMAT, "library": library_digest(), "units": units, "plan": self._plan_key})


class Probe(NamedTuple):
    """What a run with a probing cache found (`UnitCache.take`): the units it considered, the
    scopes of the layers it built, its plan's key and the plan it made (None when read back)."""

    units: dict[str, Unit]
    scopes: dict[str, Mapping[str, tuple[str, ...]]]
    plan_key: str | None
    planned: Plan | None


class ProbingUnits(UnitCache):
    """`UnitCache.probing`: an entry that exists counts as cached, unread."""

    def _found(self, unit: str, key: str) -> bool:
        return self._path(key).is_file()

    def probe(self) -> Probe:
        return Probe(self.units, self._scopes, self._plan_key, self._planned)


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


class _PlanEntry(msgspec.Struct):
    """A plan's entry as `store` writes it."""

    format: int
    key: str
    plan: Plan


_PLAN_ENTRY = msgspec.json.Decoder(_PlanEntry)


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
