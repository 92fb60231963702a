"""Streaming between hosts through the control machine: one mechanism for models and venv copies.

A reader (a command on another inventory host, or a local process on the control machine)
produces a byte stream; a command on the target host consumes it. Both ends run over the
SSH connections pyinfra already holds, so nothing is written to the control machine's disk
and no host needs a key to reach another. Used by transfer.py (a model into a host's store)
and venv.py (installed distributions copied from a donor host).

The same channels serve a command whose output is wanted as it comes, not only when it ends (what
pyinfra gives): lock.py reads the deploy lock's answer as the first line of the command that goes
on to read the host (`open_session`, `first_line`, `rest_of_output`).
"""

from __future__ import annotations

import shlex
import subprocess
import time
from dataclasses import dataclass
from typing import Callable

import gevent

from operations import host_reads, remote
from operations.pyinfra_adapter import ssh_transport

CHUNK = 1 << 20
PROGRESS_EVERY_S = 5.0


def channel(host, command: str):
    """Run `command` on `host` over its pyinfra SSH connection; the paramiko channel to stream through.

    What the command writes is not in the answers host_reads keeps for that host: they are dropped.
    """
    host_reads.changed(host)
    opened = open_session(host)
    if opened is None:
        raise RuntimeError(f"{host.name}: streaming needs an SSH connection to the host")
    opened.exec_command(command)
    return opened


def open_session(host):
    """A new session channel on `host`'s SSH connection; None where it has none (another connector)."""
    transport = ssh_transport(host)
    if transport is None or not hasattr(transport, "open_session") or not transport.is_active():
        return None
    try:
        return transport.open_session()
    except Exception:  # the server refused another channel: the caller goes through pyinfra's command path
        return None


def first_line(channel) -> tuple[str, bytes]:
    """The channel's first line of output (as soon as it comes), and what came after it."""
    data = b""
    while b"\n" not in data:
        chunk = channel.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    line, _, rest = data.partition(b"\n")
    return line.decode("utf-8", "replace"), rest


def rest_of_output(channel, head: bytes) -> tuple[int, list[str], str]:
    """Read `channel` to its end: (exit status, its output lines after the first, its stderr). Both streams are
    read as they come (as pyinfra does), so a command writing much to one never waits on the other."""
    channel.settimeout(None)  # as long as the command runs; a dead peer ends the connection (DEAD_PEER_S)
    try:
        errors = gevent.spawn(_read_to_end, channel.recv_stderr)
        out = _read_to_end(channel.recv, head)
        status = channel.recv_exit_status()
        err = errors.get()
    finally:
        channel.close()
    return status, out.decode("utf-8", "replace").splitlines(), err.decode("utf-8", "replace")


def _read_to_end(recv, head: bytes = b"") -> bytes:
    chunks = [head]
    while True:
        chunk = recv(1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


class Reader:
    """The sending end: `read(n)` gives the next bytes (b"" at the end), `close()` its (exit status, stderr),
    `stop()` ends it early (the receiving end has gone: nothing more is read)."""

    read: Callable[[int], bytes]

    def close(self) -> tuple[int, str]:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class HostReader(Reader):
    def __init__(self, host, command: str):
        self._channel = channel(host, command)
        self.read = self._channel.recv

    def close(self) -> tuple[int, str]:
        return self._channel.recv_exit_status(), self._channel.recv_stderr(4096).decode(errors="replace")

    def stop(self) -> None:
        self._channel.close()


class LocalReader(Reader):
    def __init__(self, argv: list[str]):
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.read = self._proc.stdout.read

    def close(self) -> tuple[int, str]:
        return self._proc.wait(), self._proc.stderr.read().decode(errors="replace")

    def stop(self) -> None:
        self._proc.kill()


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
        try:
            writer.sendall(block)
        except OSError:  # the writing command ended (it refused the stream, or failed): its status says why
            reader.stop()
            break
        sent += len(block)
        if progress is not None and time.monotonic() - last >= PROGRESS_EVERY_S:
            last = time.monotonic()
            progress(sent, last - start)
    if not writer.closed:
        writer.shutdown_write()
    read_status, read_errors = reader.close()
    write_status = writer.recv_exit_status()
    errors = (read_errors + writer.recv_stderr(4096).decode(errors="replace")).strip()
    return Piped(sent, read_status, write_status, errors, time.monotonic() - start)


def unpack_command(dest: str) -> str:
    """The command that unpacks a tar stream from another host (a model, a donor's venv files) into the directory
    `dest` as root's own files (no owner of the sender's, no setuid, setgid or sticky bit, no write for group or
    others), refusing by name what `tar -x` would make as the sender said (a device node, a fifo, a name or a
    link out of the tree): operations/remote/untar_as_root.py. The script travels as an argument: stdin is the stream."""
    return f"python3 -I -c {shlex.quote(remote.script('untar_as_root'))} {shlex.quote(dest)}"
