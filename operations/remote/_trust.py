# Shared by the remote scripts, with _common.py and _peer.py: inlined with them as one text (see
# _common.py's head).
import os as _os
import stat as _stat

from _common import _DIR_FLAGS  # one inlined text with _common.py (shared_text)

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
