"""The offline checks over Dynamo's objects (`factory/checking/serving.py`), table-driven: each row
breaks the Dynamo render of `tests/test_dynamo.py` one way and names what the check must report."""

from __future__ import annotations

from typing import Callable

import pytest

from ai_factory.factory.checking import serving as serving_checks
from ai_factory.factory.rendering.bundle import Rendered
from tests.test_dynamo import dynamo_raw, rendered  # noqa: F401 (fixtures)
from tests.test_scheduling import broken


def _service(name: str, service: str, change: Callable[[dict], None]) -> Callable[[Rendered], Rendered]:
    return lambda r: broken(r, "DynamoGraphDeployment", name, lambda o: change(o["spec"]["services"][service]))


def _main_limits(service: dict) -> dict:
    return service["extraPodSpec"]["mainContainer"]["resources"]["limits"]


DYNAMO_WORKERS = [
    ("accepts the Dynamo render", lambda r: r, []),
    ("flags a worker asking for a second GPU",
     _service("llama-70b", "VllmDecodeWorker", lambda s: s["resources"]["requests"].update(gpu="5")),
     ["DynamoGraphDeployment/tenant-search/llama-70b: spec.services.VllmDecodeWorker.resources.requests: asks for nvidia.com/gpu=5, not the nvidia.com/gpu=4 the plan gives one of its pods"]),
    ("flags a worker whose main container names another MIG profile",
     _service("llama-8b", "VllmWorker", lambda s: _main_limits(s).update({"nvidia.com/mig-7g.80gb": _main_limits(s).pop("nvidia.com/mig-3g.40gb")})),
     ["spec.services.VllmWorker.extraPodSpec.mainContainer.resources.limits: asks for nvidia.com/mig-7g.80gb=1, not the nvidia.com/mig-3g.40gb=1"]),
    ("flags a HAMi worker taking more of the slice's memory",
     _service("qwen-1-5b", "VllmWorker", lambda s: s["resources"]["limits"]["custom"].update({"nvidia.com/gpumem": "24576"})),
     ["spec.services.VllmWorker.resources.limits: asks for nvidia.com/gpu=1, nvidia.com/gpucores=25, nvidia.com/gpumem=24576"]),
    ("flags a worker whose main container requests another count",
     _service("llama-70b", "VllmDecodeWorker", lambda s: s["extraPodSpec"]["mainContainer"]["resources"]["requests"].update({"nvidia.com/gpu": "8"})),
     ["spec.services.VllmDecodeWorker.extraPodSpec.mainContainer.resources.requests: asks for nvidia.com/gpu=8, not the nvidia.com/gpu=4"]),
    ("flags a frontend asking for a GPU",
     _service("llama-8b", "Frontend", lambda s: s["resources"]["limits"].update(gpu="1")),
     ["spec.services.Frontend.resources.limits: a frontend asks for GPUs (nvidia.com/gpu=1); only workers run the model"]),
    ("flags a deployment no tenant model declares",
     lambda r: broken(r, "DynamoGraphDeployment", "qwen-1-5b", lambda o: o["metadata"].update(name="qwen-72b")),
     ["DynamoGraphDeployment/tenant-assistant/qwen-72b: no Dynamo model qwen-72b of tenant assistant is declared"]),
    ("flags the deployments after an undeclared one",
     lambda r: _service("llama-8b", "VllmWorker", lambda s: s["resources"]["limits"].update(gpu="2"))(
         broken(r, "DynamoGraphDeployment", "qwen-1-5b", lambda o: o["metadata"].update(name="qwen-72b"))),
     ["no Dynamo model qwen-72b of tenant assistant is declared", "spec.services.VllmWorker.resources.limits: asks for nvidia.com/mig-3g.40gb=2"]),
    ("flags the deployments after one outside a tenant namespace",
     lambda r: _service("llama-8b", "VllmWorker", lambda s: s["resources"]["limits"].update(gpu="2"))(
         broken(r, "DynamoGraphDeployment", "qwen-1-5b", lambda o: o["metadata"].update(namespace="dynamo-system"))),
     ["spec.services.VllmWorker.resources.limits: asks for nvidia.com/mig-3g.40gb=2"]),
    ("accepts a deployment outside a tenant namespace (model_pods reports it)",
     lambda r: broken(r, "DynamoGraphDeployment", "qwen-1-5b", lambda o: o["metadata"].update(namespace="dynamo-system")),
     []),
    ("flags requests and limits apart without a config",
     lambda r: Rendered(None, r.kubernetes_version, _service("llama-70b", "VllmPrefillWorker", lambda s: s["resources"]["requests"].update(gpu="2"))(r).manifests, r.inventory),
     ["spec.services.VllmPrefillWorker.resources.requests: asks for nvidia.com/gpu=2, not the nvidia.com/gpu=4 its Dynamo limits state"]),
    ("accepts malformed services (the schema check reports them)",
     lambda r: broken(r, "DynamoGraphDeployment", "llama-8b", lambda o: o["spec"]["services"].update(VllmWorker="worker", Frontend={"componentType": "frontend", "resources": []})),
     []),
]


@pytest.mark.parametrize("change, expected", [r[1:] for r in DYNAMO_WORKERS], ids=[r[0] for r in DYNAMO_WORKERS])
def test_dynamo_workers(rendered, change, expected):
    found = [str(f) for f in serving_checks.dynamo_workers(change(rendered), None)]
    assert len(found) == len(expected), found
    assert all(any(e in f for f in found) for e in expected), found


MODEL_PODS = [
    ("accepts the Dynamo render", lambda r: r, []),
    ("flags a Dynamo worker without the tenant's queue",
     _service("llama-70b", "VllmPrefillWorker", lambda s: s["extraPodMetadata"]["labels"].pop("kueue.x-k8s.io/queue-name")),
     ["DynamoGraphDeployment/tenant-search/llama-70b: spec.services.VllmPrefillWorker: its pods name no Kueue queue"]),
    ("flags a Dynamo worker tolerating another trust domain",
     _service("qwen-1-5b", "VllmWorker", lambda s: s["extraPodSpec"]["tolerations"][0].update(value="internal")),
     ["spec.services.VllmWorker: tolerates the shared-GPU nodes of trust domain internal (its own is assistant)"]),
    ("flags a Dynamo deployment outside a tenant namespace",
     lambda r: broken(r, "DynamoGraphDeployment", "qwen-1-5b", lambda o: o["metadata"].update(namespace="dynamo-system")),
     ["DynamoGraphDeployment/dynamo-system/qwen-1-5b: serves a model from dynamo-system, not a tenant's namespace"]),
]


@pytest.mark.parametrize("change, expected", [r[1:] for r in MODEL_PODS], ids=[r[0] for r in MODEL_PODS])
def test_model_pods_of_dynamo(rendered, change, expected):
    found = [str(f) for f in serving_checks.model_pods(change(rendered), None)]
    assert len(found) == len(expected), found
    assert all(any(e in f for f in found) for e in expected), found


