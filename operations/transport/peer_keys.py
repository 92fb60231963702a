"""Host to host, not through the control machine: one transfer between two inventory hosts on a
one-time key.

When a model (`model_sources`) or a donor's venv files move from one inventory host (the source) to
another (the receiver), the receiver reads them from the source itself, over OpenSSH, and no byte
crosses the control machine. It may do exactly that and nothing else, for this one transfer
(`granted`):

1. On the receiver, a new ed25519 key (no passphrase) in `/run/sglang-deploy/peer-keys/ID/` (root's,
   0700; a tmpfs, so a reboot forgets it); its private half never leaves the receiver. The receiver
   also says which of its addresses reaches the source (the kernel's route: a UDP socket connected,
   no packet sent).
2. On the source, the grant in `/run/sglang-deploy/peer-grants/ID/` (root's, 0700): `grant.json`
   (the directory and the exact list of names under it that may be read) and `send.py`
   (operations/transport/on_host/peer_send.py), and one line appended to the login user's (root's)
   `~/.ssh/authorized_keys`:
       restrict,from="RECEIVER",expiry-time="...",command="PYTHON -I .../ID/send.py SHA256"
           ssh-ed25519 KEY sglang-deploy-peer:ID
   `restrict` (no terminal, no forwarding of any kind, no `~/.ssh/rc`); `from=` the receiver's
   address alone; the forced command, whatever the client asks, is send.py, which checks that
   grant.json is byte for byte the one whose sha256 the entry names and sends a tar of only names on
   that list (no `..`, no absolute name, no link on the way); anything else (a shell, `scp`, sftp,
   another file) is refused. `expiry-time` (TTL_S on the source's clock) bounds an entry nobody
   removes.
3. The receiver learns the source's host keys as the pyinfra connection to the source (whose key was
   checked) read them, keeps them under the key's own alias (`HostKeyAlias`) with strict checking,
   and asks the source `probe`.
4. The transfer's streams are run on the receiver (operations/transport/on_host/peer_access.py
`fetch`:
   `ssh SOURCE send` into root's unpacker, the bytes counted back to the control machine for the
   progress line).
5. `Grant.close()` removes the entry (only lines of exactly that form with that ID: no other line of
   authorized_keys changes, byte for byte), the grant and the key, on both hosts, as soon as the
   streams end.

Each grant records its owner (this control machine, boot, pid and its start time, as a deploy lock
does) and its expiry. A run that died leaves its grant; the next deploy that reads the host
(`swept`: the listing is part of the host's one read, acted on only while the run holds the host's
lock), and the next grant made on either host, remove every grant and key of ours there that is
provably dead: expired, without its record (the source rebooted), or owned by a deploy of this
control machine that is gone (`lock_record.is_stale`). A live grant of another run is left alone.

Where the direct path cannot be made (the hosts do not reach each other: no route, a firewall, NAT
between them, a jump host; the source's sshd reads other key files; no `ssh`, `ssh-keygen` or
`python3` on one end), the grant is taken back and the bytes go through this machine, as before; the
run says so, and why, once per pair of hosts.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from pyinfra.api import FactBase

from configuration import ssh_login
from operations import remote
from operations.lock import lock, lock_record
from operations.run import channels, host_reads, read_batch, run_state
from operations.transport import openssh, stream_ends, streaming

MARK = "sglang-deploy-peer"
# an entry nobody removed stops working after this (sshd's expiry-time, the source's clock)
TTL_S = 6 * 3600
CIPHERS = ("aes128-gcm@openssh.com,chacha20-poly1305@openssh.com,aes256-gcm@openssh.com,"
           "aes128-ctr,aes192-ctr,aes256-ctr")
KEYS_DIR = "/run/sglang-deploy/peer-keys"

# What was said, once per (run, source, receiver), of a pair that goes through this machine.


def _script_command(mode: str, *args: str) -> str:
    return remote.isolated("python3", f"-c {shlex.quote(remote.script('peer_access'))} {mode} "
                                      f"{' '.join(shlex.quote(a) for a in args)}")


def _ask(host, command: str, stdin: bytes = b"") -> tuple[int, str, str]:
    """`command` on `host` over its pyinfra connection, `stdin` given to it: (exit status, stdout,
    stderr)."""
    channel = channels.open_session(host)
    if channel is None:
        return 255, "", f"{host.name}: no SSH connection"
    channel.exec_command(command)
    if stdin:
        channel.sendall(stdin)
    channel.shutdown_write()
    status, lines, err = channels.rest_of_output(channel, b"")
    return status, "\n".join(lines), err


def _answer(host, mode: str, *args: str, given=None) -> dict:
    status, out, err = _ask(host, _script_command(mode, *args),
                            json.dumps(given).encode() if given is not None else b"")
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"failed": (err.strip() or out.strip() or f"exit {status}")[-300:]}


def receiver_argv(ident: str, user: str, address: str, port: int) -> list[str]:
    """The `ssh` the receiver runs to reach the source with the one-time key: that key alone (no
    agent, no other key file, no config file), the source's host keys alone under the key's alias,
    strict, batch mode, nothing forwarded; the cipher list is one any OpenSSH of the last ten years
    knows."""
    directory = f"{KEYS_DIR}/{ident}"
    argv = ["ssh", "-F", "/dev/null", "-T", "-x", "-a", "-i", f"{directory}/key"]
    for name, value in (("IdentitiesOnly", "yes"), ("IdentityAgent", "none"),
                        ("UserKnownHostsFile", f"{directory}/known_hosts"),
                        ("GlobalKnownHostsFile", "none"), ("StrictHostKeyChecking", "yes"),
                        ("HostKeyAlias", f"{MARK}-{ident}"), ("UpdateHostKeys", "no"),
                        ("VerifyHostKeyDNS", "no"), ("CheckHostIP", "no"), ("BatchMode", "yes"),
                        ("PasswordAuthentication", "no"), ("KbdInteractiveAuthentication", "no"),
                        ("GSSAPIAuthentication", "no"), ("Ciphers", CIPHERS), ("Compression", "no"),
                        ("ForwardAgent", "no"), ("ForwardX11", "no"),
                        ("ClearAllForwardings", "yes"), ("ControlMaster", "no"),
                        ("ControlPath", "none"), ("PermitLocalCommand", "no"),
                        ("ServerAliveInterval", openssh.ALIVE_INTERVAL_S),
                        ("ServerAliveCountMax", openssh.ALIVE_COUNT), ("ConnectTimeout", 10),
                        ("ConnectionAttempts", 1)):
        argv += ["-o", f"{name}={value}"]
    return [*argv, "-l", user, "-p", str(port), "--", address]


def _stale(ours: dict, me: dict) -> dict[str, str]:
    """{ID: why} of the grants of ours a host holds that are provably dead (see the module's
    text)."""
    out = {}
    for ident, found in (ours or {}).items():
        owner = found.get("owner") or {}
        if found.get("expired") and found.get("record"):
            out[ident] = "expired"
        elif not found.get("record"):
            out[ident] = "its record is gone (the host restarted)"
        else:
            why = lock_record.is_stale(owner, me)
            if why:
                out[ident] = why
    return out


def _sweep(host, ours: dict, me: dict, log) -> dict[str, str]:
    """Remove those of `ours` that `_stale` proves dead, and say so; {ID: why} of those removed."""
    stale = _stale(ours, me)
    if stale:
        _answer(host, "remove", *sorted(stale))
        log(f"removed {len(stale)} one-time key(s) a run that stopped left on {host.name}: "
            + "; ".join(f"{i[:8]}: {why}" for i, why in sorted(stale.items())))
    return stale


@read_batch.batched()
class LeftAccess(FactBase):
    """Every grant (on a source) and key (on a receiver) of ours on the host, with its owner record
    and whether it expired (operations/transport/on_host/peer_access.py `left`); read only."""

    def command(self) -> str:
        return remote.command("peer_access", "left")

    def process(self, output):
        try:
            found = json.loads(output[-1])
        except (ValueError, IndexError):
            return {}
        return found if isinstance(found, dict) else {}


def swept(host, log: Callable[[str], None]) -> list[str]:
    """Remove the grants and keys of ours on `host` that a run which died left (as `_stale` judges
    them), from the host's read; only while this run holds the host's deploy lock (never under
    `--dry`, never in a view). The IDs removed."""
    if not lock.holds(host):
        return []
    left = host_reads.get(host, LeftAccess) or {}
    ours = {**(left.get("keys") or {}), **(left.get("grants") or {})}
    return sorted(_sweep(host, ours, lock_record.control_identity(), log))


@dataclass
class Grant:
    """One transfer's access from `receiver` to `source` (see the module's text)."""

    ident: str
    source: object
    receiver: object
    root: str
    argv: list[str]
    closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def job(self, what: str, size: int, names: list[str], receive: str) -> streaming.Job:
        """One stream: the receiver fetches `names` (each on the grant's list) from the source into
        `receive`."""
        fetch = _script_command("fetch", json.dumps(self.argv), receive)
        listed = b"".join(n.encode("utf-8", "surrogateescape") + b"\0" for n in names)
        opened = stream_ends.sending_end(self.receiver, fetch, listed, small=True)
        return streaming.Job(what, size, lambda: stream_ends.Fetched(opened()), stream_ends.Nowhere)

    def close(self) -> None:
        """Take the access back on both hosts (also where it was only half made)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        for host in (self.source, self.receiver):
            _answer(host, "remove", self.ident)


def granted(source, receiver, root: str, names: list[str],
            log: Callable[[str], None]) -> Grant | None:
    """Access for `receiver` to read `names` under `root` on `source`, for one transfer; None where
    the receiver cannot reach the source directly (said once per pair and run, through `log`): the
    bytes then go through this machine."""
    why = _make(source, receiver, root, names, log)
    if isinstance(why, Grant):
        return why
    told, pair = run_state.of_host(source).relays_told, (source.name, receiver.name)
    if pair not in told:
        told.add(pair)
        log(f"{receiver.name} does not read from {source.name} directly ({why}): the bytes go "
            "through this machine")
    return None


def _make(source, receiver, root: str, names: list[str], log) -> Grant | str:
    for host in (source, receiver):
        login = ssh_login.login(host)
        if login.why_not:
            return f"{host.name}: {login.why_not}"
        if channels.open_session(host) is None:
            return f"{host.name} has no SSH connection to run commands on"
    address, port, jump = ssh_login.reached_at(source)
    if jump:
        return f"{source.name} is reached through a jump host"
    ident = uuid.uuid4().hex
    me = lock_record.control_identity()
    owner = {**lock_record.new_owner(), "token": ident, "source": source.name,
             "receiver": receiver.name, "ttl_s": TTL_S}
    grant = Grant(ident, source, receiver, root, [])
    made = _answer(receiver, "keys", ident, address, str(port), given=owner)
    if "pub" not in made:  # nothing was left on either host
        return (made.get("unreachable")
                or f"the key could not be made on {receiver.name}: {made.get('failed')}")
    _sweep(receiver, made.get("ours"), me, log)
    given = {"id": ident, "pub": made["pub"], "from": made["from"], "root": root,
             "names": names, "owner": owner, "sender": remote.script("peer_send")}
    entry = _answer(source, "grant", given=given)
    if "hostkeys" not in entry:
        grant.close()
        return (entry.get("refused")
                or f"the key could not be authorised on {source.name}: {entry.get('failed')}")
    _sweep(source, entry.get("ours"), me, log)
    grant.argv = receiver_argv(ident, entry["user"], address, port)
    start = time.monotonic()
    probe = _answer(receiver, "trust", ident,
                    given={"hostkeys": entry["hostkeys"], "argv": grant.argv})
    if not probe.get("ok"):
        grant.close()
        return (f"{receiver.name} cannot reach {source.name} at {address}:{port}: "
                f"{probe.get('said') or probe.get('failed')}")
    log(f"{receiver.name} reads from {source.name} directly: a one-time key for {len(names)} "
        f"file(s) under {root} (from {made['from']}, reached in {time.monotonic() - start:.1f} s)")
    return grant


