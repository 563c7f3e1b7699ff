"""Self-service onboarding through the tenant API, end to end: a tenant the platform team never
wrote into the config is checked against `self_service` and the free capacity, registered,
planned by an update of the platform stack of each cluster it lands on and given its own stack on
each, in one job; it survives a restart of the service; deleting it reverses every step on every
one of its clusters. The `pulumi` CLI is the fake; the platform's program is the real contract of
the project's configuration (the cluster's view of it) as it stands on disk."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from ai_factory.factory.model.loading import load_stack_file
from ai_factory.factory.planning.from_config import plan_for, previous_plan
from ai_factory.factory.model.clusters import cluster_view, is_multi_cluster
from ai_factory.factory.rendering.bundle import render_clusters
from ai_factory.stacks.auth import Jwks, TokenVerifier
from ai_factory.stacks.contract import CONTRACT_OUTPUT, CONTRACT_SECRETS_OUTPUT, platform_contract, platform_secrets
from ai_factory.stacks.jobstore import JobStore
from ai_factory.stacks.fleet import FleetStacks
from ai_factory.stacks.platform import PlatformStacks
from ai_factory.stacks.service import ServiceSettings, create_app
from ai_factory.stacks.tenants import TenantStacks
from tests.fake_pulumi import Deployed, FakePulumi
from tests.fleet_env import one_cluster
from tests.stacks_support import AUDIENCE, ISSUER, REGISTRY_PASSWORD, REPO, Issuer, backend, job_outcome, tenant_program

TENANTS = "/v1/environments/dev/tenants"
NEWCO = {"name": "newco", "trust": "low", "owners": {"groups": ["newco-admins"]}, "gpus": [{"pool": "h100-train", "count": 8}], "managed_by": "tenant-stack"}


TWOCO = {
    "name": "twoco",
    "trust": "medium",
    "owners": {"groups": ["twoco-admins"]},
    "gpus": [{"pool": "h100-train", "count": 8}, {"pool": "l40s-infer", "count": 2, "memory_mib": 12288, "cores_percent": 25}],
    "managed_by": "tenant-stack",
}
"""A self-service tenant on both of dev's clusters: par1-a's H100s and par1-b's L40S slices."""


def write_project(root: Path, document: dict) -> Path:
    """This repository's platform project with `document` as its dev stack file, as the platform
    team's checkout would be; self-service opened to par1-b's inference pool too."""
    root.mkdir()
    shutil.copy(REPO / "Pulumi.yaml", root / "Pulumi.yaml")
    document = copy.deepcopy(document)
    document["config"]["ai-factory:self_service"] |= {"pools": ["h100-train", "l40s-infer"], "max_gpus": 10}
    (root / "Pulumi.dev.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    shutil.copytree(REPO / "plans", root / "plans")
    return root


@pytest.fixture
def project(tmp_path) -> Path:
    return write_project(tmp_path / "project", yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text()))


class Api:
    def __init__(self, tmp_path: Path, project: Path, issuer: Issuer):
        self.project, self.issuer = project, issuer

        def platform_program(stack: str, config: dict[str, str]) -> Deployed:
            short = stack.rsplit("/", 1)[-1]
            cfg = load_stack_file("dev", project)  # what `pulumi up` reads: the stack file and the registry
            view = cfg if short == "dev" else cluster_view(cfg, short.removeprefix("dev-"))
            contract = platform_contract(view, plan_for(view, previous_plan(short, project)), short)
            return Deployed(outputs={CONTRACT_OUTPUT: contract.to_output(), CONTRACT_SECRETS_OUTPUT: platform_secrets(view)}, secret_outputs=frozenset({CONTRACT_SECRETS_OUTPUT}))

        self.cli = FakePulumi(
            {"ai-factory": platform_program, "ai-factory-tenant": tenant_program},
            secret_config={"ai-factory:layers": json.dumps({"gpu_operator": {"registry": {"password": REGISTRY_PASSWORD}}})},
        )
        platforms = PlatformStacks(backend(tmp_path), project_dir=project, pulumi_command=self.cli)
        fleet = FleetStacks(platforms.backend, project_dir=project, pulumi_command=self.cli)
        if is_multi_cluster(load_stack_file("dev", project)):
            assert all(r.ok for r in fleet.up("dev"))
        else:
            platforms.up("dev")
        self.tenants = TenantStacks(platforms.backend, platforms=platforms, fleet=fleet, project_dir=project, pulumi_command=self.cli)
        self.store_url = f"sqlite:///{tmp_path / 'jobs.db'}"
        self.client = self.start()

    def start(self) -> TestClient:
        verifier = TokenVerifier(Jwks(ISSUER, self.issuer.fetch), audience=AUDIENCE, admin_group="platform-admins")
        return TestClient(create_app(self.tenants, verifier, ServiceSettings(environments=("dev",)), JobStore(self.store_url)))

    def auth(self, *groups: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.issuer.token(list(groups), sub='-'.join(groups))}"}

    def finished(self, response, headers) -> dict:
        assert response.status_code == 202, response.text
        return job_outcome(self.client, response.headers["Location"], headers)


@pytest.fixture
def api(tmp_path, project) -> Api:
    return Api(tmp_path, project, Issuer())


def rendered_platform(project: Path, monkeypatch) -> dict[str, dict[tuple[str, str, str], dict]]:
    """Each cluster rendered from the project as it is on disk: cluster -> (kind, namespace, name) -> object."""
    monkeypatch.chdir(project)
    return {c: {(m.kind, m.obj["metadata"].get("namespace", ""), m.name): m.obj for m in r.manifests} for c, r in render_clusters("dev").items()}


def tenant_stacks(api: Api) -> list[str]:
    return sorted(name.rsplit("/", 1)[-1] for name in api.cli.stacks if "/ai-factory-tenant/" in name)


def test_a_new_tenant_onboards_itself_on_its_cluster_end_to_end_and_survives_a_restart(api, monkeypatch):
    owner = api.auth("newco-admins")
    job = api.finished(api.client.post(TENANTS, json=NEWCO, headers=owner), owner)
    assert (job["operation"], job["state"]) == ("onboard", "succeeded"), job
    assert job["phases"] == ["registered in tenants/dev/newco.yaml", "platform dev-par1-a updated", "tenant stack dev-par1-a.newco created"]
    assert yaml.safe_load((api.project / "tenants" / "dev" / "newco.yaml").read_text())["managed_by"] == "tenant-stack"
    assert tenant_stacks(api) == ["dev-par1-a.newco"]

    objects = rendered_platform(api.project, monkeypatch)
    assert objects["par1-a"][("Namespace", "", "tenant-newco")]["metadata"]["labels"]["ai-factory.io/tenant"] == "newco"
    assert objects["par1-a"][("ResourceQuota", "tenant-newco", "tenant-quota")]["spec"]["hard"]["requests.nvidia.com/gpu"] == "8"
    assert ("ClusterQueue", "", "tenant-newco") in objects["par1-a"]
    assert ("Namespace", "", "tenant-newco") not in objects["par1-b"]

    restarted = api.start()
    assert restarted.get(f"/v1/jobs/{job['id']}", headers=owner).json()["state"] == "succeeded"
    assert restarted.get(f"{TENANTS}/newco", headers=owner).status_code == 200


def test_a_tenant_onboarded_onto_two_clusters_gets_a_platform_update_and_a_stack_on_each(api, monkeypatch):
    owner = api.auth("twoco-admins")
    job = api.finished(api.client.post(TENANTS, json=TWOCO, headers=owner), owner)
    assert (job["operation"], job["state"]) == ("onboard", "succeeded"), job
    assert job["phases"] == [
        "registered in tenants/dev/twoco.yaml",
        "platform dev-par1-a updated",
        "platform dev-par1-b updated",
        "tenant stack dev-par1-a.twoco created",
        "tenant stack dev-par1-b.twoco created",
    ]
    assert list(job["result"]["clusters"]) == ["par1-a", "par1-b"]
    assert tenant_stacks(api) == ["dev-par1-a.twoco", "dev-par1-b.twoco"]
    objects = rendered_platform(api.project, monkeypatch)
    quotas = {c: objects[c][("ResourceQuota", "tenant-twoco", "tenant-quota")]["spec"]["hard"] for c in ("par1-a", "par1-b")}
    assert quotas["par1-a"]["requests.nvidia.com/gpu"] == "8" and "requests.nvidia.com/gpumem" not in quotas["par1-a"]  # whole H100s
    assert "requests.nvidia.com/gpumem" in quotas["par1-b"] and "requests.nvidia.com/GH100_H100_SXM5_80GB" not in quotas["par1-b"]  # L40S slices


def test_offboarding_a_tenant_of_two_clusters_deletes_its_stack_and_frees_its_gpus_on_each(api, monkeypatch):
    owner = api.auth("twoco-admins")
    api.finished(api.client.post(TENANTS, json=TWOCO, headers=owner), owner)
    job = api.finished(api.client.delete(f"{TENANTS}/twoco", headers=owner), owner)
    assert (job["operation"], job["state"]) == ("offboard", "succeeded"), job
    assert job["phases"] == [
        "tenant stack dev-par1-a.twoco deleted",
        "tenant stack dev-par1-b.twoco deleted",
        "unregistered from tenants/dev",
        "platform dev-par1-a updated",
        "platform dev-par1-b updated",
    ]
    destroyed = sorted(c.stack.rsplit("/", 1)[-1] for c in api.cli.operations("destroy"))
    assert destroyed == ["dev-par1-a.twoco", "dev-par1-b.twoco"]
    assert not (api.project / "tenants" / "dev" / "twoco.yaml").exists()
    assert all(("Namespace", "", "tenant-twoco") not in objects for objects in rendered_platform(api.project, monkeypatch).values())


def test_a_platform_update_failing_on_one_cluster_unregisters_the_tenant_and_updates_the_other_without_it(api):
    api.cli.failing_stacks["dev-par1-b"] = "error: the API server of par1-b is unreachable"
    owner = api.auth("twoco-admins")
    job = api.finished(api.client.post(TENANTS, json=TWOCO, headers=owner), owner)
    assert (job["operation"], job["state"]) == ("onboard", "failed"), job
    assert job["phases"] == [
        "registered in tenants/dev/twoco.yaml",
        "platform dev-par1-a updated",
        "platform dev-par1-b failed: error: the API server of par1-b is unreachable",
        "unregistered: the platform update failed",
        "platform dev-par1-a updated",
    ]
    assert job["error"] == "the platform update failed on 1 of 2 cluster(s): platform dev-par1-b: error: the API server of par1-b is unreachable"
    assert not (api.project / "tenants" / "dev" / "twoco.yaml").exists() and tenant_stacks(api) == []
    contract = api.tenants.platforms.contract("dev", "par1-a")
    assert contract.registration("twoco") is None  # par1-a's platform no longer holds it


def test_a_one_cluster_environment_onboards_and_offboards_through_its_one_platform_stack(tmp_path, monkeypatch):
    api = Api(tmp_path, write_project(tmp_path / "one", one_cluster(yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text()))), Issuer())
    owner = api.auth("newco-admins")
    job = api.finished(api.client.post(TENANTS, json=NEWCO, headers=owner), owner)
    assert job["phases"] == ["registered in tenants/dev/newco.yaml", "platform dev updated", "tenant stack dev.newco created"], job
    job = api.finished(api.client.delete(f"{TENANTS}/newco", headers=owner), owner)
    assert job["phases"] == ["tenant stack dev.newco deleted", "unregistered from tenants/dev", "platform dev updated"], job
    assert [c.stack.rsplit("/", 1)[-1] for c in api.cli.operations("destroy")] == ["dev.newco"]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"trust": "high"}, "tenant.trust: 'high' tenants cannot onboard themselves in dev (allowed: medium, low)"),
        ({"gpus": [{"pool": "a100-mig", "mig": {"1g.10gb": 1}}]}, "tenant.gpus[0].pool: 'a100-mig' is not open to self-service tenants"),
        ({"gpus": [{"pool": "h100-train", "count": 11}]}, "tenant.gpus: 11 GPUs, instances or slices asked, more than a self-service tenant may have (10)"),
        ({"owners": {"groups": ["search-admins"]}}, "search-admins"),
    ],
    ids=["trust-not-allowed", "pool-not-open", "over-the-maximum", "another-tenants-owners"],
)
def test_a_tenant_outside_the_self_service_rules_is_refused_before_anything_is_written(api, change, problem):
    groups = change.get("owners", {}).get("groups", ["newco-admins"])
    response = api.client.post(TENANTS, json={**NEWCO, **change}, headers=api.auth(*groups))
    assert response.status_code == 422, response.text
    assert any(problem in line for line in response.json()["problems"]), response.json()
    assert not (api.project / "tenants").exists()


def test_a_tenant_the_free_capacity_cannot_hold_is_refused_with_the_shortfall(api):
    first = api.auth("newco-admins")
    assert api.finished(api.client.post(TENANTS, json=NEWCO, headers=first), first)["state"] == "succeeded"
    later = {**NEWCO, "name": "lateco", "owners": {"groups": ["lateco-admins"]}}
    second = api.client.post(TENANTS, json=later, headers=api.auth("lateco-admins"))
    assert second.status_code == 422, second.text
    assert any("h100-train" in line for line in second.json()["problems"]), second.json()
    assert sorted(p.name for p in (api.project / "tenants" / "dev").iterdir()) == ["newco.yaml"]
