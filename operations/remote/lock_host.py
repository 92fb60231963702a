# One deploy at a time per host: take, look at, or give back the host's deploy lock.
# The lock is a directory (mkdir is atomic) holding owner.json and an `owner-<id>` marker; /run is emptied on reboot.
# A side file is flock()ed around a takeover, so that two runs taking over the same stale
# lock cannot both win (the second would otherwise remove the first's fresh lock).
# Every wait is bounded by WAIT_S: the control side waits in short commands and decides
# between them (it never holds another host's lock while a command here waits).
# argv: acquire OWNER_JSON WAIT_S [TAKEOVER_ID]  |  peek  |  release OWNER_ID
# SGLANG_DEPLOY_LOCK moves the lock (unit tests run this script on the control machine).
import fcntl
import json
import os
import shutil
import sys
import time

LOCK = os.environ.get("SGLANG_DEPLOY_LOCK", "/run/sglang-deploy.lock")
OWNER = os.path.join(LOCK, "owner.json")


def holder():
    try:
        with open(OWNER) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        # mkdir done, owner.json not yet renamed in (or a hand-made directory)
        return {"id": "?", "who": "unknown (no owner.json)"}


def exists():
    return os.path.isdir(LOCK)


action = sys.argv[1]
if action == "release":
    if holder().get("id") == sys.argv[2]:
        shutil.rmtree(LOCK, ignore_errors=True)
    print(json.dumps({"released": True}))
    sys.exit(0)
if action == "peek":
    print(json.dumps({"held_by": holder() if exists() else None}))
    sys.exit(0)

owner, wait_s = json.loads(sys.argv[2]), float(sys.argv[3])
takeover = sys.argv[4] if len(sys.argv) > 4 else None
with open(LOCK + ".guard", "a") as guard:
    fcntl.flock(guard, fcntl.LOCK_EX)
    if takeover and holder().get("id") == takeover:
        shutil.rmtree(LOCK, ignore_errors=True)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.mkdir(LOCK, 0o700)
        except FileExistsError:
            if time.monotonic() >= deadline:
                print(json.dumps({"acquired": False, "held_by": holder()}))
                sys.exit(0)
            # give the guard up while waiting: a takeover by another run must not wait on us
            fcntl.flock(guard, fcntl.LOCK_UN)
            time.sleep(0.2)
            fcntl.flock(guard, fcntl.LOCK_EX)
            continue
        # A marker named by the owner id: its release (operations/lock.py: release_command) checks it in sh.
        if str(owner.get("id", "")).isalnum():
            open(os.path.join(LOCK, "owner-" + owner["id"]), "w").close()
        with open(OWNER + ".tmp", "w") as handle:
            json.dump(owner, handle)
        os.rename(OWNER + ".tmp", OWNER)
        print(json.dumps({"acquired": True}))
        sys.exit(0)
