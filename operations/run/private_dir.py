"""A directory of this control machine's user that no one else can write: where the deploy keeps
what it trusts between runs (the dropped-locks records of operations/lock/lock_record.py; the read
sets of host_reads).

A file there decides what the deploy does (a dropped-lock record lets a run take a lock over; a read
set names the commands a host runs): so the directory must be this user's own, mode 0700, and no
symlink to somewhere else. One another local user made first (in /tmp, say), or one anyone may
write, could hold files planted there; so could one under a parent another user owns or may write
(they can rename the directory away and put theirs in its place). `private_dir(path)` makes it so
(mode 0700, as this user) or stops with what it found.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from pyinfra.api.exceptions import PyinfraError


class NotPrivate(PyinfraError):
    pass


def cache_root() -> Path:
    """Where this user's sglang-deploy caches live: $SGLANG_DEPLOY_CACHE, else
    $XDG_CACHE_HOME/sglang-deploy, else ~/.cache/sglang-deploy (not checked here: each directory the
    deploy uses under it is, by private_dir)."""
    explicit = os.environ.get("SGLANG_DEPLOY_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sglang-deploy"


def private_dir(path: Path) -> Path:
    """`path`, made if missing (mode 0700, missing parents too), checked to be a real directory
    owned by this user with mode 0700; else NotPrivate, naming the path, what was expected and what
    was found.

    Nothing is repaired in place: a directory that was not private may already hold what someone
    planted.
    """
    path = Path(path)
    try:
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise NotPrivate(f"{path}: cannot make this directory ({exc.strerror}); the deploy keeps "
                         "records there that only this user may write") from None
    _tighten(path)
    problem = _not_private(path)
    if problem:
        raise NotPrivate(
            f"{path}: expected a directory of {_who(os.geteuid())} with mode 0700, not a "
            f"symlink; found {problem}. The deploy trusts what it finds there: if you made it "
            f"yourself, check what it holds and `chmod 700 {path}`; otherwise remove it "
            f"(`rm -rf {path}`) and run again"
        )
    unsafe = _unsafe_ancestor(path)
    if unsafe:
        raise NotPrivate(
            f"{path}: {unsafe}, so another user could move this directory aside and put their own "
            "in its place. The deploy trusts what it finds there: keep its caches under "
            "directories only you or root may write (set SGLANG_DEPLOY_CACHE, or XDG_CACHE_HOME, "
            "to such a place)"
        )
    return path


def _unsafe_ancestor(path: Path) -> str | None:
    """The first directory above `path` (symlinks resolved, as the kernel walks it) that someone
    other than this user or root owns, or that others may write without the sticky bit (in a sticky
    directory such as /tmp only an entry's owner may rename it); None when every one is safe."""
    euid = os.geteuid()
    for ancestor in Path(os.path.realpath(path.parent)).joinpath("x").parents:
        try:
            info = os.stat(ancestor)
        except OSError as exc:
            return f"its parent {ancestor} cannot be read ({exc.strerror})"
        if info.st_uid not in (0, euid):
            return f"its parent {ancestor} is owned by {_who(info.st_uid)}"
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            return (f"its parent {ancestor} may be written by others (mode "
                    f"{stat.S_IMODE(info.st_mode):04o}, no sticky bit)")
    return None


def _tighten(path: Path) -> None:
    """A directory of this user's that only this user could ever write (no group or other write bit:
    an earlier version made its caches 0755) is made 0700: nothing in it can have been planted.
    Anything else stays as found."""
    try:
        info = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022:
        os.chmod(path, 0o700)


def _not_private(path: Path) -> str | None:
    """What makes `path` no private directory of this user, or None."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return f"a symlink to {os.readlink(path)}"
    if not stat.S_ISDIR(info.st_mode):
        return "a file, not a directory"
    if info.st_uid != os.geteuid():
        return f"a directory owned by {_who(info.st_uid)}"
    mode = stat.S_IMODE(info.st_mode)
    if mode != 0o700:
        return f"a directory with mode {mode:04o}"
    return None


def _who(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
