"""How a kind of value refuses, and what every kind is built of: strict text and whole numbers,
control characters.

A kind (configuration/kinds.py, the words of configuration/schema.py) refuses with `refuse`: a
`PydanticCustomError` of type `refused` whose context holds the fix (and, where the value shown
should be another than the one refused, `shown`); configuration/refusals.py turns the first one into
a `DataError` naming the file, the key path, the value and the fix.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Any, Callable, Union

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Strict,
    TypeAdapter,
    ValidationError,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

REFUSED = "refused"
_UNSET: Any = object()  # no `shown` given: the message shows the value refused


def refuse(fix: str, shown: Any = _UNSET, at: str | None = None) -> PydanticCustomError:
    """The error a kind raises: `fix` is the message's last part (no `{}` formatting is applied to
    it); `shown`: the value the message shows, where it is another than the one refused (None too);
    `at`: a key below the one refused (a map's rule that names one of its entries)."""
    context = {"fix": fix}
    if shown is not _UNSET:
        context["shown"] = shown
    if at is not None:
        context["at"] = at
    return PydanticCustomError(REFUSED, "{fix}", context)


def with_fix(fix: str) -> WrapValidator:
    """Any refusal inside the kind (a wrong type, a value out of range) reads as the kind's own
    `fix`, except a refusal with a fix of its own (a more precise rule inside the kind), which is
    kept."""

    def wrap(value: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            own = [e for e in exc.errors() if e["type"] == REFUSED]
            if own:
                context = own[0]["ctx"]
                raise refuse(context["fix"], context.get("shown", _UNSET),
                             context.get("at")) from None
            raise refuse(fix) from None

    return WrapValidator(wrap)


def matching(pattern: str, fix: str) -> AfterValidator:
    """The whole string matches `pattern` (fullmatch: no final newline slips through `$`)."""
    compiled = re.compile(pattern)

    def check(text: str) -> str:
        if compiled.fullmatch(text) is None:
            raise refuse(fix)
        return text

    return AfterValidator(check)


def one_of(fix: str, *members: tuple[Callable[[Any], bool], Any]) -> Any:
    """A union read by the value's shape: each member is (whether a value has its shape, its kind);
    the first member whose shape fits validates the value, its refusals keeping their own key paths
    and fixes; a value of no member's shape is refused with `fix`. (pydantic's own union would try
    every member and report each one's refusal.)"""
    adapters = [(fits, TypeAdapter(kind)) for fits, kind in members]

    def validate(value: Any, handler: Callable[[Any], Any]) -> Any:
        for fits, adapter in adapters:
            if fits(value):
                return adapter.validate_python(value, strict=True)
        raise refuse(fix)

    return Annotated[Union[tuple(kind for _, kind in members)], WrapValidator(validate)]


def _not_too_long_a_number(value: Any) -> Any:
    """Python refuses int() of more than 4300 digits and repr() of such an int: a number that long
    is refused before anything converts or shows it (no value here needs more than 18 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        raise refuse("is far too large a number: no value here needs more than 18 digits",
                     shown=f"<a number of {value.bit_length()} bits>")
    return value


# Whole numbers and text -----------------------------------------------------------------------

Int = Annotated[int, Strict(), BeforeValidator(_not_too_long_a_number)]


Text = Annotated[str, Strict()]

# The longest value that may reach a command line, an environment or a unit line: the kernel takes
# at most 128 KiB for one argument, a unit's line is read whole, and a value this long is a file's
# content (name the file instead). Every judgement of a value is then bounded too.
VALUE_MAX = 32_768
# All of one service's flags and environment together: the unit's ExecStart is one logical line
# (systemd reads at most 1 MiB of one) and the kernel takes argv and environment together up to a
# quarter of the stack limit (2 MiB with the usual 8 MiB). A quarter of the smaller, with room for
# what the unit adds.
SERVICE_TEXT_MAX = 262_144


def _short_enough(text: str) -> str:
    if len(text) > VALUE_MAX:
        raise refuse(f"is {len(text)} characters long: at most {VALUE_MAX} go on an engine's "
                     "command line, environment or unit line; put a longer value in a file and "
                     "name the file")
    return text


BoundedText = Annotated[str, Strict(), AfterValidator(_short_enough)]


# Strings that reach a unit, an argv or a shell ----------------------------------------------


def control_character(text: str) -> tuple[int, str] | None:
    """The first character that changes how a unit line or a command line is read or shown: systemd
    ends a directive at `\\n` and `\\r`; `\\0`, `\\t`, `\\x1b`, U+2028 and the like are control or
    format characters."""
    for i, ch in enumerate(text):
        category = unicodedata.category(ch)
        if category[0] == "C" or category in ("Zl", "Zp"):
            return i, ch
    return None


def unit_safe_fix(rule: str, found: tuple[int, str]) -> str:
    i, ch = found
    return (f"{rule}: it contains the control character {ch!r} at position {i}, and values written "
            "into a unit or a command line may hold printable characters only (no \\n, \\r, \\t, "
            "\\0)")


def unit_safe(rule: str) -> AfterValidator:
    def check(text: str) -> str:
        found = control_character(text)
        if found:
            raise refuse(unit_safe_fix(rule, found))
        return text

    return AfterValidator(check)


# What every refusal of a credential in the data says to do instead.
SECRETS_FIX = ("a credential in the data sits in a world-readable unit file, the process's argv or "
               "environment and the run's output: keep it out of the data; the deploy passes "
               "secrets only as the API keys named by `api_key_secret`/`admin_api_key_secret` "
               "(docs/threat-model.md, \"Secrets, exposure and host keys\"), from the control "
               "machine's secrets file")

