"""AI-conformance evidence: the checklist of each cluster and vCluster names the rendered objects
that implement each requirement (or why it does not apply), and the validation Jobs are objects
a tenant namespace admits."""

from __future__ import annotations

import copy

import pytest
import yaml

from ai_factory.factory.checking import conformance as c
from ai_factory.factory.cli import main
from ai_factory.factory.model.loading import validate
from ai_factory.factory.model.matrix import load_matrix
from ai_factory.factory.planning.from_config import plan_for
from tests.conftest import REPO, objects, render
from tests.kyverno_engine import Request, refusals


def evidence(raw, rendered=None):
    cfg = validate(raw)
    rendered = rendered or render(raw)
    jobs = c.validation_jobs(cfg, plan_for(cfg), load_matrix().newest)
    cluster = c.cluster_checklist("dev", rendered, cfg, jobs)
    return cluster, c.tenant_checklists(cluster, rendered, cfg), jobs


@pytest.fixture(scope="module")
def dev_evidence(dev, dev_raw):
    return evidence(copy.deepcopy(dev_raw[0]), dev)


def answer(checklist: c.Checklist, requirement: str) -> c.Answer:
    return next(a for a in checklist.answers if a.requirement == requirement)


def test_every_requirement_of_the_clusters_checklist_is_answered(dev_evidence):
    cluster, _, _ = dev_evidence
    assert cluster.version == "1.34"
    assert [a.requirement for a in cluster.answers] == [r.id for r in c.REQUIREMENTS if "1.34" in r.levels]
    for a in cluster.answers:
        assert a.objects or a.justification, a.requirement


def test_implementing_objects_are_objects_of_the_render(dev_evidence, dev):
    cluster, tenants, _ = dev_evidence
    refs = {m.ref for m in dev.manifests}
    named = {ref.removesuffix(" (host)") for checklist in [cluster, *tenants] for a in checklist.answers for ref in a.objects}
    assert named and named <= refs


def test_the_dev_clusters_only_must_gap_is_the_missing_dra_driver(dev_evidence):
    cluster, _, _ = dev_evidence
    assert {a.requirement: a.status for a in cluster.gaps} == {"dra_support": "not-implemented"}
    assert answer(cluster, "ai_inference").objects == ["Gateway/inference-gateway/inference-0"]


def test_models_autoscaling_on_an_llm_signal_implement_pod_autoscaling_and_fixed_ones_do_not(dev_evidence, raw):
    assert "InferenceService/tenant-search/llama-8b" in answer(dev_evidence[0], "pod_autoscaling").objects
    raw["layers"]["metrics"] = {"enabled": False}  # no Prometheus: models keep fixed replicas
    a = answer(evidence(raw)[0], "pod_autoscaling")
    assert a.status == "partial" and "no model autoscales on an AI signal" in a.justification


def test_cluster_autoscaling_is_not_applicable_to_a_fixed_fleet_and_says_why(dev_evidence):
    cluster, _, _ = dev_evidence
    a = answer(cluster, "cluster_autoscaling")
    assert a.status == "n/a" and "fixed fleet" in a.justification and a.met


def test_a_dra_pool_implements_dra_support_and_is_smoke_tested_through_its_claim(raw):
    raw["fleet"]["pools"][0]["sharing"] = "dra"
    raw["layers"].pop("slinky")  # Slurm GRES cannot express DRA devices
    cluster, _, jobs = evidence(raw)
    a = answer(cluster, "dra_support")
    assert a.status == "implemented"
    assert any(ref.startswith("DeviceClass/") for ref in a.objects) and any(ref.startswith("ResourceClaimTemplate/") for ref in a.objects)
    job = next(j for j in jobs if j["metadata"]["name"] == "aif-validate-cuda-h100-train")
    assert job["spec"]["template"]["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "h100-train-gpu"}]
    assert "tenant-partner-acme/aif-validate-cuda-h100-train" in a.validation


@pytest.mark.parametrize(
    "kubernetes, version, listed, absent",
    [
        ("1.32", "1.33", "dra_support", "gpu_sharing"),
        ("1.35", "1.35", "gpu_sharing", "advanced_inference_ingress"),
        ("1.36", "1.36", "advanced_inference_ingress", "dra_support"),
        ("1.37", "1.37", "workload_sandboxing", "dra_support"),
    ],
)
def test_the_checklist_is_that_of_the_clusters_kubernetes_minor(kubernetes, version, listed, absent):
    assert c.checklist_version(kubernetes) == version
    ids = {r.id for r in c.REQUIREMENTS if version in r.levels}
    assert listed in ids and absent not in ids


def test_a_vcluster_checklist_names_its_own_objects_and_none_of_another_tenants(dev_evidence):
    _, tenants, _ = dev_evidence
    assert [t.tenant for t in tenants] == ["assistant", "partner-acme"]
    acme = tenants[1]
    assert acme.control_plane == ["HelmRelease/tenant-partner-acme/vcluster-partner-acme"]
    gang = answer(acme, "gang_scheduling")
    assert "LocalQueue/tenant-partner-acme/default" in gang.objects
    named = [ref for a in acme.answers for ref in a.objects]
    assert not [ref for ref in named if "tenant-assistant" in ref or "tenant-search" in ref]
    assert all(job.startswith("tenant-partner-acme/") for a in acme.answers for job in a.validation)


def test_one_cuda_smoke_test_per_pool_and_a_gang_and_an_nccl_test(dev_evidence):
    _, _, jobs = dev_evidence
    names = [j["metadata"]["name"] for j in jobs]
    assert sorted(n for n in names if n.startswith("aif-validate-cuda-")) == ["aif-validate-cuda-a100-mig", "aif-validate-cuda-h100-train", "aif-validate-cuda-l40s-infer"]
    gang = next(j for j in jobs if j["metadata"]["name"].startswith("aif-validate-gang-"))
    assert gang["spec"]["parallelism"] == gang["spec"]["completions"] == 2
    nccl = next(j for j in jobs if j["metadata"]["name"].startswith("aif-validate-nccl-"))
    assert nccl["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_each_sharing_modes_smoke_test_asks_for_its_own_resource(dev_evidence):
    _, _, jobs = dev_evidence
    limits = {j["metadata"]["name"]: j["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] for j in jobs}
    assert limits["aif-validate-cuda-a100-mig"].keys() & {"nvidia.com/mig-1g.20gb", "nvidia.com/mig-2g.20gb"}
    assert limits["aif-validate-cuda-l40s-infer"] | {} == {"cpu": "500m", "memory": "512Mi", "nvidia.com/gpu": 1, "nvidia.com/gpumem": 12288, "nvidia.com/gpucores": 25}
    assert not {k for k in limits["aif-validate-no-gpu-h100-train"] if k.startswith("nvidia.com/")}


def test_validation_jobs_are_valid_objects_their_tenants_policies_admit(dev_evidence, dev, oracles):
    _, _, jobs = dev_evidence
    policies = objects(dev, "ClusterPolicy")
    namespaces = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in objects(dev, "Namespace")}
    for job in jobs:
        assert oracles.validate_object(job, "1.34") == [], job["metadata"]["name"]
        template = job["spec"]["template"]
        ns = job["metadata"]["namespace"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns, "labels": template["metadata"]["labels"]}, "spec": template["spec"]}
        assert refusals(policies, Request(job, namespaces[ns])) == [], job["metadata"]["name"]
        assert refusals(policies, Request(pod, namespaces[ns])) == [], job["metadata"]["name"]


def _job_status(name: str, namespace: str, condition: str) -> dict:
    return {"kind": "Job", "metadata": {"name": name, "namespace": namespace}, "status": {"conditions": [{"type": condition, "status": "True"}]}}


def test_a_failed_validation_job_leaves_its_requirement_unmet(dev_evidence):
    cluster, tenants, _ = copy.deepcopy(dev_evidence)
    c.attach_results([cluster, *tenants], [
        _job_status("aif-validate-gang-h100-train", "tenant-partner-acme", "Failed"),
        _job_status("aif-validate-nccl-h100-train", "tenant-partner-acme", "Complete"),
    ])
    gang = answer(cluster, "gang_scheduling")
    assert gang.results == {"tenant-partner-acme/aif-validate-gang-h100-train": "failed", "tenant-partner-acme/aif-validate-nccl-h100-train": "succeeded"}
    assert not gang.met and "gang_scheduling" in {a.requirement for a in cluster.gaps}
    assert answer(cluster, "secure_accelerator_access").results["tenant-partner-acme/aif-validate-cuda-h100-train"] == "not run"


def test_conformance_writes_the_checklists_the_report_and_the_jobs(tmp_path, capsys):
    results = tmp_path / "jobs.yaml"
    results.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [_job_status("aif-validate-gang-h100-train", "tenant-partner-acme", "Complete")]}))
    out = tmp_path / "evidence"
    assert main(["--project-dir", str(REPO), "conformance", "dev", "-q", "--out", str(out), "--results", str(results)]) == 1  # dev's MUST gaps
    document = yaml.safe_load((out / "conformance.yaml").read_text())
    assert [(d["cluster"], d.get("vcluster")) for d in document["checklists"]] == [
        ("par1-a", None), ("par1-a", "assistant"), ("par1-a", "partner-acme"), ("par1-b", None), ("par1-b", "assistant")
    ]
    gang = next(a for a in document["checklists"][0]["answers"] if a["id"] == "gang_scheduling")
    assert {"job": "tenant-partner-acme/aif-validate-gang-h100-train", "result": "succeeded"} in gang["validation"]
    assert "GAP dra_support" in (out / "report.txt").read_text()
    assert len(list(yaml.safe_load_all((out / "validation-jobs.yaml").read_text()))) == 8
    assert "MUST requirement dra_support is not met" in capsys.readouterr().err


def test_conformance_refuses_an_unreadable_results_file(tmp_path, capsys):
    (tmp_path / "jobs.yaml").write_text("items: 3\n")
    assert main(["--project-dir", str(REPO), "conformance", "dev", "-q", "--out", str(tmp_path / "o"), "--results", str(tmp_path / "jobs.yaml")]) == 2
    assert "--results:" in capsys.readouterr().err and not (tmp_path / "o").exists()
