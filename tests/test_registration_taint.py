"""The `registration-taint` check (`factory/checking/provisioning.py`), table-driven: every
BareMetalHost boots with user data registering the node with the acceptance taint (the dev render
passing it: tests/test_provisioning.py)."""

from __future__ import annotations

import json

import pytest

from ai_factory.components import provisioning
from ai_factory.factory.acceptance import gates
from ai_factory.factory.checking.provisioning import registration_taint
from ai_factory.factory.rendering.bundle import Manifest, Rendered


def host(user_data: dict | None = None) -> dict:
    spec = {"online": True, **({"userData": user_data} if user_data is not None else {})}
    return {"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost", "metadata": {"name": "n1", "namespace": "hosts"}, "spec": spec}


def user_data_secret(taints, name: str = "n1-user-data", namespace: str = "hosts") -> dict:
    annotations = {provisioning.REGISTER_TAINTS_ANNOTATION: taints if isinstance(taints, str) else json.dumps(taints)}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace, "annotations": annotations}}


PENDING = {"key": gates.ACCEPTANCE_KEY, "value": "pending", "effect": "NoSchedule"}
REFERENCE = {"name": "n1-user-data"}
REGISTRATION_ROWS = [
    ("a host without user data", [host()], "boots without user data"),
    ("user data missing from the render", [host(REFERENCE)], "hosts/n1-user-data is not part of the render"),
    ("user data of another namespace", [host({"name": "n1-user-data", "namespace": "other"}), user_data_secret([PENDING])], "other/n1-user-data is not part"),
    ("user data registering no taint", [host(REFERENCE), user_data_secret([])], "does not register the node"),
    ("a PreferNoSchedule taint", [host(REFERENCE), user_data_secret([{**PENDING, "effect": "PreferNoSchedule"}])], "does not register the node"),
    ("the taint already accepted", [host(REFERENCE), user_data_secret([{**PENDING, "value": "accepted"}])], "does not register the node"),
    ("an unreadable statement", [host(REFERENCE), user_data_secret("[oops")], "does not register the node"),
]
REGISTRATION_ACCEPTS = [
    ("the pending taint", [host(REFERENCE), user_data_secret([PENDING])]),
    ("the pending taint among others", [host({"name": "n1-user-data", "namespace": "hosts"}), user_data_secret([{"key": "x", "effect": "NoExecute"}, PENDING])]),
    ("no host at all", [user_data_secret([])]),
]


def registration_findings(objs: list[dict]) -> list[str]:
    rendered = Rendered(None, "1.34", [Manifest(o, "provisioning", None, f"test::{i}") for i, o in enumerate(objs)], [])
    return [f"{f.ref}: {f.message}" for f in registration_taint(rendered, None)]


@pytest.mark.parametrize(("objs", "expected"), [r[1:] for r in REGISTRATION_ROWS], ids=[r[0] for r in REGISTRATION_ROWS])
def test_registration_taint_check_flags(objs, expected):
    found = registration_findings(objs)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize("objs", [r[1] for r in REGISTRATION_ACCEPTS], ids=[r[0] for r in REGISTRATION_ACCEPTS])
def test_registration_taint_check_accepts(objs):
    assert registration_findings(objs) == []


def test_every_host_is_checked_and_named_with_its_user_data():
    second = {**host(REFERENCE), "metadata": {"name": "n2", "namespace": "hosts"}}
    third = {**host({"name": "n3-user-data"}), "metadata": {"name": "n3", "namespace": "hosts"}}
    found = registration_findings([host(), second, third, user_data_secret([]), user_data_secret([PENDING], name="n3-user-data")])
    assert found == [
        "BareMetalHost/hosts/n1: boots without user data: its kubelet registers the node untainted, open to workloads before acceptance",
        "BareMetalHost/hosts/n2: its user data (hosts/n1-user-data) does not register the node with the taint "
        "ai-factory.io/acceptance=pending:NoSchedule: workloads could land before acceptance",
    ]
    assert registration_findings([host({"name": "gone"}), second]) == [
        "BareMetalHost/hosts/n1: its user data Secret hosts/gone is not part of the render",
        "BareMetalHost/hosts/n2: its user data Secret hosts/n1-user-data is not part of the render",
    ]
