"""The readiness gate's script (operations/service/on_host/wait_ready.py) against a real HTTP server on loopback.

systemctl and journalctl are stand-ins on PATH (the unit's state and journal are what the test says);
the script, its HTTP client and the server are real. Covers the README's claims: /ready must answer
200 (/health where the engine has no /ready), the smoke chat completion must answer (`smoke_test: true`), and
`smoke_test: false` sends none.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from operations import remote
from tests.unit.remote_calls import load_remote_module, own_control_group

KEY = "unit-test-wait-ready-key-5d1e"  # a test value


class Server:
    """/health answers `health` (one status per request, the last repeated), /ready `ready` likewise (None: 404, an
    engine older than sglang 0.5.23); chat answers `chat` (status, body)."""

    def __init__(self, health=(200,), chat=(200, {"choices": [{"message": {"content": "OK"}}]}), ready=None):
        self.health, self.chat = list(health), chat
        self.ready = list(ready) if ready is not None else [404]
        self.requests: list[tuple[str, str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status, body):
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                outer.requests.append(("GET", self.path, dict(self.headers)))
                answers = outer.ready if self.path == "/ready" else outer.health
                status = answers.pop(0) if len(answers) > 1 else answers[0]
                self.reply(status, b"")

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append(("POST", self.path, {**dict(self.headers), "body": json.loads(body)}))
                self.reply(*outer.chat)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def tools(tmp_path):
    """systemctl/journalctl stand-ins: the unit's state is read from a file the test writes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "unit-state"
    state.write_text(f"ActiveState=activating\nSubState=start\nResult=success\nControlGroup={own_control_group()}\n")
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\ncat {state}\n")
    (bin_dir / "journalctl").write_text("#!/bin/sh\necho 'last words of the unit'\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir, state


def gate(tools, port: int, smoke: bool, timeout: float = 10, config: Path | None = None) -> dict:
    bin_dir, _ = tools
    proc = subprocess.run(
        [sys.executable, "-", "sglang-x.service", "127.0.0.1", str(port), str(timeout), "1" if smoke else "0", str(config or "-")],
        input=remote.script("wait_ready"), capture_output=True, text=True, timeout=60,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def server():
    servers = []

    def make(**kw):
        servers.append(Server(**kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_ready_then_the_smoke_completion_answers_with_the_key_from_the_config_file(tools, server, tmp_path):
    srv = server(health=(503, 503, 200))
    config = tmp_path / "x.yml"
    config.write_text(f'api-key: "{KEY}"\n')
    result = gate(tools, srv.port, smoke=True, config=config)
    assert result["ok"] is True and result["reply"] == "OK", result
    assert [(m, p) for m, p, _ in srv.requests] == [("GET", "/ready")] + [("GET", "/health")] * 3 + [("POST", "/v1/chat/completions")]
    assert result["ready_by"] == "/health"  # an engine without /ready (404)
    chat = srv.requests[-1][2]
    assert chat["Authorization"] == f"Bearer {KEY}"
    assert chat["body"]["messages"] == [{"role": "user", "content": "Reply with OK."}]


@pytest.mark.parametrize(("status", "body", "why"), [
    (500, {"error": "boom"}, "HTTP Error 500: Internal Server Error"),
    (200, b"not json", "Expecting value: line 1 column 1 (char 0)"),
    (200, {"choices": []}, "list index out of range"),
    (401, {"error": "no key"}, "HTTP Error 401: Unauthorized"),
], ids=["server-error", "not-json", "no-choice", "unauthorized"])
def test_a_failed_smoke_completion_fails_the_gate_with_the_reason_and_the_journal(tools, server, status, body, why):
    srv = server(chat=(status, body))
    result = gate(tools, srv.port, smoke=True)
    assert result["ok"] is False, result
    assert result["reason"] == f"sglang-x.service is healthy but the smoke chat completion failed: {why}"
    assert result["journal"] == "last words of the unit"


def test_smoke_test_false_sends_no_completion(tools, server):
    srv = server(chat=(500, {"error": "would fail"}))
    result = gate(tools, srv.port, smoke=False)
    assert result == {"ok": True, "ready_s": result["ready_s"], "ready_by": "/health", "reply": None}
    assert [m for m, _, _ in srv.requests] == ["GET", "GET"]


def test_health_that_never_turns_200_fails_at_the_timeout_with_the_last_answer(tools, server):
    srv = server(health=(503,))
    result = gate(tools, srv.port, smoke=True, timeout=1)
    assert result["ok"] is False
    assert result["reason"] == f"sglang-x.service did not answer http://127.0.0.1:{srv.port}/health with 200 within 1 s (last: HTTP 503)"
    assert all(m == "GET" for m, _, _ in srv.requests)


@pytest.mark.parametrize("state", [
    "ActiveState=failed\nSubState=failed\nResult=exit-code\n",
    "ActiveState=activating\nSubState=auto-restart\nResult=exit-code\n",
    "ActiveState=inactive\nSubState=dead\nResult=success\n",
])
def test_a_dead_or_restarting_unit_fails_at_once_without_waiting(tools, server, state):
    srv = server(health=(503,))
    tools[1].write_text(state)
    result = gate(tools, srv.port, smoke=True, timeout=30)
    assert result["ok"] is False and result["elapsed_s"] < 5, result
    active, sub, res = (line.split("=")[1] for line in state.split())
    assert result["reason"] == f"sglang-x.service is {active}/{sub} (result: {res}) before it became ready"
    assert srv.requests == []


ADMIN = "unit-test-wait-ready-admin-9c0b"  # a test value


def journal_says(tools, text: str) -> None:
    """The unit's journal, as the journalctl stand-in prints it."""
    bin_dir, _ = tools
    (bin_dir / "journal.txt").write_text(text)
    (bin_dir / "journalctl").write_text(f"#!/bin/sh\ncat {bin_dir / 'journal.txt'}\n")


def test_the_journal_tail_leaves_the_host_without_the_keys_the_engine_logged(tools, server, tmp_path):
    """sglang logs server_args with its keys (sgl-project/sglang#37457): the script masks the key file's
    values, in every form it reads them, and any secret-named value, before printing the tail."""
    srv = server(health=(503,))
    tools[1].write_text("ActiveState=failed\nSubState=failed\nResult=exit-code\n")
    config = tmp_path / "x.yml"
    config.write_text(f'api-key: "{KEY}"\nadmin-api-key: "{ADMIN}"\n')
    journal_says(tools, (
        f"[2026-01-01 00:00:00] server_args=ServerArgs(model_path='/m', api_key='{KEY}', admin_api_key={ADMIN!r}, "
        f"hf_token='hf_unknowntoken123', max_total_tokens=8)\n"
        f'args: {{"api_key": "{KEY}"}}\nInvalid header value {("Bearer " + KEY).encode()!r}\n'
    ))
    proc = subprocess.run(
        [sys.executable, "-", "sglang-x.service", "127.0.0.1", str(srv.port), "10", "1", str(config)],
        input=remote.script("wait_ready"), capture_output=True, text=True, timeout=60,
        env={"PATH": f"{tools[0]}:/usr/bin:/bin"},
    )
    assert KEY not in proc.stdout + proc.stderr and ADMIN not in proc.stdout + proc.stderr
    assert "hf_unknowntoken123" not in proc.stdout
    journal = json.loads(proc.stdout)["journal"]
    assert "server_args=ServerArgs(model_path='/m', api_key='<redacted>', admin_api_key='<redacted>', hf_token='<redacted>', max_total_tokens=8)" in journal
    assert 'args: {"api_key": "<redacted>"}' in journal
    assert "Invalid header value b'Bearer <redacted>'" in journal


def test_a_failure_reason_quoting_the_key_leaves_the_host_masked(tools, server, tmp_path):
    """A key holding a carriage return (refused at validation now, but a key file written before) makes the
    HTTP client quote the whole header in its error: the reason is masked like the journal."""
    srv = server()
    config = tmp_path / "x.yml"
    config.write_text(f"api-key: {json.dumps(KEY + chr(13))}\n")
    result = gate(tools, srv.port, smoke=True, config=config)
    assert result["ok"] is False and "smoke chat completion failed" in result["reason"], result
    assert "<redacted>" in result["reason"] and KEY not in json.dumps(result), result



# /ready where the engine has it (sglang 0.5.23), /health where it has not ----------------------------------------


@pytest.mark.parametrize(("path", "status", "then"), [
    ("/ready", 404, "/health"),   # no such endpoint: an older engine
    ("/ready", 401, "/health"),   # an older engine with a key guards every path it does not know (0.5.13)
    ("/ready", 403, "/health"),
    ("/ready", 503, "/ready"),    # warming up, paused or draining: wait, do not fall back
    ("/ready", 500, "/ready"),
    ("/health", 404, "/health"),  # once on /health, it stays there
])
def test_the_fallback_rule(path, status, then):
    assert load_remote_module("wait_ready").next_probe(path, status) == then


def test_ready_is_polled_where_the_engine_has_it_and_proves_readiness_without_the_key(tools, server, tmp_path):
    srv = server(ready=(503, 503, 200), health=(500,))
    config = tmp_path / "x.yml"
    config.write_text(f'api-key: "{KEY}"\n')
    result = gate(tools, srv.port, smoke=True, config=config)
    assert result["ok"] is True and result["ready_by"] == "/ready", result
    assert [(m, p) for m, p, _ in srv.requests] == [("GET", "/ready")] * 3 + [("POST", "/v1/chat/completions")]
    assert all("Authorization" not in headers for m, _, headers in srv.requests if m == "GET")
    assert srv.requests[-1][2]["Authorization"] == f"Bearer {KEY}"


def test_a_ready_that_answers_503_is_waited_out_not_replaced_by_health(tools, server):
    """A server that is up (/health 200) but not ready (paused, draining) is not ready: the gate waits for /ready."""
    srv = server(ready=(503,), health=(200,))
    result = gate(tools, srv.port, smoke=False, timeout=1)
    assert result["ok"] is False
    assert result["reason"] == f"sglang-x.service did not answer http://127.0.0.1:{srv.port}/ready with 200 within 1 s (last: HTTP 503)"
    assert {p for _, p, _ in srv.requests} == {"/ready"}


def test_an_older_keyed_engine_falls_back_to_health(tools, server, tmp_path):
    srv = server(ready=(401,), health=(503, 200))
    config = tmp_path / "x.yml"
    config.write_text(f'api-key: "{KEY}"\n')
    result = gate(tools, srv.port, smoke=False, config=config)
    assert result["ok"] is True and result["ready_by"] == "/health", result
    assert [p for _, p, _ in srv.requests] == ["/ready", "/health", "/health"]
    assert all("Authorization" not in headers for _, _, headers in srv.requests)
