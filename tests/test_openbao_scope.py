"""OpenBao roles read their own paths only, each cluster on its own auth mount: the offline check
(`factory.checking.secrets.openbao_role_scope`) and the pack's `openbao-roles-scoped`, row by row."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s
import pulumi_vault as vault
import pytest

from ai_factory.components.external_secrets import secret_store_spec
from ai_factory.factory.checking.secrets import openbao_role_scope
from ai_factory.factory.rendering.bundle import Manifest, Rendered
from tests.policy_stacks import namespace, stack, violations


@dataclass(frozen=True)
class Role:
    name: str
    namespace: str
    paths: tuple[str, ...]
    mount: str | None = None
    """Default: the stack's own mount."""
    defined: bool = True
    also: tuple[str, ...] = ()
    """More namespaces the role is bound to."""


@dataclass(frozen=True)
class Case:
    mount: str
    roles: tuple[Role, ...]
    stores: tuple[tuple[str, str], ...] = field(default=())
    """(namespace, mountPath) of SecretStores."""


def tenant(name: str, *paths: str, **kw) -> Role:
    return Role(f"tenant-{name}", f"tenant-{name}", paths or (f"secret/data/tenants/{name}/*", f"secret/metadata/tenants/{name}/*"), **kw)


def platform(*paths: str, **kw) -> Role:
    return Role("multikueue", "kueue-system", paths, **kw)


ROWS = [
    pytest.param(Case("kubernetes", (tenant("a"),)), None, id="accepts-a-tenant-reading-its-prefix"),
    pytest.param(Case("kubernetes", (platform("secret/data/platform/bmc/*"),)), None, id="accepts-a-platform-role-of-one-cluster"),
    pytest.param(Case("kubernetes-west", (tenant("a"), platform("secret/data/clusters/west/platform/multikueue/*"))), None, id="accepts-a-clusters-roles-on-its-mount-and-prefix"),
    pytest.param(Case("kubernetes-west", (tenant("a"),), (("tenant-a", "kubernetes-west"),)), None, id="accepts-a-store-on-its-clusters-mount"),
    pytest.param(Case("kubernetes", (tenant("a", "secret/data/tenants/b/*"),)), "reads secret/data/tenants/b/*: outside tenant a's prefix tenants/a/", id="flags-a-tenant-reading-another"),
    pytest.param(Case("kubernetes", (tenant("a", "secret/data/*"),)), "reads secret/data/*: outside tenant a's prefix", id="flags-a-tenant-reading-the-whole-engine"),
    pytest.param(Case("kubernetes", (tenant("a", "sys/policies/acl/*"),)), "outside the KV engine's data", id="flags-a-path-outside-the-engine"),
    pytest.param(Case("kubernetes", (platform("secret/data/tenants/a/*"),)), "a tenant's secrets, read by a platform role", id="flags-a-platform-role-reading-a-tenant"),
    pytest.param(Case("kubernetes", (platform("secret/data/*"),)), "a tenant's secrets, read by a platform role", id="flags-a-platform-role-reading-everything"),
    pytest.param(Case("kubernetes", (platform("secret/data/clusters/east/x"),)), "another cluster's secrets", id="flags-one-clusters-role-reading-a-cluster-prefix"),
    pytest.param(
        Case("kubernetes-west", (platform("secret/data/clusters/east/platform/multikueue/*"),)),
        "outside cluster west's prefix clusters/west/", id="flags-a-manager-role-reading-another-clusters-kubeconfigs",
    ),
    pytest.param(Case("kubernetes-west", (platform("secret/data/clusters/*"),)), "outside cluster west's prefix", id="flags-a-role-reading-every-cluster"),
    pytest.param(Case("kubernetes-west", (platform("secret/data/platform/litellm*"),)), "outside cluster west's prefix", id="flags-a-clusters-role-reading-unprefixed-platform-secrets"),
    pytest.param(Case("kubernetes-west", (tenant("a", mount="kubernetes-east"),)), "is on auth mount 'kubernetes-east', not its cluster's own (kubernetes-west)", id="flags-a-role-on-another-clusters-mount"),
    pytest.param(Case("kubernetes-west", (tenant("a", mount="kubernetes"),)), "is on auth mount 'kubernetes', not its cluster's own", id="flags-a-role-on-the-shared-mount"),
    pytest.param(Case("kubernetes-west", (tenant("a"),), (("tenant-a", "kubernetes-east"),)), "logs in at OpenBao auth mount 'kubernetes-east'", id="flags-a-store-on-another-clusters-mount"),
    pytest.param(Case("kubernetes", (tenant("a", defined=False),)), "which this stack does not define", id="flags-an-undefined-policy"),
    pytest.param(Case("kubernetes", (tenant("a", "secret/data/tenants/a/*", also=("tenant-b",)),)), "the role is bound to the namespaces of tenants a, b", id="flags-a-role-of-two-tenants"),
    pytest.param(
        Case("kubernetes-west", (platform("secret/data/platform/litellm*", mount="kubernetes-east"),)),
        ("is on auth mount 'kubernetes-east'", "reads secret/data/platform/litellm*: another cluster's secrets"), id="flags-a-foreign-mounts-role-reading-unprefixed-paths",
    ),
]


def build(case: Case):
    """The case as a stack registers it (real pulumi-vault and Kubernetes resources)."""

    def program() -> None:
        vault.AuthBackend("auth", type="kubernetes", path=case.mount)
        vault.Mount("kv", path="secret", type="kv", options={"version": "2"})
        for role in case.roles:
            for ns in (role.namespace, *role.also):
                if ns.startswith("tenant-"):
                    namespace(ns, tenant=ns.removeprefix("tenant-"))
            policy = "".join(f'path "{p}" {{\n  capabilities = ["read"]\n}}\n' for p in role.paths)
            name = role.name if role.defined else f"{role.name}-elsewhere"
            if role.defined:
                vault.Policy(f"{role.name}-policy", name=role.name, policy=policy)
            vault.kubernetes.AuthBackendRole(
                f"{role.name}-role", backend=role.mount or case.mount, role_name=role.name, bound_service_account_names=["store"],
                bound_service_account_namespaces=[role.namespace, *role.also], token_policies=[name],
            )
        for ns, mount in case.stores:
            spec = secret_store_spec("http://openbao:8200", "secret", ns)
            spec["provider"]["vault"]["auth"]["kubernetes"]["mountPath"] = mount
            k8s.apiextensions.CustomResource(f"{ns}-store", api_version="external-secrets.io/v1", kind="SecretStore", metadata={"name": "openbao", "namespace": ns}, spec=spec)

    return stack(program)


def offline(case: Case, graph) -> list[str]:
    namespaces = [ns for r in case.roles for ns in (r.namespace, *r.also) if ns.startswith("tenant-")]
    manifests = [Manifest({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, ns, ns.removeprefix("tenant-"), "x") for ns in namespaces]
    manifests += [
        Manifest({"apiVersion": "external-secrets.io/v1", "kind": "SecretStore", "metadata": {"name": "openbao", "namespace": ns}, "spec": {"provider": {"vault": {"auth": {"kubernetes": {"mountPath": m}}}}}}, "x", None, "x")
        for ns, m in case.stores
    ]
    return [f.message for f in openbao_role_scope(Rendered(None, "1.34", manifests, [], graph), None)]


@pytest.mark.parametrize("case, expected", ROWS)
def test_openbao_roles_read_their_own_paths_only(case, expected):
    graph = build(case)
    found = offline(case, graph)
    pack = [m for messages in violations(graph, "openbao-roles-scoped").values() for m in messages]
    wanted = () if expected is None else (expected,) if isinstance(expected, str) else expected
    for messages in (found, pack):
        assert len(messages) == len(wanted) and all(w in m for w, m in zip(wanted, messages)), messages
