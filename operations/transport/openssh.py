"""OpenSSH for the bulk bytes: the `ssh` command line that reaches a host exactly as its pyinfra
connection does.

pyinfra's own connection (paramiko, in this one Python process) keeps carrying the deploy's commands
and reads. Bytes in bulk (wheels pushed to a host, a model streamed from another host, a donor's
venv files) go through `ssh` processes instead (operations/transport/streaming.py): paramiko's SFTP
and channels run at a fraction of OpenSSH's rate, and one Python process cannot spread several
streams over several cores.

`ssh_argv(host)` is the one place that says how. The login is pyinfra's, as
configuration/ssh_login.py reads it from the host's data: the address, `ssh_user` (`-l`) and
`ssh_port` (`-p`) over the SSH config file; that config file and no other (`-F`: `ssh_config_file`,
else `~/.ssh/config`, else none; OpenSSH's /etc/ssh/ssh_config, which pyinfra never reads, is not
read either), whose `HostName`, `User`, `Port`, `IdentityFile`, `ProxyJump` and `ProxyCommand` (a
jump host) apply as in pyinfra; the known_hosts files pyinfra checks and nothing else (no global
file, no DNS, no other key the server offers added) with `ssh_strict_host_key_checking` as set
(pyinfra's default `accept-new`); `ssh_key` alone where it is set (`-i`, `IdentitiesOnly`, no
agent), else the agent and the usual key files where the data allows them. Then what bulk bytes
want, none of which weakens authentication: the cipher `aes128-gcm@openssh.com` first, then
OpenSSH's own default order (the server picks the first it supports, so one that refuses AES-GCM
gets the defaults), no compression, `BatchMode` (never a prompt), no agent or X11 forwarding, no
port forwarding from the config, no multiplexing over someone's control socket, no `LocalCommand`,
and a peer silent for 10 s ends the transfer (as `run_locks.DEAD_PEER_S` does for pyinfra's
connection).

Where OpenSSH cannot carry a host's bytes (no `ssh` on this machine, another connector, a setting it
cannot reproduce, or `ssh HOST true` with those settings fails), `route(host, log)` says so once per
host and run, and the bytes go over pyinfra's paramiko connection as before.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import threading
from typing import Callable

from configuration import ssh_login
from operations.run import run_state

CIPHER = "aes128-gcm@openssh.com"
# OpenSSH's default order (8.x and 9.x); offered after CIPHER, each only where this machine's ssh
# has it.
DEFAULT_CIPHERS = ("chacha20-poly1305@openssh.com", "aes128-ctr", "aes192-ctr", "aes256-ctr",
                   "aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
# a peer silent for 10 s ends the transfer (run_locks.DEAD_PEER_S)
ALIVE_INTERVAL_S, ALIVE_COUNT = 5, 2


class Unavailable(Exception):
    """Why OpenSSH cannot carry this host's bytes with exactly its pyinfra connection settings."""


@functools.lru_cache(maxsize=None)
def ciphers(ssh: str = "ssh") -> str:
    """The `Ciphers` list: CIPHER, then OpenSSH's default order, each where this machine's `ssh -Q
    cipher` lists it."""
    try:
        known = set(subprocess.run([ssh, "-Q", "cipher"], capture_output=True, text=True,
                                   timeout=10).stdout.split())
    except (OSError, subprocess.SubprocessError):
        known = set()
    return ",".join(c for c in dict.fromkeys((CIPHER, *DEFAULT_CIPHERS)) if not known or c in known)


def _literal(path: str) -> str:
    """A path as OpenSSH reads it literally: its `%` tokens (`%h`, `%d`, ...) escaped, as pyinfra
    expands none."""
    return path.replace("%", "%%")


def _quoted(path: str) -> str:
    if '"' in path or any(ord(c) < 32 for c in path):
        raise Unavailable(f"the path {path!r} cannot be written in an OpenSSH option")
    path = _literal(path)
    return f'"{path}"' if any(c.isspace() for c in path) else path


# For every ssh process: never a passphrase or host-key prompt in a window either (a jump host's
# `ssh`, which OpenSSH starts without our options, included); the processes have no terminal (their
# own session).
ENVIRONMENT = {"SSH_ASKPASS_REQUIRE": "never"}


def environment() -> dict[str, str]:
    return {**os.environ, **ENVIRONMENT}


def ssh_argv(host, ssh: str = "ssh") -> list[str]:
    """The `ssh` command line (up to the destination; the remote command follows it) that logs in to
    `host` as its pyinfra connection does (see the module's text); raises Unavailable where that
    cannot be reproduced."""
    login = ssh_login.login(host)
    if login.why_not:
        raise Unavailable(login.why_not)
    argv = [ssh, "-F", login.config_file, "-T", "-x", "-a"]

    def option(name: str, value) -> None:
        argv.extend(["-o", f"{name}={value}"])

    # Host keys, as pyinfra checks them.
    option("UserKnownHostsFile", " ".join(_quoted(f) for f in login.known_hosts))
    option("GlobalKnownHostsFile", "none")
    option("StrictHostKeyChecking", login.strict_host_key_checking)
    option("UpdateHostKeys", "no")
    option("VerifyHostKeyDNS", "no")
    # The login, as pyinfra's.
    for identity in login.identities:
        argv.extend(["-i", _literal(identity)])
    if login.key_only:
        option("IdentitiesOnly", "yes")
    if not login.allow_agent:
        option("IdentityAgent", "none")
    if not login.look_for_keys and not login.identities:
        # no default key file (the config's own IdentityFile still counts, as in pyinfra)
        option("IdentityFile", "none")
    option("BatchMode", "yes")
    option("GSSAPIAuthentication", "no")
    option("GSSAPIDelegateCredentials", "no")
    # What bulk bytes want.
    option("Ciphers", ciphers(ssh))
    option("Compression", "no")
    option("ForwardAgent", "no")
    option("ForwardX11", "no")
    option("ClearAllForwardings", "yes")
    option("ControlMaster", "no")
    option("ControlPath", "none")
    option("PermitLocalCommand", "no")
    option("ServerAliveInterval", ALIVE_INTERVAL_S)
    option("ServerAliveCountMax", ALIVE_COUNT)
    option("ConnectTimeout", login.connect_timeout_s)
    option("ConnectionAttempts", login.attempts)
    if login.user:
        argv.extend(["-l", login.user])
    if login.port:
        argv.extend(["-p", str(login.port)])
    return [*argv, "--", login.address]


# Per run (run_state.RunState.routes): each host's route, decided once (a probe `ssh ... true`),
# and said once where it is pyinfra's connection.


def route(host, log: Callable[[str], None] | None = None) -> list[str] | None:
    """`ssh_argv(host)` once `ssh HOST true` with it has worked in this run; None (and why, through
    `log`, once per host and run) where the host's bytes go over pyinfra's paramiko connection
    instead."""
    return _said(host, log)


def decide(hosts, log: Callable[[str], None] | None = None) -> None:
    """Decide the routes of `hosts` not yet decided in this run, their probes at once (each is an
    SSH handshake); say, once per host and run, where a host's bytes go over pyinfra's
    connection."""
    hosts = list(dict.fromkeys(hosts))
    threads = [
        threading.Thread(target=lambda h=h: _routes(h).setdefault(_name(h), _decide(h)),
                         daemon=True)
        for h in hosts if _name(h) not in _routes(h)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for host in hosts:
        _said(host, log)


def _name(host) -> str:
    return str(getattr(host, "name", ""))


def _routes(host) -> dict:
    return run_state.of_host(host).routes


def _said(host, log) -> list[str] | None:
    routes, name = _routes(host), _name(host)
    if name not in routes:
        routes[name] = _decide(host)
    argv, why = routes[name]
    told = run_state.of_host(host).routes_told
    if argv is None and log is not None and name not in told:
        told.add(name)
        log(f"bulk bytes go over pyinfra's paramiko connection (slower): {why}")
    return argv


def _decide(host) -> tuple[list[str] | None, str]:
    ssh = shutil.which("ssh")
    if ssh is None:
        return (None, "OpenSSH's `ssh` is not installed on this machine (Debian/Ubuntu: apt-get "
                      "install openssh-client)")
    try:
        argv = ssh_argv(host, ssh)
    except Unavailable as exc:
        return (None,
                f"OpenSSH cannot reach {getattr(host, 'name', 'this host')} as pyinfra does: {exc}")
    try:
        probe = subprocess.run([*argv, "true"], stdin=subprocess.DEVNULL, capture_output=True,
                               text=True, timeout=60, start_new_session=True, env=environment())
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"`ssh {host.name} true` with its pyinfra settings failed: {exc}"
    if probe.returncode != 0:
        said = " ".join(probe.stderr.strip().splitlines()[-2:])[-300:]
        return (None, f"`ssh {host.name} true` with its pyinfra settings failed (exit "
                      f"{probe.returncode}: {said})")
    return argv, "OpenSSH"


def streams(host) -> int:
    """How many streams a host's transfers use at once: its `transfer_streams`."""
    return ssh_login.transfer_streams(host)
