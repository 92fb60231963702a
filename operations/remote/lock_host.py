# One deploy at a time per host: take, or give back, the host's deploy lock.
# The lock is a directory (mkdir is atomic) holding owner.json; /run is emptied on reboot.
# argv: acquire OWNER_JSON WAIT_S [TAKEOVER_ID]  |  release OWNER_ID
import json
import os
import shutil
import sys
import time

LOCK = "/run/sglang-deploy.lock"
OWNER = os.path.join(LOCK, "owner.json")


def holder():
    try:
        with open(OWNER) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {"id": "?", "who": "unknown (no owner.json)"}


action = sys.argv[1]
if action == "release":
    if holder().get("id") == sys.argv[2]:
        shutil.rmtree(LOCK, ignore_errors=True)
    print(json.dumps({"released": True}))
    sys.exit(0)

owner, wait_s = json.loads(sys.argv[2]), float(sys.argv[3])
takeover = sys.argv[4] if len(sys.argv) > 4 else None
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
        time.sleep(1)
        continue
    with open(OWNER + ".tmp", "w") as handle:
        json.dump(owner, handle)
    os.rename(OWNER + ".tmp", OWNER)
    print(json.dumps({"acquired": True}))
    sys.exit(0)
