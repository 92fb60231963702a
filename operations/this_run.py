"""What earlier operations of this run did, as later operations may ask it.

pyinfra adds every operation before it executes any: an operation's `did_change()` is known only
while executing. Before that (pyinfra's change check, and all of `--dry`), an operation that depends
on an earlier one's change judges by the host's state alone.
"""

from __future__ import annotations

from typing import Callable

from pyinfra import host
from pyinfra.context import ContextObject


def changed(flag: Callable[[], bool] | None) -> bool:
    """Did `flag` (e.g. `any_changed(op, ...)`, or a service's `restarted`) report a change in this run?
    False until the run executes, and where no flag was given."""
    return bool(host.state.is_executing and flag is not None and flag())


def executing() -> bool:
    """Is the run executing operations (not adding them, not `--dry`)?"""
    return bool(host.state.is_executing)


def unproxied(obj):
    """The object behind pyinfra's context proxy (`from pyinfra import host`, `state`), which is empty outside the
    host's load; any other object as it is. Kept on the real host, a value outlives the load (host_reads, lock)."""
    return obj._get_module() if isinstance(obj, ContextObject) else obj
