"""Services: the account they run as, and per service its key file, flags, unit, lifecycle and
readiness.

A service is (re)started only when something it loads changed: its unit, its venv generation,
its patch sets, its staged models, its key file, in this run or since it started (a run that
stopped between a change and its restart). Its exact flags pass the engine's own parser before
its unit is written; the readiness gate waits for /health and a smoke completion, and rolls a
failed change back to the previous unit and venv generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pyinfra import host
from pyinfra.api import deploy

from configuration.typed import Service
from deploys.environments import BuiltEnvironment
from deploys.models import ModelCopies
from operations import (
    host_plan,
    lifecycle,
    preflight,
    progress,
    readiness,
    rollback,
    rollout,
    secrets,
    this_run,
    unit_file,
    units,
)
from operations.service_user import ensure_account, gpu_device_groups, group_of


@deploy("Service account")
def service_account(config) -> tuple[str, ...]:
    """The account the services run as (`service_user`, a system user; root where the data says so),
    the directory of their key files, and the groups of this host's GPU device files, for the units'
    sandbox. Nothing on a host with no service placed on it."""
    if not config.services:
        return ()
    ensure_account(config.service_user)
    if any(service.config_file for service in config.services):
        secrets.ensure_directory(group_of(config.service_user))
    return gpu_device_groups(config.service_user)


@dataclass
class Prepared:
    """A replica whose key file and flags are ready (`service`), for its wave's restart
    (`restarted`) and gate (`gated`)."""

    service: Service
    unit_text: str
    inputs: this_run.Inputs
    environment: BuiltEnvironment
    # the host paths its process loads (host_plan.watched_inputs), read with its state
    watched: tuple[str, ...]
    rewritten: unit_file.Rewritten = field(default_factory=unit_file.Rewritten)
    started: lifecycle.Restarted = field(default_factory=lifecycle.Restarted)


@deploy("Service")
def service(config, service, stack, patch_sets: dict, environment: BuiltEnvironment,
            model_copies: ModelCopies, device_groups: tuple[str, ...],
            by_target: dict) -> Prepared:
    """Add the operations that prepare one replica before any wave restarts: its key file, and its
    exact flags through the engine's own parser in its venv (what its unit will say), with the
    engine advisories on its target's kind that the GPU check left to it (`by_target`:
    `gpus.GpuDecisions.after_staging`)."""
    unit_path = service.unit_path
    unit_text = host_plan.unit_text(config, service, stack, patch_sets, device_groups)
    key_file = secrets.config_file(
        name=f"API keys of {service.name} in a file only root and its service read",
        service=service.name,
        api_key=service.api_key,
        admin_api_key=service.admin_api_key,
        present=bool(service.config_file),
        group=group_of(config.service_user),
    )
    # What this service's process loads besides its unit: its venv, patch sets, staged models, key
    # file.
    inputs = this_run.Inputs((*environment.named_ops(), *model_copies.named_of(service),
                              (f"API keys of {service.name}", key_file, False)))
    parsed = preflight.passed(
        name=f"{service.unit_name} flags pass the engine's own parser",
        service=service.name,
        venv_path=environment.gen.path,
        launcher=config.launcher,
        argv=service.argv(),
        environment={**units.GPU_ORDER, **service.environment_variables()},  # what the unit sets
        endpoint=service.endpoint,
        unit_path=unit_path,
        unit_text=unit_text,
        inputs_changed=inputs,
        by_target=by_target,
        open_ok=bool(service.api_key) or service.allow_unauthenticated,
    )
    progress.watch(parsed, f"{service.unit_name}'s flags through the engine's own parser")
    return Prepared(service, unit_text, inputs, environment,
                    host_plan.watched_inputs(service, unit_path))


@deploy("Service")
def restarted(prepared: Prepared, held: Callable[..., str | None], restarts: bool = False) -> None:
    """In the replica's wave: its unit written and the unit (re)started if anything it loads
    changed, unless it is held (`held`, operations/rollout.py `Hold`: its service's rollout halted
    earlier in this run, or restarting it would leave too few replicas serving): then its unit file
    and process stay as they are. `restarts`: the host's plan restarts the running replica (a
    rewritten unit would restart it), so the unit write asks as a restart does."""
    service = prepared.service
    unit_path = service.unit_path
    unit_file.written(name=f"Unit {service.unit_name}", path=unit_path, text=prepared.unit_text,
                      rewritten=prepared.rewritten,
                      _if=lambda: held(restarting=restarts) is None)

    # Read before this run changes anything (one answer from the host's read): inputs whose content
    # differs from what the running process was started with. A touched file, or a file dropped
    # beside a staged model, is no change.
    watched = prepared.watched
    stale = readiness.changed_since_start(service.unit_name, service.bind, service.port, watched)
    if stale:
        host.log(f"{service.name}: {', '.join(stale)} changed since the service started (an "
                 "earlier deploy stopped before restarting it): restarting")
    lifecycle.running(
        name=f"{service.unit_name} enabled and running its current inputs",
        unit=service.unit_name,
        unit_path=unit_path,
        bind=service.bind,
        port=service.port,
        inputs=watched,
        unit_changed=prepared.rewritten,
        inputs_changed=this_run.any_of(prepared.rewritten, prepared.inputs),
        outcome=prepared.started,
        held=held,
        service=service.name,
    )


@deploy("Service")
def gated(config, prepared: Prepared, held: Callable[..., str | None], planned: bool,
          soak_s: int = 0, old_replica: tuple | None = None) -> None:
    """In the replica's wave, after every restart of the wave: the readiness gate (and a canary's
    soak). `planned`: the host's plan (re)starts it; when its rollout halted (`held`), it was kept
    on its old version, and says so."""
    service = prepared.service
    gate = readiness.ready(
        name=f"{service.unit_name} answers /health",
        service=service.name,
        unit=service.unit_name,
        bind=service.bind,
        port=service.port,
        timeout=config.readiness_timeout_s,
        smoke=config.smoke_test,
        spec=readiness.speculative_check(service),
        baseline=readiness.Baseline.of(*old_replica) if old_replica else None,
        config_file=service.config_file,
        open_to_all=service.exposed_without_key,
        restarted=prepared.started,
        inputs=prepared.watched,
        rollback_plan=rollback.Restorable(
            service.unit_path, service.unit_name, prepared.rewritten,
            [(service.environment.path, prepared.environment.switched.did_change)]),
        rollout=service.definition,
        held=lambda: prepared.started.held or (held() if planned else None),
        soak_s=soak_s,
    )
    progress.watch(gate, f"{service.unit_name} starting", progress.journal(service.unit_name))


@deploy("Service")
def wave_opened(number: int, of: int) -> None:
    """A rollout's wave begins, on every host alike (operations/rollout.py `wave`: it orders the
    waves across hosts)."""
    rollout.wave(name=f"Rollout wave {number} of {of}", number=number, of=of)


@deploy("Service")
def gates_checked() -> None:
    """After the last wave: the host fails where one of its replicas failed its gate
    (operations/rollout.py)."""
    rollout.gates_passed(name="Readiness gates passed")
