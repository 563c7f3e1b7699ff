"""Tenant workloads: every pod template in a tenant's namespace (Pods, Deployments, StatefulSets,
Jobs, CronJobs and the pod templates custom resources embed) is held, before admission, to what
admission enforces: Pod Security at the namespace's level with nothing switched back on, resources
requested, images from the allowed registries, and placement only where the tenant may go.

A tenant is a namespace labelled `ai-factory.io/tenant`; what the tenant may tolerate is its
namespace's `PodTolerationRestriction` whitelist (the same list its Kyverno rule carries,
`placement.tolerable_taints`); the allowed registries are those of the rendered
`tenant-image-registries` Kyverno policy. Chart values are not read: a Helm release's pods are
the platform's (a tenant's vCluster is checked by `vcluster-hardening`).

References: shared/reference/security-and-reliability.md (sections 2.1 and 2.3; checks 15-22 and
39 of its last section); the Pod Security Standards (baseline and restricted controls).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, Iterator

from pulumi_policy import PolicyResource

from ai_factory.components.kyverno import (
    IMAGE_REGISTRIES_POLICY,
    MAX_TOLERATION_SECONDS,
    PLATFORM_PRIORITY_CLASSES,
    STANDARD_TOLERATION_KEYS,
)
from ai_factory.components.tenant_stack import TOLERATIONS_WHITELIST_ANNOTATION
from ai_factory.policies.aif_policies.core import Violation, stack_policy
from ai_factory.policies.aif_policies.kube import Cluster, Obj, as_list, as_map, containers, pod_specs, runs_pods, cluster_of

POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
SAFE_SYSCTLS = frozenset(
    # Pod Security baseline, "Sysctls": the namespaced sysctls the kubelet allows by default.
    {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
     "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
     "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
)
BASELINE_CAPABILITIES = frozenset(
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
SAFE_SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"})
"""Pod Security restricted, "Volume Types": the only volume sources a restricted pod may use."""
REQUIRED_RESOURCES = (("requests", "cpu"), ("requests", "memory"), ("limits", "memory"))
"""What every tenant container states, so that quota and scheduling see its real size."""


def tenant_workloads(cluster: Cluster) -> Iterable[tuple[Obj, str, str, Mapping[str, Any]]]:
    """(object, tenant, namespace, pod spec) of every pod template in a tenant's namespace, read
    once for the four policies on tenant pods."""
    return cluster.once("tenant-workloads", lambda: _tenant_workloads(cluster))


def _tenant_workloads(cluster: Cluster) -> Iterator[tuple[Obj, str, str, Mapping[str, Any]]]:
    for obj in cluster.objects:
        tenant = cluster.tenant_of_namespace(obj.namespace)
        if tenant is None or not runs_pods(obj.resource.resource_type):
            continue
        for spec in pod_specs(as_map(obj.props.get("spec"))):
            yield obj, tenant.name, str(obj.namespace), spec


def _where(obj: Obj, tenant: str) -> str:
    return f"{obj.describe()} of tenant {tenant}"


# --------------------------------------------------------------------------- tenant-pod-security-context


def _context(value: Any) -> Mapping[str, Any]:
    return as_map(as_map(value).get("securityContext"))


def security_context_problems(spec: Mapping[str, Any], level: str, read_only_root: bool) -> Iterator[str]:
    """What a pod spec switches on that Pod Security `level` (baseline or restricted) forbids, and
    a writable root filesystem where `read_only_root` is required."""
    pod = _context(spec)
    if spec.get("automountServiceAccountToken") is True:
        yield "mounts its service account token (automountServiceAccountToken: true)"
    for sysctl in as_list(pod.get("sysctls")):
        name = as_map(sysctl).get("name")
        if name not in SAFE_SYSCTLS:
            yield f"sets the unsafe sysctl {name}"
    if level == "restricted":
        for volume in as_list(spec.get("volumes")):
            sources = sorted(set(as_map(volume)) - {"name"} - RESTRICTED_VOLUMES)
            if sources:
                yield f"volume {as_map(volume).get('name')} is of type {', '.join(sources)}, which Pod Security restricted does not allow"
    allowed_capabilities = RESTRICTED_CAPABILITIES if level == "restricted" else BASELINE_CAPABILITIES
    for container in containers(spec):
        name, own = container.get("name"), _context(container)
        where = f"container {name}"
        run_as_user = own.get("runAsUser", pod.get("runAsUser"))
        run_as_non_root = own.get("runAsNonRoot", pod.get("runAsNonRoot"))
        if run_as_user == 0:
            yield f"{where} runs as root (runAsUser: 0)"
        if run_as_non_root is False or (level == "restricted" and run_as_non_root is not True):
            yield f"{where} may run as root (runAsNonRoot is {run_as_non_root!r}, not true)"
        escalation = own.get("allowPrivilegeEscalation")
        if escalation is True or (level == "restricted" and escalation is not False):
            yield f"{where} allows privilege escalation (allowPrivilegeEscalation is {escalation!r}, not false)"
        seccomp = as_map(own.get("seccompProfile") or pod.get("seccompProfile")).get("type")
        if seccomp == "Unconfined" or (level == "restricted" and seccomp not in ("RuntimeDefault", "Localhost")):
            yield f"{where} runs with seccomp profile {seccomp or 'unset'} (RuntimeDefault or Localhost required)"
        if own.get("procMount") not in (None, "Default"):
            yield f"{where} sets procMount {own.get('procMount')}"
        capabilities = as_map(own.get("capabilities"))
        added = sorted({str(c) for c in as_list(capabilities.get("add"))} - allowed_capabilities)
        if added:
            yield f"{where} adds the capabilities {', '.join(added)}"
        if level == "restricted" and "ALL" not in as_list(capabilities.get("drop")):
            yield f"{where} does not drop ALL capabilities"
        apparmor = as_map(own.get("appArmorProfile") or pod.get("appArmorProfile")).get("type")
        if apparmor == "Unconfined":
            yield f"{where} runs with AppArmor profile Unconfined"
        selinux = as_map(own.get("seLinuxOptions") or pod.get("seLinuxOptions"))
        if selinux.get("type", "") not in SAFE_SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            yield f"{where} sets custom SELinux options"
        if as_map(own.get("windowsOptions") or pod.get("windowsOptions")).get("hostProcess") is True:
            yield f"{where} is a Windows host process"
        if read_only_root and own.get("readOnlyRootFilesystem") is not True:
            yield f"{where} has a writable root filesystem (readOnlyRootFilesystem is not true)"


def check_tenant_pod_security_context(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    for obj, tenant, namespace, spec in tenant_workloads(cluster):
        level = str(cluster.namespace_labels.get(namespace, {}).get(POD_SECURITY_ENFORCE) or "restricted")
        low_trust = cluster.tenants[tenant].trust == "low"
        for problem in security_context_problems(spec, level, read_only_root=low_trust):
            yield obj.resource, f"{_where(obj, tenant)}: {problem}: its namespace enforces Pod Security {level}" + (
                " and an untrusted tenant's containers keep a read-only root filesystem." if low_trust else "."
            )


# --------------------------------------------------------------------------- tenant-pod-resources


def missing_resources(container: Mapping[str, Any]) -> list[str]:
    resources = as_map(container.get("resources"))
    return [f"{kind}.{name}" for kind, name in REQUIRED_RESOURCES if as_map(resources.get(kind)).get(name) is None]


def check_tenant_pod_resources(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    for obj, tenant, _, spec in tenant_workloads(cluster_of(resources)):
        for key in ("initContainers", "containers"):  # ephemeral containers take no resources
            for container in as_list(spec.get(key)):
                missing = missing_resources(as_map(container))
                if missing:
                    yield obj.resource, (
                        f"{_where(obj, tenant)}: container {as_map(container).get('name')} does not set {', '.join(missing)}: "
                        "a tenant container states what it uses, so that its quota and the scheduler see it."
                    )


# --------------------------------------------------------------------------- tenant-pod-registries


def allowed_registries(cluster: Cluster) -> list[str] | None:
    """The image patterns of the rendered `tenant-image-registries` policy, None without one."""
    for policy in cluster.of("ClusterPolicy"):
        if policy.name != IMAGE_REGISTRIES_POLICY:
            continue
        patterns: set[str] = set()
        for rule in as_list(policy.spec.get("rules")):
            for pod_spec in pod_specs(as_map(as_map(as_map(rule).get("validate")).get("pattern"))):
                for container in containers(pod_spec):
                    patterns |= {p.strip() for p in str(container.get("image") or "").split("|") if p.strip()}
        return sorted(patterns)
    return None


def check_tenant_pod_registries(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    patterns = allowed_registries(cluster)
    if patterns is None:
        return  # no admission list to hold pods to: `admission-policies-enforced` reports its absence
    for obj, tenant, _, spec in tenant_workloads(cluster):
        for container in containers(spec):
            image = str(container.get("image") or "")
            if not any(fnmatchcase(image, p) for p in patterns):
                yield obj.resource, (
                    f"{_where(obj, tenant)}: container {container.get('name')} runs {image or 'no image'}, which is not from the "
                    f"allowed registries ({', '.join(patterns)})."
                )


# --------------------------------------------------------------------------- tenant-pod-placement


def whitelist(cluster: Cluster, namespace: str) -> list[Mapping[str, Any]]:
    """The tolerations a tenant namespace's `PodTolerationRestriction` whitelist allows (none when
    unreadable: then no toleration is allowed, and `gpu-placement` reports the namespace)."""
    namespace_obj = next((n for n in cluster.of("Namespace") if n.name == namespace), None)
    annotations = as_map(as_map(namespace_obj.props.get("metadata")).get("annotations")) if namespace_obj else {}
    try:
        listed = json.loads(str(annotations.get(TOLERATIONS_WHITELIST_ANNOTATION) or "[]"))
    except ValueError:
        return []
    return [as_map(t) for t in as_list(listed)]


def covers(allowed: Mapping[str, Any], toleration: Mapping[str, Any]) -> bool:
    """Whether a whitelist entry allows a toleration (Kubernetes' `Toleration.IsSuperset`)."""
    if allowed.get("key", "") != toleration.get("key", ""):
        return False
    if allowed.get("effect") and allowed.get("effect") != toleration.get("effect"):
        return False
    if (allowed.get("operator") or "Equal") == "Exists":
        return True
    return (toleration.get("operator") or "Equal") == "Equal" and allowed.get("value", "") == toleration.get("value", "")


def toleration_problem(toleration: Mapping[str, Any], allowed: Sequence[Mapping[str, Any]]) -> str | None:
    key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
    shown = f"{key or '(empty key)'} {operator}" + (f" {toleration.get('value')}" if toleration.get("value") else "")
    if not key and operator == "Exists":
        return "tolerates every taint (operator Exists with an empty key)"
    if not any(covers(a, toleration) for a in allowed):
        return f"tolerates {shown}, which its namespace's whitelist does not allow"
    if key in STANDARD_TOLERATION_KEYS:
        seconds = toleration.get("tolerationSeconds")
        if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds > MAX_TOLERATION_SECONDS:
            return f"tolerates {key} for {seconds if seconds is not None else 'ever'} seconds (at most {MAX_TOLERATION_SECONDS})"
    return None


def check_tenant_pod_placement(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    for obj, tenant, namespace, spec in tenant_workloads(cluster):
        where = _where(obj, tenant)
        if spec.get("nodeName"):
            yield obj.resource, f"{where}: sets nodeName {spec.get('nodeName')}, which bypasses the scheduler and every NoSchedule taint."
        priority = str(spec.get("priorityClassName") or "")
        if priority in PLATFORM_PRIORITY_CLASSES or priority.startswith("system-"):
            yield obj.resource, f"{where}: uses the platform priority class {priority}, which can preempt the platform's own pods."
        allowed = whitelist(cluster, namespace)
        for toleration in as_list(spec.get("tolerations")):
            problem = toleration_problem(as_map(toleration), allowed)
            if problem:
                yield obj.resource, f"{where}: {problem}: a tenant tolerates only its own trust domain's and dedicated nodes' taints."


POLICIES = [
    stack_policy(
        "tenant-pod-security-context",
        "Tenant pod templates meet their namespace's Pod Security level: no root, privilege escalation, unconfined "
        "seccomp or AppArmor, unsafe sysctls, unmasked /proc, added capabilities or token automount; untrusted "
        "tenants' containers keep a read-only root filesystem.",
        check_tenant_pod_security_context,
        tenant_local=True,
    ),
    stack_policy(
        "tenant-pod-resources",
        "Every tenant container requests CPU and memory and limits memory.",
        check_tenant_pod_resources,
        tenant_local=True,
    ),
    stack_policy(
        "tenant-pod-registries",
        "Tenant containers run images from the allowed registries of the tenant-image-registries admission policy only.",
        check_tenant_pod_registries,
        tenant_local=True,
    ),
    stack_policy(
        "tenant-pod-placement",
        "Tenant pods set no nodeName, no platform priority class, and tolerate only their namespace's whitelisted "
        "taints (no empty-key Exists; not-ready/unreachable for bounded seconds).",
        check_tenant_pod_placement,
        tenant_local=True,
    ),
]
