"""A stack's wheel files on the control machine: found in a wheelhouse, checked against their pins,
and the rule that no two distributions of a stack install one file.

`find` and `locate` look a stack's pinned files up in a wheelhouse directory and check their sha256
(hashes are cached by size and mtime, so a large wheel is hashed once); a missing or altered file
fails with the file's name and where it was looked for. `overlaps` reads each wheel's RECORD and
names two distributions that install one file (which copy a venv ends up with would depend on
install order). The venv operations read a wheelhouse through these
(operations/environment/venv_decide.py); `python -m tools.wheelhouse` fills one.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pyinfra.api.exceptions import PyinfraError

from configuration.stacks import Package, Stack, normalize

_HASH_CACHE = ".sha256-cache.json"


class WheelhouseError(PyinfraError):
    pass


def wheel_matches(filename: str, package: Package) -> bool:
    """True if `filename` is a wheel of exactly this distribution and version."""
    if not filename.endswith(".whl"):
        return False
    parts = filename[:-4].split("-")
    return len(parts) >= 5 and normalize(parts[0]) == package.name and parts[1] == package.version


def sha256_of(path: Path) -> str:
    """sha256 of a file, cached in the wheelhouse by (size, mtime) so each file is hashed once."""
    cache_file = path.parent / _HASH_CACHE
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    stat = path.stat()
    key = f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}"
    if key not in cache:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        cache = {k: v for k, v in cache.items() if not k.startswith(f"{path.name}:")}
        cache[key] = digest.hexdigest()
        tmp = cache_file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=0, sort_keys=True))
        tmp.replace(cache_file)
    return cache[key]


def find(package: Package, wheelhouse: Path) -> Path | None:
    if package.file:
        candidate = wheelhouse / package.file
        return candidate if candidate.is_file() else None
    matches = sorted(p for p in wheelhouse.glob("*.whl") if wheel_matches(p.name, package))
    return matches[0] if matches else None


def locate(stack: Stack, wheelhouse: Path, packages: list[Package] | None = None,
           verify: bool = True) -> dict[str, Path]:
    """Map distribution name -> wheel file, for `packages` (default: the whole stack)."""
    found: dict[str, Path] = {}
    for package in packages if packages is not None else stack.packages:
        path = find(package, wheelhouse)
        if path is None:
            wanted = package.file or f"a wheel of {package.spec}"
            raise WheelhouseError(
                f"stack {stack.name}: {wanted} not found; looked in wheelhouse "
                f"{wheelhouse.resolve()}. Fill it with: python -m tools.wheelhouse {stack.name} "
                f"{wheelhouse}"
            )
        if verify and package.sha256 and sha256_of(path) != package.sha256:
            raise WheelhouseError(
                f"stack {stack.name}: {path} has sha256 {sha256_of(path)}, the stack pins "
                f"{package.sha256}; delete the file and rebuild the wheelhouse, or correct "
                f"files/stacks/{stack.name}.yml"
            )
        found[package.name] = path
    return found


# Two distributions that install one file ---------------------------------------------------------


def wheel_files(path: Path) -> dict[str, tuple[str, str]]:
    """The files a wheel installs into site-packages, from its RECORD: {path: (hash, size)}.

    `.data/purelib` and `.data/platlib` land in site-packages; scripts, headers and data go
    elsewhere and the `.dist-info` is the distribution's own: neither is listed. Cached by the
    file's size and mtime.
    """
    stat = path.stat()
    return _wheel_files(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=1024)
def _wheel_files(path: str, _size: int, _mtime_ns: int) -> dict[str, tuple[str, str]]:
    try:
        with zipfile.ZipFile(path) as wheel:
            records = [n for n in wheel.namelist()
                       if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
            if len(records) != 1:
                raise WheelhouseError(f"{path}: not a wheel: {len(records)} .dist-info/RECORD "
                                      "file(s) in it, expected 1")
            text = wheel.read(records[0]).decode("utf-8")
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError) as exc:
        raise WheelhouseError(f"{path}: not a wheel: its RECORD cannot be read ({exc})") from exc
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0]:
            continue
        rel = row[0]
        first, _, rest = rel.partition("/")
        if first.endswith(".dist-info"):
            continue
        if first.endswith(".data"):
            kind, _, rel = rest.partition("/")
            if kind not in ("purelib", "platlib"):
                continue
        out[rel] = (row[1] if len(row) > 1 else "", row[2] if len(row) > 2 else "")
    return out


@dataclass(frozen=True)
class Overlap:
    """Files two distributions' wheels both install (the same path inside a package directory)."""

    first: Package
    second: Package
    top: str  # the top-level directory of the first shared file
    paths: tuple[str, ...]  # every shared file, sorted
    # those whose RECORD hash or size differs: the copy left depends on install order
    differ: tuple[str, ...]
    first_count: int  # files each claims (inside a package directory, with a size)
    second_count: int

    def describe(self) -> str:
        example = (self.differ or self.paths)[0]
        return (
            f"{self.top}/ is installed by both {self.first.name} {self.first.version} and "
            f"{self.second.name} {self.second.version}: {len(self.paths)} file(s) are in both "
            f"wheels, {len(self.differ)} of them differ (e.g. {example}), so which copy a venv "
            "holds depends on install order, and removing either one deletes files of the other "
            f"({self.first.name}: {self.first_count} file(s), {self.second.name}: "
            f"{self.second_count}: {self._which_holds()})"
        )

    def _which_holds(self) -> str:
        missing_first, missing_second = (self.first_count - len(self.paths),
                                         self.second_count - len(self.paths))
        if not missing_first:
            return f"{self.second.name} holds every file of {self.first.name}"
        if not missing_second:
            return f"{self.first.name} holds every file of {self.second.name}"
        return (f"{missing_first} of the first's are not in the second, {missing_second} of the "
                "second's not in the first")


def overlaps(wheels: dict[Package, Path]) -> list[Overlap]:
    """Pairs of distributions whose wheels install one file, as `environment/on_host/venv_state.py`
    counts a conflict.

    A file inside a package directory with a size is a claim; a loose top-level file both ship
    (0.5.11's flashinfer-python and torch-c-dlpack-ext each carry `build_backend.py`) and empty
    files (a shared namespace `__init__.py`) are not, as on the host.
    """
    owners: dict[str, list[Package]] = {}
    counts: dict[Package, int] = {}
    files = {}
    for package, path in wheels.items():
        files[package] = wheel_files(path)
        claims = [rel for rel, (_hash, size) in files[package].items()
                  if "/" in rel and size not in ("", "0") and not rel.startswith("..")]
        counts[package] = len(claims)
        for rel in claims:
            owners.setdefault(rel, []).append(package)
    pairs: dict[tuple[Package, Package], list[str]] = {}
    for rel, claimants in owners.items():
        for i, first in enumerate(claimants):
            for second in claimants[i + 1:]:
                pair = tuple(sorted((first, second), key=lambda p: p.name))
                pairs.setdefault(pair, []).append(rel)
    out = []
    for (first, second), paths in sorted(pairs.items(),
                                         key=lambda item: (item[0][0].name, item[0][1].name)):
        paths = sorted(paths)
        differ = tuple(p for p in paths if files[first][p] != files[second][p])
        out.append(Overlap(first, second, paths[0].split("/", 1)[0], tuple(paths), differ,
                           counts[first], counts[second]))
    return out


def refuse_overlaps(stack: Stack, wheels: dict[Package, Path], where: str = "") -> None:
    """Fail naming both distributions, a shared path and the fix when two of `wheels` install one
    file."""
    found = overlaps(wheels)
    if found:
        more = (f" (and {len(found) - 1} more pair(s): "
                f"{', '.join(f'{o.first.name}/{o.second.name}' for o in found[1:4])})"
                if len(found) > 1 else "")
        raise WheelhouseError(
            f"stack {stack.name}: {found[0].describe()}{where}{more}. A stack may name only one "
            f"distribution of a file: drop the other from files/stacks/{stack.name}.yml (keep the "
            "one the engine's CUDA build needs)"
        )
