# Fact script: describe a model's source directory and its staged copy, as one JSON line.
# argv: SRC DEST MARKER_NAME
import json
import os
import sys

src, dest, marker_name = sys.argv[1:4]


def listing(root):
    if not os.path.isdir(root):
        return None
    out = {}
    for base, dirs, names in os.walk(root):
        dirs.sort()
        for name in names:
            path = os.path.join(base, name)
            rel = os.path.relpath(path, root)
            if rel == marker_name:
                continue
            out[rel] = os.stat(path).st_size
    return out


marker = None
marker_path = os.path.join(dest, marker_name)
if os.path.isfile(marker_path):
    try:
        with open(marker_path) as handle:
            marker = json.load(handle)
    except ValueError:
        marker = {"corrupt": True}
parent = os.path.dirname(dest.rstrip("/")) or "/"
free = None
if os.path.isdir(parent):
    st = os.statvfs(parent)
    free = st.f_bavail * st.f_frsize
print(json.dumps({"src": listing(src), "dest": listing(dest), "marker": marker, "free": free}))
