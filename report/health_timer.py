"""Time to ready: for each service (re)started in the run, the time from the start of the deploy
to its gate proving it ready (`/ready` 200, `/health` on an engine without it: the migration's
figure); and, once every host is done, the hosts the run could not reach.

It reads the run's summary rows (`summary.rows`): a row the readiness gate wrote as ready
"after (re)start" is logged the moment its operation succeeds on that host.
"""

from __future__ import annotations

import time

from pyinfra import logger
from pyinfra.api.state import BaseStateCallback

from report import summary


def _process_started() -> float:
    """Seconds on the monotonic clock when this process started (Linux /proc), else now."""
    try:
        import os

        with open("/proc/self/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.monotonic() - max(age, 0.0)
    except (OSError, ValueError, IndexError):
        return time.monotonic()


class HealthTimer(BaseStateCallback):
    """Logs, for each service that became ready in this run, the time since the deploy started."""

    def __init__(self):
        self.started = _process_started()
        self.seen: set[tuple[str, str]] = set()
        self.disconnected: set[str] = set()

    def operation_host_success(self, state, host, op_hash, retry_count: int = 0):
        for service, row in summary.rows(state).get(host.name, {}).items():
            key = (host.name, service)
            if (key in self.seen or row.get("state") != "ready"
                    or "after (re)start" not in row.get("ready", "")):
                continue
            self.seen.add(key)
            elapsed = time.monotonic() - self.started
            logger.info(f"--> {host.name}/{service} is ready {elapsed:.1f} s after the "
                        "deploy started")

    def host_disconnect(self, state, host):
        self.disconnected.add(host.name)
        if not {h.name for h in state.activated_hosts} <= self.disconnected:
            return  # once, after the last host
        for name in sorted(h.name for h in state.failed_hosts if h not in state.activated_hosts):
            logger.warning(
                f"--> {name}: not reached (connection failed): nothing there changed; the other "
                "hosts were deployed. Services no longer placed on it are removed by the next "
                "deploy that reaches it"
            )


def install_timer(state) -> None:
    if not any(isinstance(h, HealthTimer) for h in state.callback_handlers):
        state.add_callback_handler(HealthTimer())
