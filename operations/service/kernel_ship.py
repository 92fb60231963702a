"""Kernel caches that travel: sealed by root once their service passed its gate, seeded into a
replica's cache before its (re)start, shipped host to host as the model is.

A restart on the same inputs finds its cache where it left it (kernel_cache.py). What this adds is
for a replica that starts with none: a host moved to after a GPU failure, a new replica, a cache
someone removed. Three operations:

1. `sealed` (after a replica's gate): root keeps a copy of the replica's cache,
   `SEALED_DIR/<key>.<arch>` (kernel_cache.sealed_name: the key and the GPU architecture the kernels
   were built for), once per key and architecture. The cache is the service user's; root never walks
   it: the service user's `tar`, in the service's own sandbox (operations/environment/transient.py),
   sends its regular files, and root's unpacker (operations/transport/on_host/untar_as_root.py)
   writes them as root's own, refusing links out of the tree, device nodes and the like. So a sealed
   copy is what the engine compiled when it served, frozen: nothing writes it later.
2. `warmed` (before a replica's (re)start, where its cache is empty): the sealed copy is seeded
   into the cache (root's `tar` of its own copy, unpacked by the service user's `tar` in the
   service's sandbox: root never writes into a directory the service user owns). Where this host
   has no sealed copy and `model_sources` names a host for the replica's target model (the host a
   service moves from), the sealed copy of the same key and architecture is first streamed from
   there, as a model is (operations/model/transfer.py: host to host on a one-time key, every file
   checked against the sha256 the origin's root computed, fanned out where several hosts need it).
3. kernel_cache.unused_removed (Cleanup): sealed copies of keys no unit names are removed with
   their caches.

A cache is worth time, never correctness: a source without the sealed copy, a stream refused or
cut, a seed that fails, each is said and the replica starts cold, as it would have.

What a cache is trusted for: its kernels are code the engine loads. A sealed copy holds what an
engine of the same key compiled on the host it came from, and no more than that engine could
write; shipping it carries that host's trust to this one, which is why only the host the data names
as the model's source is asked, never a host that merely lists one.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra import host, logger
from pyinfra.api import FunctionCommand

from operations.environment import transient
from operations.model import transfer
from operations.run import host_reads, remote_call
from operations.run.host_reads import operation
from operations.service import kernel_cache
from operations.service.kernel_cache import KERNELS_DIR, SEALED_DIR
from operations.transport import streaming

STEP_TIMEOUT_S = 1800  # a seal or a seed: a few GiB of small files, on one host


@dataclass(frozen=True)
class Warmup:
    """How a replica's empty cache gets its kernels before its (re)start: seeded from this host's
    sealed copy `sealed`, shipped first from `source` where that is set."""

    key: str
    sealed: str
    source: str | None

    @property
    def text(self) -> str:
        if self.source:
            return (f"kernel cache {self.key}: its sealed copy for {self.sealed.split('.', 1)[1]} "
                    f"from {self.source} (model_sources), where it has one; else a cold start")
        return f"kernel cache {self.key}: seeded from this host's sealed copy"


def warm_up(found: dict | None, cache_key: str, arch: str | None, starts: bool,
            source: str | None, host_name: str) -> Warmup | None:
    """The one decision of a replica's warm-up: only for a replica this run (re)starts whose cache
    is empty, from this host's sealed copy of its key and architecture, else from the host
    `model_sources` names for its target (a host, not this one, not a directory)."""
    if not starts or not isinstance(found, dict) or arch is None:
        return None
    if kernel_cache.warm(found, cache_key):
        return None
    name = kernel_cache.sealed_name(cache_key, arch)
    if (found.get("sealed") or {}).get(name, {}).get("files"):
        return Warmup(cache_key, name, None)
    if source and not transfer.is_local(source) and source != host_name:
        return Warmup(cache_key, name, source)
    return None


def seal_needed(found: dict | None, cache_key: str, arch: str | None, starts: bool) -> bool:
    """Whether root seals the replica's cache after its gate: its key and architecture have no
    sealed copy here, and the cache holds kernels or the replica (re)starts in this run (then it
    will)."""
    if not isinstance(found, dict) or arch is None:
        return False
    if kernel_cache.sealed_name(cache_key, arch) in (found.get("sealed") or {}):
        return False
    return starts or bool(kernel_cache.warm(found, cache_key))


def _as_service(sandbox: list[str], cache: str, argv: list[str], what: str) -> str:
    """`argv` as the service user, in the service's sandbox, its cache directory made by systemd."""
    return transient.command([*sandbox, f"CacheDirectory={kernel_cache.unit_setting(cache)}"],
                             {"PATH": transient.SYSTEM_PATH}, argv, what,
                             max_seconds=STEP_TIMEOUT_S)


def seal_command(cache_key: str, name: str, sandbox: list[str]) -> str:
    """Root's copy of the cache `cache_key` as `SEALED_DIR/name`: the service user's tar of its
    regular files, unpacked by root's unpacker into a fresh `.name.partial`, renamed into place
    only when whole and not empty. Prints `sealed N` or `empty`."""
    cache = f"{KERNELS_DIR}/{cache_key}"
    partial, dest = f"{SEALED_DIR}/.{name}.partial", f"{SEALED_DIR}/{name}"
    p, d = shlex.quote(partial), shlex.quote(dest)
    send = _as_service(sandbox, cache, ["/bin/sh", "-c", "cd \"$1\" && find . -type f -print0 | "
                                        "tar --null --no-recursion -T - -cf -", "sh", cache],
                       f"seal kernel cache {cache_key}")
    return (f"install -d -m 0700 {shlex.quote(SEALED_DIR)} && rm -rf {p} && mkdir -m 0700 {p} && "
            f"{send} | {streaming.unpack_command(partial)} || {{ rm -rf {p}; exit 1; }}; "
            f"n=$(find {p} -type f | wc -l); if [ \"$n\" -eq 0 ]; then rm -rf {p}; echo empty; "
            f"else rm -rf {d} && mv -T {p} {d} && echo sealed $n; fi")


def seed_command(warmup: Warmup, sandbox: list[str]) -> str:
    """The sealed copy into the replica's cache: root's tar of root's own copy, unpacked by the
    service user's tar (no owner of root's kept) into the directory systemd made for it."""
    cache = f"{KERNELS_DIR}/{warmup.key}"
    receive = _as_service(sandbox, cache, ["tar", "-x", "-f", "-", "-C", cache,
                                           "--no-same-owner", "--no-same-permissions"],
                          f"seed kernel cache {warmup.key}")
    return (f"tar -C {shlex.quote(f'{SEALED_DIR}/{warmup.sealed}')} "
            f"--exclude='./.sglang-deploy-*' -cf - . | {receive}")


def _shipped(state, target, warmup: Warmup) -> bool:
    """The sealed copy streamed from `warmup.source` (transfer.directory_from), where it has one."""
    path = f"{SEALED_DIR}/{warmup.sealed}"
    origin = state.inventory.get_host(warmup.source)
    if origin is None:
        target.log(f"kernel cache {warmup.key}: {warmup.source} is not in the inventory: a cold "
                   "start")
        return False
    if not origin.connected:
        origin.connect(reason=f"for a kernel cache of {target.name}", raise_exceptions=False)
    ok, _ = (remote_call.run(origin, f"test -d {shlex.quote(path)}", f"{path} on {origin.name}",
                             60) if origin.connected else (False, None))
    if not ok:
        target.log(f"kernel cache {warmup.key}: {warmup.source} has no sealed copy for "
                   f"{warmup.sealed.split('.', 1)[1]}: a cold start")
        return False
    remote_call.run(target, f"install -d -m 0700 {shlex.quote(SEALED_DIR)}",
                    f"making {SEALED_DIR}", 60)
    return transfer.directory_from(state, target, warmup.source, path, path)


def _warm(state, host, warmup: Warmup, sandbox: list[str]) -> bool:
    if warmup.source and not _shipped(state, host, warmup):
        return True  # a cold start, said
    ok, output = remote_call.run(host, seed_command(warmup, sandbox),
                                 f"seeding kernel cache {warmup.key}", STEP_TIMEOUT_S)
    if ok:
        host.log(f"kernel cache {warmup.key}: seeded from {warmup.sealed}")
    else:
        said = (str(getattr(output, "stderr", "") or "").strip().splitlines() or ["?"])[-1]
        host.log_styled(f"kernel cache {warmup.key}: not seeded ({said}): a cold start",
                        fg="yellow", log_func=logger.warning)
    return True


@operation()
def warmed(replica: str, cache_key: str, arch: str | None, starts: bool, source: str | None,
           sandbox: list[str]):
    """
    Before the replica's (re)start, its empty kernel cache seeded from a sealed copy (`warm_up`).

    + replica: the replica (messages)
    + cache_key: its unit's kernel cache key
    + arch: the GPU architecture it runs on (`GpuDecisions.arch_of`)
    + starts: the plan (re)starts it in this run
    + source: the host `model_sources` names for its target model, or None
    + sandbox: its unit's sandbox (`units.service_sandbox`)
    """
    found = host_reads.get(host, kernel_cache.KernelCaches, unit_dirs=kernel_cache.UNIT_DIRS)
    warmup = warm_up(found, cache_key, arch, starts, source, host.name)
    if warmup is None:
        host.noop(f"{replica}: its kernel cache needs no seed")
        return
    host.log(f"{replica}: {warmup.text}")
    yield FunctionCommand(_warm, (warmup, sandbox), {})


def _seal(state, host, cache_key: str, name: str, sandbox: list[str], started) -> bool:
    if started is not None and started.held:
        return True  # kept on its old version: nothing of the new key ran
    ok, output = remote_call.run(host, seal_command(cache_key, name, sandbox),
                                 f"sealing kernel cache {cache_key}", STEP_TIMEOUT_S)
    said = (str(getattr(output, "stdout", "") or "").strip().splitlines() or ["?"])[-1]
    if ok and said.startswith("sealed"):
        host.log(f"kernel cache {cache_key}: {said.split()[-1]} files sealed as {name}")
    elif ok:
        host.log(f"kernel cache {cache_key}: nothing compiled yet: not sealed")
    else:
        said = (str(getattr(output, "stderr", "") or "").strip().splitlines() or ["?"])[-1]
        host.log_styled(f"kernel cache {cache_key}: not sealed ({said})", fg="yellow",
                        log_func=logger.warning)
    return True


@operation()
def sealed(replica: str, cache_key: str, arch: str | None, starts: bool, sandbox: list[str],
           started=None):
    """
    After the replica's gate, root's copy of its kernel cache (`seal_needed`).

    + replica: the replica (messages)
    + cache_key, arch, starts, sandbox: as for `warmed`
    + started: its restart's outcome (`lifecycle.Restarted`): a held replica seals nothing
    """
    found = host_reads.get(host, kernel_cache.KernelCaches, unit_dirs=kernel_cache.UNIT_DIRS)
    if not seal_needed(found, cache_key, arch, starts):
        host.noop(f"{replica}: its kernel cache is sealed or empty")
        return
    name = kernel_cache.sealed_name(cache_key, arch)
    yield FunctionCommand(_seal, (cache_key, name, sandbox, started), {})
