"""Three of pyinfra 3.10's costs per operation, removed with the same answers.

Profiled on a converged run of one host with 8 services (52 operations), pyinfra spent about
0.2 s of CPU adding operations, a share that grows with every host and service:
- `get_operation_order_from_stack` orders each operation by the line numbers of its call
  stack, read through `inspect.stack()` and `getframeinfo()`, which also read every frame's
  source lines (and look up its module) to show context nobody uses. Here the same frames'
  filenames and line numbers are read from the frames themselves.
- `all_global_arguments` evaluates the type hints of its argument classes on every call
  (several times per operation); they never change, so they are evaluated once.
- `pop_global_arguments` (every operation, and every @deploy call) looks each of the 30-odd
  global arguments up in the host's data, one `getattr(host.data, key)` each: each lookup that
  finds nothing (nearly all) evaluates every layer of the host's data, merging its groups' data
  again, and raises an AttributeError. Here the data is merged once per call (`host.data.dict()`,
  the same precedence) and each argument looked up in that: on a converged run of the lab's 2
  hosts, its 53 calls took 2-3 ms of CPU instead of 10 (timed inside the run; a profile, whose cost
  grows with every Python call, had shown ten times as much).
Installed for the run by deploy.py; pinned to pyinfra 3.10 (config.py), like host_reads.
"""

from __future__ import annotations

import copy
import functools
import importlib
import sys

import pyinfra

# The modules themselves (`from pyinfra.api import operation` is the decorator, not its module).
arguments, deploy, facts, operation, util = (
    importlib.import_module(f"pyinfra.api.{name}") for name in ("arguments", "deploy", "facts", "operation", "util")
)


def operation_order_from_stack(state) -> list[int]:
    """pyinfra.api.util.get_operation_order_from_stack, reading line numbers without source lines."""
    frames = []
    frame = sys._getframe(1)  # the caller: pyinfra's stack() started at the original function's own frame
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    # What getframeinfo() answers for a frame, read directly: its filename is the code's own (getsourcefile
    # gives it back unchanged unless it names bytecode, which compiled source never does), and its line is
    # f_lineno. getframeinfo also finds the source file, its module and the call's positions (1.7 ms per
    # operation under a profile, on a run of 16 hosts), none of which the order uses.
    infos = [(f.f_code.co_filename, f.f_lineno) for f in reversed(frames)]
    start = 0
    if state.current_deploy_filename:
        # Not found: the original kept only its own frame (pyinfra's, skipped below), i.e. nothing.
        start = next((i for i, (filename, _) in enumerate(infos) if filename == state.current_deploy_filename), len(infos))
    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    line_numbers += [lineno for filename, lineno in infos[start:] if not filename.startswith(util.PYINFRA_INSTALL_DIR)]
    return line_numbers


_PYINFRA_ALL_GLOBAL_ARGUMENTS = arguments.all_global_arguments


@functools.lru_cache(maxsize=None)
def _global_arguments() -> tuple[tuple[str, type], ...]:
    return tuple(_PYINFRA_ALL_GLOBAL_ARGUMENTS())


def all_global_arguments() -> list[tuple[str, type]]:
    return list(_global_arguments())


_PYINFRA_POP_GLOBAL_ARGUMENTS = arguments.pop_global_arguments


def pop_global_arguments(state, host, kwargs):
    """pyinfra.api.arguments.pop_global_arguments, with the host's data merged once per call, not read per argument."""
    merged = getattr(getattr(host, "data", None), "dict", None)
    if not callable(merged):
        return _PYINFRA_POP_GLOBAL_ARGUMENTS(state, host, kwargs)  # not pyinfra's HostData: its own way
    host_data = merged()
    config = state.config
    if arguments.ctx_config.isset():
        config = arguments.ctx_config.get()
        assert config is not None
    meta_kwargs = host.current_deploy_kwargs or {}
    out, found_keys = {}, []
    for key, type_ in arguments.all_global_arguments():
        argument_meta = arguments.all_argument_meta[key]
        handler = argument_meta.handler
        default = argument_meta.default(config)
        if key in host_data:
            default = copy.copy(host_data[key])  # as HostData.__getattr__ gives it: a shallow copy
        if key in kwargs:
            found_keys.append(key)
            value = kwargs.pop(key)
        else:
            value = meta_kwargs.get(key, default)
        if handler:
            value = handler(config, value)
        if value != default:
            arguments.raise_if_bad_type(value, type_, arguments.ArgumentTypeError, f"Invalid argument `{key}`:")
        out[key] = value
    return out, found_keys


_ORIGINAL: dict = {}


def install() -> None:
    """Replace all three for this process (idempotent)."""
    if _ORIGINAL:
        return
    _ORIGINAL.update(get_operation_order_from_stack=util.get_operation_order_from_stack, all_global_arguments=arguments.all_global_arguments,
                     pop_global_arguments=arguments.pop_global_arguments)
    operation.get_operation_order_from_stack = operation_order_from_stack
    arguments.all_global_arguments = all_global_arguments
    facts.all_global_arguments = all_global_arguments
    for module in (arguments, deploy, facts, operation):  # each imported it by name
        module.pop_global_arguments = pop_global_arguments
