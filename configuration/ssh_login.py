"""How pyinfra's SSH connector logs in to a host, read from the host's data as pyinfra reads it:
what an OpenSSH process needs to reach the host exactly as pyinfra's connection does
(operations/transport/openssh.py builds its command line).

pyinfra 3.10's SSH connector (`make_paramiko_kwargs`, then
`sshuserclient.client.SSHClient.parse_config`): the address is `ssh_hostname`, else the inventory
name; `ssh_user`, `ssh_port` and `ssh_key` win over the SSH config file; the config file is
`ssh_config_file`, else `~/.ssh/config` where it exists (and no other: not /etc/ssh/ssh_config);
host keys are checked against `ssh_known_hosts_file`, else the config's `UserKnownHostsFile`, else
`~/.ssh/known_hosts`, with `ssh_strict_host_key_checking` (default `accept-new`, which wins over the
config's own); with `ssh_key` pyinfra logs in with that key alone (no agent, no key files), else
with the agent and the usual key files as `ssh_allow_agent` and `ssh_look_for_keys` allow;
`ssh_paramiko_connect_kwargs` go over all that.

Every key the SSH connector reads (configuration/connection.py's CONNECTOR_KEYS) is classified here
too (`SSH_KEYS`), and each argument of paramiko's connect that may appear (`PARAMIKO_ARGUMENTS`):
tests/unit/test_openssh.py fails on a key or argument this module has not classified.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from paramiko import SSHConfig
from paramiko.ssh_exception import ConfigParseError

from configuration import schema

# pyinfra 3.10's defaults for the SSH connector's keys (its `data_meta`; tests/unit/test_openssh.py
# compares them).
PYINFRA_DEFAULTS = {"ssh_strict_host_key_checking": "accept-new", "ssh_allow_agent": True,
                    "ssh_look_for_keys": True, "ssh_connect_retries": 0}
PYINFRA_CONFIG_FILE = "~/.ssh/config"
PYINFRA_KNOWN_HOSTS = "~/.ssh/known_hosts"
CONNECT_TIMEOUT_S = 10  # pyinfra's Config.CONNECT_TIMEOUT, where the run's config does not say

# reaches the OpenSSH command line (or, as in pyinfra, is left to the SSH config file)
USED = "used"
NO_EFFECT = "no effect on a transfer"
NOT_REPRODUCIBLE = "not reproducible with OpenSSH in batch mode"
SSH_KEYS = {
    "ssh_hostname": USED,
    "ssh_port": USED,
    "ssh_user": USED,
    "ssh_key": USED,
    "ssh_allow_agent": USED,
    "ssh_look_for_keys": USED,
    # never forwarded by ours (and refused in the data: configuration/connection.py)
    "ssh_forward_agent": NO_EFFECT,
    "ssh_config_file": USED,
    "ssh_known_hosts_file": USED,
    "ssh_strict_host_key_checking": USED,
    "ssh_paramiko_connect_kwargs": USED,  # argument by argument: PARAMIKO_ARGUMENTS
    "ssh_connect_retries": USED,  # ConnectionAttempts
    "ssh_connect_retry_min_delay": NO_EFFECT,
    "ssh_connect_retry_max_delay": NO_EFFECT,
    "ssh_file_transfer_protocol": NO_EFFECT,  # how pyinfra's own uploads go (sftp or scp)
    # refused in the data (a credential); batch mode never types one
    "ssh_password": NOT_REPRODUCIBLE,
    "ssh_key_password": NOT_REPRODUCIBLE,  # refused in the data (a credential)
}
# Arguments of paramiko's connect (`ssh_paramiko_connect_kwargs`) with an OpenSSH equivalent, or no
# effect on a transfer; any other one set (a `sock` built in Python, `disabled_algorithms`, ...)
# cannot be reproduced.
PARAMIKO_ARGUMENTS = {
    "key_filename": USED,
    "timeout": USED,
    "allow_agent": USED,
    "look_for_keys": USED,
    "compress": NO_EFFECT,  # bulk bytes go uncompressed
    "banner_timeout": NO_EFFECT,
    "auth_timeout": NO_EFFECT,
    "channel_timeout": NO_EFFECT,
    "gss_host": NO_EFFECT,
    "gss_trust_dns": NO_EFFECT,
}


@dataclass(frozen=True)
class Login:
    """What pyinfra's SSH connector logs in to a host with. `why_not`: why OpenSSH cannot reproduce
    it (None: it can)."""

    address: str
    user: str | None = None
    port: int | None = None
    config_file: str = os.devnull
    known_hosts: tuple[str, ...] = ()
    strict_host_key_checking: str = "accept-new"
    identities: tuple[str, ...] = ()
    key_only: bool = False  # `ssh_key`: that key alone
    allow_agent: bool = True
    look_for_keys: bool = True
    connect_timeout_s: int = CONNECT_TIMEOUT_S
    attempts: int = 1
    why_not: str | None = None


def _setting(host, key: str):
    value = host.data.get(key)
    return PYINFRA_DEFAULTS.get(key) if value is None else value


def _config_file(host) -> str:
    path = os.path.expanduser(str(host.data.get("ssh_config_file") or PYINFRA_CONFIG_FILE))
    # pyinfra reads no config where the file is missing
    return path if os.path.isfile(path) else os.devnull


def _config_entry(config_file: str, address: str) -> tuple[dict, str | None]:
    if config_file == os.devnull:
        return {}, None
    try:
        with open(config_file, encoding="utf-8") as handle:
            config = SSHConfig()
            config.parse(handle)
        return config.lookup(address), None
    except (OSError, ValueError, ConfigParseError) as exc:
        return {}, f"its SSH config file {config_file} cannot be read here ({exc})"


def login(host) -> Login:
    """How pyinfra's SSH connector logs in to `host` (see the module's text)."""
    name = str(getattr(host, "name", ""))
    if (not hasattr(host, "data")
            or getattr(getattr(host, "connector_cls", None), "__name__", "") != "SSHConnector"):
        return Login(name, why_not="it is not reached through pyinfra's SSH connector")
    data = host.data
    address = str(data.get("ssh_hostname") or name)
    for key, how in SSH_KEYS.items():
        if how == NOT_REPRODUCIBLE and data.get(key):
            return Login(address, why_not=f"`{key}` is set, which OpenSSH in batch mode cannot use")
    paramiko_kwargs = dict(data.get("ssh_paramiko_connect_kwargs") or {})
    for argument, value in paramiko_kwargs.items():
        if PARAMIKO_ARGUMENTS.get(argument) is None and value not in (None, False):
            return Login(address, why_not=f"`ssh_paramiko_connect_kwargs.{argument}` has no "
                                          "OpenSSH equivalent")

    config_file = _config_file(host)
    entry, unread = _config_entry(config_file, address)
    if unread:
        return Login(address, why_not=unread)
    if data.get("ssh_known_hosts_file"):
        known = (os.path.expanduser(str(data.get("ssh_known_hosts_file"))),)
    elif entry.get("userknownhostsfile"):
        known = tuple(os.path.expanduser(f) for f in str(entry["userknownhostsfile"]).split())
    else:
        known = (os.path.expanduser(PYINFRA_KNOWN_HOSTS),)
    key = data.get("ssh_key")
    extra = paramiko_kwargs.get("key_filename")
    identities = ([os.path.expanduser(str(key))] if key else []) + [
        os.path.expanduser(str(f))
        for f in ([extra] if isinstance(extra, str) else list(extra or []))]
    timeout = paramiko_kwargs.get("timeout") or getattr(
        getattr(getattr(host, "state", None), "config", None), "CONNECT_TIMEOUT", None)
    return Login(
        address=address,
        user=str(data.get("ssh_user")) if data.get("ssh_user") else None,
        port=int(data.get("ssh_port")) if data.get("ssh_port") else None,
        config_file=config_file,
        known_hosts=known,
        strict_host_key_checking=str(_setting(host, "ssh_strict_host_key_checking")),
        identities=tuple(identities),
        key_only=bool(key),
        allow_agent=bool(paramiko_kwargs.get("allow_agent",
                                             False if key else _setting(host, "ssh_allow_agent"))),
        look_for_keys=bool(paramiko_kwargs.get(
            "look_for_keys", False if key else _setting(host, "ssh_look_for_keys"))),
        connect_timeout_s=int(timeout or CONNECT_TIMEOUT_S),
        attempts=int(_setting(host, "ssh_connect_retries") or 0) + 1,
    )


def transfer_streams(host) -> int:
    """The host's validated `transfer_streams` (its schema default where the data leaves it out)."""
    data = getattr(host, "data", None)
    value = data.get("transfer_streams") if data is not None else None
    return (value if isinstance(value, int) and not isinstance(value, bool) and value > 0
            else schema.default_of(schema.GroupData, "transfer_streams"))


def reached_at(host) -> tuple[str, int, bool]:
    """Where another host would reach `host`'s SSH server directly: (address, port, whether pyinfra
    reaches it through a jump host). The address and port are pyinfra's (`ssh_hostname`, `ssh_port`)
    as the SSH config file maps them (`HostName`, `Port`); a jump host (`ProxyJump`, `ProxyCommand`)
    is not followed: the other host tries the address itself, and where it cannot reach it the bytes
    go through the control machine (operations/transport/peer_keys.py)."""
    data = host.data
    address = str(data.get("ssh_hostname") or getattr(host, "name", ""))
    entry, _ = _config_entry(_config_file(host), address)
    port = data.get("ssh_port") or entry.get("port") or 22
    jump = bool(entry.get("proxyjump") or entry.get("proxycommand"))
    return str(entry.get("hostname") or address), int(port), jump
