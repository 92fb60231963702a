"""A directory the deploy keeps on a host: present, and where given, with its owner, group and mode.

pyinfra's `files.directory` does the same, reading its `Directory` fact itself, once more on every
converged run; this one decides from the host's one read (operations/host_reads.py).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import OperationError, QuoteString, StringCommand
from pyinfra.facts.files import Directory

from operations import host_reads


@host_reads.operation()
def present(path: str, mode: str | None = None, user: str | None = None, group: str | None = None):
    """
    The directory ``path`` exists (made with its parents where missing) and, for each given, has ``mode``
    (octal digits, e.g. ``"700"``), ``user`` and ``group``.

    + path: an absolute path
    + mode, user, group: what it must have; None leaves that as it is

    A path that exists and is not a directory (a file, a link) stops the host: nothing there is replaced.
    """
    found = host_reads.get(host, Directory, path=path)
    if found is False:
        raise OperationError(f"{path} exists and is not a directory: move it away, then run again")
    if found is None:
        yield StringCommand("mkdir", "-p", QuoteString(path))
        found = {}
    fix_owner = bool(user and found.get("user") != user) or bool(group and found.get("group") != group)
    fix_mode = mode is not None and str(found.get("mode")) != str(int(mode))
    if fix_mode:  # the mode first: a directory being given to root is closed before it changes hands
        yield StringCommand("chmod", mode, QuoteString(path))
    if fix_owner:
        yield StringCommand("chown", QuoteString(f"{user or ''}:{group}" if group else user), QuoteString(path))
    if found and not fix_owner and not fix_mode:
        host.noop(f"directory {path} is present" + "".join(f", {v}" for v in (mode, user, group) if v))
