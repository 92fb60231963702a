"""Errors raised before any host is touched.

`DataError` subclasses pyinfra's own `PyinfraError`, so the pyinfra CLI prints the
message as-is (no traceback) and stops the whole run while it is still loading
`deploy.py`, before any operation executes on any host.
"""

from __future__ import annotations

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
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
