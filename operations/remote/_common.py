# Shared by the remote scripts (stdlib only), with _trust.py (trust in a path) and _peer.py (a
# peer's identity). A script names what it uses of any of them on one line,
#     from _common import walk_files, sha256_file  # noqa: E402 - remote.script puts _common.py here
# and remote.script() puts the three files' text in that line's place (remote.shared_text), so
# each script still travels and runs as one file (`python3 - ARGS`, or the boot unit's installed
# copy of stage_model.py).
# ctypes is imported where it is used (a venv switch): the converged read, which imports every
# script's top-level imports once before it forks (run/on_host/run_scripts.py), never needs it.
import hashlib as _hashlib
import json as _json
import os as _os
import re as _re
import stat as _stat
import subprocess as _subprocess

# Our files beside a model: the source's cached manifest, a staged copy's journal, a file being
# copied.
MANIFEST_NAME = ".sglang-deploy-manifest.json"
MANIFEST_FALLBACK_DIR = "/var/cache/sglang-deploy/manifests"
JOURNAL_NAME = ".sglang-deploy-partial.jsonl"
PART_SUFFIX = ".sglang-part"
HASH_BLOCK = 1 << 22
# A model's layer kinds that are attention (all a dense model has): any other kind in its config's
# `layer_types` (Qwen3-Next/3.5's linear_attention, LFM2's conv, ...) keeps a recurrent state.
ATTENTION_LAYERS = ("full_attention", "sliding_attention", "chunked_attention", "attention",
                    "global", "local")
# Touched by the deploy after each install into a venv generation (operations/environment/venv.py:
# STAMP).
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
    """Where a model source's manifest is cached: beside it, or (read-only source) under the
    fallback dir."""
    digest = _hashlib.sha256(_os.path.abspath(src).encode()).hexdigest()[:12]
    fallback = _os.path.join(MANIFEST_FALLBACK_DIR,
                             f"{_os.path.basename(src.rstrip('/'))}-{digest}.json")
    return _os.path.join(src, MANIFEST_NAME), fallback


def beside_model(rel, name, marker_name=None):
    """A file the deploy keeps beside a model (never part of it): manifest, marker, copy in
    progress."""
    return (name.endswith(PART_SUFFIX) or name.startswith(MANIFEST_NAME)
            or (marker_name is not None and rel == marker_name))


# Reads of a tree another user may have made (a staged copy in /dev/shm) are bounded: deeper or
# larger than this, the walk stops with a judgement (Unwalkable) instead of a crash or an endless
# read.
WALK_MAX_DEPTH = 32
WALK_MAX_ENTRIES = 200_000
_DIR_FLAGS = _os.O_RDONLY | _os.O_DIRECTORY | _os.O_NOFOLLOW


class Unwalkable(Exception):
    """A tree walk_files did not read: deeper than WALK_MAX_DEPTH, more than WALK_MAX_ENTRIES
    entries, or changed under the walk. Its text is the judgement (the path, and which bound)."""


def walk_files(root, skip=lambda rel, name: False, dirs_seen=None, follow_root=False):
    """{relpath: os.lstat()} of every entry under root that is not a directory, directories in
    sorted order; None if root is no directory. Nothing is followed: root is lstat'ed (a link to a
    directory is none, unless `follow_root`: a store's model directory), every directory is opened
    O_NOFOLLOW relative to its parent's handle, and a link in the tree is listed as what it is (a
    link), never walked into.

    With `dirs_seen` (a dict), also {relpath: os.lstat()} of every directory below root, for
    `tree_untrusted`: one lstat per directory, none more per file. Raises Unwalkable past
    WALK_MAX_DEPTH levels or WALK_MAX_ENTRIES entries.
    """
    try:
        fd = _os.open(root, _DIR_FLAGS & ~_os.O_NOFOLLOW if follow_root else _DIR_FLAGS)
    except OSError:
        return None  # absent, a link, or not a directory
    out, seen = {}, [0]

    def scan(fd, rel_dir, depth):
        with _os.scandir(fd) as found:
            entries = sorted(found, key=lambda entry: entry.name)
        seen[0] += len(entries)
        if seen[0] > WALK_MAX_ENTRIES:
            raise Unwalkable(f"{root}: more than {WALK_MAX_ENTRIES} entries: not read")
        below = []
        for entry in entries:
            rel = _os.path.join(rel_dir, entry.name) if rel_dir else entry.name
            if entry.is_dir(follow_symlinks=False):
                if dirs_seen is not None:
                    dirs_seen[rel] = entry.stat(follow_symlinks=False)
                below.append((entry.name, rel))
            elif not skip(rel, entry.name):
                out[rel] = entry.stat(follow_symlinks=False)
        for name, rel in below:
            if depth >= WALK_MAX_DEPTH:
                raise Unwalkable(f"{root}: deeper than {WALK_MAX_DEPTH} levels "
                                 f"({_os.path.join(root, rel)}): not read")
            try:
                child = _os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise Unwalkable(f"{_os.path.join(root, rel)}: changed while it was read "
                                 f"({exc.strerror}): not read") from None
            try:
                scan(child, rel, depth + 1)
            finally:
                _os.close(child)

    try:
        scan(fd, "", 0)
    finally:
        _os.close(fd)
    return out


def exchange(a, b):
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE): neither name is ever missing. Raises
    OSError."""
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
    """{unit: {property: value}} from one `systemctl show` of the units ({} where systemctl is
    missing)."""
    if not units:
        return {}
    try:
        shown = _subprocess.run(["systemctl", "show", "-p", ",".join(("Id", *properties)), *units],
                                capture_output=True, text=True, timeout=30).stdout
    except (OSError, _subprocess.TimeoutExpired):
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


def model_kind(model_dir):
    """What the model's own config.json says of its layers: `hybrid` (layers that keep a recurrent
    state - linear attention, Mamba, short convolutions - beside attention), `dense`, or None where
    there is no readable config.json. The engine advisories' `target` (configuration/advisories.py).
    """
    try:
        # Read by root in the GPU check: never wait on a fifo or read a device, whatever the name.
        fd = _os.open(_os.path.join(model_dir, "config.json"), _os.O_RDONLY | _os.O_NONBLOCK)
        with open(fd, "rb") as handle:
            if not _stat.S_ISREG(_os.fstat(fd).st_mode):
                return None
            config = _json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    for part in (config, config.get("text_config")):  # a multimodal wrapper holds its text model's
        if not isinstance(part, dict):
            continue
        layers = part.get("layer_types")
        if isinstance(layers, list) and any(str(k) not in ATTENTION_LAYERS for k in layers):
            return "hybrid"
        pattern = part.get("hybrid_override_pattern")  # Nemotron-H: M is a Mamba layer
        if isinstance(pattern, str) and "M" in pattern:
            return "hybrid"
        if any(key.startswith(("mamba_", "ssm_", "linear_conv_")) for key in part):
            return "hybrid"
    return "dense"
