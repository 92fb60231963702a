"""The end-of-run summary: one line per host and service with its endpoint, state and readiness.

Every step that decides a service's fate (the GPU check, preflight, the readiness gate and its
rollback, placement) writes its row with `record(...)` into `REPORT`, the run's one store;
`SummaryPrinter` prints it once the last host is done, and `health_timer.HealthTimer` reads it while
the run goes. Readers use `summary.REPORT` (the module attribute), never a copy of the name, so the
store is one.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.state import BaseStateCallback

from report import rollouts
from report.terminal_text import one_line

# host name -> service name -> {"endpoint", "state", "ready"}; printed when the run ends.
REPORT: dict[str, dict[str, dict[str, str]]] = {}


def record(host_name: str, service: str, endpoint: str, state: str, ready: str) -> None:
    """One row of the end-of-run summary (every step that decides a service's fate writes here)."""
    REPORT.setdefault(host_name, {})[service] = {"endpoint": endpoint,
                                                 "state": state, "ready": ready}


class SummaryPrinter(BaseStateCallback):
    """Prints, when the run ends, one line per host and service: endpoint, state, readiness."""

    def __init__(self):
        self.disconnected: set[str] = set()

    def host_disconnect(self, state, host):
        self.disconnected.add(host.name)
        if not {h.name for h in state.activated_hosts} <= self.disconnected or not REPORT:
            return  # print once, after the last host
        width = max(len(f"{h}/{s}") for h, services in REPORT.items() for s in services)
        lines = ["--> Services:"]
        for host_name in sorted(REPORT):
            for name, row in sorted(REPORT[host_name].items()):
                # A cell may hold a host's words (a failure's reason, a pid): kept to its line, it
                # cannot forge a row.
                row = {key: one_line(value) for key, value in row.items()}
                lines.append(f"    {f'{host_name}/{name}':<{width}}  {row['endpoint']:<24} "
                             f"{row['state']:<6}  {row['ready']}")
        logger.info("\n".join(lines))
        for line in rollouts.lines():
            logger.error(line)
        REPORT.clear()
        rollouts.HALTS.clear()
        rollouts.FAILED_GATES.clear()
        rollouts.RESTARTING.clear()


def install_summary(state) -> None:
    if not any(isinstance(h, SummaryPrinter) for h in state.callback_handlers):
        state.add_callback_handler(SummaryPrinter())
