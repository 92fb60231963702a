"""The one module of the deploy that reaches into pyinfra beyond its operation, fact and callback
API.

Everything else uses what pyinfra documents for deploy authors: `@operation`, `@deploy`, `FactBase`,
`host.get_fact`, `host.run_shell_command`, the command classes, `OperationMeta`,
`BaseStateCallback`, and an operation's `_inner` to nest it. What this deploy needs besides that is
here, each named by what it answers, so that a pyinfra upgrade has one file to read
(tests/unit/test_pyinfra_api.py keeps it so):

- the Host behind pyinfra's context proxy (a greenlet that outlives the host's load keeps the real
  one);
- the connector arguments a command or fact of the host runs with now (`_sudo`, `_su_user`, ... from
  the current operation, the deploy's arguments, the host's data and the run's config), by pyinfra's
  own public list (`CONNECTOR_ARGUMENT_KEYS`) and its own resolution (`pop_global_arguments`);
- the SSH transport under a host's pyinfra connection, for commands whose output is wanted as it
  comes (a lock's first line, a stream of model files), and pyinfra's own wrapping of a command for
  that host.

No pyinfra class or module attribute is assigned anywhere, and no underscore name of pyinfra is
used.
"""

from __future__ import annotations

import json

from pyinfra.api import StringCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.connectors.util import make_unix_command_for_host


def real_host(host):
    """The Host itself, also where `host` is pyinfra's context proxy (`from pyinfra import host`),
    which names a host only inside that host's load or operation: the inventory answers by name."""
    return host.state.inventory.get_host(host.name)


def connector_arguments(host) -> dict:
    """The connector arguments (`_sudo`, `_su_user`, `_env`, `_chdir`, `_shell_executable`, ...
    every key of pyinfra's `CONNECTOR_ARGUMENT_KEYS`) that a fact read on `host` now would run with,
    as pyinfra resolves them: the current operation's over the deploy's over the host's data over
    the run's config."""
    arguments, _ = pop_global_arguments(host.state, host,
                                        dict(host.current_op_global_arguments or {}))
    return {key: arguments.get(key) for key in CONNECTOR_ARGUMENT_KEYS}


def connector_context(host) -> str:
    """What, within one run, can change `connector_arguments(host)`: the current operation's and the
    current deploy's own connector arguments (the host's data and the config are fixed for the
    run)."""
    views = []
    for arguments in (host.current_op_global_arguments,
                      getattr(host, "current_deploy_kwargs", None)):
        views.append({key: arguments[key] for key in CONNECTOR_ARGUMENT_KEYS
                      if arguments and key in arguments})
    return json.dumps(views, sort_keys=True, default=str)


def ssh_transport(host):
    """The paramiko transport under `host`'s pyinfra SSH connection; None where it has none (another
    connector)."""
    client = getattr(getattr(host, "connector", None), "client", None)
    get_transport = getattr(client, "get_transport", None)
    return get_transport() if get_transport else None


def unix_command(host, command: str) -> str:
    """`command` as pyinfra's own command path would send it to `host` (its shell's wrapping), for a
    channel of ours."""
    return str(make_unix_command_for_host(getattr(host, "state", None), host,
                                          StringCommand(command)).get_raw_value())
