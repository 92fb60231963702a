# Shared by the remote scripts, with _common.py and _trust.py: inlined with them as one text (see
# _common.py's head).
import os as _os

from _trust import _owner  # one inlined text with _trust.py (shared_text)

# Peer identity (docs/threat-model.md, "A service is known by its unit's cgroup"): an answer on a
# service's port counts only when the socket that gives it belongs to a process of that service's
# unit. The port is no identity: the engine opens it only after minutes of loading, and any local
# user may bind it first. socket inode (/proc/net/tcp*) -> the processes holding it (/proc/PID/fd)
# -> their cgroup = the unit's.
_TCP_LISTEN, _TCP_ESTABLISHED = "0A", "01"


def _tcp_sockets(port):
    """[(state, local port, remote port, uid, inode)] of every TCP socket (IPv4 and IPv6) with
    `port` at either end."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, remote = (int(fields[1].rpartition(":")[2], 16),
                             int(fields[2].rpartition(":")[2], 16))
            if port in (local, remote):
                found.append((fields[3], local, remote, int(fields[7]), int(fields[9])))
    return found


def _cgroup_pids(control_group):
    """The PIDs in a unit's cgroup and those below it (`ControlGroup` of `systemctl show`): cgroup
    v2, the hybrid layout's unified tree or v1's name=systemd tree, whichever this host has."""
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"):
        top = mount + control_group
        if not _os.path.isfile(_os.path.join(top, "cgroup.procs")):
            continue
        pids = set()
        for base, _dirs, _names in _os.walk(top):
            try:
                with open(_os.path.join(base, "cgroup.procs")) as handle:
                    pids.update(int(p) for p in handle.read().split())
            except (OSError, ValueError):
                pass
        return pids
    # No cgroup tree mounted where systemd's would be (a container without systemd): each process's
    # own word for it.
    found = set()
    for pid in _all_pids():
        try:
            with open(f"/proc/{pid}/cgroup") as handle:
                paths = [line.split(":", 2)[2] for line in handle.read().splitlines()
                         if line.count(":") >= 2]
        except OSError:
            continue
        if any(p == control_group or p.startswith(control_group.rstrip("/") + "/") for p in paths):
            found.add(pid)
    return found


def _holders(inodes, pids):
    """{inode: pid} for each socket inode one of `pids` holds open."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    found = {}
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = _os.listdir(fd_dir)
        except OSError:
            continue  # gone since, or not a PID
        for fd in fds:
            try:
                inode = wanted.get(_os.readlink(f"{fd_dir}/{fd}"))
            except OSError:
                continue
            if inode is not None:
                found.setdefault(inode, pid)
    return found


def _all_pids():
    return [int(name) for name in _os.listdir("/proc") if name.isdigit()]


def _stranger(port, unit, inode, uid):
    """The refusal naming who holds a socket that is not the unit's: its uid, and its process and
    unit if found."""
    who = _owner(uid)
    pid = _holders([inode], _all_pids()).get(inode)
    if pid is not None:
        try:
            with open(f"/proc/{pid}/cgroup") as handle:
                groups = [line.split(":", 2)[2] for line in handle.read().splitlines()
                          if line.count(":") >= 2]
            who += f", pid {pid} in {groups[-1] if groups else '?'}"
        except OSError:
            who += f", pid {pid}"
    return f"port {port} is held by {who}, not by {unit}"


def port_untrusted(port, unit, control_group):
    """None when every socket listening on `port` is held by a process of `unit` (cgroup
    `control_group`), else why not: "port 30001 is held by uid 65534 (nobody), ..., not by
    sglang-dflash.service", or that nothing listens. For a client that makes its own connections
    (the benchmark client): checked before and after it."""
    listening = [(inode, uid) for state, local, _r, uid, inode in _tcp_sockets(port)
                 if state == _TCP_LISTEN and local == port]
    if not listening:
        return f"nothing listens on port {port}"
    held = (_holders([inode for inode, _ in listening], _cgroup_pids(control_group))
            if control_group else {})
    for inode, uid in listening:
        if inode not in held:
            return _stranger(port, unit, inode, uid)
    return None


def peer_untrusted(sock, unit, control_group, wait_s=5.0):
    """None when the server end of the connected socket `sock` is held by a process of `unit`
    (cgroup `control_group`), else why not. Asked after connecting and before the first byte is
    sent: a request that carries a key, passes a gate or decides a removal goes only to the service
    itself.

    The server's end has an inode once its process accepted the connection; until then (a busy event
    loop) it is looked up again, for at most `wait_s`.
    """
    import time

    server_port, client_port = sock.getpeername()[1], sock.getsockname()[1]
    pids = _cgroup_pids(control_group) if control_group else set()
    deadline = time.monotonic() + wait_s
    while True:
        ends = [(uid, inode) for state, local, remote, uid, inode in _tcp_sockets(server_port)
                if local == server_port and remote == client_port and state != _TCP_LISTEN]
        accepted = [(uid, inode) for uid, inode in ends if inode]
        if accepted:
            uid, inode = accepted[0]
            if inode in _holders([inode], pids):
                return None
            return _stranger(server_port, unit, inode, uid)
        if time.monotonic() > deadline:
            if not ends:
                return f"port {server_port}: the server's end of the connection is not on this host"
            return f"port {server_port}: no process accepted the connection within {wait_s:.0f} s"
        time.sleep(0.02)
        pids = _cgroup_pids(control_group) if control_group else set()
