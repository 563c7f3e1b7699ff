"""OpenBao + External Secrets per tenant, and secret configuration values kept secret end to end."""

from __future__ import annotations

import json
import re

from ai_factory.components._common import FactoryComponent
from ai_factory.components.external_secrets import STORE_SERVICE_ACCOUNT, TenantSecretsHook
from ai_factory.factory.rendering.harness import run_program
from ai_factory.factory.model.loading import validate
from ai_factory.factory.rendering.bundle import render_raw
from ai_factory.factory.model.secrets import SecretValue
from ai_factory.factory.model.tenancy import tenant_names
from tests.conftest import objects, render

TENANTS = ("search", "assistant", "partner-acme")


def openbao_objects(rendered, type_: str) -> dict[str, dict]:
    """Inputs of one kind of OpenBao object, by tenant (the platform's own, the provisioning
    layer's, are not a tenant's)."""
    return {r.tenant: r.inputs for r in rendered.graph.of_type(type_) if r.tenant}


def test_each_tenant_gets_a_path_policy_role_and_namespaced_store(dev):
    policies = openbao_objects(dev, "vault:index/policy:Policy")
    roles = openbao_objects(dev, "vault:kubernetes/authBackendRole:AuthBackendRole")
    stores = {s["metadata"]["namespace"]: s for s in objects(dev, "SecretStore") if s["metadata"]["namespace"].startswith("tenant-")}
    assert set(policies) == set(roles) == set(TENANTS) and set(stores) == {f"tenant-{t}" for t in TENANTS}
    for tenant in TENANTS:
        namespace = f"tenant-{tenant}"
        assert roles[tenant]["boundServiceAccountNamespaces"] == [namespace]
        assert roles[tenant]["boundServiceAccountNames"] == [STORE_SERVICE_ACCOUNT]
        assert roles[tenant]["tokenPolicies"] == [policies[tenant]["name"]] == [namespace]
        vault = stores[namespace]["spec"]["provider"]["vault"]
        assert (vault["server"], vault["path"], vault["version"]) == ("http://openbao.openbao.svc:8200", "secret", "v2")
        auth = vault["auth"]["kubernetes"]
        assert auth["role"] == roles[tenant]["roleName"] and auth["serviceAccountRef"] == {"name": STORE_SERVICE_ACCOUNT, "audiences": ["openbao"]}
        assert roles[tenant]["audience"] == "openbao"


def test_a_tenant_policy_reads_its_own_prefix_and_nothing_else(dev):
    for tenant, policy in openbao_objects(dev, "vault:index/policy:Policy").items():
        paths = re.findall(r'path "([^"]+)" \{\n  capabilities = (\[[^\]]*\])', policy["policy"])
        assert paths == [(f"secret/data/tenants/{tenant}/*", '["read"]'), (f"secret/metadata/tenants/{tenant}/*", '["read", "list"]')]


def test_no_store_is_cluster_wide_and_every_store_account_mounts_no_token(dev):
    assert objects(dev, "ClusterSecretStore") == []
    accounts = [a for a in objects(dev, "ServiceAccount") if a["metadata"]["name"] == STORE_SERVICE_ACCOUNT]
    # One per tenant, and the provisioning layer's (BMC credentials).
    assert len(accounts) == len(TENANTS) + 1 and all(a["automountServiceAccountToken"] is False for a in accounts)


def test_the_hook_parents_everything_to_the_tenant_stack(dev_raw):
    cfg = validate(dev_raw[0])
    hook = TenantSecretsHook.from_config(cfg)
    tenant = cfg.tenants[0]

    def program():
        stack = FactoryComponent("ai-factory:test:TenantStack", tenant.name, layer=f"tenant-{tenant.name}", tenant=tenant.name)
        hook.attach(stack, tenant, tenant_names(tenant))

    graph = run_program(program, project="ai-factory", stack="test")
    stack = graph.named("ai-factory:test:TenantStack", "search")
    created = [r for r in graph.resources if r is not stack]
    assert {r.type for r in created} == {
        "pulumi:providers:vault",
        "vault:index/policy:Policy",
        "vault:kubernetes/authBackendRole:AuthBackendRole",
        "kubernetes:core/v1:ServiceAccount",
        "kubernetes:external-secrets.io/v1:SecretStore",
    }
    assert all(r.parent is stack and r.tenant == "search" for r in created)


def test_stores_wait_for_the_openbao_admin_token(raw):
    del raw["layers"]["openbao"]["admin_token"]
    rendered = render(raw)
    assert objects(rendered, "SecretStore") == []
    assert not [r for r in rendered.graph.resources if r.type.startswith(("vault:", "pulumi:providers:vault"))]
    assert any(m.kind == "HelmRelease" and m.name == "openbao" for m in rendered.manifests)


def test_secret_config_values_are_used_only_as_secrets(raw):
    """As inside `pulumi up`: the engine hands the program decrypted values of the secret keys.
    Each one reaches exactly the places that need it, always as a Pulumi secret, and no file."""
    needles = {
        "keycloak-admin": "kc-admin-5f1e9d-never-in-output",
        "keycloak-db": "kc-db-0a73c2-never-in-output",
        "openbao-token": "bao-token-9c4e11-never-in-output",
    }
    raw["layers"]["keycloak"]["admin_password"] = needles["keycloak-admin"]
    raw["layers"]["keycloak"]["database"]["password"] = needles["keycloak-db"]
    raw["layers"]["openbao"]["admin_token"] = needles["openbao-token"]
    cfg = validate(raw, decrypted_secret_sections={"layers"})
    assert isinstance(cfg.layers.openbao.admin_token, SecretValue)
    rendered = render_raw(raw, {"layers"}, cfg, stack="dev")

    texts = [*rendered.files().values(), rendered.summary(), *(json.dumps(r.inputs) for r in rendered.graph.resources)]
    assert not [n for n in needles.values() for text in texts if n in text]
    with_secrets = {(r.type, r.name): r.secret_paths for r in rendered.graph.resources if r.secret_paths}
    expected = {
        ("kubernetes:core/v1:Secret", "ai-factory-gpu-operator-registry"): ["stringData..dockerconfigjson"],
        ("kubernetes:core/v1:Secret", "ai-factory-keycloak-admin"): ["stringData.password", "stringData.username"],
        ("kubernetes:core/v1:Secret", "ai-factory-keycloak-database"): ["stringData.password"],
        ("pulumi:providers:vault", "ai-factory-openbao-provider"): ["token"],
        ("pulumi:providers:vault", "ai-factory-provisioning-openbao"): ["token"],
        # A host's user data holds its join credentials, whoever adds them.
        **{("kubernetes:core/v1:Secret", f"ai-factory-provisioning-user-data-gpu-h100-0{i}"): ["stringData.userData"] for i in range(1, 5)},
        **{("pulumi:providers:keycloak", f"ai-factory-tenant-{t}-keycloak"): ["password"] for t in TENANTS},
        **{("pulumi:providers:vault", f"ai-factory-tenant-{t}-openbao"): ["token"] for t in TENANTS},
    }
    assert with_secrets == expected
    for secret in ("keycloak-admin", "keycloak-database"):
        obj = next(m.obj for m in rendered.manifests if m.kind == "Secret" and m.name == secret)
        assert set(obj["stringData"].values()) == {"[secret]"}
        assert obj["metadata"]["annotations"]["kustomize.toolkit.fluxcd.io/reconcile"] == "disabled"
