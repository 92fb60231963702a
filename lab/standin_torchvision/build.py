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

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: this also runs as a script
from lab import wheel_writer  # noqa: E402

NAME = "torchvision"
PKG = "torchvision"
TAG = "py3-none-any"
HERE = Path(__file__).resolve().parent
SRC = HERE / PKG



def version() -> str:
    """The stand-in's version: its `__version__` (one place)."""
    found = re.search(r'^__version__ = "([^"]+)"$', (SRC / "__init__.py").read_text(encoding="utf-8"), re.M)
    if not found:
        raise RuntimeError("no __version__ in %s" % (SRC / "__init__.py"))
    return found.group(1)


def wheel_name() -> str:
    return "%s-%s-%s.whl" % (PKG, version(), TAG)



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
    return wheel_writer.with_record(entries, dist_info)


def build_wheel(out_dir) -> Path:
    """Write ``torchvision-<version>-py3-none-any.whl`` into out_dir; return its path."""
    return wheel_writer.write(wheel_entries(), Path(out_dir) / wheel_name())


sha256_file = wheel_writer.sha256_file


def main(argv: list[str] | None = None) -> int:
    return wheel_writer.main(argv, "usage: python3 lab/standin_torchvision/build.py OUT_DIR", build_wheel)

if __name__ == "__main__":
    sys.exit(main())
