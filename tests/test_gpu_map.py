"""`ai-factory plan --map`: every GPU of the plan drawn once, with its trust domain; every tenant's
whole GPUs, MIG instances (at their memory slices), HAMi slices and time-sliced shares drawn inside
the GPU the plan gives them; idle and free GPUs told apart; byte-identical; legible at 512 GPUs."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ai_factory.factory.cli import main
from ai_factory.factory.model.gpus import GPU_MODELS, MEMORY_SLICES
from ai_factory.factory.planning.gpumap import draw_map
from ai_factory.factory.planning.model import Demand, HamiSlice, Plan
from ai_factory.factory.planning.planner import plan
from tests.test_plan_cli import stack_file
from tests.test_planner import mig, mixed_fleet, pool, tenant

SVG = "{http://www.w3.org/2000/svg}"


def drawn(path: Path) -> dict[str, tuple[float, float, float, float]]:
    """SVG id -> bounding box (x0, y0, x1, y1) of the shape drawn under it, for the map's ids."""
    boxes = {}
    for group in ET.parse(path).getroot().iter(f"{SVG}g"):
        gid = group.get("id", "")
        if "__" not in gid:
            continue
        shape = group.find(f"{SVG}path")
        numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", shape.get("d"))]
        xs, ys = numbers[0::2], numbers[1::2]
        boxes[gid] = (min(xs), min(ys), max(xs), max(ys))
    return boxes


def of_kind(boxes: dict, kind: str) -> dict[tuple[str, ...], tuple]:
    return {tuple(gid.split("__")[1:]): box for gid, box in boxes.items() if gid.startswith(kind + "__")}


def check_map(p: Plan, path: Path) -> None:
    """Everything the plan says about each GPU is on the map, where the plan says."""
    boxes = drawn(path)
    gpus = {key[:3]: (key[3], box) for key, box in of_kind(boxes, "gpu").items()}
    assert len(gpus) == sum(len(pl.nodes) * pl.gpus_per_node for pl in p.pools)
    expected: dict[str, set] = {kind: set() for kind in ("whole", "mig", "hami", "ts", "idle", "free")}
    for pool_plan in p.pools:
        model = GPU_MODELS[pool_plan.gpu_model]
        for node in pool_plan.nodes:
            for gpu in node.gpus:
                where = (pool_plan.name, node.name, str(gpu.index))
                domain, (x0, _, x1, _) = gpus[where]
                assert domain == (gpu.trust_domain or "-")
                width = x1 - x0
                if gpu.mode == "idle":
                    expected["free" if gpu.trust_domain is None else "idle"].add(where + ((gpu.trust_domain,) if gpu.trust_domain else ()))
                elif gpu.mode == "whole":
                    expected["whole"].add((*where, gpu.owner))
                for i in gpu.mig:
                    key = (*where, str(i.start), i.profile, i.tenant)
                    expected["mig"].add(key)
                    left, _, right, _ = of_kind(boxes, "mig")[key]
                    assert left - x0 == pytest.approx(width * i.start / MEMORY_SLICES, abs=0.01)
                    assert right - left == pytest.approx(width * model.profile(i.profile).memory_slices / MEMORY_SLICES, abs=0.01)
                expected["hami"] |= {(*where, str(k), a.tenant) for k, a in enumerate(gpu.hami)}
                expected["ts"] |= {(*where, str(k), s.tenant) for k, s in enumerate(gpu.time_slices)}
    for kind, keys in expected.items():
        assert set(of_kind(boxes, kind)) == keys, kind
    for kind in ("whole", "mig", "hami", "ts", "idle", "free"):
        for key, (x0, y0, x1, y1) in of_kind(boxes, kind).items():
            gx0, gy0, gx1, gy1 = gpus[key[:3]][1]
            assert gx0 - 0.01 <= x0 and x1 <= gx1 + 0.01 and gy0 - 0.01 <= y0 and y1 <= gy1 + 0.01, (kind, key)


def test_dev_map_draws_every_gpu_and_tenant_where_the_plan_puts_them(tmp_path, capsys):
    out = tmp_path / "map" / "dev.svg"
    assert main(["plan", str(stack_file(tmp_path)), "--out", str(tmp_path / "plan.json"), "--map", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    p = Plan.from_json((tmp_path / "plan.json").read_text())
    check_map(p, out)
    text = out.read_text()
    for tenant_name in ("assistant", "search", "partner-acme"):
        assert f">{tenant_name}" in text  # in the legend
    assert of_kind(drawn(out), "stranded")  # dev's MIG and HAMi GPUs have unallocated room


def test_map_of_every_sharing_mode_is_where_the_plan_says_and_byte_identical(tmp_path):
    pools, tenants = mixed_fleet()
    p = plan(pools, tenants)
    first, second = tmp_path / "a.svg", tmp_path / "b.svg"
    draw_map(p, first)
    draw_map(p, second)
    assert first.read_bytes() == second.read_bytes()
    check_map(p, first)
    assert {pl.sharing for pl in p.pools} >= {"mig", "hami", "time-slicing", "exclusive"}


def test_map_of_512_gpus_keeps_gpu_cells_and_text_readable(tmp_path):
    pools = [pool("h100", "H100-80GB", "exclusive", 32), pool("a100", "A100-80GB", "mig", 24), pool("l40s", "L40S-48GB", "hami", 8, per_node=8)]
    tenants = [tenant(f"t{i:03d}", Demand("h100", whole_gpus=3), mig("a100", {"3g.40gb": 1, "1g.10gb": 2}), domain=f"d{i % 6}") for i in range(60)]
    tenants += [tenant(f"h{i:02d}", Demand("l40s", hami=(HamiSlice(2, 12000, 25),)), domain=f"e{i % 4}") for i in range(20)]
    p = plan(pools, tenants)
    assert sum(len(pl.nodes) * pl.gpus_per_node for pl in p.pools) == 512
    out = tmp_path / "map.svg"
    draw_map(p, out)
    check_map(p, out)
    root = ET.parse(out).getroot()
    width_pt = float(root.get("width").removesuffix("pt"))
    assert width_pt <= 30 * 72  # one screen or page wide at most 30 inches
    cells = [x1 - x0 for x0, _, x1, _ in of_kind(drawn(out), "gpu").values()]
    assert min(cells) >= 24  # points: a third of an inch per GPU
    sizes = [float(s) for s in re.findall(r"font-size: ([\d.]+)px", out.read_text())]
    assert min(sizes) >= 4


def test_map_in_png_and_a_wrong_suffix_is_refused(tmp_path, capsys):
    png = tmp_path / "map.png"
    assert main(["plan", str(stack_file(tmp_path)), "--out", str(tmp_path / "plan.json"), "--map", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit) as exit_:
        main(["plan", str(stack_file(tmp_path)), "--map", str(tmp_path / "map.pdf")])
    assert exit_.value.code == 2
    assert "must end in .svg or .png" in capsys.readouterr().err
