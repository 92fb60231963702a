"""Cleanup: what the inventory no longer places on this host, after every readiness gate.

pyinfra runs each operation on every host before the next, so a service moved to another host
stops here only once it answers /health there (operations/service/placement.py); the models only it
used are released after it.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from configuration import settings
from deploys.planning import Reading
from operations.model import models
from operations.service import kernel_cache, placement
from operations.service.service_inputs import cache_key

STEP = "Cleanup"


def plan(reading: Reading) -> None:
    """The units of services no longer placed here (`placement.leftovers`, from the read
    `placement.remove_unplaced` decides from)."""
    units = reading.ask(placement.ManagedUnits, unit_dir=placement.UNIT_DIR)
    placed = [s.unit_name for s in reading.config.services]
    for unit in placement.leftovers(units or {}, placed):
        reading.plan.add(STEP, unit, "delete",
                         "no longer placed here (stopped once it answers where it is placed)",
                         service=placement.service_of(unit))
    found = reading.ask(kernel_cache.KernelCaches, unit_dirs=kernel_cache.UNIT_DIRS)
    for path in kernel_cache.unused(found, wanted_caches(reading.config, reading.stack,
                                                         reading.patch_sets),
                                    replaced_units(units, reading.config)):
        reading.plan.add(STEP, path, "delete", "a kernel cache no unit of this host will name (a "
                         "replaced or removed unit's: once its replacement passed its gate, or "
                         "it is removed)")


def replaced_units(units: dict | None, config) -> list[str]:
    """The paths of the units this run writes (each names a key of `wanted_caches`) or removes
    (`placement.leftovers`): the keys they name now are not kept for them. The operation reads
    the host again after the gates and removals, so a unit kept as it was (its rollout held, its
    removal deferred) keeps its cache."""
    units = units or {}
    return ([s.unit_path for s in config.services]
            + [units[u].get("path") or f"{placement.UNIT_DIR}/{u}"
               for u in placement.leftovers(units, [s.unit_name for s in config.services])])


def wanted_caches(config, stack, patch_sets: dict) -> list[str]:
    """The kernel caches the units this run writes name."""
    return [cache_key(s, stack, patch_sets) for s in config.services]


@deploy(STEP)
def cleanup(config, stack, patch_sets: dict) -> None:
    # Where the other hosts place each service: every host's validated configuration (validated once
    # per run).
    placement.remove_unplaced(config, settings.validate_inventory(host.state))
    models.release_unused(config)
    # Read after the gates and removals: the units in place then name what is kept.
    kernel_cache.unused_removed(name="Kernel caches no unit uses removed",
                                wanted=wanted_caches(config, stack, patch_sets),
                                unit_dirs=kernel_cache.UNIT_DIRS)
