# Shared by the remote scripts (stdlib only). A script names what it uses on one line,
#     from _common import walk_files, sha256_file  # noqa: E402 - remote.script puts _common.py here
# and remote.script() puts this whole file in that line's place, so each script still travels
# and runs as one file (`python3 - ARGS`, or the boot unit's installed copy of stage_model.py).
# ctypes is imported where it is used (a venv switch): the converged read, which imports every script's
# top-level imports once before it forks (remote/run_scripts.py), never needs it.
import hashlib as _hashlib
import os as _os
import re as _re
import subprocess as _subprocess

# Our files beside a model: the source's cached manifest, a staged copy's journal, a file being copied.
MANIFEST_NAME = ".sglang-deploy-manifest.json"
MANIFEST_FALLBACK_DIR = "/var/cache/sglang-deploy/manifests"
JOURNAL_NAME = ".sglang-deploy-partial.jsonl"
PART_SUFFIX = ".sglang-part"
HASH_BLOCK = 1 << 22
# Touched by the deploy after each install into a venv generation (operations/venv.py: STAMP).
STAMP = _os.path.join(".sglang-deploy", "installed")


def norm(name, sep="-"):
    """A distribution name normalised (PEP 503; `sep="_"` for .dist-info directory names)."""
    return _re.sub(r"[-_.]+", sep, name).lower()


def file_digest(path, algorithm="sha256"):
    """The hash object of a file's content, read in blocks (raises OSError)."""
    digest = _hashlib.new(algorithm)
    with open(path, "rb", buffering=0) as reader:
        for block in iter(lambda: reader.read(HASH_BLOCK), b""):
            digest.update(block)
    return digest


def sha256_file(path):
    return file_digest(path).hexdigest()


def manifest_paths(src):
    """Where a model source's manifest is cached: beside it, or (read-only source) under the fallback dir."""
    digest = _hashlib.sha256(_os.path.abspath(src).encode()).hexdigest()[:12]
    fallback = _os.path.join(MANIFEST_FALLBACK_DIR, f"{_os.path.basename(src.rstrip('/'))}-{digest}.json")
    return _os.path.join(src, MANIFEST_NAME), fallback


def beside_model(rel, name, marker_name=None):
    """A file the deploy keeps beside a model (never part of it): manifest, marker, copy in progress."""
    return name.endswith(PART_SUFFIX) or name.startswith(MANIFEST_NAME) or (marker_name is not None and rel == marker_name)


def walk_files(root, skip=lambda rel, name: False):
    """{relpath: os.lstat()} of every file under root, directories in sorted order; None if root is no directory."""
    if not _os.path.isdir(root):
        return None
    out = {}
    for base, dirs, names in _os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = _os.path.join(base, name)
            rel = _os.path.relpath(path, root)
            if not skip(rel, name):
                out[rel] = _os.lstat(path)
    return out


def exchange(a, b):
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE): neither name is ever missing. Raises OSError."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    try:
        renameat2 = libc.renameat2
    except AttributeError:
        raise OSError(38, "renameat2 is not available (glibc < 2.28)", f"{a} <-> {b}") from None
    if renameat2(at_fdcwd, a.encode(), at_fdcwd, b.encode(), rename_exchange) != 0:
        err = ctypes.get_errno()
        raise OSError(err, _os.strerror(err), f"{a} <-> {b}")


def systemctl_show(units, properties):
    """{unit: {property: value}} from one `systemctl show` of the units ({} where systemctl is missing)."""
    if not units:
        return {}
    try:
        shown = _subprocess.run(["systemctl", "show", "-p", ",".join(("Id", *properties)), *units],
                                capture_output=True, text=True).stdout
    except OSError:
        return {}
    # One block per unit, in the order asked, separated by blank lines; named by its Id.
    blocks, block = [], {}
    for line in shown.splitlines() + [""]:
        if not line.strip():
            if block:
                blocks.append(block)
            block = {}
            continue
        key, _, value = line.partition("=")
        block[key] = value
    return {block.get("Id") or unit: block for unit, block in zip(units, blocks)}
