"""The serving layer's offline checks (`factory/checking/serving.py`), table-driven: each row
breaks the dev render one way and names what the check must report ("accepts dev": nothing)."""

from __future__ import annotations

import copy
from typing import Callable

import pytest

from ai_factory.factory.checking import serving as serving_checks
from ai_factory.factory.rendering.bundle import Manifest, Rendered
from tests.test_scheduling import broken


def _predictor(change: Callable[[dict], None]) -> Callable[[dict], None]:
    return lambda obj: change(obj["spec"]["predictor"])


def _moved(obj: dict) -> None:
    obj["metadata"]["namespace"] = "kserve"


MODEL_PODS = [
    ("accepts dev", lambda r: r, []),
    ("flags a predictor without the tenant's queue",
     lambda r: broken(r, "InferenceService", "llama-8b", _predictor(lambda p: p["labels"].pop("kueue.x-k8s.io/queue-name"))),
     ["InferenceService/tenant-search/llama-8b: spec.predictor: its pods name no Kueue queue"]),
    ("flags prefill pods without the tenant's queue",
     lambda r: broken(r, "LLMInferenceService", "llama-70b", lambda o: o["spec"]["prefill"]["labels"].pop("kueue.x-k8s.io/queue-name")),
     ["LLMInferenceService/tenant-search/llama-70b: spec.prefill.template: its pods name no Kueue queue"]),
    ("flags another trust domain's toleration",
     lambda r: broken(r, "InferenceService", "qwen-1-5b", _predictor(lambda p: p["tolerations"][0].update(value="internal"))),
     ["InferenceService/tenant-assistant/qwen-1-5b: spec.predictor: tolerates the shared-GPU nodes of trust domain internal (its own is assistant)"]),
    ("flags another tenant's dedicated nodes",
     lambda r: broken(r, "InferenceService", "llama-8b", _predictor(lambda p: p["tolerations"].append({"key": "ai-factory.io/dedicated", "operator": "Equal", "value": "partner-acme", "effect": "NoSchedule"}))),
     ["InferenceService/tenant-search/llama-8b: spec.predictor: tolerates the nodes dedicated to tenant partner-acme"]),
    ("flags tolerating every taint",
     lambda r: broken(r, "LLMInferenceService", "llama-70b", lambda o: o["spec"]["template"]["tolerations"].append({"operator": "Exists"})),
     ["LLMInferenceService/tenant-search/llama-70b: spec.template: tolerates every taint"]),
    ("flags tolerating every trust domain",
     lambda r: broken(r, "InferenceService", "llama-8b", _predictor(lambda p: p["tolerations"][0].update(operator="Exists", value=None))),
     ["spec.predictor: tolerates the shared-GPU nodes of every trust domain"]),
    ("flags a host-path cache",
     lambda r: broken(r, "InferenceService", "mistral-7b", _predictor(lambda p: p["volumes"].append({"name": "cache", "hostPath": {"path": "/mnt/models"}}))),
     ["InferenceService/tenant-partner-acme/mistral-7b: spec.predictor: mounts host path '/mnt/models'"]),
    ("flags a worker pod tolerating another domain",
     lambda r: broken(r, "LLMInferenceService", "llama-70b", lambda o: o["spec"].update(worker={"containers": [], "tolerations": [{"key": "ai-factory.io/trust-domain", "operator": "Equal", "value": "assistant"}]})),
     ["LLMInferenceService/tenant-search/llama-70b: spec.worker: tolerates the shared-GPU nodes of trust domain assistant (its own is internal)"]),
    ("flags a prefill worker tolerating every tenant's dedicated nodes",
     lambda r: broken(r, "LLMInferenceService", "llama-70b", lambda o: o["spec"]["prefill"].update(worker={"containers": [], "tolerations": [{"key": "ai-factory.io/dedicated", "operator": "Exists"}]})),
     ["spec.prefill.worker: tolerates the nodes dedicated to every tenant"]),
    ("accepts malformed parts (the schema check reports them)",
     lambda r: broken(r, "InferenceService", "llama-8b", _predictor(lambda p: p.update(tolerations=["internal"], volumes=["cache"]))),
     []),
    ("accepts a model object without a spec",
     lambda r: broken(r, "InferenceService", "llama-8b", lambda o: o.update(spec="predictor")),
     []),
    ("accepts an LLMInferenceService with malformed parts",
     lambda r: broken(r, "LLMInferenceService", "llama-70b", lambda o: o["spec"].update(prefill="1", template=[])),
     []),
    ("flags every model outside a tenant namespace",
     lambda r: broken(broken(r, "InferenceService", "mistral-7b", _moved), "InferenceService", "qwen-1-5b", _moved),
     ["InferenceService/kserve/mistral-7b: serves a model from kserve", "InferenceService/kserve/qwen-1-5b: serves a model from kserve"]),
    ("flags a model outside a tenant namespace",
     lambda r: broken(r, "InferenceService", "mistral-7b", _moved),
     ["serves a model from kserve, not a tenant's namespace"]),
]


@pytest.mark.parametrize("change, expected", [r[1:] for r in MODEL_PODS], ids=[r[0] for r in MODEL_PODS])
def test_model_pods(dev, change, expected):
    found = [str(f) for f in serving_checks.model_pods(change(dev), None)]
    assert len(found) == len(expected), found
    assert all(any(e in f for f in found) for e in expected), found


def _with(rendered: Rendered, kind: str) -> Rendered:
    cache = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": kind, "metadata": {"name": "llama"}, "spec": {}}
    return Rendered(rendered.config, rendered.kubernetes_version, [*rendered.manifests, Manifest(cache, "serving", None, "test")], rendered.inventory)


SHARED_CACHES = [
    ("accepts dev", lambda r: r, []),
    ("flags the node-local cache switched on",
     lambda r: broken(r, "HelmRelease", "kserve", lambda o: o["spec"]["values"]["kserve"]["localmodel"].update(enabled=True)),
     ["HelmRelease/kserve/kserve: enables KServe's node-local model cache"]),
    *(
        (f"flags a {kind}", lambda r, kind=kind: _with(r, kind), [f"{kind}/llama: a KServe node-local model cache is shared by every namespace"])
        for kind in ("LocalModelCache", "LocalModelNodeGroup", "LocalModelNamespaceCache")
    ),
    ("accepts a release with malformed values",
     lambda r: broken(r, "HelmRelease", "kserve", lambda o: o["spec"].update(values={"kserve": "on"})),
     []),
]


@pytest.mark.parametrize("change, expected", [r[1:] for r in SHARED_CACHES], ids=[r[0] for r in SHARED_CACHES])
def test_shared_model_caches(dev, change, expected):
    found = [str(f) for f in serving_checks.shared_model_caches(change(dev), None)]
    assert len(found) == len(expected), found
    assert all(any(e in f for f in found) for e in expected), found


def _quota(namespace: str, change: Callable[[dict], None]) -> Callable[[Rendered], Rendered]:
    """The dev render with the ResourceQuota of one tenant namespace changed."""

    def edit(rendered: Rendered) -> Rendered:
        clone = Rendered(rendered.config, rendered.kubernetes_version, copy.deepcopy(rendered.manifests), rendered.inventory)
        for m in clone.manifests:
            if m.kind == "ResourceQuota" and m.namespace == namespace:
                change(m.obj["spec"]["hard"])
        return clone

    return edit


def _then(*edits: Callable[[Rendered], Rendered]) -> Callable[[Rendered], Rendered]:
    def edit(rendered: Rendered) -> Rendered:
        for e in edits:
            rendered = e(rendered)
        return rendered

    return edit


def _model(kind: str, name: str, change: Callable[[dict], None]) -> Callable[[Rendered], Rendered]:
    return lambda r: broken(r, kind, name, change)


LARGE = "LLMInferenceService", "llama-70b"
MODEL_QUOTA = [
    ("accepts dev", lambda r: r, []),
    ("flags a predictor's maximum replicas over the CPU quota",
     _model("InferenceService", "qwen-1-5b", _predictor(lambda p: p.update(maxReplicas=20))),
     ["ResourceQuota/tenant-assistant/tenant-quota: the models of tenant assistant (InferenceService/tenant-assistant/qwen-1-5b) at their maximum replicas take requests.cpu 80 over the quota's 64 (16 short)"]),
    ("flags a quota lowered under the models' CPU",
     _quota("tenant-assistant", lambda h: h.update({"requests.cpu": "10"})),
     ["take requests.cpu 12 over the quota's 10 (2 short)"]),
    ("flags memory limits over the quota (the picker's limit counted)",
     _quota("tenant-search", lambda h: h.update({"limits.memory": "90Gi"})),
     ["ResourceQuota/tenant-search/tenant-quota: the models of tenant search (InferenceService/tenant-search/llama-8b, LLMInferenceService/tenant-search/llama-70b) at their maximum replicas take limits.memory 97.5Gi over the quota's 90Gi (7.5Gi short)"]),
    ("flags memory requests over the quota",
     _quota("tenant-partner-acme", lambda h: h.update({"requests.memory": "20Gi"})),
     ["take requests.memory 32Gi over the quota's 20Gi (12Gi short)"]),
    ("flags pods over the quota",
     _quota("tenant-partner-acme", lambda h: h.update({"count/pods": "1"})),
     ["take 2 pods over the quota's 1 (1 short)"]),
    ("accepts pods exactly at the quota",
     _quota("tenant-partner-acme", lambda h: h.update({"count/pods": "2"})),
     []),
    ("flags pods over the quota's core-group line",
     _quota("tenant-partner-acme", lambda h: (h.pop("count/pods"), h.update(pods=1))),
     ["take 2 pods over the quota's 1 (1 short)"]),
    ("flags prefill replicas over the quota",
     _model(*LARGE, lambda o: o["spec"]["prefill"].update(replicas=100)),
     ["take requests.cpu 417.456 over the quota's 320 (97.456 short)"]),
    ("flags decode replicas scaled over the quota",
     _model(*LARGE, lambda o: o["spec"].setdefault("scaling", {}).update(maxReplicas=100)),
     ["take requests.cpu 423.256 over the quota's 320 (103.256 short)"]),
    ("flags every pipeline stage of a multi-node replica",
     _then(_quota("tenant-search", lambda h: h.update({"requests.cpu": "29"})),
           _model(*LARGE, lambda o: o["spec"].update(worker={"containers": []}, parallelism={"tensor": 4, "pipeline": 2}))),
     ["take requests.cpu 29.656 over the quota's 29 (0.656 short)"]),
    ("flags a container without resources at the LimitRange's defaults",
     _then(_quota("tenant-search", lambda h: h.update({"requests.cpu": "13"})),
           _model(*LARGE, lambda o: o["spec"]["template"]["containers"][0].pop("resources"))),
     ["take requests.cpu 13.656 over the quota's 13 (0.656 short)"]),
    ("flags a predictor container whose request is its limit",
     _then(_quota("tenant-assistant", lambda h: h.update({"requests.cpu": "14"})),
           _model("InferenceService", "qwen-1-5b", _predictor(lambda p: (p["model"]["resources"]["requests"].pop("cpu"), p["model"]["resources"]["limits"].update(cpu="5"))))),
     ["take requests.cpu 15 over the quota's 14 (1 short)"]),
    ("flags every pod of a large model, its picker included",
     _quota("tenant-search", lambda h: h.update({"count/pods": "5"})),
     ["take 6 pods over the quota's 5 (1 short)"]),
    ("accepts zero prefill replicas",
     _then(_quota("tenant-search", lambda h: h.update({"requests.cpu": "18"})), _model(*LARGE, lambda o: o["spec"]["prefill"].update(replicas=0))),
     []),
    ("flags negative prefill replicas at the default of one",
     _then(_quota("tenant-search", lambda h: h.update({"requests.cpu": "21"})), _model(*LARGE, lambda o: o["spec"]["prefill"].update(replicas=-1))),
     ["take requests.cpu 21.456 over the quota's 21 (0.456 short)"]),
    ("flags the other models beside a container whose CPU is unreadable (counted as none)",
     _then(_quota("tenant-search", lambda h: h.update({"requests.cpu": "10"})),
           _model("InferenceService", "llama-8b", _predictor(lambda p: p["model"]["resources"]["requests"].update(cpu="lots")))),
     ["take requests.cpu 13.456 over the quota's 10 (3.456 short)"]),
    ("accepts memory limits exactly at the quota, an unreadable limit counted as none",
     _then(_quota("tenant-search", lambda h: h.update({"limits.memory": "65.5Gi"})),
           _model("InferenceService", "llama-8b", _predictor(lambda p: p["model"]["resources"]["limits"].update(memory="much")))),
     []),
    ("counts one replica of a predictor stating neither minimum nor maximum",
     _then(_quota("tenant-assistant", lambda h: h.update({"requests.cpu": "3"})), _model("InferenceService", "qwen-1-5b", _predictor(lambda p: (p.pop("minReplicas"), p.pop("maxReplicas"))))),
     ["take requests.cpu 4 over the quota's 3 (1 short)"]),
    ("counts the minimum replicas of a predictor whose maximum is below it",
     _then(_quota("tenant-assistant", lambda h: h.update({"requests.cpu": "7"})), _model("InferenceService", "qwen-1-5b", _predictor(lambda p: p.update(minReplicas=2, maxReplicas=0)))),
     ["take requests.cpu 8 over the quota's 7 (1 short)"]),
    ("counts one decode replica of a large model stating no replicas",
     _then(_quota("tenant-search", lambda h: h.update({"requests.cpu": "17"})), _model(*LARGE, lambda o: (o["spec"].pop("scaling"), o["spec"].pop("replicas", None)))),
     ["take requests.cpu 17.356 over the quota's 17 (0.356 short)"]),
    ("counts one pod per replica of workers stating no pipeline",
     _then(_quota("tenant-search", lambda h: h.update({"requests.cpu": "21"})),
           _model(*LARGE, lambda o: o["spec"].update(worker={"containers": []}, parallelism={"tensor": 4}))),
     ["take requests.cpu 21.456 over the quota's 21 (0.456 short)"]),
    ("counts one pod per replica of workers stating a pipeline of 0",
     _then(_quota("tenant-search", lambda h: h.update({"requests.cpu": "21"})),
           _model(*LARGE, lambda o: o["spec"].update(worker={"containers": []}, parallelism={"tensor": 4, "pipeline": 0}))),
     ["take requests.cpu 21.456 over the quota's 21 (0.456 short)"]),
    ("accepts a quota without a CPU line",
     _then(_quota("tenant-assistant", lambda h: h.pop("requests.cpu")), _model("InferenceService", "qwen-1-5b", _predictor(lambda p: p.update(maxReplicas=20)))),
     []),
    ("accepts malformed replicas and resources (the schema check reports them)",
     _model("InferenceService", "qwen-1-5b", _predictor(lambda p: (p.update(maxReplicas="many", minReplicas=True), p["model"]["resources"]["requests"].update(cpu="lots", memory=[])))),
     []),
    ("accepts a model outside a tenant namespace (model_pods reports it)",
     _then(_quota("tenant-partner-acme", lambda h: h.update({"count/pods": "1"})), _model("InferenceService", "mistral-7b", _moved)),
     []),
]


@pytest.mark.parametrize("change, expected", [r[1:] for r in MODEL_QUOTA], ids=[r[0] for r in MODEL_QUOTA])
def test_model_quota(dev, change, expected):
    found = [str(f) for f in serving_checks.model_quota(change(dev), None)]
    assert len(found) == len(expected), found
    assert all(any(e in f for f in found) for e in expected), found
