"""One command on a host outside an operation's own commands, with a time bound that names what it
waited for.

pyinfra runs an operation's commands with no time limit unless told, and its `run_shell_command`
raises a bare `TimeoutError` when `_timeout` passes. A deploy that waits on a host that stopped
answering (a hung `systemctl`, an NFS store that stalls a hash) should stop saying what it waited
for, not hang, and not print a traceback. `run` gives every such call a bound and turns the timeout
into a failed call with one line that names it (tests/unit/test_time_bounds.py: every call has a
bound).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import logger


@dataclass(frozen=True)
class NoAnswer:
    """What a call that timed out gave back, shaped as pyinfra's output is read here."""

    stderr: str
    stdout: str = ""


def run(host, command, what: str, timeout_s: float, **arguments):
    """`host.run_shell_command(command)` within `timeout_s`; past it, (False, its one line as
    stderr), logged on the host naming `what`."""
    try:
        return host.run_shell_command(command, print_output=False, _timeout=timeout_s,
                                      **arguments)
    except TimeoutError:
        said = f"{what}: no answer from {host.name} within {timeout_s:g} s"
        host.log_styled(said, fg="red", log_func=logger.error)
        return False, NoAnswer(said)
