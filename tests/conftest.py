"""Shared fixtures: the dev environment, renders of (modified) configs, and the oracles."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from ai_factory.factory.model.loading import read_stack_file, stack_file, validate
from ai_factory.factory.checking.charts import Report, check_environment
from ai_factory.factory.checking.oracles import Oracles, locate_upstream_dir
from ai_factory.factory.rendering.bundle import Rendered, render_clusters, render_raw
from ai_factory.factory.rendering.charts import locate_chart_dir, locate_helm
from ai_factory.factory.model.secrets import SecretValue
from tests.fleet_env import fold_clusters

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def session_cache_dir(tmp_path_factory) -> None:
    """The render and check cache of every CLI run of the session (in-process or subprocess),
    instead of the repository's `.factory-cache`: what a test sees never depends on an earlier
    run's or another session's cache, and the tests write nothing into the tree. Shared by the
    session, so a command run again is as warm as it is for a user."""
    from ai_factory.factory.rendering.cache import CACHE_ENV

    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("factory-cache")))
    yield
    patch.undo()


@pytest.fixture(scope="session")
def dev_raw() -> tuple[dict[str, Any], set[str]]:
    """dev's sections with its two clusters folded into one (`tests.fleet_env.fold_clusters`): every
    pool, tenant and layer of dev in one render, the config the layer tests build on. dev itself
    renders per cluster (`dev_clusters`)."""
    sections, secret_sections = read_stack_file(stack_file("dev", REPO))
    fold_clusters(sections["fleet"], sections["tenants"])
    return sections, secret_sections


@pytest.fixture(scope="session")
def dev_clusters() -> dict[str, Rendered]:
    """dev as `ai-factory render dev` renders it: par1-a, then par1-b."""
    here = os.getcwd()
    os.chdir(REPO)
    try:
        return render_clusters("dev")
    finally:
        os.chdir(here)


@pytest.fixture
def raw(dev_raw) -> dict[str, Any]:
    """A private deep copy of the dev config's sections, for tests that break it."""
    return copy.deepcopy(dev_raw[0])


def without_models(raw: dict[str, Any]) -> dict[str, Any]:
    """The config without served models: for tests that reshape the pools or grants dev's models use."""
    for tenant in raw.get("tenants", []):
        tenant.pop("models", None)
    return raw


def without_dev_tenants_settings(raw: dict[str, Any]) -> dict[str, Any]:
    """The config without the layer settings that name dev's own tenants and hosts (Slurm clusters,
    Pod Security exceptions, Metal3 hosts, VMs): for tests that replace dev's tenants or pools."""
    layers = raw.get("layers", {})
    for section in ("slinky", "provisioning", "kubevirt"):
        layers.pop(section, None)
    layers.get("tenancy", {}).pop("pod_security_exceptions", None)
    return without_models(raw)


def render(raw: dict[str, Any], secret_sections: set[str] = frozenset(), stack: str = "dev") -> Rendered:
    """Render sections as the stack file would seed them: a section still holding a `secure:`
    placeholder is a secret key, besides those named."""
    cfg = validate(raw)
    holding_secrets = {section for section, value in raw.items() if _holds_secret(value)}
    return render_raw(raw, set(secret_sections) | holding_secrets, cfg, stack=stack)


def _holds_secret(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_secret(v) for v in value)
    return isinstance(value, SecretValue)


@pytest.fixture(scope="session")
def dev(dev_raw) -> Rendered:
    return render(*dev_raw)


@pytest.fixture(scope="session")
def device(dev_raw) -> Rendered:
    """dev with pools of every device-sharing mode (`tests.test_device_layer.device_config`), rendered
    once for the device layer's tests and the chart checks of its DRA chart."""
    from tests.test_device_layer import STACK, device_config

    return render(device_config(dev_raw[0]), dev_raw[1], stack=STACK)


@pytest.fixture(scope="session")
def three_tenants(dev_raw) -> tuple[dict[str, Any], set[str], Rendered]:
    """Three generated tenants on dev's platform (`tests.tenancy_env.many_tenants`): the config, its
    secret sections and its cold render (no cache), for the render and check cache tests."""
    from tests.tenancy_env import many_tenants

    raw = many_tenants(copy.deepcopy(dev_raw[0]), 3)
    return raw, dev_raw[1], render_raw(raw, dev_raw[1], validate(raw), stack="dev")


@pytest.fixture(scope="session")
def big(dev_raw) -> Rendered:
    """The bigger environment of the scheduling tests (`tests.scheduling_env.bigger_environment`), rendered."""
    from tests.scheduling_env import bigger_environment

    return render(bigger_environment(copy.deepcopy(dev_raw[0])))


@pytest.fixture(scope="session")
def oracles() -> Oracles:
    root = locate_upstream_dir()
    if root is None:
        if os.environ.get("FACTORY_REQUIRE_UPSTREAM"):
            pytest.fail("FACTORY_REQUIRE_UPSTREAM is set but no oracle directory was found")
        pytest.skip("no upstream oracle directory (../shared/upstream or $FACTORY_UPSTREAM_DIR)")
    return Oracles(root)


@dataclass(frozen=True)
class ChartEnv:
    charts_dir: Path
    helm: str
    store: Path
    """This session's store of rendered charts: each chart renders once per session and values."""


@pytest.fixture(scope="session")
def chart_env(tmp_path_factory) -> ChartEnv:
    """helm and the chart cache (`ai_factory.factory.rendering.charts`); skipped without them,
    except in CI (FACTORY_REQUIRE_UPSTREAM), which refuses to skip."""
    charts_dir, helm = locate_chart_dir(), locate_helm()
    if charts_dir is None or helm is None:
        missing = " and ".join(what for what, found in (("no chart cache (../shared/charts or $FACTORY_CHARTS_DIR)", charts_dir), ("no helm (ai-factory charts install-helm)", helm)) if found is None)
        if os.environ.get("FACTORY_REQUIRE_UPSTREAM"):
            pytest.fail(f"FACTORY_REQUIRE_UPSTREAM is set but there is {missing}")
        pytest.skip(missing)
    return ChartEnv(charts_dir, helm, tmp_path_factory.mktemp("rendered-charts"))


@dataclass(frozen=True)
class DevCheck:
    report: Report
    steps: dict[str, list[int]]
    """The progress steps the check started: description -> [size announced, units done]."""


@pytest.fixture(scope="session")
def dev_check(dev, oracles, chart_env: ChartEnv) -> DevCheck:
    """`check_environment` of `dev` with the real charts, once per session (the costliest check of
    the suite), with the progress it reported."""
    steps: dict[str, list[int]] = {}

    def step(description: str, total: int) -> Callable[[], None]:
        steps[description] = [total, 0]

        def advance() -> None:
            steps[description][1] += 1

        return advance

    report = check_environment(dev, oracles.root, chart_env.charts_dir, chart_env.helm, chart_env.store, step=step)
    return DevCheck(report, steps)


def objects(rendered: Rendered, kind: str) -> list[dict]:
    return [m.obj for m in rendered.manifests if m.kind == kind]


def one(rendered: Rendered, kind: str, name: str) -> dict:
    matches = [m.obj for m in rendered.manifests if m.kind == kind and m.name == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


Edit = Callable[[dict[str, Any]], None]


def settled(condition: Callable[[], object], seconds: float = 120) -> None:
    """Wait until `condition` holds (what another process does), failing after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the other process never got there"
        time.sleep(0.01)


def run_main(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """The CLI's `main` run in this process, as `python -m ai_factory.factory *args` would run in
    `cwd` with the stack passphrase unset and `env` added: its exit status and what it printed.
    A test of what a command prints and returns needs no interpreter of its own (starting one costs
    more than most refusals); one subprocess test per command keeps the real entry point covered."""
    from ai_factory.factory.cli import main

    saved = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    caller_dir = os.getcwd()
    try:
        for key in [k for k in os.environ if k.startswith("PULUMI_CONFIG_PASSPHRASE")]:
            del os.environ[key]
        os.environ.update(env or {})
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(list(args))
            except SystemExit as exit:  # argparse's usage errors
                status = exit.code
    finally:
        os.chdir(caller_dir)
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(["ai-factory", *args], status, out.getvalue(), err.getvalue())
