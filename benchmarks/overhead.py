"""The library's cost against a plain program registering the very same objects.

    python benchmarks/overhead.py            # dev, and generated environments of 50 and 200 tenants
    python benchmarks/overhead.py 0 100      # tenant counts (0 = the dev environment itself)

For each environment (dev with its clusters folded into one render, as the layer tests see it, or
`render_scale.environment(n)`), in one process and under the same mocks
(`factory/rendering/harness.py` `run_program`, as `factory render` runs the program):
- library: the platform program as `pulumi up` runs it (`program.main`: the config read and
  validated, the plan, components, layers, tenant stacks and hooks, the contract exported);
- plain: a hand-written program that registers every custom resource the library registered
  (same type, same name, same inputs, no components, no parents, no dependencies) as untyped
  `pulumi.CustomResource`s, through the same providers (the library's explicit provider resources,
  a tenant's Keycloak and OpenBao ones, are resources of the state too: registered first, with
  their inputs, and named by the resources that use them);
- typed: the same objects through the typed classes of their SDKs (`k8s.core.v1.ConfigMap(...)`,
  `k8s.apiextensions.CustomResource(...)`, `k8s.helm.v3.Release(...)`, `pulumi_keycloak.Group(...)`,
  `pulumi_vault.Provider(...)`), as a hand-written program would register them (`fallback`
  counts those no SDK here has a class for, registered untyped).
The figures are CPU time (the process's own, so that a machine shared with other work still
compares them fairly) per custom resource (providers not counted), the same count for all three,
and the ratios of the totals. Each size runs in a fresh process; everything is imported and the
typed classes looked up before anything is timed; each program runs `ROUNDS` times, in turn, and
its fastest run counts; before each run the heap is collected and frozen, so that no program pays
for scanning what an earlier one left (the objects the plain programs register stay alive: they
are those programs' data), and each run ends with a collection of the young generations, timed
with it: the collector's pending work on what a program allocated is the program's, wherever the
thresholds happened to fall (one young collection more or less before the timer stopped, or a
generation-1 collection just after it, moved a ratio by 0.1 or more).
"""

from __future__ import annotations

import functools
import gc
import importlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pulumi

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SIZES = ["0", "50", "200"]
PROJECT, STACK = "ai-factory", "bench"
ROUNDS = 5
"""Runs of each program, the fastest counting: with two, a machine shared with other work moved
the dev ratio between 1.05 and 1.55 from one invocation to the next."""


def environment(tenants: int) -> tuple[dict, set[str]]:
    from ai_factory.factory.model.loading import read_stack_file, stack_file
    from benchmarks.render_scale import environment as generated
    from tests.fleet_env import fold_clusters

    if tenants:
        return generated(tenants)
    raw, secret_sections = read_stack_file(stack_file("dev", REPO))
    fold_clusters(raw["fleet"], raw["tenants"])
    return raw, secret_sections


def timed(program, **config) -> float:
    """CPU seconds of one run of `program` under the mocks (`config`: `run_program`'s)."""
    from ai_factory.factory.rendering.harness import run_program

    gc.collect()
    gc.freeze()
    try:
        started = time.process_time()
        run_program(program, project=PROJECT, stack=STACK, **config)
        gc.collect(1)
        return time.process_time() - started
    finally:
        gc.unfreeze()


def measure(tenants: int) -> dict:
    from ai_factory.factory.model.loading import validate
    from ai_factory.factory.rendering import program
    from ai_factory.factory.rendering.bundle import program_config
    from ai_factory.factory.rendering.harness import run_program

    raw, secret_sections = environment(tenants)
    cfg = validate(raw)
    config, secret_keys = program_config(raw, secret_sections, PROJECT)
    library = functools.partial(program.main, with_tenant_stacks=True)
    graph = run_program(library, project=PROJECT, stack=STACK, config=config, secret_keys=secret_keys)  # warm-up, and the objects
    providers = [r for r in graph.resources if r.type.startswith("pulumi:providers:")]
    custom = [r for r in graph.resources if r.custom and not r.type.startswith("pulumi:providers:")]
    fallback = [r for r in custom if typed_class(r.type) is None]

    def registered_providers(typed: bool = False) -> dict[str, pulumi.ProviderResource]:
        return {
            p.urn: typed_class(p.type)(p.name, provider_arguments(p.inputs), None) if typed else pulumi.ProviderResource(p.type.rpartition(":")[2], p.name, dict(p.inputs))
            for p in providers
        }

    def options(r, by_urn: dict[str, pulumi.ProviderResource]) -> pulumi.ResourceOptions | None:
        # The recorded reference is `<provider urn>::<id>`.
        return pulumi.ResourceOptions(provider=by_urn[r.provider.rpartition("::")[0]]) if r.provider else None

    def plain() -> None:
        by_urn = registered_providers()
        for r in custom:
            pulumi.CustomResource(r.type, r.name, dict(r.inputs), options(r, by_urn))

    def typed() -> None:
        by_urn = registered_providers(typed=True)
        for r in custom:
            register = typed_class(r.type)
            if register is None:
                pulumi.CustomResource(r.type, r.name, dict(r.inputs), options(r, by_urn))
            else:
                register(r.name, r.inputs, options(r, by_urn))

    # The typed program registers the very same objects: every custom resource with the library's
    # inputs, through a provider of the same name (parents, and so URNs, aside).
    assert _objects(run_program(typed, project=PROJECT, stack=STACK)) == _objects(graph)
    runs: dict[str, list[float]] = {"library": [], "plain": [], "typed": []}
    for _ in range(ROUNDS):
        runs["library"].append(timed(library, config=config, secret_keys=secret_keys))
        runs["plain"].append(timed(plain))
        runs["typed"].append(timed(typed))
    best = {name: min(times) for name, times in runs.items()}
    return {
        "tenants": len(cfg.tenants),
        "resources": len(graph.resources),
        "custom": len(custom),
        **{f"{name}_ms": round(1000 * seconds / len(custom), 2) for name, seconds in best.items()},
        "plain_ratio": round(best["library"] / best["plain"], 2),
        "typed_ratio": round(best["library"] / best["typed"], 2),
        "fallback": len(fallback),
    }


def _objects(graph) -> dict[tuple[str, str], tuple[dict, str]]:
    return {(r.type, r.name): (r.inputs, r.provider.rpartition("::")[0].rpartition("::")[2]) for r in graph.resources if r.custom}


@functools.cache
def typed_class(resource_type: str):
    """How a hand-written program registers a resource of this type: its typed class (of
    pulumi-kubernetes, or of the Keycloak and OpenBao providers' SDKs, which the library uses too)
    with the inputs as keyword arguments, or None for a type no SDK here has a class for."""
    import pulumi_kubernetes as k8s

    provider, _, rest = resource_type.partition(":")
    if provider != "kubernetes" or ":" not in rest:
        return _other_sdk_class(provider, rest)
    group_version, kind = rest.split(":")
    group, _, version = group_version.rpartition("/")
    try:
        module = importlib.import_module(f"pulumi_kubernetes.{group.split('.')[0]}.{version}")
        cls = getattr(module, kind)
    except (ImportError, AttributeError):
        cls = None
    if cls is None:  # a custom resource of an operator's CRD

        def custom(name: str, inputs: dict, opts: pulumi.ResourceOptions | None) -> None:
            if set(inputs) <= {"apiVersion", "kind", "metadata", "spec"}:
                k8s.apiextensions.CustomResource(name, api_version=inputs["apiVersion"], kind=inputs["kind"], metadata=inputs.get("metadata"), spec=inputs.get("spec"), opts=opts)
            else:  # fields beside `spec` (a WorkloadPriorityClass's `value`), which that class drops: as the library registers it
                pulumi.CustomResource(resource_type, name, dict(inputs), opts)

        return custom

    def typed(name: str, inputs: dict, opts: pulumi.ResourceOptions | None) -> None:
        cls(name, opts=opts, **{_snake(k): v for k, v in inputs.items() if k not in ("apiVersion", "kind")})

    return typed


def provider_arguments(inputs: dict) -> dict:
    """A provider's recorded inputs as its typed class takes them: the SDK sends every value that
    is not a string JSON-encoded (`skipChildToken: "true"`)."""
    return {k: decoded if not isinstance(decoded := _json_or(v), str) else v for k, v in inputs.items()}


def _json_or(value):
    try:
        return json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return value


def _other_sdk_class(provider: str, rest: str):
    """`keycloak:openid/client:Client` is `pulumi_keycloak.openid.Client`, `pulumi:providers:vault`
    is `pulumi_vault.Provider`."""
    if provider == "pulumi" and rest.startswith("providers:"):
        package, module, kind = rest.partition(":")[2], "index", "Provider"
    else:
        package, (module_path, _, kind) = provider, rest.partition(":")
        module = module_path.split("/")[0]
    try:
        sdk = importlib.import_module(f"pulumi_{package}")
        cls = getattr(sdk if module == "index" else importlib.import_module(f"pulumi_{package}.{module}"), kind)
    except (ImportError, AttributeError):
        return None

    def typed(name: str, inputs: dict, opts: pulumi.ResourceOptions | None) -> pulumi.Resource:
        return cls(name, opts=opts, **{_snake(k): v for k, v in inputs.items()})

    return typed


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--one":
        sys.path.insert(0, str(REPO))
        print(json.dumps(measure(int(argv[1]))))
        return
    print(
        f"{'tenants':>7} {'resources':>9} {'custom':>7} {'library CPU ms/obj':>18} {'plain CPU ms/obj':>16} {'ratio':>6} "
        f"{'typed CPU ms/obj':>16} {'ratio':>6} {'untyped':>7}"
    )
    for size in argv or DEFAULT_SIZES:
        out = subprocess.run([sys.executable, __file__, "--one", size], capture_output=True, text=True, check=True, cwd=REPO)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{r['tenants']:>7} {r['resources']:>9} {r['custom']:>7} {r['library_ms']:>18} {r['plain_ms']:>16} {r['plain_ratio']:>6.2f} "
            f"{r['typed_ms']:>16} {r['typed_ratio']:>6.2f} {r['fallback']:>7}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
