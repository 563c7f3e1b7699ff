"""The GPU map: every pool as nodes x GPUs, each GPU filled with the tenants it serves (MIG instances
at their memory slices, HAMi slices as their memory fraction, time-sliced replicas as their share
of the replicas) and outlined in the colour of its trust domain; idle GPUs held for a domain are
hatched grey, free GPUs are white with a dashed edge, and the unallocated part of a MIG or HAMi GPU
(stranded capacity) is hatched.

Every drawn element carries an SVG id naming what it is, `__`-separated (a separator no tenant,
node or profile name contains): `gpu__<pool>__<node>__<index>__<domain or ->` for the GPU,
`whole__…__<tenant>`, `mig__…__<start>__<profile>__<tenant>`, `hami__…__<slice>__<tenant>`,
`ts__…__<share>__<tenant>`, `idle__…`, `free__…` and `stranded__…` for what is drawn inside it.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ai_factory.factory.model.gpus import GPU_MODELS, MEMORY_SLICES
from ai_factory.factory.planning.model import GpuAssignment, Plan, PoolPlan

FORMATS = (".svg", ".png")

_CELL_IN = 0.42
"""Inches per GPU cell: at 512 GPUs the map stays about 25 inches wide, text 5 points."""
_GAP = 0.18
_LABEL = 5.0
"""Width of the node-name column, in cells."""
_ROW = 1.0 + _GAP
_TARGET_WIDTH = 60.0
"""Cells across: a pool's nodes wrap into side-by-side blocks to stay near this width."""
_IDLE = "#d9d9d9"
_STRANDED = "#f2f2f2"
_PALETTES = ("tab20", "tab20b", "tab20c", "Set3", "Pastel1")


def _colours(names: list[str], palettes: tuple[str, ...]) -> dict[str, tuple[float, ...]]:
    """One colour per name, in name order, cycling through the palettes' colours."""
    pool = [c for p in palettes for c in matplotlib.colormaps[p].colors]
    return {name: pool[i % len(pool)] for i, name in enumerate(sorted(names))}


def _tenants(plan: Plan) -> list[str]:
    names = set()
    for pool in plan.pools:
        for gpu in (g for n in pool.nodes for g in n.gpus):
            names |= {gpu.owner} if gpu.owner else set()
            names |= {i.tenant for i in gpu.mig} | {a.tenant for a in gpu.hami} | {s.tenant for s in gpu.time_slices}
    return sorted(names)


def _id(*parts: object) -> str:
    return "__".join(str(p) for p in parts)


class _Map:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.tenant_colour = _colours(_tenants(plan), _PALETTES)
        domains = sorted({g.trust_domain for p in plan.pools for n in p.nodes for g in n.gpus if g.trust_domain})
        self.domain_colour = _colours(domains, ("Dark2", "Set1", "tab10"))
        self.layout = [(pool, *self._blocks(pool)) for pool in plan.pools]
        self.width = max((blocks * self._block_width(pool) for pool, blocks, _ in self.layout), default=_TARGET_WIDTH)
        self.height = sum(rows * _ROW + 2.0 for _, _, rows in self.layout)

    @staticmethod
    def _block_width(pool: PoolPlan) -> float:
        return _LABEL + pool.gpus_per_node * (1 + _GAP) + 1.0

    def _blocks(self, pool: PoolPlan) -> tuple[int, int]:
        fit = max(1, int(_TARGET_WIDTH // self._block_width(pool)))
        blocks = max(1, min(fit, math.ceil(len(pool.nodes) / 8)))
        return blocks, max(1, math.ceil(len(pool.nodes) / blocks))

    def draw(self) -> Figure:
        columns = max(4, int(self.width // 7))
        legend_rows = math.ceil((len(self.tenant_colour) + len(self.domain_colour) + 3) / columns)
        figure = Figure(figsize=(self.width * _CELL_IN, (self.height + 1.5 + 0.6 * legend_rows) * _CELL_IN))
        axes = figure.add_axes((0, 0, 1, 1))
        axes.set_xlim(0, self.width)
        axes.set_ylim(self.height + 1.5 + 0.6 * legend_rows, 0)
        axes.set_axis_off()
        top = 0.0
        for pool, blocks, rows in self.layout:
            gpus = len(pool.nodes) * pool.gpus_per_node
            axes.text(0, top + 0.9, f"{pool.name}: {pool.gpu_model}, {pool.sharing}, {len(pool.nodes)} nodes x {pool.gpus_per_node} = {gpus} GPUs", fontsize=8, fontweight="bold", va="bottom")
            for i, node in enumerate(pool.nodes):
                x = (i // rows) * self._block_width(pool)
                y = top + 1.4 + (i % rows) * _ROW
                owner = f" ({node.dedicated_tenant})" if node.dedicated_tenant else f" [{node.trust_domain}]" if node.trust_domain else ""
                axes.text(x + _LABEL - 0.2, y + 0.5, node.name + owner, fontsize=5, ha="right", va="center")
                for gpu in node.gpus:
                    self._gpu(axes, pool, node.name, gpu, x + _LABEL + gpu.index * (1 + _GAP), y)
            top += rows * _ROW + 2.0
        handles = [
            Patch(facecolor=_IDLE, hatch="////", edgecolor="#808080", label="idle: held for a trust domain"),
            Patch(facecolor="white", edgecolor="#808080", linestyle="--", label="free"),
            Patch(facecolor=_STRANDED, hatch="xxx", edgecolor="#b0b0b0", label="stranded (unallocated slices)"),
        ]
        handles += [Patch(facecolor=colour, label=tenant) for tenant, colour in self.tenant_colour.items()]
        handles += [Patch(facecolor="white", edgecolor=colour, linewidth=1.2, label=f"trust domain {domain}") for domain, colour in self.domain_colour.items()]
        axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(0, 1 - (self.height + 0.5) / (self.height + 1.5 + 0.6 * legend_rows)), ncol=columns, fontsize=5, frameon=False)
        return figure

    def _gpu(self, axes, pool: PoolPlan, node: str, gpu: GpuAssignment, x: float, y: float) -> None:
        where = (pool.name, node, gpu.index)
        add = axes.add_patch
        if gpu.mode == "idle":
            if gpu.trust_domain is None:
                add(Rectangle((x, y), 1, 1, facecolor="white", edgecolor="#808080", linestyle="--", linewidth=0.6, gid=_id("free", *where)))
            else:
                add(Rectangle((x, y), 1, 1, facecolor=_IDLE, hatch="////", edgecolor="#808080", linewidth=0, gid=_id("idle", *where, gpu.trust_domain)))
        elif gpu.mode == "whole":
            add(Rectangle((x, y), 1, 1, facecolor=self.tenant_colour[gpu.owner], linewidth=0, gid=_id("whole", *where, gpu.owner)))
            axes.text(x + 0.5, y + 0.5, gpu.owner[:9], fontsize=4, ha="center", va="center", rotation=0, clip_on=True)
        elif gpu.mode == "mig":
            self._stranded(axes, where, x, y)
            model = GPU_MODELS[pool.gpu_model]
            for i in gpu.mig:
                span = model.profile(i.profile).memory_slices / MEMORY_SLICES
                left = x + i.start / MEMORY_SLICES
                add(Rectangle((left, y), span, 1, facecolor=self.tenant_colour[i.tenant], edgecolor="white", linewidth=0.4, gid=_id("mig", *where, i.start, i.profile, i.tenant)))
                if span >= 0.25:
                    axes.text(left + span / 2, y + 0.5, i.profile.split(".")[0], fontsize=4, ha="center", va="center")
        elif gpu.mode == "hami":
            self._stranded(axes, where, x, y)
            memory = GPU_MODELS[pool.gpu_model].memory_mib * gpu.hami_memory_scaling
            bottom = y + 1.0
            for k, a in enumerate(gpu.hami):
                height = min(a.memory_mib / memory, bottom - y)
                bottom -= height
                add(Rectangle((x, bottom), 1, height, facecolor=self.tenant_colour[a.tenant], edgecolor="white", linewidth=0.4, gid=_id("hami", *where, k, a.tenant)))
            axes.text(x + 0.5, y + 0.5, f"{len(gpu.hami)}/{pool.hami_split_count}", fontsize=4, ha="center", va="center")
        elif gpu.mode == "time-sliced":
            self._stranded(axes, where, x, y)
            left = x
            for k, s in enumerate(gpu.time_slices):
                width = s.replicas / pool.time_slicing_replicas
                add(Rectangle((left, y), width, 1, facecolor=self.tenant_colour[s.tenant], edgecolor="white", linewidth=0.4, gid=_id("ts", *where, k, s.tenant)))
                left += width
        domain = gpu.trust_domain
        add(
            Rectangle(
                (x, y), 1, 1, fill=False, linewidth=1.2 if domain else 0.4,
                edgecolor=self.domain_colour[domain] if domain else "#808080",
                linestyle="-" if domain else "--", gid=_id("gpu", *where, domain or "-"),
            )
        )

    @staticmethod
    def _stranded(axes, where: tuple, x: float, y: float) -> None:
        """The GPU's unallocated room, drawn first so that allocations cover what they take."""
        axes.add_patch(Rectangle((x, y), 1, 1, facecolor=_STRANDED, hatch="xxx", edgecolor="#b0b0b0", linewidth=0, gid=_id("stranded", *where)))


def draw_map(plan: Plan, path: Path) -> None:
    """Write the map of `plan` to `path` (.svg or .png), byte-identical for the same plan."""
    if path.suffix not in FORMATS:
        raise ValueError(f"map {path}: the file name must end in {' or '.join(FORMATS)}")
    with matplotlib.rc_context({"svg.hashsalt": "ai-factory", "svg.fonttype": "none", "hatch.linewidth": 0.4, "font.family": "DejaVu Sans"}):
        figure = _Map(plan).draw()
        metadata = {"Date": None} if path.suffix == ".svg" else {}
        figure.savefig(path, format=path.suffix[1:], dpi=150, metadata=metadata, bbox_inches="tight", pad_inches=0.1)
