"""One gate for text from hosts (report/terminal_text.py, applied by operations/run/redact.py's stream on the CLI's
stdout and stderr): what a host wrote (a unit name, a journal line, a model name, a failure's reason) reaches the
operator's terminal with every control in it visible, never acting; pyinfra's own colours, spinner and prompt
keep working; JSON stays JSON and the Prometheus textfile one sample a line."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import click
import pytest
from pyinfra import progress

from operations.run import redact
from report import status_view as view
from report import summary, terminal_text
from tests.unit.test_layers import ENTRY_POINTS, import_graph, reachable
from tests.unit.test_status import service_row

ROOT = Path(redact.__file__).resolve().parents[2]

# what a host may write -> how the operator sees it
HOSTILE = {
    "OSC 52 sets the clipboard": ("ddtree\x1b]52;c;cm0gLXJmIH4K\x07.service", "ddtree\\x1b]52;c;cm0gLXJmIH4K\\x07.service"),
    "OSC 0 sets the window title": ("\x1b]0;deploy finished OK\x1b\\tail", "\\x1b]0;deploy finished OK\\x1b\\tail"),
    "CSI erases the line": ("oom-killed\x1b[2K\x1b[1Gready", "oom-killed\\x1b[2K\\x1b[1Gready"),
    "CSI moves the cursor up": ("line\x1b[3Aover", "line\\x1b[3Aover"),
    "carriage return rewrites the line": ("FAILED: import error\rready   ", "FAILED: import error\\rready   "),
    "C1 CSI (U+009B)": ("Qwen3\u009b2J-8B", "Qwen3\\u009b2J-8B"),
    "bidi override (U+202E)": ("venv_\u202etxt.exe", "venv_\\u202etxt.exe"),
    "bidi isolate (U+2066..U+2069)": ("a\u2066b\u2069c", "a\\u2066b\\u2069c"),
    "SGR conceal hides text": ("\x1b[8mhidden\x1b[0m", "\\x1b[8mhidden\x1b[0m"),  # click's reset passes, conceal not
    "backspace and bell": ("ab\x08\x08ok\x07", "ab\\x08\\x08ok\\x07"),
}
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
OUR_COLOURS = re.compile(r"\x1b\[(?:0|1|31|33)m")  # what click.style writes in these tests: reset, bold, red, yellow


def raw_controls(text: str) -> list[str]:
    """The controls left raw in `text`, but newlines, tabs and the colours click.style wrote here."""
    return RAW.findall(OUR_COLOURS.sub("", text))


class Terminal(io.StringIO):
    """What the operator's terminal receives (a tty, so click strips nothing itself)."""

    def isatty(self) -> bool:
        return True


def cli_terminal(monkeypatch) -> Terminal:
    """The CLI's stdout and stderr as the CLI has them: one terminal behind the gate. Set in the
    test itself: pytest puts its own capture back between a fixture's setup and the test."""
    screen = Terminal()
    monkeypatch.setattr(sys, "stdout", redact.RedactingStream(screen))
    monkeypatch.setattr(sys, "stderr", redact.RedactingStream(screen))
    return screen


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_text_from_a_host_is_shown_not_obeyed(case):
    text, shown = HOSTILE[case]
    assert terminal_text.visible(text) == shown
    assert not raw_controls(terminal_text.visible(text))


# pyinfra_cli monkey-patches the standard library for gevent as it is imported (pyinfra_cli/__init__.py): a test
# that needs its code runs it in an interpreter of its own, or every later test in this process would run patched.
CLI_TERMINAL = """
import io, json, os, sys
import click
from operations.run import redact

class Terminal(io.StringIO):
    def isatty(self):
        return True

screen = Terminal()
sys.stdout = redact.RedactingStream(screen)
sys.stderr = redact.RedactingStream(screen)
"""


def in_cli_process(body: str) -> str:
    """What the terminal behind the gate received while `body` ran in a fresh interpreter (pyinfra_cli imported there)."""
    code = CLI_TERMINAL + body + "\nos.write(1, json.dumps(screen.getvalue()).encode())\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_a_host_log_line_through_the_cli_stream_is_escaped_and_our_colours_pass(case):
    """pyinfra's own log path (`host.log`: its LogHandler, its LogFormatter colouring a warning yellow, the host's
    prefix in bold), and a plain print and click.echo, all through the stream the CLI writes to."""
    text, shown = HOSTILE[case]
    out = in_cli_process(f"""
import logging
from pyinfra_cli.log import LogFormatter, LogHandler
text = {text!r}
logger = logging.getLogger("test_host_text.pyinfra")
handler = LogHandler()
handler.setFormatter(LogFormatter())
logger.addHandler(handler)
logger.propagate = False
prefix = click.style("gpu-a", bold=True)
logger.warning(f"[{{prefix}}] ddtree: last journal lines:\\n    {{text}}")
logger.removeHandler(handler)
print(f"unit {{text}}")
click.echo(click.style(f"model {{text}}", fg="red"), err=True)
""")
    yellow, bold, red, reset = "\x1b[33m", "\x1b[1m", "\x1b[31m", "\x1b[0m"
    assert out == (f"{yellow}    [{bold}gpu-a{reset}] ddtree: last journal lines:\n    {shown}{reset}\n"
                   f"unit {shown}\n{red}model {shown}{reset}\n")
    assert not raw_controls(out)


def test_the_cli_wraps_its_streams_as_the_gate_loads_without_any_secret(tmp_path):
    """Under pyinfra's CLI the streams are wrapped when operations/run/redact.py is imported (by every entry point), not
    at the first registered secret: a run with no secret at all still prints no host's control."""
    texts = [text for text, _ in HOSTILE.values()]
    script = f"""
import click, pyinfra, sys
from pyinfra import logger
from pyinfra_cli.log import setup_logging
pyinfra.is_cli = True
setup_logging(20)
from operations.run import redact
texts = {texts!r}
for text in texts:
    logger.info("[gpu-a] " + text)
    click.echo("echo " + text, err=True)
    print("print " + text)
raise RuntimeError(texts[0])
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert not raw_controls(out), [line for line in out.splitlines() if raw_controls(line)]
    for _, shown in HOSTILE.values():
        assert f"print {shown}" in proc.stdout
    assert f"RuntimeError: {HOSTILE['OSC 52 sets the clipboard'][1]}" in proc.stderr


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_imports_the_gate(entry):
    """The gate is installed as operations/run/redact.py loads: an entry point that does not reach it prints host text raw
    (test_layers checks it only for those that load secrets)."""
    assert "operations.run.redact" in reachable(import_graph(), entry)


# -- pyinfra's own drawing -----------------------------------------------------------------------


class OneTurn:
    """A stop event that lets pyinfra's spinner draw once."""

    def __init__(self):
        self.turns = 0

    def is_set(self) -> bool:
        return self.turns > 0

    def wait(self, timeout=None) -> None:
        self.turns += 1


def test_pyinfra_spinner_still_draws_and_a_host_name_in_it_is_escaped(monkeypatch):
    """pyinfra's spinner ends its line with `\\r` and clears it with ESC [ K: both stay raw when pyinfra's spinner
    writes them (a pyinfra that moves its spinner fails here), its text is made visible, and the same bytes from any
    other code are escaped."""
    terminal = cli_terminal(monkeypatch)
    monkeypatch.setattr(progress, "IS_TTY", True)
    monkeypatch.delenv("PYINFRA_PROGRESS", raising=False)
    progress._print_spinner(OneTurn(), ["50% (1/2) - {gpu-\x1b]0;pwned\x07a}"])
    spun = terminal.getvalue()
    assert re.fullmatch(r"    . 50% \(1/2\) - \{gpu-\\x1b\]0;pwned\\x07a\}\r\x1b\[K", spun), repr(spun)
    sys.stderr.write("host says\r")
    sys.stderr.write("\x1b[K")
    assert terminal.getvalue()[len(spun):] == "host says\\r\\x1b[K"


def test_pyinfra_confirm_prompt_still_moves_the_cursor_up():
    """pyinfra's "Press enter to execute..." is blanked with cursor-up sequences after the answer; from another caller
    they are escaped."""
    blank = " " * len("    Press enter to execute...")
    out = in_cli_process(f"""
import builtins
from types import SimpleNamespace
from pyinfra.context import ctx_state
from pyinfra_cli import cli
builtins.input = lambda *a: ""
with ctx_state.use(SimpleNamespace(get_warning_counter=lambda: 0)):
    assert cli._do_confirm("Detected changes displayed above")
screen.write("<AFTER>")
click.echo("\\x1b[1A{blank}\\x1b[1A", err=True, nl=False)
""")
    confirmed, _, after = out.partition("<AFTER>")
    assert confirmed.endswith(f"    Press enter to execute...\x1b[1A{blank}\x1b[1A\n")
    assert after == f"\\x1b[1A{blank}\\x1b[1A"


# -- the renderers: the status view, its JSON and Prometheus text, the end-of-run summary -------------

FORGED_ROW = "\ngpu-a  ddtree   ok      30000  active/running"


def hostile_row() -> dict:
    """A service row whose host-read words carry every kind of control, and a newline that forges a row."""
    row = service_row()
    row["unit"] = {"load": "loaded", "active": "active\x1b[2K", "sub": "running\r", "enabled": "enabled"}
    row["health"] = {"status": None, "latency_ms": None, "error": "refused" + FORGED_ROW}
    row["models"] = [{"name": "Qwen3\u009b2J", "verified": False, "why": "size differs\x1b]52;c;cm0K\x07"}]
    row["gpus"] = row["host_gpus"] = [{**row["gpus"][0], "name": "NVIDIA\u202eH200"}]
    row["healthy"] = False
    row["problems"] = ["/health: refused" + FORGED_ROW, "model Qwen3\u009b2J: size differs\x1b]52;c;cm0K\x07"]
    return row


@pytest.mark.parametrize("detail", [False, True], ids=["table", "detail"])
def test_the_status_view_shows_host_words_on_their_line_and_the_json_whole(detail, monkeypatch):
    """Through the renderer and the CLI's stream: the view (on stderr) has each host word on its own line, visible,
    no more lines than a clean row gives; the JSON (on stdout) parses back to the host's words exactly."""
    terminal = cli_terminal(monkeypatch)
    rows = [hostile_row()]
    clean = view.render([service_row(healthy=False, problems=["a", "b"])], {"detail": detail}, "covers", 1000)["view"]
    code = view.emit(rows, {"detail": detail, "json": "-"}, "covers", 1000, out=sys.stdout)
    assert code == view.EXIT_UNHEALTHY
    out = terminal.getvalue()
    document_start = out.index("{\n")
    shown, document = out[:document_start], out[document_start:]
    assert not raw_controls(out)
    assert len(shown.splitlines()) == len(clean.splitlines())  # no line of the host's
    assert "refused\\ngpu-a  ddtree   ok" in shown and "Qwen3\\u009b2J" in shown
    if detail:
        assert "active\\x1b[2K/running\\r" in shown and "NVIDIA\\u202eH200" in shown and "\\x1b]52;c;cm0K\\x07" in shown
    parsed = json.loads(document)["rows"][0]
    assert {k: parsed[k] for k in rows[0]} == rows[0]


def test_json_through_the_gate_stays_json_with_the_same_strings(monkeypatch):
    """JSON written with its non-ASCII characters raw (as `ensure_ascii=False` writes C1, DEL, bidi, tags) comes out
    with each as a JSON escape: still valid, the same string, nothing raw."""
    terminal = cli_terminal(monkeypatch)
    words = {"unit": "a\u009b2Jb\x7f", "model": "m\u202eexe\u2066", "tag": "x\U000e0041y", "lone": "z\ud800", "esc": "\x1b]52;c;x\x07\r"}
    click.echo(json.dumps(words, ensure_ascii=False))
    out = terminal.getvalue()
    assert not raw_controls(out) and "\U000e0041" not in out
    assert json.loads(out) == words


def label_values(line: str) -> dict[str, str]:
    """The labels of one sample line, read as Prometheus reads them (`\\\\`, `\\"` and `\\n` are its escapes)."""
    labels = re.match(r"[a-z_]+\{(.*)\} \S+\Z", line).group(1)
    found = re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', labels)
    return {k: re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v) for k, v in found}


def test_the_prometheus_textfile_holds_host_words_as_printable_label_values():
    """A GPU's name (nvidia-smi's, from the host) with a newline would start a metric line of the host's; with a quote
    it would end the label; a raw control would be in the file. Each stays in its label, printable."""
    name = 'H200"} 1\nsglang_deploy_service_up{host="gpu-z",service="x",port="1"} 1\r\x1b[2K\u202e'
    row = service_row()
    row["host_gpus"] = [{**row["host_gpus"][0], "name": name}]
    text = view.prometheus([row])
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert not raw_controls(text) and "\u202e" not in text
    assert all(re.fullmatch(r'[a-z_]+(\{([a-z_]+="(?:[^"\\\n]|\\.)*",?)*\})? \S+', s) for s in samples), samples
    assert not any(label_values(s).get("host") == "gpu-z" for s in samples if "{" in s)  # no sample of the forged host
    gpu = [label_values(s) for s in samples if s.startswith("sglang_deploy_gpu_healthy")]
    assert gpu == [{"host": "gpu-a", "gpu": "0", "name": terminal_text.one_line(name)}]
    assert "\\x1b[2K" in gpu[0]["name"] and "\\n" in gpu[0]["name"]


def test_the_summary_keeps_a_hosts_reason_on_its_row(monkeypatch):
    """A failure's reason (the host's words) with a newline would print a row of its own: `gpu-a/ddtree ... ready`."""
    run = SimpleNamespace()
    host = SimpleNamespace(name="gpu-a", state=run)
    run.activated_hosts = [host]
    reason = "import error\n    gpu-a/ddtree  http://127.0.0.1:30000    ready   12 s after (re)start\x1b[2K\rok"
    summary.record(host, "dflash", "http://127.0.0.1:30001", "FAILED", reason)
    summary.record(host, "ddtree", "http://127.0.0.1:30000", "FAILED", "preflight: \u202eexe")
    logged = []
    monkeypatch.setattr(summary.logger, "info", logged.append)
    summary.SummaryPrinter().host_disconnect(run, host)
    lines = logged[0].splitlines()
    assert len(lines) == 3 and lines[0] == "--> Services:"
    assert lines[1].endswith("FAILED  preflight: \\u202eexe")
    assert lines[2].endswith("FAILED  import error\\n    gpu-a/ddtree  http://127.0.0.1:30000    ready   12 s after (re)start"
                             "\\x1b[2K\\rok")
