# Fact script: the host's sglang-*.service units, whether we manage them, and their state, as JSON.
# argv: UNIT_DIR
import glob
import json
import os
import re
import sys

from _common import systemctl_show  # noqa: E402 - remote.script puts _common.py here

MANAGED = "# Managed by sglang-deploy"
unit_dir = sys.argv[1]
paths = sorted(glob.glob(os.path.join(unit_dir, "sglang-*.service")))
names = [os.path.basename(p) for p in paths]
props = systemctl_show(names, ("ActiveState", "UnitFileState", "MainPID"))
out = {}
for path, name in zip(paths, names):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 16)
    except OSError:
        continue
    info = props.get(name, {})
    # The drain this unit was written with (our units write whole seconds): a removal waits for it.
    stop = re.search(r"^TimeoutStopSec=(\d+)\s*$", text, re.M)
    out[name] = {
        "path": path, "managed": text.startswith(MANAGED), "active": info.get("ActiveState", ""),
        "enabled": info.get("UnitFileState", ""), "pid": int(info.get("MainPID") or 0),
        "stop_timeout_s": int(stop.group(1)) if stop else None,
    }
print(json.dumps(out))
