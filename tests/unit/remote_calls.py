"""Remote scripts in tests: a command read back as (script name, argv); a script loaded as a module.

Tests compare what an operation yields with literal expectations: the script is named by
matching its body against the scripts of operations/remote/, and the arguments are split
as the host's shell would split them. Building the expected command
with `remote.command` instead would let a wrong argument order pass (it is the code under test).
"""

from __future__ import annotations

import re
import shlex
import types
from pathlib import Path

from operations import remote

_SHAPE = re.compile(r"\A\(cd / && exec python3 -I - (?P<args>.*?) ?<<'PYEOF'\n(?P<body>.*)\nPYEOF\n\)\Z", re.S)


def remote_call(command) -> tuple[str, list[str]]:
    """('stage_model', ['/root/models/X', ...]) for a command that runs operations/model/on_host/stage_model.py."""
    assert isinstance(command, str), f"not a shell command: {command!r}"
    match = _SHAPE.match(command)
    assert match, f"not a remote-script command: {command[:120]!r}"
    # Which script: its text as sent (with _common.py inlined); the arguments stay literal expectations.
    names = [name for name in sorted(remote.scripts()) if remote.script(name) == match["body"]]
    assert len(names) == 1, f"the script body matches {names or 'no file'} in operations/*/on_host/"
    return names[0], shlex.split(match["args"])


def load_remote_module(name: str, module_name: str | None = None) -> types.ModuleType:
    """Remote script `name` as the host runs it (_common.py inlined), as a module: its functions, its main part not run."""
    module = types.ModuleType(module_name or name)
    module.__file__ = str(remote.script_path(name))
    exec(compile(remote.script(name), module.__file__, "exec"), module.__dict__)
    return module


def own_control_group() -> str:
    """This process's cgroup (the unified line of /proc/self/cgroup): a test's server runs in it, as the engine runs
    in its unit's, for the scripts' peer identity check (_common.peer_untrusted) with a systemctl stand-in naming it."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    return next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
