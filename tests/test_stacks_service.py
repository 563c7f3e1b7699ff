"""The tenant API service through FastAPI's test client: authentication, authorisation,
validation, jobs, secrets. Tokens come from an issuer made on the spot; the CLI is the fake."""

from __future__ import annotations

import logging
import os
import threading

import sqlalchemy

import pytest
from fastapi.testclient import TestClient

from ai_factory.stacks.auth import Jwks, TokenVerifier
from ai_factory.stacks.jobstore import JobStore
from ai_factory.stacks.service import ServiceSettings, create_app, service_app
from tests.stacks_support import AUDIENCE, ISSUER, KUBECONFIG, PASSPHRASE, REGISTRY_PASSWORD, DEV_PROJECT, Issuer, backend, deployed_platform, job_outcome, registered, tenant

TENANTS = "/v1/environments/dev/tenants"


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer()


class Service:
    def __init__(self, tmp_path, issuer: Issuer):
        self.cli, _, tenants = deployed_platform(tmp_path)
        self.issuer = issuer
        verifier = TokenVerifier(Jwks(ISSUER, issuer.fetch), audience=AUDIENCE, admin_group="platform-admins")
        self.client = TestClient(create_app(tenants, verifier, ServiceSettings(environments=("dev",))))

    def auth(self, *groups: str, sub: str = "user-1") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.issuer.token(list(groups), sub=sub)}"}

    def finished(self, response, headers) -> dict:
        """Poll the job a 202 answered with until it is done."""
        assert response.status_code == 202, response.text
        return job_outcome(self.client, response.headers["Location"], headers)

    def create(self, body: dict, *groups: str) -> dict:
        headers = self.auth(*groups)
        return self.finished(self.client.post(TENANTS, json=body, headers=headers), headers)


@pytest.fixture
def service(tmp_path, issuer) -> Service:
    return Service(tmp_path, issuer)


def test_requests_without_a_valid_token_are_refused(service):
    now = len(service.cli.calls)
    bad = {
        "no token": {},
        "expired": {"Authorization": f"Bearer {service.issuer.token(['platform-admins'], expires_in=-300)}"},
        "wrong audience": {"Authorization": f"Bearer {service.issuer.token(['platform-admins'], audience='kubernetes')}"},
    }
    for case, headers in bad.items():
        response = service.client.get(TENANTS, headers=headers)
        assert response.status_code == 401, case
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert len(service.cli.calls) == now


def test_a_caller_acts_only_on_the_tenants_its_groups_own(service):
    assert service.create(tenant(), "vision-admins")["state"] == "succeeded"
    owner, stranger = service.auth("vision-admins"), service.auth("speech-admins")
    assert service.client.get(f"{TENANTS}/vision", headers=owner).status_code == 200
    assert [t["name"] for t in service.client.get(TENANTS, headers=owner).json()] == ["vision"]
    assert service.client.get(TENANTS, headers=stranger).json() == []
    refused = [
        service.client.get(f"{TENANTS}/vision", headers=stranger),
        service.client.put(f"{TENANTS}/vision", json=tenant(owners={"groups": ["speech-admins"]}), headers=stranger),
        service.client.post(f"{TENANTS}/vision/preview", json=tenant(), headers=stranger),
        service.client.delete(f"{TENANTS}/vision", headers=stranger),
    ]
    assert [r.status_code for r in refused] == [403, 403, 403, 403]
    assert refused[0].json()["detail"] == "none of your groups owns tenant 'vision'"


def test_a_caller_cannot_claim_a_tenant_the_platform_registers_for_others(service):
    claim = {**registered("assistant").model_dump(mode="json"), "owners": {"groups": ["speech-admins"]}}
    response = service.client.post(TENANTS, json=claim, headers=service.auth("speech-admins"))
    assert response.status_code == 403
    assert service.create(registered("assistant").model_dump(mode="json"), "assistant-admins")["state"] == "succeeded"


def test_a_caller_cannot_hand_its_tenant_to_owners_it_is_not_one_of(service):
    service.create(tenant(), "vision-admins")
    response = service.client.put(f"{TENANTS}/vision", json=tenant(owners={"groups": ["speech-admins"]}), headers=service.auth("vision-admins"))
    assert response.status_code == 403
    assert "only admins hand a tenant over" in response.json()["detail"]


def test_platform_admins_act_on_every_tenant(service):
    service.create(tenant(), "vision-admins")
    admin = service.auth("platform-admins", sub="root")
    assert service.client.get(f"{TENANTS}/vision", headers=admin).status_code == 200
    assert [t["name"] for t in service.client.get(TENANTS, headers=admin).json()] == ["vision"]
    handed = service.finished(service.client.put(f"{TENANTS}/vision", json=tenant(owners={"groups": ["vision-team-b"]}), headers=admin), admin)
    assert handed["state"] == "succeeded"
    deleted = service.finished(service.client.delete(f"{TENANTS}/vision", headers=admin), admin)
    assert deleted["result"]["operation"] == "destroy"


def test_an_invalid_body_is_refused_with_every_problem_and_its_path(service):
    now = len(service.cli.calls)
    body = {"name": "Vision", "trust": "lo", "owners": {"groups": []}, "gpus": [{"pool": "h100-train", "count": 0}], "qouta": {}}
    response = service.client.post(TENANTS, json=body, headers=service.auth("vision-admins"))
    assert response.status_code == 422
    assert response.json() == {
        "detail": "tenant is invalid (5 problems):",
        "problems": [
            "tenant.gpus[0].count: must be >= 1",
            "tenant.name: 'Vision' does not match ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            "tenant.owners.groups: must have at least 1 item(s)",
            "tenant.qouta: unknown key (did you mean 'quota'?)",
            "tenant.trust: must be one of 'high', 'medium' or 'low'",
        ],
    }
    assert len(service.cli.calls) == now


def test_a_tenant_the_platform_cannot_host_is_refused_with_its_paths(service):
    greedy = tenant(gpus=[{"pool": "h100-train", "count": 8}])
    response = service.client.post(TENANTS, json=greedy, headers=service.auth("vision-admins"))
    assert response.status_code == 422
    assert [p.split(":")[0] for p in response.json()["problems"]] == ["tenant.gpus"]
    mismatch = service.client.put(f"{TENANTS}/speech", json=tenant(), headers=service.auth("vision-admins"))
    assert mismatch.status_code == 422
    assert mismatch.json()["problems"] == ["tenant.name: 'vision' is not the tenant of the path ('speech')"]


def test_a_job_reports_progress_and_a_structured_result(service):
    job = service.create(tenant(), "vision-admins")
    assert (job["operation"], job["environment"], job["tenant"]) == ("create", "dev", "vision")
    assert job["steps_done"] == 4
    assert "create kubernetes:core/v1:Namespace tenant-vision-namespace" in job["recent_steps"]
    assert job["result"]["changes"] == {"create": 4}
    assert job["result"]["outputs"]["namespace"] == "tenant-vision"
    assert service.client.get(f"/v1/jobs/{job['id']}", headers=service.auth("speech-admins", sub="user-2")).status_code == 404


def test_a_failed_job_says_why(service):
    service.cli.failures["up"] = "error: update failed\n  kubernetes:core/v1:Namespace (tenant-vision-namespace): connection refused"
    job = service.create(tenant(), "vision-admins")
    assert job["state"] == "failed"
    assert job["error"].startswith("pulumi failed:") and "connection refused" in job["error"]


def test_one_tenants_jobs_run_in_order_and_two_tenants_in_parallel(service):
    service.create(tenant(), "vision-admins")
    # vision's update holds until speech's has started: only if they run at once does it see that
    # (a wall-clock window instead would flake on a loaded machine).
    speech_up, overlapped = threading.Event(), []

    def hold(op: str, stack: str) -> None:
        if op == "up" and stack.endswith(".speech"):
            speech_up.set()
        elif op == "up" and stack.endswith(".vision"):
            overlapped.append(speech_up.wait(timeout=60))

    service.cli.on_operation = hold
    start = len(service.cli.calls)
    vision, speech = service.auth("vision-admins"), service.auth("speech-admins")
    responses = [
        (service.client.put(f"{TENANTS}/vision", json=tenant(owners={"groups": ["vision-admins"], "users": ["a@example.com"]}), headers=vision), vision),
        (service.client.delete(f"{TENANTS}/vision", headers=vision), vision),
        (service.client.post(TENANTS, json=tenant("speech"), headers=speech), speech),
    ]
    jobs = [service.finished(r, h) for r, h in responses]
    assert [j["state"] for j in jobs] == ["succeeded"] * 3
    runs = {(c.args[0], c.stack.rsplit(".", 1)[-1]): c for c in service.cli.calls[start:] if c.args[0] in ("up", "destroy")}
    assert runs[("destroy", "vision")].started >= runs[("up", "vision")].ended  # in submission order
    assert overlapped == [True]  # alongside the other tenant


def test_no_secret_or_token_in_responses_or_logs(service, caplog):
    caplog.set_level(logging.DEBUG)
    headers = service.auth("vision-admins")
    job = service.create(tenant(), "vision-admins")
    status = service.client.get(f"{TENANTS}/vision", headers=headers)
    assert status.json()["outputs"]["kubeconfig"] == "[secret]"
    service.client.get(TENANTS, headers={"Authorization": "Bearer forged.token.value"})
    token = headers["Authorization"].removeprefix("Bearer ")
    seen = "\n".join([caplog.text, status.text, str(job), *service.cli.lines()])
    for secret in (token, "forged.token.value", KUBECONFIG, "vcluster-admin-token", PASSPHRASE, REGISTRY_PASSWORD):
        assert secret not in seen
    assert f"job {job['id']}: create dev/vision succeeded" in caplog.text


def test_the_openapi_description_covers_the_tenant_api(service):
    spec = service.client.get("/openapi.json").json()
    assert set(spec["paths"]) == {
        "/v1/environments/{env}/tenants",
        "/v1/environments/{env}/tenants/{name}",
        "/v1/environments/{env}/tenants/{name}/preview",
        "/v1/jobs/{job_id}",
    }
    assert {"Tenant", "JobView", "TenantStatus", "StackResult"} <= set(spec["components"]["schemas"])
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_an_environment_the_service_does_not_manage_is_not_found(service):
    response = service.client.get("/v1/environments/prod/tenants", headers=service.auth("platform-admins"))
    assert response.status_code == 404



def test_the_service_is_built_from_the_environments_config(tmp_path, monkeypatch):
    fetched = []

    def offline(url, timeout, context=None):
        fetched.append(url)
        raise OSError("network unreachable")

    monkeypatch.setattr("ai_factory.stacks.auth.urllib.request.urlopen", offline)
    client = TestClient(service_app(ServiceSettings(environments=("dev",)), backend(tmp_path), project_dir=DEV_PROJECT))
    assert client.get("/healthz").json() == {"status": "ok"}
    response = client.get(TENANTS, headers={"Authorization": f"Bearer {Issuer().token(['g'])}"})
    assert response.status_code == 503  # the issuer is unreachable here...
    assert fetched == ["https://sso.par1.example.com/realms/ai-factory/.well-known/openid-configuration"]  # ...and it is dev's


def test_the_openapi_document_lists_every_answer_and_describes_every_field(service):
    schema = service.client.get("/openapi.json").json()
    create = schema["paths"]["/v1/environments/{env}/tenants"]["post"]["responses"]
    assert {"202", "401", "403", "404", "409", "422", "503"} <= set(create)
    job = schema["components"]["schemas"]["JobView"]["properties"]
    assert job["steps_done"]["description"].startswith("Resource steps the engine has completed")
    tenant = schema["components"]["schemas"]["Tenant"]["properties"]
    assert "Low-trust tenants get whole GPUs on dedicated nodes only" in tenant["trust"]["description"]


def test_an_unknown_environment_is_not_revealed_before_authentication(service):
    assert service.client.get("/v1/environments/nowhere/tenants").status_code == 401
    assert service.client.get("/v1/environments/nowhere/tenants", headers=service.auth("platform-admins")).status_code == 404


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """The job store's database: SQLite, and the PostgreSQL server `.ci/run` starts."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    url = os.environ.get("FACTORY_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("FACTORY_REQUIRE_POSTGRES"):
            pytest.fail("FACTORY_REQUIRE_POSTGRES is set but FACTORY_TEST_POSTGRES_URL is not")
        pytest.skip("no FACTORY_TEST_POSTGRES_URL (.ci/run starts a PostgreSQL server)")
    with sqlalchemy.create_engine(url).begin() as db:  # a clean table per test
        db.execute(sqlalchemy.text("DROP TABLE IF EXISTS tenant_api_jobs"))
    return url


def test_jobs_survive_a_restart_of_the_service_and_unfinished_ones_are_marked_failed(tmp_path, issuer, store_url):
    cli, _, tenants = deployed_platform(tmp_path)
    verifier = TokenVerifier(Jwks(ISSUER, issuer.fetch), audience=AUDIENCE, admin_group="platform-admins")
    settings = ServiceSettings(environments=("dev",), database_url=store_url)
    first = TestClient(create_app(tenants, verifier, settings))
    owner = {"Authorization": f"Bearer {issuer.token(['vision-admins'])}"}
    done = first.post(TENANTS, json=tenant(), headers=owner)
    location = done.headers["Location"]
    assert job_outcome(first, location, owner)["state"] == "succeeded"
    stalled = JobStore(store_url)
    stalled.save("0" * 32, {"operation": "update", "environment": "dev", "tenant": "vision", "state": "running", "id": "0" * 32, "submitted_at": "2026-12-01T00:00:00Z"}, frozenset({"vision-admins"}), "user-1")

    restarted = TestClient(create_app(tenants, verifier, settings))
    assert restarted.get(location, headers=owner).json()["state"] == "succeeded"
    interrupted = restarted.get(f"/v1/jobs/{'0' * 32}", headers=owner).json()
    assert (interrupted["state"], interrupted["error"]) == ("failed", "the tenant API service stopped while it was running")
    assert restarted.get(location, headers={"Authorization": f"Bearer {issuer.token(['speech-admins'], sub='user-2')}"}).status_code == 404


@pytest.mark.parametrize(
    "case, method, path, body, status",
    [
        ("tenant name over the stack-name bound", "get", f"{TENANTS}/{'a' * 41}", None, 422),
        ("tenant name of 10,000 characters", "delete", f"{TENANTS}/{'a' * 10_000}", None, 422),
        ("environment name over the bound", "get", f"/v1/environments/{'e' * 41}/tenants", None, 422),
        ("job id that is no job id", "get", f"/v1/jobs/{'x' * 5000}", None, 422),
        ("body tenant name over the bound", "post", TENANTS, {"name": "v" * 50}, 422),
        ("200,000 owner groups", "post", TENANTS, {"owners": {"groups": ["g"] * 200_000}}, 413),
        ("101 owner groups", "post", TENANTS, {"owners": {"groups": [f"g{i}" for i in range(101)]}}, 422),
    ],
)
def test_oversized_requests_are_refused_with_a_4xx(service, case, method, path, body, status):
    now = len(service.cli.calls)
    kwargs = {"json": tenant(**body)} if body is not None else {}
    response = getattr(service.client, method)(path, headers=service.auth("platform-admins"), **kwargs)
    assert response.status_code == status, (case, response.text)
    assert len(service.cli.calls) == now


def test_a_streamed_body_over_the_bound_is_refused_before_it_is_read_whole(service):
    chunks = (b"x" * 1024 for _ in range(200))
    response = service.client.post(TENANTS, content=chunks, headers={**service.auth("platform-admins"), "Content-Type": "application/json"})
    assert response.status_code == 413


def test_an_overlong_token_is_refused_unread(service):
    response = service.client.get(TENANTS, headers={"Authorization": f"Bearer {'a' * 9000}"})
    assert response.status_code == 401
    assert "exceeds" in response.json()["detail"]
