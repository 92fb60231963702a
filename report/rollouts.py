"""What this run's rollouts did, as the operations record it (operations/service/rollout.py) and the
summary prints it.

A replica that fails its readiness gate halts its service's rollout (`halt`): no later wave restarts
another replica of it in this run (`halted`), and each replica kept on its old version says so
(`record_held`). So does a replica held before its restart because too few of its service's
replicas serve (`HELD_BEFORE_RESTART`, operations/service/rollout.py `hold_reason`); that halt holds
only restarts: a later replica that is down may still start. The end-of-run summary prints one line
per halted service (`lines`): which replica failed (or was held) and why, and which replicas still
run the old version. Like the summary's rows, all of it is the run's (`Rollouts`, kept on the run:
configuration/run_scope.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from configuration import run_scope

# What the replica that halted a rollout did (`Halt.what`).
FAILED_GATE = "failed its readiness gate"
HELD_BEFORE_RESTART = "was held before its restart"


@dataclass
class Halt:
    replica: str  # host/replica that failed its gate, or was held before its restart
    reason: str
    held: list[str] = field(default_factory=list)  # host/replica kept on the old version since
    what: str = FAILED_GATE


@dataclass
class Rollouts:
    # service -> its halt in this run
    halts: dict[str, Halt] = field(default_factory=dict)
    # host -> "replica: why" of each of its gates that failed in this run: the host fails once its
    # waves are done (`operations/service/rollout.gates_passed`), so the other gates of a wave, and
    # other services' later waves, still run there.
    failed_gates: dict[str, list[str]] = field(default_factory=dict)
    # host/replica of each replica whose host's plan restarts its running process in this run (added
    # while the deploy adds its operations, read while it executes): a wave's other replicas that go
    # down with it when its count is taken (operations/service/rollout.py `hold_reason`).
    restarting: set[str] = field(default_factory=set)


def of(state) -> Rollouts:
    return run_scope.of(state, Rollouts)


def gate_failed(state, host: str, replica: str, reason: str) -> None:
    of(state).failed_gates.setdefault(host, []).append(f"{replica}: {reason}")


def failed_gates(state, host: str) -> list[str]:
    return of(state).failed_gates.get(host) or []


def halt(state, service: str, replica: str, reason: str, what: str = FAILED_GATE) -> None:
    """`replica` of `service` failed its gate (or `what` else it did): the first halt is the one the
    run names."""
    of(state).halts.setdefault(service, Halt(replica, reason, what=what))


def halted(state, service: str) -> Halt | None:
    return of(state).halts.get(service)


def record_held(state, service: str, replica: str) -> None:
    found = of(state).halts.get(service)
    if found is not None and replica != found.replica and replica not in found.held:
        found.held.append(replica)


def lines(state) -> list[str]:
    out = []
    for service, found in sorted(of(state).halts.items()):
        old = [found.replica, *found.held]
        out.append(f"ROLLOUT HALTED: service {service}: replica {found.replica} {found.what} "
                   f"({found.reason[:300]}); no further replica was restarted. "
                   f"{len(old)} replica(s) still run the old version ({', '.join(old)}); "
                   + ("bring the replicas named down back (or fix their hosts) and run the deploy "
                      "again to continue" if found.what == HELD_BEFORE_RESTART
                      else "fix the cause and run the deploy again to continue"))
    return out
