# Fact script: {relpath: size} of a model directory, leaving out our own marker, manifest
# and journal files; null when the directory is absent or empty.
# argv: PATH
import json
import os
import sys

from _common import walk_files  # noqa: E402 - remote.script puts _common.py here

root = sys.argv[1]
OURS = (".sglang-deploy-",)
listing = walk_files(root, skip=lambda rel, name: name.startswith(OURS)) or {}
# Sizes of what the names point at (a store may hold links into a download cache).
print(json.dumps({rel: os.path.getsize(os.path.join(root, rel)) for rel in listing} or None))
