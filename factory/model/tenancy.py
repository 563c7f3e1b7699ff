"""The names one tenant is known by across every layer, derived once from the tenant model.

Layers meet through this typed object (`TenantNames`), never by re-typing a naming rule: the
tenant stack creates the namespace and bindings, the scheduling layer selects the namespace and
names the queues, identity, secrets, serving and billing attach to the same names.
"""

from __future__ import annotations

from dataclasses import dataclass

from ai_factory.factory.model.config import Tenant

LABEL_PREFIX = "ai-factory.io"
TENANT_LABEL = f"{LABEL_PREFIX}/tenant"
TRUST_LABEL = f"{LABEL_PREFIX}/trust"
TRUST_DOMAIN_LABEL = f"{LABEL_PREFIX}/trust-domain"
SERVES_TENANT_LABEL = f"{LABEL_PREFIX}/serves-tenant"
"""On a platform object that exists for one tenant only (its metrics query proxy, ...): the tenant
does not own it (no `ai-factory.io/tenant`), but it goes with the tenant."""
DEFAULT_CONTAINER_REQUEST = {"cpu": "100m", "memory": "512Mi", "ephemeral-storage": "1Gi"}
DEFAULT_CONTAINER_LIMIT = {"memory": "512Mi", "ephemeral-storage": "4Gi"}
"""The tenant namespace's LimitRange defaults for containers that set none: the memory limit equals
the request (no overcommit of memory); no default CPU limit (throttling hurts data loaders more
than it protects). Serving counts them for the containers KServe's presets leave unset."""
OIDC_PREFIX = "oidc:"
"""API servers run with `--oidc-username-prefix=oidc:` and `--oidc-groups-prefix=oidc:`, so no
identity-provider group can ever be taken for a Kubernetes group such as `system:masters`."""


@dataclass(frozen=True)
class TenantNames:
    tenant: str
    trust: str
    trust_domain: str
    control_plane: str
    """`namespace` or `vcluster`."""
    namespace: str
    """The tenant's namespace on the host cluster (its workloads, or its vCluster and synced pods)."""
    group_subjects: tuple[str, ...]
    """RBAC group subjects of the tenant's owners, with the OIDC prefix."""
    user_subjects: tuple[str, ...]
    cluster_queue: str
    local_queue: str
    """Name of the LocalQueue in `namespace` that every workload of the tenant must name."""

    @property
    def labels(self) -> dict[str, str]:
        """Labels every object of the tenant carries."""
        return {TENANT_LABEL: self.tenant, TRUST_LABEL: self.trust, TRUST_DOMAIN_LABEL: self.trust_domain}


def tenant_names(tenant: Tenant) -> TenantNames:
    return TenantNames(
        tenant=tenant.name,
        trust=tenant.trust,
        trust_domain=tenant.domain,
        control_plane=tenant.control_plane,
        namespace=f"tenant-{tenant.name}",
        group_subjects=tuple(f"{OIDC_PREFIX}{g}" for g in tenant.owners.groups),
        user_subjects=tuple(f"{OIDC_PREFIX}{u}" for u in tenant.owners.users),
        cluster_queue=f"tenant-{tenant.name}",
        local_queue="default",
    )
