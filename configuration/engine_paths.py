"""What the engine loads is root's or the service's: a rule over every path a service's flags and
environment name, not a list of flags.

The engine loads, runs or searches what its flag values and environment values name (a tokenizer
with remote code, a chat template, a kernel cache, a plugin directory, a `PATH`-like list). A file
there that another local user can write is code that user runs in the engine, with the engine's
key and every request. So every absolute path in a value (whole, or in a list split on `:`, `,`,
`;` or whitespace, or after `NAME=`, or as a `file://` URL) is judged twice:

- here, where the data decides: a path inside a place others write (`/tmp`, `/var/tmp`, homes, a
  world-writable `/dev/shm` outside the models the deploy stages there) is refused before any host
  is touched, naming the flag or variable, the path and who writes there;
- on the host, by the service's preflight, which runs as the service user: each named path that
  exists, and every directory above it, must be root's or the service account's and writable by
  them alone (`operations/remote/_common.py` `why_untrusted`, whose trusted owners there are root
  and the preflight's own user); the refusal names the path, its owner and mode.

The service's own StateDirectory and CacheDirectory are the service's: allowed.
"""

from __future__ import annotations

import re
from typing import Iterable

from configuration.errors import DataError
from configuration.host_paths import SERVICE_CACHE_DIR, SERVICE_STATE_DIR
from configuration.kinds_paths import WRITABLE_BY_OTHERS, inside

# Places the engine's account owns (systemd hands them to it): what it writes there is its own.
SERVICES_OWN = (SERVICE_STATE_DIR, SERVICE_CACHE_DIR)
_SPLIT = re.compile(r"[\s,;:=]+")
_PATH = re.compile(r"/[^\s,;:=]*")


def paths_in(value) -> list[str]:
    """The absolute paths a value names: itself, each element of a list, each part of a `:`, `,`,
    `;`, `=` or whitespace separated text, a `file://` URL's path. A value that is no path (`auto`,
    `0.8`, a repository id such as `Qwen/Qwen3-8B`) names none."""
    values = value if isinstance(value, (list, tuple)) else [value]
    found: list[str] = []
    for item in values:
        if not isinstance(item, str):
            continue
        text = re.sub(r"file://(?=/)", " ", item)
        for part in _SPLIT.split(text):
            if part.startswith("/") and not part.startswith("//") and _PATH.fullmatch(part):
                found.append(part)
    return list(dict.fromkeys(found))


def in_argv(argv: list[str], environment: dict[str, str]) -> list[tuple[str, str]]:
    """(where, path) for every path a unit's flags (`flag --tokenizer-path`) and environment
    (`variable HF_HOME`) name, in order: what the preflight checks on the host."""
    out: list[tuple[str, str]] = []
    flag = None
    for token in argv:
        if token.startswith("--"):
            flag, _, inline = token.partition("=")
            out += [(f"flag {flag}", p) for p in paths_in(inline)] if inline else []
            continue
        out += [(f"flag {flag}" if flag else "argument", p) for p in paths_in(token)]
    for name, value in environment.items():
        out += [(f"variable {name}", p) for p in paths_in(value)]
    return list(dict.fromkeys(out))


def others_write(path: str, staged: Iterable[str]) -> str | None:
    """Who else writes where `path` lies, or None. `staged`: the model directories the deploy stages
    (root's, in a world-writable shm dir)."""
    if any(inside(path, own) for own in SERVICES_OWN):
        return None
    if any(inside(path, model) for model in staged):
        return None
    for place, why in WRITABLE_BY_OTHERS.items():
        if place not in SERVICES_OWN and inside(path, place):
            return f"{place} ({why})"
    return None


def check(src: str, named: list[tuple[str, object]], staged: Iterable[str]) -> None:
    """Refuse the first (key path, value) of a service's flags or environment that names a path
    inside a place others write."""
    staged = tuple(staged)
    for key_path, value in named:
        for path in paths_in(value):
            place = others_write(path, staged)
            if place:
                raise DataError(
                    src, key_path, value,
                    f"names {path}, inside {place}: the engine loads, runs or searches what is "
                    "there, and another local user could put or swap a file in it first; use a "
                    "directory only root or the service account can write (e.g. under /srv or "
                    f"/root, or the service's own {SERVICE_STATE_DIR})")
