"""Peer identity (docs/threat-model.md, "A service is known by its unit's cgroup"): an answer on a service's port
counts only from a socket a process of the service's unit holds (operations/remote/_common.py: peer_untrusted for a
connection, port_untrusted for every listener on the port).

The engine opens its port only after minutes of loading; a local user (uid 65534 here) who binds it first is played
by a real HTTP server run as that user, answering 200 to everything and printing each request it gets. The
scripts under test are the ones the hosts run (the readiness gate, the service-state read behind the status view
and the migration's last check), with systemctl as a stand-in that names the unit's cgroup.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from operations import remote
from tests.unit.remote_calls import load_remote_module, own_control_group
from tests.unit.test_wait_ready import KEY, gate, server, tools  # noqa: F401 - fixtures

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="running the impostor as another user needs root")
common = load_remote_module("stage_model", "peer_identity_under_test")  # _common.py inlined; its main part not run
NOT_HERE = "/system.slice/sglang-x.service"  # a unit cgroup no process of this machine is in

IMPOSTOR = """
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self):
        print(self.command, self.path, self.headers.get("Authorization"), flush=True)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = answer

httpd = HTTPServer(("127.0.0.1", 0), Handler)
print(httpd.server_address[1], flush=True)
httpd.serve_forever()
"""


@pytest.fixture
def impostor():
    """(port, process) of an HTTP server run by another local user; what it heard is on its stdout once killed."""
    proc = subprocess.Popen(["/usr/bin/python3", "-c", IMPOSTOR], user=65534, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        yield int(proc.stdout.readline()), proc
    finally:
        proc.kill()
        proc.wait()


def heard(proc) -> str:
    proc.kill()
    return proc.stdout.read()


@as_root
def test_the_gate_sends_nothing_to_whoever_else_holds_the_port_and_names_it(tools, impostor, tmp_path):  # noqa: F811
    """It answers /health 200: the gate fails at once naming the holder and sends nothing, least of all the key.
    Seen failing without peer_untrusted: the impostor received the smoke completion, key and all."""
    port, proc = impostor
    tools[1].write_text(f"ActiveState=activating\nSubState=start\nResult=success\nControlGroup={NOT_HERE}\n")
    config = tmp_path / "x.yml"
    config.write_text(f'api-key: "{KEY}"\n')
    result = gate(tools, port, smoke=True, timeout=20, config=config)
    assert result["ok"] is False and result["elapsed_s"] < 10, result
    assert f"port {port} is held by uid 65534 (nobody), pid {proc.pid}" in result["reason"], result
    assert result["reason"].endswith(
        "not by sglang-x.service (another process answers on its port: stop it, or move the service to a free port)")
    assert heard(proc) == ""


def service_state(tools, port: int) -> dict:  # noqa: F811 - the fixture's value
    """The status view's and the migration's read of a service (operations/service/on_host/service_state.py), run here."""
    proc = subprocess.run(
        [sys.executable, "-", "sglang-x.service", "127.0.0.1", str(port)],
        input=remote.script("service_state"), capture_output=True, text=True, timeout=60,
        env={"PATH": f"{tools[0]}:/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@as_root
def test_the_status_read_takes_no_answer_from_another_holder_of_the_port(tools, impostor):  # noqa: F811
    """/health 200 from the impostor is no health: the read (the status view's row, the migration's last check
    before removing the old host's copy) says who holds the port. Seen failing without it: health 200."""
    port, proc = impostor
    tools[1].write_text(f"ActiveState=active\nSubState=running\nMainPID=1\nControlGroup={NOT_HERE}\n")
    found = service_state(tools, port)
    assert found["health"] is None, found
    assert found["stranger"].startswith(f"port {port} is held by uid 65534 (nobody), pid {proc.pid}"), found
    assert found["stranger"].endswith("not by sglang-x.service") and found["health_error"] == found["stranger"]
    assert heard(proc) == ""


def test_the_status_read_asks_the_units_own_process(tools, server):  # noqa: F811
    """The other side of the rule: the server runs in the unit's cgroup (here: this test's own), /health counts."""
    srv = server(health=(200,))
    tools[1].write_text(f"ActiveState=active\nSubState=running\nMainPID=1\nControlGroup={own_control_group()}\n")
    found = service_state(tools, srv.port)
    assert (found["health"], found["stranger"]) == (200, None), found


@as_root
def test_every_listener_on_the_port_must_be_the_units(impostor, server):  # noqa: F811
    """For a client that makes its own connections (the benchmark client): the listeners are judged."""
    port, proc = impostor
    assert common.port_untrusted(port, "sglang-x.service", NOT_HERE).startswith(f"port {port} is held by uid 65534 (nobody)")
    srv = server()
    assert common.port_untrusted(srv.port, "sglang-x.service", own_control_group()) is None
    assert common.port_untrusted(srv.port, "sglang-x.service", NOT_HERE).endswith("not by sglang-x.service")


def test_a_port_nobody_listens_on_is_said_so():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening
        assert common.port_untrusted(port, "sglang-x.service", own_control_group()) == f"nothing listens on port {port}"


def test_the_unit_cgroup_is_found_on_this_hosts_layout():
    """v2, the hybrid layout's unified tree, or v1's name=systemd tree: this process is in its own cgroup."""
    assert os.getpid() in common._cgroup_pids(own_control_group())
    assert common._cgroup_pids(NOT_HERE) == set()
    assert Path("/proc/self/cgroup").exists()


def port_holder(tools, port: int) -> subprocess.CompletedProcess:  # noqa: F811 - the fixture's value
    """measure.py's check of root's, before and after the benchmark client (operations/service/on_host/port_holder.py)."""
    return subprocess.run(["sh", "-c", remote.command("port_holder", "sglang-x.service", str(port))], capture_output=True,
                          text=True, timeout=60, env={"PATH": f"{tools[0]}:/usr/bin:/bin"})


@as_root
def test_the_benchmark_client_does_not_run_against_another_holder_of_the_port(tools, impostor, server):  # noqa: F811
    """The client makes its own connections (with the key): root checks the port's listeners before it and after it.
    Seen failing without the check: the client ran against the impostor."""
    from views import measure

    port, proc = impostor
    tools[1].write_text(f"Id=sglang-x.service\nControlGroup={NOT_HERE}\n")
    refused = port_holder(tools, port)
    assert refused.returncode == 1, refused
    assert refused.stdout.startswith(f"sglang-x.service cannot be measured: port {port} is held by uid 65534 (nobody)")
    # In root's line as measure.served builds it: the client never starts.
    holder = remote.command("port_holder", "sglang-x.service", str(port))
    command = measure.host_command("/v", {"service": "x", "port": port, "key_file": None}, ["User=nobody"], (holder,), (holder,))
    head, tail = command.split("systemd-run ", 1)
    tail = tail.split("\nPYEOF\n", 1)[1]
    ran = subprocess.run(["sh", "-c", f"{head}(echo CLIENT RAN)\n{tail}"], capture_output=True, text=True,
                         env={"PATH": f"{tools[0]}:/usr/bin:/bin"})
    assert ran.returncode == 96 and "CLIENT RAN" not in ran.stdout, ran
    srv = server()
    tools[1].write_text(f"Id=sglang-x.service\nControlGroup={own_control_group()}\n")
    assert port_holder(tools, srv.port).returncode == 0
    assert heard(proc) == ""
