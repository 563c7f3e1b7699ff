"""Admission bypasses (issue 21), tried against the rendered Kyverno policies of dev with the
evaluator of `tests/kyverno_engine.py` (no Kyverno engine installs from a package registry; the
module says why and what it evaluates): each row is a request a tenant could send, and whether
the policies must let it through."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ai_factory.components.kyverno import QUEUE_LABEL
from tests.conftest import objects
from tests.kyverno_engine import Request, refusals

SEARCH = "tenant-search"
"""High trust, trust domain internal: granted nvidia.com/gpu, nvidia.com/mig-1g.10gb and nvidia.com/mig-3g.40gb."""
ACME = "tenant-partner-acme"
"""Low trust, on its dedicated nodes, granted nvidia.com/gpu."""
OWN_TOLERATION = {"key": "ai-factory.io/trust-domain", "operator": "Equal", "value": "internal", "effect": "NoSchedule"}
LIFECYCLE = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}


@pytest.fixture(scope="module")
def admission(dev) -> tuple[list[dict], dict[str, dict[str, str]]]:
    namespaces = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in objects(dev, "Namespace")}
    return objects(dev, "ClusterPolicy"), namespaces


def container(**fields: Any) -> dict[str, Any]:
    return {
        "name": "main",
        "image": "nvcr.io/nvidia/pytorch:25.01-py3",
        "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}, "requests": {"cpu": "2", "memory": "8Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        **fields,
    }


def pod(namespace: str = SEARCH, labels: dict | None = None, **spec: Any) -> dict[str, Any]:
    """A tenant GPU pod every policy admits; `spec` replaces fields of its spec."""
    defaults: dict[str, Any] = {"containers": [container()], "tolerations": [OWN_TOLERATION, LIFECYCLE]}
    if namespace == ACME:
        defaults |= {"nodeSelector": {"ai-factory.io/dedicated": "partner-acme"},
                     "tolerations": [{"key": "ai-factory.io/dedicated", "operator": "Equal", "value": "partner-acme", "effect": "NoSchedule"}]}
    meta = {"name": "p", "namespace": namespace, "labels": {QUEUE_LABEL: "default"} if labels is None else labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {**defaults, **spec}}


def job(kind: str = "Job", labels: dict | None = None, owners: list | None = None) -> dict[str, Any]:
    template = {"metadata": {"labels": {QUEUE_LABEL: "default"}}, "spec": {"containers": [container()], "restartPolicy": "Never"}}
    meta: dict[str, Any] = {"name": "j", "namespace": SEARCH, "labels": {QUEUE_LABEL: "default"} if labels is None else labels}
    if owners:
        meta["ownerReferences"] = owners
    if kind == "CronJob":
        return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c", "namespace": SEARCH},
                "spec": {"schedule": "@hourly", "jobTemplate": {"metadata": {"labels": {} if labels == {} else {QUEUE_LABEL: "default"}}, "spec": {"template": template}}}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {"template": template}}


def with_ephemeral(base: dict[str, Any], **fields: Any) -> dict[str, Any]:
    updated = copy.deepcopy(base)
    updated["spec"]["ephemeralContainers"] = [{**container(**fields), "name": "debug", "resources": {}}]
    return updated


def service(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": SEARCH}, "spec": {"ports": [{"port": 80}], **spec}}


FORGED_JOB_OWNER = [{"apiVersion": "batch/v1", "kind": "Job", "name": "x", "uid": "1", "controller": True}]
CRONJOB_OWNER = [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "c", "uid": "2", "controller": True}]

ROWS: list[tuple[str, Request, bool]] = [
    ("a queued GPU pod of its own trust domain", Request(pod()), True),
    ("a queued GPU pod of the untrusted tenant on its dedicated nodes", Request(pod(ACME)), True),
    ("an env escape variable", Request(pod(containers=[container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])])), False),
    ("envFrom a ConfigMap", Request(pod(containers=[container(envFrom=[{"configMapRef": {"name": "gpu-env"}}])])), False),
    ("envFrom a Secret", Request(pod(containers=[container(envFrom=[{"secretRef": {"name": "gpu-env"}, "prefix": "NVIDIA_"}])])), False),
    ("spec.nodeName set on create", Request(pod(nodeName="gpu-h100-01")), False),
    ("spec.nodeName of a scheduled pod, on update", Request(pod(nodeName="gpu-h100-01"), operation="UPDATE"), True),
    ("tolerates nvidia.com/gpu Exists", Request(pod(tolerations=[OWN_TOLERATION, {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])), False),
    ("tolerates a quarantine taint", Request(pod(tolerations=[{"key": "ai-factory.io/quarantine", "operator": "Exists"}])), False),
    ("tolerates unschedulable nodes", Request(pod(tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}])), False),
    ("tolerates every taint", Request(pod(tolerations=[{"operator": "Exists"}])), False),
    ("tolerates another trust domain", Request(pod(tolerations=[{**OWN_TOLERATION, "value": "assistant"}])), False),
    ("tolerates not-ready for ever", Request(pod(tolerations=[{**LIFECYCLE, "tolerationSeconds": None}])), False),
    ("tolerates not-ready for an hour", Request(pod(tolerations=[{**LIFECYCLE, "tolerationSeconds": 3600}])), False),
    ("tolerates not-ready as NoSchedule", Request(pod(tolerations=[{**LIFECYCLE, "effect": "NoSchedule"}])), False),
    ("a GPU pod without a queue", Request(pod(labels={})), False),
    ("a GPU pod without a queue, with a forged Job owner", Request({**pod(labels={}), "metadata": {**pod(labels={})["metadata"], "ownerReferences": FORGED_JOB_OWNER}}), False),
    ("a GPU Job created by a CronJob, without a queue", Request(job(labels={}, owners=CRONJOB_OWNER)), False),
    ("a GPU CronJob whose Jobs carry no queue", Request(job("CronJob", labels={})), False),
    ("a queued GPU Job", Request(job()), True),
    ("a queued GPU CronJob", Request(job("CronJob")), True),
    ("an ephemeral container with an escape variable", Request(with_ephemeral(pod(), env=[{"name": "LD_PRELOAD", "value": "/x.so"}]), operation="UPDATE", subresource="ephemeralcontainers"), False),
    ("an ephemeral container from docker.io", Request(with_ephemeral(pod(), image="docker.io/library/busybox:1"), operation="UPDATE", subresource="ephemeralcontainers"), False),
    ("an ephemeral container running as root", Request(with_ephemeral(pod(), securityContext={"runAsUser": 0}), operation="UPDATE", subresource="ephemeralcontainers"), False),
    ("a compliant ephemeral container", Request(with_ephemeral(pod()), operation="UPDATE", subresource="ephemeralcontainers"), True),
    ("an unknown GPU resource name", Request(pod(containers=[container(resources={"limits": {"nvidia.com/gpumem-percentage": 50}})])), False),
    ("a shared-GPU resource not granted", Request(pod(containers=[container(resources={"limits": {"nvidia.com/gpu.shared": 1}})])), False),
    ("a MIG profile not granted", Request(pod(containers=[container(resources={"requests": {"nvidia.com/mig-2g.20gb": 1}})])), False),
    ("a granted MIG profile, with huge pages", Request(pod(containers=[container(resources={"limits": {"nvidia.com/mig-1g.10gb": 1, "hugepages-2Mi": "1Gi", "memory": "1Gi"}})])), True),
    ("a LoadBalancer Service", Request(service(type="LoadBalancer")), False),
    ("a NodePort Service", Request(service(type="NodePort")), False),
    ("a Service with externalIPs", Request(service(externalIPs=["203.0.113.7"])), False),
    ("a ClusterIP Service", Request(service()), True),
]


@pytest.mark.parametrize("what, request_, admitted", ROWS, ids=[r[0] for r in ROWS])
def test_admission_refuses_the_bypass(admission, what, request_, admitted):
    policies, namespaces = admission
    request_.namespace_labels = namespaces[request_.namespace]
    refused = refusals(policies, request_)
    assert (not refused) is admitted, refused


def test_a_policy_switched_to_audit_refuses_nothing(admission):
    policies, namespaces = admission
    audited = copy.deepcopy(policies)
    for policy in audited:
        for rule in policy["spec"]["rules"]:
            rule["validate"]["failureAction"] = "Audit"
    request_ = Request(pod(nodeName="gpu-h100-01"), namespace_labels=namespaces[SEARCH])
    assert refusals(policies, request_) and not refusals(audited, request_)
