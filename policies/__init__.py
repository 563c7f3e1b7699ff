"""The CrossGuard policy pack of the platform (`PulumiPolicy.yaml`, `__main__.py`) and its
importable policies (`policies.aif_policies`)."""
