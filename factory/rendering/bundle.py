"""Offline render: run the platform program under mocks and turn what it registers into files.

Output layout (stable; the same config gives byte-identical files):

    <out>/flux/<kustomization>.yaml                              one Flux Kustomization per stage
    <out>/manifests/<stage>/<layer>/<namespace or _cluster>/<kind>-<name>.yaml   one object per file
    <out>/**/kustomization.yaml                                  in every directory of flux/ and manifests/
    <out>/inventory.json                                         every Pulumi resource, and where it went

The objects are split into stages that an empty cluster can apply in order (`Staging`):
`sources` (namespaces, chart sources and what releases read), `crds` (releases whose charts install
CRDs), `controllers` (the other releases), `resources` (custom resources of the platform), then
one Kustomization per tenant (`tenants/<layer>`), and per layer the objects the program only
patches (`patches/<layer>`). A Flux Kustomization per stage applies its directory after the
stages it depends on are ready; what depends on what comes from the program's dependency graph
and from which chart installs which CRD group (`catalog.ChartSource.crd_groups`), not from lists.

Every Helm release becomes a Flux `HelmRelease` plus its source (`HelmRepository`, or
`OCIRepository` for OCI charts) in the release's namespace. A pinned release manifest Pulumi
applies from its URL (`kubernetes:yaml/v2:ConfigFile`, `catalog.MANIFESTS`) becomes a kustomize
directory of its own, `<stage>/<layer>/_remote/<name>/kustomization.yaml`, whose one resource is
that URL (kustomize-controller fetches it when it builds the stage; the render never does), its
version and digest annotated; it installs its product's CRDs like a chart release. Secret values never reach the files:
the harness has already replaced them by `[secret]`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import pickle
import re
import stat
import subprocess
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Mapping

import msgspec
import yaml

from ai_factory.components.registry import layers
from ai_factory.factory.checking import parallel
from ai_factory.factory.heap import ending_process, no_cycle_collection, settled_heap
from ai_factory.factory.model.bounded_yaml import LOADER
from ai_factory.factory.model.catalog import MANIFESTS, ManifestSource, crd_groups
from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.rendering.cache import Probe, ProbingUnits, Unit, UnitCache, library_digest, write_entry
from ai_factory.factory.rendering.harness import DuplicateResourceError, Graph, RecordingMocks, RecordingMonitor, Resource, run_program
from ai_factory.factory.model.tenancy import TENANT_LABEL
from ai_factory.factory.planning.from_config import plan_for, plan_inputs, previous_plan
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.model.loading import StackEnvironment, environment_raw, read_environment, stack_name, stack_project, validate

FLUX_INTERVAL = "1h"
FLUX_RETRY_INTERVAL = "2m"
FLUX_TIMEOUT = "15m"
"""How long a stage may take to apply and become healthy before Flux retries it."""
HELM_RELEASE_TYPES = ("kubernetes:helm.sh/v3:Release", "kubernetes:helm.sh/v4:Chart")
NON_OBJECT_TYPES = ("pulumi:providers:", "kubernetes:yaml/", "kubernetes:helm.sh/")
FLUX_SOURCE_KINDS = ("HelmRepository", "OCIRepository")
CONFIG_FILE_TYPE = "kubernetes:yaml/v2:ConfigFile"
KUSTOMIZE_API = "kustomize.config.k8s.io/v1beta1"
REMOTE_DIR = "_remote"
PIN_VERSION_ANNOTATION = "ai-factory.io/pinned-version"
PIN_DIGEST_ANNOTATION = "ai-factory.io/pinned-digest"

STAGES = ("sources", "crds", "controllers", "resources", "tenants")
"""Stages in the order an empty cluster needs them; every tenant is a stage of its own."""
PATCHES = "patches"
SHARED_STAGES = STAGES[:-1]
"""Stages holding every layer's objects in one Flux Kustomization."""

BUNDLE_NAMESPACE = "flux-system"
BUNDLE_SOURCE = {"kind": "OCIRepository", "name": "ai-factory"}
"""The Flux source holding the rendered directory (see the README): Kustomization paths are
relative to its root."""
KUSTOMIZATION_PREFIX = "ai-factory"
MANAGED_BY = "ai-factory"
"""`app.kubernetes.io/managed-by`: the tool whose output the object is, as Helm marks what it
renders; true whichever applies it (Flux, Argo CD, kubectl, or the Pulumi program)."""
NOT_IN_BUNDLE = "configured by the Pulumi program, not in the bundle"
KUSTOMIZE_FILE = "kustomization.yaml"

KEEP_ANNOTATIONS = {
    # Never deleted when it leaves the bundle or its Kustomization goes: what Pulumi retains on
    # delete (a tenant's namespace and vCluster) and what a patch only touches.
    "kustomize.toolkit.fluxcd.io/prune": "disabled",
    "argocd.argoproj.io/sync-options": "Prune=false,Delete=false",
}
PATCH_ANNOTATIONS = {
    **KEEP_ANNOTATIONS,
    # A patch sets some fields of an object someone else owns (the kubelet's Node, the namespace's
    # default ServiceAccount): keep the fields other managers set (server-side apply merges;
    # Flux's default would drop fields kubectl set).
    "kustomize.toolkit.fluxcd.io/ssa": "Merge",
}


@dataclass
class Manifest:
    obj: dict[str, Any]
    layer: str
    tenant: str | None
    origin: str
    """The Pulumi resource the object comes from (`type::name`)."""
    stage: str = ""
    """Where the bundle applies it (`STAGES`, or `PATCHES`); set by `Staging`."""
    text: str | None = None
    """Its file's text, when read back from the render cache with its resource (else dumped from `obj`)."""

    def yaml(self) -> str:
        return self.text if self.text is not None else dump_yaml(self.obj)

    @property
    def kind(self) -> str:
        return self.obj.get("kind", "")

    @property
    def name(self) -> str:
        return (self.obj.get("metadata") or {}).get("name", "")

    @property
    def namespace(self) -> str | None:
        return (self.obj.get("metadata") or {}).get("namespace")

    @property
    def is_remote(self) -> bool:
        """A pinned release manifest, referenced by URL (a kustomization of its own, not an object)."""
        return self.obj.get("apiVersion") == KUSTOMIZE_API

    @property
    def path(self) -> str:
        if self.is_remote:
            return f"{self.directory}/{REMOTE_DIR}/{self.name}/{KUSTOMIZE_FILE}"
        return f"{self.directory}/{self.namespace or '_cluster'}/{self.kind.lower()}-{self.name}.yaml"

    @property
    def directory(self) -> str:
        return "/".join(part for part in ("manifests", self.stage, self.layer) if part)

    @property
    def unit(self) -> str:
        """The directory one Flux Kustomization applies: a shared stage's, or this layer's in it."""
        return f"manifests/{self.stage}" if self.stage in SHARED_STAGES else self.directory

    @property
    def is_patch(self) -> bool:
        return self.stage == PATCHES

    @property
    def ref(self) -> str:
        scope = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind}/{scope}{self.name}"


@dataclass
class Rendered:
    """What one environment renders to: its objects and its Pulumi resource inventory."""

    config: FactoryConfig | None
    kubernetes_version: str
    manifests: list[Manifest]
    inventory: list[dict[str, Any]]
    graph: Graph | None = field(default=None, repr=False)
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    """(file, problem) of every rendered file `load_rendered` could not read as objects: `factory
    check` reports each as a finding instead of stopping."""
    kustomizations: list[dict[str, Any]] = field(default_factory=list)
    """The Flux Kustomizations applying the stages, in dependency order."""
    whole_layers: frozenset[str] | None = None
    """For a part of a render (`check.parts`): the layers of the whole render."""
    scopes: Mapping[str, tuple[str, ...]] = field(default_factory=dict, repr=False)
    """The tenants each platform resource made for some tenants only is for, by resource key
    (`FactoryComponent.tenant_scopes`, as the render cache records them; empty without one): the
    check cache's tenant views (`checking.views`)."""

    _kinds: tuple[list[Manifest], int, dict[str, list[int]]] | None = field(default=None, init=False, repr=False, compare=False)

    def of_kind(self, *kinds: str) -> list[Manifest]:
        """Objects of these kinds, in render order. Indexed by kind once, and again only when the
        list of objects is another or changed length: each check scanning every object for its
        kinds was dozens of passes over 30,000 objects at 1,000 tenants."""
        manifests, index = self.manifests, self._kind_index()
        if len(kinds) == 1:
            return [manifests[i] for i in index.get(kinds[0], ())]
        return [manifests[i] for i in sorted(i for kind in set(kinds) for i in index.get(kind, ()))]

    def kinds(self) -> list[str]:
        """The kinds of the render's objects, each once, in the order they first appear."""
        return list(self._kind_index())

    def _kind_index(self) -> dict[str, list[int]]:
        manifests = self.manifests
        if self._kinds is None or self._kinds[0] is not manifests or self._kinds[1] != len(manifests):
            index: dict[str, list[int]] = {}
            for i, m in enumerate(manifests):
                index.setdefault(m.kind, []).append(i)
            self._kinds = (manifests, len(manifests), index)
        return self._kinds[2]

    def layers(self) -> frozenset[str]:
        """The layers the render holds objects of (the whole render's, for a part)."""
        return self.whole_layers if self.whole_layers is not None else frozenset(m.layer for m in self.manifests)

    def oci_sources(self) -> dict[tuple[str | None, str], Manifest]:
        """The OCIRepositories by (namespace, name), the last of a name winning: `release_chart`'s
        index, built once by a caller asking for many releases' charts."""
        return {(m.namespace, m.name): m for m in self.of_kind("OCIRepository")}

    def release_chart(self, release: Manifest, sources: Mapping[tuple[str | None, str], Manifest] | None = None) -> str | None:
        """The chart name of a HelmRelease: its chart spec's, or its OCIRepository's URL's last part
        (`sources`: `oci_sources()`, when the caller has it)."""
        spec = release.obj.get("spec") or {}
        if "chartRef" in spec:
            source = (self.oci_sources() if sources is None else sources).get((release.namespace, (spec.get("chartRef") or {}).get("name")))
            return str((source.obj.get("spec") or {}).get("url", "")).rstrip("/").rsplit("/", 1)[-1] if source else None
        return ((spec.get("chart") or {}).get("spec") or {}).get("chart")

    @no_cycle_collection()
    def files(self) -> dict[str, str]:
        files = {m.path: m.yaml() for m in self.manifests}
        files.update({f"flux/{k['metadata']['name']}.yaml": dump_simple_yaml(k) for k in self.kustomizations})
        files.update(kustomize_files(files))
        files["inventory.json"] = dump_inventory({"kubernetesVersion": self.kubernetes_version, "resources": self.inventory}) + "\n"
        return files

    @no_cycle_collection()
    def write(self, out: Path, on_file: Callable[[], None] | None = None, record: Path | None = None, files: Mapping[str, str] | None = None) -> None:
        """`out` ends holding exactly the render's files (UTF-8). Over an earlier render only what
        differs is touched: the files no longer rendered (and directories left empty) are removed,
        a file is written only when its text changed (removing and rewriting a whole large tree
        cost a one-tenant re-render more than rendering it). `on_file`: called once per file
        (progress).

        `record`: a file (in the render cache, `cache.write_record`) where the write keeps what it
        left in `out` (`WriteRecord`), so that the next one knows a file it left untouched since
        by its status and digest instead of reading it back. `files`: `files()`, when the caller
        has it already."""
        files = self.files() if files is None else files
        if out.exists() and not out.is_dir():
            out.unlink()
        # Taken before any file's status is: what changes a file after that gets a later time.
        started = time.time_ns()
        known = WriteRecord.read(record, out) if record is not None else WriteRecord.empty(out)
        present: dict[str, os.stat_result] = {}
        top = str(out)
        walked: set[str] = set()
        holding: set[str] = set()
        """The directories walked, and those of them still holding something: bottom-up, a
        directory's own are done before it (asking each directory again cost a stat and a
        listing each, thousands in a large tree)."""
        for root, directories, names in os.walk(top, topdown=False):
            walked.add(root)
            relative_root = root[len(top) + 1 :]  # os.walk joins each directory's name to `top`
            for name in names:
                path = f"{root}/{name}"
                relative = f"{relative_root}/{name}" if relative_root else name
                status = os.lstat(path)
                if relative in files and not stat.S_ISLNK(status.st_mode):
                    present[relative] = status
                    holding.add(root)
                else:
                    os.unlink(path)
            for name in directories:
                path = os.path.join(root, name)
                if path in holding:
                    holding.add(root)
                elif path in walked:
                    os.rmdir(path)
                elif os.path.islink(path):  # os.walk does not follow a link to a directory
                    os.unlink(path)
                elif not os.listdir(path):
                    os.rmdir(path)
                else:
                    holding.add(root)
        written = WriteRecord.empty(out, started)
        for relative, text in sorted(files.items()):
            target = f"{out}/{relative}"
            data = text.encode()
            digest = hashlib.sha256(data).hexdigest()
            status = present.get(relative)
            recorded = known.digest(relative, status) if status is not None else None
            if status is None or (recorded != digest if recorded is not None else _read_bytes(target) != data):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as f:
                    f.write(data)
                status = os.stat(target)
            written.add(relative, status, digest)
            if on_file is not None:
                on_file()
        if record is not None:
            written.write(record)

    def summary(self) -> str:
        by_layer: dict[str, int] = {}
        by_tenant: dict[str, int] = {}
        for m in self.manifests:
            by_layer[m.layer] = by_layer.get(m.layer, 0) + 1
            if m.tenant:
                by_tenant[m.tenant] = by_tenant.get(m.tenant, 0) + 1
        live = sum(1 for e in self.inventory if e.get("bundle") == NOT_IN_BUNDLE)
        lines = [
            f"{len(self.manifests)} objects in {len(self.kustomizations)} Flux Kustomizations, {len(self.inventory)} Pulumi resources"
            f" ({live} {NOT_IN_BUNDLE})"
        ]
        lines += [f"  layer {layer:<24} {n:>5} objects" for layer, n in sorted(by_layer.items())]
        lines += [f"  tenant {tenant:<23} {n:>5} objects" for tenant, n in sorted(by_tenant.items())]
        return "\n".join(lines)


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


RECORD_FORMAT = 1
RECORD_MARGIN_NS = 2 * 10**9
"""The coarsest file time resolution trusted (FAT's two seconds): a file changed less than this
before a write looked at it could change again within the same recorded time."""


@dataclass
class WriteRecord:
    """What one `Rendered.write` left in its directory: each file's status (size, times, inode)
    and the digest of the text written. A later write trusts a digest only for a file whose
    status is still exactly the recorded one (any write to a file changes its ctime, which no
    tool can set back) and which had last changed well before the recording write began
    (`RECORD_MARGIN_NS`); any other file is read back."""

    out: str
    started_ns: int = 0
    """When the recording write began, before it read any file's status."""
    files: dict[str, tuple[int, int, int, int, int, str]] = field(default_factory=dict)
    """Relative path -> (size, mtime_ns, ctime_ns, inode, device, sha256 of the text)."""
    format: int = RECORD_FORMAT

    @classmethod
    def empty(cls, out: Path, started_ns: int = 0) -> WriteRecord:
        return cls(str(out.resolve()), started_ns)

    @classmethod
    def read(cls, path: Path, out: Path) -> WriteRecord:
        """The record at `path` of a write into `out`; an empty one when it is absent, unreadable
        or of another directory."""
        empty = cls.empty(out)
        try:
            record = _RECORD.decode(path.read_bytes())
        except (OSError, msgspec.DecodeError):
            return empty
        return record if record.format == RECORD_FORMAT and record.out == empty.out else empty

    def add(self, relative: str, status: os.stat_result, digest: str) -> None:
        self.files[relative] = (*_status(status), digest)

    def digest(self, relative: str, status: os.stat_result) -> str | None:
        """The digest of the text of the file at `relative`, whose status is now `status`, when
        the record can be trusted for it (None: read it back)."""
        entry = self.files.get(relative)
        if entry is None or entry[:5] != _status(status) or max(status.st_mtime_ns, status.st_ctime_ns) >= self.started_ns - RECORD_MARGIN_NS:
            return None
        return entry[5]

    def write(self, path: Path) -> None:
        write_entry(path, self)


_RECORD = msgspec.json.Decoder(WriteRecord)


def _status(status: os.stat_result) -> tuple[int, int, int, int, int]:
    return status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino, status.st_dev


def kustomize_files(files: Mapping[str, str]) -> dict[str, str]:
    """A `kustomization.yaml` in every directory of `flux/` and `manifests/`, listing exactly its
    files and subdirectories, so `kubectl apply -k` and Argo CD read the same tree as Flux."""
    own = {path.rpartition("/")[0] for path in files if path.endswith(f"/{KUSTOMIZE_FILE}")}
    """Directories with a kustomization of their own (a pinned release manifest's): listed by their parent, kept as they are."""
    entries: dict[str, set[str]] = {}
    for path in files:
        parts = path.split("/")
        if parts[0] not in ("flux", "manifests"):
            continue
        for depth in range(1, len(parts)):
            directory = "/".join(parts[:depth])
            if directory not in own:
                entries.setdefault(directory, set()).add(parts[depth])
    return {f"{directory}/{KUSTOMIZE_FILE}": kustomization_yaml(sorted(children)) for directory, children in entries.items()}


def kustomization_yaml(resources: list[str]) -> str:
    """`dump_yaml` of a kustomization listing `resources`."""
    return dump_simple_yaml({"apiVersion": KUSTOMIZE_API, "kind": "Kustomization", "resources": resources})


def dump_simple_yaml(obj: Any) -> str:
    """`dump_yaml(obj)` byte for byte, written directly when `obj` is a tree of non-empty
    mappings and lists of mappings or scalars whose every string YAML reads back as that string
    unquoted (a bundle's thousands of kustomizations and Flux Kustomizations cost more through
    the representer than all else in writing the files); else dumped."""
    lines: list[str] = []
    return "".join(lines) if _simple_block(obj, "", lines) else dump_yaml(obj)


def _simple_block(value: Any, indent: str, lines: list[str]) -> bool:
    """`value`'s block lines as the dumper writes them (keys sorted, a list under a key not
    indented, two spaces a level), appended to `lines`; False when it is not that simple."""
    if type(value) is dict and value:
        for key in sorted(value):
            if type(key) is not str or len(key) > _SIMPLE_KEY_MAX or not _plain(key):
                return False
            item = value[key]
            if type(item) is dict or type(item) is list:
                lines.append(f"{indent}{key}:\n")
                if not _simple_block(item, indent + "  " if type(item) is dict else indent, lines):
                    return False
            elif (text := _scalar(item)) is not None:
                lines.append(f"{indent}{key}: {text}\n")
            else:
                return False
        return True
    if type(value) is list and value:
        for item in value:
            if type(item) is dict:
                first = len(lines)
                if not _simple_block(item, indent + "  ", lines):
                    return False
                lines[first] = f"{indent}- {lines[first][len(indent) + 2:]}"
            elif (text := _scalar(item)) is not None:
                lines.append(f"{indent}- {text}\n")
            else:
                return False
        return True
    return False


def _scalar(value: Any) -> str | None:
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    if type(value) is str and _plain(value):
        return value
    return None


@functools.lru_cache(maxsize=1 << 15)
def _plain(text: str) -> bool:
    # Bounded by a large render's distinct strings (16,700 at 1,000 tenants), nine of ten
    # asked for again: the same keys, stages and layer names in every kustomization.
    return _PLAIN_NAME.fullmatch(text) is not None and _RESOLVER.resolve(yaml.ScalarNode, text, (True, False)) == _STR_TAG


_PLAIN_NAME = re.compile(r"(?:[A-Za-z0-9_]|\./)[A-Za-z0-9_./-]{0,200}")
"""Strings the emitter writes plain: no indicator first (`./` is none), no space, quote, colon
or `#`, no line break, and too short to fold."""
_SIMPLE_KEY_MAX = 100
"""Keys written as simple keys (`key: value`), well within both emitters' bound (PyYAML writes
a longer key than 122 characters as `? key`, libyaml one longer than 128)."""
_RESOLVER = yaml.resolver.Resolver()
_STR_TAG = "tag:yaml.org,2002:str"


def _block_strings(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    """Multi-line strings (configs embedded in Helm values: mig-parted, device plugin) as `|` blocks,
    readable in review; the emitter falls back to quoting where a block cannot hold the string."""
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


class ReferenceDumper(yaml.SafeDumper):
    """PyYAML's own emitter: the reference `_Dumper` must match byte for byte (tests/test_bundle.py)."""


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """libyaml's emitter where PyYAML was built with it (4-5 times faster on a large bundle)."""


for _dumper in (ReferenceDumper, _Dumper):
    _dumper.add_representer(str, _block_strings)


def dump_yaml(obj: Any, dumper: type[yaml.SafeDumper] = _Dumper) -> str:
    return yaml.dump(obj, Dumper=dumper, sort_keys=True, default_flow_style=False, allow_unicode=True, width=120)


def dump_json(obj: Any) -> str:
    """`json.dumps(obj, indent=2, sort_keys=True)` byte for byte, three times faster: with an
    indent `json` encodes in Python; without one in C, and msgspec's formatter then indents the
    text, copying every token as it is (strings still ASCII-escaped, numbers as Python wrote
    them). NaN and infinity, which `json` writes but JSON has not, take the slow way."""
    try:
        return msgspec.json.format(json.dumps(obj, sort_keys=True), indent=2)
    except msgspec.DecodeError:
        return json.dumps(obj, indent=2, sort_keys=True)


def dump_inventory(inventory: dict[str, Any]) -> str:
    """`dump_json` of an inventory, whose values are strings, booleans, nulls and lists of them
    (no number, which msgspec would write otherwise than `json`): encoded by msgspec (six times
    faster) when no string needs an escape (`json` escapes every non-ASCII character), as
    `dump_json`'s formatter lays out either encoding alike."""
    text = msgspec.json.encode(inventory, order="sorted")
    if text.isascii() and b"\\" not in text:
        return msgspec.json.format(text, indent=2).decode()
    return dump_json(inventory)


# --------------------------------------------------------------------------- running the program


def render_env(env: str, on_resource: Callable[[], None] | None = None, cache: Path | None = None) -> Rendered:
    """Validate the environment's stack file (failing before anything is registered), then run the
    platform program exactly as `pulumi up` would, with the stack's config seeded into the runtime.

    `env` is an environment name (`Pulumi.<env>.yaml` of the project) or a stack file's path;
    `on_resource` is called once per resource the program registers (progress); `cache`: the
    render cache directory (see `render_raw`)."""
    # The program adds the registered tenants itself, as under `pulumi up`; validated with them here.
    return _render_stack(read_environment(env), on_resource, cache)


def _render_stack(
    environment: StackEnvironment,
    on_resource: Callable[[], None] | None,
    cache: Path | None,
    meanwhile: Callable[[], None] | None = None,
    on_graph: Callable[[Graph], None] | None = None,
) -> Rendered:
    """`render_env` of a stack file already read and validated; `meanwhile`, `on_graph`: as `render_raw`'s."""
    refuse_whole_fleet(environment.cfg, str(environment.path))
    stack, project = stack_name(environment.path), stack_project(environment.path)

    def planned() -> None:
        _check_plan(environment.cfg, environment.path, project, stack, cache)
        _call(meanwhile)

    return render_raw(
        environment.raw,
        environment.secret_sections,
        environment.cfg,
        stack=stack,
        project=project,
        on_resource=on_resource,
        cache=cache,
        meanwhile=planned,
        on_graph=on_graph,
    )


def _check_plan(cfg: FactoryConfig, path: Path, project: str, stack: str, cache: Path | None) -> None:
    """Demands that do not fit are reported before anything is registered, as the stack's program
    plans them (`stack_plan`, the plan lock beside the stack file `path`)."""
    stack_plan(cfg, stack, UnitCache(cache, f"{project}.{stack}") if cache is not None else None, path.resolve().parent)


def stack_plan(cfg: FactoryConfig, stack: str, units: UnitCache | None, directory: Path | None = None) -> Plan:
    """The plan a stack's program deploys: planned from its plan lock (`previous_plan`, in the
    project `directory`), read back from the render cache `units` when this library planned from
    the same inputs (`UnitCache.plan`)."""
    previous = previous_plan(stack, directory)
    planner = functools.partial(plan_for, cfg, previous)
    return units.plan((plan_inputs(cfg), previous), planner) if units is not None else planner()


def refuse_whole_fleet(cfg: FactoryConfig, source: str) -> None:
    """An environment of several clusters is deployed (and rendered) one cluster at a time."""
    from ai_factory.factory.model.clusters import clusters
    from ai_factory.factory.model.loading import ConfigError

    found = [c.name for c in clusters(cfg)]
    if found and cfg.kubernetes.cluster is None:
        raise ConfigError(
            [f"kubernetes.cluster: the environment has clusters {', '.join(found)}; each is deployed by its own stack (<env>-<cluster>) that sets it"],
            source=source,
        )


def cluster_stack(env: str, cluster: str) -> str:
    """The platform stack of one cluster of a multi-cluster environment."""
    return f"{env}-{cluster}"


def render_clusters(
    env: str | StackEnvironment,
    on_resource: Callable[[], None] | None = None,
    cache: Path | None = None,
    meanwhile: Callable[[], None] | None = None,
    on_graph: Callable[[Graph], None] | None = None,
) -> dict[str, Rendered]:
    """Every cluster of the environment rendered as its own stack renders it (`kubernetes.cluster`
    set, the stack `<env>-<cluster>`), by cluster name in the sites' order. An environment that
    declares no cluster is one render, keyed by its name. `env`: its name or stack file's path, or
    the environment already read (`read_environment`). `meanwhile`: called once, as `render_raw`
    calls it (several clusters: before the first is rendered); `on_graph`: as `render_raw` calls it,
    for each cluster."""
    from ai_factory.factory.model.clusters import clusters

    environment = env if isinstance(env, StackEnvironment) else read_environment(env)
    path, raw, cfg = environment.path, environment.raw, environment.cfg
    if not clusters(cfg):
        return {stack_name(path): _render_stack(environment, on_resource, cache, meanwhile, on_graph)}
    _call(meanwhile)
    renders = {}
    for placed in clusters(cfg):
        cluster_raw = {**raw, "kubernetes": {**(raw.get("kubernetes") or {}), "cluster": placed.name}}
        stack = cluster_stack(stack_name(path), placed.name)
        view = validate(environment_raw(cluster_raw, stack, path.resolve().parent), source=str(path))
        _check_plan(view, path, stack_project(path), stack, cache)
        renders[placed.name] = render_raw(
            cluster_raw,
            environment.secret_sections,
            view,
            stack=stack,
            project=stack_project(path),
            on_resource=on_resource,
            cache=cache,
            on_graph=on_graph,
        )
    return renders


def cached_stacks(environment: StackEnvironment) -> list[str]:
    """The name the render cache gives each stack `render_clusters` renders (`<project>.<stack>`)."""
    from ai_factory.factory.model.clusters import clusters

    project, stack = stack_project(environment.path), stack_name(environment.path)
    return [f"{project}.{cluster_stack(stack, c.name)}" for c in clusters(environment.cfg)] or [f"{project}.{stack}"]


PARALLEL_MIN_TENANTS = 40
"""Tenants per worker process below which a render stays in one process: a worker costs its
imports and the platform built again (~3 s of CPU), more than a few tenants' stacks."""


def render_raw(
    raw: dict[str, Any],
    secret_sections: set[str],
    cfg: FactoryConfig,
    stack: str,
    plan: Plan | None = None,
    project: str = "ai-factory",
    on_resource: Callable[[], None] | None = None,
    workers: int | None = None,
    offboarded: frozenset[str] = frozenset(),
    cache: Path | None = None,
    meanwhile: Callable[[], None] | None = None,
    on_graph: Callable[[Graph], None] | None = None,
) -> Rendered:
    """`plan`: deploy this plan instead of planning from the stack's recorded one (see `program.main`).
    `project`: the Pulumi project the program runs in, whose name is the config namespace.
    `workers`: processes to render in (default: one per core, at most one per
    `PARALLEL_MIN_TENANTS` tenants). Each runs the whole program for its share of the tenants
    (without a cache every share builds the same platform; with one, this process alone:
    `_ShareUnits`, `_shares`); the shares' tenant resources are merged by
    URN, so the render is the serial one byte for byte. `on_resource` counts this process's share.
    `offboarded`: registered tenants the program leaves out (see `program.main`).
    `cache`: the render cache directory (`cache.UnitCache`): layers and tenant stacks found there
    are read back, not registered again. The first render of a stack into a cache uses the
    workers; later ones run in this process (a change builds few units). `meanwhile`: called once
    in this process before any resource is registered here and the render is done: while the
    program runs forked beside it (a cached stack's later render), else before the program runs;
    what it raises ends the render. `on_graph`: called with the render's resource graph once it is
    complete, before its objects are finished and staged."""
    config, secret_keys = program_config(raw, secret_sections, project)
    names = sorted(t.name for t in cfg.tenants)
    units = UnitCache(cache, f"{project}.{stack}") if cache is not None else None
    if workers is None:
        workers = 1 if units is not None and units.seen else min(os.cpu_count() or 1, len(names) // PARALLEL_MIN_TENANTS)
    if workers <= 1:
        # The cached units' resources are most of the heap and hold no cycle: left out of the
        # collector's passes while the program and the merge allocate around them.
        with settled_heap():
            if units is None:
                _call(meanwhile)
                return _bundled(_run_share(project, stack, config, secret_keys, plan, offboarded, None, on_resource), cfg, on_graph)
            run = functools.partial(_run_share, project, stack, config, secret_keys, plan, offboarded, None)
            return _cached(units, units.complete(_run_reading(units, run, on_resource, meanwhile)), cfg, on_graph)
    _call(meanwhile)
    # With a cache the workers leave the platform to this process (`_ShareUnits`): it costs as
    # much as `PLATFORM_PER_TENANT` of a tenant stack per tenant, here only.
    shares = _shares(names, workers, PLATFORM_PER_TENANT * len(names) if units is not None else 0.0)
    # Plain interpreters, not multiprocessing's: a worker starts with no Pulumi runtime state, and
    # without importing the caller's main module (a script calling this need not guard its body).
    started = [
        subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in shares[1:]
    ]
    # As in one process, the collector held off: finishing this share's objects and reading the
    # workers' set off full passes over the growing render (about a second of 10 at 300 tenants).
    with settled_heap(), no_cycle_collection(settle=True):
        try:
            # A pipe's buffer is small: write from threads so that our own share need not wait for it.
            feeders = [
                threading.Thread(target=_feed, args=(process, pickle.dumps((project, stack, config, secret_keys, plan, offboarded, share, cache))), daemon=True)
                for process, share in zip(started, shares[1:])
            ]
            for feeder in feeders:
                feeder.start()
            resources = list(_run_share(project, stack, config, secret_keys, plan, offboarded, shares[0], on_resource, units).resources)
            # With a cache every object built is stored with its text: each process finishes its own
            # (here while the workers finish), not this one all of them after the merge.
            finished = finished_objects(resources, stack) if units is not None else {}
            for process, feeder in zip(started, feeders):
                feeder.join()
                process.stdin = None  # written and closed by its feeder
                out, err = process.communicate()
                if process.returncode != 0:
                    raise RuntimeError(f"a render worker failed:\n{err.decode(errors='replace')[-4000:]}")
                share_resources, share_units, share_finished = pickle.loads(out)
                resources += share_resources
                finished.update(share_finished)
                if units is not None:
                    units.adopt(share_units)
        finally:
            for process in started:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        seen: set[str] = set()
        for r in resources:
            if r.key in seen:
                raise DuplicateResourceError(f"two resources are named {r.name!r} with type {r.type}")
            seen.add(r.key)
        if units is not None:
            return _cached(units, units.complete(resources), cfg, on_graph, finished)
        return _bundled(Graph(sorted(resources, key=lambda r: r.urn)), cfg, on_graph)


WORKER_START = 30
"""Tenants whose stacks cost what a worker's own work does (its interpreter and imports, pickling
its share, about 2 s of CPU, against about 0.07 s per tenant's stack and texts; at 20 the worker
still finished about 1 s after the main process's share at 200 to 1,000 tenants): the main process
takes that many more than each worker, so that all finish their shares together (the merge after
waits for the last of them)."""

PLATFORM_PER_TENANT = 0.3
"""The platform's layers cost about as much as this many tenant stacks per tenant (at 1,000
tenants 6,926 resources, about 10 s of CPU, against 22.7 resources and 15 ms per tenant's stack;
0.31 at 300 tenants): with a cache only the main process builds them (`_ShareUnits`), so it takes
that many tenants fewer."""


def _shares(names: list[str], workers: int, platform: float = 0.0) -> list[frozenset[str]]:
    """Tenants dealt in name order to the share with the least work (the main process's first,
    counting the `platform` it alone builds, in tenant stacks; a worker's counting its start):
    neighbours in name order, often alike, spread over all."""
    starts = [platform, *([WORKER_START] * (workers - 1))]
    shares: list[list[str]] = [[] for _ in starts]
    for name in names:
        share = min(range(workers), key=lambda i: (len(shares[i]) + starts[i], i))
        shares[share].append(name)
    return [frozenset(share) for share in shares]


def program_config(raw: dict[str, Any], secret_sections: set[str], project: str) -> tuple[dict[str, str], list[str]]:
    """The stack's configuration as the Pulumi runtime holds it (`<project>:<section>`, JSON) and its secret keys."""
    return {f"{project}:{section}": json.dumps(value, default=_placeholder) for section, value in raw.items()}, [f"{project}:{s}" for s in secret_sections]


def _cached(
    units: UnitCache,
    resources: list[Resource],
    cfg: FactoryConfig,
    on_graph: Callable[[Graph], None] | None,
    finished: Mapping[str, list[tuple[dict[str, Any], str]]] | None = None,
) -> Rendered:
    """The render of a cache's units: the cached ones' files as they were written, the built ones
    stored. `finished`: built resources' objects the render workers already finished (`finished_objects`)."""
    rendered = _bundled(Graph(sorted(resources, key=lambda r: r.urn)), cfg, on_graph, {**units.objects(), **(finished or {})})
    rendered.scopes = units.scopes()
    built = units.built_keys()
    made: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for m in rendered.manifests:
        if m.origin in built:
            made.setdefault(m.origin, []).append((m.obj, m.yaml()))
    units.store(made)
    return rendered


def _bundled(
    graph: Graph, cfg: FactoryConfig, on_graph: Callable[[Graph], None] | None, finished: Mapping[str, list[tuple[dict[str, Any], str]]] | None = None
) -> Rendered:
    """`from_graph`, once `on_graph` has the complete graph."""
    if on_graph is not None:
        on_graph(graph)
    return from_graph(graph, cfg, finished)


def _run_reading(
    units: UnitCache,
    run: Callable[[Callable[[], None] | None, UnitCache], Graph],
    on_resource: Callable[[], None] | None,
    meanwhile: Callable[[], None] | None = None,
) -> list[Resource]:
    """The resources the program registers with the render cache `units` (`run`: `_run_share`
    but for its progress and cache): run in a process forked for it (`parallel.beside`, with a
    `probing` cache) while this one calls `meanwhile` and reads the entries of the stack's last
    render, which at 1,000 tenants took about as long as the program after a one-tenant change.
    Here, after reading, where the stack has no last render, forking is not safe, the forked run
    failed (its error is raised here as a serial render raises it) or an entry it counted as
    cached cannot be read."""
    keys = units.last_keys()
    with parallel.beside(functools.partial(_probed_run, units.probing(), run), ahead=True) if keys else nullcontext(lambda: None) as forked:
        _call(meanwhile)
        units.prefetch(keys)
        probed = forked()
    if probed is not None and units.take(probed[1]):
        for _ in probed[0] if on_resource is not None else ():
            on_resource()
        return probed[0]
    return run(on_resource, units).resources


def _load(module: str) -> None:
    """Import a module and its packages, loaded: a module imported lazily loads on its first attribute."""
    parts = module.split(".")
    for end in range(1, len(parts) + 1):
        getattr(importlib.import_module(".".join(parts[:end])), "__all__", None)


PROGRAM_WARM_UP: tuple[Callable[[], object], ...] = (
    functools.partial(_load, "ai_factory.factory.rendering.program"),
    functools.partial(_load, "pulumi_kubernetes.core.v1"),
    layers,  # imports every layer's module
    library_digest,
    *(
        functools.partial(_load, module)
        for module in (
            "ai_factory.factory.model.upgrades",  # what the program reads its stack's configuration with
            "pulumi_keycloak.openid",
            "pulumi_kubernetes.helm.v3",
            "pulumi_kubernetes.resource.v1",
            "pulumi_kubernetes.meta.v1",
            "pulumi_kubernetes.apiextensions",
            "pulumi_kubernetes.yaml.v2",
            "pulumi_vault.kubernetes",
            "pulumi_vault.kv",
            "pulumi_kubernetes.rbac.v1",
            "pulumi_kubernetes.storage.v1",
            "pulumi_kubernetes.apps.v1",
            "pulumi_kubernetes.batch.v1",
            "pulumi_kubernetes.helm.v4",
        )
    ),
)
"""What a run of the program does first that reading a stack file does not, what a tenant's stack
needs first: import the program, the layers' modules and the provider SDKs' modules the components
reach (they load on first use), and find the library's digest. At 1,000 tenants that was half of
the program forked beside a one-tenant re-render."""


def program_ahead() -> ContextManager[None]:
    """A process forked at the block's start takes the steps of `PROGRAM_WARM_UP` while this one
    reads the stack file: the block's first cached render (`_run_reading`) runs its program there."""
    return parallel.ahead(PROGRAM_WARM_UP)


def _call(meanwhile: Callable[[], None] | None) -> None:
    if meanwhile is not None:
        meanwhile()


def _probed_run(probing: ProbingUnits, run: Callable[[Callable[[], None] | None, UnitCache], Graph]) -> tuple[list[Resource], Probe]:
    resources = run(None, probing).resources
    for r in resources:  # the merge links them again (`UnitCache.complete`, `Graph`)
        r.parent, r.dependencies = None, []
    return resources, probing.probe()


def _run_share(
    project: str,
    stack: str,
    config: dict[str, str],
    secret_keys: list[str],
    plan: Plan | None,
    offboarded: frozenset[str],
    tenants: frozenset[str] | None,
    on_resource: Callable[[], None] | None = None,
    units: UnitCache | None = None,
) -> Graph:
    from ai_factory.factory.rendering.program import main

    return run_program(
        functools.partial(main, plan, with_tenant_stacks=True, only_tenants=tenants, offboarded=offboarded, units=units),
        project=project,
        stack=stack,
        config=config,
        secret_keys=secret_keys,
        monitor=RecordingMonitor(RecordingMocks(), on_record=on_resource),
    )


_WORKER = "from ai_factory.factory.rendering.bundle import _worker; _worker()"


def _feed(process: subprocess.Popen, payload: bytes) -> None:
    try:
        process.stdin.write(payload)
        process.stdin.close()
    except OSError:
        pass  # the worker died; its exit status says why


def _worker() -> None:
    """A render worker's body: its share's arguments pickled on stdin, its resources on stdout."""
    result = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the program prints goes to stderr, never into the result
    ending_process()
    share = _tenant_share(*pickle.loads(sys.stdin.buffer.read()))
    result.write(pickle.dumps(share))
    result.close()


def _tenant_share(
    project: str,
    stack: str,
    config: dict[str, str],
    secret_keys: list[str],
    plan: Plan | None,
    offboarded: frozenset[str],
    tenants: frozenset[str],
    cache: Path | None,
) -> tuple[list[Resource], dict[str, Unit], dict[str, list[tuple[dict[str, Any], str]]]]:
    """A worker's share: its tenants' resources, unlinked (the merged graph links them again), and
    with a cache what it found of its tenants' units (the caller merges and stores them) and its
    objects finished (`finished_objects`)."""
    units = _ShareUnits(cache, "") if cache is not None else None
    share = [r for r in _run_share(project, stack, config, secret_keys, plan, offboarded, tenants, units=units).resources if r.tenant in tenants]
    finished = finished_objects(share, stack) if units is not None else {}
    for r in share:
        r.parent, r.dependencies = None, []
    found = {name: unit for name, unit in units.units.items() if name.removeprefix("tenant:") in tenants} if units is not None else {}
    return share, found, finished


class _ShareUnits(UnitCache):
    """A render worker's cache: every layer counts as cached, left to the main process, which
    builds the platform whole. A tenant stack needs no layer built beside it: its arguments come
    from the config and plan, and its dependencies on the layers are recomputed over the merged
    graph (`UnitCache.complete`), as when a one-tenant change builds it beside cached layers."""

    def build(self, unit: str, key: str, root_name: str, after: Iterable[str]) -> bool:
        return not unit.startswith("layer:") and super().build(unit, key, root_name, after)


def _placeholder(value: Any) -> str:
    from ai_factory.factory.model.secrets import SecretValue

    if isinstance(value, SecretValue):
        return value.reveal()  # offline placeholders carry no secret; this is what pulumi up decrypts
    raise TypeError(f"cannot serialise {type(value).__name__}")


@no_cycle_collection(settle=True)
def from_graph(graph: Graph, cfg: FactoryConfig, finished: Mapping[str, list[tuple[dict[str, Any], str]]] | None = None) -> Rendered:
    """`finished`: some resources' objects as an earlier render (the render cache's) or a render
    worker finished them, with their file texts, by resource key: taken as they are, not built again."""
    manifests: list[Manifest] = []
    owned: dict[str, tuple[str, ...]] = {}
    finished = finished or {}
    stack = stack_of(graph)
    for resource in graph.resources:
        if (groups := installed_crd_groups(resource)) is not None:
            owned[resource.key] = groups
        known = finished.get(resource.key)
        if known is None:
            manifests += resource_manifests(resource, stack)
        else:
            manifests += [Manifest(obj, resource.layer, resource.tenant, resource.key, text=text) for obj, text in known]
    staging = Staging(manifests, graph, owned)
    by_path: dict[str, Manifest] = {}
    for m in manifests:
        path = m.path
        if path in by_path:
            raise ValueError(f"{m.ref} is produced twice ({by_path[path].origin} and {m.origin})")
        by_path[path] = m
    kustomizations = staging.kustomizations(stack)
    files: dict[str, list[str]] = {}
    for path in sorted(by_path):
        files.setdefault(by_path[path].origin, []).append(path)
    depends_on: dict[tuple[int, ...], list[str]] = {}
    inventory = sorted(
        (inventory_entry(r, files.get(r.key), depends_on) for r in graph.resources), key=lambda e: (e["layer"], e["type"], e["name"])
    )
    return Rendered(cfg, cfg.kubernetes.version, [by_path[path] for path in sorted(by_path)], inventory, graph, kustomizations=kustomizations)


def resource_manifests(resource: Resource, stack: str) -> list[Manifest]:
    """The objects one resource puts in the bundle, labelled, as they are written (each file's
    text is theirs alone: their resource, its layer and tenant and the stack)."""
    made: list[Manifest] = []
    if resource.type in HELM_RELEASE_TYPES:
        made = helm_release_manifests(resource)
    elif resource.type == CONFIG_FILE_TYPE and (pin := manifest_pin(resource.inputs.get("file"))) is not None:
        made = [Manifest(remote_manifest(pin), resource.layer, resource.tenant, resource.key)]
    elif resource.type.startswith("kubernetes:") and not resource.type.startswith(NON_OBJECT_TYPES):
        obj = kubernetes_object(resource)
        if resource.secret_paths:
            _mark_redacted(obj)
        made = [Manifest(obj, resource.layer, resource.tenant, resource.key)]
    for m in made if resource.retain_on_delete else ():
        m.obj.setdefault("metadata", {}).setdefault("annotations", {}).update(KEEP_ANNOTATIONS)
    for m in made:
        _label(m, stack)
    return made


def installed_crd_groups(resource: Resource) -> tuple[str, ...] | None:
    """The CRD groups a resource installs (a chart release or a pinned manifest), else None."""
    if resource.type in HELM_RELEASE_TYPES:
        return crd_groups(resource.inputs["chart"])
    if resource.type == CONFIG_FILE_TYPE and (pin := manifest_pin(resource.inputs.get("file"))) is not None:
        return pin.crd_groups
    return None


def finished_objects(resources: list[Resource], stack: str) -> dict[str, list[tuple[dict[str, Any], str]]]:
    """The finished objects of `resources` (linked to their parents: a scope is found through
    them) with their file texts, by resource key, as `from_graph` takes them: what a render
    worker finishes of its share, and the main process of its own while it waits."""
    finished: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for resource in resources:
        if made := resource_manifests(resource, stack):
            finished[resource.key] = [(m.obj, m.yaml()) for m in made]
    return finished


def cached_stack(graph: Graph) -> str:
    """`<project>.<stack>` of a render (its URNs say `urn:pulumi:<stack>::<project>::...`), as the
    render cache names its stacks (`cached_stacks`)."""
    stack, _, rest = (graph.resources[0].urn.removeprefix("urn:pulumi:") if graph.resources else "").partition("::")
    return f"{rest.partition('::')[0]}.{stack}"


def stack_of(graph: Graph) -> str:
    """The stack the program ran as (every URN names it)."""
    return graph.resources[0].urn.split("::")[0].removeprefix("urn:pulumi:") if graph.resources else ""


def _is_patch(origin: str) -> bool:
    """Pulumi's `<Kind>Patch` resources set some fields of an object that exists without them."""
    return origin.startswith("kubernetes:") and origin.split("::")[0].endswith("Patch")


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


class Staging:
    """Puts every object in the earliest stage an empty cluster can apply it in, and orders the
    stages' Flux Kustomizations.

    An object goes no earlier than its kind's stage (`rule`) nor than anything it needs: what
    its Pulumi resource (or a component above it) depends on, the release installing its CRD
    group (one stage later), its namespace and, for a release, its chart source. Tenants' objects
    are their tenant's stage; patches go to their layer's patch stage, never lifting another."""

    def __init__(self, manifests: list[Manifest], graph: Graph, owned: Mapping[str, tuple[str, ...]]):
        self.manifests = manifests
        self.resources = {r.key: r for r in graph.resources}
        self.children: dict[str, list[Resource]] = {}
        for r in graph.resources:
            if r.parent is not None:
                self.children.setdefault(r.parent.key, []).append(r)
        self.by_origin: dict[str, list[int]] = {}
        for i, m in enumerate(manifests):
            self.by_origin.setdefault(m.origin, []).append(i)
        self.owners: dict[str, int] = {}
        for i, m in enumerate(manifests):
            for group in owned.get(m.origin, ()) if m.kind == "HelmRelease" or m.is_remote else ():
                if group in self.owners:
                    raise ValueError(f"{manifests[self.owners[group]].ref} and {m.ref} both install the CRDs of {group}")
                self.owners[group] = i
        self.namespaces = {m.name: i for i, m in enumerate(manifests) if m.kind == "Namespace"}
        self.sources = {(m.namespace, m.kind, m.name): i for i, m in enumerate(manifests) if m.kind in FLUX_SOURCE_KINDS}
        self._ranks: dict[int, int] = {}
        self._resource_objects: dict[str, tuple[int, ...]] = {}
        self._dependency_objects: dict[tuple[str, ...], tuple[int, ...]] = {}
        self._resource_floor: dict[str, int] = {}
        last = len(STAGES) - 1
        for i, m in enumerate(manifests):
            patch = _is_patch(m.origin)
            if m.tenant:
                rank = self._ranks[i] = last  # a tenant's stage is the last: nothing lifts it (`rule`)
            else:
                rank = self.rank(i)
                if m.tenant is None and rank == last and not patch:
                    raise ValueError(f"{m.ref} of layer {m.layer} would wait for a tenant; only tenants' objects may")
            m.stage = PATCHES if patch else STAGES[rank]

    # ---- what an object needs

    def owner(self, i: int) -> int | None:
        return self.owners.get(_group(self.manifests[i].obj.get("apiVersion", "")))

    def needs(self, i: int) -> set[int]:
        """Objects that must be applied (and healthy) before object `i`, apart from its resource's
        dependencies (`resource_objects`)."""
        m = self.manifests[i]
        needed = set()
        if (owner := self.owner(i)) is not None:
            needed.add(owner)
        if m.namespace in self.namespaces:
            needed.add(self.namespaces[m.namespace])
        if m.kind == "HelmRelease":
            spec = m.obj["spec"]
            ref = spec.get("chartRef") or spec["chart"]["spec"]["sourceRef"]
            needed.add(self.sources[(m.namespace, ref["kind"], ref["name"])])
        needed.discard(i)
        return needed

    def lineage(self, i: int) -> list[Resource]:
        resource = self.resources.get(self.manifests[i].origin)
        return [resource, *resource.ancestors()] if resource else []

    def resource_objects(self, resource: Resource) -> tuple[int, ...]:
        """The objects a resource's dependencies stand for: a release's HelmRelease (its source
        comes with it), an object's own file, every object under a component. Dependencies on
        what is not in the bundle (providers, live configuration) order nothing here."""
        if resource.key not in self._resource_objects:
            # Keyed by the dependencies too: a layer's children mostly depend on the same few resources.
            dependencies = tuple(d.key for d in resource.dependencies)
            if dependencies not in self._dependency_objects:
                found: set[int] = set()
                for dependency in resource.dependencies:
                    found.update(self._objects_of(dependency))
                self._dependency_objects[dependencies] = tuple(sorted(found))
            self._resource_objects[resource.key] = self._dependency_objects[dependencies]
        return self._resource_objects[resource.key]

    def _objects_of(self, resource: Resource) -> list[int]:
        own = self.by_origin.get(resource.key, [])
        if own:
            return [i for i in own if self.manifests[i].kind == "HelmRelease"] or own
        if resource.custom:
            return []
        return [i for child in self.children.get(resource.key, ()) for i in self._objects_of(child)]

    # ---- stages

    def rule(self, i: int) -> int:
        """The earliest stage of an object's kind."""
        m = self.manifests[i]
        if m.tenant:
            return STAGES.index("tenants")
        if m.kind in (*FLUX_SOURCE_KINDS, "Namespace"):
            return STAGES.index("sources")
        if m.kind == "HelmRelease" or m.is_remote:
            return STAGES.index("crds") if i in self.owners.values() else STAGES.index("controllers")
        if self.owner(i) is not None:
            return STAGES.index("resources")
        return STAGES.index("sources")

    def rank(self, i: int) -> int:
        if i not in self._ranks and self.rule(i) == len(STAGES) - 1:
            self._ranks[i] = self.rule(i)  # the last stage already: nothing can lift it (a tenant's objects)
        if i not in self._ranks:
            floor = self.rule(i)
            for resource in self.lineage(i):
                floor = max(floor, self._floor(resource))
            for j in self.needs(i):
                if not _is_patch(self.manifests[j].origin):
                    floor = max(floor, self.rank(j) + (1 if j == self.owner(i) else 0))
            self._ranks[i] = min(floor, len(STAGES) - 1)
        return self._ranks[i]

    def _floor(self, resource: Resource) -> int:
        if resource.key not in self._resource_floor:
            self._resource_floor[resource.key] = max(
                (self.rank(j) for j in self.resource_objects(resource) if not _is_patch(self.manifests[j].origin)), default=0
            )
        return self._resource_floor[resource.key]

    # ---- Flux Kustomizations

    def unit_needs(self) -> dict[str, set[str]]:
        """Each stage directory and the stage directories it needs."""
        of = [m.unit for m in self.manifests]  # each object's, made once (a million reads at 1,000 tenants)
        units: dict[str, set[str]] = {unit: set() for unit in of}
        lineages: dict[str, set[str]] = {unit: set() for unit in units}
        for i, unit in enumerate(of):
            units[unit].update(of[j] for j in self.needs(i))
            # A unit's objects share most of their ancestors (a tenant's component): each is walked
            # up to the first ancestor already there, whose own ancestors are there with it.
            lineage, node = lineages[unit], self.resources.get(self.manifests[i].origin)
            while node is not None and node.key not in lineage:
                lineage.add(node.key)
                node = node.parent
        by_objects: dict[tuple[int, ...], set[str]] = {}
        for unit, keys in lineages.items():
            for key in keys:
                objects = self.resource_objects(self.resources[key])
                if objects not in by_objects:  # the same objects (a layer's release) stand behind many resources
                    by_objects[objects] = {of[j] for j in objects}
                units[unit].update(by_objects[objects])
        for unit, needed in units.items():
            needed.discard(unit)
        return units

    def kustomizations(self, stack: str) -> list[dict[str, Any]]:
        needs = self.unit_needs()
        order = _dependency_order(needs)
        reach: dict[str, set[str]] = {}
        for unit in order:  # dependencies come first
            reach[unit] = set(needs[unit]).union(*(reach[n] for n in needs[unit]))
        result = []
        for unit in order:
            direct = {n for n in needs[unit] if not any(n in reach[other] for other in needs[unit] if other != n)}
            result.append(flux_kustomization(unit, sorted(kustomization_name(n) for n in direct), stack))
        return result


def _dependency_order(needs: Mapping[str, set[str]]) -> list[str]:
    """Stages with what they need first, ties by name (deterministic); a cycle is refused."""
    order: list[str] = []
    done: set[str] = set()
    pending = dict(needs)
    while pending:
        ready = sorted(u for u, n in pending.items() if n <= done)
        if not ready:
            raise ValueError("the bundle's stages depend on each other in a cycle: " + ", ".join(sorted(pending)))
        for unit in ready:
            order.append(unit)
            done.add(unit)
            del pending[unit]
    return order


def kustomization_name(unit: str) -> str:
    """`manifests/crds` -> `ai-factory-crds`, `manifests/tenants/tenant-a` -> `ai-factory-tenant-a`,
    `manifests/patches/fleet` -> `ai-factory-patches-fleet`."""
    parts = unit.split("/")[1:]
    if parts[0] == "tenants":
        parts = parts[1:]
    return "-".join([KUSTOMIZATION_PREFIX, *parts])


def flux_kustomization(unit: str, depends_on: list[str], stack: str) -> dict[str, Any]:
    patches = unit.startswith(f"manifests/{PATCHES}/")
    spec: dict[str, Any] = {
        "interval": FLUX_INTERVAL,
        "retryInterval": FLUX_RETRY_INTERVAL,
        "timeout": FLUX_TIMEOUT,
        "sourceRef": dict(BUNDLE_SOURCE),
        "path": f"./{unit}",
        # A patch stage never deletes what it patched: neither when an object leaves it nor when
        # the stage itself is deleted.
        "prune": not patches,
        # Health: every object applied must be ready (releases installed with their workloads
        # available, CRDs established) before a stage depending on this one starts.
        "wait": True,
    }
    if patches:
        spec["deletionPolicy"] = "Orphan"
    if depends_on:
        spec["dependsOn"] = [{"name": name} for name in depends_on]
    return {
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1",
        "kind": "Kustomization",
        "metadata": {"name": kustomization_name(unit), "namespace": BUNDLE_NAMESPACE, "labels": recommended_labels("gitops", stack)},
        "spec": spec,
    }


def recommended_labels(layer: str, stack: str) -> dict[str, str]:
    """The Kubernetes recommended labels the bundle adds to what the components set: the layer
    is the application, one per environment (stack)."""
    return {
        "app.kubernetes.io/part-of": "ai-factory",
        "app.kubernetes.io/component": layer,
        "app.kubernetes.io/name": layer,
        "app.kubernetes.io/instance": f"{layer}-{stack}",
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def _label(m: Manifest, stack: str) -> None:
    """Recommended labels on every object the bundle owns, without overriding a component's; a
    patch only sets what the program sets on an object it does not own, plus the annotations
    that keep Flux and Argo CD from deleting or taking it over."""
    metadata = m.obj.setdefault("metadata", {})
    if _is_patch(m.origin):  # `Staging` puts it in the patches stage, whatever the rest needs
        metadata.setdefault("annotations", {}).update(PATCH_ANNOTATIONS)
        return
    labels = metadata.setdefault("labels", {})
    defaults = recommended_labels(m.layer, stack)
    # A component's own application name (prom-label-proxy, ...) names its instance too.
    defaults["app.kubernetes.io/instance"] = f"{labels.get('app.kubernetes.io/name', m.layer)}-{stack}"
    for key, value in defaults.items():
        labels.setdefault(key, value)


def kubernetes_object(resource: Resource) -> dict[str, Any]:
    """The object a Kubernetes resource applies: its inputs, which are already in Kubernetes shape."""
    return _prune(resource.inputs)


REDACTED_ANNOTATION = "ai-factory.io/redacted"


def _mark_redacted(obj: dict[str, Any]) -> None:
    """An object whose secret values were replaced by placeholders must never be applied from the
    bundle over the real one: Flux skips objects with reconcile disabled."""
    annotations = obj.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[REDACTED_ANNOTATION] = "true"
    annotations["kustomize.toolkit.fluxcd.io/reconcile"] = "disabled"


def _prune(value: Any) -> Any:
    """Drop unset (None) fields, as the provider does before sending an object. (Whole numbers
    already came back as integers from the harness.) A copy: the bundle labels its objects."""
    # Scalars are taken as they are without a call each (most of a render's values).
    if isinstance(value, dict):
        return {k: _prune(v) if isinstance(v, (dict, list)) else v for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune(v) if isinstance(v, (dict, list)) else v for v in value]
    return value


def helm_release_manifests(resource: Resource) -> list[Manifest]:
    inputs = resource.inputs
    chart, version, namespace = inputs["chart"], inputs["version"], inputs.get("namespace") or "default"
    release_name = inputs.get("name") or resource.name
    repo = (inputs.get("repositoryOpts") or {}).get("repo")
    meta = {"name": release_name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "ai-factory"}}
    if resource.tenant:
        # A tenant's release carries its tenant label like every other object of the tenant.
        meta["labels"][TENANT_LABEL] = resource.tenant
    if chart.startswith("oci://"):
        source = {
            "apiVersion": "source.toolkit.fluxcd.io/v1",
            "kind": "OCIRepository",
            "metadata": meta,
            "spec": {"interval": FLUX_INTERVAL, "url": chart, "ref": {"tag": version}, "layerSelector": {
                "mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip", "operation": "copy"}},
        }
        chart_spec = {"chartRef": {"kind": "OCIRepository", "name": release_name}}
    else:
        source = {
            "apiVersion": "source.toolkit.fluxcd.io/v1",
            "kind": "HelmRepository",
            "metadata": {**meta, "name": _repository_name(repo)},
            "spec": {"interval": FLUX_INTERVAL, "url": repo},
        }
        chart_spec = {
            "chart": {
                "spec": {
                    "chart": chart,
                    "version": version,
                    "sourceRef": {"kind": "HelmRepository", "name": _repository_name(repo)},
                    "interval": FLUX_INTERVAL,
                }
            }
        }
    release = {
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": meta,
        "spec": {
            "interval": FLUX_INTERVAL,
            "releaseName": release_name,
            **chart_spec,
            "install": {"crds": "CreateReplace"},
            "upgrade": {"crds": "CreateReplace"},
            "values": _prune(inputs.get("values") or {}),
        },
    }
    return [
        Manifest(source, resource.layer, resource.tenant, resource.key),
        Manifest(release, resource.layer, resource.tenant, resource.key),
    ]


def manifest_pin(url: Any) -> ManifestSource | None:
    """The catalog pin of a release manifest's URL, None for any other file."""
    return next((pin for pin in MANIFESTS.values() if pin.url == url), None)


def remote_manifest(pin: ManifestSource) -> dict[str, Any]:
    return {
        "apiVersion": KUSTOMIZE_API,
        "kind": "Kustomization",
        "metadata": {"name": pin.name, "annotations": {PIN_VERSION_ANNOTATION: pin.version, PIN_DIGEST_ANNOTATION: pin.digest}},
        "resources": [pin.url],
    }


def _repository_name(url: str) -> str:
    host = re.sub(r"^https?://", "", url).strip("/")
    return re.sub(r"[^a-z0-9]+", "-", host.lower()).strip("-")[:63]


def inventory_entry(
    resource: Resource,
    files: list[str] | None = None,
    depends_on: dict[tuple[int, ...], list[str]] | None = None,
) -> dict[str, Any]:
    """`bundle`: the files the resource is written to; for what the program configures live
    through a provider (Keycloak groups and clients, OpenBao policies and roles) `NOT_IN_BUNDLE`;
    null for components and providers, which deploy nothing themselves. `depends_on`: the sorted
    keys of dependency lists already seen (by the resources' identities), as every tenant stack
    depends on the same layers."""
    if files:
        bundle: list[str] | str | None = sorted(files)
    elif resource.custom and not resource.type.startswith("pulumi:providers:"):
        bundle = NOT_IN_BUNDLE
    else:
        bundle = None
    return {
        "bundle": bundle,
        "type": resource.type,
        "name": resource.name,
        "parent": resource.parent.key if resource.parent else None,
        "layer": resource.layer,
        "tenant": resource.tenant,
        "custom": resource.custom,
        "protect": resource.protect,
        "retainOnDelete": resource.retain_on_delete,
        "dependsOn": _dependency_keys(resource, depends_on if depends_on is not None else {}),
        "secretInputs": sorted(resource.secret_paths),
    }


def _dependency_keys(resource: Resource, seen: dict[tuple[int, ...], list[str]]) -> list[str]:
    if not resource.dependencies:
        return []
    # The resources are alive in the graph as long as `seen` is used: their identities stay theirs.
    identities = tuple(map(id, resource.dependencies))
    if identities not in seen:
        seen[identities] = sorted(d.key for d in resource.dependencies)
    return list(seen[identities])


# --------------------------------------------------------------------------- reading a rendered tree


def load_rendered(directory: Path) -> Rendered:
    """A rendered directory back into objects, for `factory check <dir>`. A file that is not YAML,
    or a document that is not an object with mapping metadata, is recorded in `unreadable` (and
    left out), so that one bad file is a finding, not a traceback. `kustomization.yaml` files are
    kustomize's build instructions, not objects."""
    unreadable: list[tuple[str, str]] = []
    inventory_path = directory / "inventory.json"
    inventory: Any = {"resources": []}
    if inventory_path.is_file():
        try:
            inventory = json.loads(inventory_path.read_text())
        except (ValueError, UnicodeDecodeError) as err:
            unreadable.append(("inventory.json", f"is not JSON ({err})"))
    resources = inventory.get("resources") if isinstance(inventory, dict) else None
    if not isinstance(resources, list) or not all(isinstance(e, dict) for e in resources):
        unreadable.append(("inventory.json", "is not an object whose 'resources' is a list of objects"))
        inventory, resources = {}, []
    manifests = []
    for path in sorted((directory / "manifests").rglob("*.yaml")):
        relative = str(path.relative_to(directory))
        parts = path.relative_to(directory / "manifests").parts
        if path.name == KUSTOMIZE_FILE:
            if len(parts) == 5 and parts[2] == REMOTE_DIR:
                manifests += [Manifest(obj, parts[1], None, relative, parts[0]) for obj in _objects_in(path, relative, unreadable)]
            continue
        if len(parts) != 4:
            unreadable.append((relative, "is not at manifests/<stage>/<layer>/<namespace or _cluster>/<kind>-<name>.yaml"))
            continue
        for obj in _objects_in(path, relative, unreadable):
            tenant = ((obj.get("metadata") or {}).get("labels") or {}).get("ai-factory.io/tenant")
            manifests.append(Manifest(obj, parts[1], tenant, relative, parts[0]))
    kustomizations = [
        obj
        for path in sorted((directory / "flux").glob("*.yaml"))
        if path.name != KUSTOMIZE_FILE
        for obj in _objects_in(path, str(path.relative_to(directory)), unreadable)
    ]
    version = inventory.get("kubernetesVersion", "1.34") if isinstance(inventory, dict) else "1.34"
    return Rendered(None, str(version), manifests, resources, unreadable=unreadable, kustomizations=kustomizations)


def _objects_in(path: Path, relative: str, unreadable: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The objects of one rendered file; what cannot be read goes to `unreadable`."""
    try:
        documents = list(yaml.load_all(path.read_text(), Loader=LOADER))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        unreadable.append((relative, f"is not YAML ({str(err).splitlines()[0]})"))
        return []
    objects = []
    for index, obj in enumerate(documents):
        if obj is None:
            continue
        problem = _not_an_object(obj)
        if problem:
            unreadable.append((relative, f"document {index + 1} {problem}"))
            continue
        objects.append(obj)
    return objects


def _yaml_type(value: Any) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _not_an_object(obj: Any) -> str | None:
    """Why a YAML document cannot be read as a Kubernetes object, None when it can."""
    if not isinstance(obj, dict):
        return f"is {_yaml_type(obj)}, not a Kubernetes object (a mapping)"
    metadata = obj.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        return f"has metadata that is {_yaml_type(metadata)}, not a mapping"
    if not all(isinstance(obj.get(key, ""), str) for key in ("apiVersion", "kind")):
        return "has an apiVersion or kind that is not a string"
    for key in ("name", "namespace"):
        if not isinstance((metadata or {}).get(key, ""), str):
            return f"has a metadata.{key} that is not a string"
    if not isinstance((metadata or {}).get("labels") or {}, dict):
        return "has metadata.labels that are not a mapping"
    return None
