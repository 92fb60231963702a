"""A patch set that names the backends it served on, for tests: ddtree-sample's files under another name."""

from __future__ import annotations

import shutil
from pathlib import Path


def served_copy(patches: Path, name: str, backends: tuple[str, ...] = ("triton",)) -> Path:
    """Copy `patches`/ddtree-sample to `patches`/`name`, its manifest renamed and naming `backends`."""
    root = patches / name
    shutil.copytree(patches / "ddtree-sample", root)
    text = (root / "patchset.yml").read_text().replace("name: ddtree-sample", f"name: {name}")
    (root / "patchset.yml").write_text(text.replace("\nfiles:", f"\nattention_backends: [{', '.join(backends)}]\nfiles:", 1))
    return root
