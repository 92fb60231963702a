# Fact script: the directories in the shm dir that sglang-deploy made, as one JSON line.
# Also lists the models in the shm dir that an installed sglang-* unit still loads: a service
# being moved away keeps its staged models until its unit is removed (after the new host is ready).
# argv: SHM_DIR MARKER_NAME JOURNAL_NAME UNITS_DIR
# {"<entry>": "staged" | "partial" | "old"}: a staged model carries the marker; an interrupted
# copy (`.NAME.partial`) the journal; `.NAME.old` is a replaced copy not yet deleted. Anything
# without our marker or journal is not listed, so it is never removed; nor is anything that is not
# root's throughout (the directory and the marker or journal: no symlink, no other owner, no write
# bit for others): the shm dir is world-writable, and a copy of our marker proves nothing.
import json
import os
import stat
import sys

from _common import stat_untrusted, why_untrusted  # noqa: E402 - remote.script puts _common.py here

shm_dir, marker_name, journal_name = sys.argv[1:4]
units_dir = sys.argv[4] if len(sys.argv) > 4 else "/etc/systemd/system"
out = {}


def ours(path):
    """A regular file of root's, writable by root alone."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and stat_untrusted(path, st) is None


try:
    entries = sorted(os.listdir(shm_dir))
except OSError:
    entries = []
for entry in entries:
    path = os.path.join(shm_dir, entry)
    if os.path.islink(path) or not os.path.isdir(path):
        continue
    marked = ours(os.path.join(path, marker_name))
    journaled = ours(os.path.join(path, journal_name))
    if not (marked or journaled) or why_untrusted(path):
        continue
    if entry.startswith(".") and entry.endswith(".partial"):
        out[entry] = "partial"
    elif entry.startswith(".") and entry.endswith(".old"):
        out[entry] = "old"
    elif marked:
        out[entry] = "staged"
in_units = set()
prefix = shm_dir.rstrip("/") + "/"
try:
    unit_names = sorted(n for n in os.listdir(units_dir)
                        if n.startswith("sglang-") and n.endswith(".service"))
except OSError:
    unit_names = []
for unit_name in unit_names:
    try:
        with open(os.path.join(units_dir, unit_name)) as handle:
            words = handle.read().replace("\\\n", " ").split()
    except OSError:
        continue
    for flag, value in zip(words, words[1:]):
        if flag in ("--model-path", "--speculative-draft-model-path") and value.startswith(prefix):
            in_units.add(value[len(prefix):].split("/")[0])
print(json.dumps({"owned": out, "in_units": sorted(in_units)}))
