"""One host's plan, from its one read: each step plans in its own module, with the deciders its
operations apply (deploys/planning.py says how a step reads).

Readers: deploy.py (a host whose plan is empty gets no step operations at all: the read decided it;
each venv's build applies the `Install` its plan decided), the status view (its "deploy would"
column is this plan's changes), `--dry` and the JSON plan (report/plan_view.py).

What one step changes feeds the next: a service restarts when its unit, its venv, its staged models
or its key file change (`Reading.changed`). Where an earlier operation of the run changes what a
later decision is made from (a patch set over a generation built in this run, a model staged from a
store copy streamed in this run), the later operation asks the same decider again as the run
executes, from what the host then holds (Terraform's "known after apply").
"""

from __future__ import annotations

from typing import Callable

from deploys import cleanup, environments, gpu_check, models, service, service_account
from deploys.planning import Unread, reading
from operations.run.plan import HostPlan

STEPS = (gpu_check.plan, environments.plan, models.plan, service_account.plan, service.plan,
         cleanup.plan)


def plan_host(name: str, decisions, stack, patch_sets: dict, read: Callable,
              verify_env: str | None = None) -> HostPlan:
    """The host's plan. `decisions`: the GPU check's (`gpus.GpuDecisions`, its config with `auto`
    resolved); `read(Fact, **arguments)`: the host's answer (raises on a failed read); `verify_env`:
    how the venv is checked (the data's, unless the status view's fast check passes "fast")."""
    planning = reading(name, decisions, stack, patch_sets, read, verify_env)
    for step in STEPS:
        try:
            step(planning)
        except Unread:
            pass  # named in the plan's `unread`; the next step plans what it can
    return planning.plan
