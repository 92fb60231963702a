"""GPU decisions and placement on the lab: auto backend, refused GPUs, `gpu: auto`, removal, migration.

Only gpu-d and gpu-e are used (`python3 lab/lab.py up --hosts gpu-a,gpu-b,gpu-c,gpu-d,gpu-e`); both are
left clean and with their default stand-in GPUs. The venv built by the first deploy is kept between
tests (services, units and staged models are dropped), so that each test pays for it once.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from tests.lab.labutil import (
    ROOT,
    clean_host,
    deploy,
    http_get,
    lab_hosts,
    main_pid,
    repo_copy,
    ssh,
    write_inventory,
)
from tests.served_sets import served_copy

pytestmark = pytest.mark.lab

OLD, NEW = "gpu-d", "gpu-e"
UNITS = "/etc/systemd/system"
SERVICES = {
    # The lab's dflash (group_data/all.yml), and a temporary server sharing its staged target.
    "dflash": {
        "gpu": 1, "port": 30001, "model": "Qwen3.6-27B", "model_in": "shm", "draft_model": "Qwen3.6-27B-DFlash", "draft_in": "store",
        "args": {"speculative-algorithm": "DFLASH", "speculative-dflash-block-size": 16, "attention-backend": "auto", "grammar-backend": "none"},
    },
    "tmp": {"gpu": 0, "port": 30000, "model": "Qwen3.6-27B", "model_in": "shm", "args": {"attention-backend": "auto"}},
}
# The same server under a second name: a service is placed on one host, so two hosts compared side by side run two.
SERVICES["dflash-b"] = SERVICES["dflash"]


def lab(*args: str) -> str:
    proc = subprocess.run(["python3", "lab/lab.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"lab.py {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def drop_services(host: str) -> None:
    """Remove units and staged models, keep the venv (the slow part of a first deploy)."""
    ssh(host, (
        "for u in $(systemctl list-unit-files 'sglang-*' --no-legend | cut -d' ' -f1); do systemctl disable --now $u >/dev/null 2>&1; done; "
        "rm -f /etc/systemd/system/sglang-*.service; systemctl daemon-reload; systemctl reset-failed 'sglang-*' 2>/dev/null; "
        "rm -rf /etc/sglang-deploy /dev/shm/* /dev/shm/.[!.]* /var/cache/sglang/kernels /var/lib/sglang-deploy/kernels; true"
    ))


def placed(old, new, **extra) -> dict:
    return {OLD: {"services": SERVICES, "run_services": old, **extra.get(OLD, {})}, NEW: {"services": SERVICES, "run_services": new, **extra.get(NEW, {})}}


def run(name: str, old, new, *args: str, **extra):
    return deploy(write_inventory(f"test_placement_{name}", placed(old, new, **extra)), *args, as_json=False)


def output(result) -> str:
    return result.stdout + result.stderr


def unit_text(host: str, service: str) -> str | None:
    out = ssh(host, f"cat {UNITS}/sglang-{service}.service 2>/dev/null || true").stdout
    return out or None


def unit_state(host: str, service: str) -> str:
    return ssh(host, f"systemctl is-active sglang-{service}.service", check=False).stdout.strip()


@pytest.fixture(scope="module", autouse=True)
def own_hosts():
    assert {OLD, NEW} <= set(lab_hosts()), "run: python3 lab/lab.py up --hosts gpu-a,gpu-b,gpu-c,gpu-d,gpu-e"
    for host in (OLD, NEW):
        lab("gpus", host, "--reset")
        clean_host(host)
    yield
    if subprocess.run(["python3", "lab/lab.py", "status"], cwd=ROOT, capture_output=True, text=True).stdout.count("ssh ok") < 5:
        lab("up", "--hosts", "gpu-a,gpu-b,gpu-c,gpu-d,gpu-e")
    for host in (OLD, NEW):
        lab("gpus", host, "--reset")
        clean_host(host)


@pytest.fixture(autouse=True)
def fresh_services():
    for host in (OLD, NEW):
        drop_services(host)
        lab("gpus", host, "--reset")
    yield


def test_attention_backend_auto_is_triton_on_12_0_and_sglangs_default_on_9_0():
    lab("gpus", NEW, "--count", "2", "--name", "NVIDIA H200", "--compute-cap", "9.0", "--memory-mib", "143771")
    dry = run("backend", ["dflash"], ["dflash-b"], "--dry")
    assert dry.returncode == 2, output(dry)  # changes planned, none refused
    text = output(dry)
    assert f"[{OLD}] dflash: attention-backend auto -> triton (sm 12.0" in text
    assert f"[{NEW}] dflash-b: attention-backend auto -> sglang's default (sm 9.0)" in text
    assert f"[{NEW}] GPUs: 2 x NVIDIA H200 (sm 9.0, 143771 MiB); driver 580.159.04, CUDA 13.0" in text
    assert unit_text(OLD, "dflash") is None  # --dry changed nothing

    result = run("backend", ["dflash"], ["dflash-b"])
    assert result.returncode == 0, output(result)
    assert "    --attention-backend triton \\" in unit_text(OLD, "dflash")
    assert "--attention-backend" not in unit_text(NEW, "dflash-b")
    assert http_get(NEW, 30001, "/health")[0] == 200


@pytest.mark.parametrize(("gpus", "expected"), [
    (["--fail", "1"], "dflash: GPU 1 is unhealthy: nvidia-smi reads [GPU requires reset]; healthy free GPUs: 0"),
    (["--missing", "1"], "dflash: GPU 1 is missing (nvidia-smi lists GPUs 0; it cannot reach 0000:2A:00.0); healthy free GPUs: 0"),
    (["--process", "1:4242:81234"], "dflash: GPU 1 is in use by pid 4242, 81234 MiB; healthy free GPUs: 0"),
    (["--memory-mib", "4"], "dflash: models need 5.0 MiB per GPU (Qwen3.6-27B 4.0 MiB + Qwen3.6-27B-DFlash 1.0 MiB), GPU 1 has 4.0 MiB: short by 1.0 MiB"),
], ids=["failed", "missing", "busy", "too-small"])
def test_a_gpu_that_cannot_serve_fails_the_host_before_any_change(gpus, expected):
    lab("gpus", NEW, *gpus)
    before = ssh(NEW, "ls -A /etc/systemd/system /dev/shm /root | sort | sha256sum").stdout
    dry = run("refused", [], ["dflash"], "--dry")
    assert f"[{NEW}] GPU check will fail: {expected}" in output(dry)
    result = run("refused", [], ["dflash"])
    assert result.returncode != 0
    assert f"GPU CHECK FAILED, nothing changed on this host: {expected}" in output(result)
    assert f"{NEW}/dflash" in output(result) and "FAILED  GPU check:" in output(result)
    assert ssh(NEW, "ls -A /etc/systemd/system /dev/shm /root | sort | sha256sum").stdout == before


def test_a_host_without_what_the_stack_needs_is_refused_before_any_change():
    """Issue 50 item 1: the stack's Python, a driver as new as the stack's CUDA and room in /dev/shm for the models
    are read in the host's one read and judged with the GPUs, before anything is built, --dry included; each refusal
    names its fix. The real stack (Python 3.12, CUDA 13.0) on a lab host (Debian 12: Python 3.11), its driver set to
    CUDA 12.8 and its /dev/shm to 2 MiB (the target is 4 MiB)."""
    lab("gpus", NEW, "--cuda", "12.8")
    ssh(NEW, "mount -o remount,size=2M /dev/shm")
    try:
        before = ssh(NEW, "ls -A /etc/systemd/system /dev/shm /root | sort | sha256sum").stdout
        expected = [
            "python3.12 not found on the host: stack sglang-0.5.23-cu130 builds its venv with it; install it",
            "the driver supports CUDA 12.8, stack sglang-0.5.23-cu130 is built for CUDA 13.0: install an NVIDIA driver",
            "/dev/shm has 2.0 MiB free, the models still to stage need 4.0 MiB (Qwen3.6-27B 4.0 MiB): give it more room",
        ]
        dry = run("prerequisites", [], ["dflash"], "--dry", **{NEW: {"stack": "sglang-0.5.23-cu130"}})
        assert dry.returncode == 1, output(dry)[-3000:]
        for line in expected:
            assert f"[{NEW}] GPU check will fail: {line}" in output(dry), output(dry)[-3000:]
        result = run("prerequisites", [], ["dflash"], **{NEW: {"stack": "sglang-0.5.23-cu130"}})
        assert result.returncode != 0
        for line in expected:
            assert f"GPU CHECK FAILED, nothing changed on this host: {line}" in output(result), output(result)[-3000:]
        assert ssh(NEW, "ls -A /etc/systemd/system /dev/shm /root | sort | sha256sum").stdout == before
    finally:
        ssh(NEW, "mount -o remount,size=2468380k /dev/shm")


def test_a_long_start_prints_progress_with_the_engines_latest_line_and_a_converged_run_prints_none():
    """Issue 50 item 2: a phase longer than the progress interval (10 s) prints a line per interval on the default
    verbosity; the readiness wait's names the engine's own latest line (not its /health probes)."""
    slow = {"slow": {**SERVICES["tmp"], "env": {"STANDIN_WARMUP_S": "25"}}}
    inventory = write_inventory("test_placement_progress", {NEW: {"services": slow, "run_services": ["slow"]}})
    first = deploy(inventory, as_json=False)
    assert first.returncode == 0, output(first)[-3000:]
    lines = [line for line in output(first).splitlines() if "sglang-slow.service starting:" in line]
    assert len(lines) >= 2, output(first)[-3000:]
    assert f"[{NEW}] sglang-slow.service starting: 10 s so far; the engine's latest line: " in lines[0], lines
    assert not any("/health" in line for line in lines), lines
    again = deploy(inventory, as_json=False)
    assert again.returncode == 0 and "so far" not in output(again), output(again)[-3000:]


def test_auto_on_an_h200_is_refused_for_a_patch_set_served_only_on_triton(tmp_path):
    """DDTree's port served on triton and died on fa3, sglang's default on an H200 (bench/results/
    h200-2026-12-03-b2ac97c-ddtree-auto.txt): a set whose manifest names triton alone is refused by the host's GPU
    check where `attention-backend: auto` resolves to that default, with --dry too, before anything changes."""
    root = repo_copy(tmp_path / "repo")
    served_copy(root / "files" / "patches", "test-served-triton")
    lab("gpus", NEW, "--count", "2", "--name", "NVIDIA H200", "--compute-cap", "9.0", "--memory-mib", "143771")
    services = {"served": {**SERVICES["tmp"], "patch_sets": ["test-served-triton"]}}
    inventory = write_inventory("test_placement_served", {NEW: {"services": services, "run_services": ["served"]}}, root=root)
    expected = ("served: `attention-backend: auto` gives sglang's default on sm 9.0 here, and patch set test-served-triton "
                "was served only on triton (its manifest's attention_backends): set `attention-backend: triton`")
    before = ssh(NEW, "ls -A /etc/systemd/system /dev/shm /root | sort | sha256sum").stdout

    dry = deploy(inventory, "--dry", as_json=False, root=root)
    assert dry.returncode != 0 and f"[{NEW}] GPU check will fail: {expected}" in output(dry), output(dry)[-3000:]
    result = deploy(inventory, as_json=False, root=root)
    assert result.returncode != 0
    assert f"GPU CHECK FAILED, nothing changed on this host: {expected}" in output(result), output(result)[-3000:]
    assert ssh(NEW, "ls -A /etc/systemd/system /dev/shm /root | sort | sha256sum").stdout == before


def test_a_process_of_the_service_itself_does_not_make_its_gpu_busy():
    assert run("own", [], ["dflash"]).returncode == 0
    lab("gpus", NEW, "--process", f"1:{main_pid(NEW, 'sglang-dflash.service')}:1000")
    result = run("own", [], ["dflash"])
    assert result.returncode == 0, output(result)
    assert "GPU CHECK FAILED" not in output(result)


def test_gpu_auto_picks_a_free_gpu_and_keeps_it_across_runs():
    lab("gpus", OLD, "--process", "0:4242:1000")  # GPU 0 busy: auto takes GPU 1
    first = run("auto", {"dflash": {"gpu": "auto"}}, [])
    assert first.returncode == 0, output(first)
    assert f"[{OLD}] dflash: gpu auto -> GPU 1 (lowest healthy free GPU)" in output(first)
    assert "Environment=CUDA_VISIBLE_DEVICES=1" in unit_text(OLD, "dflash")
    pid = main_pid(OLD, "sglang-dflash.service")

    lab("gpus", OLD, "--clear-processes")  # GPU 0 is free again and the lowest: the service stays on 1
    again = run("auto", {"dflash": {"gpu": "auto"}}, [])
    assert again.returncode == 0, output(again)
    assert f"[{OLD}] dflash: gpu auto -> GPU 1 (kept: its current unit's GPU)" in output(again)
    assert "Environment=CUDA_VISIBLE_DEVICES=1" in unit_text(OLD, "dflash")
    assert main_pid(OLD, "sglang-dflash.service") == pid
    assert not re.search(r"Grand total\s+\d+\s+[1-9]", output(again)), output(again)  # nothing changed


def test_a_service_no_longer_placed_is_removed_and_nothing_else():
    assert run("unplace", ["dflash", "tmp"], []).returncode == 0
    dflash_pid = main_pid(OLD, "sglang-dflash.service")
    # A unit of someone else's, with our prefix but not our header: never touched.
    ssh(OLD, "printf '[Service]\\nExecStart=/bin/sleep infinity\\n' > /etc/systemd/system/sglang-handmade.service && systemctl daemon-reload")

    result = run("unplace", ["dflash"], [])
    assert result.returncode == 0, output(result)
    assert f"[{OLD}] sglang-tmp.service: stopped, disabled and removed (no longer placed here)" in output(result)
    assert unit_text(OLD, "tmp") is None and unit_state(OLD, "tmp") != "active"
    assert main_pid(OLD, "sglang-dflash.service") == dflash_pid
    assert ssh(OLD, "test -f /dev/shm/Qwen3.6-27B/.sglang-deploy-staged.json && echo kept").stdout.strip() == "kept"  # dflash uses it
    assert ssh(OLD, "test -f /etc/systemd/system/sglang-handmade.service && echo kept").stdout.strip() == "kept"

    result = run("unplace", [], [])
    assert result.returncode == 0, output(result)
    assert unit_text(OLD, "dflash") is None
    assert ssh(OLD, "ls -A /dev/shm").stdout.strip() == ""  # its staged model released
    assert ssh(OLD, "test -f /etc/systemd/system/sglang-handmade.service && echo kept").stdout.strip() == "kept"
    ssh(OLD, "rm -f /etc/systemd/system/sglang-handmade.service && systemctl daemon-reload")


def neighbour(host: str) -> dict:
    return {
        "pid": main_pid(host, "sglang-tmp.service"),
        "unit": ssh(host, f"sha256sum {UNITS}/sglang-tmp.service").stdout,
        "model": ssh(host, "stat -c '%i %Y %s' /dev/shm/Qwen3.6-27B /dev/shm/Qwen3.6-27B/* /dev/shm/Qwen3.6-27B/.sglang-deploy-staged.json").stdout,
    }


def kernel_cache_state(host: str, port: int) -> str:
    """What the stand-in found at its start: `warm` (its kernels in its cache) or `cold` (compiled)."""
    return json.loads(http_get(host, port, "/server_info")[1])["kernel_cache"]["state"]


def sealed_caches(host: str) -> list[str]:
    return ssh(host, "ls /var/lib/sglang-deploy/kernels 2>/dev/null; true").stdout.split()


def test_migration_with_the_old_host_reachable_leaves_the_neighbour_untouched():
    """...and the new host starts warm: the old host's kernel cache, sealed by root after its gate, is shipped with
    the model (`model_sources`), seeded before the start; the old host's copies leave with its unit."""
    # Before: dflash on the old host's GPU 1; a temporary server on the new host's GPU 0.
    before = run("move", ["dflash"], ["tmp"])
    assert before.returncode == 0, output(before)
    assert kernel_cache_state(OLD, 30001) == "cold"
    sealed = sealed_caches(OLD)
    assert len(sealed) == 1 and sealed[0].endswith(".sm120"), sealed
    kept = neighbour(NEW)

    start = time.monotonic()
    moved = run("move", [], {"tmp": None, "dflash": {"gpu": 1, "port": 30001}},
                **{NEW: {"model_sources": {"Qwen3.6-27B": OLD}}})
    text = output(moved)
    assert moved.returncode == 0, text
    ready_line = re.search(rf"--> {NEW}/dflash is ready ([0-9.]+) s after the deploy started", text)
    assert ready_line and float(ready_line.group(1)) <= time.monotonic() - start + 5
    removed = f"[{OLD}] sglang-dflash.service: stopped, disabled and removed (no longer placed here; it answers on {NEW})"
    assert removed in text
    assert text.index(ready_line.group(0)) < text.index(removed)  # the old one stops only after the new one is ready
    assert http_get(NEW, 30001, "/health")[0] == 200
    assert unit_text(OLD, "dflash") is None and unit_state(OLD, "dflash") != "active"
    assert neighbour(NEW) == kept
    key = sealed[0].split(".")[0]
    assert f"kernel cache {key}: seeded from {sealed[0]}" in text, text
    assert kernel_cache_state(NEW, 30001) == "warm"
    assert sealed[0] in sealed_caches(NEW)  # beside the neighbour's own
    assert sealed_caches(OLD) == []  # gone with its unit


def test_migration_with_the_old_host_down_converges_the_new_host():
    assert run("down", ["dflash"], []).returncode == 0
    lab("down", OLD)
    try:
        result = run("down", [], ["dflash"])
        text = output(result)
        # pyinfra drops the host it cannot reach, says so in one line, and goes on; the exit code is 1.
        assert result.returncode == 1, text
        assert f"[{OLD}] SSH error" in text, text
        assert f"--> {OLD}: not reached (connection failed): nothing there changed; the other hosts were deployed." in text
        assert f"--> {NEW}/dflash is ready" in text
        assert http_get(NEW, 30001, "/health")[0] == 200
        # Leaving the dead host out of the run is clean: exit 0, nothing to do.
        limited = run("down", [], ["dflash"], "--limit", NEW)
        assert limited.returncode == 0, output(limited)
    finally:
        lab("up", "--hosts", "gpu-a,gpu-b,gpu-c,gpu-d,gpu-e")
    # Back up, the old host starts its enabled unit at boot; the next run removes it.
    again = run("down", [], ["dflash"])
    assert again.returncode == 0, output(again)
    assert f"[{OLD}] sglang-dflash.service: stopped, disabled and removed (no longer placed here; it answers on {NEW})" in output(again)
    assert unit_text(OLD, "dflash") is None
