"""operations/pyinfra_overhead.py gives pyinfra's own answers, without its costs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyinfra
import pytest

from operations import pyinfra_overhead
from operations.pyinfra_overhead import arguments, util


def both(state):
    # One line, so that both see the same line number for this frame.
    return util.get_operation_order_from_stack(state), pyinfra_overhead.operation_order_from_stack(state)


def nested(state, depth):
    if depth:
        return nested(
            state,
            depth - 1,
        )
    return both(state)


@pytest.mark.parametrize("deploy_file", [__file__, None, "/nowhere/deploy.py"])
@pytest.mark.parametrize("is_cli", [True, False])
@pytest.mark.parametrize("depth", [0, 3])
def test_operation_order_is_pyinfras(monkeypatch, deploy_file, is_cli, depth):
    monkeypatch.setattr(pyinfra, "is_cli", is_cli)
    state = SimpleNamespace(current_deploy_filename=deploy_file, current_op_file_number=7)
    original, ours = nested(state, depth)
    assert ours == original
    if deploy_file == __file__:
        assert len(ours) >= depth + 2  # the frames from this file on, not an empty list that trivially matches


def test_global_arguments_are_pyinfras_and_not_shared_between_callers():
    original = list(arguments.get_type_hints(arguments.AllArguments).items())
    first = pyinfra_overhead.all_global_arguments()
    assert first == original and len(first) > 10
    first.clear()
    assert pyinfra_overhead.all_global_arguments() == original


def test_install_replaces_what_pyinfra_calls(monkeypatch):
    import importlib

    operation_module = importlib.import_module("pyinfra.api.operation")
    facts_module = importlib.import_module("pyinfra.api.facts")
    for module, name in ((operation_module, "get_operation_order_from_stack"), (arguments, "all_global_arguments"),
                         (facts_module, "all_global_arguments")):
        monkeypatch.setattr(module, name, getattr(module, name))  # put back after the test
    monkeypatch.setattr(pyinfra_overhead, "_ORIGINAL", {})
    pyinfra_overhead.install()
    assert operation_module.get_operation_order_from_stack is pyinfra_overhead.operation_order_from_stack
    assert arguments.all_global_arguments is facts_module.all_global_arguments is pyinfra_overhead.all_global_arguments


def test_operation_order_is_pyinfras_from_a_deploy_file_loaded_by_a_relative_name(monkeypatch):
    """pyinfra compiles deploy.py under the name given on its command line (`deploy.py`, relative): the frames'
    own filenames match it as getframeinfo's do."""
    monkeypatch.setattr(pyinfra, "is_cli", True)
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # where deploy.py is, as when pyinfra runs
    state = SimpleNamespace(current_deploy_filename="deploy.py", current_op_file_number=3)
    namespace = {"both": both, "state": state}
    exec(compile("\n\nresult = both(state)\n", "deploy.py", "exec"), namespace)
    original, ours = namespace["result"]
    assert ours == original and ours[:2] == [3, 3]  # the op number, then the line in "deploy.py"
