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


# --------------------------------------------------------------------------- Dynamo


def worker(gpu: str = "1", limit: str | None = None, main: str | None = "1", main_limit: str | None = None, queue: str | None = "default", component: str = "worker") -> dict[str, Any]:
    """A Dynamo service: `gpu`/`limit` in Dynamo's resources, `main`/`main_limit` on its main
    container (None: no GPU there); limits default to the requests."""
    main_resources = {side: {"nvidia.com/gpu": value} for side, value in (("requests", main), ("limits", main_limit or main)) if value}
    return {
        "componentType": component,
        "resources": {"requests": {"cpu": "4", "gpu": gpu}, "limits": {"gpu": limit or gpu}},
        "extraPodMetadata": {"labels": {"kueue.x-k8s.io/queue-name": queue} if queue else {}},
        "extraPodSpec": {"mainContainer": {"image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.1.0", "resources": main_resources}},
    }


FRONTEND = {"componentType": "frontend", "extraPodMetadata": {"labels": {"kueue.x-k8s.io/queue-name": "default"}}, "extraPodSpec": {"mainContainer": {"image": "x"}}}
GOOD = {"Frontend": FRONTEND, "VllmWorker": worker()}


def dynamo_stack(deployments: list[tuple[str, str, dict[str, Any]]]):
    def program() -> None:
        namespace("dynamo-system")
        namespace("tenant-a", tenant="a")
        custom("default", "LocalQueue", {"clusterQueue": "a"}, namespace_name="tenant-a", api_version="kueue.x-k8s.io/v1beta1")
        for name, ns, services in deployments:
            custom(name, "DynamoGraphDeployment", {"backendFramework": "vllm", "services": services}, namespace_name=ns, api_version="nvidia.com/v1alpha1")

    return stack(program)


@pytest.mark.parametrize(
    "deployments, expected",
    [
        pytest.param([("m", "tenant-a", GOOD)], [], id="accepts-a-worker-at-one-gpu-shape"),
        pytest.param([("m", "dynamo-system", GOOD)], ["serves a model outside every tenant's namespace"], id="flags-a-deployment-outside-tenants"),
        pytest.param(
            [("m", "dynamo-system", GOOD), ("n", "tenant-a", {"VllmWorker": worker(queue=None)})],
            ["serves a model outside every tenant's namespace", "service VllmWorker: its pods name no Kueue queue"],
            id="flags-each-deployment-after-one-outside-tenants",
        ),
        pytest.param([("m", "tenant-a", {"VllmWorker": worker(queue=None)})], ["service VllmWorker: its pods name no Kueue queue"], id="flags-no-queue"),
        pytest.param([("m", "tenant-a", {"VllmWorker": worker(queue="other")})], ["its pods name queue other, which is not a LocalQueue of tenant-a"], id="flags-a-queue-of-no-localqueue"),
        pytest.param(
            [("m", "tenant-a", {"VllmWorker": worker(gpu="2", limit="1", main="1")})],
            ["its GPU figures differ (resources.requests: nvidia.com/gpu=2; resources.limits: nvidia.com/gpu=1; mainContainer requests: nvidia.com/gpu=1; mainContainer limits: nvidia.com/gpu=1)"],
            id="flags-dynamo-requests-apart",
        ),
        pytest.param([("m", "tenant-a", {"VllmWorker": worker(main="2", main_limit="1")})], ["mainContainer requests: nvidia.com/gpu=2; mainContainer limits: nvidia.com/gpu=1)"], id="flags-main-requests-apart"),
        pytest.param([("m", "tenant-a", {"VllmWorker": worker(main="1", main_limit="2")})], ["mainContainer requests: nvidia.com/gpu=1; mainContainer limits: nvidia.com/gpu=2)"], id="flags-main-limits-apart"),
        pytest.param([("m", "tenant-a", {"VllmWorker": worker(main=None)})], ["mainContainer requests: no GPU; mainContainer limits: no GPU)"], id="flags-a-main-container-without-the-gpus"),
        pytest.param(
            [("m", "tenant-a", {"Frontend": {**FRONTEND, "resources": {"limits": {"gpu": "1"}}}})],
            ["service Frontend: a frontend asks for GPUs (resources.limits: nvidia.com/gpu=1); only workers run the model"],
            id="flags-a-frontend-with-a-gpu",
        ),
        pytest.param([("m", "tenant-a", {"Planner": worker(component="planner")})], ["service Planner: a planner asks for GPUs"], id="flags-any-non-worker-with-a-gpu"),
    ],
)
def test_dynamo_models_in_tenant_bounds(deployments, expected):
    found = [m for ms in violations(dynamo_stack(deployments), "dynamo-models-in-tenant-bounds").values() for m in ms]
    assert [any(e in m for m in found) for e in expected] == [True] * len(expected) and len(found) == len(expected), found
