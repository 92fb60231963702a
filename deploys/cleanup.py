"""Cleanup: what the inventory no longer places on this host, after every readiness gate.

pyinfra runs each operation on every host before the next, so a service moved to another host
stops here only once it answers /health there (operations/placement.py); the models only it
used are released after it.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from configuration import settings
from operations import models, placement


@deploy("Cleanup")
def cleanup(config) -> None:
    # Where the other hosts place each service: every host's validated configuration (validated once
    # per run).
    placement.remove_unplaced(config, settings.validate_inventory(host.state))
    models.release_unused(config)
