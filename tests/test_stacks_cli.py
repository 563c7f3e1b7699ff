"""`ai-factory-stacks`, and the Automation API against the real `pulumi` CLI where it is installed."""

from __future__ import annotations

import shutil

import pytest

from ai_factory.stacks.__main__ import EXIT_FAILED, EXIT_INVALID, main
from ai_factory.stacks.contract import ContractError
from ai_factory.stacks.platform import PlatformStacks
from ai_factory.stacks.tenants import TenantNotFound, TenantStacks
from tests.stacks_support import DEV_PROJECT, backend


def test_an_invalid_tenant_file_exits_2_listing_every_problem(tmp_path, capsys):
    spec = tmp_path / "tenant.yaml"
    spec.write_text("name: vision\ntrust: low\nisolation: namespace\nowners: {groups: [vision-admins]}\ngpus: [{pool: h100-train, count: 0}]\n")
    assert main(["tenant", "create", "dev", str(spec), "--state-dir", str(tmp_path)]) == EXIT_INVALID
    assert capsys.readouterr().err.splitlines() == [
        "tenant is invalid (2 problems):",
        "  - tenant.gpus[0].count: must be >= 1",
        "  - tenant.isolation: a low-trust tenant needs its own control plane (vcluster)",
    ]


def test_without_a_passphrase_the_cli_exits_1_saying_what_is_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE_FILE", raising=False)
    assert main(["tenant", "list", "dev", "--state-dir", str(tmp_path)]) == EXIT_FAILED
    assert "needs a passphrase" in capsys.readouterr().err


needs_pulumi = pytest.mark.skipif(shutil.which("pulumi") is None, reason="needs the pulumi CLI on PATH (the Automation API runs it); not installed here")


@needs_pulumi
def test_real_cli_lists_no_tenant_on_an_empty_backend(tmp_path):
    assert TenantStacks(backend(tmp_path), project_dir=DEV_PROJECT).list("dev") == []


@needs_pulumi
def test_real_cli_reports_missing_stacks_as_such(tmp_path):
    tenants = TenantStacks(backend(tmp_path), project_dir=DEV_PROJECT)
    with pytest.raises(TenantNotFound):
        tenants.status("dev", "ghost")
    with pytest.raises(ContractError, match="no platform stack organization/ai-factory/dev"):
        PlatformStacks(backend(tmp_path), project_dir=DEV_PROJECT).contract("dev")
