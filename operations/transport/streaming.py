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
import json
import os
import shlex
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Callable

from pyinfra import logger
from pyinfra.api.command import FileUploadCommand

from operations import remote
from operations.run import remote_call
from operations.transport import openssh
from operations.transport.stream_ends import FilesSource, Sink, Source, receiving_end

PROGRESS_EVERY_S = 5.0


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


def transfer_logged(jobs: list[Job], streams: int, label: str, total: int,
                    log: Callable[[str], None]) -> Moved:
    """`transfer`, its progress logged as `rate_line(label, ...)` of `total` bytes: the one way a
    transfer says how it goes."""
    return transfer(jobs, streams, lambda sent, elapsed: log(
        rate_line(label, sent, total, elapsed, len(jobs))))


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
