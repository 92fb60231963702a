"""Rollouts: the order in which a change that restarts a service reaches its replicas.

A service placed on several hosts (or several times on one) has replicas
(configuration/placement.py). A run restarts them in waves: the canaries first (`canary`), then the
rest in inventory order, at most `max_unavailable` replicas per wave (a number, or a percentage of
the replicas, rounded down, at least 1). Every service's waves are numbered from 0; wave `w` of
every service runs at once, and each wave's readiness gates pass before any replica of the next wave
restarts.

The waves are a pure function of the validated inventory (`fleet`), so every host computes the same
ones and `deploy.py` declares each wave's operations inside `host.loop(...)` over the same list on
every host, each wave opened by `wave(...)` on every host: pyinfra orders operations by their call
site and loop position, in a graph of each host's own sequence, and runs each one on every host
before the next, so a wave's restarts (and then its gates) run in parallel across hosts, and wave
w+1 starts only after every host's wave w (its gates included).

A replica that fails its gate (and is rolled back, as before) halts its service
(report/rollouts.py): a later wave's replica of that service is not restarted (`lifecycle.running`'s
`held`), and keeps its old unit and process. Other services go on. A replica with nothing to restart
passes its wave at once (a wave is a fixed group of replicas, as Ansible's `serial` batches are).

Before a replica that runs is restarted, the wave counts who serves now, not only what this run
restarted (`Hold`, `short_of`): every other replica of its service is asked on its own host
(`Probe`, through `placement.answers_now`), and a restart that would leave fewer serving than
`replicas - wave_size(max_unavailable)` is held before it happens: the replica keeps its unit and
process, the rollout halts (`HELD_BEFORE_RESTART`), and the host fails after its waves, naming the
replicas that are down. A replica that is down itself may still start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import gevent
from pyinfra import host, logger
from pyinfra.api import FunctionCommand

from configuration.typed import HostConfig, Service
from operations.run.host_reads import operation
from operations.service import placement
from report import rollouts


@dataclass(frozen=True)
class Replica:
    host: str
    name: str  # the replica's name on its host (its unit is sglang-<name>.service)
    service: str  # the service it is a replica of

    def __str__(self) -> str:
        return f"{self.host}/{self.name}"


def wave_size(max_unavailable: int | str, replicas: int) -> int:
    """Replicas per wave: `max_unavailable` as a number, or as a percentage of `replicas` rounded
    down (Kubernetes rounds maxUnavailable down too), at least 1."""
    if isinstance(max_unavailable, str):
        return max(1, replicas * int(max_unavailable.rstrip("%")) // 100)
    return max(1, int(max_unavailable))


def service_waves(replicas: list[Replica], max_unavailable: int | str,
                  canary: int | tuple[str, ...]) -> list[list[Replica]]:
    """One service's replicas (in inventory order) in waves: its canaries first, each group at most
    `wave_size`."""
    if isinstance(canary, int):
        first = replicas[:canary]
    else:
        named = set(canary)
        by_host = {}
        for replica in replicas:
            by_host.setdefault(replica.host, []).append(replica)
        first = [r for r in replicas
                 if str(r) in named or (r.host in named and len(by_host[r.host]) == 1)]
    rest = [r for r in replicas if r not in first]
    size = wave_size(max_unavailable, len(replicas))
    return [group[i:i + size] for group in (first, rest) for i in range(0, len(group), size)]


@dataclass(frozen=True)
class Rollout:
    """One service's rollout over its replicas: its keys (every replica shares them) and its waves,
    canaries first."""

    service: Service  # its first replica, for the rollout keys
    waves: list[list[Replica]]

    @property
    def canaries(self) -> list[Replica]:
        return self.waves[0] if self.service.canary and self.waves else []

    def described(self) -> dict:
        """As the plan view shows it (report/plan_view.py `record_rollouts`)."""
        count = sum(len(w) for w in self.waves)
        canary = self.service.canary
        return {"replicas": count, "max_unavailable": self.service.max_unavailable,
                "wave_size": wave_size(self.service.max_unavailable, count),
                "canary": canary if isinstance(canary, int) else list(canary),
                "waves": [[str(r) for r in w] for w in self.waves]}


def fleet(configs: dict[str, HostConfig]) -> dict[str, Rollout]:
    """service -> its rollout, over every host of the inventory (`configs` in inventory order)."""
    replicas: dict[str, list[Replica]] = {}
    first: dict[str, Service] = {}
    for host_name, config in configs.items():
        for service in config.services:
            replicas.setdefault(service.definition, []).append(
                Replica(host_name, service.name, service.definition))
            first.setdefault(service.definition, service)
    return {name: Rollout(first[name],
                          service_waves(found, first[name].max_unavailable, first[name].canary))
            for name, found in sorted(replicas.items())}


def old_replica(rollout_: Rollout, configs: dict[str, HostConfig]) -> tuple[str, Service] | None:
    """A replica that is still on the old version while the canaries are gated (the first of the
    later waves), as (host, its Service), for the canary's comparison; None without one."""
    later = [r for wave in rollout_.waves[1:] for r in wave]
    if not rollout_.canaries or not later:
        return None
    first = later[0]
    found = [s for s in configs[first.host].services if s.name == first.name]
    return (first.host, found[0]) if found else None


def host_waves(rollouts_: dict[str, Rollout], host_name: str) -> list[list[tuple[str, bool]]]:
    """This host's replicas, wave by wave, each as (name, whether it is a canary): as many waves on
    every host (the longest rollout's), empty where the host has no replica in a wave, so the waves'
    operations line up across hosts."""
    out: list[list[tuple[str, bool]]] = [
        [] for _ in range(max((len(r.waves) for r in rollouts_.values()), default=0))]
    for rollout in rollouts_.values():
        for index, wave in enumerate(rollout.waves):
            out[index] += [(r.name, r in rollout.canaries) for r in wave if r.host == host_name]
    return out


@operation()
def wave(number: int, of: int):
    """
    The start of a rollout's wave on every host, with nothing to do: it orders the waves across
    hosts.

    + number: the wave, from 1
    + of: how many waves this run has

    pyinfra orders operations by a graph of each host's own sequence: an operation only one host
    adds (a restart in wave 2 on the host whose replica is in wave 2) would otherwise be free to run
    before another host's gate of wave
    1. This operation, added by every host at the same place, follows every host's wave before it.
    """
    host.noop(f"rollout wave {number} of {of}")
    return
    yield


def _failed_gates(state, host) -> bool:
    failed = rollouts.failed_gates(host.state, host.name)
    if failed:
        host.log_styled(f"readiness gates failed on this host: {'; '.join(failed)}", fg="red",
                        log_func=logger.error)
    return not failed


@operation()
def gates_passed():
    """
    Fail the host where one of its replicas failed its readiness gate in this run (after every
    wave).

    The gate itself records the failure (and rolls the replica back) and lets the run go on: the
    other replicas of its wave on this host are still gated, each with its own rollback, and other
    services' later waves still run here (its own service's are held: report/rollouts.py). The host
    fails here, before the cleanup, as it failed at the gate before rollouts: nothing is removed
    from a host whose change failed.
    """
    # read while executing: the gates before it have run
    if not rollouts.failed_gates(host.state, host.name):
        host.noop("every readiness gate on this host passed")
        return
    yield FunctionCommand(_failed_gates, (), {})


def replicas(rollout_: Rollout) -> list[Replica]:
    """Every replica of the rollout, in wave order."""
    return [r for wave in rollout_.waves for r in wave]


class Probe:
    """Does a replica serve now? None when it does, else why not: asked on its own host at this
    moment through `placement.answers_now` (active, `/health` 200, and the port's answer comes
    from a process of the replica's own unit), never from an answer read earlier in the run.

    An answer that it serves is kept for this probe's life (`probe_of` makes one per wave: the
    unit write's check and the restart's ask the same question twice); one that it does not is
    asked again every time (it may have come back)."""

    def __init__(self, state, configs: dict[str, HostConfig]) -> None:
        self.state = state
        self.placed = {f"{p.host}/{p.replica}": p
                       for found in placement.placements(configs).values() for p in found}
        self.cleared: set[str] = set()

    def __call__(self, replica: Replica) -> str | None:
        key = str(replica)
        if key in self.cleared:
            return None
        placed = self.placed.get(key)
        why = (placement.answers_now(self.state, placed) if placed is not None
               else f"{key} is not placed in the inventory")
        if why is None:
            self.cleared.add(key)
        return why


def probe_of(state, configs: dict[str, HostConfig]) -> Probe:
    """A fresh `Probe` over the inventory's replicas (`configs`: every host's validated
    configuration). deploy.py makes one per host and wave, so every wave counts anew, earlier
    waves' replicas included (one that passed its gate and died since is counted down)."""
    return Probe(state, configs)


def down_beside(service: Service, host_name: str, rollout_: Rollout,
                probe: Callable[[Replica], str | None]) -> dict[str, str]:
    """The other replicas of `service`'s rollout (not `service`'s own replica on `host_name`) that
    do not serve now, each asked afresh by `probe`, all at once: host/replica -> why not, in wave
    order."""
    me = f"{host_name}/{service.name}"
    asked = [(r, gevent.spawn(probe, r)) for r in replicas(rollout_) if str(r) != me]
    gevent.joinall([job for _, job in asked])
    # a probe that raised counts as down, with what it raised
    answers = {str(r): (job.value if job.successful() else
                        f"{r} could not be asked ({type(job.exception).__name__}: {job.exception})")
               for r, job in asked}
    return {replica: why for replica, why in answers.items() if why is not None}


def short_of(service: Service, host_name: str, rollout_: Rollout,
             probe: Callable[[Replica], str | None], restarting: set[str]) -> str | None:
    """Why restarting `service`'s replica on `host_name` now would leave fewer replicas serving
    than its data allows (`replicas - wave_size(max_unavailable)`), naming those down; or None.

    Going down with it: the replicas that do not serve now (`down_beside`), and its wave's other
    replicas whose host's plan restarts them (`restarting`: they restart at the same time;
    report/rollouts.py `Rollouts.restarting`)."""
    every = replicas(rollout_)
    allowed = len(every) - wave_size(service.max_unavailable, len(every))
    if allowed <= 0:
        return None  # it may take every replica down at once: nothing to count
    me = f"{host_name}/{service.name}"
    down = down_beside(service, host_name, rollout_, probe)
    wave_ = next((w for w in rollout_.waves if me in map(str, w)), [])
    going = {me, *(str(r) for r in wave_ if str(r) in restarting)}
    serving = len(every) - len(going | set(down))
    if serving >= allowed:
        return None
    named = "; ".join(f"{replica} ({why[:160]})" for replica, why in down.items())
    return (f"restarting {me} now would leave {serving} of {len(every)} replicas of "
            f"{service.definition} serving, fewer than the {allowed} its max_unavailable "
            f"({service.max_unavailable}) allows; not serving now: {named or 'none'}")


class Hold:
    """A flag for `lifecycle.running`, the unit write and `readiness.ready`: why `service`'s replica
    on `host_name` must not (re)start now, or None. Read while the run executes; called with
    `restarting`, whether this run would restart (or stop) the replica where it runs now.

    - Its service's rollout halted earlier in this run (another replica failed its gate): held.
    - It would restart, and restarting it would leave too few replicas serving (`short_of`): held
      before its restart; that halts the rollout (`HELD_BEFORE_RESTART`) and fails the host, so the
      run ends non-zero naming the replicas that are down. A replica that is down itself may still
      start (it only adds a serving replica), also after such a halt.

    Once held, it stays held for the run: the gate after it says so, whatever the count reads
    later."""

    def __init__(self, state, service: Service, host_name: str, rollout_: Rollout | None = None,
                 probe: Callable[[Replica], str | None] | None = None,
                 planned: bool = False) -> None:
        self.state = state  # the run's: its halts and restarting replicas (report/rollouts.py)
        self.service = service
        self.host_name = host_name
        self.rollout = rollout_
        self.probe = probe
        self.replica = f"{host_name}/{service.name}"
        self.why: str | None = None
        if planned:
            rollouts.of(state).restarting.add(self.replica)

    def __call__(self, restarting: bool = False) -> str | None:
        if self.why is None:
            self.why = self._reason(restarting)
        return self.why

    def _reason(self, restarting: bool) -> str | None:
        found = rollouts.halted(self.state, self.service.definition)
        if found is not None and found.replica != self.replica and (
                restarting or found.what != rollouts.HELD_BEFORE_RESTART):
            return (f"the rollout of {self.service.definition} halted: {found.replica} "
                    f"{found.what} ({found.reason[:200]})")
        if not restarting or self.rollout is None or self.probe is None:
            return None
        why = short_of(self.service, self.host_name, self.rollout, self.probe,
                       rollouts.of(self.state).restarting)
        if why is not None:
            rollouts.halt(self.state, self.service.definition, self.replica, why,
                          what=rollouts.HELD_BEFORE_RESTART)
            rollouts.gate_failed(self.state, self.host_name, self.service.name,
                                 f"held before its restart: {why}")
            logger.error(f"{self.replica}: HELD before its restart, on its old version: {why}")
        return why


def hold_reason(state, service: Service, host_name: str, rollout_: Rollout | None = None,
                probe: Callable[[Replica], str | None] | None = None,
                planned: bool = False) -> Hold:
    """The `Hold` flag of `service`'s replica on `host_name` in the run `state`; `rollout_` and
    `probe` count who
    serves before it restarts (without them, only a halt holds it); `planned`: its host's plan
    restarts it where it runs (`Plan.restarts_running`): a wave-mate's count takes it down too."""
    return Hold(state, service, host_name, rollout_, probe, planned)
