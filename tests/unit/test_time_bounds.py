"""Nothing hangs (issue 46 item 7): every remote command the deploy runs through pyinfra outside an operation's own
commands (`run_shell_command`), and every local or host-side child process it starts, has a time bound, or says on
its line what bounds it (`# time bound: ...`: a stream whose peer's idle limit ends it, a child another bounded call
waits for). A source scan, so a new call without one fails here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [*sorted((ROOT / "operations").rglob("*.py")), *sorted((ROOT / "deploys").glob("*.py")),
           *sorted((ROOT / "report").glob("*.py")), *sorted((ROOT / "configuration").glob("*.py")),
           ROOT / "deploy.py", ROOT / "status.py", ROOT / "measure.py"]
SUBPROCESS = {"run", "check_output", "check_call", "call", "Popen"}
MARK = "# time bound:"


def unbounded(path: Path) -> list[str]:
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, owner = node.func.attr, node.func.value
        owner_name = owner.id if isinstance(owner, ast.Name) else ""
        remote = name == "run_shell_command"
        child = name in SUBPROCESS and owner_name in ("subprocess", "_subprocess")
        if not (remote or child):
            continue
        keywords = {k.arg for k in node.keywords}
        if keywords & {"timeout", "_timeout"}:
            continue
        span = lines[max(0, node.lineno - 4):node.end_lineno]  # the call, and a comment just above it
        if any(MARK in line for line in span):
            continue
        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node.func)}(...)")
    return found


def test_every_remote_call_and_child_process_has_a_time_bound():
    found = [entry for path in PRODUCT for entry in unbounded(path)]
    assert found == [], "calls without a time bound (give one, or say what bounds it with `# time bound: ...`):\n" + "\n".join(found)


def test_the_scan_sees_an_unbounded_call(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import subprocess\nsubprocess.run(['sleep', '9'])\nhost.run_shell_command('x', _timeout=5)\n"
                      "subprocess.Popen(['x'])  # time bound: its reader's 30 s idle limit\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert unbounded(module) == ["m.py:2: subprocess.run(...)"]
    finally:
        ROOT = saved


def test_a_call_past_its_bound_fails_naming_what_it_waited_for():
    from operations.run import remote_call
    from tests.unit.hosts import ThisMachine

    host = ThisMachine()
    ok, output = remote_call.run(host, "sleep 5", "hashing /srv/models/M on the source host", 0.5)
    assert not ok and output.stderr == "hashing /srv/models/M on the source host: no answer from gpu-b within 0.5 s"
    assert host.logs == [output.stderr]
    ok, output = remote_call.run(host, "echo fine", "saying fine", 5)
    assert ok and output.stdout.strip() == "fine"
