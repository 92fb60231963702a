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
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

from _common import (  # noqa: E402 - remote.script puts _common.py here
    JOURNAL_NAME,
    PART_SUFFIX,
    UntrustedPath,
    Unwalkable,
    beside_model,
    exchange,
    make_dir,
    make_dirs,
    manifest_paths,
    new_file,
    parents_untrusted,
    private_dir,
    stat_untrusted,
    tree_untrusted,
    walk_files,
    why_untrusted,
)

# One staging at a time per host (the deploy's and the boot unit's): a lock file in a directory of
# the deploy's own that root alone may enter (0700, made by private_dir). Never in /run/lock or the
# shm dir: a name there anyone can make first, and hold, and staging, the boot unit and the deploy
# would wait on it. /run empties at boot. (Run unprivileged, as some unit tests are, a directory of
# that user's.)
RUN_DIR = ("/run/sglang-deploy" if os.geteuid() == 0
           else os.path.join(os.path.expanduser("~"), ".cache", "sglang-deploy", "run"))
LOCK_PATH = os.path.join(RUN_DIR, "stage.lock")
# The latest progress line, for the deploy's progress watch (operations/model/models.py:
# STAGING_PROGRESS names the same file); in RUN_DIR, root's alone, removed when the copy ends.
PROGRESS_PATH = os.path.join(RUN_DIR, "staging.progress")
BLOCK = 1 << 22
WORKERS = max(1, min(8, os.cpu_count() or 1))
GIB = 1 << 30
TEST_HOOK_DIR = "/run/sglang-deploy-test"
HOLD_LIMIT_S = 600


class StageError(Exception):
    pass


def human(n):
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


# Listing and manifest ------------------------------------------------------------------


def walk(root, skip=()):
    """{relpath: os.stat_result} of the regular files under root, our own files left out."""
    try:
        out = walk_files(root, skip=lambda rel, name: rel in skip or beside_model(rel, name)) or {}
    except Unwalkable as exc:
        raise StageError(f"{exc}: a model is a few levels of files") from None
    for rel, st in out.items():
        if not stat.S_ISREG(st.st_mode):
            raise StageError(f"{os.path.join(root, rel)}: only regular files can be staged (found "
                             "a link or special file)")
    return out


def load_manifest(src):
    """The cached manifest's file entries (the first readable and trusted of the two places), or
    {}."""
    for path in manifest_paths(src):
        if why_untrusted(path):
            continue  # another user's file would tell root which hashes to skip
        try:
            with open(path) as handle:
                data = json.load(handle)
            if data.get("version") == 1 and isinstance(data.get("files"), dict):
                return data["files"]
        except (OSError, ValueError, AttributeError):
            continue
    return {}


def save_manifest(src, entries):
    body = json.dumps({"version": 1, "source": src, "files": entries}, sort_keys=True, indent=0)
    for path in manifest_paths(src):
        if why_untrusted(path):
            continue  # never written through a place another user could redirect
        try:
            with open(path) as handle:
                if handle.read() == body:
                    return path
        except OSError:
            pass
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            make_dirs(os.path.dirname(path), 0o755)
            with new_file(tmp) as handle:
                handle.write(body)
            os.rename(tmp, path)
            return path
        except UntrustedPath:
            continue  # a directory on the way that is not root's: never written through
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC):
                raise
    return None


def fresh(entry, st):
    return (bool(entry) and entry.get("size") == st.st_size
            and entry.get("mtime_ns") == st.st_mtime_ns and "sha256" in entry and "crc32" in entry)


def hash_file(path, want_sha=True, want_crc=True):
    sha = hashlib.sha256() if want_sha else None
    crc = 0
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as reader:
        while True:
            n = reader.readinto(buf)
            if not n:
                break
            if sha is not None:
                sha.update(view[:n])
            if want_crc:
                crc = zlib.crc32(view[:n], crc)
    return (sha.hexdigest() if sha is not None else None), crc


def read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def read_journal(path):
    entries = {}
    try:
        with open(path) as handle:
            for line in handle:
                try:
                    rel, size, sha, crc = json.loads(line)
                except ValueError:
                    break  # a line cut by the interruption
                entries[rel] = (size, sha, crc)
    except OSError:
        return None
    return entries


def ours(path, marker_name):
    return (os.path.isfile(os.path.join(path, marker_name))
            or os.path.isfile(os.path.join(path, JOURNAL_NAME)))


def tree_distrusted(path):
    """Why a directory (`.NAME.partial`, `.NAME.old`, a source) and everything in it may not be
    trusted, or None."""
    why = why_untrusted(path)  # judged before anything in it is read
    if why or not os.path.isdir(path):
        return why
    dirs = {}
    try:
        files = walk_files(path, dirs_seen=dirs)
    except Unwalkable as exc:
        return str(exc)
    return tree_untrusted(path, files or {}, dirs)


def staged_distrusted(dest, marker_name):
    """(why DEST may not be used at all, or None; its files to copy again instead of linking).

    DEST, its subdirectories and its marker must be root's (a copied marker in another user's
    directory proves nothing). A regular file in it that is not (another owner, a write bit for
    others: only root can have done that, e.g. an older deploy that kept a 0666 source's mode) is
    copied again; without our marker any such file makes the directory untrusted.
    """
    why = why_untrusted(dest)
    if why:
        return why, set()
    if not os.path.isdir(dest):
        return f"{dest}: not a directory", set()
    dirs = {}
    try:
        files = walk_files(dest, dirs_seen=dirs) or {}
    except Unwalkable as exc:
        return str(exc), set()
    why = tree_untrusted(dest, {}, dirs)
    bad = {rel: stat_untrusted(os.path.join(dest, rel), st) for rel, st in files.items()}
    bad = {rel: reason for rel, reason in bad.items() if reason}
    links = [rel for rel, st in files.items() if stat.S_ISLNK(st.st_mode)]
    if why or links or marker_name in bad or (bad and marker_name not in files):
        return why or next(iter(bad.values())), set()
    return None, set(bad)


def set_aside(path, why):
    """Rename an untrusted entry of the shm dir out of the way: never deleted, it may be someone's
    data."""
    parent, name = os.path.split(path.rstrip("/"))
    aside = os.path.join(
        parent, f".{name.lstrip('.')}.untrusted-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    os.rename(path, aside)
    print(f"{why}: not trusted, so never served, resumed or deleted; moved aside to {aside} "
          "(remove it once you know whose it is)")
    return aside


def rename_noreplace(src, dst):
    """rename(2) that fails (FileExistsError) where anything is at `dst`: a name in the shm dir is
    never taken over from whoever made it since it was judged (a plain rename would replace an empty
    directory, and fail on others)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:  # glibc < 2.28: checked first, then renamed
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
        os.rename(src, dst)
        return
    at_fdcwd, noreplace = -100, 1
    if renameat2(at_fdcwd, src.encode(), at_fdcwd, dst.encode(), noreplace) != 0:
        err = ctypes.get_errno()
        if err == errno.EINVAL:  # a filesystem without the flag
            if os.path.lexists(dst):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
            os.rename(src, dst)
            return
        raise OSError(err, os.strerror(err), f"{src} -> {dst}")


def place(src, dst):
    """Rename `src` to the name `dst` in the shm dir; whatever someone made there meanwhile is moved
    aside first."""
    for _attempt in range(3):
        try:
            return rename_noreplace(src, dst)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise
        set_aside(dst,
                  why_untrusted(dst) or f"{dst}: appeared while staging (not made by this run)")
    raise StageError(f"{dst} keeps appearing while staging (not made by this run): find whose it "
                     "is, then run again")


def test_hold(name):
    """The test hook described at the top: hold this model's staging while the test's hold file
    names it."""
    hold = os.path.join(TEST_HOOK_DIR, "hold-staging")
    try:
        with open(hold) as handle:
            wanted = handle.readline().strip()
    except OSError:
        return
    if wanted != name:
        return
    print(f"{name}: held by the test hook {hold} (remove it to go on)", file=sys.stderr, flush=True)
    reached = os.path.join(TEST_HOOK_DIR, "reached-staging")
    with open(reached + ".tmp", "w") as handle:
        handle.write(f"{name} {os.getpid()}\n")
    os.rename(reached + ".tmp", reached)
    deadline = time.monotonic() + HOLD_LIMIT_S
    while os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)


# Progress ------------------------------------------------------------------------------


class Progress:
    def __init__(self, name, total, interval):
        self.name, self.total, self.interval = name, total, interval
        self.done = 0
        self.lock = threading.Lock()
        self.start = time.monotonic()
        self.stop = threading.Event()
        self.thread = None
        if interval > 0 and total > 0:
            self.thread = threading.Thread(target=self.run, daemon=True)
            self.thread.start()

    def add(self, n):
        with self.lock:
            self.done += n

    def line(self):
        elapsed = max(time.monotonic() - self.start, 1e-6)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        pct = 100 * self.done / self.total if self.total else 100
        eta_text = f"{eta:.0f} s" if eta != float("inf") else "?"
        return (f"staging {self.name}: {human(self.done)} of {human(self.total)} ({pct:.0f}%), "
                f"{human(rate)}/s, ETA {eta_text}")

    def run(self):
        while not self.stop.wait(self.interval):
            line = self.line()
            print(line, file=sys.stderr, flush=True)
            self.keep(line)

    @staticmethod
    def keep(line):
        """The line, whole, in PROGRESS_PATH (written beside and renamed over it)."""
        partial = PROGRESS_PATH + ".partial"
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(line + "\n")
            os.replace(partial, PROGRESS_PATH)
        except OSError:
            pass  # progress is a courtesy: the copy goes on without it

    def close(self):
        self.stop.set()
        if self.thread:
            self.thread.join()
            for path in (PROGRESS_PATH, PROGRESS_PATH + ".partial"):
                try:
                    os.unlink(path)
                except OSError:
                    pass


# Copy ----------------------------------------------------------------------------------


def copy_file(src_path, target, st, entry, want_sha, progress):
    """Copy src_path to target's temp name, checking it against the manifest entry; then rename to
    target."""
    make_dirs(os.path.dirname(target), 0o755)
    tmp = target + PART_SUFFIX
    sha = hashlib.sha256() if want_sha else None
    crc = 0
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    written = 0
    with open(src_path, "rb", buffering=0) as reader, new_file(tmp, 0o600, binary=True) as writer:
        try:
            os.posix_fadvise(reader.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        while True:
            n = reader.readinto(buf)
            if not n:
                break
            chunk = view[:n]
            if sha is not None:
                sha.update(chunk)
            crc = zlib.crc32(chunk, crc)
            while chunk:
                chunk = chunk[writer.write(chunk):]
            written += n
            progress.add(n)
    if written != st.st_size:
        os.unlink(tmp)
        raise StageError(f"{src_path} changed while it was copied ({st.st_size} bytes listed, "
                         f"{written} read): run again")
    if entry is not None and entry["crc32"] != crc:
        os.unlink(tmp)
        raise StageError(
            f"{src_path} does not match its manifest (crc32 {crc:08x}, manifest "
            f"{entry['crc32']:08x}) although its size and mtime are unchanged: the source is "
            "damaged or was edited in place; check it, then delete its manifest "
            f"({' or '.join(manifest_paths(os.path.dirname(src_path)))}) to hash it again"
        )
    os.chmod(tmp, served_mode(st.st_mode))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.rename(tmp, target)
    if entry is None:
        entry = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                 "sha256": sha.hexdigest(), "crc32": crc}
    elif sha is not None and sha.hexdigest() != entry["sha256"]:
        raise StageError(f"{src_path} does not match its manifest (sha256): the source is damaged "
                         "or was edited in place")
    return entry


def served_mode(mode):
    """A staged file's mode: the source's read (and execute) bits; writable by root alone, no set-id
    bits."""
    return stat.S_IMODE(mode) & 0o755


def swapped(a, b):
    """Swap two paths atomically, so that b is never missing; False where the kernel or libc
    cannot."""
    try:
        exchange(a, b)
        return True
    except OSError:
        return False


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
