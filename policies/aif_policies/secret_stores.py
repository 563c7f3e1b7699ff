"""Secret delivery stays per tenant: a tenant's `SecretStore` logs in to OpenBao with that
tenant's role (the role of its namespace, `components.external_secrets`), with a service account
of its own namespace; no `ClusterExternalSecret` copies a secret into more than one tenant's
namespaces; and the External Secrets Operator keeps its cluster-wide kinds off.

References: shared/reference/security-and-reliability.md (section 6.3; check 41 of its last section).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Iterator

from pulumi_policy import PolicyResource

from ai_factory.components.external_secrets import CLUSTER_WIDE_KINDS
from ai_factory.factory.checking import secrets as secret_checks
from ai_factory.policies.aif_policies.core import Violation, stack_policy
from ai_factory.policies.aif_policies.kube import Cluster, as_list, as_map, chart_named, selects, cluster_of


def selected_tenants(cluster: Cluster, spec: Mapping[str, Any]) -> set[str]:
    """The tenants whose namespaces a `ClusterExternalSecret` writes to (its namespace list and
    label selectors, the deprecated single selector included)."""
    selectors = [as_map(s) for s in as_list(spec.get("namespaceSelectors"))]
    if "namespaceSelector" in spec:
        selectors.append(as_map(spec.get("namespaceSelector")))
    names = {str(n) for n in as_list(spec.get("namespaces"))}
    chosen = {ns for ns, labels in cluster.namespace_labels.items() if ns in names or any(selects(s, {**labels, "kubernetes.io/metadata.name": ns}) for s in selectors)}
    return {cluster.namespace_tenant[ns] for ns in chosen if ns in cluster.namespace_tenant}


def check_tenant_secret_stores_scoped(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    for copier in cluster.of("ClusterExternalSecret"):
        tenants = sorted(selected_tenants(cluster, copier.spec))
        if len(tenants) > 1:
            yield copier.resource, (
                f"{copier.describe()} writes its secret into the namespaces of tenants {', '.join(tenants)}: one tenant's "
                "secret reaches another; deliver secrets with each tenant's own SecretStore and ExternalSecret."
            )
    for store in cluster.of("ClusterSecretStore"):
        yield store.resource, f"{store.describe()} is a cluster-wide store: any namespace's ExternalSecret can read through it; tenants have SecretStores of their own."
    for external in cluster.of("ExternalSecret"):
        tenant = cluster.tenant_of_namespace(external.namespace)
        if tenant is None:
            continue
        ref = as_map(external.spec.get("secretStoreRef"))
        if ref.get("kind", "SecretStore") != "SecretStore":
            yield external.resource, f"{external.describe()} of tenant {tenant.name} reads through a {ref.get('kind')}, not its namespace's SecretStore."
        prefix = f"tenants/{tenant.name}/"
        keys = [as_map(as_map(d).get("remoteRef")).get("key") for d in as_list(external.spec.get("data"))]
        keys += [as_map(as_map(d).get("extract")).get("key") for d in as_list(external.spec.get("dataFrom"))]
        for key in sorted({str(k) for k in keys if k is not None and not str(k).startswith(prefix)}):
            yield external.resource, f"{external.describe()} of tenant {tenant.name} reads {key}, outside its prefix {prefix} in OpenBao."
    for store in cluster.of("SecretStore"):
        tenant = cluster.tenant_of_namespace(store.namespace)
        if tenant is None:
            continue
        kubernetes = as_map(as_map(as_map(as_map(store.spec.get("provider")).get("vault")).get("auth")).get("kubernetes"))
        role = kubernetes.get("role")
        if role != store.namespace:
            yield store.resource, (
                f"{store.describe()} of tenant {tenant.name} logs in to OpenBao as role {role!r}, not its own ({store.namespace}): "
                "it would read what that role may read."
            )
        account_namespace = as_map(kubernetes.get("serviceAccountRef")).get("namespace")
        if account_namespace not in (None, store.namespace):
            yield store.resource, f"{store.describe()} of tenant {tenant.name} logs in with a service account of namespace {account_namespace}."
    for release, chart in chart_named(resources, "external-secrets"):
        values = chart.values
        switched_on = [key for key in ("processClusterStore", "processClusterExternalSecret") if values.get(key) is not False]
        switched_on += [f"crds.create{kind}" for kind in CLUSTER_WIDE_KINDS if as_map(values.get("crds")).get(f"create{kind}") is not False]
        if switched_on:
            yield release, (
                f"Helm release {chart.namespace}/{chart.name} (External Secrets) turns on {', '.join(switched_on)}: cluster-wide "
                "stores and copies reach every tenant's namespace; keep them off."
            )


def check_openbao_roles_scoped(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    of_type = lambda t: [r for r in resources if r.resource_type == t]  # noqa: E731
    mounts = [str(r.props.get("path")) for r in of_type(secret_checks.AUTH_BACKEND) if r.props.get("type") == "kubernetes"]
    engines = [str(r.props.get("path")) for r in of_type("vault:index/mount:Mount") if r.props.get("type") == "kv"]
    roles = {f"OpenBao role {r.name}": r for r in of_type(secret_checks.ROLE)}
    grants = [secret_checks.grant(ref, r.props) for ref, r in roles.items()]
    policies = {str(r.props.get("name")): str(r.props.get("policy") or "") for r in of_type(secret_checks.POLICY)}
    stores = {store.describe(): store for store in cluster.of("SecretStore")}
    mount_paths = [
        (ref, as_map(as_map(as_map(as_map(store.spec.get("provider")).get("vault")).get("auth")).get("kubernetes")).get("mountPath"))
        for ref, store in stores.items()
    ]
    for ref, why in secret_checks.scope_problems(mounts, grants, policies, engines[0] if len(engines) == 1 else None, cluster.namespace_tenant, mount_paths):
        yield (roles[ref] if ref in roles else stores[ref].resource), f"{ref}: {why}."


POLICIES = [
    stack_policy(
        "tenant-secret-stores-scoped",
        "Each tenant's SecretStore uses its own OpenBao role and service account; no ClusterExternalSecret spans "
        "tenants; the External Secrets Operator serves no cluster-wide kind.",
        check_tenant_secret_stores_scoped,
        tenant_local=True,
    ),
    stack_policy(
        "openbao-roles-scoped",
        "Every OpenBao role and SecretStore of a stack is on the auth mount the stack's cluster owns; a tenant's role "
        "reads its tenant's prefix only, a platform role no tenant's secrets and, for one cluster of several, only "
        "that cluster's prefix (clusters/<cluster>/): no cluster reads another's kubeconfigs or secrets.",
        check_openbao_roles_scoped,
    ),
]
