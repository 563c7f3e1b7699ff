"""Stage 4, checking: upstream oracles (schemas, CRDs, chart values), tenant isolation, scheduling
consistency and the CrossGuard policies, run offline over a render."""
