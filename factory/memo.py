"""Results kept for the very objects they were computed from.

A render asks the same questions of one frozen configuration, plan or hook tuple once per tenant
(the fleet's offerings, the queue plan, a hook's items by tenant): answered once per object, not
once per tenant, which made building every tenant's arguments quadratic."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def by_identity(kept: int) -> Callable[[F], F]:
    """Keep the results of the last `kept` calls, keyed by the identity of the (positional)
    arguments, which must not change afterwards (frozen models and tuples). Each entry holds its
    arguments, so an id cannot be reused while its result is kept."""

    def decorate(function: F) -> F:
        results: dict[tuple[int, ...], tuple[tuple[Any, ...], Any]] = {}

        @functools.wraps(function)
        def cached(*args: Any) -> Any:
            key = tuple(map(id, args))
            hit = results.get(key)
            if hit is None:
                if len(results) >= kept:
                    del results[next(iter(results))]
                hit = results[key] = (args, function(*args))
            return hit[1]

        return cached  # type: ignore[return-value]

    return decorate
