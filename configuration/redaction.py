"""The secret values this run knows, and the name each is shown as: `<secret NAME>`.

A value is registered where secrets are loaded (configuration/secrets.py: every value of the secrets
file and of the environment, used or not, and each key a service names) and where the deploy derives
one (operations/service/secrets.py: a key file's sha256). This is the registry only, a plain map of
value -> name: operations/run/redact.py reads it to replace each value, in every form it may be
printed in, in everything the run prints, and listens (`on_register`) to wrap the CLI's output
streams from the first registration on.
"""

from __future__ import annotations

from typing import Callable

# Shorter values would be found inside ordinary words; every key the deploy accepts has 16 or more.
MIN_LENGTH = 8

# value -> the name it was last registered under, in the order first registered
_REGISTERED: dict[str, str] = {}
# told of each registration (operations/run/redact.py: compiles the value's forms, wraps the output
# streams)
_LISTENERS: list[Callable[[str], None]] = []


def register(name: str, value: str) -> None:
    """Know `value` as `<secret NAME>` from now on (the name it was last registered under); too
    short a value is not registered (it would be found inside ordinary words)."""
    if not isinstance(value, str) or len(value) < MIN_LENGTH:
        return
    _REGISTERED[value] = name
    for listener in tuple(_LISTENERS):
        listener(value)


def known(value: str) -> bool:
    """Is `value` registered already (under whatever name)?"""
    return value in _REGISTERED


def registered() -> list[tuple[str, str]]:
    """(value, name) of every registered value, in the order first registered."""
    return list(_REGISTERED.items())


def on_register(listener: Callable[[str], None]) -> None:
    """Call `listener(value)` after each registration from now on (once, however often it is
    added)."""
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)
