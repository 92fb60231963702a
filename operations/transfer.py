"""Models from elsewhere: `transfer.in_store(...)` puts a model into this host's store.

A host moved to after a GPU failure often has no models. When the data names a source for
a model - another host of the inventory (`model_sources: {Qwen3.6-27B: gpu-a}`) or a
directory on the control machine (`model_sources: {Qwen3.6-27B: /data/models/Qwen3.6-27B}`) -
the model is streamed from there into this host's store: host to host through the control
machine's own SSH connections (a `tar` on the source, nothing written on the control
machine), or from a local `tar`, into a
temporary sibling that is renamed into place only when complete and checked (every file's
relative path and size). SSH's own integrity check covers the bytes in flight; the staged
copy in shm is then built and verified from this store as usual. The source is only read.
The receiving end is not `tar -x` but `streaming.unpack_command`: the files land as root's, without
the source's owners or setuid bits, and a device node, a fifo or a link out of the tree stops the
copy, naming it; the temporary sibling is then removed.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path, PurePosixPath

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand, OperationError

from operations import host_reads, remote, streaming
from operations.host_reads import operation

OURS = (".sglang-deploy-",)  # our marker, manifest and journal files: never part of a model


@host_reads.batched()
class StoreListing(FactBase):
    """``{relpath: size}`` of a model directory (marker and manifest files left out), or None if absent."""

    def command(self, path: str) -> str:
        return remote.command("model_listing", shlex.quote(path))

    def process(self, output):
        return json.loads("\n".join(output))


def local_listing(path: str) -> dict[str, int] | None:
    """What `StoreListing` says, for a model directory on the control machine."""
    root = Path(path)
    if not root.is_dir():
        return None
    out = {
        str(p.relative_to(root)): p.stat().st_size
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(OURS)
    }
    return out or None


class _HostSource:
    """A model in another host's store, read by `tar` over that host's SSH connection."""

    def __init__(self, state, target, name: str, path: str):
        self.label, self.path = f"{name}:{path}", path
        self.host = state.inventory.get_host(name)
        if not self.host.connected:
            self.host.connect(reason=f"to stream a model to {target.name}", raise_exceptions=False)

    def listing(self):
        if not self.host.connected:
            raise OSError(f"source host {self.host.name} is unreachable")
        return self.host.get_fact(StoreListing, path=self.path)

    def reader(self, tar_command: str) -> streaming.Reader:
        return streaming.HostReader(self.host, tar_command)


class _LocalSource:
    """A model directory on the control machine, read by a local `tar`."""

    def __init__(self, state, target, path: str):
        self.label, self.path = f"control machine:{path}", str(Path(path).resolve())

    def listing(self):
        return local_listing(self.path)

    def reader(self, tar_command: str) -> streaming.Reader:
        return streaming.LocalReader(shlex.split(tar_command))


def _stream(state, host, source_name: str, src: str, dest: str) -> bool:
    source = _LocalSource(state, host, src) if is_local(source_name) else _HostSource(state, host, source_name, src)
    try:
        src_listing = source.listing()
    except OSError as exc:
        host.log_styled(f"cannot stream {source.label}: {exc}", fg="red", log_func=logger.error)
        return False
    if not src_listing:
        host.log_styled(f"cannot stream: no model at {source.label}", fg="red", log_func=logger.error)
        return False
    total = sum(src_listing.values())
    parent, name = str(PurePosixPath(dest).parent), PurePosixPath(dest).name
    partial = f"{parent}/.{name}.partial"
    reader = source.reader(f"tar -C {shlex.quote(source.path)} -cf - .")

    def progress(sent: int, elapsed: float) -> None:
        rate = sent / max(elapsed, 1e-6)
        eta = (total - sent) / rate if rate else 0
        host.log(f"streaming {name} from {source.label}: {sent / 2**20:.0f} MiB of ~{total / 2**20:.0f} MiB, {rate / 2**20:.0f} MiB/s, ETA {eta:.0f} s")

    piped = streaming.pipe(reader, host, receive_command(partial), progress)
    if not piped.ok:
        host.log_styled(f"streaming {name} from {source.label} failed ({piped.read_status}/{piped.write_status}): {piped.errors}", fg="red", log_func=logger.error)
        return False
    got = host.get_fact(StoreListing, path=partial)
    if got != src_listing:
        host.log_styled(f"streamed copy of {name} differs from {source.label} (files or sizes); left at {partial}", fg="red", log_func=logger.error)
        return False
    ok, output = host.run_shell_command(f"mv {shlex.quote(partial)} {shlex.quote(dest)}", print_output=False)
    if not ok:
        return False
    host.log(f"streamed {name} from {source.label}: {len(src_listing)} files, {piped.sent / 2**20:.0f} MiB in {piped.elapsed_s:.1f} s")
    return True


def receive_command(partial: str) -> str:
    """Unpack the model's stream (names relative to the model's directory) into `partial`, made afresh; a stream
    refused or cut leaves no `partial` behind."""
    q = shlex.quote(partial)
    return f"rm -rf {q} && mkdir -p {q} && {streaming.unpack_command(partial)} || {{ status=$?; rm -rf {q}; exit $status; }}"


def is_local(source: str) -> bool:
    """A source is a directory on the control machine when it is written as a path."""
    return "/" in source or source.startswith(".")


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

        transfer.in_store(name="Qwen3.6-27B in the store", model="Qwen3.6-27B", path="/root/models/Qwen3.6-27B", source="gpu-a",
                          source_store="/root/models")
    """
    listing = host_reads.get(host, StoreListing, path=path)
    if listing:
        host.noop(f"model {model} is in the store at {path}")
        return
    if source is None:
        raise OperationError(
            f"model {model} is not in {path} on {host.name}, and `model_sources` names no host to stream it from: "
            f"copy it there, or set model_sources: {{{model}: <a host that has it>}}"
        )
    if source == host.name:
        raise OperationError(f"model_sources names {host.name} itself for {model}, which it lacks")
    if is_local(source):
        source_path = source
    elif source_store is None:
        raise OperationError(f"model {model}: the model store of {source} is not known: pass `source_store`")
    else:
        source_path = f"{source_store}/{model}"
    host.log(f"model {model} is missing from {path}: streaming it from {source}:{source_path}")
    yield FunctionCommand(_stream, (source, source_path, path), {})
