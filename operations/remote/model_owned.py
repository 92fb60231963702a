# Fact script: the directories in the shm dir that sglang-deploy made, as one JSON line.
# argv: SHM_DIR MARKER_NAME JOURNAL_NAME
# {"<entry>": "staged" | "partial" | "old"}: a staged model carries the marker; an interrupted
# copy (`.NAME.partial`) the journal; `.NAME.old` is a replaced copy not yet deleted. Anything
# without our marker or journal is not listed, so it is never removed.
import json
import os
import sys

shm_dir, marker_name, journal_name = sys.argv[1:4]
out = {}
try:
    entries = sorted(os.listdir(shm_dir))
except OSError:
    entries = []
for entry in entries:
    path = os.path.join(shm_dir, entry)
    if os.path.islink(path) or not os.path.isdir(path):
        continue
    marked = os.path.isfile(os.path.join(path, marker_name))
    journaled = os.path.isfile(os.path.join(path, journal_name))
    if not (marked or journaled):
        continue
    if entry.startswith(".") and entry.endswith(".partial"):
        out[entry] = "partial"
    elif entry.startswith(".") and entry.endswith(".old"):
        out[entry] = "old"
    elif marked:
        out[entry] = "staged"
print(json.dumps(out))
