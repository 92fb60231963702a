"""The end-of-run summary: one line per host and service with its endpoint, state and readiness.

Every step that decides a service's fate (the GPU check, preflight, the readiness gate and its
rollback, placement) writes its row with `record(host, ...)` into the run's `Summary`, kept on the
run (configuration/run_scope.py); `SummaryPrinter` prints it once the last host is done, and
`health_timer.HealthTimer` reads it while the run goes (`rows(state)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyinfra import logger
from pyinfra.api.state import BaseStateCallback

from configuration import run_scope
from report import rollouts
from report.terminal_text import one_line


@dataclass
class Summary:
    # host name -> service name -> {"endpoint", "state", "ready"}; printed when the run ends.
    rows: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)


def rows(state) -> dict[str, dict[str, dict[str, str]]]:
    """The run's rows so far: host name -> service name -> row."""
    return run_scope.of(state, Summary).rows


def record(host, service: str, endpoint: str, state: str, ready: str) -> None:
    """One row of the end-of-run summary for `host` (every step that decides a service's fate
    writes here)."""
    rows(host.state).setdefault(host.name, {})[service] = {"endpoint": endpoint,
                                                           "state": state, "ready": ready}


class SummaryPrinter(BaseStateCallback):
    """Prints, when the run ends, one line per host and service: endpoint, state, readiness."""

    def __init__(self):
        self.disconnected: set[str] = set()

    def host_disconnect(self, state, host):
        self.disconnected.add(host.name)
        report = rows(state)
        if not {h.name for h in state.activated_hosts} <= self.disconnected or not report:
            return  # print once, after the last host
        width = max(len(f"{h}/{s}") for h, services in report.items() for s in services)
        lines = ["--> Services:"]
        for host_name in sorted(report):
            for name, row in sorted(report[host_name].items()):
                # A cell may hold a host's words (a failure's reason, a pid): kept to its line, it
                # cannot forge a row.
                row = {key: one_line(value) for key, value in row.items()}
                lines.append(f"    {f'{host_name}/{name}':<{width}}  {row['endpoint']:<24} "
                             f"{row['state']:<6}  {row['ready']}")
        logger.info("\n".join(lines))
        for line in rollouts.lines(state):
            logger.error(line)
        report.clear()


def install_summary(state) -> None:
    if not any(isinstance(h, SummaryPrinter) for h in state.callback_handlers):
        state.add_callback_handler(SummaryPrinter())
