"""The status view on the lab (status.py, issue 27): it changes nothing, never waits, and each fault shows in
its row with the right exit code.

SPARE (default gpu-b) runs one service, `st` (GPU 0, port 30500, a model staged in /dev/shm, the plain venv);
OTHER (LAB_STATUS_OTHER, default gpu-d) is placed nothing. The module deploys `st` once, then:

- converged: exit 0, both rows ok; every host's fingerprint (our units and their PIDs, our files under
  /etc/sglang-deploy, /var/lib/sglang-deploy and /dev/shm, the venvs' mtimes, the lock) is the same after, and
  on the control machine only the requested JSON and Prometheus files were written;
- during a deploy held at model staging: the deploy's lock holder (its pid) is shown and the status ends
  while the deploy still holds the lock;
- OTHER cut off (`lab.py cut`): exit 1, its row UNREACHABLE with why, SPARE's row still read;
- SPARE's GPU 0 failed (the stand-in nvidia-smi): exit 1, st UNHEALTHY naming the GPU;
- st stopped: exit 1, st UNHEALTHY, the deploy would start it;
- a file of st's live venv edited: exit 2, st DRIFT naming the distribution.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from tests.lab.labutil import (
    PYINFRA,
    ROOT,
    SPARE,
    clean_host,
    deploy,
    held,
    hold,
    lab,
    release,
    ssh,
    start_deploy,
    wait_until,
    write_inventory,
)

pytestmark = pytest.mark.lab

OTHER = os.environ.get("LAB_STATUS_OTHER", "gpu-d")
UNIT = "sglang-st.service"
PORT = 30500
MODEL = "Qwen3.6-27B"
EDITED = "/root/venv_sglang/lib/python3.11/site-packages/tqdm/std.py"
CACHE = Path(os.environ.get("SGLANG_DEPLOY_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sglang-deploy")
FINGERPRINT = (
    "for u in $(systemctl list-units 'sglang-*' --all --no-legend --plain | cut -d' ' -f1); do "
    "echo \"unit $u $(systemctl show -p ActiveState,SubState,MainPID,NRestarts --value $u | tr '\\n' ' ')\"; done; "
    "ls -1 /etc/systemd/system/ | grep '^sglang-' | sed 's/^/unitfile /'; "
    "find /etc/sglang-deploy /var/lib/sglang-deploy /dev/shm -printf '%p %s %T@ %i %m\\n' 2>/dev/null | sort; "
    "stat -c 'venv %n %Y %Z %i' /root/venv_sglang* /root/venv_sglang.generations/* 2>/dev/null; "
    "ls -la --time-style=full-iso /run | grep sglang-deploy.lock; "
    "cat /run/sglang-deploy.lock/owner.json 2>/dev/null; true"
)


def inventory() -> Path:
    services = {"st": {"gpu": 0, "port": PORT, "model": MODEL, "model_in": "shm"}}
    return write_inventory("test_status", {
        SPARE: {"services": services, "run_services": ["st"]},
        OTHER: {"run_services": []},
    })


def fingerprint(host: str) -> str:
    return ssh(host, FINGERPRINT).stdout


def control_files() -> dict[str, tuple[int, int]]:
    if not CACHE.exists():
        return {}
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in CACHE.rglob("*") if not p.is_symlink()}


def status(tmp_path: Path, timeout: int = 120):
    """Run the status with JSON and Prometheus files; (exit code, rows by (host, service), output, seconds)."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    for f in out.iterdir():
        f.unlink()
    env = {**os.environ, "STATUS_JSON": str(out / "status.json"), "STATUS_PROM": str(out / "sglang.prom"), "STATUS_WIDTH": "200"}
    start = time.monotonic()
    proc = subprocess.run([PYINFRA, str(inventory()), "status.py", "-y"], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)
    elapsed = time.monotonic() - start
    doc = json.loads((out / "status.json").read_text())
    assert doc["exit_code"] == proc.returncode, proc.stdout + proc.stderr
    rows = {(r["host"], r["service"]): r for r in doc["rows"]}
    return proc.returncode, rows, proc.stdout + proc.stderr, elapsed


@pytest.fixture(scope="module")
def placed():
    clean_host(SPARE, keep_venv=True)
    clean_host(OTHER, keep_venv=True)
    result = deploy(inventory())
    assert result.returncode == 0, result
    yield
    lab("gpus", SPARE, "--reset")
    clean_host(SPARE, keep_venv=True)
    clean_host(OTHER, keep_venv=True)


def health_ok() -> bool:
    script = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{PORT}/health', timeout=5).status)"
    return ssh(SPARE, f"python3 -c {shlex.quote(script)}", check=False).stdout.strip() == "200"


def test_converged_changes_nothing_anywhere(placed, tmp_path):
    before = {h: fingerprint(h) for h in (SPARE, OTHER)}
    files_before = control_files()
    code, rows, output, _ = status(tmp_path)
    assert code == 0, output
    st, other = rows[(SPARE, "st")], rows[(OTHER, None)]
    assert st["status"] == "ok" and other["status"] == "ok", output
    assert st["unit"]["active"] == "active" and st["pid"] and st["health"]["status"] == 200
    assert st["health"]["latency_ms"] is not None
    assert st["models"][0] == {"name": MODEL, "location": "shm", "verified": True, "why": None}
    assert st["generation"]["live"] == st["generation"]["wanted"]
    assert st["gpus"][0]["index"] == 0 and st["gpus"][0]["healthy"]
    assert st["lock"] is None and st["changes"] == []
    assert "HOST" in output and "exit code 0" in output
    prom = (tmp_path / "out" / "sglang.prom").read_text()
    assert f'sglang_deploy_service_up{{host="{SPARE}",service="st",port="{PORT}"}} 1' in prom
    assert f'sglang_deploy_service_drift{{host="{SPARE}",service="st",port="{PORT}"}} 0' in prom
    # Nothing changed on any host, nothing written on the control machine but the files asked for.
    assert {h: fingerprint(h) for h in (SPARE, OTHER)} == before
    assert control_files() == files_before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sglang.prom", "status.json"]


def test_during_a_deploy_the_lock_is_shown_not_waited_for(placed, tmp_path):
    log = tmp_path / "deploy.log"
    ssh(SPARE, f"rm -rf /dev/shm/{MODEL}")  # the deploy stages it again, and is held there by the test hook
    hold(SPARE, "staging", MODEL)
    proc = start_deploy(inventory(), log)
    try:
        held(SPARE, "staging", proc, log)
        code, rows, output, elapsed = status(tmp_path)
        assert proc.poll() is None, "the deploy ended before the status did"
        st = rows[(SPARE, "st")]
        assert st["lock"] is not None and st["lock"]["pid"] == proc.pid, output
        assert rows[(OTHER, None)]["lock"]["pid"] == proc.pid  # the deploy holds both hosts' locks
        assert f"pid {proc.pid}" in output
        assert any(MODEL in c for c in st["changes"]), st["changes"]
        assert code == 2, output  # the service still answers: drift, not unhealthy
        assert elapsed < 60
    finally:
        release(SPARE, "staging")
        proc.wait(timeout=600)
    assert proc.returncode == 0, log.read_text()[-3000:]


def test_a_host_cut_off_is_unreachable_and_the_others_are_read(placed, tmp_path):
    lab("cut", OTHER)
    try:
        code, rows, output, elapsed = status(tmp_path)
    finally:
        lab("restore", OTHER)
    assert code == 1, output
    other = rows[(OTHER, None)]
    assert other["status"] == "UNREACHABLE" and other["unreachable"], other
    assert rows[(SPARE, "st")]["status"] == "ok"
    assert f"! {OTHER}: not reached: " in output
    prom = (tmp_path / "out" / "sglang.prom").read_text()
    assert f'sglang_deploy_host_up{{host="{OTHER}"}} 0' in prom


def test_a_failed_gpu_shows_in_its_services_row(placed, tmp_path):
    lab("gpus", SPARE, "--fail", "0")
    try:
        code, rows, output, _ = status(tmp_path)
    finally:
        lab("gpus", SPARE, "--reset")
    assert code == 1, output
    st = rows[(SPARE, "st")]
    assert st["status"] == "UNHEALTHY"
    assert not st["gpus"][0]["healthy"] and any("GPU 0" in p for p in st["problems"]), st
    assert any(c["step"] == "GPU check" and c["action"] == "refuse" for c in st["plan"]), st["plan"]


def test_a_stopped_service_is_unhealthy_and_would_be_started(placed, tmp_path):
    ssh(SPARE, f"systemctl stop {UNIT}")
    try:
        code, rows, output, _ = status(tmp_path)
    finally:
        ssh(SPARE, f"systemctl start {UNIT}")
        wait_until(health_ok, 120, interval=1, what="st answers /health again")
    assert code == 1, output
    st = rows[(SPARE, "st")]
    assert st["status"] == "UNHEALTHY" and st["unit"]["active"] in ("inactive", "failed"), st
    assert any(c["action"] == "start" and c["what"] == UNIT for c in st["plan"]), st["plan"]
    assert st["health"]["status"] is None


def test_an_edited_venv_file_is_drift_naming_the_distribution(placed, tmp_path):
    ssh(SPARE, f"cp -p {EDITED} /root/status-test-saved && echo '# edited' >> {EDITED}")
    try:
        code, rows, output, _ = status(tmp_path)
    finally:
        # The same bytes back (mtime new: the fast check hashes it, and it matches RECORD again).
        ssh(SPARE, f"cp /root/status-test-saved {EDITED} && rm -f /root/status-test-saved")
    assert code == 2, output
    st = rows[(SPARE, "st")]
    assert st["status"] == "DRIFT"
    assert any(c["step"] == "Environments" and c["why"].startswith("tqdm ") and "tqdm/std.py" in c["why"]
               for c in st["plan"]), st["plan"]
    assert any(c["action"] == "restart" and c["what"] == UNIT for c in st["plan"]), st["plan"]
    again, _, output, _ = status(tmp_path)
    assert again == 0, output
