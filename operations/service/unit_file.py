"""A service's unit file on the host: its content and mode, written whole when they differ."""

from __future__ import annotations

import difflib
import hashlib

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand
from pyinfra.facts.files import File, Sha1File

from operations.run import host_reads, redact, this_run
from operations.run.file_write import replace_file
from operations.run.host_reads import operation

MODE = "644"
# The most changed lines a plan shows of one unit (a unit rewritten by hand shows its first ones,
# then how many more).
DIFF_LINES = 12


def same_content(found: dict | None, sha1: str | None, text: str) -> bool:
    """The unit file holds `text` (whatever its mode and owner)."""
    return found is not None and sha1 == hashlib.sha1(text.encode()).hexdigest()


def differs(found: dict | None, sha1: str | None, text: str) -> str | None:
    """Why the unit file (`File` and `Sha1File` facts) is not `text`, mode 644, root's; None when it
    is."""
    if found is None:
        return "absent"
    if not same_content(found, sha1, text):
        return "differs from the data"
    if (str(found.get("mode")) != MODE or found.get("user") != "root"
            or found.get("group") != "root"):
        return (f"mode {found.get('mode')} {found.get('user')}:{found.get('group')}, wanted {MODE} "
                "root:root")
    return None


def line_changes(found: list[str] | None, text: str) -> tuple[str, ...]:
    """Which lines of the unit on the host (`found`, FileContents' lines) differ from `text`:
    `- old` and `+ new`, each as the unit reads it (a flag line without its continuation), every
    secret value the run knows and every secret-named value masked (redact.engine_text: the host's
    copy may hold what the data no longer names)."""
    if found is None:
        return ()
    old = [_flag_line(line) for line in found]
    new = [_flag_line(line) for line in text.splitlines()]
    lines = [f"{line[0]} {line[2:]}" for line in difflib.ndiff(old, new)
             if line[:1] in "+-" and line[2:].strip()]
    shown = [redact.engine_text(line) for line in lines[:DIFF_LINES]]
    if len(lines) > DIFF_LINES:
        shown.append(f"... and {len(lines) - DIFF_LINES} more changed line(s)")
    return tuple(shown)


def _flag_line(line: str) -> str:
    line = line.strip()
    return line[:-1].rstrip() if line.endswith("\\") else line


class Rewritten:
    """Whether `written` replaced the unit's content in this run (known only while executing);
    called, it says. A mode or owner put back changes nothing systemd runs: no reload, no preflight,
    no restart."""

    def __init__(self) -> None:
        self.content = False

    def __call__(self) -> bool:
        return self.content


@operation()
def written(path: str, text: str, rewritten: Rewritten | None = None):
    """
    Make the unit file at ``path`` hold ``text`` (mode 0644, root's).

    + path: the unit file, e.g. ``/etc/systemd/system/sglang-ddtree.service``
    + text: its content (``units.render_unit``)
    + rewritten: a `Rewritten`, set when the content was replaced (not for a mode or owner put back)

    Written beside and renamed over (operations/run/file_write.py): systemd, or a reader, never
    sees half a unit, even if the connection drops mid-upload.
    """
    found = host_reads.get(host, File, path=path)
    sha1 = host_reads.get(host, Sha1File, path=path) if found else None
    why = differs(found, sha1, text)
    if why is None:
        host.noop(f"unit file {path} is current")
        return
    if same_content(found, sha1, text):
        host.log(f"unit file {path}: {why}: putting the mode and owner back (content unchanged: no "
                 "restart)")
        yield StringCommand("chmod", MODE, QuoteString(path))
        yield StringCommand("chown", "root:root", QuoteString(path))
        return
    if rewritten is not None and this_run.executing():
        rewritten.content = True
    yield from replace_file(path, text, MODE, make_parent=None)
