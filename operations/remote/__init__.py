"""Scripts that run on the managed hosts with the host's own `python3` (stdlib only).

They are sent inline (`python3 - ARGS <<'EOF'`), so nothing of ours is installed on a
host just to inspect it. What several scripts share lives in `_common.py`; a script's
`from _common import ...` statement is replaced by that file's text here, so each script
still travels, and runs, as one file.
"""

import ast
import functools
from pathlib import Path

_DIR = Path(__file__).parent


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


@functools.lru_cache(maxsize=None)
def script(name: str) -> str:
    """The text of remote script `name`, with _common.py in place of its `from _common import` statement."""
    body = (_DIR / f"{name}.py").read_text(encoding="utf-8")
    includes = [n for n in ast.parse(body).body if isinstance(n, ast.ImportFrom) and n.module == "_common"]
    if not includes:
        return body
    assert len(includes) == 1, f"{name}.py: one `from _common import` statement"
    include = includes[0]
    common = (_DIR / "_common.py").read_text(encoding="utf-8")
    # Inlined, an import is a definition: an alias would not exist, and a name the script
    # defines again would replace the shared one for every use in the script.
    assert all(a.asname is None for a in include.names), f"{name}.py: `from _common import x as y` cannot be inlined"
    shared = _top_level_names(ast.parse(common))
    assert {a.name for a in include.names} <= shared, f"{name}.py imports what _common.py does not define"
    lines = body.splitlines(keepends=True)
    rest = lines[: include.lineno - 1] + lines[include.end_lineno:]
    clash = shared & _top_level_names(ast.parse("".join(rest)))
    assert not clash, f"{name}.py defines {sorted(clash)} again: rename it, _common.py defines it"
    return "".join(lines[: include.lineno - 1]) + common.rstrip("\n") + "\n" + "".join(lines[include.end_lineno:])


def command(name: str, *args: str) -> str:
    """A shell command that runs remote script `name` with `args` (already shell-quoted)."""
    body = script(name)
    assert "\nPYEOF\n" not in body
    return f"python3 - {' '.join(args)} <<'PYEOF'\n{body}\nPYEOF"
