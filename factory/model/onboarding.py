"""Self-service onboarding: which tenants may add themselves, and the registry that records them.

The platform team allows it in the environment's config (`self_service`: trust levels, pools, a
maximum grant); the tenant API (`stacks/service.py`) registers a tenant that fits, and what it
registers is read with the stack file wherever the environment is read (`factory render`, `plan`,
`check`, and `pulumi up` of the platform stack), as if the tenant were listed in `tenants` with
`managed_by: tenant-stack`.

The registry is one YAML file per tenant in the project, `tenants/<env>/<name>.yaml`, rather than
a table of the API's database: the platform stack is a Pulumi program that runs wherever the
platform team runs it (a laptop, CI, the Automation API) and must not need the API's database to
know its tenants; files are reviewed, diffed and versioned like the rest of the environment, and
`factory diff` shows what an onboarding changes before anything is applied.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ai_factory.factory.model import bounded_yaml
from ai_factory.factory.model.config import FactoryConfig, Tenant

REGISTRY_DIR = "tenants"
MAX_REGISTERED = 2000
"""Registered tenants an environment may hold (the config's tenant bound)."""
MAX_FILE_BYTES = 64 * 1024


class RegistryError(ValueError):
    pass


def registry_dir(env: str, project_dir: Path) -> Path:
    return project_dir / REGISTRY_DIR / env


def registered_tenants(env: str, project_dir: Path) -> list[dict[str, Any]]:
    """The registered tenants of `env` as raw config entries, by name."""
    directory = registry_dir(env, project_dir)
    files = sorted(directory.glob("*.yaml")) if directory.is_dir() else []
    if len(files) > MAX_REGISTERED:
        raise RegistryError(f"{directory}: {len(files)} registered tenants, more than {MAX_REGISTERED}")
    entries = []
    for path in files:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise RegistryError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
        try:
            entry = bounded_yaml.load(path.read_text())
        except bounded_yaml.YamlBoundError as err:
            raise RegistryError(f"{path}: refused: {err}") from None
        except yaml.YAMLError as err:
            raise RegistryError(f"{path}: not valid YAML: {err}") from None
        if not isinstance(entry, dict) or entry.get("name") != path.stem:
            raise RegistryError(f"{path}: must hold one tenant named {path.stem!r}")
        entries.append({**entry, "managed_by": "tenant-stack"})
    return entries


def register(env: str, tenant: Tenant, project_dir: Path) -> Path:
    """Record `tenant` (replacing its previous record); written whole or not at all."""
    directory = registry_dir(env, project_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{tenant.name}.yaml"
    text = yaml.safe_dump(tenant.model_dump(mode="json", exclude_defaults=True) | {"managed_by": "tenant-stack"}, sort_keys=True)
    with tempfile.NamedTemporaryFile("w", dir=directory, suffix=".tmp", delete=False) as handle:
        handle.write(text)
    os.replace(handle.name, target)
    return target


def unregister(env: str, name: str, project_dir: Path) -> bool:
    target = registry_dir(env, project_dir) / f"{name}.yaml"
    if not target.is_file():
        return False
    target.unlink()
    return True


def is_registered(env: str, name: str, project_dir: Path) -> bool:
    return (registry_dir(env, project_dir) / f"{name}.yaml").is_file()


def demand_size(tenant: Tenant) -> int:
    """What a tenant's demands add up to, one per whole GPU, MIG instance, replica or slice."""
    return sum(d.count or 0 for d in tenant.gpus) + sum(n for d in tenant.gpus for n in d.mig.values())


def self_service_problems(cfg: FactoryConfig, tenant: Tenant, env: str) -> list[str]:
    """Why `tenant` may not onboard itself in `env`, one `tenant.<field>: ...` line each."""
    policy = cfg.self_service
    if not policy.trust:
        return [f"tenant.name: {env} allows no self-service onboarding (`self_service` in its config): ask the platform team to register {tenant.name!r}"]
    problems = []
    if tenant.trust not in policy.trust:
        problems.append(f"tenant.trust: {tenant.trust!r} tenants cannot onboard themselves in {env} (allowed: {', '.join(policy.trust)})")
    for i, demand in enumerate(tenant.gpus):
        if demand.pool not in policy.pools:
            problems.append(f"tenant.gpus[{i}].pool: {demand.pool!r} is not open to self-service tenants (open: {', '.join(policy.pools) or 'none'})")
    if (size := demand_size(tenant)) > policy.max_gpus:
        problems.append(f"tenant.gpus: {size} GPUs, instances or slices asked, more than a self-service tenant may have ({policy.max_gpus})")
    if tenant.managed_by != "tenant-stack":
        problems.append("tenant.managed_by: a self-service tenant has a stack of its own (`tenant-stack`)")
    return problems
