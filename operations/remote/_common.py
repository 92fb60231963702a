# Shared by the remote scripts (stdlib only). A script names what it uses on one line,
#     from _common import walk_files, sha256_file  # noqa: E402 - remote.script puts _common.py here
# and remote.script() puts this whole file in that line's place, so each script still travels
# and runs as one file (`python3 - ARGS`, or the boot unit's installed copy of stage_model.py).
# ctypes is imported where it is used (a venv switch): the converged read, which imports every script's
# top-level imports once before it forks (remote/run_scripts.py), never needs it.
import hashlib as _hashlib
import os as _os
import re as _re
import stat as _stat
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


def walk_files(root, skip=lambda rel, name: False, dirs_seen=None):
    """{relpath: os.lstat()} of every file under root, directories in sorted order; None if root is no directory.

    With `dirs_seen` (a dict), also {relpath: os.lstat()} of every directory below root, and of every link to
    one (not walked into), for `tree_untrusted`: one lstat per directory, none more per file.
    """
    if not _os.path.isdir(root):
        return None
    out = {}
    for base, dirs, names in _os.walk(root):
        dirs.sort()
        if dirs_seen is not None:
            for name in dirs:
                path = _os.path.join(base, name)
                dirs_seen[_os.path.relpath(path, root)] = _os.lstat(path)
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


# Trust (README "Threat model"): root reads, runs, serves or deletes only what root owns, what is no
# symlink, and what nobody else can write or swap: the entry itself and every directory above it. Anything
# else may have been put there by another local user or by the service user (the engine writes /dev/shm).
TRUSTED_UIDS = frozenset({0, _os.geteuid()})  # root; and whoever runs this (root on a host)


def _owner(uid):
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _found(path, st, what):
    return f"{path}: {what} (found: owner {_owner(st.st_uid)}, mode {_stat.S_IMODE(st.st_mode):04o})"


def stat_untrusted(path, st):
    """Why one entry (its lstat) may not be trusted, or None: a symlink, another owner, writable by others."""
    if _stat.S_ISLNK(st.st_mode):
        return _found(path, st, f"a symlink (to {_os.readlink(path) if _os.path.islink(path) else '?'}), expected a file or directory of root's")
    if st.st_uid not in TRUSTED_UIDS:
        return _found(path, st, "not owned by root")
    if st.st_mode & 0o022:
        return _found(path, st, "writable by its group or others")
    return None


def _parent_untrusted(path, st):
    """A directory above a trusted path: root's, and writable by root alone, or sticky like /tmp and /dev/shm
    (there nobody but an entry's owner may rename or remove it)."""
    if not _stat.S_ISDIR(st.st_mode):
        return _found(path, st, "a parent that is not a directory")
    if st.st_uid not in TRUSTED_UIDS:
        return _found(path, st, "a parent directory not owned by root")
    if st.st_mode & 0o022 and not st.st_mode & _stat.S_ISVTX:
        return _found(path, st, "a parent directory writable by its group or others, without the sticky bit")
    return None


def parents_untrusted(path):
    """Why the directories above `path` may let someone else swap it, or None.

    Each directory from / down is lstat'ed; a symlink on the way must be root's, and the directories of
    where it leads are checked the same way. A few lstat calls: cheap enough for every read.
    """
    path = _os.path.abspath(path)
    parts = [p for p in path.split("/") if p][:-1]
    here = "/"
    for part in [None, *parts]:
        here = here if part is None else _os.path.join(here, part)
        try:
            st = _os.lstat(here)
        except FileNotFoundError:
            return None  # nothing further down exists yet: root makes it
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
    """None when root may trust `path` (read it, run it, serve it, delete it), else why not: the path, its
    owner and mode. An absent path is judged by its parents (root is about to make it). With `link_ok`, a
    symlink of root's is followed (the live venv link) and where it leads is judged the same way.
    """
    try:
        st = _os.lstat(path)
    except FileNotFoundError:
        return parents_untrusted(path)
    if link_ok and _stat.S_ISLNK(st.st_mode) and st.st_uid in TRUSTED_UIDS:
        return parents_untrusted(path) or why_untrusted(_os.path.realpath(path))
    return parents_untrusted(path) or stat_untrusted(path, st)


def tree_untrusted(root, files, dirs):
    """Why a directory tree, already walked (`walk_files(..., dirs_seen=dirs)`: lstat results), may not be
    trusted, or None: every file and directory in it is root's, no symlink, writable by root alone."""
    for rel, st in [*sorted(dirs.items()), *sorted(files.items())]:
        why = stat_untrusted(_os.path.join(root, rel), st)
        if why:
            return why
    return None


def private_dir(path):
    """Make `path` a directory only root may enter (0700), tightening one that exists; refuse one that is not
    root's or is a symlink (raises OSError: root never writes into what another user could redirect)."""
    _os.makedirs(path, mode=0o700, exist_ok=True)
    st = _os.lstat(path)
    if _stat.S_ISLNK(st.st_mode) or st.st_uid not in TRUSTED_UIDS or parents_untrusted(path):
        raise PermissionError(why_untrusted(path) or parents_untrusted(path))
    if _stat.S_IMODE(st.st_mode) != 0o700:
        _os.chmod(path, 0o700)


# Peer identity (docs/threat-model.md, "A service is known by its unit's cgroup"): an answer on a service's
# port counts only when the socket that gives it belongs to a process of that service's unit. The port is no
# identity: the engine opens it only after minutes of loading, and any local user may bind it first.
# socket inode (/proc/net/tcp*) -> the processes holding it (/proc/PID/fd) -> their cgroup = the unit's.
_TCP_LISTEN, _TCP_ESTABLISHED = "0A", "01"


def _tcp_sockets(port):
    """[(state, local port, remote port, uid, inode)] of every TCP socket (IPv4 and IPv6) with `port` at either end."""
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
            local, remote = int(fields[1].rpartition(":")[2], 16), int(fields[2].rpartition(":")[2], 16)
            if port in (local, remote):
                found.append((fields[3], local, remote, int(fields[7]), int(fields[9])))
    return found


def _cgroup_pids(control_group):
    """The PIDs in a unit's cgroup and those below it (`ControlGroup` of `systemctl show`): cgroup v2, the
    hybrid layout's unified tree or v1's name=systemd tree, whichever this host has."""
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
    return set()


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
    """The refusal naming who holds a socket that is not the unit's: its uid, and its process and unit if found."""
    who = _owner(uid)
    pid = _holders([inode], _all_pids()).get(inode)
    if pid is not None:
        try:
            with open(f"/proc/{pid}/cgroup") as handle:
                groups = [line.split(":", 2)[2] for line in handle.read().splitlines() if line.count(":") >= 2]
            who += f", pid {pid} in {groups[-1] if groups else '?'}"
        except OSError:
            who += f", pid {pid}"
    return f"port {port} is held by {who}, not by {unit}"


def port_untrusted(port, unit, control_group):
    """None when every socket listening on `port` is held by a process of `unit` (cgroup `control_group`), else
    why not: "port 30001 is held by uid 65534 (nobody), ..., not by sglang-dflash.service", or that nothing
    listens. For a client that makes its own connections (the benchmark client): checked before and after it."""
    listening = [(inode, uid) for state, local, _r, uid, inode in _tcp_sockets(port) if state == _TCP_LISTEN and local == port]
    if not listening:
        return f"nothing listens on port {port}"
    held = _holders([inode for inode, _ in listening], _cgroup_pids(control_group)) if control_group else {}
    for inode, uid in listening:
        if inode not in held:
            return _stranger(port, unit, inode, uid)
    return None


def peer_untrusted(sock, unit, control_group, wait_s=5.0):
    """None when the server end of the connected socket `sock` is held by a process of `unit` (cgroup
    `control_group`), else why not. Asked after connecting and before the first byte is sent: a request that
    carries a key, passes a gate or decides a removal goes only to the service itself.

    The server's end has an inode once its process accepted the connection; until then (a busy event loop)
    it is looked up again, for at most `wait_s`.
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
