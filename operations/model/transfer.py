"""Models from elsewhere: `transfer.in_store(...)` puts a model into this host's store.

A host moved to after a GPU failure often has no models. When the data names a source for
a model - another host of the inventory (`model_sources: {Qwen3.6-27B: gpu-a}`) or a
directory on the control machine (`model_sources: {Qwen3.6-27B: /data/models/Qwen3.6-27B}`) -
the model is streamed from there into this host's store: host to host, this host reading from the
source itself on a one-time key for exactly the model's files (operations/transport/peer_keys.py),
or, where it cannot reach the source, through the control machine (a `tar` on the source, relayed
here between two OpenSSH processes, nothing written on the control machine; pyinfra's own
connections where OpenSSH does not reach a host: operations/transport/openssh.py), or from the
control machine's directory made into a tar stream here, into a temporary sibling `.NAME.partial`
that is renamed into place only when complete and checked. The files go in several streams at once
(`transfer_streams`, 4 by default; a file is never split, the largest first, each to the lightest
stream), then the directories (their modes and mtimes) in one more. The source's model files are
only read (their hashes are cached beside them, as staging caches them).
Every byte against the origin: before anything moves, the origin says what each file is (size and
sha256: operations/model/model_digests.py, once per run), and only that is kept. The receiving end
is not `tar -x` but `streaming.unpack_command` given that listing: the files land as root's, without
the source's owners or setuid bits; a file the origin does not list, of another size, or whose bytes
hash to another sha256 is refused (never renamed into place), and so are a device node, a fifo, a
link, a sparse member, an oversized header, and a stream that stalls; the temporary sibling is then
removed. So a host that got the model in this run and serves it on (fan-out) can send nothing but
the origin's bytes. A transfer cut any other way (a connection lost, the deploy killed) leaves in
`.NAME.partial` only files that came whole and matched; the next run keeps those that are root's,
not links, and still hash to the origin's sha256 (RESUME), and sends the rest.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import threading
from pathlib import Path, PurePosixPath
from typing import Callable

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand

from operations import remote
from operations.model import forwarding, model_digests
from operations.run import host_reads, read_batch, remote_call
from operations.run.host_reads import operation
from operations.run.plan import Refusal
from operations.transport import fanout, openssh, peer_keys, stream_ends, streaming

OURS = (".sglang-deploy-",)  # our marker, manifest and journal files: never part of a model


@read_batch.batched()
class StoreListing(FactBase):
    """``{relpath: size}`` of a model directory (marker and manifest files left out), or None if
    absent."""

    def command(self, path: str) -> str:
        return remote.command("model_listing", shlex.quote(path))

    def process(self, output):
        return json.loads("\n".join(output))


class _HostSource:
    """A model in another host's store, read by `tar` on that host (over OpenSSH where it reaches
    the host, else over pyinfra's connection to it)."""

    def __init__(self, state, target, name: str, path: str):
        self.label, self.path = f"{name}:{path}", path
        self.host = state.inventory.get_host(name)
        if not self.host.connected:
            self.host.connect(reason=f"to stream a model to {target.name}", raise_exceptions=False)

    def sender(self, names: list[str], log) -> Callable[[], stream_ends.Source]:
        # Names from stdin (NUL-separated, taken as they are), each as `./NAME` (the member names a
        # whole-tree tar gives).
        tar = (f"tar -C {shlex.quote(self.path)} --null --verbatim-files-from --no-recursion "
               "-T - -cf -")
        return stream_ends.sending_end(self.host, tar,
                                     b"".join(f"./{n}".encode() + b"\0" for n in names), log)

    def together(self, rel: str):
        # the listing says nothing of hard links: each file on its own (a link's files arrive as
        # copies)
        return rel

    def dirs_sender(self, log) -> Callable[[], stream_ends.Source]:
        """The model's directories alone (their modes and mtimes, empty ones too), sent once every
        file is in."""
        tar = (f"cd {shlex.quote(self.path)} && find . -type d -print0 | tar --null "
               "--verbatim-files-from --no-recursion -T - -cf -")
        return stream_ends.sending_end(self.host, tar, log=log, small=True)

    def hosts(self) -> tuple:
        return (self.host,)

    def direct(self, target, names: list[str], log) -> peer_keys.Grant | None:
        """`target` reading `names` from this host itself, on a one-time key
        (operations/transport/peer_keys.py); None: through here."""
        return peer_keys.granted(self.host, target, self.path, names, log)


class _LocalSource:
    """A model directory on the control machine, made into a tar stream here."""

    def __init__(self, state, target, path: str):
        self.label, self.path = f"control machine:{path}", str(Path(path).resolve())

    def sender(self, names: list[str], log) -> Callable[[], stream_ends.Source]:
        files = [(os.path.join(self.path, n), f"./{n}") for n in names]
        return lambda: stream_ends.FilesSource(files)

    def together(self, rel: str):
        """Files that are hard links of one another go in one stream (the receiving end links them
        again)."""
        st = os.lstat(os.path.join(self.path, rel))
        return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 else rel

    def dirs_sender(self, log) -> Callable[[], stream_ends.Source]:
        """The model's directories alone (their modes and mtimes, empty ones too), sent once every
        file is in."""
        dirs = [os.path.relpath(os.path.join(top, d), self.path)
                for top, names, _ in os.walk(self.path) for d in names
                if not os.path.islink(os.path.join(top, d))]
        return lambda: stream_ends.FilesSource(
            [(os.path.join(self.path, d), f"./{d}") for d in sorted(dirs)])

    def hosts(self) -> tuple:
        return ()

    def direct(self, target, names: list[str], log) -> None:
        return None  # the control machine's own files: through here


# Run on the receiving host before a model is streamed into `.NAME.partial`: keep what a run that
# stopped half way left there whole and right (a regular file, root's, not a link, writable by root
# alone, one link, named and sized as in the origin's digests, and whose bytes hash to the origin's
# sha256: a file some holder sent wrong is sent again), remove everything else (the unpacker's
# temporary names among it); a `.NAME.partial` that is not root's own directory is removed whole,
# and one is made where there is none. Prints the list of what it kept. argv: PARTIAL; stdin:
# {relpath: [size, sha256]} (model_digests).
RESUME = r"""
import hashlib, json, os, shutil, stat, sys
from concurrent.futures import ThreadPoolExecutor
partial = sys.argv[1]
want = json.load(sys.stdin)
me = os.geteuid()

def ours(st, kind):
    return kind(st.st_mode) and st.st_uid == me and not st.st_mode & 0o022

def remove(path, st):
    shutil.rmtree(path) if stat.S_ISDIR(st.st_mode) else os.unlink(path)

def right(item):
    rel, path = item
    sha = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return rel, False
    with os.fdopen(fd, "rb", buffering=0) as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return rel, False
        while True:
            block = handle.read(1 << 22)
            if not block:
                break
            sha.update(block)
    return rel, sha.hexdigest() == want[rel][1]

try:
    st = os.lstat(partial)
except FileNotFoundError:
    st = None
if st is not None and not ours(st, stat.S_ISDIR):
    remove(partial, st)
    st = None
if st is None:
    os.mkdir(partial, 0o755)
    os.chmod(partial, 0o755)
whole = {}
for top, dirs, files in os.walk(partial):
    for name in list(dirs):
        path = os.path.join(top, name)
        st = os.lstat(path)
        if not ours(st, stat.S_ISDIR):
            dirs.remove(name)
            remove(path, st)
    for name in files:
        path = os.path.join(top, name)
        rel = os.path.relpath(path, partial)
        st = os.lstat(path)
        size = (want.get(rel) or [None])[0]
        if ours(st, stat.S_ISREG) and st.st_nlink == 1 and size == st.st_size:
            whole[rel] = path
        else:
            os.unlink(path)
kept = []
with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
    for rel, ok in pool.map(right, sorted(whole.items())):
        if ok:
            kept.append(rel)
        else:
            os.unlink(whole[rel])
print(json.dumps(kept))
"""


def _last_json(text: str):
    try:
        return json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def _resumable(host, partial: str, digests: model_digests.Digests) -> set[str] | None:
    """What `partial` holds whole and right already (RESUME), or None where it could not be
    prepared."""
    ok, output = remote_call.run(
        host, streaming.with_stdin(
            remote.isolated("python3", f"-c {shlex.quote(RESUME)} {shlex.quote(partial)}"),
            digests),
        f"checking what {partial} holds already", model_digests.HASH_TIMEOUT_S)
    kept = _last_json(output.stdout) if ok else None
    return set(kept) & set(digests) if isinstance(kept, list) else None


def _stream(state, host, source_name: str, src: str, dest: str,
            digests: model_digests.Digests, swarm: fanout.Swarm | None = None,
            whole: set[str] | None = None, forwarder: str | None = None) -> bool:
    """Stream the model at `source_name:src` (the origin, or a host that got it in this run) into
    `dest`, every file checked against `digests`, the origin's. With `swarm`, this host forwards
    what its `.NAME.partial` holds while it receives (operations/model/forwarding.py). `whole`: what
    this run's unpacker wrote there already, checked (read from `forwarder` while it received
    them), not checked again."""
    source = (_LocalSource(state, host, src) if is_local(source_name)
              else _HostSource(state, host, source_name, src))
    # The routes' probes (an SSH handshake each) beside the `.NAME.partial`'s preparation.
    probes = threading.Thread(target=openssh.decide, args=([host, *source.hosts()],), daemon=True)
    probes.start()
    src_listing = model_digests.sizes(digests)
    parent, name = str(PurePosixPath(dest).parent), PurePosixPath(dest).name
    partial = f"{parent}/.{name}.partial"
    already = set(whole) if whole is not None else _resumable(host, partial, digests)
    if already is None:
        host.log_styled(f"streaming {name}: {partial} could not be prepared", fg="red",
                        log_func=logger.error)
        return False
    if swarm is not None:  # it holds only whole, checked files from now: it may forward them
        swarm.receiving(host.name, host, partial)
    kept = (f"read from {forwarder} while it received them" if whole is not None
            else "kept from an earlier run")
    if already and whole is None:
        host.log(f"{len(already)} of {len(src_listing)} files of {name} are whole in {partial} "
                 "already (a run that stopped half way), with the origin's sha256: not sent again")
    sizes = {rel: model_digests.sent_size(entry) for rel, entry in digests.items()
             if rel not in already}
    # Others wait to forward these files from here: one after another, each whole early (the rate
    # of a link is the same; a file is forwarded a file behind, not a transfer behind).
    streams = 1 if swarm is not None and FOLLOW and swarm.awaited(host.name) \
        else openssh.streams(host)
    # Host to host where the receiver reaches the source (a one-time key for exactly these files),
    # else through here.
    direct = source.direct(host, sorted(sizes), host.log) if sizes else None
    probes.join()
    # says, once, where a host's bytes go over pyinfra's connection
    openssh.decide([host, *source.hosts()], host.log)

    def unpack(names):  # this stream may hold only these files, as the origin has them
        return streaming.unpack_command(partial, listing={n: digests[n] for n in names})

    jobs = [
        direct.job(f"{name}: {len(names)} file(s)", sum(sizes[n] for n in names), names,
                   unpack(names))
        if direct else
        streaming.Job(f"{name}: {len(names)} file(s)", sum(sizes[n] for n in names),
                      source.sender(names, host.log),
                      stream_ends.receiving_end(host, unpack(names), host.log))
        for names in streaming.batches(sizes, streams, source.together)
    ] if sizes else []
    total = sum(sizes.values())
    label = f"streaming {name} from {source.label}{' directly' if direct else ''}"
    try:
        moved = streaming.transfer_logged(jobs, streams, label, total, host.log)
    finally:
        if direct:
            direct.close()
    if moved.ok:
        dirs = streaming.Job(f"{name}: its directories", 0, source.dirs_sender(host.log),
                             stream_ends.receiving_end(host, unpack([]), host.log, small=True))
        moved = streaming.transfer([dirs], 1).after(moved)
    if not moved.ok:
        if moved.refused:
            remote_call.run(host, f"rm -rf {shlex.quote(partial)}", f"removing {partial}",
                            model_digests.HASH_TIMEOUT_S)
            left = "nothing of it is kept"
        else:
            left = f"what came whole stays in {partial}: the next run sends only the rest"
        host.log_styled(f"streaming {name} from {source.label} failed: {moved.why}; {left}",
                        fg="red", log_func=logger.error)
        return False
    # every file as the origin's, nothing it does not list (the listing follows a link for its
    # size: each link the unpacker wrote was listed with its target)
    got = host.get_fact(StoreListing, path=partial) or {}
    if set(got) - set(digests) or any(got.get(rel) != size for rel, size in src_listing.items()):
        host.log_styled(f"streamed copy of {name} differs from the origin's listing (files or "
                        f"sizes); left at {partial}", fg="red", log_func=logger.error)
        return False
    if swarm is not None:  # no host reads the partial copy while it is renamed
        swarm.closing(host.name)
    ok, output = remote_call.run(host, f"mv {shlex.quote(partial)} {shlex.quote(dest)}",
                                 f"renaming {partial} into place", 60)
    if not ok:
        return False
    via = (f"OpenSSH, {host.name} reading from {source.host.name} directly" if direct
           else streaming.carried_by(*source.hosts(), host))
    host.log(f"streamed {name} from {forwarder or source.label}: {len(src_listing)} files, "
             f"{moved.sent / 2**20:.0f} MiB in {moved.elapsed_s:.1f} s over {via} ({len(jobs)} "
             f"stream(s){f', {len(already)} file(s) {kept}' if already else ''})")
    return True


def receive_command(partial: str) -> str:
    """Unpack a model's whole stream, in one piece (names relative to the model's directory), into
    `partial`, made afresh; a stream refused or cut leaves no `partial` behind. (`_stream` sends a
    model in several streams into a `partial` RESUME prepared, each through
    `streaming.unpack_command` itself.)"""
    q = shlex.quote(partial)
    return (f"rm -rf {q} && mkdir -p {q} && {streaming.unpack_command(partial)} "
            f"|| {{ status=$?; rm -rf {q}; exit $status; }}")


def is_local(source: str) -> bool:
    """A source is a directory on the control machine when it is written as a path."""
    return "/" in source or source.startswith(".")


def stream_from(model: str, path: str, source: str | None, source_store: str | None,
                host_name: str) -> str:
    """The one decider of a model missing from this host's store (`in_store`, and the Models step's
    plan): the path to stream it from, or `plan.Refusal` where no source is named, the source is
    this host, or the source host's store is not known."""
    if source is None:
        raise Refusal(
            f"model {model} is not in {path} on {host_name}, and `model_sources` names no host "
            "to stream it from: "
            f"copy it there, or set model_sources: {{{model}: <a host that has it>}}", what=path)
    if source == host_name:
        raise Refusal(f"model_sources names {host_name} itself for {model}, which it lacks",
                      what=path)
    if is_local(source):
        return source
    if source_store is None:
        raise Refusal(f"model {model}: the model store of {source} is not known: pass "
                      "`source_store`", what=path)
    return f"{source_store}/{model}"


@operation()
def in_store(model: str, path: str, source: str | None = None, source_store: str | None = None):
    """
    Make sure the model directory ``path`` exists in this host's store.

    + model: the model's name (messages)
    + path: its directory in this host's model store
    + source: where to stream it from when it is missing here: an inventory host whose store
      has it, or the model's directory on the control machine (a path)
    + source_store: when ``source`` is a host, its model store (its validated ``model_store``)

    **Example:**

    .. code:: python

        transfer.in_store(name="Qwen3.6-27B in the store", model="Qwen3.6-27B",
                          path="/root/models/Qwen3.6-27B", source="gpu-a",
                          source_store="/root/models")
    """
    listing = host_reads.get(host, StoreListing, path=path)
    if listing:
        host.noop(f"model {model} is in the store at {path}")
        return
    source_path = stream_from(model, path, source, source_store, host.name)
    host.log(f"model {model} is missing from {path}: streaming it from {source}:{source_path}")
    yield FunctionCommand(_fanned_out, (source, source_path, path), {})


def directory_from(state, host, source_name: str, src: str, dest: str) -> bool:
    """Any directory of root's on the inventory host `source_name` (a model, a sealed kernel
    cache: operations/service/kernel_ship.py) put at `dest` on `host` as a model is: host to host,
    every file checked against the origin's sha256, fanned out, resumed; False (said) where it
    could not be."""
    return _fanned_out(state, host, source_name, src, dest)


def _origin_digests(state, host, source_name: str, src: str) -> model_digests.Digests:
    """The origin's digests of the model (model_digests), taken once per run: the control
    machine's directory hashed here, or the source host's store over pyinfra's connection to it."""
    def compute():
        if is_local(source_name):
            return model_digests.local(src)
        origin = state.inventory.get_host(source_name)
        if not origin.connected:
            origin.connect(reason=f"to stream a model to {host.name}", raise_exceptions=False)
        return model_digests.on_host(origin, src)

    return model_digests.of_origin(state, ("model", source_name, src), compute)


def _fanned_out(state, host, source_name: str, src: str, dest: str) -> bool:
    """`_stream`, from another host of the run that got the same model (same source, same path) in
    this run where one did or is getting it now, else from the source
    (operations/transport/fanout.py); a copy that fails from another host is resumed from the
    source. Once its listing matched, this host serves the next ones."""
    try:
        digests = _origin_digests(state, host, source_name, src)
    except OSError as exc:
        host.log_styled(f"cannot stream {PurePosixPath(dest).name}: the origin {source_name}:{src} "
                        f"could not say what its files are: {exc}", fg="red",
                        log_func=logger.error)
        return False
    if not fanout.ENABLED:
        return _stream(state, host, source_name, src, dest, digests)
    swarm = fanout.swarm(state, ("model", source_name, src), f"model {src}",
                         control_origin=is_local(source_name))
    if not is_local(source_name):
        swarm.seed(fanout.Holder(state.inventory.get_host(source_name), src, origin=True))
    name = PurePosixPath(dest).name
    whole = None
    with swarm.lease(host.name, {}, follow=FOLLOW) as lease:
        peer = lease.source is not None and not lease.source.origin
        if peer and lease.source.following:
            host.log(f"{name}: {lease.source.name} is getting it in this run: read each file from "
                     f"there once it is checked there, not from {source_name}")
            whole = _followed(host, swarm, lease.source, dest, digests)
            ok = whole is not None
        elif peer:
            host.log(f"{name}: {lease.source.name} got it in this run: read from there, not from "
                     f"{source_name}")
            ok = _stream(state, host, lease.source.name, lease.source.root, dest, digests, swarm)
        else:
            ok = _stream(state, host, source_name, src, dest, digests, swarm)
    if whole is not None:  # every file is in: the directories and links from the origin, checks
        ok = _stream(state, host, source_name, src, dest, digests, swarm, whole,
                     lease.source.name)
    if not ok and peer:
        host.log(f"{name}: reading from {lease.source.name} failed: resuming from {source_name}")
        ok = _stream(state, host, source_name, src, dest, digests, swarm)
    if ok:
        swarm.hold(fanout.Holder(host, dest))
    else:
        swarm.gone(host.name)
    return ok


# off: a receiver waits for a holder to hold the model whole, as before forwarding (bench)
FOLLOW = True


def _followed(host, swarm: fanout.Swarm, forwarder: fanout.Holder, dest: str,
              digests: model_digests.Digests) -> set[str] | None:
    """Every file of the model read into this host's `.NAME.partial` from `forwarder` while it gets
    them (operations/model/forwarding.py), this host forwarding them on in turn: the files that are
    in whole (all of them), or None (what came whole and right stays: the origin sends the rest)."""
    parent, name = str(PurePosixPath(dest).parent), PurePosixPath(dest).name
    partial = f"{parent}/.{name}.partial"
    already = _resumable(host, partial, digests)
    if already is None:
        return None
    swarm.receiving(host.name, host, partial)
    ok, why = forwarding.follow(swarm, forwarder.name, forwarder.host, host, partial, digests,
                                already, host.log)
    if not ok:
        host.log_styled(f"{name}: following {forwarder.name} ended: {why}", fg="yellow",
                        log_func=logger.warning)
        return None
    return set(model_digests.sizes(digests))
