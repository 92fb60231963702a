"""The engine's flag lists on the control machine: current for every pinned version, and resolved
exactly as argparse (the engine's parser, `allow_abbrev` on) resolves them."""

from __future__ import annotations

import argparse
import json

import pytest

from configuration import engine_flags, patch_sets, stacks


def pinned_versions() -> set[str]:
    return {v for name in stacks.available_stacks() if (v := stacks.load_stack(name).wanted().get("sglang"))}


def test_every_engine_version_a_stack_pins_has_its_flag_list():
    missing = [v for v in sorted(pinned_versions()) if engine_flags.load(v) is None]
    assert not missing, f"generate: python -m tools.engine_flags generate VENV_PYTHON (sglang {missing})"
    assert pinned_versions() <= set(engine_flags.known_versions())


@pytest.mark.parametrize("name", sorted(p.parent.name for p in patch_sets.PATCHES_DIR.glob("*/patchset.yml")))
def test_every_patch_set_over_a_pinned_version_has_a_current_flag_list(name):
    patch_set = patch_sets.load_patch_set(name)
    if patch_set.distribution != "sglang" or patch_set.version not in pinned_versions():
        pytest.skip(f"{name} patches no pinned sglang")
    path = engine_flags.file_for(patch_set.version, name)
    assert path.is_file(), f"generate: python -m tools.engine_flags generate VENV_PYTHON --patch-set {name}"
    stored = json.loads(path.read_text())
    assert stored["patch_set"] == {"name": name, "digest": patch_set.digest}, (
        f"{name} changed since {path.name} was generated: regenerate it (tools/engine_flags.py)"
    )


def test_the_patched_engine_adds_what_the_patch_set_adds():
    base, patched = engine_flags.for_engine("0.5.23"), engine_flags.for_engine("0.5.23", ("ddtree-sample",))
    assert "DDTREE" not in base.algorithms and "DDTREE" in patched.algorithms
    assert base.resolve("speculative-ddtree-budget").action is None
    assert patched.resolve("speculative-ddtree-budget").action.dest == "speculative_ddtree_budget"


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Refused(message)


def real_parser(flags: engine_flags.EngineFlags) -> argparse.ArgumentParser:
    """An argparse parser with the same option strings, dests and arities as the engine's."""
    parser = _Parser(prog="sglang serve", allow_abbrev=flags.allow_abbrev, add_help=False)
    for action in flags.actions:
        if action.value:
            parser.add_argument(*action.options, dest=action.dest, default=None)
        else:
            parser.add_argument(*action.options, dest=action.dest, action="store_true", default=None)
    return parser


def argparse_reads(parser: argparse.ArgumentParser, flag: str, takes_value: bool) -> str | None:
    """The dest argparse sets for `--flag`, or None (unknown or ambiguous)."""
    try:
        namespace, rest = parser.parse_known_args([f"--{flag}", "1"] if takes_value else [f"--{flag}"])
    except _Refused:
        return None
    set_dests = [k for k, v in vars(namespace).items() if v is not None]
    return set_dests[0] if set_dests else None


@pytest.mark.parametrize("version", sorted(engine_flags.known_versions()))
def test_resolution_agrees_with_argparse_for_every_prefix_of_every_option(version):
    flags = engine_flags.load(version)
    parser = real_parser(flags)
    probes = {option[2:][:n] for action in flags.actions for option in action.options for n in range(1, len(option) - 1)}
    probes |= {"hos", "api-ke", "model", "mod", "m", "x", "no-such-flag", "tp", "mem-frac", "speculative-draft"}
    disagree = []
    for probe in sorted(probes):
        ours = flags.resolve(probe)
        # argparse needs a value for value-taking options; resolve first to know which to give.
        takes_value = ours.action.value if ours.action else True
        theirs = argparse_reads(parser, probe, takes_value)
        mine = ours.action.dest if ours.action else None
        if mine != theirs:
            disagree.append((probe, mine, theirs))
    assert not disagree, disagree[:20]


def test_a_stand_in_without_a_pinned_engine_still_catches_derived_flags():
    flags = engine_flags.any_engine()
    assert flags.resolve("hos").action.dest == "host"
    assert flags.resolve("model").action.dest == "model_path"
