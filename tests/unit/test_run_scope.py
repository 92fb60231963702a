"""What one run keeps lives on the run (configuration/run_scope.py), never in module globals: a second run in the same
process (a test, a bench, the status view after a deploy) starts with none of the first's rows, halts or reads."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from bench import design
from configuration import run_scope
from report import plan_view, rollouts, summary

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Counter:
    seen: list = field(default_factory=list)


def test_a_record_is_made_once_per_run_and_never_shared_between_runs():
    first, second = SimpleNamespace(), SimpleNamespace()
    assert run_scope.found(first, Counter) is None  # asking whether it exists makes nothing
    run_scope.of(first, Counter).seen.append(1)
    assert run_scope.of(first, Counter).seen == [1] and run_scope.of(second, Counter).seen == []
    assert run_scope.found(first, Counter) is run_scope.of(first, Counter)


def test_concurrent_first_asks_make_one_record():
    run, made = SimpleNamespace(), []
    barrier = threading.Barrier(8)

    def ask():
        barrier.wait()
        made.append(run_scope.of(run, Counter))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(m) for m in made}) == 1


def test_a_second_run_in_the_same_process_starts_with_none_of_the_firsts_report():
    first, second = SimpleNamespace(), SimpleNamespace()
    summary.record(SimpleNamespace(name="gpu-a", state=first), "x", "-", "FAILED", "why")
    rollouts.halt(first, "x", "gpu-a/x", "exited at start")
    rollouts.gate_failed(first, "gpu-a", "x", "exited at start")
    plan_view.record(first, {"host": "gpu-a", "changes": []})
    assert summary.rows(second) == {} and rollouts.halted(second, "x") is None
    assert rollouts.failed_gates(second, "gpu-a") == [] and run_scope.of(second, plan_view.Plans).by_host == {}
    assert rollouts.halted(first, "x").replica == "gpu-a/x" and summary.rows(first)["gpu-a"]["x"]["state"] == "FAILED"


def test_no_module_keeps_a_runs_state_in_its_globals():
    """The class, not the cases: a module-level container a run fills (or a name rebound with `global`), in any layer
    of the deploy's code, is a store a second run would inherit. Registries that are no run's are named, with why, in
    bench/design.py's PROCESS_WIDE."""
    found = design.run_stores(ROOT, ("configuration", "operations", "report", "views", "deploys", "tools"))
    assert found == [], f"module-level run state: {found}; keep it on the run (configuration/run_scope.py)"
