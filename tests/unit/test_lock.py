"""operations/lock/ (lock.py, run_locks.py, lock_record.py) with the real lock script (operations/lock/on_host/lock_host.py) run on this machine.

Each fake host is a "machine" of its own: a directory holding its /run/sglang-deploy.lock
(SGLANG_DEPLOY_LOCK) and its identity (machine-id, boot_id: SGLANG_DEPLOY_MACHINE_ID, SGLANG_DEPLOY_BOOT_ID),
and a peer address as an SSH connection would report it (which orders the locks and identifies nothing).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import click
import gevent
import pytest

from operations.lock import lock, lock_record, run_locks
from operations.run import private_dir


class FakeHost:
    def __init__(self, name: str, machine: Path, address: str | None = None):
        self.name = name
        self.data: dict = {}
        self.machine = machine
        self.lock_dir = machine / "sglang-deploy.lock"
        self.logs: list[str] = []
        self.cut = False
        transport = SimpleNamespace(getpeername=lambda: (address, 22), sock=None) if address else None
        self.connector = SimpleNamespace(client=SimpleNamespace(get_transport=lambda: transport))
        if machine.is_dir():  # what the machine reports: its own ids, kept by every FakeHost of that machine
            for name, value in (("machine-id", uuid.uuid4().hex), ("boot_id", str(uuid.uuid4()))):
                if not (machine / name).exists():
                    (machine / name).write_text(value + "\n")

    def env(self) -> dict:
        return {**os.environ, "SGLANG_DEPLOY_LOCK": str(self.lock_dir), "SGLANG_DEPLOY_MACHINE_ID": str(self.machine / "machine-id"),
                "SGLANG_DEPLOY_BOOT_ID": str(self.machine / "boot_id")}

    def machine_id(self) -> str:
        return (self.machine / "machine-id").read_text().strip()

    def run_shell_command(self, command, print_output=False, _timeout=None):
        if self.cut:
            raise EOFError("connection lost")  # what paramiko raises on a dead transport, roughly
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=_timeout, env=self.env())
        return proc.returncode == 0, SimpleNamespace(stdout=proc.stdout, stderr=proc.stderr)

    def log(self, message, log_func=None):
        self.logs.append(message)

    def log_styled(self, message, fg=None, log_func=None):
        self.logs.append(message)

    def holder(self) -> dict | None:
        try:
            return json.loads((self.lock_dir / "owner.json").read_text())
        except FileNotFoundError:
            return None


def without_renewal(holder: dict) -> dict:
    return {k: v for k, v in holder.items() if k != "renewed_s_ago"}


def machines(tmp_path: Path, *specs: tuple, host_class: type | None = None) -> list[FakeHost]:
    """FakeHosts (or `host_class`) for (name, address[, machine]); one machine directory per distinct address
    unless a third item names the machine (hosts behind one bastion: one address, several machines)."""
    hosts = []
    for name, address, *machine_name in specs:
        machine = tmp_path / (machine_name[0] if machine_name else address)
        machine.mkdir(exist_ok=True)
        hosts.append((host_class or FakeHost)(name, machine, address))
    return hosts


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """The control machine's records (dropped locks) in this test's own directory."""
    monkeypatch.setenv("SGLANG_DEPLOY_CACHE", str(tmp_path / "cache"))


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def this_control(**fields) -> dict:
    """An owner record as a run of this control machine writes it (complete: it can prove its deploy gone)."""
    return {**lock_record.new_owner(), "id": "other-run", "who": "root@ctl", "token": uuid.uuid4().hex, **fields}


def hold(host: FakeHost, **owner) -> dict:
    """Put a lock on `host` as another run would have left it (by default one of another control machine,
    whose record, as a deploy from before liveness proofs wrote it, proves nothing)."""
    record = {"id": "other-run", "who": "ops@elsewhere", "control": "elsewhere", "pid": 4242, "since": "2026-12-01 01:00:00 UTC", **owner}
    host.lock_dir.mkdir()
    (host.lock_dir / "owner.json").write_text(json.dumps(record))
    return record


def release_all(run: run_locks.RunLocks, hosts) -> None:
    for host in hosts:
        run.host_done(host, "test")


def test_locks_are_taken_in_address_order_not_inventory_or_name_order(tmp_path):
    # Names sort one way, addresses as text another, addresses as numbers a third: the numbers win.
    hosts = machines(tmp_path, ("alpha", "10.0.0.30"), ("beta", "10.0.0.9"), ("gamma", "10.0.0.10"), ("delta", "10.0.0.2"))
    run = run_locks.RunLocks()
    outcomes = run.take_all([(h, 5) for h in hosts])
    assert all(o.held for o in outcomes.values())
    assert run.events == ["take delta", "take beta", "take gamma", "take alpha"]
    assert all(h.holder()["id"] == run.owner["id"] for h in hosts)
    release_all(run, hosts)
    assert not any(h.lock_dir.exists() for h in hosts)


def test_hosts_behind_one_address_each_lock_their_own_machine(tmp_path):
    # Behind a ProxyJump bastion every host's SSH peer is the bastion: the address orders them, and each machine
    # still gets its own lock, so a second run limited to one of them cannot deploy it meanwhile.
    gpu_a, gpu_b = machines(tmp_path, ("gpu-a", "10.0.0.254", "a"), ("gpu-b", "10.0.0.254", "b"))
    first = run_locks.RunLocks()
    assert all(o.held for o in first.take_all([(gpu_b, 0), (gpu_a, 0)]).values())
    assert first.events == ["take gpu-a", "take gpu-b"]  # one address: the names order them
    assert gpu_a.holder()["id"] == gpu_b.holder()["id"] == first.owner["id"]
    limited = run_locks.RunLocks()  # `--limit gpu-b`
    outcome = limited.take_all([(FakeHost("gpu-b", gpu_b.machine, "10.0.0.254"), 1)])["gpu-b"]
    assert not outcome.held and outcome.holder["id"] == first.owner["id"]
    release_all(first, [gpu_a, gpu_b])
    assert not gpu_a.lock_dir.exists() and not gpu_b.lock_dir.exists()


@pytest.mark.parametrize("reports_id", [True, False], ids=["machine-id", "no-machine-id"])
def test_two_inventory_names_for_one_machine_are_both_refused_before_any_change(tmp_path, reports_id):
    # gpu-a.lan and GPU-A.lan (or a name and an IP) pass any comparison of strings; the machine says who it is.
    # Without a readable /etc/machine-id, the lock this run just took under the first name gives it away.
    one, other_name, spare = machines(tmp_path, ("gpu-a.lan", "10.0.0.5", "a"), ("GPU-A.lan", "10.0.1.5", "a"), ("spare", "10.0.2.6"))
    if not reports_id:
        (one.machine / "machine-id").write_text("")
    run = run_locks.RunLocks()
    outcomes = run.take_all([(one, 30), (other_name, 30), (spare, 30)])
    assert run.events == ["take gpu-a.lan", "refuse gpu-a.lan GPU-A.lan", "release gpu-a.lan", "take spare"]
    assert outcomes["spare"].held and not outcomes["gpu-a.lan"].held and not outcomes["GPU-A.lan"].held
    message = outcomes["gpu-a.lan"].refused
    assert outcomes["GPU-A.lan"].refused == message
    seen = f"both report /etc/machine-id {one.machine_id()}" if reports_id else "the lock this run took through gpu-a.lan is the one GPU-A.lan found"
    assert message.startswith(f"gpu-a.lan and GPU-A.lan are one machine ({seen}")
    assert "List the machine once in the inventory (keep gpu-a.lan or GPU-A.lan)" in message
    assert not one.lock_dir.exists(), "the machine's lock was given back at once"
    release_all(run, [one, other_name, spare])


def test_a_dry_run_refuses_two_inventory_names_for_one_machine_too(tmp_path):
    one, other_name, spare = machines(tmp_path, ("gpu-a", "10.0.0.5", "a"), ("gpu-a-ip", "10.0.1.5", "a"), ("spare", "10.0.0.6"))
    state = SimpleNamespace(inventory=SimpleNamespace(get_active_hosts=lambda: [one, other_name, spare]))
    run = lock._Run(state, executing=False)
    told = []
    threads = [threading.Thread(target=run.arrive, args=(h, 5, lambda host: told.append(host.name))) for h in (one, other_name, spare)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    outcomes = run.locks.outcomes
    assert set(outcomes) == {"gpu-a", "gpu-a-ip"} and outcomes["gpu-a"].refused == outcomes["gpu-a-ip"].refused
    assert outcomes["gpu-a"].refused.startswith(f"gpu-a and gpu-a-ip are one machine (both report /etc/machine-id {one.machine_id()}")
    assert told == ["spare"] and not one.lock_dir.exists()


def test_two_machines_that_report_one_machine_id_in_other_boots_are_two(tmp_path):
    # Cloned images keep one /etc/machine-id; the boot id tells them apart (containers on one kernel get their own).
    a, b = machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"))
    (b.machine / "machine-id").write_text(a.machine_id())
    run = run_locks.RunLocks()
    assert all(o.held for o in run.take_all([(a, 0), (b, 0)]).values())
    release_all(run, [a, b])


def test_a_busy_lock_is_waited_for_holding_no_other_then_that_host_alone_fails(tmp_path):
    a, b, c = machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3"))
    holder = hold(b, **this_control())  # a live run of this machine (this very process): not stale
    a_during_wait = []

    def watch():  # is a's lock held while the run waits for b's?
        while "wait b" not in run.events:
            time.sleep(0.01)
        a_during_wait.append(a.lock_dir.exists())

    run = run_locks.RunLocks()
    watcher = threading.Thread(target=watch)
    watcher.start()
    start = time.monotonic()
    outcomes = run.take_all([(a, 2), (b, 2), (c, 2)])
    elapsed = time.monotonic() - start
    watcher.join(timeout=10)
    assert a_during_wait == [False]
    assert run.events == ["take a", "release a", "wait b", "give up b", "take a", "take c"]
    assert outcomes["a"].held and outcomes["c"].held and not outcomes["b"].held
    assert outcomes["b"].holder == holder and 2 <= outcomes["b"].waited_s < 30
    assert elapsed < 30  # bounded by lock_wait_s, not by the holder
    assert b.holder() == holder  # never taken from a live holder
    assert any("waiting for it, up to lock_wait_s (2 s) from the run's start, holding no other lock" in line for line in b.logs)
    release_all(run, [a, b, c])


def test_the_message_names_the_holder_the_wait_and_the_fix():
    holder = {"id": "x", "who": "ops@ctl-2", "control": "ctl-2", "pid": 777, "since": "2026-12-01 02:00:00 UTC",
              "machine": "0" * 32, "boot": "1" * 32, "start": 12345, "token": "2" * 32}
    message = lock_record.locked_message("gpu-b", holder, 300.2)
    assert message == (
        "gpu-b: another deploy holds the host's lock: ops@ctl-2 (pid 777) since 2026-12-01 02:00:00 UTC; "
        "waited 300 s (lock_wait_s). If no deploy is running there, remove /run/sglang-deploy.lock on the host."
    )


def test_the_message_says_why_a_record_without_proof_is_not_taken_over():
    holder = {"id": "x", "who": "ops@ctl-2", "control": "ctl-2", "pid": 777, "since": "2026-12-01 02:00:00 UTC"}
    assert lock_record.locked_message("gpu-b", holder, 300) == (
        "gpu-b: another deploy holds the host's lock: ops@ctl-2 (pid 777) since 2026-12-01 02:00:00 UTC; "
        "waited 300 s (lock_wait_s). Its record cannot show whether that deploy has ended (it has no machine, boot, "
        "start, token: made by hand or by an older deploy), so it is never taken over automatically. "
        "If no deploy is running there, remove /run/sglang-deploy.lock on the host."
    )


def test_a_lock_freed_during_the_wait_is_taken_and_the_run_goes_on(tmp_path):
    a, b = machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"))
    hold(a, **this_control())
    threading.Timer(1.0, lambda: __import__("shutil").rmtree(a.lock_dir)).start()
    run = run_locks.RunLocks()
    outcomes = run.take_all([(a, 30), (b, 30)])
    assert outcomes["a"].held and outcomes["b"].held and outcomes["a"].waited_s < 30
    assert run.events == ["wait a", "take a", "take b"]
    release_all(run, [a, b])


def race(runs_hosts: list[list[FakeHost]], tries: int) -> None:
    """Start one run per host list at once, `tries` times: every run gets all its locks, no two overlap on a
    machine, and no run ever waits while holding a lock (the property that rules a deadlock out)."""
    inside: dict[Path, str] = {}
    clashes = []

    def deploy(run, hosts, label):
        outcomes = run.take_all([(h, 20) for h in hosts])
        assert all(o.held for o in outcomes.values()), outcomes
        for h in hosts:
            if h.machine in inside:
                clashes.append((label, inside[h.machine]))
            inside[h.machine] = label
        time.sleep(0.2)  # the deploy's changes
        for h in hosts:
            inside.pop(h.machine, None)
        release_all(run, hosts)

    for attempt in range(tries):
        runs = [run_locks.RunLocks() for _ in runs_hosts]
        threads = [threading.Thread(target=deploy, args=(run, hosts, str(i))) for i, (run, hosts) in enumerate(zip(runs, runs_hosts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
        assert not any(t.is_alive() for t in threads), f"try {attempt}: a run never finished"
        for run in runs:
            held = set()
            for event in run.events:
                verb, _, key = event.rpartition(" ")
                if verb == "take":
                    held.add(key)
                elif verb == "release":
                    held.discard(key)
                elif verb == "wait":
                    assert not held, f"{run.events}: waited for {key} while holding {held}"
    assert not clashes, f"two runs were inside their changes on one machine at once: {clashes}"


def test_two_runs_in_opposite_orders_never_deadlock_and_run_one_after_the_other(tmp_path):
    a, b = machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"))
    # The second run reaches the same machines through other addresses (another network, a NAT) that sort the
    # other way round: the address order cannot save it, only never waiting while holding can.
    a2, b2 = FakeHost("a", a.machine, "10.0.1.2"), FakeHost("b", b.machine, "10.0.1.1")
    race([[a, b], [b2, a2]], tries=3)


def test_three_runs_in_a_ring_never_deadlock(tmp_path):
    # Run i wants machines i and i+1, and sees them in that order: with waits while holding, a three-way cycle.
    dirs = [tmp_path / name for name in "abc"]
    for d in dirs:
        d.mkdir()
    # Each run sees its two machines at two addresses that sort as its own order (the same names each time).
    rings = [[FakeHost(f"m{i}", dirs[i], "10.0.2.1"), FakeHost(f"m{(i + 1) % 3}", dirs[(i + 1) % 3], "10.0.2.2")] for i in range(3)]
    race(rings, tries=2)


def test_the_lock_of_a_killed_run_of_this_machine_is_taken_over(tmp_path):
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    pid = dead_pid()
    hold(a, **this_control(pid=pid))
    run = run_locks.RunLocks()
    outcomes = run.take_all([(a, 0)])
    assert outcomes["a"].held and a.holder()["id"] == run.owner["id"]
    assert run.events == ["takeover a", "take a"]
    assert any(f"(pid {pid})" in line and f"is stale (its deploy (pid {pid}) is gone)" in line and "taking it over" in line for line in a.logs)
    release_all(run, [a])


def never_taken_over(a: FakeHost, holder: dict) -> None:
    run = run_locks.RunLocks()
    outcome = run.take_all([(a, 1)])["a"]
    assert not outcome.held and outcome.holder == holder
    assert "takeover a" not in run.events and a.holder() == holder, run.events


def test_a_lock_held_from_another_control_machine_is_never_taken_over(tmp_path):
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    never_taken_over(a, hold(a, **this_control(control="ctl-2", machine=uuid.uuid4().hex, pid=dead_pid())))  # that pid means nothing here


def test_a_live_lock_of_another_machine_with_this_hostname_is_never_taken_over(tmp_path):
    # Two CI runners, two laptops called `ubuntu`: the same hostname, its deploy's pid not alive here.
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    holder = hold(a, **this_control(machine=uuid.uuid4().hex, pid=dead_pid()))
    assert holder["control"] == socket.gethostname() and holder["who"] == "root@ctl"
    never_taken_over(a, holder)


def test_a_lock_of_another_pid_namespace_of_this_machine_is_never_taken_over(tmp_path):
    # A container sharing this machine's /etc/machine-id: its pids are not this namespace's.
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    never_taken_over(a, hold(a, **this_control(pidns="pid:[4026530000]", pid=dead_pid())))


def test_a_lock_whose_pid_now_belongs_to_another_process_is_taken_over(tmp_path):
    # The pid is alive (this very process) but started at another time: the deploy that held the lock is gone.
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    hold(a, **this_control(start=lock_record.process_start(os.getpid()) - 1))
    run = run_locks.RunLocks()
    assert run.take_all([(a, 0)])["a"].held and run.events == ["takeover a", "take a"]
    assert any(f"(pid {os.getpid()} is now another process, started at another time)" in line for line in a.logs)
    release_all(run, [a])


def test_a_lock_taken_before_this_control_machine_rebooted_is_taken_over(tmp_path):
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    holder = hold(a, **this_control(boot=str(uuid.uuid4())))  # its pid and start time are this process's: alive, but of another boot
    run = run_locks.RunLocks()
    assert run.take_all([(a, 0)])["a"].held and run.events == ["takeover a", "take a"]
    assert any(f"its control machine has restarted since (boot id {holder['boot']}" in line for line in a.logs)
    release_all(run, [a])


def renewed(host: FakeHost, seconds_ago: float) -> None:
    """The holder's last renewal of the lock on `host` (its `alive`), `seconds_ago`."""
    alive = host.lock_dir / "alive"
    alive.touch()
    at = time.time() - seconds_ago
    os.utime(alive, (at, at))


def test_a_lock_of_a_copy_of_this_machine_that_still_renews_it_is_not_taken_over(tmp_path):
    """Issue 46 item 8: a cloned VM or image keeps /etc/machine-id; its run's record names this machine with another
    boot id, which once proved a reboot. While that run renews its lock it is alive: not taken over, and the message
    says what is going on. Seen failing without the renewal check: taken over as "restarted since"."""
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    holder = hold(a, **this_control(boot=str(uuid.uuid4())))
    renewed(a, 3)
    run = run_locks.RunLocks()
    outcome = run.take_all([(a, 0)])["a"]
    assert not outcome.held and "takeover a" not in run.events and a.holder()["id"] == holder["id"]
    assert 3 <= outcome.holder["renewed_s_ago"] < 5
    message = lock_record.locked_message("a", outcome.holder, 0, run.owner)
    assert f"Its record names this control machine's /etc/machine-id ({holder['machine']}) with another boot id, " \
           "and it renewed the lock 3 s ago: a deploy is running from a copy of this machine" in message, message
    # Its renewals stopped (the copy's run ended without giving it back, or this machine rebooted): stale again.
    renewed(a, lock_record.ALIVE_S + 1)
    run = run_locks.RunLocks()
    assert run.take_all([(a, 0)])["a"].held and run.events == ["takeover a", "take a"]
    assert any(f"its control machine has restarted since (boot id {holder['boot']}" in line for line in a.logs)
    release_all(run, [a])


def test_renewal_proves_nothing_a_record_cannot(tmp_path):
    """A fresh `alive` keeps only a boot id from proving a reboot; it adds no proof of its own: another machine's
    record stays never taken over, a gone pid of this boot is still gone, and the record's own word for its renewal
    is not read."""
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    me = lock_record.new_owner()
    gone = this_control(pid=dead_pid())
    assert lock_record.is_stale({**gone, "renewed_s_ago": 1.0}, me).startswith(f"its deploy (pid {gone['pid']}) is gone")
    other = {**this_control(), "machine": uuid.uuid4().hex, "boot": str(uuid.uuid4())}
    assert lock_record.is_stale({**other, "renewed_s_ago": 999.0}, me) is None
    for value in (None, True, -1, "1", lock_record.ALIVE_S):
        assert lock_record.renewed_lately({"renewed_s_ago": value}) is False, value
    hold(a, **this_control(boot=str(uuid.uuid4())), renewed_s_ago=1.0)  # the record says so; the host does not
    run = run_locks.RunLocks()
    assert run.take_all([(a, 0)])["a"].held and run.events == ["takeover a", "take a"]
    release_all(run, [a])


def test_a_run_renews_each_lock_it_holds_until_it_gives_it_back(tmp_path):
    a, b = machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"))
    run = run_locks.RunLocks()
    run.renew_s = 0.2
    assert all(o.held for o in run.take_all([(a, 0), (b, 0)]).values())
    for host in (a, b):
        renewed(host, 60)
    gevent.sleep(0.6)
    assert all(time.time() - (h.lock_dir / "alive").stat().st_mtime < 1 for h in (a, b))
    release_all(run, [a])
    renewed(b, 60)
    gevent.sleep(0.6)
    assert time.time() - (b.lock_dir / "alive").stat().st_mtime < 1 and not a.lock_dir.exists()
    release_all(run, [b])
    gevent.sleep(0.6)
    assert run._renewing is None  # nothing held: the renewals stopped


@pytest.mark.parametrize("missing", lock_record.PROOF_FIELDS)
def test_a_record_missing_any_proof_is_never_taken_over(tmp_path, missing):
    # Everything else says "gone" (this machine, its pid dead): without that one field nothing is proven.
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    record = this_control(pid=dead_pid())
    del record[missing]
    a.lock_dir.mkdir()
    for held_as in (record, {**record, missing: [0]}):  # nor held in another form
        (a.lock_dir / "owner.json").write_text(json.dumps(held_as))
        never_taken_over(a, held_as)


@pytest.mark.parametrize("contents", [[], ["owner.json.tmp"]], ids=["empty", "no-owner-json"])
def test_a_lock_directory_without_its_record_is_never_broken_nor_replaced(tmp_path, contents):
    # Left by a deploy from before this rule (killed after its mkdir), or made by hand. A rename(2) would replace
    # an empty directory: both ways of taking refuse it, and the message says how to remove it.
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    a.lock_dir.mkdir()
    for name in contents:
        (a.lock_dir / name).write_text("{")
    run = run_locks.RunLocks()
    outcome = run.take_all([(a, 1)])["a"]
    assert not outcome.held and outcome.holder == {"id": "?", "who": "unknown (no owner.json)"}
    assert sorted(p.name for p in a.lock_dir.iterdir()) == contents and not list(a.machine.glob("*.new-*"))
    message = lock_record.locked_message("a", outcome.holder, 1)
    assert "never taken over automatically" in message and message.endswith("remove /run/sglang-deploy.lock on the host.")


def test_a_lock_its_run_could_not_give_back_is_taken_over_while_that_run_still_lives(tmp_path):
    a, b = machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"))
    first = run_locks.RunLocks()
    assert all(o.held for o in first.take_all([(a, 0), (b, 0)]).values())
    a.cut = True  # its connection died: the run drops the host and cannot give its lock back
    first.host_done(a, "the host failed")
    assert a.lock_dir.exists() and any("deploy lock not given back" in line for line in a.logs)
    a.cut = False
    second = run_locks.RunLocks()  # same control machine, and the first run's pid is alive (it is ours)
    outcomes = second.take_all([(FakeHost("a", a.machine, "10.0.0.1"), 0)])
    assert outcomes["a"].held and second.events[0] == "takeover a"
    assert b.holder()["id"] == first.owner["id"], "the first run's other lock is untouched"
    release_all(first, [b])
    second.host_done(second.slots["a"].host, "test")


def test_a_lock_taken_free_in_sh_is_the_scripts_lock_to_every_other_run(tmp_path):
    # The uncontended path (free_lock_command) writes what lock_host.py writes: another run's script sees it
    # busy and names its holder, peek names it, and only its owner gives it back.
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    first = run_locks.RunLocks()
    assert first.take_all([(a, 0)])["a"].held
    assert stat_mode(a.lock_dir) == 0o700 and not (a.lock_dir / "owner.json.tmp").exists()
    assert {k: a.holder()[k] for k in first.owner} == first.owner and a.holder()["token"]
    second = run_locks.RunLocks()
    outcome = second.take_all([(a, 0)])["a"]
    # The host adds how long ago the holder renewed it (its `alive`, made with the lock), never the record's word.
    assert not outcome.held and without_renewal(outcome.holder) == a.holder()
    assert 0 <= outcome.holder["renewed_s_ago"] < 5
    assert without_renewal(second._command(a, "peek", timeout=10)["held_by"]) == a.holder()
    second._command(a, "release", uuid.uuid4().hex, timeout=10)
    assert a.lock_dir.exists()
    release_all(first, [a])
    assert not a.lock_dir.exists()


def test_both_ways_of_taking_mark_the_owner_and_each_lock_goes_back_only_to_its_owner(tmp_path):
    a, b = machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"))
    hold(a, **this_control())
    threading.Timer(0.5, lambda: __import__("shutil").rmtree(a.lock_dir)).start()
    run = run_locks.RunLocks()
    assert all(o.held for o in run.take_all([(a, 30), (b, 30)]).values())  # a by the script (it waited), b in sh
    for host in (a, b):
        assert sorted(p.name for p in host.lock_dir.iterdir()) == ["alive", "owner-" + run.slots[host.name].token, "owner.json"]
        assert host.holder()["token"] == run.slots[host.name].token
    other = run_locks.RunLocks()
    for host in (a, b):
        assert other._run(host, lock_record.release_command(uuid.uuid4().hex), timeout=10)["released"] is True
        assert host.lock_dir.exists(), "another run's release removed this run's lock"
    release_all(run, [a, b])
    assert not a.lock_dir.exists() and not b.lock_dir.exists()


def test_a_lock_from_a_deploy_before_markers_is_given_back_by_the_script(tmp_path):
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    run = run_locks.RunLocks()
    token = uuid.uuid4().hex
    hold(a, id=run.owner["id"], token=token)  # owner.json alone, as lock_host.py wrote it before markers
    run._run(a, lock_record.release_command(token), timeout=10)
    assert not a.lock_dir.exists() and not list(a.machine.glob("*.old-*"))


def failing(tmp_path: Path, monkeypatch, *commands: str) -> None:
    """Put commands in front of PATH that fail as on a full /run."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for command in commands:
        (bindir / command).write_text(f"#!/bin/sh\necho '{command}: cannot write: No space left on device' >&2\nexit 1\n")
        (bindir / command).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")


def test_a_free_lock_the_sh_path_cannot_place_leaves_nothing_and_the_script_answers(tmp_path, monkeypatch):
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    failing(tmp_path, monkeypatch, "mv")
    run = run_locks.RunLocks()
    assert run.take_all([(a, 0)])["a"].held  # by the script, whole
    assert sorted(p.name for p in a.lock_dir.iterdir()) == ["alive", "owner-" + run.slots["a"].token, "owner.json"]
    assert not list(a.machine.glob("*.new-*"))
    monkeypatch.undo()
    release_all(run, [a])


def test_a_free_lock_whose_owner_cannot_be_written_is_never_left_and_the_host_fails(tmp_path, monkeypatch):
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    failing(tmp_path, monkeypatch, "mv", "python3")
    outcome = run_locks.RunLocks().take_all([(a, 0)])["a"]
    assert not outcome.held and "the deploy lock command failed: python3: cannot write: No space left on device" in outcome.error
    assert not a.lock_dir.exists(), "a nameless lock left behind would block every later run"
    assert not list(a.machine.glob("*.new-*"))


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_release_gives_back_only_its_own_lock(tmp_path):
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    holder = hold(a)
    run = run_locks.RunLocks()
    slot = run_locks.Slot(a, run_locks.lock_order(a), held=True, token=uuid.uuid4().hex)
    run._give_back(slot, "test")
    assert a.holder() == holder


def test_a_takeover_by_two_runs_at_once_leaves_one_winner(tmp_path):
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    hold(a, **this_control(pid=dead_pid()))
    runs = [run_locks.RunLocks() for _ in range(4)]
    results = {}
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(r.owner["id"], r.take_all([(FakeHost("a", a.machine, "10.0.0.1"), 0)])["a"].held)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    winners = [run_id for run_id, held in results.items() if held]
    assert len(winners) == 1 and a.holder()["id"] == winners[0]


def test_dead_peer_options_are_set_on_a_real_tcp_socket():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    try:
        assert run_locks.set_dead_peer_options(client, 10)
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        idle = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
        interval = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
        count = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
        assert idle + interval * count <= 10  # a silent peer is declared dead within DEAD_PEER_S
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 10000
    finally:
        client.close()
        server.close()


def test_every_host_of_a_run_sends_its_commands_without_delay(tmp_path):
    """Nagle's algorithm off (TCP_NODELAY) on each host's connection before the lock pass: with it on, each SSH
    command waited for a delayed acknowledgement (48.8 ms per `true` on the lab, 6.6 ms with it off)."""
    server = socket.create_server(("127.0.0.1", 0))
    sockets = [socket.create_connection(server.getsockname()) for _ in range(2)]
    try:
        hosts = machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"))
        for host, sock in zip(hosts, sockets):
            transport = SimpleNamespace(getpeername=lambda name=host.name: (name, 22), sock=sock)
            host.connector = SimpleNamespace(client=SimpleNamespace(get_transport=lambda transport=transport: transport))
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        state = SimpleNamespace(inventory=SimpleNamespace(get_active_hosts=lambda: hosts))
        run = lock._Run(state, executing=True)
        threads = [threading.Thread(target=run.arrive, args=(h, 5)) for h in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets] == [1, 1]
        for host in hosts:
            run.host_disconnect(state, host)
    finally:
        for sock in sockets:
            sock.close()
        server.close()


@pytest.mark.parametrize(
    "params, executing",
    [({"dry": True}, False), ({"json_output": True, "yes": False}, False), ({"json_output": True, "yes": True}, True), ({"yes": True}, True), ({"dry": False}, True)],
)
def test_only_a_run_that_executes_takes_locks(params, executing):
    with click.Context(click.Command("pyinfra")) as ctx:
        ctx.params.update({"dry": False, "yes": False, "json_output": False, **params})  # as pyinfra's own command sets them
        assert lock._executing() is executing


@pytest.mark.parametrize(
    "argv, executing",
    [
        (["inv.py", "deploy.py", "--dry"], False),
        (["inv.py", "deploy.py", "-y", "--dry"], False),
        (["inv.py", "deploy.py", "--json"], False),
        (["inv.py", "deploy.py", "--json", "-y"], True),
        (["inv.py", "deploy.py", "--json", "-vvy"], True),
        (["inv.py", "deploy.py", "--yes", "--json"], True),
        (["inv.py", "deploy.py", "-y"], True),
        (["inv.py", "deploy.py"], True),  # asks before executing: it may execute
        (["inv.py", "exec", "--json", "--", "echo", "-y"], False),
    ],
)
def test_in_pyinfras_greenlets_the_command_line_decides(argv, executing):
    # pyinfra loads deploy.py in greenlets, where click's context is not visible.
    assert click.get_current_context(silent=True) is None
    assert lock._executing(argv) is executing


def test_a_dry_run_takes_no_lock_and_names_the_holder(tmp_path):
    a, b = machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"))
    holder = hold(b)
    state = SimpleNamespace(inventory=SimpleNamespace(get_active_hosts=lambda: [a, b]))
    run = lock._Run(state, executing=False)
    threads = [threading.Thread(target=run.arrive, args=(h, 5)) for h in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not a.lock_dir.exists() and b.holder() == holder
    assert run.locks.events == []
    assert any("--dry takes no lock; another deploy holds it: ops@elsewhere (pid 4242)" in line for line in b.logs)


def test_the_last_host_to_arrive_takes_every_lock_of_the_run(tmp_path):
    a, b, c = machines(tmp_path, ("c-host", "10.0.0.3"), ("a-host", "10.0.0.1"), ("b-host", "10.0.0.2"))
    state = SimpleNamespace(inventory=SimpleNamespace(get_active_hosts=lambda: [a, b, c]))
    run = lock._Run(state, executing=True)
    seen_before_last = []
    t1 = threading.Thread(target=run.arrive, args=(a, 5))
    t1.start()
    time.sleep(0.3)
    seen_before_last.append(list(run.locks.events))  # one host arrived: nothing taken yet
    t2 = threading.Thread(target=run.arrive, args=(b, 5))
    t2.start()
    run.arrive(c, 5)
    t1.join(timeout=30)
    t2.join(timeout=30)
    assert seen_before_last == [[]]
    assert run.locks.events == ["take a-host", "take b-host", "take c-host"]
    for host in (a, b, c):
        run.host_disconnect(state, host)
    assert not any(h.lock_dir.exists() for h in (a, b, c))


def test_with_fewer_load_slots_than_hosts_the_arrived_ones_lock_them_all(tmp_path):
    # pyinfra loads at most `--parallel` hosts at once: the others cannot arrive until these finish loading.
    a, b, c = machines(tmp_path, ("a-host", "10.0.0.1"), ("b-host", "10.0.0.2"), ("c-host", "10.0.0.3"))
    state = SimpleNamespace(inventory=SimpleNamespace(get_active_hosts=lambda: [a, b, c]), pool=SimpleNamespace(size=2))
    run = lock._Run(state, executing=True, waits={"c-host": 7})  # every host's validated lock_wait_s (deploy.py)
    first = threading.Thread(target=run.arrive, args=(a, 5))
    first.start()
    run.arrive(b, 5)  # the second of two slots: takes every lock, c's too
    first.join(timeout=30)
    assert run.locks.events == ["take a-host", "take b-host", "take c-host"]
    assert run.locks.slots["c-host"].wait_s == 7
    run.arrive(c, 7)  # later, in a freed slot: its lock is already held
    assert run.locks.outcomes["c-host"].held and len(run.locks.events) == 3
    for host in (a, b, c):
        run.host_disconnect(state, host)
    assert not any(h.lock_dir.exists() for h in (a, b, c))


def test_each_host_is_told_its_lock_is_held_before_the_pass_goes_on(tmp_path):
    # The deploy begins a host's read there (host_reads.start_read): it overlaps the rest of the pass.
    c, a, b = machines(tmp_path, ("c-host", "10.0.0.3"), ("a-host", "10.0.0.1"), ("b-host", "10.0.0.2"))
    state = SimpleNamespace(inventory=SimpleNamespace(get_active_hosts=lambda: [c, a, b]))
    run = lock._Run(state, executing=True)
    told = []
    for_each = {h.name: (lambda host: told.append((host.name, list(run.locks.events)))) for h in (a, b)}  # c: none
    threads = [threading.Thread(target=run.arrive, args=(h, 5, for_each.get(h.name))) for h in (a, b, c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    # a-host (10.0.0.1) is told right after its own take, before b-host's; a host that gave no callback is not told.
    assert told == [("a-host", ["take a-host"]), ("b-host", ["take a-host", "take b-host"])]
    for host in (a, b, c):
        run.host_disconnect(state, host)


def test_a_lock_taken_again_after_a_wait_is_told_again(tmp_path):
    # The pass takes a, finds b busy, gives a back and waits: a's first read is dropped, and a is told again
    # when its lock is taken again.
    a, b = machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"))
    hold(b, **this_control())
    threading.Timer(1.0, lambda: __import__("shutil").rmtree(b.lock_dir)).start()
    told = []
    run = run_locks.RunLocks(on_taken=lambda slot: told.append(slot.name))
    outcomes = run.take_all([(a, 30), (b, 30)])
    assert outcomes["a"].held and outcomes["b"].held
    assert run.events == ["take a", "release a", "wait b", "take b", "take a"]
    assert told == ["a", "b", "a"]
    release_all(run, [a, b])


class LocalChannel:
    """A paramiko channel's calls that operations/lock/lock.py makes, run on this machine (bash, the host's lock dir)."""

    def __init__(self, host: FakeHost):
        self.host, self.proc, self.timeout, self.closed = host, None, None, False

    def settimeout(self, timeout):
        self.timeout = timeout

    def exec_command(self, command):
        self.proc = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.host.env())

    def recv(self, size):
        return os.read(self.proc.stdout.fileno(), size)

    def recv_stderr(self, size):
        return os.read(self.proc.stderr.fileno(), size)

    def recv_exit_status(self):
        return self.proc.wait()

    def close(self):
        self.closed = True


class ChannelHost(FakeHost):
    """A FakeHost whose connection opens channels (as an SSH connection does), counting them."""

    def __init__(self, name, machine, address):
        super().__init__(name, machine, address)
        self.channels: list[LocalChannel] = []
        transport = SimpleNamespace(getpeername=lambda: (address, 22), sock=None, is_active=lambda: True, open_session=self._open)
        self.connector = SimpleNamespace(client=SimpleNamespace(get_transport=lambda: transport))
        self.commands = 0

    def _open(self):
        self.channels.append(LocalChannel(self))
        return self.channels[-1]

    def run_shell_command(self, command, print_output=False, _timeout=None):
        self.commands += 1
        return super().run_shell_command(command, print_output, _timeout)


def channel_machines(tmp_path, *specs):
    return machines(tmp_path, *specs, host_class=ChannelHost)


def read_writing(marker_dir: Path, seconds: float = 0.0):
    """A host's read for RunLocks.read_for: prints a line and leaves a file, after `seconds`."""
    return lambda host: SimpleNamespace(command=f"sleep {seconds}; echo read-of-{host.name}; : > {marker_dir}/read-{host.name}")


def test_each_lock_and_its_hosts_read_are_one_command_and_the_pass_does_not_wait_for_the_read(tmp_path):
    a, b = channel_machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"))
    told = []
    run = run_locks.RunLocks(on_taken=lambda slot: told.append((slot.name, slot.running)), read_for=read_writing(tmp_path, 2))
    start = time.monotonic()
    outcomes = run.take_all([(a, 5), (b, 5)])
    assert time.monotonic() - start < 1.5, "the pass waited for the reads (2 s each)"
    assert all(o.held for o in outcomes.values()) and a.holder()["id"] == run.owner["id"] == b.holder()["id"]
    assert run.events == ["take a", "take b"]  # as when the lock is taken alone
    assert (a.commands, b.commands, len(a.channels), len(b.channels)) == (0, 0, 1, 1)
    assert [name for name, _ in told] == ["a", "b"]
    for (key, (read, output)), host in zip(told, (a, b)):
        assert output.get(timeout=10) == (0, [f"read-of-{host.name}"], "")
        assert read.command.startswith("sleep 2")
    assert all(c.closed for c in a.channels + b.channels)
    release_all(run, [a, b])
    assert not a.lock_dir.exists() and not b.lock_dir.exists()


def test_a_busy_lock_runs_no_read_and_the_pass_goes_as_before(tmp_path):
    # As test_a_busy_lock_is_waited_for_holding_no_other_then_that_host_alone_fails, with each first try also
    # carrying the host's read: the same events, and no read where the lock was not taken.
    a, b, c = channel_machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3"))
    holder = hold(b, **this_control())
    reads = tmp_path / "reads"
    reads.mkdir()
    run = run_locks.RunLocks(read_for=read_writing(reads))
    outcomes = run.take_all([(a, 2), (b, 2), (c, 2)])
    assert run.events == ["take a", "release a", "wait b", "give up b", "take a", "take c"]
    assert outcomes["a"].held and outcomes["c"].held and not outcomes["b"].held and b.holder() == holder
    time.sleep(0.5)
    assert sorted(p.name for p in reads.iterdir()) == ["read-a", "read-c"]  # b's lock was never had: not read
    release_all(run, [a, b, c])


def test_a_lock_command_with_the_read_that_answers_nothing_fails_that_host_with_its_stderr(tmp_path):
    a, b = channel_machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"))
    shutil.rmtree(b.machine)  # no /run: mkdir fails, and the script's guard file cannot be opened (a traceback, no answer)
    run = run_locks.RunLocks(read_for=read_writing(tmp_path))
    outcomes = run.take_all([(a, 0), (b, 0)])
    assert outcomes["a"].held and not outcomes["b"].held
    assert "b: the deploy lock command failed: Traceback" in outcomes["b"].error
    assert "No such file or directory" in outcomes["b"].error
    assert not (tmp_path / "read-b").exists()
    release_all(run, [a, b])


def test_hosts_behind_one_address_take_lock_and_read_in_one_command_and_hosts_without_channels_read_after(tmp_path):
    # Two machines behind one bastion are two locks, each taken with its host's read; a host without an SSH
    # connection of pyinfra's (another connector) takes its lock alone.
    first, second = channel_machines(tmp_path, ("gpu-a", "10.0.0.254", "a"), ("gpu-b", "10.0.0.254", "b"))
    (plain,) = machines(tmp_path, ("plain", "10.0.0.6"))
    run = run_locks.RunLocks(read_for=read_writing(tmp_path))
    outcomes = run.take_all([(first, 0), (second, 0), (plain, 0)])
    assert all(o.held for o in outcomes.values())
    assert (len(first.channels), len(second.channels), first.commands + second.commands) == (1, 1, 0)
    for host in (first, second):
        assert run.slots[host.name].running[1].get(timeout=10) == (0, [f"read-of-{host.name}"], "")
    assert not (tmp_path / "read-plain").exists() and run.slots["plain"].running is None
    release_all(run, [first, second, plain])


def test_the_lock_commands_first_line_names_the_machine_on_both_paths(tmp_path):
    # The fast path (sh) and the script each answer in one line with the machine id and boot id.
    a, b = channel_machines(tmp_path, ("a", "10.0.0.1"), ("b", "10.0.0.2"))
    hold(b, **this_control())
    run = run_locks.RunLocks()
    tokens = [uuid.uuid4().hex for _ in range(2)]
    taken, busy = (run._run(h, lock_record.free_lock_command(shlex.quote(json.dumps({**run.owner, "token": t})), t), timeout=10) for h, t in zip((a, b), tokens))
    ids = {h.name: {"machine": h.machine_id(), "boot": (h.machine / "boot_id").read_text().strip()} for h in (a, b)}
    assert taken == {"acquired": True, **ids["a"]}
    assert busy == {"acquired": False, "held_by": b.holder(), **ids["b"]}
    assert run._command(b, "peek", timeout=10) == {"held_by": b.holder(), **ids["b"]}


# -- the lock directory never exists without its owner record --------------------------------


def assert_whole_or_absent(host: FakeHost) -> dict | None:
    """The host's lock is absent, or whole: owner.json, its take's marker and `alive`, nothing else. Its record, or None."""
    if not os.path.lexists(host.lock_dir):
        return None
    record = json.loads((host.lock_dir / "owner.json").read_text())
    # `alive` is made with the lock (one taken over, as an older deploy left it, may lack it)
    assert sorted(p.name for p in host.lock_dir.iterdir() if p.name != "alive") == ["owner-" + record["token"], "owner.json"]
    return record


def a_later_run_takes_it(host: FakeHost) -> None:
    """Whatever a killed take left, the next run takes the lock: free, or over from a deploy proven gone."""
    run = run_locks.RunLocks()
    assert run.take_all([(FakeHost(host.name, host.machine, "10.0.0.1"), 0)])[host.name].held, host.logs
    assert assert_whole_or_absent(host)["id"] == run.owner["id"]
    release_all(run, [run.slots[host.name].host])
    assert not host.lock_dir.exists()


def killed_owner() -> tuple[str, str]:
    """A take's token and its owner record, of a deploy of this machine that is gone (its pid is dead)."""
    token = uuid.uuid4().hex
    return token, json.dumps(this_control(pid=dead_pid(), token=token))


def test_the_sh_path_killed_before_any_of_its_commands_leaves_no_lock_or_a_whole_one(tmp_path):
    # bash's DEBUG trap runs before each simple command: kill the shell there, at step 1, 2, ... until a run
    # goes through. Steps inside one command (mkdir, mv) are atomic system calls.
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    steps = 0
    while True:
        steps += 1
        token, owner = killed_owner()
        trap = f"trap '_n=$((_n+1)); [ $_n -ge {steps} ] && kill -9 $$' DEBUG\n"
        proc = subprocess.run(["bash", "-c", trap + lock_record.free_lock_command(shlex.quote(owner), token)], env=a.env(), capture_output=True, text=True)
        record = assert_whole_or_absent(a)
        if proc.returncode == 0:
            assert record["token"] == token and '"acquired": true' in proc.stdout
            break
        assert proc.returncode == -9, proc.stderr
        assert record is None or record["token"] == token
        a_later_run_takes_it(a)
    assert steps > 5
    a_later_run_takes_it(a)


KILL_AT_LINE = r'''
import os, sys
limit, script = int(sys.argv[1]), sys.argv[2]
code = compile(open(script).read(), "lock_host", "exec")
lines = 0
def trace(frame, event, arg):
    global lines
    if frame.f_code.co_filename != "lock_host":
        return None
    if event == "line":
        lines += 1
        if lines >= limit:
            os._exit(137)
    return trace
sys.argv = ["-", *sys.argv[3:]]
sys.settrace(trace)
try:
    exec(code, {"__name__": "__main__"})
finally:
    sys.settrace(None)
    print(f"lines: {lines}", file=sys.stderr)
'''


@pytest.mark.parametrize("takeover", [False, True], ids=["free", "takeover"])
def test_the_script_killed_at_any_line_leaves_no_lock_or_a_whole_one(tmp_path, takeover):
    # The script (lock_host.py) run under a tracer that kills it (os._exit) at its line 1, 2, ... until it ends;
    # taking a free lock, and taking over a stale one (whose removal is a rename aside, then a delete).
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    harness, script = tmp_path / "harness.py", tmp_path / "lock_host.py"
    harness.write_text(KILL_AT_LINE)
    script.write_text(__import__("operations.remote", fromlist=["script"]).script("lock_host"))
    limit, recovered_from = 0, set()
    while True:
        limit += 1
        stale = this_control(pid=dead_pid()) if takeover else None
        if stale:
            hold(a, **stale)
            (a.lock_dir / f"owner-{stale['token']}").touch()  # whole, as the deploy that is gone left it
        token, owner = killed_owner()
        argv = ["python3", str(harness), str(limit), str(script), "acquire", owner, "0", *([stale["token"]] if stale else [])]
        proc = subprocess.run(argv, env=a.env(), capture_output=True, text=True)
        record = assert_whole_or_absent(a)
        if proc.returncode == 0:
            assert record["token"] == token and '"acquired": true' in proc.stdout
            break
        assert proc.returncode == 137, proc.stderr
        assert record is None or record["token"] in (token, stale and stale["token"])
        left = "none" if record is None else "the new take's" if record["token"] == token else "the stale one"
        if left not in recovered_from:  # a later run takes each kind of leftover (once: the run costs a python start)
            a_later_run_takes_it(a)
            recovered_from.add(left)
        shutil.rmtree(a.lock_dir, ignore_errors=True)
        for stray in a.machine.glob("sglang-deploy.lock.*-*"):  # no lock (the tidying has a test of its own)
            shutil.rmtree(stray)
    assert limit > 10 and recovered_from == {"none", "the new take's", *(["the stale one"] if takeover else [])}
    a_later_run_takes_it(a)


def test_strays_of_killed_takes_are_tidied_when_old_and_left_alone_when_young(tmp_path):
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    old_new, young_new, old_aside = (a.machine / f"sglang-deploy.lock.{kind}-{uuid.uuid4().hex}" for kind in ("new", "new", "old"))
    for stray in (old_new, young_new, old_aside):
        stray.mkdir()
        (stray / "owner.json").write_text("{}")
    for stray in (old_new, old_aside):
        os.utime(stray, (time.time() - 3600, time.time() - 3600))
    hold(a, **this_control())  # busy: the script runs, and tidies under its guard
    assert not run_locks.RunLocks().take_all([(a, 0)])["a"].held
    assert sorted(p.name for p in a.machine.glob("sglang-deploy.lock.*-*")) == [young_new.name]


# -- the control machine's private directory ----------------------------------------------


def test_a_private_dir_is_made_mode_0700_with_its_parents(tmp_path):
    made = private_dir.private_dir(tmp_path / "home" / ".cache" / "sglang-deploy" / "dropped-locks")
    assert made.is_dir() and stat_mode(made) == 0o700 and stat_mode(made.parent) == 0o700
    assert private_dir.private_dir(made) == made  # as it is: accepted again


def test_a_private_dir_an_earlier_version_left_0755_is_tightened(tmp_path):
    """Only its owner could ever write into a 0755 directory of this user's: nothing can be planted there, so the
    cache directories an earlier version made 0755 are made 0700 instead of stopping every upgraded run."""
    earlier = tmp_path / "reads"
    earlier.mkdir()
    earlier.chmod(0o755)
    assert private_dir.private_dir(earlier) == earlier and stat_mode(earlier) == 0o700


def not_private(path: Path) -> str:
    with pytest.raises(private_dir.NotPrivate) as refused:
        private_dir.private_dir(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: expected a directory of root (uid 0) with mode 0700, not a symlink; found ")
    return message


def test_a_private_dir_that_is_a_symlink_another_users_or_open_to_others_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    assert f"found a symlink to {target}." in not_private(link)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 4321, 4321)  # another local user made it first
    assert "found a directory owned by uid 4321." in not_private(theirs)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)  # others could have written into it
    message = not_private(shared)
    assert "found a directory with mode 0775." in message and f"chmod 700 {shared}" in message and f"rm -rf {shared}" in message
    plain = tmp_path / "file"
    plain.write_text("")
    assert "found a file, not a directory." in not_private(plain)


def test_a_dropped_lock_record_planted_where_others_could_write_takes_nothing_over(tmp_path):
    # Another user's planted record would let a run break a live lock: the directory is checked before it is read.
    (a,) = machines(tmp_path, ("a", "10.0.0.1"))
    holder = hold(a, **this_control())  # a live deploy of this machine
    planted = lock_record.dropped_dir()
    planted.mkdir(parents=True)
    planted.chmod(0o777)
    (planted / holder["token"]).write_text("1")
    outcome = run_locks.RunLocks().take_all([(a, 0)])["a"]
    assert not outcome.held and a.holder() == holder
    assert f"NotPrivate: {planted}: expected a directory of root (uid 0) with mode 0700" in outcome.error


def test_a_lock_its_run_recorded_as_dropped_is_recorded_in_a_private_dir(tmp_path):
    token = uuid.uuid4().hex
    lock_record.mark_dropped(token)
    assert stat_mode(lock_record.dropped_dir()) == 0o700 and (lock_record.dropped_dir() / token).read_text() == str(os.getpid())
    assert lock_record.dropped_dir() == tmp_path / "cache" / "dropped-locks"


def test_a_private_dir_under_a_parent_others_can_replace_it_in_is_refused(tmp_path):
    """A 0700 directory of this user's is no safer than its parents: one another user owns, or may write without the
    sticky bit, lets them rename it away and put theirs in its place (also through a symlinked parent)."""
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    open_parent.chmod(0o777)
    with pytest.raises(private_dir.NotPrivate) as refused:
        private_dir.private_dir(open_parent / "sglang-deploy" / "reads")
    assert f"its parent {open_parent} may be written by others (mode 0777, no sticky bit)" in str(refused.value)
    assert "SGLANG_DEPLOY_CACHE" in str(refused.value)

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 4321, 4321)
    mine = theirs / "mine"
    mine.mkdir(mode=0o700)  # this user's own 0700 directory, inside another user's
    via_link = tmp_path / "cache-link"
    via_link.symlink_to(mine)
    for path in (mine / "reads", via_link / "reads"):
        with pytest.raises(private_dir.NotPrivate) as refused:
            private_dir.private_dir(path)
        assert f"its parent {theirs} is owned by uid 4321" in str(refused.value)

    sticky = tmp_path / "sticky"  # as /tmp: others may write, but only an entry's owner may rename it
    sticky.mkdir()
    sticky.chmod(0o1777)
    made = private_dir.private_dir(sticky / "sglang-deploy" / "reads")
    assert stat_mode(made) == 0o700
