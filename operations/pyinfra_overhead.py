"""Two of pyinfra 3.10's costs per operation, removed with the same answers.

Profiled on a converged run of one host with 8 services (52 operations), pyinfra spent about
0.2 s of CPU adding operations, a share that grows with every host and service:
- `get_operation_order_from_stack` orders each operation by the line numbers of its call
  stack, read through `inspect.stack()` and `getframeinfo()`, which also read every frame's
  source lines (and look up its module) to show context nobody uses. Here the same frames'
  filenames and line numbers are read from the frames themselves.
- `all_global_arguments` evaluates the type hints of its argument classes on every call
  (several times per operation); they never change, so they are evaluated once.
Installed for the run by deploy.py; pinned to pyinfra 3.10 (config.py), like host_reads.
"""

from __future__ import annotations

import functools
import importlib
import sys

import pyinfra

# The modules themselves (`from pyinfra.api import operation` is the decorator, not its module).
arguments, facts, operation, util = (importlib.import_module(f"pyinfra.api.{name}") for name in ("arguments", "facts", "operation", "util"))


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


_ORIGINAL: dict = {}


def install() -> None:
    """Replace both for this process (idempotent)."""
    if _ORIGINAL:
        return
    _ORIGINAL.update(get_operation_order_from_stack=util.get_operation_order_from_stack, all_global_arguments=arguments.all_global_arguments)
    operation.get_operation_order_from_stack = operation_order_from_stack
    arguments.all_global_arguments = all_global_arguments
    facts.all_global_arguments = all_global_arguments
