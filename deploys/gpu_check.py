"""GPU check: one nvidia-smi read of the host, before this deploy changes anything.

It resolves `gpu: auto` and `attention-backend: auto` for the units, shows every decision (also
with --dry) and fails the host, before any change, if a service's GPU is missing, unhealthy,
busy or too small for its models.
"""

from __future__ import annotations

from pyinfra.api import deploy

from operations import gpus


@deploy("GPU check")
def gpu_check(decisions: gpus.GpuDecisions) -> gpus.GpuDecisions:
    """Add the check of the decisions read before (`gpus.plan_for_host`, which the host's plan also
    reads)."""
    gpus.checked(name="GPUs fit the services placed on this host", plan=decisions)
    return decisions
