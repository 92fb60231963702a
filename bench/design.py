"""The design figures of "Plan, then apply" (issue 47), counted from a checkout's source:

    python -m bench.design [ROOT ...]      # each ROOT a checkout (default: this one), one column each

- change records built outside their step: calls that make a `Change` (`Change(...)`, `.add(...)` on a plan,
  `.refuse(...)`) in any module but a step's own (deploys/<step>.py, and deploys/planning.py's shared helper);
- `raise OperationError` in operations/: a refusal raised by hand where a decider's `plan.Refusal` (one text for the
  plan and the host's failure) is the rule; an unread fact (a connection gone) is one of these too;
- plan_host's lines: the body of the function every view reads the plan from;
- operations/ modules over 500 lines (remote/ included);
- module-level run stores in operations/: names a function rebinds with `global`, and module-level empty
  containers (`{}`, `[]`, `set()`, `dict()`, weak-keyed dictionaries) that the run fills; `PROCESS_WIDE` names
  the registries that are no run's, and why.

Floors and circles of operations/ come from `farm-studio look operations` (not counted here).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

# Module-level containers that are no run's: filled once per process, whichever run asks.
PROCESS_WIDE = {
    "operations/run/read_batch.py:BATCHED": "the fact classes read in a host's batch, registered at import",
    "operations/run/read_batch.py:SLOW": "the same registry's slow facts",
    "operations/run/redact.py:_PATTERNS": "the process's output filter: every secret value the process was told",
    "configuration/redaction.py:_REGISTERED": "the same filter's secret values, by name",
    "configuration/redaction.py:_LISTENERS": "who is told of a new secret value (operations/run/redact.py)",
    "configuration/group_files.py:_KEY_SOURCES": "which group file set each key: filled as pyinfra loads the "
                                                 "inventory's group_data files, before any run's State exists",
    "configuration/group_files.py:_GROUP_DIRS": "the group_data folders those loads read, the same way",
}
STEP_MODULES = {"gpu_check", "environments", "models", "service_account", "service", "cleanup", "planning"}


def _py(root: Path, package: str) -> list[Path]:
    return sorted(p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts)


def _is_change_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name) and func.id == "Change":
        return True
    if isinstance(func, ast.Attribute) and func.attr in ("add", "refuse"):
        owner = func.value
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        return name in ("plan", "plan_", "host_plan") or name.endswith("plan")
    return False


def changes_outside_steps(root: Path) -> int:
    count = 0
    for package in ("operations", "deploys", "views", "report"):
        if not (root / package).is_dir():
            continue
        for path in _py(root, package):
            if path.name == "plan.py" and path.parent.name in ("operations", "run"):
                continue  # where Change is defined (HostPlan.add, refuse)
            if path.parent.name == "deploys" and path.stem in STEP_MODULES:
                continue
            tree = ast.parse(path.read_text())
            count += sum(1 for node in ast.walk(tree) if _is_change_call(node))
    return count


def raised_operation_errors(root: Path) -> int:
    count = 0
    for path in _py(root, "operations"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                if getattr(func, "id", getattr(func, "attr", None)) == "OperationError":
                    count += 1
    return count


def plan_host_lines(root: Path) -> int:
    for package in ("deploys", "operations"):
        for path in _py(root, package):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef) and node.name == "plan_host":
                    return node.end_lineno - node.lineno + 1
    return 0


def long_modules(root: Path, limit: int = 500) -> list[str]:
    return [f"{p.relative_to(root)} ({n})" for p in _py(root, "operations")
            if (n := len(p.read_text().splitlines())) > limit]


def run_stores(root: Path, packages: tuple[str, ...] = ("operations",)) -> list[str]:
    found = []
    for path in (p for package in packages if (root / package).is_dir() for p in _py(root, package)):
        if "remote" in path.parts or "on_host" in path.parts:
            continue  # scripts run on hosts: one process per call
        tree = ast.parse(path.read_text())
        rebound = {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
        for node in tree.body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
            value = getattr(node, "value", None)
            empty = (isinstance(value, (ast.Dict, ast.List, ast.Set)) and not getattr(value, "keys", None)
                     and not getattr(value, "elts", None)) or (
                isinstance(value, ast.Call) and not value.args
                and (getattr(value.func, "id", "") in ("set", "dict")
                     or getattr(value.func, "attr", "") in ("WeakKeyDictionary", "WeakValueDictionary")))
            for target in targets:
                name = f"{path.relative_to(root)}:{getattr(target, 'id', '')}"
                if (isinstance(target, ast.Name) and (empty or target.id in rebound)
                        and name not in PROCESS_WIDE):
                    found.append(name)
    return found


def figures(root: Path) -> dict[str, object]:
    return {
        "change records outside their step": changes_outside_steps(root),
        "raise OperationError in operations/": raised_operation_errors(root),
        "plan_host lines": plan_host_lines(root),
        "operations/ modules over 500 lines": len(long_modules(root)),
        "module-level run stores in operations/": len(run_stores(root)),
        "module-level run stores elsewhere": len(run_stores(root, ("report", "views", "deploys",
                                                                   "configuration"))),
    }


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or [Path(__file__).resolve().parents[1]]
    columns = [figures(root) for root in roots]
    print("figure".ljust(42) + "".join(str(r)[-24:].rjust(26) for r in roots))
    for key in columns[0]:
        print(key.ljust(42) + "".join(str(c[key]).rjust(26) for c in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
