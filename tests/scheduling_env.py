"""A generated environment bigger than dev for the scheduling tests: every sharing mode (whole GPUs
with and without multi-node NVLink or a GPU fabric, MIG, HAMi, time-slicing, DRA), an organisation
over two trust domains of several tenants, low-trust tenants on dedicated nodes, non-default
borrowing, a tenant with no GPU.

The platform-wide sections (Kubernetes, layers, identity) are dev's, so the other layers render as
they do there; fleet and tenants are generated."""

from __future__ import annotations

from typing import Any


def _tenant(name: str, trust: str, gpus: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": name, "trust": trust, "owners": {"groups": [f"{name}-admins"]}, "gpus": gpus, **extra}


def bigger_environment(dev: dict[str, Any]) -> dict[str, Any]:
    """`dev`: the dev config's sections (a private copy; it is modified)."""
    pools = [
        {"name": "h100", "site": "dc1", "gpu": {"model": "H100-80GB", "per_node": 8}, "nodes": 12,
         "topology": {"intra_node": "nvswitch", "fabric": "infiniband", "nodes_per_rack": 4, "racks_per_block": 2}},
        {"name": "gb200", "site": "dc2", "gpu": {"model": "GB200-186GB", "per_node": 4}, "nodes": 8,
         "topology": {"intra_node": "nvlink", "fabric": "infiniband", "nodes_per_nvlink_domain": 4, "nodes_per_rack": 4}},
        {"name": "l40s-eth", "site": "dc2", "gpu": {"model": "L40S-48GB", "per_node": 4}, "nodes": 2},
        {"name": "a100-mig", "site": "dc1", "gpu": {"model": "A100-80GB", "per_node": 8}, "nodes": 4, "sharing": "mig",
         "topology": {"fabric": "roce"}},
        {"name": "l40s-hami", "site": "dc2", "gpu": {"model": "L40S-48GB", "per_node": 4}, "nodes": 4, "sharing": "hami",
         "hami": {"split_count": 10}},
        {"name": "l4-ts", "site": "dc2", "gpu": {"model": "L4-24GB", "per_node": 4}, "nodes": 3, "sharing": "time-slicing",
         "time_slicing": {"replicas": 4}},
        {"name": "h200-dra", "site": "dc1", "gpu": {"model": "H200-141GB", "per_node": 8}, "nodes": 2, "sharing": "dra"},
    ]
    research = {"trust_domain": "research", "organisation": "rnd"}
    product = {"trust_domain": "product", "organisation": "rnd", "isolation": "namespace"}
    tenants = [
        _tenant("vision", "high", [{"pool": "h100", "count": 16}, {"pool": "a100-mig", "mig": {"1g.10gb": 10, "3g.40gb": 2}}], **research),
        _tenant("speech", "high", [{"pool": "gb200", "count": 8}, {"pool": "l4-ts", "count": 6}], **research),
        _tenant("nlp", "medium", [{"pool": "l40s-hami", "count": 5, "memory_mib": 8192, "cores_percent": 20},
                                  {"pool": "a100-mig", "mig": {"1g.10gb": 3}}], **research),
        _tenant("search", "medium", [{"pool": "a100-mig", "mig": {"2g.20gb": 4}},
                                     {"pool": "l40s-hami", "count": 3, "memory_mib": 16384, "cores_percent": 30}],
                borrowing={"lendable_percent": 50, "limit_percent": 100, "fair_share_weight": 3}, **product),
        _tenant("ads", "high", [{"pool": "l4-ts", "count": 5}, {"pool": "h100", "count": 8}, {"pool": "l40s-eth", "count": 2},
                                {"pool": "h200-dra", "count": 4}], **product),
        _tenant("ops", "high", [{"pool": "h100", "count": 4}, {"pool": "l4-ts", "count": 3}],
                borrowing={"lendable_percent": 25, "limit_percent": 0}),
        _tenant("docs", "high", [], trust_domain="ops"),
        _tenant("ext-a", "low", [{"pool": "h100", "count": 8}]),
        _tenant("ext-b", "low", [{"pool": "gb200", "count": 4}], quota={"cpu": "500m", "memory": "64Gi"}),
    ]
    dev["fleet"] = {"sites": [{"name": "dc1"}, {"name": "dc2"}], "pools": pools}
    dev["tenants"] = tenants
    dev.pop("self_service", None)  # dev's rules name dev's pools
    dev.get("layers", {}).pop("provisioning", None)  # so do dev's bare-metal hosts
    dev.get("layers", {}).pop("kubevirt", None)  # and its VM pool
    # Slurm for two research tenants (dev's cluster names dev's pools), on multi-node NVLink too.
    exception = {"level": "baseline", "reason": "Slurm cluster: slurmd runs as root to start job steps", "approved_by": "platform-security"}
    dev["layers"]["tenancy"]["pod_security_exceptions"] = [{"tenant": t, **exception} for t in ("vision", "speech")]
    dev["layers"]["slinky"] = {
        "enabled": True,
        "node_resources": {pool: {"cpus": 16, "memory_gib": 128} for pool in ("h100", "a100-mig", "gb200")},
        "clusters": [{"tenant": "vision", "pools": ["h100", "a100-mig"]}, {"tenant": "speech", "pools": ["gb200"]}],
    }
    return dev
