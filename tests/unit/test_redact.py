"""Redaction (operations/run/redact.py): a registered secret value, in each form it may be printed in, and
secret-named values in the engine's text, never reach what the run prints."""

from __future__ import annotations

import ast
import base64
import io
import json
import logging
import shlex
import subprocess
import sys
import urllib.parse
from pathlib import Path

import click
import pytest

from configuration import redaction
from operations import remote
from operations.run import redact

# Test values only. KEY holds the characters that each encoding changes: / + = ' " \ & % ?
KEY = "unit-redact/k+e=y'q\"b\\s&p%x?z-0123456789"
PLAIN = "unit-redact-plain-key-5f0e2a9c71"
INSTALL_ON_OUTPUT = redact._install_on_output  # the fixture below stubs it for every other test


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    """A registry of this test's own, and no stream installed (pytest owns the streams)."""
    monkeypatch.setattr(redaction, "_REGISTERED", {})
    monkeypatch.setattr(redact, "_install_on_output", lambda: None)
    redact.register("first", KEY)
    redact.register("second", PLAIN)


def b64(raw: bytes, urlsafe: bool = False) -> str:
    return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(raw).decode()


# encoding -> (the value as it is printed, alone; that inside a line of output)
ENCODINGS = {
    "as-is": (lambda v: v, lambda e: f"key is {e} here"),
    "repr": (lambda v: repr(v), lambda e: f"server_args=ServerArgs(model_path='/m', api_key={e}, port=30000)"),
    "bytes repr": (lambda v: repr(("Bearer " + v).encode()), lambda e: f"Invalid header value {e}"),
    "json": (lambda v: json.dumps(v), lambda e: '{"api-key": ' + e + "}"),
    "json with escaped slashes": (lambda v: json.dumps(v).replace("/", "\\/"), lambda e: '{"api-key": ' + e + "}"),
    "url-encoded": (lambda v: urllib.parse.quote(v, safe=""), lambda e: f"GET /x?key={e}&b=1"),
    "url-encoded, slashes kept": (lambda v: urllib.parse.quote(v), lambda e: f"GET /x?key={e}&b=1"),
    "form-encoded": (lambda v: urllib.parse.quote_plus(v), lambda e: f"key={e}"),
    "shell-quoted": (lambda v: shlex.quote(v), lambda e: f"echo {e}"),
    "base64 alone": (lambda v: b64(v.encode()), lambda e: e),
    "base64 at offset 2 (Basic a:KEY)": (lambda v: b64(b"a:" + v.encode()), lambda e: f"Authorization: Basic {e}"),
    "base64 at offset 1 (Basic abc:KEY)": (lambda v: b64(b"abc:" + v.encode()), lambda e: f"Authorization: Basic {e}"),
    "base64 at offset 0 (Basic ab:KEY)": (lambda v: b64(b"ab:" + v.encode()), lambda e: f"Authorization: Basic {e}"),
    "urlsafe base64": (lambda v: b64(b"x" + v.encode(), urlsafe=True), lambda e: e),
    "split across lines": (lambda v: f"{v[:9]}\n    {v[9:20]}\r\n{v[20:]}", lambda e: f"    {e} end"),
    "inside a longer word": (lambda v: v, lambda e: f"xx{e}yy"),
}


@pytest.mark.parametrize("value", [KEY, PLAIN], ids=["special characters", "plain"])
@pytest.mark.parametrize("encoding", ENCODINGS, ids=list(ENCODINGS))
def test_each_form_of_a_registered_value_is_redacted(encoding, value):
    encode, in_line = ENCODINGS[encoding]
    encoded = encode(value)
    out = redact.redact(in_line(encoded))
    assert "<secret " in out, out
    # No 8 characters in a row of the printed value are left (the first and last 3 of a base64
    # string also encode what surrounds the value: they may stay).
    printed, left = windows(encoded), windows(out)
    surroundings = windows(in_line(encode("Q" * len(value))))  # what the line holds whatever the value
    inner = printed - surroundings
    if "base64" in encoding:
        inner = windows(flat(encoded)[3:-3]) - surroundings
    assert inner and not inner & left, (encoding, out)


def flat(text: str) -> str:
    return text.replace("\r", "").replace("\n", "").replace(" ", "")


def windows(text: str, width: int = 8) -> set[str]:
    text = flat(text)
    return {text[i:i + width] for i in range(len(text) - width + 1)}


def test_text_without_secrets_is_unchanged():
    text = "gpu-a/dflash  http://127.0.0.1:30001  ready  3.1 s after (re)start; api_key_secret: 'ddtree-key'"
    assert redact.redact(text) == text


def test_redaction_names_the_secret():
    assert redact.redact(f"k={PLAIN}") == "k=<secret second>"


def test_short_values_are_not_registered():
    """A value shorter than MIN_LENGTH would be found in ordinary words; no accepted key is that short."""
    redact.register("short", "abc")
    assert redact.redact("abc abcdef") == "abc abcdef"


@pytest.mark.parametrize(("text", "expected"), [
    ("server_args=ServerArgs(model_path='/m', api_key='sk-unknown-1234', admin_api_key=None, max_total_tokens=8)",
     "server_args=ServerArgs(model_path='/m', api_key='<redacted>', admin_api_key=None, max_total_tokens=8)"),
    ("{'hf_token': 'hf_abcdefghij', 'port': 30000}", "{'hf_token': '<redacted>', 'port': 30000}"),
    ('{"admin-api-key": "abcdefghijkl", "speculative_num_draft_tokens": 16}',
     '{"admin-api-key": "<redacted>", "speculative_num_draft_tokens": 16}'),
    ("HF_TOKEN=hf_abcdefghij OTHER=1", "HF_TOKEN=<redacted> OTHER=1"),
    ("ssl_keyfile_password: hunter2hunter2", "ssl_keyfile_password: <redacted>"),
    ("client_secret=abc123abc123,", "client_secret=<redacted>,"),
    ("Authorization: Bearer sk-abcdef123456", "Authorization: Bearer <redacted>"),
    ("fetching https://user:pa55w0rd@hub.example/x", "fetching https://user:<redacted>@hub.example/x"),
    ("api_key=None admin_api_key=null", "api_key=None admin_api_key=null"),
    # Keys are printable ASCII: a quote of the other kind, or an escaped one of the same, is part of the value.
    ("ServerArgs(api_key='ab\"cd-efgh', x=1)", "ServerArgs(api_key='<redacted>', x=1)"),
    ("api_key='it\\'s-a-key-123' port=1", "api_key='<redacted>' port=1"),
    ('{"token": "a\\"b-c"}', '{"token": "<redacted>"}'),
    ("max_tokens=8 tokenizer_path='/m' max_prefill_tokens: 16384", "max_tokens=8 tokenizer_path='/m' max_prefill_tokens: 16384"),
])
def test_engine_text_loses_every_secret_named_value(text, expected):
    assert redact.engine_text(text) == expected


def test_engine_text_also_redacts_registered_values_by_name():
    assert redact.engine_text(f"key {PLAIN} seen") == "key <secret second> seen"


def test_the_host_and_the_control_machine_mask_the_same_names():
    """wait_ready.py runs on hosts (stdlib, one file): it carries its own copy of the rule, kept equal here."""
    tree = ast.parse(remote.script_path("wait_ready").read_text())
    host_rule = next(
        node.value for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SECRET_ASSIGNMENT" for t in node.targets)
    )
    pattern, flags = host_rule.args[0], host_rule.args[1]
    assert ast.literal_eval(pattern) == redact.SECRET_ASSIGNMENT.pattern
    assert ast.unparse(flags) == "re.IGNORECASE" and redact.SECRET_ASSIGNMENT.flags & 2


def test_the_redacting_stream_is_what_click_writes_to():
    """click looks the stream up at each call and writes str to it (bytes would go to `.buffer`, which it lacks)."""
    sink = io.StringIO()
    stream = redact.RedactingStream(sink)
    click.echo(f"line with {KEY!r}", file=stream)
    click.echo(f"and {PLAIN}", file=stream, err=True)
    assert KEY not in sink.getvalue() and PLAIN not in sink.getvalue()
    assert sink.getvalue() == "line with '<secret first>'\nand <secret second>\n"
    with pytest.raises(TypeError):
        stream.write(b"")  # what click probes to tell a binary stream from a text one
    assert not hasattr(stream, "buffer")


def test_the_stream_redacts_before_it_makes_controls_visible():
    """A value broken across lines by `\\r\\n` is found while the line break is raw; then the `\\r` left is shown as
    `\\r` (report/terminal_text.py), not obeyed."""
    sink = io.StringIO()
    redact.RedactingStream(sink).write(f"key {PLAIN[:9]}\r\n    {PLAIN[9:]} end\r\n")
    assert sink.getvalue() == "key <secret second> end\\r\n"


def test_installed_under_the_cli_it_redacts_stdout_stderr_and_log_handlers(monkeypatch):
    """Under pyinfra's CLI (`pyinfra.is_cli`), the first registration wraps the streams and the handlers holding them."""
    import pyinfra

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    logger = logging.getLogger("test_redact.installed")
    logger.addHandler(handler)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(pyinfra, "is_cli", True, raising=False)
    monkeypatch.setattr(redact, "_install_on_output", INSTALL_ON_OUTPUT)
    try:
        redact.register("late-key", "unit-redact-late-registered-77")
        assert isinstance(sys.stdout, redact.RedactingStream) and isinstance(sys.stderr, redact.RedactingStream)
        print("stdout unit-redact-late-registered-77")
        click.echo(f"stderr {KEY}", err=True)
        logger.error("handler %s", PLAIN)
        assert out.getvalue() == "stdout <secret late-key>\n"
        assert err.getvalue() == "stderr <secret first>\nhandler <secret second>\n"
        redact.register("later-key", "unit-redact-later-registered-88")
        assert sys.stdout.stream is out  # wrapped once
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("registry", ["redact", "redaction"])
def test_a_pyinfra_cli_process_prints_no_registered_value(tmp_path, registry):
    """End to end in a process of its own: the CLI's click output, its log handler and a traceback; the value
    registered here, or where secrets are loaded (configuration/redaction.py, which this module listens to)."""
    script = f"""
import click, pyinfra, sys
from pyinfra import logger
from pyinfra_cli.log import setup_logging
pyinfra.is_cli = True
setup_logging(20)
from configuration import redaction
from operations import remote
from operations.run import redact
{registry}.register("cli-key", {PLAIN!r})
click.echo("echo {PLAIN}")
logger.info("log {PLAIN}")
print("print {PLAIN}", file=sys.stderr)
raise RuntimeError("failed with {PLAIN}")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    out = proc.stdout + proc.stderr
    assert "RuntimeError: failed with <secret cli-key>" in out, out
    assert PLAIN not in out
    assert out.count("<secret cli-key>") == 4
