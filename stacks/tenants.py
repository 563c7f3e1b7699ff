"""Tenant stacks: one Pulumi stack per tenant and environment, so that a tenant change can never
touch another tenant or the platform.

    tenants = TenantStacks(Backend())
    tenants.create("dev", {"name": "partner-acme", "trust": "low", "owners": {"groups": ["partner-acme"]}, "gpus": [...]})
    tenants.status("dev", "partner-acme").last_operation.result
    tenants.delete("dev", "partner-acme").kept    # protected resources stay, and say so

Stacks are `<org>/ai-factory-tenant/<env>.<tenant>`; in a multi-cluster environment a tenant has
one stack per cluster it is on, `<env>-<cluster>.<tenant>`, built against that cluster's platform
stack `<env>-<cluster>` and its provider settings (`kubernetes:context`), each operation running
on every one of them in the sites' order (one result per cluster, `StackResult.clusters`).
Their program (`tenant_program`, inline) reads the tenant from the stack's config and the platform contract through a `StackReference`, then
builds one `TenantStack`. Before anything runs, the tenant is validated (every problem, with its
path) and checked against the contract: the platform registers its tenants and decides
everything about them but their owners (`stacks.contract`). Operations on one tenant run one at a time (in order), on different
tenants in parallel. Each tenant stack keeps its workspace (`Pulumi.yaml`, `Pulumi.<stack>.yaml`)
in `<state_dir>/tenants/<env>.<tenant>/`.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pulumi
import yaml
from pulumi import automation as auto
from pydantic import BaseModel, ConfigDict

from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.model import bounded_yaml
from ai_factory.factory.model.raw import as_dict, as_list
from ai_factory.factory.model.loading import project_dir as current_project
from ai_factory.factory.model.clusters import cluster_view, clusters, is_multi_cluster, manager, tenant_clusters
from ai_factory.factory.model.loading import ConfigError, load_stack_file, project_name, read_stack_file, stack_file, validate, validate_tenant, with_registered_tenants
from ai_factory.factory.model.onboarding import REGISTRY_DIR, is_registered, register, self_service_problems, unregister
from ai_factory.factory.planning.from_config import plan_for, previous_plan
from ai_factory.components.registry import tenant_hooks
from ai_factory.factory.rendering.platform import own_tenant_stack
from ai_factory.stacks import backend as ops
from ai_factory.factory.rendering.bundle import cluster_stack
from ai_factory.stacks.backend import Backend, KeyedLocks, OnEvent, OnOutput, StackResult, check_name, combined
from ai_factory.stacks.contract import CONTRACT_OUTPUT, CONTRACT_SECRETS_OUTPUT, ContractError, PlatformContract, owner_conflicts
from ai_factory.stacks.fleet import FleetStacks, cluster_provider_config
from ai_factory.stacks.platform import PlatformStacks

TENANT_PROJECT = "ai-factory-tenant"
TENANT_KEY = f"{TENANT_PROJECT}:tenant"
"""Stack config: the tenant, as JSON."""
PLATFORM_KEY = f"{TENANT_PROJECT}:platform"
"""Stack config: the platform stack whose contract the tenant is built against."""
TENANT_OUTPUTS = ("namespace", "control_plane", "group_subjects", "local_queue", "labels")
"""`TenantStack` outputs the tenant stack exports (with `tenant`, the tenant as deployed): the
names other services use to reach the tenant's environment."""
PROVIDER_NAMESPACES = ("kubernetes",)
"""Provider settings a tenant stack takes from its platform's stack file, so that it targets the
same cluster (`kubernetes:context`, ...)."""

TenantInput = Tenant | Mapping[str, Any]
OnPhase = Callable[[str], Any]
"""Told each step of an onboarding or offboarding as it completes."""


class TenantNotFound(LookupError):
    pass


class TenantExists(Exception):
    pass


class PlatformUpdateFailed(Exception):
    """The update of one or more of a multi-cluster environment's platform stacks failed while
    onboarding or offboarding a tenant (each named with the CLI's error)."""

    def __init__(self, message: str, updated: Iterable[str] = ()):
        super().__init__(message)
        self.updated = list(updated)
        """The clusters whose update succeeded."""


# --------------------------------------------------------------------------- the program


async def tenant_program() -> None:
    """The program of every tenant stack: one tenant's environment, against its platform's contract."""
    config = pulumi.Config(TENANT_PROJECT)
    source = f"stack {pulumi.get_stack()}"
    try:
        tenant = validate_tenant(config.require_object("tenant"), source=source)
    except ConfigError as err:
        raise pulumi.RunError(err.render()) from None
    platform_stack = config.require("platform")
    platform = pulumi.StackReference("platform", stack_name=platform_stack)
    exported = await platform.get_output_details(CONTRACT_OUTPUT)
    secrets = await platform.get_output_details(CONTRACT_SECRETS_OUTPUT)
    try:
        contract = PlatformContract.from_output(exported.value, platform_stack)
        if secrets.secret_value is None:
            raise ContractError(f"platform stack {platform_stack} exports no secret {CONTRACT_SECRETS_OUTPUT!r}: deploy it again")
        cfg, plan = contract.config(secrets.secret_value), contract.capacity_plan()
    except ContractError as err:
        raise pulumi.RunError(str(err)) from None
    # Checked before the CLI ran too; checked again against the contract the engine read.
    if problems := contract.tenant_problems(tenant):
        raise pulumi.RunError(ConfigError(problems, source=source).render())
    placed = next(t for t in cfg.tenants if t.name == tenant.name)  # on one cluster of several: its demands there
    stack = own_tenant_stack(cfg, plan, placed, tenant_hooks(cfg, plan))
    assert stack is not None  # built: no render cache here
    pulumi.export("tenant", tenant.model_dump(mode="json"))
    for output in TENANT_OUTPUTS:
        pulumi.export(output, getattr(stack, output))


# --------------------------------------------------------------------------- results


class TenantSummary(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    name: str
    cluster: str | None = None
    """The cluster the stack builds the tenant on, in a multi-cluster environment."""
    stack: str
    owners: list[str]
    """The deployed tenant's owner groups (empty until an update succeeded)."""
    last_update: datetime | None
    resource_count: int | None
    update_in_progress: bool | None


class LastOperation(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    kind: str
    """`update`, `destroy`, `refresh`, ..."""
    result: str
    """`succeeded`, `failed` or `in-progress`."""
    started: datetime
    ended: datetime | None
    changes: dict[str, int]


class TenantStatus(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    environment: str
    name: str
    stack: str
    tenant: Tenant | None
    """The tenant as last deployed."""
    last_operation: LastOperation | None
    outputs: dict[str, Any]
    """The stack's outputs; secret ones are `[secret]`."""


@dataclasses.dataclass(frozen=True)
class TenantRecord:
    """What is known of a tenant before acting on it: what is deployed, what the platform registers."""

    deployed: Tenant | None
    exists: bool
    registered: Tenant | None


# --------------------------------------------------------------------------- the API


class TenantStacks:
    def __init__(
        self,
        backend: Backend | None = None,
        *,
        platforms: PlatformStacks | None = None,
        fleet: FleetStacks | None = None,
        project_dir: Path | None = None,
        pulumi_command: auto.PulumiCommand | None = None,
    ):
        self.backend = backend or Backend()
        self.project_dir = project_dir or current_project()
        self.platforms = platforms or PlatformStacks(self.backend, project_dir=project_dir, pulumi_command=pulumi_command)
        self.fleet = fleet or FleetStacks(self.backend, project_dir=self.project_dir, pulumi_command=pulumi_command)
        """A multi-cluster environment's platform stacks, updated on onboarding and offboarding."""
        self._pulumi_command = pulumi_command
        self._locks = KeyedLocks()
        self._project_workspace_lock = threading.Lock()
        self._project_workspace_cache: auto.LocalWorkspace | None = None

    def stack_name(self, env: str, name: str, cluster: str | None = None) -> str:
        return self.backend.stack_name(TENANT_PROJECT, _short_name(env, name, cluster))

    def clusters(self, env: str, name: str) -> list[str | None]:
        """The clusters whose stacks build the tenant, in the sites' order; `[None]` (its one
        stack) in an environment without clusters. A tenant the environment does not register
        is looked up on the manager, whose contract then says so."""
        cfg = self._fleet(env)
        if cfg is None:
            return [None]
        registered = next((t for t in cfg.tenants if t.name == name), None)
        head = manager(cfg)
        return tenant_clusters(cfg, registered) if registered is not None else [head.name if head else clusters(cfg)[0].name]

    def check(self, env: str, tenant: TenantInput) -> Tenant:
        """The tenant, validated and checked against the environment's platform contract
        (`ConfigError` listing every problem with its path). Reads only; runs no program."""
        check_name("environment", env)
        tenant = validate_tenant(tenant.model_dump(mode="json") if isinstance(tenant, Tenant) else tenant)
        contracts = [self.platforms.contract(env, cluster) for cluster in self.clusters(env, tenant.name)]
        problems = list(dict.fromkeys(p for contract in contracts for p in contract.tenant_problems(tenant)))
        problems += owner_conflicts(tenant, self._owners(env, contracts[0].registered_owners()))
        if problems:
            raise ConfigError(problems, source=f"tenant {tenant.name!r} of {env}")
        return tenant

    def onboarding_check(self, env: str, tenant: TenantInput) -> Tenant:
        """A tenant the platform does not register yet, checked against the environment's
        self-service rules (`self_service`), the owners of every other tenant and the capacity the
        plan has free (planned from the lock: no other tenant's GPUs move). Reads only."""
        check_name("environment", env)
        tenant = validate_tenant(tenant.model_dump(mode="json") if isinstance(tenant, Tenant) else tenant)
        path = stack_file(env, self.project_dir)
        raw = with_registered_tenants(read_stack_file(path)[0], env, path.resolve().parent)
        cfg = validate(raw, source=f"environment {env}")
        if any(t.name == tenant.name for t in cfg.tenants):
            raise TenantExists(f"tenant {tenant.name!r} of {env} is registered already")
        problems = self_service_problems(cfg, tenant, env)
        problems += owner_conflicts(tenant, self._owners(env, {t.name: t.owners.groups for t in cfg.tenants}))
        if problems:
            raise ConfigError(problems, source=f"tenant {tenant.name!r} of {env}")
        with_tenant = validate({**raw, "tenants": [*raw.get("tenants", []), tenant.model_dump(mode="json")]}, source=f"tenant {tenant.name!r} of {env}")
        # A shortfall is a ConfigError naming the demand; on each cluster the tenant lands on, from
        # that cluster's lock (no other cluster's view changes).
        if is_multi_cluster(with_tenant):
            for cluster in tenant_clusters(with_tenant, tenant):
                plan_for(cluster_view(with_tenant, cluster), previous_plan(cluster_stack(env, cluster), self.project_dir))
        else:
            plan_for(with_tenant, previous_plan(env, self.project_dir))
        return tenant

    def onboard(
        self, env: str, tenant: TenantInput, *, on_phase: OnPhase | None = None, on_output: OnOutput | None = None, on_event: OnEvent | None = None
    ) -> StackResult:
        """A new self-service tenant end to end: registered (`tenants/<env>/<name>.yaml`), planned
        by an update of the platform stack (of each cluster it lands on), then its own stack created
        (one per cluster, `<env>-<cluster>.<name>`). A platform update that fails unregisters it
        again (and updates the clusters already updated once more, without it); onboardings of one
        environment run one at a time."""
        phase = on_phase or (lambda _: None)
        with self._locks(f"registry:{env}"):
            tenant = self.onboarding_check(env, tenant)  # again: another onboarding may have just taken the capacity
            path = register(env, tenant, self.project_dir)
            phase(f"registered in {path.relative_to(self.project_dir)}")
            on = self.clusters(env, tenant.name)  # registered: the clusters its demands land on
            try:
                self._platforms_up(env, on, phase, on_output, on_event)
            except PlatformUpdateFailed as err:
                unregister(env, tenant.name, self.project_dir)
                phase("unregistered: the platform update failed")
                if err.updated:  # the clusters updated with it: without it again
                    self._platforms_up(env, err.updated, phase, on_output, on_event)
                raise
            except BaseException:
                unregister(env, tenant.name, self.project_dir)
                phase("unregistered: the platform update failed")
                raise
        result = self.create(env, tenant, on_output=on_output, on_event=on_event)
        for cluster in on:
            phase(f"tenant stack {_short_name(env, tenant.name, cluster)} created")
        return result

    def offboard(self, env: str, name: str, *, on_phase: OnPhase | None = None, on_output: OnOutput | None = None, on_event: OnEvent | None = None) -> StackResult:
        """The reverse of `onboard`: the tenant's stack (on each of its clusters) deleted (protected
        resources kept), its registration removed, and the platform (of each of those clusters)
        updated so its GPUs are free again."""
        phase = on_phase or (lambda _: None)
        on = self.clusters(env, name)  # while it is registered
        result = self.delete(env, name, on_output=on_output, on_event=on_event)
        for cluster in on:
            phase(f"tenant stack {_short_name(env, name, cluster)} deleted")
        with self._locks(f"registry:{env}"):
            unregister(env, name, self.project_dir)
            phase(f"unregistered from {REGISTRY_DIR}/{env}")
            self._platforms_up(env, on, phase, on_output, on_event)
        return result

    def _platforms_up(self, env: str, on: list[str | None], phase: OnPhase, on_output: OnOutput | None, on_event: OnEvent | None) -> None:
        """`pulumi up` of the platform stacks of clusters `on` (`[None]`: the environment's one
        stack), a phase per stack. A cluster's failure raises `PlatformUpdateFailed` once every
        cluster has run."""
        if on == [None]:
            self.platforms.up(env, on_output=on_output, on_event=on_event)
            phase(f"platform {env} updated")
            return
        results = self.fleet.up(env, only=on, on_output=on_output, on_event=on_event)
        for r in results:
            phase(f"platform {r.stack} updated" if r.ok else f"platform {r.stack} failed: {r.error}")
        if failed := [r for r in results if not r.ok]:
            message = "; ".join(f"platform {r.stack}: {r.error}" for r in failed)
            raise PlatformUpdateFailed(f"the platform update failed on {len(failed)} of {len(results)} cluster(s): {message}", (r.cluster for r in results if r.ok))

    def self_service(self, env: str, name: str) -> bool:
        """The tenant onboarded itself (its registration is in the registry, not in `tenants`)."""
        return is_registered(env, name, self.project_dir)

    def create(self, env: str, tenant: TenantInput, *, on_output: OnOutput | None = None, on_event: OnEvent | None = None) -> StackResult:
        """A new tenant stack, deployed. `TenantExists` if the tenant has one already."""
        tenant = self.check(env, tenant)

        def create(cluster: str | None) -> StackResult:
            settings = self._settings(env, tenant, cluster)
            with self._locks(self.stack_name(env, tenant.name, cluster)):
                try:
                    stack = self._stack(env, tenant.name, auto.Stack.create, cluster)
                except auto.StackAlreadyExistsError:
                    raise TenantExists(f"tenant {tenant.name!r} of {env} exists already ({self.stack_name(env, tenant.name, cluster)})") from None
                _configure(stack, settings)
                return ops.up(stack, on_output, on_event, self.platforms.policy_pack(env))

        return self._on_each_cluster(env, tenant.name, create)

    def update(self, env: str, tenant: TenantInput, *, on_output: OnOutput | None = None, on_event: OnEvent | None = None) -> StackResult:
        """The tenant's stack brought to `tenant` (and to the platform's current contract)."""
        tenant = self.check(env, tenant)

        def update(cluster: str | None) -> StackResult:
            settings = self._settings(env, tenant, cluster)
            with self._locks(self.stack_name(env, tenant.name, cluster)):
                stack = self._existing(env, tenant.name, cluster)
                _configure(stack, settings)
                return ops.up(stack, on_output, on_event, self.platforms.policy_pack(env))

        return self._on_each_cluster(env, tenant.name, update)

    def preview(self, env: str, tenant: TenantInput, *, on_output: OnOutput | None = None, on_event: OnEvent | None = None) -> StackResult:
        """What `create` or `update` would change. A stack made only for the preview is removed after it."""
        tenant = self.check(env, tenant)

        def preview(cluster: str | None) -> StackResult:
            settings = self._settings(env, tenant, cluster)
            with self._locks(self.stack_name(env, tenant.name, cluster)):
                try:
                    stack, new = self._stack(env, tenant.name, auto.Stack.select, cluster), False
                except auto.StackNotFoundError:
                    stack, new = self._stack(env, tenant.name, auto.Stack.create, cluster), True
                try:
                    _configure(stack, settings)
                    return ops.preview(stack, on_output, on_event, self.platforms.policy_pack(env))
                finally:
                    if new:
                        self._remove(stack, env, tenant.name, cluster)

        return self._on_each_cluster(env, tenant.name, preview)

    def delete(self, env: str, name: str, *, on_output: OnOutput | None = None, on_event: OnEvent | None = None) -> StackResult:
        """Destroy the tenant's resources but the protected ones. With nothing kept in it, the stack
        is removed; otherwise it stays, holding what was kept (listed in the result)."""
        check_name("environment", env)
        check_name("tenant", name)
        self.backend.check()

        def delete(cluster: str | None) -> StackResult:
            with self._locks(self.stack_name(env, name, cluster)):
                stack = self._existing(env, name, cluster)
                result = ops.destroy_keeping_protected(stack, on_output, on_event)
                if any(k.reason != "retained on delete" for k in result.kept):
                    return result
                self._remove(stack, env, name, cluster)
                return result.model_copy(update={"removed": True})

        return self._on_each_cluster(env, name, delete)

    def list(self, env: str) -> list[TenantSummary]:
        check_name("environment", env)
        self.backend.check()
        workspace = self._project_workspace()
        cfg = self._fleet(env)
        prefixes = {f"{cluster_stack(env, c.name)}.": c.name for c in clusters(cfg)} if cfg is not None else {f"{env}.": None}
        summaries = []
        for stack in workspace.list_stacks():
            short = stack.name.rsplit("/", 1)[-1]
            prefix = next((p for p in prefixes if short.startswith(p)), None)
            if prefix is None:
                continue
            name, cluster = short.removeprefix(prefix), prefixes[prefix]
            deployed = _deployed(ops.masked_outputs(workspace, self.stack_name(env, name, cluster)))
            summaries.append(
                TenantSummary(
                    name=name,
                    cluster=cluster,
                    stack=self.stack_name(env, name, cluster),
                    owners=list(deployed.owners.groups) if deployed else [],
                    last_update=stack.last_update,
                    resource_count=stack.resource_count,
                    update_in_progress=stack.update_in_progress,
                )
            )
        order = list(prefixes.values())
        return sorted(summaries, key=lambda s: (s.name, order.index(s.cluster)))

    def status(self, env: str, name: str, cluster: str | None = None) -> TenantStatus:
        """The tenant's stack (on `cluster`; by default on its first cluster)."""
        check_name("environment", env)
        check_name("tenant", name)
        self.backend.check()
        stack = self._existing(env, name, cluster or self.clusters(env, name)[0])
        outputs = ops.masked_outputs(stack.workspace, stack.name)
        last = stack.history(page_size=1, show_secrets=False)
        return TenantStatus(
            environment=env,
            name=name,
            stack=stack.name,
            tenant=_deployed(outputs),
            last_operation=_last_operation(last[0]) if last else None,
            outputs=outputs,
        )

    def record(self, env: str, name: str) -> TenantRecord:
        """What is deployed of the tenant, and what the platform registers of it (for authorisation).
        A platform without a readable contract registers nothing: its tenants can still be read
        and deleted, while creating or updating one fails on the contract."""
        check_name("environment", env)
        check_name("tenant", name)
        self.backend.check()
        first = self.clusters(env, name)[0]
        try:
            outputs, exists = ops.masked_outputs(self._project_workspace(), self.stack_name(env, name, first)), True
        except auto.StackNotFoundError:
            outputs, exists = {}, False
        try:
            registered = self.platforms.contract(env, first).registration(name)
        except ContractError:
            registered = None
        return TenantRecord(deployed=_deployed(outputs), exists=exists, registered=registered)

    # ------------------------------------------------------------------ plumbing

    def _owners(self, env: str, registered: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
        """Owner groups per tenant, registered or deployed: owners are the tenant's to change, so
        no tenant may take a group another tenant holds either way."""
        owners = {name: set(groups) for name, groups in registered.items()}
        for deployed in self.list(env):
            owners.setdefault(deployed.name, set()).update(deployed.owners)
        return owners

    def _fleet(self, env: str) -> FactoryConfig | None:
        """The environment, validated, when it declares clusters; None when it is one cluster,
        told from the stack file read as plain YAML (nothing decrypted or validated: every
        operation asks, on its way to the CLI)."""
        config = as_dict((bounded_yaml.read(stack_file(env, self.project_dir)) or {}).get("config"))
        fleet = as_dict(config.get(f"{project_name(self.project_dir)}:fleet"))
        if not any(as_dict(site).get("clusters") for site in as_list(fleet.get("sites"))):
            return None
        cfg = load_stack_file(env, self.project_dir)
        return cfg if is_multi_cluster(cfg) else None

    def _on_each_cluster(self, env: str, name: str, run: Callable[[str | None], StackResult]) -> StackResult:
        """`run` on the tenant's stack of each of its clusters in turn (the first failure stops it)."""
        return combined({cluster or env: run(cluster) for cluster in self.clusters(env, name)})

    def _settings(self, env: str, tenant: Tenant, cluster: str | None = None) -> dict[str, str]:
        """The stack's config: the tenant, its platform stack, the platform's provider settings."""
        return {
            TENANT_KEY: json.dumps(tenant.model_dump(mode="json"), sort_keys=True),
            PLATFORM_KEY: self.platforms.stack_name(env, cluster),
            **provider_settings(env, self.project_dir, cluster),
        }

    def _existing(self, env: str, name: str, cluster: str | None = None) -> auto.Stack:
        try:
            return self._stack(env, name, auto.Stack.select, cluster)
        except auto.StackNotFoundError:
            raise TenantNotFound(f"tenant {name!r} of {env} has no stack ({self.stack_name(env, name, cluster)})") from None

    def _stack(self, env: str, name: str, init: Callable[[str, auto.Workspace], auto.Stack], cluster: str | None = None) -> auto.Stack:
        work_dir = self._workspaces() / _short_name(env, name, cluster)
        work_dir.mkdir(parents=True, exist_ok=True)
        return init(self.stack_name(env, name, cluster), self._workspace(work_dir, program=tenant_program))

    def _remove(self, stack: auto.Stack, env: str, name: str, cluster: str | None = None) -> None:
        stack.workspace.remove_stack(stack.name)
        shutil.rmtree(self._workspaces() / _short_name(env, name, cluster), ignore_errors=True)

    def _project_workspace(self) -> auto.LocalWorkspace:
        """A workspace of the tenant project for commands on any of its stacks (list, outputs).

        Made once: a new LocalWorkspace rewrites the folder's Pulumi.yaml, which a command of a
        concurrent operation may be reading at that moment."""
        with self._project_workspace_lock:
            if self._project_workspace_cache is None:
                self._workspaces().mkdir(parents=True, exist_ok=True)
                self._project_workspace_cache = self._workspace(self._workspaces())
            return self._project_workspace_cache

    def _workspaces(self) -> Path:
        return self.backend.state_dir / "tenants"

    def _workspace(self, work_dir: Path, **options: Any) -> auto.LocalWorkspace:
        if self._pulumi_command is None:
            self._pulumi_command = ops.pulumi_cli()
        project = auto.ProjectSettings(name=TENANT_PROJECT, runtime="python", main=str(self.project_dir))
        return auto.LocalWorkspace(
            **vars(self.backend.workspace_options(self._pulumi_command, work_dir=str(work_dir), project_settings=project, **options))
        )


def _configure(stack: auto.Stack, settings: Mapping[str, str]) -> None:
    """One `pulumi config set` per key. None of it is secret: a secret never goes through
    `config set`, whose value is a command-line argument."""
    for key, value in settings.items():
        stack.set_config(key, auto.ConfigValue(value))


def _short_name(env: str, name: str, cluster: str | None) -> str:
    return f"{cluster_stack(env, cluster) if cluster else env}.{name}"


def provider_settings(env: str, project_dir: Path | None = None, cluster: str | None = None) -> dict[str, str]:
    """The platform stack file's provider settings tenant stacks share (plain values only: a
    secret one could only be copied through a command line); those of `cluster`'s platform stack
    for a tenant stack on it."""
    path = stack_file(env, project_dir)
    read_stack_file(path)  # a missing or broken file fails as it does everywhere
    config = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    settings, problems = {}, []
    for key, value in sorted(config.items()):
        if str(key).partition(":")[0] not in PROVIDER_NAMESPACES:
            continue
        if isinstance(value, dict) and "secure" in value:
            problems.append(f"{key}: a secret provider setting cannot be shared with tenant stacks; use a plain one (kubernetes:context)")
            continue
        settings[str(key)] = value if isinstance(value, str) else json.dumps(value)
    if problems:
        raise ConfigError(problems, source=str(path))
    if cluster is not None:
        settings.update(cluster_provider_config(load_stack_file(env, project_dir), cluster))
    return dict(sorted(settings.items()))


def _deployed(outputs: Mapping[str, Any]) -> Tenant | None:
    value = outputs.get("tenant")
    return Tenant.model_validate(value) if isinstance(value, dict) else None


def _last_operation(summary: auto.UpdateSummary) -> LastOperation:
    return LastOperation(
        kind=summary.kind,
        result=summary.result,
        started=summary.start_time,
        ended=summary.end_time,
        changes={getattr(op, "value", op): n for op, n in sorted((summary.resource_changes or {}).items())},
    )
