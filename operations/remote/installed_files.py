# Fact script: the installed version of a distribution (from its .dist-info directory)
# and the sha256 of files under site-packages.
# and whether a backup of each exists under BACKUP_DIR.
# argv: SITE_PACKAGES DISTRIBUTION BACKUP_DIR REL_PATH...
import hashlib
import json
import os
import re
import sys

site, dist, backup_dir = sys.argv[1:4]
paths = sys.argv[4:]


def norm(name):
    return re.sub(r"[-_.]+", "_", name).lower()


version = None
if os.path.isdir(site):
    for entry in os.listdir(site):
        if entry.endswith(".dist-info") and "-" in entry:
            name, _, ver = entry[: -len(".dist-info")].partition("-")
            if norm(name) == norm(dist):
                version = ver
hashes = {}
for rel in paths:
    path = os.path.join(site, rel)
    if os.path.isfile(path):
        with open(path, "rb") as handle:
            hashes[rel] = hashlib.sha256(handle.read()).hexdigest()
    else:
        hashes[rel] = None
backups = {rel: os.path.isfile(os.path.join(backup_dir, rel)) for rel in paths}
print(json.dumps({"version": version, "files": hashes, "backups": backups}))
