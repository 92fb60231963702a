"""The local lab itself: real systemd hosts over real SSH, the nvidia-smi stand-in, the stand-in models.

Every test calls `lab.py up` first (idempotent, under a second when the lab runs), so the module runs alone or
after others. Nothing here calls `down`: other modules reuse the lab.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "lab" / "lab.py"
STATE = ROOT / "lab" / "state"
HOSTS = ["gpu-a", "gpu-b"]
QUERY = ("index,uuid,name,compute_cap,memory.total,memory.used,driver_version,pstate,temperature.gpu,utilization.gpu,"
         "ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure,"
         "clocks_throttle_reasons.hw_slowdown")


def lab(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(LAB), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"lab.py {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
    return proc


def up() -> dict:
    lab("up", "--hosts", ",".join(HOSTS))
    return json.loads((STATE / "hosts.json").read_text())


def ssh(host: str, command: str, check: bool = True) -> subprocess.CompletedProcess:
    address = json.loads((STATE / "hosts.json").read_text())[host]["address"]
    proc = subprocess.run(
        ["ssh", "-i", str(STATE / "id_ed25519"), "-o", f"UserKnownHostsFile={STATE / 'known_hosts'}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
         f"root@{address}", command],
        capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, f"ssh {host} {command!r} -> {proc.returncode}: {proc.stderr}"
    return proc


def query(host: str, fields: str = QUERY, fmt: str = "csv") -> list[dict]:
    out = ssh(host, f"nvidia-smi --query-gpu={fields} --format={fmt}").stdout
    return list(csv.DictReader(io.StringIO(out), skipinitialspace=True))


def test_hosts_are_real_systemd_machines_over_strict_ssh():
    hosts = up()
    for name in HOSTS:
        state = ssh(name, "systemctl is-system-running --wait", check=False).stdout.strip()
        assert state in ("running", "degraded"), f"{name}: {state}"
        assert ssh(name, "hostname").stdout.strip() == name
        assert ssh(name, "systemctl is-active ssh lab-net").stdout.split() == ["active", "active"]
        assert hosts[name]["address"] == ssh(name, "ip -4 -o addr show host0").stdout.split()[3].split("/")[0]
    # each host has its own identity: host keys and machine id
    keys = {name: ssh(name, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1] for name in HOSTS}
    ids = {name: ssh(name, "cat /etc/machine-id").stdout.strip() for name in HOSTS}
    assert len(set(keys.values())) == len(HOSTS) and len(set(ids.values())) == len(HOSTS)
    known = (STATE / "known_hosts").read_text()
    for name in HOSTS:
        assert f"{hosts[name]['address']} ssh-ed25519 {keys[name]}" in known


def test_addresses_follow_the_slots():
    hosts = up()
    for name in HOSTS:
        rec = hosts[name]
        slot = rec["slot"]
        assert rec["control_address"] == f"10.213.0.{4 * slot + 1}"
        assert rec["address"] == f"10.213.0.{4 * slot + 2}"
    assert hosts["gpu-a"]["address"] == "10.213.0.2"


def test_nvidia_smi_query_shows_two_sm120_gpus():
    up()
    uuids = []
    for name in HOSTS:
        rows = query(name)
        assert len(rows) == 2, rows
        for i, row in enumerate(rows):
            assert row["index"] == str(i)
            assert row["name"] == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
            assert row["compute_cap"] == "12.0"
            assert row["memory.total [MiB]"] == "97887 MiB"
            assert row["driver_version"] == "580.159.04"
            assert row["clocks_throttle_reasons.hw_slowdown"] == "Not Active"
            uuids.append(row["uuid"])
        raw = ssh(name, f"nvidia-smi --query-gpu={QUERY} --format=csv,noheader,nounits").stdout.splitlines()
        assert raw[0].split(", ")[3:6] == ["12.0", "97887", "0"]
    assert len(set(uuids)) == len(uuids)  # distinct across GPUs and hosts
    assert query(HOSTS[0]) == query(HOSTS[0])  # and stable


def test_nvidia_smi_other_formats():
    up()
    out = ssh("gpu-a", "nvidia-smi").stdout
    assert "Driver Version: 580.159.04     CUDA Version: 13.0" in out
    assert "No running processes found" in out
    assert ssh("gpu-a", "nvidia-smi -L").stdout.count("(UUID: GPU-") == 2
    full = ssh("gpu-a", "nvidia-smi -q").stdout
    assert "Attached GPUs                                          : 2" in full
    assert "Minor Number" in full and "Product Name" in full
    apps = ssh("gpu-a", "nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv").stdout
    assert apps.strip() == "pid, gpu_uuid, used_gpu_memory [MiB]"
    bad = ssh("gpu-a", "nvidia-smi --query-gpu=index,bogus --format=csv", check=False)
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stdout


def test_gpu_failure_modes_and_reset():
    up()
    try:
        lab("gpus", "gpu-b", "--fail", "1")
        rows = query("gpu-b")
        assert rows[0]["memory.total [MiB]"] == "97887 MiB"
        assert rows[1]["memory.total [MiB]"] == "[GPU requires reset]"
        assert "ERR!" in ssh("gpu-b", "nvidia-smi").stdout

        lab("gpus", "gpu-b", "--ok", "1", "--missing", "0", "--process", "1:4242:1000")
        gone = ssh("gpu-b", "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits", check=False)
        assert gone.returncode != 0
        assert gone.stdout.strip() == "1, 1000"
        assert "Unable to determine the device handle for GPU0000:18:00.0: Unknown Error" in gone.stderr

        lab("gpus", "gpu-b", "--reset", "--count", "1", "--name", "NVIDIA H200", "--compute-cap", "9.0",
            "--memory-mib", "143771")
        assert [(r["name"], r["compute_cap"], r["memory.total [MiB]"]) for r in query("gpu-b")] == [
            ("NVIDIA H200", "9.0", "143771 MiB")]
    finally:
        lab("gpus", "gpu-b", "--reset")
    rows = query("gpu-b")
    assert [r["compute_cap"] for r in rows] == ["12.0", "12.0"]
    assert ssh("gpu-b", "nvidia-smi --query-compute-apps=pid --format=csv,noheader").stdout == ""


def test_models_present_with_expected_sizes():
    up()
    expected = {
        "Qwen3.6-27B/model-00001-of-00002.safetensors": 2 * 1024 * 1024,
        "Qwen3.6-27B/model-00002-of-00002.safetensors": 2 * 1024 * 1024,
        "Qwen3.6-27B-DFlash/model.safetensors": 1024 * 1024,
    }
    sums = {}
    for name in HOSTS:
        stat = ssh(name, "cd /root/models && stat -c '%n %s' */*").stdout.split()
        sizes = dict(zip(stat[::2], (int(x) for x in stat[1::2])))
        for rel, size in expected.items():
            assert sizes.get(rel) == size, (name, rel, sizes.get(rel))
        for model in ("Qwen3.6-27B", "Qwen3.6-27B-DFlash"):
            cfg = json.loads(ssh(name, f"cat /root/models/{model}/config.json").stdout)
            assert cfg["model_type"] == "qwen3" and cfg["torch_dtype"] == "bfloat16"
            assert f"{model}/tokenizer_config.json" in sizes
        sums[name] = ssh(name, "cd /root/models && sha256sum */*.safetensors").stdout
    assert sums["gpu-a"] == sums["gpu-b"]  # deterministic content: same checksums everywhere


def test_second_up_reuses_every_host_and_changes_nothing():
    # Reused, not rebuilt or restarted: shown by the output and the leaders' pids, not by a clock (speed is bench's).
    before = up()
    inventory = (ROOT / "lab" / "inventory.py").read_text()
    out = lab("up", "--hosts", ",".join(HOSTS)).stdout
    after = json.loads((STATE / "hosts.json").read_text())
    assert out.count("reused") == len(HOSTS), out
    for name in HOSTS:
        assert after[name]["leader_pid"] == before[name]["leader_pid"]
    assert (ROOT / "lab" / "inventory.py").read_text() == inventory


def test_inventory_is_generated_from_state_and_placement():
    hosts = up()
    from lab import lab as lab_module

    text = (ROOT / "lab" / "inventory.py").read_text()
    assert text == lab_module.inventory_text({n: hosts[n] for n in HOSTS}, lab_module.PLACEMENT)
    scope: dict = {}
    exec(text, scope)
    data = dict(scope["lab_hosts"])
    assert list(data) == HOSTS
    assert data["gpu-a"]["run_services"] == ["ddtree", "dflash"] and data["gpu-b"]["run_services"] == []
    assert data["gpu-a"]["ssh_hostname"] == hosts["gpu-a"]["address"]
    assert data["gpu-a"]["ssh_strict_host_key_checking"] == "yes"
    assert Path(data["gpu-a"]["ssh_key"]).is_absolute() and Path(data["gpu-a"]["ssh_known_hosts_file"]).exists()


def test_reboot_empties_dev_shm_and_keeps_the_address():
    before = up()
    ssh("gpu-b", "echo staged > /dev/shm/lab-reboot-marker")
    out = lab("reboot", "gpu-b").stdout
    assert "rebooted in" in out
    after = json.loads((STATE / "hosts.json").read_text())
    assert after["gpu-b"]["leader_pid"] != before["gpu-b"]["leader_pid"]
    assert after["gpu-b"]["address"] == before["gpu-b"]["address"]
    assert ssh("gpu-b", "ls -A /dev/shm").stdout == ""
    assert int(ssh("gpu-b", "cut -d. -f1 /proc/uptime").stdout) < 60  # uptime restarts, as pyinfra expects


def test_reboot_from_inside_the_host_comes_back():
    """A deploy that reboots a host itself (pyinfra server.reboot) gets it back: the supervisor restarts it."""
    before = up()
    ssh("gpu-b", "touch /dev/shm/inside-marker; (sleep 1 && reboot) </dev/null >/dev/null 2>&1 &")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rec = json.loads((STATE / "hosts.json").read_text())["gpu-b"]
        if rec["leader_pid"] and rec["leader_pid"] != before["gpu-b"]["leader_pid"]:
            if ssh("gpu-b", "true", check=False).returncode == 0:
                break
        time.sleep(0.5)
    else:
        pytest.fail("gpu-b did not come back after rebooting itself")
    assert ssh("gpu-b", "ls -A /dev/shm").stdout == ""
