"""A hand-written Pulumi program: a few ai-factory components with typed arguments, no stack file.

Two clusters, each through its own Kubernetes provider: both get Kueue with one whole-GPU flavor
of an H100 pool; the first also gets the GPU Operator and two tenants (each with its ClusterQueue,
admitted to that flavor through the Kueue component's own flavor list).
Run it as any Pulumi program (`pulumi up` in this folder, with `ai-factory` installed in the
project's virtualenv); `tests/test_examples.py` runs it under the SDK's mocks.
"""

import pulumi
import pulumi_kubernetes as k8s

from ai_factory.components.gpu_operator import GpuOperator, GpuOperatorArgs, PoolDriver
from ai_factory.components.kueue import Kueue, KueueArgs, KueueTenantHook
from ai_factory.components.tenant_stack import TenantStack, TenantStackArgs
from ai_factory.factory.model.catalog import CHARTS
from ai_factory.factory.model.config import DriverSettings, Owners, Tenant
from ai_factory.factory.model.tenancy import TRUST_DOMAIN_LABEL, tenant_names
from ai_factory.factory.planning.placement import POOL_LABEL, Grant, Offering, Taint, TenantAllocation
from ai_factory.factory.planning.quotas import CPU_FLAVOR, ClusterQueueSpec, CohortSpec, FlavorQuotas, Quota, ResourceGroup

GPU = "nvidia.com/gpu"
NODES = ("h100-000", "h100-001")

h100 = Offering(
    name="h100-research",
    pool="h100",
    gpu_model="H100-SXM5-80GB",
    kind="whole",
    trust_domain="research",
    node_labels={POOL_LABEL: "h100", TRUST_DOMAIN_LABEL: "research"},
    tolerations=(Taint(TRUST_DOMAIN_LABEL, "research"),),
    nodes=NODES,
    supply={GPU: 16},
)


def queue(tenant: str, gpus: int) -> ClusterQueueSpec:
    return ClusterQueueSpec(
        tenant=tenant,
        trust_domain="research",
        cohort="research",
        fair_share_weight=1,
        groups=(
            ResourceGroup(covered=("cpu", "memory"), flavors=(FlavorQuotas(CPU_FLAVOR, (Quota("cpu", "64"), Quota("memory", "512Gi"))),)),
            ResourceGroup(covered=(GPU,), flavors=(FlavorQuotas(h100.name, (Quota(GPU, gpus, borrowing_limit=0),)),)),
        ),
    )


def kueue_args() -> KueueArgs:
    return KueueArgs(
        chart=CHARTS["kueue"],
        namespace="kueue-system",
        flavors=(h100,),
        flavor_topologies=(),
        cohorts=(CohortSpec(name="research", parent=None, trust_domain="research"),),
        dra_device_classes=(),
    )


def tenant(name: str, gpus: int, queues: KueueTenantHook) -> None:
    spec = Tenant(name=name, trust="high", trust_domain="research", owners=Owners(groups=[f"{name}-admins"]))
    TenantStack(
        f"{name}-tenant",
        TenantStackArgs(
            tenant=spec,
            names=tenant_names(spec),
            allocation=TenantAllocation(tenant=name, grants=(Grant(offering=h100.name, pool="h100", resource=GPU, amount=gpus),)),
            offerings=(h100,),
            gpu_ceilings={GPU: gpus},
            advertised_resources=(GPU,),
            device_class_ceilings={},
            platform_flows=(),
            kubernetes_version="1.34",
            hooks=(queues,),
        ),
        opts=pulumi.ResourceOptions(provider=east, depends_on=[east_kueue]),
    )


east = k8s.Provider("east", context="east-admin")
west = k8s.Provider("west", context="west-admin")

GpuOperator(
    "east-gpu-operator",
    GpuOperatorArgs(
        chart=CHARTS["gpu-operator"],
        namespace="gpu-operator",
        drivers=(PoolDriver(pool="h100", settings=DriverSettings()),),
        toolkit_version="v1.20.0",
        mig_configs={},
        time_slicing_replicas=(),
        dcgm_exporter=True,
    ),
    opts=pulumi.ResourceOptions(provider=east),
)
east_kueue = Kueue("east-kueue", kueue_args(), opts=pulumi.ResourceOptions(provider=east))
Kueue("west-kueue", kueue_args(), opts=pulumi.ResourceOptions(provider=west))

tenant_queues = KueueTenantHook.for_kueue(kueue_args(), (queue("vision", 8), queue("speech", 8)))
tenant("vision", 8, tenant_queues)
tenant("speech", 8, tenant_queues)
