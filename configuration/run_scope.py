"""What one run keeps, kept on the run itself: pyinfra's `State` (one per `pyinfra ... deploy.py`),
never in module globals. A second run in the same process (a test, a bench, a view after a deploy)
starts with none of it, and nothing outlives the run.

    record = run_scope.of(state, Record)   # the run's one Record, made by the first ask

Each kind of record (a dataclass with defaults) belongs to the one module that defines it, which
alone reads and writes it: the run's reads and transfers (operations/run/run_state.py), the printed
report's rows, plans and halts (report/), the validated inventory (configuration/settings.py).
It sits in the lowest layer so that every layer keeps its per-run state the same way.
"""

from __future__ import annotations

import threading
from typing import TypeVar

T = TypeVar("T")

_ATTRIBUTE = "sglang_deploy_run"
_MAKING = threading.Lock()  # two greenlets' or threads' first asks make one record


def of(state, kind: type[T]) -> T:
    """The run's record of `kind`: made (`kind()`) on first ask, kept on `state` for the run's
    life."""
    kept = found(state, kind)
    if kept is None:
        with _MAKING:
            records = getattr(state, _ATTRIBUTE, None)
            if records is None:
                records = {}
                setattr(state, _ATTRIBUTE, records)
            kept = records.get(kind)
            if kept is None:
                kept = records[kind] = kind()
    return kept


def found(state, kind: type[T]) -> T | None:
    """The run's record of `kind` where a module made it, else None (asks nothing into being)."""
    return getattr(state, _ATTRIBUTE, {}).get(kind)
