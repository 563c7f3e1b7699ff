"""The hardening checks (issue 21), table-driven over the mutation benchmark's rows: each row
injects one violation into a copy of the dev render, written and read back as `ai-factory check
<dir>` reads it, and the named check must flag it; each control edits the render harmlessly and
nothing may be flagged. The oracle checks (schema, Helm values) are left out: they take most of
the time and none of these rows is theirs."""

from __future__ import annotations

import base64
import copy

import pulumi_kubernetes as k8s
import pytest
from pulumi_policy import PolicyResource
from pulumi_policy.proxy import unknown_checking_proxy

from ai_factory.factory.checking import check
from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.isolation import guarded
from ai_factory.factory.rendering.bundle import load_rendered
from ai_factory.factory.model.tenancy import TENANT_LABEL
from ai_factory.policies.aif_policies.kube import Cluster
from ai_factory.policies.aif_policies.network import NAMESPACE_KEYS, cidr_problem, fqdn_problem, tenant_egress
from ai_factory.policies.aif_policies.workloads import covers
from benchmarks.violations import CONTROLS, MUTATIONS, Bundle, dev_bundle
from tests.conftest import one
from tests.policy_stacks import stack, violations

SLOW = {"schema", "helm_values"}


@pytest.fixture(scope="module")
def base() -> Bundle:
    return dev_bundle()


def fast_findings(base: Bundle, mutate, tmp_path) -> list[Finding]:
    bundle = copy.deepcopy(base)
    mutate(bundle)
    bundle.write(tmp_path)
    rendered = load_rendered(tmp_path)
    return sorted({f for c in check.checks(rendered) if getattr(c, "__name__", "") not in SLOW for f in guarded(c)(rendered, None)})


def test_the_dev_render_passes_the_fast_checks(base, tmp_path):
    assert fast_findings(base, lambda b: None, tmp_path) == []


@pytest.mark.parametrize("family, what, expected, mutate", MUTATIONS, ids=[f"{m[0]}: {m[1]}" for m in MUTATIONS])
def test_flags_the_injected_violation(base, tmp_path, family, what, expected, mutate):
    found = fast_findings(base, mutate, tmp_path)
    assert any(f.check == expected for f in found), [str(f) for f in found]


@pytest.mark.parametrize("what, mutate", CONTROLS, ids=[c[0] for c in CONTROLS])
def test_accepts_the_harmless_edit(base, tmp_path, what, mutate):
    assert [str(f) for f in fast_findings(base, mutate, tmp_path)] == []


@pytest.mark.parametrize(
    "cidr, flagged",
    [("0.0.0.0/0", True), ("::/0", True), ("10.1.0.0/16", True), ("172.20.0.0/16", True), ("100.64.0.1/32", True),
     ("fd00::/8", True), ("0.0.0.0/1", True), ("nonsense", True), ("203.0.113.0/24", False), ("8.8.8.8/32", False), ("2001:db8::/32", False)],
)
def test_egress_address_blocks(cidr, flagged):
    assert (cidr_problem(cidr) is not None) is flagged


@pytest.mark.parametrize(
    "pattern, flagged",
    [("*", True), ("*.*", True), ("*.com", True), ("example.*", True), ("api.*.com", True),
     ("*.example.com", False), ("api.example.com", False), ("*.models.example.org", False)],
)
def test_egress_dns_patterns(pattern, flagged):
    assert (fqdn_problem(pattern) is not None) is flagged


def _resource(kind: str, api: str, name: str, namespace: str | None = None, labels: dict | None = None, spec: dict | None = None) -> PolicyResource:
    props = {"apiVersion": api, "kind": kind, "metadata": {"name": name, **({"namespace": namespace} if namespace else {}), "labels": labels or {}}, "spec": spec or {}}
    return PolicyResource(f"kubernetes:{api if '/' in api else 'core/' + api}:{kind}", unknown_checking_proxy(props), name, name, None, None, None, [], {})


EGRESS_NAMESPACES = [("a-1", "a"), ("a-2", "a"), ("b-1", "b"), ("c-1", "c"), ("platform", None)]
ANYWHERE = {"egress": [{"toCIDR": ["10.0.0.0/8"]}]}


@pytest.mark.parametrize(
    "policy, tenants",
    [
        pytest.param(("CiliumClusterwideNetworkPolicy", None, ANYWHERE), ["a", "b", "c"], id="clusterwide-without-namespace-selects-every-tenant"),
        pytest.param(("CiliumClusterwideNetworkPolicy", None, {"endpointSelector": {"matchLabels": {NAMESPACE_KEYS[0]: "b-1"}}, **ANYWHERE}), ["b"], id="clusterwide-one-namespace"),
        pytest.param(
            ("CiliumClusterwideNetworkPolicy", None, {"endpointSelector": {"matchExpressions": [{"key": NAMESPACE_KEYS[1], "operator": "In", "values": ["c-1", "platform", "a-2"]}]}, **ANYWHERE}),
            ["a", "c"],
            id="clusterwide-namespaces-in-tenant-order",
        ),
        pytest.param(("CiliumClusterwideNetworkPolicy", None, {"endpointSelector": {"matchLabels": {NAMESPACE_KEYS[0]: "platform"}}, **ANYWHERE}), [], id="clusterwide-platform-namespace"),
        pytest.param(("CiliumNetworkPolicy", "a-2", ANYWHERE), ["a"], id="namespaced-its-tenant"),
        pytest.param(("CiliumNetworkPolicy", "platform", ANYWHERE), [], id="namespaced-platform"),
    ],
)
def test_egress_rules_apply_to_the_tenants_whose_namespaces_a_policy_selects(policy, tenants):
    kind, namespace, spec = policy
    resources = [_resource("Namespace", "v1", ns, labels={TENANT_LABEL: t} if t else {}) for ns, t in EGRESS_NAMESPACES]
    resources.append(_resource(kind, "cilium.io/v2", "egress", namespace, spec=spec))
    assert [(t.name, list(rule["toCIDR"])) for _, t, rule, _ in tenant_egress(Cluster(resources))] == [(t, ["10.0.0.0/8"]) for t in tenants]


@pytest.mark.parametrize(
    "allowed, toleration, covered",
    [
        ({"key": "k", "operator": "Equal", "value": "a", "effect": "NoSchedule"}, {"key": "k", "operator": "Equal", "value": "a", "effect": "NoSchedule"}, True),
        ({"key": "k", "operator": "Equal", "value": "a", "effect": "NoSchedule"}, {"key": "k", "value": "a", "effect": "NoSchedule"}, True),
        ({"key": "k", "operator": "Equal", "value": "a", "effect": "NoSchedule"}, {"key": "k", "operator": "Exists", "effect": "NoSchedule"}, False),
        ({"key": "k", "operator": "Equal", "value": "a", "effect": "NoSchedule"}, {"key": "k", "operator": "Equal", "value": "b", "effect": "NoSchedule"}, False),
        ({"key": "k", "operator": "Equal", "value": "a", "effect": "NoSchedule"}, {"key": "k", "operator": "Equal", "value": "a"}, False),
        ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, {"key": "k", "operator": "Exists", "effect": "NoExecute"}, True),
        ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, {"key": "other", "operator": "Exists", "effect": "NoExecute"}, False),
    ],
)
def test_a_whitelist_entry_covers_only_its_subsets(allowed, toleration, covered):
    assert covers(allowed, toleration) is covered


def test_a_tenant_stack_holding_only_its_namespace_and_policy_passes_the_admission_check(dev):
    namespace, policy = one(dev, "Namespace", "tenant-search"), one(dev, "ClusterPolicy", "tenant-search-admission")

    def tenant_stack() -> None:
        k8s.core.v1.Namespace("namespace", metadata=namespace["metadata"])
        k8s.apiextensions.CustomResource("admission", api_version="kyverno.io/v1", kind="ClusterPolicy", metadata=policy["metadata"], spec=policy["spec"])

    assert violations(stack(tenant_stack), "admission-policies-enforced") == {}

    def without_its_policy() -> None:
        k8s.core.v1.Namespace("namespace", metadata=namespace["metadata"])

    assert list(violations(stack(without_its_policy), "admission-policies-enforced")) == ["kubernetes:core/v1:Namespace::namespace"]


def test_a_secret_a_chart_makes_at_install_is_not_a_secret_written_in_the_bundle():
    from ai_factory.factory.checking.hardening import bundle_secrets
    from ai_factory.factory.rendering.bundle import Manifest, Rendered
    from ai_factory.factory.rendering.charts import CHART_ORIGIN

    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hubble-server-certs", "namespace": "kube-system"}, "data": {"tls.key": "LS0t"}}
    chart_made = Manifest(secret, "cilium", None, f"{CHART_ORIGIN}cilium-1.20.0:kube-system/cilium")
    written = Manifest(secret, "cilium", None, "kubernetes:core/v1:Secret::ai-factory-cilium-certs")
    tenants = Manifest(secret, "tenant-search", "search", "kubernetes:core/v1:Secret::tenant-search-certs")
    findings = bundle_secrets(Rendered(None, "1.34", [chart_made, written, tenants], []), None)
    assert [(f.check, f.tenants) for f in findings] == [("bundle-secrets", ()), ("bundle-secrets", ("search",))]


PEM_KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\n"
CHART_SECRETS = [
    # (row, origin, field, values, flagged)
    ("flags a chart's base64 private key", "chart", "data", {"tls.key": base64.b64encode(PEM_KEY.encode()).decode()}, ["tls.key"]),
    ("flags a chart's EC private key in stringData", "chart", "stringData", {"key.pem": PEM_KEY.replace("RSA", "EC")}, ["key.pem"]),
    ("flags a PKCS#8 key among other values", "chart", "data", {"ca.crt": "Y2VydA==", "tls.key": base64.b64encode(b"-----BEGIN PRIVATE KEY-----").decode()}, ["tls.key"]),
    ("accepts a chart's certificate without its key", "chart", "data", {"ca.crt": base64.b64encode(b"-----BEGIN CERTIFICATE-----").decode()}, []),
    ("accepts a chart's empty Secret its controller fills", "chart", "data", {}, []),
    ("accepts a value that is not base64 text", "chart", "data", {"token": "not base64!"}, []),
    ("accepts a value that is not a string", "chart", "data", {"tls.key": None}, []),
    ("leaves the library's own Secrets to bundle-secrets", "library", "data", {"tls.key": base64.b64encode(PEM_KEY.encode()).decode()}, []),
]


@pytest.mark.parametrize("origin, field, values, flagged", [r[1:] for r in CHART_SECRETS], ids=[r[0] for r in CHART_SECRETS])
def test_chart_generated_keys(origin, field, values, flagged):
    from ai_factory.factory.checking.hardening import chart_generated_keys
    from ai_factory.factory.rendering.bundle import Manifest, Rendered
    from ai_factory.factory.rendering.charts import CHART_ORIGIN

    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hubble-server-certs", "namespace": "kube-system"}, field: values}
    where = f"{CHART_ORIGIN}cilium-1.20.0:kube-system/cilium" if origin == "chart" else "kubernetes:core/v1:Secret::ai-factory-cilium-certs"
    findings = list(chart_generated_keys(Rendered(None, "1.34", [Manifest(secret, "cilium", None, where)], []), None))
    assert [f.message.split(" into ")[0].removeprefix("the chart generates private key(s) ").split(", ") for f in findings] == ([flagged] if flagged else [])
