# The forced command of a one-time key (operations/transport/peer_keys.py): the only thing the
# receiving host may run on the source host with it. Installed, root's and 0600, beside its grant
# (grant.json: the directory it may read and the exact list of names under it) in a directory only
# root may enter; the authorized_keys entry runs it as
#     PYTHON -I GRANT_DIR/send.py SHA256_OF_GRANT_JSON
# so the list is fixed by the entry itself: a grant.json that is not byte for byte the one granted
# is refused. What the receiver asked for is in SSH_ORIGINAL_COMMAND, and only two requests are
# known:
#   probe   prints one line (the receiver can reach this host with this key) and reads nothing;
#   send    reads NUL-separated names on stdin, each exactly one of the granted names, no `..`, no
#           absolute name, no symlink on the way to it, and writes one tar stream of those names
#           (`tar --no-recursion`).
# Anything else (a shell, `scp -f`, sftp, another name, a name outside the list) is refused, naming
# it, exit 1. The source is only read. argv: SHA256 of grant.json
import hashlib
import json
import os
import stat
import subprocess
import sys


def refuse(why):
    sys.stderr.write(f"sglang-deploy-peer: refused: {why}\n")
    sys.exit(1)


def shown(text):
    return text if text.isprintable() else ascii(text)


here = os.path.dirname(os.path.abspath(__file__))
try:
    with open(os.path.join(here, "grant.json"), "rb") as handle:
        raw = handle.read()
except OSError as exc:
    refuse(f"no grant ({exc.strerror})")
if len(sys.argv) != 2 or hashlib.sha256(raw).hexdigest() != sys.argv[1]:
    refuse("the grant is not the one this key was given for")
grant = json.loads(raw)
asked = os.environ.get("SSH_ORIGINAL_COMMAND", "")
if asked == "probe":
    sys.stdout.write("sglang-deploy-peer ok\n")
    sys.exit(0)
if asked != "send":
    refuse(f"this key may run only the transfer it was made for, not {shown(asked)!r}")

root = grant["root"]
allowed = set(grant["names"])
names = [n for n in sys.stdin.buffer.read().split(b"\0") if n]
if not names:
    refuse("no names asked for")
checked = []
for raw_name in names:
    name = raw_name.decode("utf-8", "surrogateescape")
    if name not in allowed:
        refuse(f"{shown(name)!r} is not in the list this key was given for")
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or "" in parts:
        refuse(f"{shown(name)!r}: not a plain relative name")
    path = root
    for part in parts[:-1]:  # every directory on the way a real one (no link leads out of the tree)
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except OSError as exc:
            refuse(f"{shown(name)!r}: {exc.strerror}")
        if not stat.S_ISDIR(st.st_mode):
            refuse(f"{shown(name)!r}: {shown(path)} is not a directory")
    try:
        st = os.lstat(os.path.join(root, name))
    except OSError as exc:
        refuse(f"{shown(name)!r}: {exc.strerror}")
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        refuse(f"{shown(name)!r} is not a file")
    checked.append(b"./" + raw_name)

# time bound: the receiving unpacker's deadline and idle limit end the stream, and tar with it
tar = subprocess.Popen(
    ["tar", "-C", root, "--null", "--verbatim-files-from", "--no-recursion", "-T", "-", "-cf", "-"],
    stdin=subprocess.PIPE)
tar.stdin.write(b"\0".join(checked) + b"\0")
tar.stdin.close()
sys.exit(tar.wait())
