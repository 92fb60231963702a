"""The engine's flags, known on the control machine without sglang installed there.

sglang's server parser is a plain `argparse.ArgumentParser` (`allow_abbrev` on): it accepts
any unambiguous prefix of an option (`--hos` is `--host`) and aliases (`--model` is
`--model-path`). A check by string equality on `args` keys is therefore no check at all. This
module resolves an `args` key the way that parser does, against the parser's real option
strings, so the derived-flag, exposure and value rules (configuration/service_args.py) apply to
what the engine will actually set.

The option strings live in `files/engine_flags/<dist>-<version>.json` (one per sglang
version a stack pins) and `<dist>-<version>+<patch set>.json` (the engine with that patch set
applied: a patch set may add flags and speculative algorithms). They are generated from the
real parser, never written by hand:

    # a venv (any Python the wheel supports) with the engine installed, e.g. the lab's:
    python -m tools.engine_flags generate /path/to/venv/bin/python
    python -m tools.engine_flags generate /path/to/venv/bin/python --patch-set ddtree-sample

(tools/engine_flags.py: it runs the engine's own parser with that Python).
tests/unit/test_engine_flags.py fails when a stack pins an engine version without a file, or a patch
set changed since its file was generated; tests/lab/test_validation.py compares the checked-in file
with a fresh dump from the lab's venv.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

FLAGS_DIR = Path(__file__).resolve().parent.parent / "files" / "engine_flags"
ENGINE = "sglang"


@dataclass(frozen=True)
class Action:
    options: tuple[str, ...]  # e.g. ("--model", "--model-path")
    dest: str  # e.g. "model_path"
    value: bool  # takes a value (False: a bare switch)
    choices: tuple[str, ...] | None

    @property
    def flag(self) -> str:
        """The action's longest option without dashes: the name messages use (`model-path`)."""
        return max(self.options, key=len).lstrip("-")


@dataclass(frozen=True)
class Resolved:
    """What the engine's parser makes of one `--flag`: an action, or why there is none."""

    action: Action | None
    candidates: tuple[Action, ...] = ()  # for an ambiguous prefix: every action it could mean


@dataclass(frozen=True)
class EngineFlags:
    label: str  # "sglang 0.5.23 + ddtree-sample"
    actions: tuple[Action, ...]
    algorithms: frozenset[str] | None
    allow_abbrev: bool = True

    @cached_property
    def by_option(self) -> dict[str, Action]:
        """Option string -> its action; built once per engine (every flag of every service of every
        host is resolved through it: rebuilt per lookup, it was most of a host's validation)."""
        return {option: action for action in self.actions for option in action.options}

    @cached_property
    def _resolved(self) -> dict[str, Resolved]:
        return {}

    def resolve(self, flag: str) -> Resolved:
        """Resolve `--<flag>` as argparse does (Python 3.11 `_parse_optional`, long options):
        an exact option string wins; else, with `allow_abbrev`, every option it prefixes; one
        action: that action, several: ambiguous (argparse refuses it), none: unknown. Each flag
        once per engine (every host's services ask the same ones)."""
        if flag not in self._resolved:
            self._resolved[flag] = self._resolve(flag)
        return self._resolved[flag]

    def _resolve(self, flag: str) -> Resolved:
        option = "--" + flag
        options = self.by_option
        if option in options:
            return Resolved(options[option])
        if not self.allow_abbrev:
            return Resolved(None)
        matches = {id(a): a for o, a in options.items() if o.startswith(option)}
        if len(matches) == 1:
            return Resolved(next(iter(matches.values())))
        return Resolved(None, tuple(sorted(matches.values(), key=lambda a: a.dest)))

    def merged(self, other: "EngineFlags") -> "EngineFlags":
        """This engine plus what a patch set's build of it adds (flags, algorithms)."""
        have = {a.dest for a in self.actions}
        actions = self.actions + tuple(a for a in other.actions if a.dest not in have)
        algorithms = (None if self.algorithms is None and other.algorithms is None
                      else (self.algorithms or frozenset()) | (other.algorithms or frozenset()))
        return EngineFlags(f"{self.label} + {other.label.split(' + ', 1)[-1]}", actions, algorithms,
                           self.allow_abbrev)


def file_for(version: str, patch_set: str | None = None) -> Path:
    return FLAGS_DIR / (f"{ENGINE}-{version}" + (f"+{patch_set}" if patch_set else "") + ".json")


@lru_cache(maxsize=None)
def load(version: str, patch_set: str | None = None) -> EngineFlags | None:
    """The engine's flags for `version` (with `patch_set` applied), or None when no file was
    generated."""
    path = file_for(version, patch_set)
    if not path.is_file():
        return None
    raw = json.loads(path.read_text(encoding="utf-8"))
    actions = tuple(
        Action(tuple(a["options"]), a["dest"], bool(a["value"]),
               tuple(a["choices"]) if a["choices"] is not None else None)
        for a in raw["actions"]
    )
    algorithms = frozenset(raw["algorithms"]) if raw.get("algorithms") is not None else None
    label = f"{ENGINE} {version}" + (f" + {patch_set}" if patch_set else "")
    return EngineFlags(label, actions, algorithms, bool(raw.get("allow_abbrev", True)))


def known_versions() -> list[str]:
    return sorted(p.stem.split("-", 1)[1] for p in FLAGS_DIR.glob(f"{ENGINE}-*.json")
                  if "+" not in p.stem)


@lru_cache(maxsize=None)
def for_engine(version: str | None, patch_sets: tuple[str, ...] = ()) -> EngineFlags | None:
    """The flags of engine `version` with `patch_sets` applied; None for a stack without the
    engine. One object per combination (its lookups are kept on it: every host asks the same)."""
    if version is None:
        return None
    flags = load(version)
    if flags is None:
        return None
    for name in patch_sets:
        patched = load(version, name)
        if patched is not None:
            flags = flags.merged(patched)
    return flags


def any_engine() -> EngineFlags:
    """Every known version's flags together: for a stack whose launcher has no engine pinned
    (a stand-in), a key that any version would read as a derived flag is refused all the same."""
    actions: dict[tuple[str, ...], Action] = {}
    for version in known_versions():
        for action in load(version).actions:
            actions.setdefault(action.options, action)
    return EngineFlags(f"{ENGINE} (any of {', '.join(known_versions()) or 'no known version'})",
                       tuple(actions.values()), None)


if __name__ == "__main__":
    raise SystemExit("the flag lists are generated by python -m tools.engine_flags generate "
                     "VENV_PYTHON [--patch-set NAME]")
