"""Placement: which services run on a host is host data; what is no longer placed there goes.

- `placement.unplaced_removed(keep=..., elsewhere=...)` stops, disables and removes the units of
  our services that the inventory no longer places on the host: only `sglang-*.service` units
  that carry our "Managed by sglang-deploy" header, never the boot staging unit, nothing else.
  Their staged models are released by `models.unused_removed` (it keeps the models of the
  services still placed on the host).
- `remove_unplaced(config)` adds it for a host; the `Cleanup` component (deploys/cleanup.py) calls
  it after the readiness gates. pyinfra runs each operation on every host before the next one, so in
  a migration the old host's service is stopped only after the new host's service answered
  `/health`; and when the service is placed on another host that is not ready in this run (failed,
  left out with `--limit`, unreachable), the old one is kept running and the run says so.
- The removal is destructive, so what gates it is read at the moment of the decision: the other
  host's service must have passed this run's readiness gate there AND answer `/health` now, read
  by a command on that host right before the stop (`answers_now`), not the answer its readiness
  gate or its host read gave minutes earlier.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand

from configuration import schema
from configuration.host_paths import UNIT_DIR
from configuration.settings import HostConfig
from operations import remote
from operations.model.models import BOOT_UNIT
from operations.run import host_reads, read_batch, remote_call
from operations.run.host_reads import operation
from operations.service.readiness import probe_address
from report import rollouts, summary

PREFIX = "sglang-"
# What a removal may take beyond its unit's drain (TimeoutStopSec, from `stop_timeout_s`): the kill
# of what is left, disabling it, its file's removal and systemd's reload.
REMOVAL_MARGIN_S = 120
# `stop_timeout_s` where the data says nothing: the unit's TimeoutStopSec ever since it was a fixed
# 60 s.
DEFAULT_STOP_TIMEOUT_S: int = schema.default_of(schema.ServiceSpec, "stop_timeout_s")


@read_batch.batched()
class ManagedUnits(FactBase):
    """``{unit: {"path", "managed", "active", "enabled", "pid"}}`` for the host's
    ``sglang-*.service`` files."""

    def command(self, unit_dir: str = UNIT_DIR) -> str:
        return remote.command("placement_units", shlex.quote(unit_dir))

    def process(self, output):
        return json.loads("\n".join(output))


def replica_of(unit: str) -> str:
    """The replica's name on its host, as its summary row shows it (`sglang-dflash@2.service` ->
    `dflash@2`)."""
    return unit.removeprefix(PREFIX).removesuffix(".service")


def service_of(unit: str) -> str:
    """The service a unit of ours runs a replica of (`sglang-dflash@2.service` -> `dflash`)."""
    return replica_of(unit).split("@")[0]


def leftovers(units: dict[str, dict], keep: tuple[str, ...] | list[str]) -> list[str]:
    """Our units (header, prefix) that no placed service owns; the boot staging unit is the models'
    own."""
    return sorted(
        name for name, unit in units.items()
        if unit["managed"] and name.startswith(PREFIX) and name.endswith(".service")
        and name != BOOT_UNIT and name not in keep
    )


@dataclass(frozen=True)
class Placed:
    """A service placed on another host of the inventory: where to ask it whether it answers."""

    host: str
    unit: str
    address: str
    port: int
    replica: str = ""  # its name on its host (the summary's row)
    stop_timeout_s: int = DEFAULT_STOP_TIMEOUT_S  # its `stop_timeout_s` there

    def __str__(self) -> str:
        return (f"{self.host}/{self.replica}"
                if self.replica and self.replica != service_of(self.unit) else self.host)


def placements(configs: dict[str, HostConfig]) -> dict[str, list[Placed]]:
    """service -> where the inventory places its replicas (whether or not their hosts are in this
    run), from every host's validated configuration: on other hosts, and this host's own replicas of
    it (a replica removed while another of the same service stays here)."""
    out: dict[str, list[Placed]] = {}
    for name, config in sorted(configs.items()):
        for service in config.services:
            out.setdefault(service.definition, []).append(
                Placed(name, service.unit_name, probe_address(service.bind),
                       service.port, service.name, service.stop_timeout_s))
    return out


def removal_timeout_s(others, own: int | None = None) -> int:
    """How long the removal of a unit of a service placed at `others` (`Placed`) may take: the
    longest drain its unit may have (its own TimeoutStopSec as the host's file says, `own`; the
    largest `stop_timeout_s` among the service's placements; never less than the default) and
    REMOVAL_MARGIN_S."""
    drain = max([DEFAULT_STOP_TIMEOUT_S, own or 0, *(p.stop_timeout_s for p in others)])
    return drain + REMOVAL_MARGIN_S


def ready_elsewhere(service: str, others, report: dict) -> tuple[list, list]:
    """(replicas whose readiness gate passed in this run, the others)."""
    ready = [p for p in others
             if report.get(p.host, {}).get(p.replica or service, {}).get("state") == "ready"]
    return ready, [p for p in others if p not in ready]


def answers_now(state, placed: Placed) -> str | None:
    """None when `placed`'s service is active and answers /health with 200 now (and /ready with 200,
    where its engine has /ready: not starting, paused or draining), read by a command on its host at
    this moment; else why not. A host not in this run, failed, or unreachable does not
    answer."""
    other = state.inventory.get_host(placed.host) if state is not None else None
    if other is None or other not in state.activated_hosts or other in state.failed_hosts:
        return f"{placed.host} is not in this run or has failed"
    command = remote.command("service_state", shlex.quote(placed.unit), shlex.quote(placed.address),
                             str(int(placed.port)))
    try:
        ok, output = other.run_shell_command(command, print_output=False, _timeout=60)
        found = json.loads(output.stdout.strip().splitlines()[-1]) if ok else None
    except Exception as exc:  # the connection is gone, or the answer is not the script's
        return f"{placed.host} could not be read now ({type(exc).__name__}: {exc})"
    if not isinstance(found, dict):
        return f"{placed.host} could not be read now"
    # another process holds its port there: its answer is not the service's
    if found.get("stranger"):
        return f"{placed.unit} on {placed.host} cannot be asked now: {found['stranger']}"
    if found.get("active") != "active" or found.get("health") != 200:
        return (f"{placed.unit} on {placed.host} is {found.get('active')}, /health "
                f"{found.get('health')} now")
    # /health alone stays 200 while the engine drains or is paused: where it has /ready, that says
    if found.get("ready") not in (None, 200):
        return (f"{placed.unit} on {placed.host} answers /health but not /ready "
                f"({found.get('ready') or 'no answer'}: starting, paused or draining) now")
    return None


def removal_commands(unit: str, path: str) -> list[str]:
    quoted = shlex.quote(unit)
    return [
        f"systemctl disable --now {quoted}",
        f"rm -f -- {shlex.quote(path)}",
        "systemctl daemon-reload",
        # Braced: joined with `&&`, a bare `|| true` would swallow a failure of every step before
        # it.
        f"{{ systemctl reset-failed {quoted} 2>/dev/null || true; }}",
    ]


def _remove(state, host, unit: str, path: str, service: str, others: tuple = (),
            own_stop_s: int | None = None) -> bool:
    halted = rollouts.halted(host.state, service)
    if halted is not None:
        # A replica of it failed its gate in this run: the one being removed may be the last on the
        # old version.
        reason = (f"the rollout of service {service} halted in this run ({halted.replica} failed "
                  "its readiness gate)")
        host.log_styled(
            f"{unit} KEPT running here: {reason}; run the deploy again once it is fixed",
            fg="yellow", log_func=logger.warning)
        summary.record(host, replica_of(unit), "-", "kept", f"not placed here; {reason}")
        return True
    if others:
        ready, not_ready = ready_elsewhere(service, others, summary.rows(host.state))
        # Read now, on those hosts: their gate may have passed minutes ago, and this stop cannot be
        # undone.
        why_not = {str(p): answers_now(state, p) for p in ready}
        answering = [str(p) for p in ready if why_not[str(p)] is None]
        if not answering:
            if ready:
                reason = (f"service {service} passed its readiness gate on "
                          f"{', '.join(map(str, ready))} in this run but does not answer there now "
                          f"({'; '.join(why_not.values())})")
            else:
                reason = (f"service {service} is placed on {', '.join(map(str, not_ready))} but "
                          "did not answer /health there in this run")
            host.log_styled(f"{unit} KEPT running here: {reason}; run the deploy again once it is "
                            "ready there", fg="yellow", log_func=logger.warning)
            summary.record(host, replica_of(unit), "-", "kept", f"not placed here; {reason}")
            return True
        moved = f"; it answers on {', '.join(answering)}"
    else:
        moved = ""
    ok, output = remote_call.run(host, " && ".join(removal_commands(unit, path)),
                                 f"stopping and removing {unit}",
                                 removal_timeout_s(others, own_stop_s))
    if not ok:
        host.log_styled(
            f"{unit}: removal failed: {(output.stderr or output.stdout).strip()[-500:]}", fg="red",
            log_func=logger.error)
        return False
    host.log(f"{unit}: stopped, disabled and removed (no longer placed here{moved})")
    summary.record(host, replica_of(unit), "-", "removed", f"no longer placed here{moved}")
    return True


@operation()
def unplaced_removed(keep: tuple[str, ...] | list[str] = (),
                     elsewhere: dict[str, list[Placed]] | None = None, unit_dir: str = UNIT_DIR):
    """
    Stop, disable and remove our service units that no placed service owns.

    + keep: unit names of the services placed on this host
    + elsewhere: service -> where the inventory places its replicas (`Placed`, `placements`): one of
      them must have passed this run's readiness gate and answer /health at the moment of the
      removal
    + unit_dir: where the units live

    Ownership:
        Only ``sglang-*.service`` files whose first line is our "Managed by sglang-deploy"
        header are candidates; the boot staging unit belongs to the models' operations.

    Order:
        Added after the readiness gates: when the service moved to another host of the same
        run, this host stops it only once the new host's service answered ``/health``; if it
        did not (failed, or the host is not in this run), the unit is kept and the run says so.
        Right before the stop, the new host's service is asked again (``answers_now``): an answer
        read earlier in the run does not decide a removal.

    **Example:**

    .. code:: python

        placement.unplaced_removed(
            name="Services no longer placed on this host removed",
            keep=["sglang-ddtree.service"],
            elsewhere={"dflash": [Placed("gpu-e", "sglang-dflash.service", "127.0.0.1", 30001)]},
        )
    """
    units = host_reads.get(host, ManagedUnits, unit_dir=unit_dir)
    remove = leftovers(units, keep)
    if not remove:
        host.noop("no unit of an unplaced service on this host")
        return
    for unit in remove:
        service = service_of(unit)
        others = tuple((elsewhere or {}).get(service, ()))
        when = f"once it answers /health on {', '.join(map(str, others))}" if others else "now"
        host.log(f"{unit}: service {service} is no longer placed on this host: stop, disable and "
                 f"remove it {when}")
        yield FunctionCommand(_remove, (unit, units[unit]["path"], service, others,
                                        units[unit].get("stop_timeout_s")), {})


def remove_unplaced(config: HostConfig, configs: dict[str, HostConfig]) -> None:
    """Add the removal of what the inventory no longer places on this host (after the readiness
    gates); `configs`: every host's validated configuration
    (`configuration.settings.validate_inventory`)."""
    unplaced_removed(
        name="Services no longer placed on this host removed",
        keep=[s.unit_name for s in config.services],
        elsewhere=placements(configs),
    )
