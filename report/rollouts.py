"""What this run's rollouts did, as the operations record it (operations/service/rollout.py) and the
summary prints it.

A replica that fails its readiness gate halts its service's rollout (`halt`): no later wave restarts
another replica of it in this run (`halted`), and each replica kept on its old version says so
(`record_held`). So does a replica held before its restart because too few of its service's
replicas serve (`HELD_BEFORE_RESTART`, operations/service/rollout.py `hold_reason`); that halt holds
only restarts: a later replica that is down may still start. The end-of-run summary prints one line
per halted service (`lines`): which replica failed (or was held) and why, and which replicas still
run the old version. Like `report.summary.REPORT`, the
store is the module's and is emptied when the summary is printed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# What the replica that halted a rollout did (`Halt.what`).
FAILED_GATE = "failed its readiness gate"
HELD_BEFORE_RESTART = "was held before its restart"


@dataclass
class Halt:
    replica: str  # host/replica that failed its gate, or was held before its restart
    reason: str
    held: list[str] = field(default_factory=list)  # host/replica kept on the old version since
    what: str = FAILED_GATE


# service -> its halt in this run
HALTS: dict[str, Halt] = {}
# host -> "replica: why" of each of its gates that failed in this run: the host fails once its waves
# are done (`operations/rollout.gates_passed`), so the other gates of a wave, and other services'
# later waves, still run there.
FAILED_GATES: dict[str, list[str]] = {}


# host/replica of each replica whose host's plan restarts its running process in this run (added
# while the deploy adds its operations, read while it executes): a wave's other replicas that go
# down with it when its count is taken (operations/service/rollout.py `hold_reason`).
RESTARTING: set[str] = set()


def gate_failed(host: str, replica: str, reason: str) -> None:
    FAILED_GATES.setdefault(host, []).append(f"{replica}: {reason}")


def halt(service: str, replica: str, reason: str, what: str = FAILED_GATE) -> None:
    """`replica` of `service` failed its gate (or `what` else it did): the first halt is the one the
    run names."""
    HALTS.setdefault(service, Halt(replica, reason, what=what))


def halted(service: str) -> Halt | None:
    return HALTS.get(service)


def record_held(service: str, replica: str) -> None:
    found = HALTS.get(service)
    if found is not None and replica != found.replica and replica not in found.held:
        found.held.append(replica)


def lines() -> list[str]:
    out = []
    for service, found in sorted(HALTS.items()):
        old = [found.replica, *found.held]
        out.append(f"ROLLOUT HALTED: service {service}: replica {found.replica} {found.what} "
                   f"({found.reason[:300]}); no further replica was restarted. "
                   f"{len(old)} replica(s) still run the old version ({', '.join(old)}); "
                   + ("bring the replicas named down back (or fix their hosts) and run the deploy "
                      "again to continue" if found.what == HELD_BEFORE_RESTART
                      else "fix the cause and run the deploy again to continue"))
    return out
