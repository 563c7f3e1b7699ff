"""The library's cost per resource against a plain program registering the very same objects.

    python benchmarks/overhead.py            # dev, and generated environments of 50 and 200 tenants
    python benchmarks/overhead.py 0 100      # tenant counts (0 = the dev environment itself)

For each environment, in one process and under the same mocks (`factory/rendering/harness.py`):
- library: `factory render`'s program (config, plan, components, hooks);
- plain: a hand-written program that registers every custom resource the library registered
  (same type, same name, same inputs, no components, no parents, no dependencies) as untyped
  `pulumi.CustomResource`s;
- typed: the same objects through pulumi-kubernetes' typed classes (`k8s.core.v1.ConfigMap(...)`,
  `k8s.apiextensions.CustomResource(...)`, `k8s.helm.v3.Release(...)`), as a hand-written
  pulumi-kubernetes program would register them (resources of other providers, Keycloak and
  OpenBao, stay untyped: `fallback` counts them).
It prints each per resource and the library's ratio to both (the library's time includes
validating the config and planning). Each size runs in a fresh process, after one warm-up registration. Times are CPU
time (the process's own), so that a machine shared with other work still compares the two fairly.
"""

from __future__ import annotations

import functools
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


def measure(tenants: int) -> dict:
    from ai_factory.factory.model.loading import read_stack_file, stack_file, validate
    from ai_factory.factory.rendering.bundle import render_raw
    from ai_factory.factory.rendering.harness import run_program
    from tests.tenancy_env import many_tenants

    raw, secret_sections = read_stack_file(stack_file("dev", REPO))
    if tenants:
        raw = many_tenants(raw, tenants)
    cfg = validate(raw)
    run_program(lambda: pulumi.CustomResource("kubernetes:core/v1:ConfigMap", "warm-up", {}), project="ai-factory", stack="bench")
    started = time.process_time()
    rendered = render_raw(raw, secret_sections, cfg, stack="bench")
    library_s = time.process_time() - started
    custom = [r for r in rendered.graph.resources if r.custom and not r.type.startswith("pulumi:providers:")]

    def plain() -> None:
        for r in custom:
            pulumi.CustomResource(r.type, r.name, dict(r.inputs))

    started = time.process_time()
    run_program(plain, project="ai-factory", stack="bench")
    plain_s = time.process_time() - started
    fallback = [r for r in custom if typed_class(r.type) is None]

    def typed() -> None:
        for r in custom:
            register = typed_class(r.type)
            if register is None:
                pulumi.CustomResource(r.type, r.name, dict(r.inputs))
            else:
                register(r.name, r.inputs)

    started = time.process_time()
    run_program(typed, project="ai-factory", stack="bench")
    typed_s = time.process_time() - started
    return {
        "tenants": len(cfg.tenants),
        "resources": len(rendered.graph.resources),
        "custom": len(custom),
        "library_ms": round(1000 * library_s / len(rendered.graph.resources), 2),
        "plain_ms": round(1000 * plain_s / len(custom), 2),
        "typed_ms": round(1000 * typed_s / len(custom), 2),
        "fallback": len(fallback),
    }


@functools.cache
def typed_class(resource_type: str):
    """How a hand-written pulumi-kubernetes program registers a resource of this type: its typed
    class with the inputs as keyword arguments, or None for another provider's resource."""
    import pulumi_kubernetes as k8s

    provider, _, rest = resource_type.partition(":")
    if provider != "kubernetes" or ":" not in rest:
        return None
    group_version, kind = rest.split(":")
    group, _, version = group_version.rpartition("/")
    try:
        module = importlib.import_module(f"pulumi_kubernetes.{group.split('.')[0]}.{version}")
        cls = getattr(module, kind)
    except (ImportError, AttributeError):
        cls = None
    if cls is None:  # a custom resource of an operator's CRD

        def custom(name: str, inputs: dict) -> None:
            k8s.apiextensions.CustomResource(name, api_version=inputs["apiVersion"], kind=inputs["kind"], metadata=inputs.get("metadata"), spec=inputs.get("spec"))

        return custom

    def typed(name: str, inputs: dict) -> None:
        cls(name, **{_snake(k): v for k, v in inputs.items() if k not in ("apiVersion", "kind")})

    return typed


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--one":
        sys.path.insert(0, str(REPO))
        print(json.dumps(measure(int(argv[1]))))
        return
    print(
        f"{'tenants':>7} {'resources':>9} {'custom':>7} {'library CPU ms/res':>18} {'plain CPU ms/res':>16} {'ratio':>6} "
        f"{'typed CPU ms/res':>16} {'ratio':>6} {'untyped (not k8s)':>17}"
    )
    for size in argv or DEFAULT_SIZES:
        out = subprocess.run([sys.executable, __file__, "--one", size], capture_output=True, text=True, check=True, cwd=REPO)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{r['tenants']:>7} {r['resources']:>9} {r['custom']:>7} {r['library_ms']:>18} {r['plain_ms']:>16} {r['library_ms'] / r['plain_ms']:>6.2f} "
            f"{r['typed_ms']:>16} {r['library_ms'] / r['typed_ms']:>6.2f} {r['fallback']:>17}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
