"""What we know about the engine, as data: `files/engine_advisories.yml`, one rule that checks every
entry.

An advisory says: on these engine versions, with these flags (as the engine's parser reads them), on
this GPU (compute capability) and attention backend, the engine fails (refuse) or misbehaves (warn);
here is where it was seen and what to write instead. Before, each such fact was a special case in
code (sm 12.x means triton in the GPU check; sglang 0.5.11 with fa3 on Hopper in another function);
a fact known and not written down was not checked at all (a flag 0.5.23 no longer has passed
validation and failed on the host).

Where it is checked:
- on the control machine, before connecting (configuration/service_args.py): every entry whose
  condition the data decides (no compute capability; an attention backend given in the data, or
  sglang's default);
- in the host's GPU check (operations/gpu/gpus.py): the entries that need the GPU, with its compute
  capability and the backend `attention-backend: auto` resolves to there. An entry with `prefer`
  says what `auto` resolves to where it holds (sm 12.x: triton);
- an entry on the target model's kind (`target`: hybrid or dense, read from the model's own
  config.json where its bytes are: `model_kind` in operations/remote/_common.py) by the GPU check
  where the host's store holds the model, else by the preflight once the model is staged
  (operations/service/preflight.py), before the unit is written.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from configuration.errors import DataError
from configuration.yamlload import load_file

FILE = Path(__file__).resolve().parent.parent / "files" / "engine_advisories.yml"
EFFECTS = ("refuse", "warn")
DEFAULT_BACKEND = "default"  # sglang's own choice: no attention-backend flag
_KEYS = {"id", "summary", "engine", "patch_set", "flags", "compute_capability",
         "attention_backend", "target", "effect", "replaced_by", "prefer", "reference", "fix"}
# What a target model is, read from its config.json (operations/remote/_common.py: model_kind):
# `hybrid` has layers that keep a recurrent state (linear attention, Mamba, short convolutions)
# beside its attention layers; `dense` has attention layers only.
TARGET_KINDS = ("hybrid", "dense")
_MATCH_WORDS = ("set", "unset")


@dataclass(frozen=True)
class Advisory:
    id: str
    summary: str
    effect: str
    reference: str
    fix: str
    engine: SpecifierSet | None = None
    flags: tuple[tuple[str, tuple[str, ...]], ...] = ()
    compute_capability: tuple[str, ...] | None = None
    attention_backend: tuple[str, ...] | None = None
    # the service's patch sets, one of which it must use ("none": it uses none)
    patch_set: tuple[str, ...] | None = None
    target: tuple[str, ...] | None = None  # the target model's kind (TARGET_KINDS)
    replaced_by: str | None = None
    prefer: str | None = None

    def text(self) -> str:
        """The message: what happens, where it was seen, what to write instead."""
        return f"{self.summary} [{self.id}; {self.reference}]: {self.fix}"


@dataclass(frozen=True)
class EngineUse:
    """What an advisory is judged on: the engine version, the flags as written in the unit (written
    out in full), the engine's flag list (`configuration.engine_flags.EngineFlags`, to read aliases
    and prefixes as it does; None: the flags as written)."""

    version: str | None
    args: dict[str, Any]
    engine: Any = None
    patch_sets: tuple[str, ...] = ()

    def value(self, flag: str) -> Any:
        """The value the engine reads for `flag` (None when not given)."""
        wanted = self.dest(flag)
        for given, value in self.args.items():
            if given == flag or (wanted is not None and self.dest(given) == wanted):
                return value
        return None

    def dest(self, flag: str) -> str | None:
        """The engine's dest for `flag` (None: no flag list, or a flag it does not have)."""
        if self.engine is None:
            return None
        action = self.engine.resolve(flag).action
        return action.dest if action else None

    def backend(self) -> str | None:
        """The attention backend the data names: a backend, `default` (none named), or None for
        `auto` (the host's)."""
        named = self.value("attention-backend")
        if named in (None, False):
            return DEFAULT_BACKEND
        return None if named == "auto" else str(named)



def _matches(value: Any, words: tuple[str, ...]) -> bool:
    unset = value is None or value is False
    return any((w == "unset" and unset) or (w == "set" and not unset)
               or (not unset and str(value) == w) for w in words)


def holds(advisory: Advisory, service: EngineUse, compute_capability: str | None = None,
          backend: str | None = None, target: str | None = None) -> bool | None:
    """Whether `advisory` holds for `service`: True, False, or None when that depends on what only
    the host knows (its GPU's compute capability, the backend `auto` resolves to, the target model's
    kind). `backend` overrides the data's (the host's)."""
    if advisory.engine is not None:
        try:
            if service.version is None or Version(service.version) not in advisory.engine:
                return False
        except InvalidVersion:
            return False
    if advisory.patch_set is not None and not any(
            p in advisory.patch_set for p in (service.patch_sets or ("none",))):
        return False
    if not all(_matches(service.value(flag), words) for flag, words in advisory.flags):
        return False
    unknown = False
    if advisory.target is not None:
        if target is None:
            unknown = True
        elif target not in advisory.target:
            return False
    if advisory.compute_capability is not None:
        if compute_capability is None:
            unknown = True
        elif compute_capability.split(".")[0] not in advisory.compute_capability:
            return False
    if advisory.attention_backend is not None:
        used = backend or service.backend()
        if used is None:
            unknown = True
        elif used not in advisory.attention_backend:
            return False
    return None if unknown else True


def applying(service: EngineUse, compute_capability: str | None = None, backend: str | None = None,
             entries: Iterable[Advisory] | None = None,
             target: str | None = None) -> list[Advisory]:
    """The advisories that hold for `service` (on this GPU and backend, and for this target model's
    kind, where given), in the file's order."""
    return [a for a in (load_advisories() if entries is None else entries)
            if holds(a, service, compute_capability, backend, target)]


def by_target(service: EngineUse, compute_capability: str | None = None,
              backend: str | None = None) -> dict[str, tuple[Advisory, ...]]:
    """For a target model whose kind is not known yet (not on the host when it was read): per kind,
    the advisories that would hold for it and name a target (the rest are decided without it)."""
    out = {}
    for kind in TARGET_KINDS:
        held = tuple(a for a in applying(service, compute_capability, backend, target=kind)
                     if a.target is not None)
        if held:
            out[kind] = held
    return out


def deferred(service: EngineUse, entries: Iterable[Advisory] | None = None) -> list[Advisory]:
    """The advisories the control machine cannot decide for `service`: the host's GPU check decides
    them."""
    return [a for a in (load_advisories() if entries is None else entries)
            if holds(a, service) is None]


def replacement(flag: str, version: str | None) -> Advisory | None:
    """The advisory that names what replaced `flag` in engine `version`, if one does."""
    for advisory in load_advisories():
        if advisory.replaced_by and any(f == flag for f, _ in advisory.flags) and (
                advisory.engine is None or (version is not None and _in(version, advisory.engine))):
            return advisory
    return None


def _in(version: str, spec: SpecifierSet) -> bool:
    try:
        return Version(version) in spec
    except InvalidVersion:
        return False


# The file -----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def load_advisories(path: Path = FILE) -> tuple[Advisory, ...]:
    """Every advisory of the file, checked whole (a wrong entry names its id, key and the fix)."""
    raw = load_file(path)
    shown = str(path.name)
    if (not isinstance(raw, dict) or set(raw) != {"advisories"}
            or not isinstance(raw["advisories"], list)):
        raise DataError(shown, "advisories", raw,
                        "the file is one key, `advisories`, a list of entries")
    out, seen = [], set()
    for i, entry in enumerate(raw["advisories"]):
        advisory = _entry(shown, i, entry)
        if advisory.id in seen:
            raise DataError(shown, f"advisories[{i}].id", advisory.id, "an id is given once")
        seen.add(advisory.id)
        out.append(advisory)
    return tuple(out)


def _entry(shown: str, i: int, entry: Any) -> Advisory:
    at = f"advisories[{i}]"
    if not isinstance(entry, dict):
        raise DataError(shown, at, entry, "an entry is a map (id, summary, effect, reference, fix, "
                                          "and its conditions)")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise DataError(shown, f"{at}.{unknown[0]}", entry[unknown[0]],
                        f"unknown key; allowed: {', '.join(sorted(_KEYS))}")
    for key in ("id", "summary", "effect", "reference", "fix"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise DataError(shown, f"{at}.{key}", entry.get(key), "required, a non-empty string")
    if entry["effect"] not in EFFECTS:
        raise DataError(shown, f"{at}.effect", entry["effect"], f"one of {', '.join(EFFECTS)}")
    engine = None
    if entry.get("engine") is not None:
        try:
            engine = SpecifierSet(str(entry["engine"]))
        except InvalidSpecifier:
            raise DataError(shown, f"{at}.engine", entry["engine"],
                            "a PEP 440 specifier on the sglang version, e.g. '>=0.5.20'") from None
    flags = entry.get("flags") or {}
    if not isinstance(flags, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and v and all(isinstance(w, str) for w in v)
            for k, v in flags.items()):
        raise DataError(shown, f"{at}.flags", flags,
                        "a map of flag (no dashes) -> a list of `set`, `unset` or values")
    caps, backends = entry.get("compute_capability"), entry.get("attention_backend")
    patch, target = entry.get("patch_set"), entry.get("target")
    for key, value in (("compute_capability", caps), ("attention_backend", backends),
                       ("patch_set", patch), ("target", target)):
        if value is not None and (not isinstance(value, list) or not value
                                  or not all(isinstance(v, str) for v in value)):
            raise DataError(shown, f"{at}.{key}", value, "a list of strings")
    if target is not None and not set(target) <= set(TARGET_KINDS):
        raise DataError(shown, f"{at}.target", target,
                        f"a list of the target model's kinds: {', '.join(TARGET_KINDS)}")
    return Advisory(
        id=entry["id"], summary=" ".join(entry["summary"].split()), effect=entry["effect"],
        reference=entry["reference"], fix=entry["fix"], engine=engine,
        flags=tuple((k, tuple(v)) for k, v in flags.items()),
        compute_capability=tuple(caps) if caps else None,
        attention_backend=tuple(backends) if backends else None,
        patch_set=tuple(patch) if patch else None, target=tuple(target) if target else None,
        replaced_by=entry.get("replaced_by"), prefer=entry.get("prefer"),
    )
