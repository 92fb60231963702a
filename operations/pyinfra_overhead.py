"""Two of pyinfra 3.10's costs per operation, removed with the same answers.

Profiled on a converged run of one host with 8 services (52 operations), pyinfra spent about
0.2 s of CPU adding operations, a share that grows with every host and service:
- `get_operation_order_from_stack` orders each operation by the line numbers of its call
  stack, read through `inspect.stack()` and `getframeinfo()`, which also read every frame's
  source lines (and look up its module) to show context nobody uses. Here the same frames,
  filenames and line numbers come from `getframeinfo(frame, 0)`, which reads no source.
- `all_global_arguments` evaluates the type hints of its argument classes on every call
  (several times per operation); they never change, so they are evaluated once.
Installed for the run by deploy.py; pinned to pyinfra 3.10 (config.py), like host_reads.
"""

from __future__ import annotations

import functools
import importlib
import inspect
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
    infos = [inspect.getframeinfo(f, 0) for f in reversed(frames)]
    start = 0
    if state.current_deploy_filename:
        # Not found: the original kept only its own frame (pyinfra's, skipped below), i.e. nothing.
        start = next((i for i, info in enumerate(infos) if info.filename == state.current_deploy_filename), len(infos))
    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    line_numbers += [info.lineno for info in infos[start:] if not info.filename.startswith(util.PYINFRA_INSTALL_DIR)]
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
