#!/usr/bin/env python3
"""Build the ``sglang-standin`` wheel with the standard library only.

    python3 lab/standin/build.py OUT_DIR
    # prints "<sha256>  <wheel path>" (the format of sha256sum)

The wheel is byte-for-byte deterministic: entries in a fixed order, every
timestamp 1980-01-01 00:00:00, mode 0644, and no compression (ZIP_STORED), so
that the output does not depend on the zlib build of the interpreter either.
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

NAME = "sglang-standin"
PKG = "sglang_standin"
VERSION = "0.1.3"
TAG = "py3-none-any"
WHEEL_NAME = "%s-%s-%s.whl" % (PKG, VERSION, TAG)
DIST_INFO = "%s-%s.dist-info" % (PKG, VERSION)
HERE = Path(__file__).resolve().parent
SRC = HERE / PKG
README = HERE / "README.md"

_FIXED_DATE = (1980, 1, 1, 0, 0, 0)
_FILE_MODE = 0o100644  # regular file, rw-r--r--


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _source_version() -> str:
    text = (SRC / "__init__.py").read_text(encoding="utf-8")
    m = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', text, re.M)
    if not m:
        raise RuntimeError("no __version__ in %s" % (SRC / "__init__.py"))
    return m.group(1)


def _metadata() -> bytes:
    lines = [
        "Metadata-Version: 2.1",
        "Name: " + NAME,
        "Version: " + VERSION,
        "Summary: A stand-in for sglang.launch_server (no GPU, no model weights) for lab hosts; not SGLang",
        "License: Apache-2.0",
        "Requires-Python: >=3.8",
        "Description-Content-Type: text/markdown",
        "",
    ]
    head = "\n".join(lines)
    body = README.read_text(encoding="utf-8") if README.is_file() else ""
    return (head + "\n" + body).encode("utf-8")


def _wheel_file() -> bytes:
    return (
        "Wheel-Version: 1.0\n"
        "Generator: sglang-standin-build (%s)\n"
        "Root-Is-Purelib: true\n"
        "Tag: %s\n" % (VERSION, TAG)
    ).encode("utf-8")


def _package_files() -> list[tuple[str, bytes]]:
    files = []
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC)
        if "__pycache__" in rel.parts:
            continue
        files.append(("%s/%s" % (PKG, rel.as_posix()), p.read_bytes()))
    files.sort(key=lambda item: item[0])
    return files


def wheel_entries() -> list[tuple[str, bytes]]:
    """All (archive name, content) pairs of the wheel, in archive order, RECORD last."""
    src_version = _source_version()
    if src_version != VERSION:
        raise RuntimeError("build.py VERSION %s != sglang_standin.__version__ %s" % (VERSION, src_version))
    entries = _package_files()
    entries += [
        ("%s/METADATA" % DIST_INFO, _metadata()),
        ("%s/WHEEL" % DIST_INFO, _wheel_file()),
        ("%s/top_level.txt" % DIST_INFO, (PKG + "\n").encode("utf-8")),
    ]
    record_name = "%s/RECORD" % DIST_INFO
    record_lines = ["%s,%s,%d" % (name, _record_hash(data), len(data)) for name, data in entries]
    record_lines.append("%s,," % record_name)
    entries.append((record_name, ("\n".join(record_lines) + "\n").encode("utf-8")))
    return entries


def build_wheel(out_dir) -> Path:
    """Write ``sglang_standin-<VERSION>-py3-none-any.whl`` into out_dir; return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / WHEEL_NAME
    tmp = out / (WHEEL_NAME + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in wheel_entries():
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
        sys.stderr.write("usage: python3 lab/standin/build.py OUT_DIR\n")
        return 2
    path = build_wheel(argv[0])
    print("%s  %s" % (sha256_file(path), path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
