"""Does a patch set's code import only what the release it is built for has?

    python bench/ddtree/check_imports.py PATCH_SET_DIR RELEASE_WHEEL

A three-way merge that applies cleanly can still leave code that names something the release
does not have (a helper the change's base had and the release renamed). For every Python file
of the patch set, every `from sglang... import NAME` and `import sglang...` (at any depth, lazy
imports included) is checked statically against the release's files with the patch set laid
over them: the module must exist and define NAME (a top-level def, class, assignment or import,
or a submodule), or have a module-level `__getattr__`. Prints one line per unresolved import and
exits 1 if there is any; no code is run.
"""

from __future__ import annotations

import ast
import sys
import zipfile
from pathlib import Path

import yaml


def modules(wheel: Path, patch_set: Path) -> tuple[dict[str, str], set[str]]:
    """Module name -> source, the release's with the patch set's files over it; and which are packages."""
    sources: dict[str, str] = {}
    packages: set[str] = set()

    def add(rel: str, text: str) -> None:
        parts = rel[:-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
            packages.add(".".join(parts))
        sources[".".join(parts)] = text

    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(".py") and ".dist-info/" not in name:
                add(name, zf.read(name).decode("utf-8", errors="replace"))
    for rel in yaml.safe_load((patch_set / "patchset.yml").read_text(encoding="utf-8"))["files"]:
        if rel.endswith(".py"):
            add(rel, (patch_set / rel).read_text(encoding="utf-8"))
    return sources, packages


def defined(source: str, module: str) -> tuple[set[str], bool, list[str]]:
    """Top-level names a module defines, whether it has a module-level __getattr__, and the
    modules it star-imports (whose names it re-exports)."""
    names: set[str] = set()
    stars: list[str] = []
    tree = ast.parse(source)
    package = module

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Name):
                            names.add(sub.id)
            elif isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                stars.append(_absolute(node, package))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    names.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(node, (ast.If, ast.Try, ast.With)):  # guarded definitions count
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(node, field, []) or [])
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
    visit(tree.body)
    return names, "__getattr__" in names, stars


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module an ImportFrom names; `package` is the importing module's package."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def check(patch_set: Path, wheel: Path) -> list[str]:
    sources, packages = modules(wheel, patch_set)
    cache: dict[str, tuple[set[str], bool]] = {}

    def exported(module: str, seen: frozenset = frozenset()) -> tuple[set[str], bool]:
        if module not in cache:
            own_package = module if module in packages else module.rsplit(".", 1)[0]
            names, dynamic, stars = defined(sources[module], own_package)
            for star in stars:
                if star in sources and star not in seen:
                    more, more_dynamic = exported(star, seen | {module})
                    names |= {n for n in more if not n.startswith("_")}
                    dynamic = dynamic or more_dynamic
            cache[module] = (names, dynamic)
        return cache[module]

    def exists(module: str) -> bool:  # a module, a package, or a namespace package (no __init__.py)
        return module in sources or any(name.startswith(module + ".") for name in sources)

    problems = []
    files = yaml.safe_load((patch_set / "patchset.yml").read_text(encoding="utf-8"))["files"]
    for rel in sorted(files):
        if not rel.endswith(".py"):
            continue
        here = rel[:-3].replace("/", ".")
        package = here.rsplit(".", 1)[0] if not rel.endswith("/__init__.py") else here.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse((patch_set / rel).read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                module = _absolute(node, package)
                if not module.startswith("sglang"):
                    continue
                if not exists(module):
                    problems.append(f"{rel}:{node.lineno}: from {module} import ...: no module {module} in the release")
                    continue
                names, dynamic = exported(module) if module in sources else (set(), False)
                for alias in node.names:
                    if alias.name == "*" or alias.name in names or dynamic or exists(f"{module}.{alias.name}"):
                        continue
                    problems.append(f"{rel}:{node.lineno}: from {module} import {alias.name}: {module} has no {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("sglang") and not exists(alias.name):
                        problems.append(f"{rel}:{node.lineno}: import {alias.name}: no such module in the release")
    return problems


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    found = check(Path(sys.argv[1]), Path(sys.argv[2]))
    for line in found:
        print(line)
    print(f"imports checked: {len(found)} unresolved" if found else "imports checked: every sglang import resolves in the release")
    sys.exit(1 if found else 0)
