"""Small stacks for the policy tests: real Pulumi resources registered under the SDK's mocks, as a
platform or a tenant stack would register them, and the policy pack run over them offline."""

from __future__ import annotations

import json
from typing import Any, Callable

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components.tenant_stack import OWNERS_ANNOTATION
from ai_factory.factory.rendering.harness import Graph, run_program
from ai_factory.factory.checking.policies import resources_from_graph, run_policies
from ai_factory.factory.rendering.bundle import Rendered
from ai_factory.factory.model.tenancy import OIDC_PREFIX, TENANT_LABEL, TRUST_DOMAIN_LABEL, TRUST_LABEL

RBAC = "rbac.authorization.k8s.io"
KUEUE = "kueue.x-k8s.io/v1beta2"


def stack(program: Callable[[], None]) -> Graph:
    return run_program(program, project="ai-factory", stack="policy-test")


def all_violations(source: Graph | Rendered, config: dict[str, Any] | None = None) -> dict[str, dict[str, list[str]]]:
    """The messages every policy reports, by policy and resource (`type::name`, or `stack`)."""
    graph = source.graph if isinstance(source, Rendered) else source
    resources, _ = resources_from_graph(graph)
    found: dict[str, dict[str, list[str]]] = {}
    for name, resource, message in run_policies(resources, config or {}):
        ref = f"{resource.resource_type}::{resource.name}" if resource is not None else "stack"
        found.setdefault(name, {}).setdefault(ref, []).append(message)
    return found


def violations(source: Graph | Rendered, policy: str, config: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """The messages one policy reports, by resource."""
    return all_violations(source, config).get(policy, {})


def namespace(
    name: str,
    *,
    tenant: str | None = None,
    trust: str = "high",
    domain: str | None = None,
    level: str | None = "restricted",
    owners: tuple[str, ...] = (),
    annotations: dict[str, str] | None = None,
    **options: Any,
) -> k8s.core.v1.Namespace:
    """A namespace; with `tenant`, labelled and annotated as TenantStack does."""
    labels = {"pod-security.kubernetes.io/enforce": level} if level else {}
    annotations = dict(annotations or {})
    if tenant:
        labels.update({TENANT_LABEL: tenant, TRUST_LABEL: trust, TRUST_DOMAIN_LABEL: domain or tenant})
        annotations[OWNERS_ANNOTATION] = json.dumps([{"kind": "Group", "name": f"{OIDC_PREFIX}{g}"} for g in owners])
    return k8s.core.v1.Namespace(
        f"{name}-namespace",
        metadata={"name": name, "labels": labels, "annotations": annotations or None},
        opts=pulumi.ResourceOptions(**options),
    )


def tenant_labels(tenant: str, trust: str = "high", domain: str | None = None) -> dict[str, str]:
    return {TENANT_LABEL: tenant, TRUST_LABEL: trust, TRUST_DOMAIN_LABEL: domain or tenant}


def group(name: str) -> dict[str, str]:
    return {"kind": "Group", "name": f"{OIDC_PREFIX}{name}", "apiGroup": RBAC}


def role_binding(name: str, ns: str, role: tuple[str, str], subjects: list[dict[str, str]], labels: dict[str, str] | None = None) -> None:
    k8s.rbac.v1.RoleBinding(
        name,
        metadata={"name": name, "namespace": ns, "labels": labels or {}},
        role_ref={"apiGroup": RBAC, "kind": role[0], "name": role[1]},
        subjects=subjects,
    )


def deployment(name: str, ns: str, container: dict[str, Any], pod: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> None:
    k8s.apps.v1.Deployment(
        name,
        metadata={"name": name, "namespace": ns, "labels": labels or {}},
        spec={
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": name, **container}], **(pod or {})}},
        },
    )


def release(name: str, chart: str, ns: str, values: dict[str, Any], *, version: str = "1.0.0", repo: str | None = None, **options: Any) -> None:
    k8s.helm.v3.Release(
        name,
        name=name,
        chart=chart,
        version=version,
        namespace=ns,
        repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=repo) if repo else None,
        values=values,
        opts=pulumi.ResourceOptions(**options),
    )


def custom(name: str, kind: str, spec: dict[str, Any], *, namespace_name: str | None = None, labels=None, annotations=None, api_version: str = KUEUE) -> None:
    metadata: dict[str, Any] = {"name": name, "labels": labels or {}}
    if namespace_name:
        metadata["namespace"] = namespace_name
    if annotations:
        metadata["annotations"] = annotations
    k8s.apiextensions.CustomResource(f"{kind.lower()}-{name}", api_version=api_version, kind=kind, metadata=metadata, spec=spec)


def node(name: str, labels: dict[str, str], taints: list[dict[str, str]] | None = None) -> None:
    k8s.core.v1.NodePatch(
        f"node-{name}",
        metadata={"name": name, "labels": labels},
        spec={"taints": taints} if taints else None,
    )
