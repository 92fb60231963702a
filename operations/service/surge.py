"""Surge: a replica's rollout that never stops it serving, where its host has a free GPU.

A service with `max_surge: 1` whose replica the plan restarts (deploys/service.py `plan`) surges
where the GPU check's own rule (`gpus.surge_gpus`) finds as many free GPUs beside the replica's own
as it uses, and a port above its own that no service placed here uses and nothing answers on
(`port_for`, and the host's read of that port). The plan decides it (`decide`) and keeps the
`Surge` in its values; these operations only apply it:

1. `started`: the new version runs as a runtime unit, `sglang-<replica>.surge.service` in
   `/run/systemd/system`, rendered from the very template and data as the replica's own unit with
   only its GPUs and port replaced; it must pass the replica's full gate (`/ready`, the smoke
   completion, a speculative service's lossless and acceptance checks) on its own port, its answers
   coming from its own unit's processes. If it fails, it is stopped and removed, the old process and
   unit are untouched (the replica's restart is held), and the rollout halts as for a failed gate.
2. the replica's own restart, as without surge (its unit written, the old process stopped: drained,
   `stop_timeout_s`; its gate, with its rollback): meanwhile the surge serves.
3. `removed`: once the replica serves again on its own GPU and port, the surge is stopped (drained)
   and its unit removed. Where the replica does not serve (its change failed and its rollback too),
   the surge is kept, said, and the host fails.

Why a bridge, not a swap: the data's GPU and port stay the truth. After a rollout the replica is
where the data and the inventory put it, its one unit in `/etc/systemd/system` (what the GPU check,
the status view, the cleanup and a reboot read), and a second deploy plans nothing. A surge unit is
not a second placement: it lives in `/run` (a reboot forgets it), never holds the replica's name or
port, exists only between its start and the replica's gate in one run, and its GPU is one the check
vouched free at the run's read. The price: the new version starts twice (the surge, then the replica
on its own GPU; a warm kernel cache makes the second start the cheaper), and a load balancer sees
the surge's capacity only where it health-checks the surge port too (`--dry` names it).
"""

from __future__ import annotations

import base64
import dataclasses
import shlex
from dataclasses import dataclass
from typing import Callable

from pyinfra import logger
from pyinfra.api import FunctionCommand

from configuration.typed import HostConfig, Service
from operations.run.host_reads import operation
from operations.service import readiness
from report import rollouts, summary

SURGE_DIR = "/run/systemd/system"  # runtime units: a reboot forgets them
# A surge unit in one of these states, found by a run that did not start it, was left by an earlier
# run (killed between the surge's start and its removal): removed once the replica serves. So is
# one whose file is there, stopped (`left`).
LEFT_STATES = ("active", "activating", "reloading", "deactivating", "failed")


def left(state) -> bool:
    """Whether the read of a replica's surge unit (`readiness.ServiceState`) finds one an earlier
    run left: running or failing (LEFT_STATES), or stopped with its file still in SURGE_DIR
    (systemd loads it)."""
    return isinstance(state, dict) and (state.get("active") in LEFT_STATES
                                        or state.get("load") == "loaded")
MAX_PORT = 65535
STOP_MARGIN_S = 120


def unit_name(replica: str) -> str:
    """The surge's unit: a name no replica's unit has (a replica's name has no `.`)."""
    return f"sglang-{replica}.surge.service"


def unit_path(replica: str) -> str:
    return f"{SURGE_DIR}/{unit_name(replica)}"


@dataclass(frozen=True)
class Surge:
    """Where a replica's surge runs: its GPUs and port, beside the replica's own."""

    replica: str
    gpus: tuple[int, ...]
    port: int

    @property
    def unit(self) -> str:
        return unit_name(self.replica)

    @property
    def path(self) -> str:
        return unit_path(self.replica)

    @property
    def text(self) -> str:
        return (f"surge on GPU {','.join(map(str, self.gpus))} (port {self.port}, "
                f"{self.unit}) until the restarted replica passes its gate")


@dataclass(frozen=True)
class Decision:
    """A replica's rollout: `surge` (where it runs), or in place, and why (the plan's words)."""

    surge: Surge | None
    why: str

    @property
    def text(self) -> str:
        return self.surge.text if self.surge else f"in place ({self.why})"


def port_for(config: HostConfig, service: Service, taken: set[int]) -> int | None:
    """The lowest port above the replica's own that no service placed on this host serves on and
    no other surge of this run took; None where there is none."""
    used = {s.port for s in config.services} | set(taken)
    return next((p for p in range(service.port + 1, MAX_PORT + 1) if p not in used), None)


def port_busy(state: dict | None) -> str | None:
    """Why the surge port is not free on the host, from its read there (`readiness.ServiceState` of
    the surge unit on that port), or None: no unit of that name active, nothing answering."""
    if not isinstance(state, dict):
        return "its state was not read"
    if state.get("active") in ("active", "activating", "reloading", "deactivating"):
        return f"{state.get('unit') or 'the surge unit'} is {state.get('active')} already"
    if state.get("stranger"):
        return f"another process answers there ({str(state['stranger'])[:120]})"
    if state.get("health") is not None:
        return f"something answers there (/health {state.get('health')})"
    return None


def decide(service: Service, restarts_running: bool, gpus: tuple[int, ...], no_gpu: str,
           port: int | None, busy: str | None, leftover: str | None = None) -> Decision:
    """The one decision: surge or in place. `gpus`, `no_gpu`: `gpus.surge_gpus`; `port`:
    `port_for`; `busy`: `port_busy` of that port (None: free); `leftover`: the unit of a surge an
    earlier run left running (removed in this run, once the replica serves)."""
    if not service.max_surge:
        return Decision(None, "max_surge 0")
    if not restarts_running:
        return Decision(None, "it does not run: it only starts")
    if leftover:
        return Decision(None, f"{leftover}, left by an earlier run, is there: removed after this "
                              "run's gate")
    if not gpus:
        return Decision(None, f"no free GPU: {no_gpu}")
    if port is None:
        return Decision(None, f"no free port above {service.port}")
    if busy:
        return Decision(None, f"port {port} is not free: {busy}")
    return Decision(Surge(service.name, tuple(gpus), port), "")


def surge_service(service: Service, surge: Surge) -> Service:
    """The replica as its surge runs it: its GPUs and port replaced, nothing else."""
    return dataclasses.replace(service, gpus=surge.gpus,
                               spec=service.spec.model_copy(update={"port": surge.port}))


class Outcome:
    """What the surge did on this host, known only while executing: `serving` once it passed its
    gate, `failed` (why) when it did not; `held(hold)`: the replica's hold (`rollout.Hold`) as its
    restart must ask it: held when the surge failed, and a restart that the surge covers takes no
    serving replica away."""

    def __init__(self) -> None:
        self.serving = False
        self.failed: str | None = None

    def held(self, hold: Callable[..., str | None]) -> Callable[..., str | None]:
        def ask(restarting: bool = False) -> str | None:
            if self.failed:
                return f"its surge failed its gate: {self.failed[:200]}"
            return hold(restarting=restarting and not self.serving)
        return ask


def _run(host, command: str, timeout: int) -> tuple[bool, str]:
    ok, output = host.run_shell_command(command, print_output=False, _timeout=timeout)
    return ok, (output.stderr or output.stdout or "").strip()[-300:]


def _stop_command(surge: Surge) -> str:
    unit, path = shlex.quote(surge.unit), shlex.quote(surge.path)
    return (f"if [ -e {path} ] || systemctl is-active --quiet {unit}; then systemctl stop {unit}; "
            f"rm -f {path}; systemctl daemon-reload; systemctl reset-failed {unit} 2>/dev/null; "
            "fi; true")


def _start(state, host, surge: Surge, text: str, address: str, timeout: int, smoke: bool,
           config_file: str, spec: dict | None, rollout: str, outcome: Outcome,
           hold: Callable[..., str | None], stop_timeout_s: int) -> bool:
    replica = surge.replica
    why_held = hold(restarting=False)
    if why_held:
        host.log(f"{replica}: HELD, no surge started: {why_held}")
        return True
    data = base64.b64encode(text.encode()).decode()
    path, tmp = shlex.quote(surge.path), shlex.quote(surge.path + ".tmp")
    ok, said = _run(host, f"install -d -m 0755 {SURGE_DIR} && printf %s {shlex.quote(data)} | "
                          f"base64 -d > {tmp} && chmod 0644 {tmp} && mv -f {tmp} {path} && "
                          f"systemctl daemon-reload && systemctl start {shlex.quote(surge.unit)}",
                    stop_timeout_s + STOP_MARGIN_S)
    gpus = ",".join(map(str, surge.gpus))
    host.log(f"{replica}: surge of the new version on GPU {gpus}, port {surge.port} "
             f"({surge.unit}), beside the running one")
    result = (readiness.gate_once(host, surge.unit, address, surge.port, timeout, smoke,
                                  config_file, spec) if ok
              else {"ok": False, "reason": f"its unit did not start: {said}", "journal": ""})
    if result["ok"]:
        outcome.serving = True
        host.log(f"{replica}: surge ready in {result.get('ready_s')} s on port {surge.port}"
                 f"{readiness.ready_by_text(result)}{readiness.spec_text(result.get('spec'))}; "
                 "the replica restarts on its own GPU and port while it serves")
        return True
    reason = f"its surge on GPU {gpus}, port {surge.port} failed its gate: {result['reason']}"
    outcome.failed = reason
    host.log_styled(f"{replica}: SURGE NOT READY, removed; the old version keeps serving "
                    f"untouched: {result['reason']}", fg="red", log_func=logger.error)
    journal = result.get("journal") or ""
    if journal:
        host.log(f"{replica}: last journal lines of {surge.unit}:\n"
                 + "\n".join(f"    {line}" for line in journal.splitlines()),
                 log_func=logger.error)
    _run(host, _stop_command(surge), stop_timeout_s + STOP_MARGIN_S)
    if rollout:
        rollouts.halt(host.state, rollout, f"{host.name}/{replica}", reason)
    rollouts.gate_failed(host.state, host.name, replica, reason[:200])
    summary.record(host, replica, f"port {surge.port} (surge)", "FAILED",
                   f"{reason[:160]}; the old version kept serving")
    return True


@operation()
def started(surge: Surge, unit_text: str, bind: str, timeout: int, smoke: bool = True,
            config_file: str | None = None, spec: dict | None = None, rollout: str = "",
            outcome: Outcome | None = None, held: Callable[..., str | None] | None = None,
            stop_timeout_s: int = 60):
    """
    Start a replica's surge (the plan's `Surge`) beside it and gate it; on failure remove it.

    + surge: where it runs (GPUs, port, its runtime unit)
    + unit_text: its unit: the replica's, with the surge's GPUs and port (`surge_service`)
    + bind, timeout, smoke, config_file, spec: the replica's gate (`readiness.ready`'s)
    + rollout: the service: a failure halts its rollout
    + outcome: an `Outcome`, set while executing
    + held: the replica's hold (`rollout.Hold`): a halted rollout starts no surge
    + stop_timeout_s: the drain a stop of it waits for
    """
    yield FunctionCommand(
        _start, (surge, unit_text, readiness.probe_address(bind), timeout, smoke,
                 config_file or "-", spec, rollout, outcome or Outcome(),
                 held or (lambda restarting=False: None), stop_timeout_s), {})


def _remove(state, host, surge: Surge, unit: str, address: str, port: int, config_file: str,
            outcome: Outcome, stop_timeout_s: int, leftover: bool) -> bool:
    if outcome.serving or leftover:
        serves = readiness.gate_once(host, unit, address, port, 30, False, config_file)
        if not serves["ok"]:
            why = (f"{surge.replica} does not serve on its own port {port} "
                   f"({serves['reason'][:200]}): its surge {surge.unit} on port {surge.port} is "
                   "KEPT serving; fix the cause and run the deploy again")
            host.log_styled(why, fg="red", log_func=logger.error)
            rollouts.gate_failed(host.state, host.name, surge.replica, why[:200])
            return True
    ok, said = _run(host, _stop_command(surge), stop_timeout_s + STOP_MARGIN_S)
    if not ok:
        host.log_styled(f"{surge.replica}: its surge {surge.unit} could not be removed: {said}",
                        fg="red", log_func=logger.error)
        return False
    if outcome.serving or leftover:
        host.log(f"{surge.replica}: serves on its own GPU and port; surge {surge.unit} stopped "
                 "(drained) and removed" + (", left by an earlier run" if leftover else ""))
    return True


@operation()
def removed(surge: Surge, unit: str, bind: str, port: int, config_file: str | None = None,
            outcome: Outcome | None = None, stop_timeout_s: int = 60, leftover: bool = False):
    """
    Stop (drained) and remove a replica's surge once the replica serves on its own GPU and port.

    + surge: the plan's `Surge`
    + unit, bind, port, config_file: the replica's own unit and endpoint
    + outcome: the surge's `Outcome`
    + stop_timeout_s: the drain the stop waits for
    + leftover: a surge an earlier run left (`LEFT_STATES`), not this run's
    """
    yield FunctionCommand(
        _remove, (surge, unit, readiness.probe_address(bind), port, config_file or "-",
                  outcome or Outcome(), stop_timeout_s, leftover), {})
