"""`factory check`: passes on dev, and each oracle bites when its rule is broken."""

from __future__ import annotations

import copy

import yaml

from ai_factory.factory.checking.check import run_checks, unchecked_kinds
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.rendering.bundle import Manifest, Rendered
from tests.conftest import run_main


def mutated(rendered: Rendered, kind: str, name: str, change) -> Rendered:
    clone = copy.deepcopy(Rendered(rendered.config, rendered.kubernetes_version, rendered.manifests, rendered.inventory, kustomizations=rendered.kustomizations))
    target = next(m for m in clone.manifests if m.kind == kind and m.name == name)
    change(target.obj)
    return clone


def test_dev_is_clean(dev, oracles):
    assert run_checks(dev, oracles) == []


def test_misspelt_helm_value_fails(dev, oracles):
    broken = mutated(dev, "HelmRelease", "gpu-operator", lambda o: o["spec"]["values"]["toolkit"].update(enabeld=True))
    findings = [str(f) for f in run_checks(broken, oracles)]
    assert len(findings) == 1 and findings[0].startswith("helm-values: HelmRelease/gpu-operator/gpu-operator:")
    assert "toolkit.enabeld" in findings[0]


def test_custom_resource_with_unknown_field_fails(dev, oracles):
    broken = mutated(dev, "NVIDIADriver", "driver-h100-train", lambda o: o["spec"].update(kernelModule="open"))
    findings = [str(f) for f in run_checks(broken, oracles)]
    assert len(findings) == 1 and "NVIDIADriver/driver-h100-train" in findings[0] and "kernelModule" in findings[0]


def test_core_object_with_wrong_type_fails(dev, oracles):
    broken = mutated(dev, "Namespace", "gpu-operator", lambda o: o["metadata"].update(labels="privileged"))
    # The policies also see the namespace lose its Pod Security labels (namespace-pod-security).
    findings = [str(f) for f in run_checks(broken, oracles) if f.check == "schema"]
    assert findings and all(f.startswith("schema: Namespace/gpu-operator:") for f in findings)


def test_flux_objects_are_validated_against_their_crds(dev, oracles):
    broken = mutated(dev, "HelmRelease", "gpu-operator", lambda o: o["spec"].update(intervall="5m"))
    assert any("intervall" in str(f) for f in run_checks(broken, oracles))


def test_chart_outside_the_catalog_fails(dev, oracles):
    broken = mutated(dev, "HelmRelease", "gpu-operator", lambda o: o["spec"]["chart"]["spec"].update(chart="gpu-operatorr"))
    assert any("not in the catalog" in str(f) for f in run_checks(broken, oracles))


def test_check_on_a_rendered_directory_catches_an_edited_value(dev, tmp_path, oracles):
    out = tmp_path / "dev"
    dev.write(out)
    clean = run_main("check", str(out), "--upstream", str(oracles.root))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    path = out / "manifests/crds/gpu-operator/gpu-operator/helmrelease-gpu-operator.yaml"
    release = yaml.safe_load(path.read_text())
    release["spec"]["values"]["devicePlugin"]["enabledd"] = release["spec"]["values"]["devicePlugin"].pop("enabled")
    path.write_text(yaml.safe_dump(release))
    broken = run_main("check", str(out), "--upstream", str(oracles.root))
    assert broken.returncode == 1
    assert "devicePlugin.enabledd" in broken.stdout


def test_each_custom_kind_not_checked_is_named_once_by_api_version():
    def obj(api_version, kind):
        return Manifest({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}}, "layer", None, "origin")

    objects = [("example.com/v1", "Widget"), ("example.com/v1", "Widget"), ("example.com/v2", "Widget"), ("v1", "ConfigMap"), (["not a version"], "Gadget"), ("example.com/v1", "Gadget")]
    rendered = Rendered(None, "1.34", [obj(*o) for o in objects], [])
    assert unchecked_kinds(rendered, Oracles(None)) == ["example.com/v1 Gadget", "example.com/v1 Widget", "example.com/v2 Widget"]
