# Fact script: a unit's systemd state and the HTTP status of its /health endpoint, as JSON.
# argv: UNIT ADDRESS PORT
import json
import subprocess
import sys
import urllib.error
import urllib.request

unit, address, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
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
print(json.dumps({
    "load": props.get("LoadState"), "active": props.get("ActiveState"), "sub": props.get("SubState"),
    "pid": int(props.get("MainPID") or 0), "restarts": int(props.get("NRestarts") or 0),
    "health": health, "uptime_s": uptime,
}))
