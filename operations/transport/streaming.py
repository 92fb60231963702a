"""Streaming between hosts through the control machine: one mechanism for models and venv copies.

A reader (a command on another inventory host, or a local process on the control machine)
produces a byte stream; a command on the target host consumes it. Both ends run over the
SSH connections pyinfra already holds, so nothing is written to the control machine's disk
and no host needs a key to reach another. Used by transfer.py (a model into a host's store)
and venv_copy.py (installed distributions copied from a donor host).

The channels themselves (a session on a host's connection, a command's first line as it comes) are
operations/run/channels.py's.

Bytes in bulk (below, "Bulk bytes") go through OpenSSH processes where OpenSSH reaches the host with
its pyinfra settings (operations/transport/openssh.py), several streams at once: a model's files
from another host or from this machine (transfer.py), the wheels pushed from the wheelhouse
(`Pushes`, for venv.py), a donor's venv files. The receiving end is always `unpack_command` (root's
unpacker, each file renamed into place only once whole), run as the host's pyinfra login (root);
where OpenSSH cannot carry a host's bytes, the same streams go through pyinfra's paramiko
connection.
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import select
import shlex
import subprocess
import tarfile
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Callable

from pyinfra import logger
from pyinfra.api.command import FileUploadCommand

from operations import remote
from operations.pyinfra_adapter import ssh_transport
from operations.run import host_reads, remote_call
from operations.run.channels import channel
from operations.transport import openssh

CHUNK = 1 << 20
PROGRESS_EVERY_S = 5.0


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


# The unpacker's `--listing` travels in one argument (inside a peer fetch's receiving command, with
# the unpacker's own text): the kernel takes at most 128 KiB for one.
LISTING_MAX = 100_000
# A listed stream's time bound: this long, plus its bytes at this rate (a slower link stops there;
# what came whole is kept and the next run sends the rest).
DEADLINE_BASE_S = 600
DEADLINE_FLOOR_RATE = 10 << 20  # bytes per second


def unpack_command(dest: str, suffix: str = "", listing: dict | None = None) -> str:
    """The command that unpacks a tar stream from another host (a model, a donor's venv files) into
    the directory `dest` as root's own files (no owner of the sender's, no setuid, setgid or sticky
    bit, no write for group or others), refusing by name what `tar -x` would make as the sender said
    (a device node, a fifo, a name or a link out of the tree):
    operations/transport/on_host/untar_as_root.py. The script travels as an argument: stdin is the
    stream. `suffix` is appended to every regular file's name (wheels from another host land as
    `NAME.part`, to be checked). `listing` (`{relpath: [size, sha256 or None]}`, from the origin):
    only those files, of those sizes and digests, in a stream with a time bound; the rest
    refused."""
    words = [shlex.quote(remote.script("untar_as_root")), shlex.quote(dest)]
    if suffix:
        words += ["--suffix", shlex.quote(suffix)]
    if listing is not None:
        encoded = base64.b64encode(zlib.compress(
            json.dumps(listing, sort_keys=True, separators=(",", ":")).encode("utf-8"), 9)
        ).decode("ascii")
        if len(encoded) > LISTING_MAX:
            raise ValueError(f"the listing of {len(listing)} files for {dest} is larger than one "
                             f"argument may be ({len(encoded)} > {LISTING_MAX} bytes): send "
                             "them in more streams (`transfer_streams`)")
        total = sum(size for size, _ in listing.values() if isinstance(size, int))
        words += ["--listing", encoded,
                  "--deadline-s", str(DEADLINE_BASE_S + total // DEADLINE_FLOOR_RATE)]
    return remote.isolated("python3", "-c " + " ".join(words))


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


def carried_by(*hosts) -> str:
    """What carried bytes between these hosts (and this machine): OpenSSH where it reaches every one
    of them."""
    return "OpenSSH" if all(openssh.route(h) is not None for h in hosts) else "pyinfra's connection"


@dataclass
class Job:
    """One stream: `size` bytes (about) from `source()` into `sink()`; `what` names it in
    messages."""

    what: str
    size: int
    source: Callable[[], Source]
    sink: Callable[[], Sink]


@dataclass
class Moved:
    ok: bool
    sent: int
    elapsed_s: float
    # the first is the cause; the others were stopped by it
    failures: list[str] = field(default_factory=list)

    def after(self, earlier: "Moved") -> "Moved":
        """This transfer counted with the one before it."""
        return Moved(self.ok and earlier.ok, earlier.sent + self.sent,
                     earlier.elapsed_s + self.elapsed_s, earlier.failures + self.failures)

    @property
    def refused(self) -> bool:
        """The receiving end refused what a source sent (a link out of the tree, a device, ...:
        untar_as_root.py)."""
        return any("untar: refused" in failure for failure in self.failures)

    @property
    def why(self) -> str:
        more = (f" (and {len(self.failures) - 1} other stream(s) stopped)"
                if len(self.failures) > 1 else "")
        return (self.failures[0] if self.failures else "") + more


def _one(job: Job, count: Callable[[int], None], live: set) -> tuple[bool, str]:
    try:
        sink = job.sink()
    except OSError as exc:
        return False, f"{job.what}: the receiving end did not start: {exc}"
    try:
        source = job.source()
    except OSError as exc:
        sink.finish()
        return False, f"{job.what}: the sending end did not start: {exc}"
    live.add(source)
    gone = ""
    try:
        source.send(sink, count)
    # the receiving end has gone (its status says why), or another stream failed
    except OSError as exc:
        gone = str(exc)
        source.stop()
    finally:
        live.discard(source)
    read_status, read_said = source.finish()
    write_status, write_said = sink.finish()
    if read_status == 0 and write_status == 0 and not gone:
        return True, ""
    said = "; ".join(s for s in (write_said, read_said) if s) or gone or "no reason given"
    return False, f"{job.what} ({read_status}/{write_status}): {said}"


def transfer(jobs: list[Job], streams: int,
             progress: Callable[[int, float], None] | None = None) -> Moved:
    """Run `jobs`, `streams` at a time; `progress(bytes sent, seconds)` every PROGRESS_EVERY_S over
    them all."""
    lock = threading.Lock()
    queue, failures, live = list(jobs), [], set()
    start = time.monotonic()
    sent, last = [0], [start]

    def count(n: int) -> None:
        with lock:
            sent[0] += n
            now = time.monotonic()
            due = progress is not None and now - last[0] >= PROGRESS_EVERY_S
            if due:
                last[0] = now
        if due:
            progress(sent[0], now - start)

    def worker() -> None:
        while True:
            with lock:
                if failures or not queue:
                    return
                job = queue.pop(0)
            ok, why = _one(job, count, live)
            if not ok:
                with lock:
                    failures.append(why)
                    others = list(live)
                for source in others:
                    source.stop()

    workers = [threading.Thread(target=worker, daemon=True)
               for _ in range(max(1, min(streams, len(jobs))))]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return Moved(not failures, sent[0], time.monotonic() - start, failures)


def batches(sizes: dict[str, int], streams: int,
            together: Callable[[str], object] = lambda name: name) -> list[list[str]]:
    """The names in `sizes` as at most `streams` lists of about equal bytes (largest first, each to
    the lightest list), each in name order; a file is never split, and names with one
    `together(name)` go in one list."""
    units: dict[object, list[str]] = {}
    for name in sizes:
        units.setdefault(together(name), []).append(name)
    weight = {key: sum(sizes[n] + 512 for n in names) for key, names in units.items()}
    bins: list[tuple[int, list[str]]] = [(0, []) for _ in range(max(1, min(streams, len(units))))]
    for key in sorted(units, key=lambda k: (-weight[k], min(units[k]))):
        i = min(range(len(bins)), key=lambda k: bins[k][0])
        bins[i] = (bins[i][0] + weight[key], bins[i][1] + units[key])
    return [sorted(names) for _, names in bins if names]


def rate_line(what: str, sent: int, total: int, elapsed: float, streams: int) -> str:
    """The progress line: bytes, rate and ETA over the whole transfer."""
    rate = sent / max(elapsed, 1e-6)
    eta = max(total - sent, 0) / rate if rate else 0
    return (f"{what}: {sent / 2**20:.0f} MiB of ~{total / 2**20:.0f} MiB, "
            f"{rate / 2**20:.0f} MiB/s, ETA {eta:.0f} s"
            f" ({streams} stream{'s' if streams != 1 else ''})")


# Wheels pushed from the wheelhouse ----------------------------------------------------------------

# Run on the host before a push: which `NAME.part` files a run that died half way left whole and
# right (root's, not a link, writable by root alone, the size and the pinned sha256 of the file to
# push): those are not sent again.
VERIFIED_PARTS = r"""
import hashlib, json, os, stat, sys
ok = []
for path, size, sha256 in json.load(sys.stdin):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        continue
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022
                or st.st_size != size):
            continue
        digest = hashlib.sha256()
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() == sha256:
        ok.append(path)
print(json.dumps(ok))
"""
HEREDOC = "SGLANG_DEPLOY_EOF"


def with_stdin(command: str, data) -> str:
    """`command` given `data` (JSON, one line) on its stdin through a quoted here-document."""
    return f"{command} <<'{HEREDOC}'\n{json.dumps(data)}\n{HEREDOC}"


class Pushes:
    """Files of this machine that one operation pushes to one host, in one transfer (`transfer`:
    several streams at once, over OpenSSH where it reaches the host) when the first of its `Upload`
    commands runs. Each file lands whole under its remote name (`unpack_command`: written beside it,
    renamed once whole). A file whose remote name already holds it whole, root's, and with its
    pinned sha256 (a run that died half way) is not sent again."""

    def __init__(self, what: str = "wheel"):
        self.what = what
        # (local path, remote path, pinned sha256)
        self.files: list[tuple[str, str, str | None]] = []
        self._done: dict[str, bool] | None = None
        self._verified: set[str] | None = None

    def upload(self, src: str, dest: str, sha256: str | None = None) -> Upload:
        self.files.append((src, dest, sha256))
        return Upload(self, src, dest)

    def verified(self, host) -> set[str]:
        """The remote paths that hold their file already (checked once)."""
        if self._verified is None:
            pinned = [[dest, file_size(src), sha] for src, dest, sha in self.files if sha]
            self._verified = set()
            if pinned:
                ok, output = remote_call.run(
                    host, with_stdin(remote.isolated("python3",
                                                     f"-c {shlex.quote(VERIFIED_PARTS)}"), pinned),
                    "checking the wheels already pushed", 3600)
                if ok:
                    try:
                        self._verified = (set(json.loads(output.stdout.strip().splitlines()[-1]))
                                          & {p[0] for p in pinned})
                    except (ValueError, IndexError):
                        self._verified = set()
            if self._verified:
                host.log(f"{len(self._verified)} {self.what} file(s) already whole on the host "
                         "with their sha256 (a run that stopped half way): not sent again")
        return self._verified

    def landed(self, state, host, dest: str, fallback: Callable[[], bool]) -> bool:
        """Whether `dest` is pushed: the whole transfer runs at the first file asked for; where
        OpenSSH does not reach the host, each file goes by `fallback` (pyinfra's own upload)."""
        # the route's probe (an SSH handshake) beside the check of what is there already
        if self._verified is None:
            probe = threading.Thread(target=openssh.decide, args=([host],), daemon=True)
            probe.start()
            self.verified(host)
            probe.join()
        if dest in self.verified(host):
            return True
        if openssh.route(host, host.log) is None:
            return fallback()
        if self._done is None:
            self._done = self._pushed(state, host)
        return self._done.get(dest, False)

    def _pushed(self, state, host) -> dict[str, bool]:
        """The transfer (`fanout.WheelPushes` reads from another host of the run where one holds the
        files)."""
        return self._push(host)

    def _push(self, host) -> dict[str, bool]:
        todo = [(src, dest) for src, dest, _ in self.files if dest not in self._verified]
        sizes = {dest: file_size(src) for src, dest in todo}
        local = dict((dest, src) for src, dest in todo)
        pins = {dest: sha for _, dest, sha in self.files}
        streams = openssh.streams(host)
        jobs = []
        for names in batches(sizes, streams):
            directories = {str(PurePosixPath(d).parent) for d in names}
            for directory in sorted(directories):
                mine = [d for d in names if str(PurePosixPath(d).parent) == directory]
                files = [(local[d], PurePosixPath(d).name) for d in mine]
                listing = {PurePosixPath(d).name: [sizes[d], pins.get(d)] for d in mine}
                jobs.append(Job(f"{self.what}s to {directory}", sum(sizes[d] for d in names),
                                (lambda files=files: FilesSource(files)),
                                receiving_end(host, unpack_command(directory, listing=listing))))
        total = sum(sizes.values())
        label = f"pushing {len(todo)} {self.what}(s) over OpenSSH"
        moved = transfer(jobs, streams, lambda sent, elapsed: host.log(
            rate_line(label, sent, total, elapsed, min(streams, len(jobs)))))
        if not moved.ok:
            host.log_styled(f"pushing {self.what}s failed: {moved.why}", fg="red",
                            log_func=logger.error)
            return {}
        host.log(f"pushed {len(todo)} {self.what}(s), {total / 2**20:.0f} MiB in "
                 f"{moved.elapsed_s:.1f} s over OpenSSH ({min(streams, len(jobs))} stream(s), "
                 f"{total / 2**20 / max(moved.elapsed_s, 1e-6):.0f} MiB/s)")
        return {dest: True for dest in sizes}


def file_size(path: str) -> int:
    return os.stat(path).st_size


class Upload(FileUploadCommand):
    """pyinfra's upload of one file, carried by its `Pushes` (all of an operation's files in one
    parallel transfer over OpenSSH; pyinfra's own upload where OpenSSH does not reach the host)."""

    def __init__(self, pushes: Pushes, src: str, dest: str):
        super().__init__(src, dest)
        self.pushes = pushes

    def execute(self, state, host, connector_arguments):
        return self.pushes.landed(state, host, self.dest, lambda: super(Upload, self).execute(
            state, host, connector_arguments))
