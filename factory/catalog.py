"""Pinned upstream Helm charts: the one place where a chart's name, source and version live.

Each pin records the published chart version from `../shared/upstream/<product>/SOURCE.yaml`
(a `0.0.0`/`-dev` version in a repository's Chart.yaml is a placeholder and is never used here)
and the oracle folder whose `values.yaml` / `values.schema.json` match that version.
`tests/test_catalog.py` keeps these pins honest against the oracle files.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChartSource:
    """Where a chart comes from. `repository` is an `https://` Helm repository or an `oci://` prefix."""

    name: str
    repository: str
    version: str
    oracle_dir: str
    """Folder (relative to the oracle root) holding the chart's values.yaml for this version."""

    @property
    def is_oci(self) -> bool:
        return self.repository.startswith("oci://")

    @property
    def oci_url(self) -> str:
        """The full OCI reference of the chart (without tag)."""
        return f"{self.repository.rstrip('/')}/{self.name}"


CHARTS: dict[str, ChartSource] = {
    # Published as release tag v26.7.0; the repository's Chart.yaml says v1.0.0-devel (placeholder).
    # SOURCE.yaml: values and CRDs of the release are identical to the main-branch copy in chart/.
    "gpu-operator": ChartSource(
        name="gpu-operator",
        repository="https://helm.ngc.nvidia.com/nvidia",
        version="v26.7.0",
        oracle_dir="gpu-operator/chart",
    ),
}
