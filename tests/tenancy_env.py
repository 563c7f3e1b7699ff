"""A generated environment of many tenants of mixed trust for the isolation tests: every third
tenant is low-trust (whole H100s on a dedicated node, its own vCluster), every third medium (its own
trust domain and vCluster, MIG and HAMi slices), every third high (namespace mode, trust domains of
two tenants sharing MIG GPUs). The platform-wide sections are dev's."""

from __future__ import annotations

from typing import Any


def many_tenants(dev: dict[str, Any], count: int = 30) -> dict[str, Any]:
    """`dev`: the dev config's sections (a private copy; it is modified)."""
    tenants = []
    for i in range(count):
        name = f"team-{i:02d}"
        owners = {"groups": [f"{name}-admins"], "users": [f"lead-{i:02d}@example.com"]}
        if i % 3 == 0:
            tenants.append({"name": name, "trust": "low", "owners": owners, "gpus": [{"pool": "h100", "count": 8}]})
        elif i % 3 == 1:
            gpus = [{"pool": "a100-mig", "mig": {"1g.10gb": 2}}, {"pool": "l40s-hami", "count": 1, "memory_mib": 4096, "cores_percent": 10}]
            tenants.append({"name": name, "trust": "medium", "owners": owners, "gpus": gpus})
        else:
            gpus = [{"pool": "a100-mig", "mig": {"1g.10gb": 1}}, {"pool": "h100", "count": 2}]
            tenants.append({"name": name, "trust": "high", "trust_domain": f"internal-{i // 6}", "owners": owners, "gpus": gpus})
    low, medium, high = (sum(1 for t in tenants if t["trust"] == trust) for trust in ("low", "medium", "high"))
    dev["fleet"] = {
        "sites": [{"name": "dc1"}],
        "pools": [
            {"name": "h100", "site": "dc1", "gpu": {"model": "H100-80GB", "per_node": 8}, "nodes": low + high},
            {"name": "a100-mig", "site": "dc1", "gpu": {"model": "A100-80GB", "per_node": 8}, "nodes": medium + high, "sharing": "mig"},
            {"name": "l40s-hami", "site": "dc1", "gpu": {"model": "L40S-48GB", "per_node": 4}, "nodes": medium, "sharing": "hami"},
        ],
    }
    dev["tenants"] = tenants
    dev.get("layers", {}).pop("provisioning", None)  # dev's bare-metal hosts name dev's pools
    dev.get("layers", {}).pop("kubevirt", None)  # so does its VM pool
    # Two Slurm tenants of different trust domains (the dev config's cluster names its own tenant).
    slurm_tenants = [t["name"] for t in tenants if t["name"] in ("team-02", "team-08")]
    exception = {"level": "baseline", "reason": "Slurm cluster: slurmd runs as root to start job steps", "approved_by": "platform-security"}
    dev["layers"]["tenancy"]["pod_security_exceptions"] = [{"tenant": t, **exception} for t in slurm_tenants]
    dev["layers"]["slinky"] = {
        "enabled": True,
        "node_resources": {"h100": {"cpus": 64, "memory_gib": 512}, "a100-mig": {"cpus": 64, "memory_gib": 512}},
        "clusters": [{"tenant": t, "pools": ["h100", "a100-mig"]} for t in slurm_tenants],
    }
    dev["self_service"] = {"trust": ["medium", "low"], "pools": ["h100", "l40s-hami"], "max_gpus": 8}  # dev's rules, on these pools
    return dev
