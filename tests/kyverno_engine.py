"""A Kyverno `ClusterPolicy` evaluator for the admission tests: the subset of Kyverno 1.19's
validate rules the platform's policies use, evaluated as Kyverno evaluates them.

Why not Kyverno itself: its CLI (`kyverno apply`/`kyverno test`) is a Go binary published on
GitHub releases and as a container image only; no package registry this project can use (PyPI,
npm, Debian) ships it, and there is no Go toolchain to build it. So the rendered policies are
read here by the same rules the engine applies (kyverno.io docs: "Validate Rules", "Preconditions",
"Operators", "Anchors", "foreach"), with the real JMESPath implementation (`jmespath` on PyPI: the
language Kyverno's `{{ }}` variables are written in; the functions used, `keys`, `length`,
`starts_with`, are standard JMESPath). Anything outside the subset (an operator, anchor or
sub-rule not listed) raises `Unsupported`, so a policy the evaluator cannot read fails its test
instead of passing silently.

Supported: `match.any[].resources` (`kinds` with `Pod/ephemeralcontainers`, `namespaces` with
wildcards, `namespaceSelector`, `operations`); rule `preconditions`; `validate.pattern` (the
`=()` conditional and `X()` negation anchors, `|` alternatives, `!` negation, `*`/`?` wildcards,
one-item list patterns applying to every item); `validate.deny.conditions`; `validate.foreach`
(`list`, `preconditions`, `deny`); operators Equals, NotEquals, AnyIn, AllIn, AnyNotIn, AllNotIn,
GreaterThan, LessThan (the In family matches the value's wildcards); `failureAction` (only Enforce
refuses); `exclude.any[].subjects` (service accounts, on `request.userInfo.username`); `request.oldObject` of
an UPDATE; `podSecurity`, with the Pod Security controls of `policies/aif_policies/workloads.py`
and `security.py` standing in for the upstream library Kyverno embeds. A variable that resolves
to nothing is an error, and an erroring rule refuses (Kyverno reports `error` and, in Enforce,
blocks the request).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import jmespath

from ai_factory.policies.aif_policies.kube import containers, selects
from ai_factory.policies.aif_policies.security import host_access
from ai_factory.policies.aif_policies.workloads import security_context_problems

VARIABLE = re.compile(r"\{\{\s*((?:(?!\}\}).)*?)\s*\}\}")


class Unsupported(Exception):
    """A construct outside the evaluated subset."""


class VariableError(Exception):
    """A `{{ }}` variable that resolves to nothing."""


@dataclass
class Request:
    """One admission request: the object, its namespace's labels, the operation and subresource."""

    object: dict[str, Any]
    namespace_labels: dict[str, str] = field(default_factory=dict)
    operation: str = "CREATE"
    subresource: str = ""
    username: str = "tenant-user"
    """Who sends it (`request.userInfo.username`; a service account is `system:serviceaccount:<ns>:<name>`)."""
    old_object: dict[str, Any] | None = None
    """The object before an UPDATE (`request.oldObject`)."""

    @property
    def kind(self) -> str:
        kind = self.object["kind"]
        return f"{kind}/{self.subresource}" if self.subresource else kind

    @property
    def namespace(self) -> str:
        return self.object["metadata"].get("namespace", "")

    def context(self) -> dict[str, Any]:
        request = {"object": self.object, "operation": self.operation, "namespace": self.namespace, "userInfo": {"username": self.username}}
        if self.old_object is not None:
            request["oldObject"] = self.old_object
        return {"request": request}


def _search(expression: str, context: dict[str, Any]) -> Any:
    result = jmespath.search(expression, context)
    if result is None:
        raise VariableError(f"{expression!r} resolves to nothing")
    return result


def substitute(value: Any, context: dict[str, Any]) -> Any:
    """Kyverno variable substitution: a string that is one variable becomes its value (of any type);
    variables inside a longer string are replaced by their text."""
    if isinstance(value, str):
        whole = VARIABLE.fullmatch(value.strip())
        if whole:
            return _search(whole.group(1), context)
        return VARIABLE.sub(lambda m: _text(_search(m.group(1), context)), value)
    if isinstance(value, list):
        return [substitute(v, context) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, context) for k, v in value.items()}
    return value


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _in(key: Any, values: list[Any]) -> bool:
    return any(fnmatchcase(str(key), str(v)) if isinstance(v, str) else key == v for v in values)


def _number(value: Any) -> float:
    return float(value)


OPERATORS = {
    "Equals": lambda key, value: key == value,
    "NotEquals": lambda key, value: key != value,
    "AnyIn": lambda key, value: any(_in(k, _items(value)) for k in _items(key)),
    "AllIn": lambda key, value: all(_in(k, _items(value)) for k in _items(key)),
    "AnyNotIn": lambda key, value: any(not _in(k, _items(value)) for k in _items(key)),
    "AllNotIn": lambda key, value: all(not _in(k, _items(value)) for k in _items(key)),
    "GreaterThan": lambda key, value: _number(key) > _number(value),
    "LessThan": lambda key, value: _number(key) < _number(value),
}


def condition_holds(condition: dict[str, Any], context: dict[str, Any]) -> bool:
    operator = condition["operator"]
    if operator not in OPERATORS:
        raise Unsupported(f"operator {operator}")
    return OPERATORS[operator](substitute(condition["key"], context), substitute(condition.get("value"), context))


def conditions_hold(block: Any, context: dict[str, Any]) -> bool:
    """`{any: [...], all: [...]}` (both must hold when both are given), or a plain list (all)."""
    if isinstance(block, list):
        return all(condition_holds(c, context) for c in block)
    unknown = set(block) - {"any", "all"}
    if unknown:
        raise Unsupported(f"condition block {sorted(unknown)}")
    any_ok = any(condition_holds(c, context) for c in block["any"]) if "any" in block else True
    all_ok = all(condition_holds(c, context) for c in block["all"]) if "all" in block else True
    return any_ok and all_ok


# --------------------------------------------------------------------------- patterns


def _scalar_matches(value: Any, pattern: str) -> bool:
    alternatives = [a.strip() for a in pattern.split("|")]
    return any(_one_matches(value, a) for a in alternatives)


def _one_matches(value: Any, pattern: str) -> bool:
    if "&" in pattern or pattern[:2] in (">=", "<=") or pattern[:1] in (">", "<"):
        raise Unsupported(f"pattern operator in {pattern!r}")
    if pattern.startswith("!"):
        return not _one_matches(value, pattern[1:])
    if value is None or isinstance(value, (dict, list)):
        return False
    return fnmatchcase(_text(value), pattern)


def pattern_matches(resource: Any, pattern: Any) -> bool:
    if isinstance(pattern, dict):
        if not isinstance(resource, dict):
            return False
        for key, sub in pattern.items():
            if key.startswith("=(") and key.endswith(")"):
                name = key[2:-1]
                if name in resource and not pattern_matches(resource[name], sub):
                    return False
            elif key.startswith("X(") and key.endswith(")"):
                if resource.get(key[2:-1]) is not None:
                    return False
            elif key[:2] in ("^(", "<(", "+(") or key[:1] == "(":
                raise Unsupported(f"anchor {key}")
            elif key not in resource or not pattern_matches(resource[key], sub):
                return False
        return True
    if isinstance(pattern, list):
        if len(pattern) != 1:
            raise Unsupported("list pattern of several items")
        return isinstance(resource, list) and all(pattern_matches(item, pattern[0]) for item in resource)
    if isinstance(pattern, str):
        return _scalar_matches(resource, pattern)
    return resource == pattern


# --------------------------------------------------------------------------- rules


def rule_matches(rule: dict[str, Any], request: Request) -> bool:
    match = rule["match"]
    if set(match) - {"any"}:
        raise Unsupported(f"match {sorted(match)}")
    if "exclude" in rule and excluded(rule["exclude"], request):
        return False
    for block in match["any"]:
        resources = block["resources"]
        if set(resources) - {"kinds", "namespaces", "namespaceSelector", "operations"}:
            raise Unsupported(f"resource filter {sorted(resources)}")
        if request.kind not in resources["kinds"]:
            continue
        if "operations" in resources and request.operation not in resources["operations"]:
            continue
        if "namespaces" in resources and not any(fnmatchcase(request.namespace, n) for n in resources["namespaces"]):
            continue
        labels = {**request.namespace_labels, "kubernetes.io/metadata.name": request.namespace}
        if "namespaceSelector" in resources and not selects(resources["namespaceSelector"], labels):
            continue
        return True
    return False


def excluded(exclude: dict[str, Any], request: Request) -> bool:
    """`exclude.any[].subjects`: service accounts named exactly (Kyverno matches a subject of kind
    ServiceAccount on the request's `system:serviceaccount:<namespace>:<name>` user)."""
    if set(exclude) - {"any"}:
        raise Unsupported(f"exclude {sorted(exclude)}")
    for block in exclude["any"]:
        if set(block) - {"subjects"}:
            raise Unsupported(f"exclude filter {sorted(block)}")
        for subject in block["subjects"]:
            if subject.get("kind") != "ServiceAccount":
                raise Unsupported(f"exclude subject {subject.get('kind')}")
            if request.username == f"system:serviceaccount:{subject['namespace']}:{subject['name']}":
                return True
    return False


def pod_security_denies(level: str, pod_spec: dict[str, Any]) -> bool:
    problems = list(security_context_problems(pod_spec, level, read_only_root=False)) + list(host_access(pod_spec))
    problems += [v["name"] for v in pod_spec.get("volumes") or [] if "hostPath" in v]
    problems += [c["name"] for c in containers(pod_spec) if (c.get("securityContext") or {}).get("privileged")]
    return bool(problems)


def validate_denies(validate: dict[str, Any], request: Request, context: dict[str, Any]) -> bool:
    """Whether a validate rule fails for the request (before its failure action)."""
    known = {"failureAction", "message", "pattern", "deny", "foreach", "podSecurity"}
    if set(validate) - known:
        raise Unsupported(f"validate {sorted(set(validate) - known)}")
    if "pattern" in validate and not pattern_matches(request.object, validate["pattern"]):
        return True
    if "deny" in validate and conditions_hold(validate["deny"]["conditions"], context):
        return True
    for each in validate.get("foreach", []):
        if set(each) - {"list", "preconditions", "deny"}:
            raise Unsupported(f"foreach {sorted(each)}")
        for index, element in enumerate(_items(jmespath.search(each["list"], context) or [])):
            scoped = {**context, "element": element, "elementIndex": index}
            if "preconditions" in each and not conditions_hold(each["preconditions"], scoped):
                continue
            if conditions_hold(each["deny"]["conditions"], scoped):
                return True
    if "podSecurity" in validate:
        return pod_security_denies(validate["podSecurity"]["level"], request.object["spec"])
    return False


def refusals(policies: list[dict[str, Any]], request: Request) -> list[str]:
    """`policy/rule` of every enforced rule that refuses the request."""
    refused = []
    for policy in policies:
        spec = policy["spec"]
        if spec.get("admission") is False:
            continue
        for rule in spec["rules"]:
            if not rule_matches(rule, request):
                continue
            context = request.context()
            try:
                if "preconditions" in rule and not conditions_hold(rule["preconditions"], context):
                    continue
                denied = validate_denies(rule["validate"], request, context)
            except VariableError:
                denied = True
            if denied and rule["validate"].get("failureAction", spec.get("validationFailureAction")) == "Enforce":
                refused.append(f"{policy['metadata']['name']}/{rule['name']}")
    return refused
