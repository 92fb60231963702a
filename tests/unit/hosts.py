"""Build pyinfra hosts from plain data, without connecting, to test data validation."""

from __future__ import annotations

from pyinfra.api import Config, Inventory, State


def make_host(all_data: dict, host_data: dict | None = None, groups: dict | None = None, override: dict | None = None, name: str = "gpu-a"):
    """A pyinfra Host seeing `all_data` < `groups` data < `host_data` < `override` (pyinfra's precedence)."""
    group_args = {g: ([name], data) for g, data in (groups or {}).items()}
    inventory = Inventory(([(name, host_data or {})], all_data), override_data=override or {}, **group_args)
    State(inventory, Config())
    return inventory.get_host(name)
