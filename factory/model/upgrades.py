"""The record of an upgrade wave: `upgrades/<env>.json` of the project, written by `ai-factory
upgrade` before each step and after each gate, read by every run of the program (as the plan
lock `plans/<env>.json` is), so that `pulumi up` of any cluster's stack deploys the step the
upgrade is at: the platform on the target matrix version, the tenants of the rings done (and of
the ring under way) on its ringed charts, the other tenants still on the version they run.
Committed with the config, it is also what a stopped upgrade resumes from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

UPGRADES_DIR = "upgrades"
PLATFORM_STEP = "platform"
"""The first step: every platform layer (CRDs, the CNI, controllers) moves before any ring."""


class Stop(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: str
    cluster: str
    reason: str
    """The failed gate (`gpu-allocatable`, ...) or `pulumi up`."""
    detail: str


class UpgradeState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_version: str
    to: str
    done: list[str] = Field(default=[])
    """Steps whose update ran and whose gates passed, in order (`platform`, then rings)."""
    current: str | None = None
    """The step under way (deployed, gates not yet passed), or the one that stopped."""
    stopped: Stop | None = None
    status: Literal["running", "stopped", "complete"] = "running"

    def deployed_rings(self) -> list[str]:
        """Rings whose tenants run the target version: done, or under way."""
        steps = [*self.done, *([self.current] if self.current else [])]
        return [s for s in steps if s != PLATFORM_STEP]


def state_path(env: str, directory: Path) -> Path:
    return directory / UPGRADES_DIR / f"{env}.json"


def read_state(env: str, directory: Path) -> UpgradeState | None:
    from ai_factory.factory.model.loading import ConfigError

    path = state_path(env, directory)
    if not path.is_file():
        return None
    try:
        return UpgradeState.model_validate_json(path.read_bytes()[: 1 << 20])
    except ValidationError as err:
        where = err.errors()[0]
        raise ConfigError(
            [f"{UPGRADES_DIR}/{path.name}: not an upgrade record written by `ai-factory upgrade` ({'.'.join(map(str, where['loc'])) or 'document'}: {where['msg']})"],
            source=str(path),
        ) from None


def write_state(env: str, directory: Path, state: UpgradeState) -> None:
    path = state_path(env, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")


def environment_of(stack: str, raw: dict[str, Any]) -> str:
    """The environment a stack deploys: itself, or `<env>` for a cluster's stack `<env>-<cluster>`."""
    cluster = (raw.get("kubernetes") or {}).get("cluster") if isinstance(raw.get("kubernetes"), dict) else None
    return stack[: -len(cluster) - 1] if isinstance(cluster, str) and stack.endswith(f"-{cluster}") else stack


def with_upgrade_state(raw: dict[str, Any], env: str, directory: Path) -> dict[str, Any]:
    """`raw` as the upgrade under way (if any) deploys it: its target matrix version, and the
    rings deployed so far as `upgrades.in_progress`."""
    state = read_state(env, directory)
    if state is None:
        return raw
    matrix = raw.get("matrix") if isinstance(raw.get("matrix"), dict) else {}
    upgrades = raw.get("upgrades") if isinstance(raw.get("upgrades"), dict) else {}
    progress = {"from_version": state.from_version, "to": state.to, "done": state.deployed_rings()}
    return {**raw, "matrix": {**matrix, "version": state.to}, "upgrades": {**upgrades, "in_progress": progress}}
