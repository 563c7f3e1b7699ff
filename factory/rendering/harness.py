"""Run a Pulumi program in-process under the SDK's mock monitor and record what it registers.

This is how `factory render|check` work without a CLI or cluster, and how the tests inspect the
real program. The mock monitor hides parents and resource options and silently overwrites
duplicates, so `RecordingMonitor` reads the full `RegisterResourceRequest` and refuses a second
resource with the same type and name (the engine would fail on the duplicate URN).

This module is the one place that touches SDK internals (protobuf request fields); `pulumi` is
pinned exactly in requirements.txt for that reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, Iterator

import pulumi
from pulumi.output import Unknown
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import resource as sdk_resource
from pulumi.runtime import rpc
from pulumi.runtime.proto import resource_pb2, source_pb2
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from ai_factory.factory.heap import collect_young, no_cycle_collection
from ai_factory.factory.model.secrets import REDACTED

COMPONENT_LAYER_KEY = "aiFactoryLayer"
COMPONENT_TENANT_KEY = "aiFactoryTenant"


@dataclass
class Resource:
    """One registered resource, with what the engine would see of it."""

    type: str
    name: str
    urn: str
    custom: bool
    remote: bool
    inputs: dict[str, Any]
    """Inputs as the provider receives them (camelCase keys); secrets replaced by `[secret]`."""
    parent_urn: str
    protect: bool
    retain_on_delete: bool
    dependency_urns: list[str]
    secret_paths: list[str]
    """Where secret values sat in the inputs (dotted paths)."""
    provider: str = ""
    """The provider reference (`<provider urn>::<id>`) of a custom resource, empty for the default provider."""
    parent: Resource | None = None
    dependencies: list[Resource] = field(default_factory=list)

    @functools.cached_property
    def key(self) -> str:
        # Read in every pass over the graph (a million times at 1,000 tenants): made once. Not a
        # field, so equality and the cache entry's fields stay the type and name it is made of,
        # which nothing changes after registration.
        return f"{self.type}::{self.name}"

    def ancestors(self):
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    # The layer and tenant: the nearest one its component or an ancestor names. Read for every
    # resource in most passes over a render (the bundle, the check's parts, views and digests):
    # each made once, from its parent's, itself made once. Read once the graph is linked; linking
    # again (a merge) gives each resource the parent it had.

    @functools.cached_property
    def layer(self) -> str:
        if COMPONENT_LAYER_KEY in self.inputs:
            return self.inputs[COMPONENT_LAYER_KEY]
        return self.parent.layer if self.parent is not None else "platform"

    @functools.cached_property
    def tenant(self) -> str | None:
        if COMPONENT_TENANT_KEY in self.inputs:
            return self.inputs[COMPONENT_TENANT_KEY]
        return self.parent.tenant if self.parent is not None else None


class DuplicateResourceError(Exception):
    pass


class Graph:
    """Every resource a program registered, linked to its parent and dependencies."""

    def __init__(self, resources: list[Resource]):
        self.resources = resources
        by_urn = {r.urn: r for r in resources}
        for r in resources:
            r.parent = by_urn.get(r.parent_urn)
            r.dependencies = [by_urn[u] for u in r.dependency_urns if u in by_urn]

    @classmethod
    def subset(cls, resources: list[Resource]) -> Graph:
        """Some resources of a graph, keeping their links into the whole."""
        graph = cls.__new__(cls)
        graph.resources = resources
        return graph

    def of_type(self, type_: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_]

    def named(self, type_: str, name: str) -> Resource:
        matches = [r for r in self.resources if r.type == type_ and r.name == name]
        if not matches:
            raise KeyError(f"no {type_} named {name!r}")
        return matches[0]

    def children(self, component: Resource) -> list[Resource]:
        return [r for r in self.resources if component in r.ancestors()]


class RecordingMocks(pulumi.runtime.Mocks):
    """Kubernetes-aware echo mocks: outputs are the inputs, with the provider's defaults that code may read."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        outputs = dict(args.inputs)
        if args.typ.startswith("kubernetes:") and "metadata" in outputs:
            metadata = outputs.get("metadata") or {}
            if "name" not in metadata:
                outputs["metadata"] = {**metadata, "name": args.name}
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


class RecordingMonitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: pulumi.runtime.Mocks, on_record: Callable[[], None] | None = None):
        """`on_record`: called once per resource recorded (progress)."""
        super().__init__(mocks)
        self.recorded: dict[str, Resource] = {}
        self._lock = threading.Lock()
        self._on_record = on_record

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        # The SDK's mock URN keeps only the immediate parent's type; use the whole chain as the engine does.
        if parent:
            chain = parent.split("::")[2]
            type_ = f"{chain}${type_}"
        return "urn:pulumi:" + "::".join([pulumi.get_stack(), pulumi.get_project(), type_, name])

    def RegisterResource(self, request):
        if request.type == "pulumi:pulumi:Stack":
            return super().RegisterResource(request)
        _ensure_event_loop()  # deserialising resource references needs one on this thread
        raw = rpc.deserialize_properties(request.object, keep_unknowns=True)
        self._record(request, raw)
        if rpc.contains_unknowns(raw):  # a preview: the SDK's own path reads unknowns its way
            return super().RegisterResource(request)
        # What `MockMonitor.RegisterResource` does, on the inputs already read: deserialising
        # every resource's inputs twice was a large share of a render.
        urn = self.make_urn(request.parent, request.type, request.name)
        id_, state = self.mocks.new_resource(
            pulumi.runtime.MockResourceArgs(
                typ=request.type,
                name=request.name,
                inputs=raw,
                provider=request.provider,
                resource_id=request.importId,
                custom=request.custom or False,
                transforms=pulumi_mocks._resolve_callbacks(request.transforms),
            )
        )
        self.resources[urn] = pulumi_mocks.MockMonitor.ResourceRegistration(urn, id_, state)
        if not pulumi.runtime.is_dry_run():
            # Outside a preview the SDK resolves every output the response leaves out to the input
            # of that name (`rpc.resolve_outputs`): send only what the mocks changed, not an echo
            # of every input serialised again and read back.
            state = {k: v for k, v in state.items() if raw.get(k, _ABSENT) is not v}
        return resource_pb2.RegisterResourceResponse(urn=urn, id=id_, object=_at_once(lambda: rpc.serialize_properties(state, {})))

    def _record(self, request, raw: Any) -> None:
        secret_paths: list[str] = []
        inputs = _redact(raw, "", secret_paths)
        resource = Resource(
            type=request.type,
            name=request.name,
            urn=self.make_urn(request.parent, request.type, request.name),
            custom=bool(request.custom),
            remote=bool(request.remote),
            inputs=inputs,
            parent_urn=request.parent,
            protect=bool(request.protect),
            retain_on_delete=bool(request.retainOnDelete),
            dependency_urns=sorted(request.dependencies),
            secret_paths=secret_paths,
            provider=request.provider,
        )
        key = resource.key
        with self._lock:
            if key in self.recorded:
                raise DuplicateResourceError(f"two resources are named {request.name!r} with type {request.type}")
            self.recorded[key] = resource
        if self._on_record is not None:
            self._on_record()


_ABSENT = object()


def _at_once(coroutine: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """The result of a coroutine that never waits (the SDK's serialisation of plain data), run
    here without an event loop: the monitor may be called on the loop's own thread (see
    `_InlineExecutor`). One that does wait is run again through the loop."""
    running = coroutine()
    try:
        running.send(None)
    except StopIteration as done:
        return done.value
    running.close()
    return _sync_await(coroutine())


class _InlineExecutor(ThreadPoolExecutor):
    """Runs what the SDK hands its executor at once, on the caller's thread. The SDK sends each
    RPC to the monitor from a worker thread, as a real monitor is a remote server that blocks;
    the mock monitor never blocks, and a thread hand-off per resource (futures, locks, waking the
    loop, the GIL passed back and forth) cost more than the registration itself."""

    def submit(self, fn, /, *args, **kwargs):
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:  # as the pool's workers do: the caller's future carries it
            future.set_exception(error)
        return future


@contextlib.contextmanager
def _rpcs_inline(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    saved = loop._default_executor  # type: ignore[attr-defined]  # asyncio has no public getter
    loop.set_default_executor(_InlineExecutor())
    try:
        yield
    finally:
        loop._default_executor = saved  # type: ignore[attr-defined]


def _redact(value: Any, path: str, secret_paths: list[str], inside_secret: bool = False) -> Any:
    """Replace every secret scalar by `[secret]`, keeping the shape of secret maps and lists (a
    Secret's `stringData` keeps its keys) so rendered objects stay schema-valid.

    Copy on write: a map or list holding nothing to replace is returned itself, so the recorded
    inputs share it with what the monitor keeps of the resource (one copy of each resource's
    inputs, not two). Nothing may mutate recorded inputs."""
    if rpc.is_rpc_secret(value):
        return _redact(rpc.unwrap_rpc_secret(value), path, secret_paths, inside_secret=True)
    if isinstance(value, dict):
        copied = None
        for k, v in value.items():
            new = _redact(v, f"{path}.{k}" if path else k, secret_paths, inside_secret)
            if new is not v:
                if copied is None:
                    copied = dict(value)
                copied[k] = new
        return value if copied is None else copied
    if isinstance(value, list):
        copied = None
        for i, v in enumerate(value):
            new = _redact(v, f"{path}[{i}]", secret_paths, inside_secret)
            if new is not v:
                if copied is None:
                    copied = list(value)
                copied[i] = new
        return value if copied is None else copied
    if inside_secret and value is not None:
        secret_paths.append(path or ".")
        return REDACTED
    if isinstance(value, float) and value.is_integer():
        # The wire format carries every number as a double; the provider writes whole ones as integers.
        return int(value)
    return value


def _contains_unknowns(value: Any) -> bool:
    """`rpc.contains_unknowns` without its recursive closure: the SDK calls it on every output's
    value (about 80 times per resource), and each call made a function-cell cycle that only the
    garbage collector frees; those cycles were most of the render's garbage and set off full
    collections of the whole heap. Same answer: is an `Unknown` anywhere in the maps and lists."""
    if not isinstance(value, (dict, list)):
        return isinstance(value, Unknown)
    pending = [value]
    seen: set[int] = set()
    while pending:
        node = pending.pop()
        if isinstance(node, Unknown):
            return True
        if isinstance(node, (dict, list)) and id(node) not in seen:
            seen.add(id(node))
            if type(node) is dict:
                pending.extend(node.values())
            elif isinstance(node, dict):  # an output type: its properties shadow keys such as `values`
                pending.extend(node[k] for k in node)
            else:
                pending.extend(node)
    return False


def _no_stack_trace() -> source_pb2.StackTrace:
    """The SDK captures the Python stack of every resource for the engine's diagnostics
    (`traceback.extract_stack`, a `stat` per frame); no engine reads it here."""
    return source_pb2.StackTrace()


_SDK_DEPENDS_ON_URNS = sdk_resource._resolve_depends_on_urns
_SDK_CREATE_URN = sdk_resource.create_urn


async def _depends_on_urns(depends_on: Any, from_resource: pulumi.Resource | None = None) -> set[str]:
    """`_resolve_depends_on_urns` for the usual `depends_on`, a list of resources: the SDK lifts
    the list and each resource in it into an `Output` (futures and a task each) to learn which
    resources they stand for, which are the resources themselves; those were a sixth of a
    render's outputs (every tenant object waits for its namespace). The same URNs, through the
    SDK's own expansion of components; anything else (an output, an awaitable) takes its path."""
    if type(depends_on) is list and all(isinstance(d, pulumi.Resource) for d in depends_on):
        urns: set[str] = set()
        for d in depends_on:
            if (isinstance(d, pulumi.ComponentResource) and not d._remote) or (from_resource is not None and not rpc.declare_dependency(from_resource, d)):
                # A local component stands for its children; a cycle fails or is skipped as the
                # SDK decides (declaring a refused edge records nothing, so it is refused again).
                urns.update(await rpc._expand_dependencies([d], from_resource))
                continue
            # A custom resource: what the SDK's walk does for it (the edge declared above, then its
            # URN), without its coroutine per dependency and `Output.future`'s around the URN.
            urn = (await d.urn._data).value
            if urn and not _contains_unknowns(urn):
                urns.add(urn)
        return urns
    return await _SDK_DEPENDS_ON_URNS(depends_on, from_resource)


def _create_urn(name: Any, type_: Any, parent: Any = None, project: str | None = None, stack: str | None = None) -> pulumi.Output[str]:
    """`create_urn` of plain strings as one known output, not four: the SDK computes, for every
    registration, the URN a run without a monitor would get (and drops it when the monitor
    answers), chaining `from_input`, `apply`, `all` and `apply` on the parent's URN. Same string
    (`parent` up to its last `::`, then `$`, as the SDK cuts it); anything else (a parent
    resource, an output name) takes the SDK's path."""
    if type(name) is str and type(type_) is str and (parent is None or type(parent) is str):
        if parent is not None:
            prefix = parent[0 : parent.rfind("::")] + "$"
        else:
            prefix = f"urn:pulumi:{pulumi.get_stack() if stack is None else stack}::{pulumi.get_project() if project is None else project}::"
        return pulumi.Output.from_input(f"{prefix}{type_}::{name}")
    if type(name) is str and type(type_) is str and isinstance(parent, pulumi.Resource):
        # The alias a typed class declares for a child (`collapse_alias_to_urn`, its parent the
        # resource): one apply on the parent's URN instead of the SDK's apply, `all` and apply.
        return parent.urn.apply(lambda urn: f"{urn[0 : urn.rfind('::')]}${type_}::{name}")
    return _SDK_CREATE_URN(name, type_, parent, project, stack)


@contextlib.contextmanager
def _lean_sdk() -> Iterator[None]:
    """The SDK's per-resource bookkeeping that a mock run does not need, swapped out for the run
    (pulumi 3.272.0: `output.py` and `rpc.py` look `rpc.contains_unknowns` up at call time;
    `register_resource` looks `_get_stack_trace`, `_resolve_depends_on_urns` and `create_urn` up
    in its module), and the collector paused.

    The collector: a run allocates millions of objects that live to its end (every resource's
    futures, inputs and state) and almost no garbage cycles (a few thousand objects in a
    200-tenant render); collections during the run scanned the survivors once as young and once
    more in the middle generation, about a fifth of a render's CPU. Paused, they are scanned
    once, by the collection of the young generations that ends the run."""
    saved = rpc.contains_unknowns, sdk_resource._get_stack_trace, sdk_resource._resolve_depends_on_urns, sdk_resource.create_urn
    rpc.contains_unknowns, sdk_resource._get_stack_trace = _contains_unknowns, _no_stack_trace
    sdk_resource._resolve_depends_on_urns, sdk_resource.create_urn = _depends_on_urns, _create_urn
    try:
        with no_cycle_collection():
            yield
    finally:
        rpc.contains_unknowns, sdk_resource._get_stack_trace, sdk_resource._resolve_depends_on_urns, sdk_resource.create_urn = saved
        collect_young()


def run_program(
    program: Callable[[], Any],
    *,
    project: str,
    stack: str,
    config: dict[str, str] | None = None,
    secret_keys: list[str] | None = None,
    preview: bool = False,
    monitor: RecordingMonitor | None = None,
) -> Graph:
    """Run `program` as `pulumi up` would (without an engine) and return everything it registered.

    Exceptions raised by the program (including inside applies) propagate; pass a `monitor` to see
    what was registered before one was raised."""
    monitor = monitor or RecordingMonitor(RecordingMocks())
    pulumi.runtime.set_mocks(monitor.mocks, project=project, stack=stack, preview=preview, monitor=monitor)
    pulumi.runtime.set_all_config(config or {}, secret_keys or [])
    # A preview keeps the SDK's threads: the mock monitor's own path for unknowns pumps the event loop.
    with _lean_sdk(), contextlib.nullcontext() if preview else _rpcs_inline(_ensure_event_loop()):
        pulumi.runtime.test(program)()
    return Graph(sorted(monitor.recorded.values(), key=lambda r: r.urn))
