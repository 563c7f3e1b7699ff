"""The serving policies of the pack: table-driven rows of what each flags and accepts."""

from __future__ import annotations

from typing import Any

import pytest

from tests.policy_stacks import custom, namespace, stack, violations

GATEWAY_API = "gateway.networking.k8s.io/v1"


def listener(name: str, tenant: str | None, hostname: str | None = "a.example.com", admitted: str = "Selector") -> dict[str, Any]:
    namespaces: dict[str, Any] = {"from": admitted}
    if admitted == "Selector":
        namespaces["selector"] = {"matchLabels": {"ai-factory.io/tenant": tenant}} if tenant else {}
    spec: dict[str, Any] = {"name": name, "port": 443, "protocol": "HTTPS", "allowedRoutes": {"namespaces": namespaces}}
    if hostname:
        spec["hostname"] = hostname
    return spec


def route(name: str, ns: str, hostnames: list[str], backend_namespace: str | None = None) -> tuple[str, str, dict[str, Any]]:
    ref: dict[str, Any] = {"name": "m-predictor", "port": 80}
    if backend_namespace:
        ref["namespace"] = backend_namespace
    return name, ns, {"parentRefs": [{"name": "inference-0", "namespace": "gw"}], "hostnames": hostnames, "rules": [{"backendRefs": [ref]}]}


def environment(listeners: list[dict[str, Any]], routes: list[tuple[str, str, dict[str, Any]]] = ()):
    def program() -> None:
        namespace("gw")
        namespace("tenant-a", tenant="a")
        namespace("tenant-b", tenant="b")
        custom("inference-0", "Gateway", {"gatewayClassName": "cilium", "listeners": listeners}, namespace_name="gw", api_version=GATEWAY_API)
        for name, ns, spec in routes:
            custom(name, "HTTPRoute", spec, namespace_name=ns, api_version=GATEWAY_API)

    return stack(program)


@pytest.mark.parametrize(
    "listeners, expected",
    [
        pytest.param([listener("a-0", "a"), listener("b-0", "b", "b.example.com")], [], id="accepts-one-listener-per-tenant"),
        pytest.param([listener("gw", None, None, admitted="Same")], [], id="accepts-a-platform-listener"),
        pytest.param([listener("all", None, admitted="All")], ["admits routes of tenants a, b"], id="flags-all-namespaces"),
        pytest.param([listener("any", None)], ["admits routes of tenants a, b"], id="flags-an-empty-selector"),
        pytest.param([listener("a-0", "a", None)], ["under every hostname"], id="flags-no-hostname"),
        pytest.param([listener("a-0", "a"), listener("b-0", "b")], ["is admitted for tenants a, b"], id="flags-a-hostname-for-two-tenants"),
    ],
)
def test_gateway_listeners_isolate_tenants(listeners, expected):
    found = [m for ms in violations(environment(listeners), "gateway-listeners-isolate-tenants").values() for m in ms]
    assert [any(e in m for m in found) for e in expected] == [True] * len(expected) and len(found) == len(expected)


@pytest.mark.parametrize(
    "routes, expected",
    [
        pytest.param([route("a", "tenant-a", ["a.example.com"]), route("b", "tenant-b", ["b.example.com"])], [], id="accepts-own-hostnames"),
        pytest.param([route("a", "tenant-a", ["a.example.com"], backend_namespace="tenant-a")], [], id="accepts-its-own-namespace-named"),
        pytest.param([route("a", "tenant-a", ["x.example.com"]), route("b", "tenant-b", ["x.example.com"])], ["which tenant b also claims", "which tenant a also claims"], id="flags-a-contested-hostname"),
        pytest.param([route("a", "tenant-a", ["a.example.com"], backend_namespace="tenant-b")], ["sends traffic to tenant b's namespace"], id="flags-a-backend-of-another-tenant"),
    ],
)
def test_tenant_routes_own_hostnames(routes, expected):
    found = [m for ms in violations(environment([listener("a-0", "a")], routes), "tenant-routes-own-hostnames").values() for m in ms]
    assert [any(e in m for m in found) for e in expected] == [True] * len(expected) and len(found) == len(expected)
