"""Build a patch set (`files/patches/NAME/`) from patched files and the pristine package.

    python -m tools.patchset_build NAME --base sglang==0.5.23 --patched DIR \\
        --pristine SITE_PACKAGES_OR_WHEEL [--out files/patches] [--description TEXT] [--force]

DIR holds the patched files laid out as under site-packages (DIR/sglang/srt/server_args.py).
For each file the pristine original is looked up in SITE_PACKAGES (a directory) or inside
a wheel (a .whl file): its sha256 becomes `original`, or `original: null` when the patch
adds the file. The base version must be the pristine's (read from its `.dist-info/METADATA`),
and a file identical to its original is refused (there is nothing to patch). The result is
`OUT/NAME/patchset.yml` (the format `operations.patches.load_patch_set` reads; paths sorted,
so the same input gives the same bytes) with the files copied beside it. DIR may be
`OUT/NAME` itself: the set is then rebuilt in place after its files were edited.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import yaml

from configuration.stacks import normalize

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "files" / "patches"
MANIFEST = "patchset.yml"
_NAME_RE = re.compile(r"\A[a-z0-9][a-z0-9_-]{0,62}\Z")  # what settings accepts in `patch_sets`
_BASE_RE = re.compile(r"\A\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*\Z")
_PLAIN_RE = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9_./+-]*\Z")
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


class BuildError(Exception):
    """A reason the patch set cannot be built; the message says what to fix."""


@dataclass(frozen=True)
class Entry:
    path: str  # relative to site-packages, POSIX separators
    content: bytes
    sha256: str
    original: str | None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_base(text: str) -> tuple[str, str]:
    match = _BASE_RE.match(text)
    if not match:
        raise BuildError(f"--base {text!r}: must be DISTRIBUTION==VERSION, e.g. sglang==0.5.23")
    return match.group(1), match.group(2)


def _metadata(text: str) -> tuple[str, str]:
    msg = email.parser.Parser().parsestr(text, headersonly=True)
    return (msg.get("Name") or "").strip(), (msg.get("Version") or "").strip()


class Pristine:
    """The unpatched install: a site-packages directory or a wheel."""

    def __init__(self, location: Path, distribution: str):
        self.location = location
        self.distribution = distribution
        self._zip: zipfile.ZipFile | None = None
        if location.is_dir():
            found = [p for p in sorted(location.glob("*.dist-info")) if (p / "METADATA").is_file()]
            metas = [(p.name, _metadata((p / "METADATA").read_text(encoding="utf-8", errors="replace"))) for p in found]
            self.kind = "site-packages"
        elif location.is_file() and zipfile.is_zipfile(location):
            self._zip = zipfile.ZipFile(location)
            names = sorted(n for n in self._zip.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
            metas = [(n.split("/")[0], _metadata(self._zip.read(n).decode("utf-8", errors="replace"))) for n in names]
            self.kind = "wheel"
        else:
            raise BuildError(f"--pristine {location}: must be a site-packages directory or a wheel (.whl) file")
        mine = [(d, v) for d, (n, v) in metas if normalize(n) == normalize(distribution)]
        if not mine:
            seen = ", ".join(d for d, _ in metas) or "none"
            raise BuildError(
                f"--pristine {location}: no {distribution} installed there ({self.kind} .dist-info found: {seen})"
            )
        if len({v for _, v in mine}) > 1:
            raise BuildError(
                f"--pristine {location}: several {distribution} installs ({', '.join(d for d, _ in mine)}): "
                "reinstall it so exactly one remains"
            )
        self.version = mine[0][1]

    def read(self, rel: str) -> bytes | None:
        """The pristine bytes at `rel`, or None when the package has no such file."""
        if self._zip is not None:
            try:
                info = self._zip.getinfo(rel)
            except KeyError:
                return None
            if info.is_dir():
                raise BuildError(f"{rel}: a directory in the pristine wheel {self.location}, not a file")
            return self._zip.read(info)
        path = self.location / rel
        if not path.exists() and not path.is_symlink():
            return None
        if not path.is_file():
            raise BuildError(f"{rel}: {path} exists in the pristine site-packages but is not a regular file")
        return path.read_bytes()

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()


def collect_patched(patched: Path) -> dict[str, bytes]:
    """Every file under `patched` (bytecode caches and a top-level patchset.yml left out)."""
    if not patched.is_dir():
        raise BuildError(f"--patched {patched}: not a directory")
    found: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(patched):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for d in dirnames:
            if (Path(dirpath) / d).is_symlink():
                raise BuildError(f"--patched: {Path(dirpath) / d} is a symlink: lay the real files out instead")
        for filename in sorted(filenames):
            path = Path(dirpath) / filename
            rel = path.relative_to(patched).as_posix()
            if rel == MANIFEST or filename.endswith(_SKIP_SUFFIXES):
                continue
            if path.is_symlink() or not path.is_file():
                raise BuildError(f"--patched: {path} is not a regular file (symlinks are not copied)")
            found[rel] = path.read_bytes()
    if not found:
        raise BuildError(f"--patched {patched}: holds no files (lay them out as under site-packages)")
    return found


def build_entries(patched_files: dict[str, bytes], pristine: Pristine) -> list[Entry]:
    entries, errors = [], []
    for rel in sorted(patched_files):
        content = patched_files[rel]
        original = pristine.read(rel)
        if original is not None and original == content:
            errors.append(
                f"{rel}: identical to the original in {pristine.location}: nothing to patch (leave it out of --patched)"
            )
            continue
        entries.append(Entry(rel, content, sha256(content), None if original is None else sha256(original)))
    if errors:
        raise BuildError("\n".join(errors))
    return entries


def _scalar(text: str) -> str:
    """`text` as a YAML scalar: plain where YAML reads it back as this string, else quoted."""
    return text if _PLAIN_RE.match(text) and yaml.safe_load(text) == text else json.dumps(text)


def render_manifest(name: str, distribution: str, version: str, entries: list[Entry], description: str) -> str:
    lines = [
        f"# {description}",
        f"name: {_scalar(name)}",
        f"base: {{distribution: {_scalar(distribution)}, version: {json.dumps(version)}}}",
        "files:",
    ]
    for entry in sorted(entries, key=lambda e: e.path):
        original = "null" if entry.original is None else json.dumps(entry.original)
        lines.append(f"  {_scalar(entry.path)}: {{sha256: {json.dumps(entry.sha256)}, original: {original}}}")
    text = "\n".join(lines) + "\n"
    expected = {
        "name": name,
        "base": {"distribution": distribution, "version": version},
        "files": {e.path: {"sha256": e.sha256, "original": e.original} for e in entries},
    }
    if yaml.safe_load(text) != expected:  # a path YAML would read differently
        raise BuildError("internal error: the rendered manifest does not read back as written")
    return text


def build(
    name: str,
    base: str,
    patched: Path,
    pristine_path: Path,
    out: Path = DEFAULT_OUT,
    description: str | None = None,
    force: bool = False,
) -> Path:
    """Write `out/name/` and return that directory; raises BuildError."""
    if not _NAME_RE.match(name):
        raise BuildError(f"NAME {name!r}: must match {_NAME_RE.pattern} (lower case, digits, '-' and '_')")
    distribution, version = parse_base(base)
    if description is not None and ("\n" in description or "\r" in description):
        raise BuildError("--description: must be one line")
    patched = patched.resolve()
    target = (out / name).resolve()
    in_place = patched == target
    if target.exists() and not in_place and not force:
        raise BuildError(f"{target} already exists: pass --force to replace it")
    if not in_place and (target in patched.parents or patched in target.parents):
        raise BuildError(f"--patched {patched} and the output {target} must not contain one another")

    patched_files = collect_patched(patched)
    pristine = Pristine(pristine_path, distribution)
    try:
        if pristine.version != version:
            raise BuildError(
                f"--base {distribution}=={version}, but the pristine {pristine.kind} {pristine_path} has "
                f"{distribution} {pristine.version}: diff against the version the patch set is for"
            )
        entries = build_entries(patched_files, pristine)
    finally:
        pristine.close()

    added = sum(e.original is None for e in entries)
    description = description or (
        f"{name}: {len(entries) - added} replaced and {added} added files over {distribution} {version} "
        "(python -m tools.patchset_build)"
    )
    manifest = render_manifest(name, distribution, version, entries, description)

    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out))
    try:
        for entry in entries:
            dest = staging / PurePosixPath(entry.path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(entry.content)
            dest.chmod(0o644)
        (staging / MANIFEST).write_text(manifest, encoding="utf-8")
        (staging / MANIFEST).chmod(0o644)
        staging.chmod(0o755)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{name}.old.", dir=out))
            os.rename(target, old / name)
            os.rename(staging, target)
            shutil.rmtree(old)
        else:
            os.rename(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.patchset_build",
        description="Build files/patches/NAME/ (patchset.yml and the patched files) against a pristine package.",
    )
    parser.add_argument("name", metavar="NAME", help="patch set name: the directory under --out")
    parser.add_argument("--base", required=True, help="the distribution and version patched, e.g. sglang==0.5.23")
    parser.add_argument("--patched", required=True, type=Path, help="directory of patched files, laid out as under site-packages")
    parser.add_argument("--pristine", required=True, type=Path, help="the unpatched site-packages directory, or the distribution's wheel")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where patch sets live (default: files/patches)")
    parser.add_argument("--description", help="the one-line comment at the top of patchset.yml")
    parser.add_argument("--force", action="store_true", help="replace an existing OUT/NAME")
    args = parser.parse_args(argv)
    try:
        target = build(args.name, args.base, args.patched, args.pristine, args.out, args.description, args.force)
    except BuildError as exc:
        for line in str(exc).splitlines():
            print(f"patchset_build: error: {line}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"patchset_build: error: {exc}", file=sys.stderr)
        return 1
    raw = yaml.safe_load((target / MANIFEST).read_text(encoding="utf-8"))
    files = raw["files"]
    added = sum(v["original"] is None for v in files.values())
    if target.parent == DEFAULT_OUT.resolve():
        # The deploy's own reader must accept the result.
        from configuration.errors import DataError
        from operations.patches import load_patch_set

        load_patch_set.cache_clear()
        try:
            load_patch_set(args.name)
        except DataError as exc:
            print(f"patchset_build: error: operations.patches cannot load the result: {exc}", file=sys.stderr)
            return 1
    try:
        shown = target.relative_to(Path.cwd())
    except ValueError:
        shown = target
    print(f"patch set {args.name}: {len(files) - added} replaced, {added} added, "
          f"over {raw['base']['distribution']} {raw['base']['version']} -> {shown}/{MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
