# One-time access from one inventory host to another for one transfer
# (operations/transport/peer_keys.py), both ends, as root. Sent as `python3 -I -c SCRIPT MODE ARGS`
# (stdin is free for the mode's input).
#
# On the receiving host:
#   keys ID ADDRESS PORT
#       (stdin: the owner record, JSON) makes PEER_KEYS/ID (0700), a new ed25519 key there (no
#       passphrase, it never leaves this host), and finds the address this host reaches ADDRESS
#       from (the source's `from=`); prints {"pub", "from", "ours"}, or {"unreachable": why}.
#   trust ID
#       (stdin: {"hostkeys": [...], "argv": [...]}) writes the source's host keys, as the pyinfra
#       connection to the source read them, into PEER_KEYS/ID/known_hosts under the key's alias,
#       then asks the source `probe` with ARGV; prints {"ok", "said"}.
#   fetch ARGV RECEIVE
#       (stdin: NUL-separated names) runs ARGV + `send` (the names on its stdin) and relays what it
#       writes into `sh -c RECEIVE` (root's unpacker); prints the bytes relayed so far, a line at a
#       time; exit 0 only when both ends did.
# On the source host:
#   grant
#       (stdin: {"id", "pub", "from", "root", "names", "owner", "sender"}) writes the grant
#       (PEER_GRANTS/ID: grant.json, the forced command send.py) and appends to root's
#       authorized_keys one entry: `restrict`, `from=` the receiver, `expiry-time=`, `command=`
#       send.py with grant.json's sha256, the key, the comment MARK:ID; prints {"hostkeys", "user",
#       "ours"}, or {"refused": why}. The owner record's `ttl_s` becomes its `expires` (this host's
#       clock), on either host.
# On either:
#   left
#       prints {"grants": ours, "keys": ours}: every grant and key of ours on this host, read only
#       (each deploy's read of the host: the control machine sweeps those of runs that died).
#   remove ID...
#       removes those grants' entries (only lines of exactly our form with that ID: no other line
#       of authorized_keys is touched, byte for byte) and their directories on this host.
# "ours": {ID: {"owner", "expired", "entry", "record"}} for every grant or key of ours found here
# besides the new one, which the control machine judges (a stale one, of a run that died, is then
# removed).
import fcntl
import hashlib
import ipaddress
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from _common import private_dir  # noqa: E402 - remote.script puts _common.py here

MARK = "sglang-deploy-peer"
PEER_KEYS = "/run/sglang-deploy/peer-keys"
PEER_GRANTS = "/run/sglang-deploy/peer-grants"
ID = re.compile(r"[0-9a-f]{32}")
ENTRY = re.compile(r'restrict,from="[0-9A-Fa-f.:]+",expiry-time="[0-9]{14}",command="[^"\\]*" '
                   r"ssh-ed25519 [A-Za-z0-9+/]+={0,2} " + MARK + r":([0-9a-f]{32})")
PUB = re.compile(r"ssh-ed25519 [A-Za-z0-9+/]+={0,2}")


def answer(value):
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


def authorized_keys():
    return os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".ssh", "authorized_keys")


def entries(text):
    """{ID: line} of our entries in authorized_keys' text."""
    out = {}
    for line in text.split(b"\n"):
        found = ENTRY.fullmatch(line.decode("utf-8", "replace"))
        if found:
            out[found.group(1)] = line
    return out


def read_keys(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return b""


def rewrite_keys(path, text):
    """authorized_keys replaced whole by `text` (a file beside it, same owner and mode, renamed over
    it)."""
    try:
        st = os.lstat(path)
        mode, uid, gid = st.st_mode & 0o7777, st.st_uid, st.st_gid
    except FileNotFoundError:
        mode, uid, gid = 0o600, os.geteuid(), os.getegid()
    temporary = f"{path}.{MARK}-{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text)
            handle.flush()
            os.fchown(handle.fileno(), uid, gid)
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.rename(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def locked():
    """Our writers of authorized_keys one at a time (this host's runs of the deploy)."""
    private_dir(PEER_GRANTS)
    handle = open(os.path.join(PEER_GRANTS, ".lock"), "a")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def record(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def ours(directory, keys_text=None, but=None):
    found = {}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        names = []
    listed = entries(keys_text) if keys_text is not None else {}
    for name in set(names) | set(listed):
        if not ID.fullmatch(name) or name == but:
            continue
        owner = record(os.path.join(directory, name, "owner.json"))
        expires = (owner or {}).get("expires")
        found[name] = {"owner": owner,
                       "expired": not isinstance(expires, (int, float)) or time.time() > expires,
                       "entry": name in listed, "record": owner is not None}
    return found


def write_private(path, data, mode=0o600):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def new_dir(parent, ident):
    private_dir(parent)
    path = os.path.join(parent, ident)
    shutil.rmtree(path, ignore_errors=True)
    os.mkdir(path, 0o700)
    return path


# The receiving host -------------------------------------------------------------------------------


def keys(ident, address, port):
    owner = json.load(sys.stdin)
    try:
        infos = socket.getaddrinfo(address, int(port), type=socket.SOCK_DGRAM)
    except OSError as exc:
        return answer({"unreachable": f"{address} does not resolve here ({exc})"})
    source_of, why = None, ""
    for family, kind, proto, _, where in infos:
        probe = socket.socket(family, kind, proto)
        try:
            probe.connect(where)  # no packet: the kernel picks the route and this end's address
            source_of = probe.getsockname()[0]
            break
        except OSError as exc:
            why = exc.strerror or str(exc)
        finally:
            probe.close()
    if source_of is None:
        return answer({"unreachable": f"no route to {address} ({why})"})
    directory = new_dir(PEER_KEYS, ident)
    owner["expires"] = int(time.time()) + int(owner.pop("ttl_s"))
    write_private(os.path.join(directory, "owner.json"), json.dumps(owner).encode())
    try:
        made = subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{MARK}:{ident}", "-f",
             os.path.join(directory, "key")], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        shutil.rmtree(directory, ignore_errors=True)
        return answer({"unreachable": "ssh-keygen: no answer within 60 s"})
    if made.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        return answer({"unreachable": f"ssh-keygen failed: {made.stderr.strip()[-300:]}"})
    with open(os.path.join(directory, "key.pub"), encoding="utf-8") as handle:
        pub = " ".join(handle.read().split()[:2])
    answer({"pub": pub, "from": source_of, "ours": ours(PEER_KEYS, but=ident)})


def trust(ident):
    given = json.load(sys.stdin)
    directory = os.path.join(PEER_KEYS, ident)
    alias = f"{MARK}-{ident}"
    lines = [f"{alias} {key}\n" for key in given["hostkeys"]
             if re.fullmatch(r"[a-z0-9@.-]+ [A-Za-z0-9+/]+={0,2}", key)]
    write_private(os.path.join(directory, "known_hosts"), "".join(lines).encode())
    try:
        probe = subprocess.run([*given["argv"], "probe"], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return answer({"ok": False, "said": "no answer within 60 s"})
    said = " ".join((probe.stderr or probe.stdout).strip().splitlines()[-2:])[-300:]
    answer({"ok": probe.returncode == 0 and probe.stdout.strip() == f"{MARK} ok",
            "said": said or f"exit {probe.returncode}"})


def fetch(argv_json, receive):
    names = sys.stdin.buffer.read()
    said = tempfile.TemporaryFile()
    # time bound: both ends stop within the receiving unpacker's deadline and idle limit, or
    # ssh's keepalive on a dead peer; the relay below ends with them
    sender = subprocess.Popen([*json.loads(argv_json), "send"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=said)
    # time bound: as the sender's
    receiver = subprocess.Popen(["/bin/sh", "-c", receive], stdin=subprocess.PIPE,
                                stdout=said, stderr=said)
    sender.stdin.write(names)
    sender.stdin.close()
    source, sink = sender.stdout.fileno(), receiver.stdin.fileno()
    total, shown, last = 0, 0, time.monotonic()
    gone = False
    while True:
        try:
            if hasattr(os, "splice"):
                moved = os.splice(source, sink, 1 << 20)
            else:
                block = os.read(source, 1 << 20)
                view = memoryview(block)
                while view:
                    view = view[os.write(sink, view):]
                moved = len(block)
        except (BrokenPipeError, ConnectionResetError):
            # The receiving end stopped taking bytes. Having read the archive's end it exits 0
            # before the sender's last padding: the rest is read here to its end. Having failed, it
            # says why, and the sender is stopped.
            gone = receiver.wait() != 0
            if gone:
                sender.kill()
            else:
                while os.read(source, 1 << 20):
                    pass
            break
        if not moved:
            break
        total += moved
        now = time.monotonic()
        if now - last >= 0.5:
            try:
                sys.stdout.write(f"{total}\n")
                sys.stdout.flush()
            # the control machine has gone (the deploy was stopped): stop too
            except (BrokenPipeError, OSError):
                sender.kill()
                receiver.kill()
                sys.exit(1)
            shown, last = total, now
    try:
        receiver.stdin.close()
    except OSError:
        pass
    sent_status, received_status = sender.wait(), receiver.wait()
    if total != shown:
        sys.stdout.write(f"{total}\n")
        sys.stdout.flush()
    said.seek(0)
    text = said.read()[-4000:].decode("utf-8", "replace").strip()
    if sent_status or received_status or gone:
        sys.stderr.write(text or f"exit {sent_status}/{received_status}")
        sys.exit(1)


# The source host ----------------------------------------------------------------------------------


def keys_file_ok(path):
    """Why root's authorized_keys cannot take our entry (None: it can)."""
    try:
        shown = subprocess.run(["sshd", "-T"], capture_output=True, text=True, timeout=30,
                               env={**os.environ, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        files = [line.split()[1:] for line in shown.stdout.splitlines()
                 if line.lower().startswith("authorizedkeysfile ")]
    except (OSError, subprocess.SubprocessError):
        files = []
    home = os.path.dirname(os.path.dirname(path))
    if files and not any(os.path.join(home, f.replace("%h/", "").replace("~/", "")) == path
                         for f in files[0]):
        return f"sshd reads keys from {' '.join(files[0])}, not {path}"
    for each in (os.path.dirname(path), path):
        try:
            st = os.lstat(each)
        except FileNotFoundError:
            continue
        if os.path.islink(each) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return f"{each} is a link, not root's, or writable by others"
    return None


def grant():
    given = json.load(sys.stdin)
    ident, pub, peer = given["id"], given["pub"], given["from"]
    if not ID.fullmatch(ident) or not PUB.fullmatch(pub):
        return answer({"refused": "not a grant of ours"})
    try:
        peer = str(ipaddress.ip_address(peer))
    except ValueError:
        return answer({"refused": f"{peer!r} is not an address"})
    path = authorized_keys()
    why = keys_file_ok(path)
    if why:
        return answer({"refused": why})
    hostkeys = []
    for name in sorted(os.listdir("/etc/ssh")):
        if name.startswith("ssh_host_") and name.endswith("_key.pub"):
            with open(os.path.join("/etc/ssh", name), encoding="utf-8") as handle:
                hostkeys.append(" ".join(handle.read().split()[:2]))
    with locked():
        directory = new_dir(PEER_GRANTS, ident)
        owner = dict(given["owner"])
        owner["expires"] = int(time.time()) + int(owner.pop("ttl_s"))
        write_private(os.path.join(directory, "owner.json"), json.dumps(owner).encode())
        body = json.dumps(
            {"root": os.path.realpath(given["root"]), "names": given["names"]}).encode()
        write_private(os.path.join(directory, "grant.json"), body)
        write_private(os.path.join(directory, "send.py"), given["sender"].encode())
        # sshd reads it in this host's zone
        expiry = time.strftime("%Y%m%d%H%M%S", time.localtime(owner["expires"]))
        command = f"{sys.executable} -I {directory}/send.py {hashlib.sha256(body).hexdigest()}"
        line = (f'restrict,from="{peer}",expiry-time="{expiry}",command="{command}" {pub} '
                f'{MARK}:{ident}')
        if not ENTRY.fullmatch(line):
            shutil.rmtree(directory, ignore_errors=True)
            return answer({"refused": "the entry would not be one of ours"})
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        text = read_keys(path)
        rewrite_keys(path, text + (b"\n" if text and not text.endswith(b"\n") else b"")
                           + line.encode() + b"\n")
        answer({"hostkeys": hostkeys, "user": pwd.getpwuid(os.geteuid()).pw_name,
                "ours": ours(PEER_GRANTS, read_keys(path), but=ident)})


def remove(idents):
    idents = {i for i in idents if ID.fullmatch(i)}
    path = authorized_keys()
    if os.path.isdir(PEER_GRANTS) or entries(read_keys(path)):
        with locked():
            text = read_keys(path)
            lines = text.split(b"\n")
            kept = [line for line in lines
                    if not ((found := ENTRY.fullmatch(line.decode("utf-8", "replace")))
                            and found.group(1) in idents)]
            if len(kept) != len(lines):
                rewrite_keys(path, b"\n".join(kept))
    for parent in (PEER_GRANTS, PEER_KEYS):
        for ident in idents:
            shutil.rmtree(os.path.join(parent, ident), ignore_errors=True)
    answer({"removed": sorted(idents)})


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "keys":
        keys(*args)
    elif mode == "trust":
        trust(*args)
    elif mode == "fetch":
        fetch(*args)
    elif mode == "grant":
        grant()
    elif mode == "remove":
        remove(args)
    elif mode == "left":
        answer({"grants": ours(PEER_GRANTS, read_keys(authorized_keys())), "keys": ours(PEER_KEYS)})
    else:
        sys.exit(f"unknown mode {mode}")


main()
