"""A plan: what a deploy would change on a host, as data (Terraform's shape: read, plan, apply).

Each step of the deploy (its components in deploys/: GPU check, Environments, Models, Service
account, Service, Cleanup) has pure decision functions from the validated configuration and the
host's read to `Change` records, in its own module (deploys/plan.py runs them), from one read of
the host, for the whole host's `HostPlan`. The deploy reads that plan to decide whether a host needs
its operations at all, `--dry` prints it, the JSON plan writes it, and the status view shows its
changes: one decision, read four ways.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pyinfra.api import OperationError

# What a change does to its object (Terraform's NoOp/Create/Update/Delete, and a service's own
# verbs).
ACTIONS = ("create", "update", "delete", "restart", "start", "reload", "enable", "check", "refuse")


class Refusal(OperationError):
    """A step's decider refuses the host: the plan records it as a `refuse` change with this very
    text, and the step's operation raises it, so pyinfra fails the host with the same words that
    `--dry` and the status view showed. `what`: the object refused (a path, a venv, a user)."""

    def __init__(self, text: str, what: str | None = None):
        super().__init__(text)
        self.what = what


@dataclass(frozen=True)
class Change:
    """One thing a deploy would do on a host: to `what`, `action`, because `why`; in `step` (a
    deploy component)."""

    step: str
    what: str
    action: str
    why: str
    service: str | None = None  # the service it belongs to; None for the host's own objects
    # The lines that change in a text file the deploy writes whole (a unit): `- what the host has`,
    # `+ what the data makes`, secrets masked (unit_file.line_changes).
    diff: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"change action {self.action!r} is none of {', '.join(ACTIONS)}")

    @property
    def text(self) -> str:
        """One line, as the status view and `--dry` print it: `update /etc/...: mode 664, wanted
        644`."""
        return (f"{self.action} {self.what}: {self.why}" if self.why
                else f"{self.action} {self.what}")

    def record(self) -> dict:
        record = asdict(self)
        record["diff"] = list(self.diff)
        return record


@dataclass
class HostPlan:
    """Every change of one host, in the deploy's order; `unread`: what could not be read (then
    nothing is sure)."""

    host: str
    changes: list[Change] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    # What a step decided that its operations apply as decided, keyed by (what, object): e.g.
    # ("install", venv path) -> venv_decide.Install. Never shown; the changes are the plan's words.
    values: dict = field(default_factory=dict, repr=False, compare=False)

    def add(self, step: str, what: str, action: str, why: str = "",
            service: str | None = None, diff: tuple[str, ...] = ()) -> Change:
        change = Change(step, what, action, why, service, diff)
        self.changes.append(change)
        return change

    def refuse(self, step: str, refusal: Refusal, what: str, service: str | None = None) -> Change:
        """Record a decider's refusal, with the text its operation raises."""
        return self.add(step, refusal.what or what, "refuse", str(refusal), service=service)

    @property
    def refusals(self) -> list[Change]:
        return [c for c in self.changes if c.action == "refuse"]

    @property
    def converged(self) -> bool:
        """Nothing to do, and everything needed to say so was read."""
        return not self.changes and not self.unread

    def of_service(self, name: str | None) -> list[Change]:
        return [c for c in self.changes if c.service == name]

    def restarts(self, name: str) -> bool:
        """Does the plan (re)start service replica `name`?"""
        return any(c.action in ("restart", "start") for c in self.of_service(name))

    def restarts_running(self, name: str) -> bool:
        """Does the plan restart service replica `name` where it runs now (not start it where it
        is down)?"""
        return any(c.action == "restart" for c in self.of_service(name))

    def steps(self) -> list[str]:
        return list(dict.fromkeys(c.step for c in self.changes))

    def exit_code(self) -> int:
        """As `terraform plan -detailed-exitcode`: 0 nothing to do, 2 changes, 1 refused or not
        read."""
        if self.refusals or self.unread:
            return 1
        return 2 if self.changes else 0

    def record(self) -> dict:
        return {
            "host": self.host,
            "exit_code": self.exit_code(),
            "changes": [c.record() for c in self.changes if c.action != "refuse"],
            "refusals": [c.record() for c in self.refusals],
            "unread": list(self.unread),
        }
