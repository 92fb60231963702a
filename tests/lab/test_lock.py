"""Deploy locks on real hosts: no deadlock between runs in opposite orders, no lock held by a run stuck on a
cut host, a killed run's locks taken over, `--dry` beside a real deploy; machines known by what they report (one
machine under two inventory names refused before any change; two machines behind one bastion, one SSH peer
address, each locked).

Uses gpu-c (the host that gets stuck or cut) and gpu-d (the other host of the run; `LOCK_LAB_HOSTS=c,d` picks
others); both are cleaned before and after, the first is restored if a test cut it. The stuck deploy is held in the readiness gate by a stand-in
that never becomes ready (`STANDIN_NEVER_READY`), and every test checks, on the host, that it is really
inside that gate (its `wait_ready` process runs there) before it acts.

`LOCK_TRIES` (default 2) sets how many concurrent pairs the opposite-order test starts; `bench/locks.py`
runs the same race many times and prints the figures.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import paramiko
import pytest

from tests.lab.labutil import (
    PYINFRA,
    ROOT,
    STATE,
    clean_host,
    deploy,
    lab,
    lab_hosts,
    ssh,
    wait_until,
    write_inventory,
)

pytestmark = pytest.mark.lab

STUCK, OTHER = os.environ.get("LOCK_LAB_HOSTS", "gpu-c,gpu-d").split(",")
SLOW = {"slow": {"gpu": 0, "port": 30120, "model": "Qwen3.6-27B-DFlash", "model_in": "store", "env": {"STANDIN_NEVER_READY": 1}}}
# Long enough that a lock held until the gate's timeout (600 + 180 s) would fail every wait below.
STUCK_READINESS_S = 600
# How long the opposite-order race's first run holds its locks in a readiness gate.
HOLD_S = 20
LOG_DIR = Path(tempfile.gettempdir()) / "sglang-deploy-test_lock"  # deploys' own output, read by the tests


def lock_owner(host: str) -> str | None:
    """The owner.json of the host's deploy lock, or None when the lock is free."""
    out = ssh(host, "cat /run/sglang-deploy.lock/owner.json 2>/dev/null || echo FREE").stdout.strip()
    return None if out == "FREE" else out


def in_readiness_gate(host: str) -> list[int]:
    """PIDs of the readiness gate's wait for sglang-slow.service on the host (empty when it is not waiting)."""
    # wait_ready's argv: UNIT ADDRESS PORT TIMEOUT SMOKE CONFIG (service_state's starts alike, then paths)
    out = ssh(host, f"pgrep -f '^python3 -I - sglang-slow.service 127.0.0.1 30120 {STUCK_READINESS_S} [01] ' || true").stdout.split()
    return [int(pid) for pid in out]


def end_gate_processes(host: str) -> None:
    """Stop the readiness waits our stuck deploys left on the host (the cut kept their SSH session from closing)."""
    pids = in_readiness_gate(host)
    if pids:
        ssh(host, f"kill {' '.join(map(str, pids))} 2>/dev/null; true")


def start(inventory: Path, name: str, *extra: str) -> tuple[subprocess.Popen, Path]:
    LOG_DIR.mkdir(exist_ok=True)
    log = LOG_DIR / f"{name}.log"
    out = open(log, "w")
    proc = subprocess.Popen([PYINFRA, str(inventory), "deploy.py", "-y", *extra], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)
    return proc, log


def start_stuck_deploy(name: str, lock_wait_s: int = 30, **connection) -> tuple[subprocess.Popen, Path]:
    """A deploy over gpu-c (a service that never becomes ready) and gpu-d, returned once it is inside gpu-c's gate.
    `connection`: data of both hosts' (an `ssh_config_file`)."""
    inventory = write_inventory(f"test_lock_{name}", {
        STUCK: {"services": SLOW, "run_services": ["slow"], "readiness_timeout_s": STUCK_READINESS_S, "lock_wait_s": lock_wait_s, **connection},
        OTHER: {"run_services": [], "lock_wait_s": lock_wait_s, **connection},
    })
    proc, log = start(inventory, name)

    def inside():
        assert proc.poll() is None, f"the stuck deploy ended before its readiness gate:\n{log.read_text()[-3000:]}"
        return in_readiness_gate(STUCK)

    wait_until(inside, timeout=600, interval=1, what="the first deploy inside gpu-c's readiness gate")
    owner = lock_owner(STUCK)
    assert owner and f'"pid": {proc.pid}' in owner and f'"pid": {proc.pid}' in (lock_owner(OTHER) or ""), "the stuck deploy holds both locks"
    return proc, log


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module", autouse=True)
def lock_hosts():
    assert {STUCK, OTHER} <= set(lab_hosts()), "run: python3 lab/lab.py up --hosts gpu-a,gpu-b,gpu-c,gpu-d,gpu-e"
    lab("restore", STUCK)
    for host in (STUCK, OTHER):
        clean_host(host)
        ssh(host, "rm -rf /run/sglang-deploy.lock")
    yield
    lab("restore", STUCK)
    end_gate_processes(STUCK)
    for host in (STUCK, OTHER):
        clean_host(host)
        ssh(host, "rm -rf /run/sglang-deploy.lock")


def opposite_order_race(tries: int) -> list[dict]:
    """`tries` times: two deploys over gpu-c and gpu-d, one inventory in each order, started together."""
    try:
        return _race(tries)
    finally:
        # The held service would keep gpu-c's GPU 0 busy for the next test (the GPU check refuses a busy GPU).
        clean_host(STUCK, keep_venv=True)


def race_inventories(attempt) -> tuple[Path, Path]:
    """The race's two inventories (gpu-c then gpu-d, and the other way round) for try `attempt`.

    The meeting is made certain, not left to timing: whichever run takes the locks first
    restarts a service whose warm-up lasts HOLD_S (its unit changes with `attempt`), so it holds
    both locks in its readiness gate far longer than the other run takes to reach its lock step.
    """
    hold = {"hold": {"gpu": 0, "port": 30121, "model": "Qwen3.6-27B-DFlash", "model_in": "store",
                     "env": {"STANDIN_WARMUP_S": HOLD_S, "LOCK_TRY": attempt}}}
    stuck = {"services": hold, "run_services": ["hold"], "lock_wait_s": 300}
    one = write_inventory("test_lock_order_cd", {STUCK: stuck, OTHER: {"run_services": [], "lock_wait_s": 300}})
    two = write_inventory("test_lock_order_dc", {OTHER: {"run_services": [], "lock_wait_s": 300}, STUCK: stuck})
    return one, two


def _race(tries: int) -> list[dict]:
    rows = []
    for attempt in range(tries):
        one, two = race_inventories(attempt)
        start_at = time.monotonic()
        runs = [start(one, f"order{attempt}.cd"), start(two, f"order{attempt}.dc")]
        codes = []
        for proc, _ in runs:
            try:
                codes.append(proc.wait(timeout=600))
            except subprocess.TimeoutExpired:
                stop(proc)
                codes.append("hung")
        logs = [log.read_text() for _, log in runs]
        waited = [float(m.group(1)) for text in logs for m in re.finditer(r"deploy lock taken after waiting ([\d.]+) s", text)]
        rows.append({"codes": codes, "logs": logs, "waited": waited, "waiters": sum("waiting for it" in text for text in logs),
                     "elapsed_s": time.monotonic() - start_at})
    return rows


def test_two_deploys_over_the_same_hosts_in_opposite_orders_run_one_after_the_other():
    for row in opposite_order_race(int(os.environ.get("LOCK_TRIES", "2"))):
        assert row["codes"] == [0, 0], row["logs"]
        # They really met: exactly one found a lock held by the other, waited holding nothing, then ran.
        assert row["waiters"] == 1 and len(row["waited"]) == 1, row["logs"]
        assert all("holding no other lock" in text for text in row["logs"] if "waiting for it" in text)
    assert lock_owner(STUCK) is None and lock_owner(OTHER) is None


def test_a_deploy_stuck_on_a_cut_host_does_not_hold_up_a_run_on_another_host():
    first, first_log = start_stuck_deploy("stuck_cut")
    try:
        # A silent cut (no RST: the peer just stops answering), the case that used to sit out the gate's timeout.
        lab("cut", STUCK)
        cut_at = time.monotonic()
        assert first.poll() is None, "the first deploy ended before the cut"
        # The operator moves on at once: a run on gpu-d (where the service would go), with a wait far shorter
        # than the stuck gate's timeout.
        second_inventory = write_inventory("test_lock_after_cut", {OTHER: {"run_services": [], "lock_wait_s": 60}})
        result = deploy(second_inventory, as_json=False)
        second_done = time.monotonic() - cut_at
        assert result.returncode == 0, result
        text = result.stdout + result.stderr
        waited = re.search(r"deploy lock taken after waiting ([\d.]+) s", text)
        print(f"run on {OTHER}: waited {waited.group(1) if waited else 0} s for its lock, done {second_done:.1f} s after the cut")
        first.wait(timeout=120)  # it dropped the cut host and ended, instead of sitting in the gate for 780 s
        dropped_after = time.monotonic() - cut_at
        log = first_log.read_text()
        assert first.returncode == 1 and f"[{STUCK}]" in log
        assert f"[{STUCK}] deploy lock not given back" in log, log[-3000:]
        print(f"the stuck deploy ended {dropped_after:.1f} s after the cut")
    finally:
        stop(first)
        lab("restore", STUCK)
        end_gate_processes(STUCK)
    # The cut host's lock stayed behind (its run could not give it back); that run is gone, so the next takes it over.
    assert lock_owner(STUCK) is not None
    result = deploy(write_inventory("test_lock_after_restore", {STUCK: {"run_services": [], "lock_wait_s": 3}}), as_json=False)
    assert result.returncode == 0, result
    assert "is stale (its deploy" in result.stdout + result.stderr
    assert lock_owner(STUCK) is None


def test_the_locks_of_a_killed_deploy_are_taken_over():
    first, _ = start_stuck_deploy("killed")
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    end_gate_processes(STUCK)
    assert first.returncode == -signal.SIGKILL
    assert f'"pid": {first.pid}' in (lock_owner(STUCK) or "") and f'"pid": {first.pid}' in (lock_owner(OTHER) or "")
    inventory = write_inventory("test_lock_after_kill", {STUCK: {"run_services": [], "lock_wait_s": 3}, OTHER: {"run_services": [], "lock_wait_s": 3}})
    result = deploy(inventory, as_json=False)
    assert result.returncode == 0, result
    text = result.stdout + result.stderr
    for host in (STUCK, OTHER):
        assert re.search(rf"\[{host}\] deploy lock held by .* \(pid {first.pid}\) .* is stale \(its deploy \(pid {first.pid}\) is gone\): taking it over", text), text[-3000:]
        assert lock_owner(host) is None


def test_a_dry_run_beside_a_real_deploy_neither_waits_nor_blocks_it():
    # With lock_wait_s 0 and both locks held by the real deploy, a dry run that tried to lock would fail at once.
    first, _ = start_stuck_deploy("beside_dry")
    try:
        before = {host: lock_owner(host) for host in (STUCK, OTHER)}
        dry_inventory = write_inventory("test_lock_dry", {STUCK: {"run_services": [], "lock_wait_s": 0}, OTHER: {"run_services": [], "lock_wait_s": 0}})
        result = deploy(dry_inventory, "--dry", as_json=False)
        assert result.returncode in (0, 2), result  # planned (nothing, or changes), never refused or failed
        text = result.stdout + result.stderr
        for host in (STUCK, OTHER):
            assert f"[{host}] --dry takes no lock; another deploy holds it: root@" in text and f"(pid {first.pid})" in text
        assert {host: lock_owner(host) for host in (STUCK, OTHER)} == before, "the dry run changed the locks"
        assert first.poll() is None and in_readiness_gate(STUCK), "the real deploy was not in its gate throughout"
    finally:
        stop(first)
        end_gate_processes(STUCK)
    for host in (STUCK, OTHER):
        ssh(host, "rm -rf /run/sglang-deploy.lock")  # the killed deploy's


def test_a_host_whose_lock_stays_busy_fails_alone_and_the_others_deploy():
    holder = '{"id": "by-hand", "who": "ops@ctl-2", "control": "ctl-2", "pid": 4242, "since": "2026-12-01 01:00:00 UTC"}'
    ssh(OTHER, f"mkdir /run/sglang-deploy.lock && printf '%s' '{holder}' > /run/sglang-deploy.lock/owner.json")
    try:
        inventory = write_inventory("test_lock_one_busy", {STUCK: {"run_services": [], "lock_wait_s": 2}, OTHER: {"run_services": [], "lock_wait_s": 2}})
        result = deploy(inventory, as_json=False)
        text = result.stdout + result.stderr
        assert result.returncode == 1, result
        assert (f"{OTHER}: another deploy holds the host's lock: ops@ctl-2 (pid 4242) since 2026-12-01 01:00:00 UTC; "
                "waited 2 s (lock_wait_s)") in text
        # gpu-c went through every operation of the run (its summary row), gpu-d none
        assert re.search(rf"\[{STUCK}\] (No changes|Success)", text) and not re.search(rf"\[{OTHER}\] (No changes|Success)", text), text[-3000:]
        assert lock_owner(STUCK) is None and lock_owner(OTHER) == holder
    finally:
        ssh(OTHER, "rm -rf /run/sglang-deploy.lock")


def test_a_lock_of_a_copy_of_this_control_machine_is_not_taken_over_while_it_renews_it():
    """A cloned VM or image keeps /etc/machine-id: its run's record names this control machine with another boot id,
    which alone once proved a reboot and let this run take the lock over while the copy deployed. While the copy's
    run renews its lock (touches `alive`, as every run does every RENEW_S), the host fails alone naming the copy; once
    the renewals stop, the lock is taken over. Seen failing without the renewal check: taken over at once."""
    from operations.lock import lock_record

    me = lock_record.new_owner()
    record = {**me, "id": "clone-run", "who": "root@ctl-copy", "boot": "0" * 8 + me["boot"][8:], "token": "c" * 32}
    lock_dir = "/run/sglang-deploy.lock"
    ssh(OTHER, f"mkdir -m 700 {lock_dir} && printf '%s' {shlex.quote(json.dumps(record))} > {lock_dir}/owner.json && "
               f": > {lock_dir}/owner-{'c' * 32} && : > {lock_dir}/alive")
    inventory = write_inventory("test_lock_clone", {OTHER: {"run_services": [], "lock_wait_s": 2}})
    try:
        ssh(OTHER, f"touch {lock_dir}/alive")  # the copy's run renews it
        held = deploy(inventory, as_json=False)
        text = held.stdout + held.stderr
        assert held.returncode == 1, text[-3000:]
        assert ("with another boot id, and it renewed the lock" in text
                and "a deploy is running from a copy of this machine (a cloned VM or image)" in text), text[-3000:]
        assert json.loads(lock_owner(OTHER))["id"] == "clone-run"
        ssh(OTHER, f"touch -d '-{lock_record.ALIVE_S + 5} seconds' {lock_dir}/alive")  # the copy's run stopped renewing it
        taken = deploy(inventory, as_json=False)
        text = taken.stdout + taken.stderr
        assert taken.returncode == 0, text[-3000:]
        assert "is stale (its control machine has restarted since" in text, text[-3000:]
        assert lock_owner(OTHER) is None  # taken over, then given back at the run's end
    finally:
        ssh(OTHER, f"rm -rf {lock_dir}")


# -- machines known by what they report ----------------------------------------------------

# What a deploy could change on a lab host (the lock, our units and files, staged models, venvs): compared before
# and after a run that must change nothing.
FINGERPRINT = ("ls -la --time-style=+%s /run/sglang-deploy.lock /etc/systemd/system /root /dev/shm 2>&1; "
               "ls -laR --time-style=+%s /etc/sglang-deploy /usr/local/lib/sglang-deploy 2>&1; ls -d /run/sglang-deploy.lock.new-* /run/sglang-deploy.lock.old-* 2>&1")


def ssh_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_one_machine_under_two_inventory_names_is_refused_before_any_change(tmp_path):
    # gpu-c by its address, and again under an ssh_config alias of the same address: no comparison of the
    # inventory's strings can see it, the machine's /etc/machine-id does. Both are refused, with --dry too.
    alias = f"{STUCK}-again"
    config = ssh_config(tmp_path / "ssh_config", f"Host {alias}\n  HostName {lab_hosts()[STUCK]['address']}\n")
    inventory = write_inventory("test_lock_one_machine_two_names", {STUCK: {"run_services": [], "lock_wait_s": 5}})
    row = (alias, {"ssh_hostname": alias, "ssh_config_file": str(config), "ssh_user": "root", "ssh_key": str(STATE / "id_ed25519"),
                   "ssh_known_hosts_file": str(STATE / "known_hosts"), "ssh_strict_host_key_checking": "yes",
                   "run_services": [], "lock_wait_s": 5})
    inventory.write_text(inventory.read_text().replace("\n]\n", f"\n    {row!r},\n]\n"))
    machine_id = ssh(STUCK, "cat /etc/machine-id").stdout.strip()
    before = ssh(STUCK, FINGERPRINT, check=False).stdout
    for extra in ((), ("--dry",)):
        result = deploy(inventory, *extra, as_json=False)
        text = result.stdout + result.stderr
        assert result.returncode != 0, text[-3000:]
        assert f"{STUCK} and {alias} are one machine (both report /etc/machine-id {machine_id}" in text, text[-3000:]
        assert f"List the machine once in the inventory (keep {STUCK} or {alias})" in text
        assert not re.search(rf"\[({STUCK}|{alias})\] (No changes|Success)", text), text[-3000:]
        assert ssh(STUCK, FINGERPRINT, check=False).stdout == before, f"{extra}: the refused run changed the host"


class _BastionSession(paramiko.ServerInterface):
    """One client's SSH session on the bastion: a channel id is the session's own (every session numbers its
    channels from 0), so each session keeps its own map of channel -> destination."""

    def __init__(self, destinations: list[tuple[str, int]]):
        self.destinations = destinations
        self.channels: dict[int, tuple[str, int]] = {}

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_direct_tcpip_request(self, chanid, origin, destination):
        self.channels[chanid] = destination
        self.destinations.append(destination)
        return paramiko.OPEN_SUCCEEDED


class Bastion:
    """An SSH jump host on 127.0.0.1 (paramiko's server side): it forwards every `direct-tcpip` channel to its
    destination. Through it, every lab host's SSH connection has one peer address: 127.0.0.1 and its port."""

    def __init__(self):
        self.key = paramiko.ECDSAKey.generate()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.destinations: list[tuple[str, int]] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.key.get_name()} {self.key.get_base64()}\n"

    def close(self) -> None:
        self.listener.close()

    # serving
    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(client,), daemon=True).start()

    def _session(self, client) -> None:
        transport = paramiko.Transport(client)
        transport.add_server_key(self.key)
        session = _BastionSession(self.destinations)
        transport.start_server(server=session)
        while transport.is_active():
            channel = transport.accept(timeout=1)
            if channel is not None:
                target = socket.create_connection(session.channels.pop(channel.get_id()))
                threading.Thread(target=self._pump, args=(channel, target), daemon=True).start()

    @staticmethod
    def _pump(channel, target) -> None:
        try:
            while True:
                ready, _, _ = select.select([channel, target], [], [], 5)
                if channel in ready:
                    data = channel.recv(1 << 16)
                    if not data:
                        break
                    target.sendall(data)
                if target in ready:
                    data = target.recv(1 << 16)
                    if not data:
                        break
                    channel.sendall(data)
        except OSError:
            pass
        finally:
            channel.close()
            target.close()


@pytest.fixture
def bastion():
    jump = Bastion()
    yield jump
    jump.close()


def test_hosts_behind_one_bastion_are_each_locked_and_a_limited_run_waits(tmp_path, bastion):
    # Every host's SSH peer is the bastion (127.0.0.1 and its port). The first deploy holds gpu-c and gpu-d
    # (stuck in gpu-c's readiness gate); a second run `--limit gpu-d` must not deploy gpu-d meanwhile.
    known = tmp_path / "known_hosts"
    known.write_text(bastion.known_hosts_line())
    addresses = " ".join(lab_hosts()[h]["address"] for h in (STUCK, OTHER))
    config = ssh_config(tmp_path / "ssh_config", (
        f"Host {addresses}\n  ProxyJump bastion\n"
        f"Host bastion\n  HostName 127.0.0.1\n  Port {bastion.port}\n  User root\n  IdentityFile {STATE / 'id_ed25519'}\n"
        f"  UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n"
    ))
    first, first_log = start_stuck_deploy("behind_bastion", ssh_config_file=str(config))
    try:
        assert {d[0] for d in bastion.destinations} == {lab_hosts()[h]["address"] for h in (STUCK, OTHER)}, "not through the bastion"
        holder = lock_owner(OTHER)
        limited = write_inventory("test_lock_behind_bastion_limited", {
            STUCK: {"run_services": [], "lock_wait_s": 2, "ssh_config_file": str(config)},
            OTHER: {"run_services": [], "lock_wait_s": 2, "ssh_config_file": str(config)},
        })
        result = deploy(limited, "--limit", OTHER, as_json=False)
        text = result.stdout + result.stderr
        assert result.returncode != 0, text[-3000:]
        assert f"{OTHER}: another deploy holds the host's lock: root@" in text and f"(pid {first.pid})" in text, text[-3000:]
        assert not re.search(rf"\[{OTHER}\] (No changes|Success)", text), text[-3000:]
        assert lock_owner(OTHER) == holder and first.poll() is None and in_readiness_gate(STUCK)
    finally:
        stop(first)
        end_gate_processes(STUCK)
        clean_host(STUCK, keep_venv=True)  # its held service would keep GPU 0 busy for the next test
        for host in (STUCK, OTHER):
            ssh(host, "rm -rf /run/sglang-deploy.lock")  # the killed deploy's
