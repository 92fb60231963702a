"""The keys pyinfra itself reads from the data, judged before any host is touched.

pyinfra's own keys (its connectors' `data_meta` and its global arguments) pass the unknown-key
check; of those, pyinfra's operation arguments are refused wherever the data sets them
(`refused_operation_arguments`: pyinfra applies them to every operation, ours included), and
every key a connector reads is classified by one rule (`CONNECTOR_KEYS`): fine, weakening
authentication (host-key checking off, a known_hosts that keeps no key, agent forwarding), or
carrying a credential (a password, a passphrase), refused with the
reason and the fix, the value never shown. A key pyinfra reads that the table has not classified is
refused too, and tests/unit/test_connector_keys.py fails on it.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from paramiko import SSHConfig
from paramiko.ssh_exception import ConfigParseError as SSHConfigError

from configuration.errors import DataError

# pyinfra's own keys -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def pyinfra_keys() -> frozenset[str]:
    """Data keys pyinfra itself reads: its connectors' keys (ssh_hostname, ssh_user, ...) and its
    global arguments (_sudo, ...). Only these pass; `ssh_usr` is a typo like any other."""
    from pyinfra.api.arguments import all_global_arguments

    return frozenset({name for name, _ in all_global_arguments() if name.startswith("_")}
                     | set(connector_data_keys()))


@functools.lru_cache(maxsize=None)
def connector_data_keys() -> dict[str, str]:
    """Every key pyinfra's connectors read from the data (their `data_meta`), and a connector that
    reads it. Found once per process: pyinfra lists its connectors from the installed packages'
    entry points."""
    from pyinfra.api.connectors import get_all_connectors

    keys: dict[str, str] = {}
    for name, connector in sorted(get_all_connectors().items()):
        for key in getattr(connector, "data_meta", None) or {}:
            keys.setdefault(key, name)
    return keys


# Why each of pyinfra's operation arguments is refused in the data. A rule, not a list: every global
# argument the installed pyinfra takes (`all_global_arguments`) is refused wherever the data sets
# it;
# these say why for the ones whose harm is known, the rest get OPERATION_ARGUMENT.
OPERATION_ARGUMENT = ("is one of pyinfra's operation arguments, which pyinfra takes from the data "
                      "for every operation, the deploy's own checks and scripts included: the "
                      "deploy sets them per operation where they are needed; remove it")
_OPERATION_ARGUMENT_WHY = {
    "_env": ("puts variables into every command root runs on the host (a loader or interpreter "
             "variable would run code as root): remove it; a service's variables go in its `env`"),
    "_shell_executable": ("runs root's commands under another shell than the one the deploy's "
                          "scripts are written for: remove it"),
    "_chdir": ("runs every command root runs on the host from that directory, where a script could "
               "import or read what a local user left there: remove it; the deploy runs its "
               "scripts from `/`"),
    "_temp_dir": ("makes pyinfra stage root's uploads (key files, units) in a directory the deploy "
                  "neither makes nor verifies: remove it"),
    "_stdin": "feeds its text to every command root runs on the host: remove it",
    "_success_exit_codes": ("turns a failed command (a check, a probe, a readiness gate) into a "
                            "pass on every operation: remove it"),
    "_ignore_errors": ("turns every failed operation (a check, a probe, a readiness gate) into a "
                       "warning and goes on: remove it"),
    "_continue_on_error": ("runs the rest of a failed operation's commands (after a failed check "
                           "or gate): remove it"),
    "_retry_until": "decides when a failed operation counts as done: remove it",
    "_if": "decides whether each of the deploy's operations runs at all: remove it",
    "_run_once": ("runs each of the deploy's operations on the first host only; every host needs "
                  "its own: remove it"),
}


@functools.lru_cache(maxsize=None)
def refused_operation_arguments() -> dict[str, str]:
    """Every pyinfra global argument (`_sudo`, `_chdir`, `_success_exit_codes`, ...) with why the
    data may not set it. pyinfra reads each from the data for every operation it runs, ours
    included: in the data it would change how root runs the deploy's checks and scripts (from a
    directory others write, with failures counted as passes, as another user). The deploy's
    operation arguments are its own."""
    from pyinfra.api.arguments import all_global_arguments, auth_argument_meta

    escalation = ("switches the user the deploy's commands run as, which the deploy lock and the "
                  "host's read ignore, and stages uploads (key files) in a predictable /tmp path: "
                  "log in as root instead (`ssh_user: root`, or a root login through your SSH "
                  "config) and remove it")
    refused = {}
    for name, _ in all_global_arguments():
        if name.startswith("_"):
            refused[name] = (escalation if name in auth_argument_meta
                             else _OPERATION_ARGUMENT_WHY.get(name, OPERATION_ARGUMENT))
    return refused


# pyinfra's connector keys: every key a connector reads from the data, judged ----------------------
#
# A rule over the keys pyinfra's connectors read (their `data_meta`), not a list of the bad ones:
# each key is classified, a key set in the data that pyinfra reads and this table does not know is
# refused (its value unseen), and tests/unit/test_connector_keys.py fails when the installed pyinfra
# reads a key the table lacks.

FINE = "fine"
WEAKENS = "weakens authentication"
CREDENTIAL = "carries a credential"
OVERRIDES = "overrides a key the deploy reads"
HIDDEN = "<hidden>"

IMPERSONATION = ("a machine that answers at the host's address in its place would get root's "
                 "commands and the API keys")
HOST_KEYS_FIX = ("check host keys: leave `ssh_strict_host_key_checking` out (pyinfra's "
                 "`accept-new`) or set it to `yes`, name your own known_hosts file (a file only "
                 "you write, e.g. ~/.ssh/known_hosts), and enrol each new host's key "
                 "(docs/threat-model.md, \"Host keys\")")
LOGIN_FIX = ("a credential in the inventory sits in a file, in the run's output and in every "
             "process that loads it: log in with a key (`ssh_key`, or your SSH agent), and keep a "
             "key's passphrase in your agent (`ssh-add`), not in the data")
# The values with which pyinfra checks a host's key
# (sshuserclient.client.get_missing_host_key_policy): `accept-new` (its default) trusts a host's
# first key and holds it to it, `yes` only keys already known, `ask` asks you.
HOST_KEY_CHECKING = ("yes", "accept-new", "ask")


@dataclass(frozen=True)
class _Judged:
    """Why a connector key's value is refused; `at`: the entry below the key (a paramiko
    argument)."""

    why: str
    shown: Any
    at: str = ""
    fix: str = ""


@dataclass(frozen=True)
class ConnectorKey:
    """How one key a pyinfra connector reads from the data is judged. `kind`: FINE (nothing beyond
    its own kind, where it has one), CREDENTIAL (refused whenever it holds something; its value is
    never shown), OVERRIDES (refused whenever set: the deploy reads another key that says the same),
    WEAKENS (refused where `judge(value, host)` finds that the value lowers the bar). `why` says
    what a CREDENTIAL or OVERRIDES key does; `fix` ends the message."""

    kind: str
    fix: str = ""
    judge: Callable[[Any, Any], "_Judged | None"] | None = None
    why: str = ""


def _judge_key(rule: ConnectorKey, value: Any, host) -> _Judged | None:
    if rule.kind == CREDENTIAL:
        return None if value is None or value == "" else _Judged(rule.why, HIDDEN)
    if rule.kind == OVERRIDES:
        return None if value is None else _Judged(rule.why, value)
    if rule.kind == WEAKENS:
        return rule.judge(value, host)
    return None


def _host_key_checking(value: Any, host) -> _Judged | None:
    if value in HOST_KEY_CHECKING:
        return None
    return _Judged("does not check host keys (pyinfra checks them with "
                   f"{', '.join(HOST_KEY_CHECKING)} only): {IMPERSONATION}", value)


def _keeps_no_host_keys(path: Any) -> str | None:
    """Why a known_hosts file checks no host key, or None: /dev/null (or another thing that is not a
    file) keeps none, so every host's key is new to it and accepted; a file others can write holds
    the keys they put there."""
    if not isinstance(path, str) or not path:
        return "is not the path of a known_hosts file"
    real = Path(os.path.realpath(os.path.expanduser(path)))
    if str(real) == "/dev/null" or (real.exists() and not real.is_file()):
        return (f"is {real}, which keeps no host key: every host's key is new to it and accepted, "
                f"so {IMPERSONATION}")
    if real.is_file() and real.stat().st_mode & 0o022:
        return (f"is {real}, which others than its owner may write (mode "
                f"{real.stat().st_mode & 0o777:o}): whoever writes it chooses the keys trusted, so "
                f"{IMPERSONATION}")
    if real.is_file() and real.stat().st_uid not in (os.geteuid(), 0):
        return (f"is {real}, which belongs to uid {real.stat().st_uid}, neither you nor root: its "
                f"owner chooses the keys trusted, so {IMPERSONATION}")
    return None


def _known_hosts_file(value: Any, host) -> _Judged | None:
    why = _keeps_no_host_keys(value)
    return _Judged(why, value) if why else None


def _agent_forwarding(value: Any, host) -> _Judged | None:
    if value is None or value is False:
        return None
    return _Judged("forwards your SSH agent to the host: root there, and whoever becomes root, can "
                   "log in as you wherever your keys reach while the deploy runs (the deploy needs "
                   "no agent on the hosts)", value)


def _ssh_config_entry(value: Any, host) -> _Judged | None:
    """The ssh config file pyinfra reads for this host (read here with paramiko's parser, which
    pyinfra's extends with `Include`): its UserKnownHostsFile, StrictHostKeyChecking and
    ForwardAgent are judged as the data keys that override them. pyinfra 3.10's own defaults for the
    last two win over the file; they are judged all the same, as the file says what the operator
    meant."""
    path = Path(os.path.expanduser(str(value)))
    if not path.is_file():
        return None  # pyinfra reads no config then (sshuserclient.client.get_ssh_config)
    address = str(host.data.get("ssh_hostname") or host.name)
    try:
        with path.open(encoding="utf-8") as handle:
            config = SSHConfig()
            config.parse(handle)
        entry = config.lookup(address)
    except (OSError, ValueError, ImportError, SSHConfigError):
        return None  # pyinfra fails the host on it, with its own message
    said = f"{path} sets, for {address}"
    if not set_in_any_layer(host, "ssh_known_hosts_file"):
        for known in str(entry.get("userknownhostsfile", "")).split():
            why = _keeps_no_host_keys(known)
            if why:
                return _Judged(f"{said}, `UserKnownHostsFile {known}`, and that file {why}", value)
    checking = entry.get("stricthostkeychecking")
    if (checking is not None and checking.lower() not in HOST_KEY_CHECKING
            and not set_in_any_layer(host, "ssh_strict_host_key_checking")):
        return _Judged(f"{said}, `StrictHostKeyChecking {checking}`, which does not check host "
                       f"keys: {IMPERSONATION}", value)
    if (str(entry.get("forwardagent", "")).lower() == "yes"
            and not set_in_any_layer(host, "ssh_forward_agent")):
        return _Judged(f"{said}, `ForwardAgent yes`: " + _agent_forwarding(True, host).why, value,
                       fix="remove that line, or name another file")
    return None


def _paramiko_arguments(value: Any, host) -> _Judged | None:
    """`ssh_paramiko_connect_kwargs` go to paramiko's SSHClient.connect over what pyinfra derived
    from the other keys: each argument is judged by its own rule (PARAMIKO_CONNECT_ARGUMENTS)."""
    if not isinstance(value, dict):
        return None  # pyinfra refuses it (a dict)
    for name, entry in value.items():
        rule = PARAMIKO_CONNECT_ARGUMENTS.get(name)
        if rule is None:
            return _Judged("is an argument of paramiko's SSHClient.connect this deploy has not "
                           "judged (whether it weakens authentication or carries a credential)",
                           HIDDEN, f".{name}",
                           "remove it, or judge it in PARAMIKO_CONNECT_ARGUMENTS "
                           "(configuration/connection.py)")
        judged = _judge_key(rule, entry, host)
        if judged:
            return replace(judged, at=f".{name}{judged.at}", fix=judged.fix or rule.fix)
    return None


def _when_set(why: str) -> Callable[[Any, Any], _Judged | None]:
    return lambda value, host: _Judged(why, value) if value not in (None, False) else None


KERBEROS_FIX = (
    "remove it: the deploy logs in with SSH keys and checks host keys against known_hosts")
# paramiko 4's SSHClient.connect arguments (tests/unit/test_connector_keys.py keeps the table equal
# to its signature).
PARAMIKO_CONNECT_ARGUMENTS: dict[str, ConnectorKey] = {
    "hostname": ConnectorKey(OVERRIDES, "set `ssh_hostname` instead",
                             why="overrides the address pyinfra connects to, which the deploy "
                                 "reads from `ssh_hostname` (two inventory names for one address "
                                 "are refused by it)"),
    "port": ConnectorKey(OVERRIDES, "set `ssh_port` instead",
                         why="overrides the port pyinfra connects to, which the deploy reads from "
                             "`ssh_port`"),
    "username": ConnectorKey(OVERRIDES, "set `ssh_user` instead",
                             why="overrides the user pyinfra logs in as (`ssh_user`)"),
    "password": ConnectorKey(CREDENTIAL, LOGIN_FIX, why="is a password"),
    "passphrase": ConnectorKey(CREDENTIAL, LOGIN_FIX, why="is a key's passphrase"),
    "pkey": ConnectorKey(CREDENTIAL, LOGIN_FIX, why="is a private key"),
    "auth_strategy": ConnectorKey(CREDENTIAL, LOGIN_FIX,
                                  why="is an authentication strategy, which holds the passwords "
                                      "and keys it offers"),
    "key_filename": ConnectorKey(FINE),  # the path of a key, as `ssh_key`
    "timeout": ConnectorKey(FINE),
    "allow_agent": ConnectorKey(FINE),  # the agent signs the login here; it is not forwarded
    "look_for_keys": ConnectorKey(FINE),
    "compress": ConnectorKey(FINE),
    # the transport's socket (a proxy): the host's key is still checked through it
    "sock": ConnectorKey(FINE),
    "gss_auth": ConnectorKey(WEAKENS, KERBEROS_FIX, _when_set(
        "logs in with Kerberos, delegating your Kerberos credentials to the host (paramiko's "
        "default): root there can use them as you")),
    "gss_kex": ConnectorKey(WEAKENS, KERBEROS_FIX, _when_set(
        "takes the host's identity from a Kerberos key exchange, and paramiko then skips its "
        "known_hosts check")),
    "gss_deleg_creds": ConnectorKey(WEAKENS, KERBEROS_FIX, _when_set(
        "delegates your Kerberos credentials to the host: root there can use them as you")),
    "gss_host": ConnectorKey(FINE),
    "gss_trust_dns": ConnectorKey(FINE),
    "banner_timeout": ConnectorKey(FINE),
    "auth_timeout": ConnectorKey(FINE),
    "channel_timeout": ConnectorKey(FINE),
    "disabled_algorithms": ConnectorKey(FINE),  # only narrows what paramiko accepts
    "transport_factory": ConnectorKey(WEAKENS, "remove it", _when_set(
        "builds the SSH transport with code of its own, which then says what the host's key is")),
}
# Every key pyinfra's connectors read (pyinfra 3.10: ssh, docker/podman, the test connector `fake`).
CONNECTOR_KEYS: dict[str, ConnectorKey] = {
    "ssh_hostname": ConnectorKey(FINE),  # a host name (kinds.HostName, below)
    "ssh_port": ConnectorKey(FINE),  # a port (kinds.Port, below)
    "ssh_user": ConnectorKey(FINE),
    "ssh_key": ConnectorKey(FINE),  # the path of a key, not the key
    "ssh_password": ConnectorKey(CREDENTIAL, LOGIN_FIX, why="is a password"),
    "ssh_key_password": ConnectorKey(CREDENTIAL, LOGIN_FIX, why="is a key's passphrase"),
    "ssh_allow_agent": ConnectorKey(FINE),  # the agent signs the login here; it is not forwarded
    "ssh_look_for_keys": ConnectorKey(FINE),
    "ssh_forward_agent": ConnectorKey(WEAKENS, "remove it (or set it to false)", _agent_forwarding),
    "ssh_config_file": ConnectorKey(WEAKENS, "remove that line from the file, or name another "
                                             f"file; {HOST_KEYS_FIX}", _ssh_config_entry),
    "ssh_known_hosts_file": ConnectorKey(WEAKENS, HOST_KEYS_FIX, _known_hosts_file),
    "ssh_strict_host_key_checking": ConnectorKey(WEAKENS, HOST_KEYS_FIX, _host_key_checking),
    "ssh_paramiko_connect_kwargs": ConnectorKey(WEAKENS, "remove it", _paramiko_arguments),
    "ssh_connect_retries": ConnectorKey(FINE),
    "ssh_connect_retry_min_delay": ConnectorKey(FINE),
    "ssh_connect_retry_max_delay": ConnectorKey(FINE),
    # sftp or scp, over the same checked connection
    "ssh_file_transfer_protocol": ConnectorKey(FINE),
    "docker_identifier": ConnectorKey(FINE),
    "docker_platform": ConnectorKey(FINE),
    "docker_architecture": ConnectorKey(FINE),
    "fake_responses": ConnectorKey(FINE),
    "fake_delay": ConnectorKey(FINE),
    "fake_delay_jitter": ConnectorKey(FINE),
}


def judge_connector_keys(host, reader) -> None:
    """Every connector key set in any data layer, judged by its rule; one pyinfra reads that the
    table does not know is refused, its value unseen (it might be a credential)."""
    for key, connector in sorted(connector_data_keys().items()):
        if not set_in_any_layer(host, key):
            continue
        rule = CONNECTOR_KEYS.get(key)
        if rule is None:
            raise DataError(reader.source(key), key, HIDDEN,
                            f"`{key}` is a key of pyinfra's {connector} connector that this deploy "
                            "has not judged (whether it weakens authentication or carries a "
                            "credential): remove it, or judge it in CONNECTOR_KEYS "
                            "(configuration/connection.py)")
        judged = _judge_key(rule, host.data.get(key), host)
        if judged:
            raise DataError(reader.source(key), key + judged.at, judged.shown,
                            f"`{key}{judged.at}` {judged.why}: {judged.fix or rule.fix}")


def set_in_any_layer(host, key: str) -> bool:
    inventory = host.inventory
    layers = [inventory.get_override_data(), inventory.get_host_data(host.name),
              inventory.get_data(), *(inventory.get_group_data(group) for group in host.groups)]
    return any(key in layer for layer in layers)
