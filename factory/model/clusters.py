"""Several clusters per environment: sites hold clusters, pools join one cluster of their site,
tenants are placed on one or more clusters.

An environment that declares no cluster is one cluster, exactly as before (no per-cluster stack).
One that declares clusters is deployed as one platform stack per cluster (`<env>-<cluster>`),
each stack setting `kubernetes.cluster`: validation then returns the cluster's view of the
environment (`cluster_view`), holding the cluster's site, pools and tenants only, each tenant's
GPU demands cut to the cluster's pools. A tenant's grant is its demands, and every pool belongs
to one cluster, so its quotas summed over its clusters are its grant, never more
(`ai_factory.factory.checking.fleet` checks the renders say so).

The manager cluster runs the identity layer (the other clusters' vCluster API servers trust its
issuer) and MultiKueue (`components/multikueue.py`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ai_factory.factory.model.config import MAX_CLUSTERS, Cluster, FactoryConfig, Tenant
from ai_factory.factory.model.raw import as_dict, as_list, did_you_mean


@dataclass(frozen=True)
class PlacedCluster:
    cluster: Cluster
    site: str

    @property
    def name(self) -> str:
        return self.cluster.name


def clusters(cfg: FactoryConfig) -> list[PlacedCluster]:
    """Every declared cluster, site by site (the environment's, even from a cluster's view)."""
    env = environment(cfg)
    return [PlacedCluster(c, site.name) for site in env.fleet.sites for c in site.clusters]


def is_multi_cluster(cfg: FactoryConfig) -> bool:
    return bool(clusters(cfg))


def manager(cfg: FactoryConfig) -> PlacedCluster | None:
    found = clusters(cfg)
    return next((c for c in found if c.cluster.role == "manager"), found[0] if len(found) == 1 else None)


def pool_cluster(cfg: FactoryConfig, pool_name: str) -> str:
    env = environment(cfg)
    pool = env.pool(pool_name)
    if pool.cluster:
        return pool.cluster
    site = next(s for s in env.fleet.sites if s.name == pool.site)
    return site.clusters[0].name


def tenant_clusters(cfg: FactoryConfig, tenant: Tenant) -> list[str]:
    """The clusters a tenant is on, in the order the sites declare them."""
    order = [c.name for c in clusters(cfg)]
    tenant = next((t for t in environment(cfg).tenants if t.name == tenant.name), tenant)  # a view cuts its demands
    if tenant.clusters is not None:
        wanted = set(tenant.clusters)
    else:
        wanted = {pool_cluster(cfg, d.pool) for d in tenant.gpus}
        head = manager(cfg)
        if not wanted and head is not None:
            wanted = {head.name}
    return [name for name in order if name in wanted]


def environment(cfg: FactoryConfig) -> FactoryConfig:
    """The whole environment a (cluster's view of a) config belongs to."""
    return cfg.environment or cfg


def cluster_view(cfg: FactoryConfig, name: str) -> FactoryConfig:
    """`cfg` as the stack of cluster `name` deploys it: the cluster's pools and tenants
    (each with its demands and served models on the cluster's pools), its API server; the identity layer only on
    the manager. Layer settings naming pools keep those of the cluster."""
    placed = next(c for c in clusters(cfg) if c.name == name)
    pools = [p for p in cfg.fleet.pools if pool_cluster(cfg, p.name) == name]
    pool_names = {p.name for p in pools}
    tenants = [
        t.model_copy(update={"gpus": [d for d in t.gpus if d.pool in pool_names], "models": [m for m in t.models if m.gpus.pool in pool_names]})
        for t in cfg.tenants
        if name in tenant_clusters(cfg, t)
    ]
    layers = cfg.layers
    remediation = layers.health.remediation
    health = layers.health.model_copy(
        update={
            "remediation": remediation.model_copy(
                update={"pools": {k: v for k, v in remediation.pools.items() if k in pool_names}, "sites": {k: v for k, v in remediation.sites.items() if k == placed.site}}
            )
        }
    )
    is_manager = manager(cfg) is not None and manager(cfg).name == name
    tenant_names = {t.name for t in tenants}
    slurm_clusters = [
        c.model_copy(update={"pools": [p for p in c.pools if p in pool_names]})
        for c in layers.slinky.clusters
        if c.tenant in tenant_names and set(c.pools) & pool_names
    ]
    slinky = layers.slinky.model_copy(update={"clusters": slurm_clusters})
    kubevirt = layers.kubevirt.model_copy(
        update={
            "pools": {k: v for k, v in layers.kubevirt.pools.items() if k in pool_names},
            "tenants": [
                t.model_copy(update={"vms": [vm for vm in t.vms if vm.pool in pool_names]}) for t in layers.kubevirt.tenants if t.tenant in tenant_names
            ],
        }
    )
    provisioning = layers.provisioning.model_copy(update={"pools": {k: v for k, v in layers.provisioning.pools.items() if k in pool_names}})
    tenancy = layers.tenancy.model_copy(
        update={"pod_security_exceptions": [e for e in layers.tenancy.pod_security_exceptions if e.tenant in tenant_names]}
    )
    layers = layers.model_copy(
        update={
            "health": health,
            "slinky": slinky,
            "kubevirt": kubevirt,
            "provisioning": provisioning,
            "tenancy": tenancy,
            **({} if is_manager else {"keycloak": layers.keycloak.model_copy(update={"enabled": False})}),
        }
    )
    self_service = cfg.self_service.model_copy(update={"pools": [p for p in cfg.self_service.pools if p in pool_names]})
    view = cfg.model_copy(
        update={
            "kubernetes": cfg.kubernetes.model_copy(update={"cluster": name, "api_server": placed.cluster.api_server or cfg.kubernetes.api_server}),
            "fleet": cfg.fleet.model_copy(update={"pools": pools}),  # every site: the view validates again as it is
            "tenants": tenants,
            "layers": layers,
            "self_service": self_service,
        }
    )
    view._environment = cfg
    return view


# --------------------------------------------------------------------------- raw rules


def cluster_problems(raw: dict[str, Any]) -> list[str]:
    """The placement rules over the raw config: unique cluster names, one manager, pools on a
    cluster of their site, tenants on clusters that exist and hold their pools."""
    fleet = as_dict(raw.get("fleet"))
    sites = [as_dict(s) for s in as_list(fleet.get("sites"))]
    pools = [as_dict(p) for p in as_list(fleet.get("pools"))]
    tenants = [as_dict(t) for t in as_list(raw.get("tenants"))]
    problems: list[str] = []
    by_site: dict[str, list[str]] = {}
    seen: Counter[str] = Counter()
    roles: dict[str, str] = {}
    for i, site in enumerate(sites):
        for j, cluster in enumerate(map(as_dict, as_list(site.get("clusters")))):
            name = cluster.get("name")
            if not isinstance(name, str):
                continue
            seen[name] += 1
            if seen[name] == 2:
                problems.append(f"fleet.sites[{i}].clusters[{j}].name: duplicate cluster name {name!r}; a cluster name is unique across the sites")
            if isinstance(site.get("name"), str):
                by_site.setdefault(site["name"], []).append(name)
            roles.setdefault(name, str(cluster.get("role", "worker")))
    names = set(seen)
    if sum(seen.values()) > MAX_CLUSTERS:
        problems.append(f"fleet.sites: {sum(seen.values())} clusters in all; an environment has at most {MAX_CLUSTERS}")
    cluster_path = "kubernetes.cluster"
    chosen = as_dict(raw.get("kubernetes")).get("cluster")
    if not names:
        problems += [f"fleet.pools[{i}].cluster: no site declares clusters" for i, p in enumerate(pools) if p.get("cluster") is not None]
        problems += [f"tenants[{i}].clusters: no site declares clusters" for i, t in enumerate(tenants) if t.get("clusters") is not None]
        if chosen is not None:
            problems.append(f"{cluster_path}: no site declares clusters")
        return problems
    managers = sorted(n for n, r in roles.items() if r == "manager")
    if len(names) > 1 and len(managers) != 1:
        problems.append(f"fleet.sites: {len(managers)} manager clusters ({', '.join(managers) or 'none'}); exactly one cluster has `role: manager` (identity, MultiKueue)")
    head = managers[0] if len(managers) == 1 else (next(iter(names)) if len(names) == 1 else None)
    if isinstance(chosen, str) and chosen not in names:
        problems.append(f"{cluster_path}: unknown cluster {chosen!r}{did_you_mean(chosen, names)}")
    for i, site in enumerate(sites):
        if isinstance(site.get("name"), str) and site["name"] not in by_site and any(p.get("site") == site["name"] for p in pools):
            problems.append(f"fleet.sites[{i}].clusters: site {site['name']!r} has pools but no cluster")
    pool_cluster_of: dict[str, str] = {}
    pool_names = {p.get("name") for p in pools if isinstance(p.get("name"), str)}
    for i, pool in enumerate(pools):
        site_clusters = by_site.get(str(pool.get("site")), [])
        cluster = pool.get("cluster")
        if cluster is None:
            if len(site_clusters) > 1:
                problems.append(f"fleet.pools[{i}].cluster: site {pool.get('site')!r} has clusters {', '.join(site_clusters)}; name the pool's")
            elif site_clusters and isinstance(pool.get("name"), str):
                pool_cluster_of[pool["name"]] = site_clusters[0]
        elif isinstance(cluster, str):
            if cluster not in site_clusters:
                where = f"site {pool.get('site')!r}'s clusters" if site_clusters else "the clusters"
                problems.append(f"fleet.pools[{i}].cluster: {cluster!r} is not one of {where}{did_you_mean(cluster, site_clusters or names)}")
            elif isinstance(pool.get("name"), str):
                pool_cluster_of[pool["name"]] = cluster
    for i, tenant in enumerate(tenants):
        path = f"tenants[{i}].clusters"
        placed = tenant.get("clusters")
        demands = [d.get("pool") for d in map(as_dict, as_list(tenant.get("gpus")))]
        if any(isinstance(p, str) and p not in pool_cluster_of and p in pool_names for p in demands):
            continue  # a pool without a valid cluster: its own problem says so
        demanded = {pool_cluster_of[p] for p in demands if p in pool_cluster_of}
        if placed is None:
            on = demanded or ({head} if head else set())
        else:
            on = set()
            for j, name in enumerate(as_list(placed)):
                if not isinstance(name, str):
                    continue
                if name not in names:
                    problems.append(f"{path}[{j}]: unknown cluster {name!r}{did_you_mean(name, names)}")
                on.add(name)
            for missing in sorted(demanded - on):
                problems.append(f"{path}: the tenant demands GPUs of cluster {missing!r}'s pools but is not placed on it")
        vcluster = tenant.get("isolation", "namespace" if tenant.get("trust") == "high" else "vcluster") == "vcluster"
        if head and len(on) > 1 and head not in on:
            problems.append(f"{path}: a tenant on several clusters is also on the manager cluster {head!r}, where MultiKueue dispatches its jobs")
        elif head and vcluster and on and head not in on and len(names) > 1:
            problems.append(f"{path}: a vCluster tenant is also on the manager cluster {head!r}, whose identity layer creates its sign-in client")
    return problems


CANARY = "canary"


def ring_problems(raw: dict[str, Any]) -> list[str]:
    """Rings are unique; a tenant names one; a low-trust tenant is never in the first ring (where
    a new version meets its first workloads) nor in one named `canary`, by name or by default."""
    upgrades = as_dict(raw.get("upgrades"))
    rings = [r for r in as_list(upgrades.get("rings", ["canary", "early", "broad"])) if isinstance(r, str)]
    problems = [f"upgrades.rings[{i}]: ring {r!r} is listed twice" for i, r in enumerate(rings) if r in rings[:i]]
    if not rings:
        return problems
    for i, tenant in enumerate(map(as_dict, as_list(raw.get("tenants")))):
        ring = tenant.get("ring")
        if ring is not None and isinstance(ring, str) and ring not in rings:
            problems.append(f"tenants[{i}].ring: unknown ring {ring!r}{did_you_mean(ring, rings)}")
            continue
        placed = ring if isinstance(ring, str) else rings[-1]
        if tenant.get("trust") == "low" and ((len(rings) > 1 and placed == rings[0]) or placed == CANARY):
            problems.append(f"tenants[{i}].ring: a low-trust tenant is never in the first ring or the {CANARY!r} ring ({placed!r}); upgrades reach it after others have run the new version")
    progress = as_dict(upgrades.get("in_progress"))
    for j, ring in enumerate(as_list(progress.get("done"))):
        if isinstance(ring, str) and ring not in rings:
            problems.append(f"upgrades.in_progress.done[{j}]: unknown ring {ring!r}{did_you_mean(ring, rings)}")
    return problems
