# Stage a model directory: copy SRC into a temporary sibling of DEST, verify every file
# by sha256 against the source, write the ownership marker (the manifest), then rename
# into place. An interrupted run leaves only the temporary sibling, which the next run
# deletes: nothing that looks complete is ever half-written.
# argv: SRC DEST MARKER_NAME
import hashlib
import json
import os
import shutil
import sys

src, dest, marker_name = sys.argv[1:4]
BLOCK = 1 << 22
dest = dest.rstrip("/")
parent, name = os.path.split(dest)
tmp = os.path.join(parent, f".{name}.partial")
old = os.path.join(parent, f".{name}.old")


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(1)


if not os.path.isdir(src):
    fail(f"model source {src} does not exist on this host: put the model there, or fix `model`/`model_store` in the data")
files = []
for base, dirs, names in os.walk(src):
    dirs.sort()
    for entry in sorted(names):
        files.append(os.path.relpath(os.path.join(base, entry), src))
total = sum(os.path.getsize(os.path.join(src, rel)) for rel in files)
os.makedirs(parent, exist_ok=True)
for leftover in (tmp, old):
    shutil.rmtree(leftover, ignore_errors=True)
st = os.statvfs(parent)
free = st.f_bavail * st.f_frsize
# The staged copy replaces an existing one only after it is complete, so both must fit.
if total > free:
    gib = 2 ** 30
    fail(f"{parent} has {free / gib:.2f} GiB free, model {name} needs {total / gib:.2f} GiB: free space there or load the model from the store")

manifest = {}
os.makedirs(tmp)
for rel in files:
    source_path, target_path = os.path.join(src, rel), os.path.join(tmp, rel)
    os.makedirs(os.path.dirname(target_path), exist_ok=True)
    digest = hashlib.sha256()
    with open(source_path, "rb") as reader, open(target_path, "wb") as writer:
        for block in iter(lambda: reader.read(BLOCK), b""):
            digest.update(block)
            writer.write(block)
    shutil.copystat(source_path, target_path)
    manifest[rel] = [os.path.getsize(source_path), digest.hexdigest()]
for rel, (size, sha) in manifest.items():
    check = hashlib.sha256()
    with open(os.path.join(tmp, rel), "rb") as reader:
        for block in iter(lambda: reader.read(BLOCK), b""):
            check.update(block)
    if check.hexdigest() != sha:
        shutil.rmtree(tmp, ignore_errors=True)
        fail(f"staged copy of {rel} differs from {src}/{rel} after copying (sha256 {check.hexdigest()} != {sha}); nothing was replaced")
with open(os.path.join(tmp, marker_name), "w") as handle:
    json.dump({"source": src, "files": manifest}, handle, sort_keys=True)
if os.path.exists(dest):
    os.rename(dest, old)
os.rename(tmp, dest)
shutil.rmtree(old, ignore_errors=True)
print(f"staged {name}: {len(manifest)} files, {total / 2**20:.1f} MiB, verified")
