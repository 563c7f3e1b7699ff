"""Self-service onboarding through the tenant API, end to end: a tenant the platform team never
wrote into the config is checked against `self_service` and the free capacity, registered,
planned by a platform update and given its own stack, in one job; it survives a restart of the
service; deleting it reverses every step. The `pulumi` CLI is the fake; the platform's program is
the real contract of the project's configuration as it stands on disk."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from ai_factory.factory.model.loading import load_stack_file
from ai_factory.factory.planning.from_config import plan_for, previous_plan
from ai_factory.factory.rendering.bundle import render_env
from ai_factory.stacks.auth import Jwks, TokenVerifier
from ai_factory.stacks.contract import CONTRACT_OUTPUT, CONTRACT_SECRETS_OUTPUT, platform_contract, platform_secrets
from ai_factory.stacks.jobstore import JobStore
from ai_factory.stacks.platform import PlatformStacks
from ai_factory.stacks.service import ServiceSettings, create_app
from ai_factory.stacks.tenants import TenantStacks
from tests.fake_pulumi import Deployed, FakePulumi
from tests.stacks_support import AUDIENCE, ISSUER, REGISTRY_PASSWORD, REPO, Issuer, backend, job_outcome, tenant_program

TENANTS = "/v1/environments/dev/tenants"
NEWCO = {"name": "newco", "trust": "low", "owners": {"groups": ["newco-admins"]}, "gpus": [{"pool": "h100-train", "count": 8}], "managed_by": "tenant-stack"}


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of this repository's platform project, as the platform team's checkout would be."""
    root = tmp_path / "project"
    root.mkdir()
    for name in ("Pulumi.yaml", "Pulumi.dev.yaml"):
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "plans", root / "plans")
    return root


class Api:
    def __init__(self, tmp_path: Path, project: Path, issuer: Issuer):
        self.project, self.issuer = project, issuer

        def platform_program(stack: str, config: dict[str, str]) -> Deployed:
            cfg = load_stack_file("dev", project)  # what `pulumi up` reads: the stack file and the registry
            contract = platform_contract(cfg, plan_for(cfg, previous_plan("dev", project)), "dev")
            return Deployed(outputs={CONTRACT_OUTPUT: contract.to_output(), CONTRACT_SECRETS_OUTPUT: platform_secrets(cfg)}, secret_outputs=frozenset({CONTRACT_SECRETS_OUTPUT}))

        self.cli = FakePulumi(
            {"ai-factory": platform_program, "ai-factory-tenant": tenant_program},
            secret_config={"ai-factory:layers": json.dumps({"gpu_operator": {"registry": {"password": REGISTRY_PASSWORD}}})},
        )
        platforms = PlatformStacks(backend(tmp_path), project_dir=project, pulumi_command=self.cli)
        platforms.up("dev")
        self.tenants = TenantStacks(platforms.backend, platforms=platforms, project_dir=project, pulumi_command=self.cli)
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


def rendered_platform(project: Path, monkeypatch) -> dict[tuple[str, str, str], dict]:
    """The environment rendered from the project as it is on disk: (kind, namespace, name) -> object."""
    monkeypatch.chdir(project)
    return {(m.kind, m.obj["metadata"].get("namespace", ""), m.name): m.obj for m in render_env("dev").manifests}


def test_a_new_tenant_onboards_itself_end_to_end_and_survives_a_restart(api, monkeypatch):
    owner = api.auth("newco-admins")
    job = api.finished(api.client.post(TENANTS, json=NEWCO, headers=owner), owner)
    assert (job["operation"], job["state"]) == ("onboard", "succeeded"), job
    assert job["phases"] == ["registered in tenants/dev/newco.yaml", "platform dev updated", "tenant stack created"]
    assert yaml.safe_load((api.project / "tenants" / "dev" / "newco.yaml").read_text())["managed_by"] == "tenant-stack"

    objects = rendered_platform(api.project, monkeypatch)
    assert objects[("Namespace", "", "tenant-newco")]["metadata"]["labels"]["ai-factory.io/tenant"] == "newco"
    assert objects[("ResourceQuota", "tenant-newco", "tenant-quota")]["spec"]["hard"]["requests.nvidia.com/gpu"] == "8"
    assert ("ClusterQueue", "", "tenant-newco") in objects

    restarted = api.start()
    assert restarted.get(f"/v1/jobs/{job['id']}", headers=owner).json()["state"] == "succeeded"
    assert restarted.get(f"{TENANTS}/newco", headers=owner).status_code == 200


def test_deleting_a_self_service_tenant_reverses_its_onboarding(api, monkeypatch):
    owner = api.auth("newco-admins")
    api.finished(api.client.post(TENANTS, json=NEWCO, headers=owner), owner)
    job = api.finished(api.client.delete(f"{TENANTS}/newco", headers=owner), owner)
    assert (job["operation"], job["state"]) == ("offboard", "succeeded"), job
    assert job["phases"] == ["tenant stack deleted", "unregistered from tenants/dev", "platform dev updated"]
    assert not (api.project / "tenants" / "dev" / "newco.yaml").exists()
    assert ("Namespace", "", "tenant-newco") not in rendered_platform(api.project, monkeypatch)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"trust": "high"}, "tenant.trust: 'high' tenants cannot onboard themselves in dev (allowed: medium, low)"),
        ({"gpus": [{"pool": "a100-mig", "mig": {"1g.10gb": 1}}]}, "tenant.gpus[0].pool: 'a100-mig' is not open to self-service tenants"),
        ({"gpus": [{"pool": "h100-train", "count": 9}]}, "tenant.gpus: 9 GPUs, instances or slices asked, more than a self-service tenant may have (8)"),
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
