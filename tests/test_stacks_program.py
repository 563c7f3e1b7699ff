"""The two programs behind the stacks, run in-process under the mock monitor: the platform
program exports the contract, the tenant program builds one `TenantStack` from it (read through
a mocked `StackReference`)."""

from __future__ import annotations

import copy
import json

import pulumi
import pytest
from pulumi.runtime import rpc

from ai_factory.factory.rendering.harness import Graph, RecordingMocks, RecordingMonitor, run_program
from ai_factory.factory.rendering.program import main as platform_main
from ai_factory.stacks.contract import CONTRACT_OUTPUT, CONTRACT_SECRETS_OUTPUT, CONTRACT_VERSION
from ai_factory.stacks.tenants import PLATFORM_KEY, TENANT_KEY, tenant_program
from tests.conftest import render
from tests.stacks_support import dev_contract, dev_contract_secrets, registered, self_service_env

PLATFORM_STACK = "organization/ai-factory/dev"


class Exports:
    """A program's `pulumi.export`s, resolved (the mock runtime never registers the stack's outputs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.values: dict = {}
        self.secret: set[str] = set()
        self._recorded: dict[str, pulumi.Output] = {}
        monkeypatch.setattr(pulumi, "export", lambda name, value: self._recorded.__setitem__(name, pulumi.Output.from_input(value)))

    def around(self, program):
        def collect(_):
            values = pulumi.Output.all(**self._recorded)
            flags = pulumi.Output.all(**{k: pulumi.Output.from_input(v.is_secret()) for k, v in self._recorded.items()})
            return pulumi.Output.all(values, flags).apply(self._store)

        return lambda: pulumi.Output.from_input(program()).apply(collect)

    def _store(self, values_flags) -> None:
        values, flags = values_flags
        self.values.update(values)
        self.secret.update(k for k, secret in flags.items() if secret)


def monitor_with_platform(outputs: dict) -> RecordingMonitor:
    """A monitor whose `StackReference` reads answer with the platform stack's `outputs` (the
    secrets one secret)."""

    class Mocks(RecordingMocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs):
            if args.typ == "pulumi:pulumi:StackReference":
                return args.name, {"name": args.inputs["name"], "outputs": outputs, "secretOutputNames": [CONTRACT_SECRETS_OUTPUT]}
            return super().new_resource(args)

    return RecordingMonitor(Mocks())


@pytest.fixture
def exports(monkeypatch) -> Exports:
    return Exports(monkeypatch)


def run_platform(raw: dict, secret_sections: set[str], exports: Exports) -> None:
    config = {f"ai-factory:{section}": json.dumps(value, default=str) for section, value in raw.items()}
    run_program(exports.around(platform_main), project="ai-factory", stack="dev", config=config, secret_keys=[f"ai-factory:{s}" for s in secret_sections])


def run_tenant(tenant: dict, contract: str | None, exports: Exports | None = None, monitor: RecordingMonitor | None = None) -> Graph:
    monitor = monitor or monitor_with_platform(platform_outputs(contract))
    config = {TENANT_KEY: json.dumps(tenant), PLATFORM_KEY: PLATFORM_STACK}
    program = exports.around(tenant_program) if exports else tenant_program
    return run_program(program, project="ai-factory-tenant", stack="dev.x", config=config, monitor=monitor)


def platform_outputs(contract: str | None) -> dict:
    return {CONTRACT_OUTPUT: contract, CONTRACT_SECRETS_OUTPUT: dev_contract_secrets()} if contract is not None else {}


@pytest.fixture(scope="module")
def contract() -> str:
    return dev_contract(self_service_env())


def test_platform_program_exports_a_versioned_contract_without_its_secrets(dev_raw, exports):
    raw = copy.deepcopy(dev_raw[0])
    # As `pulumi up` sees it: the engine decrypted the secret section.
    raw["layers"]["gpu_operator"]["registry"]["password"] = "ngc-api-key-decrypted"
    run_platform(raw, {"layers"}, exports)
    exported = exports.values[CONTRACT_OUTPUT]
    contract = json.loads(exported)
    assert contract["contract_version"] == CONTRACT_VERSION
    assert contract["api_server"] == "https://api.par1.example.com:6443"
    assert contract["identity"]["issuer_url"] == "https://sso.par1.example.com/realms/ai-factory"
    assert set(contract["tenants"]) == set(contract["allocations"]) == {"search", "assistant", "partner-acme"}
    assert contract["tenants"]["assistant"]["namespace"] == "tenant-assistant"
    assert contract["cohorts"] == {"search": "trust-domain-internal", "assistant": "trust-domain-assistant", "partner-acme": "trust-domain-partner-acme"}
    assert "ngc-api-key-decrypted" not in exported
    assert contract["platform_config"]["layers"]["gpu_operator"]["registry"]["password"] == "[secret]"
    assert exports.secret == {CONTRACT_SECRETS_OUTPUT}  # the contract itself is read in clear
    secrets = {tuple(s["path"]): s["value"] for s in json.loads(exports.values[CONTRACT_SECRETS_OUTPUT])}
    assert secrets[("layers", "gpu_operator", "registry", "password")] == "ngc-api-key-decrypted"


def test_a_tenant_stack_builds_what_the_platform_builds_for_that_tenant(dev, contract):
    graph = run_tenant(registered("assistant").model_dump(mode="json"), contract)

    def objects(resources, root):
        return sorted((r.type, r.name, json.dumps(r.inputs, sort_keys=True), r.protect, r.retain_on_delete) for r in resources if root in [r, *r.ancestors()])

    platform_root = dev.graph.named("ai-factory:tenancy:TenantStack", "ai-factory-tenant-assistant")
    tenant_root = graph.named("ai-factory:tenancy:TenantStack", "ai-factory-tenant-assistant")
    assert objects(graph.resources, tenant_root) == objects(dev.graph.resources, platform_root)
    assert len(objects(graph.resources, tenant_root)) > 5


def test_the_tenant_program_exports_the_tenant_and_its_names(contract, exports):
    run_tenant(registered("assistant").model_dump(mode="json"), contract, exports)
    assert exports.values["tenant"]["owners"]["groups"] == ["assistant-admins"]
    assert exports.values["namespace"] == "tenant-assistant"
    assert exports.values["control_plane"] == "vcluster"
    assert exports.values["group_subjects"] == ["oidc:assistant-admins"]
    assert exports.secret == set()


def test_the_tenant_program_refuses_what_the_contract_refuses_and_builds_nothing(contract):
    monitor = monitor_with_platform(platform_outputs(contract))
    taken = registered("assistant").model_copy(update={"trust": "high"}).model_dump(mode="json")
    with pytest.raises(pulumi.RunError, match=r"tenant\.trust: \"high\" differs from the platform's registration of 'assistant'"):
        run_tenant(taken, contract, monitor=monitor)
    assert monitor.recorded == {}


def test_the_tenant_program_refuses_a_contract_of_another_version(contract):
    newer = json.dumps({**json.loads(contract), "contract_version": CONTRACT_VERSION + 1})
    with pytest.raises(pulumi.RunError, match=f"exports contract version {CONTRACT_VERSION + 1}; this library reads version {CONTRACT_VERSION}"):
        run_tenant(registered("assistant").model_dump(mode="json"), newer)


def test_the_tenant_program_refuses_an_undeployed_platform():
    with pytest.raises(pulumi.RunError, match="exports no 'contract': deploy it first"):
        run_tenant(registered("assistant").model_dump(mode="json"), None)


def test_the_tenant_program_gives_hooks_the_platform_secrets_and_keeps_them_secret(contract):
    secrets = json.dumps([{**s, "value": "decrypted-" + "-".join(map(str, s["path"]))} for s in json.loads(dev_contract_secrets())])
    seen: dict[str, dict] = {}

    class Mocks(RecordingMocks):
        def new_resource(self, args):
            if args.typ == "pulumi:pulumi:StackReference":
                outputs = {CONTRACT_OUTPUT: contract, CONTRACT_SECRETS_OUTPUT: secrets}
                return args.name, {"name": args.inputs["name"], "outputs": outputs, "secretOutputNames": [CONTRACT_SECRETS_OUTPUT]}
            seen[args.name] = args.inputs
            return super().new_resource(args)

    run_tenant(registered("assistant").model_dump(mode="json"), contract, monitor=RecordingMonitor(Mocks()))
    # The identity hook logs in to Keycloak with the platform's admin password, which the engine
    # receives as a secret (encrypted in the tenant's state).
    password = seen["ai-factory-tenant-assistant-keycloak"]["password"]
    assert rpc.is_rpc_secret(password) and rpc.unwrap_rpc_secret(password) == "decrypted-layers-keycloak-admin_password"


def test_the_platform_stack_leaves_tenants_with_a_stack_of_their_own_out(dev_raw):
    raw = copy.deepcopy(dev_raw[0])
    raw["tenants"][1]["managed_by"] = "tenant-stack"
    assert raw["tenants"][1]["name"] == "assistant"
    config = {f"ai-factory:{section}": json.dumps(value, default=str) for section, value in raw.items()}
    graph = run_program(platform_main, project="ai-factory", stack="dev", config=config, secret_keys=[f"ai-factory:{s}" for s in dev_raw[1]])
    assert {r.name for r in graph.of_type("ai-factory:tenancy:TenantStack")} == {"ai-factory-tenant-search", "ai-factory-tenant-partner-acme"}


def test_the_render_shows_the_environment_whole_with_self_managed_tenants_as_their_stacks_build_them(dev_raw):
    raw = copy.deepcopy(dev_raw[0])
    raw["tenants"][1]["managed_by"] = "tenant-stack"
    rendered = render(raw, dev_raw[1])
    stacks = {r.name: r for r in rendered.graph.of_type("ai-factory:tenancy:TenantStack")}
    assert set(stacks) == {"ai-factory-tenant-search", "ai-factory-tenant-partner-acme", "ai-factory-tenant-assistant"}
    assert stacks["ai-factory-tenant-assistant"].parent is None  # a stack of its own, not a child of the platform
    assert stacks["ai-factory-tenant-search"].parent.type == "ai-factory:index:Platform"
