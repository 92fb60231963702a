"""What every step's plan reads: the host's one read, the validated data, and the plan it adds to.

Each step of the deploy plans in its own module (`plan(reading)` in deploys/gpu_check.py,
environments.py, models.py, service_account.py, service.py, cleanup.py), from the very deciders
its operations apply, read with the very arguments they read with (so every answer comes from the
host's one batched read, operations/run/host_reads.py). deploys/plan.py runs them in the deploy's
order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from operations.run import directory
from operations.run.plan import HostPlan, Refusal


class Unread(Exception):
    """A fact the host did not answer: nothing of the step that depends on it can be planned."""


@dataclass
class Reading:
    """One host's planning: `ask(Fact, **arguments)` answers from its read (a failed read is named
    in `plan.unread` and raises `Unread`); `changed`: what a service loads -> whether this run
    changes it (venv path, `store:MODEL`, `shm:MODEL`), for the Service step's restarts."""

    plan: HostPlan
    decisions: object  # gpus.GpuDecisions, its config with `auto` resolved
    stack: object
    patch_sets: dict
    read: Callable
    verify: str
    changed: dict[str, bool] = field(default_factory=dict)

    @property
    def config(self):
        return self.decisions.config

    def ask(self, fact, **kwargs):
        try:
            return self.read(fact, **kwargs)
        except Exception as exc:  # a failed read: named in the plan, never a traceback
            self.plan.unread.append(f"{fact.__name__}: {exc}")
            raise Unread from exc


def reading(name: str, decisions, stack, patch_sets: dict, read: Callable,
            verify_env: str | None = None) -> Reading:
    return Reading(HostPlan(name), decisions, stack, patch_sets, read,
                   verify_env or decisions.config.verify_env)


def directory_change(plan: HostPlan, step: str, path: str, found, mode: str, user: str,
                     group: str) -> bool:
    """A kept directory's change (`directory.decide`, as `directory.present` applies it): whether
    there is one."""
    try:
        todo = directory.decide(path, found, mode, user, group)
    except Refusal as refusal:
        plan.refuse(step, refusal, path)
        return True
    if todo:
        why = ("absent" if "create" in todo
               else f"{found.get('mode')} {found.get('user')}:{found.get('group')}, wanted {mode} "
                    f"{user}:{group}")
        plan.add(step, path, "create" if "create" in todo else "update", why)
    return bool(todo)
