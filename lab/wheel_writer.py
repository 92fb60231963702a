"""The lab's stand-in wheels, written the same way every time (stdlib only): lab/standin, lab/standin_kernel and
lab/standin_torchvision build their wheels with it, and the stacks pin those wheels' sha256.

Entries in the order given, RECORD last, every timestamp 1980-01-01 00:00:00, mode 0644, no compression: the same
sources give the same bytes on any machine.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

FIXED_DATE = (1980, 1, 1, 0, 0, 0)
FILE_MODE = 0o100644  # regular file, rw-r--r--


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def with_record(entries: list[tuple[str, bytes]], dist_info: str) -> list[tuple[str, bytes]]:
    """`entries` (archive name, content) and, last, the RECORD that lists them."""
    record_name = "%s/RECORD" % dist_info
    lines = ["%s,%s,%d" % (name, record_hash(data), len(data)) for name, data in entries]
    lines.append("%s,," % record_name)
    return [*entries, (record_name, ("\n".join(lines) + "\n").encode("utf-8"))]


def write(entries: list[tuple[str, bytes]], target: Path) -> Path:
    """The wheel `target` holding `entries` in their order, written beside it and renamed in."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=FIXED_DATE)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3  # unix, so that external_attr is read as a mode
            info.external_attr = FILE_MODE << 16
            zf.writestr(info, data)
    tmp.replace(target)
    return target


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv: list[str] | None, usage: str, build, max_args: int = 1) -> int:
    """A builder's command line: OUT_DIR (and up to max_args - 1 more), printing "<sha256>  <wheel path>"."""
    argv = sys.argv[1:] if argv is None else argv
    if not 1 <= len(argv) <= max_args or argv[0] in ("-h", "--help"):
        sys.stderr.write(usage + "\n")
        return 2
    path = build(*argv)
    print("%s  %s" % (sha256_file(path), path))
    return 0
