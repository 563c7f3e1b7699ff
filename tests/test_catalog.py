"""The chart pins agree with the oracles' records of the published versions."""

from __future__ import annotations

import re

import pytest
import yaml

from ai_factory.factory.checking.oracles import _read_crds
from ai_factory.factory.model.catalog import CHARTS


@pytest.mark.parametrize("product", sorted(CHARTS))
def test_pin_is_a_published_version_recorded_upstream(product, oracles):
    pin = CHARTS[product]
    folder = oracles.root / pin.oracle_dir.split("/")[0]
    source = (folder / "SOURCE.yaml").read_text()
    assert pin.version in source, f"{product} {pin.version} is not recorded in SOURCE.yaml"
    assert pin.repository.rstrip("/") in source.replace("/ ", " "), f"{product} repository {pin.repository} not in SOURCE.yaml"
    assert not pin.version.startswith(("0.0.0", "v0.0.0")) and "-dev" not in pin.version
    chart = yaml.safe_load((oracles.root / pin.oracle_dir / "Chart.yaml").read_text())
    assert chart["name"] == pin.name
    assert (oracles.root / pin.oracle_dir / "values.yaml").is_file()


@pytest.mark.parametrize("product", sorted(p for p, pin in CHARTS.items() if pin.crd_groups))
def test_declared_crd_groups_are_groups_of_the_products_upstream_crds(product, oracles):
    pin = CHARTS[product]
    folder = oracles.root / pin.oracle_dir.split("/")[0]
    # A chart CRD the oracle keeps once, in another product's folder ("see ../multus"), counts too.
    referred = [oracles.root / name for name in re.findall(r"see \.\./([a-z0-9-]+)", (folder / "SOURCE.yaml").read_text())]
    upstream = {
        crd["spec"]["group"]
        for where in (folder, *referred)
        for path in where.rglob("crds/*.yaml")
        for crd in _read_crds(path)  # MB-sized CRDs, read as the checks read them (compact JSON parses fast)
    }
    assert set(pin.crd_groups) <= upstream
