"""Least privilege on the lab: the service runs as the unprivileged `sglang` user in a systemd sandbox, and as root when the data says so.

Uses gpu-c only (other modules use gpu-a, gpu-b, gpu-d and gpu-e).
"""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.lab.labutil import clean_host, deploy, http_get, main_pid, ssh, write_inventory

pytestmark = pytest.mark.lab

HOST = "gpu-c"
PORT = 30130
UNIT = "sglang-hard.service"
CONFIG = "/etc/sglang-deploy/secrets/hard.yml"
KEY = "lab-test-key-hardening-3b9e71d2"  # a test value: never a real key
ENV = {"SGLANG_DEPLOY_SECRET_HARD_KEY": KEY}
# The target from the shm dir, the draft from the store under /root (0700): both must be reachable.
SERVICE = {
    "gpu": 0, "port": PORT, "model": "Qwen3.6-27B", "model_in": "shm",
    "draft_model": "Qwen3.6-27B-DFlash", "draft_in": "store", "api_key_secret": "hard-key",
}
# `systemd-analyze security` as measured on the lab (systemd 252): 9.6 UNSAFE for the unit
# before (root, no sandbox); 3.2 OK as the sglang user, 3.5 OK as root in the same sandbox.
MAX_EXPOSURE = 3.2
MAX_EXPOSURE_ROOT = 3.5


def clean() -> None:
    clean_host(HOST)
    ssh(HOST, "userdel sglang 2>/dev/null; groupdel sglang 2>/dev/null; rm -rf /var/lib/sglang /var/cache/sglang; true")


def inventory(**host_data):
    return write_inventory("test_hardening", {HOST: {"services": {"hard": SERVICE}, "run_services": ["hard"], **host_data}})


def status(pid: int) -> dict[str, str]:
    lines = ssh(HOST, f"cat /proc/{pid}/status").stdout.splitlines()
    return {name: value.strip() for name, _, value in (line.partition(":") for line in lines)}


def exposure() -> float:
    out = ssh(HOST, f"systemd-analyze security {UNIT} --no-pager", check=False).stdout
    return float(re.search(rf"Overall exposure level for {re.escape(UNIT)}: ([0-9.]+)", out).group(1))


def chat_with_key() -> dict:
    """A chat completion from the host itself, with the API key (the service demands it)."""
    script = (
        "import json, urllib.request\n"
        "body = json.dumps({'model': 'default', 'messages': [{'role': 'user', 'content': 'hello'}]}).encode()\n"
        f"req = urllib.request.Request('http://127.0.0.1:{PORT}/v1/chat/completions', data=body, "
        f"headers={{'Content-Type': 'application/json', 'Authorization': 'Bearer {KEY}'}})\n"
        "print(urllib.request.urlopen(req, timeout=30).read().decode())\n"
    )
    return json.loads(ssh(HOST, f"python3 -c {shlex.quote(script)}").stdout)


@pytest.fixture(scope="module")
def hardened():
    clean()
    inv = inventory()
    result = deploy(inv, env=ENV)
    assert result.returncode == 0, result
    yield inv, result
    clean()


def test_the_deploy_creates_a_system_user_without_a_login_shell(hardened):
    name, _, uid, gid, _, home, shell = ssh(HOST, "getent passwd sglang").stdout.strip().split(":")
    assert int(uid) < 1000 and home == "/var/lib/sglang" and shell == "/usr/sbin/nologin"
    assert ssh(HOST, "stat -c '%U %G' /var/lib/sglang /var/cache/sglang").stdout.split() == ["sglang"] * 4


def test_the_server_runs_as_the_service_user_without_capabilities(hardened):
    uid = ssh(HOST, "id -u sglang").stdout.strip()
    st = status(main_pid(HOST, UNIT))
    assert st["Uid"].split() == [uid] * 4
    assert st["CapEff"] == st["CapBnd"] == "0000000000000000"
    assert st["NoNewPrivs"] == "1"


def test_it_answers_health_and_a_chat_completion(hardened):
    assert http_get(HOST, PORT, "/health")[0] == 200
    reply = chat_with_key()
    assert reply["choices"][0]["message"]["content"]


def test_the_config_file_is_readable_by_root_and_the_service_group_only(hardened):
    assert ssh(HOST, f"stat -c '%a %U %G' /etc/sglang-deploy/secrets {CONFIG}").stdout.split() == [
        "710", "root", "sglang", "640", "root", "sglang",
    ]
    # Another unprivileged user cannot read it; the service user can.
    assert ssh(HOST, f"setpriv --reuid=nobody --regid=nogroup --clear-groups cat {CONFIG}", check=False).returncode != 0
    assert KEY in ssh(HOST, f"setpriv --reuid=sglang --regid=sglang --clear-groups cat {CONFIG}").stdout


def test_home_directories_show_only_what_the_service_loads(hardened):
    pid = main_pid(HOST, UNIT)
    inside = set(ssh(HOST, f"nsenter -t {pid} -m ls -A /root").stdout.split())
    assert ".ssh" not in inside and inside <= {"venv_sglang", "venv_sglang.generations", "models"}
    assert ssh(HOST, f"nsenter -t {pid} -m ls -A /root/models").stdout.split() == ["Qwen3.6-27B-DFlash"]
    # Read-only for the service, /dev/shm shared with the host.
    touch = ssh(HOST, f"nsenter -t {pid} -m setpriv --reuid=sglang --regid=sglang --clear-groups touch /root/venv_sglang/x", check=False)
    assert touch.returncode != 0 and "Read-only file system" in touch.stderr
    assert "Qwen3.6-27B" in ssh(HOST, f"nsenter -t {pid} -m ls /dev/shm").stdout.split()


def test_exposure_score_is_below_the_measured_threshold(hardened):
    assert exposure() <= MAX_EXPOSURE


def test_a_second_run_changes_nothing(hardened):
    inv, _ = hardened
    result = deploy(inv, env=ENV)
    assert result.returncode == 0 and result.changed == [], result


def test_a_bad_service_user_is_refused_before_any_host_is_touched(hardened):
    result = deploy(inventory(service_user="Bad User"), env=ENV)
    assert result.returncode != 0
    assert f"inventory (host {HOST}): service_user: 'Bad User': must be a user name" in result.stderr
    assert "Starting operation" not in result.stderr


def test_service_user_root_still_works_in_the_same_sandbox(hardened):
    result = deploy(inventory(service_user="root"), env=ENV)
    assert result.returncode == 0, result
    st = status(main_pid(HOST, UNIT))
    assert st["Uid"].split() == ["0"] * 4
    assert st["CapEff"] == "0000000000000000" and st["NoNewPrivs"] == "1"
    assert http_get(HOST, PORT, "/health")[0] == 200
    assert chat_with_key()["choices"][0]["message"]["content"]
    assert ssh(HOST, f"stat -c '%a %U %G' /etc/sglang-deploy/secrets {CONFIG}").stdout.split() == [
        "700", "root", "root", "600", "root", "root",
    ]
    assert exposure() <= MAX_EXPOSURE_ROOT
