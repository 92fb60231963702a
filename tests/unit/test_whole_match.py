"""A pattern that checks a value checks all of it: no `$` anchor where `re.match`/`re.compile` is used.

`$` matches before a final `\\n` as well as at the end, so `re.match(r"^[a-z]+$", "ok\\n")` passes a value with a
newline in it: one such pattern let `args: {"zz\\n": ...}` write a line of its own into a unit. A whole value is
checked with `re.fullmatch` or with `\\A...\\Z`. This test parses every regex literal given to `re.match`,
`re.search` or `re.compile` in the project's own files (with `re`'s own parser, so a `$` inside a character class
or escaped is not mistaken for the anchor) and fails on any end-of-line anchor, unless the call asks for
`re.MULTILINE`, where `$` is meant as the end of each line of a text.
"""

from __future__ import annotations

import ast
import os
import re
import re._constants as sre
import re._parser as sre_parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Not the project's own code: installed packages, the lab's copies of hosts, upstream files that patch sets replace.
SKIPPED = {".venv", ".git", "lab/cache", "lab/state", "files/patches", "__pycache__"}
CALLS = {"match", "search", "compile"}


def project_files() -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder).relative_to(ROOT)
        dirs[:] = [d for d in dirs if (here / d).as_posix() not in SKIPPED and d not in SKIPPED]
        found += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(found)


def has_end_of_line_anchor(tokens) -> bool:
    for op, arg in tokens:
        if op is sre.AT and arg is sre.AT_END:
            return True
        children = []
        if op is sre.SUBPATTERN:
            children = [arg[-1]]
        elif op is sre.BRANCH:
            children = arg[1]
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            children = [arg[2]]
        elif op in (sre.ASSERT, sre.ASSERT_NOT):
            children = [arg[1]]
        elif op is sre.ATOMIC_GROUP:
            children = [arg]
        elif op is sre.GROUPREF_EXISTS:
            children = [c for c in arg[1:] if c is not None]
        if any(has_end_of_line_anchor(child) for child in children):
            return True
    return False


def multiline(call: ast.Call) -> bool:
    return "MULTILINE" in ast.unparse(call) or re.search(r"\bre\.M\b", ast.unparse(call)) is not None


def offending_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CALLS
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and node.args):
            continue
        pattern = node.args[0]
        if not (isinstance(pattern, ast.Constant) and isinstance(pattern.value, str)) or multiline(node):
            continue
        if has_end_of_line_anchor(sre_parse.parse(pattern.value)):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: re.{node.func.attr}({pattern.value!r})")
    return found


def test_the_detector_sees_the_anchor_and_only_the_anchor():
    assert has_end_of_line_anchor(sre_parse.parse(r"^[a-z]+$"))
    assert has_end_of_line_anchor(sre_parse.parse(r"^a$|^b\Z"))
    assert has_end_of_line_anchor(sre_parse.parse(r"(x(y$))"))
    assert not has_end_of_line_anchor(sre_parse.parse(r"\A[a-z]+\Z"))
    assert not has_end_of_line_anchor(sre_parse.parse(r"[$]\$"))


def test_no_pattern_in_the_project_lets_a_trailing_newline_through():
    files = project_files()
    assert any(p.parts[-2:] == ("configuration", "settings.py") for p in files)
    found = [hit for path in files for hit in offending_calls(path)]
    assert found == [], "use re.fullmatch or \\A...\\Z (`$` also matches before a final newline):\n" + "\n".join(found)


def test_a_trailing_newline_is_refused_where_it_was_let_through():
    # The pattern lines changed by this rule, each with the value that used to pass.
    from configuration import kinds, patch_sets, service_args, stacks, yamlload
    from operations.run import templates

    assert not re.fullmatch(kinds.NAME, "ddtree\n") and not kinds.FLAG.fullmatch("zz\n")
    assert not kinds.ENV_NAME.fullmatch("X\n") and not service_args._NUMBER_WORD.fullmatch("-1\n")
    assert not stacks._SHA256_RE.match("0" * 64 + "\n") and not patch_sets._SHA_RE.match("0" * 64 + "\n")
    assert not yamlload._INT_OK.match("1\n")
    assert templates.systemd_quote("a\n") != "a\n"
