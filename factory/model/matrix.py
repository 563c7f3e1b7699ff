"""The version-locked matrix (`matrix.yaml` beside this module): versions that pin together a
Kubernetes minor, NVIDIA drivers, the container toolkit, every chart of the catalog and the images
the library names, with the combinations tested.

An environment runs one matrix version (`matrix.version` of its config, default the newest).
`matrix_problems` lists every pin of the environment outside that version (and every pool whose
Kubernetes, driver and sharing mode were not tested together) that no recorded exception
(`matrix.exceptions`) names with its exact value; `ai-factory check` refuses such an environment.
`diff` lists what moves between two versions, each change marked ringable (it can go tenant by
tenant) or platform-wide (a CRD version, the CNI, the node software: every tenant at once).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Iterator

import yaml
from pydantic import BaseModel, Field, StringConstraints, ValidationError, model_validator

from ai_factory.factory.model.catalog import CHARTS, MANIFESTS
from ai_factory.factory.model.config import Chart, FactoryConfig, Model, Sharing

MATRIX_FILE = Path(__file__).with_name("matrix.yaml")

VersionName = Annotated[str, StringConstraints(pattern=r"^[0-9]{4}\.[0-9]{2}(\.[0-9]+)?$", max_length=16)]
"""A matrix version: `<year>.<month>`, with a patch number when a month has two (`2026.12.1`)."""

RINGED_CHARTS = frozenset({"vcluster"})
"""Charts released once per tenant (each tenant's vCluster): they move ring by ring. Every other
chart is one release for the whole cluster."""
CNI_CHARTS = frozenset({"cilium"})


class Tested(Model):
    """Combinations run together: every Kubernetes minor with every driver and sharing mode listed."""

    kubernetes: list[str] = Field(min_length=1)
    drivers: list[str] = Field(min_length=1)
    sharing: list[Sharing] = Field(min_length=1)


class MatrixVersion(Model):
    version: VersionName
    kubernetes: list[str] = Field(min_length=1)
    drivers: list[str] = Field(min_length=1)
    toolkit: str
    charts: dict[str, str]
    manifests: dict[str, str]
    """Release manifests of products without a chart (`catalog.MANIFESTS`), by version."""
    images: dict[str, str]
    tested: list[Tested] = Field(min_length=1)

    @model_validator(mode="after")
    def _complete(self) -> MatrixVersion:
        if set(self.charts) != set(CHARTS):
            missing, extra = sorted(set(CHARTS) - set(self.charts)), sorted(set(self.charts) - set(CHARTS))
            raise ValueError(f"charts must be those of the catalog (missing {missing}, unknown {extra})")
        if set(self.manifests) != set(MANIFESTS):
            missing, extra = sorted(set(MANIFESTS) - set(self.manifests)), sorted(set(self.manifests) - set(MANIFESTS))
            raise ValueError(f"manifests must be those of the catalog (missing {missing}, unknown {extra})")
        for combo in self.tested:
            if not (set(combo.kubernetes) <= set(self.kubernetes) and set(combo.drivers) <= set(self.drivers)):
                raise ValueError("a tested combination names a Kubernetes minor or driver the version does not pin")
        return self

    def tested_together(self, kubernetes: str, driver: str, sharing: str) -> bool:
        return any(kubernetes in t.kubernetes and driver in t.drivers and sharing in t.sharing for t in self.tested)


class Matrix(BaseModel):
    versions: list[MatrixVersion] = Field(min_length=1)

    @model_validator(mode="after")
    def _ordered(self) -> Matrix:
        keys = [_order(v.version) for v in self.versions]
        if keys != sorted(set(keys)):
            raise ValueError("versions must be unique and listed oldest first")
        return self

    @property
    def newest(self) -> MatrixVersion:
        return self.versions[-1]

    @property
    def names(self) -> list[str]:
        return [v.version for v in self.versions]

    def get(self, name: str) -> MatrixVersion | None:
        return next((v for v in self.versions if v.version == name), None)


def _order(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in name.split("."))


class MatrixFileError(Exception):
    """The matrix file itself is wrong: a defect of the library, reported with its problem."""


@functools.cache
def load_matrix(path: Path = MATRIX_FILE) -> Matrix:
    try:
        return Matrix.model_validate(yaml.safe_load(path.read_text()))
    except (OSError, yaml.YAMLError, ValidationError) as err:
        raise MatrixFileError(f"{path}: {err}") from None


# --------------------------------------------------------------------------- an environment's pins


@dataclass(frozen=True)
class Pin:
    path: str
    """Where the config sets it, as problems name paths: `layers.kueue.chart.version`."""
    kind: str
    """`kubernetes`, `driver`, `toolkit` or `chart`."""
    key: str
    """The chart's catalog key; the kind for the others."""
    value: str


def chart_fields(model: BaseModel, at: str) -> Iterator[tuple[str, Chart]]:
    """Every `Chart` held by `model` (recursively), with its path."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, Chart):
            yield f"{at}.{name}", value
        elif isinstance(value, BaseModel):
            yield from chart_fields(value, f"{at}.{name}")


@functools.cache
def chart_keys() -> dict[str, str]:
    """Config path of each chart field -> its catalog key, read off the defaults (each default is
    `Chart.pinned(<key>)`): the table cannot miss a chart a layer adds."""
    from ai_factory.factory.model.config import Layers

    return {path: chart._product for path, chart in chart_fields(Layers(), "layers")}


def env_pins(cfg: FactoryConfig) -> list[Pin]:
    pins = [Pin("kubernetes.version", "kubernetes", "kubernetes", cfg.kubernetes.version)]
    pins += [Pin(f"fleet.pools[{i}].driver.version", "driver", "driver", p.driver.version) for i, p in enumerate(cfg.fleet.pools)]
    if cfg.layers.gpu_operator.enabled:
        pins.append(Pin("layers.gpu_operator.toolkit_version", "toolkit", "toolkit", cfg.layers.gpu_operator.toolkit_version))
    keys = chart_keys()
    pins += [Pin(f"{path}.version", "chart", keys[path], chart.version) for path, chart in chart_fields(cfg.layers, "layers")]
    return pins


def expected(version: MatrixVersion, pin: Pin) -> list[str]:
    """The values `version` allows for `pin`."""
    return {
        "kubernetes": version.kubernetes,
        "driver": version.drivers,
        "toolkit": [version.toolkit],
        "chart": [version.charts.get(pin.key, "")],
    }[pin.kind]


def selected_version(cfg: FactoryConfig, matrix: Matrix) -> MatrixVersion | None:
    return matrix.get(cfg.matrix.version) if cfg.matrix.version else matrix.newest


def matrix_problems(cfg: FactoryConfig, matrix: Matrix | None = None, version: str | None = None) -> list[str]:
    """Every pin outside the matrix version the environment runs (`version` overrides the
    config's, as an upgrade checks its target), every untested pool combination, and every
    exception that covers nothing; one `path: message` each."""
    matrix = matrix or load_matrix()
    chosen = matrix.get(version) if version else selected_version(cfg, matrix)
    if chosen is None:
        name = version or cfg.matrix.version
        return [f"matrix.version: {name!r} is not a matrix version (versions: {', '.join(matrix.names)})"]
    excepted = {e.pin: e for e in cfg.matrix.exceptions}
    used: set[str] = set()
    problems = [
        f"matrix.exceptions[{i}].pin: {e.pin} has an exception already"
        for i, e in enumerate(cfg.matrix.exceptions)
        if any(other.pin == e.pin for other in cfg.matrix.exceptions[:i])
    ]

    def outside(path: str, value: str, message: str) -> None:
        exception = excepted.get(path)
        if exception is not None and exception.value == value:
            used.add(path)
        elif exception is not None:
            problems.append(f"{path}: {message}; the exception recorded for it names {exception.value!r}, not {value!r}")
        else:
            problems.append(f"{path}: {message}; pin a value of the matrix or record an exception in matrix.exceptions")

    for pin in env_pins(cfg):
        allowed = expected(chosen, pin)
        if pin.value not in allowed:
            what = f"chart {pin.key}" if pin.kind == "chart" else pin.kind
            outside(pin.path, pin.value, f"{pin.value} is outside matrix {chosen.version} ({what}: {', '.join(allowed)})")
    for i, pool in enumerate(cfg.fleet.pools):
        if cfg.kubernetes.version not in chosen.kubernetes or pool.driver.version not in chosen.drivers:
            continue  # the pin itself is outside (or excepted): a combination problem would repeat it
        if not chosen.tested_together(cfg.kubernetes.version, pool.driver.version, pool.sharing):
            outside(
                f"fleet.pools[{i}].sharing",
                pool.sharing,
                f"pool {pool.name!r}: Kubernetes {cfg.kubernetes.version}, driver {pool.driver.version} and {pool.sharing} sharing "
                f"were not tested together in matrix {chosen.version}",
            )
    for i, exception in enumerate(cfg.matrix.exceptions):
        if exception.pin not in used and not any(p.startswith(f"{exception.pin}: ") for p in problems):
            problems.append(f"matrix.exceptions[{i}].pin: {exception.pin} is within matrix {chosen.version} (or not a pin); remove the exception")
    return problems


# --------------------------------------------------------------------------- between versions


@dataclass(frozen=True)
class Change:
    kind: str
    key: str
    before: str
    after: str
    ringable: bool
    why: str

    def line(self) -> str:
        scope = "note" if self.kind == "tested" else "ringed" if self.ringable else "platform-wide"
        return f"  {self.kind:<10} {self.key:<24} {self.before or '-':>12} -> {self.after or '-':<12} {scope}: {self.why}"


def _listed(values: list[str]) -> str:
    return ", ".join(values)


def diff(old: MatrixVersion, new: MatrixVersion) -> list[Change]:
    """What moves from `old` to `new`, node software and Kubernetes first, then charts, images."""
    changes = []
    if old.kubernetes != new.kubernetes:
        changes.append(Change("kubernetes", "minors", _listed(old.kubernetes), _listed(new.kubernetes), False, "the control plane and every node"))
    if old.drivers != new.drivers:
        changes.append(Change("driver", "drivers", _listed(old.drivers), _listed(new.drivers), False, "node software, pool by pool, for every tenant on the pool"))
    if old.toolkit != new.toolkit:
        changes.append(Change("toolkit", "toolkit", old.toolkit, new.toolkit, False, "node software on every GPU node"))
    for key in sorted(set(old.charts) | set(new.charts)):
        before, after = old.charts.get(key, ""), new.charts.get(key, "")
        if before != after:
            changes.append(Change("chart", key, before, after, *_chart_scope(key)))
    for key in sorted(set(old.manifests) | set(new.manifests)):
        before, after = old.manifests.get(key, ""), new.manifests.get(key, "")
        if before != after:
            changes.append(Change("manifest", key, before, after, False, f"installs CRDs ({', '.join(MANIFESTS[key].crd_groups)}): one version for every tenant"))
    for key in sorted(set(old.images) | set(new.images)):
        before, after = old.images.get(key, ""), new.images.get(key, "")
        if before != after:
            changes.append(Change("image", key, before.rpartition(":")[2], after.rpartition(":")[2], True, after or before))
    if [t.model_dump() for t in old.tested] != [t.model_dump() for t in new.tested]:
        changes.append(Change("tested", "combinations", "", "", True, "the combinations tested changed (see `ai-factory matrix --version`)"))
    return changes


def _chart_scope(key: str) -> tuple[bool, str]:
    if key in RINGED_CHARTS:
        return True, "one release per tenant"
    if key in CNI_CHARTS:
        return False, "the CNI: every pod's network"
    if CHARTS[key].crd_groups:
        return False, f"installs CRDs ({', '.join(CHARTS[key].crd_groups)}): one version for every tenant"
    return False, "one release for the cluster"


def describe(version: MatrixVersion) -> str:
    """The matrix version as the `matrix` command prints it."""
    lines = [f"matrix {version.version}", f"  kubernetes   {_listed(version.kubernetes)}", f"  drivers      {_listed(version.drivers)}", f"  toolkit      {version.toolkit}", "  charts"]
    lines += [f"    {key:<24} {value}" for key, value in sorted(version.charts.items())]
    lines.append("  manifests")
    lines += [f"    {key:<24} {value}" for key, value in sorted(version.manifests.items())]
    lines.append("  images")
    lines += [f"    {key:<24} {value}" for key, value in sorted(version.images.items())]
    lines.append("  tested")
    lines += [f"    kubernetes {_listed(t.kubernetes)} x driver {_listed(t.drivers)} x sharing {_listed(t.sharing)}" for t in version.tested]
    return "\n".join(lines)


def describe_diff(old: MatrixVersion, new: MatrixVersion) -> str:
    changes = diff(old, new)
    lines = [f"matrix {old.version} -> {new.version}: {len(changes)} change(s)"]
    lines += [c.line() for c in changes]
    return "\n".join(lines)


def to_json(version: MatrixVersion) -> dict[str, Any]:
    return version.model_dump(mode="json")


def with_matrix_pins(cfg: FactoryConfig, matrix: Matrix | None = None) -> FactoryConfig:
    """`cfg` with the pins its matrix version sets wherever the config leaves them to the default:
    each chart a layer does not pin itself, and the toolkit. A config naming no matrix version
    keeps the library's pins (the newest version's)."""
    if cfg.matrix.version is None:
        return cfg
    chosen = (matrix or load_matrix()).get(cfg.matrix.version)
    if chosen is None:
        return cfg  # refused by `matrix_problems`
    keys = chart_keys()

    def repinned(model: BaseModel, at: str) -> BaseModel:
        update: dict[str, Any] = {}
        for name in type(model).model_fields:
            value = getattr(model, name)
            path = f"{at}.{name}"
            if isinstance(value, Chart) and name not in model.model_fields_set and path in keys:
                update[name] = value.model_copy(update={"version": chosen.charts[keys[path]]})
            elif isinstance(value, BaseModel) and not isinstance(value, Chart):
                inner = repinned(value, path)
                if inner is not value:
                    update[name] = inner
        if at == "layers.gpu_operator" and "toolkit_version" not in model.model_fields_set:
            update["toolkit_version"] = chosen.toolkit
        return model.model_copy(update=update) if update else model

    return cfg.model_copy(update={"layers": repinned(cfg.layers, "layers")})


def tenant_chart_version(cfg: FactoryConfig, tenant_ring: str, key: str, version: str) -> str:
    """The version of a ringed chart (`RINGED_CHARTS`) for a tenant of `tenant_ring`: during an
    upgrade, the `from` version's until its ring is done."""
    progress = cfg.upgrades.in_progress
    if progress is None or key not in RINGED_CHARTS or tenant_ring in progress.done:
        return version
    before = load_matrix().get(progress.from_version)
    return before.charts[key] if before is not None else version
