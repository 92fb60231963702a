"""GPU check: one nvidia-smi read of the host, before this deploy changes anything.

It resolves `gpu: auto` and `attention-backend: auto` for the units, shows every decision (also
with --dry) and fails the host, before any change, if a service's GPU is missing, unhealthy,
busy or too small for its models.
"""

from __future__ import annotations

from pyinfra.api import deploy

from deploys.planning import Reading
from operations.gpu import gpus

STEP = "GPU check"


def plan(reading: Reading) -> None:
    """The GPU check's refusals, as `gpus.plan_for_host` decided them from the host's read (the
    decisions the step's operation checks): a service's, or the host's own."""
    for error in reading.decisions.errors:
        service = reading.decisions.service_of(error)
        if service:
            reading.plan.add(STEP, f"service {service}", "refuse", error.split(": ", 1)[-1],
                             service=service)
        else:
            reading.plan.add(STEP, "this host", "refuse", error)


@deploy(STEP)
def gpu_check(decisions: gpus.GpuDecisions) -> gpus.GpuDecisions:
    """Add the check of the decisions read before (`gpus.plan_for_host`, which the host's plan also
    reads)."""
    gpus.checked(name="GPUs fit the services placed on this host", plan=decisions)
    return decisions
