# Shared by the remote scripts (stdlib only). A script names what it uses on one line,
#     from _common import walk_files, sha256_file  # noqa: E402 - remote.script puts _common.py here
# and remote.script() puts this whole file in that line's place, so each script still travels
# and runs as one file (`python3 - ARGS`, or the boot unit's installed copy of stage_model.py).
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


# Trust (README "Threat model"): root reads, runs, serves or deletes only what root owns, what is no
# symlink, and what nobody else can write or swap: the entry itself and every directory above it.
# Anything else may have been put there by another local user or by the service user (the engine
# writes /dev/shm). What root makes itself it makes through make_dirs / make_dir / new_file: created
# exclusively (never exist_ok), then checked on the handle it got, so a name another user took first
# is refused, never used.
TRUSTED_UIDS = frozenset({0, _os.geteuid()})  # root; and whoever runs this (root on a host)


class UntrustedPath(PermissionError):
    """What make_dirs, make_dir and private_dir refuse; its text names the path, its owner and
    mode."""


def _owner(uid):
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _found(path, st, what):
    return (f"{path}: {what} (found: owner {_owner(st.st_uid)}, mode "
            f"{_stat.S_IMODE(st.st_mode):04o})")


def stat_untrusted(path, st):
    """Why one entry (its lstat) may not be trusted, or None: a symlink, another owner, writable by
    others."""
    if _stat.S_ISLNK(st.st_mode):
        return _found(path, st,
                      f"a symlink (to {_os.readlink(path) if _os.path.islink(path) else '?'}), "
                      "expected a file or directory of root's")
    if st.st_uid not in TRUSTED_UIDS:
        return _found(path, st, "not owned by root")
    if st.st_mode & 0o022:
        return _found(path, st, "writable by its group or others")
    return None


def _parent_untrusted(path, st):
    """A directory above a trusted path: root's, and writable by root alone, or sticky like /tmp and
    /dev/shm (there nobody but an entry's owner may rename or remove it)."""
    if not _stat.S_ISDIR(st.st_mode):
        return _found(path, st, "a parent that is not a directory")
    if st.st_uid not in TRUSTED_UIDS:
        return _found(path, st, "a parent directory not owned by root")
    if st.st_mode & 0o022 and not st.st_mode & _stat.S_ISVTX:
        return _found(path, st,
                      "a parent directory writable by its group or others, without the sticky bit")
    return None


def _absent_untrusted(path):
    """Why an absent `path` may not be counted on to be root's once it exists, or None. Under a
    directory only root can write, only root can make it. Under one others can write (a sticky
    /dev/shm, /tmp, /run/lock), whoever makes it first owns it and what root would put in it: root
    makes such a name only through make_dirs (or make_dir, new_file), which refuse one root did not
    make."""
    path = _os.path.abspath(path)
    parent = _os.path.dirname(path)
    try:
        # the directories above were judged already (a link of root's is followed)
        st = _os.stat(parent)
    except OSError:
        return None
    if st.st_mode & 0o022:
        return (f"{path}: absent, in {parent} (owner {_owner(st.st_uid)}, mode "
                f"{_stat.S_IMODE(st.st_mode):04o}), which others can write: whoever makes it first "
                "owns it, so it is trusted only as root makes it (make_dirs: exclusively, then "
                "checked)")
    return None


def parents_untrusted(path):
    """Why the directories above `path` may let someone else swap it, or None.

    Each directory from / down is lstat'ed; a symlink on the way must be root's, and the directories
    of where it leads are checked the same way. One that is missing is judged by
    `_absent_untrusted`: fine below a directory only root writes, not below one others can write. A
    few lstat calls: cheap enough for every read.
    """
    path = _os.path.abspath(path)
    parts = [p for p in path.split("/") if p][:-1]
    here = "/"
    for part in [None, *parts]:
        here = here if part is None else _os.path.join(here, part)
        try:
            st = _os.lstat(here)
        except FileNotFoundError:
            return _absent_untrusted(here)  # nothing further down exists yet
        if _stat.S_ISLNK(st.st_mode):
            if st.st_uid not in TRUSTED_UIDS:
                return _found(here, st, "a symlink on the path, not owned by root")
            # Where it leads, and every directory above that (parents_untrusted of a child of it).
            why = parents_untrusted(_os.path.join(_os.path.realpath(here), "-"))
        else:
            why = _parent_untrusted(here, st)
        if why:
            return why
    return None


def why_untrusted(path, link_ok=False):
    """None when root may trust `path` (read it, run it, serve it, delete it), else why not: the
    path, its owner and mode. An absent path is judged by its parents and by where it would be made:
    under a directory others can write (/dev/shm, /tmp) it is not trusted, as whoever makes it first
    owns it (`_absent_untrusted`). With `link_ok`, a symlink of root's is followed (the live venv
    link) and where it leads is judged the same way.
    """
    try:
        st = _os.lstat(path)
    except FileNotFoundError:
        return parents_untrusted(path) or _absent_untrusted(path)
    if link_ok and _stat.S_ISLNK(st.st_mode) and st.st_uid in TRUSTED_UIDS:
        return parents_untrusted(path) or why_untrusted(_os.path.realpath(path))
    return parents_untrusted(path) or stat_untrusted(path, st)


def tree_untrusted(root, files, dirs):
    """Why a directory tree, already walked (`walk_files(..., dirs_seen=dirs)`: lstat results), may
    not be trusted, or None: every file and directory in it is root's, no symlink, writable by root
    alone."""
    for rel, st in [*sorted(dirs.items()), *sorted(files.items())]:
        why = stat_untrusted(_os.path.join(root, rel), st)
        if why:
            return why
    return None


_MAX_LINKS = 40  # as the kernel's limit on links followed in one path


def _dir_at(fd, name, mode):
    """(handle, made) of the directory `name` in the directory open as `fd`: opened without
    following a link, or made with os.mkdir (never exist_ok) and then opened. One another user made
    first is opened as found (made False) for the caller to judge. Raises OSError where `name` is a
    link or no directory."""
    try:
        return _os.open(name, _DIR_FLAGS, dir_fd=fd), False
    except FileNotFoundError:
        pass
    try:
        _os.mkdir(name, mode, dir_fd=fd)
        made = True
    except FileExistsError:
        made = False  # made by someone else since the open above: judged as found
    return _os.open(name, _DIR_FLAGS, dir_fd=fd), made


def make_dirs(path, mode=0o755, set_aside=None):
    """Make the directory `path` and each one missing above it, root's: those above with mode 0755,
    `path` with `mode` (an existing one keeps its mode). Returns the directories it made, from the
    top. Raises UntrustedPath (the path, its owner and mode) where something on the way may not be
    trusted.

    From / down, each component is opened relative to the one above (O_DIRECTORY|O_NOFOLLOW) and
    judged on that handle (fstat): one that exists must be a directory of root's, writable by root
    alone or sticky like /dev/shm (`_parent_untrusted`); a symlink of root's is followed (/var/run
    -> /run) and what it leads to is judged the same way. A missing one is made by os.mkdir, never
    exist_ok: one another user made in between (in a sticky /dev/shm anyone may) makes it fail, and
    is then judged as found and refused. Nothing is judged by its path before it is made. With
    `set_aside(path, why)` (stage_model.py), a component of another user's (or a link of theirs) in
    a directory others can write is moved aside by it instead (never deleted) and made afresh.
    """
    made, links = [], 0
    todo = [p for p in _os.path.abspath(path).split("/") if p]
    here, fd = "/", _os.open("/", _DIR_FLAGS)
    try:
        why = _parent_untrusted("/", _os.fstat(fd))
        if why:
            raise UntrustedPath(why)
        tries = 0
        while todo:
            name = todo.pop(0)
            # from a link's target: `here` is real (no link in it), so `..` is its parent
            if name in (".", ".."):
                if name == "..":
                    todo = [p for p in _os.path.dirname(here).split("/") if p] + todo
                    _os.close(fd)
                    here, fd = "/", _os.open("/", _DIR_FLAGS)
                continue
            there = _os.path.join(here, name)
            try:
                child, fresh = _dir_at(fd, name, mode if not todo else 0o755)
            except OSError as exc:
                try:
                    st = _os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    st = None
                if st is None or _stat.S_ISDIR(st.st_mode):
                    # what the system said (a name gone again, EACCES unprivileged, EROFS): the
                    # caller's to tell
                    raise exc
                if _stat.S_ISLNK(st.st_mode) and st.st_uid in TRUSTED_UIDS:
                    links += 1
                    if links > _MAX_LINKS:
                        raise UntrustedPath(f"{there}: more than {_MAX_LINKS} symlinks on the way "
                                            f"to {path}") from None
                    target = _os.readlink(name, dir_fd=fd)
                    todo = [p for p in target.split("/") if p] + todo
                    if target.startswith("/"):
                        _os.close(fd)
                        here, fd = "/", _os.open("/", _DIR_FLAGS)
                    continue
                child, fresh = None, False
                why = (stat_untrusted(there, st) if _stat.S_ISLNK(st.st_mode)
                       else _found(there, st, "not a directory"))
            else:
                st = _os.fstat(child)
                if fresh:
                    made.append(there)
                    why = (None if _stat.S_ISDIR(st.st_mode) and st.st_uid in TRUSTED_UIDS
                           else _found(there, st, "not the directory root just made"))
                    if not why:
                        # on the handle: whatever the umask
                        _os.fchmod(child, mode if not todo else 0o755)
                else:
                    why = _parent_untrusted(there, st)
                    if why and not todo:  # `path` itself, the directory root puts things in
                        why = why.replace(": a parent directory ", ": a directory ", 1)
            if why:
                if child is not None:
                    _os.close(child)
                if set_aside is not None and tries < 3 and _os.fstat(fd).st_mode & 0o022:
                    tries += 1
                    # someone's name in a world-writable directory: theirs to keep, not ours
                    set_aside(there, why)
                    todo.insert(0, name)
                    continue
                raise UntrustedPath(f"{why}: root makes {path} itself, as root's, and uses nothing "
                                    "another user made or linked there")
            _os.close(fd)
            here, fd, tries = there, child, 0
    finally:
        _os.close(fd)
    return made


def make_dir(path, mode=0o755):
    """Make the one directory `path`, exclusively (FileExistsError where anything is there: it may
    be another user's), with `mode`, checked on its handle to be the directory root just made. Its
    parent must be trusted (made or judged by the caller)."""
    _os.mkdir(path, mode)
    fd = _os.open(path, _DIR_FLAGS)
    try:
        st = _os.fstat(fd)
        if not _stat.S_ISDIR(st.st_mode) or st.st_uid not in TRUSTED_UIDS:
            raise UntrustedPath(_found(path, st, "not the directory root just made"))
        _os.fchmod(fd, mode)
    finally:
        _os.close(fd)


def new_file(path, mode=0o644, binary=False):
    """A file root writes, opened for writing as made afresh: O_CREAT|O_EXCL|O_NOFOLLOW, never
    another's file nor a link's target. A leftover of a run that died is removed first; the
    directory must be root's (the caller made or judged it)."""
    try:
        _os.unlink(path)
    except FileNotFoundError:
        pass
    fd = _os.open(path, _os.O_WRONLY | _os.O_CREAT | _os.O_EXCL | _os.O_NOFOLLOW, mode)
    return _os.fdopen(fd, "wb", buffering=0) if binary else _os.fdopen(fd, "w")


def private_dir(path):
    """Make `path` a directory only root may enter (0700), tightening one that exists; refuse one
    that is not root's or is a symlink (raises UntrustedPath, a PermissionError: root never writes
    into what another user could redirect). Made through make_dirs, then checked and tightened on
    its handle."""
    make_dirs(path, 0o700)
    try:
        fd = _os.open(path, _DIR_FLAGS)
    except OSError:
        st = _os.lstat(path)
        raise UntrustedPath(stat_untrusted(path, st)
                            or _found(path, st, "not a directory")) from None
    try:
        st = _os.fstat(fd)
        if st.st_uid not in TRUSTED_UIDS:
            raise UntrustedPath(_found(path, st, "not owned by root"))
        if _stat.S_IMODE(st.st_mode) != 0o700:
            _os.fchmod(fd, 0o700)
    finally:
        _os.close(fd)


# Peer identity (docs/threat-model.md, "A service is known by its unit's cgroup"): an answer on a
# service's port counts only when the socket that gives it belongs to a process of that service's
# unit. The port is no identity: the engine opens it only after minutes of loading, and any local
# user may bind it first. socket inode (/proc/net/tcp*) -> the processes holding it (/proc/PID/fd)
# -> their cgroup = the unit's.
_TCP_LISTEN, _TCP_ESTABLISHED = "0A", "01"


def _tcp_sockets(port):
    """[(state, local port, remote port, uid, inode)] of every TCP socket (IPv4 and IPv6) with
    `port` at either end."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, remote = (int(fields[1].rpartition(":")[2], 16),
                             int(fields[2].rpartition(":")[2], 16))
            if port in (local, remote):
                found.append((fields[3], local, remote, int(fields[7]), int(fields[9])))
    return found


def _cgroup_pids(control_group):
    """The PIDs in a unit's cgroup and those below it (`ControlGroup` of `systemctl show`): cgroup
    v2, the hybrid layout's unified tree or v1's name=systemd tree, whichever this host has."""
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"):
        top = mount + control_group
        if not _os.path.isfile(_os.path.join(top, "cgroup.procs")):
            continue
        pids = set()
        for base, _dirs, _names in _os.walk(top):
            try:
                with open(_os.path.join(base, "cgroup.procs")) as handle:
                    pids.update(int(p) for p in handle.read().split())
            except (OSError, ValueError):
                pass
        return pids
    # No cgroup tree mounted where systemd's would be (a container without systemd): each process's
    # own word for it.
    found = set()
    for pid in _all_pids():
        try:
            with open(f"/proc/{pid}/cgroup") as handle:
                paths = [line.split(":", 2)[2] for line in handle.read().splitlines()
                         if line.count(":") >= 2]
        except OSError:
            continue
        if any(p == control_group or p.startswith(control_group.rstrip("/") + "/") for p in paths):
            found.add(pid)
    return found


def _holders(inodes, pids):
    """{inode: pid} for each socket inode one of `pids` holds open."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    found = {}
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = _os.listdir(fd_dir)
        except OSError:
            continue  # gone since, or not a PID
        for fd in fds:
            try:
                inode = wanted.get(_os.readlink(f"{fd_dir}/{fd}"))
            except OSError:
                continue
            if inode is not None:
                found.setdefault(inode, pid)
    return found


def _all_pids():
    return [int(name) for name in _os.listdir("/proc") if name.isdigit()]


def _stranger(port, unit, inode, uid):
    """The refusal naming who holds a socket that is not the unit's: its uid, and its process and
    unit if found."""
    who = _owner(uid)
    pid = _holders([inode], _all_pids()).get(inode)
    if pid is not None:
        try:
            with open(f"/proc/{pid}/cgroup") as handle:
                groups = [line.split(":", 2)[2] for line in handle.read().splitlines()
                          if line.count(":") >= 2]
            who += f", pid {pid} in {groups[-1] if groups else '?'}"
        except OSError:
            who += f", pid {pid}"
    return f"port {port} is held by {who}, not by {unit}"


def port_untrusted(port, unit, control_group):
    """None when every socket listening on `port` is held by a process of `unit` (cgroup
    `control_group`), else why not: "port 30001 is held by uid 65534 (nobody), ..., not by
    sglang-dflash.service", or that nothing listens. For a client that makes its own connections
    (the benchmark client): checked before and after it."""
    listening = [(inode, uid) for state, local, _r, uid, inode in _tcp_sockets(port)
                 if state == _TCP_LISTEN and local == port]
    if not listening:
        return f"nothing listens on port {port}"
    held = (_holders([inode for inode, _ in listening], _cgroup_pids(control_group))
            if control_group else {})
    for inode, uid in listening:
        if inode not in held:
            return _stranger(port, unit, inode, uid)
    return None


def peer_untrusted(sock, unit, control_group, wait_s=5.0):
    """None when the server end of the connected socket `sock` is held by a process of `unit`
    (cgroup `control_group`), else why not. Asked after connecting and before the first byte is
    sent: a request that carries a key, passes a gate or decides a removal goes only to the service
    itself.

    The server's end has an inode once its process accepted the connection; until then (a busy event
    loop) it is looked up again, for at most `wait_s`.
    """
    import time

    server_port, client_port = sock.getpeername()[1], sock.getsockname()[1]
    pids = _cgroup_pids(control_group) if control_group else set()
    deadline = time.monotonic() + wait_s
    while True:
        ends = [(uid, inode) for state, local, remote, uid, inode in _tcp_sockets(server_port)
                if local == server_port and remote == client_port and state != _TCP_LISTEN]
        accepted = [(uid, inode) for uid, inode in ends if inode]
        if accepted:
            uid, inode = accepted[0]
            if inode in _holders([inode], pids):
                return None
            return _stranger(server_port, unit, inode, uid)
        if time.monotonic() > deadline:
            if not ends:
                return f"port {server_port}: the server's end of the connection is not on this host"
            return f"port {server_port}: no process accepted the connection within {wait_s:.0f} s"
        time.sleep(0.02)
        pids = _cgroup_pids(control_group) if control_group else set()


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
