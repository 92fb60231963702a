"""The deploy's templates (`templates/`), rendered strictly (an unknown variable is an error) and
deterministically, with the one quoting rule for a word of a systemd unit (`systemd_quote`): the
service units (operations/service/units.py) and the boot-time staging unit
(operations/model/models.py) both render through here.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import jinja2

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
_PLAIN = re.compile(r"\A[A-Za-z0-9_./:=,+@-]+\Z")


def systemd_quote(value: str, expands_variables: bool = True) -> str:
    """Quote one word for a unit file: specifiers (%) are escaped, and variables ($) where systemd
    expands them.

    systemd expands `$VAR` in `ExecStart=` but not in `Environment=`.
    """
    text = str(value).replace("%", "%%")
    if expands_variables:
        text = text.replace("$", "$$")
    if _PLAIN.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def template(name: str) -> jinja2.Template:
    """A template from `templates/`, rendered strictly (an unknown variable is an error) and
    deterministically."""
    return _environment().get_template(name)


@functools.lru_cache(maxsize=None)
def _environment() -> jinja2.Environment:
    # One per process: it compiles each template once (a host's services share the unit template).
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["systemd_quote"] = systemd_quote
    return env
