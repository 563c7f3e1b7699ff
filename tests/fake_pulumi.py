"""A stand-in for the `pulumi` CLI, injected into the Automation API as its `PulumiCommand`.

It records every command line (arguments, working directory, environment) and answers like the
CLI does for the commands `stacks/` issues: stacks live in memory per fully qualified name, `up`
runs a per-project fake program (a function from the stack's config to outputs and resources),
engine events are streamed to the SDK's `--event-log` gRPC endpoint, JSON answers have the CLI's
shapes (`stack output`, `stack history`, `stack export`, `stack ls`) and errors its messages (so
the SDK maps them to `StackNotFoundError`, `StackAlreadyExistsError`, ...). No process is started.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import grpc
import yaml
from pulumi import automation as auto
from pulumi._version import version as sdk_version
from pulumi.automation._cmd import CommandResult
from pulumi.automation.errors import create_command_error
from pulumi.runtime.proto import events_pb2, events_pb2_grpc
from semver import VersionInfo

SECRET_MASK = "[secret]"


@dataclass
class Deployed:
    """What a program leaves in a stack: outputs (some secret) and resources."""

    outputs: dict[str, Any] = field(default_factory=dict)
    secret_outputs: frozenset[str] = frozenset()
    resources: list[dict[str, Any]] = field(default_factory=list)
    """State entries: `urn`, `type`, and `protect` / `retainOnDelete` / `parent` where set."""


Program = Callable[[str, dict[str, str]], Deployed]
"""(fully qualified stack name, plain config) -> what an `up` leaves."""


@dataclass
class FakeStack:
    config: dict[str, str] = field(default_factory=dict)
    deployed: Deployed = field(default_factory=Deployed)
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Call:
    args: list[str]
    cwd: str
    env: dict[str, str]
    started: float
    ended: float = 0.0

    @property
    def line(self) -> str:
        return " ".join(["pulumi", *self.args])

    @property
    def stack(self) -> str | None:
        return _flag(self.args, "--stack")


class FakePulumi(auto.PulumiCommand):
    def __init__(self, programs: dict[str, Program] | None = None, *, delay: float = 0.0, secret_config: dict[str, str] | None = None):
        # No super().__init__(): it would run `pulumi version`.
        self.command = "pulumi"
        self.version = VersionInfo.parse(str(sdk_version))
        self.programs = programs or {}
        self.delay = delay
        """Seconds every update, preview and destroy takes (for concurrency tests)."""
        self.on_operation: Callable[[str, str], None] | None = None
        """Called as each update, preview or destroy starts, with the operation and the stack's
        short name (`dev.vision`), in the thread running it: a concurrency test holds an
        operation there until another has started."""
        self.secret_config = secret_config or {}
        """Decrypted secret config every stack holds (shown by `--show-secrets` commands only)."""
        self.stacks: dict[str, FakeStack] = {}
        self.calls: list[Call] = []
        self.failures: dict[str, str] = {}
        """Operation (`up`, `preview`, `destroy`) -> stderr of a failure to simulate."""
        self.failing_stacks: dict[str, str] = {}
        """Stack (its short name, `dev-par1-b`) -> stderr of a failure of its every operation."""
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the CLI

    def run(self, args, cwd, additional_env, on_output=None, on_error=None) -> CommandResult:
        args = [a for a in args if a != "--non-interactive"]
        call = Call(list(args), cwd, dict(additional_env), time.monotonic())
        with self._lock:
            self.calls.append(call)
        try:
            code, stdout, stderr = self._dispatch(args, cwd, on_output)
        finally:
            call.ended = time.monotonic()
        result = CommandResult(stdout=stdout, stderr=stderr, code=code)
        if code != 0:
            raise create_command_error(result)
        return result

    def _dispatch(self, args: list[str], cwd: str, on_output) -> tuple[int, str, str]:
        command = [a for a in args if not a.startswith("-")][:2]
        name = _flag(args, "--stack")
        if command == ["stack", "init"]:
            return self._init(args[2])
        if command == ["stack", "ls"]:
            return self._list(cwd)
        if command == ["stack", "rm"]:
            return self._remove([a for a in args[2:] if not a.startswith("-")][0], force="--force" in args)
        if command[:1] == ["stack"] or command[:1] == ["config"]:
            if name not in self.stacks:
                return 255, "", f"error: no stack named '{name}' found"
            stack = self.stacks[name]
            if command == ["stack", "select"]:
                return 0, "", ""
            if command == ["stack", "output"]:
                return 0, json.dumps(self._outputs(stack, "--show-secrets" in args)), ""
            if command == ["stack", "history"]:
                page_size = int(_flag(args, "--page-size") or 0) or None
                return 0, json.dumps(self._history(stack, "--show-secrets" in args)[:page_size]), ""
            if command == ["stack", "export"]:
                return 0, json.dumps(_export(stack)), ""
            if command == ["config", "set"]:
                stack.config[args[2]] = args[args.index("--") + 1]
                return 0, "", ""
        if command[:1] in (["up"], ["preview"], ["destroy"]):
            if name not in self.stacks:
                return 255, "", f"error: no stack named '{name}' found"
            return self._operation(command[0], name, args, on_output)
        raise AssertionError(f"the fake pulumi does not know `{' '.join(args)}`")

    def _init(self, name: str) -> tuple[int, str, str]:
        with self._lock:
            if name in self.stacks:
                return 255, "", f"error: stack '{name}' already exists"
            self.stacks[name] = FakeStack()
        return 0, f"Created stack '{name}'", ""

    def _list(self, cwd: str) -> tuple[int, str, str]:
        project = yaml.safe_load((Path(cwd) / "Pulumi.yaml").read_text())["name"]
        rows = [
            {
                "name": name,
                "current": False,
                "updateInProgress": False,
                **({"lastUpdate": stack.history[-1]["endTime"]} if stack.history else {}),
                "resourceCount": len(stack.deployed.resources),
            }
            for name, stack in sorted(self.stacks.items())
            if name.split("/")[1] == project
        ]
        return 0, json.dumps(rows), ""

    def _remove(self, name: str, force: bool) -> tuple[int, str, str]:
        stack = self.stacks.get(name)
        if stack is None:
            return 255, "", f"error: no stack named '{name}' found"
        if stack.deployed.resources and not force:
            return 255, "", (
                f"error: '{name}' still has resources; removal rejected. Possible actions:\n"
                f"- Make sure that '{name}' is the stack that you want to destroy\n"
                "- Run `pulumi destroy` to delete the resources, then run `pulumi stack rm`\n"
                "- Run `pulumi stack rm --force` to override this error"
            )
        del self.stacks[name]
        return 0, f"Stack '{name}' has been removed!", ""

    def _operation(self, op: str, name: str, args: list[str], on_output) -> tuple[int, str, str]:
        stack = self.stacks[name]
        started = _now()
        if self.on_operation is not None:
            self.on_operation(op, name.rsplit("/", 1)[-1])
        time.sleep(self.delay)
        failure = self.failures.get(op) or self.failing_stacks.get(name.rsplit("/", 1)[-1])
        if failure is not None:
            stack.history.append(_entry("update" if op == "up" else op, started, "failed", {}, self._config(stack, True)))
            return 255, "", failure
        before = {r["urn"]: r for r in stack.deployed.resources}
        if op == "destroy":
            kept = _kept_by_protection(stack.deployed.resources) if "--exclude-protected" in args else []
            after = Deployed(outputs={}, resources=kept)
        else:
            after = self.programs[name.split("/")[1]](name, dict(stack.config))
        now = {r["urn"]: r for r in after.resources}
        steps = [("create", r) for u, r in now.items() if u not in before] + [("same", r) for u, r in now.items() if u in before]
        steps += [("delete", r) for u, r in before.items() if u not in now]
        changes: dict[str, int] = {}
        for step, _ in steps:
            changes[step] = changes.get(step, 0) + 1
        lines = [f"{'Previewing update' if op == 'preview' else 'Destroying' if op == 'destroy' else 'Updating'} ({name})"]
        lines += [f"    {'+' if s == 'create' else '-' if s == 'delete' else ' '}  {r['type']} {r['urn'].rsplit('::', 1)[-1]} {s}" for s, r in steps]
        lines += ["Resources:"] + [f"    {n} {s}" for s, n in sorted(changes.items())]
        for line in lines:
            if on_output:
                on_output(line)
        if (log := _flag(args, "--event-log")) is not None:
            _stream_events(log, steps, changes, preview=op == "preview")
        if op != "preview":
            stack.deployed = after
            kind = "update" if op == "up" else op
            stack.history.append(_entry(kind, started, "succeeded", changes, self._config(stack, True)))
        return 0, "\n".join(lines), ""

    # ------------------------------------------------------------------ answers

    def _outputs(self, stack: FakeStack, show_secrets: bool) -> dict[str, Any]:
        return {k: v if show_secrets or k not in stack.deployed.secret_outputs else SECRET_MASK for k, v in stack.deployed.outputs.items()}

    def _config(self, stack: FakeStack, show_secrets: bool) -> dict[str, Any]:
        secrets = {k: v if show_secrets else SECRET_MASK for k, v in self.secret_config.items()}
        return {**{k: {"value": v, "secret": False} for k, v in stack.config.items()}, **{k: {"value": v, "secret": True} for k, v in secrets.items()}}

    def _history(self, stack: FakeStack, show_secrets: bool) -> list[dict[str, Any]]:
        return [dict(e, config=self._config(stack, show_secrets)) for e in reversed(stack.history)]

    # ------------------------------------------------------------------ what tests look at

    def lines(self) -> list[str]:
        return [c.line for c in self.calls]

    def operations(self, op: str) -> list[Call]:
        return [c for c in self.calls if c.args[:1] == [op]]


def _flag(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _entry(kind: str, started: str, result: str, changes: dict[str, int], config: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": kind,
        "startTime": started,
        "endTime": _now(),
        "message": "",
        "environment": {"exec.kind": "auto.inline"},
        "config": config,
        "result": result,
        "version": 1,
        "resourceChanges": changes,
    }


def _kept_by_protection(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What `destroy --exclude-protected` leaves: protected resources and their ancestors."""
    by_urn = {r["urn"]: r for r in resources}
    kept: set[str] = set()
    for r in resources:
        if r.get("protect"):
            node: dict | None = r
            while node is not None and node["urn"] not in kept:
                kept.add(node["urn"])
                node = by_urn.get(node.get("parent", ""))
    return [r for r in resources if r["urn"] in kept]


def _export(stack: FakeStack) -> dict[str, Any]:
    resources = [{"urn": "urn:pulumi:stack::project::pulumi:pulumi:Stack::stack", "type": "pulumi:pulumi:Stack", "custom": False}]
    for r in stack.deployed.resources:
        # Secret inputs are exported encrypted unless --show-secrets.
        resources.append({"custom": True, "inputs": {"data": {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270", "ciphertext": "v1:AAAA"}}, **r})
    return {"version": 3, "deployment": {"manifest": {"time": _now(), "version": "v3"}, "resources": resources}}


def _stream_events(address: str, steps: list[tuple[str, dict]], changes: dict[str, int], preview: bool) -> None:
    """What the engine sends to `--event-log tcp://...` (the SDK's gRPC events server)."""
    events: list[dict[str, Any]] = [{"preludeEvent": {"config": {}}}]
    for op, r in steps:
        metadata = {"op": op, "urn": r["urn"], "type": r["type"], "provider": ""}
        events += [{"resourcePreEvent": {"metadata": metadata, "planning": preview}}, {"resOutputsEvent": {"metadata": metadata, "planning": preview}}]
    events.append({"summaryEvent": {"maybeCorrupt": False, "durationSeconds": 1, "resourceChanges": changes, "PolicyPacks": {}}})
    with grpc.insecure_channel(address.removeprefix("tcp://")) as channel:
        stub = events_pb2_grpc.EventsStub(channel)
        requests = [events_pb2.EventRequest(event=json.dumps({"sequence": i, "timestamp": int(time.time()), **e})) for i, e in enumerate(events)]
        stub.StreamEvents(iter(requests))
