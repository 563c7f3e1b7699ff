"""The pack's entry point, run by `pulumi preview --policy-pack policies`: builds the PolicyPack from
the importable policies, which starts the analyzer server (so nothing imports this module)."""

from pulumi_policy import EnforcementLevel, PolicyPack

from ai_factory.policies.aif_policies import PACK_NAME, POLICIES

PolicyPack(PACK_NAME, policies=POLICIES, enforcement_level=EnforcementLevel.MANDATORY)
