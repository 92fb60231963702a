#!/usr/bin/env python3
"""Build the lab's stand-in ``torchvision`` wheel (import-only names, no image ops), stdlib only.

    python3 lab/standin_torchvision/build.py OUT_DIR
    # prints "<sha256>  <wheel path>" (the format of sha256sum)

Why the lab needs it, and what it holds: ``torchvision/__init__.py``. Only the stack that runs
sglang's benchmark client on the lab (``files/stacks/lab-cpu-sglang-bench.yml``) installs it.

The wheel is byte-for-byte deterministic, like lab/standin/build.py: entries in a fixed order,
every timestamp 1980-01-01 00:00:00, mode 0644, no compression.
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

NAME = "torchvision"
PKG = "torchvision"
TAG = "py3-none-any"
HERE = Path(__file__).resolve().parent
SRC = HERE / PKG

_FIXED_DATE = (1980, 1, 1, 0, 0, 0)
_FILE_MODE = 0o100644  # regular file, rw-r--r--


def version() -> str:
    """The stand-in's version: its `__version__` (one place)."""
    found = re.search(r'^__version__ = "([^"]+)"$', (SRC / "__init__.py").read_text(encoding="utf-8"), re.M)
    if not found:
        raise RuntimeError("no __version__ in %s" % (SRC / "__init__.py"))
    return found.group(1)


def wheel_name() -> str:
    return "%s-%s-%s.whl" % (PKG, version(), TAG)


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _metadata() -> bytes:
    return (
        "Metadata-Version: 2.1\n"
        "Name: %s\n"
        "Version: %s\n"
        "Summary: A stand-in for torchvision (import-only names, no image ops) for lab hosts; not torchvision\n"
        "License: BSD-3-Clause\n"
        "Requires-Python: >=3.8\n" % (NAME, version())
    ).encode("utf-8")


def _wheel_file() -> bytes:
    return (
        "Wheel-Version: 1.0\n"
        "Generator: torchvision-standin-build (%s)\n"
        "Root-Is-Purelib: true\n"
        "Tag: %s\n" % (version(), TAG)
    ).encode("utf-8")


def wheel_entries() -> list[tuple[str, bytes]]:
    """All (archive name, content) pairs of the wheel, in archive order, RECORD last."""
    dist_info = "%s-%s.dist-info" % (PKG, version())
    entries = sorted((p.relative_to(HERE).as_posix(), p.read_bytes()) for p in SRC.rglob("*.py"))
    entries += [
        ("%s/METADATA" % dist_info, _metadata()),
        ("%s/WHEEL" % dist_info, _wheel_file()),
        ("%s/top_level.txt" % dist_info, (PKG + "\n").encode("utf-8")),
    ]
    record_name = "%s/RECORD" % dist_info
    record_lines = ["%s,%s,%d" % (name, _record_hash(data), len(data)) for name, data in entries]
    record_lines.append("%s,," % record_name)
    entries.append((record_name, ("\n".join(record_lines) + "\n").encode("utf-8")))
    return entries


def build_wheel(out_dir) -> Path:
    """Write ``torchvision-<version>-py3-none-any.whl`` into out_dir; return its path."""
    entries = wheel_entries()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / wheel_name()
    tmp = out / (target.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_FIXED_DATE)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3  # unix, so that external_attr is read as a mode
            info.external_attr = _FILE_MODE << 16
            zf.writestr(info, data)
    tmp.replace(target)
    return target


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        sys.stderr.write("usage: python3 lab/standin_torchvision/build.py OUT_DIR\n")
        return 2
    path = build_wheel(argv[0])
    print("%s  %s" % (sha256_file(path), path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
