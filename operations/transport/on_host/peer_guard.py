# The key goes only to the unit (docs/threat-model.md, "The key goes only to the unit, for the
# whole run"). A process that talks to a service over its own connections (measure.py's benchmark
# client and its probe requests, in the service's sandbox) executes this text first: from then on,
# before the first byte of every TCP connection leaves, the server end of that connection must be a
# socket a process of the service's unit holds (peer_untrusted: socket inode -> holding PIDs -> the
# unit's cgroup). A check before and after the run is not enough: if the engine dies in between, a
# local user who binds the port receives every later request, `Authorization` header included.
#
# Checked per connection, not per port, and where every byte passes: socket.socket's send methods
# (urllib, requests, http.client, and asyncio's transports, which aiohttp writes through, all send
# on a socket.socket). A C extension that writes to the descriptor itself would pass by it; the
# benchmark client has none (sglang 0.5.23's bench_serving: aiohttp on asyncio's own loop, and
# requests), and root's check of the port's listeners after the run stays.
#
# The first connection that fails stops everything after it: that connection and every later one
# get ConnectionRefusedError before sending; with `exit_code` set (the client, whose own error
# handling would go on to the next request) the process prints REFUSED_MARK and the reason on
# stderr and exits at once.
#
# Executed, not run: exec(text, {"__name__": "peer_guard"}) with SGLANG_DEPLOY_PEER_GUARD in the
# environment, JSON {"unit": ..., "control_group": ..., "exit_code": null or a number}. Without it,
# executing this installs nothing.
import json
import os
import socket
import sys
import weakref

from _common import peer_untrusted  # noqa: E402 - remote.script puts _common.py here

ENVIRONMENT = "SGLANG_DEPLOY_PEER_GUARD"
REFUSED_MARK = "SGLANG-DEPLOY-PEER-REFUSED "
SEND_METHODS = ("send", "sendall", "sendmsg", "sendto", "sendfile")
refused = []  # the first refusal's reason, once there is one
checked = weakref.WeakSet()  # sockets whose peer was found to be the unit's


def check(sock, unit, control_group, exit_code):
    if sock in checked or sock.family not in (socket.AF_INET, socket.AF_INET6) \
            or sock.type != socket.SOCK_STREAM:
        return
    if not refused:
        try:
            sock.getpeername()
        except OSError:
            return  # not connected: the send fails on its own, no byte leaves
        why = peer_untrusted(sock, unit, control_group or "")
        if why is None:
            checked.add(sock)
            return
        refused.append(why)
    if exit_code is not None:
        sys.stderr.write(REFUSED_MARK + refused[0] + "\n")
        sys.stderr.flush()
        os._exit(exit_code)
    raise ConnectionRefusedError(f"sglang-deploy: not sent: {refused[0]}")


def install(unit, control_group, exit_code=None):
    for name in SEND_METHODS:
        original = getattr(socket.socket, name)

        def guarded(self, *args, _original=original, **kwargs):
            check(self, unit, control_group, exit_code)
            return _original(self, *args, **kwargs)

        guarded.__name__ = name
        setattr(socket.socket, name, guarded)


_config = os.environ.get(ENVIRONMENT)
if _config:
    _config = json.loads(_config)
    install(_config["unit"], _config["control_group"], _config.get("exit_code"))
