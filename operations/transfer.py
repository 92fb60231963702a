"""Models from another host: `transfer.in_store(...)` puts a model into this host's store.

A host moved to after a GPU failure often has no models. When the data names a source host
for a model (`model_sources: {Qwen3.6-27B: gpu-a}`), the model is streamed from that host's
store into this host's store, host to host through the control machine's own SSH
connections (a `tar` on each side, nothing written on the control machine), into a
temporary sibling that is renamed into place only when complete and checked (every file's
relative path and size). SSH's own integrity check covers the bytes in flight; the staged
copy in shm is then built and verified from this store as usual. The source is only read.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import PurePosixPath

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand, operation

from operations import remote
from operations.settings import GLOBAL_KEYS

CHUNK = 1 << 20
PROGRESS_EVERY_S = 5.0


class StoreListing(FactBase):
    """``{relpath: size}`` of a model directory (marker and manifest files left out), or None if absent."""

    def command(self, path: str) -> str:
        return remote.command("model_listing", shlex.quote(path))

    def process(self, output):
        return json.loads("\n".join(output))


def _exec(client, command: str):
    channel = client.get_transport().open_session()
    channel.exec_command(command)
    return channel


def _stream(state, host, source_name: str, src: str, dest: str) -> bool:
    source = state.inventory.get_host(source_name)
    if not source.connected:
        source.connect(reason=f"to stream a model to {host.name}", raise_exceptions=False)
    if not source.connected:
        host.log_styled(f"cannot stream {src}: source host {source_name} is unreachable", fg="red", log_func=logger.error)
        return False
    src_listing = source.get_fact(StoreListing, path=src)
    if not src_listing:
        host.log_styled(f"cannot stream: {source_name} has no model at {src}", fg="red", log_func=logger.error)
        return False
    total = sum(src_listing.values())
    parent, name = str(PurePosixPath(dest).parent), PurePosixPath(dest).name
    partial = f"{parent}/.{name}.partial"
    src_parent, src_name = str(PurePosixPath(src).parent), PurePosixPath(src).name
    reader = _exec(source.connector.client, f"tar -C {shlex.quote(src_parent)} -cf - {shlex.quote(src_name)}")
    writer = _exec(
        host.connector.client,
        f"rm -rf {shlex.quote(partial)} && mkdir -p {shlex.quote(partial)} && tar -C {shlex.quote(partial)} --strip-components=1 -xf -",
    )
    sent, start, last = 0, time.monotonic(), time.monotonic()
    while True:
        block = reader.recv(CHUNK)
        if not block:
            break
        writer.sendall(block)
        sent += len(block)
        if time.monotonic() - last >= PROGRESS_EVERY_S:
            last = time.monotonic()
            rate = sent / max(last - start, 1e-6)
            eta = (total - sent) / rate if rate else 0
            host.log(f"streaming {name} from {source_name}: {sent / 2**20:.0f} MiB of ~{total / 2**20:.0f} MiB, {rate / 2**20:.0f} MiB/s, ETA {eta:.0f} s")
    writer.shutdown_write()
    read_status, write_status = reader.recv_exit_status(), writer.recv_exit_status()
    if read_status != 0 or write_status != 0:
        errors = (reader.recv_stderr(4096) + writer.recv_stderr(4096)).decode(errors="replace").strip()
        host.log_styled(f"streaming {name} from {source_name} failed ({read_status}/{write_status}): {errors}", fg="red", log_func=logger.error)
        return False
    got = host.get_fact(StoreListing, path=partial)
    if got != src_listing:
        host.log_styled(f"streamed copy of {name} differs from {source_name}:{src} (files or sizes); left at {partial}", fg="red", log_func=logger.error)
        return False
    ok, output = host.run_shell_command(f"mv {shlex.quote(partial)} {shlex.quote(dest)}", print_output=False)
    if not ok:
        return False
    elapsed = time.monotonic() - start
    host.log(f"streamed {name} from {source_name}: {len(src_listing)} files, {sent / 2**20:.0f} MiB in {elapsed:.1f} s")
    return True


@operation()
def in_store(model: str, path: str, source: str | None = None):
    """
    Make sure the model directory ``path`` exists in this host's store.

    + model: the model's name (messages)
    + path: its directory in this host's model store
    + source: inventory name of a host whose store has it, to stream it from when it is missing here

    **Example:**

    .. code:: python

        transfer.in_store(name="Qwen3.6-27B in the store", model="Qwen3.6-27B", path="/root/models/Qwen3.6-27B", source="gpu-a")
    """
    listing = host.get_fact(StoreListing, path=path)
    if listing:
        host.noop(f"model {model} is in the store at {path}")
        return
    if source is None:
        from pyinfra.api import OperationError

        raise OperationError(
            f"model {model} is not in {path} on {host.name}, and `model_sources` names no host to stream it from: "
            f"copy it there, or set model_sources: {{{model}: <a host that has it>}}"
        )
    if source == host.name:
        from pyinfra.api import OperationError

        raise OperationError(f"model_sources names {host.name} itself for {model}, which it lacks")
    source_host = host.inventory.get_host(source)
    source_store = source_host.data.get("model_store", GLOBAL_KEYS["model_store"].default)
    source_path = f"{source_store}/{model}"
    host.log(f"model {model} is missing from {path}: streaming it from {source}:{source_path}")
    yield FunctionCommand(_stream, (source, source_path, path), {})
