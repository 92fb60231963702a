"""Patch sets on the control machine: `files/patches/<name>/`, its manifest read and checked like
the data.

A patch set is `files/patches/<name>/`: `patchset.yml` names the base distribution and
version it was written for and, for each file (a path under site-packages), the sha256
of its content and of the original it replaces (null for a new file); the files lie
beside it at the same relative paths. `attention_backends` (optional) names the attention backends
the set was served on: a service using it must run on one of them (`unserved_backend`), since a
set that parses and imports can still die on the GPU in a backend it never met (DDTree on fa3:
bench/results/h200-2026-12-03-b2ac97c-ddtree-auto.txt). `load_patch_set(name)` returns the checked
`PatchSet`, or the `DataError` naming the manifest, the key and the fix. Applying one on a host is
operations/environment/patches.py's; `python -m tools.patchset_build` writes a manifest.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any

from configuration.errors import DataError
from configuration.yamlload import load_file

PATCHES_DIR = Path(__file__).resolve().parent.parent / "files" / "patches"
_SHA_RE = re.compile(r"\A[0-9a-f]{64}\Z")
# The manifest's keys: anything else is a typo (`orignal:` would leave an original never backed up).
_TOP_KEYS = ("name", "description", "base", "attention_backends", "parser_only", "files")
_BASE_KEYS = ("distribution", "version")
_FILE_KEYS = ("sha256", "original")
# sglang's backend names: fa3, triton, flashinfer, trtllm_mha, ...
BACKEND_RE = re.compile(r"\A[a-z0-9_]+\Z")
# The engine's flags that choose an attention backend: the one for both phases, each phase's own,
# and the draft's.
ATTENTION_BACKEND_FLAGS = ("attention-backend", "prefill-attention-backend",
                           "decode-attention-backend", "speculative-draft-attention-backend")


@dataclass(frozen=True)
class PatchFile:
    path: str  # relative to site-packages
    sha256: str
    original: str | None  # sha256 of the file it replaces; None: the patch adds it


@dataclass(frozen=True)
class PatchSet:
    name: str
    distribution: str
    version: str
    files: tuple[PatchFile, ...]
    root: Path
    # None: never served on a GPU, nothing to hold it to
    attention_backends: tuple[str, ...] | None = None
    # It registers its algorithm and flags for the engine's parser and decodes nothing (a sample
    # for the lab's stand-in engine): refused on a stack that serves on GPUs (patch_set_fit).
    parser_only: bool = False

    def local(self, patch_file: PatchFile) -> Path:
        return self.root / patch_file.path

    @property
    def digest(self) -> str:
        """Identifies the set's exact content (its manifest pins every file's sha256)."""
        text = (f"{self.distribution}=={self.version}\n"
                + "".join(f"{f.path} {f.sha256}\n" for f in self.files))
        return hashlib.sha256(text.encode()).hexdigest()


@lru_cache(maxsize=None)
def load_patch_set(name: str) -> PatchSet:
    root = PATCHES_DIR / name
    shown = f"files/patches/{name}/patchset.yml"
    if not (root / "patchset.yml").is_file():
        raise DataError(shown, "(file)", name, "must exist and be valid YAML: a patch set is "
                                               "files/patches/<name>/patchset.yml and its files")
    raw = load_file(root / "patchset.yml", shown)
    for key in raw if isinstance(raw, dict) else ():
        if key not in _TOP_KEYS:
            raise DataError(shown, str(key), raw[key],
                            f"unknown key; allowed: {', '.join(_TOP_KEYS)}")
    if not isinstance(raw, dict) or raw.get("name") != name:
        raise DataError(shown, "name", (raw or {}).get("name") if isinstance(raw, dict) else raw,
                        f"must be '{name}' (the directory name)")
    base = raw.get("base")
    if not isinstance(base, dict) or not base.get("distribution") or not base.get("version"):
        raise DataError(shown, "base", base, 'must be {distribution: sglang, version: "0.5.23"}: '
                                             'the install the files were written for')
    for key in base:
        if key not in _BASE_KEYS:
            raise DataError(shown, f"base.{key}", base[key],
                            f"unknown key; allowed: {', '.join(_BASE_KEYS)}")
    if not isinstance(base["version"], str):
        raise DataError(shown, "base.version", base["version"],
                        'must be a quoted version such as "0.5.23"')
    backends = raw.get("attention_backends")
    if "attention_backends" in raw and (
            not isinstance(backends, list) or not backends
            or not all(isinstance(b, str) and BACKEND_RE.match(b) for b in backends)
            or len(set(backends)) != len(backends)):
        raise DataError(shown, "attention_backends", backends,
                        "must list the attention backends the set was served on, each once, e.g. "
                        "[triton] (sglang's names, lower case); leave the key out for a set never "
                        "served on a GPU")
    parser_only = raw.get("parser_only", False)
    if not isinstance(parser_only, bool):
        raise DataError(shown, "parser_only", parser_only,
                        "must be true (the set registers its algorithm for the engine's parser "
                        "only and decodes nothing) or false")
    entries = raw.get("files")
    if not isinstance(entries, dict) or not entries:
        raise DataError(shown, "files", entries,
                        "must map each file path (relative to site-packages) to {sha256, original}")
    patch_files = []
    for rel, spec in entries.items():
        key = f"files.{rel}"
        pure = PurePosixPath(str(rel))
        if pure.is_absolute() or ".." in pure.parts:
            raise DataError(shown, key, rel,
                            "must be a relative path inside site-packages, without '..'")
        if not isinstance(spec, dict) or not _SHA_RE.match(str(spec.get("sha256", ""))):
            raise DataError(shown, f"{key}.sha256", spec,
                            "must give the sha256 (64 hex digits) of the patched content")
        for file_key in spec:
            if file_key not in _FILE_KEYS:
                raise DataError(shown, f"{key}.{file_key}",
                                spec[file_key], f"unknown key; allowed: {', '.join(_FILE_KEYS)} "
                                                "(null for a new file)")
        if "original" not in spec:
            raise DataError(shown, f"{key}.original", None, "must be given: the sha256 of the file "
                                                            "it replaces, or null for a new file")
        original = spec.get("original")
        if original is not None and not _SHA_RE.match(str(original)):
            raise DataError(shown, f"{key}.original", original,
                            "must be the sha256 of the replaced original, or null for a new file")
        local = root / str(rel)
        if not local.is_file():
            raise DataError(shown, key, str(local),
                            "the patched file is missing beside patchset.yml")
        actual = hashlib.sha256(local.read_bytes()).hexdigest()
        if actual != spec["sha256"]:
            raise DataError(shown, f"{key}.sha256", spec["sha256"],
                            f"{local} has sha256 {actual}: regenerate the manifest")
        patch_files.append(PatchFile(str(rel), spec["sha256"], original))
    return PatchSet(name, str(base["distribution"]), str(base["version"]), tuple(patch_files), root,
                    tuple(backends) if backends is not None else None, parser_only)


def unserved_backend(patch_set: PatchSet, args: dict[str, Any]) -> tuple[str, Any] | None:
    """The first attention-backend flag in a service's `args` (flag -> value) whose backend
    `patch_set` was not served on: `(flag, value)`, with `("attention-backend", None)` where the
    flag is left out and sglang's default for the GPU would run (fa3 on an H200). None where the set
    names no backends, or all fit. `attention-backend: auto` is the deploy's own value, resolved on
    the host from the GPU: passed over here, checked again there once resolved
    (operations/gpu/gpus.py)."""
    if patch_set.attention_backends is None:
        return None
    for flag in ATTENTION_BACKEND_FLAGS:
        value = args.get(flag)
        # `false` and null leave the flag out, as not writing it does
        if value is None or value is False:
            if flag == "attention-backend":
                return flag, None
            continue
        if flag == "attention-backend" and value == "auto":
            continue
        if str(value) not in patch_set.attention_backends:
            return flag, value
    return None


def first_unserved(names: tuple[str, ...],
                   args: dict[str, Any]) -> tuple[PatchSet, str, Any] | None:
    """Over a service's patch sets, in order: the first set and `unserved_backend`'s answer for it,
    or None."""
    for name in names:
        patch_set = load_patch_set(name)
        unserved = unserved_backend(patch_set, args)
        if unserved is not None:
            return (patch_set, *unserved)
    return None


def unserved_reason(patch_set: PatchSet, flag: str, value: Any, what: str | None = None) -> str:
    """Why `unserved_backend`'s answer is refused, and the ways out; `what` says what was asked for,
    where the flag and value alone do not (a resolved `auto`)."""
    served = ", ".join(patch_set.attention_backends or ())
    what = what or (f"without `{flag}` sglang runs its default backend for the GPU (fa3 on sm 9.0)"
                    if value is None
                    else f"`{flag}: {value}`")
    return (f"{what}, and patch set {patch_set.name} was served only on {served} (its manifest's "
            f"attention_backends): set `attention-backend: {patch_set.attention_backends[0]}`, or "
            "serve the set on that backend on a GPU first (bench/ddtree/gpu_run.sh) and add it "
            "with `python -m tools.patchset_build --attention-backend`")


def available() -> list[str]:
    """The names of the patch sets in `files/patches/` (each a directory with a `patchset.yml`)."""
    return sorted(p.parent.name for p in PATCHES_DIR.glob("*/patchset.yml"))
