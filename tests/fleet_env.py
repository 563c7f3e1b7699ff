"""A three-site environment of four clusters, built from the dev stack file: par1 has two clusters
(par1-a the manager, par1-b), fra1 and ams1 one each; `assistant` is on three clusters, `search`
on par1-a, par1-b and ams1-a (its pools'), `partner-acme` on par1-a only."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent


def fleet_document() -> dict[str, Any]:
    document = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())
    config = document["config"]
    config["ai-factory:fleet"]["sites"] = [
        {"name": "par1", "region": "eu-west-paris", "clusters": [
            {"name": "par1-a", "role": "manager", "context": "par1-a-admin"},
            {"name": "par1-b", "api_server": "https://api.par1-b.example.com:6443", "context": "par1-b-admin"},
        ]},
        {"name": "fra1", "region": "eu-central-frankfurt", "clusters": [{"name": "fra1-a", "api_server": "https://api.fra1.example.com:6443"}]},
        {"name": "ams1", "region": "eu-west-amsterdam", "clusters": [{"name": "ams1-a", "api_server": "https://api.ams1.example.com:6443"}]},
    ]
    pools = config["ai-factory:fleet"]["pools"]
    pools[0]["cluster"] = "par1-a"
    pools[1]["cluster"] = "par1-b"
    pools[2]["site"] = "fra1"
    del pools[2]["cluster"]  # fra1's only cluster
    pools[3]["cluster"] = "par1-a"  # the VM pool
    pools.append({"name": "h100-ams", "site": "ams1", "gpu": {"model": "H100-80GB", "per_node": 8}, "sharing": "exclusive", "nodes": 2,
                  "topology": {"fabric": "infiniband"}, "driver": {"version": "595.91.07"}})
    tenants = config["ai-factory:tenants"]
    tenants[0]["gpus"].append({"pool": "h100-ams", "count": 8})
    tenants[1]["clusters"] = ["par1-a", "par1-b", "fra1-a"]
    return document


def fold_clusters(fleet: dict[str, Any], tenants: list[dict[str, Any]]) -> None:
    """The `fleet` and `tenants` sections (changed in place) with no cluster declared: every site,
    pool and tenant in one cluster, as an environment without clusters is."""
    for site in fleet.get("sites") or []:
        site.pop("clusters", None)
    for pool in fleet.get("pools") or []:
        pool.pop("cluster", None)
    for tenant in tenants:
        tenant.pop("clusters", None)


def one_cluster(document: dict[str, Any]) -> dict[str, Any]:
    """`document` (a copy) with no cluster declared (`fold_clusters`)."""
    document = copy.deepcopy(document)
    fold_clusters(document["config"]["ai-factory:fleet"], document["config"].get("ai-factory:tenants") or [])
    return document


def one_cluster_text(text: str) -> str:
    """A stack file's text without its clusters' declarations (`fold_clusters`), its comments and
    layout kept: dev's text as one cluster, for tests that edit it as text."""
    kept, section, inside = [], None, None
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if indent == 2 and stripped and not stripped.startswith("#"):
            section = stripped.split(":", 2)[1] if stripped.startswith("ai-factory:") else None
        if inside is not None and stripped.startswith("- ") and indent > inside:
            continue  # an entry of a site's `clusters:` list
        inside = indent if section == "fleet" and stripped.startswith("clusters:") else None
        if inside is None and not (section == "fleet" and stripped.startswith("cluster: ")):
            kept.append(line)
    return "".join(kept)


def write_env(directory: Path, document: dict[str, Any] | None = None, name: str = "fleet") -> Path:
    """The environment as `Pulumi.<name>.yaml` of a project in `directory`."""
    shutil.copy(REPO / "Pulumi.yaml", directory / "Pulumi.yaml")
    path = directory / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump(copy.deepcopy(document or fleet_document()), sort_keys=False))
    return path

