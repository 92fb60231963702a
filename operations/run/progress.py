"""Progress of a long phase on a host, on the default verbosity: while a watched operation runs
there, a line every `EVERY_S` seconds says what it does, how long so far, and how far (the stage
script's own bytes, rate and ETA; bytes written into a venv generation; the engine's latest log
line while a service starts).

pyinfra prints a command's output only with `-vvv` and only as it ends, so a first deploy on a real
host (a multi-GB venv, a 54 GB model into RAM, a 27B model loading for minutes) looked hung. Here a
state callback (`Watcher`) starts a greenlet when a watched operation starts on a host and stops it
when the operation ends; the greenlet asks the host, over its own channel, what the phase has
reached (`Watch.reader`, a cheap shell command: `Reader`). A phase shorter than `EVERY_S` prints
nothing, and a converged host, which gets no operation, prints nothing either.

Engine text is redacted as every engine line is (`redact.engine_text`), cut to one short line.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass

import gevent
from pyinfra import logger
from pyinfra.api.state import BaseStateCallback

from operations.run import redact
from report.sizes import human_bytes
from report.terminal_text import one_line

EVERY_S = 10.0
READ_TIMEOUT_S = 15
LINE_MAX = 200


@dataclass(frozen=True)
class Reader:
    """How to ask the host how far a watched operation got: `command`, a shell command whose last
    line of output says it; `kind`: `line` (print that line), `bytes` (a byte count: printed with
    its rate) or `engine` (the engine's log line, redacted)."""

    command: str
    kind: str = "line"


@dataclass(frozen=True)
class Watch:
    """What a watched operation does (`what`), and how far it got (`reader`; None: the time so far
    only)."""

    what: str
    reader: Reader | None = None

    @property
    def kind(self) -> str:
        return self.reader.kind if self.reader else "line"


def last_line(path: str) -> Reader:
    return Reader(f"tail -n 1 {shlex.quote(path)} 2>/dev/null; true", "line")


def bytes_under(path: str) -> Reader:
    return Reader(f"du -sb {shlex.quote(path)} 2>/dev/null | cut -f1; true", "bytes")


def journal(unit: str) -> Reader:
    """The engine's latest line that is not the readiness gate's own `/health` request (an access
    log line for each probe would hide what the engine is doing)."""
    return Reader(f"journalctl -u {shlex.quote(unit)} -n 50 -o cat --no-pager 2>/dev/null "
                  "| grep -v ' /health' | tail -n 1; true", "engine")


def watch(operation, what: str, how: Reader | None = None) -> None:
    """Print `what` (and how far, per `how`) every EVERY_S seconds while `operation` (what an
    operation call returned) runs on its host."""
    from pyinfra import state

    _watcher(state).watches[id(operation)] = (operation, Watch(what, how))


def _watcher(state) -> Watcher:
    for handler in state.callback_handlers:
        if isinstance(handler, Watcher):
            return handler
    handler = Watcher()
    state.add_callback_handler(handler)
    return handler


def _elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds} s"


def progress_line(watched: Watch, elapsed_s: float, output: str | None,
                  previous: tuple[float, int] | None) -> tuple[str, tuple[float, int] | None]:
    """The line printed for one tick, and what the next tick's rate is measured from."""
    lines = [line for line in (output or "").splitlines() if line.strip()]
    said = lines[-1].strip() if lines else ""
    head = f"{watched.what}: {_elapsed(elapsed_s)} so far"
    if watched.kind == "bytes" and said.isdigit():
        now = (elapsed_s, int(said))
        rate = ""
        if previous and now[0] > previous[0] and now[1] >= previous[1]:
            rate = f", {human_bytes((now[1] - previous[1]) / (now[0] - previous[0]))}/s"
        return f"{head}, {human_bytes(now[1])} written{rate}", now
    if watched.kind == "engine" and said:
        said = redact.engine_text(said)
        return one_line(f"{head}; the engine's latest line: {said[:LINE_MAX]}"), previous
    return one_line(f"{head}; {said[:LINE_MAX]}" if said else head), previous


class Watcher(BaseStateCallback):
    """Starts a host's progress greenlet as a watched operation starts there, stops it as the
    operation ends (whatever its outcome). Per-run state: the watches, on this callback."""

    def __init__(self) -> None:
        super().__init__()
        self.watches: dict[int, tuple[object, Watch]] = {}
        self.running: dict[tuple[str, str], gevent.Greenlet] = {}

    def _of(self, state, host, op_hash):
        data = state.ops.get(host, {}).get(op_hash)
        entry = self.watches.get(id(getattr(data, "operation_meta", None)))
        return entry[1] if entry else None

    def operation_host_start(self, state, host, op_hash):
        watched = self._of(state, host, op_hash)
        if watched is not None and state.is_executing:
            self.running[(host.name, op_hash)] = gevent.spawn(_tick, host, watched)

    def _stop(self, host, op_hash) -> None:
        greenlet = self.running.pop((host.name, op_hash), None)
        if greenlet is not None:
            greenlet.kill(block=True, timeout=READ_TIMEOUT_S)

    def operation_host_success(self, state, host, op_hash, retry_count: int = 0):
        self._stop(host, op_hash)

    def operation_host_error(self, state, host, op_hash, retry_count: int = 0,
                             max_retries: int = 0):
        self._stop(host, op_hash)


def _tick(host, watched: Watch) -> None:
    start = time.monotonic()
    previous = None
    while True:
        gevent.sleep(EVERY_S)
        output = None
        if watched.reader:
            try:
                ok, out = host.run_shell_command(watched.reader.command, print_output=False,
                                                 print_input=False, _timeout=READ_TIMEOUT_S)
                output = out.stdout if ok else None
            except Exception:  # the host stopped answering: the operation itself will say so
                output = None
        line, previous = progress_line(watched, time.monotonic() - start, output, previous)
        host.log(line, log_func=logger.info)
