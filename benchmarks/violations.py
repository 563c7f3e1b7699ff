"""Mutation benchmark of `ai-factory check`: single violations injected into copies of the dev
render, each expected to be caught by a named check, and the catch rate.

    python benchmarks/violations.py            (from the repository root; about 15 s)
    python benchmarks/violations.py -v         (every finding of every mutation)

Each row of `MUTATIONS` is (family, what is injected, the check expected to catch it, the
mutation). A mutation edits the rendered files (`Bundle`: YAML objects by path, the inventory, raw
text), which are written to a fresh directory and read back with `load_rendered`, exactly as
`ai-factory check <dir>` reads a bundle. A row is caught when, besides what the clean render yields
(nothing), a finding of the expected check appears. `CONTROLS` are edits that break nothing (a
compliant tenant workload, a narrow egress rule): they must yield no finding.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ai_factory.factory.checking.check import run_checks  # noqa: E402
from ai_factory.factory.checking.findings import Finding  # noqa: E402
from ai_factory.factory.checking.oracles import Oracles, locate_upstream_dir  # noqa: E402
from ai_factory.factory.model.bounded_yaml import LOADER  # noqa: E402
from ai_factory.factory.rendering.bundle import load_rendered, render_clusters  # noqa: E402

TENANT = "tenant-search"
"""A high-trust tenant namespace of dev (trust domain internal; Pod Security baseline under the
reviewed exception of its Slurm cluster, so rows that only `restricted` refuses use `LOW_TRUST`)."""
LOW_TRUST = "tenant-partner-acme"
"""The low-trust tenant namespace of dev (dedicated nodes)."""


@dataclass
class Bundle:
    """A rendered directory being mutated: objects by path (one document per file, as rendered),
    the inventory entries, and files written verbatim."""

    objects: dict[str, dict[str, Any]]
    inventory: dict[str, Any]
    raw: dict[str, str] = field(default_factory=dict)

    def key(self, path: str) -> str:
        """The file of `<layer>/<namespace>/<kind>-<name>`, in whichever stage the bundle put it."""
        (found,) = [k for k in self.objects if k.split("/", 2)[2] == f"{path}.yaml"]
        return found

    def obj(self, path: str) -> dict[str, Any]:
        return self.objects[self.key(path)]

    def add(self, layer: str, obj: dict[str, Any]) -> None:
        namespace = obj["metadata"].get("namespace") or "_cluster"
        stage = "tenants" if layer.startswith("tenant-") else "resources"
        self.objects[f"manifests/{stage}/{layer}/{namespace}/{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"] = obj

    def remove(self, path: str) -> None:
        del self.objects[self.key(path)]

    def entry(self, resource_type: str, name: str) -> dict[str, Any]:
        """The one inventory entry of a type whose Pulumi name contains `name` (the names carry
        their component's prefix)."""
        (found,) = [e for e in self.inventory["resources"] if e["type"] == resource_type and name in e["name"]]
        return found

    def write(self, out: Path) -> None:
        for relative, obj in self.objects.items():
            (out / relative).parent.mkdir(parents=True, exist_ok=True)
            (out / relative).write_text(yaml.dump(obj, Dumper=DUMPER, sort_keys=True))
        for relative, text in self.raw.items():
            (out / relative).parent.mkdir(parents=True, exist_ok=True)
            (out / relative).write_text(text)
        (out / "inventory.json").write_text(json.dumps(self.inventory))


DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def read_bundle(directory: Path) -> Bundle:
    files = sorted((directory / "manifests").rglob("*.yaml"))
    objects = {str(p.relative_to(directory)): yaml.load(p.read_text(), Loader=LOADER) for p in files if p.name != "kustomization.yaml"}
    raw = {str(p.relative_to(directory)): p.read_text() for p in [*files, *(directory / "flux").glob("*.yaml")] if str(p.relative_to(directory)) not in objects}
    return Bundle(objects, json.loads((directory / "inventory.json").read_text()), raw)


# --------------------------------------------------------------------------- tenant workloads


def workload(namespace: str = TENANT, name: str = "trainer", kind: str = "Deployment", **pod: Any) -> dict[str, Any]:
    """A tenant workload that passes every check; `pod` overrides fields of its pod spec."""
    container = {
        "name": "main",
        "image": "nvcr.io/nvidia/pytorch:25.01-py3",
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    spec = {"containers": [container], **pod}
    labels = {"app": name}
    template = {"metadata": {"labels": labels}, "spec": spec}
    body: dict[str, Any] = {
        "Deployment": {"selector": {"matchLabels": labels}, "template": template},
        "Job": {"template": {**template, "spec": {**spec, "restartPolicy": "Never"}}},
        "CronJob": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": {**template, "spec": {**spec, "restartPolicy": "Never"}}}}},
        "Pod": spec,
    }[kind]
    api = {"Deployment": "apps/v1", "Job": "batch/v1", "CronJob": "batch/v1", "Pod": "v1"}[kind]
    tenant = {"ai-factory.io/tenant": namespace.removeprefix("tenant-")}
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": namespace, "labels": tenant}, "spec": body}


def add_workload(**kwargs: Any) -> Callable[[Bundle], None]:
    def mutate(bundle: Bundle) -> None:
        obj = workload(**{k: v for k, v in kwargs.items() if k in ("namespace", "name", "kind")})
        containers = _pod(obj)["containers"]
        for key, value in kwargs.items():
            if key == "container":
                value(containers[0])
            elif key == "pod_spec":
                value(_pod(obj))
        bundle.add(str(kwargs.get("layer", obj["metadata"]["namespace"])), obj)

    return mutate


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    if obj["kind"] == "Pod":
        return spec
    if obj["kind"] == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    return spec["template"]["spec"]


def container_sets(*path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(target: dict[str, Any]) -> None:
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = value

    return edit


def container_drops(*path: str) -> Callable[[dict[str, Any]], None]:
    def edit(target: dict[str, Any]) -> None:
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return edit


Mutation = tuple[str, str, str, Callable[[Bundle], None]]

WORKLOADS: list[Mutation] = [
    ("tenant pods", "runAsNonRoot: false", "tenant-pod-security-context", add_workload(container=container_sets("securityContext", "runAsNonRoot", value=False))),
    ("tenant pods", "runAsUser: 0 (pod level)", "tenant-pod-security-context", add_workload(pod_spec=container_sets("securityContext", "runAsUser", value=0))),
    ("tenant pods", "allowPrivilegeEscalation: true", "tenant-pod-security-context", add_workload(container=container_sets("securityContext", "allowPrivilegeEscalation", value=True))),
    ("tenant pods", "seccompProfile Unconfined", "tenant-pod-security-context", add_workload(container=container_sets("securityContext", "seccompProfile", value={"type": "Unconfined"}))),
    ("tenant pods", "unsafe sysctl kernel.msgmax", "tenant-pod-security-context", add_workload(pod_spec=container_sets("securityContext", "sysctls", value=[{"name": "kernel.msgmax", "value": "65536"}]))),
    ("tenant pods", "procMount: Unmasked", "tenant-pod-security-context", add_workload(container=container_sets("securityContext", "procMount", value="Unmasked"))),
    ("tenant pods", "capability SYS_ADMIN added", "tenant-pod-security-context", add_workload(container=container_sets("securityContext", "capabilities", "add", value=["SYS_ADMIN"]))),
    ("tenant pods", "writable root filesystem (untrusted tenant)", "tenant-pod-security-context", add_workload(namespace=LOW_TRUST, layer="tenant-partner-acme", container=container_sets("securityContext", "readOnlyRootFilesystem", value=False))),
    ("tenant pods", "automountServiceAccountToken: true", "tenant-pod-security-context", add_workload(kind="CronJob", pod_spec=container_sets("automountServiceAccountToken", value=True))),
    ("tenant pods", "no resource requests", "tenant-pod-resources", add_workload(container=container_drops("resources"))),
    ("tenant pods", "no memory limit (Job)", "tenant-pod-resources", add_workload(kind="Job", container=container_drops("resources", "limits"))),
    ("tenant pods", "image from docker.io", "tenant-pod-registries", add_workload(kind="Pod", container=container_sets("image", value="docker.io/library/python:3.12"))),
    ("tenant pods", "priorityClassName system-node-critical", "tenant-pod-placement", add_workload(pod_spec=container_sets("priorityClassName", value="system-node-critical"))),
    ("tenant pods", "nodeName set", "tenant-pod-placement", add_workload(kind="Pod", pod_spec=container_sets("nodeName", value="gpu-h100-01"))),
    ("tenant pods", "tolerates another tenant's dedicated nodes", "tenant-pod-placement",
     add_workload(pod_spec=container_sets("tolerations", value=[{"key": "ai-factory.io/dedicated", "operator": "Equal", "value": "partner-acme", "effect": "NoSchedule"}]))),
    ("tenant pods", "tolerates another trust domain", "tenant-pod-placement",
     add_workload(pod_spec=container_sets("tolerations", value=[{"key": "ai-factory.io/trust-domain", "operator": "Equal", "value": "assistant", "effect": "NoSchedule"}]))),
    ("tenant pods", "operator Exists with an empty key", "tenant-pod-placement", add_workload(pod_spec=container_sets("tolerations", value=[{"operator": "Exists"}]))),
    ("tenant pods", "nvidia.com/gpu Exists", "tenant-pod-placement", add_workload(pod_spec=container_sets("tolerations", value=[{"key": "nvidia.com/gpu", "operator": "Exists"}]))),
    ("tenant pods", "envFrom a Secret", "tenant-pods", add_workload(container=container_sets("envFrom", value=[{"secretRef": {"name": "gpu-env"}}]))),
    ("tenant pods", "an nfs volume", "tenant-pod-security-context", add_workload(namespace=LOW_TRUST, layer="tenant-partner-acme", pod_spec=container_sets("volumes", value=[{"name": "data", "nfs": {"server": "10.0.0.5", "path": "/"}}]))),
    ("tenant pods", "hostNetwork: true", "tenant-pods", add_workload(pod_spec=container_sets("hostNetwork", value=True))),
    ("tenant pods", "a privileged container", "tenant-pods", add_workload(container=container_sets("securityContext", "privileged", value=True))),
    ("tenant pods", "a host port", "no-privileged-outside-allowlist", add_workload(container=container_sets("ports", value=[{"containerPort": 80, "hostPort": 80}]))),
    ("tenant pods", "hostPath volume (existing)", "tenant-pods", add_workload(pod_spec=container_sets("volumes", value=[{"name": "host", "hostPath": {"path": "/"}}]))),
]

# --------------------------------------------------------------------------- network, secrets, admission, reliability

ISOLATION = "tenant-search/_cluster/ciliumclusterwidenetworkpolicy-tenant-search-isolation"
CLUSTER = "kyverno/_cluster/clusterpolicy-"
OPENBAO = "openbao/openbao/helmrelease-openbao"
KEYCLOAK = "keycloak/keycloak/helmrelease-keycloak"


def edit(path: str, change: Callable[[dict[str, Any]], None]) -> Callable[[Bundle], None]:
    return lambda bundle: change(bundle.obj(path))


def egress(rule: dict[str, Any]) -> Callable[[Bundle], None]:
    return edit(ISOLATION, lambda policy: policy["spec"]["egress"].append(rule))


def network_policy(rule: dict[str, Any]) -> Callable[[Bundle], None]:
    obj = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "egress", "namespace": TENANT, "labels": {"ai-factory.io/tenant": "search"}},
           "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [rule]}}
    return lambda bundle: bundle.add("tenant-search", obj)


def service(**spec: Any) -> Callable[[Bundle], None]:
    obj = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api", "namespace": TENANT, "labels": {"ai-factory.io/tenant": "search"}},
           "spec": {"selector": {"app": "api"}, "ports": [{"port": 80}], **spec}}
    return lambda bundle: bundle.add("tenant-search", obj)


def secret(**fields: Any) -> Callable[[Bundle], None]:
    obj = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": TENANT, "labels": {"ai-factory.io/tenant": "search"}}, **fields}
    return lambda bundle: bundle.add("tenant-search", obj)


def cluster_external_secret(selector: dict[str, Any]) -> Callable[[Bundle], None]:
    obj = {"apiVersion": "external-secrets.io/v1", "kind": "ClusterExternalSecret", "metadata": {"name": "shared"},
           "spec": {"namespaceSelectors": [selector], "externalSecretSpec": {"secretStoreRef": {"name": "openbao", "kind": "SecretStore"}, "data": []}}}
    return lambda bundle: bundle.add("external-secrets", obj)


def external_secret(key: str, kind: str = "SecretStore") -> Callable[[Bundle], None]:
    obj = {"apiVersion": "external-secrets.io/v1", "kind": "ExternalSecret", "metadata": {"name": "db", "namespace": TENANT, "labels": {"ai-factory.io/tenant": "search"}},
           "spec": {"secretStoreRef": {"name": "openbao", "kind": kind}, "target": {"name": "db"}, "data": [{"secretKey": "password", "remoteRef": {"key": key, "property": "password"}}]}}
    return lambda bundle: bundle.add("tenant-search", obj)


def set_path(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            obj = obj[int(key)] if isinstance(obj, list) else obj.setdefault(key, {})
        obj[last] = value

    return change


def unprotect(resource_type: str, name: str) -> Callable[[Bundle], None]:
    def mutate(bundle: Bundle) -> None:
        bundle.entry(resource_type, name).update(protect=False, retainOnDelete=False)

    return mutate


def raw(path: str, text: str) -> Callable[[Bundle], None]:
    def mutate(bundle: Bundle) -> None:
        bundle.raw[f"manifests/resources/{path}.yaml"] = text  # a new file, in a stage

    return mutate


OTHERS: list[Mutation] = [
    ("network", "egress to 0.0.0.0/0 except the metadata address", "tenant-egress-bounded",
     egress({"toCIDRSet": [{"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}]})),
    ("network", "egress to 10.0.0.0/8", "tenant-egress-bounded", egress({"toCIDR": ["10.0.0.0/8"]})),
    ("network", "egress to ::/0", "tenant-egress-bounded", egress({"toCIDR": ["::/0"]})),
    ("network", "toFQDNs matchPattern '*'", "tenant-egress-bounded", egress({"toFQDNs": [{"matchPattern": "*"}]})),
    ("network", "NetworkPolicy ipBlock 192.168.0.0/16", "tenant-egress-bounded", network_policy({"to": [{"ipBlock": {"cidr": "192.168.0.0/16"}}]})),
    ("network", "an egress rule of ports only (every destination)", "tenant-egress-bounded", egress({"toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}]})),
    ("network", "a NetworkPolicy egress rule naming no peer", "tenant-egress-bounded", network_policy({"ports": [{"port": 443}]})),
    ("network", "egress to the world entity", "network-allow-rules", egress({"toEntities": ["world"]})),
    ("network", "Service type LoadBalancer", "tenant-services-internal", service(type="LoadBalancer")),
    ("network", "Service with externalIPs", "tenant-services-internal", service(externalIPs=["203.0.113.7"])),
    ("secrets", "Secret with literal stringData", "bundle-secrets", secret(stringData={"password": "hunter2"})),
    ("secrets", "Secret with literal data", "bundle-secrets", secret(data={"password": "aHVudGVyMg=="})),
    ("secrets", "platform Secret's value in clear", "bundle-secrets", edit("keycloak/keycloak/secret-keycloak-database", set_path("stringData.password", "s3cret"))),
    ("secrets", "ClusterExternalSecret over every tenant", "tenant-secret-stores-scoped",
     cluster_external_secret({"matchExpressions": [{"key": "ai-factory.io/tenant", "operator": "Exists"}]})),
    ("secrets", "SecretStore with another tenant's role", "tenant-secret-stores-scoped",
     edit("tenant-search/tenant-search/secretstore-openbao", set_path("spec.provider.vault.auth.kubernetes.role", "tenant-assistant"))),
    ("secrets", "a ClusterSecretStore", "tenant-secret-stores-scoped",
     lambda b: b.add("external-secrets", {"apiVersion": "external-secrets.io/v1", "kind": "ClusterSecretStore", "metadata": {"name": "everyone"},
                                          "spec": {"provider": {"vault": {"server": "http://openbao.openbao.svc:8200", "path": "secret", "version": "v2",
                                                                          "auth": {"tokenSecretRef": {"name": "root", "key": "token", "namespace": "openbao"}}}}}})),
    ("secrets", "ExternalSecret outside the tenant's prefix", "tenant-secret-stores-scoped", external_secret("tenants/assistant/db")),
    ("secrets", "ExternalSecret through a ClusterSecretStore", "tenant-secret-stores-scoped", external_secret("tenants/search/db", kind="ClusterSecretStore")),
    ("secrets", "ESO processes ClusterExternalSecrets", "tenant-secret-stores-scoped",
     edit("external-secrets/external-secrets/helmrelease-external-secrets", set_path("spec.values.processClusterExternalSecret", True))),
    ("admission", "escape-env policy switched to Audit", "admission-policies-enforced",
     edit(f"{CLUSTER}tenant-gpu-escape-env", set_path("spec.rules.0.validate.failureAction", "Audit"))),
    ("admission", "tenant policy deleted", "admission-policies-enforced", lambda b: b.remove("tenant-search/_cluster/clusterpolicy-tenant-search-admission")),
    ("admission", "registries policy deleted", "admission-policies-enforced", lambda b: b.remove(f"{CLUSTER}tenant-image-registries")),
    ("admission", "failurePolicy Ignore", "admission-policies-enforced", edit(f"{CLUSTER}tenant-gpu-queue", set_path("spec.failurePolicy", "Ignore"))),
    ("admission", "webhook timeout 30 s", "admission-policies-enforced", edit(f"{CLUSTER}tenant-gpu-device-mounts", set_path("spec.webhookTimeoutSeconds", 30))),
    ("admission", "a tenant's toleration rule removed", "admission-policies-enforced",
     edit("tenant-search/_cluster/clusterpolicy-tenant-search-admission", lambda p: p["spec"]["rules"].pop(3))),
    ("admission", "LD_PRELOAD dropped from the escape list", "admission-policies-enforced",
     edit(f"{CLUSTER}tenant-gpu-escape-env", lambda p: p["spec"]["rules"][0]["validate"]["foreach"][0]["deny"]["conditions"]["any"][0]["value"].remove("LD_PRELOAD"))),
    ("admission", "a tenant's Pod Security lowered to privileged", "admission-policies-enforced",
     edit("tenant-search/_cluster/clusterpolicy-tenant-search-admission", set_path("spec.rules.0.validate.podSecurity.level", "privileged"))),
    ("admission", "registries allow-list opened to '*'", "admission-policies-enforced",
     edit(f"{CLUSTER}tenant-image-registries", set_path("spec.rules.0.validate.pattern.spec.containers.0.image", "*"))),
    ("admission", "a rule excluding a group", "admission-policies-enforced",
     edit(f"{CLUSTER}tenant-node-name", set_path("spec.rules.0.exclude", {"any": [{"subjects": [{"kind": "Group", "name": "oidc:search"}]}]}))),
    ("admission", "webhookConfiguration failurePolicy Ignore", "admission-policies-enforced",
     edit(f"{CLUSTER}tenant-gpu-queue", set_path("spec.webhookConfiguration", {"failurePolicy": "Ignore"}))),
    ("admission", "Kyverno with one admission replica", "admission-policies-enforced",
     edit("kyverno/kyverno/helmrelease-kyverno", set_path("spec.values.admissionController.replicas", 1))),
    ("admission", "Kyverno forces failurePolicy Ignore", "admission-policies-enforced",
     edit("kyverno/kyverno/helmrelease-kyverno", set_path("spec.values.features.forceFailurePolicyIgnore.enabled", True))),
    ("reliability", "Keycloak database Secret unprotected", "stateful-resources-protected", unprotect("kubernetes:core/v1:Secret", "keycloak-database")),
    ("reliability", "Keycloak namespace unprotected", "stateful-resources-protected", unprotect("kubernetes:core/v1:Namespace", "keycloak-namespace")),
    ("reliability", "OpenBao release unprotected", "stateful-resources-protected", unprotect("kubernetes:helm.sh/v3:Release", "release-openbao")),
    ("reliability", "OpenBao's KV engine unprotected", "stateful-resources-protected", unprotect("vault:index/mount:Mount", "openbao-kv")),
    ("reliability", "OpenBao's StorageClass deletes volumes", "stateful-resources-protected", edit("openbao/_cluster/storageclass-openbao-raft", set_path("reclaimPolicy", "Delete"))),
    ("reliability", "a tenant namespace unprotected", "tenant-protection", unprotect("kubernetes:core/v1:Namespace", "tenant-search-namespace")),
    ("reliability", "OpenBao with 1 replica", "stateful-high-availability", edit(OPENBAO, set_path("spec.values.server.ha.replicas", 1))),
    ("reliability", "OpenBao disruption budget off", "stateful-high-availability", edit(OPENBAO, set_path("spec.values.server.ha.disruptionBudget.enabled", False))),
    ("reliability", "OpenBao volumes deleted with it", "stateful-high-availability",
     edit(OPENBAO, set_path("spec.values.server.persistentVolumeClaimRetentionPolicy.whenDeleted", "Delete"))),
    ("reliability", "Keycloak with one replica", "stateful-high-availability", edit(KEYCLOAK, set_path("spec.values.replicas", 1))),
    ("robustness", "a file whose document is a list", "rendered-files", raw("kyverno/_cluster/list", "- a\n- b\n")),
    ("robustness", "a file whose document is a scalar", "rendered-files", raw("kyverno/_cluster/scalar", "42\n")),
    ("robustness", "a Cohort whose flavors are a string", "flavor-supply",
     edit("kueue/_cluster/cohort-trust-domain-assistant", set_path("spec.resourceGroups.0.flavors", "x"))),
    ("robustness", "a file that is not YAML", "rendered-files", raw("kyverno/_cluster/broken", "a: [\n")),
    ("robustness", "an object whose metadata is a list", "rendered-files", raw("kyverno/_cluster/pod-x", "kind: Pod\nmetadata: [x]\n")),
]

CONTROLS: list[tuple[str, Callable[[Bundle], None]]] = [
    ("a compliant tenant Deployment", add_workload()),
    ("a compliant untrusted tenant Job", add_workload(namespace=LOW_TRUST, layer="tenant-partner-acme", kind="Job")),
    (
        "a whitelisted toleration with bounded seconds",
        add_workload(pod_spec=container_sets("tolerations", value=[{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}])),
    ),
    ("egress to a public address block and a named domain", egress({"toCIDR": ["203.0.113.0/24"], "toFQDNs": [{"matchPattern": "*.example.com"}]})),
    ("a ClusterIP Service", service()),
    ("an ExternalSecret under the tenant's prefix", external_secret("tenants/search/db")),
]

MUTATIONS: list[Mutation] = [*WORKLOADS, *OTHERS]


# --------------------------------------------------------------------------- running


def findings_of(base: Bundle, mutate: Callable[[Bundle], None], oracles: Oracles) -> list[Finding]:
    bundle = copy.deepcopy(base)
    mutate(bundle)
    directory = Path(tempfile.mkdtemp(prefix="violation-"))
    try:
        bundle.write(directory)
        return run_checks(load_rendered(directory), oracles)
    finally:
        shutil.rmtree(directory)


def dev_bundle() -> Bundle:
    """dev's manager cluster par1-a, as `render dev` writes it: the namespaces mutated are its tenants'."""
    directory = Path(tempfile.mkdtemp(prefix="dev-render-"))
    try:
        render_clusters("dev")["par1-a"].write(directory)
        return read_bundle(directory)
    finally:
        shutil.rmtree(directory)


def main(verbose: bool = False) -> int:
    oracles = Oracles(locate_upstream_dir())
    base = dev_bundle()
    baseline = set(findings_of(base, lambda b: None, oracles))
    print(f"clean dev render: {len(baseline)} finding(s)")
    caught = 0
    for family, what, expected, mutate in MUTATIONS:
        new = [f for f in findings_of(base, mutate, oracles) if f not in baseline]
        hit = any(f.check == expected for f in new)
        caught += hit
        print(f"{'caught' if hit else 'MISSED':7} {family:18} {what:55} {expected}")
        for f in new if verbose or not hit else []:
            print(f"          {f}")
    false_alarms = 0
    for what, mutate in CONTROLS:
        new = [f for f in findings_of(base, mutate, oracles) if f not in baseline]
        false_alarms += bool(new)
        print(f"{'clean' if not new else 'FLAGGED':7} {'control':18} {what}")
        for f in new:
            print(f"          {f}")
    print(f"caught {caught}/{len(MUTATIONS)} ({100 * caught / len(MUTATIONS):.0f}%); controls flagged: {false_alarms}/{len(CONTROLS)}")
    return 0 if caught == len(MUTATIONS) and not false_alarms else 1


if __name__ == "__main__":
    sys.exit(main("-v" in sys.argv))
