"""The checks across clusters (`factory/checking/fleet.py`), on small hand-made renders: a
tenant's GPU quotas over its clusters against its grant, the manager's dispatch queue against
the workers' quotas."""

from __future__ import annotations

import pytest

from ai_factory.factory.checking.fleet import fleet_findings, grant
from ai_factory.factory.model.loading import load_stack_file
from ai_factory.factory.rendering.bundle import Manifest, Rendered
from tests.fleet_env import write_env


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fleet-checks")
    return load_stack_file(str(write_env(directory)))


def queue(name: str, quotas: dict[str, int], tenant: str = "assistant") -> Manifest:
    resources = [{"name": r, **({"nominalQuota": n} if n is not None else {})} for r, n in quotas.items()]
    obj = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
           "spec": {"resourceGroups": [{"coveredResources": list(quotas), "flavors": [{"name": "f", "resources": [{"name": "cpu", "nominalQuota": "64"}, *resources]}]}]}}
    return Manifest(obj, "kueue", tenant, "test")


def render(*manifests: Manifest) -> Rendered:
    return Rendered(None, "1.34", list(manifests), [])


ASSISTANT_B = {"nvidia.com/mig-2g.20gb": 3, "nvidia.com/mig-1g.20gb": 1}
ASSISTANT_F = {"nvidia.com/gpu": 6, "nvidia.com/gpumem": 73728, "nvidia.com/gpucores": 150}


def renders(b=ASSISTANT_B, f=ASSISTANT_F, dispatch=None):
    return {
        "par1-a": render(queue("tenant-assistant-multicluster", dispatch if dispatch is not None else {**b, **f})),
        "par1-b": render(queue("tenant-assistant", b)),
        "fra1-a": render(queue("tenant-assistant", f)),
    }


@pytest.mark.parametrize(
    "clusters, expected",
    [
        pytest.param(renders(), [], id="accepts-quotas-that-add-up-to-the-grant"),
        pytest.param(renders(b={"nvidia.com/mig-2g.20gb": 2, "nvidia.com/mig-1g.20gb": 1}, dispatch={"nvidia.com/mig-2g.20gb": 2}), [], id="accepts-quotas-under-the-grant"),
        pytest.param(
            renders(f={**ASSISTANT_F, "nvidia.com/gpu": 7}),
            ["fleet-quota: ClusterQueue/tenant-assistant: nvidia.com/gpu: 7 over the clusters (fra1-a 7), above the tenant's grant of 6"],
            id="flags-a-quota-above-the-grant",
        ),
        pytest.param(
            {**renders(), "ams1-a": render(queue("tenant-assistant", {"nvidia.com/gpu": 1}))},
            ["fleet-quota: ClusterQueue/tenant-assistant: nvidia.com/gpu: 7 over the clusters (fra1-a 6, ams1-a 1), above the tenant's grant of 6"],
            id="flags-a-grant-counted-on-two-clusters",
        ),
        pytest.param(
            renders(dispatch={**ASSISTANT_B, **ASSISTANT_F, "nvidia.com/mig-1g.20gb": 2}),
            ["fleet-dispatch: ClusterQueue/tenant-assistant-multicluster: cluster par1-a: dispatches up to 2 nvidia.com/mig-1g.20gb, more than the tenant's 1 on its worker clusters"],
            id="flags-a-dispatch-above-the-workers",
        ),
        pytest.param(renders(dispatch={**ASSISTANT_B, "nvidia.com/gpu.shared": 0}), [], id="accepts-a-dispatch-of-none-of-a-resource-no-worker-has"),
        pytest.param({"fra1-a": render(queue("tenant-assistant", {"nvidia.com/gpu.shared": None}))}, [], id="accepts-a-resource-line-without-quota-as-none"),
        pytest.param(
            renders(dispatch={"nvidia.com/gpu.shared": 1}),
            ["fleet-dispatch: ClusterQueue/tenant-assistant-multicluster: cluster par1-a: dispatches up to 1 nvidia.com/gpu.shared, more than the tenant's 0 on its worker clusters"],
            id="flags-a-dispatch-of-a-resource-no-worker-has",
        ),
    ],
)
def test_fleet_findings(cfg, clusters, expected):
    assert [str(f).split(" [tenants")[0] for f in fleet_findings(cfg, clusters)] == expected


@pytest.mark.parametrize(
    "tenant, expected",
    [
        ("assistant", {"nvidia.com/mig-2g.20gb": 3, "nvidia.com/mig-1g.20gb": 1, "nvidia.com/gpu": 6, "nvidia.com/gpumem": 73728, "nvidia.com/gpucores": 150}),
        ("search", {"nvidia.com/gpu": 24, "nvidia.com/mig-1g.10gb": 6, "nvidia.com/mig-3g.40gb": 2, "nvidia.com/GH100_H100_SXM5_80GB": 2}),  # and its VM GPUs
        ("partner-acme", {"nvidia.com/gpu": 8}),
    ],
)
def test_a_grant_is_every_unit_the_tenant_demands(cfg, tenant, expected):
    assert grant(cfg, next(t for t in cfg.tenants if t.name == tenant)) == expected


def test_a_time_sliced_demand_is_granted_as_shared_gpus(cfg):
    pool = cfg.fleet.pools[0].model_copy(update={"sharing": "time-slicing"})
    changed = cfg.model_copy(update={"fleet": cfg.fleet.model_copy(update={"pools": [pool, *cfg.fleet.pools[1:]]})})
    assert grant(changed, next(t for t in changed.tenants if t.name == "partner-acme")) == {"nvidia.com/gpu.shared": 8}
