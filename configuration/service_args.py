"""A service's engine flags (`args`), resolved as the engine's own parser resolves them
(configuration/engine_flags.py: aliases and unambiguous prefixes), then judged: not a flag the tool
derives from a service key, no credential, known to the pinned engine, given once, a value the
flag's action takes, values the engine would refuse only on the GPU, and the engine advisories the
data decides (configuration/advisories.py). The map's shape (flag names, value kinds) is the
schema's (configuration/schema.py, `ArgMap`).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from configuration import advisories, engine_flags, exposure, kinds
from configuration.errors import DataError
from configuration.patch_set_fit import available_patch_sets, provides
from configuration.refusals import require
from configuration.typed import Arg

# Values the engine would refuse only once it runs on the GPU (or misuse silently): refused here.
_POSITIVE_INT_DESTS = (
    "tp_size", "pp_size", "dp_size", "ep_size", "speculative_dflash_block_size",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
    "speculative_ddtree_budget",
)
_FRACTION_DESTS = ("mem_fraction_static",)
# `args` values the tool resolves itself before the unit is written (operations/gpu/gpus.py).
_RESOLVED_BY_US = {("attention_backend", "auto")}


def _argv_word(src: str, path: str, word: Any, shown: Any) -> str:
    """One word of the engine's argv: unit-safe, and never read by the engine's parser as an
    option of its own (`--host=0.0.0.0` as a value would set --host); negative numbers stay
    values."""
    rule = "must be a non-empty single line without surrounding spaces"
    text = str(word)
    found = kinds.control_character(text)
    require(found is None, src, path, shown, kinds.unit_safe_fix(rule, found) if found else "")
    require(text != "" and text.strip() == text, src, path, shown, rule)
    require(not text.startswith("-") or bool(_NUMBER_WORD.fullmatch(text)), src, path, shown,
            "a value may not start with '-' (the engine's parser would read it as another flag); "
            "only negative numbers such as -1 may")
    return text


_NUMBER_WORD = re.compile(r"-[0-9]{1,18}(\.[0-9]*)?([eE][-+]?[0-9]{1,3})?|-\.[0-9]{1,18}")


def resolve_args(src: str, path: str, value: dict, engine: engine_flags.EngineFlags | None,
                 version: str | None = None, judge_unknown: bool = False) -> list[Arg]:
    """`args` resolved as the engine's parser will read them: `engine` is the flag list of the
    service's stack and patch sets, or None for a launcher without a pinned engine (then every
    known engine version's flags are used, so a derived flag is caught whatever it is spelled).
    With `judge_unknown` (a pinned engine whose whole flag list is known), a flag its parser does
    not have is refused here (`_known_to_the_engine`)."""
    parser = engine if engine is not None else engine_flags.any_engine()
    out: list[Arg] = []
    seen: dict[str, str] = {}
    for raw_flag, flag_value in value.items():
        key_path = f"{path}.{raw_flag}"
        # a name the schema's kind let through (configuration/schema.py, `ArgMap`)
        flag = raw_flag.removeprefix("--")
        resolved = parser.resolve(flag)
        _not_derived(src, key_path, flag, flag_value, resolved)
        dest = resolved.action.dest if resolved.action else None
        exposure.no_credential(src, key_path, flag, dest)
        if judge_unknown:
            _known_to_the_engine(src, key_path, flag, flag_value, resolved, engine, version)
        if resolved.action and f"--{flag}" not in resolved.action.options:
            # A prefix: written out in full, so the unit says what the engine reads.
            flag = max((o for o in resolved.action.options if o.startswith(f"--{flag}")),
                       key=len).lstrip("-")
        ident = dest or flag
        if ident in seen:
            how = ("with and without `--`"
                   if seen[ident].removeprefix("--") == raw_flag.removeprefix("--")
                   else f"as `{seen[ident]}` and `{raw_flag}`: {parser.label} reads both as "
                        f"`--{flag}`")
            raise DataError(src, key_path, raw_flag,
                            f"`{raw_flag.removeprefix('--')}` is given twice ({how}); keep one")
        seen[ident] = str(raw_flag)
        if flag_value is None or flag_value is False:
            continue
        if flag_value is not True:
            for word in flag_value if isinstance(flag_value, list) else [flag_value]:
                _argv_word(src, key_path, word, flag_value)
            exposure.no_credential_in_urls(src, key_path, flag, flag_value)
        _fits_the_action(src, key_path, flag_value, resolved.action, parser)
        out.append(Arg(flag, flag_value, key_path, dest, src))
    return out


def _known_to_the_engine(src: str, key_path: str, flag: str, flag_value: Any, resolved, engine,
                         version: str | None) -> None:
    """A flag the pinned engine's own flag list does not have (or a prefix of several) is refused
    before connecting: its parser would refuse it on the host (`unrecognized arguments`, `ambiguous
    option`). Named with the engine, what replaced it where an advisory says
    (files/engine_advisories.yml), else the closest flags it has."""
    if resolved.action is not None:
        return
    if resolved.candidates:
        options = ", ".join(f"`--{a.flag}`" for a in resolved.candidates)
        raise DataError(src, key_path, flag_value, f"`--{flag}` is ambiguous in {engine.label}: it "
                                                   f"could mean {options}; write one out")
    renamed = advisories.replacement(flag, version)
    if renamed is not None:
        raise DataError(src, key_path, flag_value,
                        f"`--{flag}` is not a flag of {engine.label}: {renamed.text()}")
    names = sorted({o.lstrip("-") for a in engine.actions for o in a.options if o.startswith("--")})
    close = difflib.get_close_matches(flag, names, n=3, cutoff=0.6)
    hint = f"; the closest it has: {', '.join(f'`--{c}`' for c in close)}" if close else ""
    raise DataError(src, key_path, flag_value, f"`--{flag}` is not a flag of {engine.label} (its "
                                               "parser would refuse it on the host: unrecognized "
                                               f"arguments){hint}; remove it, or pin a stack whose "
                                               "engine has it")


def advisories_refused(src: str, args_path: str, args: list[Arg], engine,
                       version: str | None, patch_sets: tuple[str, ...] = ()) -> None:
    """An engine advisory (files/engine_advisories.yml) with effect `refuse` whose condition the
    data decides and which holds: refused before connecting, naming the flag it is about, the
    reference and the fix. Those that need the GPU (or warn) are the host's GPU check's
    (operations/gpu/gpus.py)."""
    judged = advisories.EngineUse(version, {a.flag: a.value for a in args}, engine, patch_sets)
    for advisory in advisories.applying(judged):
        if advisory.effect != "refuse":
            continue
        given = [a for a in args for flag, _ in advisory.flags if judged.value(flag) is not None and
                 (a.flag == flag or (a.dest is not None and judged.dest(flag) == a.dest))]
        where, value = (given[0].key_path, given[0].value) if given else (args_path, None)
        raise DataError(src, where, value, advisory.text())


def _not_derived(src: str, key_path: str, flag: str, flag_value: Any, resolved) -> None:
    derived = [a for a in ((resolved.action,) if resolved.action else resolved.candidates)
               if a.dest in kinds.DERIVED_DESTS]
    if derived:
        action = derived[0]
        how = ("" if f"--{flag}" in action.options
               else (f" (the engine's parser reads `--{flag}` as `--{action.flag}`)"
                     if resolved.action else f" (`--{flag}` could mean `--{action.flag}`)"))
        # A key written where a secret name belongs must not reach the run's output.
        shown = "<hidden>" if kinds.DERIVED_DESTS[action.dest].endswith("_secret") else flag_value
        raise DataError(src, key_path, shown,
                        f"`--{action.flag}` is derived from the service key "
                        f"`{kinds.DERIVED_DESTS[action.dest]}`{how}; set that instead")


def _fits_the_action(src: str, key_path: str, flag_value: Any, action, parser) -> None:
    if action is None:
        return
    require(flag_value is True or action.value, src, key_path, flag_value,
            f"`--{action.flag}` is a switch in {parser.label}: write `true` to set it or `false` "
            "to omit it")
    if (action.choices and flag_value is not True
            and (action.dest, flag_value) not in _RESOLVED_BY_US):
        words = flag_value if isinstance(flag_value, list) else [flag_value]
        bad = [w for w in words if str(w) not in action.choices]
        require(not bad, src, key_path, flag_value,
                f"not a choice of `--{action.flag}` in {parser.label}: {', '.join(action.choices)}")


def check_arg_values(src: str, args: list[Arg], gpus: tuple[int, ...], patch_sets: tuple[str, ...],
                      engine: engine_flags.EngineFlags | None, version: str | None = None) -> None:
    """Values the engine accepts at parse time but fails on at start (or on the GPU)."""
    by_dest = {a.dest: a for a in args if a.dest}
    for dest in _POSITIVE_INT_DESTS:
        arg = by_dest.get(dest)
        if arg is not None:
            require(kinds.positive_whole_number(arg.value) is not None, src,
                    arg.key_path, arg.value, "must be a positive whole number (ASCII digits)")
    for dest in _FRACTION_DESTS:
        arg = by_dest.get(dest)
        if arg is not None:
            fraction = kinds.decimal_number(arg.value)
            require(fraction is not None and 0 < fraction < 1, src, arg.key_path, arg.value,
                    "must be a fraction of the GPU's memory strictly between 0 and 1, e.g. 0.85")
    needed = 1
    for dest in ("tp_size", "pp_size"):
        if dest in by_dest:
            needed *= kinds.positive_whole_number(by_dest[dest].value)
    listed = len(gpus) or 1  # `gpu: auto` takes one GPU
    if needed > listed:
        arg = by_dest.get("tp_size") or by_dest["pp_size"]
        raise DataError(src, arg.key_path, arg.value,
                        f"needs {needed} GPUs (tp-size x pp-size) but the service lists {listed} "
                        f"({'auto: one GPU' if not gpus else ', '.join(map(str, gpus))}): list "
                        f"{needed} GPUs in `gpu`, or lower it")
    algorithm = by_dest.get("speculative_algorithm")
    if algorithm is not None and engine is not None and engine.algorithms is not None:
        name = str(algorithm.value).upper()
        if name not in engine.algorithms:
            providers = [p for p in available_patch_sets()
                         if p not in patch_sets and provides(version, p, name)]
            fix = (f"add a patch set that provides it to `patch_sets`: {', '.join(providers)}"
                   if providers
                   else f"use one of {', '.join(sorted(engine.algorithms - {'NONE'}))}")
            raise DataError(src, algorithm.key_path, algorithm.value,
                            f"{engine.label} has no speculative algorithm {name}: {fix}")
