# Fact script: a unit's systemd state and the HTTP status of its /health endpoint, as JSON,
# and which of the service's inputs (PATH...: its unit file, the venv link, staged models'
# markers, its key file) changed since the running process started: a deploy that died
# between changing an input and restarting the service leaves exactly that behind.
#
# "Changed" means changed in content. When the deploy (re)starts a service it records, here in
# RECORD_DIR/<unit>.json, the identity of each input and the new MainPID (`--record`); later
# runs compare each input's identity now with the recorded one:
# - a regular file: its sha256 (a `touch`, or a rewrite with the same bytes, is no change);
# - a staged model's marker also by its inode: a re-stage writes a new marker (a repaired copy
#   has the same manifest), while a file dropped beside the model leaves it alone;
# - a symlink (the venv): the generation it points at, and that generation's install stamp,
#   which the deploy touches after every install into it (a repair in place).
# A process started since by systemd (a reboot: the boot unit re-stages the models first, Restart=)
# or an operator (another MainPID than the record's) loaded the inputs as they were at its start:
# an input that differs from the record counts only if it changed after that start. Without a
# record (a deploy older than this one), inputs modified after the process started count as changed.
#
# The records hold the sha256 of the key file: their directory and its parent are root's alone
# (0700, an existing one tightened when a record is written), each record 0600. A record that is not
# root's alone (another owner, a symlink, a parent others can write) is not read: as if there were
# none.
#
# argv: UNIT ADDRESS PORT [PATH...]          read (prints JSON)
#       --record UNIT [PATH...]              write the record for the running process
import json
import os
import socket
import stat
import sys
import time

from _common import (  # noqa: E402 - remote.script puts _common.py here
    STAMP,
    file_digest,
    peer_untrusted,
    private_dir,
    systemctl_show,
    why_untrusted,
)

RECORD_DIR = "/var/lib/sglang-deploy/started"
MARKER = ".sglang-deploy-staged.json"  # operations/model/models.py: MARKER


class NotTheService(Exception):
    """The port answered from a socket no process of the unit holds (docs/threat-model.md: peer
    identity)."""


def http_status(address, port, path, unit, control_group, timeout=5):
    """The status code of `GET path` (redirects not followed: /health answers for itself), asked
    only of the unit's own process: NotTheService (why) when another one holds the connection's
    server end.

    A socket and one request, not urllib: http.client's imports (the email package) cost a good
    share of a one-service host's whole read in CPU, on every converged run (bench/HISTORY.md).
    Raises OSError when nothing answers or the connection drops before a status line, ValueError
    when what answers is not HTTP.
    """
    with socket.create_connection((address, port), timeout=timeout) as conn:
        stranger = peer_untrusted(conn, unit, control_group)
        if stranger:
            raise NotTheService(stranger)
        conn.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {address}:{port}\r\nConnection: close\r\n\r\n".encode())
        head = b""
        while b"\n" not in head and len(head) < 8192:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
    if not head:
        raise ConnectionResetError("the connection closed before any answer")
    first = head.split(b"\n", 1)[0]
    parts = first.split(None, 2)
    if (len(parts) < 2 or not parts[0].startswith(b"HTTP/") or len(parts[1]) != 3
            or not parts[1].isdigit()):
        raise ValueError(f"its first line is {first[:40]!r}")
    return int(parts[1])


def show(unit):
    props = ("LoadState", "ActiveState", "SubState", "MainPID", "NRestarts",
             "ActiveEnterTimestampMonotonic", "UnitFileState", "NeedDaemonReload", "ControlGroup")
    return systemctl_show([unit], props).get(unit, {})


def identity(path):
    """What the process loads from `path`, as a string that changes only when that does (None:
    absent)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if os.path.islink(path):
        target = os.path.realpath(path)
        try:
            stamp = os.lstat(os.path.join(target, STAMP)).st_mtime_ns
        except OSError:
            stamp = None
        return f"link {target} installed {stamp}"
    if not stat.S_ISREG(st.st_mode):
        # Never opened: a FIFO planted where a marker should be (a squatted shm dir) would hold the
        # read forever.
        return f"not a file {stat.S_IFMT(st.st_mode):o} {st.st_ino}"
    try:
        digest = file_digest(path)
    except OSError:
        return f"unreadable {st.st_ino}"
    if os.path.basename(path) == MARKER:
        return f"sha256 {digest.hexdigest()} inode {st.st_ino}"
    return f"sha256 {digest.hexdigest()}"


def changed_at(path):
    """When `path` last changed, for a process started outside the deploy (seconds; 0 when
    absent)."""
    try:
        when = os.lstat(path).st_mtime
    except OSError:
        return 0
    if os.path.islink(path):
        try:
            when = max(when, os.lstat(os.path.join(os.path.realpath(path), STAMP)).st_mtime)
        except OSError:
            pass
    return when


def record_path(unit):
    return os.path.join(RECORD_DIR, unit.replace("/", "_") + ".json")


if sys.argv[1] == "--record":
    unit, paths = sys.argv[2], sys.argv[3:]
    pid = int(show(unit).get("MainPID") or 0)
    try:
        private_dir(os.path.dirname(RECORD_DIR))
        private_dir(RECORD_DIR)
    except PermissionError as exc:
        sys.exit(f"{exc}: no record of what the service started with is written there (it holds "
                 "the key file's sha256)")
    body = {"pid": pid, "inputs": {path: identity(path) for path in paths}}
    tmp = record_path(unit) + ".tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)  # left by a run that died: made again, 0600
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600),
                   "w") as handle:
        json.dump(body, handle, sort_keys=True)
    os.rename(tmp, record_path(unit))
    print(json.dumps(body))
    sys.exit(0)

unit, address, port, paths = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
props = show(unit)
health, health_error, stranger = None, None, None
asked = time.monotonic()
try:
    health = http_status(address, port, "/health", unit, props.get("ControlGroup"))
except NotTheService as exc:
    stranger = health_error = str(exc)  # not asked: its answer would say nothing of the service
except OSError:
    health = None  # nothing answers, or the connection was refused, reset or timed out
except ValueError as exc:
    # Something that is not an HTTP server holds the port (sshd on 22 answers with its banner).
    health_error = f"the port answers, but not with HTTP ({exc})"
# how long /health took to answer (the status view shows it)
health_ms = round((time.monotonic() - asked) * 1000, 1)
# Serving now, as the readiness gate judges it (service/on_host/wait_ready.py): GET /ready where the
# engine has it (sglang 0.5.23: 503 while starting, paused or draining after a SIGTERM), asked only
# once /health answered 200. None where the engine has none (404; or 401/403, the key an older
# engine guards unknown paths with) or it was not asked; 0 where it did not answer.
ready = None
if health == 200:
    try:
        ready = http_status(address, port, "/ready", unit, props.get("ControlGroup"))
        ready = None if ready in (401, 403, 404) else ready
    except NotTheService as exc:
        stranger = health_error = str(exc)
    except (OSError, ValueError):
        ready = 0
uptime = None
try:
    with open("/proc/uptime") as handle:
        now = float(handle.read().split()[0])
    entered = int(props.get("ActiveEnterTimestampMonotonic") or 0) / 1e6
    if entered:
        uptime = round(now - entered, 1)
except (OSError, ValueError):
    pass
pid = int(props.get("MainPID") or 0)
try:
    if why_untrusted(record_path(unit)):
        raise OSError("not root's alone")
    with open(record_path(unit)) as handle:
        record = json.load(handle)
    if not isinstance(record, dict) or not isinstance(record.get("inputs"), dict):
        record = None
except (OSError, ValueError):
    record = None
gate = None  # what the readiness gate proved of this very process (wait_ready.py: keep_gate)
try:
    gate_file = record_path(unit)[:-len(".json")] + ".gate.json"
    if not why_untrusted(gate_file):
        with open(gate_file) as handle:
            found = json.load(handle)
        if isinstance(found, dict) and pid and found.get("pid") == pid:
            gate = {k: found.get(k) for k in ("accept_length", "accept_source", "checked_tokens",
                                              "near_ties", "lossless", "probes", "decode_tok_s")}
except (OSError, ValueError):
    gate = None
newer = []
entered = int(props.get("ActiveEnterTimestampMonotonic") or 0) / 1e6
if entered and props.get("ActiveState") == "active":
    started = time.time() - (time.monotonic() - entered)  # the same kernel clock as systemd's
    for path in paths:
        if record is not None:
            if path in record["inputs"] and identity(path) == record["inputs"][path]:
                continue
            # Content differs from the record. The process the deploy started (same PID) did not
            # load it; one started since (a reboot: the boot unit re-stages, then the service
            # starts) did, if the change came before its start.
            if record.get("pid") != pid and changed_at(path) <= started + 1:
                continue
            newer.append(path)
        elif changed_at(path) > started + 1:
            newer.append(path)
print(json.dumps({
    "load": props.get("LoadState"), "active": props.get("ActiveState"),
    "sub": props.get("SubState"), "pid": pid, "restarts": int(props.get("NRestarts") or 0),
    # Whether the unit starts at boot, and whether its file changed since systemd loaded it
    # (a run that died between writing the unit and `daemon-reload`):
    # operations/service/lifecycle.py.
    "enabled": props.get("UnitFileState"), "need_reload": props.get("NeedDaemonReload") == "yes",
    "health": health, "health_error": health_error, "health_ms": health_ms, "ready": ready,
    "uptime_s": uptime, "newer": newer, "recorded": record is not None,
    # Set when another process than the unit's holds the port (its uid, pid, cgroup): no answer of
    # it counts.
    "stranger": stranger,
    "gate": gate,
}))
