"""Chart values embedding YAML documents are written through libyaml, byte for byte as PyYAML's
own emitter writes them (`components._common.yaml_text`)."""

from __future__ import annotations

import functools

import yaml

from ai_factory.components import _common
from ai_factory.factory.rendering import program
from ai_factory.factory.rendering.bundle import program_config
from ai_factory.factory.rendering.harness import run_program


def test_every_embedded_yaml_document_of_dev_is_what_pyyamls_emitter_writes(dev_raw, monkeypatch):
    assert _common.YAML_DUMPER is yaml.CSafeDumper, "PyYAML without libyaml: the components fall back to the pure-Python emitter"
    config, secret_keys = program_config(*dev_raw, "ai-factory")

    def inputs() -> dict[str, dict]:
        graph = run_program(functools.partial(program.main, with_tenant_stacks=True), project="ai-factory", stack="dev", config=config, secret_keys=secret_keys)
        return {r.urn: r.inputs for r in graph.resources}

    through_libyaml = inputs()
    monkeypatch.setattr(_common, "YAML_DUMPER", yaml.SafeDumper)
    through_pyyaml = inputs()
    embedded = [v for values in through_pyyaml.values() for v in _strings(values) if "\n" in v and ": " in v]
    assert len(embedded) >= 8  # the vCluster manifests, Falco's rules, Kueue's and the GPU operator's configs, Keycloak's, Slinky's
    assert through_libyaml == through_pyyaml


def _strings(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value
