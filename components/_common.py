"""Helpers every component uses: labels, the component base class, namespaces and Helm charts."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol, Sequence, TypeVar

import pulumi
import pulumi_kubernetes as k8s
import yaml

from ai_factory.factory.memo import by_identity
from ai_factory.factory.model.catalog import ChartSource
from ai_factory.factory.rendering.harness import COMPONENT_LAYER_KEY, COMPONENT_TENANT_KEY
from ai_factory.factory.model.config import FactoryConfig, Tenant
from ai_factory.factory.model.tenancy import LABEL_PREFIX, TENANT_LABEL, TenantNames

T = TypeVar("T")
V = TypeVar("V")
R = TypeVar("R", bound=pulumi.Resource)

POOL_LABEL = f"{LABEL_PREFIX}/pool"
SITE_LABEL = f"{LABEL_PREFIX}/site"
RACK_LABEL = f"{LABEL_PREFIX}/rack"
BLOCK_LABEL = f"{LABEL_PREFIX}/block"
NVLINK_DOMAIN_LABEL = f"{LABEL_PREFIX}/nvlink-domain"
GPU_MODEL_LABEL = f"{LABEL_PREFIX}/gpu-model"
FABRIC_LABEL = f"{LABEL_PREFIX}/fabric"
RDMA_LABEL = f"{LABEL_PREFIX}/rdma"
"""On the nodes of RDMA pools: how their NICs are exposed (`sriov` or `rdma-shared`)."""
PART_OF = "ai-factory"


YAML_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""libyaml's emitter where PyYAML was built with it; PyYAML's own otherwise."""


def yaml_text(data: Any, **options: Any) -> str:
    """`yaml.safe_dump(data, **options)`, byte for byte, through `YAML_DUMPER`: chart values embed
    YAML documents (a vCluster's manifests per tenant, rules, configs) and PyYAML's own emitter,
    in Python, cost several times libyaml's (tests/test_yaml_text.py holds the two equal)."""
    return yaml.dump(data, Dumper=YAML_DUMPER, **options)


def restricted_container(user: int) -> dict[str, Any]:
    """A container's security context under Pod Security restricted, as `user`, with a read-only root."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": user,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def labels(component: str, *, tenant: str | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The label set of every object the library creates (Kubernetes recommended labels + ours)."""
    result = {"app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/component": component}
    if tenant:
        result[TENANT_LABEL] = tenant
    result.update(extra or {})
    return result


class FactoryComponent(pulumi.ComponentResource):
    """Base of every ai-factory component: a stable type token and the layer/tenant it belongs to,
    recorded in its properties so the inventory can attribute every child."""

    def __init__(self, token: str, name: str, *, layer: str, tenant: str | None = None, opts: pulumi.ResourceOptions | None = None):
        props: dict[str, Any] = {COMPONENT_LAYER_KEY: layer}
        if tenant:
            props[COMPONENT_TENANT_KEY] = tenant
        super().__init__(token, name, props, opts)
        self.layer = layer
        self._served: dict[pulumi.Resource, frozenset[str]] = {}
        self._before_tenants: tuple[list[pulumi.Resource], dict[str, list[pulumi.Resource]]] | None = None

        self.resource_name = name

    def child(self, **options: Any) -> pulumi.ResourceOptions:
        """Options for a child: parented to this component (which passes its provider on), plus
        any extra options."""
        return pulumi.ResourceOptions(parent=self, **options)

    def child_name(self, suffix: str) -> str:
        """A child's Pulumi name: the component's own name first (Pulumi's convention), so two
        instances of a component never register the same URN. Kubernetes names are not derived
        from it: they stay what the layer defines."""
        return f"{self.resource_name}-{suffix}"

    # ---- what a layer made for some tenants only

    def serves(self, tenants: Iterable[str], resource: R) -> R:
        """`resource`, created under this layer for these tenants only (a tenant's query proxy,
        its trust domain's queue): their stacks' objects are ordered after it, no other tenant's
        (`ordered_before`)."""
        if isinstance(resource, pulumi.ComponentResource):
            raise TypeError(f"{resource_key(resource)}: a component is not made for some tenants, its custom resources are")
        self._served[resource] = frozenset(tenants)
        return resource

    def tenant_scopes(self) -> dict[str, tuple[str, ...]]:
        """The tenants each resource made for some tenants only (`serves`) is for, by resource key
        (`<type>::<name>`, the inventory's): what the render cache records with the layer, so
        that a tenant stack's dependencies on a cached layer are those the SDK gives a built one."""
        return {resource_key(r): tuple(sorted(tenants)) for r, tenants in self._served.items()}

    def ordered_before(self, tenant: str) -> list[pulumi.Resource]:
        """What a tenant's stack depends on in this layer: what a `depends_on` on the component
        stands for (every custom resource under it, reached through local components, as the SDK
        expands it), less what the layer made for other tenants only. Its shared resources (chart
        releases installing CRDs, controllers and webhooks; cluster-wide policies and classes) and
        its own, so the count does not grow with the tenants. Call once every child exists."""
        if self._before_tenants is None:
            shared: list[pulumi.Resource] = []
            own: dict[str, list[pulumi.Resource]] = {}
            pending = list(self._childResources)  # what the SDK expands a component to
            while pending:
                r = pending.pop()
                if isinstance(r, pulumi.ComponentResource) and not r._remote:
                    pending.extend(r._childResources)
                elif r in self._served:
                    for t in self._served[r]:
                        own.setdefault(t, []).append(r)
                else:
                    shared.append(r)
            self._before_tenants = (shared, own)
        shared, own = self._before_tenants
        return [*shared, *own.get(tenant, ())]

    def serves_domains(self, domain_tenants: Mapping[str, Sequence[str]], domains: Iterable[str], resource: R) -> R:
        """`resource`, made for these trust domains' tenants only (`serves`): a domain's queue or
        flavor, an organisation's queue. With no tenants by domain, it stays shared."""
        if domain_tenants:
            self.serves([t for d in domains for t in domain_tenants.get(d, ())], resource)
        return resource


def domain_tenants(cfg: FactoryConfig) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Each trust domain's tenants, for a layer marking what it made per domain (`serves_domains`)."""
    by_domain: dict[str, list[str]] = {}
    for t in cfg.tenants:
        by_domain.setdefault(t.domain, []).append(t.name)
    return tuple((domain, tuple(sorted(names))) for domain, names in sorted(by_domain.items()))


def queue_domains(queues: Sequence[Any]) -> dict[str, list[str]]:
    """The trust domains each queue-tree node (Kueue cohort, KAI queue: a `name`, `parent` and
    `trust_domain`) is for: a domain's node its domain; an organisation's node, the parent of its
    domains' nodes, all of them (their tenants' queues borrow through it)."""
    domains: dict[str, list[str]] = {q.name: [q.trust_domain] for q in queues if q.trust_domain}
    for q in queues:
        if q.parent and q.trust_domain:
            domains.setdefault(q.parent, []).append(q.trust_domain)
    return domains


def resource_key(resource: pulumi.Resource) -> str:
    """A resource's key in the render (`harness.Resource.key`, the inventory's): type and name."""
    return f"{resource.pulumi_resource_type}::{resource.pulumi_resource_name}"


class ArgumentError(ValueError):
    """Typed arguments that contradict each other (a tenant queue naming a flavor its Kueue does
    not have, ...), raised when the arguments are built, before any resource is registered.
    One `argument: message` line per problem."""

    def __init__(self, what: str, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join([f"invalid {what} ({len(problems)} problem{'s' if len(problems) != 1 else ''}):", *(f"  - {p}" for p in problems)]))


POD_SECURITY_LEVELS = ("privileged", "baseline", "restricted")


def namespace(
    component: FactoryComponent,
    name: str,
    *,
    pod_security: str,
    extra_labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    **options: Any,
) -> k8s.core.v1.Namespace:
    """A namespace with Pod Security admission enforced (and audited/warned at the same level)."""
    assert pod_security in POD_SECURITY_LEVELS
    ns_labels = labels(component.layer, extra=extra_labels)
    for mode in ("enforce", "audit", "warn"):
        ns_labels[f"pod-security.kubernetes.io/{mode}"] = pod_security
    return k8s.core.v1.Namespace(
        component.child_name("namespace"),
        metadata=k8s.meta.v1.ObjectMetaArgs(name=name, labels=ns_labels, annotations=dict(annotations) if annotations else None),
        opts=component.child(**options),
    )


def helm_release(
    component: FactoryComponent,
    name: str,
    source: ChartSource,
    *,
    namespace: pulumi.Input[str],
    values: Mapping[str, Any],
    **options: Any,
) -> k8s.helm.v3.Release:
    """Install a pinned chart as a Helm release named `name` (a real release, visible to `helm`,
    with its hooks; its Pulumi name is the component's, `<component>-release-<name>`). Values are
    passed whole; `factory check` validates them against the chart."""
    if source.is_oci:
        chart, repository_opts = source.oci_url, None
    else:
        chart, repository_opts = source.name, k8s.helm.v3.RepositoryOptsArgs(repo=source.repository)
    return k8s.helm.v3.Release(
        component.child_name(f"release-{name}"),
        name=name,
        chart=chart,
        version=source.version,
        repository_opts=repository_opts,
        namespace=namespace,
        values=dict(values),
        atomic=False,
        max_history=10,
        opts=component.child(**options),
    )


class TenantHook(Protocol):
    """Per-tenant objects a platform layer adds to every tenant environment.

    A layer that needs objects per tenant (its queue, its identity group, its secret store, ...)
    returns a hook: plain data built from the config and the plan, so a tenant stack run on its own
    (Automation API, one stack per tenant) can rebuild it without the platform's resources.
    `TenantStack` calls `attach` once per tenant; every resource it creates must be parented to
    `stack` (use `stack.child(...)`) so the tenant's objects live, and go, with the tenant.

    A hook holding data of every tenant (their queues, their models) also defines
    `narrowed(tenant) -> hook`: the same hook with only what that tenant's `attach` reads. Each
    tenant stack is built from its narrowed hooks (`narrowed`), so its objects depend on its own
    data only and the render cache keys it by that (`ai_factory.factory.rendering.cache`).
    """

    layer: str

    def attach(self, stack: FactoryComponent, tenant: Tenant, names: TenantNames) -> None: ...


def narrowed(hook: TenantHook, tenant: str) -> TenantHook:
    """`hook` with only what `tenant`'s objects are built from (the whole hook if it does not say)."""
    narrow = getattr(hook, "narrowed", None)
    return narrow(tenant) if narrow is not None else hook


def tenant_items(items: Iterable[T], tenant: str) -> tuple[T, ...]:
    """The items (queues, clusters, networks, each with a `tenant`) of one tenant.

    Every tenant's stack narrows the same hook, so a tuple (immutable, of frozen items) is indexed
    by tenant once instead of scanned per tenant, which was quadratic in the tenants."""
    if type(items) is not tuple:
        return tuple(i for i in items if i.tenant == tenant)  # type: ignore[attr-defined]
    return _items_by_tenant(items).get(tenant, ())


@by_identity(kept=16)  # a render narrows a handful of hooks' tuples: enough for all of them
def _items_by_tenant(items: tuple[Any, ...]) -> dict[str, tuple[Any, ...]]:
    index: dict[str, list[Any]] = {}
    for item in items:
        index.setdefault(item.tenant, []).append(item)
    return {name: tuple(own) for name, own in index.items()}


def tenant_entry(by_tenant: Mapping[str, V], tenant: str) -> dict[str, V]:
    """The entry of one tenant in a mapping by tenant name (none if it has none)."""
    return {tenant: by_tenant[tenant]} if tenant in by_tenant else {}
