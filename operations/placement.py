"""Placement: which services run on a host is host data; what is no longer placed there goes.

- `placement.unplaced_removed(keep=..., elsewhere=...)` stops, disables and removes the units of
  our services that the inventory no longer places on the host: only `sglang-*.service` units
  that carry our "Managed by sglang-deploy" header, never the boot staging unit, nothing else.
  Their staged models are released by `models.unused_removed` (it keeps the models of the
  services still placed on the host).
- `remove_unplaced(config)` adds it for a host; the `Cleanup` component (deploys/cleanup.py) calls it after the readiness gates.
  pyinfra runs each operation on every host before the next one, so in a migration the old
  host's service is stopped only after the new host's service answered `/health`; and when the
  service is placed on another host that is not ready in this run (failed, left out with
  `--limit`, unreachable), the old one is kept running and the run says so.
"""

from __future__ import annotations

import json
import shlex

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand, operation

from configuration.settings import HostConfig
from operations import remote
from operations.models import BOOT_UNIT
from report import summary

UNIT_DIR = "/etc/systemd/system"
PREFIX = "sglang-"


class ManagedUnits(FactBase):
    """``{unit: {"path", "managed", "active", "enabled", "pid"}}`` for the host's ``sglang-*.service`` files."""

    def command(self, unit_dir: str = UNIT_DIR) -> str:
        return remote.command("placement_units", shlex.quote(unit_dir))

    def process(self, output):
        return json.loads("\n".join(output))


def service_of(unit: str) -> str:
    return unit.removeprefix(PREFIX).removesuffix(".service")


def leftovers(units: dict[str, dict], keep: tuple[str, ...] | list[str]) -> list[str]:
    """Our units (header, prefix) that no placed service owns; the boot staging unit is the models' own."""
    return sorted(
        name for name, unit in units.items()
        if unit["managed"] and name.startswith(PREFIX) and name.endswith(".service") and name != BOOT_UNIT and name not in keep
    )


def placed_elsewhere(inventory, this_host: str) -> dict[str, list[str]]:
    """service -> the other hosts of the inventory that place it (whether or not they are in this run)."""
    out: dict[str, list[str]] = {}
    for other in inventory:
        if other.name == this_host:
            continue
        placed = other.data.get("run_services") or []
        for name in placed if isinstance(placed, (list, dict)) else []:
            if isinstance(name, str):
                out.setdefault(name, []).append(other.name)
    return out


def ready_elsewhere(service: str, others: tuple[str, ...] | list[str], report: dict) -> tuple[list[str], list[str]]:
    """(hosts where `service` answered /health in this run, hosts where it did not or was not deployed)."""
    ready = [h for h in others if report.get(h, {}).get(service, {}).get("state") == "ready"]
    return ready, [h for h in others if h not in ready]


def removal_commands(unit: str, path: str) -> list[str]:
    quoted = shlex.quote(unit)
    return [
        f"systemctl disable --now {quoted}",
        f"rm -f -- {shlex.quote(path)}",
        "systemctl daemon-reload",
        # Braced: joined with `&&`, a bare `|| true` would swallow a failure of every step before it.
        f"{{ systemctl reset-failed {quoted} 2>/dev/null || true; }}",
    ]


def _remove(state, host, unit: str, path: str, service: str, others: tuple[str, ...]) -> bool:
    if others:
        ready, not_ready = ready_elsewhere(service, others, summary.REPORT)
        if not ready:
            reason = f"service {service} is placed on {', '.join(not_ready)} but did not answer /health there in this run"
            host.log_styled(f"{unit} KEPT running here: {reason}; run the deploy again once it is ready there", fg="yellow", log_func=logger.warning)
            summary.record(host.name, service, "-", "kept", f"not placed here; {reason}")
            return True
        moved = f"; it answers on {', '.join(ready)}"
    else:
        moved = ""
    ok, output = host.run_shell_command(" && ".join(removal_commands(unit, path)), print_output=False)
    if not ok:
        host.log_styled(f"{unit}: removal failed: {(output.stderr or output.stdout).strip()[-500:]}", fg="red", log_func=logger.error)
        return False
    host.log(f"{unit}: stopped, disabled and removed (no longer placed here{moved})")
    summary.record(host.name, service, "-", "removed", f"no longer placed here{moved}")
    return True


@operation()
def unplaced_removed(keep: tuple[str, ...] | list[str] = (), elsewhere: dict[str, list[str]] | None = None, unit_dir: str = UNIT_DIR):
    """
    Stop, disable and remove our service units that no placed service owns.

    + keep: unit names of the services placed on this host
    + elsewhere: service -> other hosts that place it: there it must answer /health first
    + unit_dir: where the units live

    Ownership:
        Only ``sglang-*.service`` files whose first line is our "Managed by sglang-deploy"
        header are candidates; the boot staging unit belongs to the models' operations.

    Order:
        Added after the readiness gates: when the service moved to another host of the same
        run, this host stops it only once the new host's service answered ``/health``; if it
        did not (failed, or the host is not in this run), the unit is kept and the run says so.

    **Example:**

    .. code:: python

        placement.unplaced_removed(
            name="Services no longer placed on this host removed",
            keep=["sglang-ddtree.service"], elsewhere={"dflash": ["gpu-e"]},
        )
    """
    units = host.get_fact(ManagedUnits, unit_dir=unit_dir)
    remove = leftovers(units, keep)
    if not remove:
        host.noop("no unit of an unplaced service on this host")
        return
    for unit in remove:
        service = service_of(unit)
        others = tuple((elsewhere or {}).get(service, ()))
        when = f"once it answers /health on {', '.join(others)}" if others else "now"
        host.log(f"{unit}: service {service} is no longer placed on this host: stop, disable and remove it {when}")
        yield FunctionCommand(_remove, (unit, units[unit]["path"], service, others), {})


def remove_unplaced(config: HostConfig) -> None:
    """Add the removal of what the inventory no longer places on this host (after the readiness gates)."""
    unplaced_removed(
        name="Services no longer placed on this host removed",
        keep=[s.unit_name for s in config.services],
        elsewhere=placed_elsewhere(host.inventory, host.name),
    )
