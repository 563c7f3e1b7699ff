"""The pack's `remediation-rbac` (policies/aif_policies/remediation.py): rows of bindings it flags
and accepts on small stacks (a health component's namespaces, real RBAC resources under mocks),
and the real program failing the pack when the remediation step's role is broken."""

from __future__ import annotations

import copy

import pulumi
import pulumi_kubernetes as k8s
import pytest

from ai_factory.components import _gpu_remediation as step
from ai_factory.components import health
from tests.conftest import render
from tests.policy_stacks import RBAC, namespace, stack, violations

POLICY = "remediation-rbac"
HOME = "medik8s"
EVICT = {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}
CORDON = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}


def account(ns: str = HOME, name: str = "step") -> dict:
    return {"kind": "ServiceAccount", "name": name, "namespace": ns}


def rbac(rules: list[dict] | None, subject: dict | list[dict], *, scope: str | None = None, role_kind: str = "ClusterRole", role_labels=None, aggregate=None) -> None:
    """A role (unless `rules` is None) and its binding: cluster-wide, or in namespace `scope`."""
    meta = {"name": "r"} if role_kind == "ClusterRole" else {"name": "r", "namespace": scope}
    if rules is not None and role_kind == "ClusterRole":
        k8s.rbac.v1.ClusterRole("role", metadata={**meta, "labels": role_labels or {}}, rules=rules, aggregation_rule=aggregate)
    elif rules is not None:
        k8s.rbac.v1.Role("role", metadata=meta, rules=rules)
    binding_meta = {"name": "b"} if scope is None else {"name": "b", "namespace": scope}
    kind = k8s.rbac.v1.ClusterRoleBinding if scope is None else k8s.rbac.v1.RoleBinding
    subjects = subject if isinstance(subject, list) else [subject]
    kind("binding", metadata=binding_meta, role_ref={"apiGroup": RBAC, "kind": role_kind, "name": "r"}, subjects=subjects)


def program(build) -> None:
    parent = pulumi.ComponentResource(health.TOKEN, "health")
    namespace(HOME, level="privileged", parent=parent)
    namespace("elsewhere")
    build()


ROWS = [
    # (id, build, expected message fragment or None for accepted)
    ("step-rules-accepted", lambda: rbac(step.RBAC_RULES, account()), None),
    ("evict-and-cordon-accepted", lambda: rbac([EVICT, CORDON], account()), None),
    ("own-namespace-secrets-accepted", lambda: rbac([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}], account(), scope=HOME, role_kind="Role"), None),
    ("other-namespaces-account-not-judged", lambda: rbac([{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}], account("elsewhere")), None),
    ("user-not-judged", lambda: rbac([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}], {"kind": "User", "name": "ops", "apiGroup": RBAC}), None),
    ("group-named-like-the-namespace-not-judged",
     lambda: rbac([{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}], {"kind": "Group", "name": HOME, "apiGroup": RBAC}), None),
    ("unselected-role-not-aggregated-accepted", lambda: (
        k8s.rbac.v1.ClusterRole("piece", metadata={"name": "piece", "labels": {"agg": "yes"}}, rules=[{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]),
        rbac([EVICT], account(), aggregate={"clusterRoleSelectors": [{"matchLabels": {"agg": "yes", "team": "remediation"}}]}),
    ), None),
    ("health-account-after-another-flagged",
     lambda: rbac([{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}], [account("elsewhere"), account()]), "ServiceAccount medik8s/step"),
    ("deleting-pods-flagged", lambda: rbac([EVICT, {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete"]}], account()), "deletes pods in every namespace"),
    ("deleting-pods-by-collection-flagged", lambda: rbac([{"apiGroups": [""], "resources": ["pods"], "verbs": ["deletecollection"]}], account()), "deletes pods"),
    ("secrets-cluster-wide-flagged", lambda: rbac([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}], account()), "reads Secrets in every namespace"),
    ("secrets-of-another-namespace-flagged",
     lambda: rbac([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["watch"]}], account(), scope="elsewhere", role_kind="Role"), "reads Secrets in namespace elsewhere"),
    ("wildcard-resources-flagged", lambda: rbac([{"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}], account()), "wildcard resources"),
    ("wildcard-groups-flagged", lambda: rbac([{"apiGroups": ["*"], "resources": ["nodes"], "verbs": ["get"]}], account()), "wildcard apiGroups"),
    ("escalation-flagged", lambda: rbac([{"apiGroups": [RBAC], "resources": ["clusterroles"], "verbs": ["bind"]}], account()), "verb bind"),
    ("namespace-group-flagged", lambda: rbac([{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}], {"kind": "Group", "name": f"system:serviceaccounts:{HOME}", "apiGroup": RBAC}),
     "Group system:serviceaccounts:medik8s of the health layer"),
    ("undefined-role-flagged", lambda: rbac(None, account()), "which the stack does not define"),
    ("aggregated-delete-flagged", lambda: (
        k8s.rbac.v1.ClusterRole("piece", metadata={"name": "piece", "labels": {"agg": "yes"}}, rules=[{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]),
        rbac([], account(), aggregate={"clusterRoleSelectors": [{"matchLabels": {"agg": "yes"}}]}),
    ), "deletes pods"),
]


@pytest.mark.parametrize("build, expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_remediation_rbac_flags_and_accepts(build, expected):
    found = violations(stack(lambda: program(build)), POLICY)
    if expected is None:
        assert found == {}
    else:
        (messages,) = found.values()
        assert any(expected in m for m in messages), messages


def test_each_health_account_bound_to_an_undefined_role_is_reported():
    found = violations(stack(lambda: program(lambda: rbac(None, [account(), account(name="other")]))), POLICY)
    (messages,) = found.values()
    assert len(messages) == 2 and "medik8s/other" in messages[1]


def test_the_pack_fails_the_program_whose_remediation_step_deletes_pods(dev_raw, monkeypatch):
    broken = [*step.RBAC_RULES, {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]
    monkeypatch.setattr(step, "RBAC_RULES", broken)
    found = violations(render(copy.deepcopy(dev_raw[0])), POLICY)
    binding = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding::ai-factory-health-step-binding"
    assert list(found) == [binding]
    assert "grants ServiceAccount medik8s/ai-factory-gpu-remediation of the health layer ClusterRole ai-factory-gpu-remediation with deletes pods" in found[binding][0]
