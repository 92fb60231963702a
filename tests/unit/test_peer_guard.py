"""The key goes only to the unit, for the whole run (operations/transport/on_host/peer_guard.py): in a process that talks to a
service over its own connections (measure.py's benchmark client and probes), every TCP connection is checked on its
own before its first byte leaves, and the first that is not the unit's stops the run.

A check of the port before and after the client is not enough: the engine can die in between and a local user bind
its port. Here that user is played by a real HTTP server run as uid 65534 that prints every request it gets
(test_peer_identity's impostor); the engine by a server in this test's own cgroup. Each case runs in a child
python that executed the guard's text, as the host script and the client do, and sends as urllib, requests,
http.client and asyncio's transports (what aiohttp writes through) do. Seen failing without the guard (the
environment variable unset): the impostor printed the key.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from operations import remote
from tests.unit.remote_calls import own_control_group
from tests.unit.test_peer_identity import NOT_HERE, as_root, heard, impostor  # noqa: F401 - fixtures
from tests.unit.test_wait_ready import server  # noqa: F401 - fixture

KEY = "peer-guard-test-key-5b1e"  # a test value
UNIT = "sglang-x.service"

# The child: the guard's text executed first (argv[1]: its environment value, or "" for none), then one request per
# way named in argv[2:], each printing what became of it.
CHILD = r"""
import asyncio, http.client, json, os, sys, urllib.request
port = int(sys.argv[2])
if sys.argv[1]:
    os.environ["SGLANG_DEPLOY_PEER_GUARD"] = sys.argv[1]
exec(compile(sys.stdin.read(), "peer_guard.py", "exec"), {"__name__": "peer_guard"})
headers = {"Authorization": "Bearer " + sys.argv[3]}

def with_urllib():
    req = urllib.request.Request("http://127.0.0.1:%d/generate" % port, data=b"{}", headers=headers)
    return urllib.request.urlopen(req, timeout=10).status

def with_requests():
    import requests
    return requests.post("http://127.0.0.1:%d/generate" % port, data=b"{}", headers=headers, timeout=10).status_code

def with_http_client():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/generate", body=b"{}", headers=headers)
    return conn.getresponse().status

def with_asyncio():
    async def talk():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nContent-Length: 2\r\n"
                     b"Connection: close\r\n\r\n{}" % headers["Authorization"].encode())
        await writer.drain()
        status = (await reader.readline()).split()[1]
        writer.close()
        return int(status)
    return asyncio.run(talk())

for way in sys.argv[4:]:
    try:
        print(json.dumps([way, globals()["with_" + way]()]), flush=True)
    except Exception as exc:
        print(json.dumps([way, "%s: %s" % (type(exc).__name__, exc)]), flush=True)
"""
WAYS = ["urllib", "requests", "http_client", "asyncio"]


def child(port: int, control_group: str | None, ways: list[str], exit_code: int | None = None):
    config = "" if control_group is None else json.dumps(
        {"unit": UNIT, "control_group": control_group, "exit_code": exit_code})
    proc = subprocess.run([sys.executable, "-c", CHILD, config, str(port), KEY, *ways],
                          input=remote.script("peer_guard"), capture_output=True, text=True, timeout=60)
    return proc, dict(json.loads(line) for line in proc.stdout.splitlines())


def test_every_way_of_sending_reaches_the_units_own_server(server):  # noqa: F811
    srv = server()
    proc, outcome = child(srv.port, own_control_group(), WAYS)
    assert proc.returncode == 0, proc.stderr
    assert outcome == {way: 200 for way in WAYS}, outcome


@as_root
@pytest.mark.parametrize("way", WAYS)
def test_a_connection_to_another_holder_of_the_port_is_refused_before_its_first_byte(impostor, way):  # noqa: F811
    """Each way on its own: the connection is made, the impostor accepts it, and no byte is sent; the refusal names
    the holder. Seen failing without the guard: the impostor printed `POST /generate Bearer <key>`."""
    port, proc = impostor
    ran, outcome = child(port, NOT_HERE, [way])
    assert ran.returncode == 0, ran.stderr
    said = outcome[way]
    if way == "asyncio":
        # A transport turns an error of its send into a lost connection, the reason dropped (the benchmark client
        # therefore runs with exit_code: test_the_client_stops_at_once_saying_why).
        assert said == "ConnectionResetError: Connection lost", outcome
    else:
        # urllib and requests wrap the ConnectionRefusedError in their own errors; its text is kept.
        assert "sglang-deploy: not sent: " in said, outcome
        assert f"port {port} is held by uid 65534 (nobody), pid {proc.pid}" in said and f"not by {UNIT}" in said
    assert heard(proc) == ""


def test_the_first_refusal_stops_every_later_connection(server):  # noqa: F811
    """Once one connection was not the unit's, the run sends nothing more, not even to the unit's own server: a port
    that changed hands once is not trusted again within the run. The first connection here goes to a listener that
    never accepts (its server end is no process's: refused after the check's wait)."""
    srv = server()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        code = CHILD.replace("for way in sys.argv[4:]:",
                             f"for way, port in (('urllib', {silent.getsockname()[1]}), ('urllib', {srv.port})):")
        ran = subprocess.run(
            [sys.executable, "-c", code, json.dumps({"unit": UNIT, "control_group": own_control_group()}), "0", KEY],
            input=remote.script("peer_guard"), capture_output=True, text=True, timeout=60)
    first, second = [json.loads(line)[1] for line in ran.stdout.splitlines()]
    assert "no process accepted the connection" in first, first
    assert second == first, second
    assert srv.requests == [], srv.requests


@as_root
def test_the_client_stops_at_once_saying_why(impostor):  # noqa: F811
    """With exit_code (the benchmark client, whose own error handling would go on to its next request): the process
    exits with that status, the reason on stderr after the marker the host script reads."""
    port, proc = impostor
    ran, outcome = child(port, NOT_HERE, ["asyncio", "urllib"], exit_code=75)
    assert ran.returncode == 75 and outcome == {}, (ran.stdout, ran.stderr)
    marked = [line for line in ran.stderr.splitlines() if line.startswith("SGLANG-DEPLOY-PEER-REFUSED ")]
    assert len(marked) == 1 and f"port {port} is held by uid 65534 (nobody)" in marked[0]
    assert heard(proc) == ""


@as_root
def test_without_the_guard_the_impostor_gets_the_key(impostor):  # noqa: F811
    """The class the guard closes, shown: the same child with no guard configured sends the key to the holder."""
    port, proc = impostor
    ran, outcome = child(port, None, ["urllib"])
    assert outcome["urllib"] == 200
    assert heard(proc) == f"POST /generate Bearer {KEY}\n"


def test_other_sockets_are_not_judged():
    """A UNIX socket pair (what the engine's own libraries use locally) sends as before; only TCP is checked."""
    code = ("import json, os, socket, sys\n"
            "os.environ['SGLANG_DEPLOY_PEER_GUARD'] = json.dumps({'unit': 'u', 'control_group': '/nowhere'})\n"
            "exec(compile(sys.stdin.read(), 'peer_guard.py', 'exec'), {'__name__': 'peer_guard'})\n"
            "a, b = socket.socketpair()\na.sendall(b'ok')\nprint(b.recv(2).decode())\n")
    ran = subprocess.run([sys.executable, "-c", code], input=remote.script("peer_guard"), capture_output=True,
                         text=True, timeout=60)
    assert ran.stdout == "ok\n", ran.stderr
