"""operations/remote: each script is sent as one stdlib file, with what the scripts share (_common.py) inlined."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from operations import remote

SCRIPTS = sorted(remote.scripts())


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_is_one_file_that_imports_only_the_standard_library(name):
    tree = ast.parse(remote.script(name))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}
    assert "_common" not in imported
    # abi_probe, preflight and engine_flags run inside the served venv and import what they probe on purpose.
    allowed_third_party = {"abi_probe": {"torch", "sgl_kernel", "triton", "sglang"}, "preflight": {"sglang"}, "engine_flags": {"sglang"}}.get(name, set())
    assert imported - set(sys.stdlib_module_names) <= allowed_third_party, imported - set(sys.stdlib_module_names)


def test_a_shared_helper_is_written_once():
    shared = {"norm", "exchange", "walk_files", "systemctl_show", "file_digest", "sha256_file", "manifest_paths"}
    for name in SCRIPTS:
        text = remote.script_path(name).read_text()
        defined = {n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
        assert not defined & shared, f"{name}.py defines {defined & shared} again"


def make_script_dir(tmp_path, monkeypatch, common: str, script: str):
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "_common.py").write_text(common)
    (tmp_path / "step" / "on_host").mkdir(parents=True)
    (tmp_path / "step" / "on_host" / "x.py").write_text(script)
    monkeypatch.setattr(remote, "_DIR", tmp_path / "remote")
    remote.script.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_cache():
    remote.script.cache_clear()
    yield
    remote.script.cache_clear()


def test_the_import_statement_is_replaced_by_the_shared_file_and_runs(tmp_path, monkeypatch):
    make_script_dir(tmp_path, monkeypatch, "def twice(x):\n    return 2 * x\n",
                    "import sys\nfrom _common import (\n    twice,\n)\nprint(twice(int(sys.argv[1])))\n")
    text = remote.script("x")
    assert "_common" not in text
    assert subprocess.run([sys.executable, "-", "21"], input=text, capture_output=True, text=True).stdout == "42\n"


@pytest.mark.parametrize(("script", "message"), [
    ("from _common import twice as double\n", "cannot be inlined"),
    ("from _common import thrice\n", "does not define"),
    ("from _common import twice\n\ndef twice(x):\n    return x\n", "defines ['twice'] again"),
])
def test_an_include_that_would_change_meaning_when_inlined_is_refused(tmp_path, monkeypatch, script, message):
    make_script_dir(tmp_path, monkeypatch, "def twice(x):\n    return 2 * x\n", script)
    with pytest.raises(AssertionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        remote.script("x")


def test_a_scripts_part_is_inlined_once_with_the_shared_text_once(tmp_path, monkeypatch):
    """A host script may keep parts beside it (`_X.py`, not scripts themselves): each is inlined where first imported,
    and the shared text once, whichever of them imports it first."""
    make_script_dir(tmp_path, monkeypatch, "SHARED_MARKER = 1\ndef twice(x):\n    return 2 * x\n",
                    "import sys\nfrom _part import thrice\nfrom _common import twice\nfrom _part import thrice\n"
                    "print(twice(thrice(int(sys.argv[1]))))\n")
    (tmp_path / "step" / "on_host" / "_part.py").write_text(
        "import math\nfrom _common import twice\n\ndef thrice(x):\n    return twice(x) + x\n")
    text = remote.script("x")
    assert "from _" not in text and text.count("SHARED_MARKER = 1") == 1 and text.count("def thrice") == 1
    assert subprocess.run([sys.executable, "-", "7"], input=text, capture_output=True, text=True).stdout == "42\n"
    assert "math" in remote.top_level_imports(text)  # the part's imports are the script's (the read imports them once)
    assert sorted(remote.scripts()) == ["x"]  # a part is no script


@pytest.mark.parametrize(("part", "script", "message"), [
    (None, "from _part import thrice\n", "no such file beside it"),
    ("def thrice(x):\n    return 3 * x\n", "from _part import four\n", "does not define"),
    ("def thrice(x):\n    return 3 * x\n", "from _part import thrice\n\ndef thrice(x):\n    return x\n", "again"),
])
def test_a_part_that_would_change_meaning_when_inlined_is_refused(tmp_path, monkeypatch, part, script, message):
    make_script_dir(tmp_path, monkeypatch, "def twice(x):\n    return 2 * x\n", script)
    if part is not None:
        (tmp_path / "step" / "on_host" / "_part.py").write_text(part)
    with pytest.raises(AssertionError, match=message):
        remote.script("x")


def _constant(script: str, name: str):
    """The value a remote script assigns to `name` at its top level (a literal, or the default of `os.environ.get`)."""
    tree = ast.parse(remote.script_path(script).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call):  # os.environ.get("VARIABLE", default)
                value = value.args[1]
            return ast.literal_eval(value)
    raise AssertionError(f"{script}.py assigns no {name}")


def test_the_host_paths_a_script_keeps_a_copy_of_are_the_deploys():
    """A script travels alone (stdlib only): where it cannot be given a path as an argument, it keeps a copy of
    configuration/host_paths.py's, compared here."""
    from configuration import host_paths
    from operations.lock import lock_record
    from operations.service import rollback

    assert _constant("service_state", "RECORD_DIR") == rollback.RECORD_DIR == f"{host_paths.STATE_DIR}/started"
    assert _constant("wait_ready", "RECORD_DIR") == rollback.RECORD_DIR  # the gate's figures, beside the records
    assert _constant("lock_host", "LOCK") == host_paths.LOCK_PATH == lock_record.LOCK_PATH  # lock_record.py's copy: until it imports host_paths
    assert _constant("venv_switch", "UNIT_DIR") == host_paths.UNIT_DIR  # the units whose generations stay
    # Root's runtime directory, as root runs the script (it keeps a fallback under the home of a user who runs it).
    assert '"/run/sglang-deploy" if os.geteuid() == 0' in remote.script("stage_model") and host_paths.RUN_DIR == "/run/sglang-deploy"
