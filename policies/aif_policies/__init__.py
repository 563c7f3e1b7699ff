"""The ai-factory guardrails: every CrossGuard policy of the pack, importable without starting the
analyzer server (only `PolicyPack(...)` does that, in `policies/__main__.py`).

`POLICIES` is what the pack registers and what `factory check` runs offline; the README's
"Policies" section lists them.
"""

from ai_factory.policies.aif_policies import admission, fabric, gpu, network, reliability, secret_stores, security, serving, slurm, tenancy, workloads

PACK_NAME = "ai-factory-guardrails"

POLICIES = [
    *tenancy.POLICIES,
    *gpu.POLICIES,
    *security.POLICIES,
    *reliability.POLICIES,
    *workloads.POLICIES,
    *network.POLICIES,
    *fabric.POLICIES,
    *serving.POLICIES,
    *secret_stores.POLICIES,
    *admission.POLICIES,
    *slurm.POLICIES,
]
