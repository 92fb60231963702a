"""One deploy at a time per host: a second one waits, then names the holder; a killed one's lock is taken over."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.lab.labutil import PYINFRA, ROOT, SPARE, clean_host, deploy, ssh, write_inventory

pytestmark = pytest.mark.lab

SLOW = {"slow": {"gpu": 0, "port": 30120, "model": "Qwen3.6-27B-DFlash", "model_in": "store", "env": {"STANDIN_NEVER_READY": 1}}}


def start_slow_deploy() -> subprocess.Popen:
    inventory = write_inventory("test_lock_slow", {SPARE: {"services": SLOW, "run_services": ["slow"], "readiness_timeout_s": 40}})
    proc = subprocess.Popen([PYINFRA, str(inventory), "deploy.py", "-y"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while ssh(SPARE, "test -d /run/sglang-deploy.lock && echo held || echo free").stdout.strip() != "held":
        assert time.monotonic() < deadline and proc.poll() is None, "the first deploy never took the lock"
        time.sleep(0.5)
    return proc


def test_a_second_deploy_waits_then_names_the_holder():
    clean_host(SPARE)
    first = start_slow_deploy()
    try:
        inventory = write_inventory("test_lock_second", {SPARE: {"run_services": [], "lock_wait_s": 3}})
        start = time.monotonic()
        result = deploy(inventory)
        assert result.returncode != 0
        assert f"{SPARE}: another deploy holds the host's lock: root@" in result.stderr
        assert f"(pid {first.pid})" in result.stderr and "waited 3 s" in result.stderr
        assert time.monotonic() - start < 60
    finally:
        first.wait(timeout=300)
    assert ssh(SPARE, "test -d /run/sglang-deploy.lock && echo held || echo free").stdout.strip() == "free"
    clean_host(SPARE)


def test_the_lock_of_a_killed_deploy_is_taken_over():
    clean_host(SPARE)
    first = start_slow_deploy()
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert ssh(SPARE, "test -d /run/sglang-deploy.lock && echo held || echo free").stdout.strip() == "held"
    inventory = write_inventory("test_lock_after_kill", {SPARE: {"run_services": [], "lock_wait_s": 3}})
    result = deploy(inventory, as_json=False)
    assert result.returncode == 0, result
    assert "is stale: taking it over" in result.stdout + result.stderr
    assert ssh(SPARE, "test -d /run/sglang-deploy.lock && echo held || echo free").stdout.strip() == "free"
    clean_host(SPARE)
