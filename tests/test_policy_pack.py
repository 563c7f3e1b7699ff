"""The pack itself: its entry point registers every policy, its module imports without starting
the analyzer server, the pack and `factory check` report the same names and messages, its
configuration file fits the policies, and the README documents every policy."""

from __future__ import annotations

import ast
import json
import pkgutil
import runpy
import subprocess
import sys
from typing import Any

import jsonschema
import pulumi
import pulumi_kubernetes as k8s
import pulumi_policy
import pytest
import yaml
from google.protobuf import struct_pb2
from pulumi.runtime.proto import analyzer_pb2
from pulumi_policy import EnforcementLevel, ResourceValidationArgs
from pulumi_policy.policy import _PolicyAnalyzerServicer
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, UnknownValueError, unknown_checking_proxy

import ai_factory.policies.aif_policies
from ai_factory.factory.checking import policies as policy_check
from ai_factory.factory.checking.check import CHECKS
from ai_factory.factory.checking.policies import OfflineOptions, policy_config, resources_from_graph, run_policies
from ai_factory.factory.rendering.bundle import load_rendered, render_env
from ai_factory.factory.rendering.harness import Graph
from ai_factory.policies.aif_policies import PACK_NAME, POLICIES
from tests.fleet_env import one_cluster
from tests.conftest import REPO
from tests.policy_stacks import deployment, group, namespace, release, role_binding, stack, tenant_labels

POLICY_DIR = REPO / "policies"


def rule_functions() -> set[str]:
    """Every `check_*` rule defined in the policy modules."""
    names = set()
    for module in pkgutil.iter_modules(ai_factory.policies.aif_policies.__path__):
        tree = ast.parse((POLICY_DIR / "aif_policies" / f"{module.name}.py").read_text())
        names |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("check_")}
    return names


def test_pack_registers_every_policy_of_the_module(monkeypatch):
    registered: dict[str, Any] = {}

    def fake_pack(name, policies, enforcement_level=None, **_):
        registered.update(name=name, policies=policies, level=enforcement_level)

    monkeypatch.setattr(pulumi_policy, "PolicyPack", fake_pack)
    runpy.run_path(str(POLICY_DIR / "__main__.py"), run_name="__main__")
    names = [p.name for p in registered["policies"]]
    assert registered["name"] == PACK_NAME
    assert len(names) == len(set(names))
    assert {"check_" + n.replace("-", "_") for n in names} == rule_functions()


def test_policy_module_imports_without_starting_a_server():
    # PolicyPack(...) would print a port and block forever: the import must return at once.
    done = subprocess.run(
        [sys.executable, "-c", "import ai_factory.policies.aif_policies as p; print(len(p.POLICIES))"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(len(POLICIES))


# --------------------------------------------------------------------------- the pack and the offline run agree


def broken_stack():
    namespace("tenant-a", tenant="a", owners=("a-admins",))
    namespace("tenant-b", tenant="b", owners=("b-admins",), level=None)
    role_binding("foreign", "tenant-a", ("ClusterRole", "edit"), [group("b-admins")], tenant_labels("a"))
    deployment("miner", "tenant-a", {"image": "miner:latest", "env": [{"name": "LD_PRELOAD", "value": "/x.so"}], "securityContext": {"privileged": True}})
    release("keycloak", "keycloakx", "keycloak", {"auth": {"adminPassword": "hunter2"}}, version="7.x", repo="https://charts.example.com")
    k8s.core.v1.PersistentVolumeClaim(
        "data", metadata={"name": "data", "namespace": "tenant-a", "labels": tenant_labels("a")},
        spec={"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    )


def _struct(props: Any) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(json.loads(json.dumps(props)))
    return struct


def pack_diagnostics(graph) -> set[tuple[str, str, str, int]]:
    """What the real analyzer (the servicer `PolicyPack` serves) reports: (policy, URN, message, level)."""
    servicer = _PolicyAnalyzerServicer(PACK_NAME, "0.1.0", POLICIES, EnforcementLevel.MANDATORY)
    found = set()
    for r in graph.resources:
        options = analyzer_pb2.AnalyzerResourceOptions(protect=r.protect, parent=r.parent_urn)
        request = analyzer_pb2.AnalyzeRequest(type=r.type, properties=_struct(r.inputs), urn=r.urn, name=r.name, options=options)
        found |= {(d.policyName, r.urn, d.message, d.enforcementLevel) for d in servicer.Analyze(request, None).diagnostics}
    resources = [
        analyzer_pb2.AnalyzerResource(
            type=r.type, properties=_struct(r.inputs), urn=r.urn, name=r.name, parent=r.parent_urn, dependencies=r.dependency_urns,
            options=analyzer_pb2.AnalyzerResourceOptions(protect=r.protect, parent=r.parent_urn),
        )
        for r in graph.resources
    ]
    stack_response = servicer.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=resources), None)
    return found | {(d.policyName, d.urn, d.message, d.enforcementLevel) for d in stack_response.diagnostics}


def test_pack_and_offline_run_report_the_same_policies_and_messages():
    graph = stack(broken_stack)
    resources, _ = resources_from_graph(graph)
    descriptions = {p.name: p.description for p in POLICIES}
    levels = {p.name: p.enforcement_level for p in POLICIES}
    level_codes = {EnforcementLevel.MANDATORY: analyzer_pb2.MANDATORY, EnforcementLevel.ADVISORY: analyzer_pb2.ADVISORY}
    offline = {
        (name, resource.urn, f"{descriptions[name]}\n{message}", level_codes[levels[name]])
        for name, resource, message in run_policies(resources, {})
    }
    assert {name for name, *_ in offline} >= {
        "no-cross-tenant-rbac", "tenant-cannot-edit-isolation", "namespace-pod-security", "no-privileged-outside-allowlist",
        "no-gpu-escape-variables", "images-pinned", "no-plaintext-secrets", "charts-pinned", "stateful-resources-protected",
    }
    assert pack_diagnostics(graph) == offline


def linked_stack():
    platform = pulumi.ComponentResource("ai-factory:index:Platform", "platform")
    ns = k8s.core.v1.Namespace("tenant-a", metadata={"name": "tenant-a"}, opts=pulumi.ResourceOptions(parent=platform))
    k8s.core.v1.ConfigMap("settings", metadata={"name": "settings", "namespace": "tenant-a"}, opts=pulumi.ResourceOptions(parent=platform, depends_on=[ns]))
    k8s.core.v1.ConfigMap("after-all", metadata={"name": "after-all", "namespace": "tenant-a"}, opts=pulumi.ResourceOptions(depends_on=[platform]))


def links(resources) -> dict[str, tuple[str | None, list[str]]]:
    return {r.urn: (r.parent.urn if r.parent else None, sorted(d.urn for d in r.dependencies)) for r in resources}


@pytest.mark.parametrize("part", [False, True], ids=["whole", "a-part-without-the-namespace"])
def test_the_offline_run_links_each_resource_to_its_parent_and_dependencies_as_the_engine_does(part):
    graph = stack(linked_stack)
    if part:  # as a check's part: links into the rest of the render, which the engine would not see, left out
        graph = Graph.subset([r for r in graph.resources if r.type != "kubernetes:core/v1:Namespace"])
    seen = []
    policy = pulumi_policy.StackValidationPolicy(name="links", description="links", validate=lambda args, report: seen.append(links(args.resources)))
    request = analyzer_pb2.AnalyzeStackRequest(resources=[
        analyzer_pb2.AnalyzerResource(type=r.type, properties=_struct(r.inputs), urn=r.urn, name=r.name, parent=r.parent_urn, dependencies=r.dependency_urns)
        for r in graph.resources
    ])
    _PolicyAnalyzerServicer(PACK_NAME, "0.1.0", [policy], EnforcementLevel.MANDATORY).AnalyzeStack(request, None)
    offline = links(resources_from_graph(graph)[0])
    assert offline == seen[0]
    assert any(parent for parent, _ in offline.values()) and any(dependencies for _, dependencies in offline.values())


def test_a_value_unknown_during_preview_is_not_guessed():
    policy = next(p for p in POLICIES if p.name == "no-privileged-outside-allowlist")
    props = unknown_checking_proxy({"metadata": {"name": "app", "namespace": UNKNOWN_STRING_VALUE}, "spec": {}})
    args = ResourceValidationArgs("kubernetes:apps/v1:Deployment", props, "urn", "app", OfflineOptions(False, False, None), None, {})
    with pytest.raises(UnknownValueError):
        policy.validate(args, lambda message, urn=None: None)


# --------------------------------------------------------------------------- configuration


def test_pack_config_file_sets_only_known_settings_of_known_policies():
    config = json.loads((POLICY_DIR / "config.dev.json").read_text())
    schemas = {p.name: p.config_schema for p in POLICIES}
    for name, settings in config.items():
        assert name in schemas, f"config.dev.json configures unknown policy {name!r}"
        settings = {k: v for k, v in settings.items() if k != "enforcementLevel"}
        schema = schemas[name]
        assert schema is not None or not settings, name
        if settings:
            jsonschema.validate(settings, {"type": "object", "properties": schema.properties, "additionalProperties": False})


def test_offline_run_honours_the_stacks_pack_config(tmp_path):
    (tmp_path / "config.review.json").write_text(json.dumps({"images-pinned": "disabled", "charts-pinned": {"additionalRepositories": ["https://charts.example.com"]}}))
    resources, _ = resources_from_graph(stack(broken_stack))
    names = {name for name, _, _ in run_policies(resources, policy_config("review", tmp_path))}
    assert "images-pinned" not in names and "no-plaintext-secrets" in names
    charts = [m for n, _, m in run_policies(resources, policy_config("review", tmp_path)) if n == "charts-pinned"]
    assert charts and not any("repository" in m for m in charts)  # the mirror is known; the version range is not


# --------------------------------------------------------------------------- factory check and the README


def test_factory_check_reports_the_pack_violations_for_an_environment_and_its_render(tmp_path):
    document = one_cluster(yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text()))  # one render
    document["config"]["ai-factory:layers"]["gpu_operator"]["chart"] = {"version": "v25.0.0", "repository": "https://charts.example.com/nvidia"}
    stack_file = tmp_path / "Pulumi.broken.yaml"
    stack_file.write_text(yaml.safe_dump(document))
    release = "kubernetes:helm.sh/v3:Release::ai-factory-gpu-operator-release-gpu-operator: Helm release gpu-operator/gpu-operator (chart gpu-operator): "
    expected = [
        "charts-pinned: " + release + "repository https://charts.example.com/nvidia is not a repository of the catalog",
        "gpu-operator-secure-toolkit: " + release + "chart version 'v25.0.0' is older than v25.3.1",
    ]
    assert policy_check.resource_policies in CHECKS and policy_check.stack_policies in CHECKS
    rendered = render_env(str(stack_file))
    from_environment = sorted(str(f) for f in policy_check.policies(rendered, None))
    assert [line[: len(e)] for line, e in zip(from_environment, expected)] == expected and len(from_environment) == 2
    rendered.write(tmp_path / "rendered")
    assert sorted(str(f) for f in policy_check.policies(load_rendered(tmp_path / "rendered"), None)) == from_environment


def test_readme_documents_every_policy_with_its_level():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Policies", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[3].strip() for line in section.splitlines() if line.startswith("| `")}
    assert rows == {p.name: p.enforcement_level.value for p in POLICIES}
    assert "--policy-pack-config policies/config.dev.json" in section



def test_every_policy_setting_is_typed_described_and_defaulted_validly():
    for policy in POLICIES:
        for name, schema in (policy.config_schema.properties if policy.config_schema else {}).items():
            assert schema["type"] in ("string", "boolean", "array") and schema["description"], (policy.name, name)
            assert schema["type"] != "array" or schema["items"] == {"type": "string"}, (policy.name, name)
            jsonschema.validate(schema["default"], schema)
