"""What a host must have before anything is built on it, judged from the host's one read.

A real host that lacks the stack's Python, runs a driver older than the stack's CUDA, has a
glibc older than its wheels' tags, or a `/dev/shm` smaller than the models to stage, was found
out late: mid-build (`python3.12 not found`), after a multi-GB generation (the ABI probe), or at
staging.
Here each is read in the host's batch (`HostBasics`, a shell fact: it works where no python runs)
and judged by `refusals`, which the GPU check adds to its errors: the host fails before its first
change, `--dry` says so (exit 1), and each refusal names what to install or change.

Not judged here: disk for generations (a stack's installed size is not known before its first
build; a full disk fails the build, which leaves the live generation as it was).
"""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase

from operations.run import read_batch
from report.sizes import human_bytes

_MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_")
# The legacy manylinux tags, as the glibc they stand for (PEP 600).
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


@read_batch.batched()
class HostBasics(FactBase):
    """The host's user, init, glibc, the stack's Python, and free bytes where models and venvs go.

    `python`: the interpreter the stack builds with (`python3.12`); `paths`: directories whose
    filesystem's free space counts (the nearest existing parent of each is asked); `staged`: model
    directories already in RAM, whose bytes count as staged."""

    def command(self, python: str, paths: tuple[str, ...] | list[str] = (),
                staged: tuple[str, ...] | list[str] = ()) -> str:
        lines = [
            'echo "uid $(id -u)"',
            'echo "init $(cat /proc/1/comm 2>/dev/null)"',
            'echo "glibc $(getconf GNU_LIBC_VERSION 2>/dev/null)"',
            f'echo "python $(command -v {shlex.quote(python)} || true)"',
        ]
        for path in paths:
            quoted = shlex.quote(path)
            # the nearest existing parent: the venv's own directory does not exist before its build
            lines.append(f'p={quoted}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
                         f'echo "free {quoted} $(df -PB1 "$p" | awk \'NR==2 {{print $4}}\')"')
        for path in staged:
            quoted = shlex.quote(path)
            lines.append(f'[ -d {quoted} ] && echo "staged {quoted} $(du -sb {quoted} | cut -f1)"')
        return "; ".join(lines) + "; true"

    def process(self, output) -> dict:
        found: dict = {"free": {}, "staged": {}}
        for line in output:
            key, _, rest = line.partition(" ")
            if key in ("free", "staged"):
                path, _, value = rest.rpartition(" ")
                if value.isdigit():
                    found[key][path] = int(value)
            elif key == "uid":
                found["uid"] = int(rest) if rest.strip().isdigit() else None
            elif key == "glibc":
                match = re.search(r"(\d+)\.(\d+)", rest)
                found["glibc"] = (int(match.group(1)), int(match.group(2))) if match else None
            elif key in ("init", "python"):
                found[key] = rest.strip() or None
        return found


def read_arguments(config, stack) -> dict:
    """What `HostBasics` is asked, for this host's data and stack."""
    staged = sorted({m.load_path for m in config.staged_models})
    paths = [config.shm_dir] if config.staged_models else []
    return {"python": f"python{stack.python}", "paths": paths, "staged": staged}


def wheel_glibc(filename: str) -> tuple[int, int] | None:
    """The oldest glibc a wheel runs on (the lowest of its manylinux tags); None: no glibc
    requirement (a pure or non-Linux-tagged wheel)."""
    if not filename.endswith(".whl"):
        return None
    platforms = filename[:-len(".whl")].split("-")[-1].split(".")
    found = [tuple(map(int, m.groups())) for p in platforms for m in [_MANYLINUX.match(p)] if m]
    found += [_LEGACY[p.split("_x86_64")[0].split("_aarch64")[0]] for p in platforms
              if p.split("_", 1)[0] in _LEGACY]
    return min(found) if found else None


def stack_glibc(stack) -> tuple[tuple[int, int], str] | None:
    """The newest glibc any of the stack's wheels needs, and the first wheel that needs it."""
    needs = [(v, p.file) for p in stack.packages if p.file for v in [wheel_glibc(p.file)] if v]
    return max(needs, key=lambda item: item[0]) if needs else None


def _version(parts: tuple[int, int]) -> str:
    return ".".join(map(str, parts))


def refusals(config, stack, basics: dict, gpu_facts=None) -> list[str]:
    """Why this host cannot take the data's stack, models and services, each with its fix; empty
    when it can. `basics`: `HostBasics`' answer; `gpu_facts`: the GPU check's read (the driver's
    CUDA)."""
    out = []
    if basics.get("uid") not in (0, None):
        out.append(f"the deploy runs as uid {basics['uid']} there, not root: it installs venvs and "
                   "units and stages into RAM as root; connect as root (ssh_user: root) with your "
                   "key")
    if basics.get("init") not in ("systemd", None):
        out.append(f"its init is {basics['init']}, not systemd: each service is a systemd unit; "
                   "use a host that boots systemd (a container needs systemd as PID 1)")
    python = f"python{stack.python}"
    if config.environments and not basics.get("python"):
        out.append(f"{python} not found on the host: stack {stack.name} builds its venv with it; "
                   f"install it with its venv module ({python} and {python}-venv from the "
                   "distribution, or a deadsnakes/uv-provided build), or choose a stack for the "
                   "host's Python")
    needs = stack_glibc(stack) if config.environments else None
    glibc = basics.get("glibc")
    if needs and glibc and tuple(glibc) < needs[0]:
        out.append(f"glibc {_version(tuple(glibc))} there, stack {stack.name}'s wheels need "
                   f"{_version(needs[0])} or newer ({needs[1]}): use a distribution with glibc "
                   f"{_version(needs[0])} or newer (`ldd --version` says which it has)")
    cuda = stack.cuda
    driver = _driver_cuda(gpu_facts)
    if cuda and config.services and driver and driver < cuda:
        out.append(f"the driver supports CUDA {_version(driver)}, stack {stack.name} is built for "
                   f"CUDA {_version(cuda)}: install an NVIDIA driver that supports CUDA "
                   f"{_version(cuda)} (nvidia-smi's header says which), then reboot")
    out += _shm_space(config, basics, gpu_facts)
    return out


def _driver_cuda(gpu_facts) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", (gpu_facts.cuda_version or "") if gpu_facts else "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _shm_space(config, basics: dict, gpu_facts) -> list[str]:
    """The models still to stage against the free space of `shm_dir` (a tmpfs is half of RAM by
    default; a 27B bf16 target is ~54 GB)."""
    if not config.staged_models or gpu_facts is None:
        return []
    free = basics.get("free", {}).get(config.shm_dir)
    if free is None:
        return []
    staged = basics.get("staged", {})
    need, parts = 0, []
    for model in config.staged_models:
        size = gpu_facts.model_bytes.get(model.store_path)
        if size is None:
            continue  # not in the store: staging says so, naming the path
        more = max(0, size - staged.get(model.load_path, 0))
        if more:
            need += more
            parts.append(f"{model.name} {human_bytes(more)}")
    if need <= free:
        return []
    return [f"{config.shm_dir} has {human_bytes(free)} free, the models still to stage need "
            f"{human_bytes(need)} ({', '.join(parts)}): give it more room (mount -o remount,"
            f"size=... {config.shm_dir}, and the same in /etc/fstab), or load a model from the "
            "store (model_in: store)"]
