"""The platform contract: what survives the stack output, what a reader refuses, and which
tenants the platform can host as given."""

from __future__ import annotations

import json

import pytest

from ai_factory.factory.model.config import Tenant
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.stacks.contract import CONTRACT_VERSION, ContractError, PlatformContract, platform_contract, platform_secrets
from tests.stacks_support import registered, self_service_env, tenant

STACK = "organization/ai-factory/dev"


@pytest.fixture(scope="module")
def dev_cfg():
    return self_service_env()


@pytest.fixture(scope="module")
def contract(dev_cfg) -> PlatformContract:
    return platform_contract(dev_cfg, plan_for(dev_cfg), "dev")


def test_the_contract_reads_back_the_platform_it_was_made_from(dev_cfg, contract):
    read = PlatformContract.from_output(contract.to_output(), STACK)
    assert read == contract
    assert read.config(platform_secrets(dev_cfg)) == dev_cfg
    assert read.capacity_plan() == plan_for(dev_cfg)


def test_a_missing_or_other_version_contract_is_refused_with_what_to_do(contract):
    with pytest.raises(ContractError, match=r"exports no 'contract': deploy it first \(ai-factory-stacks platform up\)"):
        PlatformContract.from_output(None, STACK)
    newer = json.dumps({**json.loads(contract.to_output()), "contract_version": CONTRACT_VERSION + 1})
    with pytest.raises(ContractError, match=f"exports contract version {CONTRACT_VERSION + 1}; this library reads version {CONTRACT_VERSION}"):
        PlatformContract.from_output(newer, STACK)


def test_a_registered_tenant_is_hosted_as_registered_with_its_own_owners(contract):
    assistant = registered("assistant")
    assert contract.tenant_problems(assistant) == []
    handed_over = assistant.model_copy(update={"owners": assistant.owners.model_copy(update={"groups": ["assistant-oncall"], "users": []})})
    assert contract.tenant_problems(handed_over) == []


def test_a_registered_tenant_cannot_change_what_the_platform_decides(contract):
    assistant = registered("assistant")
    changed = Tenant.model_validate({**assistant.model_dump(), "trust": "high", "gpus": [{"pool": "h100-train", "count": 24}], "quota": {"cpu": "512"}})
    problems = contract.tenant_problems(changed)
    assert [p.split(":")[0] for p in problems] == ["tenant.gpus", "tenant.isolation", "tenant.quota", "tenant.trust"]
    assert all("differs from the platform's registration of 'assistant' in dev" in p for p in problems)


def test_a_tenant_the_platform_stack_builds_gets_no_stack_of_its_own(contract):
    assert contract.tenant_problems(registered("search")) == [
        "tenant.managed_by: 'search' is built by the platform stack of dev; set its `managed_by: tenant-stack` "
        "in the platform config and update the platform to give it a stack of its own"
    ]


def test_defaults_spelled_out_mean_the_same(contract):
    spelled = registered("assistant").model_copy(update={"isolation": "vcluster", "trust_domain": "assistant"})
    assert contract.tenant_problems(spelled) == []


def test_a_tenant_the_platform_does_not_register_is_refused_saying_how_to_register_it(contract):
    assert contract.tenant_problems(Tenant.model_validate(tenant("newcomer"))) == [
        "tenant.name: 'newcomer' is not a tenant of platform dev: its GPUs, queues and trust are planned with every other "
        "tenant's; register it in the platform config (`tenants`) and update the platform"
    ]


def test_a_tenant_program_refuses_a_platform_running_a_layer_its_library_lacks(dev_raw):
    from ai_factory.factory.model.loading import validate
    from ai_factory.factory.planning.from_config import plan_for
    from ai_factory.stacks.contract import platform_contract

    cfg = validate(dev_raw[0])
    contract = platform_contract(cfg, plan_for(cfg), "dev")
    assert "kueue" in contract.layers and "volcano" not in contract.layers
    tenant = next(t for t in cfg.tenants if t.name == "assistant").model_copy(update={"managed_by": "tenant-stack"})
    newer = contract.model_copy(update={"layers": (*contract.layers, "serving-from-the-future")})
    assert newer.tenant_problems(tenant) == [
        "platform: dev runs layers this library does not have (serving-from-the-future): "
        "run the tenant stack with the library release that deployed the platform"
    ]
    assert not any(p.startswith("platform:") for p in contract.tenant_problems(tenant))
