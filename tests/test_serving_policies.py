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


# --------------------------------------------------------------------------- models within the quota

KSERVE = "serving.kserve.io"


def predictor(max_replicas: int, cpu: str = "4", memory: str = "16Gi") -> dict[str, Any]:
    resources = {"requests": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": "1"}, "limits": {"memory": memory, "nvidia.com/gpu": "1"}}
    return {"predictor": {"minReplicas": 1, "maxReplicas": max_replicas, "model": {"modelFormat": {"name": "vllm"}, "resources": resources}}}


def large(replicas: int, prefill: int | None = None) -> dict[str, Any]:
    pod = {"containers": [{"name": "main", "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "16Gi"}}}]}
    spec: dict[str, Any] = {"model": {"uri": "hf://m/m"}, "replicas": replicas, "template": pod, "router": {"scheduler": {}}}
    if prefill:
        spec["prefill"] = {"replicas": prefill, "template": pod}
    return spec


def dynamo_graph(workers: int) -> dict[str, Any]:
    def main(cpu: str, memory: str) -> dict[str, Any]:
        return {"extraPodSpec": {"mainContainer": {"resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}}}}

    return {"services": {"Frontend": {"componentType": "frontend", "replicas": 1, **main("2", "4Gi")}, "VllmWorker": {"componentType": "worker", "replicas": workers, **main("4", "16Gi")}}}


def serving_world(hard: dict[str, str], models: list[tuple[str, str, str, dict[str, Any]]]):
    def program() -> None:
        namespace("kserve")
        namespace("tenant-b", tenant="b")
        namespace("tenant-a", tenant="a")
        # A quota of a tenant without models comes first: it must not end the reading.
        custom("a-quota", "ResourceQuota", {"hard": {"requests.cpu": "1"}}, namespace_name="tenant-b", api_version="v1")
        custom("quota", "ResourceQuota", {"hard": hard}, namespace_name="tenant-a", api_version="v1")
        for name, kind, ns, spec in models:
            version = {"InferenceService": f"{KSERVE}/v1beta1", "DynamoGraphDeployment": "nvidia.com/v1alpha1"}.get(kind, f"{KSERVE}/v1alpha2")
            custom(name, kind, spec, namespace_name=ns, api_version=version)

    return stack(program)


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


QUOTA = {"requests.cpu": "16", "requests.memory": "64Gi", "limits.memory": "64Gi", "count/pods": "10"}


@pytest.mark.parametrize(
    "hard, models, expected",
    [
        pytest.param(QUOTA, [("m", "InferenceService", "tenant-a", predictor(4))], [], id="accepts-models-that-fit-at-max"),
        pytest.param(QUOTA, [("m", "InferenceService", "tenant-a", predictor(5))], ["take requests.cpu 20 over the quota's 16 (4 short)", "requests.memory 80Gi over the quota's 64Gi (16Gi short)", "limits.memory 80Gi over the quota's 64Gi (16Gi short)"], id="flags-replicas-at-max-over-cpu-and-memory"),
        pytest.param(QUOTA, [("m", "InferenceService", "tenant-a", predictor(2)), ("n", "InferenceService", "tenant-a", predictor(2, cpu="5"))], ["its models (m, n) at their maximum replicas take requests.cpu 18 over the quota's 16 (2 short)"], id="flags-models-together-over-cpu"),
        pytest.param({**QUOTA, "count/pods": "3"}, [("m", "InferenceService", "tenant-a", predictor(4, cpu="1", memory="1Gi"))], ["take 4 pods over the quota's 3 (1 short)"], id="flags-pods-over-the-quota"),
        pytest.param(QUOTA, [("big", "LLMInferenceService", "tenant-a", large(2, prefill=1))], ["limits.memory 65.5Gi over the quota's 64Gi (1.5Gi short)"], id="flags-the-picker-and-sidecars-of-a-large-model"),
        pytest.param(QUOTA, [("big", "LLMInferenceService", "tenant-a", large(2))], [], id="accepts-a-large-model-with-its-picker"),
        pytest.param({"requests.memory": "64Gi"}, [("m", "InferenceService", "tenant-a", predictor(8, memory="8Gi"))], [], id="accepts-lines-the-quota-does-not-set"),
        pytest.param(QUOTA, [("m", "InferenceService", "kserve", predictor(50))], [], id="accepts-models-outside-tenant-namespaces"),
        pytest.param(QUOTA, [("d", "DynamoGraphDeployment", "tenant-a", dynamo_graph(3))], [], id="accepts-a-dynamo-model-and-its-frontend"),
        pytest.param(QUOTA, [("d", "DynamoGraphDeployment", "tenant-a", dynamo_graph(4))], ["take requests.cpu 18 over the quota's 16 (2 short)", "requests.memory 68Gi over the quota's 64Gi (4Gi short)", "limits.memory 68Gi over the quota's 64Gi (4Gi short)"], id="flags-dynamo-workers-and-frontend-over-the-quota"),
        pytest.param(QUOTA, [("a-platform", "InferenceService", "kserve", predictor(50)), ("m", "InferenceService", "tenant-a", predictor(5))], ["its models (m) at their maximum replicas take requests.cpu 20"] + ["memory 80Gi"] * 2, id="flags-a-tenant-model-after-a-platform-one"),
    ],
)
def test_models_fit_tenant_quota(hard, models, expected):
    found = [m for ms in violations(serving_world(hard, models), "models-fit-tenant-quota").values() for m in ms]
    assert [any(e in m for m in found) for e in expected] == [True] * len(expected) and len(found) == len(expected), found


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
