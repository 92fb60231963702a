"""What a service's process is made of on its host: the unit text the deploy writes for it, and the
paths whose content at each (re)start is recorded (a later difference means restart). One answer
for the Service step's plan (deploys/service.py), its operations and the status view."""

from __future__ import annotations

from operations.environment import venv_read
from operations.model import models
from operations.service import kernel_cache, units


def watched_inputs(service, unit_path: str) -> tuple[str, ...]:
    """The host paths the service's process loads besides its code: unit file, venv link, staged
    models' markers, key file. Their content at each (re)start is recorded; a later difference means
    restart."""
    paths = (unit_path, service.environment.path)
    paths += tuple(f"{m.load_path}/{models.MARKER}" for m in service.models if m.location == "shm")
    return paths + ((service.config_file,) if service.config_file else ())


def unit_text(config, service, stack, patch_sets: dict, device_groups: tuple[str, ...]) -> str:
    """The unit the deploy writes for `service` (its GPU decided): the same text for the operation
    and the plan. It runs its venv's generation of this stack and patch sets
    (`venv_read.generation`)."""
    digests = {name: patch_sets[name].digest for name in service.patch_sets}
    staging = (models.boot_unit_name(config)
               if any(m.location == "shm" for m in service.models) else None)
    return units.render_unit(config, service, stack, units.inputs_digest(stack, digests),
                             after_units=(staging,) if staging else (),
                             supplementary_groups=device_groups,
                             runs=generation_path(service, stack, patch_sets))


def generation_path(service, stack, patch_sets: dict) -> str:
    """The venv generation the service's unit runs (`venv_read.generation`'s path)."""
    env = service.environment
    return venv_read.generation(env.path, stack,
                                {n: patch_sets[n].digest for n in env.patch_sets}).path


def cache_key(service, stack, patch_sets: dict) -> str:
    """The kernel cache the service's unit names (operations/service/kernel_cache.py)."""
    return kernel_cache.key(service, generation_path(service, stack, patch_sets))
