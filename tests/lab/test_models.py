"""Model staging on a real lab host: stage, converge, repair, resume, run out of space, clean up, reboot.

Destructive: runs on LAB_MODELS_HOST (default gpu-b), which no lab service uses. Models are generated
in that host's store as `stg-*` and deleted at the end; the host is left clean (`clean_host`).
Most tests run a staging-only deploy (settings + `models.stage_for_host`, as deploy.py calls it);
the reboot test runs the whole deploy.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from operations import remote
from operations.model import models
from tests.lab.labutil import (
    PYINFRA,
    ROOT,
    DeployResult,
    clean_host,
    deploy,
    http_get,
    lab_hosts,
    ssh,
    write_inventory,
)

pytestmark = pytest.mark.lab

HOST = os.environ.get("LAB_MODELS_HOST", "gpu-b")
STORE = "/root/models"
SMALL = "stg-small"  # 24 files, about 21 MiB, in two folders
BIG = "stg-big"  # 4 files, 600 MiB: slow enough to be killed mid-copy
OP = "Model {} staged in {}"
MARKER = models.MARKER
TINY = "/mnt/sglang-tiny"

STAGING_DEPLOY = ROOT / "lab" / "test_models_deploy.py"
STAGING_DEPLOY_TEXT = f"""# Written by tests/lab/test_models.py: only the model staging part of deploy.py.
import sys
sys.path.insert(0, {str(ROOT)!r})
from pyinfra import host
from configuration import settings
from operations.model import models
models.stage_for_host(settings.host_config(host))
"""


def service(model: str, port: int = 30200, gpu: int = 0, where: str = "shm") -> dict:
    return {"gpu": gpu, "port": port, "model": model, "model_in": where}


def inventory(name: str, services: dict, **data) -> str:
    return str(write_inventory(name, {HOST: {"services": services, "run_services": list(services), **data}}))


def stage_only(inv: str, *extra: str) -> DeployResult:
    argv = [PYINFRA, inv, str(STAGING_DEPLOY.relative_to(ROOT)), "-y", "--json", *extra]
    return DeployResult(subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900))


def changed(result: DeployResult) -> list[str]:
    return [name for name, _hosts in result.changed]


def make_model(name: str, sizes_mib: dict[str, float]) -> None:
    commands = [f"rm -rf {STORE}/{name}"]
    for rel, mib in sizes_mib.items():
        path = f"{STORE}/{name}/{rel}"
        commands.append(f"mkdir -p $(dirname {path}) && head -c {int(mib * 2**20)} /dev/urandom > {path}")
    ssh(HOST, " && ".join(commands), timeout=300)


def stat(path: str) -> dict[str, tuple[int, int]]:
    """relpath -> (inode, mtime_ns) of every file under path on the host."""
    script = (
        "import os, sys, json; root = sys.argv[1]; print(json.dumps({os.path.relpath(os.path.join(b, n), root): "
        "[os.stat(os.path.join(b, n)).st_ino, os.stat(os.path.join(b, n)).st_mtime_ns] for b, _d, ns in os.walk(root) for n in ns}))"
    )
    return {k: tuple(v) for k, v in json.loads(ssh(HOST, f"python3 -c '{script}' {path}").stdout).items()}


def same_content(model: str, shm: str = "/dev/shm") -> bool:
    out = ssh(HOST, f"cd {STORE}/{model} && find . -type f ! -name '.sglang-deploy-*' | sort | xargs sha256sum; echo ==; "
                    f"cd {shm}/{model} && find . -type f ! -name '.sglang-deploy-*' | sort | xargs sha256sum").stdout
    src, dst = out.split("==")
    return src.strip() == dst.strip()


def small_staged() -> str:
    """The state most tests start from: stg-small staged (a no-op when it already is); its inventory."""
    inv = inventory("test_models_small", {"small": service(SMALL)})
    result = stage_only(inv)
    assert result.returncode == 0, result
    return inv


def shm_entries() -> list[str]:
    return sorted(ssh(HOST, "ls -A /dev/shm").stdout.split())


@pytest.fixture(scope="module", autouse=True)
def models_host():
    STAGING_DEPLOY.write_text(STAGING_DEPLOY_TEXT)
    clean_host(HOST)
    files = {f"model-{i:05d}-of-00020.safetensors": 1 for i in range(1, 21)}
    make_model(SMALL, {"config.json": 0.001, **files, "tokenizer/vocab.json": 0.5, "tokenizer/merges.txt": 0.2, "extra/notes.md": 0.01})
    yield
    ssh(HOST, f"umount {TINY} 2>/dev/null; rm -rf {STORE}/stg-* /etc/sglang-deploy /usr/local/lib/sglang-deploy", check=False)
    clean_host(HOST)


def test_stage_then_rerun_changes_nothing_and_the_source_is_untouched():
    before = ssh(HOST, f"cd {STORE}/{SMALL} && find . -type f | sort | xargs sha256sum").stdout
    inv = inventory("test_models_small", {"small": service(SMALL)})
    first = stage_only(inv)
    assert first.returncode == 0, first
    assert OP.format(SMALL, "/dev/shm") in changed(first)
    assert same_content(SMALL)
    assert ssh(HOST, f"test -f /dev/shm/{SMALL}/{MARKER} && test -f {STORE}/{SMALL}/.sglang-deploy-manifest.json && echo ok").stdout.strip() == "ok"
    again = stage_only(inv)
    assert again.returncode == 0 and again.changed == [], again
    # Only the manifest cache was added beside the source.
    after = ssh(HOST, f"cd {STORE}/{SMALL} && find . -type f ! -name .sglang-deploy-manifest.json | sort | xargs sha256sum").stdout
    assert after == before
    assert shm_entries() == [SMALL]


def test_deleted_file_is_copied_alone():
    inv = small_staged()
    before = stat(f"/dev/shm/{SMALL}")
    gone = "model-00007-of-00020.safetensors"
    ssh(HOST, f"rm /dev/shm/{SMALL}/{gone}")
    result = stage_only(inv)
    assert result.returncode == 0, result
    assert changed(result) == [OP.format(SMALL, "/dev/shm")]
    after = stat(f"/dev/shm/{SMALL}")
    for rel, ident in before.items():
        if rel not in (gone, MARKER):
            assert after[rel] == ident, f"{rel} was copied again"
    assert after[gone] != before[gone]
    assert same_content(SMALL)
    assert stage_only(inv).changed == []


def test_same_size_corruption_is_found_by_full_verify_and_repaired():
    inv = small_staged()
    victim = f"/dev/shm/{SMALL}/model-00003-of-00020.safetensors"
    # Its mtime put back: a fast check (names, sizes, mtimes) cannot see it (test_convergence: one it can).
    ssh(HOST, f"touch -r {victim} /tmp/mtime-ref && printf 'XXXX' | dd of={victim} bs=1 seek=4096 conv=notrunc status=none && touch -r /tmp/mtime-ref {victim}")
    assert not same_content(SMALL)
    fast = stage_only(inv)
    assert fast.returncode == 0 and fast.changed == [], "a fast check looks at names, sizes and mtimes only"
    full = stage_only(inv, "--data", "verify_models=full")
    assert full.returncode == 0, full
    assert changed(full) == [OP.format(SMALL, "/dev/shm")]
    assert same_content(SMALL)
    assert stage_only(inv, "--data", "verify_models=full").changed == []


def test_interrupted_copy_leaves_nothing_complete_and_the_next_run_finishes_it():
    small_staged()
    ssh(HOST, f"rm -rf /dev/shm/{BIG} /dev/shm/.{BIG}.partial")
    make_model(BIG, {"a.bin": 250, "b.bin": 150, "c.bin": 100, "d.bin": 100})
    dest, partial = f"/dev/shm/{BIG}", f"/dev/shm/.{BIG}.partial"
    journal = f"{partial}/{models.JOURNAL}"
    subprocess.run(
        ["ssh", "-i", str(ROOT / "lab/state/id_ed25519"), "-o", f"UserKnownHostsFile={ROOT / 'lab/state/known_hosts'}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{lab_hosts()[HOST]['address']}", "mkdir -p /tmp/stg && cat > /tmp/stg/stage_model.py"],
        input=remote.script("stage_model"), text=True, check=True, timeout=60,
    )
    # Start a stage, kill -9 it as soon as one file is journaled (others are still being written).
    killed = ssh(HOST, (
        f"python3 /tmp/stg/stage_model.py {STORE}/{BIG} {dest} {MARKER} --progress 0 >/dev/null 2>&1 & pid=$!; "
        f"for i in $(seq 1 2000); do if [ -s {journal} ]; then break; fi; sleep 0.005; done; "
        f"kill -9 $pid; wait $pid; echo killed $?; cat {journal} | wc -l; ls -A {partial}"
    ), timeout=120).stdout.split()
    assert killed[:2] == ["killed", "137"], killed
    assert 1 <= int(killed[2]) < 4, killed
    assert MARKER not in killed[3:], "a killed copy must not carry the marker"
    assert ssh(HOST, f"test -e {dest} && echo exists || echo absent").stdout.strip() == "absent"
    state = json.loads(ssh(HOST, models.StagedModel().command(f"{STORE}/{BIG}", dest)).stdout)
    assert models.drift(state) == "not staged"
    finished = [json.loads(line)[0] for line in ssh(HOST, f"cat {journal}").stdout.splitlines() if line.endswith("]")]
    kept = {rel: ident for rel, ident in stat(partial).items() if rel in finished}

    inv = inventory("test_models_big", {"small": service(SMALL), "big": service(BIG, port=30201, gpu=1)})
    result = stage_only(inv)
    assert result.returncode == 0, result
    assert OP.format(BIG, "/dev/shm") in changed(result)
    assert OP.format(SMALL, "/dev/shm") not in changed(result)
    assert same_content(BIG)
    now = stat(dest)
    assert all(now[rel] == ident for rel, ident in kept.items()), "journaled files are reused, not copied again"
    assert f".{BIG}.partial" not in shm_entries()
    ssh(HOST, f"rm -rf {STORE}/{BIG}")


def test_not_enough_space_fails_with_the_numbers_and_leaves_nothing():
    ssh(HOST, f"mkdir -p {TINY} && (mountpoint -q {TINY} || mount -t tmpfs -o size=1m tmpfs {TINY})")
    try:
        inv = inventory("test_models_tiny", {"small": service(SMALL)}, shm_dir=TINY)
        result = deploy_text(inv)
        assert result.returncode != 0
        text = result.stdout + result.stderr
        assert f"not enough space to stage: {TINY} has 1.00 MiB free, this host must stage 20.71 MiB more (stg-small 20.71 MiB)" in text, text[-3000:]
        assert ssh(HOST, f"ls -A {TINY}").stdout.strip() == ""
    finally:
        ssh(HOST, f"umount {TINY}; rmdir {TINY}", check=False)


def deploy_text(inv: str) -> DeployResult:
    argv = [PYINFRA, inv, str(STAGING_DEPLOY.relative_to(ROOT)), "-y"]
    return DeployResult(subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900))


def test_unused_staged_model_is_removed_and_nothing_else():
    make_model("stg-gone", {"w.bin": 1})
    make_model("stg-other", {"w.bin": 2})
    two = inventory("test_models_two", {"small": service(SMALL), "gone": service("stg-gone", port=30201, gpu=1)})
    assert stage_only(two).returncode == 0
    ssh(HOST, f"rm -rf {STORE}/stg-gone")  # its source gone too: only our marker says the copy is ours
    ssh(HOST, "mkdir -p /dev/shm/not-ours && echo keep > /dev/shm/not-ours/file")
    assert {SMALL, "stg-gone"} <= set(shm_entries())
    inv = inventory("test_models_other", {"other": service("stg-other")})
    result = stage_only(inv)
    assert result.returncode == 0, result
    assert "Unused staged models removed from /dev/shm" in changed(result)
    assert shm_entries() == ["not-ours", "stg-other"]
    listing = json.loads(ssh(HOST, f"cat {models.BOOT_LIST}").stdout)
    assert [m["name"] for m in listing["models"]] == ["stg-other"]
    assert stage_only(inv).changed == []
    ssh(HOST, "rm -rf /dev/shm/not-ours")


def test_reboot_restages_from_the_store_and_the_service_answers_without_a_deploy():
    """The whole deploy places dflash on the host; after a real reboot the boot unit stages its model again."""
    inv = write_inventory("test_models_reboot", {HOST: {"run_services": ["dflash"]}})
    result = deploy(inv)
    assert result.returncode == 0, result
    assert http_get(HOST, 30001, "/health")[0] == 200
    assert ssh(HOST, f"systemctl is-enabled {models.BOOT_UNIT}").stdout.strip() == "enabled"
    subprocess.run(["python3", "lab/lab.py", "reboot", HOST], cwd=ROOT, check=True, capture_output=True, timeout=300)
    deadline = time.monotonic() + 240
    status = None
    while time.monotonic() < deadline:
        try:
            status = http_get(HOST, 30001, "/health")[0]
        except (AssertionError, subprocess.TimeoutExpired):
            status = None
        if status == 200:
            break
        time.sleep(3)
    journal = ssh(HOST, f"journalctl -b -u {models.BOOT_UNIT} --no-pager | tail -5", check=False).stdout
    assert status == 200, f"no /health 200 within 240 s after the reboot; boot unit journal:\n{journal}"
    assert ssh(HOST, f"systemctl is-active {models.BOOT_UNIT}").stdout.strip() == "active"
    assert "Qwen3.6-27B: staged" in journal
    assert ssh(HOST, f"test -f /dev/shm/Qwen3.6-27B/{MARKER} && echo ok").stdout.strip() == "ok"
    # Converged: the deploy after the reboot changes nothing.
    assert deploy(inv).changed == []
