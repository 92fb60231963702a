"""Faults mid-deploy: the network cut during staging and during an install, the deploy killed, the host rebooted.

Each time the next run converges, a further run reports no changes, and nothing is lost: the model store's
source copy is unchanged, nothing half-written in the shm dir looks complete (a staged copy verifies, with a
full re-hash, or is absent), and the service that ran before the fault answers /health until its replacement is
ready (polled from inside the host's network namespace while its network is cut).

Runs on LAB_FAULTS_HOST (default gpu-e) only, with one service `flt` placed there; the tests run in order and
share that host. A generated model `flt-big` (1 GiB in 8 files) in the host's store makes staging take long
enough to be interrupted. Network cuts are `lab.py cut --kill-connections` (the veth down, and this machine's TCP
connections to the host aborted, as a cut longer than TCP's retransmission timeout ends), then `lab.py restore`.
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

from operations import models
from tests.lab.labutil import (
    ROOT,
    clean_host,
    deploy,
    health_inside,
    http_get,
    lab,
    lab_hosts,
    main_pid,
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
# Removed from the venv by hand to force an install while the service runs (several files each, so
# the install lasts long enough to be caught).
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


def staging_begun(model: str) -> bool:
    return host_ssh(f"test -d {SHM}/.{model}.partial && echo yes || true").strip() == "yes"


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
    assert noop.returncode == 0 and noop.changed == [], noop


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
    ssh(HOST, f"rm -rf {STORE}/flt-* && mkdir -p {STORE}/{BIG} && cp {STORE}/{SMALL}/config.json {STORE}/{BIG}/")
    rewrite(BIG, BIG_FILES)
    first = deploy(inventory(SMALL))
    assert first.returncode == 0, first
    assert health() == 200
    yield
    if lab_hosts()[HOST].get("cut"):
        lab("restore", HOST)
    clean_host(HOST)
    ssh(HOST, f"rm -rf {STORE}/flt-*", check=False)


def test_network_cut_during_staging():
    inv = inventory(BIG)
    sources = source_digest(SMALL), source_digest(BIG)
    pid = main_pid(HOST, UNIT)
    log = LOGS / "cut_staging.log"
    proc = start_deploy(inv, log)
    wait_until(lambda: proc.poll() is not None or staging_begun(BIG), 300, what="staging of flt-big")
    assert proc.poll() is None, f"the deploy ended before staging could be cut:\n{log.read_text()[-3000:]}"
    lab("cut", HOST, "--kill-connections")
    try:
        still_serving(pid, inside=True)
        rc = finish(proc, log)
        assert rc != 0, f"the deploy cannot have succeeded without its host:\n{log.read_text()[-3000:]}"
        still_serving(pid, seconds=2, inside=True)
    finally:
        lab("restore", HOST)
    still_serving(pid, seconds=1)
    # The staging the deploy started runs on (it was not its connection that held it); then nothing half-written.
    wait_until(lambda: not stage_running(BIG), 300, interval=1, what="the interrupted staging ending on the host")
    nothing_half_written()
    converges(inv, BIG)
    assert (source_digest(SMALL), source_digest(BIG)) == sources
    assert host_ssh(f"ls -A {SHM}").split() == [BIG], "the replaced service's model is released"


def test_network_cut_during_an_install():
    """The service moves to a new venv (a fresh environment: every wheel installed); the network goes mid-install."""
    inv = inventory(BIG, venv_path=NEW_VENV)
    host_ssh(f"rm -rf {NEW_VENV} {NEW_VENV}.generations")
    pid = main_pid(HOST, UNIT)
    log = LOGS / "cut_install.log"
    proc = start_deploy(inv, log)
    # An installer at work, or a venv being created: the environment is built beside the live one.
    installing = "pgrep -f '[u]v [p]ip install|[p]ip.* install|[-]m venv ' >/dev/null && echo yes || true"
    wait_until(lambda: proc.poll() is not None or host_ssh(installing).strip() == "yes", 300, interval=0.1, what="the install")
    assert proc.poll() is None, f"the deploy ended before the install could be cut:\n{log.read_text()[-3000:]}"
    lab("cut", HOST, "--kill-connections")
    try:
        still_serving(pid, inside=True)
        rc = finish(proc, log)
        assert rc != 0, f"the deploy cannot have succeeded without its host:\n{log.read_text()[-3000:]}"
    finally:
        lab("restore", HOST)
    still_serving(pid, seconds=1)
    wait_until(lambda: not host_ssh(installing).strip(), 300, interval=1, what="the interrupted install ending on the host")
    # The unit still runs the old venv: nothing was switched or restarted under it.
    assert f"{VENV}/bin/python" in host_ssh(f"cat /etc/systemd/system/{UNIT}")
    converges(inv, BIG)
    script = f"import importlib.metadata as m; print(*(m.version(d) for d in {DISTS!r}))"
    versions = host_ssh(f"{NEW_VENV}/bin/python -c {shlex.quote(script)}")
    assert len(versions.split()) == len(DISTS), versions
    converges(inventory(BIG), BIG)  # back to the usual venv for the tests after this one
    host_ssh(f"rm -rf {NEW_VENV} {NEW_VENV}.generations")


# Filled by the kill test for the check after it.
KILLED: dict = {}


def test_deploy_killed_during_staging():
    """A new version of the model arrives in the store; the deploy staging it is killed (SIGKILL) mid-copy."""
    inv = inventory(BIG)
    rewrite(BIG, BIG_FILES[:3])
    sources = source_digest(BIG)
    pid = main_pid(HOST, UNIT)
    log = LOGS / "kill.log"
    proc = start_deploy(inv, log)
    # The copy itself takes well under a second here: catch the operation's start in the deploy's
    # own output (read locally, fast), then the copy on the host if it shows in time.
    wait_until(lambda: proc.poll() is not None or f"Model {BIG} staged in" in log.read_text(), 300, interval=0.01, what="the staging operation")
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and proc.poll() is None and not staging_begun(BIG):
        pass
    assert proc.poll() is None, f"the deploy ended before staging could be interrupted:\n{log.read_text()[-3000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    still_serving(pid)
    # The lock of the killed deploy is still there, and taken over by the next run (same control machine).
    assert host_ssh("test -d /run/sglang-deploy.lock && echo held || echo free").strip() == "held"
    wait_until(lambda: not stage_running(BIG), 300, interval=1, what="the interrupted staging ending on the host")
    nothing_half_written()
    converges(inv, BIG)
    assert source_digest(BIG) == sources
    KILLED["marker_mtime"] = int(host_ssh(f"stat -c %Y {SHM}/{BIG}/{models.MARKER}").strip())
    KILLED["started"] = started_at()
    (LOGS / "kill.evidence").write_text(f"{UNIT} started {KILLED['started']}, staged marker written {KILLED['marker_mtime']}\n")


def test_after_a_killed_deploy_the_service_runs_the_model_it_staged():
    if not KILLED:
        pytest.skip("needs test_deploy_killed_during_staging to have passed")
    assert KILLED["started"] >= KILLED["marker_mtime"], (
        f"{UNIT} started at {KILLED['started']}, before its model's staged copy was replaced at {KILLED['marker_mtime']}")


def test_reboot_during_staging():
    """The host reboots while the deploy stages a new version of the model; the boot unit stages it again."""
    inv = inventory(BIG)
    rewrite(BIG, BIG_FILES[3:6])
    sources = source_digest(BIG)
    log = LOGS / "reboot.log"
    proc = start_deploy(inv, log)
    wait_until(lambda: proc.poll() is not None or staging_begun(BIG), 300, what="staging of the new flt-big")
    assert proc.poll() is None, f"the deploy ended before the reboot:\n{log.read_text()[-3000:]}"
    boots = lab_hosts()[HOST].get("boots")
    lab("reboot", HOST)
    assert lab_hosts()[HOST].get("boots") != boots
    rc = finish(proc, log)
    assert rc != 0, f"the deploy cannot have succeeded across the reboot:\n{log.read_text()[-3000:]}"
    # Without a deploy: the boot unit stages the store's copy, the service starts after it.
    wait_until(lambda: health() == 200, 300, interval=2, what=f"{UNIT} answering /health after the reboot")
    journal = host_ssh(f"journalctl -b -u {models.BOOT_UNIT} --no-pager | tail -5")
    assert f"{BIG}: staged" in journal, journal
    nothing_half_written()
    converges(inv, BIG)
    assert source_digest(BIG) == sources
    assert started_at() >= int(host_ssh(f"stat -c %Y {SHM}/{BIG}/{models.MARKER}").strip())


def test_the_host_is_left_converged():
    """After all the faults: one more run changes nothing, and the network is plugged in."""
    assert not lab_hosts()[HOST].get("cut")
    result = deploy(inventory(BIG))
    assert result.returncode == 0 and result.changed == [], result
    assert shlex.split(host_ssh(f"ls -A {SHM}")) == [BIG]
