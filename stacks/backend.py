"""Where stacks keep their state, and what every stack operation shares.

`Backend` says where state lives (a local file backend under the state directory by default, or
any URL the Pulumi CLI accepts: Pulumi Cloud, `s3://...`, `azblob://...`, `gs://...`) and how
secrets are encrypted. Its settings reach the CLI as environment variables only: the passphrase is
read by the CLI from `PULUMI_CONFIG_PASSPHRASE_FILE` (or `PULUMI_CONFIG_PASSPHRASE`) and never
appears on a command line, in a result or in a log.

The operations (`preview`, `up`, `destroy_keeping_protected`) stream the CLI's output lines and
engine events to the caller's callbacks and return a `StackResult`: the changes per operation,
the stack's outputs with secret ones masked, and on destroy what was kept and why.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from pulumi import automation as auto
from pulumi.automation.events import EngineEvent
from pydantic import BaseModel, ConfigDict

from ai_factory.factory.model.secrets import REDACTED

log = logging.getLogger("stacks")

DIY_ORGANIZATION = "organization"
"""Self-managed backends (file, S3, ...) accept `org/project/stack` names only with this org."""
STACK_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
"""Environment and tenant names are DNS labels: they join into stack names with a dot."""
BOOKKEEPING_TYPES = ("pulumi:pulumi:Stack", "pulumi:providers:")
"""State entries that are not the stack's resources (the stack itself, provider instances)."""

OnOutput = Callable[[str], Any]
OnEvent = Callable[[EngineEvent], Any]


class BackendError(Exception):
    """The backend cannot be used as configured (no passphrase for the passphrase provider, ...)."""


def default_state_dir() -> Path:
    return Path(os.environ.get("AI_FACTORY_STATE_DIR", "~/.ai-factory")).expanduser()


@dataclass(frozen=True)
class Backend:
    state_dir: Path = field(default_factory=default_state_dir)
    """Workspaces of tenant stacks (their `Pulumi.<stack>.yaml`) and, by default, the file backend.
    Defaults to `$AI_FACTORY_STATE_DIR`, else `~/.ai-factory`."""
    url: str | None = None
    """Backend URL (`https://api.pulumi.com`, `s3://bucket?region=...`, `file://...`); None is a
    file backend in `<state_dir>/backend`."""
    organization: str = DIY_ORGANIZATION
    """Organisation in fully qualified stack names: `organization` on self-managed backends, your
    organisation on Pulumi Cloud."""
    secrets_provider: str = "passphrase"
    """Secrets provider of new stacks (`passphrase`, `awskms://...`, `hashivault://...`, ...)."""
    passphrase_file: Path | None = None
    """File holding the passphrase (passed as `PULUMI_CONFIG_PASSPHRASE_FILE`); None leaves it to
    `PULUMI_CONFIG_PASSPHRASE_FILE` or `PULUMI_CONFIG_PASSPHRASE` in the environment."""

    @property
    def backend_url(self) -> str:
        return self.url or (self.state_dir / "backend").as_uri()

    def stack_name(self, project: str, stack: str) -> str:
        return auto.fully_qualified_stack_name(self.organization, project, stack)

    def env_vars(self) -> dict[str, str]:
        """What the CLI needs, as environment variables (never arguments)."""
        env = {"PULUMI_BACKEND_URL": self.backend_url, "PULUMI_SKIP_UPDATE_CHECK": "true"}
        if self.passphrase_file is not None:
            env["PULUMI_CONFIG_PASSPHRASE_FILE"] = str(self.passphrase_file)
        return env

    def check(self) -> None:
        """Fail before any CLI call when the backend cannot work as configured."""
        if self.passphrase_file is not None and not self.passphrase_file.is_file():
            raise BackendError(f"passphrase file {self.passphrase_file} does not exist")
        if self.secrets_provider == "passphrase" and self.passphrase_file is None and not (
            os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE") or os.environ.get("PULUMI_CONFIG_PASSPHRASE") is not None
        ):
            raise BackendError(
                "the passphrase secrets provider needs a passphrase: set PULUMI_CONFIG_PASSPHRASE_FILE "
                "(or PULUMI_CONFIG_PASSPHRASE) in the environment, or pass a passphrase file"
            )
        if self.url is None:
            (self.state_dir / "backend").mkdir(parents=True, exist_ok=True)

    def workspace_options(self, pulumi_command: auto.PulumiCommand | None, **options: Any) -> auto.LocalWorkspaceOptions:
        return auto.LocalWorkspaceOptions(
            env_vars=self.env_vars(), secrets_provider=self.secrets_provider, pulumi_command=pulumi_command, **options
        )


MAX_NAME = 40
"""Longest environment or tenant name: a stack name (`tenant-<name>`) stays within a DNS label."""


class InvalidName(ValueError):
    """An environment or tenant name that is not a DNS label of at most `MAX_NAME` characters."""


def check_name(kind: str, name: str) -> None:
    if not STACK_NAME.match(name) or len(name) > MAX_NAME:
        raise InvalidName(f"{kind} {name!r} is not a DNS label (lowercase letters, digits and '-', at most 40)")


# --------------------------------------------------------------------------- results


class KeptResource(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    urn: str
    type: str
    reason: Literal["protected", "needed by a protected resource", "retained on delete"]
    """`protected`: still in the stack, undeletable; `needed by ...`: still in the stack because a
    protected resource is its child or depends on it; `retained on delete`: out of the stack, left
    in place (the cluster keeps the object)."""


class StackResult(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    stack: str
    operation: Literal["preview", "up", "destroy"]
    changes: dict[str, int]
    """Resources per operation (`create`, `update`, `delete`, `same`, ...)."""
    outputs: dict[str, Any] = {}
    """The stack's outputs after the operation; secret ones are `[secret]`."""
    kept: list[KeptResource] = []
    """Destroy: what is still there, and why."""
    removed: bool = False
    """Destroy: the stack itself was removed (nothing was kept in it)."""
    clusters: dict[str, StackResult] = {}
    """A tenant on several clusters: each cluster's stack's own result, in the sites' order (the
    fields above then sum them; `outputs` are the first cluster's, the names being the same on each)."""


def combined(results: dict[str, StackResult]) -> StackResult:
    """One result for an operation run on the stacks of several clusters."""
    if len(results) == 1:
        return next(iter(results.values()))
    first = next(iter(results.values()))
    changes: dict[str, int] = {}
    for result in results.values():
        for op, n in result.changes.items():
            changes[op] = changes.get(op, 0) + n
    return StackResult(
        stack=", ".join(r.stack for r in results.values()),
        operation=first.operation,
        changes=dict(sorted(changes.items())),
        outputs=first.outputs,
        kept=[k for r in results.values() for k in r.kept],
        removed=all(r.removed for r in results.values()),
        clusters=results,
    )


@dataclass(frozen=True)
class PolicyPack:
    """A CrossGuard pack every preview and update runs, with its configuration file if any."""

    path: Path
    config: Path | None = None

    def options(self) -> dict[str, list[str]]:
        return {
            "policy_packs": [str(self.path)],
            "policy_pack_configs": [str(self.config)] if self.config else [],
        }


def preview(stack: auto.Stack, on_output: OnOutput | None, on_event: OnEvent | None, policy_pack: PolicyPack | None = None) -> StackResult:
    result = stack.preview(on_output=_lines(on_output), on_event=on_event, **(policy_pack.options() if policy_pack else {}))
    return StackResult(stack=stack.name, operation="preview", changes=_changes(result.change_summary))


def up(stack: auto.Stack, on_output: OnOutput | None, on_event: OnEvent | None, policy_pack: PolicyPack | None = None) -> StackResult:
    result = stack.up(on_output=_lines(on_output), on_event=on_event, **(policy_pack.options() if policy_pack else {}))
    return StackResult(
        stack=stack.name,
        operation="up",
        changes=_changes(result.summary.resource_changes),
        outputs={k: REDACTED if v.secret else v.value for k, v in result.outputs.items()},
    )


def destroy_keeping_protected(stack: auto.Stack, on_output: OnOutput | None, on_event: OnEvent | None) -> StackResult:
    """Destroy every resource that is not protected; protected ones (and what they need) stay in
    the stack, resources retained on delete leave the stack and stay in the cluster."""
    before = state_resources(stack)
    result = stack.destroy(exclude_protected=True, on_output=_lines(on_output), on_event=on_event)
    after = state_resources(stack)
    remaining = {r["urn"] for r in after}
    kept = [
        KeptResource(urn=r["urn"], type=r["type"], reason="protected" if r.get("protect") else "needed by a protected resource")
        for r in after
    ] + [
        KeptResource(urn=r["urn"], type=r["type"], reason="retained on delete")
        for r in before
        if r.get("retainOnDelete") and r["urn"] not in remaining
    ]
    return StackResult(
        stack=stack.name,
        operation="destroy",
        changes=_changes(result.summary.resource_changes),
        kept=sorted(kept, key=lambda k: k.urn),
    )


def state_resources(stack: auto.Stack) -> list[dict[str, Any]]:
    """The stack's resources from its state (`stack export` without `--show-secrets`: secret
    values stay encrypted), less the stack itself and provider instances."""
    state = json.loads(run_cli(stack.workspace, stack.name, ["stack", "export"]) or "{}")
    resources = (state.get("deployment") or {}).get("resources") or []
    return [r for r in resources if not r.get("type", "").startswith(BOOKKEEPING_TYPES)]


def masked_outputs(workspace: auto.LocalWorkspace, stack_name: str) -> dict[str, Any]:
    """A stack's outputs as `pulumi stack output --json` prints them: secrets stay `[secret]`
    (the SDK's `Stack.outputs()` would decrypt them). A missing stack raises `StackNotFoundError`."""
    return json.loads(run_cli(workspace, stack_name, ["stack", "output", "--json"]) or "{}")


def run_cli(workspace: auto.LocalWorkspace, stack_name: str, args: list[str]) -> str:
    """A read-only CLI command on one stack, with the workspace's environment."""
    result = workspace.pulumi_command.run([*args, "--stack", stack_name], workspace.work_dir, workspace.env_vars)
    return result.stdout


def _changes(summary: Any) -> dict[str, int]:
    changes = {getattr(op, "value", op): count for op, count in (summary or {}).items()}
    return dict(sorted(changes.items()))


def _lines(on_output: OnOutput | None) -> OnOutput:
    def each(line: str) -> None:
        log.debug("pulumi: %s", line)
        if on_output is not None:
            on_output(line)

    return each


# --------------------------------------------------------------------------- concurrency


class KeyedLocks:
    """One lock per key (an environment, a tenant): operations on one key run one at a time, on
    different keys in parallel. In-process only; across processes the backend's own stack lock
    refuses a second concurrent update."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def __call__(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())


def pulumi_cli() -> auto.PulumiCommand:
    """The `pulumi` CLI on PATH; every Automation API operation runs it."""
    try:
        return auto.PulumiCommand()
    except FileNotFoundError:
        raise BackendError("the Automation API runs the `pulumi` CLI, which is not on PATH (https://www.pulumi.com/docs/install/)") from None
