"""SSH channels of this run's connections: open a session on a host, read a command's first line as
soon as it comes, and the rest to its end. The streams (operations/transport/streaming.py), the host
lock and the one-time keys all talk through them.
"""

from __future__ import annotations

import gevent

from operations.pyinfra_adapter import ssh_transport
from operations.run import host_reads


def channel(host, command: str):
    """Run `command` on `host` over its pyinfra SSH connection; the paramiko channel to stream
    through.

    What the command writes is not in the answers host_reads keeps for that host: they are dropped.
    """
    host_reads.forget(host)
    opened = open_session(host)
    if opened is None:
        raise RuntimeError(f"{host.name}: streaming needs an SSH connection to the host")
    opened.exec_command(command)
    return opened


def open_session(host):
    """A new session channel on `host`'s SSH connection; None where it has none (another
    connector)."""
    transport = ssh_transport(host)
    if transport is None or not hasattr(transport, "open_session") or not transport.is_active():
        return None
    try:
        return transport.open_session()
    # the server refused another channel: the caller goes through pyinfra's command path
    except Exception:
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
    """Read `channel` to its end: (exit status, its output lines after the first, its stderr). Both
    streams are read as they come (as pyinfra does), so a command writing much to one never waits on
    the other."""
    # as long as the command runs; a dead peer ends the connection (DEAD_PEER_S)
    channel.settimeout(None)
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
