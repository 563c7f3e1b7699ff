"""A finding of an offline check (`ai_factory.factory.checking.check`, `ai_factory.factory.checking.isolation`): the check, the object and
the tenants involved."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Finding:
    check: str
    ref: str
    message: str
    tenants: tuple[str, ...] = ()

    def __str__(self) -> str:
        who = f" [tenants: {', '.join(self.tenants)}]" if self.tenants else ""
        return f"{self.check}: {self.ref}: {self.message}{who}"
