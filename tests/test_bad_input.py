"""Hostile or mistaken stack files: each is refused with one message naming every problem by its
path, exit status 2, no traceback, nothing written; and none takes long or much memory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ai_factory.factory.model import bounded_yaml
from ai_factory.factory.model.config import MAX_FLEET_NODES
from ai_factory.factory.model.loading import ConfigError, read_stack_file, validate
from tests.conftest import REPO, run_main

DEV_PASSPHRASE = "ai-factory-dev"  # Pulumi.dev.yaml says so: the dev stack's published passphrase
DEV_TEXT = (REPO / "Pulumi.dev.yaml").read_text()


def problems(raw) -> list[str]:
    with pytest.raises(ConfigError) as err:
        validate(raw)
    return err.value.problems


def stack_problems(tmp_path: Path, text: str, monkeypatch, passphrase: str | None = None, decrypt_check: bool = False) -> list[str]:
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE_FILE", raising=False)
    if passphrase is None:
        monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    else:
        monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", passphrase)
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_stack_file(path, decrypt_check=decrypt_check)
    return err.value.problems


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_CONFIG_PASSPHRASE")}
    return subprocess.run(
        [sys.executable, "-m", "ai_factory.factory", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**environ, **(env or {})}
    )


def refused_render(tmp_path: Path, text: str) -> str:
    """`render` of the stack file `text`: refused with exit 2, no traceback, nothing written; its stderr."""
    path, out = tmp_path / "Pulumi.bad.yaml", tmp_path / "out"
    path.write_text(text)
    proc = run_main("render", str(path), "--out", str(out), "-q")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert not out.exists()
    return proc.stderr


# --------------------------------------------------------------------------- namespaces


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (DEV_TEXT.replace("ai-factory:tenants:", "ai-factroy:tenants:"), "ai-factroy:tenants: unknown config namespace 'ai-factroy' (did you mean 'ai-factory'?)"),
        (DEV_TEXT.replace("kubernetes:context:", "kuberentes:context:"), "kuberentes:context: unknown config namespace 'kuberentes' (did you mean 'kubernetes'?)"),
        (DEV_TEXT.replace("ai-factory:tenants:", "tenants:"), "tenants: a config key is `<namespace>:<name>` (did you mean 'ai-factory:tenants'?)"),
    ],
    ids=["misspelt-project-namespace", "misspelt-provider-namespace", "no-namespace"],
)
def test_a_key_outside_the_known_namespaces_is_refused(tmp_path, monkeypatch, text, expected):
    assert stack_problems(tmp_path, text, monkeypatch) == [expected]


def test_provider_settings_are_accepted(tmp_path, monkeypatch):
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    path = tmp_path / "Pulumi.ok.yaml"
    path.write_text(DEV_TEXT.replace("  kubernetes:context: dev-admin\n", "  kubernetes:context: dev-admin\n  pulumi:tags: {team: gpu}\n"))
    raw, _ = read_stack_file(path)
    assert [t["name"] for t in raw["tenants"]] == ["search", "assistant", "partner-acme"]


def test_cli_refuses_a_misspelt_namespace_with_exit_2_and_writes_nothing(tmp_path):
    path = tmp_path / "Pulumi.typo.yaml"
    path.write_text(DEV_TEXT.replace("ai-factory:tenants:", "ai-factroy:tenants:"))
    proc = run_cli("render", str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "ai-factroy:tenants: unknown config namespace 'ai-factroy'" in proc.stderr
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- YAML bounds


BILLION_LAUGHS = "config:\n  ai-factory:tenants: &a9 [*a8, *a8, *a8, *a8, *a8, *a8, *a8, *a8, *a8, *a8]\n"
for _level in range(8, 0, -1):
    BILLION_LAUGHS = f"x{_level}: &a{_level} [{', '.join([f'*a{_level - 1}'] * 10)}]\n" + BILLION_LAUGHS
BILLION_LAUGHS = "x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + BILLION_LAUGHS


def test_an_alias_expansion_bomb_is_refused_in_well_under_a_second(tmp_path):
    assert len(BILLION_LAUGHS) < 1000  # ten billion values once expanded
    path = tmp_path / "Pulumi.laughs.yaml"
    path.write_text(BILLION_LAUGHS)
    started = time.process_time()
    with pytest.raises(ConfigError) as err:
        read_stack_file(path)
    assert time.process_time() - started < 1
    [problem] = err.value.problems
    assert problem.startswith(f"Pulumi.laughs.yaml: refused: more than {bounded_yaml.MAX_EXPANDED_NODES} values once its aliases are expanded (line ")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("config: " + "[" * 1000 + "]" * 1000, f"nested deeper than {bounded_yaml.MAX_DEPTH} levels"),
        ("a: &a [*a]\nconfig: {}\n", "recursive alias"),
        ("x0: &x0 1\n" + "".join(f"x{i}: &x{i} [*x{i - 1}]\n" for i in range(1, 200)) + "config: {ai-factory:tenants: *x199}\n",
         f"nested deeper than {bounded_yaml.MAX_DEPTH} levels once its aliases are expanded"),
    ],
    ids=["deep-nesting", "recursive-alias", "deep-alias-chain"],
)
def test_documents_past_the_nesting_bound_or_recursive_are_refused(tmp_path, monkeypatch, text, expected):
    found = stack_problems(tmp_path, text, monkeypatch)
    assert len(found) == 1 and expected in found[0], found


def _nested_mappings(depth: int) -> str:
    """A block-style document whose deepest node is `depth` nodes down (a scalar under depth - 1 mappings)."""
    return "".join(f"{' ' * i}k{i}:\n" for i in range(depth - 1)) + " " * (depth - 1) + "v\n"


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        (_nested_mappings(bounded_yaml.MAX_DEPTH), None),
        # The key at the 65th level is on line 64.
        (_nested_mappings(bounded_yaml.MAX_DEPTH + 1), f"nested deeper than {bounded_yaml.MAX_DEPTH} levels (line {bounded_yaml.MAX_DEPTH})"),
        ("[" * bounded_yaml.MAX_DEPTH + "]" * bounded_yaml.MAX_DEPTH, None),
        ("[" * (bounded_yaml.MAX_DEPTH + 1) + "]" * (bounded_yaml.MAX_DEPTH + 1), f"nested deeper than {bounded_yaml.MAX_DEPTH} levels (line 1)"),
        ("a: [x]\nb: " + "[" * bounded_yaml.MAX_DEPTH + "]" * bounded_yaml.MAX_DEPTH, f"nested deeper than {bounded_yaml.MAX_DEPTH} levels (line 2)"),
        ("[" * 1001 + "]" * 1001, f"nested deeper than {bounded_yaml.MAX_DEPTH} levels (line 1)"),
    ],
    ids=["block-at-the-bound", "block-one-past", "flow-at-the-bound", "flow-one-past", "one-past-after-a-closed-sibling", "past-libyamls-own-bound"],
)
def test_nesting_is_refused_one_level_past_the_bound_and_accepted_at_it(text, refused):
    if refused:
        with pytest.raises(bounded_yaml.YamlBoundError) as err:
            bounded_yaml.load(text)
        assert str(err.value) == refused
    else:
        assert bounded_yaml.load(text) is not None


def test_a_document_that_is_not_yaml_is_a_yaml_error_not_a_bound():
    with pytest.raises(yaml.YAMLError):
        bounded_yaml.load("a: [b")


def test_a_stack_file_over_the_size_bound_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    text = "config: {}\n# " + "x" * bounded_yaml.MAX_FILE_BYTES + "\n"
    assert stack_problems(tmp_path, text, monkeypatch) == [f"Pulumi.bad.yaml: refused: larger than {bounded_yaml.MAX_FILE_BYTES} bytes"]


def test_the_cli_refuses_an_alias_bomb_with_exit_2_quickly(tmp_path):
    path = tmp_path / "Pulumi.laughs.yaml"
    path.write_text(BILLION_LAUGHS)
    proc = run_cli("plan", str(path), "--out", str(tmp_path / "plan.json"), timeout=30)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "once its aliases are expanded" in proc.stderr
    assert not (tmp_path / "plan.json").exists()


# --------------------------------------------------------------------------- sizes


def _dev_pool(raw, name):
    return next(p for p in raw["fleet"]["pools"] if p["name"] == name)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda r: _dev_pool(r, "l40s-infer").update(nodes=1_000_000), [f"fleet.pools[2].nodes: must be <= {MAX_FLEET_NODES}"]),
        (lambda r: [_dev_pool(r, n).update(nodes=MAX_FLEET_NODES // 2) for n in ("a100-mig", "l40s-infer")],
         [f"fleet.pools: {MAX_FLEET_NODES + 5} nodes in all; a fleet is one Kubernetes cluster, at most {MAX_FLEET_NODES} nodes"]),
        (lambda r: r["tenants"][2]["gpus"][0].update(count=10**18), ["tenants[2].gpus[0].count: must be <= 5120000"]),
        (lambda r: r["tenants"][2]["gpus"][0].update(count=33),
         ["tenants[2].gpus[0].count: 33 is more than pool 'h100-train' could ever supply (32 GPUs); the demand cannot be planned"]),
        (lambda r: r["tenants"][1]["gpus"][1].update(count=100_000),
         ["tenants[1].gpus[1].count: 100000 is more than pool 'l40s-infer' could ever supply (64 HAMi vGPUs); the demand cannot be planned"]),
        (lambda r: r["tenants"][0]["gpus"][1]["mig"].update({"3g.40gb": 10**6}),
         ["tenants[0].gpus[1].mig.3g.40gb: 1000000 is more than pool 'a100-mig' could ever supply (32 3g.40gb instances); the demand cannot be planned"]),
        (lambda r: r["tenants"][0]["owners"].update(groups=[f"search-admins-{i}" for i in range(300)]), ["tenants[0].owners.groups: must have at most 256 item(s)"]),
        (lambda r: r["fleet"]["sites"][0].update(region="x" * 5000), ["fleet.sites[0].region: must be at most 1024 character(s)"]),
    ],
    ids=["pool-nodes", "fleet-nodes", "count-field", "gpus-beyond-pool", "hami-beyond-pool", "mig-beyond-pool", "owner-list", "text"],
)
def test_every_count_is_bounded_before_planning(raw, edit, expected):
    edit(raw)
    assert problems(raw) == expected


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: _dev_pool(r, "l40s-infer").update(nodes=1_000_000),
        lambda r: r["tenants"][0]["gpus"][1]["mig"].update({"3g.40gb": 10**7}),
        lambda r: r["tenants"][1]["gpus"][1].update(count=100_000),
    ],
    ids=["nodes", "mig", "hami"],
)
def test_the_cli_refuses_oversized_counts_within_seconds(tmp_path, edit):
    document = yaml.safe_load(DEV_TEXT)
    sections = {k.partition(":")[2]: v for k, v in document["config"].items() if k.startswith("ai-factory:")}
    edit(sections)
    path = tmp_path / "Pulumi.huge.yaml"
    path.write_text(DEV_TEXT.split("config:")[0] + yaml.safe_dump({"config": {**document["config"], **{f"ai-factory:{k}": v for k, v in sections.items()}}}))
    # CPU time, not wall time: the bound is on the work a refusal costs, which a loaded machine does not change.
    started = time.process_time()
    proc = run_main("plan", str(path), "--out", str(tmp_path / "plan.json"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert time.process_time() - started < 10
    assert not (tmp_path / "plan.json").exists()


def test_an_invalid_gpu_count_per_node_is_reported_once(raw):
    _dev_pool(raw, "h100-train")["gpu"]["per_node"] = 0  # the pool's NUMA map names GPUs 0..7
    assert problems(raw) == ["fleet.pools[0].gpu.per_node: must be >= 1"]


def test_numa_indexes_outside_the_node_are_one_problem_per_numa_node(raw):
    _dev_pool(raw, "h100-train")["gpu"]["per_node"] = 2
    assert [p for p in problems(raw) if ".topology." in p] == [
        "fleet.pools[0].topology.numa[0].gpus: GPU index(es) 2, 3 outside 0..1",
        "fleet.pools[0].topology.numa[1].gpus: GPU index(es) 4, 5, 6, 7 outside 0..1",
    ]


def test_an_owner_group_listed_twice_in_one_tenant_is_a_field_error(raw):
    raw["tenants"][1]["owners"]["groups"] = ["assistant-admins", "assistant-admins", "assistant-admins"]
    assert problems(raw) == ["tenants[1].owners.groups[1]: group 'assistant-admins' is listed twice"]


# --------------------------------------------------------------------------- secure values

REGISTRY_CIPHERTEXT = "v1:jsUq714BZSdQwgLB:WN65JUbpHV/TbNkymT+KJTeOxpC0nmZVxSgpaFnG0hMKFw=="
SALT_LINE = next(line for line in DEV_TEXT.splitlines() if line.startswith("encryptionsalt:"))


@pytest.mark.parametrize(
    ("secure", "expected"),
    [
        ("123", "must be a ciphertext string from `pulumi config set --secret`, got int"),
        ("hunter2", "not a Pulumi ciphertext (`v1:<nonce>:<ciphertext>`)"),
        ("v1:c2hvcnQ=:WN65JUbpHV/TbNkymT+KJTeOxpC0nmZVxSgpaFnG0hMKFw==", "its nonce is 5 bytes, not 12"),
        ("v1:jsUq714BZSdQwgLB:not*base64", "its ciphertext is not base64"),
    ],
)
def test_a_malformed_secure_value_is_refused_offline_always(tmp_path, monkeypatch, secure, expected):
    text = DEV_TEXT.replace(f"secure: {REGISTRY_CIPHERTEXT}", f"secure: {secure}")
    assert stack_problems(tmp_path, text, monkeypatch) == [f"layers.gpu_operator.registry.password: malformed secure value: {expected}"]


def test_secure_values_without_a_salt_are_refused(tmp_path, monkeypatch):
    text = DEV_TEXT.replace(SALT_LINE + "\n", "")
    assert stack_problems(tmp_path, text, monkeypatch) == [
        "encryptionsalt: missing, so no passphrase decrypts this stack's secure values (set them again with `pulumi config set --secret`)"
    ]


def test_a_wrong_passphrase_is_refused(tmp_path, monkeypatch):
    assert stack_problems(tmp_path, DEV_TEXT, monkeypatch, passphrase="not-the-passphrase") == [
        "encryptionsalt: the passphrase is not this stack's: its encryptionsalt does not decrypt with it"
    ]


def test_each_secure_value_that_does_not_decrypt_is_named(tmp_path, monkeypatch):
    tampered = REGISTRY_CIPHERTEXT.replace("WN65", "XN65")
    other = "v1:Do2FFZMh/qYXG2Oc:AsRBkrWrJZZzxRxwWPYeTCVsnKkB0xU44wJlhyQ5eRbBRVHnfXFvqOuYlZUz4Cm2wmhi8v8="
    text = DEV_TEXT.replace(REGISTRY_CIPHERTEXT, tampered).replace(other, other.replace("AsRB", "BsRB"))
    assert stack_problems(tmp_path, text, monkeypatch, passphrase=DEV_PASSPHRASE) == [
        "layers.gpu_operator.registry.password: does not decrypt with this stack's passphrase (encrypted for another stack or passphrase?)",
        "layers.keycloak.admin_password: does not decrypt with this stack's passphrase (encrypted for another stack or passphrase?)",
    ]


def test_the_right_passphrase_accepts_every_dev_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", DEV_PASSPHRASE)
    raw, secret_sections = read_stack_file(REPO / "Pulumi.dev.yaml", decrypt_check=True)
    assert secret_sections == {"layers"}


def test_decrypt_check_without_a_passphrase_is_refused(tmp_path, monkeypatch):
    assert stack_problems(tmp_path, DEV_TEXT, monkeypatch, decrypt_check=True) == [
        "--decrypt-check: set PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE to the stack's passphrase"
    ]


def test_the_cli_names_an_undecryptable_secret_without_printing_any_plaintext(tmp_path):
    path = tmp_path / "Pulumi.tampered.yaml"
    path.write_text(DEV_TEXT.replace(REGISTRY_CIPHERTEXT, REGISTRY_CIPHERTEXT.replace("WN65", "XN65")))
    proc = run_main("render", str(path), "--out", str(tmp_path / "out"), "--decrypt-check", env={"PULUMI_CONFIG_PASSPHRASE": DEV_PASSPHRASE})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "layers.gpu_operator.registry.password: does not decrypt" in proc.stderr
    assert not (tmp_path / "out").exists()
    for plaintext in _dev_plaintexts():
        assert plaintext not in proc.stdout + proc.stderr


def _dev_plaintexts() -> list[str]:
    """The dev stack's secrets in clear, decrypted here independently of the library."""
    import base64
    import hashlib

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    salt = base64.b64decode(SALT_LINE.split(":")[2])
    key = hashlib.pbkdf2_hmac("sha256", DEV_PASSPHRASE.encode(), salt, 1_000_000, 32)
    ciphertexts = [line.split("secure: ")[1] for line in DEV_TEXT.splitlines() if "secure: " in line]
    plaintexts = [AESGCM(key).decrypt(*(base64.b64decode(part) for part in c.split(":")[1:]), None).decode() for c in ciphertexts]
    assert len(plaintexts) == 6 and all(len(p) >= 8 for p in plaintexts)
    return plaintexts


# --------------------------------------------------------------------------- output


def test_the_command_ends_with_its_status_and_everything_it_printed():
    """`ai-factory` ends its process without the interpreter's teardown (`cli.run`): what the command
    printed to a pipe after its last flush still arrives, and its status is the process's."""
    program = "from ai_factory.factory import cli; cli.main = lambda: print('findings', flush=False) or 3; cli.run()"
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=60, env=buffered)
    assert (done.returncode, done.stdout) == (3, "findings\n"), done.stderr


@pytest.mark.parametrize("command", ["plan", "render"])
def test_a_reader_that_leaves_early_ends_no_command_in_a_traceback(tmp_path, command):
    out = tmp_path / ("plan.json" if command == "plan" else "out")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_CONFIG_PASSPHRASE")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ai_factory.factory", command, "dev", "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ,
    )
    proc.stdout.close()  # `| head` that has read enough
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 141, stderr.decode()
    assert b"Traceback" not in stderr and b"BrokenPipeError" not in stderr
    written = [tmp_path / c / "plan.json" for c in ("par1-a", "par1-b")] if command == "plan" else [out]  # dev's clusters' plans
    assert all(path.exists() for path in written)  # written whole before anything was printed


@pytest.mark.parametrize(
    ("lock", "expected"),
    [
        ("not json", "(document: Invalid JSON"),
        ('{"pools": 5}', "(pools: Input should be a valid array)"),
        ("index", ".gpus.0.index: Input should be a valid integer"),
    ],
    ids=["not-json", "wrong-shape", "wrong-type"],
)
def test_a_broken_plan_lock_is_a_config_error(tmp_path, lock, expected):
    (tmp_path / "plans").mkdir()
    if lock == "index":
        lock = (REPO / "plans" / "dev-par1-a.json").read_text().replace('"index": 0', '"index": "zero"', 1)
    (tmp_path / "plans" / "locked-par1-a.json").write_text(lock)  # the lock of the environment's cluster par1-a
    path = tmp_path / "Pulumi.locked.yaml"
    path.write_text(DEV_TEXT)
    proc = run_main("plan", str(path), "--out", str(tmp_path / "plan.json"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "plans/locked-par1-a.json: not a plan lock written by `ai-factory plan --lock` (" in proc.stderr
    assert expected in proc.stderr
    assert not (tmp_path / "par1-a").exists() and not (tmp_path / "par1-b").exists()


def test_pulumi_up_refuses_a_key_outside_the_known_namespaces(dev_raw):
    import json


    from ai_factory.factory.model.loading import load_pulumi_config
    from ai_factory.factory.rendering.harness import run_program

    # Layers naming dev's tenants (its Slurm cluster, its VMs, its Pod Security exception) would report them unknown.
    layers = {**dev_raw[0]["layers"], "slinky": {}, "kubevirt": {}, "tenancy": {k: v for k, v in dev_raw[0]["layers"]["tenancy"].items() if k != "pod_security_exceptions"}}
    config = {f"ai-factory:{k}": json.dumps(v, default=lambda s: s.reveal()) for k, v in {**dev_raw[0], "layers": layers}.items() if k != "tenants"}
    config["ai-factroy:tenants"] = json.dumps(dev_raw[0]["tenants"])
    with pytest.raises(ConfigError) as err:
        run_program(load_pulumi_config, project="ai-factory", stack="dev", config=config, secret_keys=["ai-factory:layers"])
    assert err.value.problems == ["ai-factroy:tenants: unknown config namespace 'ai-factroy' (did you mean 'ai-factory'?)"]


def test_a_registered_tenant_file_is_read_within_the_yaml_bounds(tmp_path):
    from ai_factory.factory.model.onboarding import RegistryError, registered_tenants, registry_dir

    directory = registry_dir("dev", tmp_path)
    directory.mkdir(parents=True)
    (directory / "laughs.yaml").write_text(BILLION_LAUGHS.replace("config:\n  ai-factory:tenants: ", "name: "))
    started = time.process_time()
    with pytest.raises(RegistryError, match="refused: more than 250000 values once its aliases are expanded"):
        registered_tenants("dev", tmp_path)
    assert time.process_time() - started < 1
