"""Named, pinned package stacks: the only way a serving venv's contents are chosen.

A stack is `files/stacks/<name>.yml`: the Python version and a closed set of
distributions, each with an exact version (local tag included, e.g. `2.11.0+cu130`)
and, where the file is known, its wheel filename and sha256. Closed means the venv is
installed with `--no-deps`: nothing is resolved on the host, nothing comes from "latest".
A distribution may instead name a `build:` script (a stand-in built on the control
machine, such as the lab's server) that provides `build_wheel(out_dir) -> Path` (or
`build_wheel(out_dir, version) -> Path` when one script builds several versions).

A stack may extend another: `extends: <stack name>`, then `packages:` replace (same name),
add (new name) or remove (value `null`) the base's distributions, and `python:` may be
omitted (inherited). The result is a whole `Stack` of its own name and file.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from configuration.errors import DataError
from configuration.yamlload import load_file

_REPO = Path(__file__).resolve().parent.parent
STACKS_DIR = _REPO / "files" / "stacks"
_SHA256_RE = re.compile(r"\A[0-9a-f]{64}\Z")
_VERSION_RE = re.compile(r"\A[0-9][0-9A-Za-z.+!_-]*\Z")
_PY_RE = re.compile(r"\A3\.[0-9]{1,2}\Z")
# Pythons a serving venv may use: sglang needs 3.10 or later; 3.15 is not released.
SUPPORTED_PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")
# name-version(-build)?-python-abi-platform.whl (PEP 427; name and version escaped with '_').
_WHEEL_RE = re.compile(
    r"\A(?P<name>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.!+]+)(-[0-9][A-Za-z0-9_.]*)?"
    r"-(?P<py>[A-Za-z0-9_.]+)-(?P<abi>[A-Za-z0-9_.]+)-(?P<plat>[A-Za-z0-9_.]+)\.whl\Z")


def normalize(name: str) -> str:
    """PEP 503 name normalisation (`Sglang_Kernel` -> `sglang-kernel`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    file: str | None = None
    sha256: str | None = None
    build: str | None = None

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Stack:
    name: str
    python: str
    packages: tuple[Package, ...]
    path: Path

    def wanted(self) -> dict[str, str]:
        return {p.name: p.version for p in self.packages}

    @property
    def cuda(self) -> tuple[int, int] | None:
        """The CUDA version (major, minor) its wheels were built for; None for a CPU stack."""
        return cuda_of(self.wanted())

    @property
    def site_packages(self) -> str:
        return f"lib/python{self.python}/site-packages"

    @property
    def content_digest(self) -> str:
        """sha256 of what the stack resolves to (python and every pin), base stacks included; not of
        its file."""
        digest = hashlib.sha256(f"python {self.python}\n".encode())
        for p in self.packages:
            digest.update(
                f"{p.name}=={p.version} {p.file or ''} {p.sha256 or ''} {p.build or ''}\n".encode())
        return digest.hexdigest()


# The distribution whose version is the CUDA runtime a stack's wheels were built against (`13.0.96`
# -> 13.0); a stack without it (the lab's CPU stacks) serves on no GPU and needs no driver.
CUDA_RUNTIME = "nvidia-cuda-runtime"


def cuda_of(pins: dict[str, str]) -> tuple[int, int] | None:
    """The CUDA version (major, minor) of a stack's pins (distribution -> version)."""
    match = re.match(r"(\d+)\.(\d+)", pins.get(CUDA_RUNTIME) or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def available_stacks() -> list[str]:
    return sorted(p.stem for p in STACKS_DIR.glob("*.yml"))


_STACK_NAME_RE = re.compile(r"\A[a-z0-9][a-z0-9._-]*\Z")


def load_stack(name: object, source: str = "stack", key_path: str = "stack") -> Stack:
    """Load and check a stack by name; `source`/`key_path` say where the name was given."""
    if (not isinstance(name, str) or not _STACK_NAME_RE.match(name)
            or not (STACKS_DIR / f"{name}.yml").exists()):
        raise DataError(source, key_path, name,
                        f"unknown stack; available: {', '.join(available_stacks())} "
                        "(files/stacks/<name>.yml)")
    return _load_stack_file(STACKS_DIR / f"{name}.yml")


_TOP_KEYS = ("name", "python", "packages", "description", "extends")


@lru_cache(maxsize=None)
def _load_stack_file(path: Path) -> Stack:
    return _parse_stack_file(path, ())


def _parse_stack_file(path: Path, chain: tuple[str, ...]) -> Stack:
    """`chain`: the stacks that extend this one, outermost first (to find a cycle)."""
    shown = f"files/stacks/{path.name}"
    raw = load_file(path, shown)
    if not isinstance(raw, dict):
        raise DataError(shown, "(top level)", raw, "must be a mapping with name, python, packages")
    for key in raw:
        if key not in _TOP_KEYS:
            raise DataError(shown, key, raw[key], f"unknown key; allowed: {', '.join(_TOP_KEYS)}")
    if raw.get("name") != path.stem:
        raise DataError(shown, "name", raw.get("name"), f"must equal the file name '{path.stem}'")
    base = _base_of(path, raw, chain) if "extends" in raw else None
    python = raw.get("python")
    if python is None and base is not None:
        python = base.python
    elif not isinstance(python, str) or not _PY_RE.match(python):
        raise DataError(shown, "python", raw.get("python"),
                        'must be a quoted major.minor version such as "3.11"')
    if python not in SUPPORTED_PYTHONS:
        raise DataError(shown, "python", python, "is not a Python the serving venv supports: use "
                                                 f"one of {', '.join(SUPPORTED_PYTHONS)}")
    packages_raw = raw.get("packages")
    if base is not None and packages_raw is None:
        packages_raw = {}
    elif not isinstance(packages_raw, dict) or (base is None and not packages_raw):
        raise DataError(shown, "packages", packages_raw,
                        "must be a non-empty map of distribution -> {version, file, sha256}")
    packages = {p.name: p for p in base.packages} if base is not None else {}
    for dist, spec in packages_raw.items():
        key = f"packages.{dist}"
        if not isinstance(dist, str) or normalize(dist) != dist:
            raise DataError(shown, key, dist, "write distribution names PEP 503-normalised: "
                                              f"'{normalize(str(dist))}'")
        if spec is None and base is not None:
            if dist not in packages:
                raise DataError(shown, key, spec, f"the base stack {base.name} has no {dist} to "
                                                  "remove; drop this line")
            del packages[dist]
            continue
        packages[dist] = _package(shown, key, dist, spec, python)
    if not packages:
        raise DataError(shown, "packages", packages_raw,
                        f"removes every distribution of {base.name}: a stack needs at least one")
    for package in packages.values():  # inherited ones too: `python:` may be overridden
        m = _WHEEL_RE.match(package.file)
        _python_tags_fit(shown, f"packages.{package.name}.file", package.file, m["py"],
                         m["abi"], python)
    return Stack(path.stem, python, tuple(sorted(packages.values(), key=lambda p: p.name)), path)


def _base_of(path: Path, raw: dict, chain: tuple[str, ...]) -> Stack:
    shown = f"files/stacks/{path.name}"
    name = raw["extends"]
    here = path.parent
    if (not isinstance(name, str) or not _STACK_NAME_RE.match(name)
            or not (here / f"{name}.yml").is_file()):
        available = ", ".join(sorted(p.stem for p in here.glob("*.yml") if p.stem != path.stem))
        raise DataError(shown, "extends", name,
                        f"unknown stack; available: {available} (files/stacks/<name>.yml)")
    chain = (*chain, path.stem)
    if name in chain:
        cycle = " -> ".join((*chain[chain.index(name):], name))
        raise DataError(shown, "extends", name, f"stacks extend each other in a cycle ({cycle}): "
                                                "extend a stack that does not extend this one")
    return _parse_stack_file(here / f"{name}.yml", chain)


def _package(shown: str, key: str, dist: str, spec: object, python: str) -> Package:
    if isinstance(spec, str):
        spec = {"version": spec}
    if not isinstance(spec, dict):
        raise DataError(shown, key, spec, "must be a version string or {version, file, sha256}")
    unknown = set(spec) - {"version", "file", "sha256", "build"}
    if unknown:
        raise DataError(shown, key, sorted(unknown),
                        "unknown keys; allowed: version, file, sha256, build")
    version = spec.get("version")
    if not isinstance(version, str) or not _VERSION_RE.match(version):
        raise DataError(shown, f"{key}.version", version,
                        'must be an exact version, quoted, such as "2.11.0+cu130"')
    file = spec.get("file")
    match = _WHEEL_RE.match(file) if isinstance(file, str) else None
    if match is None:
        raise DataError(shown, f"{key}.file", file,
                        "must be a wheel file name (*.whl): name-version-python-abi-platform.whl, "
                        "required for every package")
    if normalize(match["name"]) != dist:
        raise DataError(shown, f"{key}.file", file,
                        f"is a wheel of {normalize(match['name'])}, not of {dist}")
    if match["version"].replace("_", "-") != version.replace("_", "-"):
        raise DataError(shown, f"{key}.version", version,
                        f"disagrees with the wheel file name ({file} is version "
                        f"{match['version']}): the version is the one in the file name")
    # Every file is pinned by its hash: a stack is the exact bytes a venv holds, wherever they come
    # from.
    sha = spec.get("sha256")
    if not isinstance(sha, str) or not _SHA256_RE.match(sha):
        raise DataError(shown, f"{key}.sha256", sha,
                        "must be 64 lowercase hex digits: the wheel's sha256 (`sha256sum FILE`), "
                        "required for every file")
    build = spec.get("build")
    if build is not None and not (isinstance(build, str) and (_REPO / build).is_file()):
        raise DataError(shown, f"{key}.build", build, "must be the path of a build script in this "
                                                      "repository (e.g. lab/standin/build.py)")
    return Package(dist, version, file, sha, build)


def _python_tags_fit(shown: str, key: str, file: str, py_tags: str, abi: str, python: str) -> None:
    """A `cpXY` wheel installs only on CPython X.Y (or, with the stable ABI `abi3`, X.Y and
    later)."""
    want = int(python.split(".")[1])
    fits = []
    for tag in py_tags.split("."):
        m = re.fullmatch(r"cp3([0-9]+)", tag)
        if not m:
            fits.append(tag.startswith("py3") or tag == "py2.py3")
            continue
        minor = int(m[1])
        fits.append(minor == want or (abi == "abi3" and minor <= want))
    if not any(fits):
        raise DataError(shown, key, file, f"is built for {py_tags}-{abi}, which Python {python} "
                                          "(the stack's `python`) cannot install")
