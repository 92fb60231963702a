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
from pyinfra.operations.util import any_changed

from deploys.environments import Environment
from deploys.models import ModelCopies
from operations import lifecycle, models, preflight, readiness, rollback, secrets, this_run, units
from operations.service_user import ensure_account, gpu_device_groups, group_of
from operations.unit_file import written as unit_written


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


def watched_inputs(service, unit_path: str) -> tuple[str, ...]:
    """The host paths the service's process loads besides its code: unit file, venv link, staged models'
    markers, key file. Their content at each (re)start is recorded; a later difference means restart."""
    paths = (unit_path, service.environment.path)
    paths += tuple(f"{m.load_path}/{models.MARKER}" for m in service.models if m.location == "shm")
    return paths + ((service.config_file,) if service.config_file else ())


@deploy("Service")
def service(config, service, stack, patch_sets: dict, environment: Environment, model_copies: ModelCopies,
            device_groups: tuple[str, ...]) -> None:
    """Add the operations that make one service run its data, and gate on its readiness."""
    unit_path = service.unit_path
    digests = {name: patch_sets[name].digest for name in service.patch_sets}
    staging = models.boot_unit_name(config) if any(m.location == "shm" for m in service.models) else None
    unit_text = units.render_unit(
        config, service, stack, units.inputs_digest(stack, digests), after_units=(staging,) if staging else (),
        supplementary_groups=device_groups,
    )
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
    unit_file = unit_written(name=f"Unit {service.unit_name}", path=unit_path, text=unit_text)

    # Read before this run changes anything (one answer from the host's read): inputs whose content
    # differs from what the running process was started with. A touched file, or a file dropped beside
    # a staged model, is no change.
    watched = watched_inputs(service, unit_path)
    stale = readiness.changed_since_start(service.unit_name, service.bind, service.port, watched)
    if stale:
        host.log(f"{service.name}: {', '.join(stale)} changed since the service started (an earlier deploy stopped before restarting it): restarting")
    started = lifecycle.Outcome()
    lifecycle.running(
        name=f"{service.unit_name} enabled and running its current inputs",
        unit=service.unit_name,
        unit_path=unit_path,
        bind=service.bind,
        port=service.port,
        inputs=watched,
        unit_changed=unit_file.did_change,
        inputs_changed=any_changed(unit_file, *inputs.metas()),
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
        rollback_plan=rollback.Restorable(unit_path, service.unit_name, unit_file.did_change, [(service.environment.path, environment.switched.did_change)]),
    )
