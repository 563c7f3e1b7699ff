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

from ai_factory.components.kyverno import PLATFORM_POLICY_NAMES, WEBHOOK_TIMEOUT_SECONDS, tenant_policy_name
from ai_factory.policies.aif_policies.core import Violation, stack_policy
from ai_factory.policies.aif_policies.kube import Cluster, Obj, as_list, as_map, chart_named, selects


def _filters(match: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    blocks = [as_map(b) for key in ("any", "all") for b in as_list(match.get(key))] or [match]
    return [as_map(b.get("resources")) for b in blocks]


def matches_namespace(rule: Mapping[str, Any], namespace: str, namespace_labels: Mapping[str, Any]) -> bool:
    """Whether a rule's `match` can select objects of a namespace (by name or by label)."""
    for resources in _filters(as_map(rule.get("match"))):
        names = [str(n) for n in as_list(resources.get("namespaces"))]
        selector = resources.get("namespaceSelector")
        by_name = not names or any(fnmatchcase(namespace, n) for n in names)
        by_label = selector is None or selects(selector, {**namespace_labels, "kubernetes.io/metadata.name": namespace})
        if by_name and by_label:
            return True
    return False


def policy_problems(policy: Obj, protected: Mapping[str, Mapping[str, Any]]) -> Iterator[str]:
    """What makes a protecting ClusterPolicy let requests through; `protected`: the labels of the
    tenant namespaces it must cover, by name."""
    spec = policy.spec
    if spec.get("admission") is False:
        yield "has admission switched off (admission: false)"
    if spec.get("validationFailureAction") not in (None, "Enforce", "enforce"):
        yield f"sets validationFailureAction {spec.get('validationFailureAction')} (only Enforce refuses)"
    if spec.get("failurePolicy", "Fail") != "Fail":
        yield f"has failurePolicy {spec.get('failurePolicy')}: when Kyverno cannot answer, requests pass unchecked"
    timeout = spec.get("webhookTimeoutSeconds", WEBHOOK_TIMEOUT_SECONDS)
    if not isinstance(timeout, int) or timeout > WEBHOOK_TIMEOUT_SECONDS:
        yield f"has webhookTimeoutSeconds {timeout}, above Kyverno's default {WEBHOOK_TIMEOUT_SECONDS}"
    rules = [as_map(r) for r in as_list(spec.get("rules"))]
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
        missed = sorted(ns for ns, labels in protected.items() if not matches_namespace(rule, ns, labels))
        if missed:
            yield f"rule {name} does not match the tenant namespace(s) {', '.join(missed)}"


def check_admission_policies_enforced(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = Cluster(resources)
    tenant_namespaces = {ns: cluster.namespace_labels.get(ns, {}) for ns in cluster.namespace_tenant}
    if not tenant_namespaces:
        return
    policies = {p.name: p for p in cluster.of("ClusterPolicy")}
    expected = {name: tenant_namespaces for name in PLATFORM_POLICY_NAMES}
    expected |= {tenant_policy_name(ns): {ns: labels} for ns, labels in tenant_namespaces.items()}
    for name, protected in sorted(expected.items()):
        policy = policies.get(name)
        if policy is None:
            yield None, f"Kyverno ClusterPolicy {name} is missing: what it refuses, tenants of {', '.join(sorted(protected))} may do."
            continue
        for problem in policy_problems(policy, protected):
            yield policy.resource, f"Kyverno ClusterPolicy {name} {problem}: it protects tenants at admission and must enforce, fail closed and cover them."
    releases = chart_named(resources, "kyverno")
    if not releases:
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


POLICIES = [
    stack_policy(
        "admission-policies-enforced",
        "Every tenant-protecting Kyverno policy exists, enforces, fails closed, times out within 10 s, excludes nothing "
        "and matches its tenants; the Kyverno chart does not fail open or skip tenant namespaces.",
        check_admission_policies_enforced,
    ),
]
