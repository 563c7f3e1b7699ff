"""Admission itself: the Kyverno policies that protect tenants are all there, by name, and
enforce, fail closed and answer in time; the Kyverno chart does not switch that off.

Expected: every platform policy (`components.kyverno.PLATFORM_POLICY_NAMES`) and, per tenant
namespace, its own policy (`<namespace>-admission`). Each must: keep admission on; enforce every
rule (`failureAction: Enforce`, no `Audit` override, no policy-wide `validationFailureAction:
Audit`); fail closed (`failurePolicy` Fail); time out within Kyverno's default (10 s, a longer
timeout holds every API request that long when Kyverno is slow); exclude nothing; and match the
tenant namespaces it protects. The chart keeps `forceFailurePolicyIgnore` off and its webhooks'
namespace selector excludes no tenant namespace.

References: shared/reference/security-and-reliability.md (section 2.2; checks 15-18 of its last section).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, Iterator

from pulumi_policy import PolicyResource
from pulumi_policy.proxy import UnknownValueError

from ai_factory.components.kyverno import (
    DEDICATED_NODES_RULE,
    ESCAPE_VARIABLES,
    FORBIDDEN_MOUNTS,
    IMAGE_REGISTRIES_POLICY,
    PLATFORM_RULES,
    TOKEN as KYVERNO_COMPONENT,
    POD_SECURITY_RULE,
    TENANT_RULES,
    WEBHOOK_TIMEOUT_SECONDS,
    tenant_policy_name,
)
from ai_factory.factory.model.tenancy import TRUST_LABEL
from ai_factory.policies.aif_policies.core import Violation, stack_policy
from ai_factory.policies.aif_policies.kube import Obj, as_list, as_map, chart_named, cluster_of, known, selects
from ai_factory.policies.aif_policies.workloads import allowed_registries


def _filters(match: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    blocks = [as_map(b) for key in ("any", "all") for b in as_list(match.get(key))] or [match]
    return [as_map(b.get("resources")) for b in blocks]


def _name_matches(namespace: str, pattern: str) -> bool:
    """`fnmatchcase`, without compiling a pattern that has no wildcard: each tenant's policy names
    its own namespace, and compiling a thousand of them was a third of this policy's time."""
    return fnmatchcase(namespace, pattern) if "*" in pattern or "?" in pattern or "[" in pattern else namespace == pattern


def matches_namespace(match: Mapping[str, Any], namespace: str, namespace_labels: Mapping[str, Any]) -> bool:
    """Whether a rule's `match` can select objects of a namespace (by name or by label)."""
    for resources in _filters(match):
        names = [str(n) for n in as_list(resources.get("namespaces"))]
        selector = resources.get("namespaceSelector")
        by_name = not names or any(_name_matches(namespace, n) for n in names)
        by_label = selector is None or selects(selector, {**namespace_labels, "kubernetes.io/metadata.name": namespace})
        if by_name and by_label:
            return True
    return False


POD_SECURITY_LEVELS = ("privileged", "baseline", "restricted")
MIN_ADMISSION_REPLICAS = 3
"""Kyverno's own guidance for a highly available admission controller (`layers.kyverno.admission_replicas`)."""
OPEN_IMAGE_PATTERNS = ("*", "*/*", "?*", "*:*", "*/*/*")
"""Image patterns that admit any image: an allow-list holding one is none."""
CONTENT_LISTS = {
    # policy: (what its deny values must still hold, what they are)
    "tenant-gpu-escape-env": (ESCAPE_VARIABLES, "escape variable"),
    "tenant-gpu-device-mounts": (FORBIDDEN_MOUNTS, "device mount"),
}


def _deny_values(rule: Mapping[str, Any]) -> set[str]:
    values: set[str] = set()
    for each in as_list(as_map(rule.get("validate")).get("foreach")):
        for condition in as_list(as_map(as_map(as_map(each).get("deny")).get("conditions")).get("any")):
            values |= {str(v) for v in as_list(as_map(condition).get("value"))}
    return values


def content_problems(name: str, rules: Mapping[str, Mapping[str, Any]], level: str | None) -> Iterator[str]:
    """What a protecting policy's rules no longer refuse: escape variables or mounts dropped from
    their lists, Pod Security below the namespace's."""
    if name in CONTENT_LISTS:
        required, what = CONTENT_LISTS[name]
        missing = sorted(set(required) - {v for r in rules.values() for v in _deny_values(r)})
        if missing:
            yield f"no longer refuses the {what}(s) {', '.join(missing)}"
    pod_security = as_map(as_map(rules.get(POD_SECURITY_RULE)).get("validate")).get("podSecurity")
    if level in POD_SECURITY_LEVELS and pod_security is not None:
        enforced = as_map(pod_security).get("level")
        if enforced not in POD_SECURITY_LEVELS or POD_SECURITY_LEVELS.index(enforced) < POD_SECURITY_LEVELS.index(level):
            yield f"enforces Pod Security {enforced!r}, below its namespace's {level!r}"


def policy_problems(policy: Obj, protected: Mapping[str, Mapping[str, Any]], expected_rules: Sequence[str] = ()) -> Iterator[str]:
    """What makes a protecting ClusterPolicy let requests through; `protected`: the labels of the
    tenant namespaces it must cover, by name; `expected_rules`: the rules it must have."""
    spec = policy.spec
    if spec.get("admission") is False:
        yield "has admission switched off (admission: false)"
    if spec.get("validationFailureAction") not in (None, "Enforce", "enforce"):
        yield f"sets validationFailureAction {spec.get('validationFailureAction')} (only Enforce refuses)"
    if spec.get("failurePolicy", "Fail") != "Fail":
        yield f"has failurePolicy {spec.get('failurePolicy')}: when Kyverno cannot answer, requests pass unchecked"
    webhook = as_map(spec.get("webhookConfiguration"))
    if webhook.get("failurePolicy", "Fail") != "Fail":
        yield f"has webhookConfiguration.failurePolicy {webhook.get('failurePolicy')}: when Kyverno cannot answer, requests pass unchecked"
    for key, timeout in (("webhookTimeoutSeconds", spec.get("webhookTimeoutSeconds")), ("webhookConfiguration.timeoutSeconds", webhook.get("timeoutSeconds"))):
        if timeout is not None and (not isinstance(timeout, int) or timeout > WEBHOOK_TIMEOUT_SECONDS):
            yield f"has {key} {timeout}, above Kyverno's default {WEBHOOK_TIMEOUT_SECONDS}"
    rules = [as_map(r) for r in as_list(spec.get("rules"))]
    missing = sorted(set(expected_rules) - {str(r.get("name")) for r in rules})
    if missing:
        yield f"lacks the rule(s) {', '.join(missing)}"
    if not rules:
        yield "has no rules"
    for rule in rules:
        name = rule.get("name")
        validate = as_map(rule.get("validate"))
        if validate and validate.get("failureAction", spec.get("validationFailureAction")) not in ("Enforce", "enforce"):
            yield f"rule {name} does not enforce (failureAction {validate.get('failureAction')!r})"
        if any(as_map(o).get("action") not in ("Enforce", "enforce") for o in as_list(validate.get("failureActionOverrides"))):
            yield f"rule {name} overrides its action to audit for some namespaces"
        if rule.get("exclude"):
            yield f"rule {name} excludes some requests"
        missed = unmatched_namespaces(rule, protected)
        if missed:
            yield f"rule {name} does not match the tenant namespace(s) {', '.join(missed)}"


def unmatched_namespaces(rule: Mapping[str, Any], protected: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The namespaces of `protected` (their labels by name) a rule's `match` cannot select, sorted.
    A platform rule is asked about every tenant namespace: its match is read once for all of them
    when no value of it is unknown during preview, else again for each, raising where the
    engine's proxies do (and only if there is a namespace to ask about). A tenant's rule, asked
    about its one namespace, is read where it is asked (reading it whole first was as much work again)."""
    if len(protected) > 1:
        try:
            match = as_map(known(rule.get("match")))
        except UnknownValueError:
            pass
        else:
            return sorted(ns for ns, labels in protected.items() if not matches_namespace(match, ns, labels))
    return sorted(ns for ns, labels in protected.items() if not matches_namespace(as_map(rule.get("match")), ns, labels))


def check_admission_policies_enforced(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    tenant_namespaces = {ns: cluster.namespace_labels.get(ns, {}) for ns in cluster.namespace_tenant}
    if not tenant_namespaces:
        return
    try:  # read once for every rule that matches them by label, unless one is unknown during preview
        tenant_namespaces = {ns: known(labels) for ns, labels in tenant_namespaces.items()}
    except UnknownValueError:
        pass  # read where each rule asks, raising where the engine's proxies do
    policies = {p.name: p for p in cluster.of("ClusterPolicy")}
    releases = chart_named(resources, "kyverno")
    # A tenant's own stack (self-service) holds its namespace and its policy only; the platform's
    # policies and the engine are the platform stack's, recognised by its Kyverno layer.
    platform = bool(releases) or any(r.resource_type == KYVERNO_COMPONENT for r in resources) or bool(set(PLATFORM_RULES) & set(policies))
    expected = {name: (tenant_namespaces, rules, None) for name, rules in PLATFORM_RULES.items()} if platform else {}
    for ns, labels in tenant_namespaces.items():
        rules = (*TENANT_RULES, DEDICATED_NODES_RULE) if labels.get(TRUST_LABEL) == "low" else TENANT_RULES
        expected[tenant_policy_name(ns)] = ({ns: labels}, rules, str(labels.get("pod-security.kubernetes.io/enforce") or ""))
    namespaces = {n.name: n.resource for n in cluster.of("Namespace")}
    for name, (protected, rules, level) in sorted(expected.items()):
        policy = policies.get(name)
        if policy is None:
            # Reported against what it would protect: the tenant's namespace, or the Kyverno release.
            anchor = namespaces.get(next(iter(protected))) if len(protected) == 1 and name not in PLATFORM_RULES else (releases[0][0] if releases else None)
            yield anchor, f"Kyverno ClusterPolicy {name} is missing: what it refuses, tenants of {', '.join(sorted(protected))} may do."
            continue
        by_name = {str(as_map(r).get("name")): as_map(r) for r in as_list(policy.spec.get("rules"))}
        problems = [*policy_problems(policy, protected, rules), *content_problems(name, by_name, level)]
        if name == IMAGE_REGISTRIES_POLICY:
            problems += [f"admits every image (pattern {p})" for p in allowed_registries(cluster) or [] if p in OPEN_IMAGE_PATTERNS]
        for problem in problems:
            yield policy.resource, f"Kyverno ClusterPolicy {name} {problem}: it protects tenants at admission and must enforce, fail closed and cover them."
    if platform and not releases:
        yield None, "no Kyverno release: the tenant admission policies have no engine."
    for release, chart in releases:
        values = chart.values
        if as_map(as_map(values.get("features")).get("forceFailurePolicyIgnore")).get("enabled") is True:
            yield release, f"Helm release {chart.namespace}/{chart.name} (Kyverno) forces failurePolicy Ignore on every policy: admission fails open."
        selector = as_map(as_map(values.get("config")).get("webhooks")).get("namespaceSelector")
        if isinstance(selector, Mapping):
            skipped = sorted(ns for ns, labels in tenant_namespaces.items() if not selects(selector, {**labels, "kubernetes.io/metadata.name": ns}))
            if skipped:
                yield release, f"Helm release {chart.namespace}/{chart.name} (Kyverno): its webhooks' namespaceSelector skips the tenant namespace(s) {', '.join(skipped)}."
        replicas = as_map(values.get("admissionController")).get("replicas")
        if not isinstance(replicas, int) or replicas < MIN_ADMISSION_REPLICAS:
            yield release, (
                f"Helm release {chart.namespace}/{chart.name} (Kyverno) runs {replicas!r} admission controller replica(s), fewer than "
                f"{MIN_ADMISSION_REPLICAS}: with the webhooks failing closed, one lost replica would block every tenant request."
            )


POLICIES = [
    stack_policy(
        "admission-policies-enforced",
        "Every tenant-protecting Kyverno policy exists, enforces, fails closed, times out within 10 s, excludes nothing "
        "and matches its tenants; the Kyverno chart does not fail open or skip tenant namespaces.",
        check_admission_policies_enforced,
    ),
]
