# Fact script: the host's sglang-*.service units, whether we manage them, and their state, as JSON.
# argv: UNIT_DIR
import glob
import json
import os
import subprocess
import sys

MANAGED = "# Managed by sglang-deploy"
unit_dir = sys.argv[1]
paths = sorted(glob.glob(os.path.join(unit_dir, "sglang-*.service")))
names = [os.path.basename(p) for p in paths]
props = {}
if names:
    try:
        shown = subprocess.run(["systemctl", "show", "-p", "Id,ActiveState,UnitFileState,MainPID", *names], capture_output=True, text=True).stdout
    except OSError:
        shown = ""
    block = {}
    for line in shown.splitlines() + [""]:
        if not line.strip():
            if block.get("Id"):
                props[block["Id"]] = block
            block = {}
            continue
        key, _, value = line.partition("=")
        block[key] = value
out = {}
for path, name in zip(paths, names):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            managed = handle.read(len(MANAGED)) == MANAGED
    except OSError:
        continue
    info = props.get(name, {})
    out[name] = {
        "path": path, "managed": managed, "active": info.get("ActiveState", ""),
        "enabled": info.get("UnitFileState", ""), "pid": int(info.get("MainPID") or 0),
    }
print(json.dumps(out))
