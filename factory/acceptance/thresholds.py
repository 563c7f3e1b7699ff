"""NCCL all-reduce bus-bandwidth thresholds per GPU model and link.

`busbw` is nccl-tests' bus bandwidth (the algorithm bandwidth scaled by 2(n-1)/n for all-reduce),
the figure NVSentinel's preflight checks compare; the `nccl-node` gate reports nccl-tests' closing
`# Avg bus bandwidth`, the `nccl-pair` gate the same definition computed from its own timed
all-reduces of 256 MiB over `torch.distributed` (`nccl_tests`). Every row needs a measured figure: none lets an exit code
stand for one (`gates`, "No figure, no pass"). The built-in table has a row per GPU model of
the catalog and per link; the figures are the sources' and do not depend on the model (no
source below gives per-model minima), so a site that measured its own hardware sets
`layers.provisioning.acceptance.nccl` instead (which then must cover every model and link of the
fleet).
"""

from __future__ import annotations

from ai_factory.factory.model.config import FactoryConfig, NcclThreshold
from ai_factory.factory.model.gpus import GPU_MODELS

NVSENTINEL_PREFLIGHT = (
    "NVIDIA/NVSentinel@0f6073182b distros/kubernetes/nvsentinel/charts/preflight/values.yaml"
)
# (scope, link) -> (GB/s, source)
LINK_MINIMA: dict[tuple[str, str], tuple[float, str]] = {
    ("node", "nvswitch"): (150.0, f"{NVSENTINEL_PREFLIGHT}: preflight-nccl-loopback BW_THRESHOLD_GBPS, 'valid for NVLink GPU-to-GPU interconnect'"),
    ("node", "nvlink"): (150.0, f"{NVSENTINEL_PREFLIGHT}: preflight-nccl-loopback BW_THRESHOLD_GBPS, 'valid for NVLink GPU-to-GPU interconnect'"),
    ("node", "pcie"): (15.0, f"{NVSENTINEL_PREFLIGHT}: 'if using PCIe GPU-interconnect, this threshold should be set to ~15 GB/s'"),
    ("pair", "infiniband"): (100.0, f"{NVSENTINEL_PREFLIGHT}: preflight-nccl-allreduce BW_THRESHOLD_GBPS (fabric-agnostic default; its tested InfiniBand figure is 166 GB/s)"),
    ("pair", "roce"): (100.0, f"{NVSENTINEL_PREFLIGHT}: preflight-nccl-allreduce BW_THRESHOLD_GBPS (fabric-agnostic default)"),
    ("pair", "ethernet"): (10.0, "80% of one 100 GbE link (12.5 GB/s): without RDMA NCCL uses TCP sockets over the node's NIC; our arithmetic, no benchmark"),
}


def builtin_table() -> list[NcclThreshold]:
    return [
        NcclThreshold(gpu_model=model, scope=scope, link=link, min_busbw_gbps=gbps, source=source)
        for model in sorted(GPU_MODELS)
        for (scope, link), (gbps, source) in LINK_MINIMA.items()
    ]


def table(cfg: FactoryConfig) -> dict[tuple[str, str, str], NcclThreshold]:
    rows = cfg.layers.provisioning.acceptance.nccl
    return {(r.gpu_model, r.scope, r.link): r for r in (rows if rows is not None else builtin_table())}
