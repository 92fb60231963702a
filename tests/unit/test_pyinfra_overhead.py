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


def _host_with_layered_data():
    """A host whose data comes from every layer pyinfra reads: override, host, two groups, all, deploy data."""
    from pyinfra.api import Config, Inventory, State

    inventory = Inventory(
        ([("web", {"_sudo_user": "from-host", "_env": {"A": "host"}})], {"_timeout": 9, "_shell_executable": "bash"}),
        override_data={"_retries": 2},
        first=(["web"], {"_sudo": True, "_env": {"A": "first group"}, "_chdir": "/srv"}),
        second=(["web"], {"_sudo": False, "_get_pty": True}),
    )
    state = State(inventory, Config())
    host = inventory.get_host("web")
    host.data._use_sudo_password = "from-override"  # set during a deploy: the override layer
    return state, host


@pytest.mark.parametrize("kwargs", [
    {},
    {"_sudo": False, "name": "an operation argument, left in place"},
    {"_env": {"B": "call"}, "_timeout": 3, "_if": [lambda: True]},
    {"_serial": True, "_run_once": True, "path": "/etc/x"},
])
@pytest.mark.parametrize("deploy_kwargs", [None, {"_sudo_user": "from-deploy", "_chdir": "/deploy"}])
def test_global_arguments_popped_are_pyinfras(kwargs, deploy_kwargs):
    """Every layer of host data, a @deploy's arguments and the call's own, in pyinfra's precedence; what is popped
    and what is left in the call's arguments are the same."""
    state, host = _host_with_layered_data()
    host.current_deploy_kwargs = deploy_kwargs
    theirs_kwargs, ours_kwargs = dict(kwargs), dict(kwargs)
    theirs = pyinfra_overhead._PYINFRA_POP_GLOBAL_ARGUMENTS(state, host, theirs_kwargs)
    ours = pyinfra_overhead.pop_global_arguments(state, host, ours_kwargs)
    assert ours == theirs and ours_kwargs == theirs_kwargs
    assert ours[0]["_retries"] == 2 and ours[0]["_get_pty"] is True  # the layers were read, not only defaults
    # Values are copies, as HostData gives them: changing one does not change the host's data.
    ours[0]["_env"]["changed"] = "here"
    assert "changed" not in host.data._env


def test_a_bad_global_argument_fails_as_in_pyinfra():
    from pyinfra.api.exceptions import ArgumentTypeError

    state, host = _host_with_layered_data()
    errors = []
    for pop in (pyinfra_overhead._PYINFRA_POP_GLOBAL_ARGUMENTS, pyinfra_overhead.pop_global_arguments):
        with pytest.raises(ArgumentTypeError) as caught:
            pop(state, host, {"_timeout": "soon"})
        errors.append(str(caught.value))
    assert errors[0] == errors[1]


def test_install_makes_every_caller_pop_global_arguments_our_way(monkeypatch):
    import importlib

    modules = [importlib.import_module(f"pyinfra.api.{name}") for name in ("arguments", "deploy", "facts", "operation")]
    for module in modules:
        monkeypatch.setattr(module, "pop_global_arguments", module.pop_global_arguments)
    for module, name in ((modules[3], "get_operation_order_from_stack"), (arguments, "all_global_arguments"), (modules[2], "all_global_arguments")):
        monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setattr(pyinfra_overhead, "_ORIGINAL", {})
    pyinfra_overhead.install()
    assert all(module.pop_global_arguments is pyinfra_overhead.pop_global_arguments for module in modules)
