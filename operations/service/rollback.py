"""Automatic rollback: a change that leaves a service failing readiness is undone.

Before a deploy overwrites a service's unit, its preflight (`preflight.passed`) copies the unit that
is there (the one the service runs with) to `BACKUP_DIR`. If the service, restarted by this
run, then fails its readiness gate, `readiness.ready` calls `undo()`: the saved unit is put
back, every venv this run switched to a new generation is switched back to the previous one
(patch sets live inside a generation, so they go back with it), the unit is restarted and
its readiness confirmed. The host still fails, with a message that says what was rolled
back and why; the journal tail of the failed start is logged before that.

The deploy's state on a host (`STATE_DIR`: these saved units, and service/on_host/service_state.py's
records of what each started service loaded, which hold the sha256 of its key file) is root's alone:
the directories 0700 (`state_private`, on every run: an older 0755 one is tightened), the records
0600.

Not rolled back: staged models (a model is replaced only by its new complete copy, and a
changed model keeps its name) and the API-key file (its content comes from the secrets
source, which the operator changed on purpose).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Callable

from pyinfra import host
from pyinfra.facts.files import Directory

from configuration.host_paths import STATE_DIR
from operations import remote
from operations.run import directory, host_reads
from operations.run.host_reads import operation

BACKUP_DIR = f"{STATE_DIR}/rollback"
RECORD_DIR = f"{STATE_DIR}/started"  # service/on_host/service_state.py: RECORD_DIR


STEP_TIMEOUT_S = 300  # one step of a rollback on the host
RESTART_MARGIN_S = 120  # a restart beyond its unit's drain: the kill of what is left, the start


def backup_path(unit_name: str) -> str:
    return f"{BACKUP_DIR}/{unit_name}"


def save_command(unit_path: str, unit_name: str) -> str:
    """Keep a copy of the unit the service runs with; `preflight.passed` runs it once the new unit
    passed."""
    backup = shlex.quote(backup_path(unit_name))
    # install -d also tightens directories that exist (an older deploy made them 0755).
    return (f"install -d -m 0700 {STATE_DIR} {BACKUP_DIR} && cp -p {shlex.quote(unit_path)} "
            f"{backup}.tmp && mv -f {backup}.tmp {backup}")


@dataclass
class Restorable:
    """What `undo()` may restore for one service, each part known only once the run executes."""

    unit_path: str
    unit_name: str
    unit_changed: Callable[[], bool]
    # (venv_path, "this run switched it to a new generation")
    venvs: list[tuple[str, Callable[[], bool]]] = field(default_factory=list)
    # the unit's drain (its `stop_timeout_s`, TimeoutStopSec): the restart waits for it first
    stop_timeout_s: int = 60

    def parts(self) -> tuple[bool, list[str]]:
        return self.unit_changed(), [path for path, switched in self.venvs if switched()]


def undo(host, plan: Restorable) -> tuple[list[str], str | None]:
    """Restore the saved unit and the previous venv generations; restart. Returns (what was rolled
    back, error)."""
    unit_changed, venvs = plan.parts()
    done, commands = [], []
    backup = backup_path(plan.unit_name)
    if unit_changed:
        commands.append(f"test -f {shlex.quote(backup)} && cp -p {shlex.quote(backup)} "
                        f"{shlex.quote(plan.unit_path)} && systemctl daemon-reload")
        done.append(f"unit {plan.unit_name} (the previous one)")
    for path in venvs:
        commands.append(remote.command("venv_switch", shlex.quote(path), "--previous"))
        done.append(f"venv {path} (the previous generation)")
    if not commands:
        return ([], "nothing this run changed can be rolled back (a new service, or a change of "
                    "models or API keys)")
    commands.append(f"systemctl restart {shlex.quote(plan.unit_name)}")
    for command in commands:
        # The restart first stops what runs (the failed change), draining up to its stop timeout.
        bound = (max(STEP_TIMEOUT_S, plan.stop_timeout_s + RESTART_MARGIN_S)
                 if command.startswith("systemctl restart ") else STEP_TIMEOUT_S)
        ok, output = host.run_shell_command(command, print_output=False, _timeout=bound)
        if not ok:
            return (done, f"rollback step failed: {command.splitlines()[0][:120]}: "
                          f"{' '.join(output.stderr.split())[-300:]}")
    return done, None


@operation()
def state_private(create: bool = True):
    """
    Keep the deploy's state directory on the host root's alone: it holds saved units and the records
    of what each service was started with (the sha256 of its key file among them).

    + create: make the directories where they are missing (a host that runs services); else only
      tighten those an older deploy left (mode 0755)

    **Example:**

    .. code:: python

        rollback.state_private(name="State directory /var/lib/sglang-deploy is root's alone")
    """
    for path in (STATE_DIR, RECORD_DIR, BACKUP_DIR):
        if not create and host_reads.get(host, Directory, path=path) is None:
            host.noop(f"directory {path} does not exist")
            continue
        yield from directory.present._inner(path=path, user="root", group="root", mode="700")
