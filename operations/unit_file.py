"""A service's unit file on the host: its content and mode, written whole when they differ."""

from __future__ import annotations

import hashlib

from pyinfra import host
from pyinfra.facts.files import File, Sha1File

from operations import host_reads
from operations.file_write import replace_file
from operations.host_reads import operation

MODE = "644"


@operation()
def written(path: str, text: str):
    """
    Make the unit file at ``path`` hold ``text`` (mode 0644, root's).

    + path: the unit file, e.g. ``/etc/systemd/system/sglang-ddtree.service``
    + text: its content (``units.render_unit``)

    Written beside and renamed over (operations/file_write.py): systemd, or a reader, never
    sees half a unit, even if the connection drops mid-upload.
    """
    found = host_reads.get(host, File, path=path)
    same_text = found is not None and host_reads.get(host, Sha1File, path=path) == hashlib.sha1(text.encode()).hexdigest()
    if same_text and str(found.get("mode")) == MODE and found.get("user") == "root" and found.get("group") == "root":
        host.noop(f"unit file {path} is current")
        return
    yield from replace_file(path, text, MODE, make_parent=None)
