"""A service's kernel caches: its engine's JIT state, keyed by what its kernels depend on.

The engine compiles kernels on its first start and at its first batches (triton, flashinfer's JIT,
torch inductor, the CUDA driver's PTX cache, deep_gemm): on a GPU most of a cold start's time to
ready after the weights are in (bench/results/h100-2026-12-05-84cb7e5-hybrid-weights.txt: 27.8 s of
86.6 s capturing CUDA graphs). Each service runs with its caches in one directory of the unit's
`CacheDirectory`, `kernels/<key>`, where the key is a digest of everything that changes what is
compiled:

- the venv generation it runs (its stack's resolved pins and its patch sets: another torch, triton
  or sgl_kernel compiles other kernels);
- its target and draft models, by name (their shapes; a model's path says only where it is staged);
- every engine flag and environment variable it has, except those that only address it
  (`ADDRESSING`: where it listens, which GPU, its key file, where its models are staged). The rule
  is a list of what may be left out, not of what counts: a flag this file has never heard of keys
  the cache (a cold start, never a kernel built for other settings).

The GPU architecture is not in the key: a host's caches are read by the GPUs of that host, and
triton and flashinfer key their own entries by architecture inside the directory.

So a restart on the same inputs reuses the caches (the same key); a rollback to the previous unit
(within the run, before the Cleanup step) finds the previous key's directory; the Cleanup step
removes the caches no unit in place names (`unused`): a service keeps its unit's cache; a surge
(operations/service/surge.py: only its GPU and port differ) compiles into the directory its
replica then starts from, warm; two replicas of one service on a host share one directory. The
status view says whether a service's directory holds anything (`warm`).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import PurePosixPath

from pyinfra import host
from pyinfra.api import FactBase

from configuration.host_paths import SERVICE_CACHE_DIR, STATE_DIR, UNIT_DIR
from operations import remote
from operations.run import host_reads, read_batch
from operations.run.host_reads import operation
from operations.service import surge

KERNELS_DIR = f"{SERVICE_CACHE_DIR}/kernels"
# Root's copies of caches that passed a gate, one per key and GPU architecture (`sealed_name`):
# what a cache is seeded from, here or on a host it is shipped to (kernel_ship.py).
SEALED_DIR = f"{STATE_DIR}/kernels"
# Where the host's units are that may name a kernel cache (their `sglang-*` files): installed and
# runtime (a surge). Not the units the rollback saved: it puts one back only within the run that
# saved it, before the Cleanup step, and a saved unit changes whenever a preflight runs, so a cache
# it alone named would go in a later run that changes nothing else. Directories, not globs: a fact's
# arguments are plain words, or it cannot join the host's one read (operations/run/read_batch.py).
UNIT_DIRS = (UNIT_DIR, surge.SURGE_DIR)

# Flags that only say where the engine listens, which files it reads its models and keys from, or
# how it logs: they change no compiled kernel. Anything else keys the cache.
ADDRESSING = frozenset({
    "model-path", "speculative-draft-model-path", "tokenizer-path", "host", "port", "config",
    "api-key", "admin-api-key", "served-model-name", "log-level", "log-level-http",
    "log-requests", "log-requests-level", "enable-metrics", "base-gpu-id", "dist-init-addr",
    "nccl-port",
})
# The environment the deploy derives per replica (its GPUs, their order).
ADDRESSING_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"})


def kernel_inputs(service, generation: str) -> dict:
    """What the service's compiled kernels depend on, as the key digests it."""
    flags = [[flag, value] for flag, value in service.args if flag not in ADDRESSING]
    env = sorted([k, v] for k, v in service.env if k not in ADDRESSING_ENV)
    return {"generation": generation, "target": service.target.name,
            "draft": service.draft.name if service.draft else None, "args": flags, "env": env}


def key(service, generation: str) -> str:
    """The service's cache key (16 hex digits) for the venv generation it runs (its path)."""
    text = json.dumps(kernel_inputs(service, generation), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def directory(service, generation: str) -> str:
    return f"{KERNELS_DIR}/{key(service, generation)}"


def unit_setting(cache_dir: str) -> str:
    """`cache_dir` and its HOME as the unit's `CacheDirectory=` names them: relative to systemd's
    cache root (the parent of SERVICE_CACHE_DIR); systemd creates them for the service user."""
    relative = PurePosixPath(cache_dir).relative_to(PurePosixPath(SERVICE_CACHE_DIR).parent)
    return f"{relative} {relative}/home"


def environment(cache_dir: str) -> dict[str, str]:
    """The engine's cache variables, all inside `cache_dir`.

    flashinfer keeps its JIT cache in `$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer`
    (flashinfer/jit/env.py), triton in `$TRITON_CACHE_DIR`, torch's inductor in
    `$TORCHINDUCTOR_CACHE_DIR` (else a /tmp dir, private and lost at each restart), torch's C++
    extensions in `$TORCH_EXTENSIONS_DIR`, the CUDA driver's PTX cache in `$CUDA_CACHE_PATH`,
    sglang's deep_gemm in `$SGLANG_DG_CACHE_DIR`; the rest (outlines, torch hub) under
    `$XDG_CACHE_HOME`. And HOME, `cache_dir/home`: what a library caches under `~` whatever the
    variables say is keyed and travels too. On an H100
    (bench/results/h100-2026-12-07-kernel-caches.txt) sgl_kernel's JIT kept its compiled kernels in
    `~/.cache/tvm-ffi`, sglang its torch.compile cache in `~/.cache/sglang`, tilelang in
    `~/.tilelang`: with HOME emptied a start with the rest of its cache took 0.93 of a cold one.
    """
    return {
        "HOME": f"{cache_dir}/home",
        "XDG_CACHE_HOME": cache_dir,
        "TRITON_CACHE_DIR": f"{cache_dir}/triton",
        "FLASHINFER_WORKSPACE_BASE": f"{cache_dir}/flashinfer",
        "TORCHINDUCTOR_CACHE_DIR": f"{cache_dir}/torchinductor",
        "TORCH_EXTENSIONS_DIR": f"{cache_dir}/torch_extensions",
        "CUDA_CACHE_PATH": f"{cache_dir}/nv",
        "SGLANG_DG_CACHE_DIR": f"{cache_dir}/deep_gemm",
    }


@read_batch.batched()
class KernelCaches(FactBase):
    """``{"caches": {key: {"files", "bytes"}}, "sealed": {sealed_name: {...}}, "named": {unit
    path: [key]}}``: the host's kernel caches, root's sealed copies, and the keys its unit files
    name (`unit_dirs`: installed, runtime)."""

    def command(self, unit_dirs: tuple[str, ...] = ()) -> str:
        return remote.command("kernel_caches", shlex.quote(KERNELS_DIR), shlex.quote(SEALED_DIR),
                              *(shlex.quote(g) for g in unit_dirs))

    def process(self, output):
        return json.loads("\n".join(output))


def sealed_name(cache_key: str, arch: str) -> str:
    """A sealed copy's name: its key and the GPU architecture it was compiled on."""
    return f"{cache_key}.{arch}"


def unused(found: dict | None, wanted: list[str] | tuple[str, ...],
           replaced_units: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The kernel caches to remove, as paths: those no unit of the host names (installed or
    runtime: `found["named"]`, but the units this run rewrites or removes, `replaced_units`) and no
    unit this run writes names (`wanted`), and the sealed copies of such keys. So a service keeps
    the cache of the unit it runs; the one a new unit replaces goes in the same run, after the
    gates (a rollback within the run, before them, finds it); a service moved away takes its caches
    with it."""
    if not found:
        return []
    named = found.get("named") or {}
    keep = {k for path, keys in named.items() if path not in replaced_units for k in keys}
    keep |= set(wanted)
    live = [f"{KERNELS_DIR}/{k}" for k in (found.get("caches") or {}) if k not in keep]
    sealed = [f"{SEALED_DIR}/{name}" for name in (found.get("sealed") or {})
              if name.split(".", 1)[0] not in keep]
    return sorted(live + sealed)


def warm(found: dict | None, cache_key: str) -> bool | None:
    """Whether the cache `cache_key` holds compiled kernels (None: the host was not read)."""
    if not isinstance(found, dict):
        return None
    return bool(((found.get("caches") or {}).get(cache_key) or {}).get("files"))


def remove_command(paths: list[str]) -> str:
    """Remove these caches (each a directory of KERNELS_DIR or SEALED_DIR, never a link)."""
    words = " ".join(shlex.quote(p) for p in paths)
    return f"for d in {words}; do [ -L \"$d\" ] || rm -rf -- \"$d\"; done"


@operation()
def unused_removed(wanted: list[str] | tuple[str, ...], unit_dirs: tuple[str, ...]):
    """
    Remove the host's kernel caches that no unit uses (`unused`), as the host is after the run's
    gates and removals: a replaced unit's old key, a removed unit's, go; a unit kept as it was (its
    rollout held, its removal deferred) keeps its cache.

    + wanted: the keys of the units this run writes
    + unit_dirs: where the host's unit files are (installed, runtime)
    """
    remove = unused(host_reads.get(host, KernelCaches, unit_dirs=unit_dirs), wanted)
    if not remove:
        host.noop("no unused kernel caches")
        return
    host.log(f"kernel caches no unit uses: removing {', '.join(remove)}")
    yield remove_command(remove)
