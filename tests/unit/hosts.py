"""Build pyinfra hosts from plain data, without connecting, to test data validation."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pyinfra.api import Config, Inventory, State

from operations.model import transfer


def make_host(all_data: dict, host_data: dict | None = None, groups: dict | None = None, override: dict | None = None, name: str = "gpu-a"):
    """A pyinfra Host seeing `all_data` < `groups` data < `host_data` < `override` (pyinfra's precedence)."""
    group_args = {g: ([name], data) for g, data in (groups or {}).items()}
    inventory = Inventory(([(name, host_data or {})], all_data), override_data=override or {}, **group_args)
    State(inventory, Config())
    return inventory.get_host(name)


def local_listing(path: str) -> dict[str, int] | None:
    """What `transfer.StoreListing` (model/on_host/model_listing.py) says, for a model directory on this machine: regular
    files and links followed for their sizes, our own files left out."""
    root = Path(path)
    if not root.is_dir():
        return None
    out = {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))
           if p.is_file() and not p.name.startswith(transfer.OURS)}
    return out or None


class ThisMachine:
    """A host that is this machine: its commands run under `sh -c`, its store listing is read here."""

    def __init__(self, name: str = "gpu-b"):
        self.name = name
        self.logs: list[str] = []

    def log(self, text, **_):
        self.logs.append(text)

    log_styled = log

    def get_fact(self, fact, path):
        assert fact is transfer.StoreListing
        return local_listing(path)

    def run_shell_command(self, command, print_output=False, _timeout=None):
        try:
            result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=_timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(command) from None  # as pyinfra's connector does
        return result.returncode == 0, result
