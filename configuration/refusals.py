"""From the schema's refusals to the operator's message: a `DataError` naming the file, the key
path, the value and the fix.

Each kind of value (configuration/kinds.py) refuses with its fix; `validated` (a model of
configuration/schema.py) and `value_of_kind` (one value) turn the first refusal into the
`DataError`, and `require` raises one for a rule checked here, on the validated values.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from configuration.errors import DataError


def require(cond: bool, src: str, path: str, value: Any, fix: str) -> None:
    if not cond:
        raise DataError(src, path, value, fix)


def _key_path(prefix: str, loc: tuple) -> str:
    """`services.ddtree` + ('env', 'X') -> `services.ddtree.env.X`; list positions as `[0]`; a map
    key's own refusal (`[key]`) is reported at the key."""
    path = prefix
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _first_error(exc: ValidationError) -> dict:
    """The error an operator should see first: an unknown key, then a missing one, then the first in
    field order."""
    errors = exc.errors()
    for kind in ("extra_forbidden", "missing"):
        for error in errors:
            if error["type"] == kind:
                return error
    return errors[0]


def _data_error(exc: ValidationError, where, allowed: list[str], missing_doc) -> DataError:
    """`where(key) -> (source, key path prefix)` names the file and the key; the kinds name the
    fix."""
    error = _first_error(exc)
    loc = tuple(error["loc"])
    source, prefix = where(loc[0] if loc else None)
    ctx = error.get("ctx") or {}
    if "at" in ctx:
        loc = (*loc, ctx["at"])
    path = _key_path(prefix, loc[1:])
    if error["type"] == "extra_forbidden":
        return DataError(source, path, error["input"],
                         f"unknown key; allowed: {', '.join(allowed)}")
    if error["type"] == "missing":
        return DataError(source, path, None, f"required: {missing_doc(loc[0] if loc else None)}")
    shown = ctx["shown"] if "shown" in ctx else error["input"]
    return DataError(source, path, shown, ctx.get("fix") or error["msg"])


def validated(model: type[BaseModel], data: dict, where) -> BaseModel:
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        raise _data_error(exc, where, list(model.model_fields),
                          lambda key: model.model_fields[key].description) from None


@functools.lru_cache(maxsize=None)
def _adapter(kind: Any) -> TypeAdapter:
    return TypeAdapter(kind)


def value_of_kind(src: str, path: str, kind: Any, value: Any) -> Any:
    """One value of `kind` (configuration/kinds.py), or the `DataError` with its fix."""
    try:
        return _adapter(kind).validate_python(value, strict=True)
    except ValidationError as exc:
        raise _data_error(exc, lambda _: (src, path), [], lambda _: "") from None
