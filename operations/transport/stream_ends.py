"""The two ends of a stream between hosts: where its bytes come from (a `Source`: a command on
another host, a local process, files of this machine, a reader) and where they go (a `Sink`: root's
unpacker on the receiving host, over OpenSSH or pyinfra's channel), and how a stream's bytes are
relayed between them (spliced where both ends are pipes). operations/transport/streaming.py runs
jobs of such streams, several at once; this module is one stream's ends.
"""

from __future__ import annotations

import fcntl
import io
import os
import select
import subprocess
import tarfile
import tempfile
import threading
from typing import Callable

from operations.pyinfra_adapter import ssh_transport
from operations.run import host_reads
from operations.run.channels import channel
from operations.transport import openssh

CHUNK = 1 << 20


class Reader:
    """The sending end: `read(n)` gives the next bytes (b"" at the end), `close()` its (exit status,
    stderr), `stop()` ends it early (the receiving end has gone: nothing more is read)."""

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
        return (self._channel.recv_exit_status(),
                self._channel.recv_stderr(4096).decode(errors="replace"))

    def stop(self) -> None:
        self._channel.close()


class LocalReader(Reader):
    def __init__(self, argv: list[str]):
        # time bound: the receiving unpacker's deadline and idle limit end the transfer, which
        # then stops this reader
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.read = self._proc.stdout.read

    def close(self) -> tuple[int, str]:
        return self._proc.wait(), self._proc.stderr.read().decode(errors="replace")

    def stop(self) -> None:
        self._proc.kill()


# Bulk bytes ---------------------------------------------------------------------------------------
#
# A transfer is a list of jobs, run `streams` at a time; each job is one stream: a sending end (a
# `tar` on another host, or files of this machine made into a tar stream here) relayed here into a
# receiving end (a command on the target host reading its stdin). Each end is an OpenSSH process
# where `openssh.route` has one for its host, else a channel of pyinfra's own connection. The first
# job that fails stops the others (their sending ends are ended; their receiving ends see their
# input end and say so), and the transfer says why.

# the kernel pipes between us and the ssh processes (Linux; best effort): fewer, larger reads
PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = 1031


def _bigger_pipe(stream) -> None:
    try:
        fcntl.fcntl(stream.fileno(), F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, AttributeError, ValueError):
        pass


class ReceiverGone(OSError):
    """The receiving end stopped taking bytes (it refused the stream, failed, or its connection
    ended)."""


class Stopped(OSError):
    """Another stream of the transfer failed: this one stops."""


def _said(handle) -> str:
    handle.seek(0)
    return handle.read()[-4000:].decode("utf-8", "replace").strip()


class Sink:
    """A receiving end: a command on the target host that reads the stream on its stdin."""

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def finish(self) -> tuple[int, str]:
        """Close its input and wait for it: (its exit status, what it said)."""
        raise NotImplementedError


class ProcessSink(Sink):
    """`ssh HOST COMMAND` (or any local process) fed on its stdin."""

    def __init__(self, argv: list[str], host=None):
        if host is not None:
            # what the command writes is not in the answers host_reads keeps for that host
            host_reads.forget(host)
        self._said = tempfile.TemporaryFile()
        # time bound: the unpacker it runs (its deadline and idle limit), and ssh's keepalive
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=self._said,
                                      stderr=self._said, start_new_session=True,
                                      env=openssh.environment())
        _bigger_pipe(self._proc.stdin)

    def write(self, data: bytes) -> None:
        try:
            self._proc.stdin.write(data)
        except (OSError, ValueError) as exc:
            raise ReceiverGone(str(exc)) from None

    def fileno(self) -> int:
        return self._proc.stdin.fileno()

    def finish(self) -> tuple[int, str]:
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        status = self._proc.wait()
        with self._said:
            return status, _said(self._said)


class ChannelSink(Sink):
    """The command on a channel of the host's pyinfra connection (where OpenSSH does not reach
    it)."""

    def __init__(self, host, command: str):
        self._channel = channel(host, command)

    def write(self, data: bytes) -> None:
        try:
            self._channel.sendall(data)
        except OSError as exc:
            raise ReceiverGone(str(exc)) from None

    def finish(self) -> tuple[int, str]:
        if not self._channel.closed:
            try:
                self._channel.shutdown_write()
            except OSError:
                pass
        status = self._channel.recv_exit_status()
        return status, self._channel.recv_stderr(1 << 16).decode(errors="replace").strip()


class Source:
    """A sending end: `send(sink, count)` gives it everything (`count(n)` after each block),
    `finish()` its (exit status, what it said), `stop()` ends it early from another stream."""

    def send(self, sink: Sink, count: Callable[[int], None]) -> None:
        raise NotImplementedError

    def finish(self) -> tuple[int, str]:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


def _feed(write, close, data: bytes) -> None:
    """Give a sending command its stdin (a list of names) beside the relay of its stdout, so that
    neither waits on the other."""

    def run():
        try:
            if data:
                write(data)
        except (OSError, ValueError):
            pass
        finally:
            try:
                close()
            except (OSError, ValueError):
                pass

    threading.Thread(target=run, daemon=True).start()


class _Relay(Source):
    read: Callable[[int], bytes]
    stopped = False

    def send(self, sink: Sink, count: Callable[[int], None]) -> None:
        while True:
            try:
                block = self.read(CHUNK)
            except (OSError, ValueError):
                block = b""  # ended by `stop()`: its status says so
            if not block:
                return
            sink.write(block)
            count(len(block))


def _splice(source: int, sink: int, count: Callable[[int], None]) -> None:
    """Move everything from pipe `source` to pipe `sink` inside the kernel (Linux `splice`: no copy
    through this process), `count(n)` after each move; returns at the source's end. Both ends are
    made non-blocking and waited on with `select`, which gevent makes cooperative under pyinfra."""
    os.set_blocking(source, False)
    os.set_blocking(sink, False)
    while True:
        select.select([source], [], [])
        try:
            moved = os.splice(source, sink, CHUNK, flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK)
        # the receiving end's pipe is full (the source had bytes): wait until it takes more
        except BlockingIOError:
            select.select([], [sink], [])
            continue
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ReceiverGone(str(exc)) from None
        except OSError:  # the source was ended (`stop()`): its status says so
            return
        if not moved:
            return
        count(moved)


class ProcessSource(_Relay):
    """`ssh HOST COMMAND` (or a local process): what it writes on stdout; `stdin` given to it. Into
    another process (`ProcessSink`: ssh to the receiving host) the bytes move between the two pipes
    inside the kernel (Linux)."""

    def send(self, sink: Sink, count: Callable[[int], None]) -> None:
        if isinstance(sink, ProcessSink) and hasattr(os, "splice"):
            _splice(self._proc.stdout.fileno(), sink.fileno(), count)
        else:
            super().send(sink, count)

    def __init__(self, argv: list[str], stdin: bytes = b""):
        self._said = tempfile.TemporaryFile()
        # time bound: the receiving unpacker's deadline and idle limit, and ssh's keepalive
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._said, start_new_session=True,
                                      env=openssh.environment())
        _bigger_pipe(self._proc.stdout)
        out = self._proc.stdout
        self.read = getattr(out, "read1", out.read)
        _feed(self._proc.stdin.write, self._proc.stdin.close, stdin)

    def finish(self) -> tuple[int, str]:
        status = self._proc.wait()
        self._proc.stdout.close()
        with self._said:
            return status, _said(self._said)

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()


class ChannelSource(_Relay):
    """The command on a channel of the host's pyinfra connection; `stdin` given to it."""

    def __init__(self, host, command: str, stdin: bytes = b""):
        self._channel = channel(host, command)
        self.read = self._channel.recv
        _feed(self._channel.sendall, self._channel.shutdown_write, stdin)

    def finish(self) -> tuple[int, str]:
        return (self._channel.recv_exit_status(),
                self._channel.recv_stderr(1 << 16).decode(errors="replace").strip())

    def stop(self) -> None:
        self._channel.close()


class ReaderSource(_Relay):
    """A `Reader` (HostReader, LocalReader) as a sending end."""

    def __init__(self, reader: Reader):
        self._reader = reader
        self.read = reader.read

    def finish(self) -> tuple[int, str]:
        return self._reader.close()

    def stop(self) -> None:
        self._reader.stop()


class Fetched(Source):
    """A receiving host that fetches the bytes itself, from the source host
    (operations/transport/peer_keys.py): the command there (`inner`, a sending end of this
    machine's) writes back only how many bytes it has received so far, a line at a time, which are
    counted as they come. Nothing of the transfer's own bytes passes through this machine."""

    def __init__(self, inner: _Relay):
        self._inner = inner

    def send(self, sink: Sink, count: Callable[[int], None]) -> None:
        seen, rest = 0, b""
        while True:
            try:
                block = self._inner.read(1 << 16)
            except (OSError, ValueError):
                block = b""  # ended by `stop()`: its status says so
            if not block:
                return
            *lines, rest = (rest + block).split(b"\n")
            for line in lines:
                if line.strip().isdigit():
                    count(int(line) - seen)
                    seen = int(line)

    def finish(self) -> tuple[int, str]:
        return self._inner.finish()

    def stop(self) -> None:
        self._inner.stop()


class Nowhere(Sink):
    """The receiving end of a `Fetched` job: the receiving host writes the bytes itself."""

    def write(self, data: bytes) -> None:
        raise ReceiverGone("nothing is relayed here")

    def finish(self) -> tuple[int, str]:
        return 0, ""


class FilesSource(Source):
    """Files of this machine, made into a tar stream here (no `tar` needed here): [(path, member
    name)], each added as what it is (a link as a link, a fifo as a fifo: the receiving end judges
    it)."""

    def __init__(self, files: list[tuple[str, str]]):
        self._files = files
        self._stopped = False
        self._failed = ""

    def send(self, sink: Sink, count: Callable[[int], None]) -> None:
        if isinstance(sink, ProcessSink) and hasattr(os, "sendfile"):
            try:
                self._send_into_pipe(sink.fileno(), count)
            except (ReceiverGone, Stopped):
                raise
            # a file of ours could not be read: the stream stops short, and says why
            except OSError as exc:
                self._failed = f"{exc.filename or ''}: {exc.strerror or exc}"
            return
        source = self

        class Out:
            def write(self, data: bytes) -> int:
                if source._stopped:
                    raise Stopped("stopped")
                sink.write(data)
                count(len(data))
                return len(data)

        try:
            with tarfile.open(fileobj=Out(), mode="w|", bufsize=CHUNK, format=tarfile.GNU_FORMAT,
                              copybufsize=CHUNK) as archive:
                for path, name in self._files:
                    archive.add(path, arcname=name, recursive=False)
        except (ReceiverGone, Stopped):
            raise
        # a file of ours could not be read: the stream stops short, and says why
        except OSError as exc:
            self._failed = f"{exc.filename or ''}: {exc.strerror or exc}"

    def _send_into_pipe(self, pipe: int, count: Callable[[int], None]) -> None:
        """The same tar stream as `tarfile` writes (its own headers, hard links as links), each
        file's bytes moved from the page cache into the pipe by the kernel (`sendfile`: no copy
        through this process)."""
        os.set_blocking(pipe, False)

        def put(data: bytes) -> None:
            view = memoryview(data)
            while view:
                if self._stopped:
                    raise Stopped("stopped")
                try:
                    wrote = os.write(pipe, view)
                except BlockingIOError:
                    select.select([], [pipe], [])
                    continue
                except (BrokenPipeError, ConnectionResetError) as exc:
                    raise ReceiverGone(str(exc)) from None
                view = view[wrote:]
                count(wrote)

        # headers, and links seen
        archive = tarfile.TarFile(fileobj=io.BytesIO(), mode="w", format=tarfile.GNU_FORMAT)
        for path, name in self._files:
            info = archive.gettarinfo(path, arcname=name)
            if info is None:
                continue  # a socket: tarfile adds none either
            put(info.tobuf(archive.format, archive.encoding, archive.errors))
            if not (info.isreg() and info.size):
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                offset = 0
                while offset < info.size:
                    if self._stopped:
                        raise Stopped("stopped")
                    try:
                        moved = os.sendfile(pipe, fd, offset, min(CHUNK, info.size - offset))
                    except BlockingIOError:
                        select.select([], [pipe], [])
                        continue
                    except (BrokenPipeError, ConnectionResetError) as exc:
                        raise ReceiverGone(str(exc)) from None
                    if not moved:
                        raise OSError(5, "changed while it was sent (shorter than it was)", path)
                    offset += moved
                    count(moved)
            finally:
                os.close(fd)
            put(b"\0" * (-info.size % tarfile.BLOCKSIZE))
        put(b"\0" * (2 * tarfile.BLOCKSIZE))  # the end of the archive

    def finish(self) -> tuple[int, str]:
        return (1, self._failed) if self._failed or self._stopped else (0, "")

    def stop(self) -> None:
        self._stopped = True


def _connected(host) -> bool:
    transport = ssh_transport(host)
    return transport is not None and hasattr(transport, "is_active") and transport.is_active()


def receiving_end(host, command: str, log: Callable[[str], None] | None = None,
                  small: bool = False) -> Callable[[], Sink]:
    """How to open `command` on `host` as a receiving end: over OpenSSH where it reaches the host,
    else pyinfra's channel (`small`: a few bytes, which pyinfra's open connection carries without a
    handshake of their own)."""
    argv = None if small and _connected(host) else openssh.route(host, log)
    if argv is None:
        return lambda: ChannelSink(host, command)
    return lambda: ProcessSink([*argv, command], host)


def sending_end(host, command: str, stdin: bytes = b"", log: Callable[[str], None] | None = None,
                small: bool = False) -> Callable[[], Source]:
    """How to open `command` on `host` (another host: a model's source, a donor) as a sending
    end."""
    argv = None if small and _connected(host) else openssh.route(host, log)
    if argv is not None:
        return lambda: ProcessSource([*argv, command], stdin)
    if stdin:
        return lambda: ChannelSource(host, command, stdin)
    return lambda: ReaderSource(HostReader(host, command))
