"""The deploy uses pyinfra through its public API only; what it needs beyond that lives in one adapter module.

pyinfra's internals move between releases (3.10 added fact preconditions and dropped `_get_fact_hash`; v4 is
announced): code that replaces pyinfra's methods, reads its underscore names or copies its code turns every
upgrade into a port, and a wrong port gives stale answers silently. So, over the deploy's own code (not the
tests, which may stub anything):
- no attribute of anything imported from pyinfra is assigned (`Host.get_fact = ...`, `module.fn = ...`,
  `setattr(...)`), and no pyinfra module is imported by name at run time (`importlib.import_module`);
- no underscore name of pyinfra is used: neither imported (`from pyinfra.api.facts import _handle_fact_kwargs`)
  nor read as an attribute (`proxy._get_module()`, `meta._hash`), with one exception pyinfra documents for
  nesting operations, `<operation>._inner` (docs.pyinfra.com/en/3.x/api/operations.html);
- pyinfra modules beyond its operation, fact, command and callback API are imported only by
  `operations/pyinfra_adapter.py` (and configuration/connection.py's reading of pyinfra's own global argument and
  connector key lists, which validation compares the operators' data with).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pyinfra
import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    [p for d in ("configuration", "operations", "deploys", "report", "tools") for p in (ROOT / d).rglob("*.py")]
    + [ROOT / name for name in ("deploy.py", "status.py", "measure.py", "inventory.py", "config.py")]
)
ADAPTER = ROOT / "operations" / "pyinfra_adapter.py"
# pyinfra's API for deploy authors: operations, facts, commands, state callbacks, exceptions, the context objects.
PUBLIC_MODULES = ("pyinfra", "pyinfra.api", "pyinfra.api.exceptions", "pyinfra.api.operation", "pyinfra.api.state",
                  "pyinfra.api.command", "pyinfra.operations.util")
PUBLIC_PACKAGES = ("pyinfra.facts", "pyinfra.operations")
# Validation compares the operators' data with pyinfra's own lists of global arguments and connector keys.
ALSO_ALLOWED = {("configuration/connection.py", "pyinfra.api.arguments"), ("configuration/connection.py", "pyinfra.api.connectors")}
DOCUMENTED_UNDERSCORE = {"_inner"}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _pyinfra_names(tree: ast.Module) -> set[str]:
    """Names a module binds to pyinfra modules or objects."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "pyinfra"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pyinfra":
            names |= {a.asname or a.name for a in node.names}
    return names


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


@lru_cache(maxsize=None)
def _pyinfra_underscore_names() -> frozenset[str]:
    """Every underscore name pyinfra defines: its private functions, classes, module names and attributes."""
    names = set()
    for path in Path(pyinfra.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__"))


@lru_cache(maxsize=None)
def _our_names() -> frozenset[str]:
    """Every name the deploy's own code defines (a `_run` of ours is ours, whatever pyinfra also calls one)."""
    names = set()
    for path in SOURCES:
        tree = _tree(path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
        for node in tree.body:  # a module's own names, read as `module._name`
            for target in node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return frozenset(names)


def reassignments(path: Path) -> list[str]:
    tree = _tree(path)
    ours = _pyinfra_names(tree)
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and _root(target) in ours:
                found.append(f"{_rel(path)}:{node.lineno}: assigns {ast.unparse(target)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") and node.args:
            if _root(node.args[0]) in ours:
                found.append(f"{_rel(path)}:{node.lineno}: {ast.unparse(node)[:80]}")
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args:
            if isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("pyinfra") or isinstance(node.args[0], ast.JoinedStr):
                found.append(f"{_rel(path)}:{node.lineno}: imports a pyinfra module by name: {ast.unparse(node)[:80]}")
    return found


def underscore_uses(path: Path) -> list[str]:
    tree = _tree(path)
    private = _pyinfra_underscore_names() - _our_names() - DOCUMENTED_UNDERSCORE
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pyinfra":
            found += [f"{_rel(path)}:{node.lineno}: imports {a.name} from {node.module}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Attribute) and node.attr in private:
            found.append(f"{_rel(path)}:{node.lineno}: reads pyinfra's {node.attr}: {ast.unparse(node)[:80]}")
    return found


def internal_imports(path: Path) -> list[str]:
    if path == ADAPTER:
        return []
    found = []
    for node in ast.walk(_tree(path)):
        modules = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        for module in modules:
            if module.split(".")[0] != "pyinfra" or module in PUBLIC_MODULES + PUBLIC_PACKAGES or module.startswith(tuple(p + "." for p in PUBLIC_PACKAGES)):
                continue
            if (_rel(path), module) in ALSO_ALLOWED:
                continue
            found.append(f"{_rel(path)}:{node.lineno}: imports {module}: pyinfra's internals go through operations/pyinfra_adapter.py")
    return found


@pytest.mark.parametrize("check", [reassignments, underscore_uses, internal_imports])
def test_the_deploy_uses_pyinfra_through_its_public_api(check):
    found = [line for path in SOURCES for line in check(path)]
    assert found == [], "\n".join(found)


def test_the_checks_see_what_they_are_for(tmp_path):
    """Each rule catches the shapes the deploy used before (the checks must be able to fail)."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import importlib\n"
        "from pyinfra.api.host import Host\n"
        "from pyinfra.api.facts import _handle_fact_kwargs\n"
        "from pyinfra.context import ContextObject\n"
        "Host.get_fact = lambda self, cls: None\n"
        "setattr(Host, 'put_file', None)\n"
        "arguments = importlib.import_module('pyinfra.api.arguments')\n"
        "def f(proxy, meta):\n"
        "    return proxy._get_module(), meta._hash\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert len(reassignments(planted)) == 3
        assert {line.split(": ", 1)[1].split(":")[0] for line in underscore_uses(planted)} >= {
            "imports _handle_fact_kwargs from pyinfra.api.facts", "reads pyinfra's _get_module", "reads pyinfra's _hash"}
        assert len(internal_imports(planted)) == 3  # pyinfra.api.host, pyinfra.api.facts, pyinfra.context
    finally:
        ROOT = saved
