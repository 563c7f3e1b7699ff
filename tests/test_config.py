"""The typed configuration: what is accepted, and how every kind of mistake is reported."""

from __future__ import annotations

import json

import pulumi
import pytest

from ai_factory.factory.rendering.harness import RecordingMocks, RecordingMonitor, run_program
from ai_factory.factory.model.loading import ConfigError, load_pulumi_config, read_stack_file, validate
from ai_factory.factory.rendering.program import main
from ai_factory.factory.model.secrets import SecretValue
from tests.conftest import REPO, run_main


def problems(raw) -> list[str]:
    with pytest.raises(ConfigError) as err:
        validate(raw)
    return err.value.problems


def test_dev_config_is_valid(dev_raw):
    cfg = validate(dev_raw[0])
    assert [t.name for t in cfg.tenants] == ["search", "assistant", "partner-acme"]
    assert {t.trust for t in cfg.tenants} == {"high", "medium", "low"}
    assert len({p.sharing for p in cfg.fleet.pools}) >= 2
    assert len({p.gpu.model for p in cfg.fleet.pools}) >= 2


def test_defaults_follow_trust(dev_raw):
    cfg = validate(dev_raw[0])
    by_name = {t.name: t for t in cfg.tenants}
    assert by_name["search"].control_plane == "namespace"
    assert by_name["assistant"].control_plane == "vcluster"
    assert by_name["assistant"].domain == "assistant"
    assert by_name["search"].domain == "internal"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda r: r["fleet"]["pools"][0].update(sharring="mig"), "fleet.pools[0].sharring: unknown key (did you mean 'sharing'?)"),
        (lambda r: r["fleet"]["pools"][0]["gpu"].update(per_node="eight"), "fleet.pools[0].gpu.per_node: must be an integer"),
        (lambda r: r["tenants"][2]["gpus"][0].update(count=0), "tenants[2].gpus[0].count: must be >= 1"),
        (lambda r: r["fleet"]["pools"][1]["gpu"].update(model="A100"), "fleet.pools[1].gpu.model: unknown GPU model 'A100'"),
        (lambda r: r["tenants"].append(dict(r["tenants"][0])), "tenants[3].name: duplicate name 'search'"),
        (lambda r: r["tenants"][0]["gpus"][0].update(pool="h100-trian"), "tenants[0].gpus[0].pool: unknown pool 'h100-trian' (did you mean 'h100-train'?)"),
        (lambda r: r["fleet"]["pools"][0].update(site="lon1"), "fleet.pools[0].site: unknown site 'lon1'"),
        (lambda r: r["tenants"][1].update(trust="untrusted"), "tenants[1].trust: must be one of 'high', 'medium' or 'low'"),
        (lambda r: r["tenants"][2]["gpus"].append({"pool": "a100-mig", "mig": {"1g.10gb": 1}}), "tenants[2].gpus[1].pool: low-trust tenants get whole GPUs only"),
        (lambda r: r["tenants"][0]["gpus"][1].update(mig={"1g.5gb": 2}), "tenants[0].gpus[1].mig.1g.5gb: not a MIG profile of A100-80GB"),
        (lambda r: r["tenants"][0]["gpus"][1].update(count=2), "tenants[0].gpus[1].count: not used by mig pool 'a100-mig'"),
        (lambda r: r["tenants"][1]["gpus"][1].pop("memory_mib"), "tenants[1].gpus[1].memory_mib: required by hami pool 'l40s-infer'"),
        (lambda r: r["fleet"]["pools"][2].update(node_list=[{"name": "x", "rack": "r"}]), "fleet.pools[2]: give exactly one of `nodes` (a count) or `node_list`"),
        (lambda r: r["fleet"]["pools"][2]["gpu"].update(model="L40S-48GB") or r["fleet"]["pools"][2].update(sharing="mig"), "fleet.pools[2].sharing: L40S-48GB has no MIG"),
        (lambda r: r["layers"]["gpu_operator"].update(toolkit_version="v1.17.7"), "layers.gpu_operator.toolkit_version: container toolkit v1.17.7 is affected by container-escape CVEs"),
        (lambda r: r["layers"]["gpu_operator"]["registry"].update(password="hunter2"), "layers.gpu_operator.registry.password: must be a secret"),
        (lambda r: r["tenants"][1].update(trust_domain="partner-acme"), "tenants: trust domain 'partner-acme' mixes a low-trust tenant with others"),
        (lambda r: r.pop("fleet"), "fleet: required"),
        # Wrong types where cross-references look: reported as field errors, never a crash.
        (lambda r: r["fleet"]["pools"][0].update(name=["h100"]), "fleet.pools[0].name: must be a string"),
        (lambda r: r["fleet"]["sites"][0].update(name={"x": 1}), "fleet.sites[0].name: must be a string"),
        (lambda r: r["fleet"]["pools"][1].update(site={"name": "par1"}), "fleet.pools[1].site: must be a string"),
        (lambda r: r["fleet"]["pools"][1]["gpu"].update(model=["A100-80GB"]), "fleet.pools[1].gpu.model: must be a string"),
        (lambda r: r["fleet"]["pools"][0].update(sharing=["exclusive"]), "fleet.pools[0].sharing: must be one of"),
        (lambda r: r["tenants"][1].update(trust_domain="unassigned"), "tenants[1].trust_domain: 'unassigned' is reserved"),
        (lambda r: r["layers"].update(keycloak={"enabled": False}) or r["tenants"][1]["owners"]["groups"].append("search-admins"),
         "tenants[1].owners.groups: group 'search-admins' already owns tenant 'search'; an identity group administers one tenant"),
        (lambda r: r["tenants"][2]["owners"].update(users=["lea@example.com"]), "tenants[2].owners.users: user 'lea@example.com' already owns tenant 'assistant'; an identity user administers one tenant"),
        (lambda r: r["fleet"]["pools"].append({**r["fleet"]["pools"][2], "name": "l40s-infer-x"}) or r["tenants"].extend(
            {"name": name, "trust": "medium", "trust_domain": domain, "owners": {"groups": [f"{name}-admins"]},
             "gpus": [{"pool": pool, "count": 1, "memory_mib": 1024, "cores_percent": 10}]}
            for name, domain, pool in (("t1", "x-y", "l40s-infer"), ("t2", "y", "l40s-infer-x"))),
         "tenants[4].gpus[0].pool: the flavor of pool 'l40s-infer-x' for trust domain 'y' would be named 'l40s-infer-x-y'"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_each_mistake_is_reported_with_its_path(raw, dev_raw, edit, expected):
    edit(raw)
    found = problems(raw)
    assert any(p.startswith(expected) for p in found), found


def test_all_problems_are_reported_at_once(raw, dev_raw):
    raw["fleet"]["pools"][0]["sharring"] = "mig"  # misspelt key
    raw["tenants"][1]["gpus"][1]["count"] = "six"  # wrong type
    raw["tenants"][1]["gpus"][0]["pool"] = "b200"  # missing pool, in the same tenant as the wrong type
    found = problems(raw)
    assert any(p.startswith("fleet.pools[0].sharring: unknown key") for p in found)
    assert any(p.startswith("tenants[1].gpus[1].count: must be an integer") for p in found)
    assert any(p.startswith("tenants[1].gpus[0].pool: unknown pool 'b200'") for p in found)


def test_unknown_section_in_stack_file_is_reported(tmp_path):
    (tmp_path / "Pulumi.x.yaml").write_text("config:\n  ai-factory:tenantz: []\n  kubernetes:context: c\n")
    with pytest.raises(ConfigError) as err:
        read_stack_file(tmp_path / "Pulumi.x.yaml")
    assert err.value.problems == ["tenantz: unknown key (did you mean 'tenants'?)"]


def test_secure_values_become_opaque_placeholders(dev_raw):
    cfg = validate(dev_raw[0])
    password = cfg.layers.gpu_operator.registry.password
    assert isinstance(password, SecretValue)
    assert "v1:" not in password.reveal()
    assert "secret" in repr(password) and password.reveal() not in repr(password)
    assert cfg.model_dump()["layers"]["gpu_operator"]["registry"]["password"] == "[secret]"


def _seeded(raw, secret_sections):
    return (
        {f"ai-factory:{k}": json.dumps(v, default=lambda s: s.reveal()) for k, v in raw.items()},
        [f"ai-factory:{s}" for s in secret_sections],
    )


def test_pulumi_config_accepts_decrypted_values_of_secret_keys_only(raw):
    raw["layers"]["gpu_operator"]["registry"]["password"] = "decrypted-by-the-engine"
    config, _ = _seeded(raw, set())
    loaded = {}

    def program():
        loaded["cfg"] = load_pulumi_config()

    run_program(program, project="ai-factory", stack="dev", config=config, secret_keys=["ai-factory:layers"])
    assert loaded["cfg"].layers.gpu_operator.registry.password.reveal() == "decrypted-by-the-engine"

    with pytest.raises(ConfigError, match="registry.password: must be a secret"):
        run_program(program, project="ai-factory", stack="dev", config=config, secret_keys=[])


def test_invalid_config_registers_nothing(raw):
    raw["tenants"][0]["gpus"][0]["pool"] = "nowhere"
    config, secret_keys = _seeded(raw, {"layers"})
    monitor = RecordingMonitor(RecordingMocks())
    with pytest.raises(pulumi.RunError, match=r"tenants\[0\].gpus\[0\].pool: unknown pool 'nowhere'"):
        run_program(main, project="ai-factory", stack="dev", config=config, secret_keys=secret_keys, monitor=monitor)
    assert monitor.recorded == {}


def test_cli_exits_2_without_traceback_listing_every_path(tmp_path):
    text = (REPO / "Pulumi.dev.yaml").read_text()
    text = text.replace("sharing: exclusive", "sharring: exclusive", 1)
    text = text.replace("per_node: 4}", "per_node: four}", 1)
    text = text.replace("- {pool: h100-train, count: 8}", "- {pool: h200-train, count: 8}", 1)
    (tmp_path / "Pulumi.broken.yaml").write_text(text)
    proc = run_main("render", str(tmp_path / "Pulumi.broken.yaml"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "fleet.pools[0].sharring: unknown key" in proc.stderr
    assert "fleet.pools[2].gpu.per_node: must be an integer" in proc.stderr
    assert "tenants[2].gpus[0].pool: unknown pool 'h200-train'" in proc.stderr
    assert not (tmp_path / "out").exists()
