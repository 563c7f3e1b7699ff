"""The serving path: no tenant's route can capture another tenant's traffic, a tenant's models at
their maximum replicas fit its quota, and a Dynamo model stays inside its tenant's namespace, queue
and GPUs.

A Gateway listener that admits tenants' routes admits one tenant's namespaces only, under a
hostname (a listener without one takes every hostname) that no listener admitting another tenant
holds; a tenant's route names only hostnames no other tenant's route claims, and sends only to its
own namespaces. Gateway API resolves two routes claiming one hostname by age, so the first tenant
to claim a hostname would take the other's traffic.

A model's pods at its maximum replicas (decode, prefill, pipeline stages, KServe's endpoint
picker) must fit its tenant namespace's ResourceQuota CPU, memory and pods, or it stalls below its
maximum while its tenant's other pods are refused (`factory.checking.serving.model_demand`).

A `DynamoGraphDeployment` lives in a tenant's namespace; every component's pods name a Kueue
queue of that namespace (so serving is admitted against the tenant's quota); a worker asks for
the same GPUs as requests and as limits, in Dynamo's `resources` and on its main container alike
(the operator merges both into one container: two different figures leave the pod's real request
to merge order); no frontend or other component asks for a GPU. The pods' security context,
tolerations and images are the workload policies' (`workloads.py`), which read Dynamo's
`extraPodSpec` as a pod spec.

References: Gateway API `allowedRoutes` and `ReferenceGrant` (GEP-709); issue 13 items 1, 3 and 4;
the DynamoGraphDeployment CRD (`../shared/upstream/dynamo/crds`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Iterator

from pulumi_policy import PolicyResource

from ai_factory.factory.checking.serving import MODEL_KINDS, dynamo_gpus, gpus_of, listed_gpus, model_demand, quota_shortfalls
from ai_factory.factory.model.serving import HostDemand
from ai_factory.policies.aif_policies.core import Violation, stack_policy
from ai_factory.policies.aif_policies.kube import Cluster, Obj, as_list, as_map, selects, cluster_of

ROUTE_KINDS = ("HTTPRoute", "GRPCRoute")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def admitted_tenants(cluster: Cluster, gateway: Obj, listener: Mapping[str, Any]) -> list[str]:
    """The tenants whose namespaces a listener admits routes from (Gateway API default: `Same`)."""
    namespaces = as_map(as_map(listener.get("allowedRoutes")).get("namespaces"))
    admitted = namespaces.get("from", "Same")
    if admitted == "All":
        names = list(cluster.namespace_tenant)
    elif admitted == "Selector":
        names = [ns for ns, labels in cluster.namespace_labels.items() if selects(namespaces.get("selector"), {**labels, "kubernetes.io/metadata.name": ns})]
    else:
        names = [gateway.namespace or ""]
    return sorted({cluster.namespace_tenant[ns] for ns in names if ns in cluster.namespace_tenant})


def check_gateway_listeners_isolate_tenants(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    holders: dict[str, set[str]] = {}
    for gateway in cluster.of("Gateway"):
        for listener in as_list(gateway.spec.get("listeners")):
            listener = as_map(listener)
            tenants = admitted_tenants(cluster, gateway, listener)
            name = listener.get("name")
            if len(tenants) > 1:
                yield gateway.resource, f"{gateway.describe()} listener {name} admits routes of tenants {', '.join(tenants)}: each could capture the others' traffic; give each tenant a listener selecting its namespaces only."
            elif tenants and not listener.get("hostname"):
                yield gateway.resource, f"{gateway.describe()} listener {name} admits tenant {tenants[0]}'s routes under every hostname; give it the tenant's hostname."
            if len(tenants) == 1 and listener.get("hostname"):
                held = holders.setdefault(str(listener["hostname"]), set())
                held.update(tenants)
                if len(held) > 1:
                    yield gateway.resource, f"{gateway.describe()} listener {name}: hostname {listener['hostname']} is admitted for tenants {', '.join(sorted(held))}."


def check_tenant_routes_own_hostnames(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    claims: dict[str, set[str]] = {}
    routes = [(r, t) for r in cluster.of(*ROUTE_KINDS) if (t := cluster.tenant_of_namespace(r.namespace))]
    for route, tenant in routes:
        for host in as_list(route.spec.get("hostnames")):
            claims.setdefault(str(host), set()).add(tenant.name)
    for route, tenant in routes:
        for host in as_list(route.spec.get("hostnames")):
            others = sorted(claims[str(host)] - {tenant.name})
            if others:
                yield route.resource, f"{route.describe()} of tenant {tenant.name} claims hostname {host}, which tenant {', '.join(others)} also claims: the older route would take the other's traffic."
        for rule in as_list(route.spec.get("rules")):
            for ref in as_list(as_map(rule).get("backendRefs")):
                target = cluster.tenant_of_namespace(as_map(ref).get("namespace"))
                if target is not None and target.name != tenant.name:
                    yield route.resource, f"{route.describe()} of tenant {tenant.name} sends traffic to tenant {target.name}'s namespace {as_map(ref).get('namespace')}."


def check_models_fit_tenant_quota(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    demands: dict[str, tuple[HostDemand, list[str]]] = {}
    for model in cluster.of(*MODEL_KINDS):
        if cluster.tenant_of_namespace(model.namespace) is None:
            continue
        total, names = demands.get(model.namespace or "", (HostDemand(), []))
        demands[model.namespace or ""] = (total + model_demand(model.kind, model.spec), [*names, model.name])
    for quota in cluster.of("ResourceQuota"):
        if quota.namespace not in demands:
            continue
        demand, names = demands[quota.namespace]
        for problem in quota_shortfalls(as_map(quota.spec.get("hard")), demand):
            yield quota.resource, f"{quota.describe()} of tenant {cluster.namespace_tenant[quota.namespace]}: its models ({', '.join(names)}) at their maximum replicas take {problem}."


def check_dynamo_models_in_tenant_bounds(resources: Sequence[PolicyResource], config: Mapping[str, Any]) -> Iterator[Violation]:
    cluster = cluster_of(resources)
    queues = {(q.namespace, q.name) for q in cluster.of("LocalQueue")}
    for dgd in cluster.of("DynamoGraphDeployment"):
        tenant = cluster.tenant_of_namespace(dgd.namespace)
        if tenant is None:
            yield dgd.resource, f"{dgd.describe()} serves a model outside every tenant's namespace: its pods would escape every tenant's quota and isolation."
            continue
        for name, service in sorted(as_map(dgd.spec.get("services")).items()):
            service = as_map(service)
            where = f"{dgd.describe()} of tenant {tenant.name}, service {name}"
            queue = as_map(as_map(service.get("extraPodMetadata")).get("labels")).get(QUEUE_LABEL)
            if (dgd.namespace, queue) not in queues:
                named = f"queue {queue}, which is not a LocalQueue of {dgd.namespace}" if queue else "no Kueue queue"
                yield dgd.resource, f"{where}: its pods name {named}: they would not count against the tenant's quota."
            dynamo = as_map(service.get("resources"))
            main = as_map(as_map(as_map(service.get("extraPodSpec")).get("mainContainer")).get("resources"))
            asked = {
                "resources.requests": dynamo_gpus(dynamo.get("requests")),
                "resources.limits": dynamo_gpus(dynamo.get("limits")),
                "mainContainer requests": gpus_of(main.get("requests")),
                "mainContainer limits": gpus_of(main.get("limits")),
            }
            if service.get("componentType") != "worker":
                if any(asked.values()):
                    yield dgd.resource, f"{where}: a {service.get('componentType') or 'component'} asks for GPUs ({'; '.join(f'{k}: {listed_gpus(v)}' for k, v in asked.items() if v)}); only workers run the model."
            elif len({tuple(sorted(v.items())) for v in asked.values()}) > 1:
                yield dgd.resource, f"{where}: its GPU figures differ ({'; '.join(f'{k}: {listed_gpus(v)}' for k, v in asked.items())}); a worker asks for one GPU shape, as requests and as limits."


POLICIES = [
    stack_policy(
        "gateway-listeners-isolate-tenants",
        "A Gateway listener admits one tenant's routes, under a hostname of its own.",
        check_gateway_listeners_isolate_tenants,
    ),
    stack_policy(
        "tenant-routes-own-hostnames",
        "A tenant's route claims no hostname another tenant's route claims, and sends only to its own namespaces.",
        check_tenant_routes_own_hostnames,
    ),
    stack_policy(
        "models-fit-tenant-quota",
        "A tenant's models at their maximum replicas fit its namespace's ResourceQuota CPU, memory and pods.",
        check_models_fit_tenant_quota,
    ),
    stack_policy(
        "dynamo-models-in-tenant-bounds",
        "A DynamoGraphDeployment is in a tenant's namespace, its pods name a queue of that namespace, and only its workers ask for GPUs, one shape as requests and limits.",
        check_dynamo_models_in_tenant_bounds,
    ),
]
