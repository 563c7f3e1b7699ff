"""Security: Pod Security on every namespace, privileged and host access only in the reviewed
platform namespaces, no GPU escape variables or mounts, the GPU Operator's toolkit locked down and
recent enough, images pinned, and no plaintext secret in chart values, ConfigMaps or env values.

References: shared/reference/security-and-reliability.md (sections 2.1, 5 and 6.3; checks 15-21,
35-38 and 41 of its last section).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, Iterator

import yaml

from ai_factory.components import registry
from ai_factory.components.kyverno import ESCAPE_VARIABLES, FORBIDDEN_MOUNTS
from ai_factory.components.tenant_stack import POD_SECURITY_EXCEPTION_ANNOTATION
from ai_factory.factory.model.config import MIN_CONTAINER_TOOLKIT
from ai_factory.factory.model.secrets import REDACTED
from ai_factory.factory.model.tenancy import TENANT_LABEL
from ai_factory.policies.aif_policies.core import resource_policy
from ai_factory.policies.aif_policies.kube import (
    HELM_TYPES,
    as_list,
    as_map,
    containers,
    describe,
    helm_chart,
    kind_of,
    labels,
    metadata,
    name_of,
    namespace_of,
    pod_specs,
    runs_pods,
)

# --------------------------------------------------------------------------- the reviewed allow-list

KUBERNETES_PRIVILEGED_NAMESPACES: dict[str, str] = {
    "kube-system": "Kubernetes' own node daemons (kube-proxy, CNI agents installed there)",
}
"""Namespaces no layer owns whose pods must break Pod Security baseline. Each layer declares its own
(`Layer.privileged_namespaces`, with why), reviewed with the layer."""
PRIVILEGED_SETTINGS = {
    "privilegedNamespaces": {
        "type": "array",
        "items": {"type": "string"},
        "default": [],
        "description": "Namespaces added to the reviewed allow-list of platform namespaces whose pods may be privileged "
        "or use host namespaces, paths and ports (the layers' declared privileged namespaces, `Layer.privileged_namespaces`).",
    }
}


def privileged_namespaces(config: Mapping[str, Any]) -> set[str]:
    reviewed = KUBERNETES_PRIVILEGED_NAMESPACES | registry.privileged_namespaces()
    return set(reviewed) | {str(n) for n in as_list(config.get("privilegedNamespaces"))}


# --------------------------------------------------------------------------- namespace-pod-security

POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
POD_SECURITY_LEVELS = ("privileged", "baseline", "restricted")


def check_namespace_pod_security(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> Iterator[str]:
    if resource_type in HELM_TYPES:
        chart = helm_chart(resource_type, props)
        if chart.create_namespace:
            yield (
                f"{describe(resource_type, props)} creates its namespace {chart.namespace} (createNamespace), which then "
                "has no Pod Security labels: create it with components/_common.namespace(..., pod_security=...)."
            )
        return
    if kind_of(resource_type) != "Namespace":
        return
    name = name_of(props)
    level = labels(props).get(POD_SECURITY_ENFORCE)
    tenant = labels(props).get(TENANT_LABEL)
    if level not in POD_SECURITY_LEVELS:
        found = f"is {level!r}" if level else "is missing"
        yield (
            f"Namespace {name}: label {POD_SECURITY_ENFORCE} {found}; every namespace enforces a Pod Security level "
            f"({', '.join(POD_SECURITY_LEVELS)}): create it with components/_common.namespace(..., pod_security=...)."
        )
    elif level == "privileged" and (tenant or name not in privileged_namespaces(config)):
        owner = f"of tenant {tenant!r}" if tenant else "outside the reviewed allow-list"
        yield (
            f"Namespace {name} {owner} enforces Pod Security 'privileged': only reviewed platform namespaces may "
            "(a layer's privileged_namespaces in its LAYER declaration, or the policy's privilegedNamespaces setting); "
            "enforce 'restricted' (tenants) or 'baseline'."
        )
    elif tenant and level == "baseline" and not as_map(metadata(props).get("annotations")).get(POD_SECURITY_EXCEPTION_ANNOTATION):
        yield (
            f"Namespace {name} of tenant {tenant!r} enforces Pod Security 'baseline' without a reviewed exception "
            f"(annotation {POD_SECURITY_EXCEPTION_ANNOTATION}): tenants enforce 'restricted' unless "
            "layers.tenancy.pod_security_exceptions grants one."
        )


# --------------------------------------------------------------------------- no-privileged-outside-allowlist

BASELINE_CAPABILITIES = frozenset(
    # Pod Security baseline: capabilities a container may add (reference section 2.1, control 4).
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
     "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)
HOST_VALUE_KEYS = ("privileged", "hostNetwork", "hostPID", "hostIPC")


def host_access(pod_spec: Mapping[str, Any]) -> Iterator[str]:
    """The Pod Security baseline host controls a pod spec breaks."""
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key) is True:
            yield key
    for volume in as_list(pod_spec.get("volumes")):
        if as_map(volume).get("hostPath") is not None:
            yield f"hostPath volume {as_map(volume).get('name')} ({as_map(as_map(volume).get('hostPath')).get('path')})"
    for container in containers(pod_spec):
        name = container.get("name")
        context = as_map(container.get("securityContext"))
        if context.get("privileged") is True:
            yield f"privileged container {name}"
        if as_map(context.get("windowsOptions")).get("hostProcess") is True:
            yield f"host-process container {name}"
        added = {str(c).upper().removeprefix("CAP_") for c in as_list(as_map(context.get("capabilities")).get("add"))}
        if added - BASELINE_CAPABILITIES:
            yield f"capabilities {', '.join(sorted(added - BASELINE_CAPABILITIES))} added to container {name}"
        for port in as_list(container.get("ports")):
            if as_map(port).get("hostPort"):
                yield f"hostPort {as_map(port).get('hostPort')} on container {name}"


def true_host_values(values: Any, path: str = "values") -> Iterator[str]:
    """Chart values that turn on privileged mode or host namespaces (`privileged: true`, ...)."""
    if isinstance(values, Mapping):
        for key, value in values.items():
            if key in HOST_VALUE_KEYS and value is True:
                yield f"{path}.{key}: true"
            yield from true_host_values(value, f"{path}.{key}")
    elif isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
        for i, value in enumerate(values):
            yield from true_host_values(value, f"{path}[{i}]")


def check_no_privileged_outside_allowlist(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> Iterator[str]:
    allowed = privileged_namespaces(config)
    if resource_type in HELM_TYPES:
        chart = helm_chart(resource_type, props)
        found = [] if chart.namespace in allowed else list(true_host_values(chart.values))
        where = chart.namespace
    elif runs_pods(resource_type):
        where = namespace_of(props)
        found = [] if where in allowed else [p for spec in pod_specs(props) for p in host_access(spec)]
    else:
        return
    if found:
        yield (
            f"{describe(resource_type, props)} asks for privileged or host access ({'; '.join(found)}) in namespace "
            f"{where or '(none)'}, which is not a reviewed platform namespace: drop it, or move the workload to a "
            "namespace a layer declares privileged (`Layer.privileged_namespaces`) after review."
        )


# --------------------------------------------------------------------------- no-gpu-escape-variables


def is_escape_variable(name: Any) -> bool:
    # The lists the Kyverno layer denies at admission (and `factory check` reads), so the three
    # enforcements cannot drift apart.
    return isinstance(name, str) and any(fnmatchcase(name, pattern) for pattern in ESCAPE_VARIABLES)


def is_escape_mount(path: Any) -> bool:
    if not isinstance(path, str):
        return False
    path = path.rstrip("/") or "/"
    return any(fnmatchcase(path, pattern) for pattern in FORBIDDEN_MOUNTS)


def escapes_in_pod(pod_spec: Mapping[str, Any]) -> Iterator[str]:
    for container in containers(pod_spec):
        name = container.get("name")
        for env in as_list(container.get("env")):
            if is_escape_variable(as_map(env).get("name")):
                yield f"env {as_map(env).get('name')} in container {name}"
        for mount in as_list(container.get("volumeMounts")):
            if is_escape_mount(as_map(mount).get("mountPath")):
                yield f"mount {as_map(mount).get('mountPath')} in container {name}"


def escapes_in_values(values: Any, path: str = "values") -> Iterator[str]:
    """Escape variables set through chart values: `{name, value}` lists and maps under env-like keys."""
    if isinstance(values, Mapping):
        for key, value in values.items():
            here = f"{path}.{key}"
            if "env" in str(key).lower():
                for i, item in enumerate(as_list(value)):
                    if is_escape_variable(as_map(item).get("name")):
                        yield f"{here}[{i}] sets {as_map(item).get('name')}"
                for variable in as_map(value):
                    if is_escape_variable(variable):
                        yield f"{here}.{variable}"
            yield from escapes_in_values(value, here)
    elif isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
        for i, value in enumerate(values):
            yield from escapes_in_values(value, f"{path}[{i}]")


def check_no_gpu_escape_variables(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> Iterator[str]:
    allowed = privileged_namespaces(config)
    kind = kind_of(resource_type)
    if resource_type in HELM_TYPES:
        chart = helm_chart(resource_type, props)
        found = [] if chart.namespace in allowed else sorted(set(escapes_in_values(chart.values)))
    elif kind in ("ConfigMap", "Secret"):
        data = {**as_map(props.get("data")), **as_map(props.get("stringData"))}
        found = [] if namespace_of(props) in allowed else [f"key {k} (importable with envFrom)" for k in data if is_escape_variable(k)]
    elif runs_pods(resource_type):
        found = [] if namespace_of(props) in allowed else [e for spec in pod_specs(props) for e in escapes_in_pod(spec)]
    else:
        return
    if found:
        yield (
            f"{describe(resource_type, props)} sets GPU escape variables or mounts ({'; '.join(found)}): only the device "
            "plugin decides which GPUs a container sees and HAMi's limits stay on; remove them (GPU access goes through "
            "resource requests)."
        )


# --------------------------------------------------------------------------- gpu-operator-secure-toolkit

SAFE_DEVICE_LIST_STRATEGIES = ("volume-mounts", "cdi-annotations", "cdi-cri")
TOOLKIT_SETTINGS = {
    "minToolkitVersion": {
        "type": "string",
        "default": "v" + ".".join(map(str, MIN_CONTAINER_TOOLKIT)),
        "description": "Oldest NVIDIA Container Toolkit allowed (v1.17.8 fixes CVE-2024-0132, CVE-2025-23359, CVE-2025-23266).",
    },
    "minOperatorVersion": {
        "type": "string",
        "default": "v25.3.1",
        "description": "Oldest GPU Operator chart allowed (v25.3.1 ships toolkit v1.17.8).",
    },
    "allowCudaCompatLibHook": {
        "type": "boolean",
        "default": False,
        "description": "Allow the toolkit's enable-cuda-compat hook (needed only for CUDA forward compatibility; the "
        "hook honoured LD_PRELOAD from images before v1.17.8).",
    },
}


def version_tuple(version: Any) -> tuple[int, ...] | None:
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?", str(version or ""))
    return tuple(int(p) for p in match.groups()) if match else None


def _env(entries: Any) -> dict[str, str]:
    return {str(as_map(e).get("name")): str(as_map(e).get("value")) for e in as_list(entries) if as_map(e).get("name")}


def check_gpu_operator_secure_toolkit(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> Iterator[str]:
    if resource_type not in HELM_TYPES:
        return
    chart = helm_chart(resource_type, props)
    if chart.chart_name != "gpu-operator":
        return
    name = describe(resource_type, props)
    values = chart.values
    toolkit = as_map(values.get("toolkit"))
    plugin = as_map(values.get("devicePlugin"))
    toolkit_env = _env(toolkit.get("env"))
    strategies = [s.strip() for s in _env(plugin.get("env")).get("DEVICE_LIST_STRATEGY", "").split(",") if s.strip()]

    operator_floor = str(config["minOperatorVersion"])
    if (version_tuple(chart.version) or (0,)) < (version_tuple(operator_floor) or (0,)):
        yield f"{name}: chart version {chart.version!r} is older than {operator_floor} (container-escape CVEs); pin {operator_floor} or later."
    toolkit_floor = str(config["minToolkitVersion"])
    if "version" in toolkit and (version_tuple(toolkit["version"]) or (0,)) < (version_tuple(toolkit_floor) or (0,)):
        yield f"{name}: toolkit.version {toolkit['version']!r} is older than {toolkit_floor} (CVE-2024-0132, CVE-2025-23359, CVE-2025-23266); use {toolkit_floor} or later."
    if toolkit.get("enabled") is False:
        yield f"{name}: toolkit.enabled is false, so none of the toolkit settings below can be enforced; let the operator manage the toolkit."
    if toolkit_env.get("ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED") != "false":
        yield (
            f"{name}: toolkit.env must set ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false, or an unprivileged "
            "container picks any GPU with NVIDIA_VISIBLE_DEVICES (NVIDIA/gpu-operator#700)."
        )
    if not strategies or any(s not in SAFE_DEVICE_LIST_STRATEGIES for s in strategies):
        yield (
            f"{name}: devicePlugin.env DEVICE_LIST_STRATEGY is {','.join(strategies) or 'unset (envvar)'}; use "
            f"{' or '.join(SAFE_DEVICE_LIST_STRATEGIES)} so the GPUs a container gets are not an environment variable."
        )
    if "volume-mounts" in strategies and toolkit_env.get("ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS") != "true":
        yield f"{name}: with DEVICE_LIST_STRATEGY volume-mounts, toolkit.env must set ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS=true."
    opt_in = {f.strip() for f in toolkit_env.get("NVIDIA_CONTAINER_TOOLKIT_OPT_IN_FEATURES", "").split(",")}
    if not config["allowCudaCompatLibHook"] and "disable-cuda-compat-lib-hook" not in opt_in:
        yield (
            f"{name}: toolkit.env NVIDIA_CONTAINER_TOOLKIT_OPT_IN_FEATURES must include disable-cuda-compat-lib-hook "
            "(NVIDIAScape, CVE-2025-23266), unless the policy's allowCudaCompatLibHook setting says CUDA forward "
            "compatibility is needed."
        )


# --------------------------------------------------------------------------- images-pinned

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
IMAGE_SETTINGS = {
    "requireDigest": {
        "type": "boolean",
        "default": False,
        "description": "Require every image to be pinned by digest, not only by an explicit tag other than `latest`.",
    }
}


def image_problem(image: str, require_digest: bool) -> str | None:
    if DIGEST.search(image):
        return None
    if require_digest:
        return "is not pinned by digest"
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "has no tag (it means latest)"
    if last.rsplit(":", 1)[1] == "latest":
        return "uses the tag latest"
    return None


def images_in_values(values: Any, path: str) -> Iterator[tuple[str, str]]:
    """Image references in an object or chart values: a full reference under an `image` key, or
    `repository`/`image` with the `digest`, `tag` or `version` beside them (an absent or empty tag
    means the chart's own, pinned with the chart), or a `tag: latest` anywhere. A lone `version`
    is not taken for an image tag (Kyverno's `podSecurity.version: latest` is a standard version)."""
    if isinstance(values, Mapping):
        tag_key = next((k for k in ("digest", "tag", "version") if isinstance(values.get(k), str) and values.get(k)), None)
        image, repository = values.get("image"), values.get("repository")
        if isinstance(image, str) and image and tag_key is None:
            yield f"{path}.image", image
        elif tag_key and (isinstance(image, str) or isinstance(repository, str) or values.get("tag") == "latest"):
            base = "/".join(p for p in (repository, image) if isinstance(p, str) and p)
            tag = values[tag_key]
            separator = "@" if tag_key == "digest" or tag.startswith("sha256:") else ":"
            yield f"{path}.{tag_key}", f"{base}{separator}{tag}"
        for key, value in values.items():
            yield from images_in_values(value, f"{path}.{key}")
    elif isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
        for i, value in enumerate(values):
            yield from images_in_values(value, f"{path}[{i}]")


def check_images_pinned(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> Iterator[str]:
    require_digest = bool(config["requireDigest"])
    if resource_type in HELM_TYPES:
        references = images_in_values(helm_chart(resource_type, props).values, "values")
    elif runs_pods(resource_type):
        references = images_in_values({k: v for k, v in props.items() if k != "metadata"}, "")
    else:
        return
    for where, image in references:
        problem = image_problem(image, require_digest)
        if problem:
            yield f"{describe(resource_type, props)}: image {image!r} ({where.lstrip('.')}) {problem}; pin an exact version or a digest."


# --------------------------------------------------------------------------- no-plaintext-secrets

CREDENTIAL_WORDS = (
    "password", "passwd", "passphrase", "token", "apikey", "accesskey", "secretaccesskey", "secretkey", "privatekey",
    "clientsecret", "sharedsecret", "credentials", "credential", "dockerconfigjson", "masterkey",
)
"""Key names (lower case, separators removed) that end with one of these hold a credential, unless
what comes before already names one (`passwordSecretKey` says where a password is kept)."""
REFERENCE_PREFIXES = ("existing", "use", "enable", "create", "generate", "auto", "require", "allow", "skip")
CREDENTIAL_PATTERNS = {
    "a private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "an AWS access key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "a GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "an NGC API key": re.compile(r"\bnvapi-[A-Za-z0-9_-]{20,}"),
    "a Slack token": re.compile(r"\bxox[baprs]-[A-Za-z0-9-]{10,}"),
    "a JSON web token": re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\."),
    # user:password@ in a URL; a placeholder (`${...}`, `$(...)`, `{{ ... }}`, `%s`) is not a password.
    "a password in a URL": re.compile(r"\b[a-z][a-z0-9+.-]*://[^/\s:@]+:(?![$%{])[^/\s@]+@", re.IGNORECASE),
}


def credential_key(key: Any) -> bool:
    normal = re.sub(r"[^a-z0-9]", "", str(key).lower())
    word = next((w for w in sorted(CREDENTIAL_WORDS, key=len, reverse=True) if normal.endswith(w)), None)
    if word is None or normal.startswith(REFERENCE_PREFIXES):
        return False
    qualifier = normal[: -len(word)]
    return not any(w in qualifier for w in (*CREDENTIAL_WORDS, "secret"))


def literal(value: Any) -> bool:
    """A value that is the credential itself, not a reference to one or a template placeholder."""
    return isinstance(value, str) and bool(value.strip()) and not re.fullmatch(r"\s*(\$\{[^}]*\}|\{\{.*\}\}|\$\([^)]*\))\s*", value)


def secrets_in(value: Any, path: str, key: Any = None) -> Iterator[str]:
    """Where a value holds a credential in clear: a Pulumi secret that reached it (offline, it shows
    as the `[secret]` placeholder), a credential-named key with a literal value, an env entry
    naming a credential, a known credential format, or any of these inside embedded YAML/JSON."""
    if isinstance(value, Mapping):
        entry_name = value.get("name")
        if "value" in value and isinstance(entry_name, str) and credential_key(entry_name) and literal(value.get("value")):
            yield f"{path} ({entry_name})"
        for k, v in value.items():
            yield from secrets_in(v, f"{path}.{k}", k)
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        for i, v in enumerate(value):
            yield from secrets_in(v, f"{path}[{i}]")
    elif isinstance(value, str):
        if value == REDACTED or value.startswith(REDACTED + ":"):
            yield f"{path} (a Pulumi secret)"
        elif key is not None and credential_key(key) and literal(value):
            yield path
        elif isinstance(embedded := _embedded(value), (Mapping, list)):
            yield from secrets_in(embedded, path)
        else:
            what = next((what for what, pattern in CREDENTIAL_PATTERNS.items() if pattern.search(value)), None)
            if what:
                yield f"{path} ({what})"


def _embedded(text: str) -> Any:
    """A YAML or JSON document embedded in a string (a config file in a ConfigMap or in values)."""
    if "\n" not in text and not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def check_no_plaintext_secrets(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> Iterator[str]:
    kind = kind_of(resource_type)
    if resource_type in HELM_TYPES:
        found = list(secrets_in(helm_chart(resource_type, props).values, "values"))
    elif kind == "ConfigMap":
        found = list(secrets_in(as_map(props.get("data")), "data")) + list(secrets_in(as_map(props.get("binaryData")), "binaryData"))
    elif runs_pods(resource_type) and kind != "Secret":
        found = [
            f"env {as_map(e).get('name')} of container {c.get('name')}"
            for s in pod_specs(props)
            for c in containers(s)
            for e in as_list(c.get("env"))
            if any(secrets_in({"name": as_map(e).get("name"), "value": as_map(e).get("value")}, "env"))
        ]
    else:
        return
    if found:
        yield (
            f"{describe(resource_type, props)} holds credentials in plain text ({'; '.join(found)}): chart values, "
            "ConfigMaps and env values are stored and shown in clear; keep the credential in a Secret (or OpenBao "
            "through External Secrets) and reference it by name."
        )


POLICIES = [
    resource_policy(
        "namespace-pod-security",
        "Every namespace enforces a Pod Security level: 'privileged' only for reviewed platform namespaces, tenants "
        "'restricted' (or 'baseline' by a reviewed exception).",
        check_namespace_pod_security,
        settings=PRIVILEGED_SETTINGS,
    ),
    resource_policy(
        "no-privileged-outside-allowlist",
        "Privileged containers, host namespaces, host paths and host ports only in reviewed platform namespaces.",
        check_no_privileged_outside_allowlist,
        settings=PRIVILEGED_SETTINGS,
    ),
    resource_policy(
        "no-gpu-escape-variables",
        "No workload outside the reviewed platform namespaces sets NVIDIA/HAMi escape variables or mounts device-list, "
        "shim or driver paths.",
        check_no_gpu_escape_variables,
        settings=PRIVILEGED_SETTINGS,
    ),
    resource_policy(
        "gpu-operator-secure-toolkit",
        "The GPU Operator keeps unprivileged containers from choosing GPUs, disables the cuda-compat hook and meets "
        "the version floors of the container-escape fixes.",
        check_gpu_operator_secure_toolkit,
        settings=TOOLKIT_SETTINGS,
    ),
    resource_policy(
        "images-pinned",
        "Every image is pinned to an explicit version (or a digest), never latest or untagged.",
        check_images_pinned,
        advisory=True,
        settings=IMAGE_SETTINGS,
    ),
    resource_policy(
        "no-plaintext-secrets",
        "No credential in plain text in chart values, ConfigMaps or container env values.",
        check_no_plaintext_secrets,
    ),
]
