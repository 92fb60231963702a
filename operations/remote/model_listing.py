# Fact script: {relpath: size} of a model directory, leaving out our own marker, manifest
# and journal files; null when the directory is absent or empty.
# argv: PATH
import json
import os
import sys

root = sys.argv[1]
OURS = (".sglang-deploy-",)
out = {}
if os.path.isdir(root):
    for base, dirs, names in os.walk(root):
        dirs.sort()
        for name in names:
            if name.startswith(OURS):
                continue
            path = os.path.join(base, name)
            out[os.path.relpath(path, root)] = os.path.getsize(path)
print(json.dumps(out or None))
