"""Every python that root starts on a host runs isolated (issue 46 item 1): `-I` and from `/`.

A script run as `python3 -` (or `-c`, or `-m`) puts the working directory first on `sys.path`, and every `PYTHON*`
variable of the session reaches it: with pyinfra's `_chdir: /tmp` in the data (refused now, tests/unit/
test_connector_keys.py) any local user who left a `json.py` there ran code as root at the next deploy, `--dry` or status
view. The mechanism is one pair of builders (`remote.isolated`, `remote.heredoc`); these tests hold every host command of
the product code to them (a rule over the source, not a list of call sites) and run what they build against a planted
module and variables.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

from operations import remote
from operations.run import read_batch

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [*sorted((ROOT / "operations").rglob("*.py")), *sorted((ROOT / "deploys").rglob("*.py")),
           *sorted((ROOT / "configuration").rglob("*.py")),
           *(ROOT / name for name in ("deploy.py", "status.py", "measure.py", "inventory.py", "config.py"))]

# A python started with an option other than -I, as a string of the product code writes it (`python3 -`,
# `{gen.python} -m pip`, `python3.11 -c`). `python -m tools.X` / `operations.X` / `<launcher>` are the operator's
# commands on the control machine, named in messages: this checkout's modules, which no host has.
NOT_ISOLATED = re.compile(r"python[\w.]*(?:\)|\}|'|\")*[ \t]+-(?!I\b)(?!m (?:tools|operations)\.|m <)\S*")


def _strings(path: Path):
    """(line, text) of every string literal of `path` but docstrings; an f-string's fields as `{expression}`."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(part.value if isinstance(part, ast.Constant) else "{" + ast.unparse(part.value) + "}"
                                       for part in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_product_string_starts_a_python_that_is_not_isolated():
    found = [f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r}"
             for path in PRODUCT for line, text in _strings(path) for match in NOT_ISOLATED.finditer(text)]
    assert found == [], "start it through remote.isolated / remote.heredoc (`-I`, from `/`):\n" + "\n".join(found)


@pytest.mark.parametrize("text", [
    'f"python3 - {args} <<\'PYEOF\'"', '"python3 -c " + code', 'f"{shlex.quote(gen.python)} -m pip install"',
    'f"{python} -m venv {path}"', 'f"python3.11 -c {code}"'])
def test_the_rule_finds_the_shapes_the_code_used_to_write(tmp_path, text):
    """The shapes of the commands before this rule: each is found (the test above cannot pass by matching nothing)."""
    module = tmp_path / "m.py"
    module.write_text(f"x = {text}\n")
    assert [match.group(0) for _, found in _strings(module) for match in NOT_ISOLATED.finditer(found)]


def test_the_host_unit_that_runs_our_script_runs_it_isolated():
    # The boot unit is root's python too (systemd starts it from `/`); the service's own unit runs the engine as the
    # service user, not root.
    text = (ROOT / "templates" / "sglang-stage.service.j2").read_text()
    assert re.search(r"^ExecStart=/usr/bin/python3 -I ", text, re.M)


# What the builders make, run here against a planted module and variables -------------------------------------------

PROBE = "import json, sys\nprint(json.__file__)\nprint(sys.flags.isolated, __import__('os').getcwd())\n"


@pytest.fixture
def planted(tmp_path):
    """A directory a local user writes, holding a `json.py` that says it ran; the session's cwd and PYTHONPATH."""
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "json.py").write_text("import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('root ran me')\n"
                                  "dumps = loads = None\n")
    env = {**os.environ, "PYTHONPATH": str(evil), "PYTHONSTARTUP": str(evil / "json.py")}
    return evil, env


def _run(command: str, cwd: Path, env: dict) -> str:
    done = subprocess.run(["sh", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("build", [
    lambda: remote.heredoc("python3", "a b", PROBE),
    lambda: remote.isolated("python3", "-c " + __import__("shlex").quote(PROBE)),
    lambda: remote.heredoc("python3", "", PROBE) + " | cat",
])
def test_what_the_builders_make_imports_nothing_from_the_directory_or_the_variables(planted, build):
    evil, env = planted
    out = _run(build(), evil, env).splitlines()
    assert not (evil / "RAN").exists() and not out[0].startswith(str(evil))
    assert out[1] == "1 /"


def test_the_batched_read_runs_its_scripts_isolated_too(planted, monkeypatch):
    """The host's one read (read_batch.batch_command) starts one python for all of our scripts: that one too."""
    evil, env = planted

    class Script:
        shell_executable = None
        requires_command = None

        def command(self):
            return remote.heredoc("python3", "", PROBE)

    monkeypatch.setattr(remote, "is_script", lambda body: True)
    command, python_ids = read_batch.batch_command([(0, Script(), {})])
    assert python_ids == {0}
    out = _run(command, evil, env)
    assert not (evil / "RAN").exists() and str(evil / "json.py") not in out and "1 /" in out
