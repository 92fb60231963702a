# Fact script: a unit's systemd state and the HTTP status of its /health endpoint, as JSON,
# and which of the service's inputs (PATH...: its unit file, the venv link, staged models'
# markers, its key file) changed after the running process started: a deploy that died
# between changing an input and restarting the service leaves exactly that behind.
# argv: UNIT ADDRESS PORT [PATH...]
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

unit, address, port, paths = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
props = {}
out = subprocess.run(
    ["systemctl", "show", unit, "-p", "LoadState,ActiveState,SubState,MainPID,NRestarts,ActiveEnterTimestampMonotonic"],
    capture_output=True, text=True,
)
for line in out.stdout.splitlines():
    key, _, value = line.partition("=")
    props[key] = value
health = None
try:
    with urllib.request.urlopen(f"http://{address}:{port}/health", timeout=5) as response:
        health = response.status
except urllib.error.HTTPError as exc:
    health = exc.code
except OSError:
    health = None
uptime = None
try:
    with open("/proc/uptime") as handle:
        now = float(handle.read().split()[0])
    entered = int(props.get("ActiveEnterTimestampMonotonic") or 0) / 1e6
    if entered:
        uptime = round(now - entered, 1)
except (OSError, ValueError):
    pass
newer = []
entered = int(props.get("ActiveEnterTimestampMonotonic") or 0) / 1e6
if entered and props.get("ActiveState") == "active":
    started = time.time() - (time.monotonic() - entered)  # the same kernel clock as systemd's
    for path in paths:
        try:
            if os.lstat(path).st_mtime > started + 1:
                newer.append(path)
        except OSError:
            pass
print(json.dumps({
    "load": props.get("LoadState"), "active": props.get("ActiveState"), "sub": props.get("SubState"),
    "pid": int(props.get("MainPID") or 0), "restarts": int(props.get("NRestarts") or 0),
    "health": health, "uptime_s": uptime, "newer": newer,
}))
