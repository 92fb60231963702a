"""Whether a service's patch sets fit it: each exists and is written for the version its stack pins,
and a set that names the attention backends it served on holds the service to them. Checked before
any host is touched (a host would refuse a set that does not apply only after building a venv
generation for it, and a backend it never met can kill the engine on the GPU).
"""

from __future__ import annotations

from configuration import engine_flags
from configuration import patch_sets as patch_set_files
from configuration.errors import DataError
from configuration.refusals import require
from configuration.stacks import cuda_of, normalize
from configuration.typed import Arg


def check_patch_sets(src: str, key_path: str, patch_sets: tuple[str, ...], stack: str,
                     pins: dict[str, str]) -> None:
    """Each of a service's patch sets exists, and fits the stack (`pins`: the stack's distribution
    -> version)."""
    for patch_set in patch_sets:
        require((patch_set_files.PATCHES_DIR / patch_set / "patchset.yml").exists(), src, key_path,
                patch_set, "no such patch set; available: "
                           f"{', '.join(patch_set_files.available()) or '(none)'}")
        # its manifest, checked like the data
        loaded = patch_set_files.load_patch_set(patch_set)
        _fits_the_stack(stack, pins, src, key_path, loaded)
        _decodes_where_it_serves(stack, pins, src, key_path, loaded)


def _decodes_where_it_serves(stack: str, pins: dict[str, str], src: str, key_path: str,
                             patch_set: patch_set_files.PatchSet) -> None:
    """A set that only registers its algorithm for the parser (the lab's sample) passes every check
    the lab makes, and on a GPU stack would start a service that cannot decode."""
    cuda = cuda_of(pins)
    require(
        not (patch_set.parser_only and cuda), src, key_path, patch_set.name,
        f"files/patches/{patch_set.name}/patchset.yml says parser_only: it registers its algorithm "
        f"for the engine's parser and decodes nothing, and the stack {stack} serves on GPUs "
        f"(CUDA {'.'.join(map(str, cuda or ()))}): put a patch set built from the algorithm's "
        "source in its place (python -m tools.patchset_build; docs/stacks-and-patch-sets.md), or "
        "leave the service out of the hosts' run_services",
    )


def _fits_the_stack(stack: str, pins: dict[str, str], src: str, key_path: str,
                    patch_set: patch_set_files.PatchSet) -> None:
    """A patch set is written for one version of its base: over another version it would not apply
    (the host would refuse it only after building a venv generation for it). Known here, so refused
    before any host is touched."""
    pinned = pins.get(normalize(patch_set.distribution))
    require(
        pinned == patch_set.version, src, key_path, patch_set.name,
        f"files/patches/{patch_set.name}/patchset.yml is written for {patch_set.distribution} "
        f"{patch_set.version}, but the stack {stack} "
        + (f"pins {patch_set.distribution} {pinned}" if pinned
           else f"has no {patch_set.distribution}")
        + f": use a stack with {patch_set.distribution} {patch_set.version}, or port the patch set "
          f"to {pinned or 'the stack'} (python -m tools.patchset_build; "
          "docs/stacks-and-patch-sets.md)",
    )


def served_backends(src: str, args_path: str, args: list[Arg], patch_sets: tuple[str, ...]) -> None:
    """A patch set that names the attention backends it was served on (its manifest's
    `attention_backends`) holds the service to them: DDTree's port parsed, imported and passed every
    deploy on sglang's default backend (fa3 on the H200), then died capturing its CUDA graphs or at
    its first request (bench/results/ h200-2026-12-03-b2ac97c-ddtree-auto.txt), while on triton it
    served. `auto` is resolved and checked on the host."""
    unserved = patch_set_files.first_unserved(patch_sets, {a.flag: a.value for a in args})
    if unserved is not None:
        patch_set, flag, value = unserved
        arg = next((a for a in args if a.flag == flag), None)
        raise DataError(src, arg.key_path if arg else args_path, value,
                        patch_set_files.unserved_reason(*unserved))


def provides(version: str | None, patch_set: str, algorithm: str) -> bool:
    """Whether `patch_set`, built for the engine `version` the service runs, adds the speculative
    `algorithm` (a patch set written for another version of the engine does not apply to this
    one)."""
    flags = engine_flags.load(version, patch_set) if version else None
    return flags is not None and algorithm in (flags.algorithms or ())


def available_patch_sets() -> list[str]:
    return patch_set_files.available()
