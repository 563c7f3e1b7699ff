"""The root component: composes the platform's layers from one validated configuration."""

from __future__ import annotations

import pulumi

from components._common import FactoryComponent
from components.fleet import Fleet, FleetArgs
from components.gpu_operator import GpuOperator, GpuOperatorArgs, PoolDriver
from factory.config import FactoryConfig
from factory.planner import Plan

TOKEN = "ai-factory:index:Platform"


def gpu_operator_args(cfg: FactoryConfig) -> GpuOperatorArgs:
    layer = cfg.layers.gpu_operator
    return GpuOperatorArgs(
        chart=layer.chart.source("gpu-operator"),
        namespace=layer.namespace,
        drivers=tuple(PoolDriver(pool=p.name, settings=p.driver) for p in cfg.fleet.pools),
        toolkit_version=layer.toolkit_version,
        mig=any(p.sharing == "mig" for p in cfg.fleet.pools),
        dcgm_exporter=layer.dcgm_exporter,
        registry=layer.registry,
    )


class Platform(FactoryComponent):
    """Everything one environment runs: the fleet's node labels, then each enabled layer."""

    def __init__(self, name: str, cfg: FactoryConfig, plan: Plan, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="platform", opts=opts)
        fleet = Fleet("fleet", FleetArgs.from_config(cfg), opts=self.child())
        if cfg.layers.gpu_operator.enabled:
            GpuOperator("gpu-operator", gpu_operator_args(cfg), opts=self.child(depends_on=[fleet]))
        self.register_outputs({})
