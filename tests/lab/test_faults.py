"""Faults mid-deploy: the network cut during staging and during an install, the deploy killed, the host rebooted.

Each time the next run converges, a further run reports no changes, and nothing is lost: the model store's
source copy is unchanged, nothing half-written in the shm dir looks complete (a staged copy verifies, with a
full re-hash, or is absent), and the service that ran before the fault answers /health until its replacement is
ready (polled from inside the host's network namespace while its network is cut).

Runs on LAB_FAULTS_HOST (default gpu-e) only, with one service `flt` placed there. Each test brings the host to
the state it starts from itself (`serving(...)`), so any one runs alone or in any order. The moment of each fault
is made certain by a test hook that holds the deploy at a known point (`labutil.hold`): staging is held by
stage_model.py once its `.flt-big.partial` exists and before it copies (see the script's header), the install by
a wrapper put in front of the host's uv for the test. The test waits until the host reports the step held, checks
the deploy still runs, and only then cuts, kills or reboots; the hold is released after the fault.
A generated model `flt-big` (1 GiB in 8 files) in the host's store is what gets staged. Network cuts are
`lab.py cut --kill-connections` (the veth down, and this machine's TCP connections to the host aborted, as a cut
longer than TCP's retransmission timeout ends), then `lab.py restore`.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from operations.model import models
from tests.lab.labutil import (
    HOOKS,
    ROOT,
    clean_host,
    deploy,
    health_inside,
    held,
    hold,
    http_get,
    lab,
    lab_hosts,
    main_pid,
    release,
    ssh,
    start_deploy,
    wait_until,
    write_inventory,
)

pytestmark = pytest.mark.lab

HOST = os.environ.get("LAB_FAULTS_HOST", "gpu-e")
PORT = 30300
UNIT = "sglang-flt.service"
STORE = "/root/models"
SHM = "/dev/shm"
VENV = "/root/venv_sglang"
NEW_VENV = "/root/venv_flt"
SMALL = "Qwen3.6-27B"
BIG = "flt-big"
BIG_FILES = [f"model-{i:05d}-of-00008.safetensors" for i in range(1, 9)]  # 128 MiB each
LOGS = ROOT / "lab" / "state" / "test_faults"
# Distributions the fresh venv must hold after the interrupted install is finished by the next run.
DISTS = ("tqdm", "pygments")


def inventory(model: str, venv_path: str = VENV, **env) -> Path:
    flt = {"gpu": 0, "port": PORT, "model": model, "model_in": "shm", "env": env}
    data = {"services": {"flt": flt}, "run_services": ["flt"], "readiness_timeout_s": 90, "lock_wait_s": 30, "venv_path": venv_path}
    return write_inventory("test_faults", {HOST: data})


def host_ssh(command: str, timeout: int = 120) -> str:
    return ssh(HOST, command, timeout=timeout).stdout


def source_digest(model: str) -> str:
    """Listing and content of a model's source in the store (our manifest cache left out)."""
    return host_ssh(f"cd {STORE}/{model} && find . -type f ! -name '.sglang-deploy-*' | sort | xargs sha256sum", timeout=300)


def rewrite(model: str, names: list[str], mib: int = 128) -> None:
    """A new version of some of a model's files arrives in the store."""
    cmds = [f"head -c {mib << 20} /dev/urandom > {STORE}/{model}/{n}.new && mv {STORE}/{model}/{n}.new {STORE}/{model}/{n}" for n in names]
    host_ssh(" && ".join(cmds), timeout=300)


def staged_state(model: str) -> str | None:
    """Why /dev/shm/<model> is not a verified copy of the store (full re-hash), or None if it is."""
    state = json.loads(host_ssh(models.StagedModel().command(f"{STORE}/{model}", f"{SHM}/{model}", "full"), timeout=300))
    return models.drift(state)


def nothing_half_written() -> None:
    """Every directory in the shm dir that looks complete (no leading dot) verifies; temp files only in temp dirs."""
    for entry in host_ssh(f"ls -A {SHM}").split():
        if not entry.startswith("."):
            assert staged_state(entry) is None, f"{SHM}/{entry} looks complete but does not verify: {staged_state(entry)}"
    stray = host_ssh(f"find {SHM} -name '*.sglang-part' ! -path '{SHM}/.*.partial/*'").strip()
    assert not stray, f"half-written files outside a temp dir: {stray}"


def stage_running(model: str) -> bool:
    return bool(host_ssh(f"pgrep -f '[p]ython3 - {STORE}/{model} ' || true").strip())


def staged_marker_sha(model: str) -> str:
    """The staged copy's marker (what the service was started on), or "" when there is none."""
    return host_ssh(f"sha256sum < {SHM}/{model}/{models.MARKER} 2>/dev/null || true").strip()


def serving(model: str) -> None:
    """The state a test starts from: `flt` runs `model` from the shm dir, the usual venv, the network up, no hold."""
    if lab_hosts()[HOST].get("cut"):
        lab("restore", HOST)
    release(HOST, "staging")
    release(HOST, "install")
    result = deploy(inventory(model))
    assert result.returncode == 0, result
    assert health() == 200 and model_path() == f"{SHM}/{model}"


def health() -> int | None:
    try:
        return http_get(HOST, PORT, "/health")[0]
    except (AssertionError, subprocess.TimeoutExpired):
        return None


def model_path() -> str:
    return json.loads(http_get(HOST, PORT, "/server_info")[1])["model_path"]


def started_at() -> int:
    """When the service's current process started (unix seconds, the host's clock)."""
    return int(host_ssh(f"systemctl show --timestamp=unix -p ExecMainStartTimestamp --value {UNIT}").strip().lstrip("@"))


def finish(proc: subprocess.Popen, log: Path, timeout: int = 300) -> int:
    """The background deploy's exit status; a deploy that hangs is killed and fails the test.

    A deploy that lost its host ends with pyinfra's own error line, not a traceback from our code.
    """
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the deploy did not end within {timeout} s after the fault; its output:\n{log.read_text()[-3000:]}")
    # pyinfra itself may print a connector traceback when the host vanishes under a fact read;
    # none may come from this project's code (the lock, the operations).
    text = log.read_text()
    ours = [line for line in text.splitlines() if line.strip().startswith("File ") and "/site-packages/" not in line]
    assert not ours, text[-4000:]
    return rc


def converges(inv: Path, model: str) -> None:
    """The run after a fault succeeds and serves `model` from the shm dir; the one after it changes nothing."""
    again = deploy(inv)
    assert again.returncode == 0, again
    assert health() == 200
    assert model_path() == f"{SHM}/{model}"
    assert staged_state(model) is None
    noop = deploy(inv)
    if noop.returncode != 0 or noop.changed:
        # Say why: the same run once more, with its operations' own log lines (what differed).
        again = deploy(inv, "-v", as_json=False)
        raise AssertionError(f"the run after convergence changed {noop.changed} (rc {noop.returncode});"
                             f" once more, verbose:\n{again.stdout[-6000:]}{again.stderr[-6000:]}")


def still_serving(pid: int, seconds: float = 4, inside: bool = False) -> None:
    """The service that ran before the fault keeps answering (same process): polled for a few seconds."""
    end = time.monotonic() + seconds
    while True:
        status = health_inside(HOST, PORT) if inside else health()
        assert status == 200, f"the running service stopped answering /health during the fault ({status})"
        if time.monotonic() > end:
            break
        time.sleep(1)
    if not inside:
        assert main_pid(HOST, UNIT) == pid, "the running service was restarted by a deploy that did not finish"


@pytest.fixture(scope="module", autouse=True)
def faults_host():
    if lab_hosts()[HOST].get("cut"):
        lab("restore", HOST)
    LOGS.mkdir(parents=True, exist_ok=True)
    clean_host(HOST)
    ssh(HOST, f"rm -rf {STORE}/flt-* {NEW_VENV} {NEW_VENV}.generations && mkdir -p {STORE}/{BIG} && cp {STORE}/{SMALL}/config.json {STORE}/{BIG}/")
    rewrite(BIG, BIG_FILES)
    yield
    if lab_hosts()[HOST].get("cut"):
        lab("restore", HOST)
    ssh(HOST, f"rm -rf {HOOKS}", check=False)
    clean_host(HOST)
    ssh(HOST, f"rm -rf {STORE}/flt-* {NEW_VENV} {NEW_VENV}.generations", check=False)


@pytest.fixture
def holds():
    """The hooks are released whatever the test's outcome (a held step would otherwise wait out its limit)."""
    yield
    if lab_hosts()[HOST].get("cut"):
        lab("restore", HOST)
    release(HOST, "staging")
    release(HOST, "install")


def test_network_cut_during_staging(holds):
    serving(SMALL)
    inv = inventory(BIG)
    sources = source_digest(SMALL), source_digest(BIG)
    pid = main_pid(HOST, UNIT)
    log = LOGS / "cut_staging.log"
    hold(HOST, "staging", BIG)
    proc = start_deploy(inv, log)
    stager = held(HOST, "staging", proc, log)
    assert host_ssh(f"test -d {SHM}/.{BIG}.partial && test ! -e {SHM}/{BIG} && echo inside").strip() == "inside"
    lab("cut", HOST, "--kill-connections")
    try:
        still_serving(pid, inside=True)
        rc = finish(proc, log)
        assert rc != 0, f"the deploy cannot have succeeded without its host:\n{log.read_text()[-3000:]}"
        still_serving(pid, seconds=2, inside=True)
    finally:
        lab("restore", HOST)
    still_serving(pid, seconds=1)
    # The fault landed inside staging: the copy had not begun and no staged flt-big existed when the network went.
    assert host_ssh(f"test ! -e {SHM}/{BIG} && echo absent").strip() == "absent"
    release(HOST, "staging")
    # The staging the deploy started runs on (it was not its connection that held it); then nothing half-written.
    wait_until(lambda: not stage_running(BIG), 300, interval=1, what=f"the interrupted staging (pid {stager}) ending on the host")
    nothing_half_written()
    converges(inv, BIG)
    assert (source_digest(SMALL), source_digest(BIG)) == sources
    assert host_ssh(f"ls -A {SHM}").split() == [BIG], "the replaced service's model is released"


UV_HOLD = """#!/bin/sh
# Written by tests/lab/test_faults.py (a test hook, removed after the test): holds `uv pip install` into the
# venv that {hooks}/hold-install names, until that file is removed (at most 600 s); then runs the real uv.
hold={hooks}/hold-install
case "$*" in
  *"pip install"*)
    if [ -f "$hold" ] && [ -n "$(cat "$hold")" ] && case "$*" in *"$(cat "$hold")"*) true;; *) false;; esac; then
      echo "uv $$" > {hooks}/reached-install.tmp && mv {hooks}/reached-install.tmp {hooks}/reached-install
      n=0; while [ -f "$hold" ] && [ $n -lt 6000 ]; do sleep 0.1; n=$((n+1)); done
    fi;;
esac
exec "$0.real" "$@"
"""


@pytest.fixture
def uv_held():
    """The host's uv behind a wrapper that can hold an install (put back afterwards)."""
    from configuration import settings
    from operations.environment import installer

    uv = installer.uv_binary(settings.GLOBAL_KEYS["host_wheel_cache"].default)
    assert host_ssh(f"test -x {uv} && echo ok").strip() == "ok", f"{uv} missing: the deploy installs with uv on the lab"
    host_ssh(f"test -e {uv}.real || mv {uv} {uv}.real; cat > {uv} <<'EOF'\n{UV_HOLD.format(hooks=HOOKS)}EOF\nchmod 755 {uv}")
    yield
    release(HOST, "install")
    ssh(HOST, f"test -e {uv}.real && mv -f {uv}.real {uv}; true", check=False)


def test_network_cut_during_an_install(holds, uv_held):
    """The service moves to a new venv (a fresh environment: every wheel installed); the network goes mid-install."""
    serving(BIG)
    inv = inventory(BIG, venv_path=NEW_VENV)
    host_ssh(f"rm -rf {NEW_VENV} {NEW_VENV}.generations")
    pid = main_pid(HOST, UNIT)
    log = LOGS / "cut_install.log"
    hold(HOST, "install", f"{NEW_VENV}.generations/")
    proc = start_deploy(inv, log)
    installer = held(HOST, "install", proc, log)
    # Inside the install: the generation exists, nothing of the stack is in it yet, the live link not made.
    assert host_ssh(f"ls {NEW_VENV}.generations/*/lib/python3*/site-packages | grep -c -i '^tqdm' || true").strip() == "0"
    assert host_ssh(f"test ! -e {NEW_VENV} && echo unswitched").strip() == "unswitched"
    lab("cut", HOST, "--kill-connections")
    try:
        still_serving(pid, inside=True)
        rc = finish(proc, log)
        assert rc != 0, f"the deploy cannot have succeeded without its host:\n{log.read_text()[-3000:]}"
    finally:
        lab("restore", HOST)
    still_serving(pid, seconds=1)
    release(HOST, "install")
    wait_until(lambda: host_ssh(f"kill -0 {installer} 2>/dev/null || echo gone").strip() == "gone", 300, interval=1,
               what="the interrupted install ending on the host")
    # The unit still runs the old venv (its generation: units name theirs): nothing was switched or restarted under it.
    unit = host_ssh(f"cat /etc/systemd/system/{UNIT}")
    assert f"ExecStart={VENV}.generations/" in unit and NEW_VENV not in unit, unit
    converges(inv, BIG)
    script = f"import importlib.metadata as m; print(*(m.version(d) for d in {DISTS!r}))"
    versions = host_ssh(f"{NEW_VENV}/bin/python -c {shlex.quote(script)}")
    assert len(versions.split()) == len(DISTS), versions
    converges(inventory(BIG), BIG)  # back to the usual venv
    host_ssh(f"rm -rf {NEW_VENV} {NEW_VENV}.generations")


def test_deploy_killed_during_staging(holds):
    """A new version of the model arrives in the store; the deploy staging it is killed (SIGKILL) mid-staging.

    The next run serves the new version: the service is restarted on the copy staged after the kill.
    """
    serving(BIG)
    inv = inventory(BIG)
    before = staged_marker_sha(BIG)
    rewrite(BIG, BIG_FILES[:3])
    sources = source_digest(BIG)
    pid = main_pid(HOST, UNIT)
    log = LOGS / "kill.log"
    hold(HOST, "staging", BIG)
    proc = start_deploy(inv, log)
    stager = held(HOST, "staging", proc, log)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # The kill landed inside staging: the old copy is still the staged one, the new one half-built beside it.
    assert staged_marker_sha(BIG) == before
    assert host_ssh(f"test -d {SHM}/.{BIG}.partial && echo partial").strip() == "partial"
    still_serving(pid)
    # The lock of the killed deploy is still there, and taken over by the next run (same control machine).
    assert host_ssh("test -d /run/sglang-deploy.lock && echo held || echo free").strip() == "held"
    release(HOST, "staging")
    wait_until(lambda: not stage_running(BIG), 300, interval=1, what=f"the interrupted staging (pid {stager}) ending on the host")
    nothing_half_written()
    converges(inv, BIG)
    assert source_digest(BIG) == sources
    marker_mtime = int(host_ssh(f"stat -c %Y {SHM}/{BIG}/{models.MARKER}").strip())
    assert staged_marker_sha(BIG) != before, "the new version was staged"
    assert main_pid(HOST, UNIT) != pid and started_at() >= marker_mtime, (
        f"{UNIT} started at {started_at()}, before its model's staged copy was replaced at {marker_mtime}")


def test_reboot_during_staging(holds):
    """The host reboots while the deploy stages a new version of the model; the boot unit stages it again."""
    serving(BIG)
    inv = inventory(BIG)
    before = staged_marker_sha(BIG)
    rewrite(BIG, BIG_FILES[3:6])
    sources = source_digest(BIG)
    log = LOGS / "reboot.log"
    hold(HOST, "staging", BIG)
    proc = start_deploy(inv, log)
    held(HOST, "staging", proc, log)
    assert staged_marker_sha(BIG) == before  # the reboot lands before the new copy replaces the old
    boots = lab_hosts()[HOST].get("boots")
    lab("reboot", HOST)
    assert lab_hosts()[HOST].get("boots") != boots
    rc = finish(proc, log)
    assert rc != 0, f"the deploy cannot have succeeded across the reboot:\n{log.read_text()[-3000:]}"
    # /run is emptied at boot: the hold is gone with it, so the boot unit is never held.
    assert host_ssh(f"test -e {HOOKS} && echo left || echo gone").strip() == "gone"
    # Without a deploy: the boot unit stages the store's copy, the service starts after it.
    wait_until(lambda: health() == 200, 300, interval=2, what=f"{UNIT} answering /health after the reboot")
    journal = host_ssh(f"journalctl -b -u {models.BOOT_UNIT} --no-pager | tail -5")
    assert f"{BIG}: staged" in journal, journal
    nothing_half_written()
    converges(inv, BIG)
    assert source_digest(BIG) == sources
    assert staged_marker_sha(BIG) != before
    assert started_at() >= int(host_ssh(f"stat -c %Y {SHM}/{BIG}/{models.MARKER}").strip())
    assert not lab_hosts()[HOST].get("cut")
    assert shlex.split(host_ssh(f"ls -A {SHM}")) == [BIG]
