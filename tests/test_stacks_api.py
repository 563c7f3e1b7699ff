"""The Automation API layer (`stacks.platform`, `stacks.tenants`) up to the CLI boundary: the
commands it issues, what it refuses before issuing any, what it returns, and how it runs
operations side by side. The `pulumi` CLI is `tests.fake_pulumi.FakePulumi`."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from ai_factory.factory.model.config import Tenant
from ai_factory.factory.model.loading import ConfigError
from ai_factory.stacks.backend import Backend, BackendError
from ai_factory.stacks.contract import CONTRACT_VERSION, ContractError
from ai_factory.stacks.platform import PlatformStacks
from ai_factory.stacks.tenants import TENANT_KEY, TenantExists, TenantNotFound, TenantStacks
from tests.stacks_support import KUBECONFIG, PASSPHRASE, REGISTRY_PASSWORD, DEV_PROJECT, backend, deployed_platform, fake_cli, registered, tenant

TENANT = "organization/ai-factory-tenant/dev.vision"
PLATFORM = "organization/ai-factory/dev"
PACK = f"{DEV_PROJECT}/policies --policy-pack-config {DEV_PROJECT}/policies/config.dev.json"


def commands(cli, since: int = 0) -> list[str]:
    """Command lines without the per-run ports of the SDK's local gRPC servers."""
    return [" ".join(a.split("=")[0] if a.startswith("--client") else ("<event-log>" if a.startswith("tcp://") else a) for a in c.args) for c in cli.calls[since:]]


# --------------------------------------------------------------------------- platform stacks


def test_platform_up_runs_the_project_program_in_the_project_directory(tmp_path):
    cli = fake_cli()
    result = PlatformStacks(backend(tmp_path), project_dir=DEV_PROJECT, pulumi_command=cli).up("dev")
    assert commands(cli) == [
        f"stack select --stack {PLATFORM}",
        f"stack init {PLATFORM} --secrets-provider passphrase",
        f"up --yes --skip-preview --policy-pack {PACK} --exec-kind auto.local --stack {PLATFORM}",
        f"stack output --json --stack {PLATFORM}",
        f"stack output --json --show-secrets --stack {PLATFORM}",
        f"stack history --json --show-secrets --page-size 1 --page 1 --stack {PLATFORM}",
    ]
    assert {c.cwd for c in cli.calls} == {str(DEV_PROJECT)}
    assert result.operation == "up" and result.changes == {"create": 2}
    assert json.loads(result.outputs["contract"])["contract_version"] == CONTRACT_VERSION


def test_platform_preview_and_destroy_issue_the_expected_commands(tmp_path):
    cli, platforms, _ = deployed_platform(tmp_path)
    start = len(cli.calls)
    assert platforms.preview("dev").changes == {"same": 2}
    destroyed = platforms.destroy("dev")
    assert commands(cli, start) == [
        f"stack select --stack {PLATFORM}",
        f"preview --policy-pack {PACK} --exec-kind auto.local --event-log <event-log> --stack {PLATFORM}",
        f"stack select --stack {PLATFORM}",
        f"stack export --stack {PLATFORM}",
        f"destroy --skip-preview --yes --exclude-protected --exec-kind auto.local --stack {PLATFORM}",
        f"stack history --json --show-secrets --page-size 1 --page 1 --stack {PLATFORM}",
        f"stack export --stack {PLATFORM}",
    ]
    assert destroyed.changes == {"delete": 2} and destroyed.kept == []


def test_backend_reaches_the_cli_through_the_environment_only(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    tenants.create("dev", tenant())
    for call in cli.calls:
        assert call.env["PULUMI_BACKEND_URL"] == (tmp_path / "state" / "backend").as_uri()
        assert call.env["PULUMI_CONFIG_PASSPHRASE_FILE"] == str(tmp_path / "passphrase")
        assert "PULUMI_CONFIG_PASSPHRASE" not in call.env
    assert (tmp_path / "state" / "backend").is_dir()


def test_a_configurable_backend_names_stacks_in_its_organisation(tmp_path):
    cli = fake_cli()
    cloud = Backend(state_dir=tmp_path, url="https://api.pulumi.com", organization="acme", passphrase_file=None, secrets_provider="awskms://alias/pulumi")
    PlatformStacks(cloud, project_dir=DEV_PROJECT, pulumi_command=cli).up("dev")
    assert cli.calls[1].args == ["stack", "init", "acme/ai-factory/dev", "--secrets-provider", "awskms://alias/pulumi"]
    assert cli.calls[0].env["PULUMI_BACKEND_URL"] == "https://api.pulumi.com"


def test_invalid_platform_config_fails_before_any_command(tmp_path):
    broken = tmp_path / "project"
    broken.mkdir()
    (broken / "Pulumi.broken.yaml").write_text("config:\n  ai-factory:fleet:\n    sites: []\n    pools: []\n")
    cli = fake_cli()
    with pytest.raises(ConfigError) as err:
        PlatformStacks(backend(tmp_path), project_dir=broken, pulumi_command=cli).up("broken")
    assert "fleet.sites: must have at least 1 item(s)" in err.value.problems
    assert cli.calls == []


def test_a_passphrase_provider_without_a_passphrase_fails_before_any_command(tmp_path, monkeypatch):
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE_FILE", raising=False)
    cli = fake_cli()
    with pytest.raises(BackendError, match="PULUMI_CONFIG_PASSPHRASE_FILE"):
        PlatformStacks(Backend(state_dir=tmp_path), project_dir=DEV_PROJECT, pulumi_command=cli).up("dev")
    assert cli.calls == []


def test_progress_streams_output_lines_and_engine_events(tmp_path):
    cli, platforms, tenants = deployed_platform(tmp_path)
    lines, events = [], []
    tenants.create("dev", tenant(), on_output=lines.append, on_event=events.append)
    assert lines[0] == f"Updating ({TENANT})" and "    4 create" in lines
    steps = [e.resource_pre_event.metadata for e in events if e.resource_pre_event]
    assert [(s.op.value, s.type) for s in steps][:2] == [("create", "ai-factory:tenancy:TenantStack"), ("create", "kubernetes:core/v1:Namespace")]
    assert any(e.summary_event for e in events)


# --------------------------------------------------------------------------- tenant stacks


def test_tenant_create_configures_the_stack_then_runs_the_inline_program(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    start = len(cli.calls)
    result = tenants.create("dev", tenant())
    tenant_json = json.dumps(Tenant.model_validate(tenant()).model_dump(mode="json"), sort_keys=True)
    assert commands(cli, start) == [
        f"stack output --json --stack {PLATFORM}",
        "stack ls --json",  # other tenants' owners: no group may own two tenants
        f"stack init {TENANT} --secrets-provider passphrase",
        f"config set ai-factory-tenant:tenant --plaintext --stack {TENANT} -- {tenant_json}",
        f"config set ai-factory-tenant:platform --plaintext --stack {TENANT} -- {PLATFORM}",
        f"config set kubernetes:context --plaintext --stack {TENANT} -- dev-admin",
        f"up --yes --skip-preview --policy-pack {PACK} --client --exec-kind auto.inline --stack {TENANT}",
        f"stack output --json --stack {TENANT}",
        f"stack output --json --show-secrets --stack {TENANT}",
        f"stack history --json --show-secrets --page-size 1 --page 1 --stack {TENANT}",
    ]
    assert cli.calls[-1].cwd == str(tmp_path / "state" / "tenants" / "dev.vision")
    assert result.changes == {"create": 4}
    assert result.outputs["namespace"] == "tenant-vision"


def test_tenant_update_preview_and_delete_issue_the_expected_commands(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    tenants.create("dev", tenant())
    start = len(cli.calls)
    tenants.update("dev", tenant(owners={"groups": ["vision-admins"], "users": ["ana@example.com"]}))
    tenants.preview("dev", tenant())
    tenants.delete("dev", "vision")
    ops = [c for c in commands(cli, start) if not c.startswith(("config set", "stack output", "stack history", "stack ls"))]
    assert ops == [
        f"stack select --stack {TENANT}",
        f"up --yes --skip-preview --policy-pack {PACK} --client --exec-kind auto.inline --stack {TENANT}",
        f"stack select --stack {TENANT}",
        f"preview --policy-pack {PACK} --client --exec-kind auto.inline --event-log <event-log> --stack {TENANT}",
        f"stack select --stack {TENANT}",
        f"stack export --stack {TENANT}",
        f"destroy --skip-preview --yes --exclude-protected --client --exec-kind auto.inline --stack {TENANT}",
        f"stack export --stack {TENANT}",
    ]


def test_deleting_a_tenant_keeps_protected_resources_and_says_so(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    tenants.create("dev", tenant())
    result = tenants.delete("dev", "vision")
    kept = {k.type: k.reason for k in result.kept}
    assert kept == {
        "kubernetes:core/v1:Namespace": "protected",
        "ai-factory:tenancy:TenantStack": "needed by a protected resource",
        "kubernetes:core/v1:ResourceQuota": "retained on delete",
    }
    assert result.changes == {"delete": 2, "same": 2} and result.removed is False
    assert TENANT in cli.stacks  # the stack still holds the protected namespace
    assert not any(c.args[:2] == ["stack", "rm"] for c in cli.calls)


def test_deleting_a_tenant_with_nothing_protected_removes_its_stack(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    tenants.create("dev", tenant())
    for r in cli.stacks[TENANT].deployed.resources:
        r.pop("protect", None)
    result = tenants.delete("dev", "vision")
    assert result.removed is True
    assert [k.reason for k in result.kept] == ["retained on delete", "retained on delete"]
    assert cli.calls[-1].args == ["stack", "rm", "--yes", TENANT]
    assert TENANT not in cli.stacks and not (tmp_path / "state" / "tenants" / "dev.vision").exists()


def test_previewing_a_new_tenant_leaves_no_stack_behind(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    result = tenants.preview("dev", tenant())
    assert result.changes == {"create": 4}
    assert TENANT not in cli.stacks and cli.calls[-1].args == ["stack", "rm", "--yes", TENANT]


def test_list_and_status_read_the_deployed_tenants(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    tenants.create("dev", tenant())
    tenants.create("dev", registered("assistant"))
    assert [(t.name, t.owners, t.resource_count) for t in tenants.list("dev")] == [("assistant", ["assistant-admins"], 4), ("vision", ["vision-admins"], 4)]
    status = tenants.status("dev", "vision")
    assert status.tenant.owners.groups == ["vision-admins"]
    assert (status.last_operation.kind, status.last_operation.result) == ("update", "succeeded")
    assert status.outputs["kubeconfig"] == "[secret]"
    assert f"stack history --json --page-size 1 --page 1 --stack {TENANT}" in commands(cli)


def test_creating_an_existing_tenant_or_updating_a_missing_one_is_refused(tmp_path):
    _, _, tenants = deployed_platform(tmp_path)
    tenants.create("dev", tenant())
    with pytest.raises(TenantExists):
        tenants.create("dev", tenant())
    with pytest.raises(TenantNotFound):
        tenants.update("dev", tenant("speech"))
    with pytest.raises(TenantNotFound):
        tenants.delete("dev", "ghost")


def test_an_invalid_tenant_is_refused_with_every_path_before_any_command(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    start = len(cli.calls)
    with pytest.raises(ConfigError) as err:
        tenants.create("dev", {"name": "Vision", "trust": "low", "isolation": "namespace", "owners": {"groups": []}, "gpus": [{"pool": "h100-train", "count": 0}]})
    assert err.value.problems == [
        "tenant.gpus[0].count: must be >= 1",
        "tenant.isolation: a low-trust tenant needs its own control plane (vcluster)",
        "tenant.name: 'Vision' does not match ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        "tenant.owners.groups: must have at least 1 item(s)",
    ]
    assert len(cli.calls) == start


def test_a_tenant_the_contract_refuses_is_refused_before_its_stack_is_touched(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    start = len(cli.calls)
    with pytest.raises(ConfigError) as err:
        tenants.create("dev", registered("assistant").model_copy(update={"trust": "high"}))
    assert [p.split(":")[0] for p in err.value.problems] == ["tenant.isolation", "tenant.trust"]
    assert commands(cli, start) == [f"stack output --json --stack {PLATFORM}", "stack ls --json"]


def test_no_owner_group_of_another_tenant_is_accepted(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    tenants.create("dev", tenant())
    start = len(cli.calls)
    # `speech` is registered with speech-admins, `search` is a platform-built tenant with search-admins.
    with pytest.raises(ConfigError) as err:
        tenants.update("dev", tenant(owners={"groups": ["vision-admins", "speech-admins", "search-admins"]}))
    assert err.value.problems == [
        "tenant.owners.groups[1]: group 'speech-admins' already owns tenant 'speech'; an identity group administers one tenant",
        "tenant.owners.groups[2]: group 'search-admins' already owns tenant 'search'; an identity group administers one tenant",
    ]
    assert not any(c.startswith(("up", "preview")) for c in commands(cli, start))


def test_a_group_another_tenant_stack_took_is_refused_too(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    tenants.create("dev", tenant("vision", owners={"groups": ["vision-admins", "ml-leads"]}))
    with pytest.raises(ConfigError, match=r"tenant.owners.groups\[1\]: group 'ml-leads' already owns tenant 'vision'"):
        tenants.create("dev", tenant("speech", owners={"groups": ["speech-admins", "ml-leads"]}))


def test_tenants_need_a_deployed_platform(tmp_path):
    cli = fake_cli()
    tenants = TenantStacks(backend(tmp_path), project_dir=DEV_PROJECT, pulumi_command=cli)
    with pytest.raises(ContractError, match="no platform stack organization/ai-factory/dev: deploy it first"):
        tenants.create("dev", tenant())
    assert not any(c.args[:2] == ["stack", "init"] for c in cli.calls)


def test_a_registered_tenant_may_change_its_owners_only(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    assistant = registered("assistant")
    tenants.create("dev", assistant.model_copy(update={"owners": assistant.owners.model_copy(update={"users": ["ana@example.com"]})}))
    deployed = json.loads(cli.stacks["organization/ai-factory-tenant/dev.assistant"].config[TENANT_KEY])
    assert deployed["owners"]["users"] == ["ana@example.com"]
    assert deployed["gpus"] == assistant.model_dump(mode="json")["gpus"]
    with pytest.raises(ConfigError, match=r"tenant\.gpus: .* differs from the platform's registration of 'assistant'"):
        tenants.update("dev", assistant.model_copy(update={"gpus": []}))


# --------------------------------------------------------------------------- secrets


def test_no_secret_reaches_a_command_line_a_result_or_a_log(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    cli, platforms, tenants = deployed_platform(tmp_path)
    results = [
        platforms.up("dev", on_output=logging.getLogger("test").info),
        tenants.create("dev", tenant()),
        tenants.create("dev", registered("assistant")),
        tenants.status("dev", "vision"),
        tenants.delete("dev", "vision"),
    ]
    assert any(c.args[:2] == ["stack", "output"] and "--show-secrets" in c.args for c in cli.calls)  # the SDK does decrypt
    everything = "\n".join([*cli.lines(), caplog.text, *(r.model_dump_json() for r in results)])
    for secret in (PASSPHRASE, REGISTRY_PASSWORD, KUBECONFIG, "vcluster-admin-token"):
        assert secret not in everything
    assert results[1].outputs["kubeconfig"] == "[secret]"


# --------------------------------------------------------------------------- concurrency


def run_in_threads(*work) -> list:
    errors: list[BaseException] = []

    def guarded(fn):
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 re-raised in the test thread
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(fn,)) for fn in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return threads


def test_operations_on_two_tenants_run_in_parallel(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    # Each tenant's update waits there for the other's: both get through only if they run at once
    # (a wall-clock window instead would flake on a loaded machine).
    both, met = threading.Barrier(2, timeout=20), []

    def hold(op: str, stack: str) -> None:
        if op == "up":
            try:
                both.wait()
                met.append(stack)
            except threading.BrokenBarrierError:
                pass

    cli.on_operation = hold
    run_in_threads(lambda: tenants.create("dev", tenant("vision")), lambda: tenants.create("dev", tenant("speech")))
    assert len(cli.operations("up")[1:]) == 2
    assert sorted(met) == ["dev.speech", "dev.vision"]  # each update started before the other one ended


def test_operations_on_one_tenant_run_one_at_a_time(tmp_path):
    cli, _, tenants = deployed_platform(tmp_path)
    tenants.create("dev", tenant())
    cli.delay = 0.3
    start = len(cli.calls)
    with_user = lambda user: tenant(owners={"groups": ["vision-admins"], "users": [user]})  # noqa: E731
    run_in_threads(lambda: tenants.update("dev", with_user("a@example.com")), lambda: tenants.preview("dev", with_user("b@example.com")), lambda: tenants.update("dev", with_user("c@example.com")))
    runs = sorted((c for c in cli.calls[start:] if c.args[0] in ("up", "preview", "destroy")), key=lambda c: c.started)
    assert len(runs) == 3
    for first, second in zip(runs, runs[1:]):
        assert second.started >= first.ended
