# Part of stage_model.py (inlined into it by remote.script, as _common.py is): where staging
# keeps its lock and progress, the source's manifest and a staged copy's journal, whether a staged
# copy may be trusted, placing and copying one file, the test hold and the progress line.
# stage_model.py (beside it) says what staging does and why.

import errno
import hashlib
import json
import os
import stat
import sys
import threading
import time
import zlib

from _common import (  # noqa: E402 - remote.script puts _common.py here
    JOURNAL_NAME,
    PART_SUFFIX,
    UntrustedPath,
    Unwalkable,
    beside_model,
    exchange,
    make_dirs,
    manifest_paths,
    new_file,
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
