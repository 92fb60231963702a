"""One layer order, guarded: every module of the deploy imports only from layers below its own (or its own package).

    1 configuration                 the operators' data and its rules: loaded, validated, typed (imports no other layer)
    2 operations/remote             the stdlib scripts run on hosts (sent alone: they import only `_common`): each
                                    step's `on_host/` folder, and operations/remote (their loader and `_common`)
      operations/pyinfra_adapter    the one module that reaches into pyinfra's internals
      report                        the run's printed record (summary, status view, health timer): pyinfra state
                                    callbacks over plain rows; it imports nothing of the deploy, and the operations
                                    (layer 3) record into `report.summary`, so it sits below them
    3 operations                    our operations and facts, one concern each, in rooms by step (ROOMS: a room
                                    imports only from rooms below it or from itself)
    4 deploys                       the components: a deploy's steps in order, each planning itself (`plan`) and adding
                                    the operations that apply its plan
    5 views                         what a person reads (the status view's rows, the measurements): they read the
                                    deploy's plan (deploys/plan.py) and change nothing
    6 entry points                  deploy.py, status.py, measure.py (and config.py, inventory.py, group_data/*.py)
      tools                         control-machine command-line tools (`python -m tools.X`): they read the data and
                                    use operations' pure parts (`operations.environment.installer`'s pinned uv wheels), and nothing
                                    of the deploy imports them, so they sit with the entry points

The rules (each failure names the file, the line, the import and the fix):

- a module imports a project module only from a lower layer, or from its own package (layer 2's three groups, and
  layer 6's entry points and tools, do not import each other); nothing imports `tests`, `lab` or `bench`;
- a remote script (operations/*/on_host/*.py) imports nothing of the project but `from _common import ...`, which
  `operations.remote.script()` replaces by _common.py's text;
- every project import is at the top of its module (no import inside a function, class or block): what a module
  needs is seen at a glance, and an import circle cannot hide behind a late import;
- no import circle among the project's modules (strongly connected components of the module import graph);
- only configuration reads a host's data (`host.data`, `inventory.get_host(...).data`, the inventory's data
  getters): operations, deploys, report, tools and the entry points receive the validated `HostConfig`;
- every entry point that loads the data (and with it the secrets) imports operations.run.redact, which wraps the run's
  output at the first registered secret (configuration/redaction.py tells it).

The allowances below are exceptions with their reason, each to be deleted once its line is fixed: an allowance
that no longer matches anything fails too.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = {"configuration", "operations", "deploys", "views", "report", "tools", "deploy", "status", "measure", "config",
           "inventory", "group_data"}
NEVER = {"tests", "lab", "bench"}  # the deploy's code never imports its tests, its lab or its benchmarks
ENTRY_POINTS = ("deploy", "status", "measure")

# (file, the import as written): a function-level project import left in place, and why.
ALLOWED_LATE_IMPORTS: dict[tuple[str, str], str] = {}
# (file, the line as written, stripped): a read of a host's data outside configuration, and why.
ALLOWED_DATA_READS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Layer:
    group: str  # the package (or group of files) a module belongs to
    rank: int


def layer_of(module: str) -> Layer:
    if module.split(".")[0] == "configuration":
        return Layer("configuration", 1)
    if module == "operations.remote" or module.startswith("operations.remote.") or is_remote_script(module):
        return Layer("operations/remote", 2)
    if module == "operations.pyinfra_adapter":
        return Layer("operations/pyinfra_adapter", 2)
    if module.split(".")[0] == "report":
        return Layer("report", 2)
    if module.split(".")[0] == "operations":
        return Layer("operations", 3)
    if module.split(".")[0] == "deploys":
        return Layer("deploys", 4)
    if module.split(".")[0] == "views":
        return Layer("views", 5)
    if module.split(".")[0] == "tools":
        return Layer("tools", 6)
    return Layer("entry points", 6)


ORDER = "configuration 1 < operations/remote, operations/pyinfra_adapter, report 2 < operations 3 < deploys 4 < views 5 < entry points, tools 6"


def sources() -> dict[str, Path]:
    """Module name -> file, for every module of the deploy's code."""
    files = [p for package in ("configuration", "operations", "deploys", "views", "report", "tools") for p in (ROOT / package).rglob("*.py")]
    files += [*ROOT.glob("*.py"), *(ROOT / "group_data").glob("*.py")]
    out = {}
    for path in sorted(files):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = sources()


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def is_remote_script(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "operations" and (parts[1:2] == ["remote"] and len(parts) > 2 or "on_host" in parts)


# The rooms of operations/ (layer 3), by step, lowest first: what a step plans, applies and runs on the host,
# together. A room imports only from rooms below it, or from itself.
ROOMS = {
    "run": 1,          # the run's own machinery: one read per host, writes, channels, per-run state, templates
    "lock": 2,         # one deploy at a time per host
    "transport": 3,    # bytes between hosts: streams, OpenSSH, one-time keys, fan-out
    "gpu": 4,          # the GPU check and a host's prerequisites
    "environment": 4,  # the serving venv's generations, the installer, patch sets, the sandboxed engine
    "model": 4,        # models staged into the store and shm
    "service": 5,      # units, the service account, readiness gates, rollback, placement, rollout
}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "operations" and len(parts) >= 2 and parts[1] in ROOMS else None


@dataclass(frozen=True)
class Import:
    importer: str  # module name
    target: str  # the project module it loads (the deepest that exists), or the name written
    line: int
    text: str  # the statement as written
    top_level: bool  # a statement of the module's own body
    common: bool = False  # `from _common import ...` in a remote script


def _existing(name: str) -> str:
    """The deepest module of `name` (a.b.c) that exists here, else `name` itself."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in MODULES:
            return ".".join(parts[:end])
    return name


def _package_of(module: str) -> str:
    path = MODULES[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def imports_of(module: str) -> list[Import]:
    """The project modules `module` imports, each statement once per module it loads."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        common = False
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(module)
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            common = base == "_common" and not node.level and is_remote_script(module)
            if common:
                base = "operations.remote._common"  # remote.script() puts _common.py's text in its place
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        text = ast.unparse(node)
        for name in dict.fromkeys(names):
            if name.split(".")[0] in PROJECT | NEVER:
                found.append(Import(module, _existing(name), node.lineno, text, id(node) in top, common))
    return found


IMPORTS = {module: imports_of(module) for module in MODULES}


def where(imp: Import) -> str:
    return f"{rel(MODULES[imp.importer])}:{imp.line}: `{imp.text}`"


def test_every_layer_has_its_modules():
    """The map above covers the code as it is (a renamed package would otherwise pass every rule unseen)."""
    groups = {layer_of(m).group for m in MODULES}
    assert groups == {"configuration", "operations/remote", "operations/pyinfra_adapter", "report", "operations",
                      "deploys", "views", "tools", "entry points"}, groups
    assert {"deploy", "status", "measure", "operations.remote._common", "operations.pyinfra_adapter"} <= set(MODULES)


def test_a_module_imports_only_from_lower_layers_or_its_own_package():
    problems = []
    for imports in IMPORTS.values():
        for imp in imports:
            if imp.target.split(".")[0] in NEVER:
                problems.append(f"{where(imp)}: the deploy's code never imports {imp.target.split('.')[0]}/: move what "
                                f"it needs into the deploy's own layers")
                continue
            if is_remote_script(imp.importer):
                continue  # test_a_remote_script_imports_only_common
            mine, theirs = layer_of(imp.importer), layer_of(imp.target)
            if mine.group == theirs.group or theirs.rank < mine.rank:
                continue
            fix = (f"move what it uses of {imp.target} down into {'configuration' if mine.rank <= 2 else 'a layer below ' + mine.group} "
                   f"(and have {imp.target} import it from there), or have the layer above pass it in as an argument")
            if imp.importer == "operations.remote":
                fix = "the remote scripts' loader reads files; it imports nothing of the deploy"
            problems.append(f"{where(imp)} imports {imp.target} ({theirs.group}, layer {theirs.rank}) into "
                            f"{mine.group} (layer {mine.rank}): a module imports only from lower layers or its own "
                            f"package ({ORDER}). Fix: {fix}")
    assert not problems, "\n".join(problems)


def test_every_operation_lives_in_a_room_by_step():
    """operations/ is rooms by step (ROOMS), with only the remote scripts' loader and the pyinfra adapter beside them:
    a module dropped at its top would pass every other rule unseen."""
    loose = [rel(MODULES[m]) for m in MODULES
             if m.startswith("operations.") and room_of(m) is None and layer_of(m).rank == 3]
    assert not loose, (f"{loose}: put each into the room of the step that uses it (operations/<room>/: {sorted(ROOMS)}), "
                       "or into operations/run/ if every step does")
    assert {m.split(".")[1] for m in MODULES if room_of(m)} == set(ROOMS)


def test_a_room_imports_only_from_rooms_below_it_or_itself():
    problems = []
    for imports in IMPORTS.values():
        for imp in imports:
            mine, theirs = room_of(imp.importer), room_of(imp.target)
            if mine is None or theirs is None or is_remote_script(imp.importer) or mine == theirs:
                continue
            if ROOMS[theirs] < ROOMS[mine]:
                continue
            problems.append(f"{where(imp)} imports {imp.target} (room {theirs}, {ROOMS[theirs]}) into room {mine} "
                            f"({ROOMS[mine]}): a room imports only from rooms below it ({ROOMS}). Fix: move what it "
                            f"uses down into a room below both (operations/run/ if every step needs it), or pass it in "
                            "as an argument from the room above")
    assert not problems, "\n".join(problems)


def test_a_remote_script_imports_only_common():
    """A remote script is sent to a host as one file (`python3 - ARGS`): nothing of the deploy is there to import."""
    scripts = [m for m in MODULES if is_remote_script(m)]
    assert scripts
    problems = []
    for module in ["operations.remote", *scripts]:
        for imp in IMPORTS[module]:
            if imp.common:
                continue
            problems.append(f"{where(imp)}: a remote script travels alone and imports nothing of the deploy but "
                            "`from _common import NAME` (which remote.script() replaces by _common.py's text). Fix: "
                            "put what it shares with other scripts into operations/remote/_common.py and import it so, "
                            "or pass the value as an argument of the script's command")
    assert not problems, "\n".join(problems)


def test_every_project_import_is_at_the_top_of_its_module():
    found = set()
    problems = []
    for imports in IMPORTS.values():
        for imp in imports:
            if imp.top_level:
                continue
            key = (rel(MODULES[imp.importer]), imp.text)
            if key in ALLOWED_LATE_IMPORTS:
                found.add(key)
                continue
            problems.append(f"{where(imp)} is inside a function, class or block: import {imp.target} at the top of "
                            f"{rel(MODULES[imp.importer])}; if that makes an import circle, move what both modules "
                            "need into a module below both")
    stale = [f"{file}: `{text}`" for file, text in ALLOWED_LATE_IMPORTS if (file, text) not in found]
    assert not problems, "\n".join(problems)
    assert not stale, f"no longer found, delete from ALLOWED_LATE_IMPORTS in {rel(Path(__file__))}: " + "; ".join(stale)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): every strongly connected component of `graph`."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    out.append(sorted(component))
    return out


def import_graph() -> dict[str, set[str]]:
    return {module: {imp.target for imp in imports if imp.target in MODULES} for module, imports in IMPORTS.items()}


def test_the_strongly_connected_components_finder_finds_a_circle():
    assert sorted(strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})) == [["a", "b", "c"], ["d"]]
    assert strongly_connected({"a": {"a"}}) == [["a"]]


def test_no_import_circle():
    graph = import_graph()
    problems = []
    for component in strongly_connected(graph):
        if len(component) == 1 and component[0] not in graph[component[0]]:
            continue
        edges = [where(imp) for module in component for imp in IMPORTS[module] if imp.target in component]
        problems.append(f"import circle among {', '.join(component)}:\n    " + "\n    ".join(edges)
                        + "\n  Fix: move what they share into a module below all of them (a lower layer, or a small "
                          "module of their package that imports none of them), and import it from there")
    assert not problems, "\n".join(problems)


DATA_GETTERS = {"get_data", "get_host_data", "get_group_data", "get_override_data", "get_groups_data"}


def data_reads(path: Path) -> list[tuple[int, str]]:
    """(line, the line as written) of each read of a host's or the inventory's data in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for node in ast.walk(tree):
        read = (isinstance(node, ast.Attribute) and node.attr == "data"
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")))
        read |= isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in DATA_GETTERS
        if read:
            found.append((node.lineno, lines[node.lineno - 1].strip()))
    return sorted(set(found))


def test_only_configuration_reads_a_hosts_data():
    found = set()
    problems = []
    for module, path in MODULES.items():
        if layer_of(module).group == "configuration":
            continue
        for line, text in data_reads(path):
            key = (rel(path), text)
            if key in ALLOWED_DATA_READS:
                found.add(key)
                continue
            problems.append(f"{rel(path)}:{line}: `{text}` reads a host's data: {layer_of(module).group} receives "
                            "validated configuration only. Fix: validate the key in configuration (schema.py and "
                            "kinds.py, with a case in tests/unit/bad_data/), carry it in HostConfig (settings.host_config), "
                            "and pass it in from the deploy (deploys/) as an argument")
    stale = [f"{file}: `{text}`" for file, text in ALLOWED_DATA_READS if (file, text) not in found]
    assert not problems, "\n".join(problems)
    assert not stale, f"no longer found, delete from ALLOWED_DATA_READS in {rel(Path(__file__))}: " + "; ".join(stale)


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += sorted(graph.get(module, ()))
    return seen


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_an_entry_point_that_loads_secrets_wraps_the_output_first(entry):
    """configuration/secrets.py registers every secret value it loads in configuration/redaction.py, which knows nothing
    of output; operations/run/redact.py wraps the CLI's streams when told of the first one, once it is imported. Every
    import of an entry point runs before its first line loads the data, so importing it is enough."""
    loaded = reachable(import_graph(), entry)
    if "configuration.secrets" in loaded:
        assert "operations.run.redact" in loaded, (
            f"{entry}.py loads secrets (configuration.secrets) but never imports operations.run.redact: a registered secret "
            f"would reach the output. Fix: import operations.run.redact in {entry}.py or in an operation it uses")
