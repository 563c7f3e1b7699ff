"""Kyverno: admission policies, in Enforce mode, that back tenant isolation.

Written as `ClusterPolicy` (kyverno.io/v1): Kyverno 1.19 serves it alongside the CEL-based
`policies.kyverno.io` kinds, and only it has the `podSecurity` sub-rule (the upstream Pod Security
checks, kept current by Kyverno). Every rule sets `validate.failureAction: Enforce`; every policy
fails closed (`failurePolicy: Fail`, webhook timeout 10 s) and, but `tenant-node-name`, scans
existing objects in the background. `admission-policies-enforced` (policies/aif_policies/
admission.py) expects each of them, by name and rule, offline. They select tenant namespaces by the tenant label, which tenants cannot edit.

Platform-wide policies (one each, whatever the tenants; `PLATFORM_POLICY_NAMES`):
- `tenant-gpu-queue`: a pod, Job or CronJob requesting a GPU resource carries a Kueue queue
  (`kueue.x-k8s.io/queue-name`) itself, on its pod template too: the rule keys on what is
  requested, never on `ownerReferences` (a tenant can forge them) nor on the creator;
- `tenant-node-name`: no pod is created with `spec.nodeName` (it bypasses the scheduler and every
  NoSchedule taint; not in background scans, where every scheduled pod has one);
- `tenant-gpu-escape-env`: no container sets the NVIDIA/HAMi variables that widen GPU access or
  switch HAMi's limits off, nor `LD_PRELOAD`, nor imports variables with `envFrom` (a ConfigMap or
  Secret could carry them unseen);
- `tenant-gpu-device-mounts`: no mount of the device-list path, GPU device nodes, driver or HAMi
  files, and no hostPath volume;
- `tenant-image-registries`: images only from the configured registries (plus vCluster's own, and Slinky's while the slinky layer is on);
- `tenant-service-exposure`: no NodePort or LoadBalancer Service, no `externalIPs` (CVE-2020-8554).

Per tenant (`TenantAdmissionHook`, one `ClusterPolicy` per tenant, created by its stack):
Pod Security at the tenant's level (restricted, or a reviewed baseline exception); an allow-list of
resource names: besides CPU, memory, ephemeral storage and huge pages, only the GPU resources it
can be admitted (`quotas.gpu_ceiling` above 0: granted, or borrowable in its trust domain's
cohort), so a name never advertised is refused too; only the RuntimeClasses of its trust level;
tolerations as an allow-list: of the placement taints (`placement.PLACEMENT_TAINT_KEYS`) only
those it may tolerate (`placement.tolerable_taints`, the list its namespace's
`PodTolerationRestriction` annotation carries: no `Exists` on those keys, no empty-key toleration
of every taint), and of every other taint only the node-lifecycle ones (`NoExecute`, at most 300
s); and, for a low-trust tenant, only pods that select its dedicated nodes (`nodeSelector`
`ai-factory.io/dedicated: <tenant>`). The placement rules hold where the host API server does not
enable the `PodNodeSelector`/`PodTolerationRestriction` plugins the namespace annotations
configure (most managed Kubernetes services do not offer `PodNodeSelector`).

Every pod rule matches `Pod/ephemeralcontainers` as well: ephemeral containers are added through
that subresource, which a rule matching `Pod` alone never sees.

The webhooks exclude kube-system and Kyverno's namespace, and the admission controller runs at
least 3 replicas (with a disruption budget), so a failing webhook cannot lock the cluster out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import FactoryComponent, helm_release, labels, namespace, tenant_entry
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig, RuntimeClasses, Tenant
from ai_factory.factory.planning.model import Plan
from ai_factory.factory.planning.placement import DEDICATED_LABEL, PLACEMENT_TAINT_KEYS, Taint, advertised_resources, tolerable_taints
from ai_factory.factory.planning.quotas import gpu_ceiling
from ai_factory.factory.model.tenancy import TENANT_LABEL, TenantNames, tenant_names
from ai_factory.components import slinky
from ai_factory.components.registry import Layer

TOKEN = "ai-factory:admission:Kyverno"
RELEASE = "kyverno"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
WEBHOOK_TIMEOUT_SECONDS = 10
ESCAPE_VARIABLES = (
    "NVIDIA_VISIBLE_DEVICES",  # picks GPUs outside the allocation (NVIDIA/gpu-operator#700)
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "LD_PRELOAD",  # NVIDIAScape (CVE-2025-23266); also unloads HAMi's shim
    "CUDA_DISABLE_CONTROL",  # switches HAMi's limits off (Project-HAMi/HAMi#636)
    "CUDA_DEVICE_MEMORY_LIMIT*",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_OVERSUBSCRIBE",
    "GPU_CORE_UTILIZATION_POLICY",
)
"""Environment variables no tenant container may set (Kyverno wildcards)."""
FORBIDDEN_MOUNTS = (
    "/var/run/nvidia-container-devices*",  # the device-list strategy `volume-mounts` reads GPUs from here
    "/run/nvidia-container-devices*",
    "/dev/nvidia*",
    "/run/nvidia*",
    "/usr/local/nvidia*",
    "/etc/ld.so.preload",
    "/usr/local/vgpu*",  # HAMi's shim
)
"""Mount paths no tenant container may use."""
IMAGE_REGISTRIES_POLICY = "tenant-image-registries"
PLATFORM_RULES = {
    "tenant-gpu-queue": ("gpu-pods-carry-a-queue", "gpu-jobs-carry-a-queue", "gpu-cronjobs-carry-a-queue"),
    "tenant-node-name": ("no-node-name",),
    "tenant-gpu-escape-env": ("no-gpu-escape-variables",),
    "tenant-gpu-device-mounts": ("no-gpu-device-mounts", "no-host-path"),
    IMAGE_REGISTRIES_POLICY: ("allowed-registries",),
    "tenant-service-exposure": ("no-node-port", "no-load-balancer", "no-external-ips"),
}
"""The platform-wide policies (`platform_policies`) and their rules, each expected by name by the
offline checks."""
PLATFORM_POLICY_NAMES = tuple(PLATFORM_RULES)
STANDARD_TOLERATION_KEYS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
"""Taints every pod may tolerate (`NoExecute`, `Exists`), as the `DefaultTolerationSeconds`
admission plugin adds them, for at most `MAX_TOLERATION_SECONDS`."""
MAX_TOLERATION_SECONDS = 300
"""The plugin's default: how long a tenant pod may stay on a not-ready or unreachable node."""
PLATFORM_PRIORITY_CLASSES = ("system-node-critical", "system-cluster-critical")
"""Kubernetes' own priority classes (every `system-` name is reserved): never a tenant's."""
VCLUSTER_IMAGES = ("ghcr.io/loft-sh/*", "coredns/coredns:*")
"""What a tenant's vCluster runs in its namespace: the control plane and its CoreDNS."""
ALL_CONTAINERS = "request.object.spec.[ephemeralContainers, initContainers, containers][]"
TOLERATIONS = "request.object.spec.tolerations || `[]`"
TOLERATION_KEY = "{{ element.key || '' }}"
TOLERATION_OPERATOR = "{{ element.operator || 'Equal' }}"
TOLERATION_PAIR = "{{ element.key || '' }}={{ element.value || '' }}"
TOLERATION_SECONDS = f"{{{{ element.tolerationSeconds || `{MAX_TOLERATION_SECONDS + 1}` }}}}"
"""A toleration's seconds; without any it tolerates for ever, read as one second over the bound."""
"""A toleration as `key=value` (`key=` for `operator: Exists`), the form of `toleration_pairs`."""
DEDICATED_SELECTOR = f"{{{{ request.object.spec.nodeSelector.\"{DEDICATED_LABEL}\" || '' }}}}"
TENANT_NAMESPACES = {"matchExpressions": [{"key": TENANT_LABEL, "operator": "Exists"}]}
POD_KINDS = ("Pod", "Pod/ephemeralcontainers")
"""What pod rules match: a Pod, and the subresource `kubectl debug` adds ephemeral containers through
(a rule matching `Pod` alone never sees that request)."""
BASE_RESOURCES = ("cpu", "memory", "ephemeral-storage")
"""Resources every tenant may request (with `hugepages-*`): anything else must be granted to it."""
EXTENDED_RESOURCES = (
    "[?!starts_with(@, 'hugepages-') && "
    + " && ".join(f"@ != '{r}'" for r in BASE_RESOURCES)
    + "]"
)
"""JMESPath filter keeping the resource names beyond the base ones (GPU and other device resources)."""
NO_AUTOGEN = {"pod-policies.kyverno.io/autogen-controllers": "none"}


@dataclass(frozen=True)
class KyvernoArgs:
    chart: ChartSource
    namespace: str
    admission_replicas: int
    allowed_registries: tuple[str, ...]
    gpu_resources: tuple[str, ...]
    """Every GPU resource name the platform advertises (`placement.advertised_resources`)."""

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> KyvernoArgs:
        layer = cfg.layers.kyverno
        return cls(
            chart=layer.chart.source("kyverno"),
            namespace=layer.namespace,
            admission_replicas=layer.admission_replicas,
            allowed_registries=tuple(layer.allowed_registries) + (slinky.TENANT_IMAGES if cfg.layers.slinky.enabled else ()),
            gpu_resources=advertised_resources(plan),
        )


def chart_values(args: KyvernoArgs) -> dict[str, Any]:
    return {
        "admissionController": {"replicas": args.admission_replicas},
        "config": {
            "excludeKyvernoNamespace": True,
            "webhooks": {
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", args.namespace]}
                    ]
                }
            },
        },
        # Fail closed: a policy the webhook cannot evaluate rejects the request.
        "features": {"forceFailurePolicyIgnore": {"enabled": False}},
    }


def _in_tenants(*kinds: str, operations: tuple[str, ...] = ()) -> dict[str, Any]:
    resources: dict[str, Any] = {"kinds": list(kinds), "namespaceSelector": TENANT_NAMESPACES}
    if operations:
        resources["operations"] = list(operations)
    return {"any": [{"resources": resources}]}


def _rule(name: str, match: dict[str, Any], message: str, check: dict[str, Any], preconditions: dict | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"name": name, "match": match, "validate": {"failureAction": "Enforce", "message": message, **check}}
    if preconditions:
        rule["preconditions"] = preconditions
    return rule


def _policy_spec(rules: list[dict[str, Any]], background: bool = True) -> dict[str, Any]:
    return {"background": background, "failurePolicy": "Fail", "webhookTimeoutSeconds": WEBHOOK_TIMEOUT_SECONDS, "rules": rules}


def requested_resources(containers: str) -> str:
    """JMESPath (in a Kyverno variable) of every resource name the containers request or limit."""
    return f"{{{{ {containers}.resources.[limits, requests][] | [?@] | [].keys(@) | [] }}}}"


def _any_of(patterns: tuple[str, ...] | list[str]) -> str:
    return " | ".join(patterns)


def platform_policies(args: KyvernoArgs) -> dict[str, tuple[dict[str, str], dict[str, Any]]]:
    """Name -> (annotations, spec) of the policies that hold for every tenant."""
    gpu = list(args.gpu_resources)
    registries = _any_of([*args.allowed_registries, *VCLUSTER_IMAGES])
    queued = {QUEUE_LABEL: "?*"}

    def carries_a_queue(name: str, kinds: tuple[str, ...], what: str, pod_spec: str, pattern: dict[str, Any]) -> dict[str, Any]:
        # Keyed on what is requested, never on ownerReferences (a tenant can forge them) nor on who
        # creates the object (a CronJob's Jobs, a Job's pods carry their template's labels).
        return _rule(
            name,
            _in_tenants(*kinds),
            f"{what} requesting a GPU must name its Kueue queue with the label {QUEUE_LABEL} (on a workload's pod template too).",
            {"pattern": pattern},
            {"all": [{"key": requested_resources(f"{pod_spec}.[ephemeralContainers, initContainers, containers][]"), "operator": "AnyIn", "value": gpu}]},
        )

    return {
        "tenant-gpu-queue": (
            NO_AUTOGEN,
            _policy_spec(
                [
                    carries_a_queue("gpu-pods-carry-a-queue", POD_KINDS, "A pod", "request.object.spec", {"metadata": {"labels": queued}}),
                    carries_a_queue("gpu-jobs-carry-a-queue", ("Job",), "A Job", "request.object.spec.template.spec", {"metadata": {"labels": queued}}),
                    carries_a_queue(
                        "gpu-cronjobs-carry-a-queue",
                        ("CronJob",),
                        "A CronJob",
                        "request.object.spec.jobTemplate.spec.template.spec",
                        {"spec": {"jobTemplate": {"metadata": {"labels": queued}}}},
                    ),
                ]
            ),
        ),
        "tenant-node-name": (
            {},
            # Not in background scans: every scheduled pod has a nodeName, set by the scheduler's binding.
            _policy_spec(
                [
                    _rule(
                        "no-node-name",
                        _in_tenants("Pod", operations=("CREATE",)),
                        "Tenant pods may not set spec.nodeName: it bypasses the scheduler and every NoSchedule taint.",
                        {"deny": {"conditions": {"any": [{"key": "{{ request.object.spec.nodeName || '' }}", "operator": "NotEquals", "value": ""}]}}},
                    )
                ],
                background=False,
            ),
        ),
        "tenant-gpu-escape-env": (
            {},
            _policy_spec(
                [
                    _rule(
                        "no-gpu-escape-variables",
                        _in_tenants(*POD_KINDS),
                        "Containers may not set NVIDIA device-selection, HAMi control or preload variables, nor import variables "
                        "with envFrom (a ConfigMap or Secret could carry them): GPUs come from the device plugin only.",
                        {
                            "foreach": [
                                {
                                    "list": ALL_CONTAINERS,
                                    "deny": {
                                        "conditions": {
                                            "any": [
                                                {"key": "{{ element.env[].name || `[]` }}", "operator": "AnyIn", "value": list(ESCAPE_VARIABLES)},
                                                {"key": "{{ length(element.envFrom || `[]`) }}", "operator": "GreaterThan", "value": 0},
                                            ]
                                        }
                                    },
                                }
                            ]
                        },
                    )
                ]
            ),
        ),
        "tenant-gpu-device-mounts": (
            {},
            _policy_spec(
                [
                    _rule(
                        "no-gpu-device-mounts",
                        _in_tenants(*POD_KINDS),
                        "Containers may not mount the GPU device list, device nodes, driver or HAMi files.",
                        {
                            "foreach": [
                                {
                                    "list": ALL_CONTAINERS,
                                    "deny": {
                                        "conditions": {
                                            "any": [{"key": "{{ element.volumeMounts[].mountPath || `[]` }}", "operator": "AnyIn", "value": list(FORBIDDEN_MOUNTS)}]
                                        }
                                    },
                                }
                            ]
                        },
                    ),
                    _rule(
                        "no-host-path",
                        _in_tenants(*POD_KINDS),
                        "hostPath volumes are not allowed in tenant namespaces.",
                        {"pattern": {"spec": {"=(volumes)": [{"X(hostPath)": "null"}]}}},
                    ),
                ]
            ),
        ),
        IMAGE_REGISTRIES_POLICY: (
            {},
            _policy_spec(
                [
                    _rule(
                        "allowed-registries",
                        _in_tenants(*POD_KINDS),
                        "Images must come from the platform's allowed registries.",
                        {
                            "pattern": {
                                "spec": {
                                    "=(ephemeralContainers)": [{"image": registries}],
                                    "=(initContainers)": [{"image": registries}],
                                    "containers": [{"image": registries}],
                                }
                            }
                        },
                    )
                ]
            ),
        ),
        "tenant-service-exposure": (
            {},
            _policy_spec(
                [
                    _rule("no-node-port", _in_tenants("Service"), "NodePort Services are not allowed for tenants.", {"pattern": {"spec": {"=(type)": "!NodePort"}}}),
                    _rule(
                        "no-load-balancer",
                        _in_tenants("Service"),
                        "LoadBalancer Services are not allowed for tenants: they expose services through the platform's gateway.",
                        {"pattern": {"spec": {"=(type)": "!LoadBalancer"}}},
                    ),
                    _rule(
                        "no-external-ips",
                        _in_tenants("Service"),
                        "Services may not set externalIPs (CVE-2020-8554).",
                        {"pattern": {"spec": {"X(externalIPs)": "null"}}},
                    ),
                ]
            ),
        ),
    }


class Kyverno(FactoryComponent):
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: KyvernoArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="kyverno", opts=opts)
        ns = namespace(self, args.namespace, pod_security="restricted")
        release = helm_release(self, RELEASE, args.chart, namespace=ns.metadata.name, values=chart_values(args), depends_on=[ns])
        for policy, (policy_annotations, spec) in platform_policies(args).items():
            k8s.apiextensions.CustomResource(
                self.child_name(policy),
                api_version="kyverno.io/v1",
                kind="ClusterPolicy",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=policy, labels=labels(self.layer), annotations=dict(policy_annotations) or None),
                spec=spec,
                opts=self.child(depends_on=[release]),
            )
        self.namespace = ns.metadata.name
        self.register_outputs({"namespace": self.namespace})


def tenant_policy_name(namespace: str) -> str:
    """The name of a tenant's own ClusterPolicy, from its namespace."""
    return f"{namespace}-admission"


def toleration_pairs(taints: Sequence[Taint]) -> list[str]:
    """The `key=value` pairs (`TOLERATION_PAIR`) of the placement taints a tenant may tolerate."""
    return [f"{t.key}={t.value}" for t in taints]


POD_SECURITY_RULE = "pod-security"
"""The first rule of a tenant's policy; its `match` (the tenant's own pods) is every rule's."""
GPU_RESOURCES_RULE = "granted-gpu-resources"
"""The rule of a tenant's policy that denies the GPU resource names it cannot be admitted."""
TOLERATIONS_RULE = "placement-tolerations"
"""The rule of a tenant's policy that allows only its placement taints' `key=value` pairs."""
RUNTIME_CLASSES_RULE = "runtime-classes"
DEDICATED_NODES_RULE = "dedicated-nodes"
TENANT_RULES = (POD_SECURITY_RULE, GPU_RESOURCES_RULE, RUNTIME_CLASSES_RULE, TOLERATIONS_RULE)
"""The rules of every tenant's policy (a low-trust tenant's has `DEDICATED_NODES_RULE` too)."""


def granted_gpu_resources_rule(tenant: str, match: dict[str, Any], granted: list[str]) -> dict[str, Any]:
    """A tenant's rule allowing the pods `match` selects, besides the base resources
    (`BASE_RESOURCES`, `hugepages-*`), only the resource names `granted` (those of its ceiling):
    an allow-list, so a name the platform never advertised (`nvidia.com/gpumem-percentage`) is
    refused too. Its only variable part is that list."""
    return _rule(
        GPU_RESOURCES_RULE,
        match,
        f"Tenant {tenant} may only request the GPU resources its trust domain offers it (granted or borrowable): "
        f"{', '.join(granted) or 'none'}, besides CPU, memory, ephemeral storage and huge pages.",
        {
            "foreach": [
                {
                    "list": ALL_CONTAINERS,
                    "deny": {
                        "conditions": {
                            "any": [
                                {"key": f"{{{{ keys(element.resources.{kind} || `{{}}`){EXTENDED_RESOURCES} }}}}", "operator": "AnyNotIn", "value": granted}
                                for kind in ("limits", "requests")
                            ]
                        }
                    },
                }
            ]
        },
    )


def placement_tolerations_rule(tenant: str, match: dict[str, Any], pairs: list[str]) -> dict[str, Any]:
    """A tenant's rule allowing the pods `match` selects only the placement-taint tolerations
    `pairs` (`toleration_pairs`) and, of every other taint, only the node-lifecycle ones
    (`STANDARD_TOLERATION_KEYS`, `NoExecute`, at most `MAX_TOLERATION_SECONDS`): an allow-list.
    Its only variable part is `pairs`."""
    return _rule(
        TOLERATIONS_RULE,
        match,
        f"Tenant {tenant} may tolerate the placement taints ({', '.join(PLACEMENT_TAINT_KEYS)}) only as "
        f"{', '.join(pairs) or 'nothing'} (operator Equal), no taint at all with an empty key, and otherwise only "
        f"{' and '.join(STANDARD_TOLERATION_KEYS)} (Exists, NoExecute, at most {MAX_TOLERATION_SECONDS} seconds).",
        {
            "foreach": [
                {
                    "list": TOLERATIONS,
                    # An empty key (with `Exists`) tolerates every taint: checked like a placement key.
                    "preconditions": {"any": [{"key": TOLERATION_KEY, "operator": "AnyIn", "value": ["", *PLACEMENT_TAINT_KEYS]}]},
                    "deny": {
                        "conditions": {
                            "any": [
                                {"key": TOLERATION_OPERATOR, "operator": "NotEquals", "value": "Equal"},
                                {"key": TOLERATION_PAIR, "operator": "AnyNotIn", "value": pairs},
                            ]
                        }
                    },
                },
                {
                    "list": TOLERATIONS,
                    "preconditions": {"all": [{"key": TOLERATION_KEY, "operator": "AnyNotIn", "value": ["", *PLACEMENT_TAINT_KEYS]}]},
                    "deny": {
                        "conditions": {
                            "any": [
                                {"key": TOLERATION_KEY, "operator": "AnyNotIn", "value": list(STANDARD_TOLERATION_KEYS)},
                                {"key": TOLERATION_OPERATOR, "operator": "NotEquals", "value": "Exists"},
                                {"key": "{{ element.effect || '' }}", "operator": "NotEquals", "value": "NoExecute"},
                                {"key": TOLERATION_SECONDS, "operator": "GreaterThan", "value": MAX_TOLERATION_SECONDS},
                            ]
                        }
                    },
                },
            ]
        },
    )


def tenant_policy_spec(
    names: TenantNames, pod_security: str, granted_gpu: list[str], runtime_classes: list[str], tolerable: Sequence[Taint]
) -> dict[str, Any]:
    """The tenant's own admission rules. `tolerable`: the placement taints it may tolerate
    (`placement.tolerable_taints`)."""
    own = {"any": [{"resources": {"kinds": list(POD_KINDS), "namespaces": [names.namespace]}}]}
    rules = [
        _rule(
            POD_SECURITY_RULE,
            own,
            f"Pods of tenant {names.tenant} must meet Pod Security {pod_security}.",
            {"podSecurity": {"level": pod_security, "version": "latest"}},
        )
    ]
    rules.append(granted_gpu_resources_rule(names.tenant, own, granted_gpu))
    runtime = {"=(runtimeClassName)": _any_of(runtime_classes)} if runtime_classes else {"X(runtimeClassName)": "null"}
    rules.append(
        _rule(
            RUNTIME_CLASSES_RULE,
            own,
            f"Tenant {names.tenant} ({names.trust} trust) may only use the RuntimeClasses: {', '.join(runtime_classes) or 'none'}.",
            {"pattern": {"spec": runtime}},
        )
    )
    rules.append(placement_tolerations_rule(names.tenant, own, toleration_pairs(tolerable)))
    if names.trust == "low":
        rules.append(
            _rule(
                DEDICATED_NODES_RULE,
                own,
                f"Pods of untrusted tenant {names.tenant} must select its dedicated nodes: nodeSelector {DEDICATED_LABEL}: {names.tenant} "
                f"(and tolerate the taint {DEDICATED_LABEL}={names.tenant}:NoSchedule).",
                {"deny": {"conditions": {"any": [{"key": DEDICATED_SELECTOR, "operator": "NotEquals", "value": names.tenant}]}}},
            )
        )
    return _policy_spec(rules)


@dataclass(frozen=True)
class TenantAdmissionHook:
    """A tenant's ClusterPolicy: cluster-scoped, so the tenant cannot delete it."""

    gpu_resources: tuple[str, ...]
    allowed: Mapping[str, tuple[str, ...]]
    """Tenant name -> the GPU resource names it can be admitted (ceiling above 0, `quotas.gpu_ceiling`)."""
    runtime_classes: RuntimeClasses
    baseline_tenants: frozenset[str]
    """Tenants with a reviewed Pod Security `baseline` exception."""
    tolerable: Mapping[str, tuple[Taint, ...]]
    """Tenant name -> the placement taints it may tolerate (`placement.tolerable_taints` of the
    offerings of its ceiling, as its stack's namespace annotations)."""
    layer: str = "kyverno"

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> TenantAdmissionHook:
        ceilings = {t.name: gpu_ceiling(cfg, plan, t) for t in cfg.tenants}
        return cls(
            gpu_resources=advertised_resources(plan),
            allowed={t.name: tuple(r for r, n in ceilings[t.name].resources.items() if n > 0) for t in cfg.tenants},
            runtime_classes=cfg.layers.kyverno.runtime_classes,
            baseline_tenants=frozenset(e.tenant for e in cfg.layers.tenancy.pod_security_exceptions),
            tolerable={t.name: tolerable_taints(tenant_names(t), ceilings[t.name].offerings) for t in cfg.tenants},
        )

    def narrowed(self, tenant: str) -> TenantAdmissionHook:
        """Only the tenant's own GPU resources, exception and taints (see `TenantHook`)."""
        return replace(self, allowed=tenant_entry(self.allowed, tenant), baseline_tenants=self.baseline_tenants & {tenant}, tolerable=tenant_entry(self.tolerable, tenant))

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None:
        allowed = set(self.allowed.get(names.tenant, ()))
        spec = tenant_policy_spec(
            names,
            "baseline" if names.tenant in self.baseline_tenants else "restricted",
            [r for r in self.gpu_resources if r in allowed],
            list(getattr(self.runtime_classes, names.trust)),
            self.tolerable.get(names.tenant, ()),
        )
        k8s.apiextensions.CustomResource(
            stack.child_name("admission"),
            api_version="kyverno.io/v1",
            kind="ClusterPolicy",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=tenant_policy_name(names.namespace), labels=labels(stack.layer, tenant=names.tenant, extra=names.labels)),
            spec=spec,
            opts=stack.child(),
        )


LAYER = Layer(
    name="kyverno",
    section="kyverno",
    chart="kyverno",
    component=Kyverno,
    args=KyvernoArgs.from_config,
    requires=("fleet",),
    tenant_hook=TenantAdmissionHook.from_config,
)
