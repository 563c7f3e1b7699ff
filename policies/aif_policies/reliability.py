"""Reliability: state survives a destroy or a replacement, and charts install what was reviewed.

Stateful resources (volumes, StatefulSets, CRDs, the charts that hold the platform's state and
the namespaces around them) are protected (`protect=True`) and retained on delete
(`retain_on_delete=True`), and the StorageClasses their volumes use keep volumes on release.
Helm charts come at exact versions from the repositories of the catalog (factory/catalog.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Iterator

from pulumi_policy import PolicyResource

from ai_factory.factory.checking.health import STEP as REMEDIATION_STEP, step_bound_problems, step_settings
from ai_factory.factory.model.catalog import CHARTS
from ai_factory.policies.aif_policies.core import Violation, protected, resource_policy, retain_on_delete, stack_policy
from ai_factory.policies.aif_policies.kube import HELM_TYPES, as_list, as_map, cluster_of, describe, group_of, helm_chart

STATEFUL_KINDS = {
    # kind: API group. Deleting one of these deletes data (CRDs take every custom resource with them).
    "PersistentVolumeClaim": "",
    "PersistentVolume": "",
    "StatefulSet": "apps",
    "CustomResourceDefinition": "apiextensions.k8s.io",
    "Cluster": "postgresql.cnpg.io",
}
STATEFUL_TYPES = {
    # Pulumi resource type: the state it holds. Review any addition.
    "vault:index/mount:Mount": "an OpenBao secrets engine (deleting it deletes every secret in it)",
}
STATEFUL_CHARTS = {
    # chart name: the state it holds. Review any addition.
    "openbao": "OpenBao's integrated Raft storage (every tenant's secrets)",
    "postgresql": "a PostgreSQL database",
}
CREDENTIAL_SECRETS = {
    # chart name: (values path of the Secret holding the credentials of its external state, what it opens).
    # Losing it locks the chart out of its own data. Review any addition.
    "keycloakx": ("database.existingSecret", "Keycloak's database credentials"),
}


def _value(values: Mapping[str, Any], path: str) -> Any:
    node: Any = values
    for part in path.split("."):
        node = as_map(node).get(part)
    return node


def credential_secrets(resources: Sequence[PolicyResource]) -> dict[tuple[str, str], str]:
    """(namespace, name) -> what it opens, of every Secret a chart keeps its state's credentials in."""
    found = {}
    for resource in resources:
        if resource.resource_type in HELM_TYPES:
            chart = helm_chart(resource.resource_type, resource.props)
            path, what = CREDENTIAL_SECRETS.get(chart.chart_name, (None, None))
            name = _value(chart.values, path) if path else None
            if name:
                found[(chart.namespace, str(name))] = what
    return found


def _stateful(resource: PolicyResource, credentials: Mapping[tuple[str, str], str]) -> str | None:
    """What state a resource holds, None if it holds none."""
    if resource.resource_type == "kubernetes:core/v1:Secret":
        metadata = as_map(as_map(resource.props).get("metadata"))
        return credentials.get((str(metadata.get("namespace") or ""), str(metadata.get("name") or "")))
    if resource.resource_type in STATEFUL_TYPES:
        return STATEFUL_TYPES[resource.resource_type]
    if resource.resource_type in HELM_TYPES:
        chart = helm_chart(resource.resource_type, resource.props)
        return STATEFUL_CHARTS.get(chart.chart_name)
    kind = resource.resource_type.rsplit(":", 1)[-1]
    if resource.resource_type.startswith("kubernetes:") and STATEFUL_KINDS.get(kind) == group_of(resource.resource_type):
        return f"a {kind}'s data"
    return None


def _namespace(resource: PolicyResource) -> str | None:
    if resource.resource_type in HELM_TYPES:
        return helm_chart(resource.resource_type, resource.props).namespace
    return as_map(as_map(resource.props).get("metadata")).get("namespace")


def storage_classes(value: Any) -> Iterator[str]:
    """StorageClass names a resource's spec or chart values ask for (`storageClassName`, `storageClass`)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key in ("storageClassName", "storageClass") and isinstance(item, str) and item:
                yield item
            elif key != "metadata":
                yield from storage_classes(item)
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        for item in value:
            yield from storage_classes(item)


def protection_problem(resource: PolicyResource) -> str | None:
    """What is missing for `resource` to survive a destroy: protection (both the pack and the
    offline run see it), or retention once protected (only the offline run sees it)."""
    if protected(resource) is False:
        return "is not protected: pass protect=True, retain_on_delete=True in its resource options"
    if retain_on_delete(resource) is False:
        return "is protected but not retained on delete: pass retain_on_delete=True in its resource options too"
    return None


def check_stateful_resources_protected(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    namespaces = {ns.name: ns for ns in cluster.of("Namespace")}
    classes = {sc.name: sc for sc in cluster.of("StorageClass")}
    holders: dict[str, str] = {}
    used_classes: dict[str, str] = {}
    credentials = credential_secrets(resources)
    for resource in resources:
        state = _stateful(resource, credentials)
        if state is None:
            continue
        name = describe(resource.resource_type, resource.props, resource.name)
        problem = protection_problem(resource)
        if problem:
            yield resource, f"{name} holds {state} but {problem}, so that no destroy, replacement or removal from the program deletes it."
        namespace = _namespace(resource)
        if namespace:
            holders.setdefault(namespace, name)
        source = helm_chart(resource.resource_type, resource.props).values if resource.resource_type in HELM_TYPES else resource.props
        for storage_class in storage_classes(source):
            used_classes.setdefault(storage_class, name)
        if resource.resource_type.endswith(":PersistentVolume"):
            policy = as_map(as_map(resource.props).get("spec")).get("persistentVolumeReclaimPolicy")
            if policy != "Retain":
                yield resource, f"{name} has reclaim policy {policy or 'unset'}: set persistentVolumeReclaimPolicy Retain."
    for namespace, holder in sorted(holders.items()):
        ns = namespaces.get(namespace)
        problem = protection_problem(ns.resource) if ns else None
        if problem:
            yield ns.resource, f"Namespace {namespace} holds {holder} but {problem}: deleting a namespace deletes everything in it."
    for storage_class, user in sorted(used_classes.items()):
        sc = classes.get(storage_class)
        if sc is not None and sc.props.get("reclaimPolicy") != "Retain":
            yield sc.resource, (
                f"StorageClass {storage_class} (used by {user}) has reclaimPolicy {sc.props.get('reclaimPolicy') or 'Delete'}: "
                "volumes of stateful parts must outlive their claims; set reclaimPolicy: Retain."
            )


# --------------------------------------------------------------------------- stateful-high-availability

MIN_REPLICAS = {
    # chart name: (values path, fewest replicas, why). A quorum of 3 survives one loss; 2 survive one restart.
    "openbao": ("server.ha.replicas", 3, "its Raft quorum survives the loss of one member only with 3"),
    "keycloakx": ("replicas", 2, "one replica makes every login wait for its restart"),
}
REQUIRED_VALUES = {
    # chart name: (values path, required value, what it keeps).
    "openbao": (
        ("server.ha.enabled", True, "high availability (Raft across replicas)"),
        ("server.ha.disruptionBudget.enabled", True, "its disruption budget (a drain never takes the quorum)"),
        ("server.dataStorage.enabled", True, "its data volume"),
    ),
}
KEPT_ON_DELETE = {
    # chart name: values path of the StatefulSet's persistentVolumeClaimRetentionPolicy.
    "openbao": "server.persistentVolumeClaimRetentionPolicy",
}


def check_stateful_high_availability(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> Iterator[str]:
    if resource_type not in HELM_TYPES:
        return
    chart = helm_chart(resource_type, props)
    name = describe(resource_type, props)
    if chart.chart_name in MIN_REPLICAS:
        path, fewest, why = MIN_REPLICAS[chart.chart_name]
        replicas = _value(chart.values, path)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < fewest:
            yield f"{name}: {path} is {replicas!r}, fewer than {fewest}: {why}."
    for path, required, what in REQUIRED_VALUES.get(chart.chart_name, ()):
        if _value(chart.values, path) != required:
            yield f"{name}: {path} is {_value(chart.values, path)!r}, not {required!r}: it keeps {what}."
    retention_path = KEPT_ON_DELETE.get(chart.chart_name)
    if retention_path:
        retention = as_map(_value(chart.values, retention_path))
        for when in ("whenDeleted", "whenScaled"):
            if retention.get(when) != "Retain":
                yield f"{name}: {retention_path}.{when} is {retention.get(when)!r}: its volumes must be retained (Retain), or deleting or scaling the StatefulSet deletes the data."


# --------------------------------------------------------------------------- charts-pinned

EXACT_VERSION = re.compile(r"^v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
REPOSITORY_SETTINGS = {
    "additionalRepositories": {
        "type": "array",
        "items": {"type": "string"},
        "default": [],
        "description": "Chart repositories (https:// or oci:// prefixes) allowed besides the catalog's, e.g. an internal mirror.",
    }
}


def known_repositories(config: Mapping[str, Any]) -> set[str]:
    return {c.repository.rstrip("/") for c in CHARTS.values()} | {str(r).rstrip("/") for r in as_list(config.get("additionalRepositories"))}


def check_charts_pinned(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> Iterator[str]:
    if resource_type not in HELM_TYPES:
        return
    chart = helm_chart(resource_type, props)
    name = describe(resource_type, props)
    if not EXACT_VERSION.match(chart.version):
        yield (
            f"{name}: version {chart.version or '(none)'!r} is not an exact chart version; pin one (factory/catalog.py) "
            "so that the same config always installs the same chart."
        )
    if not chart.repository:
        yield f"{name}: chart {chart.chart!r} comes from no repository (a local path?); install published charts from the catalog's repositories."
    elif chart.repository.rstrip("/") not in known_repositories(config):
        yield (
            f"{name}: repository {chart.repository} is not a repository of the catalog (factory/catalog.py); install "
            "charts from their official repositories, or list a mirror in the policy's additionalRepositories setting."
        )


# --------------------------------------------------------------------------- remediation-bounded

NODE_HEALTH_CHECK = "NodeHealthCheck"
NHC_GROUP = "remediation.medik8s.io"
LIMIT = re.compile(r"^(100|[1-9][0-9]?)%$")


def check_remediation_bounded(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> Iterator[str]:
    """A NodeHealthCheck bounds how many nodes remediate at once and how long a remediation may
    take, on a selector of its own; the remediation step's ConfigMap bounds each pool it drains or
    quarantines in (components/health.py, components/_gpu_remediation.py)."""
    if resource_type == "kubernetes:core/v1:ConfigMap" and as_map(props.get("metadata")).get("name") == REMEDIATION_STEP:
        for pool, settings in sorted(step_settings(props.get("data")).items()):
            for problem in step_bound_problems(settings):
                yield f"{describe(resource_type, props)}: pools.json, pool {pool}: {problem}; give each pool its blast radius in nodes."
        return
    if not resource_type.endswith(f":{NODE_HEALTH_CHECK}") or group_of(resource_type) != NHC_GROUP:
        return
    spec = as_map(props.get("spec"))
    name = describe(resource_type, props)
    limit = spec.get("maxUnhealthy")
    if spec.get("minHealthy") is not None:
        yield f"{name}: minHealthy bounds the healthy nodes, not the remediating ones; set maxUnhealthy to the pool's blast radius instead."
    elif limit is None:
        yield f"{name}: no maxUnhealthy: the controller then lets up to half the selected nodes remediate at once; set the pool's blast radius."
    elif not ((isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1) or (isinstance(limit, str) and LIMIT.match(limit))):
        yield f"{name}: maxUnhealthy {limit!r} allows no remediation at all (or is not a count or percentage); a faulty node would stay unremediated."
    if not as_map(spec.get("selector")).get("matchLabels") and not as_list(as_map(spec.get("selector")).get("matchExpressions")):
        yield f"{name}: its selector selects every node (control plane included); select one pool."
    steps = as_list(spec.get("escalatingRemediations"))
    if not steps or any(not as_map(step).get("timeout") for step in steps):
        yield (
            f"{name}: a remediation without escalatingRemediations timeouts never ends; give each step a timeout so a "
            "failed remediation stops and a person is paged."
        )


POLICIES = [
    stack_policy(
        "stateful-resources-protected",
        "Stateful resources and their namespaces are protected and retained on delete; their StorageClasses retain volumes.",
        check_stateful_resources_protected,
    ),
    resource_policy(
        "stateful-high-availability",
        "OpenBao runs 3 Raft replicas with its disruption budget and keeps its volumes; Keycloak runs at least 2 replicas.",
        check_stateful_high_availability,
    ),
    resource_policy(
        "remediation-bounded",
        "Every NodeHealthCheck bounds concurrent remediations (maxUnhealthy), selects a pool, and times out each remediation step; "
        "the remediation step bounds each pool in nodes.",
        check_remediation_bounded,
    ),
    resource_policy(
        "charts-pinned",
        "Every Helm chart is pinned to an exact version from a known repository.",
        check_charts_pinned,
        settings=REPOSITORY_SETTINGS,
    ),
]
