"""Kubernetes resource quantities as the config accepts them (`ai_factory.factory.model.config.Quantity`)."""

from __future__ import annotations

from decimal import Decimal

_SUFFIXES = {
    "m": Decimal(1) / 1000, "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}


def parse_quantity(quantity: str) -> Decimal:
    """A quantity in base units (cores, bytes)."""
    number = quantity.rstrip("kMGTPEimi")
    suffix = quantity[len(number):]
    return Decimal(number) * _SUFFIXES.get(suffix, Decimal(1))


def gib(amount: Decimal) -> str:
    """Bytes as GiB for messages, e.g. `96Gi`, `2.5Gi`."""
    return f"{(amount / 2**30).quantize(Decimal('0.01')).normalize():f}Gi"


def cores(amount: Decimal) -> str:
    """Cores for messages, e.g. `12`, `1.256`."""
    return f"{amount.normalize():f}"
