"""OpenBao roles read their own paths only: a tenant's role its tenant's prefix, a platform role
(MultiKueue's, LiteLLM's, the BMC store's) no tenant's secrets and, in a multi-cluster
environment, only its own cluster's prefix `clusters/<cluster>/` (the manager's kubeconfigs of
its workers among them). Every role and every SecretStore of a stack logs in at the Kubernetes
auth mount that stack's OpenBao layer creates (`kubernetes`, or `kubernetes-<cluster>` for one
cluster of several): a token of one cluster never logs in as another cluster's role.

`scope_problems` is the rule; `factory check` runs it on the rendered graph (`openbao_role_scope`,
the external-secrets layer's check) and the CrossGuard pack on the stack's resources
(`policies/aif_policies/secret_stores.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

from ai_factory.factory.checking.findings import Finding

AUTH_BACKEND = "vault:index/authBackend:AuthBackend"
POLICY = "vault:index/policy:Policy"
ROLE = "vault:kubernetes/authBackendRole:AuthBackendRole"
PATH = re.compile(r'path\s+"([^"]*)"')
TENANTS_PREFIX = "tenants/"


@dataclass(frozen=True)
class Grant:
    """One Kubernetes-auth role, as the stack declares it."""

    ref: str
    mount: str
    role: str
    namespaces: tuple[str, ...]
    policies: tuple[str, ...]


def grant(ref: str, inputs: Mapping[str, Any]) -> Grant:
    return Grant(
        ref,
        str(inputs.get("backend") or ""),
        str(inputs.get("roleName") or ""),
        tuple(str(n) for n in inputs.get("boundServiceAccountNamespaces") or ()),
        tuple(str(p) for p in inputs.get("tokenPolicies") or ()),
    )


def mount_cluster(mount: str) -> str | None:
    """The cluster whose own auth mount `mount` is (`kubernetes-<cluster>`), None for `kubernetes`."""
    from ai_factory.components.openbao import KUBERNETES_AUTH_PATH

    return mount.removeprefix(f"{KUBERNETES_AUTH_PATH}-") if mount.startswith(f"{KUBERNETES_AUTH_PATH}-") else None


def scope_problems(
    mounts: Iterable[str],
    grants: Iterable[Grant],
    policies: Mapping[str, str],
    kv_mount: str | None,
    tenant_of_namespace: Mapping[str, str],
    stores: Iterable[tuple[str, str | None]] = (),
) -> Iterator[tuple[str, str]]:
    """(ref, why) for each role or store reaching beyond its own paths or cluster.

    `mounts`: the auth mounts the stack's OpenBao layer creates (none: the stack configures no
    OpenBao, and mounts are not judged); `policies`: policy name -> HCL; `stores`: (ref, mountPath)
    of each SecretStore; `kv_mount`: the KV engine's path (None: whichever a path names)."""
    own = set(mounts)
    clusters = {mount_cluster(m) for m in own}
    for ref, mount in stores:
        if own and mount not in own:
            yield ref, f"logs in at OpenBao auth mount {mount!r}, not its cluster's own ({', '.join(sorted(own))}): it would log in as another cluster's role"
    for g in grants:
        if own and g.mount not in own:
            yield g.ref, f"role {g.role!r} is on auth mount {g.mount!r}, not its cluster's own ({', '.join(sorted(own))})"
        tenants = sorted({tenant_of_namespace[n] for n in g.namespaces if n in tenant_of_namespace})
        cluster = mount_cluster(g.mount) if g.mount in own or not own else None
        for name in g.policies:
            if name not in policies:
                yield g.ref, f"role {g.role!r} grants policy {name!r}, which this stack does not define: what it reads cannot be checked"
                continue
            for path in PATH.findall(policies[name]):
                if why := _outside(path, kv_mount, tenants, cluster, len(clusters - {None}) > 0):
                    yield g.ref, f"role {g.role!r} (policy {name!r}) reads {path}: {why}"


def _outside(path: str, kv_mount: str | None, tenants: list[str], cluster: str | None, multi_cluster: bool) -> str | None:
    """Why `path` is not the role's to read, or None."""
    from ai_factory.components.openbao import CLUSTERS_PREFIX

    engine = kv_mount if kv_mount is not None else path.split("/", 1)[0]
    area = next((path.removeprefix(f"{engine}/{a}/") for a in ("data", "metadata") if path.startswith(f"{engine}/{a}/")), None)
    if area is None:
        return f"outside the KV engine's data ({engine}/data/, {engine}/metadata/)"
    if len(tenants) > 1:
        return f"the role is bound to the namespaces of tenants {', '.join(tenants)}"
    if tenants:
        prefix = f"{TENANTS_PREFIX}{tenants[0]}/"
        return None if area.startswith(prefix) else f"outside tenant {tenants[0]}'s prefix {prefix}"
    if area.startswith(TENANTS_PREFIX) or TENANTS_PREFIX.startswith(area.rstrip("*")):
        return "a tenant's secrets, read by a platform role"
    if cluster is not None:
        prefix = f"{CLUSTERS_PREFIX}{cluster}/"
        return None if area.startswith(prefix) else f"outside cluster {cluster}'s prefix {prefix}"
    if multi_cluster or area.startswith(CLUSTERS_PREFIX) or CLUSTERS_PREFIX.startswith(area.rstrip("*")):
        return "another cluster's secrets"
    return None


def openbao_role_scope(rendered, oracles) -> Iterable[Finding]:
    """The rule over a render's graph (a rendered directory has no OpenBao inputs: its stores only)."""
    from ai_factory.factory.model.config import FactoryConfig

    cfg: FactoryConfig | None = rendered.config
    graph = rendered.graph
    kv_mount = cfg.layers.openbao.kv_mount if cfg is not None else None
    tenant_of_namespace = {m.name: m.tenant for m in rendered.of_kind("Namespace") if m.tenant}
    stores = [
        (m.ref, (((m.obj.get("spec") or {}).get("provider") or {}).get("vault") or {}).get("auth", {}).get("kubernetes", {}).get("mountPath"))
        for m in rendered.of_kind("SecretStore")
    ]
    resources = list(graph.resources) if graph is not None else []
    mounts = [str(r.inputs.get("path")) for r in resources if r.type == AUTH_BACKEND and r.inputs.get("type") == "kubernetes"]
    grants = [grant(f"OpenBao role {r.name}", r.inputs) for r in resources if r.type == ROLE]
    policies = {str(r.inputs.get("name")): str(r.inputs.get("policy") or "") for r in resources if r.type == POLICY}
    tenants = {g.ref: sorted({tenant_of_namespace[n] for n in g.namespaces if n in tenant_of_namespace}) for g in grants}
    for ref, why in scope_problems(mounts, grants, policies, kv_mount, tenant_of_namespace, stores):
        yield Finding("openbao-role-scope", ref, why, tuple(tenants.get(ref, ())))
