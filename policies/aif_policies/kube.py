"""Reading Kubernetes objects, Helm releases and the stack's cluster picture out of resource data.

A Kubernetes object registers as `kubernetes:<group>/<version>:<Kind>` with inputs in Kubernetes
shape (`apiVersion`, `kind`, `metadata`, `spec`, ...). Helm releases (`helm.v3.Release`) and v4
charts are registered whole: CrossGuard sees their chart, version, repository, namespace and
values, never the objects Helm renders from them (the Pulumi guide says so: "CrossGuard policies
can't be enforced on these resources"), so rules on charts read their values.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterator

from pulumi_policy import PolicyResource

from ai_factory.factory.checking.label_index import LabelIndex
from ai_factory.factory.checking.tree import maps_within
from ai_factory.factory.checking.unknowns import MAPPINGS, SEQUENCES
from ai_factory.factory.model.tenancy import TENANT_LABEL, TRUST_DOMAIN_LABEL, TRUST_LABEL

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
HELM_CHART = "kubernetes:helm.sh/v4:Chart"
HELM_TYPES = (HELM_RELEASE, HELM_CHART)
TENANT_STACK = "ai-factory:tenancy:TenantStack"
"""The component that owns a tenant's objects (components/tenant_stack.py)."""
_NOT_OBJECTS = ("kubernetes:helm.sh/", "kubernetes:yaml", "kubernetes:kustomize", "pulumi:providers:")


def as_map(value: Any) -> Mapping[str, Any]:
    return value if type(value) in MAPPINGS or isinstance(value, Mapping) else {}


def as_list(value: Any) -> Sequence[Any]:
    return value if type(value) in SEQUENCES or isinstance(value, Sequence) and not isinstance(value, (str, bytes)) else ()


def known(value: Any) -> Any:
    """`value` read whole into plain dicts and lists; raises `UnknownValueError` where a read of
    it would (a value unknown during preview). Once read, it answers any number of questions
    without the proxies, and no read of it can raise."""
    if isinstance(value, (str, bytes)):
        return value  # a Sequence, but one value; tested first: its ABC check missed the ABC cache every time
    if type(value) in MAPPINGS or isinstance(value, Mapping):
        return {key: known(item) for key, item in value.items()}
    if type(value) in SEQUENCES or isinstance(value, Sequence):
        return [known(item) for item in value]
    return value


def kind_of(resource_type: str) -> str | None:
    """The Kubernetes kind a resource type registers (`NodePatch` for a patch), None for anything
    that is not one object (Helm, YAML groups, providers, components)."""
    if not resource_type.startswith("kubernetes:") or resource_type.startswith(_NOT_OBJECTS):
        return None
    return resource_type.rsplit(":", 1)[-1]


ADMISSION_RULE_GROUPS = ("kyverno.io", "policies.kyverno.io", "admissionregistration.k8s.io", "templates.gatekeeper.sh", "constraints.gatekeeper.sh")
"""API groups of admission rules: their pod patterns describe pods, they run none."""


def runs_pods(resource_type: str) -> bool:
    """Whether the pod specs inside an object are pods it runs (not an admission rule's patterns)."""
    return kind_of(resource_type) is not None and group_of(resource_type) not in ADMISSION_RULE_GROUPS


def group_of(resource_type: str) -> str:
    """The API group of a Kubernetes resource type (`""` for the core group)."""
    group = resource_type.split(":")[1].rsplit("/", 1)[0]
    return "" if group == "core" else group


def metadata(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_map(props.get("metadata"))


def labels(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_map(metadata(props).get("labels"))


def name_of(props: Mapping[str, Any]) -> str:
    return str(metadata(props).get("name") or "")


def namespace_of(props: Mapping[str, Any]) -> str | None:
    namespace = metadata(props).get("namespace")
    return str(namespace) if namespace else None


def describe(resource_type: str, props: Mapping[str, Any], fallback: str = "") -> str:
    """How messages name a resource: `Kind namespace/name`, `Kind name` or the Helm release."""
    if resource_type in HELM_TYPES:
        release = helm_chart(resource_type, props)
        return f"Helm release {release.namespace}/{release.name or fallback} (chart {release.chart or '?'})"
    kind = (kind_of(resource_type) or resource_type).removesuffix("Patch")
    name = name_of(props) or fallback
    namespace = namespace_of(props)
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


# --------------------------------------------------------------------------- pods


def pod_specs(value: Any) -> Iterator[Mapping[str, Any]]:
    """Every pod spec inside an object or chart values: any mapping with a `containers` list, at
    any depth (Pods, workload templates, and custom resources embedding pod templates alike), or
    with a `mainContainer` (Dynamo's `extraPodSpec`, whose operator adds the pod's main container)."""
    return (item for item in maps_within(value, skipped_key="metadata") if any(isinstance(c, Mapping) for c in as_list(item.get("containers"))) or main_container(item) is not None)


def containers(pod_spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in as_list(pod_spec.get(key)):
            if isinstance(container, Mapping):
                yield container
    if (main := main_container(pod_spec)) is not None:
        yield main


def main_container(pod_spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container a Dynamo `extraPodSpec` adds to the pod its operator builds: one naming its
    image (a CRD's schema of the field, also a mapping, names none)."""
    main = pod_spec.get("mainContainer")
    return main if isinstance(main, Mapping) and isinstance(main.get("image"), str) else None


# --------------------------------------------------------------------------- Helm


@dataclass(frozen=True)
class HelmChart:
    name: str
    """Release name."""
    namespace: str
    chart: str
    """Chart name, or its full `oci://` reference."""
    version: str
    repository: str
    """The `https://` repository, or the `oci://` prefix of an OCI chart."""
    values: Mapping[str, Any]
    create_namespace: bool

    @property
    def chart_name(self) -> str:
        return self.chart.rstrip("/").rsplit("/", 1)[-1]


def helm_chart(resource_type: str, props: Mapping[str, Any]) -> HelmChart:
    chart = str(props.get("chart") or "")
    repository = str(as_map(props.get("repositoryOpts")).get("repo") or "")
    if chart.startswith("oci://"):
        repository = chart.rstrip("/").rsplit("/", 1)[0]
    return HelmChart(
        name=str(props.get("name") or ""),
        namespace=str(props.get("namespace") or "default"),
        chart=chart,
        version=str(props.get("version") or ""),
        repository=repository,
        values=as_map(props.get("values")),
        create_namespace=bool(props.get("createNamespace")) and resource_type == HELM_RELEASE,
    )


def chart_named(resources: Sequence[PolicyResource], chart_name: str) -> list[tuple[PolicyResource, HelmChart]]:
    return [(r, chart) for r, chart in cluster_of(resources).charts if chart.chart_name == chart_name]


# --------------------------------------------------------------------------- quantities

_SUFFIX = {
    "": 1, "m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")


def quantity(value: Any) -> Fraction | None:
    """A Kubernetes quantity (`8`, `"500m"`, `"512Gi"`) as an exact number, None if unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return Fraction(value)
    return _text_quantity(str(value).strip())


@functools.lru_cache(maxsize=4096)
def _text_quantity(text: str) -> Fraction | None:
    # A fleet's quotas repeat a few figures thousands of times (every tenant's quota lines).
    match = _QUANTITY.fullmatch(text)
    if not match:
        return None
    return Fraction(match.group(1)) * _SUFFIX[match.group(2) or ""]


def gpu_resource(quota_key: str) -> str | None:
    """The GPU resource a ResourceQuota line caps (`requests.nvidia.com/mig-1g.10gb` ->
    `nvidia.com/mig-1g.10gb`), None for any other line. Extended resources are quota'd with the
    `requests.` prefix; a bare name is accepted too."""
    resource = quota_key.removeprefix("requests.").removeprefix("limits.")
    return resource if resource.startswith("nvidia.com/") or resource.endswith("/gpu") else None


# --------------------------------------------------------------------------- the cluster picture


@dataclass(frozen=True)
class Obj:
    """One Kubernetes object of the stack, with the resource it comes from."""

    resource: PolicyResource
    kind: str
    props: Mapping[str, Any]

    # Read once per object: the policies of a run read each object's name, labels and spec many
    # times over, each read through the unknown-checking proxy (an unknown value raises on every read).
    @functools.cached_property
    def name(self) -> str:
        return name_of(self.props)

    @functools.cached_property
    def namespace(self) -> str | None:
        return namespace_of(self.props)

    @functools.cached_property
    def labels(self) -> Mapping[str, Any]:
        return labels(self.props)

    @functools.cached_property
    def spec(self) -> Mapping[str, Any]:
        return as_map(self.props.get("spec"))

    def describe(self) -> str:
        return describe(self.resource.resource_type, self.props, self.resource.name)


@dataclass(frozen=True)
class Tenant:
    """A tenant as the stack shows it: its namespaces carry the tenant and trust labels."""

    name: str
    trust: str | None
    trust_domain: str | None
    namespaces: tuple[str, ...]


class Cluster:
    """The stack's Kubernetes objects by kind, and the tenants their namespaces declare."""

    def __init__(self, resources: Sequence[PolicyResource]):
        self.resources = resources
        self.objects: list[Obj] = []
        """Every Kubernetes object (and patch) of the stack, in stack order."""
        self._by_kind: dict[str, list[Obj]] = defaultdict(list)
        for r in resources:
            kind = kind_of(r.resource_type)
            if kind is not None:
                obj = Obj(r, kind, r.props)
                self.objects.append(obj)
                self._by_kind[kind].append(obj)
        tenants: dict[str, dict[str, Any]] = {}
        self.namespace_tenant: dict[str, str] = {}
        self.namespace_labels: dict[str, Mapping[str, Any]] = {}
        for ns in self.of("Namespace"):
            self.namespace_labels[ns.name] = ns.labels
            tenant = ns.labels.get(TENANT_LABEL)
            if tenant:
                self.namespace_tenant[ns.name] = str(tenant)
                entry = tenants.setdefault(str(tenant), {"namespaces": [], "trust": None, "domain": None})
                entry["namespaces"].append(ns.name)
                entry["trust"] = entry["trust"] or ns.labels.get(TRUST_LABEL)
                entry["domain"] = entry["domain"] or ns.labels.get(TRUST_DOMAIN_LABEL)
        self.tenants = {
            name: Tenant(name, e["trust"], e["domain"], tuple(sorted(e["namespaces"]))) for name, e in sorted(tenants.items())
        }
        self._by_namespace: dict[tuple[str, str | None], list[Obj]] | None = None
        self._once: dict[str, _Replay] = {}
        self._namespaces = LabelIndex(self.namespace_labels, self.namespace_labels.__getitem__)
        """A selector of one tenant's labels finds its namespaces without testing every namespace
        (one ClusterQueue per tenant made that quadratic)."""

    @functools.cached_property
    def charts(self) -> list[tuple[PolicyResource, HelmChart]]:
        """Every Helm release and chart of the stack, read once for the policies of a run that look
        one up by name (each scanned every resource)."""
        return [(r, helm_chart(r.resource_type, r.props)) for r in self.resources if r.resource_type in HELM_TYPES]

    def of(self, *kinds: str) -> list[Obj]:
        return [o for kind in kinds for o in self._by_kind.get(kind, [])]

    def once(self, name: str, produce: Callable[[], Iterator[Any]]) -> Iterable[Any]:
        """What `produce()` yields, produced once for every policy of a run (`cluster_of`) that
        asks for `name`, and replayed to each as it came: a policy that stops early reads no
        further, and one that reaches an error (a value unknown during preview) gets it there."""
        if name not in self._once:
            self._once[name] = _Replay(produce())
        return self._once[name]

    def in_namespace(self, kind: str, namespace: str | None) -> list[Obj]:
        """The objects of one kind in one namespace, in stack order (indexed on first use)."""
        if self._by_namespace is None:
            self._by_namespace = defaultdict(list)
            for o in self.objects:
                self._by_namespace[o.kind, o.namespace].append(o)
        return list(self._by_namespace.get((kind, namespace), ()))

    def tenant_of_namespace(self, namespace: str | None) -> Tenant | None:
        tenant = self.namespace_tenant.get(namespace or "")
        return self.tenants.get(tenant) if tenant else None

    def namespaces_selected(self, selector: Any, among: Iterable[str]) -> list[str]:
        """The namespaces of `among` a label selector selects (`selects`, on their own labels), sorted."""
        candidates = set(among).intersection(self._namespaces.matching(as_map(as_map(selector).get("matchLabels"))))
        return sorted(ns for ns in candidates if selects(selector, self.namespace_labels.get(ns, {})))

    def nodes(self) -> dict[str, Obj]:
        """The node patches of the fleet layer by node name (the platform never creates Nodes)."""
        return {o.name: o for o in self.of("NodePatch", "Node")}


class _Replay:
    """An iterator's items, read from it once however many times they are iterated."""

    def __init__(self, source: Iterator[Any]):
        self._source: Iterator[Any] | None = source
        self._items: list[Any] = []
        self._error: Exception | None = None

    def __iter__(self) -> Iterator[Any]:
        position = 0
        while True:
            if position < len(self._items):
                yield self._items[position]
                position += 1
            elif self._error is not None:
                raise self._error
            elif self._source is None:
                return
            else:
                try:
                    self._items.append(next(self._source))
                except StopIteration:
                    self._source = None
                except Exception as error:  # raised to every reader that gets this far, as the source raised it
                    self._error, self._source = error, None


_last_cluster: tuple[Sequence[PolicyResource], Cluster] | None = None


def cluster_of(resources: Sequence[PolicyResource]) -> Cluster:
    """The index of a stack's resources, built once for all the stack policies of a run (each is
    handed the same resource list): built per policy, it was most of the pack's time."""
    global _last_cluster
    if _last_cluster is None or _last_cluster[0] is not resources:
        _last_cluster = (resources, Cluster(resources))
    return _last_cluster[1]


def selects(selector: Any, object_labels: Mapping[str, Any]) -> bool:
    """Whether a Kubernetes label selector (matchLabels and matchExpressions) selects the labels.
    An empty selector selects everything; an absent one is the caller's business."""
    selector = as_map(selector)
    for key, value in as_map(selector.get("matchLabels")).items():
        if object_labels.get(key) != value:
            return False
    for expression in as_list(selector.get("matchExpressions")):
        expression = as_map(expression)
        key, operator = expression.get("key"), expression.get("operator")
        values = {str(v) for v in as_list(expression.get("values"))}
        present = key in object_labels
        if operator == "In" and not (present and str(object_labels[key]) in values):
            return False
        if operator == "NotIn" and present and str(object_labels[key]) in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def ancestors(resource: PolicyResource) -> Iterator[PolicyResource]:
    node = resource.parent
    while node is not None:
        yield node
        node = node.parent
