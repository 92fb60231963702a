# Fact script: the serving venv's generations, read with the host's own python3 (stdlib only),
# so it works before any venv exists; on a converged host it comes in the host's one read
# (host_reads).
# argv: LIVE_PATH GENERATION_PATH HOST_CACHE UV_BINARY [fast|full|write-index]
#
# LIVE_PATH is what units run (`LIVE_PATH/bin/python`): a symlink to the live generation, or a
# plain venv directory from before generations existed. GENERATION_PATH is the generation this
# deploy wants. For each venv read (the wanted generation, and the live one when it is another
# directory) every distribution is listed from its .dist-info: name, version (local tag kept),
# installer, and the files its RECORD names that are damaged:
# - `fast` (the default): missing, another size than RECORD's, or - in a generation the deploy
#   stamped when it last installed into it (STAMP) - modified after that stamp and then
#   found to differ from RECORD's sha256 (only such files are hashed). A same-size edit whose mtime
#   was put back is not seen: that needs `full`. Without a stamp (a venv we did not build), size
#   only.
# - `full`: every file is hashed and compared with RECORD's sha256.
# Left out: bytecode; files a patch set replaced (the patch sets check their own sha256); files
# outside site-packages (bin/ scripts: a generation's copy rewrites their paths): presence only.
# Separately, files that share their inode with another path (st_nlink > 1: uv's cache or another
# generation, from a hard-linked install or copy) are counted as `linked`: an edit there would
# change them unseen, so the deploy reinstalls them as copies of their own.
# Files that two distributions both claim (two kernel builds owning `sgl_kernel/`) are reported.
#
# The listing (every RECORD's rows, each distribution's name, version and installer: this
# script's part _venv_listing.py, beside it) comes, in a fast check, from the generation's index
# (INDEX) when its .dist-info files are still those it was written from (their inode, size, mtime
# and ctime; the answer says "index": used, missing or stale); otherwise they are read. Either way
# the answer is the same: the index only spares reading and splitting every RECORD. The deploy
# writes it (`write-index`: the one mode that writes, run as a command of the venv operation, never
# as a read) after each install into a generation, and again where a check found it missing or
# stale.
#
# Trust (`untrusted`: a list of reasons, empty when none): root later runs LIVE_PATH/bin/python and
# installs from HOST_CACHE (uv and the wheels). LIVE_PATH (and where its link leads), the
# generations directory, the wanted generation and its bin/, HOST_CACHE, uv and every wheel in it
# must be root's, no symlink of another user, writable by root alone, as every directory above them:
# else another user (the service user, whose StateDirectory may hold a venv_path) could swap the
# interpreter. A few lstat calls; the wheels' lstat replaces the stat the cache listing made anyway.
import base64
import bisect
import functools
import glob
import json
import os
import stat
import sys

from _common import (  # noqa: E402 - remote.script puts _common.py here
    STAMP,
    file_digest,
    stat_untrusted,
    why_untrusted,
)
from _venv_listing import (  # noqa: E402 - remote.script puts _venv_listing.py here
    dist_infos,
    indexed_listing,
    listing_key,
    parse_listing,
    site_of,
    write_index,
)

live, wanted, host_cache, uv_binary = sys.argv[1:5]
mode = (sys.argv[5:6] or ["fast"])[0]
def python_version(venv):
    try:
        with open(os.path.join(venv, "pyvenv.cfg")) as handle:
            for line in handle:
                key, _, value = line.partition("=")
                if key.strip() in ("version", "version_info"):
                    return value.strip()
    except OSError:
        return None
    return None


def record_hash(path):
    """A file's hash the way RECORD writes it: sha256=<urlsafe base64, no padding>."""
    try:
        digest = file_digest(path)
    except OSError:
        return None
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def patched_files(venv):
    out = set()
    for record in glob.glob(os.path.join(venv, ".sglang-deploy", "patches", "*", "applied.json")):
        try:
            with open(record) as handle:
                out.update(json.load(handle).get("files", {}))
        except (OSError, ValueError):
            pass
    return out


def lstat_or_none(path, dir_fd=None):
    try:
        return os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None


def stat_pass(site, rels, sizes, hash_after, workers=None):
    """(stats, suspects): os.lstat of each RECORD path (None where it fails), and the sorted indexes
    of the rows that need the row-by-row rules: missing, another size than RECORD's (-1: none
    given), linked, or modified after `hash_after`. Where workers stat'ed the files, the others are
    only known to be there (PRESENT).

    This is most of a converged run's read (tens of thousands of files per venv): each directory is
    opened once and its files are stat'ed relative to it, by a C-level map where none fails. On a
    host with CPUs to spare (a GPU host has dozens) the rows are split in equal runs among forked
    workers, which group their own by directory and send back their suspects alone; on a small host,
    one pass here.
    """
    if workers is None:
        workers = stat_workers(len(rels))
    if workers > 1 and len(rels) > 1:
        return forked_stat_pass(site, rels, sizes, hash_after, workers)
    stats = stat_rows(site, rels)
    return stats, suspects_among(stats, sizes, hash_after)


PRESENT = True  # a file a worker saw and found no suspect: only its presence is used


def stat_workers(files):
    """Forked workers for a venv's stat pass: one below a few thousand files (a fork costs as much
    as some hundreds of stat calls), else half the CPUs this process may run on (the host's read
    runs other jobs beside it), at most 8. SGLANG_DEPLOY_STAT_WORKERS sets it (the unit tests
    compare both ways on a 2-CPU machine)."""
    forced = os.environ.get("SGLANG_DEPLOY_STAT_WORKERS", "")
    if forced.isdigit() and int(forced) > 0:
        return int(forced)
    if files < 8000:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus // 2))


def stat_rows(site, rels):
    """The lstat of each of `rels` (None where the file is not there), in order.

    Each directory is opened once and its files stat'ed by name; a path outside site-packages (`..`)
    or not normalised is stat'ed whole."""
    out = [None] * len(rels)
    groups = {}
    for i, rel in enumerate(rels):
        if rel.startswith("..") or "/./" in rel or "//" in rel:
            out[i] = lstat_or_none(os.path.normpath(os.path.join(site, rel)))
            continue
        head, _, name = rel.rpartition("/")
        group = groups.get(head)
        if group is None:
            group = groups[head] = ([], [])
        group[0].append(i)
        group[1].append(name)
    for head, (indexes, names) in groups.items():
        try:
            fd = os.open(os.path.join(site, head),
                         os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_PATH", 0))
        except OSError:
            continue  # a directory gone: none of its files is there
        try:
            try:
                stats = list(
                    map(functools.partial(os.stat, dir_fd=fd, follow_symlinks=False), names))
            except OSError:
                stats = [lstat_or_none(name, fd) for name in names]
        finally:
            os.close(fd)
        for i, st in zip(indexes, stats):
            out[i] = st
    return out


def suspects_among(stats, sizes, hash_after):
    """The indexes whose stat fails the one-line test."""
    return [i for i, (st, size) in enumerate(zip(stats, sizes))
            if st is None or st.st_size != size or st.st_nlink > 1 or st.st_mtime_ns > hash_after]


def run_suspects(site, rels, sizes, hash_after, start, end):
    """A worker's answer for rows [start, end): {index: None (missing) | (mode, size, nlink,
    mtime_ns)} of its suspects."""
    stats = stat_rows(site, rels[start:end])
    sent = {}
    for i in suspects_among(stats, sizes[start:end], hash_after):
        st = stats[i]
        sent[start + i] = (None if st is None
                           else (st.st_mode, st.st_size, st.st_nlink, st.st_mtime_ns))
    return sent


class Seen:
    """A suspect's stat as a worker sent it back: all that the row rules read."""

    __slots__ = ("st_mode", "st_size", "st_nlink", "st_mtime_ns")

    def __init__(self, st_mode, st_size, st_nlink, st_mtime_ns):
        self.st_mode, self.st_size, self.st_nlink, self.st_mtime_ns = (st_mode, st_size,
                                                                       st_nlink, st_mtime_ns)


def forked_stat_pass(site, rels, sizes, hash_after, workers):
    """stat_pass over `workers` forked processes, each given an equal run of rows; a run whose
    worker could not start or failed is stat'ed here."""
    import marshal

    bounds = [len(rels) * k // workers for k in range(workers + 1)]
    children = []
    for start, end in zip(bounds, bounds[1:]):
        read_end = write_end = None
        try:
            read_end, write_end = os.pipe()
            pid = os.fork()
        except OSError:
            for fd in (read_end, write_end):
                if fd is not None:
                    os.close(fd)
            children.append((None, None, start, end))
            continue
        if pid == 0:
            status = 1
            try:
                os.close(read_end)
                view = memoryview(
                    marshal.dumps(run_suspects(site, rels, sizes, hash_after, start, end)))
                while view:
                    view = view[os.write(write_end, view):]
                status = 0
            finally:
                # never the parent's exit path: its buffered output is the parent's to write
                os._exit(status)
        os.close(write_end)
        children.append((pid, read_end, start, end))
    stats = [PRESENT] * len(rels)
    suspects = []
    for pid, read_end, start, end in children:
        sent = None
        if pid is not None:
            with os.fdopen(read_end, "rb") as reader:
                data = reader.read()
            _, wait_status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(wait_status) == 0:
                try:
                    sent = marshal.loads(data)
                except (EOFError, ValueError, TypeError):
                    sent = None
        if sent is None:  # no worker could start, or it failed: its rows are stat'ed here
            sent = run_suspects(site, rels, sizes, hash_after, start, end)
        for i, values in sent.items():
            stats[i] = None if values is None else Seen(*values)
            suspects.append(i)
    suspects.sort()
    return stats, suspects


def read_venv(venv):
    python = python_version(venv)
    if python is None:
        return None
    site = site_of(venv)
    patched = patched_files(venv)
    try:
        stamp = os.lstat(os.path.join(venv, STAMP)).st_mtime_ns
    except OSError:
        stamp = None
    # Files modified after this are hashed (`fast`); `full` hashes every file (a time no file
    # reaches = none).
    hash_after = -1 if mode == "full" else stamp if stamp is not None else float("inf")
    # Every distribution's RECORD rows: from the index the deploy wrote at its last install into
    # this generation, while the .dist-info files are those it was written from; else (and in a
    # `full` check) read.
    infos = dist_infos(site)
    listing, index = None, "not used"
    # without site-packages there is nothing to index (nor to write)
    if mode != "full" and site is not None:
        listing, index = indexed_listing(venv, listing_key(site, infos))
    dists_listed, all_rels, all_hashes, size_texts = listing or parse_listing(infos)
    all_sizes = [int(text) if text.isdigit() else -1 for text in size_texts]
    # Tens of thousands of files per venv, on every converged run: every distribution's files are
    # stat'ed in one pass (split among forked workers on a host with CPUs to spare), and only the
    # rows that pass a one-line test (missing, other size, linked, modified after the stamp, or no
    # size in RECORD) go through the row-by-row rules below.
    all_stats, all_suspects = stat_pass(site, all_rels, all_sizes, hash_after)
    bounds, start = [], 0
    for dist in dists_listed:
        bounds.append((start, start + dist[4]))
        start += dist[4]
    # Paths that more than one distribution lists: {rel: {distribution's position: its (last) row
    # listing rel}}.
    multi = {}
    if len(set(all_rels)) < len(all_rels):
        seen, twice = set(), set()
        for rel in all_rels:
            if rel in seen:
                twice.add(rel)
            seen.add(rel)
        for position, (first, end) in enumerate(bounds):
            for i in range(first, end):
                if all_rels[i] in twice:
                    multi.setdefault(all_rels[i], {})[position] = i
        multi = {rel: rows for rel, rows in multi.items() if len(rows) > 1}
    dists, to_hash = {}, []
    for (dist_name, version, installer, has_record, _), (first, end) in zip(dists_listed, bounds):
        suspects = all_suspects[
            bisect.bisect_left(all_suspects, first):bisect.bisect_left(all_suspects, end)]
        damaged, linked = [], []
        for i in suspects:
            rel, st = all_rels[i], all_stats[i]
            if st is None:
                damaged.append((rel, None, None))
                continue
            if rel in patched:
                continue
            # Scripts outside site-packages (bin/) name their venv's path, which a generation's
            # copy rewrites: for them only presence counts.
            if not stat.S_ISREG(st.st_mode):
                if not rel.startswith(".."):
                    # a wheel installs files only: a symlink or directory is not its
                    damaged.append((rel, None, None))
                continue
            if st.st_nlink > 1:
                linked.append(rel)
            if rel.startswith(".."):
                continue
            if all_sizes[i] >= 0 and all_sizes[i] != st.st_size:
                damaged.append((rel, str(st.st_size), None))
                continue
            expected = all_hashes[i] if all_hashes[i].startswith("sha256=") else None
            if expected and st.st_mtime_ns > hash_after:
                to_hash.append((os.path.normpath(os.path.join(site, rel)), expected, damaged, rel))
        dists[dist_name] = {
            "version": version,
            "installer": installer,
            "files": end - first,
            "record": has_record,
            "damaged": damaged,
            "linked": linked,
        }
    if to_hash:
        # Hashing is most of a full check's time; hashlib releases the GIL on large buffers.
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
            for (path, expected, damaged, rel), digest in zip(
                    to_hash, pool.map(record_hash, [t[0] for t in to_hash])):
                if digest != expected:
                    damaged.append((rel, None, digest))

    def claims(rel):
        """(distribution, RECORD size, RECORD hash) of each that ships `rel`, present, with a size
        (a claim)."""
        out = []
        for position, i in sorted(multi.get(rel, {}).items()):
            if (all_stats[i] is not None and size_texts[i] not in ("", "0")
                    and not rel.startswith("..") and ".dist-info/" not in rel):
                out.append((dists_listed[position][0], size_texts[i], all_hashes[i]))
        return out

    for dist in dists.values():
        # A file two wheels both ship (sglang 0.5.11's flashinfer-python and torch-c-dlpack-ext
        # each carry their own top-level build_backend.py) holds the copy installed last: it is
        # right if it matches another claimant's RECORD (its size, or its hash where hashed).
        damaged = [
            rel for rel, size, digest in dist["damaged"]
            if (size is None and digest is None)
            or not any((size is not None and size == s) or (digest is not None and digest == h)
                       for _, s, h in claims(rel))
        ]
        dist["damaged_count"] = len(damaged)
        dist["damaged"] = damaged[:5]
        dist["linked_count"] = len(dist["linked"])
        dist["linked"] = dist["linked"][:5]
    shared = {}
    for rel in multi:
        # Two distributions owning one package directory (two kernel builds, both `sgl_kernel/`)
        # is a conflict; a loose top-level file both ship is not one (see above).
        owners = {dist_name for dist_name, _, _ in claims(rel)}
        if "/" in rel and len(owners) > 1:
            shared.setdefault(rel.split("/", 1)[0], set()).update(owners)
    return {
        "path": venv,
        "python": python,
        # What the check compared, for the log: a fast check of an unstamped venv compares sizes
        # only.
        "checked": "sha256" if mode == "full" else "size, mtime" if stamp is not None else "size",
        "hashed": len(to_hash),
        "index": index,
        "dists": dists,
        "shared": {top: sorted(owners) for top, owners in sorted(shared.items())},
    }


if mode == "write-index":
    written, why = write_index(wanted)
    print(json.dumps({"written": written, "why": why}))
    sys.exit(0)

if os.path.islink(live):
    kind, target = "link", os.path.realpath(live)
elif os.path.isdir(live):
    kind, target = "dir", os.path.realpath(live)
elif os.path.lexists(live):
    kind, target = "other", None
else:
    kind, target = "absent", None



def untrusted_paths():
    """Why root may not run or install from what this read covers (see the top): one line per path,
    [] when none."""
    # A symlink of root's (venv_path itself; a donor's venv read through it; bin/python) is followed
    # and where it leads judged the same way.
    paths = [live, live + ".generations", wanted, os.path.join(wanted, "bin"),
             os.path.join(wanted, "bin", "python"), host_cache, uv_binary]
    found = [why_untrusted(path, link_ok=True) for path in paths]
    return list(dict.fromkeys(why for why in found if why))


def wheel_cache():
    """{wheel: size} of the host's wheel cache, and why root may not install any of them (lstat:
    never followed)."""
    sizes, untrusted = {}, []
    try:
        names = [n for n in os.listdir(host_cache) if n.endswith(".whl")]
    except OSError:
        return sizes, untrusted
    for name in names:
        path = os.path.join(host_cache, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        sizes[name] = st.st_size
        why = stat_untrusted(path, st)
        if why:
            untrusted.append(why)
    return sizes, untrusted


wanted_state = read_venv(wanted)
live_state = read_venv(target) if target and target != os.path.realpath(wanted) else None
cache, untrusted_wheels = wheel_cache()
print(json.dumps({
    "machine": os.uname().machine,  # what platform.machine() says, without importing it
    "live": {"kind": kind, "target": target},
    "wanted": wanted_state,
    "live_state": live_state,
    "cache": cache,
    "uv": os.access(uv_binary, os.X_OK),
    "untrusted": untrusted_paths() + sorted(untrusted_wheels),
}))
