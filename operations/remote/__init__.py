"""Scripts that run on the managed hosts with the host's own `python3` (stdlib only).

They are sent inline (`python3 -I - ARGS <<'EOF'`, from `/`: `heredoc`), so nothing of ours is
installed on a host just to inspect it. Every python that root starts on a host runs isolated
(`isolated`): `-I` (no `PYTHON*` variable, no user site, neither the working directory nor the
script's on `sys.path`) and from `/`, so no directory a local user writes and no variable of the
session reaches what root imports; tests/unit/test_isolated.py holds every command to it.

Each script lives with the step that runs it, in that step's `on_host/` folder
(operations/model/on_host/stage_model.py, operations/service/on_host/wait_ready.py, ...), and is
named by its file's stem, unique across the steps (`scripts()`). What several scripts share lives
here (`SHARED_FILES`: `_common.py`, `_trust.py`, `_peer.py`); a script's `from _common import
...` statement is replaced by their text here, so each script still travels, and runs, as one file.
A long script keeps parts beside it (`_stage_files.py` beside stage_model.py), named with a leading
`_` (no script themselves), each inlined the same way where the script first imports it.
"""

import ast
import functools
from pathlib import Path

# _common.py's folder; the steps' packages, each with its `on_host/`, lie beside it
_DIR = Path(__file__).parent


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _imports(tree: ast.Module) -> list[str]:
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif (isinstance(node, ast.ImportFrom) and node.module and not node.level
              and not node.module.startswith("_")):
            names.append(node.module)
    return names


@functools.lru_cache(maxsize=None)
def _common_tree(text: str) -> ast.Module:
    return ast.parse(text)


# Every script text `script()` has returned in this process, with the modules it imports at its top
# level: a command built from one of them is ours.
_GIVEN: dict[str, tuple[str, ...]] = {}


def is_script(body: str) -> bool:
    """Is `body` the text of one of our scripts, as `script()` gave it? (Every fact builds its
    command with `script()` before anything asks: no other script need be read, inlined and parsed
    to answer.)"""
    return body in _GIVEN


def top_level_imports(body: str) -> tuple[str, ...]:
    """The modules a script (as `script()` gave it) imports at its top level, found when it was
    inlined."""
    return _GIVEN.get(body, ())


@functools.lru_cache(maxsize=None)
def scripts() -> dict[str, Path]:
    """Every host script, by name: the files of the steps' `on_host/` folders. Two steps may not
    name a script alike (a name is what every caller asks for)."""
    found: dict[str, Path] = {}
    # A name that starts with `_` is a part of a script beside it (`_inlined`), not a script.
    for path in sorted(_DIR.parent.glob("*/on_host/[!_]*.py")):
        assert path.stem not in found, (
            f"two host scripts named {path.stem}: {found.get(path.stem)} and {path}; rename one")
        found[path.stem] = path
    return found


def script_path(name: str) -> Path:
    """The file of remote script `name` as it lies here (run as it is, with `_common` not inlined,
    only by scripts that do not import it: tools/engine_flags.py runs `engine_flags` with a venv's
    Python on the control machine)."""
    try:
        return scripts()[name]
    except KeyError:
        raise KeyError(f"no host script {name!r} in operations/*/on_host/") from None


# Where a script text sent in a batch (operations/run/host_reads.py) held `shared_text()`: the batch
# carries that text once.
SHARED_MARK = "#@@sglang-deploy-shared@@"


# What the scripts share, one concern a file: names, digests and walks; trust in a path; a peer's
# identity. A script imports any of it as `from _common import ...`: the files are inlined as one
# text.
SHARED_FILES = ("_common.py", "_trust.py", "_peer.py")


@functools.lru_cache(maxsize=None)
def shared_text() -> str:
    """What the scripts share (SHARED_FILES, those that lie here), as every script that imports from
    it holds it, inlined."""
    texts = [_without_shared_imports((_DIR / name).read_text(encoding="utf-8")).rstrip("\n")
             for name in SHARED_FILES if (_DIR / name).exists()]
    return "\n\n\n".join(texts)


def _without_shared_imports(text: str) -> str:
    """A shared file's text without its `from _common import ...` (or `_trust`, `_peer`) lines: they
    name what it uses of the others, which the one inlined text defines beside it."""
    shared = {name.removesuffix(".py") for name in SHARED_FILES}
    lines = text.splitlines(keepends=True)
    for node in reversed(ast.parse(text).body):
        if isinstance(node, ast.ImportFrom) and node.module in shared and not node.level:
            del lines[node.lineno - 1:node.end_lineno]
    return "".join(lines)


def script(name: str) -> str:
    """The text of remote script `name`, with _common.py in place of its `from _common import`
    statement."""
    text, imports = _script(name)
    _GIVEN.setdefault(text, imports)
    return text


@functools.lru_cache(maxsize=None)
def _script(name: str) -> tuple[str, tuple[str, ...]]:
    """`script(name)` and its top-level imports, read, inlined and parsed once per process."""
    placed: set[str] = set()
    text, imports = _inlined(script_path(name), placed)
    return text, tuple(dict.fromkeys(imports))


def _inlined(path: Path, placed: set[str]) -> tuple[str, list[str]]:
    """The text of host script `path` with each `from _X import ...` statement replaced by what it
    names: `_common` by the shared text (`shared_text`), any other `_X` by the script's own part
    `_X.py` beside it (inlined the same way); each once, where it is first imported. `placed`: the
    parts already in the text. Its top-level imports, the parts' and the shared text's included."""
    body = path.read_text(encoding="utf-8")
    tree = ast.parse(body)
    imports = _imports(tree)
    includes = [n for n in tree.body if isinstance(n, ast.ImportFrom) and not n.level
                and n.module and n.module.startswith("_")]
    lines = body.splitlines(keepends=True)
    own = _top_level_names(tree)
    replacements = []
    for include in includes:
        first = include.module not in placed
        placed.add(include.module)
        if include.module == "_common":
            text, defined = shared_text(), _top_level_names(_common_tree(shared_text()))
            imports += _imports(_common_tree(shared_text()))
        else:
            part = path.parent / f"{include.module}.py"
            assert part.is_file(), f"{path.name} imports {include.module}: no such file beside it"
            defined = _top_level_names(ast.parse(part.read_text(encoding="utf-8")))
            text = ""
            if first:
                text, part_imports = _inlined(part, placed)
                imports += part_imports
        # Inlined, an import is a definition: an alias would not exist, and a name the script
        # defines again would replace the included one for every use in the script.
        assert all(a.asname is None for a in include.names), (
            f"{path.name}: `from {include.module} import x as y` cannot be inlined")
        assert {a.name for a in include.names} <= defined, (
            f"{path.name} imports what {include.module}.py does not define")
        # The import statement itself defines no top-level name: the script's own names are those of
        # its tree.
        clash = defined & own
        assert not clash, (
            f"{path.name} defines {sorted(clash)} again: rename it, {include.module}.py defines it")
        replacements.append((include, text if first else ""))
    for include, text in reversed(replacements):
        lines[include.lineno - 1:include.end_lineno] = [text.rstrip("\n") + "\n" if text else ""]
    return "".join(lines), imports


def _clear() -> None:
    _script.cache_clear()
    scripts.cache_clear()
    shared_text.cache_clear()


script.cache_clear = _clear  # tests that swap the scripts' or _common's directory


def isolated(interpreter: str, rest: str) -> str:
    """A shell command that runs `interpreter -I REST` from `/`, in a subshell of its own (the
    shell's own directory is left as it was for what follows). `rest`: already shell-quoted."""
    return f"(cd / && exec {interpreter} -I {rest})"


def heredoc(interpreter: str, args: str, body: str) -> str:
    """A shell command that runs the python source `body` as `interpreter -I - ARGS` from `/`, the
    source on stdin (a here-document). Redirections and pipes may follow it."""
    assert "\nPYEOF\n" not in body and not body.endswith("\nPYEOF")
    return f"(cd / && exec {interpreter} -I - {args} <<'PYEOF'\n{body}\nPYEOF\n)"


def command(name: str, *args: str) -> str:
    """A shell command that runs remote script `name` with `args` (already shell-quoted), with the
    host's own python3, isolated."""
    return heredoc("python3", " ".join(args), script(name))
