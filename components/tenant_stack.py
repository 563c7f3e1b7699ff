"""One tenant in, one isolated environment out: `TenantStack`.

Every tenant gets, on the host cluster:

* its namespace (`tenant-<name>`), Pod Security `restricted` enforced (a reviewed exception may
  lower it to `baseline`, never lower), its owners recorded on it, the default service account's
  token automount off;
* a control plane by trust: namespace mode (a `tenant-admin` Role bound to its OIDC groups and
  users, namespaced, no wildcard, no write on quotas, RBAC, network policies or queues), or a
  vCluster (the pinned chart, hardened: OIDC for its API server, Pod Security enforced by its
  syncer, the stack's quota on its host namespace with every GPU resource, its network policy on,
  no cluster-scoped object synced to the host) whose API server the tenant administers and which
  has no host RBAC at all;
* a `CiliumClusterwideNetworkPolicy`: cluster-scoped, so no tenant can delete it; default deny in
  both directions, then its own namespace, DNS, the platform flows of the config and, for a
  vCluster, the host API server its syncer needs; the cloud metadata address denied outright;
* a ResourceQuota covering CPU, memory, storage, object counts, `services.nodeports: 0` and every
  GPU resource name the platform advertises, each at the tenant's ceiling (`quotas.gpu_ceiling`:
  its grant plus what its ClusterQueue may borrow in its trust domain; 0 where its domain offers
  none), and a LimitRange;
* GPU placement consistent with trust, through two in-tree admission plugins if the host API server
  enables them (`PodNodeSelector`, `PodTolerationRestriction`), configured by namespace
  annotations: a tenant may only tolerate the taints of its trust domain's offerings, the ones its
  queue may borrow on included (so it can never reach another trust domain's shared GPUs or
  another tenant's dedicated nodes), and a
  low-trust tenant's pods are pinned to, and tolerate only, the nodes dedicated to it. Kueue
  flavors put the same selectors and tolerations on queued workloads; the quota backs both up.
  With no dedicated node (no GPU granted), a low-trust tenant's pods stay pending: they never run
  on shared nodes. The tenant's Kyverno admission policy (`kyverno.TenantAdmissionHook`) enforces the
  same tolerations (`placement.tolerable_taints`) and dedicated-node selector where the host API
  server does not enable those plugins; a low-trust tenant's vCluster control plane is pinned to its
  dedicated nodes accordingly.

Other layers add their per-tenant objects (queues, identity, secrets, ...) through `TenantHook`s;
every child of the stack waits for the tenant's namespace.

Deletion: the namespace (and with it the tenant's volumes) and the vCluster release are
protected and retained, so removing a tenant from the config can never silently delete data; the
objects that constrain what runs in the namespace (quota, limits, network policy, service account
setting) are retained with it, so a namespace kept for off-boarding never runs unconfined. Access
(RBAC) is revoked at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal, Mapping, Sequence

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components._common import FactoryComponent, TenantHook, helm_release, labels, namespace, narrowed, yaml_text
from ai_factory.components.dra import CHART_DEVICE_CLASSES, whole_gpu_class
from ai_factory.components.kubevirt import vfio_ceilings
from ai_factory.components.network import vf_class_ceilings
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.model.config import FactoryConfig, Identity, PlatformFlow, Tenant, TenantQuota
from ai_factory.factory.model.matrix import tenant_chart_version
from ai_factory.factory.planning.model import WHOLE_GPU, Plan
from ai_factory.factory.planning.placement import DEDICATED_LABEL, Offering, TenantAllocation, advertised_resources, allocations, dedicated_taint, tolerable_taints
from ai_factory.factory.planning.quotas import GpuCeiling, gpu_ceiling
from ai_factory.factory.model.tenancy import DEFAULT_CONTAINER_LIMIT, DEFAULT_CONTAINER_REQUEST, LABEL_PREFIX, OIDC_PREFIX, TenantNames, tenant_names

TOKEN = "ai-factory:tenancy:TenantStack"
CRD_GROUPS = ("cilium.io",)
"""The CRD groups of the custom resources the stack creates itself (its hooks' are their layers'):
the stack is applied after the layers installing them (`platform.tenant_layers`)."""

OWNERS_ANNOTATION = f"{LABEL_PREFIX}/owners"
DEVICE_CLASS_QUOTA_SUFFIX = ".deviceclass.resource.k8s.io/devices"
"""ResourceQuota counts the devices of a DeviceClass that ResourceClaims request under this name."""
"""JSON list of the RBAC subjects (`{"kind", "name"}`) that own the tenant: how an offline analysis
tells whose subject a binding names. The tenant cannot edit its Namespace, so it cannot forge it."""
POD_SECURITY_EXCEPTION_ANNOTATION = f"{LABEL_PREFIX}/pod-security-exception"
"""On a namespace that enforces `baseline`: the reviewed reason and approver."""
NODE_SELECTOR_ANNOTATION = "scheduler.alpha.kubernetes.io/node-selector"
"""PodNodeSelector admission plugin: merged into every pod's nodeSelector (conflicts rejected)."""
DEFAULT_TOLERATIONS_ANNOTATION = "scheduler.alpha.kubernetes.io/defaultTolerations"
TOLERATIONS_WHITELIST_ANNOTATION = "scheduler.alpha.kubernetes.io/tolerationsWhitelist"
"""PodTolerationRestriction admission plugin: a pod whose tolerations are not all in this list is
rejected (an empty list would mean "anything", so the list always holds the node-lifecycle pair)."""
NODE_LIFECYCLE_TOLERATIONS = (
    # Added to every pod by DefaultTolerationSeconds; harmless (NoExecute on failing nodes).
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
)
NAMESPACE_LABEL = "k8s:io.kubernetes.pod.namespace"
"""The label Cilium gives every endpoint: the namespace of its pod."""
CLOUD_METADATA_CIDRS = ("169.254.169.254/32", "fd00:ec2::254/128")
"""Cloud instance metadata (IPv4, and AWS's IPv6 endpoint): node credentials live there."""
KUBE_DNS = {NAMESPACE_LABEL: "kube-system", "k8s:k8s-app": "kube-dns"}

READ = ("get", "list", "watch")
WRITE = (*READ, "create", "update", "patch", "delete", "deletecollection")
TENANT_ADMIN_RULES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # (API group, resources, verbs). Explicit lists only: what is not here is denied, notably
    # resourcequotas/limitranges (read only), RBAC, NetworkPolicies (additive allow rules would
    # widen the platform's policy), Kueue queues (read only) and every cluster-scoped resource.
    ("", ("configmaps", "persistentvolumeclaims", "pods", "secrets", "serviceaccounts", "services"), WRITE),
    ("", ("pods/attach", "pods/exec", "pods/portforward"), ("create", "get")),
    ("", ("events", "limitranges", "pods/log", "resourcequotas"), READ),
    ("apps", ("deployments", "deployments/scale", "replicasets", "statefulsets", "statefulsets/scale"), WRITE),
    ("autoscaling", ("horizontalpodautoscalers",), WRITE),
    ("batch", ("cronjobs", "jobs"), WRITE),
    ("events.k8s.io", ("events",), READ),
    ("kueue.x-k8s.io", ("localqueues", "workloads"), READ),
    ("policy", ("poddisruptionbudgets",), WRITE),
)

VCLUSTER_UID = 12345
"""The non-root user vCluster's rootless mode runs its control plane as (the chart defaults to
UID 0, which Pod Security `restricted` refuses)."""
VCLUSTER_OSS_IMAGE = "loft-sh/vcluster-oss"
"""The open-source build named by the chart's values (the default image carries the Pro modules)."""


@dataclass(frozen=True)
class VClusterControlPlane:
    """A tenant's own API server: the pinned vCluster chart, trusting the platform's OIDC issuer."""

    chart: ChartSource
    identity: Identity


@dataclass(frozen=True)
class TenantStackArgs:
    tenant: Tenant
    names: TenantNames
    allocation: TenantAllocation
    """What the plan guarantees the tenant (its grants)."""
    offerings: tuple[Offering, ...]
    """The offerings the tenant may be admitted to (`GpuCeiling.offerings`: with Kueue, all of its
    trust domain's): their tolerations are the only ones it may use."""
    gpu_ceilings: dict[str, int]
    """Per GPU resource name, the most it can ever be admitted (`quotas.gpu_ceiling`; absent = 0):
    its quota lines."""
    advertised_resources: tuple[str, ...]
    """Every GPU resource name the platform's nodes advertise: each gets a quota line."""
    device_class_ceilings: dict[str, int]
    """Per DRA DeviceClass of the platform, the most devices the tenant's ResourceClaims may hold
    (its ceiling on the DRA offerings of that class, 0 elsewhere): a quota line each, since
    Kubernetes counts claimed devices there, not under `requests.nvidia.com/gpu`."""
    platform_flows: tuple[PlatformFlow, ...]
    """Platform services the tenant's pods may reach or be reached from, besides DNS."""
    kubernetes_version: str
    """Pins the Pod Security standard version of the namespace."""
    vcluster: VClusterControlPlane | None = None
    """None: namespace mode (host RBAC for the owners)."""
    pod_security_exception: str | None = None
    """The reviewed reason (and approver) for enforcing `baseline`; None enforces `restricted`."""
    hooks: tuple[TenantHook, ...] = ()
    """Other layers' per-tenant objects (queues, identity, secrets, ...)."""

    @property
    def pod_security(self) -> Literal["restricted", "baseline"]:
        return "baseline" if self.pod_security_exception else "restricted"


def tenant_stack_args(cfg: FactoryConfig, plan: Plan, tenant: Tenant, hooks: Sequence[TenantHook]) -> TenantStackArgs:
    allocation = allocations(plan, {tenant.name: tenant.domain})[tenant.name]
    ceiling = gpu_ceiling(cfg, plan, tenant)
    tenancy = cfg.layers.tenancy
    exception = next((e for e in tenancy.pod_security_exceptions if e.tenant == tenant.name), None)
    vcluster = None
    if tenant.control_plane == "vcluster":
        assert cfg.identity is not None, "validation requires `identity` for vCluster tenants"
        chart = tenancy.chart.source("vcluster")
        version = tenant_chart_version(cfg, tenant.upgrade_ring(cfg.upgrades.rings), "vcluster", chart.version)
        vcluster = VClusterControlPlane(chart=replace(chart, version=version), identity=cfg.identity)
    return TenantStackArgs(
        tenant=tenant,
        names=tenant_names(tenant),
        allocation=allocation,
        offerings=ceiling.offerings,
        gpu_ceilings=dict(ceiling.resources),
        advertised_resources=advertised_resources(plan),
        device_class_ceilings=device_class_ceilings(plan, ceiling) | vf_class_ceilings(
            cfg, plan, tenant.name, ceiling.per_offering, {o.name: o.pool for o in ceiling.offerings}) | vfio_ceilings(cfg, tenant.name, ceiling),
        platform_flows=tuple(tenancy.platform_flows),
        kubernetes_version=cfg.kubernetes.version,
        vcluster=vcluster,
        pod_security_exception=f"{exception.reason} (approved by {exception.approved_by})" if exception else None,
        # Each hook narrowed to the tenant: its objects depend on its own data only (and are cached so).
        hooks=tuple(narrowed(h, tenant.name) for h in hooks),
    )


# --------------------------------------------------------------------------- pure builders


def owner_subjects(names: TenantNames) -> list[dict[str, str]]:
    groups = [{"kind": "Group", "name": g} for g in names.group_subjects]
    return groups + [{"kind": "User", "name": u} for u in names.user_subjects]


def device_class_ceilings(plan: Plan, ceiling: GpuCeiling) -> dict[str, int]:
    dra_models = {p.name: p.gpu_model for p in plan.pools if p.sharing == "dra"}
    classes = {whole_gpu_class(model): 0 for model in dra_models.values()}
    if dra_models:
        classes.update(dict.fromkeys(CHART_DEVICE_CLASSES, 0))
    for offering in ceiling.offerings:
        if offering.pool in dra_models:
            classes[whole_gpu_class(offering.gpu_model)] += ceiling.per_offering.get((offering.name, WHOLE_GPU), 0)
    return dict(sorted(classes.items()))


def quota_hard(
    quota: TenantQuota, gpu_ceilings: Mapping[str, int], advertised: Sequence[str], device_classes: Mapping[str, int]
) -> dict[str, str]:
    """ResourceQuota `hard`: the tenant's settings, no NodePort, and one line per advertised GPU
    resource (extended resources are only quota'd as `requests.<name>`) at the tenant's ceiling,
    not its grant, so that what its ClusterQueue admits by borrowing can run; 0 where its trust
    domain offers none."""
    hard = {
        "requests.cpu": quota.cpu,
        "requests.memory": quota.memory,
        "limits.memory": quota.memory,
        "requests.storage": quota.storage,
        "requests.ephemeral-storage": quota.ephemeral_storage,
        "count/pods": str(quota.pods),
        "count/persistentvolumeclaims": str(quota.persistent_volume_claims),
        "count/services": str(quota.services),
        "count/configmaps": str(quota.configmaps),
        "count/secrets": str(quota.secrets),
        "services.loadbalancers": str(quota.load_balancers),
        "services.nodeports": "0",
    }
    for resource in sorted(set(advertised) | set(gpu_ceilings)):
        hard[f"requests.{resource}"] = str(gpu_ceilings.get(resource, 0))
    for device_class, devices in device_classes.items():
        hard[f"{device_class}{DEVICE_CLASS_QUOTA_SUFFIX}"] = str(devices)
    return hard


def allowed_tolerations(args: TenantStackArgs) -> list[dict[str, str]]:
    """The tolerations the tenant's pods may carry: the node-lifecycle ones and its placement taints
    (`placement.tolerable_taints`: its trust domain's offerings', `args.offerings`, and its
    dedicated nodes'), which its Kyverno admission policy enforces too."""
    return [*NODE_LIFECYCLE_TOLERATIONS, *(t.toleration() for t in tolerable_taints(args.names, args.offerings))]


def namespace_annotations(args: TenantStackArgs) -> dict[str, str]:
    annotations = {
        OWNERS_ANNOTATION: _compact(owner_subjects(args.names)),
        TOLERATIONS_WHITELIST_ANNOTATION: _compact(allowed_tolerations(args)),
    }
    if args.names.trust == "low":
        taint = dedicated_taint(args.names)
        annotations[NODE_SELECTOR_ANNOTATION] = f"{taint.key}={taint.value}"
        annotations[DEFAULT_TOLERATIONS_ANNOTATION] = _compact([taint.toleration()])
    if args.pod_security_exception:
        annotations[POD_SECURITY_EXCEPTION_ANNOTATION] = args.pod_security_exception
    return annotations


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _ports(flow_ports) -> list[dict[str, Any]]:
    return [{"ports": [{"port": str(p.port), "protocol": p.protocol} for p in flow_ports]}]


def _peer(flow: PlatformFlow) -> dict[str, Any]:
    return {"matchLabels": {NAMESPACE_LABEL: flow.namespace, **{f"k8s:{k}": v for k, v in sorted(flow.pod_labels.items())}}}


def network_policy_spec(args: TenantStackArgs) -> dict[str, Any]:
    """The tenant's CiliumClusterwideNetworkPolicy: default deny both ways, then explicit allows."""
    own = {"matchLabels": {NAMESPACE_LABEL: args.names.namespace}}
    ingress: list[dict[str, Any]] = [{"fromEndpoints": [own]}]
    egress: list[dict[str, Any]] = [
        {"toEndpoints": [own]},
        {"toEndpoints": [{"matchLabels": dict(KUBE_DNS)}], "toPorts": [{"ports": [{"port": "53", "protocol": "UDP"}, {"port": "53", "protocol": "TCP"}]}]},
    ]
    if args.vcluster:
        # The vCluster syncer talks to the host API server; synced workloads carry only tokens of
        # the virtual API server, which the host one does not accept.
        egress.append({"toEntities": ["kube-apiserver"]})
    for flow in args.platform_flows:
        if flow.direction == "egress":
            egress.append({"toEndpoints": [_peer(flow)], "toPorts": _ports(flow.ports)})
        else:
            ingress.append({"fromEndpoints": [_peer(flow)], "toPorts": _ports(flow.ports)})
    return {
        "description": f"Isolation of tenant {args.names.tenant}: default deny both ways; own namespace, DNS and platform flows only.",
        "endpointSelector": own,
        "enableDefaultDeny": {"ingress": True, "egress": True},
        "ingress": ingress,
        "egress": egress,
        "egressDeny": [{"toCIDR": list(CLOUD_METADATA_CIDRS)}],
    }


def admin_rules() -> list[dict[str, Any]]:
    return [{"apiGroups": [group], "resources": list(resources), "verbs": list(verbs)} for group, resources, verbs in TENANT_ADMIN_RULES]


def _security_contexts() -> tuple[dict[str, Any], dict[str, Any]]:
    """Pod and container security contexts that pass Pod Security `restricted`."""
    identity = {"runAsNonRoot": True, "runAsUser": VCLUSTER_UID, "runAsGroup": VCLUSTER_UID}
    seccomp = {"seccompProfile": {"type": "RuntimeDefault"}}
    pod = {**identity, "fsGroup": VCLUSTER_UID, **seccomp}
    container = {**identity, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, **seccomp}
    return pod, container


def oidc_args(identity: Identity, tenant: str) -> list[str]:
    """kube-apiserver flags: users and groups from the issuer, prefixed so that no identity-provider
    group can ever be taken for a Kubernetes group such as `system:masters`; the tenant's own
    client as audience, so a token issued for another tenant's API server is refused."""
    return [
        f"--oidc-issuer-url={identity.issuer_url}",
        f"--oidc-client-id={identity.vcluster_client_id(tenant)}",
        f"--oidc-username-claim={identity.username_claim}",
        f"--oidc-groups-claim={identity.groups_claim}",
        f"--oidc-username-prefix={OIDC_PREFIX}",
        f"--oidc-groups-prefix={OIDC_PREFIX}",
    ]


def in_vcluster_manifests(args: TenantStackArgs) -> str:
    """Objects applied inside the tenant's vCluster: its owners administer it (and only it)."""
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "tenant-admins", "labels": labels(args.names.tenant, tenant=args.names.tenant)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{**s, "apiGroup": "rbac.authorization.k8s.io"} for s in owner_subjects(args.names)],
    }
    return yaml_text(binding, sort_keys=True)


def vcluster_values(args: TenantStackArgs) -> dict[str, Any]:
    """vCluster chart values (validated against the chart's strict schema by `factory check`)."""
    assert args.vcluster is not None
    pod_context, container_context = _security_contexts()
    off = {"enabled": False}
    statefulset: dict[str, Any] = {
        "image": {"repository": VCLUSTER_OSS_IMAGE},
        "security": {"podSecurityContext": pod_context, "containerSecurityContext": container_context},
    }
    coredns: dict[str, Any] = {"security": {"podSecurityContext": pod_context, "containerSecurityContext": container_context}}
    if args.names.trust == "low":
        # Its Kyverno admission policy admits a low-trust tenant's pods (and pod templates) only on
        # its dedicated nodes, the control plane's included.
        taint = dedicated_taint(args.names)
        statefulset["scheduling"] = {"nodeSelector": {DEDICATED_LABEL: taint.value}, "tolerations": [taint.toleration()]}
        coredns["deployment"] = {"nodeSelector": {DEDICATED_LABEL: taint.value}, "tolerations": [taint.toleration()]}
    return {
        "controlPlane": {
            "distro": {"k8s": {"enabled": True, "apiServer": {"extraArgs": oidc_args(args.vcluster.identity, args.names.tenant)}, "securityContext": container_context}},
            "statefulSet": statefulset,
            "coredns": coredns,
        },
        "sync": {
            "toHost": {
                # Nothing cluster-scoped (or host-wide) is written to the host from inside.
                "namespaces": off,
                "persistentVolumes": off,
                "priorityClasses": off,
                "storageClasses": off,
                "networkPolicies": off,  # allow rules from inside would widen the platform's policy
                "serviceAccounts": off,
                "ingresses": off,
                # The /etc/hosts rewrite is an injected root init container that `restricted` refuses.
                "pods": {"rewriteHosts": off},
            },
            "fromHost": {
                "nodes": {"enabled": False, "syncBackChanges": False},
                "priorityClasses": off,
                "runtimeClasses": off,
            },
        },
        "policies": {
            "podSecurityStandard": args.pod_security,
            # The vCluster's quota is the stack's ResourceQuota on its host namespace, where every
            # synced pod runs: every GPU resource at its ceiling, checked offline. The chart's would
            # be a second host quota whose default lines (`limits.cpu`, refusing every container
            # without a CPU limit) values cannot remove, as Pulumi drops nulls; likewise the
            # stack's LimitRange is the only one (two would make container defaults ambiguous).
            "resourceQuota": off,
            "limitRange": off,
            # Off: the chart's policies cannot be narrowed by values (they are templates; values only
            # add rules) and they open cross-tenant paths: `namespaceSelector: {}` with a pod label
            # any tenant can set (`app: loft`), egress on 443/6443 to every pod, the API server
            # open on 8443 to every pod. Cilium adds Kubernetes allow rules to the cluster-wide
            # deny, so they would widen it. The tenant's Cilium policy (`network_policy_spec`) is
            # all the vCluster needs: its own namespace (control plane, synced workloads,
            # snapshots), kube-dns, the host API server as the `kube-apiserver` entity (its real
            # address), and the platform flows of the config (users' ingress path among them).
            "networkPolicy": off,
        },
        "experimental": {"deploy": {"vcluster": {"manifests": in_vcluster_manifests(args)}}},
        "telemetry": off,
    }


# --------------------------------------------------------------------------- the component


class TenantStack(FactoryComponent):
    """A tenant's isolated environment on the host cluster (see the module docstring)."""

    namespace: pulumi.Output[str]
    group_subjects: pulumi.Output[list[str]]
    local_queue: pulumi.Output[str]
    labels: pulumi.Output[dict[str, str]]
    control_plane: pulumi.Output[str]

    def __init__(self, name: str, args: TenantStackArgs, opts: pulumi.ResourceOptions | None = None):
        names = args.names
        super().__init__(TOKEN, name, layer=f"tenant-{names.tenant}", tenant=names.tenant, opts=opts)
        self.names = names
        self._namespace_resource: k8s.core.v1.Namespace | None = None
        object_labels = labels(self.layer, tenant=names.tenant, extra=names.labels)
        version = f"v{args.kubernetes_version}"
        ns = namespace(
            self,
            names.namespace,
            pod_security=args.pod_security,
            extra_labels={**names.labels, **{f"pod-security.kubernetes.io/{m}-version": version for m in ("enforce", "audit", "warn")}},
            annotations=namespace_annotations(args),
            protect=True,
            retain_on_delete=True,
        )
        self._namespace_resource = ns
        retained = {"retain_on_delete": True}

        def meta(object_name: str) -> dict[str, Any]:
            return {"name": object_name, "namespace": names.namespace, "labels": object_labels}

        k8s.core.v1.ServiceAccountPatch(
            self.child_name("default-service-account"),
            metadata=meta("default"),
            automount_service_account_token=False,
            opts=self.child(**retained),
        )
        hard = quota_hard(args.tenant.quota, args.gpu_ceilings, args.advertised_resources, args.device_class_ceilings)
        k8s.core.v1.ResourceQuota(self.child_name("quota"), metadata=meta("tenant-quota"), spec={"hard": hard}, opts=self.child(**retained))
        k8s.core.v1.LimitRange(
            self.child_name("limits"),
            metadata=meta("tenant-limits"),
            spec={"limits": [{"type": "Container", "default": DEFAULT_CONTAINER_LIMIT, "defaultRequest": DEFAULT_CONTAINER_REQUEST}]},
            opts=self.child(**retained),
        )
        k8s.apiextensions.CustomResource(
            self.child_name("isolation"),
            api_version="cilium.io/v2",
            kind="CiliumClusterwideNetworkPolicy",
            metadata={"name": f"{names.namespace}-isolation", "labels": object_labels},
            spec=network_policy_spec(args),
            opts=self.child(**retained),
        )
        if args.vcluster is None:
            self._namespace_rbac(names, meta)
        else:
            helm_release(
                self,
                f"vcluster-{names.tenant}",
                args.vcluster.chart,
                namespace=names.namespace,
                values=vcluster_values(args),
                protect=True,
                retain_on_delete=True,
            )
        for hook in args.hooks:
            hook.attach(self, args.tenant, names)

        self.namespace = ns.metadata.name
        self.group_subjects = pulumi.Output.from_input(list(names.group_subjects))
        self.local_queue = pulumi.Output.from_input(names.local_queue)
        self.labels = pulumi.Output.from_input(dict(names.labels))
        self.control_plane = pulumi.Output.from_input(names.control_plane)
        self.register_outputs(
            {
                "namespace": self.namespace,
                "group_subjects": self.group_subjects,
                "local_queue": self.local_queue,
                "labels": self.labels,
                "control_plane": self.control_plane,
            }
        )

    def child(self, **options: Any) -> pulumi.ResourceOptions:
        """Options for a child (the stack's own or a hook's): every namespaced object of the tenant
        waits for its namespace."""
        if self._namespace_resource is not None:
            options["depends_on"] = [self._namespace_resource, *(options.get("depends_on") or [])]
        return super().child(**options)

    def _namespace_rbac(self, names: TenantNames, meta) -> None:
        role = k8s.rbac.v1.Role(self.child_name("admin-role"), metadata=meta("tenant-admin"), rules=admin_rules(), opts=self.child())
        k8s.rbac.v1.RoleBinding(
            self.child_name("admin-binding"),
            metadata=meta("tenant-admin"),
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-admin"},
            subjects=[{**s, "apiGroup": "rbac.authorization.k8s.io"} for s in owner_subjects(names)],
            opts=self.child(depends_on=[role]),
        )
