"""Kinds of host paths (configuration/kinds.py re-exports them): absolute, normalized, apart from
the system's directories and the deploy's own, and, for what root later runs, reads or deletes, not
where others can write."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated

from pydantic import AfterValidator

from configuration.host_paths import OWN_PATHS, SERVICE_CACHE_DIR, SERVICE_STATE_DIR
from configuration.kinds_base import Text, control_character, refuse, unit_safe_fix, with_fix

ABS_FIX = "must be an absolute path on the host, without '..'"
PATH_CHARS = re.compile(r"[A-Za-z0-9_./+@:-]{1,4096}")
# Host paths no configured directory may be or contain: the deploy moves `venv_path` into its
# generations directory, prunes generations, empties staging directories and chowns caches, so
# pointing one of them at a system directory (or at `/`) would destroy it.
DENIED_PATHS = (
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32",
    "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys",
    "/tmp", "/usr", "/var", "/root/.ssh", "/run/user", "/usr/local", "/var/cache", "/var/lib",
    "/var/log", "/var/tmp", "/var/spool",
)
# Trees nothing of ours may be inside (system files, kernel interfaces), except the RAM disks.
DENIED_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
                "/sbin", "/sys", "/usr", "/run/user")
ALLOWED_IN_DENIED_TREES = ("/dev/shm",)
# Places the service user or any local user can write. Root later runs the venv's python, reads and
# installs the wheels and serves the models: none of those may lie where someone else could put or
# swap a file.
WRITABLE_BY_OTHERS = {
    SERVICE_STATE_DIR: "the unit's StateDirectory and the service user's home, which systemd hands "
                       "to the service user",
    SERVICE_CACHE_DIR: "the unit's CacheDirectory, which systemd hands to the service user",
    "/tmp": "world-writable", "/var/tmp": "world-writable", "/dev/shm": "world-writable",
    "/run/lock": "world-writable", "/var/lock": "world-writable", "/var/crash": "world-writable",
    "/home": "users' homes, which their users write",
    "/run/user": "users' runtime directories, which their users write",
}


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _host_path(value: str) -> str:
    """An absolute, normalized host path, outside the deny list, written as it will be used."""
    if not value.startswith("/"):
        raise refuse(ABS_FIX)
    found = control_character(value)
    if found:
        raise refuse(unit_safe_fix("must be one line of printable characters", found))
    if PATH_CHARS.fullmatch(value) is None:
        raise refuse("may hold only letters, digits and _ . / + @ : - (no spaces, quotes, % or $: "
                     "it is written into unit files)")
    if ".." in value.split("/"):
        raise refuse(ABS_FIX)
    normal = str(PurePosixPath(re.sub("/+", "/", value)))  # `/root//venv/` is `/root/venv`
    for denied in DENIED_PATHS:
        if inside(denied, normal):
            raise refuse(f"is {'' if normal == denied else 'a parent of '}{denied}, a system "
                         "directory the deploy would move, prune or fill: use a directory of its "
                         "own, e.g. /root/venv_sglang or /srv/models")
    for tree in DENIED_TREES:
        if inside(normal, tree) and not any(inside(normal, ok) for ok in ALLOWED_IN_DENIED_TREES):
            raise refuse(f"is inside {tree} (system files): use a directory of its own, e.g. under "
                         "/root or /srv")
    for own in OWN_PATHS:
        if inside(normal, own) or inside(own, normal):
            raise refuse(f"overlaps {own}, which the deploy manages itself: use another directory")
    return normal


def writable_by_others(path: str, allowed: tuple[str, ...] = ()) -> str | None:
    """Why root may not trust what lies at `path` (a place others can write), or None."""
    for place, why in WRITABLE_BY_OTHERS.items():
        if inside(path, place) and place not in allowed:
            return (f"is inside {place} ({why}): root runs, reads or deletes what is there, and "
                    "another user could put or swap a file in it first; use a root-owned "
                    "directory, e.g. under /root or /srv")
    return None


def _trusted(allowed: tuple[str, ...]) -> AfterValidator:
    def check(path: str) -> str:
        reason = writable_by_others(path, allowed)
        if reason:
            raise refuse(reason)
        return path

    return AfterValidator(check)


# What root later runs (a venv), reads to install (wheels, a donor venv) or serves (the store): not
# where others write.
TrustedHostPath = Annotated[Text, AfterValidator(_host_path), _trusted(()), with_fix(ABS_FIX)]
# The RAM disk models are staged into: /dev/shm is world-writable, and the staging code moves a
# squatted directory aside; every other place others can write is refused.
ShmDir = Annotated[Text, AfterValidator(_host_path), _trusted(("/dev/shm",)), with_fix(ABS_FIX)]
