#!/usr/bin/env python3
# Stage a model directory from the model store into the shm dir: verified, atomic, incremental.
#
#   stage_model.py SRC DEST MARKER [--verify fast|full] [--also SRC2 DEST2]... [--progress SECONDS]
#   stage_model.py --list /etc/sglang-deploy/models.json (the boot unit: every model in the list)
#
# Run by the deploy (`python3 - ARGS`, stdlib only) and, installed on the host, by the boot unit:
# the same code, manifest and verification in both places.
#
# Manifest: per file of SRC its size, mtime, sha256 (identity) and crc32 (copy check), cached in
# SRC/.sglang-deploy-manifest.json (or under /var/cache/sglang-deploy/manifests/ if SRC is
# read-only) and reused for every file whose size and mtime are unchanged. The cache file is the
# only thing ever written into SRC.
#
# Atomic: the new copy is built in DEST's sibling `.NAME.partial`. Files that are already right in
# DEST are hard-linked (same inode, no copy); the others are copied to `<file>.sglang-part`, checked
# against the manifest and renamed; each finished file is journaled, so an interrupted run resumes
# where it stopped. The marker (the staged manifest, our ownership mark) is written last, then the
# directory replaces DEST by rename. DEST is always either the previous copy or the complete new
# one.
#
# Trust (README "Models in RAM"): the shm dir is world-writable. A DEST, `.NAME.partial` or
# `.NAME.old` that is not root's throughout (a symlink, another owner, writable by others: made by
# another local user or by the engine) is never served, resumed or deleted: it is renamed aside
# (`.NAME.untrusted-TIME`) and the model staged afresh. The source and the directories above it must
# be root's too (root reads them, and writes the manifest beside them); a symlink in the source is
# refused (root would copy what it points at into a directory others can read). Staged files keep
# the source's read bits, never a write bit but root's. What root makes here it makes exclusively
# and checks on the handle (_common.make_dirs, make_dir, new_file): the shm dir itself when missing
# (a name another user took first in a world-writable directory is moved aside the same way),
# `.NAME.partial`, every directory and file in it. Trees are read without following a link and only
# so deep and so large (_common.walk_files): past that, a judgement, never a crash. The staging lock
# lies in a directory of root's alone (RUN_DIR), never in a world-writable one where anyone could
# take its name.
#
# Test hook (tests/lab/test_faults.py): a file /run/sglang-deploy-test/hold-staging whose first line
# names the model (DEST's basename) holds that model's staging once its `.NAME.partial` exists and
# before the first byte is copied: the script writes .../reached-staging ("NAME PID") and waits
# until the hold file is removed, at most HOLD_LIMIT_S. Nothing in the deploy creates that
# directory; /run is a root-only tmpfs, emptied at boot; a hold that is never released only delays,
# and says so on stderr.
import argparse
import fcntl
import json
import os
import shutil
import stat
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from _common import (  # noqa: E402 - remote.script puts _common.py here
    JOURNAL_NAME,
    PART_SUFFIX,
    UntrustedPath,
    Unwalkable,
    beside_model,
    make_dir,
    make_dirs,
    new_file,
    parents_untrusted,
    private_dir,
    walk_files,
    why_untrusted,
)
from _stage_files import (  # noqa: E402 - remote.script puts _stage_files.py here
    LOCK_PATH,
    RUN_DIR,
    WORKERS,
    Progress,
    StageError,
    copy_file,
    fresh,
    hash_file,
    human,
    load_manifest,
    ours,
    place,
    read_journal,
    read_json,
    save_manifest,
    set_aside,
    staged_distrusted,
    swapped,
    test_hold,
    tree_distrusted,
    walk,
)

# Staging -------------------------------------------------------------------------------


def pending_bytes(src, dest, marker_name):
    """Bytes still to copy for a model, from names and sizes only (for the free-space check)."""
    if not os.path.isdir(src):
        return 0
    listing = walk(src)
    # An untrusted copy is staged afresh: all of it counts.
    marker = (read_json(os.path.join(dest, marker_name))
              if os.path.isdir(dest) and not why_untrusted(dest) else None)
    staged = (marker or {}).get("files") or {}
    partial = os.path.join(os.path.dirname(dest.rstrip("/")),
                           f".{os.path.basename(dest.rstrip('/'))}.partial")
    journal = (read_journal(os.path.join(partial, JOURNAL_NAME)) if not why_untrusted(partial)
               else None) or {}
    need = 0
    for rel, st in listing.items():
        present = (rel in staged and _size(os.path.join(dest, rel)) == st.st_size) or (
            rel in journal and _size(os.path.join(partial, rel)) == st.st_size
        )
        if not present:
            need += st.st_size
    return need


def _size(path):
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def mem_available():
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def hash_many(paths, want_crc=True):
    if not paths:
        return {}
    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(zip(paths, pool.map(lambda p: hash_file(p, True, want_crc), paths)))


def digests(src):
    """{relpath: [size, sha256]} (a link: ["symlink", target]) of the model at SRC, as the origin of
    a copy to another host
    (operations/model/model_digests.py): the cached manifest's entries where a file is unchanged
    since it was hashed (size and mtime), the rest hashed now (and cached, as staging does)."""
    try:
        # our own files left out, as the store's listing leaves them
        # (model/on_host/model_listing.py)
        found = walk_files(src, skip=lambda rel, name: name.startswith(".sglang-deploy-")
                           or beside_model(rel, name), follow_root=True)
    except Unwalkable as exc:
        raise StageError(f"{exc}: a model is a few levels of files") from None
    if not found:
        raise StageError(f"{src}: no model files there")
    links = {}
    for rel, st in list(found.items()):
        if stat.S_ISLNK(st.st_mode):  # listed as a link: the receiving end judges where it points
            links[rel] = ["symlink", os.readlink(os.path.join(src, rel))]
            del found[rel]
        elif not stat.S_ISREG(st.st_mode):
            raise StageError(f"{os.path.join(src, rel)}: a model holds files and links, not a "
                             "special file: remove it")
    cache = load_manifest(src)
    known = {rel: cache[rel] for rel, st in found.items() if fresh(cache.get(rel), st)}
    stale = sorted((rel for rel in found if rel not in known), key=lambda rel: -found[rel].st_size)
    hashed = hash_many([os.path.join(src, rel) for rel in stale])
    for rel in stale:
        sha, crc = hashed[os.path.join(src, rel)]
        known[rel] = {"size": found[rel].st_size, "mtime_ns": found[rel].st_mtime_ns,
                      "sha256": sha, "crc32": crc}
    if stale:
        save_manifest(src, known)
    return {**{rel: [known[rel]["size"], known[rel]["sha256"]] for rel in sorted(found)}, **links}


def stage(src, dest, marker_name, verify="fast", others=(), interval=5.0):
    # What root writes here the service reads: never writable by others, whatever umask the shell
    # gave.
    umask = os.umask(0o022)
    try:
        return stage_model(src, dest, marker_name, verify, others, interval)
    finally:
        os.umask(umask)


def stage_model(src, dest, marker_name, verify, others, interval):
    src = src.rstrip("/") or "/"
    dest = dest.rstrip("/")
    parent, name = os.path.split(dest)
    partial = os.path.join(parent, f".{name}.partial")
    old = os.path.join(parent, f".{name}.old")
    started = time.monotonic()
    if not os.path.isdir(src):
        raise StageError(f"model source {src} does not exist on this host: put the model there, or "
                         "fix `model`/`model_store` in the data")
    listing = walk(src, skip={marker_name})
    why = tree_distrusted(src)
    if not why:
        try:
            # The shm dir, made here when missing: exclusively and checked (a name another user made
            # first in a world-writable directory is moved aside), never judged by its path before a
            # later makedirs.
            make_dirs(parent, 0o755, set_aside=set_aside)
        except UntrustedPath as exc:
            why = str(exc)
    why = why or parents_untrusted(dest)
    if why:
        raise StageError(
            f"{why}: root copies the model from {src} into {parent}, which the service reads; it "
            "must be root's and writable by root alone, and so must the directories above both "
            "(chown root: / chmod go-w), then run again"
        )
    cache = load_manifest(src)
    known = {rel: cache[rel] for rel, st in listing.items() if fresh(cache.get(rel), st)}

    for leftover in (old, partial):
        why = tree_distrusted(leftover) if os.path.lexists(leftover) else None
        if why:
            set_aside(leftover, why)  # planted, journal and all: nothing in it is resumed
    if os.path.isdir(old) and ours(old, marker_name):
        shutil.rmtree(old)
    if os.path.isdir(partial):
        if not os.path.isfile(os.path.join(partial, JOURNAL_NAME)):
            if ours(partial, marker_name) or not os.listdir(partial):
                # a previous copy parked by an interrupted swap, or an empty start
                shutil.rmtree(partial)
            else:
                raise StageError(f"{partial} exists and was not made by sglang-deploy: move it "
                                 "away, then run again")

    staged = None  # marker of DEST: {rel: [size, sha256, crc32]}
    # files of DEST that are root's data but not fit to serve as they are (a write bit for others)
    copy_again = set()
    if os.path.lexists(dest):
        why, copy_again = staged_distrusted(dest, marker_name)
        if why:
            set_aside(dest, why)
    if os.path.isdir(dest):
        marker = read_json(os.path.join(dest, marker_name))
        if marker is not None and isinstance(marker.get("files"), dict):
            staged = marker["files"]
        else:
            return adopt(src, dest, marker_name, listing, known)
    journal = read_journal(os.path.join(partial, JOURNAL_NAME)) or {}

    # Files that may be reused need the source's hash first (the cache usually has it).
    def reusable_size(rel, st):
        return (staged and rel in staged and _size(os.path.join(dest, rel)) == st.st_size) or (
            rel in journal and _size(os.path.join(partial, rel)) == st.st_size
        )

    unknown = [rel for rel, st in listing.items() if rel not in known and reusable_size(rel, st)]
    hashed = hash_many([os.path.join(src, rel) for rel in unknown])
    for rel in unknown:
        sha, crc = hashed[os.path.join(src, rel)]
        known[rel] = {"size": listing[rel].st_size, "mtime_ns": listing[rel].st_mtime_ns,
                      "sha256": sha, "crc32": crc}
    dest_sha = {}
    if verify == "full" and staged:
        candidates = [r for r in listing
                      if r in staged and r in known and staged[r][1] == known[r]["sha256"]]
        hashed = hash_many([os.path.join(dest, r) for r in candidates], want_crc=False)
        dest_sha = {os.path.relpath(p, dest): v[0] for p, v in hashed.items()}

    keep, link, copy = [], [], []
    for rel, st in listing.items():
        entry = known.get(rel)
        if (entry and rel in journal and tuple(journal[rel][:2]) == (st.st_size, entry["sha256"])
                and _size(os.path.join(partial, rel)) == st.st_size):
            keep.append(rel)
        elif (
            entry and staged and rel in staged and rel not in copy_again
            and list(staged[rel][:2]) == [st.st_size, entry["sha256"]]
            and _size(os.path.join(dest, rel)) == st.st_size
            and (verify != "full" or dest_sha.get(rel) == entry["sha256"])
        ):
            link.append(rel)
        else:
            copy.append(rel)

    dest_files = walk(dest, skip={marker_name}) if staged is not None else {}
    if (staged is not None and not copy and not keep and set(dest_files) == set(listing)
            and set(staged) == set(listing)):
        save_manifest(src, {rel: known[rel] for rel in listing})
        if os.path.isdir(partial):
            shutil.rmtree(partial)
        print(f"{name}: already staged, {len(listing)} files verified against the manifest "
              f"({verify})")
        return {"copied": 0, "bytes": 0}

    # Free space: everything this host must still stage, this model and the others, before copying
    # anything.
    need_here = sum(listing[rel].st_size for rel in copy)
    need_others = {os.path.basename(d.rstrip("/")): pending_bytes(s, d, marker_name)
                   for s, d in others}
    need = need_here + sum(need_others.values())
    st = os.statvfs(parent)
    free = st.f_bavail * st.f_frsize
    memory = mem_available()
    short = [f"{parent} has {human(free)} free"] if need > free else []
    if memory is not None and need > memory:
        short.append(f"the host has {human(memory)} of memory available")
    if short:
        parts = ([f"{name} {human(need_here)}"]
                 + [f"{n} {human(b)}" for n, b in need_others.items() if b])
        raise StageError(
            f"not enough space to stage: {' and '.join(short)}, this host must stage {human(need)} "
            f"more ({', '.join(parts)}): free space there, give {parent} more room, or load a "
            "model from the store (`model_in: store`)"
        )

    if not os.path.isdir(partial):
        try:
            # not exist_ok: one made by someone else since the check above is not ours
            make_dir(partial, 0o755)
        except FileExistsError:
            raise StageError(
                f"{partial} appeared while staging (not made by this run): run again") from None
    journal_path = os.path.join(partial, JOURNAL_NAME)
    # Appended to (a resumed copy's journal is root's: judged above); never through a link.
    journal_file = os.fdopen(
        os.open(journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644), "a")
    try:
        leftovers = walk_files(
            partial, skip=lambda rel, entry_name: not entry_name.endswith(PART_SUFFIX)) or {}
    except Unwalkable as exc:
        journal_file.close()
        raise StageError(str(exc)) from None
    for rel in leftovers:
        os.unlink(os.path.join(partial, rel))
    journal_lock = threading.Lock()

    def journaled(rel, entry):
        with journal_lock:
            journal_file.write(
                json.dumps([rel, entry["size"], entry["sha256"], entry["crc32"]]) + "\n")
            journal_file.flush()

    for rel in link:
        target = os.path.join(partial, rel)
        make_dirs(os.path.dirname(target), 0o755)
        if os.path.lexists(target):
            os.unlink(target)
        os.link(os.path.join(dest, rel), target)
        journaled(rel, known[rel])

    test_hold(name)
    progress = Progress(name, need_here, interval)

    def one(rel):
        entry = copy_file(os.path.join(src, rel), os.path.join(partial, rel), listing[rel],
                          known.get(rel), verify == "full" or rel not in known, progress)
        known[rel] = entry
        journaled(rel, entry)

    try:
        with ThreadPoolExecutor(WORKERS) as pool:
            for future in [pool.submit(one, rel)
                           for rel in sorted(copy, key=lambda r: -listing[r].st_size)]:
                future.result()
    finally:
        progress.close()
        journal_file.close()
        save_manifest(src, {rel: known[rel] for rel in listing if rel in known})

    # Anything in the partial copy that the source no longer has goes before the marker is written.
    for rel in set(walk(partial, skip={JOURNAL_NAME, marker_name})) - set(listing):
        os.unlink(os.path.join(partial, rel))
    built = walk(partial, skip={JOURNAL_NAME, marker_name})
    wrong = sorted(rel for rel, st in listing.items()
                   if rel not in built or built[rel].st_size != st.st_size)
    if wrong:
        raise StageError(f"{partial}: {', '.join(wrong[:3])} missing or of the wrong size after "
                         "copying; nothing was replaced")
    files = {rel: [listing[rel].st_size, known[rel]["sha256"], known[rel]["crc32"]]
             for rel in listing}
    tmp_marker = os.path.join(partial, marker_name + ".tmp")
    with new_file(tmp_marker) as handle:
        json.dump({"source": src, "files": files}, handle, sort_keys=True)
    os.rename(tmp_marker, os.path.join(partial, marker_name))
    os.unlink(journal_path)
    why = why_untrusted(dest) if os.path.lexists(dest) else None
    if why:
        set_aside(dest, why)  # made since the check above: never swapped in as `old` and deleted
    if os.path.isdir(dest):
        if swapped(partial, dest):
            place(partial, old)
        else:
            place(dest, old)
            place(partial, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        place(partial, dest)
    elapsed = time.monotonic() - started
    rate = f", {human(need_here / elapsed)}/s" if need_here and elapsed > 0 else ""
    print(
        f"{name}: staged {len(listing)} files: {len(copy)} copied ({human(need_here)}), "
        f"{len(link) + len(keep)} kept; checked against the manifest in {elapsed:.1f} s{rate}"
    )
    return {"copied": len(copy), "bytes": need_here}


def adopt(src, dest, marker_name, listing, known):
    """DEST exists without our marker: take it over only if it is an exact copy; never delete it."""
    dest_files = walk(dest, skip={marker_name})
    same_names = (set(dest_files) == set(listing)
                  and all(dest_files[r].st_size == listing[r].st_size for r in listing))
    if same_names:
        for rel in [r for r in listing if r not in known]:
            sha, crc = hash_file(os.path.join(src, rel))
            st = listing[rel]
            known[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                          "sha256": sha, "crc32": crc}
        hashed = hash_many([os.path.join(dest, r) for r in listing], want_crc=False)
        if all(hashed[os.path.join(dest, r)][0] == known[r]["sha256"] for r in listing):
            save_manifest(src, known)
            files = {rel: [listing[rel].st_size, known[rel]["sha256"], known[rel]["crc32"]]
                     for rel in listing}
            tmp_marker = os.path.join(dest, marker_name + ".tmp")
            with new_file(tmp_marker) as handle:
                json.dump({"source": src, "files": files, "adopted": True}, handle, sort_keys=True)
            os.rename(tmp_marker, os.path.join(dest, marker_name))
            print(f"{os.path.basename(dest)}: an exact copy was already there; marked as staged")
            return {"copied": 0, "bytes": 0}
    raise StageError(
        f"{dest} exists but was not staged by sglang-deploy (no {marker_name}) and differs from "
        f"{src}: it is never removed by the deploy; move it away (or delete it), then run again"
    )


def main(argv):
    parser = argparse.ArgumentParser(prog="stage_model.py")
    parser.add_argument("src", nargs="?")
    parser.add_argument("dest", nargs="?")
    parser.add_argument("marker", nargs="?")
    parser.add_argument("--verify", choices=("fast", "full"), default="fast")
    parser.add_argument("--also", nargs=2, action="append", default=[], metavar=("SRC", "DEST"))
    parser.add_argument("--progress", type=float, default=5.0,
                        help="seconds between progress lines on stderr (0: none)")
    parser.add_argument("--list", help="stage every model of this JSON list (the boot unit)")
    parser.add_argument("--digests", metavar="SRC",
                        help="print {relpath: [size, sha256]} of the model at SRC (an origin)")
    args = parser.parse_args(argv)
    if args.digests:
        print(json.dumps(digests(args.digests)))
        return
    if args.list:
        spec = read_json(args.list)
        if not spec:
            raise StageError(f"{args.list} is missing or not valid JSON: run the deploy")
        jobs = [(m["src"], m["dest"]) for m in spec["models"]]
        marker, verify = spec["marker"], spec.get("verify", "fast")
    else:
        if not (args.src and args.dest and args.marker):
            parser.error("SRC DEST MARKER, or --list FILE")
        jobs = [(args.src, args.dest)] + [tuple(a) for a in args.also]
        jobs_to_run = jobs[:1]
        marker, verify = args.marker, args.verify
    try:
        private_dir(RUN_DIR)
    except UntrustedPath as exc:
        raise StageError(
            f"{exc}: the staging lock is kept there; move it away, then run again") from None
    with os.fdopen(os.open(LOCK_PATH, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                           0o600), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for i, (src, dest) in enumerate(jobs if args.list else jobs_to_run):
            # The first model checks free space for all of them, so a shortfall stops before any
            # copy.
            others = [j for j in jobs[i + 1:]] if args.list else jobs[1:]
            stage(src, dest, marker, verify, others, args.progress)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except StageError as exc:
        print(f"stage_model: {exc}", file=sys.stderr)
        sys.exit(1)
