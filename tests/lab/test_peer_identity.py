"""Peer identity on a real lab host: another local user binds a service's port before the engine does.

The engine opens its port only after loading (minutes for a real model), so any local user can bind it first and
answer /health 200. Before, the readiness gate passed on that answer and sent the smoke completion, the service's
API key in its header, to that user; the status view showed the service healthy. Now every request is sent only
once the server end of its connection is a socket a process of the unit's own cgroup holds: the gate fails naming
the holder, nothing reaches it, the status view says who holds the port; once it is gone, the deploy serves. Seen failing without the mechanism: the impostor's journal held
`HEARD POST /v1/chat/completions Bearer <the key>`.

The impostor is a real unprivileged user's HTTP server (its own transient unit, `systemd-run -p User=`), which
logs every request it gets to its journal. Runs on the spare host, cleaned before and after.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.lab.labutil import (
    PYINFRA,
    ROOT,
    deploy,
    health_inside,
    impostor_source,
    ssh,
    write_inventory,
)

pytestmark = pytest.mark.lab

PORT = 30150
KEY_NAME = "peer-key"
KEY = "lab-peer-identity-key-7f3a9c1e"  # a test value
SERVICE = {"gpu": 0, "port": PORT, "model": "Qwen3.6-27B-DFlash", "model_in": "shm", "api_key_secret": KEY_NAME}
UNIT = "sglang-peer.service"
SQUATTER = "squatter"
IMPOSTOR_UNIT = f"lab-impostor-{os.getpid()}.service"  # its journal holds only what this test's impostor heard
IMPOSTOR = impostor_source(PORT)


@pytest.fixture
def host(spare_with_venv):
    ssh(spare_with_venv, f"id {SQUATTER} >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin {SQUATTER}")
    yield spare_with_venv
    ssh(spare_with_venv, f"systemctl stop {IMPOSTOR_UNIT} 2>/dev/null; rm -f /var/tmp/lab-impostor.py; userdel {SQUATTER}; true", check=False)


def impostor_heard(host: str) -> list[str]:
    journal = ssh(host, f"journalctl -u {IMPOSTOR_UNIT} --no-pager -o cat").stdout
    return [line for line in journal.splitlines() if line.startswith("HEARD")]


def status_rows(inventory: Path, tmp_path: Path) -> dict:
    out = tmp_path / "status.json"
    env = {**os.environ, "STATUS_JSON": str(out), "STATUS_WIDTH": "200", f"SGLANG_DEPLOY_SECRET_{KEY_NAME.upper().replace('-', '_')}": KEY}
    subprocess.run([PYINFRA, str(inventory), "status.py", "-y"], cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    return {r["service"]: r for r in json.loads(out.read_text())["rows"]}


def test_a_port_held_by_another_user_gets_no_request_and_is_named(host, tmp_path):
    inventory = write_inventory("test_peer_identity", {host: {"services": {"peer": SERVICE}, "run_services": ["peer"]}})
    env = {f"SGLANG_DEPLOY_SECRET_{KEY_NAME.upper().replace('-', '_')}": KEY}
    uid = ssh(host, f"id -u {SQUATTER}").stdout.strip()
    ssh(host, f"printf %s {shlex.quote(IMPOSTOR)} > /var/tmp/lab-impostor.py && chmod 644 /var/tmp/lab-impostor.py")
    ssh(host, f"systemd-run --quiet --unit {IMPOSTOR_UNIT} -p User={SQUATTER} /usr/bin/python3 /var/tmp/lab-impostor.py")
    ssh(host, f"for i in $(seq 50); do ss -ltn 'sport = :{PORT}' | grep -q LISTEN && exit 0; sleep 0.1; done; exit 1")
    assert health_inside(host, PORT) == 200  # what the gate and the status view took for the service before
    probed = impostor_heard(host)
    assert probed == ["HEARD GET /health None"]  # the test's own question: the impostor logs what it hears

    failed = deploy(inventory, env=env, as_json=False)
    said = failed.stdout + failed.stderr
    assert failed.returncode != 0, failed
    assert f"port {PORT} is held by uid {uid} ({SQUATTER})" in said and f"not by {UNIT}" in said, said[-3000:]
    assert impostor_heard(host) == probed, "a request of the deploy reached the other user's process"
    assert KEY not in said

    row = status_rows(inventory, tmp_path)["peer"]
    assert f"port {PORT} is held by uid {uid} ({SQUATTER})" in json.dumps(row), row
    assert impostor_heard(host) == probed

    ssh(host, f"systemctl stop {IMPOSTOR_UNIT}")
    served = deploy(inventory, env=env)
    assert served.returncode == 0, served
    assert health_inside(host, PORT) == 200
    assert status_rows(inventory, tmp_path)["peer"]["health"]["status"] == 200
