"""How the deploy writes a number of bytes for people: one rule for every message of the control
machine (the GPU check's fit, the prerequisites' free space, the progress lines).

The host scripts write their own (operations/model/on_host/stage_model.py `human`): they run on the
host with the standard library alone and cannot import this.
"""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """`n` bytes in the largest binary unit (B, KiB, MiB, GiB) that keeps the number at least 1:
    "512 B", "200.0 MiB", "95.6 GiB"."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
