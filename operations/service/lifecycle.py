"""A service's systemd lifecycle in one operation: loaded, enabled, running what its inputs are now.

The operation reads the unit's state once (`readiness.ServiceState`, the same fact and arguments
that `readiness.changed_since_start` and `readiness.ready` read: one answer from the host's read)
and `steps()`, a pure function of that state and of what this run changed, decides every command:
`daemon-reload` (the unit file changed in this run, or systemd's copy is out of date and the unit
is about to (re)start), `enable`, `start` or `restart` (something it loads changed), and the
record of what the (re)started process loaded. pyinfra's `systemd.service` would read two more
facts per call and take four operations per service to say the same.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable

from pyinfra import host

from operations import remote
from operations.run import this_run
from operations.run.host_reads import operation
from operations.service import readiness

# pyinfra's SystemdStatus counts these sub-states as running (facts/systemd.py); so does this.
RUNNING = ("running", "waiting", "exited", "listening", "mounted")
# ...and these unit-file states as enabled (SystemdEnabled).
ENABLED = ("enabled", "static")


class Restarted:
    """What the operation did on this host, read by the readiness gate after it (known only while
    executing)."""

    def __init__(self) -> None:
        self.restarted = False
        # why it was kept on its old version instead (its rollout halted)
        self.held: str | None = None

    def __call__(self) -> bool:
        return self.restarted


@dataclass(frozen=True)
class Steps:
    """What a unit needs, in this order: reload systemd, enable it, start or restart it, record its
    inputs."""

    reload: bool
    enable: bool
    start: bool
    restart: bool
    record: bool


def steps(state: dict, unit_path: str, unit_changed: bool, inputs_changed: bool) -> Steps:
    """The decision, from the unit's state (`readiness.ServiceState`) and what this run changed; no
    host access."""
    running = state.get("sub") in RUNNING
    newer = state.get("newer") or []
    start = not running
    restart = running and (inputs_changed or bool(newer))
    return Steps(
        # systemd flags a unit whose file is newer than its loaded copy, also after a mere `touch`:
        # a reload is due when this run rewrote the file, or before a start, or before a restart
        # onto a file whose content the process was not started with (a run that died before its
        # reload).
        reload=unit_changed or (bool(state.get("need_reload")) and (start or unit_path in newer)),
        enable=state.get("enabled") not in ENABLED,
        start=start,
        restart=restart,
        # After any (re)start, and where no record covers the running process (started before
        # records existed, or by hand).
        record=start or restart or not state.get("recorded"),
    )


@operation()
def running(
    unit: str,
    unit_path: str,
    bind: str,
    port: int,
    inputs: tuple[str, ...],
    unit_changed: Callable[[], bool] | None = None,
    inputs_changed: Callable[[], bool] | None = None,
    outcome: Restarted | None = None,
    held: Callable[..., str | None] | None = None,
    service: str = "",
):
    """
    Make ``unit`` loaded, enabled and running the inputs it has now; record what it started with.

    + unit: the service's systemd unit
    + unit_path: its unit file (one of ``inputs``)
    + bind: the address it binds (its /health is read from the host itself)
    + port: its port
    + inputs: the host paths its process loads (unit file, venv link, staged models' markers, key
      file); the state fact says which of them changed since the running process started
    + unit_changed: callable, true when this run rewrote the unit file
    + inputs_changed: callable, true when this run changed any of its inputs
    + outcome: a `Restarted` set when this run (re)started the unit
    + held: callable (`rollout.Hold`), why the unit must not (re)start now (its service's rollout
      halted in this run, or restarting it would leave too few replicas serving), or None; asked
      with ``restarting``: whether this is a restart of the running unit (not a start)
    + service: the replica's name, for the message when it is held

    A restart happens when the unit runs and an input changed, in this run or since it started
    (an earlier run stopped between a change and its restart). The record is written after
    any (re)start, and when no record covers the running process (a process started before
    records existed, or by hand).
    """
    state = readiness.service_state(unit, readiness.probe_address(bind), port, inputs)
    todo = steps(state, unit_path, unit_changed=this_run.changed(unit_changed),
                 inputs_changed=this_run.changed(inputs_changed))
    # A replica that is down only starts (it adds a serving replica); one that runs restarts: only
    # that is counted against the replicas that serve (rollout.Hold).
    why_held = (held(restarting=todo.restart)
                if held is not None and this_run.executing() and (todo.start or todo.restart)
                else None)
    if why_held:
        # Its service's rollout halted: this replica keeps its old unit and process (a later run
        # goes on).
        host.log(f"{service or unit}: HELD on its old version, not (re)started: {why_held}")
        if outcome is not None:
            outcome.held = why_held
        return
    quoted = shlex.quote(unit)
    if todo.reload:
        yield "systemctl daemon-reload"
    if todo.enable:
        yield f"systemctl enable {quoted}"
    else:
        host.noop(f"{unit} is enabled")
    if todo.start:
        yield f"systemctl start {quoted}"
    elif todo.restart:
        yield f"systemctl restart {quoted}"
    else:
        host.noop(f"{unit} runs its current inputs")
    if todo.record:
        yield remote.command("service_state", "--record", quoted, *(shlex.quote(p) for p in inputs))
    if outcome is not None and this_run.executing():
        outcome.restarted = todo.start or todo.restart
