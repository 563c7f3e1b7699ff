"""How a policy is declared once and run two ways.

Every rule is a plain function over resource data, wrapped once into a CrossGuard policy object:

- a resource rule `(resource_type, props, config) -> messages` sees one resource's inputs, as
  `pulumi preview --policy-pack policies` hands them to the pack (camelCase, proxied so that a
  value unknown during preview raises `UnknownValueError`, which CrossGuard reports as "can't run
  during preview");
- a stack rule `(resources, config) -> (resource or None, message)` sees every resource of the
  stack as `PolicyResource`s linked to their parent and dependencies.

The wrapped objects are what the pack registers (`policies/__main__.py`) and what `factory check`
runs offline over the rendered graph (`factory/policy_check.py`), so the names, levels and
messages cannot drift apart. Building them starts nothing: only `PolicyPack(...)` starts the
analyzer server, and only the pack's `__main__` builds one.

Rules read mappings and sequences through the `Mapping`/`Sequence` protocols (the proxies are not
`dict`/`list`) and never mutate what they read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable, Iterable, Optional

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

ResourceRule = Callable[[str, Mapping[str, Any], Mapping[str, Any]], Iterable[str]]
StackRule = Callable[[Sequence[PolicyResource], Mapping[str, Any]], Iterable["Violation"]]

Violation = tuple[Optional[PolicyResource], str]
"""What a stack rule reports: the resource it names (None: the stack) and the message."""
Settings = Mapping[str, Mapping[str, Any]]
"""A policy's user-tunable thresholds: JSON-schema properties, each with its `default`."""


def _config(settings: Settings, given: Mapping[str, Any]) -> dict[str, Any]:
    # CrossGuard passes only what the user's --policy-pack-config file sets; schema defaults are
    # not applied by the SDK, so they are applied here.
    return {**{key: schema["default"] for key, schema in settings.items()}, **dict(given or {})}


def _level(advisory: bool) -> EnforcementLevel:
    return EnforcementLevel.ADVISORY if advisory else EnforcementLevel.MANDATORY


def _schema(settings: Settings) -> PolicyConfigSchema | None:
    return PolicyConfigSchema(properties={k: dict(v) for k, v in settings.items()}) if settings else None


def resource_policy(
    name: str, description: str, rule: ResourceRule, *, advisory: bool = False, settings: Settings | None = None
) -> ResourceValidationPolicy:
    """A CrossGuard resource policy running `rule` on every resource's inputs. Mandatory unless
    `advisory` (for rules where a platform may legitimately differ)."""
    settings = settings or {}

    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        for message in rule(args.resource_type, args.props, _config(settings, args.get_config())):
            report(message, None)

    return ResourceValidationPolicy(
        name=name,
        description=description,
        validate=validate,
        enforcement_level=_level(advisory),
        config_schema=_schema(settings),
    )


def stack_policy(
    name: str, description: str, rule: StackRule, *, advisory: bool = False, settings: Settings | None = None, tenant_local: bool = False
) -> StackValidationPolicy:
    """A CrossGuard stack policy running `rule` over all resources; each violation is attached to
    the resource the rule names (or to the stack when it names none). `tenant_local`: the rule
    finds over the stack what it finds over each tenant's view (`factory check` then checks only
    the changed tenants' views again; see `ai_factory.factory.checking.findings.tenant_local`)."""
    settings = settings or {}

    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        for resource, message in rule(args.resources, _config(settings, args.get_config())):
            report(message, resource.urn if resource is not None else None)

    policy = StackValidationPolicy(
        name=name,
        description=description,
        validate=validate,
        enforcement_level=_level(advisory),
        config_schema=_schema(settings),
    )
    policy.tenant_local = tenant_local  # type: ignore[attr-defined]
    return policy


def protected(resource: PolicyResource) -> bool | None:
    """Whether `resource` is protected, or None when the caller cannot know (the offline runner
    reading a rendered directory where an object cannot be matched to its inventory entry)."""
    return resource.opts.protect


def retain_on_delete(resource: PolicyResource) -> bool | None:
    """Whether `resource` is retained on delete, or None when the caller cannot know.

    CrossGuard's `PolicyResourceOptions` (pulumi-policy 1.21.0) carries `protect` but not
    `retainOnDelete`; the offline runner passes options that do (`factory/policy_check.py`)."""
    return getattr(resource.opts, "retain_on_delete", None)
