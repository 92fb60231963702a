"""The data's layers: the group files operators edit, the keys each layer may set, and where each
key came from.

Operators edit `group_data/<group>.yml`; the thin `group_data/<group>.py` beside each calls
`load_group_yaml(__file__)` (from configuration.settings), so pyinfra's own precedence applies
unchanged (`--data` > host data > group data > all). A key no layer may set is refused with the
closest known one (`load_group_yaml`, `no_unknown_keys`); a `.yml` without its loader is refused
(`stray_group_files`); a bad value is reported with the layer, and the file, it came from
(`Reader`).
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from configuration import connection, kinds, schema
from configuration.connection import HIDDEN
from configuration.errors import DataError
from configuration.refusals import value_of_kind
from configuration.yamlload import load_file

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Key:
    default: Any
    doc: str
    required: bool = False


def _keys(model: type[BaseModel]) -> dict[str, Key]:
    """A model's keys as the rest of the deploy reads them (defaults by name); the schema is the one
    source."""
    return {name: Key(schema.default_of(model, name), f.description,
                      bool(f.json_schema_extra.get("required")))
            for name, f in model.model_fields.items()}


# Keys any group (or host) may set, keys that belong in the inventory's host data, and a service's
# keys.
GLOBAL_KEYS: dict[str, Key] = _keys(schema.GroupData)
HOST_KEYS: dict[str, Key] = _keys(schema.HostData)
SERVICE_KEYS: dict[str, Key] = _keys(schema.ServiceSpec)


# (group, key) -> YAML file that set it last (for error messages). pyinfra merges the
# group_data folders of the deploy dir and of the inventory's dir key by key, last wins.
_KEY_SOURCES: dict[tuple[str, str], str] = {}
# group_data directories whose loaders ran: a `.yml` there without its `.py` is reported.
_GROUP_DIRS: set[Path] = set()


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def load_group_yaml(group_py_file: str) -> dict[str, Any]:
    """Load `<group>.yml` beside a `group_data/<group>.py` file and return its keys.

    The file's syntax (configuration/yamlload.py: no duplicate keys, no YAML 1.1 surprises, UTF-8)
    and top-level key names are checked here; values are validated for the whole inventory
    by `validate_inventory`, once all layers are merged.
    """
    py_path = Path(group_py_file)
    yml_path = py_path.with_suffix(".yml")
    shown = _display_path(yml_path)
    group = py_path.stem
    _GROUP_DIRS.add(py_path.resolve().parent)
    if not yml_path.exists():
        raise DataError(shown, "(file)", None, f"missing: create it, or delete {py_path.name} if "
                                               f"group '{group}' has no data")
    data = load_file(yml_path, shown)
    if data is None:
        # An empty file would silently fall back to every default (another stack, other paths).
        raise DataError(shown, "(file)", None, "empty: write the group's keys, or delete it and "
                                               f"{py_path.name} if group '{group}' has no data")
    if not isinstance(data, dict):
        raise DataError(shown, "(top level)", data, "must be a mapping of key: value")
    known = {**GLOBAL_KEYS, **HOST_KEYS}
    for key in data:
        if key not in known:
            raise DataError(shown, str(key), data[key], _unknown_key_message(key, known))
    for key in data:
        _KEY_SOURCES[(group, key)] = shown
    return data


# Keys that once meant something: the error says what replaced them rather than only "unknown key".
RETIRED_KEYS = {
    "force_patch_sets": "no longer used: a file edited by hand inside an installed package differs "
                        "from its RECORD, so the venv check reinstalls that package in a new "
                        "generation before any patch set is applied; remove the key",
}


def _unknown_key_message(key: Any, known, extra: str = "") -> str:
    if key in RETIRED_KEYS:
        return RETIRED_KEYS[key]
    refused = connection.refused_operation_arguments()
    if key in refused:
        return f"`{key}` {refused[key]}"
    return f"unknown key; allowed: {', '.join(sorted(known))}{extra}{_did_you_mean(key, known)}"


def _did_you_mean(key: Any, known) -> str:
    close = difflib.get_close_matches(str(key), list(known), n=1)
    return f" (did you mean `{close[0]}`?)" if close else ""


def stray_group_files() -> None:
    """A `group_data/<group>.yml` without its `<group>.py` loader is never read by pyinfra."""
    dirs = set(_GROUP_DIRS) | {REPO_ROOT / "group_data", Path.cwd() / "group_data"}
    if len(sys.argv) > 1 and sys.argv[1].endswith(".py"):
        dirs.add(Path(sys.argv[1]).resolve().parent / "group_data")
    for folder in sorted(dirs):
        for yml in sorted([*folder.glob("*.yml"), *folder.glob("*.yaml")]):
            if not yml.with_suffix(".py").exists():
                raise DataError(_display_path(yml), "(file)", yml.name,
                                f"has no loader {yml.stem}.py beside it, so pyinfra never reads "
                                f"it: copy group_data/all.py to {yml.stem}.py (it loads "
                                f"{yml.stem}.yml), or delete the file")


class Reader:
    """Reads one host's merged data, remembering where each top-level key came from."""

    def __init__(self, host):
        self.host = host
        self.name = host.name

    def source(self, key: str) -> str:
        inventory = self.host.inventory
        if key in inventory.get_override_data():
            return "--data"
        if key in inventory.get_host_data(self.name):
            return f"inventory (host {self.name})"
        for group in reversed(self.host.groups):
            if key in inventory.get_group_data(group):
                return _KEY_SOURCES.get((group, key), f"group_data/{group}.py")
        if key in inventory.get_data():
            return _KEY_SOURCES.get(("all", key), "group_data/all.py")
        return "defaults (configuration/settings.py)"

    def get(self, key: str, spec: Key) -> Any:
        return self.host.data.get(key, spec.default)


def precedence(source: str) -> int:
    if source == "--data":
        return 4
    if source.startswith("inventory"):
        return 3
    if source.startswith("defaults"):
        return 0
    return 1 if Path(source).stem == "all" else 2


def no_unknown_keys(host) -> None:
    """Typos in the inventory or in --data would otherwise be silently ignored; pyinfra's operation
    arguments, in any layer, would change how root runs every operation of the deploy (as another
    user, from a directory others write, with failed checks counted as passes)."""
    known = {**GLOBAL_KEYS, **HOST_KEYS}
    pyinfra_keys = connection.pyinfra_keys()
    layers = (
        ("--data", host.inventory.get_override_data()),
        (f"inventory (host {host.name})", host.inventory.get_host_data(host.name)),
    )
    for source, data in layers:
        for key in data:
            if key not in known and key not in pyinfra_keys:
                if key in RETIRED_KEYS:
                    raise DataError(source, key, data[key], _unknown_key_message(key, known))
                hint = _did_you_mean(key, [*known, *pyinfra_keys])
                raise DataError(source, key, _shown_under(key, data[key]),
                                f"unknown key; allowed: {', '.join(sorted(known))}, or one of "
                                "pyinfra's own (ssh_hostname, ssh_user, ssh_port, ssh_key, "
                                f"...){hint}")
    reader = Reader(host)
    for key, why in connection.refused_operation_arguments().items():
        if connection.set_in_any_layer(host, key):
            raise DataError(reader.source(key), key, _shown_under(key, host.data.get(key)),
                            f"`{key}` {why}")
    connection.judge_connector_keys(host, reader)
    for key, kind in (("ssh_hostname", kinds.HostName), ("ssh_port", kinds.Port)):
        if host.data.get(key) is not None:
            value_of_kind(reader.source(key), key, kind, host.data.get(key))


def _shown_under(key: Any, value: Any) -> Any:
    """A value as a message about `key` shows it: hidden under a name that says it holds a
    credential (`_sudo_password`) and under any `ssh_*` name, where a mistyped key (`ssh_pasword`)
    may hold one."""
    name = str(key).lstrip("_")
    return HIDDEN if kinds.CREDENTIAL_FLAG_WORDS.search(name) or name.startswith("ssh_") else value
