"""The CrossGuard pack, run offline: `factory check` applies the policies of `policies/` to the
rendered resource graph, so review needs no Pulumi CLI.

Each registered resource becomes what the engine would hand the pack: resource policies get its
inputs and options, stack policies get every resource linked to its parent and dependencies. The
options carry `retain_on_delete` as well, which CrossGuard itself does not pass to policies, so the
offline run checks retention where `pulumi preview --policy-pack policies` can only check
`protect`. A finding is the policy's name and the very message the pack reports, against the
resource it names (`type::name`, the tail of its URN) or the stack.

Configuration is the pack's: `policies/config.<stack>.json`, the file `pulumi preview
--policy-pack-config` takes, when it exists (its `enforcementLevel: disabled` turns a policy off).

From a rendered directory (no in-process graph) the resources are rebuilt from the manifests (a
Flux HelmRelease and its source become the Helm release) and linked to `inventory.json` for their
options, parent and dependencies where an object matches its entry (same type and layer, and its
name is in the resource name); options of an object that matches no entry are unknown, and the
checks on them (`stateful-resources-protected`) skip it. `factory check <env>` is exact.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable

from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

from ai_factory.factory.checking.findings import Finding, is_tenant_local, tenant_local
from ai_factory.factory.rendering.charts import CHART_ORIGIN
from ai_factory.factory.rendering.harness import Graph
from ai_factory.factory.model.loading import project_dir
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.checking.unknowns import lazy_unknown_checking_proxy
from ai_factory.factory.heap import no_cycle_collection
from ai_factory.factory.rendering.bundle import Manifest, Rendered
from ai_factory.policies.aif_policies import PACK_NAME, POLICIES
from ai_factory.policies.aif_policies.kube import HELM_RELEASE, as_map

POLICY_DIR = "policies"
"""The pack's folder in the user's project, holding `config.<stack>.json`."""
STACK_REF = "stack"
"""What a finding names when a stack policy reports against no resource."""


class OfflineOptions(PolicyResourceOptions):
    """CrossGuard's resource options plus `retain_on_delete`, which the engine does not pass."""

    def __init__(self, protect: bool | None, retain_on_delete: bool | None, parent: str | None):
        super().__init__(protect, [], None, [], PolicyCustomTimeouts(0, 0, 0), [], parent)
        self.retain_on_delete = retain_on_delete


def policy_config(stack: str | None, directory: Path | None = None) -> dict[str, dict[str, Any]]:
    """The pack configuration of a stack (`policies/config.<stack>.json` of the project), empty when there is none."""
    path = (directory or project_dir() / POLICY_DIR) / f"config.{stack}.json"
    if stack is None or not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    # Like the CLI, accept `"policy": "advisory"` as well as `"policy": {"enforcementLevel": ..., ...}`,
    # and `"all"` for every policy.
    return {name: ({"enforcementLevel": value} if isinstance(value, str) else dict(value)) for name, value in raw.items()}


# --------------------------------------------------------------------------- resources


def _link(resources: list[PolicyResource], parents: dict[str, str | None], dependencies: dict[str, list[str]]) -> list[PolicyResource]:
    by_urn = {r.urn: r for r in resources}
    for r in resources:
        parent = parents.get(r.urn)
        r.parent = by_urn.get(parent) if parent else None
        r.dependencies = [by_urn[d] for d in dependencies.get(r.urn, []) if d in by_urn]
    return resources


def resources_from_graph(graph: Graph) -> tuple[list[PolicyResource], dict[str, str | None]]:
    """Every registered resource as CrossGuard sees it, and the tenant of each (by URN)."""
    resources = [
        PolicyResource(
            r.type,
            lazy_unknown_checking_proxy(r.inputs),
            r.urn,
            r.name,
            OfflineOptions(r.protect, r.retain_on_delete, r.parent_urn or None),
            None,
            None,
            [],
            {},
        )
        for r in graph.resources
    ]
    parents = {r.urn: r.parent_urn or None for r in graph.resources}
    dependencies = {r.urn: list(r.dependency_urns) for r in graph.resources}
    return _link(resources, parents, dependencies), {r.urn: r.tenant for r in graph.resources}


def _resource_types(obj: Mapping[str, Any]) -> tuple[str, str]:
    """The resource types an object may come from: the object itself, or a patch of it."""
    api_version, kind = str(obj.get("apiVersion") or ""), str(obj.get("kind") or "")
    group_version = api_version if "/" in api_version else f"core/{api_version}"
    return f"kubernetes:{group_version}:{kind}", f"kubernetes:{group_version}:{kind}Patch"


def _release_props(release: Manifest, sources: dict[tuple[str | None, str], Mapping[str, Any]]) -> dict[str, Any]:
    """The `helm.v3.Release` inputs a Flux HelmRelease was rendered from (malformed parts, which the
    schema check reports, read as absent)."""
    spec = as_map(release.obj.get("spec"))
    props: dict[str, Any] = {"name": spec.get("releaseName") or release.name, "namespace": release.namespace, "values": as_map(spec.get("values"))}

    def source_of(reference: Any) -> Mapping[str, Any]:
        name = as_map(reference).get("name")
        return as_map(as_map(sources.get((release.namespace, name)) if isinstance(name, str) else None).get("spec"))

    if "chartRef" in spec:
        source = source_of(spec["chartRef"])
        props.update(chart=source.get("url", ""), version=as_map(source.get("ref")).get("tag", ""))
    else:
        chart = as_map(as_map(spec.get("chart")).get("spec"))
        source = source_of(chart.get("sourceRef"))
        props.update(chart=chart.get("chart", ""), version=chart.get("version", ""), repositoryOpts={"repo": source.get("url", "")})
    return props


def resources_from_directory(rendered: Rendered) -> tuple[list[PolicyResource], dict[str, str | None]]:
    """The resources of a rendered directory: components and providers from the inventory,
    Kubernetes objects and Helm releases from the manifests, matched to their inventory entries."""
    entries = {f"{e['type']}::{e['name']}": e for e in rendered.inventory}
    sources = {(m.namespace, m.name): m.obj for m in rendered.manifests if m.kind in ("HelmRepository", "OCIRepository")}
    unmatched = dict(entries)
    built: list[tuple[str, str, dict[str, Any], dict[str, Any] | None, str | None]] = []
    for m in rendered.manifests:
        if m.kind in ("HelmRepository", "OCIRepository") or m.origin.startswith(CHART_ORIGIN):
            continue  # a chart's objects are inside its release, the one resource the pack sees
        if m.kind == "HelmRelease":
            types, props = (HELM_RELEASE,), _release_props(m, sources)
        else:
            types, props = _resource_types(m.obj), m.obj
        entry = _match(types, m, str(props.get("name") or "") if m.kind == "HelmRelease" else m.name, unmatched)
        resource_type, name = (entry["type"], entry["name"]) if entry else (types[0], m.name)
        built.append((resource_type, name, props, entry, m.tenant))
    for entry in unmatched.values():
        if not entry["type"].startswith("kubernetes:"):  # components and providers: no manifest of their own
            built.append((entry["type"], entry["name"], {}, entry, entry.get("tenant")))
    resources, parents, dependencies, tenants = [], {}, {}, {}
    for resource_type, name, props, entry, tenant in built:
        urn = f"{resource_type}::{name}"
        protect = entry["protect"] if entry else None
        retain = entry["retainOnDelete"] if entry else None
        parent = entry["parent"] if entry else None
        resources.append(PolicyResource(resource_type, lazy_unknown_checking_proxy(props), urn, name, OfflineOptions(protect, retain, parent), None, None, [], {}))
        parents[urn] = parent
        dependencies[urn] = list(entry["dependsOn"]) if entry else []
        tenants[urn] = tenant
    return _link(resources, parents, dependencies), tenants


def _match(types: tuple[str, ...], manifest: Manifest, name: str, unmatched: dict[str, dict]) -> dict | None:
    """The inventory entry a manifest comes from: the one of its type named like the object, else
    the only one of its type in its layer, else the only one of those whose name contains the
    object's; None when that is still ambiguous."""
    for resource_type in types:
        exact = unmatched.pop(f"{resource_type}::{name}", None)
        if exact is not None:
            return exact
    candidates = [k for k, e in unmatched.items() if e["type"] in types and e["layer"] == manifest.layer]
    if len(candidates) > 1:
        candidates = [k for k in candidates if name in unmatched[k]["name"]]
    return unmatched.pop(candidates[0]) if len(candidates) == 1 else None


# --------------------------------------------------------------------------- running the pack


POLICY_KINDS = (ResourceValidationPolicy, StackValidationPolicy)


def run_policies(
    resources: list[PolicyResource],
    config: Mapping[str, Mapping[str, Any]],
    kinds: tuple[type, ...] = POLICY_KINDS,
    which: Callable[[ResourceValidationPolicy | StackValidationPolicy], bool] = lambda policy: True,
) -> list[tuple[str, PolicyResource | None, str]]:
    """(policy name, resource or None for the stack, message) for every violation of the policies
    of these `kinds` (and `which` selects), in the words the pack reports them."""
    violations: list[tuple[str, PolicyResource | None, str]] = []
    by_urn = {r.urn: r for r in resources}
    for policy in (p for p in POLICIES if isinstance(p, kinds) and which(p)):
        given = dict(config.get(policy.name) or {})
        level = given.pop("enforcementLevel", (config.get("all") or {}).get("enforcementLevel"))
        if level == EnforcementLevel.DISABLED.value:
            continue
        if isinstance(policy, ResourceValidationPolicy):
            for r in resources:
                args = ResourceValidationArgs(r.resource_type, r.props, r.urn, r.name, r.opts, None, given)
                _validate(policy, args, lambda message, _urn=None, r=r: violations.append((policy.name, r, message)))
        elif isinstance(policy, StackValidationPolicy):
            args = StackValidationArgs(resources, given)
            _validate(policy, args, lambda message, urn=None: violations.append((policy.name, by_urn.get(urn or ""), message)))
    return violations


SDK_PACK_VERSION = "0.0.1"
"""The version pulumi-policy's `PolicyPack` reports in its own messages (the CLI shows PulumiPolicy.yaml's)."""


def _validate(policy: ResourceValidationPolicy | StackValidationPolicy, args: Any, report: Any) -> None:
    try:
        policy.validate(args, report)
    except UnknownValueError as error:  # a value a preview cannot know: the pack's own words
        report(f"can't run policy '{policy.name}' from policy pack '{PACK_NAME}@v{SDK_PACK_VERSION}' during preview: {error.message}")


def _stack_of(graph: Graph | None) -> str | None:
    """The stack a graph was rendered for (its URNs say `urn:pulumi:<stack>::...`)."""
    urn = graph.resources[0].urn if graph and graph.resources else ""
    return urn.removeprefix("urn:pulumi:").split("::", 1)[0] if urn.startswith("urn:pulumi:") else None


_shared: tuple[Rendered, list[tuple[list[PolicyResource], dict[str, str | None]]]] | None = None


@contextmanager
def shared(rendered: Rendered) -> Iterator[None]:
    """The pack's checks run in this block over `rendered` share its resources as CrossGuard sees
    them (`run_checks`: the resource policies, the tenant-local stack policies and the others are
    three checks, and building the resources is most of their time); a part's are not kept."""
    global _shared
    outer, _shared = _shared, (rendered, [])
    try:
        yield
    finally:
        _shared = outer


def _resources(rendered: Rendered) -> tuple[list[PolicyResource], dict[str, str | None]]:
    """The render's resources as CrossGuard sees them, and the tenant of each (by URN)."""
    kept = _shared[1] if _shared is not None and _shared[0] is rendered else None
    if kept:
        return kept[0]
    found = resources_from_graph(rendered.graph) if rendered.graph is not None else resources_from_directory(rendered)
    if kept is not None:
        kept.append(found)
    return found


def policies(
    rendered: Rendered, oracles: Oracles, kinds: tuple[type, ...] = POLICY_KINDS, which: Callable[[Any], bool] = lambda policy: True
) -> Iterable[Finding]:
    """The CrossGuard pack (`policies/`) over the rendered resource graph; a finding is named after
    the policy and says what the pack says."""
    # Reference counting frees the resources, their proxies and the stack's index (a proxy knows
    # its path, not its parent); the collector's passes over them as they grew were a quarter of
    # the stack policies' time at 1,000 tenants. They join the settled heap for the later checks.
    with no_cycle_collection(settle=True):
        resources, tenants = _resources(rendered)
        violations = run_policies(resources, policy_config(_stack_of(rendered.graph)), kinds, which)
    for policy_name, resource, message in violations:
        ref = f"{resource.resource_type}::{resource.name}" if resource is not None else STACK_REF
        tenant = tenants.get(resource.urn) if resource is not None else None
        yield Finding(policy_name, ref, message, (tenant,) if tenant else ())


def resource_policies(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """The pack's resource policies: each sees one resource, its inputs and options."""
    return policies(rendered, oracles, (ResourceValidationPolicy,))


def stack_policies(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """The pack's stack policies that read across tenants: each sees every resource of the stack."""
    return policies(rendered, oracles, (StackValidationPolicy,), lambda policy: not is_tenant_local(policy))


@tenant_local
def tenant_stack_policies(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    """The pack's tenant-local stack policies (`core.stack_policy(tenant_local=True)`): each sees
    every resource of the stack, and finds over it what it finds over each tenant's view."""
    return policies(rendered, oracles, (StackValidationPolicy,), is_tenant_local)


def pack_config(rendered: Rendered) -> dict[str, dict[str, Any]]:
    """The pack configuration the policies of this render run with."""
    return policy_config(_stack_of(rendered.graph))
