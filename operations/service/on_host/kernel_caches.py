# Fact script: the host's kernel caches (kernel_cache.KERNELS_DIR/<key>: files and bytes in each),
# its sealed copies (kernel_cache.SEALED_DIR/<key>.<arch>) and the keys the host's unit files name
# (installed, runtime, the rollback's saved units: {path: [key]}), as JSON.
# argv: KERNELS_DIR SEALED_DIR UNIT_DIR... (the `sglang-*` files in each)
import glob
import json
import os
import re
import sys

from _common import Unwalkable, walk_files  # noqa: E402 - remote.script puts _common.py here

KEY = re.compile(r"/kernels/([0-9a-f]{16})(?:/|\s|$)", re.M)
root, sealed_root, unit_dirs = sys.argv[1], sys.argv[2], sys.argv[3:]


def listed(where):
    """{name: {"files", "bytes"}} of each directory in `where` (not a link, not our `.partial`)."""
    found = {}
    try:
        entries = sorted(os.listdir(where))
    except OSError:
        entries = []
    for name in entries:
        path = os.path.join(where, name)
        if name.startswith(".") or os.path.islink(path) or not os.path.isdir(path):
            continue
        try:  # bounded, nothing followed: the service user makes these trees
            walked = walk_files(path, skip=lambda rel, base: base.startswith(".sglang-deploy-"))
        except Unwalkable as exc:
            found[name] = {"files": 0, "bytes": 0, "error": str(exc)}
            continue
        walked = walked or {}
        found[name] = {"files": len(walked), "bytes": sum(st.st_size for st in walked.values())}
    return found


caches, sealed = listed(root), listed(sealed_root)
named = {}
for unit_dir in unit_dirs:
    for path in sorted(glob.glob(os.path.join(glob.escape(unit_dir), "sglang-*"))):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                keys = sorted(set(KEY.findall(handle.read(1 << 16))))
        except OSError:
            continue
        if keys:
            named[path] = keys
print(json.dumps({"caches": caches, "sealed": sealed, "named": named}))
