"""The GPU catalog against the MIG ground truth in `../shared/reference/mig-profiles.yaml`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ai_factory.factory.model.gpus import GPU_MODELS

REFERENCE = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "mig-profiles.yaml"
NON_MIG_MODELS = {"L40S-48GB", "L4-24GB"}


@pytest.fixture(scope="module")
def reference() -> dict:
    if not REFERENCE.is_file():
        pytest.skip(f"MIG ground truth {REFERENCE} is absent (it lives next to the repository, not in it)")
    return yaml.safe_load(REFERENCE.read_text())


def test_catalog_holds_every_reference_model_plus_the_non_mig_ones(reference):
    assert set(GPU_MODELS) == set(reference["gpus"]) | NON_MIG_MODELS


def test_models_match_the_reference(reference):
    for name, ref in reference["gpus"].items():
        model = GPU_MODELS[name]
        assert model.name == name
        assert model.memory_gb == ref["memory_gb"], name
        assert model.architecture == ref["architecture"], name
        assert model.pci_device_ids == tuple(ref["pci_device_ids"]), name
        assert ref["compute_slices"] == 7 and ref["memory_slices"] == 8, name
        assert [p.name for p in model.mig_profiles] == [p["name"] for p in ref["profiles"]], name


def test_profiles_match_the_reference_field_by_field(reference):
    classes = reference["profile_classes"]
    for name, ref in reference["gpus"].items():
        for profile, ref_profile in zip(GPU_MODELS[name].mig_profiles, ref["profiles"]):
            where = f"{name} {profile.name}"
            assert profile.klass == ref_profile["class"], where
            assert profile.compute_slices == ref_profile["compute_slices"], where
            assert profile.memory_slices == ref_profile["memory_slices"], where
            assert profile.memory_gb == ref_profile["memory_gb"], where
            assert profile.max_count == ref_profile["max_count"], where
            assert profile.placements == tuple(ref_profile["placements"]), where
            ref_class = classes[profile.klass]
            assert profile.media_extensions == ref_class.get("media_extensions", False), where
            assert (profile.compute_slices, profile.memory_slices, profile.max_count) == (
                ref_class["compute_slices"],
                ref_class["memory_slices"],
                ref_class["max_count"],
            ), where
            assert profile.placements == tuple(ref_class["placements"]), where


def test_non_mig_models():
    for name in NON_MIG_MODELS:
        model = GPU_MODELS[name]
        assert model.architecture == "ada"
        assert not model.mig_capable and model.mig_profiles == ()
    assert GPU_MODELS["L40S-48GB"].memory_gb == 48
    assert GPU_MODELS["L4-24GB"].memory_gb == 24


@pytest.mark.parametrize(
    ("model", "profile", "resource"),
    [
        ("H100-80GB", "1g.10gb", "nvidia.com/mig-1g.10gb"),
        ("H100-80GB", "1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),
        ("A100-40GB", "3g.20gb", "nvidia.com/mig-3g.20gb"),
        ("GB200-186GB", "7g.186gb", "nvidia.com/mig-7g.186gb"),
    ],
)
def test_resource_names_follow_the_device_plugin(model, profile, resource):
    assert GPU_MODELS[model].profile(profile).resource_name == resource


def test_unknown_profile_error_names_the_model_and_the_choices():
    with pytest.raises(KeyError, match=r"'H100-80GB' has no MIG profile '3g.20gb'.*3g.40gb"):
        GPU_MODELS["H100-80GB"].profile("3g.20gb")
    with pytest.raises(KeyError, match=r"'L4-24GB' has no MIG"):
        GPU_MODELS["L4-24GB"].profile("1g.5gb")


def test_memory_mib_is_below_nominal_and_plausible():
    for model in GPU_MODELS.values():
        assert 0.9 * model.memory_gb * 1000 < model.memory_mib <= model.memory_gb * 1024, model.name
