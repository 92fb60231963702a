"""Services: the account they run as, and per service its key file, flags, unit, lifecycle and readiness.

A service is (re)started only when something it loads changed: its unit, its venv generation,
its patch sets, its staged models, its key file, in this run or since it started (a run that
stopped between a change and its restart). Its exact flags pass the engine's own parser before
its unit is written; the readiness gate waits for /health and a smoke completion, and rolls a
failed change back to the previous unit and venv generation.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from deploys.environments import BuiltEnvironment
from deploys.models import ModelCopies
from operations import host_plan, lifecycle, preflight, readiness, rollback, secrets, this_run, unit_file, units
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


@deploy("Service")
def service(config, service, stack, patch_sets: dict, environment: BuiltEnvironment, model_copies: ModelCopies,
            device_groups: tuple[str, ...]) -> None:
    """Add the operations that make one service run its data, and gate on its readiness."""
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
    # What this service's process loads besides its unit: its venv, patch sets, staged models, key file.
    inputs = this_run.Inputs((*environment.named_ops(), *model_copies.named_of(service), (f"API keys of {service.name}", key_file, False)))
    preflight.passed(
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
    )
    rewritten = unit_file.Rewritten()  # the unit's content replaced (a mode put back restarts nothing)
    unit_file.written(name=f"Unit {service.unit_name}", path=unit_path, text=unit_text, rewritten=rewritten)

    # Read before this run changes anything (one answer from the host's read): inputs whose content
    # differs from what the running process was started with. A touched file, or a file dropped beside
    # a staged model, is no change.
    watched = host_plan.watched_inputs(service, unit_path)
    stale = readiness.changed_since_start(service.unit_name, service.bind, service.port, watched)
    if stale:
        host.log(f"{service.name}: {', '.join(stale)} changed since the service started (an earlier deploy stopped before restarting it): restarting")
    started = lifecycle.Restarted()
    lifecycle.running(
        name=f"{service.unit_name} enabled and running its current inputs",
        unit=service.unit_name,
        unit_path=unit_path,
        bind=service.bind,
        port=service.port,
        inputs=watched,
        unit_changed=rewritten,
        inputs_changed=this_run.any_of(rewritten, inputs),
        outcome=started,
    )
    readiness.ready(
        name=f"{service.unit_name} answers /health",
        service=service.name,
        unit=service.unit_name,
        bind=service.bind,
        port=service.port,
        timeout=config.readiness_timeout_s,
        smoke=config.smoke_test,
        config_file=service.config_file,
        open_to_all=service.exposed_without_key,
        restarted=started,
        inputs=watched,
        rollback_plan=rollback.Restorable(unit_path, service.unit_name, rewritten, [(service.environment.path, environment.switched.did_change)]),
    )
