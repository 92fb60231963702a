"""Streaming between hosts through the control machine: one mechanism for models and venv copies.

A reader (a command on another inventory host, or a local process on the control machine)
produces a byte stream; a command on the target host consumes it. Both ends run over the
SSH connections pyinfra already holds, so nothing is written to the control machine's disk
and no host needs a key to reach another. Used by transfer.py (a model into a host's store)
and venv.py (installed distributions copied from a donor host).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from typing import Callable

from operations import host_reads

CHUNK = 1 << 20
PROGRESS_EVERY_S = 5.0


def channel(host, command: str):
    """Run `command` on `host` over its pyinfra SSH connection; the paramiko channel to stream through.

    What the command writes is not in the answers host_reads keeps for that host: they are dropped.
    """
    host_reads.changed(host)
    opened = host.connector.client.get_transport().open_session()
    opened.exec_command(command)
    return opened


class Reader:
    """The sending end: `read(n)` gives the next bytes (b"" at the end), `close()` its (exit status, stderr)."""

    read: Callable[[int], bytes]

    def close(self) -> tuple[int, str]:
        raise NotImplementedError


class HostReader(Reader):
    def __init__(self, host, command: str):
        self._channel = channel(host, command)
        self.read = self._channel.recv

    def close(self) -> tuple[int, str]:
        return self._channel.recv_exit_status(), self._channel.recv_stderr(4096).decode(errors="replace")


class LocalReader(Reader):
    def __init__(self, argv: list[str]):
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.read = self._proc.stdout.read

    def close(self) -> tuple[int, str]:
        return self._proc.wait(), self._proc.stderr.read().decode(errors="replace")


@dataclass
class Piped:
    sent: int
    read_status: int
    write_status: int
    errors: str
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.read_status == 0 and self.write_status == 0


def pipe(reader: Reader, host, write_command: str, progress: Callable[[int, float], None] | None = None) -> Piped:
    """Send everything `reader` produces to `write_command`'s stdin on `host`; `progress(sent, elapsed)` every few seconds."""
    writer = channel(host, write_command)
    sent, start = 0, time.monotonic()
    last = start
    while True:
        block = reader.read(CHUNK)
        if not block:
            break
        writer.sendall(block)
        sent += len(block)
        if progress is not None and time.monotonic() - last >= PROGRESS_EVERY_S:
            last = time.monotonic()
            progress(sent, last - start)
    writer.shutdown_write()
    read_status, read_errors = reader.close()
    write_status = writer.recv_exit_status()
    errors = (read_errors + writer.recv_stderr(4096).decode(errors="replace")).strip()
    return Piped(sent, read_status, write_status, errors, time.monotonic() - start)
