"""The plan as people and machines read it: per host and service under `--dry`, and as JSON on
request.

    # the plan, per host and service (what, why, action); exit 0 nothing to do, 2 changes, 1 refused
    pyinfra inventory.py deploy.py --dry
    # and as JSON (its fields: docs/status.md, "The plan as JSON")
    PLAN_JSON=plan.json pyinfra inventory.py deploy.py --dry
    # the JSON on stdout (the plan's text, like pyinfra's log, on stderr)
    PLAN_JSON=- pyinfra inventory.py deploy.py --dry -y

Each host's load records its plan (deploys/plan.py, `HostPlan.record()`: changes and
refusals as the status view's JSON has them, and what could not be read); once the last host is
done, `PlanPrinter` prints and writes it. Under `--dry`, the process exits as
`terraform plan -detailed-exitcode` does: 0 nothing to do, 2 changes, 1 a refusal, a fact not read,
or a host whose load failed (not planned). A real run writes the plan it applied (PLAN_JSON) and
keeps pyinfra's exit code.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pyinfra import logger
from pyinfra.api.state import BaseStateCallback

from configuration import run_scope
from report.atomic_file import write_atomically
from report.terminal_text import one_line

# The JSON plan's shape, named in the document (docs/plan.md): a reader checks it before reading a
# field (a change of meaning or a field removed gets a new number; a field added does not).
SCHEMA = "sglang-deploy-plan/1"

@dataclass
class Plans:
    """What the run planned (kept on the run: configuration/run_scope.py)."""

    # host name -> its plan's record, written as each host's load plans it
    by_host: dict[str, dict] = field(default_factory=dict)
    # service -> {"replicas", "max_unavailable", "canary", "waves": [["host/replica", ...], ...]}:
    # its rollout's waves (operations/service/rollout.py), the same from every host's load.
    rollouts: dict[str, dict] = field(default_factory=dict)


def record(state, plan: dict) -> None:
    run_scope.of(state, Plans).by_host[plan["host"]] = plan


def record_rollouts(state, rollouts: dict[str, dict]) -> None:
    run_scope.of(state, Plans).rollouts.update(rollouts)


def rollout_actions(plans: list[dict]) -> dict[str, str]:
    """host/replica -> `restart` or `start` where its plan (re)starts it."""
    out = {}
    for plan in plans:
        for change in plan["changes"]:
            if change["action"] in ("restart", "start") and change["service"]:
                out[f"{plan['host']}/{change['service']}"] = change["action"]
    return out


def rollout_document(plans: list[dict], rollouts: dict[str, dict]) -> dict:
    actions = rollout_actions(plans)
    return {name: {**{k: v for k, v in r.items() if k != "waves"},
                   "waves": [[{"replica": x, "action": actions.get(x, "none")} for x in wave]
                             for wave in r["waves"]]}
            for name, r in sorted(rollouts.items()) if r["replicas"] > 1}


def rollout_text(plans: list[dict], rollouts: dict[str, dict]) -> list[str]:
    """Each replicated service's waves in order, each replica with what its plan does (`none`: it
    passes its wave)."""
    lines = []
    for name, rollout in rollout_document(plans, rollouts).items():
        canary = f", canaries first: {rollout['canary']}" if rollout["canary"] else ""
        lines.append(f"    {name}: {rollout['replicas']} replicas, at most {rollout['wave_size']} "
                     f"not serving at once{canary}")
        for index, wave in enumerate(rollout["waves"], start=1):
            lines.append(f"      wave {index}: "
                         + ", ".join(f"{r['replica']} ({r['action']})" for r in wave))
    return (["--> Rollouts (each wave's readiness gates pass before the next wave restarts):"]
            + lines) if lines else []


def exit_code(plans: list[dict], unplanned: list[str]) -> int:
    """The run's code: 1 if any host refused, read incompletely or was not planned; else 2 if any
    changes; else 0."""
    if unplanned or any(p["exit_code"] == 1 for p in plans):
        return 1
    return 2 if any(p["exit_code"] == 2 for p in plans) else 0


def document(plans: list[dict], unplanned: list[str], rollouts: dict[str, dict]) -> dict:
    return {"schema": SCHEMA, "exit_code": exit_code(plans, unplanned), "hosts": plans,
            "rollouts": rollout_document(plans, rollouts),
            "not_planned": [{"host": name, "why": "its load failed before its plan (pyinfra's "
                                                  "error above says why)"}
                            for name in unplanned]}


def text(plans: list[dict], unplanned: list[str], rollouts: dict[str, dict]) -> str:
    """The plan per host and service: `host/service: action what: why`, or `host: converged`."""
    lines = ["--> Plan:"]
    for plan in plans:
        entries = plan["refusals"] + plan["changes"]
        if not entries and not plan["unread"]:
            lines.append(f"    {plan['host']}: nothing to change")
            continue
        for change in entries:
            who = f"{plan['host']}/{change['service']}" if change["service"] else plan["host"]
            why = f": {change['why']}" if change["why"] else ""
            lines.append(
                one_line(f"    {who}  [{change['step']}] {change['action']} {change['what']}{why}"))
            lines += [one_line(f"        {line}") for line in change.get("diff") or ()]
        for what in plan["unread"]:
            lines.append(one_line(f"    {plan['host']}  not read: {what}"))
    for name in unplanned:
        lines.append(f"    {name}: not planned (its load failed: pyinfra's error above says why)")
    lines += rollout_text(plans, rollouts)
    code = exit_code(plans, unplanned)
    lines.append(f"    exit code {code} (0 nothing to change, 2 changes, 1 refused or not read)")
    return "\n".join(lines)


class PlanPrinter(BaseStateCallback):
    """Once the last host is done: the plan printed (under --dry), the JSON written (PLAN_JSON), the
    exit code."""

    def __init__(self, json_to: str | None, dry: bool):
        self.json_to, self.dry = json_to, dry
        self.disconnected: set[str] = set()
        self.done = False
        super().__init__()

    def host_disconnect(self, state, host):
        self.disconnected.add(host.name)
        if self.done or not {h.name for h in state.activated_hosts} <= self.disconnected:
            return
        self.done = True
        planned = run_scope.of(state, Plans)
        plans = [planned.by_host[name] for name in sorted(planned.by_host)]
        unplanned = sorted(h.name for h in state.inventory
                           if h.name not in planned.by_host and state.is_host_in_limit(h))
        if self.dry or self.json_to:
            # pyinfra's log (stderr): stdout stays its --json, or PLAN_JSON=-
            logger.info(text(plans, unplanned, planned.rollouts))
        if self.json_to:
            doc = json.dumps(document(plans, unplanned, planned.rollouts), indent=2,
                             sort_keys=True) + "\n"
            if self.json_to == "-":
                sys.stdout.write(doc)
                sys.stdout.flush()
            else:
                write_atomically(Path(self.json_to), doc)
                logger.info(f"--> Plan written to {self.json_to}")
        if self.dry:
            raise SystemExit(exit_code(plans, unplanned))


def install(state, environ) -> None:
    if not any(isinstance(h, PlanPrinter) for h in state.callback_handlers):
        state.add_callback_handler(
            PlanPrinter(environ.get("PLAN_JSON") or None, "--dry" in sys.argv[1:]))
