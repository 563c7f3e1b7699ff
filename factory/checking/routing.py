"""Offline checks of the serving path: no tenant's route can capture another tenant's traffic, and no
tenant reaches another tenant's model except through the gateway or LiteLLM.

Read from the rendered objects only (as every isolation check, `ai_factory.factory.checking.isolation`):

* `gateway_routes`: every Gateway listener that admits a tenant's routes admits that tenant's
  namespace only, under a hostname of its own (a listener without a hostname, or with one another
  listener gives another tenant, lets routes capture foreign traffic); every tenant route names
  only hostnames no other tenant's route or listener holds, and sends only to its own namespace
  (a backend elsewhere needs a ReferenceGrant, and another tenant's namespace never may be one).
* `litellm_reach`: LiteLLM's namespace denies egress by default, and every allow into a tenant's
  namespace names the pods of one model LiteLLM's model list routes to, never a whole namespace.
* `model_ingress`: a policy selecting a tenant's model pods admits only its own namespace, the
  gateway's `ingress` identity, Cilium's health checks and LiteLLM's pods.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import urlsplit

from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.isolation import View, _endpoint_scope, _policy_specs, guarded
from ai_factory.factory.checking.label_index import selects
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.model.serving import MODEL_LABEL
from ai_factory.factory.model.catalog import CHARTS
from ai_factory.factory.rendering.bundle import Manifest, Rendered
from ai_factory.factory.rendering.charts import releases_of

ROUTE_KINDS = ("HTTPRoute", "GRPCRoute")
MODEL_INFO_KEY = "ai_factory_model"
"""Key of a LiteLLM model-list entry's `model_info` naming the tenant's model it routes to."""
ADMITTED_ENTITIES = frozenset({"ingress", "health"})
"""Cilium identities a model pod may accept besides pods: the Gateway's Envoy and health probes."""


def _finding(check: str, m: Manifest, message: str, *tenants: str | None) -> Finding:
    return Finding(check, m.ref, message, tuple(sorted({t for t in tenants if t})))


def _listeners(view: View) -> Iterator[tuple[Manifest, Mapping[str, Any], list[str]]]:
    """(Gateway, listener, tenants whose namespaces the listener admits routes from)."""
    for gateway in view.of_kind("Gateway"):
        for listener in (gateway.obj.get("spec") or {}).get("listeners") or []:
            namespaces = ((listener.get("allowedRoutes") or {}).get("namespaces") or {})
            admitted = namespaces.get("from", "Same")
            if admitted == "All":
                names = list(view.tenant_namespaces)
            elif admitted == "Selector":
                names = [ns for ns, labels in view.namespace_labels.items() if selects(namespaces.get("selector"), labels)]
            else:
                names = [gateway.namespace or ""]
            yield gateway, listener, sorted({t.tenant for ns in names if (t := view.tenant_at(ns))})


def gateway_routes(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    view = View.of(rendered)
    host_owner: dict[str, set[str]] = {}
    listeners = list(_listeners(view))
    for gateway, listener, tenants in listeners:
        name = listener.get("name")
        if len(tenants) > 1:
            yield _finding("gateway-routes", gateway, f"listener {name} admits routes of tenants {', '.join(tenants)}: each could capture the others' traffic", *tenants)
        if tenants and not listener.get("hostname"):
            yield _finding("gateway-routes", gateway, f"listener {name} admits tenant {', '.join(tenants)}'s routes under every hostname", *tenants)
        if len(tenants) == 1 and listener.get("hostname"):
            host_owner.setdefault(str(listener["hostname"]), set()).update(tenants)
    routes = [m for m in view.of_kind(*ROUTE_KINDS) if view.tenant_at(m.namespace)]
    for m in routes:
        home = view.tenant_at(m.namespace)
        assert home is not None
        for host in (m.obj.get("spec") or {}).get("hostnames") or []:
            host_owner.setdefault(str(host), set()).add(home.tenant)
    for host, owners in sorted(host_owner.items()):
        if len(owners) > 1:
            where = next((g for g, l, t in listeners if l.get("hostname") == host), None) or next(m for m in routes if host in ((m.obj.get("spec") or {}).get("hostnames") or []))
            yield _finding("gateway-routes", where, f"hostname {host} is claimed by tenants {', '.join(sorted(owners))}: one could capture the other's traffic", *owners)
    grants = _reference_grants(view)
    for m in routes:
        home = view.tenant_at(m.namespace)
        assert home is not None
        for rule in (m.obj.get("spec") or {}).get("rules") or []:
            for ref in rule.get("backendRefs") or []:
                target = ref.get("namespace") or m.namespace
                if target == m.namespace:
                    continue
                other = view.tenant_at(target)
                if other:
                    yield _finding("gateway-routes", m, f"routes tenant {home.tenant}'s traffic to tenant {other.tenant}'s {ref.get('kind', 'Service')} {target}/{ref.get('name')}", home.tenant, other.tenant)
                elif (target, m.namespace, m.kind) not in grants:
                    yield _finding("gateway-routes", m, f"sends to {target}/{ref.get('name')} without a ReferenceGrant in {target}", home.tenant)
    for grant in view.of_kind("ReferenceGrant"):
        home = view.tenant_at(grant.namespace)
        for source in (grant.obj.get("spec") or {}).get("from") or []:
            other = view.tenant_at(source.get("namespace"))
            if home and other and other.tenant != home.tenant:
                yield _finding("gateway-routes", grant, f"lets tenant {other.tenant}'s {source.get('kind')}s reach into tenant {home.tenant}'s namespace", home.tenant, other.tenant)


def _reference_grants(view: View) -> set[tuple[str, str, str]]:
    """(namespace granting, namespace granted, kind granted)."""
    return {
        (m.namespace or "", str(source.get("namespace")), str(source.get("kind")))
        for m in view.of_kind("ReferenceGrant")
        for source in (m.obj.get("spec") or {}).get("from") or []
    }


def _model_of(selector: Mapping[str, Any]) -> set[str] | None:
    """The model names a Cilium endpoint selector narrows to, None when it does not."""
    key = f"k8s:{MODEL_LABEL}"
    labels = selector.get("matchLabels") or {}
    if key in labels or MODEL_LABEL in labels:
        return {str(labels.get(key, labels.get(MODEL_LABEL)))}
    for expression in selector.get("matchExpressions") or []:
        if expression.get("key") in (key, MODEL_LABEL) and expression.get("operator") == "In":
            return {str(v) for v in expression.get("values") or []}
    return None


def _litellm_releases(rendered: Rendered) -> list[Manifest]:
    return [r.manifest for r in releases_of(rendered)[0] if r.pin.name == CHARTS["litellm"].name]


def routed_models(release: Manifest) -> set[tuple[str, str]]:
    """(namespace, model) of every entry of a LiteLLM release's model list."""
    values = (release.obj.get("spec") or {}).get("values") or {}
    found = set()
    for entry in (values.get("proxy_config") or {}).get("model_list") or []:
        info = entry.get("model_info") or {}
        host = urlsplit(str((entry.get("litellm_params") or {}).get("api_base", ""))).hostname or ""
        parts = host.split(".")
        if len(parts) >= 2 and info.get(MODEL_INFO_KEY):
            found.add((parts[1], str(info[MODEL_INFO_KEY])))
    return found


def litellm_reach(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    view = View.of(rendered)
    for release in _litellm_releases(rendered):
        ns = release.namespace or ""
        routed = routed_models(release)
        policies = [(m, s) for m in view.of_kind("CiliumClusterwideNetworkPolicy", "CiliumNetworkPolicy") for s in _policy_specs(m)]
        selecting = []
        for m, spec in policies:
            namespaces, _ = _endpoint_scope(spec.get("endpointSelector") or {}, view, m.namespace if m.kind == "CiliumNetworkPolicy" else None)
            if namespaces is None or ns in namespaces:
                selecting.append((m, spec, namespaces, _))
        whole = [s for m, s, namespaces, narrows in selecting if not narrows and namespaces == {ns}]
        if not any((s.get("enableDefaultDeny") or {}).get("egress", bool(s.get("egress"))) for s in whole):
            yield _finding("litellm-reach", release, f"no Cilium policy denies LiteLLM's egress by default in {ns}: it can reach every tenant's models")
        for m, spec, _, _ in selecting:
            for rule in spec.get("egress") or []:
                for selector in rule.get("toEndpoints") or []:
                    targets, _ = _endpoint_scope(selector, view, None)
                    for target in sorted(targets or set(view.tenant_namespaces)):
                        tenant = view.tenant_at(target)
                        if tenant is None:
                            continue
                        models = _model_of(selector)
                        if models is None:
                            yield _finding("litellm-reach", m, f"lets LiteLLM reach every pod of tenant {tenant.tenant}'s namespace {target}, not only the models it routes to", tenant.tenant)
                            continue
                        for model in sorted(models - {name for space, name in routed if space == target}):
                            yield _finding("litellm-reach", m, f"lets LiteLLM reach tenant {tenant.tenant}'s model {model}, which its model list does not route to", tenant.tenant)


def _is_litellm(selector: Mapping[str, Any], view: View, litellm_namespaces: set[str]) -> bool:
    namespaces, narrows = _endpoint_scope(selector, view, None)
    return bool(namespaces) and narrows and namespaces <= litellm_namespaces


def model_ingress(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    view = View.of(rendered)
    litellm = {m.namespace or "" for m in _litellm_releases(rendered)}
    for m in view.of_kind("CiliumClusterwideNetworkPolicy", "CiliumNetworkPolicy"):
        for spec in _policy_specs(m):
            selector = spec.get("endpointSelector") or {}
            if _model_of(selector) is None:
                continue
            namespaces, _ = _endpoint_scope(selector, view, m.namespace if m.kind == "CiliumNetworkPolicy" else None)
            for ns in sorted(namespaces or set(view.tenant_namespaces)):
                tenant = view.tenant_at(ns)
                if tenant is None:
                    continue
                for rule in spec.get("ingress") or []:
                    for entity in sorted(set(rule.get("fromEntities") or []) - ADMITTED_ENTITIES):
                        yield _finding("model-ingress", m, f"tenant {tenant.tenant}'s model pods accept entity {entity!r}", tenant.tenant)
                    for peer in rule.get("fromEndpoints") or []:
                        sources, _ = _endpoint_scope(peer, view, None)
                        if sources == {ns} or _is_litellm(peer, view, litellm):
                            continue
                        others = sorted({t.tenant for s in sources or set(view.tenant_namespaces) if (t := view.tenant_at(s)) and t.tenant != tenant.tenant})
                        what = f"tenant {', '.join(others)}'s pods" if others else f"pods of {', '.join(sorted(sources)) if sources else 'every namespace'}"
                        yield _finding("model-ingress", m, f"tenant {tenant.tenant}'s model pods accept {what}, not only the gateway, LiteLLM and its own namespace", tenant.tenant, *others)
                    if rule.get("fromCIDR") or rule.get("fromCIDRSet"):
                        yield _finding("model-ingress", m, f"tenant {tenant.tenant}'s model pods accept an address block", tenant.tenant)


GATEWAY_CHECKS = (guarded(gateway_routes), guarded(model_ingress))
LITELLM_CHECKS = (guarded(litellm_reach),)
