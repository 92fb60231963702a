"""Build a patch set (`files/patches/NAME/`) from patched files and the pristine package.

    python -m tools.patchset_build NAME --base sglang==0.5.23 --patched DIR \\
        --pristine SITE_PACKAGES_OR_WHEEL [--out files/patches] [--description TEXT] [--force]

DIR holds the patched files laid out as under site-packages (DIR/sglang/srt/server_args.py).
For each file the pristine original is looked up in SITE_PACKAGES (a directory) or inside
a wheel (a .whl file): its sha256 becomes `original`, or `original: null` when the patch
adds the file. The base version must be the pristine's (read from its `.dist-info/METADATA`),
and a file identical to its original is refused (there is nothing to patch). The result is
`OUT/NAME/patchset.yml` (the format `configuration.patch_sets.load_patch_set` reads; paths sorted,
so the same input gives the same bytes) with the files copied beside it. DIR may be
`OUT/NAME` itself: the set is then rebuilt in place after its files were edited.

From a change (a pull request, a fork's commits) instead of finished files:

    python -m tools.patchset_build NAME --base sglang==0.5.13 --pristine sglang-0.5.13-*.whl \\
        --git FORK_CLONE --change-base BASE_COMMIT --change COMMIT --change-root python \\
        [--resolved DIR] [--conflicts DIR]

The change is what differs between BASE and CHANGE (two commits of the clone FORK_CLONE, bare
or not; or, without --git, two directories); its paths under CHANGE_ROOT are the installed
package's (python/sglang/srt/x.py is sglang/srt/x.py). Each file the change edits is merged
into the release's own file (from --pristine) with a three-way merge (`git merge-file`:
release, change base, change): the release keeps what it has and gains what the change
changed. A file the change adds is added (`original: null`). The build is refused, naming the
file and each conflicting hunk, where a file does not merge cleanly, where the change deletes
a file or edits one the release lacks, and where a merged Python file no longer compiles; the
merge with its conflict markers is written to --conflicts (default OUT/.NAME.conflicts/) with
a `conflicts.yml` naming the inputs. Edit those files, then pass that directory as --resolved:
a resolution is used only for a file that conflicts, for the very inputs it was made from,
and only without conflict markers. Paths of the change outside CHANGE_ROOT (tests, docs,
kernel sources) are not part of the installed package: they are listed and left out.

An operator's own fixes to the merged files (a bug the change has on this release, found on
a real host) go on top with --fix PATCH, in order: each a unified diff (`git diff` form, -p1)
whose paths are site-packages paths (a/sglang/srt/x.py). The build is refused, naming the fix
and git's hunk message, where a fix does not apply, deletes a file, or leaves a Python file
that no longer compiles; the manifest's comment names the fixes applied.

Once the set has served on a GPU, name the attention backends it served on with
--attention-backend NAME (repeatable): the manifest's `attention_backends`, to which the deploy
then holds every service using the set (a backend it never met can die at start or at the first
request even though the flags parse: DDTree's port on fa3).
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import yaml

from configuration.errors import DataError
from configuration.patch_sets import BACKEND_RE, load_patch_set
from configuration.stacks import normalize

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "files" / "patches"
MANIFEST = "patchset.yml"
_NAME_RE = re.compile(r"\A[a-z0-9][a-z0-9_-]{0,62}\Z")  # what settings accepts in `patch_sets`
_BASE_RE = re.compile(
    r"\A\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*\Z")
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
            metas = [
                (p.name, _metadata((p / "METADATA").read_text(encoding="utf-8", errors="replace")))
                for p in found]
            self.kind = "site-packages"
        elif location.is_file() and zipfile.is_zipfile(location):
            self._zip = zipfile.ZipFile(location)
            names = sorted(n for n in self._zip.namelist()
                           if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
            metas = [
                (n.split("/")[0], _metadata(self._zip.read(n).decode("utf-8", errors="replace")))
                for n in names]
            self.kind = "wheel"
        else:
            raise BuildError(
                f"--pristine {location}: must be a site-packages directory or a wheel (.whl) file")
        mine = [(d, v) for d, (n, v) in metas if normalize(n) == normalize(distribution)]
        if not mine:
            seen = ", ".join(d for d, _ in metas) or "none"
            raise BuildError(
                f"--pristine {location}: no {distribution} installed there ({self.kind} .dist-info "
                f"found: {seen})"
            )
        if len({v for _, v in mine}) > 1:
            raise BuildError(
                f"--pristine {location}: several {distribution} installs "
                f"({', '.join(d for d, _ in mine)}): reinstall it so exactly one remains"
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
                raise BuildError(
                    f"{rel}: a directory in the pristine wheel {self.location}, not a file")
            return self._zip.read(info)
        path = self.location / rel
        if not path.exists() and not path.is_symlink():
            return None
        if not path.is_file():
            raise BuildError(
                f"{rel}: {path} exists in the pristine site-packages but is not a regular file")
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
                raise BuildError(
                    f"--patched: {Path(dirpath) / d} is a symlink: lay the real files out instead")
        for filename in sorted(filenames):
            path = Path(dirpath) / filename
            rel = path.relative_to(patched).as_posix()
            if rel == MANIFEST or filename.endswith(_SKIP_SUFFIXES):
                continue
            if path.is_symlink() or not path.is_file():
                raise BuildError(
                    f"--patched: {path} is not a regular file (symlinks are not copied)")
            found[rel] = path.read_bytes()
    if not found:
        raise BuildError(f"--patched {patched}: holds no files (lay them out as under "
                         "site-packages)")
    return found


def build_entries(patched_files: dict[str, bytes], pristine: Pristine) -> list[Entry]:
    entries, errors = [], []
    for rel in sorted(patched_files):
        content = patched_files[rel]
        original = pristine.read(rel)
        if original is not None and original == content:
            errors.append(
                f"{rel}: identical to the original in {pristine.location}: nothing to patch (leave "
                "it out of --patched)"
            )
            continue
        entries.append(
            Entry(rel, content, sha256(content), None if original is None else sha256(original)))
    if errors:
        raise BuildError("\n".join(errors))
    return entries


def _scalar(text: str) -> str:
    """`text` as a YAML scalar: plain where YAML reads it back as this string, else quoted."""
    return text if _PLAIN_RE.match(text) and yaml.safe_load(text) == text else json.dumps(text)


def render_manifest(name: str, distribution: str, version: str, entries: list[Entry],
                    description: str, attention_backends: tuple[str, ...] = (),
                    parser_only: bool = False) -> str:
    lines = [
        f"# {description}",
        f"name: {_scalar(name)}",
        f"base: {{distribution: {_scalar(distribution)}, version: {json.dumps(version)}}}",
    ]
    if attention_backends:
        lines.append(f"attention_backends: [{', '.join(attention_backends)}]")
    if parser_only:
        lines.append("parser_only: true")
    lines.append("files:")
    for entry in sorted(entries, key=lambda e: e.path):
        original = "null" if entry.original is None else json.dumps(entry.original)
        lines.append(f"  {_scalar(entry.path)}: {{sha256: {json.dumps(entry.sha256)}, original: "
                     f"{original}}}")
    text = "\n".join(lines) + "\n"
    expected = {
        "name": name,
        "base": {"distribution": distribution, "version": version},
        "files": {e.path: {"sha256": e.sha256, "original": e.original} for e in entries},
    }
    if attention_backends:
        expected["attention_backends"] = list(attention_backends)
    if parser_only:
        expected["parser_only"] = True
    if yaml.safe_load(text) != expected:  # a path YAML would read differently
        raise BuildError("internal error: the rendered manifest does not read back as written")
    return text


# A change merged into the release ------------------------------------------------------

CONFLICTS_MANIFEST = "conflicts.yml"
_MARKERS = ("<<<<<<< ", "||||||| ", "=======", ">>>>>>> ")
# a conflicting hunk longer than this is shown cut, the whole of it is in --conflicts
_HUNK_LINES = 40


@dataclass(frozen=True)
class ChangedFile:
    """One path of the change: its bytes before (None: added) and after (None: deleted)."""

    path: str  # relative to the change's root, POSIX separators
    before: bytes | None
    after: bytes | None


@dataclass
class Change:
    """What differs between two trees: commits of a git repository, or two directories."""

    label_base: str
    label_change: str
    root: str  # the tree's folder that is site-packages ("" or e.g. "python")
    files: list[ChangedFile] = field(default_factory=list)  # under root, paths relative to it
    outside: list[str] = field(default_factory=list)  # changed paths outside root (left out)


def _git(repo: Path, *args: str) -> bytes:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    except FileNotFoundError:
        raise BuildError("git is not installed: the three-way merge is `git merge-file`") from None
    if out.returncode != 0:
        raise BuildError(f"git -C {repo} {' '.join(args)}: "
                         f"{out.stderr.decode(errors='replace').strip()}")
    return out.stdout


def _root_prefix(root: str) -> str:
    pure = PurePosixPath(root.strip("/")) if root.strip("/") else None
    if pure is not None and (".." in pure.parts or pure.is_absolute()):
        raise BuildError(f"--change-root {root!r}: must be a folder inside the tree, without '..'")
    return "" if pure is None else pure.as_posix() + "/"


def change_from_git(repo: Path, base: str, change: str, root: str = "") -> Change:
    """The change between commits `base` and `change` of `repo` (a clone, bare or not)."""
    prefix = _root_prefix(root)
    base_id = _git(repo, "rev-parse", "--verify", "--end-of-options",
                   f"{base}^{{commit}}").decode().strip()
    change_id = _git(repo, "rev-parse", "--verify", "--end-of-options",
                     f"{change}^{{commit}}").decode().strip()
    raw = _git(repo, "diff", "--raw", "--no-renames", "--no-abbrev", "-z", base_id,
               change_id).split(b"\0")
    result = Change(f"change base {base_id[:12]}", f"change {change_id[:12]}", prefix.rstrip("/"))
    for meta, path in zip(raw[0::2], raw[1::2]):
        if not meta:
            continue
        old_mode, new_mode, _old, _new, status = meta.decode().lstrip(":").split()
        rel_path = path.decode("utf-8", errors="surrogateescape")
        if not rel_path.startswith(prefix):
            result.outside.append(rel_path)
            continue
        for mode in (old_mode, new_mode):
            if mode not in ("000000", "100644", "100755"):
                raise BuildError(
                    f"{rel_path}: the change has it as git mode {mode} (a symlink or submodule): a "
                    "patch set holds regular files only")
        before = None if status == "A" else _git(repo, "cat-file", "blob", f"{base_id}:{rel_path}")
        after = None if status == "D" else _git(repo, "cat-file", "blob", f"{change_id}:{rel_path}")
        result.files.append(ChangedFile(rel_path[len(prefix):], before, after))
    if not result.files:
        raise BuildError(f"the change {base_id[:12]}..{change_id[:12]} touches nothing under "
                         f"{prefix or 'the tree'!s}")
    return result


def _tree_files(folder: Path, what: str) -> dict[str, bytes]:
    if not folder.is_dir():
        raise BuildError(f"{what} {folder}: not a directory")
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and d != ".git")
        for filename in filenames:
            path = Path(dirpath) / filename
            if filename.endswith(_SKIP_SUFFIXES):
                continue
            if path.is_symlink() or not path.is_file():
                raise BuildError(
                    f"{what}: {path} is not a regular file (a patch set holds regular files only)")
            found[path.relative_to(folder).as_posix()] = path.read_bytes()
    return found


def change_from_dirs(base: Path, change: Path, root: str = "") -> Change:
    """The change between two directories (the change's base files and its patched files)."""
    prefix = _root_prefix(root)
    before, after = _tree_files(base, "--change-base"), _tree_files(change, "--change")
    result = Change(f"change base {base.name}", f"change {change.name}", prefix.rstrip("/"))
    for rel_path in sorted(set(before) | set(after)):
        if before.get(rel_path) == after.get(rel_path):
            continue
        if not rel_path.startswith(prefix):
            result.outside.append(rel_path)
            continue
        result.files.append(
            ChangedFile(rel_path[len(prefix):], before.get(rel_path), after.get(rel_path)))
    if not result.files:
        raise BuildError(f"--change-base {base} and --change {change} hold the same files under "
                         f"{prefix or 'the tree'}")
    return result


@dataclass(frozen=True)
class Hunk:
    merge_line: int  # 1-based, in the merge with markers
    # 1-based, inclusive; (n, n-1) where the release has no line there
    release_lines: tuple[int, int]
    text: str  # the hunk with its markers


@dataclass
class MergeReport:
    """Per file of the change, what the merge did: the lines `main` prints and results files
    keep."""

    release: str  # "sglang 0.5.13"
    outcomes: dict[str, str] = field(default_factory=dict)  # path -> one line
    left_out: list[str] = field(default_factory=list)  # paths outside the change's root
    conflicts: dict[str, list[Hunk]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [f"{path}: {what}" for path, what in sorted(self.outcomes.items())]
        out += [f"{path}: outside the installed package (--change-root): left out"
                for path in self.left_out]
        return out


def _is_text(data: bytes) -> bool:
    return b"\0" not in data


def merge_file(release: bytes, base: bytes, change: bytes,
               labels: tuple[str, str, str]) -> tuple[bytes, int]:
    """`git merge-file --diff3`: the merged bytes (with markers where it conflicts) and the number
    of conflicts."""
    with tempfile.TemporaryDirectory(prefix="patchset-merge-") as tmp:
        paths = []
        for name, data in (("release", release), ("base", base), ("change", change)):
            paths.append(Path(tmp) / name)
            paths[-1].write_bytes(data)
        try:
            out = subprocess.run(
                ["git", "merge-file", "-p", "--diff3",
                 "-L", labels[0], "-L", labels[1], "-L", labels[2], *map(str, paths)],
                capture_output=True, check=False,
            )
        except FileNotFoundError:
            raise BuildError(
                "git is not installed: the three-way merge is `git merge-file`") from None
    if out.returncode < 0 or out.returncode > 127:
        raise BuildError(f"git merge-file failed ({out.returncode}): "
                         f"{out.stderr.decode(errors='replace').strip()}")
    return out.stdout, out.returncode


def conflict_hunks(merged: bytes, release: bytes) -> list[Hunk]:
    """The conflicting hunks of a diff3-style merge, each placed in the release's own lines."""
    import difflib

    lines = merged.decode("utf-8", errors="replace").splitlines(keepends=True)
    release_lines = release.decode("utf-8", errors="replace").splitlines(keepends=True)
    # The lines outside the markers and the release's side of each hunk are release lines
    # where the change did not touch them: align them with the release to name its line numbers.
    plain, where = [], []  # merge lines that may be the release's, and their merge index
    state = None
    for index, line in enumerate(lines):
        if line.startswith(_MARKERS[0]):
            state = "ours"
        elif state and line.startswith(_MARKERS[1]):
            state = "base"
        elif state and line.startswith(_MARKERS[2]) and line.rstrip("\r\n") == _MARKERS[2]:
            state = "theirs"
        elif state and line.startswith(_MARKERS[3]):
            state = None
        elif state in (None, "ours"):
            plain.append(line)
            where.append(index)
    to_release = {}
    matcher = difflib.SequenceMatcher(None, plain, release_lines, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        for k in range(size):
            to_release[where[a + k]] = b + k
    hunks, index = [], 0
    while index < len(lines):
        if not lines[index].startswith(_MARKERS[0]):
            index += 1
            continue
        start = index
        while index < len(lines) and not lines[index].startswith(_MARKERS[3]):
            index += 1
        body = lines[start:index + 1]
        ours_end = next((k for k in range(start + 1, index) if lines[k].startswith(_MARKERS[1])),
                        start + 1)
        ours = [to_release[k] for k in range(start + 1, ours_end) if k in to_release]
        if ours:
            span = (ours[0] + 1, ours[-1] + 1)
        else:  # the release has nothing there: the line after the last release line before it
            before = [to_release[k] for k in range(start) if k in to_release]
            after_line = (before[-1] + 1 if before else 0) + 1
            span = (after_line, after_line - 1)
        if len(body) > _HUNK_LINES:
            body = (body[:_HUNK_LINES - 1]
                    + [f"... ({len(body) - _HUNK_LINES + 1} more lines) ...\n", body[-1]])
        hunks.append(Hunk(start + 1, span, "".join(body)))
        index += 1
    return hunks


def _compiles(path: str, data: bytes) -> str | None:
    """None when `data` compiles as Python (or is not a .py file), else the error."""
    if not path.endswith(".py"):
        return None
    try:
        compile(data, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _inputs_digest(release: bytes | None, before: bytes | None,
                   after: bytes | None) -> dict[str, str | None]:
    return {
        "release": None if release is None else sha256(release),
        "base": None if before is None else sha256(before),
        "change": None if after is None else sha256(after),
    }


def _load_resolutions(folder: Path | None) -> tuple[dict[str, bytes], dict]:
    if folder is None:
        return {}, {}
    manifest = folder / CONFLICTS_MANIFEST
    if not manifest.is_file():
        raise BuildError(f"--resolved {folder}: no {CONFLICTS_MANIFEST} (resolve in the folder a "
                         "refused build wrote its conflicts to: it records which inputs each "
                         "resolution is for)")
    recorded = yaml.safe_load(manifest.read_text(encoding="utf-8")) or {}
    if not isinstance(recorded, dict) or not isinstance(recorded.get("files"), dict):
        raise BuildError(f"{manifest}: must map files: {{path: {{release, base, change}}}}")
    files = {rel: data for rel, data in _tree_files(folder, "--resolved").items()
             if rel != CONFLICTS_MANIFEST}
    return files, recorded


def merge_change(change: Change, pristine: Pristine, resolved: Path | None = None) -> tuple[
        dict[str, bytes], MergeReport, dict[str, tuple[bytes, dict]]]:
    """The patched files of `change` applied to the release in `pristine`.

    Returns (patched files, report, conflicts: path -> (merge with markers, inputs' digests));
    refusals other than conflicts raise BuildError at once, with every reason found."""
    release_label = f"{pristine.distribution} {pristine.version}"
    labels = (release_label, change.label_base, change.label_change)
    report = MergeReport(release_label, left_out=list(change.outside))
    resolutions, recorded = _load_resolutions(resolved)
    patched: dict[str, bytes] = {}
    conflicts: dict[str, tuple[bytes, dict]] = {}
    errors: list[str] = []
    for item in sorted(change.files, key=lambda f: f.path):
        rel, before, after = item.path, item.before, item.after
        release = pristine.read(rel)
        digest = _inputs_digest(release, before, after)
        result: bytes | None = None
        if after is None:
            if release is None:
                report.outcomes[rel] = (f"deleted by the change and absent from {release_label}: "
                                        "nothing to do")
            else:
                errors.append(f"{rel}: the change deletes it and {release_label} has it: a patch "
                              "set cannot delete a file (port the deletion by hand: edit the files "
                              "that import it)")
            continue
        if before is None:  # added by the change
            if release is None:
                result, outcome = after, "added (new file, original null)"
            elif release == after:
                report.outcomes[rel] = (
                    f"added by the change, already in {release_label} as is: left out")
                continue
            else:
                errors.append(f"{rel}: the change adds it, but {release_label} already has a "
                              f"different {rel}: merge the two by hand and pass the result as a "
                              "patched file")
                continue
        elif release is None:
            errors.append(f"{rel}: the change edits it, but {release_label} has no such file "
                          "(added, moved or renamed after the release?)")
            continue
        elif release == after:
            report.outcomes[rel] = f"{release_label} already has the change's file: left out"
            continue
        elif not (_is_text(release) and _is_text(before) and _is_text(after)):
            if release != before:
                errors.append(
                    f"{rel}: a binary file that {release_label} changed too: cannot merge it")
                continue
            result, outcome = (after,
                               "binary, the release's file is the change's base: the change's file")
        else:
            merged, count = merge_file(release, before, after, labels)
            if count:
                if rel in resolutions:
                    result, outcome = resolutions.pop(rel), "resolved by hand (--resolved)"
                    if recorded["files"].get(rel) != digest:
                        errors.append(
                            f"{rel}: the resolution in {resolved} was made for other inputs "
                            f"({CONFLICTS_MANIFEST} says {recorded['files'].get(rel)}, these are "
                            f"{digest}): resolve this merge again")
                        continue
                    if any(line.startswith(_MARKERS)
                           for line in result.decode("utf-8", "replace").splitlines()):
                        errors.append(
                            f"{rel}: the resolution in {resolved} still holds conflict markers")
                        continue
                else:
                    conflicts[rel] = (merged, digest)
                    report.conflicts[rel] = conflict_hunks(merged, release)
                    report.outcomes[rel] = f"CONFLICT ({count} hunk{'s' if count > 1 else ''})"
                    continue
            elif release == before:
                result, outcome = merged, "merged cleanly (the release's file is the change's base)"
            else:
                result, outcome = (merged, "merged cleanly (three-way: the release's file differs "
                                           "from the change's base)")
        problem = _compiles(rel, result)
        if problem and _compiles(rel, release or b"") is None:
            errors.append(f"{rel}: the merged file does not compile ({problem}) though the "
                          "release's does: resolve it by hand")
            continue
        report.outcomes[rel] = outcome
        patched[rel] = result
    for rel in sorted(resolutions):
        errors.append(
            f"{rel}: a resolution in {resolved}, but this build has no conflict in it: remove it")
    if errors:
        raise BuildError("\n".join(errors))
    return patched, report, conflicts


def _fix_paths(fix: Path) -> list[str]:
    """The site-packages paths a fix edits or creates, as git itself reads its headers (`git apply
    --numstat -z`: quoted and non-ASCII names included). BuildError for what a patch set cannot
    carry, as `git apply --summary` names it: a deletion, a rename or a copy (a rename deletes its
    old path), a mode change (a set holds contents)."""
    def git_apply(*args: str) -> str:
        out = subprocess.run(["git", "apply", *args, str(fix.resolve())],
                             capture_output=True, check=False)
        if out.returncode != 0:
            raise BuildError(f"--fix {fix}: git cannot read it as a diff "
                             f"({out.stderr.decode(errors='replace').strip()}); write it as "
                             "`git diff` does, over a/ and b/ site-packages paths")
        return out.stdout.decode("utf-8", errors="surrogateescape")

    for line in git_apply("--summary").splitlines():
        words = line.split()
        if words[:2] == ["delete", "mode"]:
            raise BuildError(f"--fix {fix}: deletes {' '.join(words[3:])}: a patch set cannot "
                             "delete a file")
        if words[:1] in (["rename"], ["copy"]):
            raise BuildError(f"--fix {fix}: {line.strip()}: a patch set cannot rename or copy a "
                             "file (a rename deletes the old path); write the new file whole in "
                             "the fix instead")
        if words[:2] == ["mode", "change"]:
            raise BuildError(
                f"--fix {fix}: {line.strip()}: a patch set holds file contents, not modes")
    # -z: "ADDED\tDELETED\tPATH\0" per file, paths as they are (no C quoting).
    records = [r for r in git_apply("--numstat", "-z").split("\0") if r]
    return [record.split("\t", 2)[2] for record in records]


def apply_fixes(fixes: list[Path], patched: dict[str, bytes], pristine: Pristine,
                report: MergeReport) -> dict[str, bytes]:
    """`patched` with each fix (a -p1 unified diff over site-packages paths) applied in order by
    `git apply`.

    A file a fix edits that the change left alone is read from the release. Raises BuildError naming
    the fix and git's message (the file and the hunk's line) where one does not apply."""
    result = dict(patched)
    for fix in fixes:
        if not fix.is_file():
            raise BuildError(f"--fix {fix}: no such file")
        paths = _fix_paths(fix)
        if not paths:
            raise BuildError(f"--fix {fix}: not a unified diff (no file in it; write it as "
                             "`git diff` does)")
        with tempfile.TemporaryDirectory(prefix="patchset-fix.") as tmp:
            work = Path(tmp)
            # its own repository: git apply works on this tree and nowhere above it
            _git(work, "init", "-q")
            for rel in paths:
                if PurePosixPath(rel).is_absolute() or ".." in PurePosixPath(rel).parts:
                    raise BuildError(
                        f"--fix {fix}: path {rel!r} must be a site-packages path without '..'")
                data = result[rel] if rel in result else pristine.read(rel)
                if data is not None:
                    dest = work / PurePosixPath(rel)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(data)
            out = subprocess.run(["git", "-C", str(work), "apply", "--verbose", str(fix.resolve())],
                                 capture_output=True, check=False)
            if out.returncode != 0:
                message = out.stderr.decode(errors="replace").strip().replace(str(work) + "/", "")
                raise BuildError(f"--fix {fix}: does not apply to the merged files of "
                                 f"{report.release}:\n{message}\nport the fix to these files (the "
                                 "change or the release moved), then build again")
            for new in paths:
                data = (work / PurePosixPath(new)).read_bytes()
                problem = _compiles(new, data)
                if problem:
                    raise BuildError(f"--fix {fix}: {new} does not compile after it ({problem})")
                if data == pristine.read(new):
                    result.pop(new, None)
                    report.outcomes[new] = (f"back to {report.release}'s own file after --fix "
                                            f"{fix.name}: left out")
                    continue
                before = report.outcomes.get(new, f"{report.release}'s own file")
                report.outcomes[new] = f"{before}; then --fix {fix.name}"
                result[new] = data
    return result


def _conflict_message(report: MergeReport, folder: Path) -> str:
    lines = []
    for rel, hunks in sorted(report.conflicts.items()):
        lines.append(f"{rel}: does not merge cleanly into {report.release}'s file "
                     f"({len(hunks)} conflicting hunk{'s' if len(hunks) > 1 else ''}); the merge "
                     f"with its markers: {folder / rel}")
        for number, hunk in enumerate(hunks, 1):
            first, last = hunk.release_lines
            where = (f"{report.release} lines {first}-{last}" if last >= first
                     else f"before {report.release} line {first}")
            lines.append(f"  hunk {number} of {len(hunks)}, at {where}:")
            lines += [f"    {line}" for line in hunk.text.splitlines()]
    lines.append(f"resolve: edit the files under {folder} (remove every marker), then build again "
                 f"with --resolved {folder}")
    return "\n".join(lines)


def _write_conflicts(folder: Path, conflicts: dict[str, tuple[bytes, dict]]) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    for rel, (merged, _digest) in conflicts.items():
        dest = folder / PurePosixPath(rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(merged)
    record = {"files": {rel: digest for rel, (_merged, digest) in sorted(conflicts.items())}}
    (folder / CONFLICTS_MANIFEST).write_text(
        "# Which inputs each conflicted merge here came from (sha256): a resolution is used only "
        "for these.\n" + yaml.safe_dump(record, sort_keys=True), encoding="utf-8")


# Building ---------------------------------------------------------------------------------


def _check_target(name: str, out: Path, source: Path | None, force: bool) -> Path:
    if not _NAME_RE.match(name):
        raise BuildError(
            f"NAME {name!r}: must match {_NAME_RE.pattern} (lower case, digits, '-' and '_')")
    target = (out / name).resolve()
    in_place = source is not None and source == target
    if target.exists() and not in_place and not force:
        raise BuildError(f"{target} already exists: pass --force to replace it")
    if (source is not None and not in_place
            and (target in source.parents or source in target.parents)):
        raise BuildError(f"--patched {source} and the output {target} must not contain one another")
    return target


def _write_set(name: str, target: Path, out: Path, entries: list[Entry], manifest: str) -> None:
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


def _open_pristine(pristine_path: Path, distribution: str, version: str) -> Pristine:
    pristine = Pristine(pristine_path, distribution)
    if pristine.version != version:
        pristine.close()
        raise BuildError(
            f"--base {distribution}=={version}, but the pristine {pristine.kind} {pristine_path} "
            f"has {distribution} {pristine.version}: diff against the version the patch set is for"
        )
    return pristine


def _check_backends(backends: tuple[str, ...]) -> None:
    for backend in backends:
        if not BACKEND_RE.match(backend):
            raise BuildError(f"--attention-backend {backend!r}: must be sglang's name for it, "
                             "lower case (triton, fa3, flashinfer, ...)")
    if len(set(backends)) != len(backends):
        raise BuildError(f"--attention-backend: {', '.join(backends)} names one backend twice")


def _description(name: str, entries: list[Entry], distribution: str, version: str, how: str) -> str:
    added = sum(e.original is None for e in entries)
    return (f"{name}: {len(entries) - added} replaced and {added} added files over {distribution} "
            f"{version} (python -m tools.patchset_build{how})")


def build(
    name: str,
    base: str,
    patched: Path,
    pristine_path: Path,
    out: Path = DEFAULT_OUT,
    description: str | None = None,
    force: bool = False,
    attention_backends: tuple[str, ...] = (),
    parser_only: bool = False,
) -> Path:
    """Write `out/name/` and return that directory; raises BuildError."""
    distribution, version = parse_base(base)
    _check_backends(attention_backends)
    if description is not None and ("\n" in description or "\r" in description):
        raise BuildError("--description: must be one line")
    patched = patched.resolve()
    target = _check_target(name, out, patched, force)
    patched_files = collect_patched(patched)
    pristine = _open_pristine(pristine_path, distribution, version)
    try:
        entries = build_entries(patched_files, pristine)
    finally:
        pristine.close()
    description = description or _description(name, entries, distribution, version, "")
    _write_set(name, target, out, entries, render_manifest(name, distribution, version, entries,
                                                           description, attention_backends,
                                                           parser_only))
    return target


def build_from_change(
    name: str,
    base: str,
    change: Change,
    pristine_path: Path,
    out: Path = DEFAULT_OUT,
    description: str | None = None,
    force: bool = False,
    resolved: Path | None = None,
    conflicts_dir: Path | None = None,
    fixes: list[Path] | None = None,
    attention_backends: tuple[str, ...] = (),
    parser_only: bool = False,
) -> tuple[Path, MergeReport]:
    """Merge `change` into the release's files and write `out/name/`; returns it and what each
    file's merge did.

    Where a file conflicts, the merges are written to `conflicts_dir` (default
    `out/.name.conflicts`) and BuildError names each file and hunk; nothing is written to
    `out/name`."""
    distribution, version = parse_base(base)
    _check_backends(attention_backends)
    if description is not None and ("\n" in description or "\r" in description):
        raise BuildError("--description: must be one line")
    target = _check_target(name, out, None, force)
    pristine = _open_pristine(pristine_path, distribution, version)
    try:
        patched_files, report, conflicts = merge_change(change, pristine,
                                                        resolved.resolve() if resolved else None)
        if conflicts:
            folder = (conflicts_dir or out / f".{name}.conflicts").resolve()
            _write_conflicts(folder, conflicts)
            raise BuildError(_conflict_message(report, folder))
        patched_files = apply_fixes(list(fixes or ()), patched_files, pristine, report)
        if not patched_files:
            raise BuildError(f"the change leaves nothing to patch in {distribution} {version}: "
                             + "; ".join(report.lines()))
        entries = build_entries(patched_files, pristine)
    finally:
        pristine.close()
    description = description or _description(
        name, entries, distribution, version,
        f": {change.label_base} to {change.label_change}, three-way merged"
        + "".join(f", then {fix.name}" for fix in fixes or ()))
    _write_set(name, target, out, entries, render_manifest(name, distribution, version, entries,
                                                           description, attention_backends,
                                                           parser_only))
    return target, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.patchset_build",
        description="Build files/patches/NAME/ (patchset.yml and the patched files) against a "
                    "pristine package: from patched files (--patched) or from a change merged into "
                    "the release (--change-base/--change).",
    )
    parser.add_argument("name", metavar="NAME", help="patch set name: the directory under --out")
    parser.add_argument("--base", required=True,
                        help="the distribution and version patched, e.g. sglang==0.5.23")
    parser.add_argument("--patched", type=Path,
                        help="directory of patched files, laid out as under site-packages")
    parser.add_argument("--pristine", required=True, type=Path,
                        help="the unpatched site-packages directory, or the distribution's wheel")
    parser.add_argument("--change-base", metavar="BASE",
                        help="the change's base: a commit of --git, or a directory")
    parser.add_argument("--change", metavar="CHANGE",
                        help="the change itself: a commit of --git, or a directory")
    parser.add_argument("--git", type=Path, metavar="REPO",
                        help="a clone (bare or not) holding --change-base and --change as commits")
    parser.add_argument("--change-root", default="", metavar="DIR",
                        help="the change's folder that is site-packages (sglang's repository: "
                             "python)")
    parser.add_argument("--resolved", type=Path, metavar="DIR",
                        help="hand resolutions of conflicted merges (the --conflicts folder, "
                             "edited)")
    parser.add_argument("--conflicts", type=Path, metavar="DIR",
                        help="where a refused merge writes its conflicts (default "
                             "OUT/.NAME.conflicts)")
    parser.add_argument("--fix", type=Path, action="append", default=[], metavar="PATCH",
                        help="an operator's fix applied after the merge (a -p1 unified diff over "
                             "site-packages paths); repeatable, in order")
    parser.add_argument("--attention-backend", action="append", default=[], metavar="NAME",
                        dest="attention_backends",
                        help="an attention backend the set was served on, on a GPU (repeatable): "
                             "the manifest's attention_backends; services using the set are then "
                             "held to them")
    parser.add_argument("--parser-only", action="store_true",
                        help="the set registers its algorithm for the engine's parser and decodes "
                             "nothing (a sample for the lab): the manifest's parser_only; a stack "
                             "that serves on GPUs refuses it")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="where patch sets live (default: files/patches)")
    parser.add_argument("--description", help="the one-line comment at the top of patchset.yml")
    parser.add_argument("--force", action="store_true", help="replace an existing OUT/NAME")
    args = parser.parse_args(argv)
    from_change = args.change_base is not None or args.change is not None
    if from_change == (args.patched is not None):
        parser.error("give either --patched DIR or --change-base and --change")
    if from_change and (args.change_base is None or args.change is None):
        parser.error("--change-base and --change go together")
    if (not from_change
            and (args.git or args.change_root or args.resolved or args.conflicts or args.fix)):
        parser.error("--git, --change-root, --resolved, --conflicts and --fix go with "
                     "--change-base/--change")
    report = None
    try:
        if from_change:
            if args.git:
                change = change_from_git(args.git, args.change_base, args.change, args.change_root)
            else:
                change = change_from_dirs(Path(args.change_base), Path(args.change),
                                          args.change_root)
            target, report = build_from_change(
                args.name, args.base, change, args.pristine, args.out, args.description, args.force,
                args.resolved, args.conflicts, args.fix, tuple(args.attention_backends),
                args.parser_only,
            )
        else:
            target = build(args.name, args.base, args.patched, args.pristine, args.out,
                           args.description, args.force, tuple(args.attention_backends),
                           args.parser_only)
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
        load_patch_set.cache_clear()
        try:
            load_patch_set(args.name)
        except DataError as exc:
            print(f"patchset_build: error: configuration.patch_sets cannot load the result: {exc}",
                  file=sys.stderr)
            return 1
    try:
        shown = target.relative_to(Path.cwd())
    except ValueError:
        shown = target
    for line in report.lines() if report else ():
        print(line)
    print(f"patch set {args.name}: {len(files) - added} replaced, {added} added, "
          f"over {raw['base']['distribution']} {raw['base']['version']} -> {shown}/{MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
