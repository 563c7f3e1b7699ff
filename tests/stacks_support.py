"""Shared pieces of the `stacks/` tests: fake programs for the fake CLI, a backend in a temporary
directory, OIDC keys and tokens made on the spot."""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import jwt
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi.testclient import TestClient

from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.model.loading import load_stack_file, read_stack_file, stack_file, validate
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.stacks.backend import Backend
from ai_factory.stacks.contract import CONTRACT_OUTPUT, CONTRACT_SECRETS_OUTPUT, platform_contract, platform_secrets
from ai_factory.stacks.platform import PlatformStacks
from ai_factory.stacks.tenants import TENANT_KEY, TenantStacks
from tests.fake_pulumi import Deployed, FakePulumi
from tests.fleet_env import one_cluster

REPO = Path(__file__).resolve().parent.parent


def one_cluster_dev_project() -> Path:
    """dev with its clusters folded into one (`tests.fleet_env.one_cluster`), in a project of its
    own (the repository's policies and acceptance results linked in): the stacks tests exercise the
    API on an environment's one platform stack `dev`; dev's two clusters are those of
    `test_fleet_tenants` and `test_onboarding`."""
    root = Path(tempfile.mkdtemp(prefix="aif-dev-one-cluster-"))
    shutil.copy(REPO / "Pulumi.yaml", root / "Pulumi.yaml")
    document = one_cluster(yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text()))
    (root / "Pulumi.dev.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    for linked in ("policies", "acceptance"):
        (root / linked).symlink_to(REPO / linked)
    return root


DEV_PROJECT = one_cluster_dev_project()
PASSPHRASE = "correct-horse-battery-staple"
REGISTRY_PASSWORD = "ngc-api-key-7d1f0c"
"""The dev stack's decrypted registry password, as the fake CLI's `--show-secrets` answers show it."""
KUBECONFIG = "apiVersion: v1\nclusters: [{cluster: {token: vcluster-admin-token-9c2e}}]"
"""A secret output of every tenant stack (a vCluster admin kubeconfig)."""
ISSUER = "https://sso.par1.example.com/realms/ai-factory"
AUDIENCE = "ai-factory-tenants"


def tenant(name: str = "vision", **fields: Any) -> dict[str, Any]:
    """A low-trust tenant without GPUs, as the API takes it (registered in `self_service_env`)."""
    return {"name": name, "trust": "low", "owners": {"groups": [f"{name}-admins"]}, "managed_by": "tenant-stack", **fields}


@functools.cache
def self_service_env() -> FactoryConfig:
    """The dev environment where `assistant` and two more tenants, `vision` and `speech`, have
    stacks of their own, for the tests to create and delete through the API."""
    raw, _ = read_stack_file(stack_file("dev", DEV_PROJECT))
    for registered_tenant in raw["tenants"]:
        if registered_tenant["name"] == "assistant":
            registered_tenant["managed_by"] = "tenant-stack"
    raw["tenants"] = [*raw["tenants"], tenant("vision"), tenant("speech")]
    return validate(raw)


def dev_contract(cfg: FactoryConfig | None = None) -> str:
    cfg = cfg or load_stack_file("dev", DEV_PROJECT)
    return platform_contract(cfg, plan_for(cfg), "dev").to_output()


def dev_contract_secrets() -> str:
    """Offline, the dev config's secrets are placeholders (`[secret]:<path>`)."""
    return platform_secrets(load_stack_file("dev", DEV_PROJECT))


def registered(name: str) -> Tenant:
    return next(t for t in self_service_env().tenants if t.name == name)


def platform_program(stack: str, config: dict[str, str]) -> Deployed:
    """What `pulumi up` of the dev platform (`self_service_env`) leaves: its contract, a few resources."""
    root = "urn:pulumi:dev::ai-factory::ai-factory:index:Platform"
    return Deployed(
        outputs={CONTRACT_OUTPUT: dev_contract(self_service_env()), CONTRACT_SECRETS_OUTPUT: dev_contract_secrets()},
        secret_outputs=frozenset({CONTRACT_SECRETS_OUTPUT}),
        resources=[
            {"urn": f"{root}::ai-factory", "type": "ai-factory:index:Platform"},
            {"urn": f"{root}$kubernetes:helm.sh/v3:Release::gpu-operator", "type": "kubernetes:helm.sh/v3:Release", "parent": f"{root}::ai-factory"},
        ],
    )


def tenant_program(stack: str, config: dict[str, str]) -> Deployed:
    """What `pulumi up` of a tenant stack leaves: the tenant's names (and a secret) as outputs, a
    protected namespace, a quota retained on delete, RBAC deleted with the tenant."""
    tenant = json.loads(config[TENANT_KEY])
    name = tenant["name"]
    root = f"urn:pulumi:{stack.rsplit('/', 1)[-1]}::ai-factory-tenant::ai-factory:tenancy:TenantStack"
    parent = f"{root}::{name}"
    return Deployed(
        outputs={"tenant": tenant, "namespace": f"tenant-{name}", "local_queue": "default", "kubeconfig": KUBECONFIG},
        secret_outputs=frozenset({"kubeconfig"}),
        resources=[
            {"urn": parent, "type": "ai-factory:tenancy:TenantStack"},
            {"urn": f"{root}$kubernetes:core/v1:Namespace::tenant-{name}-namespace", "type": "kubernetes:core/v1:Namespace", "protect": True, "retainOnDelete": True, "parent": parent},
            {"urn": f"{root}$kubernetes:core/v1:ResourceQuota::{name}-quota", "type": "kubernetes:core/v1:ResourceQuota", "retainOnDelete": True, "parent": parent},
            {"urn": f"{root}$kubernetes:rbac.authorization.k8s.io/v1:RoleBinding::{name}-admin-binding", "type": "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "parent": parent},
        ],
    )


def fake_cli(delay: float = 0.0) -> FakePulumi:
    return FakePulumi(
        {"ai-factory": platform_program, "ai-factory-tenant": tenant_program},
        delay=delay,
        secret_config={"ai-factory:layers": json.dumps({"gpu_operator": {"registry": {"password": REGISTRY_PASSWORD}}})},
    )


def backend(tmp_path: Path) -> Backend:
    passphrase = tmp_path / "passphrase"
    passphrase.write_text(PASSPHRASE)
    return Backend(state_dir=tmp_path / "state", passphrase_file=passphrase)


def deployed_platform(tmp_path: Path, delay: float = 0.0) -> tuple[FakePulumi, PlatformStacks, TenantStacks]:
    """A fake CLI holding an `up`-to-date dev platform stack, and the APIs over it."""
    cli = fake_cli(delay)
    platforms = PlatformStacks(backend(tmp_path), project_dir=DEV_PROJECT, pulumi_command=cli)
    platforms.up("dev")
    return cli, platforms, TenantStacks(platforms.backend, platforms=platforms, project_dir=DEV_PROJECT, pulumi_command=cli)


# --------------------------------------------------------------------------- OIDC


class Issuer:
    """An OIDC issuer in a test: RSA signing keys, its discovery document and JWKS, and tokens."""

    def __init__(self, kid: str = "key-1"):
        self.keys: dict[str, rsa.RSAPrivateKey] = {}
        self.fetches: list[str] = []
        self.rotate(kid)

    def rotate(self, kid: str) -> None:
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = kid

    def fetch(self, url: str) -> dict[str, Any]:
        self.fetches.append(url)
        if url == f"{ISSUER}/.well-known/openid-configuration":
            return {"issuer": ISSUER, "jwks_uri": f"{ISSUER}/protocol/openid-connect/certs"}
        if url == f"{ISSUER}/protocol/openid-connect/certs":
            return {"keys": [{**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(k.public_key())), "kid": kid, "use": "sig", "alg": "RS256"} for kid, k in self.keys.items()]}
        raise AssertionError(f"unexpected fetch {url}")

    def token(self, groups: list[str], *, sub: str = "user-1", audience: str = AUDIENCE, issuer: str = ISSUER, expires_in: int = 300, kid: str | None = None, key: rsa.RSAPrivateKey | None = None) -> str:
        now = int(time.time())
        claims = {"iss": issuer, "aud": audience, "sub": sub, "iat": now, "exp": now + expires_in, "groups": groups}
        kid = kid or self.kid
        return jwt.encode(claims, key or self.keys[kid], algorithm="RS256", headers={"kid": kid})


def job_outcome(client: TestClient, location: str, headers: dict[str, str]) -> dict:
    """The job once done. Jobs render a tenant stack, which takes seconds on a loaded machine: a
    generous deadline, since only a job that never ends is a failure here."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = client.get(location, headers=headers).json()
        if job["state"] in ("succeeded", "failed"):
            return job
        time.sleep(0.02)
    raise AssertionError(f"job {location} did not finish: {job}")
