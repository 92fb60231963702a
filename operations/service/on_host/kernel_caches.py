# Fact script: the host's kernel caches (kernel_cache.KERNELS_DIR/<key>: files and bytes in each)
# and the keys the host's unit files name (installed, runtime, the rollback's saved units), as JSON.
# argv: KERNELS_DIR UNIT_FILE_GLOB...
import glob
import json
import os
import re
import sys

KEY = re.compile(r"/kernels/([0-9a-f]{16})(?:/|\s|$)", re.M)
root, patterns = sys.argv[1], sys.argv[2:]
caches = {}
try:
    entries = sorted(os.listdir(root))
except OSError:
    entries = []
for name in entries:
    path = os.path.join(root, name)
    if os.path.islink(path) or not os.path.isdir(path):
        continue
    files = size = 0
    for top, dirs, names in os.walk(path):  # links are not followed
        for each in names:
            try:
                st = os.lstat(os.path.join(top, each))
            except OSError:
                continue
            files += 1
            size += st.st_size
    caches[name] = {"files": files, "bytes": size}
named = set()
for pattern in patterns:
    for path in glob.glob(pattern):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                named.update(KEY.findall(handle.read(1 << 16)))
        except OSError:
            continue
print(json.dumps({"caches": caches, "named": sorted(named)}))
