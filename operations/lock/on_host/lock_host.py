# One deploy at a time per host: take, look at, or give back the host's deploy lock.
# The lock is a directory holding owner.json and an `owner-<token>` marker (the token names one take
# of the lock); /run is emptied on reboot. A lock directory never exists without its owner record:
# it is built complete beside (`<lock>.new-<token>`, mode 0700) and renamed into place with
# RENAME_NOREPLACE, which fails while anything is there (even an empty directory, which a plain
# rename(2) would replace: one left by a deploy from before this rule, or being filled by one right
# now). It is removed by renaming it aside (`<lock>.old-<token>`) first, so no one ever sees it
# half-removed. A crash at any point leaves no lock or a complete one, plus at worst a stray
# `.new-*` / `.old-*` directory, which is no lock and which a later take tidies away.
# A side file is flock()ed around a takeover, so that two runs taking over the same stale
# lock cannot both win (the second would otherwise remove the first's fresh lock).
# Every wait is bounded by WAIT_S: the control side waits in short commands and decides
# between them (it never holds another host's lock while a command here waits).
# Every answer is one line, and says which machine answered (/etc/machine-id and the boot id): the
# control side knows machines by what they report (operations/lock/lock.py).
# argv: acquire OWNER_JSON WAIT_S [TAKEOVER_TOKEN]  |  peek  |  release TOKEN
# SGLANG_DEPLOY_LOCK moves the lock, SGLANG_DEPLOY_MACHINE_ID and SGLANG_DEPLOY_BOOT_ID the identity
# files (unit tests run this script on the control machine, one directory per pretended machine).
import fcntl
import json
import os
import re
import shutil
import sys
import time

LOCK = os.environ.get("SGLANG_DEPLOY_LOCK", "/run/sglang-deploy.lock")
OWNER = os.path.join(LOCK, "owner.json")
ALIVE = os.path.join(LOCK, "alive")  # touched by the holding run every RENEW_S
MACHINE_ID = os.environ.get("SGLANG_DEPLOY_MACHINE_ID", "/etc/machine-id")
BOOT_ID = os.environ.get("SGLANG_DEPLOY_BOOT_ID", "/proc/sys/kernel/random/boot_id")
TOKEN = re.compile(r"[0-9a-f]{32}")
# A `.new-*` directory younger than this may still be on its way into place (its maker renames it
# within a command of at most WAIT_S); older ones are strays. Even a young one taken away only makes
# its maker's rename fail (it then answers "not acquired" or tries again): nothing is removed in
# place.
STRAY_AGE_S = 120


def identity_file(path):
    try:
        with open(path) as handle:
            value = handle.read().strip()
    except OSError:
        return ""
    return value if re.fullmatch(r"[0-9a-f-]{1,64}", value) else ""


def answer(**fields):
    fields.update(machine=identity_file(MACHINE_ID), boot=identity_file(BOOT_ID))
    print(json.dumps(fields))
    sys.exit(0)


def holder():
    try:
        with open(OWNER) as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        # never made by this version: a hand-made directory, or one left by a deploy from before
        # owner records were renamed in with their directory
        return {"id": "?", "who": "unknown (no owner.json)"}
    if not isinstance(found, dict):
        return {"id": "?", "who": "unknown (owner.json is not a record)"}
    # How long ago its run renewed it (operations/lock/lock_record.py: RENEW_S), on this host's
    # clock; the record's own word never counts for it.
    found.pop("renewed_s_ago", None)
    try:
        found["renewed_s_ago"] = round(max(0.0, time.time() - os.stat(ALIVE).st_mtime), 1)
    except OSError:
        pass
    return found


def exists():
    return os.path.lexists(LOCK)


def rename_noreplace(src, dst):
    """rename(2) that fails when anything is at `dst` (an empty directory included). True if
    renamed."""
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd, noreplace = -100, 1
        if renameat2(at_fdcwd, src.encode(), at_fdcwd, dst.encode(), noreplace) == 0:
            return True
        err = ctypes.get_errno()
        if err in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        # EINVAL, ENOSYS: the kernel or filesystem lacks the flag
        if err not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(err, os.strerror(err), f"{src} -> {dst}")
    # without the flag: checked first (racing only a pre-rule deploy's mkdir)
    if os.path.lexists(dst):
        return False
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise
    return True


def build(owner, token):
    """The lock as it will be in place: a new directory (0700) with the owner's marker and
    owner.json."""
    new = f"{LOCK}.new-{token}"
    shutil.rmtree(new, ignore_errors=True)
    os.mkdir(new, 0o700)
    # A marker named by the take's token: the release (operations/lock/lock_record.py:
    # release_command) checks it in sh.
    open(os.path.join(new, "owner-" + token), "w").close()
    open(os.path.join(new, "alive"), "w").close()
    with open(os.path.join(new, "owner.json"), "w") as handle:
        json.dump(owner, handle)
    return new


def remove(path, token):
    """Take the lock at `path` away: renamed aside first (atomic), then deleted."""
    aside = f"{LOCK}.old-{token}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def tidy():
    """Remove the strays of crashed takes and releases beside the lock (called with the guard
    held)."""
    parent, base = os.path.split(LOCK)
    now = time.time()
    for name in os.listdir(parent or "."):
        kind = name[len(base) + 1:len(base) + 5] if name.startswith(base + ".") else ""
        if kind not in ("new-", "old-"):
            continue
        path = os.path.join(parent, name)
        try:
            if kind == "new-" and now - os.lstat(path).st_mtime < STRAY_AGE_S:
                continue
            aside = path if kind == "old-" else f"{LOCK}.old-{name[len(base) + 5:]}"
            if aside != path:
                # its maker's rename now fails: it never places a half-removed lock
                os.rename(path, aside)
            shutil.rmtree(aside, ignore_errors=True)
        except OSError:
            continue


action = sys.argv[1]
if action == "release":
    token = sys.argv[2]
    if TOKEN.fullmatch(token) and holder().get("token") == token:
        remove(LOCK, token)
    answer(released=True)
if action == "peek":
    answer(held_by=holder() if exists() else None)

owner, wait_s = json.loads(sys.argv[2]), float(sys.argv[3])
token = str(owner.get("token", ""))
if not TOKEN.fullmatch(token):
    raise SystemExit(f"lock_host.py: owner token {token!r} is not 32 hex digits")
takeover = sys.argv[4] if len(sys.argv) > 4 else None
new = build(owner, token)
try:
    with open(LOCK + ".guard", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        tidy()
        if takeover and holder().get("token") == takeover:
            remove(LOCK, takeover)
        deadline = time.monotonic() + wait_s
        while True:
            if not os.path.isdir(new):  # taken away as a stray while this take waited: made again
                new = build(owner, token)
            if rename_noreplace(new, LOCK):
                answer(acquired=True)
            if time.monotonic() >= deadline:
                answer(acquired=False, held_by=holder())
            # give the guard up while waiting: a takeover by another run must not wait on us
            fcntl.flock(guard, fcntl.LOCK_UN)
            time.sleep(0.2)
            fcntl.flock(guard, fcntl.LOCK_EX)
finally:
    shutil.rmtree(new, ignore_errors=True)  # not placed (or already renamed: then nothing is there)
