"""Offline render: run the platform program under mocks and turn what it registers into files.

Output layout (stable; the same config gives byte-identical files):

    <out>/manifests/<layer>/<namespace or _cluster>/<kind>-<name>.yaml   one object per file
    <out>/inventory.json                                                  every Pulumi resource

Every Helm release becomes a Flux `HelmRelease` plus its source (`HelmRepository`, or
`OCIRepository` for OCI charts) in the release's namespace, so `<out>/manifests` is a GitOps
bundle Flux can reconcile. Secret values never reach the files: the harness has already replaced
them by `[secret]`.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.rendering.harness import Graph, RecordingMocks, RecordingMonitor, Resource, run_program
from ai_factory.factory.model.tenancy import TENANT_LABEL
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.model.loading import read_stack_file, stack_file, stack_name, stack_project, validate, with_registered_tenants

FLUX_INTERVAL = "1h"
HELM_RELEASE_TYPES = ("kubernetes:helm.sh/v3:Release", "kubernetes:helm.sh/v4:Chart")
NON_OBJECT_TYPES = ("pulumi:providers:", "kubernetes:yaml/", "kubernetes:helm.sh/")


@dataclass
class Manifest:
    obj: dict[str, Any]
    layer: str
    tenant: str | None
    origin: str
    """The Pulumi resource the object comes from (`type::name`)."""

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
    def path(self) -> str:
        folder = self.namespace or "_cluster"
        return f"manifests/{self.layer}/{folder}/{self.kind.lower()}-{self.name}.yaml"

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

    def files(self) -> dict[str, str]:
        files = {m.path: dump_yaml(m.obj) for m in self.manifests}
        files["inventory.json"] = json.dumps(
            {"kubernetesVersion": self.kubernetes_version, "resources": self.inventory}, indent=2, sort_keys=True
        ) + "\n"
        return files

    def write(self, out: Path, on_file: Callable[[], None] | None = None) -> None:
        """`on_file`: called once per file written (progress)."""
        if out.exists():
            shutil.rmtree(out)
        for relative, text in sorted(self.files().items()):
            target = out / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            if on_file is not None:
                on_file()

    def summary(self) -> str:
        by_layer: dict[str, int] = {}
        by_tenant: dict[str, int] = {}
        for m in self.manifests:
            by_layer[m.layer] = by_layer.get(m.layer, 0) + 1
            if m.tenant:
                by_tenant[m.tenant] = by_tenant.get(m.tenant, 0) + 1
        lines = [f"{len(self.manifests)} objects, {len(self.inventory)} Pulumi resources"]
        lines += [f"  layer {layer:<24} {n:>5} objects" for layer, n in sorted(by_layer.items())]
        lines += [f"  tenant {tenant:<23} {n:>5} objects" for tenant, n in sorted(by_tenant.items())]
        return "\n".join(lines)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (configs embedded in Helm values: mig-parted, device plugin) as `|` blocks,
    readable in review; PyYAML falls back to quoting where a block cannot hold the string."""


_Dumper.add_representer(
    str, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)
)


def dump_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=True, default_flow_style=False, allow_unicode=True, width=120)


# --------------------------------------------------------------------------- running the program


def render_env(env: str, on_resource: Callable[[], None] | None = None) -> Rendered:
    """Validate the environment's stack file (failing before anything is registered), then run the
    platform program exactly as `pulumi up` would, with the stack's config seeded into the runtime.

    `env` is an environment name (`Pulumi.<env>.yaml` of the project) or a stack file's path;
    `on_resource` is called once per resource the program registers (progress)."""
    path = stack_file(env)
    raw, secret_sections = read_stack_file(path)
    # The program adds the registered tenants itself, as under `pulumi up`; validated with them here.
    cfg = validate(with_registered_tenants(raw, stack_name(path), path.resolve().parent), source=str(path))
    plan_for(cfg)  # demands that do not fit are reported here, before anything is registered
    return render_raw(raw, secret_sections, cfg, stack=stack_name(path), project=stack_project(path), on_resource=on_resource)


def render_raw(
    raw: dict[str, Any],
    secret_sections: set[str],
    cfg: FactoryConfig,
    stack: str,
    plan: Plan | None = None,
    project: str = "ai-factory",
    on_resource: Callable[[], None] | None = None,
) -> Rendered:
    """`plan`: deploy this plan instead of planning from the stack's recorded one (see `program.main`).
    `project`: the Pulumi project the program runs in, whose name is the config namespace."""
    from ai_factory.factory.rendering.program import main

    config = {f"{project}:{section}": json.dumps(value, default=_placeholder) for section, value in raw.items()}
    graph = run_program(
        functools.partial(main, plan, with_tenant_stacks=True),
        project=project,
        stack=stack,
        config=config,
        secret_keys=[f"{project}:{s}" for s in secret_sections],
        monitor=RecordingMonitor(RecordingMocks(), on_record=on_resource),
    )
    return from_graph(graph, cfg)


def _placeholder(value: Any) -> str:
    from ai_factory.factory.model.secrets import SecretValue

    if isinstance(value, SecretValue):
        return value.reveal()  # offline placeholders carry no secret; this is what pulumi up decrypts
    raise TypeError(f"cannot serialise {type(value).__name__}")


def from_graph(graph: Graph, cfg: FactoryConfig) -> Rendered:
    manifests: list[Manifest] = []
    for resource in graph.resources:
        if resource.type in HELM_RELEASE_TYPES:
            manifests += helm_release_manifests(resource)
        elif resource.type.startswith("kubernetes:") and not resource.type.startswith(NON_OBJECT_TYPES):
            obj = kubernetes_object(resource)
            if resource.secret_paths:
                _mark_redacted(obj)
            manifests.append(Manifest(obj, resource.layer, resource.tenant, resource.key))
    manifests.sort(key=lambda m: m.path)
    seen: dict[str, str] = {}
    for m in manifests:
        if m.path in seen:
            raise ValueError(f"{m.ref} is produced twice ({seen[m.path]} and {m.origin})")
        seen[m.path] = m.origin
    inventory = sorted((inventory_entry(r) for r in graph.resources), key=lambda e: (e["layer"], e["type"], e["name"]))
    return Rendered(cfg, cfg.kubernetes.version, manifests, inventory, graph)


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
    already came back as integers from the harness.)"""
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune(v) for v in value]
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


def _repository_name(url: str) -> str:
    host = re.sub(r"^https?://", "", url).strip("/")
    return re.sub(r"[^a-z0-9]+", "-", host.lower()).strip("-")[:63]


def inventory_entry(resource: Resource) -> dict[str, Any]:
    return {
        "type": resource.type,
        "name": resource.name,
        "parent": resource.parent.key if resource.parent else None,
        "layer": resource.layer,
        "tenant": resource.tenant,
        "custom": resource.custom,
        "protect": resource.protect,
        "retainOnDelete": resource.retain_on_delete,
        "dependsOn": sorted(d.key for d in resource.dependencies),
        "secretInputs": sorted(resource.secret_paths),
    }


# --------------------------------------------------------------------------- reading a rendered tree


SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it (ten times faster on a large bundle)."""


def load_rendered(directory: Path) -> Rendered:
    """A rendered directory back into objects, for `factory check <dir>`. A file that is not YAML,
    or a document that is not an object with mapping metadata, is recorded in `unreadable` (and
    left out), so that one bad file is a finding, not a traceback."""
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
        layer = path.relative_to(directory / "manifests").parts[0]
        try:
            documents = list(yaml.load_all(path.read_text(), Loader=SAFE_LOADER))
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            unreadable.append((relative, f"is not YAML ({str(err).splitlines()[0]})"))
            continue
        for index, obj in enumerate(documents):
            if obj is None:
                continue
            problem = _not_an_object(obj)
            if problem:
                unreadable.append((relative, f"document {index + 1} {problem}"))
                continue
            tenant = ((obj.get("metadata") or {}).get("labels") or {}).get("ai-factory.io/tenant")
            manifests.append(Manifest(obj, layer, tenant, relative))
    version = inventory.get("kubernetesVersion", "1.34") if isinstance(inventory, dict) else "1.34"
    return Rendered(None, str(version), manifests, resources, unreadable=unreadable)


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
