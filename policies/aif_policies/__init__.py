"""The ai-factory guardrails: every CrossGuard policy of the pack, importable without starting the
analyzer server (only `PolicyPack(...)` does that, in `policies/__main__.py`).

`POLICIES` is what the pack registers and what `factory check` runs offline; the README's
"Policies" section lists them.
"""

import importlib
import pkgutil

PACK_NAME = "ai-factory-guardrails"

# Every module of the package that declares `POLICIES` contributes them, in module-name order: a
# concern's new module joins the pack without being listed here.
POLICIES = [
    policy
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__))
    for policy in getattr(importlib.import_module(f"{__name__}.{module}"), "POLICIES", ())
]
