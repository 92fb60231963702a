"""One deploy at a time per host, without deadlocks, without locks held by a run that stopped.

Each host has one lock, `/run/sglang-deploy.lock` (a directory; /run empties at a reboot).
How a run takes, holds and gives back its locks, and why:

- **All of the run's locks, before any change, in one fixed order.** pyinfra loads `deploy.py`
  for every host in parallel greenlets. Each host's `acquire()` waits until every host of the
  run has reached it (its data is valid by then), or as many as pyinfra loads at once
  (`--parallel`); the last to arrive takes all the run's locks, over the connections pyinfra already opened, in the order of the machines'
  addresses (the peer address of each SSH connection). Hosts of one inventory that share
  an address share one lock: it is taken once, and given back when the last of them is done.
  The command that takes a host's lock goes on, once it has it, to the host's one read
  (`RunLocks.read_for`): its first line answers the lock, so the pass goes on as soon as that
  line comes, while the read's output is collected beside it.
- **It never waits while holding.** A pass takes the locks in order without waiting; at the
  first one held by another run, it gives back what the pass took and then waits for that
  one alone (in commands of at most `WAIT_STEP_S`, checking between them whether the holder
  died). So no run ever holds a lock while it waits for another, and no cycle of waiting
  runs (a deadlock) can form, whatever order other runs or other inventories use; the fixed
  order only makes two runs over the same hosts collide on the first lock instead of each
  taking half (they then run one after the other). A lock still held by another run after
  the host's `lock_wait_s` fails **that host alone** (its holder is named; the run's other
  hosts go on, the way pyinfra drops any failed host), so an operator moving a service off
  a dead host is not held up by a deploy elsewhere; when every host is locked the run stops.
- **A lock is not held by a run that stopped making progress on its host.** pyinfra keeps
  a command running until its output ends, and a host whose network is cut sends nothing:
  the readiness gate's command (up to `readiness_timeout_s` + 180 s) then waited out its
  whole timeout, holding every other host of the run (operations run in lock-step) and so
  their locks. Every connection of a run gets TCP keepalives and a TCP user timeout
  (`DEAD_PEER_S`), so a peer that stops answering is detected by the kernel within
  seconds; the command fails, pyinfra drops the host, the run goes on with the others
  and ends. A host the run dropped (failed) gives its lock back at once, not at the run's end.
  When the connection is gone and the lock cannot be given back, the run records on this
  control machine that it no longer holds it (`_DROPPED`), and the next run from here takes
  it over even while the first one still runs elsewhere.
- **A killed run's locks are taken over** by the next run from the same control machine
  (its pid is gone). One held from another control machine is never broken automatically:
  the message says who holds it since when, and how to remove it.
- **`--dry` takes no lock**: it only reads, so it never blocks a real deploy; it says when
  another deploy holds a host's lock (what it shows may change when that one finishes).

The interactive confirmation (a run without `-y` or `--dry`) holds the locks while the
prompt waits for its operator: plan with `--dry`, apply with `-y`.
"""

from __future__ import annotations

import atexit
import getpass
import ipaddress
import json
import os
import random
import shlex
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gevent
from pyinfra import logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import BaseStateCallback
from pyinfra.connectors.util import make_unix_command_for_host

from operations import remote
from operations.streaming import first_line, open_session, rest_of_output, ssh_transport
from operations.this_run import unproxied

LOCK_PATH = "/run/sglang-deploy.lock"
# A peer that acknowledges nothing for this long is gone: TCP keepalive probes start after
# 2 s of silence, every 2 s, 4 unanswered ones abort the connection; data left unacknowledged
# aborts it after the same time (TCP_USER_TIMEOUT). A busy host's kernel still answers
# probes, so a long quiet command on a live host is not cut.
DEAD_PEER_S = 10
# Longest single waiting command on a host; between two, the holder's liveness is checked.
WAIT_STEP_S = 5
# How long a host's load may lag the others' before the lock step (only local work lies between).
ARRIVAL_TIMEOUT_S = 120
# Runs from this control machine record here the locks they gave up without giving them back.
_DROPPED = Path(tempfile.gettempdir()) / f"sglang-deploy-locks.{os.getuid()}"


def new_owner() -> dict:
    return {
        "id": uuid.uuid4().hex,
        "who": f"{getpass.getuser()}@{socket.gethostname()}",
        "control": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


class HostLocked(PyinfraError):
    pass


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _dropped_file(token: str) -> Path:
    return _DROPPED / token


def mark_dropped(token: str) -> None:
    """Record that this run no longer holds the lock `token` (it could not give it back)."""
    _DROPPED.mkdir(mode=0o700, exist_ok=True)
    _dropped_file(token).write_text(str(os.getpid()))
    atexit.register(_dropped_file(token).unlink, missing_ok=True)  # once we exit, our pid says it


def is_stale(holder: dict, control: str) -> str | None:
    """Why `holder` (an owner.json) no longer holds its lock, or None if it may still."""
    if holder.get("control") != control:
        return None  # another control machine: its processes cannot be seen from here
    if not _pid_alive(int(holder.get("pid") or 0)):
        return f"its deploy (pid {holder.get('pid')}) is gone"
    token = holder.get("token")
    if token and _dropped_file(token).exists():
        return f"its deploy (pid {holder.get('pid')}) lost the host's connection and dropped the host"
    return None


def describe(holder: dict | None) -> str:
    holder = holder or {}
    return f"{holder.get('who', 'unknown')} (pid {holder.get('pid', '?')}) since {holder.get('since', '?')}"


def locked_message(name: str, holder: dict | None, waited_s: float) -> str:
    return (
        f"{name}: another deploy holds the host's lock: {describe(holder)}; waited {waited_s:.0f} s (lock_wait_s). "
        f"If no deploy is running there, remove {LOCK_PATH} on the host."
    )


def lock_key(host) -> tuple:
    """What identifies the machine behind `host`: the peer address of its open connection.

    Sorting by it gives every run the same order; two inventory hosts with one address get one key.
    """
    transport = ssh_transport(host)
    if transport is not None:
        try:
            address, port = transport.getpeername()[:2]
            return (0, ipaddress.ip_address(address.split("%")[0]).packed.rjust(16, b"\0"), port, address)
        except (OSError, ValueError):
            pass
    return (1, host.name.encode(), 0, host.name)


def key_text(key: tuple) -> str:
    return f"{key[3]}:{key[2]}" if key[0] == 0 else key[3]


def _socket(host):
    """The socket under `host`'s SSH connection, or None (not connected, or a proxy command's pipe)."""
    sock = getattr(ssh_transport(host), "sock", None)
    return sock if hasattr(sock, "setsockopt") else None


def watch_connection(host, dead_peer_s: int = DEAD_PEER_S) -> bool:
    """Make the kernel abort `host`'s SSH connection once the peer has answered nothing for `dead_peer_s`."""
    sock = _socket(host)
    return sock is not None and set_dead_peer_options(sock, dead_peer_s)


def send_without_delay(host) -> bool:
    """Turn Nagle's algorithm off on `host`'s SSH connection (TCP_NODELAY), as OpenSSH does for its sessions.

    Each command is a few small SSH messages each way. With Nagle on (paramiko's default, and pyinfra's), a
    message written while the last one is not yet acknowledged waits for that acknowledgement, which the peer's
    kernel delays by up to 40 ms: on the lab, 48.8 ms per `true` against 6.6 ms with it off (20 commands each, one
    host). An operation that changes something sends several commands in a row: a run rewriting one host's boot
    unit files took 2.83 s with it on and 2.26 s with it off. A converged run's few commands per host (the lock, the
    read, the lock's release) did not wait this way measurably."""
    sock = _socket(host)
    if sock is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # not TCP
        return False
    return True


def set_dead_peer_options(sock, dead_peer_s: int = DEAD_PEER_S) -> bool:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        idle = max(1, dead_peer_s // 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, (dead_peer_s - idle) // idle))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, dead_peer_s * 1000)
    except (OSError, AttributeError):  # not TCP (a proxy command's pipe), or not Linux
        return False
    return True


_LOCK_SH = f'"${{SGLANG_DEPLOY_LOCK:-{LOCK_PATH}}}"'  # SGLANG_DEPLOY_LOCK: as in lock_host.py (unit tests)


def free_lock_command(owner: str, owner_id: str) -> str:
    """`lock_host.py acquire OWNER 0` with its free-lock path in sh, where no python need start on the host:
    mkdir (atomic), the owner's marker file, owner.json written beside and renamed in.

    The script's guard (flock) orders takeovers of a stale lock, which remove a directory; this
    path removes only a directory its own mkdir just made (when the owner cannot be written), and
    its mkdir fails while any lock, stale or not, exists: then the script runs and answers as it
    always does.
    """
    lock = _LOCK_SH
    return (
        f"if mkdir -m 700 {lock} 2>/dev/null; then "
        f"{{ : > {lock}/{_marker(owner_id)} && printf '%s' {owner} > {lock}/owner.json.tmp && "
        f"mv -f {lock}/owner.json.tmp {lock}/owner.json && "
        # A lock this command made and could not name is its own to remove (no output: the caller fails the host).
        f"echo '{{\"acquired\": true}}'; }} || rm -rf {lock}; else\n"
        f"{remote.command('lock_host', 'acquire', owner, '0')}\nfi"
    )


def release_command(owner_id: str) -> str:
    """`lock_host.py release OWNER_ID`: a lock holding this owner's marker is removed in sh; any other (held by
    another run, or taken by a deploy from before markers) goes to the script, which compares owner.json."""
    lock = _LOCK_SH
    return (
        f"if [ -e {lock}/{_marker(owner_id)} ]; then rm -rf {lock} && echo '{{\"released\": true}}'; else\n"
        f"{remote.command('lock_host', 'release', shlex.quote(owner_id))}\nfi"
    )


def _marker(owner_id: str) -> str:
    # The owner id is new_owner()'s uuid hex: a plain file name (lock_host.py writes the same marker).
    if not owner_id.isalnum():
        raise ValueError(f"owner id {owner_id!r} is not a uuid hex")
    return f"owner-{owner_id}"


@dataclass
class Outcome:
    held: bool
    holder: dict | None = None
    waited_s: float = 0.0
    error: str | None = None


@dataclass
class _Slot:
    key: tuple
    hosts: list = field(default_factory=list)
    wait_s: float = 0.0
    token: str | None = None
    held: bool = False
    done: set = field(default_factory=set)
    running: tuple | None = None  # the host's read begun by the command that took this lock (RunLocks.read_for)


class RunLocks:
    """One run's locks: take them all in order (never waiting while holding), give each back when done."""

    def __init__(self, owner: dict | None = None, on_taken: Callable[[_Slot], None] | None = None,
                 read_for: Callable[[object], object | None] | None = None):
        self.owner = owner or new_owner()
        self.on_taken = on_taken  # called as each lock is taken, before the pass goes on to the next
        # read_for(host): the host's read (an object with a shell `command`) to run in the same call that takes its
        # lock, or None. Once taken, slot.running holds (that read, a greenlet giving (exit status, output lines, stderr)).
        self.read_for = read_for
        self.slots: dict[tuple, _Slot] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.events: list[str] = []  # what was done, in order (read by tests and the bench)
        self._mutex = threading.Lock()

    # -- remote ---------------------------------------------------------------------------
    def _command(self, host, *args: str, timeout: float) -> dict:
        return self._run(host, remote.command("lock_host", *args), timeout)

    @staticmethod
    def _run(host, command: str, timeout: float) -> dict:
        ok, output = host.run_shell_command(command, print_output=False, _timeout=timeout)
        try:
            return json.loads(output.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise HostLocked(f"{host.name}: the deploy lock command failed: {output.stderr.strip()[-300:]}") from None

    def _try(self, slot: _Slot, wait_s: float) -> dict:
        host = slot.hosts[0]
        token = uuid.uuid4().hex
        owner = shlex.quote(json.dumps({**self.owner, "token": token}))
        timeout = wait_s + 60  # the command returns by itself after wait_s; this only bounds a hung host
        # A free lock is taken in sh (free_lock_command): the uncontended pass costs one round trip per host,
        # which also begins the host's read where the deploy has one (the host's one call of the run).
        slot.running = None
        result = None
        if wait_s == 0 and len(slot.hosts) == 1 and self.read_for is not None:
            read = self.read_for(host)
            if read is not None:
                result = self._run_with_read(slot, free_lock_command(owner, self.owner["id"]), read, timeout)
        if result is None:
            result = self._run(host, free_lock_command(owner, self.owner["id"]), timeout)
        holder = result.get("held_by") or {}
        if not result["acquired"]:
            why = is_stale(holder, self.owner["control"])
            if why:
                host.log(f"deploy lock held by {describe(holder)} is stale ({why}): taking it over")
                self.events.append(f"takeover {key_text(slot.key)}")
                result = self._command(host, "acquire", owner, "0", shlex.quote(holder.get("id", "?")), timeout=timeout)
        if not result["acquired"] and wait_s > 0:
            result = self._command(host, "acquire", owner, f"{wait_s:.1f}", timeout=timeout)
        if result["acquired"]:
            slot.held, slot.token = True, token
            self.events.append(f"take {key_text(slot.key)}")
            if self.on_taken is not None:
                self.on_taken(slot)
        return result

    def _run_with_read(self, slot: _Slot, lock_command: str, read, timeout: float) -> dict | None:
        """Take the lock and, where it was taken, go straight on to the host's read, in one command: its first
        line answers the lock (read as soon as it comes, so the pass goes on), the rest is the read's output.

        pyinfra returns a command's output only when it ends, so this command runs on a channel of its own over
        the host's SSH connection, wrapped as pyinfra wraps the lock's own command. None where the host has no
        such connection (another connector): the lock is then taken on its own."""
        host = slot.hosts[0]
        channel = open_session(host)
        if channel is None:
            return None
        script = f"{lock_command}\nif [ -e {_LOCK_SH}/{_marker(self.owner['id'])} ]; then\n{read.command}\nfi"
        command = make_unix_command_for_host(getattr(host, "state", None), host, script).get_raw_value()
        logger.debug(f"{host.name}: taking the deploy lock and reading the host in one command")
        channel.settimeout(timeout)
        try:
            channel.exec_command(command)
            line, rest = first_line(channel)
        except Exception as exc:
            channel.close()
            raise HostLocked(f"{host.name}: the deploy lock command failed: {type(exc).__name__}: {exc}") from None
        output = gevent.spawn(rest_of_output, channel, rest)
        try:
            result = json.loads(line)
            result["acquired"]  # noqa: B018 - an answer without it is no answer
        except (ValueError, KeyError, TypeError):
            stderr = output.get()[2]
            raise HostLocked(f"{host.name}: the deploy lock command failed: {stderr.strip()[-300:]}") from None
        if result["acquired"]:
            slot.running = (read, output)
        return result

    def _give_back(self, slot: _Slot, why: str) -> None:
        if not slot.held:
            return
        slot.held = False
        self.events.append(f"release {key_text(slot.key)}")
        for host in slot.hosts:
            try:
                self._run(host, release_command(self.owner["id"]), timeout=30)
                return
            except Exception as exc:  # the connection died (network cut, host rebooted)
                error = exc
        mark_dropped(slot.token or "")
        slot.hosts[0].log(
            f"deploy lock not given back ({why}; {type(error).__name__}: {error}): the next deploy from this machine "
            f"takes it over; from another machine, remove {LOCK_PATH} on the host once no deploy runs there",
            log_func=logger.warning,
        )

    # -- taking ---------------------------------------------------------------------------
    def take_all(self, hosts_and_waits: list[tuple[object, float]]) -> dict[str, Outcome]:
        """Take every host's lock, in address order; return each host name's outcome."""
        for host, wait_s in hosts_and_waits:
            key = lock_key(host)
            slot = self.slots.setdefault(key, _Slot(key))
            slot.hosts.append(host)
            slot.wait_s = max(slot.wait_s, float(wait_s))
        order = sorted(self.slots)
        start = time.monotonic()
        pending = list(order)
        failed: dict[tuple, Outcome] = {}
        collisions = 0
        while True:
            busy = None
            for key in list(pending):
                slot = self.slots[key]
                if slot.held:
                    continue
                try:
                    result = self._try(slot, 0)
                except Exception as exc:
                    failed[key] = Outcome(False, error=f"{type(exc).__name__}: {exc}")
                    pending.remove(key)
                    continue
                if not result["acquired"]:
                    busy = (slot, result.get("held_by"))
                    break
            if busy is None:
                break
            slot, holder = busy
            # Never wait while holding: what this pass took goes back before the wait.
            gave_back = False
            for key in pending:
                if self.slots[key].held:
                    self._give_back(self.slots[key], "waiting for another host's lock")
                    gave_back = True
            if gave_back:
                # Two runs that reach the same machines in different orders (other addresses) could hand locks
                # back and forth in step; a random pause, longer each time, breaks the step.
                collisions += 1
                time.sleep(random.uniform(0, min(2.0, 0.1 * 2**collisions)))
            announced = False
            while True:
                remaining = start + slot.wait_s - time.monotonic()
                if remaining <= 0:
                    failed[slot.key] = Outcome(False, holder, time.monotonic() - start)
                    pending.remove(slot.key)
                    self.events.append(f"give up {key_text(slot.key)}")
                    break
                if not announced:
                    slot.hosts[0].log(
                        f"deploy lock held by {describe(holder)}: waiting for it, up to lock_wait_s ({slot.wait_s:.0f} s) "
                        "from the run's start, holding no other lock"
                    )
                    self.events.append(f"wait {key_text(slot.key)}")
                    announced = True
                try:
                    result = self._try(slot, min(WAIT_STEP_S, remaining))
                except Exception as exc:
                    failed[slot.key] = Outcome(False, error=f"{type(exc).__name__}: {exc}")
                    pending.remove(slot.key)
                    break
                if result["acquired"]:
                    slot.hosts[0].log(f"deploy lock taken after waiting {time.monotonic() - start:.1f} s")
                    break
                holder = result.get("held_by") or holder
        for key, slot in self.slots.items():
            outcome = failed.get(key) or Outcome(True, waited_s=time.monotonic() - start)
            for host in slot.hosts:
                self.outcomes[host.name] = outcome
        return self.outcomes

    # -- giving back ----------------------------------------------------------------------
    def host_done(self, host, why: str) -> None:
        """`host` does nothing more in this run: give its lock back once every host sharing it is done."""
        with self._mutex:
            slot = next((s for s in self.slots.values() if any(h.name == host.name for h in s.hosts)), None)
            if slot is None or host.name in slot.done:
                return
            slot.done.add(host.name)
            if not slot.held or len(slot.done) < len(slot.hosts):
                return
        self._give_back(slot, why)

    def held_host_names(self) -> set[str]:
        return {h.name for s in self.slots.values() if s.held for h in s.hosts}


class _Run(BaseStateCallback):
    """The process's one run: the barrier at which all hosts arrive, its locks, its callbacks."""

    def __init__(self, state, executing: bool):
        self.state = state
        self.executing = executing
        self.expected = {h.name: h for h in state.inventory.get_active_hosts()}
        # pyinfra loads at most this many hosts at once (--parallel, or 20 per CPU): no more can arrive together.
        self.at_once = getattr(getattr(state, "pool", None), "size", None) or len(self.expected)
        self.arrived: dict[str, tuple[object, float]] = {}
        self.taking = False
        self.ready = threading.Event()
        self.on_held: dict[str, Callable[..., None]] = {}
        self.reads: dict[str, Callable[[object], object | None]] = {}
        self.locks = RunLocks(on_taken=self._taken, read_for=self._read_for)
        self.mutex = threading.Lock()

    def _taken(self, slot: _Slot) -> None:
        for host in slot.hosts:
            self._tell_held(host, slot.running)

    def _tell_held(self, host, running=None) -> None:
        if host.name in self.on_held:
            if running is None:
                self.on_held[host.name](host)
            else:
                self.on_held[host.name](host, running)

    def _read_for(self, host):
        read = self.reads.get(host.name)
        return read(host) if read is not None else None

    def arrive(self, host, wait_s: float, on_held: Callable[..., None] | None = None,
               read: Callable[[object], object | None] | None = None) -> None:
        with self.mutex:
            self.arrived[host.name] = (host, wait_s)
            if on_held is not None:
                self.on_held[host.name] = on_held
            if read is not None:
                self.reads[host.name] = read
            full = set(self.arrived) >= set(self.expected) or len(self.arrived) >= self.at_once
            take, self.taking = full and not self.taking, self.taking or full
        if take:
            try:
                self._take()
            finally:
                self.ready.set()
        elif not self.ready.wait(ARRIVAL_TIMEOUT_S):
            missing = ", ".join(sorted(set(self.expected) - set(self.arrived)))
            raise HostLocked(f"{host.name}: hosts {missing} did not reach the deploy lock within {ARRIVAL_TIMEOUT_S} s of the others")

    def _take(self) -> None:
        # Hosts that could not load yet (more hosts than pyinfra loads at once) are locked with the others,
        # with their data's lock_wait_s as given (their own load validates it).
        hosts = [self.arrived.get(name) or (h, _raw_wait(h)) for name, h in sorted(self.expected.items())]
        for host, _ in hosts:
            watch_connection(host)
            send_without_delay(host)
        if self.executing:
            self.locks.take_all(hosts)
        else:
            self._peek(hosts)

    def _peek(self, hosts) -> None:
        for host, _ in hosts:
            try:
                holder = self.locks._command(host, "peek", timeout=60).get("held_by")
            except Exception:
                holder = None  # the plan's own facts will say what is wrong with the host
            if holder:
                host.log(f"--dry takes no lock; another deploy holds it: {describe(holder)} (this plan may change when it ends)", log_func=logger.warning)
            self._tell_held(host)

    # -- pyinfra callbacks ----------------------------------------------------------------
    def operation_end(self, state, op_hash):
        for host in list(state.failed_hosts):
            if host.name in self.locks.held_host_names():
                self.locks.host_done(host, "the host failed")

    def host_disconnect(self, state, host):
        self.locks.host_done(host, "the run ended")


_RUN: _Run | None = None


def _raw_wait(host) -> float:
    value = getattr(getattr(host, "data", None), "get", lambda *_: None)("lock_wait_s")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return float(value)
    from configuration.settings import GLOBAL_KEYS

    return float(GLOBAL_KEYS["lock_wait_s"].default)


def _executing(argv: list[str] | None = None) -> bool:
    """Will this pyinfra run execute operations (not `--dry`, not a `--json` plan without `-y`)?

    Read from click's context where it is visible, else from the command line: pyinfra loads
    `deploy.py` in greenlets, and click keeps its context in a (greenlet-)local of the main one.
    """
    import sys

    import click

    ctx = click.get_current_context(silent=True)
    if ctx is not None and "dry" in ctx.params:
        dry, yes, as_json = bool(ctx.params.get("dry")), bool(ctx.params.get("yes")), bool(ctx.params.get("json_output"))
    else:
        args = list(argv if argv is not None else sys.argv[1:])
        args = args[: args.index("--")] if "--" in args else args
        short = [a[1:] for a in args if a.startswith("-") and not a.startswith("--")]
        dry, as_json = "--dry" in args, "--json" in args
        yes = "--yes" in args or any("y" in flags and set(flags) <= {"v", "y"} for flags in short)
    return not dry and not (as_json and not yes)


def acquire(host, state, wait_s: int, on_held: Callable[..., None] | None = None,
            read: Callable[[object], object | None] | None = None) -> None:
    """Take this run's locks (the last host to arrive takes all of them), then fail `host` alone if its lock was not had.

    `on_held(host)` is called as soon as the host's lock is taken (with `--dry`, once its lock is looked at),
    while the pass goes on to the next host: the deploy begins the host's read there (host_reads.start_read).
    `read(host)` gives the host's read to begin in the very command that takes its lock (host_reads.lock_read):
    then `on_held(host, (that read, its output))` is called instead.
    """
    global _RUN
    host, state = unproxied(host), unproxied(state)
    if _RUN is None or _RUN.state is not state:
        _RUN = _Run(state, _executing())
        state.add_callback_handler(_RUN)
    run = _RUN
    run.arrive(host, wait_s, on_held, read)
    if not run.executing:
        return
    outcome = run.locks.outcomes.get(host.name)
    if outcome is None or outcome.held:
        return
    if outcome.error:
        message = f"{host.name}: could not take the deploy lock: {outcome.error}"
    else:
        message = locked_message(host.name, outcome.holder, outcome.waited_s)
    if not any(o.held for o in run.locks.outcomes.values()):
        raise HostLocked(message)  # no host of this run can go on: stop the run with the reason
    # This host alone fails (pyinfra goes on with the others): its load ends here, before any operation is added.
    host.log_styled(message, fg="red", log_func=logger.error)
    state.fail_hosts({host})
    raise gevent.GreenletExit
