"""Patch sets and the preflight on the lab: revert byte for byte, wrong base, the real parser, a refused flag."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
import zipfile

import pytest
import yaml

from operations.environment.patches import PATCHES_DIR, load_patch_set
from tests.lab.labutil import (
    PYINFRA,
    ROOT,
    SPARE,
    deploy,
    http_get,
    main_pid,
    repo_copy,
    ssh,
    write_inventory,
)

pytestmark = pytest.mark.lab

PATCHED_ENV = "/root/venv_sglang+ddtree-sample"
PLAIN_ENV = "/root/venv_sglang"
DDTREE_ARGV = [
    "--model-path", "/dev/shm/Qwen3.6-27B", "--speculative-algorithm", "DDTREE",
    "--speculative-draft-model-path", "/root/models/Qwen3.6-27B-DFlash", "--speculative-ddtree-budget", "15",
]


@pytest.fixture(scope="module", autouse=True)
def converged():
    result = deploy()
    assert result.returncode == 0, result


def parses(host: str, venv: str, argv: list[str]) -> tuple[bool, str]:
    script = (
        "import json, sys\n"
        "from sglang.srt.server_args import prepare_server_args\n"
        "a = prepare_server_args(json.loads(sys.argv[1]))\n"
        "print(a.speculative_algorithm, a.speculative_ddtree_budget)\n"
    )
    result = ssh(host, f"{venv}/bin/python -c {shlex.quote(script)} {shlex.quote(json.dumps(argv))}", check=False)
    return result.returncode == 0, result.stdout + result.stderr


def pristine_sha256(rel: str) -> str:
    wheel = next((ROOT / "lab" / "cache" / "wheelhouse").glob("sglang-0.5.23-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        return hashlib.sha256(zf.read(rel)).hexdigest()


def test_ddtree_flags_parse_with_the_sample_set_and_are_refused_without_it():
    ok, out = parses("gpu-a", PATCHED_ENV, DDTREE_ARGV)
    assert ok and "DDTREE 15" in out, out
    ok, out = parses("gpu-a", PLAIN_ENV, DDTREE_ARGV)
    assert not ok and "unrecognized arguments: --speculative-ddtree-budget 15" in out, out


def revert_on_gpu_a() -> str:
    """Revert ddtree-sample in gpu-a's live patched venv (its originals back, no applied record); the site dir."""
    site = ssh("gpu-a", f"ls -d {PATCHED_ENV}/lib/python3*/site-packages").stdout.strip()
    proc = subprocess.run(
        [PYINFRA, "lab/inventory.py", "tests/lab/deploys/revert_patch.py", "-y", "--limit", "gpu-a",
         "--data", "patch_set=ddtree-sample", "--data", f"venv={PATCHED_ENV}"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return site


def test_revert_restores_every_original_byte_for_byte_and_the_deploy_reapplies():
    patch_set = load_patch_set("ddtree-sample")
    site = revert_on_gpu_a()
    for patch_file in patch_set.files:
        found = ssh("gpu-a", f"sha256sum {site}/{patch_file.path} 2>/dev/null || echo absent").stdout.split()[0]
        if patch_file.original is None:
            assert found == "absent"
        else:
            assert found == patch_file.original == pristine_sha256(patch_file.path)
    assert ssh("gpu-a", f"test -e {PATCHED_ENV}/.sglang-deploy/patches/ddtree-sample/applied.json || echo gone").stdout.strip() == "gone"
    result = deploy()
    assert result.returncode == 0, result
    assert any(name.startswith("Patch set ddtree-sample applied in generation ") for name, _ in result.changed), result
    assert deploy().changed == []


def test_a_base_file_edited_by_hand_is_reinstalled_and_then_patched_with_no_force_needed():
    """A file the set replaces, edited by hand while the set is not applied (a host patched by hand): it is
    neither the original nor the patched file. The venv check sees it differ from sglang's RECORD and the
    deploy reinstalls sglang in a new generation before the set goes on, so no escape hatch is needed."""
    patch_set = load_patch_set("ddtree-sample")
    replaced = next(f for f in patch_set.files if f.original is not None)
    site = revert_on_gpu_a()
    ssh("gpu-a", f"echo '# edited by hand' >> {site}/{replaced.path}")
    result = deploy()
    assert result.returncode == 0, result
    assert f"installed file(s) missing or altered ({replaced.path}" in result.stderr, result.stderr[-3000:]
    live_site = ssh("gpu-a", f"ls -d {PATCHED_ENV}/lib/python3*/site-packages").stdout.strip()
    assert ssh("gpu-a", f"sha256sum {live_site}/{replaced.path}").stdout.split()[0] == replaced.sha256
    assert deploy().changed == []


@pytest.fixture
def wrong_base_repo(tmp_path, spare):
    """A copy of the repository with one more patch set, `test-wrong-base` (ddtree-sample claiming sglang 0.5.22).

    Written into a copy, never into this checkout's files/patches/ (where another run would see it).
    """
    root = repo_copy(tmp_path / "repo")
    target = root / "files" / "patches" / "test-wrong-base"
    shutil.copytree(PATCHES_DIR / "ddtree-sample", target)
    manifest = yaml.safe_load((target / "patchset.yml").read_text())
    manifest["name"], manifest["base"]["version"] = "test-wrong-base", "0.5.22"
    (target / "patchset.yml").write_text(yaml.safe_dump(manifest))
    return root


def test_patch_set_for_another_base_is_refused_and_nothing_is_written(wrong_base_repo):
    """The control machine knows the patch set's base and the stack's pin: the run stops at validation, before any
    host is touched (it used to build a venv generation for it first, then refuse it on the host; the host's own
    refusal stays for a venv whose engine changed under a patch set: tests/unit/test_operations.py)."""
    services = {"wrong": {"gpu": 0, "port": 30103, "model": "Qwen3.6-27B-DFlash", "model_in": "store",
                          "patch_sets": ["test-wrong-base"]}}
    inventory = write_inventory("test_wrong_base", {SPARE: {"services": services, "run_services": ["wrong"]}}, root=wrong_base_repo)
    result = deploy(inventory, root=wrong_base_repo)
    assert result.returncode != 0
    assert ("services.wrong.patch_sets: 'test-wrong-base': files/patches/test-wrong-base/patchset.yml is written for "
            "sglang 0.5.22, but the stack lab-cpu-sglang pins sglang 0.5.23") in result.stderr
    # Nothing was built, switched in or written on the host.
    assert ssh(SPARE, "test -e /root/venv_sglang+test-wrong-base || echo absent").stdout.strip() == "absent"
    assert ssh(SPARE, "test -e /root/venv_sglang+test-wrong-base.generations || echo absent").stdout.strip() == "absent"
    assert ssh(SPARE, "ls /etc/systemd/system | grep -c sglang- || true").stdout.strip() == "0"
    assert not (PATCHES_DIR / "test-wrong-base").exists()


def test_flag_refused_by_the_preflight_leaves_the_running_service_untouched():
    data = yaml.safe_load((ROOT / "group_data" / "all.yml").read_text())
    args = {**data["services"]["dflash"]["args"], "max-running-requests": "lots"}  # a value only the parser judges
    unit = "sglang-dflash.service"
    pid = main_pid("gpu-a", unit)
    unit_sha = ssh("gpu-a", f"sha256sum /etc/systemd/system/{unit}").stdout
    inventory = write_inventory("test_stale_flag", {"gpu-a": {"run_services": {"ddtree": {}, "dflash": {"args": args}}}})
    result = deploy(inventory)
    assert result.returncode != 0
    assert "--max-running-requests" in result.stderr and "'lots'" in result.stderr
    assert "gpu-a/dflash" in result.stderr and "FAILED  preflight:" in result.stderr
    assert main_pid("gpu-a", unit) == pid
    assert ssh("gpu-a", f"sha256sum /etc/systemd/system/{unit}").stdout == unit_sha
    assert http_get("gpu-a", 30001, "/health")[0] == 200
    assert deploy().changed == []
