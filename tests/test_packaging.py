"""The library as users get it: a wheel installed in a fresh virtualenv, used from a project of
their own outside this repository."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _pins(lines: list[str]) -> list[str]:
    return sorted(line.split("#")[0].strip() for line in lines if line.split("#")[0].strip() and not line.startswith("-"))


def test_the_distribution_depends_on_exactly_the_pinned_runtime_requirements():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert _pins(declared) == _pins((REPO / "requirements.txt").read_text().splitlines())


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel built from this checkout (and its pinned dependencies)."""
    work = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(work), str(REPO)], check=True, timeout=300)
    (wheel,) = work.glob("ai_factory-*.whl")
    env = work / "venv"
    venv.create(env, with_pip=True)
    # --no-compile: byte-compiling every dependency at install is most of the install's work, and
    # what the tests run is compiled on import all the same.
    subprocess.run([env / "bin" / "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile", str(wheel)], check=True, timeout=900)
    return env


def test_the_wheel_installs_everything_under_one_ai_factory_namespace(installed):
    (wheel,) = installed.parent.glob("ai_factory-*.whl")
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"ai_factory"}
    assert {"ai_factory/policies/PulumiPolicy.yaml", "ai_factory/factory/planning/mig.py", "ai_factory/factory/model/matrix.yaml"} <= set(zipfile.ZipFile(wheel).namelist())


def test_the_installed_cli_renders_and_plans_a_project_of_the_users_own(installed, tmp_path):
    project = tmp_path / "my-platform"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: acme-gpu\nruntime: python\n")
    stack = (REPO / "Pulumi.dev.yaml").read_text()
    (project / "Pulumi.dev.yaml").write_text(re.sub(r"^  ai-factory:", "  acme-gpu:", stack, flags=re.M))
    render = subprocess.run([installed / "bin" / "ai-factory", "render", "dev"], cwd=project, capture_output=True, text=True, timeout=300)
    assert render.returncode == 0, render.stderr
    assert "cluster par1-a (build/dev/par1-a/):\n248 objects" in render.stdout and "cluster par1-b (build/dev/par1-b/):\n118 objects" in render.stdout
    assert all((project / "build" / "dev" / c / "inventory.json").is_file() for c in ("par1-a", "par1-b"))
    plan = subprocess.run(
        [installed / "bin" / "ai-factory", "--project-dir", str(project), "plan", "dev", "--lock"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert plan.returncode == 0, plan.stderr
    assert sorted(p.name for p in (project / "plans").iterdir()) == ["dev-par1-a.json", "dev-par1-b.json"]


def test_a_stack_file_in_another_projects_namespace_configures_nothing_and_says_so(installed, tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("name: other-project\nruntime: python\n")
    shutil.copy(REPO / "Pulumi.dev.yaml", tmp_path / "Pulumi.dev.yaml")  # its sections are `ai-factory:...`
    render = subprocess.run([installed / "bin" / "ai-factory", "render", "dev"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert render.returncode == 2 and "Traceback" not in render.stderr


def test_the_components_example_runs_from_outside_the_repository(installed, tmp_path):
    script = tmp_path / "program.py"
    shutil.copy(REPO / "examples" / "components" / "__main__.py", tmp_path / "example.py")
    script.write_text(
        "import runpy\n"
        "from ai_factory.factory.rendering.harness import run_program\n"
        "graph = run_program(lambda: runpy.run_path('example.py'), project='example', stack='dev')\n"
        "print(len(graph.resources))\n"
    )
    run = subprocess.run([installed / "bin" / "python", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert int(run.stdout.strip()) > 20
