"""Progress of render, check and plan: on stderr when it is a terminal, never otherwise, never with
--quiet; the work reports through plain callbacks."""

from __future__ import annotations

import pytest

from ai_factory.factory.checking.check import checks, run_checks
from ai_factory.factory.cli import main
from ai_factory.factory.progress import Steps
from ai_factory.factory.rendering.bundle import Rendered
from tests.test_plan_cli import stack_file


@pytest.fixture
def terminal(monkeypatch):
    """stderr (and stdout) taken for a terminal, as rich decides it."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("TTY_INTERACTIVE", "1")


def test_no_progress_when_stderr_is_not_a_terminal(tmp_path, capsys, monkeypatch):
    for variable in ("TTY_COMPATIBLE", "TTY_INTERACTIVE", "FORCE_COLOR"):
        monkeypatch.delenv(variable, raising=False)
    assert not Steps().enabled
    assert main(["plan", str(stack_file(tmp_path)), "--out", str(tmp_path / "plan.json")]) == 0
    assert capsys.readouterr().err == ""


def test_plan_shows_progress_on_a_terminal_and_quiet_hides_it(tmp_path, capsys, terminal):
    path = stack_file(tmp_path)
    assert Steps().enabled and not Steps(quiet=True).enabled
    assert main(["plan", str(path), "--out", str(tmp_path / "plan.json"), "--map", str(tmp_path / "map.svg")]) == 0
    err = capsys.readouterr().err
    assert "planning" in err and "drawing" in err
    assert main(["plan", str(path), "--out", str(tmp_path / "plan.json"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_check_shows_progress_per_check_on_a_terminal(tmp_path, capsys, terminal):
    main(["check", str(tmp_path)])  # an empty rendered directory: every check, no object, no chart
    err = capsys.readouterr().err
    total = len(checks(Rendered(None, "1.34", [], [])))
    assert "checking" in err and f"{total}/{total}" in err


def test_run_checks_reports_each_check_once_it_has_run():
    rendered = Rendered(None, "1.34", [], [])
    done = []
    oracles = object()  # no check reads the oracles when there is no object
    assert run_checks(rendered, oracles, on_check=lambda: done.append(len(done))) == []
    assert len(done) == len(checks(rendered))


def test_render_counts_resources_and_files_on_a_terminal(tmp_path, capsys, terminal):
    out = tmp_path / "build"
    assert main(["render", str(stack_file(tmp_path)), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "rendering" in err and "resources" in err and "writing" in err
    files = sum(1 for p in out.rglob("*") if p.is_file())
    assert f"{files}/{files}" in err


def test_check_environment_counts_charts_rendered_and_checks_run(dev, dev_check):
    counts, report = dev_check.steps, dev_check.report
    releases = sum(m.kind == "HelmRelease" for m in dev.manifests)
    assert counts["rendering charts"] == [releases, releases] and report.charts_rendered == releases
    total, done = counts["checking"]
    assert total == done > 0
