"""What earlier operations of this run did, as later operations may ask it.

pyinfra adds every operation before it executes any: an operation's `did_change()` is known only
while executing. Before that (pyinfra's change check, and all of `--dry`), an operation that depends
on an earlier one's change judges by the host's state alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyinfra import host
from pyinfra.api.operation import OperationMeta


def changed(flag: Callable[[], bool] | None) -> bool:
    """Did `flag` (e.g. `any_changed(op, ...)`, or a service's `restarted`) report a change in this
    run? False until the run executes, and where no flag was given."""
    return bool(host.state.is_executing and flag is not None and flag())


def executing() -> bool:
    """Is the run executing operations (not adding them, not `--dry`)?"""
    return bool(host.state.is_executing)


def any_of(*flags: Callable[[], bool]) -> Callable[[], bool]:
    """A flag that reports a change when any of `flags` does."""
    return lambda: any(flag() for flag in flags)


@dataclass(frozen=True)
class Inputs:
    """Operations of this run whose result a service's process loads (its venv, patch sets, models,
    key file), by the name each was added with; `conditional`: an operation with an `_if`, which
    pyinfra plans as changing whatever its condition will say. Called, it answers whether any of
    them changed (as pyinfra's `any_changed`)."""

    ops: tuple[tuple[str, OperationMeta, bool], ...]

    def __call__(self) -> bool:
        return any(meta.did_change() for _, meta, _ in self.ops)

    def metas(self) -> list[OperationMeta]:
        return [meta for _, meta, _ in self.ops]

    def planned(self) -> list[str]:
        """The names of those planned to change: before execution (and all of `--dry`) only a plan
        is known. A conditional operation changes only when the operations its condition reads
        change, judged on their own."""
        return [name for name, meta, conditional in self.ops
                if not conditional and meta.will_change]
