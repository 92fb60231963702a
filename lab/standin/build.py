#!/usr/bin/env python3
"""Build the ``sglang-standin`` wheel with the standard library only.

    python3 lab/standin/build.py OUT_DIR
    # prints "<sha256>  <wheel path>" (the format of sha256sum)

The wheel is byte-for-byte deterministic: entries in a fixed order, every
timestamp 1980-01-01 00:00:00, mode 0644, and no compression (ZIP_STORED), so
that the output does not depend on the zlib build of the interpreter either.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: this also runs as a script
from lab import wheel_writer  # noqa: E402

NAME = "sglang-standin"
PKG = "sglang_standin"
VERSION = "0.1.6"
TAG = "py3-none-any"
WHEEL_NAME = "%s-%s-%s.whl" % (PKG, VERSION, TAG)
DIST_INFO = "%s-%s.dist-info" % (PKG, VERSION)
HERE = Path(__file__).resolve().parent
SRC = HERE / PKG
README = HERE / "README.md"




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
    return wheel_writer.with_record(entries, DIST_INFO)


def build_wheel(out_dir) -> Path:
    """Write ``sglang_standin-<VERSION>-py3-none-any.whl`` into out_dir; return its path."""
    return wheel_writer.write(wheel_entries(), Path(out_dir) / WHEEL_NAME)


sha256_file = wheel_writer.sha256_file


def main(argv: list[str] | None = None) -> int:
    return wheel_writer.main(argv, "usage: python3 lab/standin/build.py OUT_DIR", build_wheel)

if __name__ == "__main__":
    sys.exit(main())
