# ddtree-sample patch set for sglang 0.5.23 (sglang-deploy: files/patches/ddtree-sample/).
# A parser-level sample that makes the overlay mechanism testable: it registers the
# DDTREE algorithm name and its flag and knobs, and validates them. It does NOT
# implement tree drafting or tree verification; a real DDTree patch set replaces
# these files through the same patch set format.
"""DDTree settings: the tree budget and the SGLANG_DDTREE_* environment knobs.

DDTree (DFlash with tree verification) verifies up to ``budget`` draft tokens
arranged as a tree (the root adds one: ``draft_token_num = budget + 1``).
``SGLANG_DDTREE_MAX_TOPK`` caps the tree's width (candidates per depth) and
``SGLANG_DDTREE_DEPTH_BONUS`` is added to a child's log-probability to favour
depth over width. Only the standard library is imported: ``fields/spec.py``
uses this module while the command line is parsed.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

MAX_TOPK_ENV = "SGLANG_DDTREE_MAX_TOPK"
DEPTH_BONUS_ENV = "SGLANG_DDTREE_DEPTH_BONUS"
DEFAULT_MAX_TOPK = 6
DEFAULT_DEPTH_BONUS = 0.2


@dataclass(frozen=True)
class DDTreeKnobs:
    max_topk: int
    depth_bonus: float


def ddtree_budget_from_env(environ: Mapping[str, str] | None = None) -> DDTreeKnobs:
    """Read and validate the SGLANG_DDTREE_* knobs that shape the tree a budget buys.

    ``SGLANG_DDTREE_MAX_TOPK`` must be an integer >= 1 (default 6);
    ``SGLANG_DDTREE_DEPTH_BONUS`` a finite float (default 0.2). Raises ValueError.
    """
    env = os.environ if environ is None else environ
    raw_topk = env.get(MAX_TOPK_ENV, "").strip()
    raw_bonus = env.get(DEPTH_BONUS_ENV, "").strip()
    try:
        max_topk = int(raw_topk) if raw_topk else DEFAULT_MAX_TOPK
    except ValueError:
        max_topk = 0
    if max_topk < 1:
        raise ValueError(
            f"{MAX_TOPK_ENV}={raw_topk!r}: must be an integer >= 1 (default {DEFAULT_MAX_TOPK})."
        )
    try:
        depth_bonus = float(raw_bonus) if raw_bonus else DEFAULT_DEPTH_BONUS
    except ValueError:
        depth_bonus = math.nan
    if not math.isfinite(depth_bonus):
        raise ValueError(
            f"{DEPTH_BONUS_ENV}={raw_bonus!r}: must be a finite number "
            f"(default {DEFAULT_DEPTH_BONUS})."
        )
    return DDTreeKnobs(max_topk=max_topk, depth_bonus=depth_bonus)


def check_ddtree_budget(value) -> int:
    """The budget as a positive int; raises ValueError otherwise."""
    try:
        budget = int(str(value).strip())  # str(): True and 1.5 are refused, not coerced
    except ValueError:
        budget = 0
    if budget < 1:
        raise ValueError(
            f"the DDTree budget must be a positive integer, got {value!r}."
        )
    return budget


def parse_ddtree_budget(text: str) -> int:
    """argparse ``type=`` for ``--speculative-ddtree-budget``."""
    try:
        return check_ddtree_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def validate_ddtree_server_args(budget: int | None) -> DDTreeKnobs:
    """Resolution-time check for DDTREE, on top of DFLASH's own checks."""
    if budget is not None:
        check_ddtree_budget(budget)
    return ddtree_budget_from_env()
