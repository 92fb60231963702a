# Fact script: the installed version of a distribution (from its .dist-info directory)
# and the sha256 of files under site-packages.
# whether a backup of each exists under BACKUP_DIR, and the applied-state RECORD (JSON) if any.
# argv: SITE_PACKAGES DISTRIBUTION BACKUP_DIR RECORD REL_PATH...
import json
import os
import sys

from _common import (  # noqa: E402 - remote.script puts _common.py here
    norm,
    sha256_file,
    why_untrusted,
)

site, dist, backup_dir, record_path = sys.argv[1:5]
paths = sys.argv[5:]


version = None
if os.path.isdir(site):
    for entry in os.listdir(site):
        if entry.endswith(".dist-info") and "-" in entry:
            name, _, ver = entry[: -len(".dist-info")].partition("-")
            if norm(name, "_") == norm(dist, "_"):
                version = ver
hashes = {}
for rel in paths:
    path = os.path.join(site, rel)
    if os.path.isfile(path):
        hashes[rel] = sha256_file(path)
    else:
        hashes[rel] = None
backups = {rel: os.path.isfile(os.path.join(backup_dir, rel)) for rel in paths}
record = None
# The applied-state record decides what root restores from the backups: read only if root's alone.
if os.path.isfile(record_path) and why_untrusted(record_path):
    record = {"corrupt": True}
elif os.path.isfile(record_path):
    try:
        with open(record_path) as handle:
            record = json.load(handle)
    except ValueError:
        record = {"corrupt": True}
print(json.dumps({"version": version, "files": hashes, "backups": backups, "record": record}))
