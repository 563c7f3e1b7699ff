"""The tenant API service: tenant stacks over HTTP, for other services and for people.

    ai-factory-stacks serve --environment dev            # http://127.0.0.1:8080/docs

A thin layer over `stacks.tenants.TenantStacks`: it authenticates, authorises, validates, runs
long operations as jobs, and maps errors to status codes; every decision about tenants lives in
the Python API.

- Authentication: `Authorization: Bearer <token>`, an OIDC token of the platform's issuer
  (`identity.issuer_url` of the environments served), for this service's audience (`stacks.auth`).
- Authorisation: a caller acts on a tenant when one of its groups owns the tenant
  (`owners.groups`: of the deployed tenant, else of the platform's registration of it, else of the
  tenant being created); members of the admin group act on every tenant. A caller cannot hand a
  tenant to owners it is not one of.
- Validation: bodies are `Tenant` models (the platform config's); a bad body is refused with 422
  and every problem with its path (`tenant.gpus[0].count: must be >= 1`), as `factory` reports
  config errors, and so is a tenant the platform contract refuses.
- Jobs: create, update, preview and delete answer 202 with a job (`Location: /v1/jobs/<id>`) and
  run in the background: one tenant's jobs in submission order, different tenants' in parallel.
  Jobs are kept in a database (`stacks.jobstore`: SQLite by default, PostgreSQL by URL), so they
  survive a restart; one that a stopped process left unfinished is marked failed.
- Secrets: no response carries one (secret stack outputs are `[secret]`); tokens are never logged.

Why FastAPI (with uvicorn): the request models *are* the library's pydantic models, so the
OpenAPI description (`/openapi.json`, `/docs`) and the validation come from the same types as the
config, and `TestClient` exercises the real app without a server. The standard library's
`http.server` would need a hand-written OpenAPI document, validation and a production server.
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoints' annotations at runtime.
import logging
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path as FilePath
from typing import Annotated, Callable, Literal

from fastapi import Body, Depends, FastAPI, HTTPException, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pulumi.automation import CommandError
from pulumi.automation.events import EngineEvent
from pydantic import BaseModel, ConfigDict

from ai_factory.factory.model.config import Tenant
from ai_factory.factory.model.loading import ConfigError, load_stack_file, stack_file, validate_tenant
from ai_factory.stacks.auth import AuthError, Caller, IssuerUnavailable, Jwks, TokenVerifier, issuer_ssl_context
from ai_factory.stacks.backend import MAX_NAME, Backend, BackendError, InvalidName, StackResult, check_name
from ai_factory.stacks.contract import ContractError
from ai_factory.stacks.jobstore import JobStore
from ai_factory.stacks.tenants import PlatformUpdateFailed, TenantExists, TenantNotFound, TenantRecord, TenantStacks, TenantStatus, TenantSummary

log = logging.getLogger("ai_factory.stacks.service")

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
JOB_ID_PATTERN = r"^[0-9a-f]{32}$"
RECENT_STEPS = 50
MAX_BODY_BYTES = 64 * 1024
"""Largest request body: a tenant is a few hundred bytes; anything near this is an attack."""
MAX_TOKEN_BYTES = 8 * 1024
"""Longest bearer token read (an OIDC access token is far shorter); a longer one is refused unread."""
MAX_LIST_ITEMS = 100
"""Most items of any list in a tenant body (owner groups, GPU requests, ...)."""

Operation = Literal["create", "update", "preview", "delete", "onboard", "offboard"]
DESCRIPTION = """Tenant environments of the ai-factory platform, one Pulumi stack per tenant.

Authenticate with an OIDC bearer token of the platform's issuer. You act on the tenants one of
your groups owns (`owners.groups`); platform admins on all. Create, update, preview and delete
answer `202` with a job: poll `GET /v1/jobs/{id}` (its `Location`) until it has `succeeded` or
`failed`. Invalid tenants are refused with `422` and every problem with its path."""


class Forbidden(Exception):
    """The caller is authenticated but may not do this (HTTP 403)."""


class BodyTooLarge(HTTPException):
    """A request body over `MAX_BODY_BYTES` (HTTP 413). An `HTTPException`, so that FastAPI's body
    reading passes it on instead of turning it into a 400."""

    def __init__(self) -> None:
        super().__init__(413, f"the request body exceeds {MAX_BODY_BYTES} bytes")


class BodyLimit:
    """ASGI middleware refusing a body over `MAX_BODY_BYTES`, by its Content-Length before reading
    or, when streamed, as soon as what arrived exceeds it: the service never holds more."""

    def __init__(self, app: Callable, limit: int = MAX_BODY_BYTES) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await _reply(send, 413, f"the request body exceeds {self.limit} bytes")
        received = 0

        async def limited() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b"")) if message["type"] == "http.request" else 0
            if received > self.limit:
                raise BodyTooLarge()
            return message

        await self.app(scope, limited, send)


async def _reply(send: Callable, status: int, detail: str) -> None:
    body = Problems(detail=detail).model_dump_json().encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def overlong_lists(value: object, path: str = "tenant") -> list[str]:
    """A problem line for every list of a body longer than `MAX_LIST_ITEMS`, with its path."""
    if isinstance(value, dict):
        return [line for key, item in value.items() for line in overlong_lists(item, f"{path}.{key}")]
    if isinstance(value, list):
        if len(value) > MAX_LIST_ITEMS:
            return [f"{path}: at most {MAX_LIST_ITEMS} items (got {len(value)})"]
        return [line for i, item in enumerate(value) for line in overlong_lists(item, f"{path}[{i}]")]
    return []


class ServiceSettings(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    environments: tuple[str, ...]
    """The environments (platform stacks) whose tenants the service manages."""
    audience: str = "ai-factory-tenants"
    """The audience tokens must carry: this service's client id at the issuer."""
    admin_group: str = "platform-admins"
    """Members of this group act on every tenant."""
    database_url: str | None = None
    """Where jobs are kept (an SQLAlchemy URL): `postgresql+psycopg://...` for several replicas;
    by default an SQLite file in the state directory."""
    issuer_ca: FilePath | None = None
    """CA bundle (PEM) the issuer's certificate chains to, when it is not a public CA; trusted for
    the issuer's discovery and key requests only."""


# --------------------------------------------------------------------------- jobs


class JobView(BaseModel):
    """A job: one operation on one tenant's stack, run in the background."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    id: str
    operation: Operation
    environment: str
    tenant: str
    state: Literal["queued", "running", "succeeded", "failed"]
    submitted_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    steps_done: int = 0
    """Resource steps the engine has completed so far."""
    recent_steps: list[str] = []
    """The latest resource steps (`create kubernetes:core/v1:Namespace tenant-x-namespace`)."""
    result: StackResult | None = None
    error: str | None = None
    problems: list[str] = []
    """When the tenant was refused: every problem, with its path."""
    phases: list[str] = []
    """Onboarding and offboarding: the steps done so far (registered, platform updated, tenant stack created)."""


@dataclass
class Job:
    view: JobView
    owners: frozenset[str]
    """Groups that may see the job: the tenant's owners of record when it was submitted."""
    subject: str
    work: Callable[["Job"], StackResult]
    persist: Callable[["Job"], None] = lambda job: None
    """Writes the job to the store (set by `Jobs.submit`)."""
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))

    def on_event(self, event: EngineEvent) -> None:
        if event.resource_pre_event is not None:
            step = event.resource_pre_event.metadata
            self.recent.append(f"{step.op.value} {step.type} {step.urn.rsplit('::', 1)[-1]}")
        if event.res_outputs_event is not None:
            self.view.steps_done += 1

    def on_phase(self, phase: str) -> None:
        self.view.phases.append(phase)
        self.persist(self)

    def snapshot(self) -> JobView:
        return self.view.model_copy(update={"recent_steps": list(self.recent)})


class Jobs:
    """Background jobs: per tenant a queue drained by one thread, so that one tenant's jobs run
    in submission order and different tenants' in parallel. Every change of state is written to
    the job store (`stacks.jobstore`), which answers for jobs this process is not running."""

    def __init__(self, store: JobStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._queues: dict[str, deque[Job]] = {}
        if interrupted := store.interrupted("the tenant API service stopped"):
            log.warning("%d job(s) interrupted by a restart marked failed", interrupted)

    def _save(self, job: Job) -> None:
        self._store.save(job.view.id, job.snapshot().model_dump(mode="json"), job.owners, job.subject)

    def submit(self, job: Job) -> Job:
        key = f"{job.view.environment}.{job.view.tenant}"
        job.persist = self._save
        self._save(job)
        with self._lock:
            self._jobs[job.view.id] = job
            queue = self._queues.setdefault(key, deque())
            queue.append(job)
            if len(queue) == 1:
                threading.Thread(target=self._drain, args=(key,), name=f"tenant-{key}", daemon=True).start()
        log.info("job %s: %s %s/%s queued", job.view.id, job.view.operation, job.view.environment, job.view.tenant)
        return job

    def get(self, job_id: str) -> tuple[JobView, frozenset[str], str] | None:
        """The job (live when this process runs it), its owners and its submitter."""
        if (job := self._jobs.get(job_id)) is not None:
            return job.snapshot(), job.owners, job.subject
        if (stored := self._store.load(job_id)) is None:
            return None
        view, owners, subject = stored
        return JobView.model_validate(view), owners, subject

    def _drain(self, key: str) -> None:
        while True:
            with self._lock:
                job = self._queues[key][0]
            self._run(job)
            self._save(job)
            with self._lock:
                self._jobs.pop(job.view.id, None)
                self._queues[key].popleft()
                if not self._queues[key]:
                    del self._queues[key]
                    return

    def _run(self, job: Job) -> None:
        view = job.view
        view.state, view.started_at = "running", _now()
        self._save(job)
        log.info("job %s: %s %s/%s started", view.id, view.operation, view.environment, view.tenant)
        try:
            view.result, view.state = job.work(job), "succeeded"
        except ConfigError as err:
            view.state, view.error, view.problems = "failed", err.render().splitlines()[0], err.problems
        except (TenantExists, TenantNotFound, ContractError, BackendError, PlatformUpdateFailed) as err:
            view.state, view.error = "failed", str(err)
        except CommandError as err:
            # The engine masks secrets in what it prints; keep the end, where the error is.
            view.state, view.error = "failed", "pulumi failed:\n" + "\n".join(str(err).strip().splitlines()[-20:])
        except Exception as err:  # noqa: BLE001 a job reports every failure instead of dying silently
            log.exception("job %s: unexpected failure", view.id)
            view.state, view.error = "failed", f"unexpected {type(err).__name__}"
        view.finished_at = _now()
        log.info("job %s: %s %s/%s %s", view.id, view.operation, view.environment, view.tenant, view.state)


def _now() -> datetime:
    return datetime.now(timezone.utc)


# --------------------------------------------------------------------------- the app


class Problems(BaseModel):
    """Why a request was refused."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    detail: str
    """One line."""
    problems: list[str] = []
    """Every problem, with its path (`tenant.gpus[0].count: ...`), when there are several."""


def create_app(tenants: TenantStacks, verifier: TokenVerifier, settings: ServiceSettings, store: JobStore | None = None) -> FastAPI:
    """`store`: where jobs are kept; by default the SQLite file of `settings.database_url`."""
    app = FastAPI(
        title="ai-factory tenant API",
        version="1",
        description=DESCRIPTION,
        responses={
            401: {"model": Problems, "description": "No acceptable bearer token"},
            403: {"model": Problems, "description": "None of the caller's groups owns the tenant"},
            404: {"model": Problems, "description": "No such environment, tenant or job (for this caller)"},
            413: {"model": Problems, "description": f"The request body exceeds {MAX_BODY_BYTES} bytes"},
            422: {"model": Problems, "description": "The request or the tenant is invalid: every problem with its path"},
            503: {"model": Problems, "description": "The issuer's keys or the state backend cannot be reached"},
        },
    )
    conflict = {409: {"model": Problems, "description": "The tenant exists already, or the platform contract refuses it"}}
    if store is None:
        tenants.backend.state_dir.mkdir(parents=True, exist_ok=True)
        store = JobStore(settings.database_url or f"sqlite:///{tenants.backend.state_dir / 'tenant-api.db'}")
    jobs = Jobs(store)
    bearer = HTTPBearer(auto_error=False, description="An OIDC access token of the platform's issuer")

    def caller(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Caller:
        if credentials is None:
            raise AuthError("a bearer token is required")
        if len(credentials.credentials) > MAX_TOKEN_BYTES:
            raise AuthError(f"the bearer token exceeds {MAX_TOKEN_BYTES} bytes")
        return verifier.verify(credentials.credentials)

    def environment(env: Annotated[str, Path(pattern=NAME_PATTERN, max_length=MAX_NAME)], who: Annotated[Caller, Depends(caller)]) -> str:
        """Known only to authenticated callers: an unknown environment answers 404 after 401."""
        if env not in settings.environments:
            raise HTTPException(404, f"this service manages no environment {env!r}")
        return env

    Who = Annotated[Caller, Depends(caller)]
    Env = Annotated[str, Depends(environment)]
    Name = Annotated[str, Path(pattern=NAME_PATTERN, max_length=MAX_NAME)]
    TenantBody = Annotated[Tenant, Body(description="The tenant, as in the platform config's `tenants`.")]

    def submit(op: Operation, env: str, name: str, who: Caller, owners: frozenset[str], work: Callable[[Job], StackResult]) -> JSONResponse:
        view = JobView(id=uuid.uuid4().hex, operation=op, environment=env, tenant=name, state="queued", submitted_at=_now())
        jobs.submit(Job(view=view, owners=owners, subject=who.subject, work=work))
        log.info("job %s: submitted by %s", view.id, who.subject)
        return JSONResponse(view.model_dump(mode="json"), status_code=202, headers={"Location": f"/v1/jobs/{view.id}"})

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/environments/{env}/tenants", response_model=list[TenantSummary], summary="The tenants the caller may act on")
    def list_tenants(env: Env, who: Who) -> list[TenantSummary]:
        return [t for t in tenants.list(env) if who.may_act_for(t.owners)]

    @app.post(
        "/v1/environments/{env}/tenants",
        status_code=202,
        response_model=JobView,
        responses=conflict,
        summary="Create a tenant (a job); one the platform does not register onboards itself where `self_service` allows",
    )
    def create(env: Env, tenant: TenantBody, who: Who) -> JSONResponse:
        tenant = _revalidated(tenant)
        record = tenants.record(env, tenant.name)
        owners = _authorise_change(who, record, tenant)
        if record.exists:
            raise TenantExists(f"tenant {tenant.name!r} of {env} exists already")
        if record.registered is None:  # not in the platform's `tenants`: it may onboard itself
            tenants.onboarding_check(env, tenant)
            return submit("onboard", env, tenant.name, who, owners, lambda job: tenants.onboard(env, tenant, on_phase=job.on_phase, on_event=job.on_event))
        tenants.check(env, tenant)
        return submit("create", env, tenant.name, who, owners, lambda job: tenants.create(env, tenant, on_event=job.on_event))

    @app.get("/v1/environments/{env}/tenants/{name}", response_model=TenantStatus, summary="A tenant's status")
    def status(env: Env, name: Name, who: Who) -> TenantStatus:
        _authorise(who, _existing(tenants.record(env, name), env, name), name)
        return tenants.status(env, name)

    @app.put("/v1/environments/{env}/tenants/{name}", status_code=202, response_model=JobView, responses=conflict, summary="Update a tenant (a job)")
    def update(env: Env, name: Name, tenant: TenantBody, who: Who) -> JSONResponse:
        tenant = _revalidated(tenant, name)
        owners = _authorise_change(who, _existing(tenants.record(env, name), env, name), tenant)
        tenants.check(env, tenant)
        return submit("update", env, name, who, owners, lambda job: tenants.update(env, tenant, on_event=job.on_event))

    @app.post("/v1/environments/{env}/tenants/{name}/preview", status_code=202, response_model=JobView, responses=conflict, summary="Preview a create or update (a job)")
    def preview(env: Env, name: Name, tenant: TenantBody, who: Who) -> JSONResponse:
        tenant = _revalidated(tenant, name)
        owners = _authorise_change(who, tenants.record(env, name), tenant)
        tenants.check(env, tenant)
        return submit("preview", env, name, who, owners, lambda job: tenants.preview(env, tenant, on_event=job.on_event))

    @app.delete("/v1/environments/{env}/tenants/{name}", status_code=202, response_model=JobView, summary="Delete a tenant (a job); protected resources are kept")
    def delete(env: Env, name: Name, who: Who) -> JSONResponse:
        owners = _authorise(who, _existing(tenants.record(env, name), env, name), name)
        if tenants.self_service(env, name):
            return submit("offboard", env, name, who, owners, lambda job: tenants.offboard(env, name, on_phase=job.on_phase, on_event=job.on_event))
        return submit("delete", env, name, who, owners, lambda job: tenants.delete(env, name, on_event=job.on_event))

    @app.get("/v1/jobs/{job_id}", response_model=JobView, summary="A job's state, progress and result")
    def job(job_id: Annotated[str, Path(pattern=JOB_ID_PATTERN)], who: Who) -> JobView:
        found = jobs.get(job_id)
        if found is None or not (who.may_act_for(found[1]) or who.subject == found[2]):
            raise HTTPException(404, f"no job {job_id}")
        return found[0]

    _install_error_handlers(app)
    app.add_middleware(BodyLimit)
    return app


def _revalidated(tenant: Tenant, name: str | None = None) -> Tenant:
    """The body once more through the config's own validation (its tenant rules, its messages)."""
    if name is not None and tenant.name != name:
        raise ConfigError([f"tenant.name: {tenant.name!r} is not the tenant of the path ({name!r})"], source="tenant")
    body = tenant.model_dump(mode="json")
    problems = overlong_lists(body)
    if len(tenant.name) > MAX_NAME:
        problems.insert(0, f"tenant.name: at most {MAX_NAME} characters (its stack name is a DNS label)")
    if problems:
        raise ConfigError(problems, source="tenant")
    return validate_tenant(body)


def _existing(record: TenantRecord, env: str, name: str) -> TenantRecord:
    if not record.exists:
        raise TenantNotFound(f"tenant {name!r} of {env} has no stack")
    return record


def _owners_of_record(record: TenantRecord, proposed: Tenant | None) -> frozenset[str]:
    """Who owns the tenant now: the deployed tenant's owners, else the platform's registration's,
    else (a tenant being created) the proposed owners. A stack holding no deployed tenant and no
    registration (a create that failed) is the admins' only."""
    for tenant in (record.deployed, record.registered, None if record.exists else proposed):
        if tenant is not None:
            return frozenset(tenant.owners.groups)
    return frozenset()


def _authorise(who: Caller, record: TenantRecord, name: str) -> frozenset[str]:
    owners = _owners_of_record(record, None)
    if not who.may_act_for(owners):
        raise Forbidden(f"none of your groups owns tenant {name!r}")
    return owners


def _authorise_change(who: Caller, record: TenantRecord, tenant: Tenant) -> frozenset[str]:
    owners = _owners_of_record(record, tenant)
    if not who.may_act_for(owners):
        raise Forbidden(f"none of your groups owns tenant {tenant.name!r}")
    if not who.may_act_for(tenant.owners.groups):
        raise Forbidden("the tenant's owners must include one of your groups (only admins hand a tenant over)")
    return owners | frozenset(tenant.owners.groups)


def _install_error_handlers(app: FastAPI) -> None:
    def problems(status: int, detail: str, lines: list[str] = (), headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(Problems(detail=detail, problems=list(lines)).model_dump(), status_code=status, headers=headers)

    @app.exception_handler(AuthError)
    def unauthenticated(request: Request, err: AuthError) -> JSONResponse:
        log.info("refused %s %s: %s", request.method, request.url.path, err)
        return problems(401, str(err), headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})

    @app.exception_handler(Forbidden)
    def forbidden(request: Request, err: Forbidden) -> JSONResponse:
        log.info("forbidden %s %s: %s", request.method, request.url.path, err)
        return problems(403, str(err))

    @app.exception_handler(ConfigError)
    def invalid(request: Request, err: ConfigError) -> JSONResponse:
        return problems(422, err.render().splitlines()[0], err.problems)

    @app.exception_handler(InvalidName)
    def invalid_name(request: Request, err: InvalidName) -> JSONResponse:
        return problems(422, str(err))

    @app.exception_handler(RequestValidationError)
    def invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
        if any(e["loc"][:1] == ("body",) for e in err.errors()) and isinstance(err.body, dict):
            if overlong_lists(err.body):
                return invalid(request, ConfigError(overlong_lists(err.body), source="tenant"))
            try:  # the config's own messages, every problem at once
                validate_tenant(err.body)
            except ConfigError as config_error:
                return invalid(request, config_error)
        lines = [f"{'.'.join(str(p) for p in e['loc'][1:]) or e['loc'][0]}: {e['msg']}" for e in err.errors()]
        return problems(422, f"request is invalid ({len(lines)} problem{'s' if len(lines) != 1 else ''})", lines)

    @app.exception_handler(TenantNotFound)
    def not_found(request: Request, err: TenantNotFound) -> JSONResponse:
        return problems(404, str(err))

    @app.exception_handler(TenantExists)
    def exists(request: Request, err: TenantExists) -> JSONResponse:
        return problems(409, str(err))

    @app.exception_handler(ContractError)
    def no_contract(request: Request, err: ContractError) -> JSONResponse:
        return problems(409, str(err))

    @app.exception_handler(BackendError)
    @app.exception_handler(IssuerUnavailable)
    def unavailable(request: Request, err: Exception) -> JSONResponse:
        log.error("%s %s: %s", request.method, request.url.path, err)
        return problems(503, str(err))


def service_app(settings: ServiceSettings, backend: Backend, *, project_dir: FilePath | None = None) -> FastAPI:
    """The service for `settings.environments`, trusting the issuer their configuration names
    (`identity`); the signing keys are fetched when the first token arrives."""
    identities = set()
    for env in settings.environments:
        check_name("environment", env)
        identity = load_stack_file(env, project_dir).identity
        if identity is None:
            raise ConfigError([f"identity: required to serve the tenants of {env} (the issuer of the callers' tokens)"], source=str(stack_file(env, project_dir)))
        identities.add((identity.issuer_url, identity.groups_claim))
    if len(identities) != 1:
        raise ConfigError([f"identity: the environments served name different issuers or group claims {sorted(identities)}; run one service per issuer"])
    issuer, groups_claim = identities.pop()
    jwks = Jwks(issuer, ssl_context=issuer_ssl_context(str(settings.issuer_ca) if settings.issuer_ca else None))
    verifier = TokenVerifier(jwks, audience=settings.audience, admin_group=settings.admin_group, groups_claim=groups_claim)
    return create_app(TenantStacks(backend, project_dir=project_dir), verifier, settings)
