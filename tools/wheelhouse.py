"""The control machine's wheelhouse: where a stack's wheel files come from.

`locate()` finds every file a stack needs and checks its sha256 (hashes are cached by
size and mtime, so a large wheel is hashed once); a missing or altered file fails with
the file's name and where it was looked for. `build()` fills a wheelhouse: wheels are
downloaded from the package index with `pip download --no-deps` (exact pins only), and
stand-ins with a `build:` script are built locally. Beside the stack's files it puts the
pinned uv wheel (operations/environment/installer.py `UV_WHEELS`) for the stack's architecture, so
that hosts install with uv (`installer: auto`); it is sha256-checked like any pinned file.
Last, it reads each wheel's RECORD and refuses a stack in which two distributions install one file
(`overlaps`): which copy a venv ends up with would depend on install order. Finding, checking and
reading a wheel is configuration/wheels.py's (the deploy's venv operations read a wheelhouse there
too).

    python -m tools.wheelhouse STACK[,STACK...] [DIR]     # fill DIR (default: ./wheelhouse)
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

from configuration.errors import DataError
from configuration.stacks import Package, Stack, load_stack
from configuration.wheels import WheelhouseError, find, locate, refuse_overlaps, sha256_of
from operations.environment import installer

REPO_ROOT = Path(__file__).resolve().parent.parent


def _build_standin(package: Package, wheelhouse: Path) -> Path:
    script = REPO_ROOT / package.build
    spec = importlib.util.spec_from_file_location(f"_build_{package.name.replace('-', '_')}",
                                                  script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # A script that builds several versions (lab/standin_kernel) takes the one pinned:
    # build_wheel(out_dir, version).
    if len(inspect.signature(module.build_wheel).parameters) > 1:
        return Path(module.build_wheel(wheelhouse, package.version))
    return Path(module.build_wheel(wheelhouse))


def architecture(stack: Stack) -> str:
    """The machine (`uname -m`) the stack's wheels are for: aarch64 if a pinned file name says so,
    else x86_64."""
    return "aarch64" if any("aarch64" in (p.file or "") for p in stack.packages) else "x86_64"


def uv_package(stack: Stack) -> Package | None:
    """The pinned uv wheel the wheelhouse carries for `stack` (None if the stack pins uv itself)."""
    if any(p.name == "uv" for p in stack.packages):
        return None
    return installer.UV_WHEELS[architecture(stack)]


def build(stack: Stack, wheelhouse: Path) -> list[Path]:
    """Put every file of `stack`, and the uv wheel, into `wheelhouse`; files already there and
    intact are kept."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    uv = uv_package(stack)
    extra = [uv] if uv is not None else []
    missing = []
    for package in [*stack.packages, *extra]:
        if package.build:
            # cheap and deterministic: always rebuilt, then checked against the pin
            missing.append(package)
            continue
        path = find(package, wheelhouse)
        if path is not None and (not package.sha256 or sha256_of(path) == package.sha256):
            continue
        if path is not None:
            path.unlink()  # altered or truncated: fetch again
        missing.append(package)
    for package in [p for p in missing if p.build]:
        _build_standin(package, wheelhouse)
    to_download = [p for p in missing if not p.build]
    if to_download:
        print(f"download {len(to_download)} wheels for stack {stack.name}", flush=True)
    for tags, group in _by_wheel_tags(to_download).items():
        _download(stack, wheelhouse, group, tags)
    located = locate(stack, wheelhouse)
    # Before any host installs them: two wheels of one file leave the copy installed last, and a
    # second deploy refuses.
    refuse_overlaps(stack, {p: located[p.name] for p in stack.packages},
                    " (read from their wheels' RECORD)")
    return list(located.values()) + list(locate(stack, wheelhouse, extra).values())


def _by_wheel_tags(packages: list[Package]) -> dict[tuple, list[Package]]:
    """Group packages by the (abi tags, platform tags) of their pinned wheel, so each group is one
    pip call."""
    groups: dict[tuple, list[Package]] = {}
    for package in packages:
        tags: tuple = ()
        if package.file:
            _python, abi, platform = package.file[:-4].split("-")[-3:]
            tags = (tuple(abi.split(".")), tuple(platform.split(".")))
        groups.setdefault(tags, []).append(package)
    return groups


def _download(stack: Stack, wheelhouse: Path, packages: list[Package], tags: tuple) -> None:
    # The machine's own pip constraints (e.g. a torch cap) must not bend exact pins; the
    # target's Python, ABI and platform come from the pinned file names, not from this machine.
    env = {**os.environ, "PIP_CONSTRAINT": ""}
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
        "--python-version", stack.python, "--dest", str(wheelhouse),
    ]
    if tags:
        abis, platforms = tags
        cmd += [arg for abi in abis for arg in ("--abi", abi)]
        cmd += [arg for platform in platform_order(platforms) for arg in ("--platform", platform)]
    subprocess.run(cmd + [p.spec for p in packages], check=True, env=env)


_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def platform_order(platforms) -> list[str]:
    """The pinned file's platform tags, the newest glibc first, as pip orders a real host's own
    tags.

    pip downloads the file whose best tag ranks first; two files of one release can both fit (regex
    2026.11.19 has `...manylinux_2_17_x86_64.whl` and
    `...manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl`), and in the file name's order they tie on
    `manylinux2014` and pip takes the one the index lists first. Newest first, the pinned file's own
    newest tag decides.
    """
    def glibc(platform: str) -> tuple[int, int]:
        found = re.match(r"manylinux_(\d+)_(\d+)_", platform)
        return ((int(found[1]), int(found[2])) if found
                else _LEGACY_MANYLINUX.get(platform.split("_", 1)[0], (0, 0)))

    return sorted(platforms, key=glibc, reverse=True)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    try:
        stacks = [load_stack(name, "command line", "STACK") for name in argv[0].split(",") if name]
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    wheelhouse = Path(argv[1] if len(argv) > 1 else "wheelhouse")
    for stack in stacks:
        try:
            files = build(stack, wheelhouse)
        except (WheelhouseError, subprocess.CalledProcessError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        total = sum(f.stat().st_size for f in files)
        uv = uv_package(stack)
        with_uv = f" (uv {uv.version} for {architecture(stack)} included)" if uv is not None else ""
        print(f"wheelhouse {wheelhouse}: {len(files)} files for stack {stack.name}{with_uv}, "
              f"{total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
