"""A directory the deploy keeps on a host: present, and where given, with its owner, group and mode.

pyinfra's `files.directory` does the same, reading its `Directory` fact itself, once more on every
converged run; this one decides from the host's one read (operations/run/host_reads.py).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand
from pyinfra.facts.files import Directory

from operations.run import host_reads
from operations.run.plan import Refusal


def fixes(found: dict | None | bool, mode: str | None, user: str | None,
          group: str | None) -> list[str]:
    """What `present` would change on a directory read as `found` (the `Directory` fact): "create",
    "mode", "owner"; [] when it is as wanted. A path that is no directory is the caller's refusal
    (`found is False`)."""
    if found is None:
        return (["create"] + (["mode"] if mode is not None else [])
                + (["owner"] if user or group else []))
    found = found or {}
    out = []
    if mode is not None and str(found.get("mode")) != str(int(mode)):
        out.append("mode")
    if bool(user and found.get("user") != user) or bool(group and found.get("group") != group):
        out.append("owner")
    return out


def decide(path: str, found: dict | None | bool, mode: str | None, user: str | None,
           group: str | None) -> list[str]:
    """The one decider of a kept directory, asked by its step's plan and by `present`: `fixes`,
    or `plan.Refusal` where the path is no directory (`found is False`: nothing there is
    replaced)."""
    if found is False:
        raise Refusal(f"{path} exists and is not a directory: move it away, then run again",
                      what=path)
    return fixes(found, mode, user, group)


@host_reads.operation()
def present(path: str, mode: str | None = None, user: str | None = None, group: str | None = None):
    """
    The directory ``path`` exists (made with its parents where missing) and, for each given, has
    ``mode`` (octal digits, e.g. ``"700"``), ``user`` and ``group``.

    + path: an absolute path
    + mode, user, group: what it must have; None leaves that as it is

    A path that exists and is not a directory (a file, a link) stops the host: nothing there is
    replaced.
    """
    found = host_reads.get(host, Directory, path=path)
    todo = decide(path, found, mode, user, group)
    if "create" in todo:
        yield StringCommand("mkdir", "-p", QuoteString(path))
    fix_owner, fix_mode = "owner" in todo, "mode" in todo
    # the mode first: a directory being given to root is closed before it changes hands
    if fix_mode:
        yield StringCommand("chmod", mode, QuoteString(path))
    if fix_owner:
        yield StringCommand("chown", QuoteString(f"{user or ''}:{group}" if group else user),
                            QuoteString(path))
    if not todo:
        host.noop(f"directory {path} is present"
                  + "".join(f", {v}" for v in (mode, user, group) if v))
