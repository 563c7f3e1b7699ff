"""GPU model catalog: memory, PCI IDs and MIG geometry of the datacenter GPUs the factory plans for.

The MIG data is our own copy of the research file `shared/reference/mig-profiles.yaml` (that file is
not shipped, so nothing here reads it at runtime; `tests/test_gpus.py` compares the two field by
field). Every MIG-capable model in scope has 7 compute slices and 8 memory slices and the same seven
GPU-instance profile classes; only names and memory differ between models.

Profile names are what nvidia-smi, mig-parted and GPU feature discovery print. They are not stable
across drivers and boards (GB200 went from 1g.24gb/3g.95gb/7g.189gb to 1g.23gb/3g.93gb/7g.186gb), so
the catalog records the names of current production boards and the planner works on classes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True)
class MigProfile:
    name: str
    """nvidia-smi profile name, e.g. `1g.10gb` or `1g.10gb+me`."""
    klass: str
    """Geometry class shared by all models: c1m1, c1m1_me, c1m2, c2m2, c3m4, c4m4, c7m8."""
    compute_slices: int
    memory_slices: int
    memory_gb: int
    """Nominal memory in the name (what resource names and mig-parted configs use)."""
    max_count: int
    placements: tuple[int, ...]
    """Legal start indexes on the 8-wide memory-slice axis; an instance occupies
    [start, start + memory_slices)."""
    media_extensions: bool

    @property
    def resource_name(self) -> str:
        """The extended resource the NVIDIA device plugin advertises under the `mixed` strategy.

        The plugin builds it as `"mig-" + profile` with every `+` replaced by `.`
        (NVIDIA/k8s-device-plugin `internal/rm/rm.go`, `AddDefaultResourcesToConfig`), because `+` is
        not allowed in a resource name: `1g.10gb+me` is advertised as `nvidia.com/mig-1g.10gb.me`.
        """
        return "nvidia.com/mig-" + self.name.replace("+", ".")


@dataclass(frozen=True)
class GpuModel:
    name: str
    """Catalog key, e.g. `H100-80GB`."""
    memory_gb: int
    """Nominal memory."""
    memory_mib: int
    """Device memory as nvidia-smi/NVML reports it with MIG off (the smallest figure among the
    model's board variants). HAMi registers this much `nvidia.com/gpumem` per GPU, so the planner
    budgets HAMi slices against it, not against the nominal size."""
    architecture: str
    pci_device_ids: tuple[str, ...]
    """PCI device IDs in mig-parted `device-filter` form (`0x<device><vendor>`, e.g. `0x233010DE`)."""
    mig_profiles: tuple[MigProfile, ...]
    """Empty when the model has no MIG."""

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def profile(self, name: str) -> MigProfile:
        for profile in self.mig_profiles:
            if profile.name == name:
                return profile
        if not self.mig_capable:
            raise KeyError(f"GPU model {self.name!r} has no MIG; it cannot offer profile {name!r}")
        known = ", ".join(p.name for p in self.mig_profiles)
        raise KeyError(f"GPU model {self.name!r} has no MIG profile {name!r}; its profiles are: {known}")


@dataclass(frozen=True)
class MigClass:
    """Geometry shared by one GPU-instance profile class on every 7-slice GPU in scope."""

    compute_slices: int
    memory_slices: int
    max_count: int
    placements: tuple[int, ...]


# mig-profiles.yaml `profile_classes`: observed on A100, H100-80 and H100 NVL; inferred for H200,
# B200 and GB200 from identical profile IDs, memory fractions and counts.
MIG_CLASSES: dict[str, MigClass] = {
    "c1m1": MigClass(1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    "c1m1_me": MigClass(1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "c1m2": MigClass(1, 2, 4, (0, 2, 4, 6)),
    "c2m2": MigClass(2, 2, 3, (0, 2, 4)),
    "c3m4": MigClass(3, 4, 2, (0, 4)),
    "c4m4": MigClass(4, 4, 1, (0,)),
    "c7m8": MigClass(7, 8, 1, (0,)),
}


def _profile(name: str, klass: str) -> MigProfile:
    geometry = MIG_CLASSES[klass]
    memory_gb = int(re.fullmatch(r"\dg\.(\d+)gb(\+me)?", name).group(1))
    return MigProfile(
        name=name,
        klass=klass,
        compute_slices=geometry.compute_slices,
        memory_slices=geometry.memory_slices,
        memory_gb=memory_gb,
        max_count=geometry.max_count,
        placements=geometry.placements,
        media_extensions=klass == "c1m1_me",
    )


def _mig_profiles(c1m1: str, c1m2: str, c2m2: str, c3m4: str, c4m4: str, c7m8: str) -> tuple[MigProfile, ...]:
    """The seven profiles of a 7-slice GPU; the media-extension profile is the small 1g plus `+me`."""
    return (
        _profile(c1m1, "c1m1"),
        _profile(c1m1 + "+me", "c1m1_me"),
        _profile(c1m2, "c1m2"),
        _profile(c2m2, "c2m2"),
        _profile(c3m4, "c3m4"),
        _profile(c4m4, "c4m4"),
        _profile(c7m8, "c7m8"),
    )


_CATALOG = (
    GpuModel(
        name="A100-40GB",
        memory_gb=40,
        memory_mib=40536,
        architecture="ampere",
        pci_device_ids=("0x20B010DE", "0x20F110DE"),
        mig_profiles=_mig_profiles("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    ),
    GpuModel(
        name="A100-80GB",
        memory_gb=80,
        memory_mib=81920,
        architecture="ampere",
        pci_device_ids=("0x20B210DE", "0x20B510DE"),
        mig_profiles=_mig_profiles("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    ),
    GpuModel(
        name="H100-80GB",
        memory_gb=80,
        memory_mib=81559,
        architecture="hopper",
        pci_device_ids=("0x233010DE", "0x233110DE"),
        mig_profiles=_mig_profiles("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    ),
    GpuModel(
        name="H100-94GB-NVL",
        memory_gb=94,
        memory_mib=95830,
        architecture="hopper",
        pci_device_ids=("0x232110DE",),
        mig_profiles=_mig_profiles("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    ),
    GpuModel(
        name="H200-141GB",
        memory_gb=141,
        memory_mib=143771,
        architecture="hopper",
        pci_device_ids=("0x233510DE", "0x233B10DE"),
        mig_profiles=_mig_profiles("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    ),
    GpuModel(
        name="B200-180GB",
        memory_gb=180,
        memory_mib=183359,
        architecture="blackwell",
        pci_device_ids=("0x290110DE",),
        mig_profiles=_mig_profiles("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
    ),
    GpuModel(
        name="GB200-186GB",
        memory_gb=186,
        memory_mib=189471,
        architecture="blackwell",
        pci_device_ids=("0x294110DE",),
        mig_profiles=_mig_profiles("1g.23gb", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"),
    ),
    # Ada Lovelace: no MIG. PCI IDs from pci.ids (10de:26b9 AD102GL [L40S], 10de:27b8 AD104GL [L4]).
    GpuModel(
        name="L40S-48GB",
        memory_gb=48,
        memory_mib=46068,
        architecture="ada",
        pci_device_ids=("0x26B910DE",),
        mig_profiles=(),
    ),
    GpuModel(
        name="L4-24GB",
        memory_gb=24,
        memory_mib=23034,
        architecture="ada",
        pci_device_ids=("0x27B810DE",),
        mig_profiles=(),
    ),
)

GPU_MODELS: dict[str, GpuModel] = {model.name: model for model in _CATALOG}

VM_RESOURCE_NAMES: dict[str, str] = {
    "0x20B210DE": "nvidia.com/GA100_A100_SXM4_80GB",
    "0x20B510DE": "nvidia.com/GA100_A100_PCIE_80GB",
    "0x233010DE": "nvidia.com/GH100_H100_SXM5_80GB",
    "0x26B910DE": "nvidia.com/AD102GL_L40S",
}
"""What the GPU Operator's sandbox device plugin (kubevirt-gpu-device-plugin) advertises a GPU bound
to vfio-pci as: `nvidia.com/` and its pci.ids device name, brackets dropped, spaces to `_`
(pci.ids: `20b2 GA100 [A100 SXM4 80GB]`). Only names seen advertised are listed; another device's
name is given in its pool's settings (`layers.kubevirt.pools.<pool>.resource_name`)."""


def vm_resource_name(pci_device_id: str, override: str | None = None) -> str | None:
    """The resource VMs request for a GPU of this PCI ID, None when it is not known."""
    return override or VM_RESOURCE_NAMES.get(pci_device_id)


def pci_vendor_selector(pci_device_id: str) -> str:
    """`0x233010DE` (mig-parted's form) as KubeVirt's `pciVendorSelector`, `10DE:2330`."""
    return f"{pci_device_id[6:10]}:{pci_device_id[2:6]}"
