"""The pack's entry point, run by `pulumi preview --policy-pack policies`: builds the PolicyPack from
the importable policies, which starts the analyzer server (so nothing imports this module)."""

import sys
from pathlib import Path

# Pulumi runs this file with only policies/ on sys.path; the policies import the repository's packages.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from policies.aif_policies import PACK_NAME, POLICIES  # noqa: E402

PolicyPack(PACK_NAME, policies=POLICIES, enforcement_level=EnforcementLevel.MANDATORY)
