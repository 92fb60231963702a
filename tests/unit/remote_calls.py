"""Read back a remote-script command (`python3 - ARGS <<'PYEOF' ... PYEOF`) as (script name, argv).

Tests compare what an operation yields with literal expectations: the script is named by
matching its body against the files in operations/remote/ read here from disk, and the
arguments are split as the host's shell would split them. Building the expected command
with `remote.command` instead would let a wrong argument order pass (it is the code under test).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REMOTE_DIR = Path(__file__).resolve().parents[2] / "operations" / "remote"
_SHAPE = re.compile(r"\Apython3 - (?P<args>.*?) ?<<'PYEOF'\n(?P<body>.*)\nPYEOF\Z", re.S)


def remote_call(command) -> tuple[str, list[str]]:
    """('stage_model', ['/root/models/X', ...]) for a command that runs operations/remote/stage_model.py."""
    assert isinstance(command, str), f"not a shell command: {command!r}"
    match = _SHAPE.match(command)
    assert match, f"not a remote-script command: {command[:120]!r}"
    names = [p.stem for p in sorted(REMOTE_DIR.glob("*.py")) if p.read_text(encoding="utf-8") == match["body"]]
    assert len(names) == 1, f"the script body matches {names or 'no file'} in {REMOTE_DIR}"
    return names[0], shlex.split(match["args"])
