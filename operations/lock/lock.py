"""One deploy at a time per host, without deadlocks, without locks held by a run that stopped.

Each host has one lock, `/run/sglang-deploy.lock` (a directory; /run empties at a reboot). Machines
are known by what they report (`/etc/machine-id` and the boot id), never by an address or a name.
How a run takes, holds and gives back its locks, and why:

- **All of the run's locks, before any change, in one fixed order.** pyinfra loads `deploy.py`
  for every host in parallel greenlets. Each host's `acquire()` waits until every host of the
  run has reached it (its data is valid by then), or as many as pyinfra loads at once
  (`--parallel`); the last to arrive takes all the run's locks, over the connections pyinfra
  already opened, one lock per inventory host, in the order of `lock_order`: the peer address
  of each SSH connection, then the host's `ssh_hostname` and its inventory name. That order is
  known before the first command (a machine's identity comes only with its first answer) and is
  the same for every run over the same hosts; it only makes two such runs collide on their first
  lock instead of each taking half. Nothing else rests on it: behind a bastion every host has the
  bastion's address (the names then order them), and each host still takes its own lock.
  The command that takes a host's lock goes on, once it has it, to the host's one read
  (`RunLocks.read_for`): its first line answers the lock, so the pass goes on as soon as that
  line comes, while the read's output is collected beside it.
- **One machine, one inventory name.** Every answer of the lock command names the machine that
  answered (`{"acquired": true, "machine": ..., "boot": ...}`: the same first line, no round
  trip more). Two hosts of the run that answer as one machine (the same machine id and boot id,
  or one finds the lock the run just took under the other's name) are both refused, before any
  change, with `--dry` too: one machine under two names would be deployed twice at once, and
  each name's cleanup would remove the other's services.
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
  control machine that it no longer holds it (`dropped_dir()`, a directory of this user's
  own, mode 0700: operations/run/private_dir.py), and the next run from here takes it over even
  while the first one still runs elsewhere.
- **A lock is taken over only when its record proves its holder gone.** owner.json holds the
  control machine's /etc/machine-id and boot id, the deploy's pid, that pid's start time
  (/proc/PID/stat field 22) and pid namespace. The holder is gone when the record names this
  control machine and it has booted since, or (in the same pid namespace) the pid is gone or
  now another process (another start time); or when this machine recorded that run as having
  dropped the host. A boot since proves nothing while the holder still renews its lock: a run
  touches `alive` in each lock it holds every `RENEW_S` over that host's connection, and the
  host answers how long ago (`renewed_s_ago`, its own clock). A record of this machine id with
  another boot id renewed within `ALIVE_S` is a live run on a copy of this machine (a cloned VM
  or image keeps /etc/machine-id): never taken over, and the message says so. A hostname proves
  nothing (two CI runners, two laptops called `ubuntu`).
  A record from another machine, or one without these fields (made by hand, or by an older
  deploy), is never broken automatically: the message says who holds it since when, and how
  to remove it.
- **A lock directory never exists without its owner record.** It is built complete beside
  the lock and renamed into place (`free_lock_command` in sh, lock_host.py otherwise), so a
  run killed at any point leaves no lock or a whole one.
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
import re
import shlex
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gevent
from pyinfra import logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import BaseStateCallback

from configuration.settings import GLOBAL_KEYS
from operations import remote
from operations.pyinfra_adapter import real_host, ssh_transport, unix_command
from operations.run import host_reads, run_state
from operations.run.channels import first_line, open_session, rest_of_output
from operations.run.private_dir import NotPrivate, cache_root, private_dir

LOCK_PATH = "/run/sglang-deploy.lock"
# A peer that acknowledges nothing for this long is gone: TCP keepalive probes start after
# 2 s of silence, every 2 s, 4 unanswered ones abort the connection; data left unacknowledged
# aborts it after the same time (TCP_USER_TIMEOUT). A busy host's kernel still answers
# probes, so a long quiet command on a live host is not cut.
DEAD_PEER_S = 10
# Longest single waiting command on a host; between two, the holder's liveness is checked.
WAIT_STEP_S = 5
# A holder renews each lock it holds this often (touches `alive` in it); one renewed within ALIVE_S
# is alive, whatever its record's boot id says (is_stale). Three renewals may be missed (a busy
# connection, a slow host) before a rebooted holder's lock becomes stale by its boot id.
RENEW_S = 10
ALIVE_S = 3 * RENEW_S
# How long a host's load may lag the others' before the lock step (only local work lies between).
ARRIVAL_TIMEOUT_S = 120
MACHINE_ID_PATH = "/etc/machine-id"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# What an owner record must hold to prove, from this machine, that its deploy is gone (see
# is_stale).
PROOF_FIELDS = ("machine", "boot", "pid", "start", "token")
_TOKEN = re.compile(r"[0-9a-f]{32}")


# -- who holds a lock --------------------------------------------------------------------


def new_owner() -> dict:
    """This run's owner record: who (for people), and what proves whether it still runs (for
    is_stale)."""
    me = control_identity()
    return {
        "id": uuid.uuid4().hex,
        "who": f"{getpass.getuser()}@{socket.gethostname()}",
        "control": socket.gethostname(),  # shown to people; proves nothing (hostnames repeat)
        **me,
        "pid": os.getpid(),
        "start": process_start(os.getpid()),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def control_identity() -> dict:
    """This control machine as its records name it: machine id, boot id, and the pid namespace its
    pids are of."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return {"machine": _read_id(MACHINE_ID_PATH), "boot": _read_id(BOOT_ID_PATH), "pidns": pidns}


def _read_id(path: str) -> str:
    try:
        value = Path(path).read_text().strip()
    except OSError:
        return ""
    return value if re.fullmatch(r"[0-9a-f-]{1,64}", value) else ""


def process_start(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (/proc/PID/stat field 22); None if it cannot be
    read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


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


def dropped_dir() -> Path:
    """Where runs of this user on this control machine record the locks they gave up without giving
    them back."""
    return cache_root() / "dropped-locks"


def mark_dropped(token: str) -> None:
    """Record that this run no longer holds the lock `token` (it could not give it back)."""
    if not _TOKEN.fullmatch(token or ""):
        return
    record = private_dir(dropped_dir()) / token
    record.write_text(str(os.getpid()))
    # once we exit, our pid and its start time say it
    atexit.register(record.unlink, missing_ok=True)


def _dropped_here(token) -> bool:
    if (not isinstance(token, str) or not _TOKEN.fullmatch(token)
            or not os.path.lexists(dropped_dir())):
        return False
    # a record only this user could have written
    return (private_dir(dropped_dir()) / token).exists()


def missing_proof(holder: dict) -> list[str]:
    """The fields of PROOF_FIELDS that `holder` (an owner.json) lacks or holds in no usable form."""
    def usable(name, value):
        if name == "token":
            return isinstance(value, str) and bool(_TOKEN.fullmatch(value))
        if name in ("pid", "start"):
            return (isinstance(value, int) and not isinstance(value, bool)
                    and value > (0 if name == "pid" else -1))
        return isinstance(value, str) and bool(value)

    return [name for name in PROOF_FIELDS if not usable(name, holder.get(name))]


def is_stale(holder: dict, me: dict) -> str | None:
    """Why `holder` (an owner.json) provably no longer holds its lock, seen from the run `me`
    (new_owner()); else None.

    Only a record of this very control machine (its machine id) can prove it: by a boot since (boot
    id), or, in the same pid namespace, by its pid gone or now another process (its start time). A
    name proves nothing.
    """
    if _dropped_here(holder.get("token")):
        return (
            f"its deploy (pid {holder.get('pid')}) lost the host's connection and dropped the host")
    if missing_proof(holder) or not me.get("machine") or holder["machine"] != me["machine"]:
        return None  # cannot be proven from here: another machine, or a record without the proof
    if holder["boot"] != me.get("boot"):
        if _live_copy(holder, me):
            return None  # a live run on a copy of this machine (clone_hint)
        return (f"its control machine has restarted since (boot id {holder['boot']}, now "
                f"{me.get('boot')})")
    if not holder.get("pidns") or holder.get("pidns") != me.get("pidns"):
        # another pid namespace (a container on this machine): its pids are not ours to look at
        return None
    pid = holder["pid"]
    if not _pid_alive(pid):
        return f"its deploy (pid {pid}) is gone"
    started = process_start(pid)
    if started is not None and started != holder["start"]:
        return (f"its deploy (pid {pid}) is gone (pid {pid} is now another process, started at "
                "another time)")
    return None


def renewed_lately(holder: dict) -> bool:
    """Did the holder renew its lock within ALIVE_S (the host's answer, `renewed_s_ago`)?"""
    renewed = holder.get("renewed_s_ago")
    return (isinstance(renewed, (int, float)) and not isinstance(renewed, bool)
            and 0 <= renewed < ALIVE_S)


def _live_copy(holder: dict, me: dict) -> bool:
    """Does `holder` name this machine id with another boot id, and still renew its lock: a run on
    another machine with this machine's /etc/machine-id (a cloned VM or image)?"""
    return bool(holder.get("machine") and holder.get("machine") == me.get("machine")
                and holder.get("boot") != me.get("boot") and renewed_lately(holder))


def clone_hint(holder: dict | None, me: dict) -> str:
    """What to say of a lock `_live_copy` finds: another machine with this machine's
    /etc/machine-id runs a deploy."""
    holder = holder or {}
    if _live_copy(holder, me):
        return (f" Its record names this control machine's /etc/machine-id ({holder['machine']}) "
                f"with another boot id, and it renewed the lock {holder['renewed_s_ago']:.0f} s "
                "ago: a deploy is running from a copy of this machine (a cloned VM or image). "
                "Give each control machine its own /etc/machine-id (systemd-machine-id-setup).")
    return ""


def renew_command(token: str) -> str:
    """Touch `alive` in the host's lock if it is still this take's (its marker is there)."""
    return (f'_sglang_lock={_LOCK_SH}; [ -e "$_sglang_lock/{_marker(token)}" ] && '
            ': > "$_sglang_lock/alive.new" && mv -f "$_sglang_lock/alive.new" '
            '"$_sglang_lock/alive"')


def describe(holder: dict | None) -> str:
    holder = holder or {}
    return (f"{holder.get('who', 'unknown')} (pid {holder.get('pid', '?')}) since "
            f"{holder.get('since', '?')}")


def locked_message(name: str, holder: dict | None, waited_s: float,
                   me: dict | None = None) -> str:
    missing = missing_proof(holder or {})
    unprovable = (
        f" Its record cannot show whether that deploy has ended (it has no {', '.join(missing)}: "
        "made by hand or by an older deploy), so it is never taken over automatically."
        if holder and missing else ""
    )
    return (
        f"{name}: another deploy holds the host's lock: {describe(holder)}; waited {waited_s:.0f} "
        f"s (lock_wait_s).{unprovable}{clone_hint(holder, me or {})} If no deploy is running "
        f"there, remove {LOCK_PATH} on the host."
    )


def same_machine_message(first: str, second: str, machine: tuple[str, str] | None) -> str:
    seen = (f"both report /etc/machine-id {machine[0]} and boot id {machine[1]}"
            if machine and machine[0]
            else f"the lock this run took through {first} is the one {second} found")
    return (
        f"{first} and {second} are one machine ({seen}): under two inventory names it would be "
        "deployed twice at once, and each name's cleanup would remove the other's services. "
        f"Nothing was changed there. List the machine once in the inventory (keep {first} or "
        f"{second}); if they are two machines, give each its own /etc/machine-id "
        "(systemd-machine-id-setup)."
    )


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


# -- the commands ------------------------------------------------------------------------

# SGLANG_DEPLOY_LOCK, SGLANG_DEPLOY_MACHINE_ID, SGLANG_DEPLOY_BOOT_ID: as in lock_host.py (unit
# tests).
_LOCK_SH = f'"${{SGLANG_DEPLOY_LOCK:-{LOCK_PATH}}}"'
_IDENTITY_SH = (
    f'{{ read -r _sglang_machine < "${{SGLANG_DEPLOY_MACHINE_ID:-{MACHINE_ID_PATH}}}"; '
    f'read -r _sglang_boot < "${{SGLANG_DEPLOY_BOOT_ID:-{BOOT_ID_PATH}}}"; }} 2>/dev/null; '
    'case "$_sglang_machine$_sglang_boot" in *[!0-9a-f-]*) _sglang_machine= _sglang_boot= ;; esac; '
)


def free_lock_command(owner: str, token: str) -> str:
    """`lock_host.py acquire OWNER 0` with its free-lock path in sh, where no python need start on
    the host.

    As the script does: the lock is built complete beside (`<lock>.new-<token>`: the take's marker
    and owner.json) and renamed into place by `mv -nT` (renameat2 RENAME_NOREPLACE, as GNU mv does:
    it fails while anything is there, even an empty directory). Whether the lock is now this take's
    is judged by its marker in place, never by mv's exit status. The answer's one line names the
    machine (machine id, boot id) and adds only shell builtins to the path. Where the lock was not
    free, or anything here failed, the script runs and answers as it always does (its guard orders
    takeovers of a stale lock).
    """
    marker = _marker(token)
    return (
        f'_sglang_lock={_LOCK_SH}; _sglang_new="$_sglang_lock.new-{token}"\n'
        'if [ ! -e "$_sglang_lock" ] && mkdir -m 700 "$_sglang_new" 2>/dev/null; then '
        f': > "$_sglang_new/{marker}" && : > "$_sglang_new/alive" && '
        f'printf \'%s\' {owner} > "$_sglang_new/owner.json" && '
        'mv -nT "$_sglang_new" "$_sglang_lock" 2>/dev/null; '
        '[ -e "$_sglang_new" ] && rm -rf "$_sglang_new"; fi\n'
        f'if [ -e "$_sglang_lock/{marker}" ]; then {_IDENTITY_SH}'
        'printf \'{"acquired": true, "machine": "%s", "boot": "%s"}\\n\' '
        '"$_sglang_machine" "$_sglang_boot"; else\n'
        f"{remote.command('lock_host', 'acquire', owner, '0')}\nfi"
    )


def release_command(token: str) -> str:
    """`lock_host.py release TOKEN`: a lock holding this take's marker is renamed aside and removed
    in sh (so it is never seen half-removed); any other (held by another take) goes to the script,
    which compares owner.json."""
    return (
        f'_sglang_lock={_LOCK_SH}; _sglang_old="$_sglang_lock.old-{token}"\n'
        f'if [ -e "$_sglang_lock/{_marker(token)}" ]; then '
        'mv -T "$_sglang_lock" "$_sglang_old" && rm -rf "$_sglang_old" && '
        'echo \'{"released": true}\'; else\n'
        f"{remote.command('lock_host', 'release', shlex.quote(token))}\nfi"
    )


def _marker(token: str) -> str:
    # The take's token is a uuid hex: a plain file name (lock_host.py writes the same marker).
    if not _TOKEN.fullmatch(token or ""):
        raise ValueError(f"lock token {token!r} is not a uuid hex")
    return f"owner-{token}"


def _machine(answer: dict) -> tuple[str, str] | None:
    """The machine a lock command's answer came from (machine id, boot id); None where it did not
    say."""
    machine, boot = answer.get("machine"), answer.get("boot")
    return (machine, boot or "") if isinstance(machine, str) and machine else None


@dataclass
class Outcome:
    held: bool
    holder: dict | None = None
    waited_s: float = 0.0
    error: str | None = None
    # why this host was refused whole (it is the machine of another host of the run)
    refused: str | None = None


@dataclass
class _Slot:
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

    def __init__(self, owner: dict | None = None, on_taken: Callable[[_Slot], None] | None = None,
                 read_for: Callable[[object], object | None] | None = None):
        self.owner = owner or new_owner()
        # called as each lock is taken, before the pass goes on to the next
        self.on_taken = on_taken
        # read_for(host): the host's read (an object with a shell `command`) to run in the same call
        # that takes its lock, or None. Once taken, slot.running holds (that read, a greenlet giving
        # (exit status, output lines, stderr)).
        self.read_for = read_for
        self.slots: dict[str, _Slot] = {}  # by inventory name
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

    def _try(self, slot: _Slot, wait_s: float) -> dict:
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

    def _run_with_read(self, slot: _Slot, lock_command: str, read, token: str,
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
        script = f"{lock_command}\nif [ -e {_LOCK_SH}/{_marker(token)} ]; then\n{read.command}\nfi"
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

    def _give_back(self, slot: _Slot, why: str) -> None:
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
            slot = self.slots.setdefault(host.name, _Slot(host, lock_order(host)))
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

    def _attempt(self, slot: _Slot, wait_s: float, failed: dict, pending: list) -> dict | None:
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

    def _same_machine(self, slot: _Slot, result: dict) -> _Slot | None:
        """Another host of this run that is the machine `slot`'s answer came from, or None."""
        holder = result.get("held_by") or {}
        if not result["acquired"] and holder.get("id") == self.owner["id"]:
            # The machine's lock is held by this very run: it took it under another inventory name.
            taker = next((s for s in self.slots.values()
                          if s is not slot and s.token and s.token == holder.get("token")), None)
            if taker is not None:
                return taker
        slot.machine = _machine(result) or slot.machine
        if slot.machine is None:
            return None
        return next((s for s in self.slots.values() if s is not slot and s.machine == slot.machine),
                    None)

    def _refuse(self, slot: _Slot, other: _Slot, failed: dict, pending: list) -> None:
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


class _Run(BaseStateCallback):
    """The process's one run: the barrier at which all hosts arrive, its locks, its callbacks."""

    def __init__(self, state, executing: bool, waits: dict[str, float] | None = None):
        self.state = state
        self.executing = executing
        # Each host's validated lock_wait_s, for hosts locked before their own load arrives
        # (deploy.py passes them).
        self.waits = dict(waits or {})
        self.expected = {h.name: h for h in state.inventory.get_active_hosts()}
        # pyinfra loads at most this many hosts at once (--parallel, or 20 per CPU): no more can
        # arrive together.
        self.at_once = getattr(getattr(state, "pool", None), "size", None) or len(self.expected)
        self.arrived: dict[str, tuple[object, float]] = {}
        self.taking = False
        self.ready = threading.Event()
        self.on_held: dict[str, Callable[..., None]] = {}
        self.reads: dict[str, Callable[[object], object | None]] = {}
        self.locks = RunLocks(on_taken=self._taken, read_for=self._read_for)
        self.mutex = threading.Lock()

    def _taken(self, slot: _Slot) -> None:
        self._tell_held(slot.host, slot.running)

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
            raise HostLocked(f"{host.name}: hosts {missing} did not reach the deploy lock within "
                             f"{ARRIVAL_TIMEOUT_S} s of the others")

    def _take(self) -> None:
        # Hosts that could not load yet (more hosts than pyinfra loads at once) are locked with the
        # others, with their data's lock_wait_s as given (their own load validates it).
        hosts = [self.arrived.get(name) or (h, float(self.waits.get(name, DEFAULT_WAIT_S)))
                 for name, h in sorted(self.expected.items())]
        for host, _ in hosts:
            watch_connection(host)
            send_without_delay(host)
        if self.executing:
            self.locks.take_all(hosts)
        else:
            self._peek(hosts)

    def _peek(self, hosts) -> None:
        """--dry: look at each host's lock (taking none), and refuse hosts that answer as one
        machine, as a run does."""
        machines: dict[tuple[str, str], str] = {}
        for host, _ in hosts:
            try:
                answer = self.locks._command(host, "peek", timeout=60)
            except Exception:
                answer = {}  # the plan's own facts will say what is wrong with the host
            holder = answer.get("held_by")
            if holder:
                host.log(f"--dry takes no lock; another deploy holds it: {describe(holder)} (this "
                         "plan may change when it ends)", log_func=logger.warning)
            machine = _machine(answer)
            first = machines.setdefault(machine, host.name) if machine else host.name
            if first != host.name:
                message = same_machine_message(first, host.name, machine)
                for name in (first, host.name):
                    if name not in self.locks.outcomes:
                        self.locks.outcomes[name] = Outcome(False, refused=message)
        for host, _ in hosts:
            if host.name not in self.locks.outcomes:
                self._tell_held(host)

    # -- pyinfra callbacks ----------------------------------------------------------------
    def operation_end(self, state, op_hash):
        for host in list(state.failed_hosts):
            if host.name in self.locks.held_host_names():
                self.locks.host_done(host, "the host failed")

    def host_disconnect(self, state, host):
        self.locks.host_done(host, "the run ended")


DEFAULT_WAIT_S = float(GLOBAL_KEYS["lock_wait_s"].default)


def _executing(argv: list[str] | None = None) -> bool:
    """Will this pyinfra run execute operations (not `--dry`, not a `--json` plan without `-y`)?

    Read from click's context where it is visible, else from the command line: pyinfra loads
    `deploy.py` in greenlets, and click keeps its context in a (greenlet-)local of the main one.
    """
    import sys

    import click

    ctx = click.get_current_context(silent=True)
    if ctx is not None and "dry" in ctx.params:
        dry, yes, as_json = (bool(ctx.params.get("dry")), bool(ctx.params.get("yes")),
                             bool(ctx.params.get("json_output")))
    else:
        args = list(argv if argv is not None else sys.argv[1:])
        args = args[: args.index("--")] if "--" in args else args
        short = [a[1:] for a in args if a.startswith("-") and not a.startswith("--")]
        dry, as_json = "--dry" in args, "--json" in args
        yes = "--yes" in args or any("y" in flags and set(flags) <= {"v", "y"} for flags in short)
    return not dry and not (as_json and not yes)


def holds(host) -> bool:
    """Does this run hold `host`'s deploy lock now? Never under `--dry` (it takes none) nor in a
    view."""
    host = real_host(host)
    run = run_state.found(host.state)
    return (run is not None and run.locks is not None
            and host.name in run.locks.locks.held_host_names())


def acquire(host, state, wait_s: int, on_held: Callable[..., None] | None = None,
            read: Callable[[object], object | None] | None = None,
            waits: dict[str, float] | None = None) -> None:
    """Take this run's locks (the last host to arrive takes all of them), then fail `host` alone if
    its lock was not had.

    `on_held(host)` is called as soon as the host's lock is taken (with `--dry`, once its lock is
    looked at), while the pass goes on to the next host: the deploy begins the host's read there
    (host_reads.start_read). `read(host)` gives the host's read to begin in the very command that
    takes its lock (host_reads.lock_read): then `on_held(host, (that read, its output))` is called
    instead.
    A host that is the machine of another host of the run is refused, with `--dry` too.
    `waits`: every host's validated `lock_wait_s` by name (a host may be locked before its own load
    arrives).
    """
    host = real_host(host)
    state = host.state
    kept = run_state.of(state)
    if kept.locks is None:
        kept.locks = _Run(state, _executing(), waits)
        state.add_callback_handler(kept.locks)
    run = kept.locks
    run.arrive(host, wait_s, on_held, read)
    outcome = run.locks.outcomes.get(host.name)
    if outcome is None or outcome.held:
        return
    if outcome.refused:
        message = f"{host.name}: refused: {outcome.refused}"
    elif outcome.error:
        message = f"{host.name}: could not take the deploy lock: {outcome.error}"
    else:
        message = locked_message(host.name, outcome.holder, outcome.waited_s, run.locks.owner)
    if not any(name not in run.locks.outcomes or run.locks.outcomes[name].held
               for name in run.expected):
        raise HostLocked(message)  # no host of this run can go on: stop the run with the reason
    # This host alone fails (pyinfra goes on with the others): its load ends here, before any
    # operation is added.
    host.log_styled(message, fg="red", log_func=logger.error)
    state.fail_hosts({host})
    raise gevent.GreenletExit
