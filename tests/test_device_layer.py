"""The device layer as the plan configures it: node labels and taints, MIG Manager and time-slicing
configs, HAMi and the DRA driver. Most tests read a test-only environment: dev plus a time-sliced
pool, a second HAMi pool (another split count, one tenant opting in to memory oversubscription) and
a DRA pool shared by a medium-trust tenant and a low-trust one."""

from __future__ import annotations

import copy
import json
import re
from collections import Counter

import pytest
import yaml

from ai_factory.components.dra import PRODUCT_NAMES, whole_gpu_class
from ai_factory.components.gpu_operator import NODE_TAINT_KEYS
from ai_factory.factory.checking.check import run_checks
from ai_factory.factory.model.gpus import GPU_MODELS
from ai_factory.factory.model.loading import ConfigError, validate
from ai_factory.factory.planning.placement import DEDICATED_LABEL, MIG_CONFIG_LABEL, allocations, node_placements
from ai_factory.factory.planning.from_config import plan_for
from ai_factory.factory.planning.report import report_text
from ai_factory.factory.model.tenancy import TRUST_DOMAIN_LABEL
from tests.conftest import objects, one, render, without_models

STACK = "device-test"  # never `dev`: a locked plans/dev.json must not change these tests


def device_config(dev_config: dict) -> dict:
    raw = copy.deepcopy(dev_config)
    raw["fleet"]["pools"] += [
        {"name": "l4-ts", "site": "par1", "gpu": {"model": "L4-24GB", "per_node": 2}, "sharing": "time-slicing", "nodes": 2},
        {"name": "l4-hami", "site": "par1", "gpu": {"model": "L4-24GB", "per_node": 2}, "sharing": "hami", "nodes": 1, "hami": {"split_count": 4}},
        {"name": "h100-dra", "site": "par1", "gpu": {"model": "H100-80GB", "per_node": 4}, "sharing": "dra", "nodes": 2},
    ]
    tenants = {t["name"]: t for t in raw["tenants"]}
    tenants["search"]["gpus"] += [
        {"pool": "l4-ts", "count": 6},
        {"pool": "l4-hami", "count": 2, "memory_mib": 8192, "cores_percent": 30, "memory_oversubscription": 1.5},
    ]
    tenants["assistant"]["gpus"].append({"pool": "h100-dra", "count": 2})
    tenants["partner-acme"]["gpus"].append({"pool": "h100-dra", "count": 3})
    return raw


@pytest.fixture(scope="module")
def device_raw(dev_raw):
    return device_config(dev_raw[0]), dev_raw[1]


@pytest.fixture(scope="module")
def device_plan(device_raw):
    return plan_for(validate(device_raw[0]))


def nodes(rendered) -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in objects(rendered, "Node")}


def values(rendered, release: str) -> dict:
    return one(rendered, "HelmRelease", release)["spec"]["values"]


def printed_gpus(plan, cfg) -> dict[tuple[str, int], tuple[str, str, str]]:
    """(node, GPU index) -> (pool sharing, mode, layout), read back from the printed GPU tables."""
    rows, sharing = {}, None
    for line in report_text(plan, cfg, gpus=True).splitlines():
        header = re.match(r"pool [^:]+: [^,]+, ([a-z-]+),", line)
        if header:
            sharing = header.group(1)
            continue
        cells = re.split(r" {2,}", line)
        if sharing and len(cells) >= 4 and cells[1].isdigit():
            rows[cells[0], int(cells[1])] = (sharing, cells[2], cells[3])
        elif not line:
            sharing = None
    return rows


# --------------------------------------------------------------------------- every object


DEVICE_LAYERS = ("fleet", "gpu-operator", "hami", "dra")


def test_device_layer_objects_pass_every_oracle(device, oracles):
    """The layers' own objects, and the claim templates they add to tenant environments."""
    mine = [m for m in device.manifests if m.layer in DEVICE_LAYERS or m.kind == "ResourceClaimTemplate"]
    assert {m.layer for m in mine} >= set(DEVICE_LAYERS) and any(m.kind == "ResourceClaimTemplate" for m in mine)
    refs = {m.ref for m in mine}
    assert [str(f) for f in run_checks(device, oracles) if f.ref in refs] == []


# --------------------------------------------------------------------------- fleet: labels and taints


def test_each_node_carries_exactly_the_taints_and_the_labels_the_plan_places(device, device_plan):
    rendered = nodes(device)
    for placement in node_placements(device_plan):
        node = rendered[placement.node]
        assert placement.labels.items() <= node["metadata"]["labels"].items()
        assert node.get("spec", {}).get("taints", []) == [t.as_dict() for t in placement.taints]


def test_no_node_with_shared_gpus_lacks_its_trust_domain_taint(device, device_plan):
    rendered = nodes(device)
    shared = [(pool, node) for pool in device_plan.pools if pool.sharing in ("mig", "hami", "time-slicing") for node in pool.nodes]
    assert {pool.sharing for pool, _ in shared} == {"mig", "hami", "time-slicing"}
    for _, node in shared:
        taints = rendered[node.name]["spec"]["taints"]
        expected = {"key": TRUST_DOMAIN_LABEL, "value": node.trust_domain or "unassigned", "effect": "NoSchedule"}
        assert expected in taints, node.name
        serving = {gpu.trust_domain for gpu in node.gpus if gpu.mode != "idle"}
        assert serving <= {node.trust_domain}, f"{node.name} serves {serving}"


def test_low_trust_tenants_nodes_are_tainted_for_them_alone(device, device_plan):
    rendered = nodes(device)
    dedicated = [node for pool in device_plan.pools for node in pool.nodes if node.dedicated_tenant]
    assert {n.dedicated_tenant for n in dedicated} == {"partner-acme"}
    assert {p.name for p in device_plan.pools if any(n.dedicated_tenant for n in p.nodes)} == {"h100-train", "h100-dra"}
    for node in dedicated:
        assert {"key": DEDICATED_LABEL, "value": "partner-acme", "effect": "NoSchedule"} in rendered[node.name]["spec"]["taints"]
        assert {gpu.owner for gpu in node.gpus if gpu.mode == "whole"} == {"partner-acme"}


# --------------------------------------------------------------------------- GPU Operator: MIG


def mig_parted(rendered) -> dict:
    config = values(rendered, "gpu-operator")["migManager"]["config"]
    assert config["create"] is True and config["name"]
    return yaml.safe_load(config["data"]["config.yaml"])


def test_each_mig_node_selects_a_config_whose_layout_is_the_printed_plan(device, device_raw, device_plan):
    configs = mig_parted(device)["mig-configs"]
    printed = printed_gpus(device_plan, validate(device_raw[0]))
    mig_pools = [pool for pool in device_plan.pools if pool.sharing == "mig"]
    assert mig_pools
    for pool in mig_pools:
        pci_ids = list(GPU_MODELS[pool.gpu_model].pci_device_ids)
        for node in pool.nodes:
            name = nodes(device)[node.name]["metadata"]["labels"][MIG_CONFIG_LABEL]
            entries = configs[name]
            for index in range(pool.gpus_per_node):
                entry = next(e for e in entries if index in e["devices"])
                assert entry["device-filter"] == pci_ids
                _, mode, layout = printed[node.name, index]
                profiles = Counter(part.split("@")[0] for part in layout.split()) if mode == "mig" else Counter()
                assert entry["mig-enabled"] is (mode == "mig"), (node.name, index)
                assert Counter(entry.get("mig-devices", {})) == profiles, (node.name, index)


def test_mig_manager_ships_all_disabled_as_its_default(device):
    config = values(device, "gpu-operator")["migManager"]["config"]
    assert config["default"] == "all-disabled"
    assert mig_parted(device)["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    assert mig_parted(device)["version"] == "v1"


# --------------------------------------------------------------------------- GPU Operator: time-slicing


def test_time_sliced_nodes_select_a_config_with_their_pool_replicas_renamed_as_shared(device, device_plan):
    config = values(device, "gpu-operator")["devicePlugin"]["config"]
    data = {name: yaml.safe_load(text) for name, text in config["data"].items()}
    assert config["create"] is True and "sharing" not in data[config["default"]]
    pool = device_plan.pool("l4-ts")
    for node in pool.nodes:
        selected = data[nodes(device)[node.name]["metadata"]["labels"]["nvidia.com/device-plugin.config"]]
        assert selected["sharing"]["timeSlicing"] == {
            "renameByDefault": True,
            "failRequestsGreaterThanOne": True,
            "resources": [{"name": "nvidia.com/gpu", "replicas": pool.time_slicing_replicas}],
        }
        assert selected["flags"]["migStrategy"] == "mixed"


def test_no_device_plugin_config_without_time_sliced_pools(dev):
    assert "config" not in values(dev, "gpu-operator")["devicePlugin"]


def test_time_sliced_grants_count_the_shared_resource(device_plan):
    grants = allocations(device_plan, {"search": "internal"})["search"].grants
    assert {(g.pool, g.resource, g.amount) for g in grants if g.pool == "l4-ts"} == {("l4-ts", "nvidia.com/gpu.shared", 6)}


# --------------------------------------------------------------------------- HAMi


def hami_nodes(plan) -> set[str]:
    return {node.name for pool in plan.pools if pool.sharing == "hami" for node in pool.nodes}


def test_hami_device_plugin_selects_hami_nodes_only_and_the_nvidia_plugin_stays_off_them(device, device_plan):
    selector = values(device, "hami")["devicePlugin"]["nvidiaNodeSelector"]
    selected = {name for name, node in nodes(device).items() if selector.items() <= node["metadata"]["labels"].items()}
    assert selected == hami_nodes(device_plan) and len(selected) == 3
    for name in selected:
        assert nodes(device)[name]["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] == "false"


def test_hami_binpacks_nodes_and_gpus(device):
    assert values(device, "hami")["scheduler"]["defaultSchedulerPolicy"] == {"nodeSchedulerPolicy": "binpack", "gpuSchedulerPolicy": "binpack"}


def test_hami_split_count_and_memory_scaling_follow_the_plan_per_node(device, device_plan):
    plugin = values(device, "hami")["devicePlugin"]
    entries = {e["name"]: e for e in json.loads(plugin["nodeConfiguration"]["config"])["nodeconfig"]}
    assert set(entries) == hami_nodes(device_plan)
    for pool in (p for p in device_plan.pools if p.sharing == "hami"):
        for node in pool.nodes:
            scaling = {gpu.hami_memory_scaling for gpu in node.gpus if gpu.mode == "hami"} or {1.0}
            assert entries[node.name] == {
                "name": node.name,
                "operatingmode": "hami-core",
                "devicesplitcount": pool.hami_split_count,
                "devicememoryscaling": scaling.pop(),
            }
    assert entries["l4-hami-000"]["devicememoryscaling"] == 1.5  # search opted in
    assert {e["devicememoryscaling"] for n, e in entries.items() if n.startswith("l40s")} == {1.0}
    assert plugin["deviceMemoryScaling"] == 1 and plugin["deviceSplitCount"] == 4


def test_hami_hands_devices_over_as_volume_mounts_like_the_toolkit_requires(device):
    # The toolkit ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers (test_gpu_operator.py).
    assert values(device, "hami")["devicePlugin"]["deviceListStrategy"] == "volume-mounts"


def test_hami_tolerates_every_platform_taint(device):
    assert {t["key"] for t in values(device, "hami")["devicePlugin"]["tolerations"]} == set(NODE_TAINT_KEYS)


def test_hami_is_installed_only_with_a_hami_pool(raw):
    without_models(raw)
    raw["fleet"]["pools"][2]["sharing"] = "time-slicing"
    raw["tenants"][1]["gpus"][1] = {"pool": "l40s-infer", "count": 6}
    assert [m for m in render(raw, stack=STACK).manifests if m.layer == "hami"] == []


@pytest.mark.parametrize("layer", ["hami", "dra"])
def test_a_pool_whose_layer_is_disabled_is_refused(raw, layer):
    raw["fleet"]["pools"][2]["sharing"] = layer
    raw["layers"][layer] = {"enabled": False}
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert f"fleet.pools[2].sharing: pool 'l40s-infer' uses {layer} but layers.{layer} is disabled" in err.value.problems


# --------------------------------------------------------------------------- DRA


def test_dra_kubelet_plugin_runs_only_on_dra_nodes_and_the_nvidia_plugin_stays_off_them(device, device_plan):
    plugin = values(device, "dra-driver-nvidia-gpu")["kubeletPlugin"]
    selected = {name for name, node in nodes(device).items() if plugin["nodeSelector"].items() <= node["metadata"]["labels"].items()}
    assert selected == {n.name for n in device_plan.pool("h100-dra").nodes}
    assert all(nodes(device)[n]["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] == "false" for n in selected)
    assert {t["key"] for t in plugin["tolerations"]} == set(NODE_TAINT_KEYS)


def test_dra_driver_is_the_pinned_release_using_the_operator_driver(device):
    release = one(device, "HelmRelease", "dra-driver-nvidia-gpu")
    assert release["spec"]["chartRef"]["kind"] == "OCIRepository"
    source = one(device, "OCIRepository", "dra-driver-nvidia-gpu")["spec"]
    assert (source["url"], source["ref"]["tag"]) == ("oci://registry.k8s.io/dra-driver-nvidia/charts/dra-driver-nvidia-gpu", "0.4.1")
    chart = release["spec"]["values"]
    assert chart["nvidiaDriverRoot"] == "/run/nvidia/driver" and chart["gpuResourcesEnabledOverride"] is True


def test_dra_device_class_selects_whole_gpus_of_the_pool_model(device):
    classes = objects(device, "DeviceClass")
    assert [c["metadata"]["name"] for c in classes] == ["h100-80gb-whole"]
    expression = classes[0]["spec"]["selectors"][0]["cel"]["expression"]
    assert "device.driver == 'gpu.nvidia.com'" in expression
    assert "device.attributes['gpu.nvidia.com'].type == 'gpu'" in expression
    assert f".productName.lowerAscii().matches('{PRODUCT_NAMES['H100-80GB']}')" in expression


NVML_PRODUCT_NAMES = {
    "A100-40GB": ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"],
    "A100-80GB": ["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"],
    "H100-80GB": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"],
    "H100-94GB-NVL": ["NVIDIA H100 NVL"],
    "H200-141GB": ["NVIDIA H200", "NVIDIA H200 NVL"],
    "B200-180GB": ["NVIDIA B200"],
    "GB200-186GB": ["NVIDIA GB200"],
    "L40S-48GB": ["NVIDIA L40S"],
    "L4-24GB": ["NVIDIA L4"],
}


def test_every_catalog_model_has_a_product_name_pattern_matching_its_boards_only():
    assert set(PRODUCT_NAMES) == set(GPU_MODELS) == set(NVML_PRODUCT_NAMES)
    for model, pattern in PRODUCT_NAMES.items():
        for other, names in NVML_PRODUCT_NAMES.items():
            for name in names:
                assert bool(re.search(pattern, name.lower())) is (other == model), (model, name)


def test_dra_tenants_get_a_claim_template_for_their_pool_in_their_namespace(device):
    templates = {(m.tenant, m.namespace, m.name): m.obj for m in device.manifests if m.kind == "ResourceClaimTemplate"}
    assert set(templates) == {
        ("assistant", "tenant-assistant", "h100-dra-gpu"),
        ("partner-acme", "tenant-partner-acme", "h100-dra-gpu"),
    }
    classes = {c["metadata"]["name"] for c in objects(device, "DeviceClass")}
    for template in templates.values():
        (request,) = template["spec"]["spec"]["devices"]["requests"]
        assert request["exactly"] == {"deviceClassName": whole_gpu_class("H100-80GB"), "allocationMode": "ExactCount", "count": 1}
        assert request["exactly"]["deviceClassName"] in classes


def test_dra_pool_before_kubernetes_1_34_is_refused(device_raw):
    raw = copy.deepcopy(device_raw[0])
    raw["kubernetes"] = {"version": "1.33"}
    with pytest.raises(ConfigError) as err:
        validate(raw)
    index = next(i for i, p in enumerate(raw["fleet"]["pools"]) if p.get("sharing") == "dra")
    assert f"fleet.pools[{index}].sharing: dra needs Kubernetes >= 1.34 (resource.k8s.io/v1); kubernetes.version is 1.33" in err.value.problems


def test_dra_is_installed_only_with_a_dra_pool(dev):
    assert [m for m in dev.manifests if m.layer == "dra"] == []


def test_tenants_of_one_domain_disagreeing_on_hami_memory_oversubscription_are_refused(device_raw):
    raw = copy.deepcopy(device_raw[0])
    raw["tenants"].append(
        {"name": "ranking", "trust": "high", "trust_domain": "internal", "owners": {"groups": ["ranking-admins"]},
         "gpus": [{"pool": "l4-hami", "count": 1, "memory_mib": 4096, "cores_percent": 10}]}
    )
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert err.value.problems == [
        "tenants: trust domain 'internal' asks for different HAMi memory oversubscription on pool 'l4-hami' "
        "(ranking: 1.0, search: 1.5); HAMi sets it per node and a node serves its whole trust domain, so the domain's tenants must agree"
    ]
