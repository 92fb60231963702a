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

One lock's record and commands are lock_record.py's; the pass that takes a run's locks over its
hosts' connections is run_locks.py's; here, the run's barrier (`acquire`: the last host to arrive
takes every lock) and pyinfra's callbacks that give a lock back.
"""

from __future__ import annotations

import threading
from typing import Callable

import gevent
from pyinfra import logger
from pyinfra.api.state import BaseStateCallback

from configuration.settings import GLOBAL_KEYS
from operations.lock.lock_record import describe, locked_message, machine_of, same_machine_message
from operations.lock.run_locks import (
    HostLocked,
    Outcome,
    RunLocks,
    Slot,
    send_without_delay,
    watch_connection,
)
from operations.pyinfra_adapter import real_host
from operations.run import run_state

# How long a host's load may lag the others' before the lock step (only local work lies between).
ARRIVAL_TIMEOUT_S = 120


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

    def _taken(self, slot: Slot) -> None:
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
            machine = machine_of(answer)
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
