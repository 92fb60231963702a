# Fact script: describe a model's source directory and its staged copy, as one JSON line.
# argv: SRC DEST MARKER_NAME [full]
# Cheap by default (`fast`): names, sizes and mtimes, and the source's cached manifest (valid for
# a file while its size and mtime are unchanged). A staged file modified after its marker was
# written (the stage script gives every file its source's mtime, then writes the marker) was
# written after staging: those files alone are hashed (`suspect_hashes`). A same-size edit whose
# mtime was put back is not seen that way. With `full`, every staged file is re-hashed (sha256),
# for `verify_models: full`.
# Trust: `untrusted` says why the staged copy may not be served (a symlink, another owner, a write
# bit for others, on it, its marker, a file or directory in it, or a directory above it),
# `src_untrusted` the same of the source; from the lstat results the listing reads anyway, plus one
# lstat per directory and per parent. Each directory is judged before it is read: one that is not
# root's (another user's in /dev/shm, a link) is not walked at all (listed as {}), and a walk
# follows no link and stops past _common's depth and entry bounds with a judgement ("deeper than 32
# levels"), never a crash or an endless read.
import json
import os
import sys

from _common import (  # noqa: E402 - remote.script puts _common.py here
    Unwalkable,
    beside_model,
    manifest_paths,
    sha256_file,
    stat_untrusted,
    tree_untrusted,
    walk_files,
    why_untrusted,
)

src, dest, marker_name = sys.argv[1:4]
src = src.rstrip("/") or "/"
full = sys.argv[4:5] == ["full"]


def read_tree(root):
    """(listing, why root may not trust it) of the directory `root` (see the top): (None, None) when
    it is absent or no directory; ({}, why), unread, when it may not be trusted; else its listing,
    walked."""
    if not os.path.lexists(root):
        return None, None
    why = why_untrusted(root)  # before anything in it is read: lstat, the directories above
    if why:
        return {}, why
    dirs = {}
    try:
        listing = walk_files(root, skip=lambda rel, name: beside_model(rel, name, marker_name),
                             dirs_seen=dirs)
    except Unwalkable as exc:
        return {}, str(exc)
    if listing is None:
        return None, None
    return listing, tree_untrusted(root, listing, dirs)


def source_hashes(listing):
    """{relpath: sha256} from the cached manifest if it covers every file unchanged, else None."""
    for path in manifest_paths(src):
        if why_untrusted(path):
            continue
        try:
            with open(path) as handle:
                entries = json.load(handle)["files"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not isinstance(entries, dict):
            continue
        fresh = all(
            isinstance(entries.get(rel), dict)
            and (entries[rel].get("size"), entries[rel].get("mtime_ns"))
            == (st.st_size, st.st_mtime_ns) and "sha256" in entries[rel]
            for rel, st in listing.items()
        )
        if fresh:
            return {rel: entries[rel]["sha256"] for rel in listing}
    return None


source, source_untrusted = read_tree(src)
staged, dest_untrusted = read_tree(dest)
marker_path = os.path.join(dest, marker_name)
if staged is not None and not dest_untrusted and os.path.lexists(marker_path):
    dest_untrusted = stat_untrusted(marker_path, os.lstat(marker_path))
marker = None
# Nothing in an untrusted copy is opened: its owner may have made any name a FIFO (a read that never
# ends).
if staged is not None and not dest_untrusted and os.path.isfile(marker_path):
    try:
        with open(os.path.join(dest, marker_name)) as handle:
            marker = json.load(handle)
    except ValueError:
        marker = {"corrupt": True}
parent = os.path.dirname(dest.rstrip("/")) or "/"
free = None
if os.path.isdir(parent):
    st = os.statvfs(parent)
    free = st.f_bavail * st.f_frsize
out = {
    "src": None if source is None else {rel: st.st_size for rel, st in source.items()},
    "src_hashes": None if source is None else source_hashes(source),
    "dest": None if staged is None else {rel: st.st_size for rel, st in staged.items()},
    "marker": marker,
    "free": free,
    "untrusted": dest_untrusted,
    "src_untrusted": source_untrusted,
}
if dest_untrusted:
    names = []
elif full and staged:
    names = sorted(staged)
elif staged and marker is not None:
    written = os.lstat(os.path.join(dest, marker_name)).st_mtime_ns
    names = sorted(rel for rel, st in staged.items()
                   if rel in (marker.get("files") or {}) and st.st_mtime_ns > written)
else:
    names = []
if names:
    # Imported only when files are hashed: concurrent.futures brings logging and traceback into
    # every host's read.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
        hashes = dict(zip(names, pool.map(lambda rel: sha256_file(os.path.join(dest, rel)), names)))
    out["dest_hashes" if full else "suspect_hashes"] = hashes
print(json.dumps(out))
