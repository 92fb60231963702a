"""A file a reader takes whole or not at all (the status view's JSON and Prometheus files, the JSON
plan): kept apart so that a deploy writing its plan does not import the status view."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """`text` into `path` as a whole: written to a temporary file beside it, then renamed over it,
    so a reader (node_exporter's textfile collector) never sees half a file. The temporary name does
    not end in `.prom`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                               dir=str(path.parent or Path(".")))
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
