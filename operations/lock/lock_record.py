"""A host's deploy lock as it lies on the host, and what its record proves: the lock directory
(`LOCK_PATH`) with its owner record (owner.json: `new_owner`), whether that record proves its holder
gone (`is_stale`, with what this control machine recorded of the locks it dropped), the sh commands
that take, renew and give back a lock where no python need start (on_host/lock_host.py does the
rest), and the messages that name a holder.

Separate from taking a run's locks (run_locks.py) and from the run's barrier (lock.py): this is one
lock and one record, read the same by every run, by the one-time keys of operations/transport
(peer_keys: whose grant is stale) and by the lock script's own rules; why locks are taken as they
are is lock.py's docstring.
"""

from __future__ import annotations

import atexit
import getpass
import os
import re
import shlex
import socket
import time
import uuid
from pathlib import Path

from operations import remote
from operations.run.private_dir import cache_root, private_dir

LOCK_PATH = "/run/sglang-deploy.lock"
# A holder renews each lock it holds this often (touches `alive` in it); one renewed within ALIVE_S
# is alive, whatever its record's boot id says (is_stale). Three renewals may be missed (a busy
# connection, a slow host) before a rebooted holder's lock becomes stale by its boot id.
RENEW_S = 10
ALIVE_S = 3 * RENEW_S
MACHINE_ID_PATH = "/etc/machine-id"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# What an owner record must hold to prove, from this machine, that its deploy is gone (see
# is_stale).
PROOF_FIELDS = ("machine", "boot", "pid", "start", "token")
_TOKEN = re.compile(r"[0-9a-f]{32}")


# -- who holds a lock --------------------------------------------------------------------


def new_owner() -> dict:
    """This run's owner record: who (for people), and what proves whether it still runs (for
    is_stale)."""
    me = control_identity()
    return {
        "id": uuid.uuid4().hex,
        "who": f"{getpass.getuser()}@{socket.gethostname()}",
        "control": socket.gethostname(),  # shown to people; proves nothing (hostnames repeat)
        **me,
        "pid": os.getpid(),
        "start": process_start(os.getpid()),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def control_identity() -> dict:
    """This control machine as its records name it: machine id, boot id, and the pid namespace its
    pids are of."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return {"machine": _read_id(MACHINE_ID_PATH), "boot": _read_id(BOOT_ID_PATH), "pidns": pidns}


def _read_id(path: str) -> str:
    try:
        value = Path(path).read_text().strip()
    except OSError:
        return ""
    return value if re.fullmatch(r"[0-9a-f-]{1,64}", value) else ""


def process_start(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (/proc/PID/stat field 22); None if it cannot be
    read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None



def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dropped_dir() -> Path:
    """Where runs of this user on this control machine record the locks they gave up without giving
    them back."""
    return cache_root() / "dropped-locks"


def mark_dropped(token: str) -> None:
    """Record that this run no longer holds the lock `token` (it could not give it back)."""
    if not _TOKEN.fullmatch(token or ""):
        return
    record = private_dir(dropped_dir()) / token
    record.write_text(str(os.getpid()))
    # once we exit, our pid and its start time say it
    atexit.register(record.unlink, missing_ok=True)


def _dropped_here(token) -> bool:
    if (not isinstance(token, str) or not _TOKEN.fullmatch(token)
            or not os.path.lexists(dropped_dir())):
        return False
    # a record only this user could have written
    return (private_dir(dropped_dir()) / token).exists()


def missing_proof(holder: dict) -> list[str]:
    """The fields of PROOF_FIELDS that `holder` (an owner.json) lacks or holds in no usable form."""
    def usable(name, value):
        if name == "token":
            return isinstance(value, str) and bool(_TOKEN.fullmatch(value))
        if name in ("pid", "start"):
            return (isinstance(value, int) and not isinstance(value, bool)
                    and value > (0 if name == "pid" else -1))
        return isinstance(value, str) and bool(value)

    return [name for name in PROOF_FIELDS if not usable(name, holder.get(name))]


def is_stale(holder: dict, me: dict) -> str | None:
    """Why `holder` (an owner.json) provably no longer holds its lock, seen from the run `me`
    (new_owner()); else None.

    Only a record of this very control machine (its machine id) can prove it: by a boot since (boot
    id), or, in the same pid namespace, by its pid gone or now another process (its start time). A
    name proves nothing.
    """
    if _dropped_here(holder.get("token")):
        return (
            f"its deploy (pid {holder.get('pid')}) lost the host's connection and dropped the host")
    if missing_proof(holder) or not me.get("machine") or holder["machine"] != me["machine"]:
        return None  # cannot be proven from here: another machine, or a record without the proof
    if holder["boot"] != me.get("boot"):
        if _live_copy(holder, me):
            return None  # a live run on a copy of this machine (clone_hint)
        return (f"its control machine has restarted since (boot id {holder['boot']}, now "
                f"{me.get('boot')})")
    if not holder.get("pidns") or holder.get("pidns") != me.get("pidns"):
        # another pid namespace (a container on this machine): its pids are not ours to look at
        return None
    pid = holder["pid"]
    if not _pid_alive(pid):
        return f"its deploy (pid {pid}) is gone"
    started = process_start(pid)
    if started is not None and started != holder["start"]:
        return (f"its deploy (pid {pid}) is gone (pid {pid} is now another process, started at "
                "another time)")
    return None


def renewed_lately(holder: dict) -> bool:
    """Did the holder renew its lock within ALIVE_S (the host's answer, `renewed_s_ago`)?"""
    renewed = holder.get("renewed_s_ago")
    return (isinstance(renewed, (int, float)) and not isinstance(renewed, bool)
            and 0 <= renewed < ALIVE_S)


def _live_copy(holder: dict, me: dict) -> bool:
    """Does `holder` name this machine id with another boot id, and still renew its lock: a run on
    another machine with this machine's /etc/machine-id (a cloned VM or image)?"""
    return bool(holder.get("machine") and holder.get("machine") == me.get("machine")
                and holder.get("boot") != me.get("boot") and renewed_lately(holder))


def clone_hint(holder: dict | None, me: dict) -> str:
    """What to say of a lock `_live_copy` finds: another machine with this machine's
    /etc/machine-id runs a deploy."""
    holder = holder or {}
    if _live_copy(holder, me):
        return (f" Its record names this control machine's /etc/machine-id ({holder['machine']}) "
                f"with another boot id, and it renewed the lock {holder['renewed_s_ago']:.0f} s "
                "ago: a deploy is running from a copy of this machine (a cloned VM or image). "
                "Give each control machine its own /etc/machine-id (systemd-machine-id-setup).")
    return ""


def describe(holder: dict | None) -> str:
    holder = holder or {}
    return (f"{holder.get('who', 'unknown')} (pid {holder.get('pid', '?')}) since "
            f"{holder.get('since', '?')}")


def locked_message(name: str, holder: dict | None, waited_s: float,
                   me: dict | None = None) -> str:
    missing = missing_proof(holder or {})
    unprovable = (
        f" Its record cannot show whether that deploy has ended (it has no {', '.join(missing)}: "
        "made by hand or by an older deploy), so it is never taken over automatically."
        if holder and missing else ""
    )
    return (
        f"{name}: another deploy holds the host's lock: {describe(holder)}; waited {waited_s:.0f} "
        f"s (lock_wait_s).{unprovable}{clone_hint(holder, me or {})} If no deploy is running "
        f"there, remove {LOCK_PATH} on the host."
    )


def same_machine_message(first: str, second: str, machine: tuple[str, str] | None) -> str:
    seen = (f"both report /etc/machine-id {machine[0]} and boot id {machine[1]}"
            if machine and machine[0]
            else f"the lock this run took through {first} is the one {second} found")
    return (
        f"{first} and {second} are one machine ({seen}): under two inventory names it would be "
        "deployed twice at once, and each name's cleanup would remove the other's services. "
        f"Nothing was changed there. List the machine once in the inventory (keep {first} or "
        f"{second}); if they are two machines, give each its own /etc/machine-id "
        "(systemd-machine-id-setup)."
    )


# -- the commands ------------------------------------------------------------------------

# SGLANG_DEPLOY_LOCK, SGLANG_DEPLOY_MACHINE_ID, SGLANG_DEPLOY_BOOT_ID: as in lock_host.py (unit
# tests).
LOCK_SH = f'"${{SGLANG_DEPLOY_LOCK:-{LOCK_PATH}}}"'
_IDENTITY_SH = (
    f'{{ read -r _sglang_machine < "${{SGLANG_DEPLOY_MACHINE_ID:-{MACHINE_ID_PATH}}}"; '
    f'read -r _sglang_boot < "${{SGLANG_DEPLOY_BOOT_ID:-{BOOT_ID_PATH}}}"; }} 2>/dev/null; '
    'case "$_sglang_machine$_sglang_boot" in *[!0-9a-f-]*) _sglang_machine= _sglang_boot= ;; esac; '
)


def free_lock_command(owner: str, token: str) -> str:
    """`lock_host.py acquire OWNER 0` with its free-lock path in sh, where no python need start on
    the host.

    As the script does: the lock is built complete beside (`<lock>.new-<token>`: the take's marker
    and owner.json) and renamed into place by `mv -nT` (renameat2 RENAME_NOREPLACE, as GNU mv does:
    it fails while anything is there, even an empty directory). Whether the lock is now this take's
    is judged by its marker in place, never by mv's exit status. The answer's one line names the
    machine (machine id, boot id) and adds only shell builtins to the path. Where the lock was not
    free, or anything here failed, the script runs and answers as it always does (its guard orders
    takeovers of a stale lock).
    """
    marker = marker_of(token)
    return (
        f'_sglang_lock={LOCK_SH}; _sglang_new="$_sglang_lock.new-{token}"\n'
        'if [ ! -e "$_sglang_lock" ] && mkdir -m 700 "$_sglang_new" 2>/dev/null; then '
        f': > "$_sglang_new/{marker}" && : > "$_sglang_new/alive" && '
        f'printf \'%s\' {owner} > "$_sglang_new/owner.json" && '
        'mv -nT "$_sglang_new" "$_sglang_lock" 2>/dev/null; '
        '[ -e "$_sglang_new" ] && rm -rf "$_sglang_new"; fi\n'
        f'if [ -e "$_sglang_lock/{marker}" ]; then {_IDENTITY_SH}'
        'printf \'{"acquired": true, "machine": "%s", "boot": "%s"}\\n\' '
        '"$_sglang_machine" "$_sglang_boot"; else\n'
        f"{remote.command('lock_host', 'acquire', owner, '0')}\nfi"
    )


def renew_command(token: str) -> str:
    """Touch `alive` in the host's lock if it is still this take's (its marker is there)."""
    return (f'_sglang_lock={LOCK_SH}; [ -e "$_sglang_lock/{marker_of(token)}" ] && '
            ': > "$_sglang_lock/alive.new" && mv -f "$_sglang_lock/alive.new" '
            '"$_sglang_lock/alive"')


def release_command(token: str) -> str:
    """`lock_host.py release TOKEN`: a lock holding this take's marker is renamed aside and removed
    in sh (so it is never seen half-removed); any other (held by another take) goes to the script,
    which compares owner.json."""
    return (
        f'_sglang_lock={LOCK_SH}; _sglang_old="$_sglang_lock.old-{token}"\n'
        f'if [ -e "$_sglang_lock/{marker_of(token)}" ]; then '
        'mv -T "$_sglang_lock" "$_sglang_old" && rm -rf "$_sglang_old" && '
        'echo \'{"released": true}\'; else\n'
        f"{remote.command('lock_host', 'release', shlex.quote(token))}\nfi"
    )


def marker_of(token: str) -> str:
    # The take's token is a uuid hex: a plain file name (lock_host.py writes the same marker).
    if not _TOKEN.fullmatch(token or ""):
        raise ValueError(f"lock token {token!r} is not a uuid hex")
    return f"owner-{token}"


def machine_of(answer: dict) -> tuple[str, str] | None:
    """The machine a lock command's answer came from (machine id, boot id); None where it did not
    say."""
    machine, boot = answer.get("machine"), answer.get("boot")
    return (machine, boot or "") if isinstance(machine, str) and machine else None


