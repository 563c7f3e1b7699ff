"""The shared inference Gateway, LiteLLM and the serving path's isolation: config rules, what the
render holds, and the offline checks that prove no tenant reaches another's routes or models."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from ai_factory.factory.checking.routing import gateway_routes, litellm_reach, model_ingress
from ai_factory.factory.model.loading import ConfigError, validate
from ai_factory.factory.rendering.bundle import Rendered
from tests.conftest import render


def problems(raw) -> list[str]:
    with pytest.raises(ConfigError) as err:
        validate(raw)
    return err.value.problems


def with_litellm(raw: dict[str, Any]) -> dict[str, Any]:
    raw["layers"]["litellm"]["enabled"] = True
    return raw


@pytest.fixture(scope="module")
def served(dev_raw) -> Rendered:
    """The dev environment with LiteLLM on."""
    raw = with_litellm(copy.deepcopy(dev_raw[0]))
    return render(raw, dev_raw[1])


def objects(rendered: Rendered, kind: str) -> dict[str, dict[str, Any]]:
    return {m.name: m.obj for m in rendered.manifests if m.kind == kind}


# --------------------------------------------------------------------------- config


def test_a_hostname_owned_by_another_tenant_is_refused_with_its_path(raw):
    raw["tenants"][1]["hostnames"] = [f"{raw['tenants'][0]['name']}.inference.par1.example.com"]
    assert problems(raw) == [f"tenants[1].hostnames[0]: '{raw['tenants'][0]['name']}.inference.par1.example.com' is already owned by tenant '{raw['tenants'][0]['name']}'; a hostname routes to one tenant only"]


def test_litellm_names_what_it_lacks_and_unknown_references(raw):
    with_litellm(raw)
    del raw["layers"]["litellm"]["master_key"]
    raw["layers"]["litellm"]["budgets"]["nobody"] = {}
    raw["layers"]["litellm"]["shared_models"] = ["no/such-model"]
    found = problems(raw)
    assert "layers.litellm.master_key: required while the layer is enabled" in found
    assert any(p.startswith("layers.litellm.budgets.nobody: unknown tenant") for p in found)
    assert any(p.startswith("layers.litellm.shared_models[0]: 'no/such-model' is no exposed model's served name") for p in found)


# --------------------------------------------------------------------------- render


def test_each_tenant_hostname_is_a_listener_admitting_only_that_tenant(served):
    listeners = [l for g in objects(served, "Gateway").values() for l in g["spec"]["listeners"]]
    routes = objects(served, "HTTPRoute")
    assert routes and len(listeners) == len(routes)
    for route in routes.values():
        tenant = route["metadata"]["labels"]["ai-factory.io/tenant"]
        (listener,) = [l for l in listeners if l["name"] == route["spec"]["parentRefs"][0]["sectionName"]]
        assert listener["allowedRoutes"]["namespaces"]["selector"]["matchLabels"]["ai-factory.io/tenant"] == tenant
        assert route["spec"]["hostnames"] == [listener["hostname"]]


def test_models_sharing_a_served_name_split_its_traffic_by_maximum_replicas(dev_raw):
    from dataclasses import replace

    from ai_factory.components.gateway import Routed, route_rules, routed

    old = routed(validate(dev_raw[0]))[0]
    new = Routed(replace(old.endpoint, model="next", service="next-predictor"), 1)
    (rule,) = route_rules([Routed(old.endpoint, 3), new])
    assert rule["matches"][0]["headers"][0]["value"] == old.endpoint.served_name
    assert {b["name"]: b["weight"] for b in rule["backendRefs"]} == {old.endpoint.service: 3, "next-predictor": 1}


def test_litellm_keys_and_secrets_never_appear_in_the_bundle_or_inventory(served):
    teams = [e for e in served.inventory if e["type"] == "pulumi-python:dynamic:Resource"]
    assert teams and all({"master_key", "openbao_token"} <= set(e["secretInputs"]) for e in teams)
    release = objects(served, "HelmRelease")["litellm"]["spec"]["values"]
    assert release["masterkeySecretName"] == release["db"]["secret"]["name"] == "litellm-secrets"
    # Offline a Pulumi secret renders as the `[secret]` placeholder: none reached LiteLLM's objects.
    assert "[secret]" not in json.dumps([m.obj for m in served.manifests if m.namespace == "litellm"])
    keys = objects(served, "ExternalSecret")["litellm-api-key"]
    assert keys["spec"]["data"][0]["remoteRef"]["key"].startswith("tenants/")


# --------------------------------------------------------------------------- checks


def edit(rendered: Rendered, kind: str, name: str | None, change) -> Rendered:
    clone = copy.deepcopy(Rendered(rendered.config, rendered.kubernetes_version, rendered.manifests, rendered.inventory, kustomizations=rendered.kustomizations))
    target = next(m for m in clone.manifests if m.kind == kind and (name is None or m.name == name))
    change(target.obj)
    return clone


def _first_listener(obj):
    return obj["spec"]["listeners"][0]


def _route_of(rendered: Rendered, index: int) -> str:
    return sorted(objects(rendered, "HTTPRoute"))[index]


def _other_hostname(rendered: Rendered):
    names = sorted(objects(rendered, "HTTPRoute"))
    other = objects(rendered, "HTTPRoute")[names[1]]["spec"]["hostnames"][0]
    return names[0], lambda o: o["spec"]["hostnames"].append(other)


def _foreign_backend(rendered: Rendered):
    names = sorted(objects(rendered, "HTTPRoute"))
    other = objects(rendered, "HTTPRoute")[names[1]]["metadata"]["namespace"]
    return names[0], lambda o: o["spec"]["rules"][0]["backendRefs"][0].update(namespace=other)


def _litellm_policy(o):
    return o["spec"]["egress"]


ROWS = [
    # (id, check, kind, name or a function of the render giving (name, change), change, expected phrase)
    ("listener-open-to-all", gateway_routes, "Gateway", None, lambda o: _first_listener(o)["allowedRoutes"]["namespaces"].update({"from": "All"}), "admits routes of tenants"),
    ("listener-without-hostname", gateway_routes, "Gateway", None, lambda o: _first_listener(o).pop("hostname"), "under every hostname"),
    ("listeners-of-two-tenants-share-a-hostname", gateway_routes, "Gateway", None, lambda o: o["spec"]["listeners"][1].update(hostname=o["spec"]["listeners"][0]["hostname"]), "is claimed by tenants"),
    ("backend-in-a-platform-namespace-without-a-grant", gateway_routes, "HTTPRoute", None, lambda o: o["spec"]["rules"][0]["backendRefs"][0].update(namespace="litellm"), "without a ReferenceGrant"),
    ("route-claims-another-tenants-hostname", gateway_routes, "HTTPRoute", _other_hostname, None, "is claimed by tenants"),
    ("route-to-another-tenant", gateway_routes, "HTTPRoute", _foreign_backend, None, "routes tenant"),
    ("litellm-without-default-deny", litellm_reach, "CiliumClusterwideNetworkPolicy", "litellm-isolation", lambda o: o["spec"].update(enableDefaultDeny={"ingress": True, "egress": False}), "denies LiteLLM's egress"),
    (
        "litellm-to-a-whole-tenant-namespace",
        litellm_reach,
        "CiliumClusterwideNetworkPolicy",
        "litellm-isolation",
        lambda o: [s["matchLabels"].pop("k8s:ai-factory.io/model", None) for r in o["spec"]["egress"] for s in r.get("toEndpoints", []) if "tenant-" in s["matchLabels"].get("k8s:io.kubernetes.pod.namespace", "")],
        "every pod of tenant",
    ),
    (
        "litellm-to-an-unrouted-model",
        litellm_reach,
        "CiliumClusterwideNetworkPolicy",
        "litellm-isolation",
        lambda o: [s["matchLabels"].update({"k8s:ai-factory.io/model": "secret-model"}) for r in o["spec"]["egress"] for s in r.get("toEndpoints", []) if "k8s:ai-factory.io/model" in s["matchLabels"]],
        "which its model list does not route to",
    ),
    ("model-pods-accept-the-world", model_ingress, "CiliumClusterwideNetworkPolicy", "tenant-search-serving-models", lambda o: o["spec"]["ingress"].append({"fromEntities": ["world"]}), "accept entity 'world'"),
    (
        "model-pods-accept-another-tenant",
        model_ingress,
        "CiliumClusterwideNetworkPolicy",
        "tenant-search-serving-models",
        lambda o: o["spec"]["ingress"].append({"fromEndpoints": [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "tenant-assistant"}}]}),
        "accept tenant assistant's pods",
    ),
]


@pytest.mark.parametrize("check, kind, name, change, expected", [pytest.param(*row[1:], id=row[0]) for row in ROWS])
def test_serving_checks_flag_this(served, oracles, check, kind, name, change, expected):
    if callable(name):
        name, change = name(served)
    broken = edit(served, kind, name, change)
    assert any(expected in f.message for f in check(broken, oracles)), [str(f) for f in check(broken, oracles)]


@pytest.mark.parametrize("check", [gateway_routes, litellm_reach, model_ingress], ids=lambda c: c.__name__)
def test_serving_checks_accept_the_dev_environment(served, oracles, check):
    assert list(check(served, oracles)) == []


def _with(rendered: Rendered, obj: dict[str, Any]) -> Rendered:
    from ai_factory.factory.rendering.bundle import Manifest

    clone = edit(rendered, "Namespace", None, lambda o: None)
    clone.manifests.append(Manifest(obj, "test", None, "test::grant"))
    return clone


def _grant(namespace: str, source_namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": {"name": "grant", "namespace": namespace},
        "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": source_namespace}], "to": [{"group": "", "kind": "Service"}]},
    }


def test_a_reference_grant_letting_another_tenant_in_is_flagged(served, oracles):
    findings = [f.message for f in gateway_routes(_with(served, _grant("tenant-search", "tenant-assistant")), oracles)]
    assert findings == ["lets tenant assistant's HTTPRoutes reach into tenant search's namespace"]


def test_a_backend_in_a_platform_namespace_is_accepted_with_its_grant(served, oracles):
    route = sorted(objects(served, "HTTPRoute"))[0]
    home = objects(served, "HTTPRoute")[route]["metadata"]["namespace"]
    moved = edit(served, "HTTPRoute", route, lambda o: o["spec"]["rules"][0]["backendRefs"][0].update(namespace="litellm"))
    assert list(gateway_routes(_with(moved, _grant("litellm", home)), oracles)) == []


# --------------------------------------------------------------------------- the endpoint picker

STANDALONE_PICKER = "llm-d-router-standalone-v0.10.0.tgz"
RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def _helm_template(chart_env, chart: str, namespace: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    import subprocess

    import yaml

    done = subprocess.run(
        [chart_env.helm, "template", "picker", str(chart_env.charts_dir / chart), "--namespace", namespace, "--kube-version", "1.34.0", "--values", "-"],
        input=json.dumps(values), capture_output=True, text=True, check=True,
    )
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_the_standalone_picker_chart_cannot_meet_pod_security_restricted_with_any_value(chart_env):
    """Why the gateway layer does not install llm-d-router-standalone (components/gateway.py): its
    picker container and its pod take no security context from values; only the Envoy sidecar
    does (`router.proxy.securityContext`)."""
    import tarfile

    from ai_factory.policies.aif_policies.workloads import security_context_problems

    values = {"router": {"modelServers": {"matchLabels": {"ai-factory.io/model": "llama-70b"}}, "proxy": {"securityContext": RESTRICTED}}}
    (deployment,) = [d for d in _helm_template(chart_env, STANDALONE_PICKER, "tenant-search", values) if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["envoy-proxy", "epp"] and "securityContext" not in pod
    assert list(security_context_problems(pod, "restricted", False)) == [
        "container epp may run as root (runAsNonRoot is None, not true)",
        "container epp allows privilege escalation (allowPrivilegeEscalation is None, not false)",
        "container epp runs with seccomp profile unset (RuntimeDefault or Localhost required)",
        "container epp does not drop ALL capabilities",
    ]
    with tarfile.open(chart_env.charts_dir / STANDALONE_PICKER) as chart:
        templates = {m.name: chart.extractfile(m).read().decode() for m in chart.getmembers() if m.isfile() and "/templates/" in m.name}
    readers = {(name, line.strip()) for name, text in templates.items() for line in text.splitlines() if "securityContext" in line and "{{" in line}
    assert readers == {
        ("llm-d-router-standalone/charts/router/templates/_deployment.yaml", "{{- with $proxy.securityContext }}"),
        ("llm-d-router-standalone/charts/router/templates/_proxy-deployment.yaml", "{{- with $proxy.securityContext }}"),
    }


def test_kserves_endpoint_picker_meets_pod_security_restricted(chart_env):
    """The picker LLMInferenceServices get instead (`router.scheduler`): the llm-d preset of the
    kserve-runtime-configs chart, rendered with the serving layer's values."""
    from ai_factory.components.serving import LLMISVC_CONFIGS_VALUES
    from ai_factory.policies.aif_policies.workloads import security_context_problems

    docs = _helm_template(chart_env, "kserve-runtime-configs-v0.20.0.tgz", "kserve", LLMISVC_CONFIGS_VALUES)
    (scheduler,) = [d for d in docs if d["kind"] == "LLMInferenceServiceConfig" and d["metadata"]["name"] == "kserve-config-llm-scheduler"]
    pod = scheduler["spec"]["router"]["scheduler"]["template"]
    assert [c["name"] for c in pod["containers"]] == ["main", "tokenizer"]
    assert list(security_context_problems(pod, "restricted", False)) == []
