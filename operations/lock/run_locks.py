"""One run's deploy locks, taken over its hosts' connections: every host's lock in one fixed order
(`lock_order`), never waiting while holding (`RunLocks.take_all`), a lock taken in the same command
that begins the host's read, each renewed while held and given back when its host is done; and the
connections they ride on, made to drop a silent peer within `DEAD_PEER_S` and to send without
Nagle's delay.

Separate from one lock's record and commands (lock_record.py), which this takes and gives back, and
from the run's barrier and pyinfra's callbacks (lock.py), which decide when this runs: this is the
pass over the hosts, with no pyinfra state of its own. Why it is done this way: lock.py's docstring.
"""

from __future__ import annotations

import ipaddress
import json
import random
import shlex
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import gevent
from pyinfra import logger
from pyinfra.api.exceptions import PyinfraError

from operations import remote
from operations.lock.lock_record import (
    LOCK_PATH,
    LOCK_SH,
    RENEW_S,
    describe,
    free_lock_command,
    is_stale,
    machine_of,
    mark_dropped,
    marker_of,
    new_owner,
    release_command,
    renew_command,
    same_machine_message,
)
from operations.pyinfra_adapter import ssh_transport, unix_command
from operations.run import host_reads
from operations.run.channels import first_line, open_session, rest_of_output
from operations.run.private_dir import NotPrivate

# A peer that acknowledges nothing for this long is gone: TCP keepalive probes start after
# 2 s of silence, every 2 s, 4 unanswered ones abort the connection; data left unacknowledged
# aborts it after the same time (TCP_USER_TIMEOUT). A busy host's kernel still answers
# probes, so a long quiet command on a live host is not cut.
DEAD_PEER_S = 10
# Longest single waiting command on a host; between two, the holder's liveness is checked.
WAIT_STEP_S = 5


class HostLocked(PyinfraError):
    pass



# -- the order and the connections ----------------------------------------------------------


def lock_order(host) -> tuple:
    """Where `host` comes in a run's lock order: the peer address of its open connection, then its
    `ssh_hostname` and inventory name. Known before the first command, the same in every run over
    the same hosts; it identifies nothing (hosts behind one bastion share an address), the machine's
    own answer does."""
    peer: tuple = (1, b"", 0)
    transport = ssh_transport(host)
    if transport is not None:
        try:
            address, port = transport.getpeername()[:2]
            peer = (0, ipaddress.ip_address(address.split("%")[0]).packed.rjust(16, b"\0"), port)
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    data = getattr(host, "data", None)
    configured = getattr(data, "get", lambda *_: None)("ssh_hostname") or host.name
    return (*peer, str(configured).lower(), host.name)


def _socket(host):
    """The socket under `host`'s SSH connection, or None (not connected, or a proxy command's
    pipe)."""
    sock = getattr(ssh_transport(host), "sock", None)
    return sock if hasattr(sock, "setsockopt") else None


def watch_connection(host, dead_peer_s: int = DEAD_PEER_S) -> bool:
    """Make the kernel abort `host`'s SSH connection once the peer has answered nothing for
    `dead_peer_s`."""
    sock = _socket(host)
    return sock is not None and set_dead_peer_options(sock, dead_peer_s)


def send_without_delay(host) -> bool:
    """Turn Nagle's algorithm off on `host`'s SSH connection (TCP_NODELAY), as OpenSSH does for its
    sessions.

    Each command is a few small SSH messages each way. With Nagle on (paramiko's default, and
    pyinfra's), a message written while the last one is not yet acknowledged waits for that
    acknowledgement, which the peer's kernel delays by up to 40 ms: every command waits, and an
    operation that changes something sends several commands in a row (the figures:
    bench/HISTORY.md). A converged run's few commands per host (the lock, the read, the lock's
    release) did not wait this way measurably."""
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
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT,
                        max(1, (dead_peer_s - idle) // idle))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, dead_peer_s * 1000)
    except (OSError, AttributeError):  # not TCP (a proxy command's pipe), or not Linux
        return False
    return True



@dataclass
class Outcome:
    held: bool
    holder: dict | None = None
    waited_s: float = 0.0
    error: str | None = None
    # why this host was refused whole (it is the machine of another host of the run)
    refused: str | None = None


@dataclass
class Slot:
    """One inventory host's lock in this run."""

    host: object
    order: tuple
    wait_s: float = 0.0
    token: str | None = None  # the last take's (its marker, and the owner record's "token")
    held: bool = False
    machine: tuple[str, str] | None = None  # (machine id, boot id) as the host last answered
    # the host's read begun by the command that took this lock (RunLocks.read_for)
    running: tuple | None = None

    @property
    def name(self) -> str:
        return self.host.name


class RunLocks:
    """One run's locks: take them all in order (never waiting while holding), give each back when
    done."""

    def __init__(self, owner: dict | None = None, on_taken: Callable[[Slot], None] | None = None,
                 read_for: Callable[[object], object | None] | None = None):
        self.owner = owner or new_owner()
        # called as each lock is taken, before the pass goes on to the next
        self.on_taken = on_taken
        # read_for(host): the host's read (an object with a shell `command`) to run in the same call
        # that takes its lock, or None. Once taken, slot.running holds (that read, a greenlet giving
        # (exit status, output lines, stderr)).
        self.read_for = read_for
        self.slots: dict[str, Slot] = {}  # by inventory name
        self.outcomes: dict[str, Outcome] = {}
        self.events: list[str] = []  # what was done, in order (read by tests and the bench)
        self._mutex = threading.Lock()
        self._renewing: gevent.Greenlet | None = None
        self.renew_s = RENEW_S

    def _renew(self) -> None:
        """Every `renew_s`, while this run holds any lock: renew each (renew_command), over its
        host's connection; a host that does not answer is left to the connection's own watch."""
        while True:
            gevent.sleep(self.renew_s)
            held = [slot for slot in self.slots.values() if slot.held]
            if not held:
                self._renewing = None
                return
            for slot in held:
                try:
                    # time bound: a short command on a connection that watch_connection drops
                    # within DEAD_PEER_S when its peer is gone
                    slot.host.run_shell_command(renew_command(slot.token), print_output=False,
                                                _timeout=DEAD_PEER_S + 5)
                except Exception:  # the connection died: the run's own handling says so
                    continue

    # -- remote ---------------------------------------------------------------------------
    def _command(self, host, *args: str, timeout: float) -> dict:
        return self._run(host, remote.command("lock_host", *args), timeout)

    @staticmethod
    def _run(host, command: str, timeout: float) -> dict:
        ok, output = host.run_shell_command(command, print_output=False, _timeout=timeout)
        try:
            return json.loads(output.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise HostLocked(f"{host.name}: the deploy lock command failed: "
                             f"{output.stderr.strip()[-300:]}") from None

    def _try(self, slot: Slot, wait_s: float) -> dict:
        host = slot.host
        token = uuid.uuid4().hex
        owner = shlex.quote(json.dumps({**self.owner, "token": token}))
        # the command returns by itself after wait_s; this only bounds a hung host
        timeout = wait_s + 60
        # A free lock is taken in sh (free_lock_command): the uncontended pass costs one round trip
        # per host, which also begins the host's read where the deploy has one (the host's one call
        # of the run).
        slot.running = None
        result = None
        if wait_s == 0 and self.read_for is not None:
            read = self.read_for(host)
            if read is not None:
                result = self._run_with_read(slot, free_lock_command(owner, token), read, token,
                                             timeout)
        if result is None:
            result = self._run(host, free_lock_command(owner, token), timeout)
        holder = result.get("held_by") or {}
        # this run's, under another name: take_all refuses both
        ours = holder.get("id") == self.owner["id"]
        if not result["acquired"] and not ours:
            why = is_stale(holder, self.owner)
            if why:
                host.log(f"deploy lock held by {describe(holder)} is stale ({why}): taking it over")
                self.events.append(f"takeover {slot.name}")
                result = self._command(host, "acquire", owner, "0", shlex.quote(holder["token"]),
                                       timeout=timeout)
        if not result["acquired"] and wait_s > 0 and not ours:
            result = self._command(host, "acquire", owner, f"{wait_s:.1f}", timeout=timeout)
        if result["acquired"]:
            slot.held, slot.token = True, token
            self.events.append(f"take {slot.name}")
            if self._renewing is None:
                self._renewing = gevent.spawn(self._renew)
            if self.on_taken is not None:
                self.on_taken(slot)
        return result

    def _run_with_read(self, slot: Slot, lock_command: str, read, token: str,
                       timeout: float) -> dict | None:
        """Take the lock and, where it was taken, go straight on to the host's read, in one command:
        its first line answers the lock (read as soon as it comes, so the pass goes on), the rest is
        the read's output.

        pyinfra returns a command's output only when it ends, so this command runs on a channel of
        its own over the host's SSH connection, wrapped as pyinfra wraps the lock's own command.
        None where the host has no such connection (another connector): the lock is then taken on
        its own."""
        host = slot.host
        channel = open_session(host)
        if channel is None:
            return None
        script = f"{lock_command}\nif [ -e {LOCK_SH}/{marker_of(token)} ]; then\n{read.command}\nfi"
        command = unix_command(host, script)
        logger.debug(f"{host.name}: taking the deploy lock and reading the host in one command")
        channel.settimeout(timeout)
        try:
            channel.exec_command(command)
            line, rest = first_line(channel)
        except Exception as exc:
            channel.close()
            raise HostLocked(f"{host.name}: the deploy lock command failed: {type(exc).__name__}: "
                             f"{exc}") from None
        output = gevent.spawn(rest_of_output, channel, rest)
        try:
            result = json.loads(line)
            result["acquired"]  # noqa: B018 - an answer without it is no answer
        except (ValueError, KeyError, TypeError):
            stderr = output.get()[2]
            raise HostLocked(
                f"{host.name}: the deploy lock command failed: {stderr.strip()[-300:]}") from None
        if result["acquired"]:
            slot.running = (read, output)
        return result

    def _give_back(self, slot: Slot, why: str) -> None:
        with self._mutex:
            if not slot.held:
                return
            slot.held = False
        self.events.append(f"release {slot.name}")
        # Another run may have the host before this one takes it again: what was read under this
        # hold is dropped.
        host_reads.forget(slot.host)
        try:
            self._run(slot.host, release_command(slot.token or ""), timeout=30)
            return
        except Exception as exc:  # the connection died (network cut, host rebooted)
            error = exc
        try:
            mark_dropped(slot.token or "")
            then = "the next deploy from this machine takes it over; from another machine, remove"
        except NotPrivate as exc:
            then = f"it could not be recorded here ({exc}); remove"
        slot.host.log(
            f"deploy lock not given back ({why}; {type(error).__name__}: {error}): {then} "
            f"{LOCK_PATH} on the host once no deploy runs there",
            log_func=logger.warning,
        )

    # -- taking ---------------------------------------------------------------------------
    def take_all(self, hosts_and_waits: list[tuple[object, float]]) -> dict[str, Outcome]:
        """Take every host's lock, in lock_order; return each host name's outcome."""
        for host, wait_s in hosts_and_waits:
            slot = self.slots.setdefault(host.name, Slot(host, lock_order(host)))
            slot.wait_s = max(slot.wait_s, float(wait_s))
        pending = [slot.name for slot in sorted(self.slots.values(), key=lambda s: s.order)]
        start = time.monotonic()
        failed: dict[str, Outcome] = {}
        collisions = 0
        while True:
            busy = None
            for name in list(pending):
                slot = self.slots[name]
                if slot.held or name not in pending:  # held, or refused meanwhile with another host
                    continue
                result = self._attempt(slot, 0, failed, pending)
                if result is not None and not result["acquired"]:
                    busy = (slot, result.get("held_by"))
                    break
            if busy is None:
                break
            slot, holder = busy
            # Never wait while holding: what this pass took goes back before the wait.
            gave_back = False
            for name in pending:
                if self.slots[name].held:
                    self._give_back(self.slots[name], "waiting for another host's lock")
                    gave_back = True
            if gave_back:
                # Two runs that reach the same machines in different orders (other addresses) could
                # hand locks back and forth in step; a random pause, longer each time, breaks the
                # step.
                collisions += 1
                time.sleep(random.uniform(0, min(2.0, 0.1 * 2**collisions)))
            announced = False
            while True:
                remaining = start + slot.wait_s - time.monotonic()
                if remaining <= 0:
                    failed[slot.name] = Outcome(False, holder, time.monotonic() - start)
                    pending.remove(slot.name)
                    self.events.append(f"give up {slot.name}")
                    break
                if not announced:
                    slot.host.log(
                        f"deploy lock held by {describe(holder)}: waiting for it, up to "
                        f"lock_wait_s ({slot.wait_s:.0f} s) from the run's start, holding no other "
                        "lock"
                    )
                    self.events.append(f"wait {slot.name}")
                    announced = True
                result = self._attempt(slot, min(WAIT_STEP_S, remaining), failed, pending)
                if result is None:
                    break
                if result["acquired"]:
                    slot.host.log(
                        f"deploy lock taken after waiting {time.monotonic() - start:.1f} s")
                    break
                holder = result.get("held_by") or holder
        for name, slot in self.slots.items():
            self.outcomes[name] = (failed.get(name)
                                   or Outcome(True, waited_s=time.monotonic() - start))
        return self.outcomes

    def _attempt(self, slot: Slot, wait_s: float, failed: dict, pending: list) -> dict | None:
        """`_try` the slot's lock; None where that host is out of the pass (its command failed, or
        it was refused)."""
        try:
            result = self._try(slot, wait_s)
        except Exception as exc:
            failed[slot.name] = Outcome(False, error=f"{type(exc).__name__}: {exc}")
            pending.remove(slot.name)
            return None
        other = self._same_machine(slot, result)
        if other is not None:
            self._refuse(slot, other, failed, pending)
            return None
        return result

    def _same_machine(self, slot: Slot, result: dict) -> Slot | None:
        """Another host of this run that is the machine `slot`'s answer came from, or None."""
        holder = result.get("held_by") or {}
        if not result["acquired"] and holder.get("id") == self.owner["id"]:
            # The machine's lock is held by this very run: it took it under another inventory name.
            taker = next((s for s in self.slots.values()
                          if s is not slot and s.token and s.token == holder.get("token")), None)
            if taker is not None:
                return taker
        slot.machine = machine_of(result) or slot.machine
        if slot.machine is None:
            return None
        return next((s for s in self.slots.values() if s is not slot and s.machine == slot.machine),
                    None)

    def _refuse(self, slot: Slot, other: Slot, failed: dict, pending: list) -> None:
        """`slot` and `other` are one machine: both fail, before any change, their lock given
        back."""
        message = same_machine_message(other.name, slot.name, slot.machine or other.machine)
        self.events.append(f"refuse {other.name} {slot.name}")
        for refused in (other, slot):
            self._give_back(refused, f"{other.name} and {slot.name} are one machine")
            if refused.name in pending:
                pending.remove(refused.name)
            # a third name: the first pair's message stays
            if not (failed.get(refused.name) and failed[refused.name].refused):
                failed[refused.name] = Outcome(False, refused=message)

    # -- giving back ----------------------------------------------------------------------
    def host_done(self, host, why: str) -> None:
        """`host` does nothing more in this run: give its lock back."""
        slot = self.slots.get(host.name)
        if slot is not None:
            self._give_back(slot, why)

    def held_host_names(self) -> set[str]:
        return {s.name for s in self.slots.values() if s.held}
