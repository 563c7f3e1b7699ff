"""A finding of an offline check (`ai_factory.factory.checking.check`, `ai_factory.factory.checking.isolation`): the check, the object and
the tenants involved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar


@dataclass(frozen=True, order=True)
class Finding:
    check: str
    ref: str
    message: str
    tenants: tuple[str, ...] = ()

    def __str__(self) -> str:
        who = f" [tenants: {', '.join(self.tenants)}]" if self.tenants else ""
        return f"{self.check}: {self.ref}: {self.message}{who}"


C = TypeVar("C", bound=Callable)


def tenant_local(check: C) -> C:
    """Marks a fleet-wide check tenant-local: over a render it finds exactly what it finds over
    each tenant's view (`checking.views`: the tenant's objects and resources, the platform's made
    for it, the platform's made for no tenant in particular), each finding in the view of every
    tenant it is attributed to (those of the object it names, else its tenants), and a finding
    attributed to none in every view alike. It reads the render's objects, resources and
    inventory, never its config. The check cache then keeps its findings per tenant and checks
    only the changed tenants' views again (tests/test_check_views.py holds every marked check to
    it)."""
    check.tenant_local = True  # type: ignore[attr-defined]
    return check


def is_tenant_local(check: Callable) -> bool:
    return getattr(check, "tenant_local", False)
