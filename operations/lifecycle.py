"""A service's systemd lifecycle in one operation: loaded, enabled, running what its inputs are now.

One read of the unit's state (`readiness.ServiceState`, the same fact and arguments that
`readiness.changed_since_start` and `readiness.ready` read, so one answer from the host's read)
decides every command: `daemon-reload` when the unit file changed in this run, or systemd's loaded
copy is out of date and the unit is about to (re)start, `enable` when it is not, `start` when it is not running,
`restart` when it runs and something it loaded changed, and the record of what the (re)started
process loaded. pyinfra's `systemd.service` would read two more facts per call and take four
operations per service to say the same.
"""

from __future__ import annotations

import shlex
from typing import Callable

from pyinfra import host
from pyinfra.api import operation

from operations import readiness, remote

# pyinfra's SystemdStatus counts these sub-states as running (facts/systemd.py); so does this.
RUNNING = ("running", "waiting", "exited", "listening", "mounted")
# ...and these unit-file states as enabled (SystemdEnabled).
ENABLED = ("enabled", "static")


class Outcome:
    """What the operation did on this host, read by the readiness gate after it (known only while executing)."""

    def __init__(self) -> None:
        self.restarted = False

    def __call__(self) -> bool:
        return self.restarted


def _called(flag: Callable[[], bool] | None) -> bool:
    # OperationMeta.did_change is only known while executing; before, pyinfra's change check
    # and --dry judge by the host's state alone.
    return bool(host.state.is_executing and flag is not None and flag())


@operation()
def running(
    unit: str,
    unit_path: str,
    bind: str,
    port: int,
    inputs: tuple[str, ...],
    unit_changed: Callable[[], bool] | None = None,
    inputs_changed: Callable[[], bool] | None = None,
    outcome: Outcome | None = None,
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
    + outcome: an `Outcome` set when this run (re)started the unit

    A restart happens when the unit runs and an input changed, in this run or since it started
    (an earlier run stopped between a change and its restart). The record is written after
    any (re)start, and when no record covers the running process (a process started before
    records existed, or by hand).
    """
    state = readiness.service_state(unit, readiness.probe_address(bind), port, inputs)
    quoted = shlex.quote(unit)
    running = state.get("sub") in RUNNING
    newer = state.get("newer") or []
    # systemd flags a unit whose file is newer than its loaded copy, also after a mere `touch`: a
    # reload is due when this run rewrote the file, or when it will start the unit or restart it onto
    # a file whose content the process was not started with (a run that died before its reload).
    if _called(unit_changed) or (state.get("need_reload") and (not running or unit_path in newer)):
        yield "systemctl daemon-reload"
    if state.get("enabled") not in ENABLED:
        yield f"systemctl enable {quoted}"
    else:
        host.noop(f"{unit} is enabled")
    started = False
    if not running:
        yield f"systemctl start {quoted}"
        started = True
    elif _called(inputs_changed) or newer:
        yield f"systemctl restart {quoted}"
        started = True
    else:
        host.noop(f"{unit} runs its current inputs")
    if started or not state.get("recorded"):
        yield remote.command("service_state", "--record", quoted, *(shlex.quote(p) for p in inputs))
    if outcome is not None and host.state.is_executing:
        outcome.restarted = started
