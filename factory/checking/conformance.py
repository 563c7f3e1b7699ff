"""Kubernetes AI Conformance evidence: a filled checklist per cluster and per tenant vCluster,
generated from the rendered configuration, and the validation Jobs a platform team runs after
`pulumi up` (their results, read back from the cluster, are attached to the requirements).

The checklist is the CNCF one for the cluster's Kubernetes minor (`cncf/k8s-ai-conformance`
`docs/AIConformance-<minor>.yaml`, and `kubernetes-sigs/wg-ai-conformance` for 1.37; see
`../shared/reference/landscape.md` section 3). Every requirement is answered:
- `implemented`: the rendered objects that implement it (each `Kind/namespace/name` of the bundle);
- `n/a`: the requirement's context does not apply here, with why (the program's rule: "we do not
  support it" is never a justification);
- `partial` / `not-implemented`: what exists and what is missing, stated plainly.
A MUST that is neither implemented nor justified N/A is a gap: `ai-factory conformance` exits 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from ai_factory.factory.model.config import FactoryConfig
from ai_factory.factory.model.matrix import MatrixVersion
from ai_factory.factory.model.tenancy import tenant_names
from ai_factory.factory.planning.model import HAMI_CORES, HAMI_MEMORY, Plan
from ai_factory.factory.planning.placement import Offering, allocations, offerings
from ai_factory.factory.rendering.bundle import Manifest, Rendered, dump_yaml

Level = Literal["MUST", "SHOULD"]
Status = Literal["implemented", "partial", "not-implemented", "n/a"]
MET: tuple[Status, ...] = ("implemented", "n/a")

CHECKLIST_VERSIONS = ("1.33", "1.34", "1.35", "1.36", "1.37")


@dataclass(frozen=True)
class Requirement:
    id: str
    kar: str
    category: str
    text: str
    levels: dict[str, Level]
    """Per checklist version; absent where the version's checklist does not list it."""


def _levels(spec: str) -> dict[str, Level]:
    """`"- - S S S"`: the level in each of CHECKLIST_VERSIONS (`M`, `S`, or `-` not listed)."""
    return {v: ("MUST" if c == "M" else "SHOULD") for v, c in zip(CHECKLIST_VERSIONS, spec.split()) if c != "-"}


REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement("dra_support", "KAR-0051", "accelerators", "Support the DRA APIs for requests richer than counts.", _levels("S M M - -")),
    Requirement("driver_runtime_management", "KAR-0001", "accelerators", "A verifiable mechanism that keeps compatible accelerator drivers and container-runtime configuration installed.", _levels("- - S S S")),
    Requirement("gpu_sharing", "KAR-0003", "accelerators", "At least one static GPU-sharing strategy (hardware partitions as schedulable resources, or software sharing).", _levels("- - S S S")),
    Requirement("virtualized_accelerator", "KAR-0004", "accelerators", "Expose and manage vGPU-type devices consistently with physical fractional GPUs.", _levels("- - S S S")),
    Requirement("ai_inference", "", "networking", "A Gateway API implementation with advanced traffic management for inference.", _levels("M M M M M")),
    Requirement("advanced_inference_ingress", "KAR-0011", "networking", "The Gateway API Inference Extension: model-aware routing.", _levels("- - - S S")),
    Requirement("high_performance_networking", "KAR-0010", "networking", "Manage and expose specialised NICs (RDMA) with discoverable characteristics, multi-NIC pods.", _levels("- - - S S")),
    Requirement("disaggregated_inference", "KAR-0041", "networking", "Run a prefill/decode-disaggregated serving solution.", _levels("- - - S S")),
    Requirement("gang_scheduling", "KAR-0053", "scheduling", "Install and operate at least one all-or-nothing gang scheduler.", _levels("M M M M M")),
    Requirement("cluster_autoscaling", "KAR-0055", "scheduling", "If an autoscaler exists, it scales accelerator node groups from pending accelerator pods.", _levels("M M M M M")),
    Requirement("pod_autoscaling", "KAR-0057", "scheduling", "HPA works for accelerator pods, including on AI-relevant custom metrics.", _levels("M M M M M")),
    Requirement("accelerator_metrics", "KAR-0059", "observability", "Per-accelerator utilisation and memory (temperature, power, interconnect) on a machine-readable endpoint.", _levels("M M M M M")),
    Requirement("ai_service_metrics", "KAR-0061", "observability", "A monitoring system that discovers and scrapes workloads exposing Prometheus-format metrics.", _levels("M M M M M")),
    Requirement("secure_accelerator_access", "KAR-0049", "security", "Accelerator access from containers isolated and mediated by the device plugin or DRA plus the runtime.", _levels("M M M M M")),
    Requirement("workload_sandboxing", "KAR-0020", "security", "A sandbox strongly isolated from the host kernel for untrusted code.", _levels("- - - - S")),
    Requirement("robust_controller", "KAR-0063", "operator", "At least one complex AI operator with CRDs installs and works: pods run, webhooks work, resources reconcile.", _levels("M M M M M")),
)


def checklist_version(kubernetes: str) -> str:
    """The checklist a cluster of this Kubernetes minor is assessed against: its own, or the
    nearest one published (the first is 1.33)."""
    minor = tuple(int(p) for p in kubernetes.split("."))
    known = [v for v in CHECKLIST_VERSIONS if tuple(int(p) for p in v.split(".")) <= minor]
    return known[-1] if known else CHECKLIST_VERSIONS[0]


@dataclass
class Answer:
    requirement: str
    level: Level
    status: Status
    objects: list[str] = field(default_factory=list)
    """The bundle's objects that implement the requirement (`Kind/namespace/name`)."""
    justification: str = ""
    validation: list[str] = field(default_factory=list)
    """Validation Jobs whose success evidences the requirement (`namespace/name`)."""
    results: dict[str, str] = field(default_factory=dict)
    """Job -> `succeeded`, `failed`, `running` or `not run`, once results are attached."""

    @property
    def met(self) -> bool:
        return self.status in MET and not any(r == "failed" for r in self.results.values())

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.requirement, "level": self.level, "status": self.status}
        if self.objects:
            data["implemented_by"] = self.objects
        if self.justification:
            data["justification"] = self.justification
        if self.validation:
            data["validation"] = [{"job": job, "result": self.results.get(job, "not run")} for job in self.validation]
        return data


@dataclass
class Checklist:
    cluster: str
    version: str
    answers: list[Answer]
    tenant: str | None = None
    """Set for a tenant's vCluster."""
    control_plane: list[str] = field(default_factory=list)
    """The vCluster's own release."""

    @property
    def gaps(self) -> list[Answer]:
        return [a for a in self.answers if a.level == "MUST" and not a.met]

    @property
    def scope(self) -> str:
        return f"vcluster {self.tenant} on cluster {self.cluster}" if self.tenant else f"cluster {self.cluster}"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"cluster": self.cluster}
        if self.tenant:
            data |= {"vcluster": self.tenant, "control_plane": self.control_plane}
        data |= {"checklist": f"KubernetesAIConformance-{self.version}", "answers": [a.to_dict() for a in self.answers]}
        return data


# --------------------------------------------------------------------------- reading the render


class Objects:
    """The rendered objects of one cluster, queried by kind, layer and tenant."""

    def __init__(self, rendered: Rendered):
        self.manifests = rendered.manifests

    def find(self, kind: str, *, layer: str | None = None, tenant: str | None = None, where: Callable[[Manifest], bool] = lambda m: True) -> list[str]:
        return sorted(
            m.ref
            for m in self.manifests
            if m.kind == kind and (layer is None or m.layer == layer) and (tenant is None or m.tenant == tenant) and where(m)
        )

    def release(self, layer: str) -> list[str]:
        return self.find("HelmRelease", layer=layer)

    def values(self, layer: str) -> dict[str, Any]:
        found = [m for m in self.manifests if m.kind == "HelmRelease" and m.layer == layer]
        return (found[0].obj.get("spec") or {}).get("values") or {} if found else {}


def _answer(requirement: Requirement, version: str, objects: list[str], missing: str = "", *, partial: str = "", na: str = "", validation: Iterable[str] = ()) -> Answer:
    """`objects` implement it; `partial` says what is missing beside them; `na` why it does not
    apply; `missing` what would implement it when nothing does."""
    level = requirement.levels[version]
    if na:
        return Answer(requirement.id, level, "n/a", objects, na, list(validation))
    if objects and partial:
        return Answer(requirement.id, level, "partial", objects, partial, list(validation))
    if objects:
        return Answer(requirement.id, level, "implemented", objects, "", list(validation))
    return Answer(requirement.id, level, "not-implemented", [], missing, [])


def cluster_checklist(cluster: str, rendered: Rendered, cfg: FactoryConfig, jobs: list[dict[str, Any]], version: str | None = None) -> Checklist:
    """The checklist of one cluster from its render. `jobs`: its validation Jobs (`validation_jobs`)."""
    version = version or checklist_version(cfg.kubernetes.version)
    o = Objects(rendered)
    by_purpose: dict[str, list[str]] = {}
    for job in jobs:
        for requirement in job["metadata"]["annotations"][EVIDENCES_ANNOTATION].split(","):
            by_purpose.setdefault(requirement, []).append(f"{job['metadata']['namespace']}/{job['metadata']['name']}")
    sharing = {p.sharing for p in cfg.fleet.pools}
    fabrics = sorted({p.topology.fabric for p in cfg.fleet.pools if p.topology.fabric != "ethernet"})
    dcgm = bool(o.values("gpu-operator").get("dcgmExporter", {}).get("enabled"))
    prometheus = o.release("metrics")
    # KServe turns these into KEDA ScaledObjects, whose HPAs read the model's vLLM series from
    # Prometheus through KEDA's external-metrics server (KEDA: a declared cluster prerequisite).
    llm_scaled = o.find(
        "InferenceService", where=lambda m: (m.obj.get("metadata", {}).get("annotations") or {}).get("serving.kserve.io/autoscalerClass") == "keda"
    ) + o.find("LLMInferenceService", where=lambda m: "scaling" in (m.obj.get("spec") or {}))
    kyverno_gpu = o.find("ClusterPolicy", layer="kyverno", where=lambda m: m.name.startswith("tenant-gpu-"))
    answers: dict[str, Callable[[Requirement], Answer]] = {
        "dra_support": lambda r: _answer(
            r, version, o.release("dra") + o.find("DeviceClass") + o.find("ResourceClaimTemplate"),
            "no pool uses `sharing: dra`, so no DRA driver publishes devices; set a pool's sharing to dra to install the NVIDIA DRA driver",
            validation=[j for j in by_purpose.get("dra_support", [])],
        ),
        "driver_runtime_management": lambda r: _answer(
            r, version, o.find("NVIDIADriver") + o.release("gpu-operator"),
            "the GPU Operator layer is off: nothing installs or verifies drivers",
        ),
        "gpu_sharing": lambda r: _answer(
            r, version, (o.release("gpu-operator") if sharing & {"mig", "time-slicing"} else []) + o.release("hami") + o.release("dra"),
            "every pool gives whole GPUs (`sharing: exclusive`); set mig, time-slicing, hami or dra on a pool",
            validation=by_purpose.get("gpu_sharing", []),
        ),
        "virtualized_accelerator": lambda r: _answer(
            r, version, o.release("hami"), "no pool uses HAMi vGPUs (`sharing: hami`); no vGPU devices are exposed",
            validation=by_purpose.get("virtualized_accelerator", []),
        ),
        "ai_inference": lambda r: _answer(
            r, version, o.find("Gateway") + o.find("GatewayClass"),
            "no Gateway API implementation is rendered: the platform's inference gateway (layers.tenancy.platform_flows) "
            "runs outside this library, and Cilium's Gateway API needs kube-proxy replacement, which the Cilium layer does not set",
        ),
        "advanced_inference_ingress": lambda r: _answer(r, version, o.find("InferencePool"), "no Gateway API Inference Extension (InferencePool) is rendered"),
        "high_performance_networking": lambda r: _answer(
            r, version, [],
            f"pools with a {', '.join(fabrics)} fabric carry topology labels, but no NIC operator exposes RDMA devices to pods"
            if fabrics else "no pool has an RDMA fabric and no NIC operator is rendered",
        ),
        "disaggregated_inference": lambda r: _answer(r, version, [], "no prefill/decode-disaggregated serving stack is rendered"),
        "gang_scheduling": lambda r: _answer(
            r, version, o.release("kueue") + o.find("ClusterQueue") + o.release("kai-scheduler") + o.release("volcano"),
            "no scheduling layer (Kueue, KAI Scheduler, Volcano) is on", validation=by_purpose.get("gang_scheduling", []),
        ),
        "cluster_autoscaling": lambda r: _answer(
            r, version, [],
            na="the GPU nodes are a fixed fleet (fleet.pools name or count them; the provisioning layer owns them) and no cluster "
            "autoscaler is installed; the requirement applies where an autoscaler exists",
        ),
        "pod_autoscaling": lambda r: _answer(
            r, version, o.find("Role", where=lambda m: _grants(m.obj, "autoscaling", "horizontalpodautoscalers")) + prometheus + llm_scaled,
            "tenants are not granted HorizontalPodAutoscalers",
            partial="" if llm_scaled else "tenants may create HorizontalPodAutoscalers (autoscaling/v2, served by the API server) on resource "
            "metrics; no model autoscales on an AI signal (a model's `replicas.metric`, through KEDA)",
        ),
        "accelerator_metrics": lambda r: _answer(
            r, version, (o.release("gpu-operator") if dcgm else []) + o.find("ServiceMonitor", layer="metrics", where=lambda m: "hami" in m.name),
            "the DCGM exporter is off (layers.gpu_operator.dcgm_exporter)",
        ),
        "ai_service_metrics": lambda r: _answer(
            r, version, prometheus + o.find("PodMonitor", where=lambda m: m.tenant is not None),
            "the metrics layer is off: no Prometheus discovers workloads (layers.metrics.enabled)",
        ),
        "secure_accelerator_access": lambda r: _answer(
            r, version, (o.release("gpu-operator") if cfg.layers.gpu_operator.enabled else []) + kyverno_gpu,
            "neither the GPU Operator's device plugin settings nor the Kyverno GPU policies are rendered",
            partial="" if kyverno_gpu else "devices are mediated by the device plugin, but no admission policy refuses GPU escapes (layers.kyverno)",
            validation=by_purpose.get("secure_accelerator_access", []),
        ),
        "workload_sandboxing": lambda r: _answer(
            r, version, [], "no sandboxed runtime (gVisor, Kata) is installed; pods may name only the RuntimeClasses of layers.kyverno.runtime_classes"
        ),
        "robust_controller": lambda r: _answer(
            r, version, o.release("kueue") + o.release("kai-scheduler") + o.release("volcano"),
            "no AI operator with CRDs and webhooks is installed", validation=by_purpose.get("robust_controller", []),
        ),
    }
    listed = [r for r in REQUIREMENTS if version in r.levels]
    return Checklist(cluster, version, [answers[r.id](r) for r in listed])


def _grants(role: dict[str, Any], group: str, resource: str) -> bool:
    return any(group in (rule.get("apiGroups") or []) and resource in (rule.get("resources") or []) for rule in role.get("rules") or [])


def tenant_checklists(cluster: Checklist, rendered: Rendered, cfg: FactoryConfig) -> list[Checklist]:
    """One checklist per vCluster tenant: the requirements answered by the tenant's own objects
    where it has them (its queue, quota, metrics scrape, admission policy), inherited from the
    host cluster otherwise (the vCluster syncs pods to the host, where its devices, drivers and
    schedulers are)."""
    o = Objects(rendered)
    result = []
    for tenant in (t for t in cfg.tenants if t.control_plane == "vcluster"):
        own = {
            "gang_scheduling": o.find("LocalQueue", tenant=tenant.name),
            "secure_accelerator_access": o.find("ResourceQuota", tenant=tenant.name) + o.find("ClusterPolicy", tenant=tenant.name),
            "ai_service_metrics": o.find("PodMonitor", tenant=tenant.name),
            "accelerator_metrics": o.find("PrometheusRule", tenant=tenant.name),
            "dra_support": o.find("ResourceClaimTemplate", tenant=tenant.name),
        }
        others = {m.ref for m in o.manifests if m.tenant not in (None, tenant.name)}
        answers = []
        for host in cluster.answers:
            mine = own.get(host.requirement, [])
            shared = [f"{ref} (host)" for ref in host.objects if ref not in others and ref not in mine]
            served = host.status == "implemented" and not mine
            answers.append(
                Answer(
                    host.requirement,
                    host.level,
                    host.status,
                    mine + shared,
                    f"served by the host cluster {cluster.cluster}, where the vCluster's pods run" if served else host.justification if host.status != "implemented" else "",
                    [j for j in host.validation if j.startswith(f"{tenant_names(tenant).namespace}/")],
                )
            )
        result.append(Checklist(cluster.cluster, cluster.version, answers, tenant=tenant.name, control_plane=o.find("HelmRelease", tenant=tenant.name)))
    return result


# --------------------------------------------------------------------------- validation Jobs

VALIDATION_LABEL = "ai-factory.io/validation"
EVIDENCES_ANNOTATION = "ai-factory.io/evidences"
CLUSTER_ANNOTATION = "ai-factory.io/cluster"
"""The cluster of a multi-cluster environment a validation Job is applied to."""
"""Comma-separated requirement ids a validation Job evidences."""
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

NCCL_SCRIPT = """\
import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    tensor = torch.ones(1 << 26, device="cuda")
    dist.all_reduce(tensor)
    assert tensor[0].item() == world, tensor[0].item()
    dist.destroy_process_group()


if __name__ == "__main__":
    world = torch.cuda.device_count()
    assert world >= 2, f"{world} GPU(s) visible"
    mp.spawn(run, args=(world,), nprocs=world)
    print(f"NCCL all-reduce over {world} GPUs: ok")
"""
NO_GPU_SCRIPT = "import sys, torch; n = torch.cuda.device_count(); print(f'{n} GPU(s) visible without a request'); sys.exit(n != 0)"


def _placed(offering: Offering) -> dict[str, Any]:
    """The nodes of the tenant's offering, as Kueue would place the pod there (a low-trust
    tenant's pods must name its dedicated nodes themselves)."""
    return {"nodeSelector": dict(offering.node_labels), "tolerations": [t.toleration() for t in offering.tolerations]}


def _restricted_pod(containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A pod that passes Pod Security `restricted` (tenant namespaces enforce it)."""
    for container in containers:
        container["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": containers,
        **spec,
    }


def _job(name: str, namespace: str, evidences: list[str], pod: dict[str, Any], *, parallelism: int = 1) -> dict[str, Any]:
    labels = {VALIDATION_LABEL: name.removeprefix("aif-validate-"), "app.kubernetes.io/managed-by": "ai-factory", QUEUE_LABEL: "default"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": {EVIDENCES_ANNOTATION: ",".join(evidences)}},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "backoffLimit": 0,
            "activeDeadlineSeconds": 900,
            "template": {"metadata": {"labels": {k: v for k, v in labels.items() if k != "app.kubernetes.io/managed-by"}}, "spec": pod},
        },
    }


SMALL = {"cpu": "500m", "memory": "512Mi"}


def validation_jobs(cfg: FactoryConfig, plan: Plan, version: MatrixVersion) -> list[dict[str, Any]]:
    """The Jobs that show the cluster works as the checklist says, run as a tenant's workloads
    are: in the namespace of a tenant that has quota on the pool, through its LocalQueue, under
    its admission rules. One CUDA smoke test per pool (so per sharing mode), a gang of two pods
    admitted all at once through Kueue, an NCCL all-reduce across the GPUs of one node, and a pod
    that asks for no GPU and must see none."""
    tenants = {t.name: t for t in cfg.tenants}
    grants = allocations(plan, {t.name: t.domain for t in cfg.tenants})
    by_offering = {o.name: o for o in offerings(plan)}
    pools = {p.name: p for p in cfg.fleet.pools}
    jobs: list[dict[str, Any]] = []
    first_whole: tuple[str, str, int, str, Offering] | None = None  # (tenant, resource, count, pool, offering)
    for pool in cfg.fleet.pools:
        if plan.pool(pool.name).vm_resource:
            continue  # its GPUs are passed through to VMs (vfio): no container can use them
        holders = sorted(
            ((name, g) for name, a in grants.items() for g in a.grants if g.pool == pool.name and g.resource not in (HAMI_MEMORY, HAMI_CORES)),
            key=lambda held: (held[0], held[1].resource),
        )
        if not holders:
            continue
        tenant_name, grant = holders[0]
        tenant = tenants[tenant_name]
        names = tenant_names(tenant)
        limits: dict[str, Any] = {grant.resource: 1}
        extra: dict[str, Any] = {}
        if pool.sharing == "hami":
            demand = next(d for d in tenant.gpus if d.pool == pool.name)
            limits |= {HAMI_MEMORY: demand.memory_mib, HAMI_CORES: demand.cores_percent}
        if pool.sharing == "dra":
            limits = {}
            extra = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"{pool.name}-gpu"}]}
        container = {"name": "vectoradd", "image": version.images["cuda-sample"], "resources": {"requests": dict(SMALL), "limits": {**SMALL, **limits}}}
        if pool.sharing == "dra":
            container["resources"]["claims"] = [{"name": "gpu"}]
        evidences = ["secure_accelerator_access"] + {"mig": ["gpu_sharing"], "time-slicing": ["gpu_sharing"], "hami": ["gpu_sharing", "virtualized_accelerator"], "dra": ["dra_support"]}.get(pool.sharing, [])
        offering = by_offering[grant.offering]
        jobs.append(_job(f"aif-validate-cuda-{pool.name}", names.namespace, evidences, _restricted_pod([container], **extra, **_placed(offering))))
        jobs.append(
            _job(
                f"aif-validate-no-gpu-{pool.name}",
                names.namespace,
                ["secure_accelerator_access"],
                _restricted_pod(
                    [{"name": "no-gpu", "image": version.images["pytorch"], "command": ["python", "-c", NO_GPU_SCRIPT], "resources": {"requests": dict(SMALL), "limits": dict(SMALL)}}],
                    **_placed(offering),
                ),
            )
        )
        whole = [(n, g) for n, g in holders if g.resource == "nvidia.com/gpu" and pool.sharing == "exclusive" and g.amount >= 2]
        if whole and first_whole is None:
            first_whole = (whole[0][0], "nvidia.com/gpu", min(whole[0][1].amount, pools[pool.name].gpu.per_node), pool.name, by_offering[whole[0][1].offering])
    if first_whole is not None:
        tenant_name, resource, count, pool_name, offering = first_whole
        namespace = tenant_names(tenants[tenant_name]).namespace
        member = {"name": "member", "image": version.images["cuda-sample"], "resources": {"requests": dict(SMALL), "limits": {**SMALL, resource: 1}}}
        jobs.append(_job(f"aif-validate-gang-{pool_name}", namespace, ["gang_scheduling", "robust_controller"], _restricted_pod([member], **_placed(offering)), parallelism=2))
        nccl = {
            "name": "nccl",
            "image": version.images["pytorch"],
            "command": ["python", "-c", "import pathlib, runpy, sys; pathlib.Path('/work/nccl.py').write_text(sys.argv[1]); runpy.run_path('/work/nccl.py', run_name='__main__')", NCCL_SCRIPT],
            "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "4", "memory": "16Gi", resource: count}},
            "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}, {"name": "work", "mountPath": "/work"}],
        }
        volumes = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}, {"name": "work", "emptyDir": {}}]
        jobs.append(_job(f"aif-validate-nccl-{pool_name}", namespace, ["gang_scheduling"], _restricted_pod([nccl], volumes=volumes, **_placed(offering))))
    return jobs


def job_result(job: dict[str, Any]) -> str:
    """A Job's outcome from its status, as `kubectl get jobs -o yaml` returns it."""
    conditions = {c.get("type"): c.get("status") for c in (job.get("status") or {}).get("conditions") or []}
    if conditions.get("Complete") == "True" or conditions.get("SuccessCriteriaMet") == "True":
        return "succeeded"
    if conditions.get("Failed") == "True" or conditions.get("FailureTarget") == "True":
        return "failed"
    return "running"


def attach_results(checklists: list[Checklist], observed: Iterable[dict[str, Any]]) -> None:
    """Record each validation Job's observed outcome on the answers it evidences."""
    results = {f"{(j.get('metadata') or {}).get('namespace')}/{(j.get('metadata') or {}).get('name')}": job_result(j) for j in observed if isinstance(j, dict)}
    for checklist in checklists:
        for answer in checklist.answers:
            answer.results = {job: results.get(job, "not run") for job in answer.validation}


# --------------------------------------------------------------------------- the report


def report_text(checklists: list[Checklist]) -> str:
    lines = []
    for checklist in checklists:
        gaps = checklist.gaps
        lines.append(f"{checklist.scope}: KubernetesAIConformance-{checklist.version}, {len(gaps)} MUST gap(s)")
        lines += [f"  control plane {ref}" for ref in checklist.control_plane]
        for a in checklist.answers:
            mark = "ok " if a.met else "GAP" if a.level == "MUST" else " - "
            lines.append(f"  {mark} {a.requirement:<28} {a.level:<6} {a.status}")
            for ref in a.objects:
                lines.append(f"        {ref}")
            if a.justification:
                lines.append(f"        why: {a.justification}")
            for job in a.validation:
                lines.append(f"        validated by job {job}: {a.results.get(job, 'not run')}")
        lines.append("")
    return "\n".join(lines)



def write_evidence(out: Path, checklists: list[Checklist], jobs: list[dict[str, Any]]) -> list[str]:
    """`conformance.yaml` (every checklist), `report.txt` and `validation-jobs.yaml` (the Jobs to
    `kubectl apply`) under `out`; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    document = {"checklists": [c.to_dict() for c in checklists]}
    files = {
        "conformance.yaml": dump_yaml(document),
        "report.txt": report_text(checklists),
        "validation-jobs.yaml": "".join(f"---\n{dump_yaml(job)}" for job in jobs),
    }
    for name, text in files.items():
        (out / name).write_text(text)
    return [str(out / name) for name in files]


def read_results(path: Path) -> list[dict[str, Any]]:
    """The Jobs of a `kubectl get jobs -o yaml|json` answer (a `List`), or a plain list of Jobs."""
    from ai_factory.factory.model import bounded_yaml
    from ai_factory.factory.model.loading import ConfigError

    try:
        document = bounded_yaml.read(path)
    except FileNotFoundError:
        raise ConfigError([f"--results: {path}: no such file"], source=str(path)) from None
    except Exception as err:  # bounded_yaml's refusals and YAML syntax errors alike
        raise ConfigError([f"--results: {path}: not a readable YAML or JSON document: {str(err)[:200]}"], source=str(path)) from None
    items = document.get("items") if isinstance(document, dict) else document
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ConfigError([f"--results: {path}: expected a List of Jobs (`kubectl get jobs -o yaml`) or a list of Jobs"], source=str(path))
    return items


def conformance_evidence(env: str, results: Path | None = None, on_resource: Callable[[], None] | None = None) -> tuple[list[Checklist], list[dict[str, Any]]]:
    """The checklists (the cluster's, then one per vCluster tenant) and validation Jobs of an
    environment, with the observed results attached when `results` names them."""
    from ai_factory.factory.model.loading import ConfigError, load_stack_file, stack_file, stack_name
    from ai_factory.factory.model.matrix import load_matrix, selected_version
    from ai_factory.factory.planning.from_config import plan_for, previous_plan
    from ai_factory.factory.rendering.bundle import cluster_stack, render_clusters

    observed = read_results(results) if results is not None else None
    path = stack_file(env)
    cfg = load_stack_file(env)
    version = selected_version(cfg, load_matrix())
    if version is None:
        raise ConfigError([f"matrix.version: {cfg.matrix.version!r} is not a matrix version"], source=str(path))
    checklists: list[Checklist] = []
    jobs: list[dict[str, Any]] = []
    for cluster, rendered in render_clusters(env, on_resource=on_resource).items():
        view = rendered.config
        stack = cluster if cluster == stack_name(path) else cluster_stack(stack_name(path), cluster)
        cluster_jobs = validation_jobs(view, plan_for(view, previous_plan(stack, path.resolve().parent)), version)
        if cluster != stack_name(path):
            for job in cluster_jobs:
                job["metadata"]["annotations"][CLUSTER_ANNOTATION] = cluster
        checklist = cluster_checklist(cluster, rendered, view, cluster_jobs)
        checklists += [checklist, *tenant_checklists(checklist, rendered, view)]
        jobs += cluster_jobs
    if observed is not None:
        attach_results(checklists, observed)
    return checklists, jobs
