#!/usr/bin/env python3
"""Build the lab's stand-in ``sglang-kernel`` wheel (import package ``sgl_kernel``), stdlib only.

    python3 lab/standin_kernel/build.py OUT_DIR [VERSION]
    # prints "<sha256>  <wheel path>" (the format of sha256sum)

One source, one build per version, each "built against" one torch (recorded in the wheel as
``sgl_kernel/_build_info.py``): ``0.4.10+cpu`` against torch 2.13.0 (the lab's torch
2.13.0+cpu: it imports) and ``0.4.9+cpu`` against torch 2.12.0 (the lab's deliberately
mismatched pair: its import fails with the dynamic loader's ``undefined symbol`` line). The
placeholder ``sgl_kernel/common_ops.abi3.so`` is not a shared object; it is there so that the
failing path is a file the distribution's RECORD owns, as with the real kernel.

The wheel is byte-for-byte deterministic, like lab/standin/build.py: entries in a fixed order,
every timestamp 1980-01-01 00:00:00, mode 0644, no compression.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: this also runs as a script
from lab import wheel_writer  # noqa: E402

NAME = "sglang-kernel"
PKG = "sgl_kernel"
DIST = "sglang_kernel"
TAG = "py3-none-any"
# version -> the torch release it is "built against"
VERSIONS = {"0.4.10+cpu": "2.13.0", "0.4.11+cpu": "2.13.0", "0.4.9+cpu": "2.12.0"}
DEFAULT_VERSION = "0.4.10+cpu"
HERE = Path(__file__).resolve().parent
SRC = HERE / PKG

_COMMON_OPS = (
    b"sglang-kernel stand-in (lab/standin_kernel): a placeholder, not a shared object.\n"
    b"The real sglang-kernel ships its compiled ops here; sgl_kernel/__init__.py stands in for loading them.\n"
)


def wheel_name(version: str) -> str:
    return "%s-%s-%s.whl" % (DIST, version, TAG)



def _metadata(version: str) -> bytes:
    return (
        "Metadata-Version: 2.1\n"
        "Name: %s\n"
        "Version: %s\n"
        "Summary: A stand-in for sglang-kernel (no compiled ops; 'built against' torch %s) for lab hosts; not the real kernel\n"
        "License: Apache-2.0\n"
        "Requires-Python: >=3.8\n" % (NAME, version, VERSIONS[version])
    ).encode("utf-8")


def _wheel_file(version: str) -> bytes:
    return (
        "Wheel-Version: 1.0\n"
        "Generator: sglang-kernel-standin-build (%s)\n"
        "Root-Is-Purelib: true\n"
        "Tag: %s\n" % (version, TAG)
    ).encode("utf-8")


def _build_info(version: str) -> bytes:
    return (
        '"""Written by lab/standin_kernel/build.py: this build\'s version and the torch it was built against."""\n\n'
        '__version__ = "%s"\n'
        'TORCH_BUILT_AGAINST = "%s"\n' % (version, VERSIONS[version])
    ).encode("utf-8")


def wheel_entries(version: str = DEFAULT_VERSION) -> list[tuple[str, bytes]]:
    """All (archive name, content) pairs of the wheel, in archive order, RECORD last."""
    if version not in VERSIONS:
        raise ValueError("no stand-in sglang-kernel %s; known: %s" % (version, ", ".join(sorted(VERSIONS))))
    dist_info = "%s-%s.dist-info" % (DIST, version)
    entries = [("%s/__init__.py" % PKG, (SRC / "__init__.py").read_bytes())]
    entries += [
        ("%s/_build_info.py" % PKG, _build_info(version)),
        ("%s/common_ops.abi3.so" % PKG, _COMMON_OPS),
    ]
    entries.sort(key=lambda item: item[0])
    entries += [
        ("%s/METADATA" % dist_info, _metadata(version)),
        ("%s/WHEEL" % dist_info, _wheel_file(version)),
        ("%s/top_level.txt" % dist_info, (PKG + "\n").encode("utf-8")),
    ]
    return wheel_writer.with_record(entries, dist_info)


def build_wheel(out_dir, version: str = DEFAULT_VERSION) -> Path:
    """Write ``sglang_kernel-<version>-py3-none-any.whl`` into out_dir; return its path."""
    return wheel_writer.write(wheel_entries(version), Path(out_dir) / wheel_name(version))


sha256_file = wheel_writer.sha256_file


def main(argv: list[str] | None = None) -> int:
    usage = "usage: python3 lab/standin_kernel/build.py OUT_DIR [VERSION]  (%s)" % ", ".join(sorted(VERSIONS))
    return wheel_writer.main(argv, usage, build_wheel, max_args=2)

if __name__ == "__main__":
    sys.exit(main())
