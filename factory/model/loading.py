"""Reading and validating an environment's configuration.

Two entry points produce the same `FactoryConfig`:
- `load_stack_file(env)`: offline, from `Pulumi.<env>.yaml` (what `factory render|check|plan` use);
- `load_pulumi_config()`: inside `pulumi up`, through `pulumi.Config()`.

The config namespace is the Pulumi project's name (`name:` in `Pulumi.yaml`), which is what
`pulumi config set` writes by default: `ai-factory:` in this repository's example project,
`<your project>:` in yours. The project is the current directory (the CLI's `--project-dir`
changes into another), never the installed library's folder.

Both go through `validate()`, which reports every problem at once (field errors of every section
plus the cross-references between sections) as a `ConfigError`, before anything is registered.
"""

from __future__ import annotations

import types
import typing
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from ai_factory.factory.model.config import (
    MAX_FLEET_NODES,
    MAX_GPU_UNITS,
    MAX_GPUS_PER_NODE,
    SECTIONS,
    FactoryConfig,
    HamiPool,
    Tenant,
    TimeSlicing,
)
from ai_factory.factory.model.clusters import cluster_problems, cluster_view, ring_problems
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.model.matrix import with_matrix_pins
from ai_factory.factory.model.onboarding import RegistryError, registered_tenants, registry_dir
from ai_factory.factory.planning.placement import UNASSIGNED, offering_name
from ai_factory.factory.model import bounded_yaml
from ai_factory.factory.model.raw import as_dict, as_list, did_you_mean
from ai_factory.factory.model.secrets import PassphraseCrypter, SecretsError, offline_placeholder, parse_ciphertext, parse_salt, passphrase_from_env

PROJECT_FILE = "Pulumi.yaml"


class ConfigError(Exception):
    """Invalid configuration. `problems` holds one `path: message` line per problem, sorted."""

    def __init__(self, problems: Iterable[str], source: str = "configuration"):
        self.problems = sorted(set(problems))
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{self.source} is invalid ({len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}):"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


# --------------------------------------------------------------------------- entry points


def project_dir() -> Path:
    """The user's Pulumi project: the current directory, as for the `pulumi` CLI."""
    return Path.cwd()


def project_name(directory: Path) -> str:
    """The `name:` of the project in `directory`: the namespace of its configuration."""
    path = directory / PROJECT_FILE
    try:
        document = bounded_yaml.read(path)
    except bounded_yaml.YamlBoundError as err:
        raise ConfigError([f"{PROJECT_FILE}: refused: {err}"], source=str(path)) from None
    except FileNotFoundError:
        raise ConfigError([f"{PROJECT_FILE}: no Pulumi project in {directory} (run from your project, or pass --project-dir)"], source=str(directory)) from None
    except yaml.YAMLError as err:
        raise ConfigError([f"{PROJECT_FILE}: not valid YAML: {err}"], source=str(path)) from None
    name = document.get("name") if isinstance(document, dict) else None
    if not isinstance(name, str) or not name:
        raise ConfigError([f"{PROJECT_FILE}: name: a project name is required"], source=str(path))
    return name


def stack_project(path: Path) -> str:
    """The project a stack file belongs to: the `Pulumi.yaml` beside it, else the current project's."""
    beside = path.resolve().parent
    return project_name(beside if (beside / PROJECT_FILE).is_file() else project_dir())


def stack_file(env: str, directory: Path | None = None) -> Path:
    """`Pulumi.<env>.yaml` of the project, or `env` itself when it names a stack file."""
    if env.endswith((".yaml", ".yml")):
        return Path(env)
    return (directory or project_dir()) / f"Pulumi.{env}.yaml"


def stack_name(path: Path) -> str:
    return path.name.removeprefix("Pulumi.").rsplit(".", 1)[0]


def read_stack_file(path: Path, decrypt_check: bool = False) -> tuple[dict[str, Any], set[str]]:
    """The raw sections of a stack file in its project's namespace (`<project>:<section>`), with
    `secure:` values turned into placeholders.

    Returns the sections and the names of those holding a secret (they are seeded as secret config).
    Every key must belong to a known namespace (`known_namespaces`). Secure values must be Pulumi
    ciphertexts; with a passphrase in the environment each must decrypt with it, and
    `decrypt_check` makes that check mandatory (no passphrase is then a problem)."""
    if not path.is_file():
        raise ConfigError([f"{path.name}: no such stack file"], source=str(path))
    try:
        document = bounded_yaml.read(path) or {}
    except bounded_yaml.YamlBoundError as err:
        raise ConfigError([f"{path.name}: refused: {err}"], source=str(path)) from None
    except yaml.YAMLError as err:
        raise ConfigError([f"{path.name}: not valid YAML: {err}"], source=str(path)) from None
    if not isinstance(document, dict) or not isinstance(document.get("config", {}), dict):
        raise ConfigError([f"{path.name}: `config:` must be a mapping"], source=str(path))
    raw: dict[str, Any] = {}
    problems = []
    secret_sections: set[str] = set()
    secure: dict[str, Any] = {}
    project = stack_project(path)
    for key, value in (document.get("config") or {}).items():
        problem = config_key_problem(str(key), project)
        if problem:
            problems.append(problem)
            continue
        namespace, _, section = str(key).partition(":")
        if namespace != project:
            continue  # provider settings such as kubernetes:context belong to their providers
        found: dict[str, Any] = {}
        raw[section] = _replace_secure(value, section, found)
        if found:
            secret_sections.add(section)
            secure.update(found)
    problems += _check_secure_values(document, secure, decrypt_check)
    if problems:
        raise ConfigError(problems, source=str(path))
    return raw, secret_sections


def with_registered_tenants(raw: dict[str, Any], env: str, directory: Path, offboarded: frozenset[str] = frozenset()) -> dict[str, Any]:
    """`raw` with the tenants that onboarded themselves (`tenants/<env>/*.yaml`) after its own:
    the environment as the platform program sees it (the stack file alone is `read_stack_file`).
    `offboarded`: registered tenants left out, as if their files were gone (`factory diff`)."""
    try:
        registered = [t for t in registered_tenants(env, directory) if t["name"] not in offboarded]
    except RegistryError as err:
        raise ConfigError([f"tenants: {err}"], source=str(registry_dir(env, directory))) from None
    if not registered:
        return raw
    return {**raw, "tenants": [*as_list(raw.get("tenants")), *registered]}


def environment_raw(raw: dict[str, Any], stack: str, directory: Path, offboarded: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The stack file's sections as the program deploys them: with the tenants that onboarded
    themselves (but the `offboarded`) and the upgrade under way (`ai_factory.factory.model.upgrades`)."""
    from ai_factory.factory.model.upgrades import environment_of, with_upgrade_state

    env = environment_of(stack, raw)  # a cluster's stack reads its environment's tenants and upgrade
    return with_upgrade_state(with_registered_tenants(raw, env, directory, offboarded), env, directory)


def stack_file_lines(path: Path) -> dict[str, int]:
    """Where each config path of a stack file is written: `{"tenants[1].gpus[0]": 97, ...}` (1-based
    lines), in the path syntax of `ConfigError` problems; sections of the project's namespace by
    their name, other keys (`kubernetes:context`, `encryptionsalt`) as written. Empty when the file
    cannot be read (its problems are reported by `read_stack_file`)."""
    try:
        root = bounded_yaml.compose(path)
        project = stack_project(path)
    except (OSError, ValueError, yaml.YAMLError, ConfigError):
        return {}
    lines: dict[str, int] = {}

    def walk(node: yaml.Node, at: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    inner = f"{at}.{key.value}" if at else str(key.value)
                    lines.setdefault(inner, key.start_mark.line + 1)
                    walk(value, inner)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines.setdefault(f"{at}[{i}]", item.start_mark.line + 1)
                walk(item, f"{at}[{i}]")

    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if not isinstance(key, yaml.ScalarNode):
                continue
            if key.value != "config":
                lines.setdefault(str(key.value), key.start_mark.line + 1)
            elif isinstance(value, yaml.MappingNode):
                for config_key, section in value.value:
                    if isinstance(config_key, yaml.ScalarNode):
                        namespace, _, name = str(config_key.value).partition(":")
                        at = name if namespace == project and name else str(config_key.value)
                        lines.setdefault(at, config_key.start_mark.line + 1)
                        walk(section, at)
    return lines


def line_of(lines: dict[str, int], path: str) -> int | None:
    """The line of `path`, or of its nearest written ancestor (a defaulted field is reported at the
    mapping that omits it)."""
    while path:
        if path in lines:
            return lines[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return None


PROVIDER_NAMESPACES = ("kubernetes", "keycloak", "vault", "command", "pulumi")
"""Config namespaces besides the project's: the providers the program uses (`kubernetes:context`,
...) and the engine's own (`pulumi:tags`)."""


def known_namespaces(project: str) -> tuple[str, ...]:
    """Every config namespace a stack file of `project` may use; any other is a mistake (a misspelt
    `ai-factroy:tenants` would otherwise leave an environment without tenants, silently)."""
    return (project, *PROVIDER_NAMESPACES)


def config_key_problem(key: str, project: str) -> str | None:
    """What is wrong with a config key of `project`'s stack, if anything: no namespace, a namespace
    no one reads, or a section the project does not have."""
    namespace, colon, section = key.partition(":")
    if not colon:
        hint = f" (did you mean '{project}:{key}'?)" if key in SECTIONS else ""
        return f"{key}: a config key is `<namespace>:<name>`{hint}"
    if namespace not in known_namespaces(project):
        return f"{key}: unknown config namespace {namespace!r}{did_you_mean(namespace, known_namespaces(project))}"
    if namespace == project and section not in SECTIONS:
        return f"{section}: unknown key{did_you_mean(section, SECTIONS)}"
    return None


def _check_secure_values(document: dict[str, Any], secure: dict[str, Any], decrypt_check: bool) -> list[str]:
    """Each secure value is a well-formed ciphertext; with the passphrase available, each decrypts.
    Problems name the config path, never a plaintext."""
    problems = []
    for path, ciphertext in sorted(secure.items()):
        try:
            parse_ciphertext(ciphertext)
        except SecretsError as err:
            problems.append(f"{path}: malformed secure value: {err}")
    provider = document.get("secretsprovider")
    if provider not in (None, "passphrase"):
        if decrypt_check:
            problems.append(f"secretsprovider: {str(provider)[:80]!r} cannot be checked offline; --decrypt-check verifies passphrase stacks only")
        return problems
    salt = document.get("encryptionsalt")
    if salt is None:
        if secure:
            problems.append("encryptionsalt: missing, so no passphrase decrypts this stack's secure values (set them again with `pulumi config set --secret`)")
        return problems
    try:
        parse_salt(salt)
    except SecretsError as err:
        return problems + [f"encryptionsalt: {err}"]
    try:
        passphrase = passphrase_from_env()
    except SecretsError as err:
        return problems + [str(err)]
    if passphrase is None:
        if decrypt_check:
            problems.append("--decrypt-check: set PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE to the stack's passphrase")
        return problems
    try:
        crypter = PassphraseCrypter(passphrase, salt)
    except SecretsError as err:
        return problems + [f"encryptionsalt: {err}"]
    for path, ciphertext in sorted(secure.items()):
        try:
            if not crypter.decrypts(ciphertext):
                problems.append(f"{path}: does not decrypt with this stack's passphrase (encrypted for another stack or passphrase?)")
        except SecretsError:
            pass  # malformed: reported above
    return problems


@dataclass(frozen=True)
class StackEnvironment:
    """A stack file read and validated once, for a tool that needs both its raw sections (a
    render) and its configuration (a check's refusals and fleet findings)."""

    path: Path
    raw: dict[str, Any]
    secret_sections: set[str]
    """The sections holding a secret (`read_stack_file`)."""
    cfg: FactoryConfig


def read_environment(env: str, directory: Path | None = None) -> StackEnvironment:
    path = stack_file(env, directory)
    raw, secret_sections = read_stack_file(path)
    return StackEnvironment(path, raw, secret_sections, validate(environment_raw(raw, stack_name(path), path.resolve().parent), source=str(path)))


def load_stack_file(env: str, directory: Path | None = None) -> FactoryConfig:
    return read_environment(env, directory).cfg


def load_pulumi_config(offboarded: frozenset[str] = frozenset()) -> FactoryConfig:
    """The environment as `pulumi up` sees it: decrypted config, secret sections known to the engine
    (without the registered tenants `offboarded`: `factory diff` of a self-service tenant's removal)."""
    import pulumi
    from pulumi.runtime.config import CONFIG, is_config_secret

    config = pulumi.Config()  # the project's own namespace
    raw = {section: value for section in SECTIONS if (value := config.get_object(section)) is not None}
    raw = environment_raw(raw, pulumi.get_stack(), project_dir(), offboarded)
    decrypted = {section for section in raw if is_config_secret(f"{pulumi.get_project()}:{section}")}
    source = f"stack {pulumi.get_stack()}"
    key_problems = [p for key in sorted(CONFIG.get()) if (p := config_key_problem(key, pulumi.get_project()))]
    try:
        cfg = validate(raw, decrypted_secret_sections=decrypted, source=source)
    except ConfigError as err:
        raise ConfigError([*key_problems, *err.problems], source=source) from None
    if key_problems:
        raise ConfigError(key_problems, source=source)
    return cfg


def validate(raw: dict[str, Any], decrypted_secret_sections: set[str] = frozenset(), source: str = "configuration") -> FactoryConfig:
    """Validate every section separately (so one bad section hides no problem of another), then the
    cross-references between them; raise one `ConfigError` listing all problems.

    Secret fields take `SecretValue`s (offline placeholders of `secure:` entries). Plain strings are
    accepted there only inside `decrypted_secret_sections`: the config keys the engine decrypted."""
    problems: list[str] = []
    validated: dict[str, Any] = {}
    for section, field in FactoryConfig.model_fields.items():
        if section not in raw:
            if field.is_required():
                problems.append(f"{section}: required")
            continue
        try:
            validated[section] = TypeAdapter(field.annotation).validate_python(
                raw[section], context={"plaintext_is_secret": section in decrypted_secret_sections}
            )
        except ValidationError as err:
            problems += [_format_error(section, e) for e in err.errors()]
    problems += cross_check(raw)
    if problems:
        raise ConfigError(problems, source=source)
    cfg = with_matrix_pins(FactoryConfig.model_validate(validated))
    return cluster_view(cfg, cfg.kubernetes.cluster) if cfg.kubernetes.cluster else cfg


def validate_tenant(raw: Any, source: str = "tenant") -> Tenant:
    """One tenant on its own, as the Automation API takes it (`stacks.tenants`): the field rules of
    a `tenants[]` entry and the rules a tenant obeys by itself, every problem at once with its path
    from `tenant`, as one `ConfigError`. Rules against the platform (pools, registration) are the
    platform contract's (`stacks.contract`)."""
    problems: list[str] = []
    tenant = None
    try:
        tenant = Tenant.model_validate(raw)
    except ValidationError as err:
        problems += [_format_error("tenant", e, root=Tenant) for e in err.errors()]
    problems += _tenant_rules("tenant", as_dict(raw))
    if problems:
        raise ConfigError(problems, source=source)
    return tenant


# --------------------------------------------------------------------------- cross-references


def cross_check(raw: dict[str, Any]) -> list[str]:
    """Rules that relate parts of the config. Written over the raw data (guarding every access) so
    they run even where a section has field errors, and every problem shows up in one report."""
    problems: list[str] = []
    fleet = as_dict(raw.get("fleet"))
    sites = as_list(fleet.get("sites"))
    pools = as_list(fleet.get("pools"))
    tenants = as_list(raw.get("tenants"))

    problems += _duplicates("fleet.sites", sites)
    problems += _duplicates("fleet.pools", pools)
    problems += _duplicates("tenants", tenants)

    site_names = {name for s in map(as_dict, sites) if isinstance(name := s.get("name"), str)}
    pools_by_name: dict[str, dict] = {}
    node_names: Counter[str] = Counter()
    for i, pool in enumerate(map(as_dict, pools)):
        path = f"fleet.pools[{i}]"
        if isinstance(pool.get("name"), str):
            pools_by_name.setdefault(pool["name"], pool)
        if isinstance(pool.get("site"), str) and pool["site"] not in site_names:
            problems.append(f"{path}.site: unknown site {pool['site']!r}{did_you_mean(pool['site'], site_names)}")
        model = as_dict(pool.get("gpu")).get("model")
        if isinstance(model, str) and model not in GPU_MODELS:
            problems.append(f"{path}.gpu.model: unknown GPU model {model!r}{did_you_mean(model, GPU_MODELS)}")
        elif pool.get("sharing") == "mig" and isinstance(model, str) and not GPU_MODELS[model].mig_capable:
            problems.append(f"{path}.sharing: {model} has no MIG; use exclusive, time-slicing, hami or dra")
        if (pool.get("nodes") is None) == (pool.get("node_list") is None):
            problems.append(f"{path}: give exactly one of `nodes` (a count) or `node_list`")
        for node in map(as_dict, as_list(pool.get("node_list"))):
            if isinstance(node.get("name"), str):
                node_names[node["name"]] += 1
        per_node = _valid_int(as_dict(pool.get("gpu")).get("per_node"), 1, MAX_GPUS_PER_NODE)
        for j, numa in enumerate(map(as_dict, as_list(as_dict(pool.get("topology")).get("numa")))):
            outside = [gpu for gpu in as_list(numa.get("gpus")) if isinstance(gpu, int) and per_node and not 0 <= gpu < per_node]
            if outside:
                problems.append(f"{path}.topology.numa[{j}].gpus: GPU index(es) {', '.join(map(str, outside))} outside 0..{per_node - 1}")
    problems += [f"fleet.pools: node {name!r} is listed {n} times" for name, n in node_names.items() if n > 1]
    total_nodes = sum(_node_count(pool) or 0 for pool in map(as_dict, pools))
    if total_nodes > MAX_FLEET_NODES:
        problems.append(f"fleet.pools: {total_nodes} nodes in all; a fleet is one Kubernetes cluster, at most {MAX_FLEET_NODES} nodes")
    problems += _check_tenancy(raw, tenants)
    problems += _check_scheduling(raw, pools, tenants)
    for i, pool in enumerate(as_list(as_dict(raw.get("self_service")).get("pools"))):
        if isinstance(pool, str) and pool not in pools_by_name:
            problems.append(f"self_service.pools[{i}]: unknown pool {pool!r}{did_you_mean(pool, pools_by_name)}")
    problems += _check_owners(tenants)
    problems += cluster_problems(raw)
    problems += ring_problems(raw)
    problems += _check_layers(raw)
    problems += _check_offering_names(pools_by_name, tenants)

    domains: dict[str, list[tuple[str, str]]] = {}
    for i, tenant in enumerate(map(as_dict, tenants)):
        name = tenant.get("name")
        domain = tenant.get("trust_domain") or name
        if isinstance(domain, str) and isinstance(name, str):
            domains.setdefault(domain, []).append((name, tenant.get("trust")))
        problems += _tenant_rules(f"tenants[{i}]", tenant)
        for j, demand in enumerate(map(as_dict, as_list(tenant.get("gpus")))):
            problems += _check_demand(f"tenants[{i}].gpus[{j}]", demand, pools_by_name, tenant.get("trust"))
    for domain, members in sorted(domains.items()):
        if len(members) > 1 and any(trust == "low" for _, trust in members):
            names = ", ".join(sorted(n for n, _ in members))
            problems.append(f"tenants: trust domain {domain!r} mixes a low-trust tenant with others ({names}); a low-trust tenant is a domain of its own")
    return problems


RESERVED_NAMESPACE_PREFIX = "tenant-"
"""Tenant namespaces are `tenant-<name>` (`ai_factory.factory.model.tenancy`); no platform flow may point into one."""


def _check_tenancy(raw: dict[str, Any], tenants: list) -> list[str]:
    """vCluster API servers need the OIDC issuer; Pod Security exceptions and platform flows must
    name real tenants and platform namespaces."""
    problems = []
    trust = {t.get("name"): t.get("trust") for t in map(as_dict, tenants) if isinstance(t.get("name"), str)}
    if raw.get("identity") is None:
        for i, tenant in enumerate(map(as_dict, tenants)):
            if tenant.get("isolation", "namespace" if tenant.get("trust") == "high" else "vcluster") == "vcluster":
                problems.append(f"tenants[{i}].isolation: a vCluster signs users in with OIDC; set `identity` (the issuer)")
    tenancy = as_dict(as_dict(raw.get("layers")).get("tenancy"))
    exceptions = as_list(tenancy.get("pod_security_exceptions"))
    seen: Counter[str] = Counter()
    for i, exception in enumerate(map(as_dict, exceptions)):
        path, name = f"layers.tenancy.pod_security_exceptions[{i}].tenant", exception.get("tenant")
        if not isinstance(name, str):
            continue
        seen[name] += 1
        if name not in trust:
            problems.append(f"{path}: unknown tenant {name!r}{did_you_mean(name, trust)}")
        elif trust[name] == "low":
            problems.append(f"{path}: a low-trust tenant runs Pod Security restricted, without exception")
        if seen[name] == 2:
            problems.append(f"{path}: tenant {name!r} has more than one exception")
    flows = as_list(tenancy.get("platform_flows"))
    problems += _duplicates("layers.tenancy.platform_flows", flows)
    for i, flow in enumerate(map(as_dict, flows)):
        namespace = flow.get("namespace")
        if isinstance(namespace, str) and namespace.startswith(RESERVED_NAMESPACE_PREFIX):
            problems.append(f"layers.tenancy.platform_flows[{i}].namespace: {namespace!r} is a tenant namespace; flows go to platform services only")
    return problems


def _check_scheduling(raw: dict[str, Any], pools: list, tenants: list) -> list[str]:
    """Every GPU passes through a queue: some scheduling layer is on when tenants demand GPUs, HAMi
    slices go through Kueue (KAI and Volcano cannot meter them), time slices too under KAI, KAI and
    Volcano never both place pods, and a trust domain's cohort and queue have one organisation."""
    problems = []
    layers = as_dict(raw.get("layers"))
    kueue = as_dict(layers.get("kueue")).get("enabled", True) is not False
    kai = as_dict(layers.get("kai_scheduler")).get("enabled", False) is True
    volcano = as_dict(layers.get("volcano")).get("enabled", False) is True
    if kai and volcano:
        problems.append("layers.volcano.enabled: KAI Scheduler and Volcano cannot both place pods on the GPU nodes (each sees the GPUs the other gave away as free); enable one")
    if not (kueue or kai or volcano) and any(as_list(t.get("gpus")) for t in map(as_dict, tenants)):
        problems.append("layers.kueue.enabled: tenants demand GPUs but no scheduling layer is on (kueue, kai_scheduler or volcano); every GPU must pass through a queue")
    if not kueue:
        for i, pool in enumerate(map(as_dict, pools)):
            if pool.get("sharing") == "hami":
                problems.append(f"fleet.pools[{i}].sharing: HAMi slices are admitted and metered by Kueue only (KAI Scheduler and Volcano cannot); enable layers.kueue")
            elif pool.get("sharing") == "time-slicing" and kai:
                problems.append(f"fleet.pools[{i}].sharing: KAI Scheduler does not count time-sliced replicas (nvidia.com/gpu.shared) against queues; enable layers.kueue")
    organisations: dict[str, set[str]] = {}
    for tenant in map(as_dict, tenants):
        domain = tenant.get("trust_domain") or tenant.get("name")
        if isinstance(domain, str):
            organisations.setdefault(domain, set()).add(str(tenant.get("organisation") or "(none)"))
    for domain, names in sorted(organisations.items()):
        if len(names) > 1:
            problems.append(f"tenants: trust domain {domain!r} spans organisations ({', '.join(sorted(names))}); a trust domain belongs to one organisation")
    return problems


def _valid_int(value: Any, low: int, high: int) -> int | None:
    """`value` if it is an integer its field accepts; None lets the field error speak alone (no
    cross-check built on an impossible value, such as a GPU index range of `0..-1`)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high else None


def _node_count(pool: dict) -> int | None:
    nodes, node_list = pool.get("nodes"), pool.get("node_list")
    if nodes is not None:
        return _valid_int(nodes, 1, MAX_FLEET_NODES)
    return len(node_list) if isinstance(node_list, list) and len(node_list) <= MAX_FLEET_NODES else None


def pool_supply(pool: dict, profile_max: int = 1) -> int | None:
    """The most units one demand on `pool` could ever get: every GPU of every node, times what one
    GPU offers under the pool's sharing (time-sliced replicas, HAMi splits, `profile_max` MIG
    instances of one profile); None while a field it needs is invalid (its own error says so)."""
    nodes = _node_count(pool)
    per_node = _valid_int(as_dict(pool.get("gpu")).get("per_node"), 1, MAX_GPUS_PER_NODE)
    sharing = pool.get("sharing", "exclusive")
    per_gpu = {
        "time-slicing": _valid_int(as_dict(pool.get("time_slicing")).get("replicas", TimeSlicing().replicas), 2, 64),
        "hami": _valid_int(as_dict(pool.get("hami")).get("split_count", HamiPool().split_count), 1, 64),
        "mig": profile_max,
    }.get(sharing, 1)
    if nodes is None or per_node is None or per_gpu is None:
        return None
    return nodes * per_node * per_gpu


def _beyond_supply(path: str, count: Any, pool_name: str, supply: int | None, unit: str) -> list[str]:
    if supply is None or _valid_int(count, 1, MAX_GPU_UNITS) is None or count <= supply:
        return []
    return [f"{path}: {count} is more than pool {pool_name!r} could ever supply ({supply} {unit}); the demand cannot be planned"]


def _tenant_rules(path: str, tenant: dict) -> list[str]:
    """Rules a tenant obeys on its own, whatever the rest of the config says."""
    problems = []
    if tenant.get("trust") == "low" and tenant.get("isolation") == "namespace":
        problems.append(f"{path}.isolation: a low-trust tenant needs its own control plane (vcluster)")
    field = "trust_domain" if tenant.get("trust_domain") else "name"
    if tenant.get(field) == UNASSIGNED:
        problems.append(f"{path}.{field}: {UNASSIGNED!r} is reserved for the nodes the plan gives to no trust domain")
    for kind in ("groups", "users"):
        seen: Counter[str] = Counter()
        for j, owner in enumerate(as_list(as_dict(tenant.get("owners")).get(kind))):
            if not isinstance(owner, str):
                continue  # a field error
            seen[owner] += 1
            if seen[owner] == 2:  # once per owner, however often repeated
                problems.append(f"{path}.owners.{kind}[{j}]: {kind[:-1]} {owner!r} is listed twice")
    return problems


def _check_owners(tenants: list) -> list[str]:
    """Tokens carry group and user names, not paths: one owner in two tenants would open both."""
    problems = []
    for kind in ("groups", "users"):
        holders: dict[str, Any] = {}
        for i, tenant in enumerate(map(as_dict, tenants)):
            for owner in as_list(as_dict(tenant.get("owners")).get(kind)):
                if isinstance(owner, str) and holders.setdefault(owner, tenant.get("name")) != tenant.get("name"):
                    problems.append(f"tenants[{i}].owners.{kind}: {kind[:-1]} {owner!r} already owns tenant {holders[owner]!r}; an identity {kind[:-1]} administers one tenant")
    return problems


def _check_offering_names(pools: dict[str, dict], tenants: list) -> list[str]:
    """Each (pool, trust domain) a tenant uses becomes a flavor named `<pool>-<domain>`; two pairs
    must never meet in one name (pool `a` of domain `b-c` and pool `a-b` of domain `c`)."""
    problems = []
    seen: dict[str, tuple[str, str]] = {}
    for i, tenant in enumerate(map(as_dict, tenants)):
        domain = tenant.get("trust_domain") or tenant.get("name")
        for j, demand in enumerate(map(as_dict, as_list(tenant.get("gpus")))):
            pool = demand.get("pool")
            if not (isinstance(domain, str) and isinstance(pool, str) and pool in pools):
                continue
            name = offering_name(pool, domain)
            other = seen.setdefault(name, (pool, domain))
            if other != (pool, domain):
                problems.append(
                    f"tenants[{i}].gpus[{j}].pool: the flavor of pool {pool!r} for trust domain {domain!r} would be named "
                    f"{name!r}, like that of pool {other[0]!r} for trust domain {other[1]!r}; rename a pool or a trust domain"
                )
    return problems


def _check_demand(path: str, demand: dict, pools: dict[str, dict], trust: Any) -> list[str]:
    pool_name = demand.get("pool")
    if not isinstance(pool_name, str):
        return []
    pool = pools.get(pool_name)
    if pool is None:
        return [f"{path}.pool: unknown pool {pool_name!r}{did_you_mean(pool_name, pools)}"]
    sharing = pool.get("sharing", "exclusive")
    if not isinstance(sharing, str):
        return []  # the pool's own field error says what is wrong
    problems = []
    if trust == "low" and sharing not in ("exclusive", "dra"):
        problems.append(f"{path}.pool: low-trust tenants get whole GPUs only; pool {pool_name!r} shares GPUs ({sharing})")
    given = {k for k in ("count", "mig", "memory_mib", "cores_percent") if demand.get(k) not in (None, {}, [])}
    expected = {"mig": {"mig"}, "hami": {"count", "memory_mib", "cores_percent"}}.get(sharing, {"count"})
    for key in sorted(given - expected):
        problems.append(f"{path}.{key}: not used by {sharing} pool {pool_name!r} (it takes {', '.join(sorted(expected))})")
    for key in sorted(expected - given):
        problems.append(f"{path}.{key}: required by {sharing} pool {pool_name!r}")
    if demand.get("memory_oversubscription", 1.0) != 1.0 and sharing != "hami":
        problems.append(f"{path}.memory_oversubscription: only HAMi pools can oversubscribe GPU memory")
    model_name = as_dict(pool.get("gpu")).get("model")
    model = GPU_MODELS.get(model_name) if isinstance(model_name, str) else None
    if sharing == "mig" and model is not None:
        profiles = {p.name: p for p in model.mig_profiles}
        for profile, count in as_dict(demand.get("mig")).items():
            if profile not in profiles:
                problems.append(f"{path}.mig.{profile}: not a MIG profile of {model.name}{did_you_mean(str(profile), profiles)}")
            else:
                supply = pool_supply(pool, profiles[profile].max_count)
                problems += _beyond_supply(f"{path}.mig.{profile}", count, pool_name, supply, f"{profile} instances")
    elif "count" in expected:
        unit = {"time-slicing": "time-sliced replicas", "hami": "HAMi vGPUs"}.get(sharing, "GPUs")
        problems += _beyond_supply(f"{path}.count", demand.get("count"), pool_name, pool_supply(pool), unit)
    return problems


def _duplicates(path: str, items: list) -> list[str]:
    names = Counter(item.get("name") for item in map(as_dict, items) if isinstance(item.get("name"), str))
    return [
        f"{path}[{i}].name: duplicate name {item['name']!r}"
        for i, item in enumerate(map(as_dict, items))
        if isinstance(item.get("name"), str) and names[item["name"]] > 1 and i != _first_index(items, item["name"])
    ]


def _check_layers(raw: dict[str, Any]) -> list[str]:
    """Each layer's own cross-section rules (`Layer.config_checks`), declared in its module, and the
    rule every layer installed for a sharing mode (`Layer.sharing`) shares: a pool using that mode
    needs the layer on."""
    # Imported here: the registry imports every layer module, and they import the model.
    from ai_factory.components.registry import layers

    problems = [problem for layer in layers() for check in layer.config_checks for problem in check(raw)]
    switched = as_dict(raw.get("layers"))
    for i, pool in enumerate(map(as_dict, as_list(as_dict(raw.get("fleet")).get("pools")))):
        for layer in layers():
            if pool.get("sharing") in layer.sharing and layer.section and as_dict(switched.get(layer.section)).get("enabled", True) is False:
                problems.append(f"fleet.pools[{i}].sharing: pool {pool.get('name')!r} uses {pool['sharing']} but layers.{layer.section} is disabled")
    return problems


def _first_index(items: list, name: str) -> int:
    return next(i for i, item in enumerate(map(as_dict, items)) if item.get("name") == name)


# --------------------------------------------------------------------------- messages


def _replace_secure(value: Any, path: str, found: dict[str, Any]) -> Any:
    """`value` with each `{secure: <ciphertext>}` replaced by its placeholder; the ciphertexts are
    collected in `found` by config path."""
    if isinstance(value, dict):
        if set(value) == {"secure"}:
            found[path] = value["secure"]
            return offline_placeholder(path)
        return {k: _replace_secure(v, f"{path}.{k}", found) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_secure(v, f"{path}[{i}]", found) for i, v in enumerate(value)]
    return value


def _format_path(section: str, loc: tuple) -> str:
    path = section
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _format_error(section: str, error: dict, root: Any = None) -> str:
    """One pydantic error as `path: message`; `root` is the model at `section` when it is not a
    section of `FactoryConfig` (a lone tenant)."""
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))
    path = _format_path(section, loc)
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        allowed = _allowed_keys(section, loc[:-1], root)
        return f"{path}: unknown key{did_you_mean(str(loc[-1]), allowed)}"
    messages = {
        "missing": "required",
        "greater_than_equal": f"must be >= {ctx.get('ge')}",
        "greater_than": f"must be > {ctx.get('gt')}",
        "less_than_equal": f"must be <= {ctx.get('le')}",
        "too_short": f"must have at least {ctx.get('min_length')} item(s)",
        "too_long": f"must have at most {ctx.get('max_length')} item(s)",
        "string_too_long": f"must be at most {ctx.get('max_length')} character(s)",
        "string_pattern_mismatch": f"{error['input']!r} does not match {ctx.get('pattern')}",
        "literal_error": f"must be one of {ctx.get('expected')}",
        "int_type": "must be an integer",
        "int_parsing": "must be an integer",
        "bool_type": "must be true or false",
        "bool_parsing": "must be true or false",
        "string_type": "must be a string",
        "list_type": "must be a list",
        "dict_type": "must be a mapping",
        "model_type": "must be a mapping",
        "model_attributes_type": "must be a mapping",
    }
    message = messages.get(kind, error["msg"].removeprefix("Value error, "))
    return f"{path}: {message}"


def _allowed_keys(section: str, loc: tuple, root: Any = None) -> list[str]:
    """The keys a mapping at `section` + `loc` accepts, for "did you mean" hints."""
    annotation: Any = root if root is not None else FactoryConfig.model_fields[section].annotation
    for part in loc:
        annotation = _unwrap(annotation, want_item=isinstance(part, int))
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(part, str):
            field = annotation.model_fields.get(part)
            annotation = field.annotation if field else None
        elif isinstance(part, str):
            annotation = _unwrap(annotation, want_item=True)
    annotation = _unwrap(annotation, want_item=False)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def _unwrap(annotation: Any, want_item: bool) -> Any:
    """Strip Optional/Annotated; with `want_item`, step into a list's items or a dict's values."""
    while True:
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin is typing.Annotated:
            annotation = args[0]
        elif origin in (typing.Union, types.UnionType):
            annotation = next((a for a in args if a is not type(None)), None)
        elif want_item and origin in (list, dict):
            annotation = args[-1]
            want_item = False
        else:
            return annotation

