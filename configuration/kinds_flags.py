"""Kinds of engine flags (configuration/kinds.py re-exports them): a flag's name, the flags the tool
derives from service keys, names that say they carry a credential, and a service's `args` map of
flag -> value, whose value is never shown where the flag may carry a credential. The map is read as
the engine's parser reads it in configuration/service_args.py.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from annotated_types import MinLen
from pydantic import AfterValidator, BeforeValidator, Strict, TypeAdapter, ValidationError

from configuration import engine_flags
from configuration.kinds_base import BoundedText, Int, Text, one_of, refuse, with_fix

FLAG_FIX = ("flag names are lowercase words joined by '-', as on sglang's command line (e.g. "
            "`attention-backend`)")
FLAG = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")
# Engine dests the tool derives from service keys (the parser's `dest`, so that every alias and
# prefix of `--model-path`, `--host`, `--api-key`, ... is one and the same rule).
DERIVED_DESTS = {
    "model_path": "model",
    "speculative_draft_model_path": "draft_model",
    "port": "port",
    "host": "bind",
    "config": "api_key_secret",
    "api_key": "api_key_secret",
    "admin_api_key": "admin_api_key_secret",
}
# A flag whose name says it carries a credential (the dest's words, or the flag's own when the
# engine's list does not know it): its value would sit in the world-readable unit and the process's
# argv.
CREDENTIAL_FLAG_WORDS = re.compile(
    r"(\A|_)(api_?key|admin_?key|access_?key|secret_?key|private_?key|token|auth_?token"
    r"|access_?token|hf_?token|bearer|password|passwd|passphrase|secret|secrets|credential"
    r"|credentials)(_|\Z)")

ARGS_FIX = "must be a map of sglang flag -> value, e.g. `attention-backend: triton`"
FLAG_VALUE_FIX = (
    "a flag value is a string, number, true (bare flag), false/null (omitted) or a list")


def _finite(number: float) -> float:
    if not math.isfinite(number):
        raise refuse("must be a finite number (inf and nan are no value an engine flag takes)")
    return number


def _is_word(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


# One word of a flag's value: a string or a number (a number of thousands of digits cannot even be
# written out).
FlagWord = one_of(FLAG_VALUE_FIX,
                  (lambda v: isinstance(v, str), BoundedText),
                  (lambda v: isinstance(v, int) and not isinstance(v, bool), Int),
                  (lambda v: isinstance(v, float),
                   Annotated[float, Strict(), AfterValidator(_finite)]))
# A flag's value: `true` a bare flag, `false`/null the flag left out, a word, or a list of words
# (`--flag w1 w2`).
FlagValue = Annotated[one_of(FLAG_VALUE_FIX,
                             (lambda v: v is None, type(None)),
                             (lambda v: isinstance(v, bool), Annotated[bool, Strict()]),
                             (lambda v: isinstance(v, list), Annotated[list[FlagWord], MinLen(1)]),
                             (_is_word, FlagWord)),
                      with_fix(FLAG_VALUE_FIX)]
_FLAG_VALUE = TypeAdapter(FlagValue)


def _may_carry_a_credential(flag: str) -> bool:
    """A refused value under a flag that may carry a credential is not shown: the flag's name says
    so, or an engine's parser reads it (a prefix, an alias) as a flag whose dest says so or as one
    derived from a secret (`--api-key`, and `--config`, the file that carries the keys), as
    configuration/service_args.py would hide it."""
    name = flag.removeprefix("--")
    resolved = engine_flags.any_engine().resolve(name)
    dests = [a.dest for a in ((resolved.action,) if resolved.action else resolved.candidates)]
    return (any(CREDENTIAL_FLAG_WORDS.search(word) for word in (name.replace("-", "_"), *dests))
            or any(DERIVED_DESTS.get(dest, "").endswith("_secret") for dest in dests))


def _flags_allowed(args: Any) -> Any:
    """Each flag's name, then its value, refused at `args.<flag>`; a value is not shown where the
    flag may carry a credential."""
    if not isinstance(args, dict):
        raise refuse(ARGS_FIX)
    for flag, value in args.items():
        if not isinstance(flag, str):
            raise refuse("flag names are strings such as `attention-backend`",
                         shown=flag, at=str(flag))
        if FLAG.fullmatch(flag.removeprefix("--")) is None:
            raise refuse(FLAG_FIX, shown=flag, at=flag)
        try:
            _FLAG_VALUE.validate_python(value, strict=True)
        except ValidationError as exc:
            context = exc.errors()[0]["ctx"]
            shown = "<hidden>" if _may_carry_a_credential(flag) else context.get("shown", value)
            raise refuse(context["fix"], shown=shown, at=flag) from None
    return args


ArgMap = Annotated[dict[Text, FlagValue], BeforeValidator(_flags_allowed)]
