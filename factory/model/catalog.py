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
    crd_groups: tuple[str, ...] = ()
    """API groups whose CRDs a release of this chart installs (from its `crds/`, its templates or,
    for Cilium, its operator at start-up). The GitOps bundle applies a custom resource only after
    the release owning its group is ready; `tests/test_catalog.py` checks each group against the
    oracle's CRDs of the product."""

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
        crd_groups=("nvidia.com", "nfd.k8s-sigs.io"),
    ),
    # SOURCE.yaml: release v0.19.2; main's values.yaml differs from the tag only in image tags.
    "kueue": ChartSource(
        name="kueue",
        repository="oci://registry.k8s.io/kueue/charts",
        version="0.19.2",
        oracle_dir="kueue/chart",
        crd_groups=("kueue.x-k8s.io",),
    ),
    # Moved from NVIDIA/ to kai-scheduler/KAI-Scheduler; the published chart version is the git tag
    # (the repository's Chart.yaml says 0.0.0). values.yaml differs from v0.17.0 by 3 lines.
    "kai-scheduler": ChartSource(
        name="kai-scheduler",
        repository="oci://ghcr.io/kai-scheduler/kai-scheduler",
        version="v0.17.0",
        oracle_dir="kai-scheduler/chart",
        crd_groups=("scheduling.run.ai", "kai.scheduler"),
    ),
    # master's chart has diverged from the release; chart-release/ is the published 1.15.1.
    "volcano": ChartSource(
        name="volcano",
        repository="https://volcano-sh.github.io/helm-charts",
        version="1.15.1",
        oracle_dir="volcano/chart-release",
        crd_groups=("batch.volcano.sh", "bus.volcano.sh", "config.volcano.sh", "nodeinfo.volcano.sh", "scheduling.volcano.sh", "shard.volcano.sh", "topology.volcano.sh"),
    ),
    # The repository's master is the v2.10.0 release commit (SOURCE.yaml); no values schema.
    "hami": ChartSource(
        name="hami",
        repository="https://project-hami.github.io/HAMi/",
        version="2.10.0",
        oracle_dir="hami/chart",
    ),
    # Moved to kubernetes-sigs/dra-driver-nvidia-gpu and renamed from nvidia-dra-driver-gpu; main's
    # 0.5.0-dev is unpublished, so the pin is the latest release, whose values are in chart-release/.
    "dra-driver-nvidia-gpu": ChartSource(
        name="dra-driver-nvidia-gpu",
        repository="oci://registry.k8s.io/dra-driver-nvidia/charts",
        version="0.4.1",
        oracle_dir="nvidia-dra-driver-gpu/chart-release",
        crd_groups=("resource.nvidia.com",),
    ),
    # main's Chart.yaml says 0.0.1 (placeholder, 0.37 in development); the latest stable release
    # v0.36.1 is published as chart 0.36.1, its values and strict schema are in chart-release/.
    "vcluster": ChartSource(
        name="vcluster",
        repository="https://charts.loft.sh",
        version="0.36.1",
        oracle_dir="vcluster/chart-release",
    ),
    # The published chart package (cilium/charts, v1.20.0); the CRDs come from a main commit two weeks
    # older (SOURCE.yaml), the same API for the policies we emit.
    "cilium": ChartSource(
        name="cilium",
        repository="https://helm.cilium.io/",
        version="1.20.0",
        oracle_dir="cilium/chart",
        crd_groups=("cilium.io",),
    ),
    # codecentric's keycloakx (Quarkus Keycloak 26.5.6), tag keycloakx-7.1.11; with a values schema.
    "keycloak": ChartSource(
        name="keycloakx",
        repository="https://codecentric.github.io/helm-charts",
        version="7.1.11",
        oracle_dir="keycloak/chart",
    ),
    # openbao-helm main = tag openbao-0.29.2 (OpenBao v2.6.2); with a values schema.
    "openbao": ChartSource(
        name="openbao",
        repository="https://openbao.github.io/openbao-helm",
        version="0.29.2",
        oracle_dir="openbao/chart",
    ),
    # main = helm-chart-2.9.0 (v2.9.0); with a values schema.
    "external-secrets": ChartSource(
        name="external-secrets",
        repository="https://charts.external-secrets.io",
        version="2.9.0",
        oracle_dir="external-secrets/chart",
        crd_groups=("external-secrets.io", "generators.external-secrets.io"),
    ),
    # Tag kyverno-chart-3.9.0 (Kyverno v1.19.0): main carries the placeholder v0.0.0. No values schema.
    "kyverno": ChartSource(
        name="kyverno",
        repository="https://kyverno.github.io/kyverno/",
        version="3.9.0",
        oracle_dir="kyverno/chart",
        crd_groups=("kyverno.io", "policies.kyverno.io"),
    ),
    # falcosecurity/charts master = tag falco-9.1.0 (Falco 0.44.1). No values schema.
    "falco": ChartSource(
        name="falco",
        repository="https://falcosecurity.github.io/charts",
        version="9.1.0",
        oracle_dir="falco/chart",
    ),
    # Chart 0.34.0 = operator v0.32.0 (main HEAD). No values schema.
    "trivy-operator": ChartSource(
        name="trivy-operator",
        repository="https://aquasecurity.github.io/helm-charts/",
        version="0.34.0",
        oracle_dir="trivy-operator/chart",
        crd_groups=("aquasecurity.github.io",),
    ),
    # deliveryhero/helm-charts stable/node-problem-detector 2.4.1 (NPD v1.35.1); kubernetes/node-problem-detector
    # ships no chart. No values schema. OCI is the repository the chart's README prefers.
    "node-problem-detector": ChartSource(
        name="node-problem-detector",
        repository="oci://ghcr.io/deliveryhero/helm-charts",
        version="2.4.1",
        oracle_dir="node-problem-detector/chart",
    ),
    # prometheus-community/helm-charts tag kube-prometheus-stack-88.5.3 (operator v0.93.1); the oracle's
    # values.yaml is main at the same chart version. No values schema; subchart values not in the oracle.
    "kube-prometheus-stack": ChartSource(
        name="kube-prometheus-stack",
        repository="https://prometheus-community.github.io/helm-charts",
        version="88.5.3",
        oracle_dir="prometheus-operator/chart",
    ),
    # opencost/opencost-helm-chart main = tag opencost-2.5.17 (OpenCost 1.120.1). No values schema.
    "opencost": ChartSource(
        name="opencost",
        repository="https://opencost.github.io/opencost-helm-chart",
        version="2.5.17",
        oracle_dir="opencost/chart",
    ),
    # kserve/kserve release v0.20.0, published as OCI charts (no classic repository index). CRDs and
    # controller are separate charts; the llmisvc pair serves LLMInferenceService (llm-d).
    "kserve-crd": ChartSource(
        name="kserve-crd",
        repository="oci://ghcr.io/kserve/charts",
        version="v0.20.0",
        oracle_dir="kserve/charts/kserve-crd",
        crd_groups=("serving.kserve.io",),
    ),
    "kserve-resources": ChartSource(
        name="kserve-resources",
        repository="oci://ghcr.io/kserve/charts",
        version="v0.20.0",
        oracle_dir="kserve/chart",
    ),
    "kserve-llmisvc-crd": ChartSource(
        name="kserve-llmisvc-crd",
        repository="oci://ghcr.io/kserve/charts",
        version="v0.20.0",
        oracle_dir="kserve/charts/kserve-llmisvc-crd",
        # Its CRDs are of serving.kserve.io too, whose installer the bundle counts as kserve-crd (the
        # chart skips ClusterStorageContainer when kserve-crd owns it); LLMInferenceServices are
        # tenants' objects, applied after every platform release.
    ),
    "kserve-llmisvc-resources": ChartSource(
        name="kserve-llmisvc-resources",
        repository="oci://ghcr.io/kserve/charts",
        version="v0.20.0",
        oracle_dir="kserve/charts/kserve-llmisvc-resources",
    ),
    # The llm-d well-known LLMInferenceServiceConfigs (scheduler, prefill/decode templates, routing
    # sidecar) that LLMInferenceServices are merged with; KServe's model-server runtimes off.
    "kserve-runtime-configs": ChartSource(
        name="kserve-runtime-configs",
        repository="oci://ghcr.io/kserve/charts",
        version="v0.20.0",
        oracle_dir="kserve/charts/kserve-runtime-configs",
    ),
    # kubernetes-sigs/lws tag v0.10.0: the chart version is the tag (Chart.yaml says 0.1.0).
    # SOURCE.yaml: the fork snapshot of upstream main at df888f68 (chart 1.1.0, its operator
    # subchart 1.1.0; upstream has moved on to 1.3.0). Its CRDs are of group nvidia.com, which the
    # GPU Operator's release owns in the bundle (one release per group): DynamoGraphDeployments are
    # tenants' objects, ordered after this release by their tenant stack's dependency on the layer.
    "dynamo-platform": ChartSource(
        name="dynamo-platform",
        repository="https://helm.ngc.nvidia.com/nvidia/ai-dynamo",
        version="1.1.0",
        oracle_dir="dynamo/chart",
    ),
    "lws": ChartSource(
        name="lws",
        repository="oci://registry.k8s.io/lws/charts",
        version="v0.10.0",
        oracle_dir="lws/chart",
        crd_groups=("leaderworkerset.x-k8s.io",),
    ),
    # Mellanox/network-operator tag v26.4.1, the latest stable release (master is 26.7.0-rc.1); its values
    # are chart-release/. The bundled SR-IOV Network Operator (NVIDIA's build, its CRDs in the chart)
    # is the one installed: the standalone sriov-network-operator chart would be a second operator
    # fighting over the same SriovNetworkNodePolicies. No values schema.
    "network-operator": ChartSource(
        name="network-operator",
        repository="https://helm.ngc.nvidia.com/nvidia",
        version="26.4.1",
        oracle_dir="network-operator/chart-release",
        # nv-ipam's CRDs come from the operator once a NicClusterPolicy asks for nv-ipam.
        crd_groups=("mellanox.com", "k8s.cni.cncf.io", "sriovnetwork.openshift.io", "sriovnetwork.k8snetworkplumbingwg.io", "nv-ipam.nvidia.com"),
    ),
    # BerriAI/litellm deploy/charts/litellm-helm 1.1.0 (LiteLLM v1.80.12), published only as OCI. Its
    # repository could not be obtained: the oracle's values.yaml is a transcription (SOURCE.yaml), so
    # no package of it is in the chart cache. No values schema.
    "litellm": ChartSource(
        name="litellm-helm",
        repository="oci://ghcr.io/berriai",
        version="1.1.0",
        oracle_dir="litellm/chart",
    ),
    # SlinkyProject/slurm-operator tag v1.2.1 (the latest stable; 1.3.0-rc1 is a release candidate), OCI only.
    # The CRDs chart installs slinky.slurm.net; the operator chart's own `crds.enabled` stays off. Its
    # oracle folder holds the 1.3.0-rc1 copy (the only one recorded): the chart has no values at all.
    "slurm-operator-crds": ChartSource(
        name="slurm-operator-crds",
        repository="oci://ghcr.io/slinkyproject/charts",
        version="1.2.1",
        oracle_dir="slinky/charts/slurm-operator-crds",
        crd_groups=("slinky.slurm.net",),
    ),
    "slurm-operator": ChartSource(
        name="slurm-operator",
        repository="oci://ghcr.io/slinkyproject/charts",
        version="1.2.1",
        oracle_dir="slinky/charts/slurm-operator-1.2.1",
    ),
    # One release per tenant that asks for a Slurm cluster (components/slinky.py).
    "slurm": ChartSource(
        name="slurm",
        repository="oci://ghcr.io/slinkyproject/charts",
        version="1.2.1",
        oracle_dir="slinky/charts/slurm-1.2.1",
    ),
}


@dataclass(frozen=True)
class ManifestSource:
    """A product without a Helm chart, installed from the manifest its release publishes.

    `url` is the release asset at `version`; `digest` is the pin the render can verify offline:
    the upstream commit of the release tag as `../shared/upstream/<product>/SOURCE.yaml` records it
    (this machine has no network, so the asset's own sha256 has never been computed here and is not
    invented). Pulumi applies the URL at deployment (`kubernetes:yaml/v2:ConfigFile`, read by the
    provider, never by the render) and the GitOps bundle lists it as a remote resource of its
    stage (`factory/rendering/bundle.py`); `tests/test_catalog.py` keeps `version` and `digest`
    equal to SOURCE.yaml."""

    name: str
    url: str
    version: str
    digest: str
    """`git:<commit>` of the release tag the asset was built from."""
    oracle_dir: str
    """Folder (relative to the oracle root) holding SOURCE.yaml and the CRDs of this version."""
    crd_groups: tuple[str, ...] = ()
    """API groups whose CRDs applying the manifest installs (as `ChartSource.crd_groups`)."""


MANIFESTS: dict[str, ManifestSource] = {
    # kubevirt/kubevirt release v1.9.0 (tag commit in SOURCE.yaml): virt-operator and the KubeVirt CRD.
    # virt-operator registers the VirtualMachine/instance type CRDs (kubevirt.io, instancetype.kubevirt.io)
    # itself once a KubeVirt CR exists.
    "kubevirt-operator": ManifestSource(
        name="kubevirt-operator",
        url="https://github.com/kubevirt/kubevirt/releases/download/v1.9.0/kubevirt-operator.yaml",
        version="v1.9.0",
        digest="git:79d34c1762169e5b0370ec491cef5ca12e6b504c",
        oracle_dir="kubevirt",
        crd_groups=("kubevirt.io", "instancetype.kubevirt.io"),
    ),
    # CDI v1.66.0, the version KubeVirt v1.9.0 is released with (SOURCE.yaml, HCO hack/config). Its tag
    # commit is not recorded upstream-side here; the pin is the HCO commit that bundles it.
    "cdi-operator": ManifestSource(
        name="cdi-operator",
        url="https://github.com/kubevirt/containerized-data-importer/releases/download/v1.66.0/cdi-operator.yaml",
        version="v1.66.0",
        digest="git:03da3cff7325b28b4a7361a90bc921e184f875ef",
        oracle_dir="kubevirt",
        crd_groups=("cdi.kubevirt.io",),
    ),
}


def crd_groups(chart: str) -> tuple[str, ...]:
    """The CRD groups the pinned chart named `chart` installs (`chart` as a release names it: the
    chart's name, or its `oci://` reference); none for a chart outside the catalog."""
    name = chart.rsplit("/", 1)[-1]
    return next((c.crd_groups for c in CHARTS.values() if c.name == name), ())
