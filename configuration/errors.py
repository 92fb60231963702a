"""Errors raised before any host is touched.

`DataError` subclasses pyinfra's own `PyinfraError`, so the pyinfra CLI prints the
message as-is (no traceback) and stops the whole run while it is still loading
`deploy.py`, before any operation executes on any host.
"""

from __future__ import annotations

import sys

from pyinfra.api.exceptions import PyinfraError


class DataError(PyinfraError):
    """Bad deploy data: names the file, the key path, the value and the fix."""

    def __init__(self, source: str, key_path: str, value: object, fix: str):
        self.source = source
        self.key_path = key_path
        self.value = value
        self.fix = fix
        shown = _show(value)
        super().__init__(f"{source}: {key_path}: {shown}: {fix}")


def _show(value: object) -> str:
    try:
        text = repr(value)
    # an int of more than 4300 digits, or a value holding one: Python will not write it out
    except ValueError:
        text = f"<{type(value).__name__} holding a number too long to show>"
    return text if len(text) <= 120 else text[:117] + "..."


def is_dry_run(host) -> bool:
    """True while `pyinfra --dry` plans (nothing will execute after it)."""
    return "--dry" in sys.argv[1:] and not host.state.is_executing


def fail_dry_run(host) -> None:
    """Make `pyinfra --dry` exit non-zero for a refusal the real run would make.

    Under --dry nothing executes, so an operation that would fail the host when it runs
    (a GPU check, a preflight) has only printed its verdict; pyinfra's CLI exits 1 exactly when
    the state has failed hosts, so the host is marked failed. Only under --dry: before a real
    run (its planning pass) the operation itself fails the host when it executes."""
    if is_dry_run(host):
        # Inside an operation `host` is pyinfra's context proxy: the set needs the Host itself.
        real = host.state.inventory.get_host(host.name)
        real.state.failed_hosts.add(real)
