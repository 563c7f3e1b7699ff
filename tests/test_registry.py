"""The layer registry drives the root component, the tenant hooks and the checks."""

from __future__ import annotations

from ai_factory.components.registry import layer, layers
from ai_factory.factory.checking import scheduling
from ai_factory.factory.checking.check import checks
from ai_factory.factory.model.catalog import CHARTS
from ai_factory.factory.model.config import Layers
from tests.conftest import render


def test_every_layer_names_an_existing_config_section_chart_pin_and_required_layers():
    names = {l.name for l in layers()}
    for declared in layers():
        assert declared.section is None or declared.section in Layers.model_fields, declared.name
        assert declared.chart is None or declared.chart in CHARTS, declared.name
        assert set(declared.requires) <= names, declared.name
    assert [l.name for l in layers()].index("openbao") < [l.name for l in layers()].index("external-secrets")


def test_a_layer_switched_off_disappears_from_render_hooks_and_checks(raw):
    dev = render(raw)
    assert {"falco", "kyverno"} <= {m.layer for m in dev.manifests}
    assert any(m.kind == "ClusterPolicy" and m.tenant for m in dev.manifests)  # kyverno's tenant hook
    raw["layers"]["falco"] = {"enabled": False}
    raw["layers"]["kyverno"] = {"enabled": False}
    without = render(raw)
    assert not {"falco", "kyverno"} & {m.layer for m in without.manifests}
    assert not [m for m in without.manifests if m.kind == "ClusterPolicy"]
    assert not [r for r in without.graph.resources if r.type == "ai-factory:admission:Kyverno" or r.name.endswith("-admission")]


def test_a_layer_switched_on_brings_its_component_hook_and_checks(raw):
    dev = render(raw)
    assert scheduling.kai_queue_shares not in checks(dev)
    raw["layers"]["kai_scheduler"] = {"enabled": True}
    with_kai = render(raw)
    assert "kai-scheduler" in {m.layer for m in with_kai.manifests}
    assert {m.tenant for m in with_kai.manifests if m.kind == "Queue" and m.tenant} == {t["name"] for t in raw["tenants"]}
    assert scheduling.kai_queue_shares in checks(with_kai)
    assert layer("kai-scheduler").checks == (scheduling.kai_queue_shares,)


def test_crd_groups_a_layer_expects_from_the_cluster_are_the_only_ones_without_an_installing_release(dev, monkeypatch):
    from ai_factory.factory.checking import ordering

    assert layer("health").external_crds and not [f for f in ordering.bundle_order(dev, None) if "medik8s" in f.message]
    monkeypatch.setattr(ordering, "external_crds", lambda names: set())
    flagged = {f.ref for f in ordering.bundle_order(dev, None) if "remediation.medik8s.io" in f.message}
    assert {"NodeHealthCheck/ai-factory-gpu-h100-train"} <= flagged


def test_a_layers_config_checks_run_with_validation_and_report_with_every_other_problem(raw, monkeypatch):
    import dataclasses

    from ai_factory.components import registry
    from ai_factory.factory.model.loading import ConfigError, validate

    assert layer("health").config_checks
    extra = dataclasses.replace(layer("falco"), name="probe", config_checks=(lambda doc: ["layers.probe: checked"],))
    monkeypatch.setattr(registry, "layers", lambda: (*registry._discover(), extra))
    raw["tenants"][0]["trust"] = "unheard-of"
    raw["layers"]["health"]["remediation"] = {"pools": {"no-such-pool": {"nodes": 1}}}
    try:
        validate(raw)
    except ConfigError as error:
        problems = error.problems
    else:
        raise AssertionError("validation accepted a broken config")
    assert "layers.probe: checked" in problems
    assert any(p.startswith("layers.health.remediation.pools.no-such-pool: unknown pool") for p in problems)
    assert any(p.startswith("tenants[0].trust") for p in problems)


def test_the_packs_privileged_allow_list_is_what_the_layers_declare(monkeypatch):
    import dataclasses

    from ai_factory.components import registry
    from ai_factory.policies.aif_policies.security import privileged_namespaces

    assert {"gpu-operator", "node-problem-detector", "medik8s", "kube-system"} <= privileged_namespaces({})
    without_npd = tuple(
        dataclasses.replace(l, privileged_namespaces={}) if l.name == "health" else l for l in registry._discover()
    )
    monkeypatch.setattr(registry, "layers", lambda: without_npd)
    assert not {"node-problem-detector", "medik8s"} & privileged_namespaces({})
    assert "gpu-operator" in privileged_namespaces({})
