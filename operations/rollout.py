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
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import host, logger
from pyinfra.api import FunctionCommand

from configuration.typed import HostConfig, Service
from operations.host_reads import operation
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
    failed = rollouts.FAILED_GATES.get(host.name) or []
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
    if not rollouts.FAILED_GATES.get(host.name):
        host.noop("every readiness gate on this host passed")
        return
    yield FunctionCommand(_failed_gates, (), {})


def hold_reason(service: Service, host_name: str):
    """A flag for `lifecycle.running` / `readiness.ready`: why `service`'s replica on `host_name`
    must not restart now (its service's rollout halted earlier in this run), or None. Read while the
    run executes."""

    def reason() -> str | None:
        found = rollouts.halted(service.definition)
        if found is None or found.replica == f"{host_name}/{service.name}":
            return None
        return (f"the rollout of {service.definition} halted: {found.replica} failed its readiness "
                f"gate ({found.reason[:120]})")

    return reason

