# Fact script: {relpath: size} of a model directory, leaving out our own marker, manifest
# and journal files; null when the directory is absent or empty.
# argv: PATH
# A store's model directory may itself be a link of the operator's, and hold links into a download
# cache: those are followed for their sizes (files only, as the control machine's listing does).
# Nothing is walked through a link, and the walk is bounded (_common.walk_files): a tree too deep or
# too large fails the read, naming it.
import json
import os
import stat
import sys

from _common import Unwalkable, walk_files  # noqa: E402 - remote.script puts _common.py here

root = sys.argv[1]
OURS = (".sglang-deploy-",)
try:
    listing = walk_files(root, skip=lambda rel, name: name.startswith(OURS), follow_root=True) or {}
except Unwalkable as exc:
    sys.exit(f"model_listing: {exc}")
sizes = {}
for rel, st in listing.items():
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(os.path.join(root, rel))
        except OSError:
            continue  # a dangling link: no file
        if not stat.S_ISREG(st.st_mode):
            continue  # a link to a directory: not walked, not a file
    sizes[rel] = st.st_size
print(json.dumps(sizes or None))
