"""Text from hosts, as the operator's terminal may show it: every control in it visible, none
acting.

A host's text (unit names, journal tails, failure reasons, model and venv names, nvidia-smi's words)
is not trusted: printed raw, an escape sequence in it rewrites or hides lines, moves the cursor,
sets the clipboard (OSC 52) or the window title, and a bidi override reorders what is read.
`visible()` writes every control and format character but `\\n` and `\\t`, and so every escape
sequence, as a visible escape (`\\x1b`, `\\r`, `\\u009b`, `\\u202e`); only the SGR colour sequences
click.style writes (pyinfra's colours) stay raw. A host's own SGR sequence of that kind passes too:
in a stream of text the two cannot be told apart (conceal, which click never writes, does not pass).

The one place it is applied is the CLI's output streams (operations/run/redact.py's stream,
installed under the pyinfra CLI as that module loads): whoever prints, pyinfra or we, writes through
it. pyinfra's own cursor control (its progress spinner's `\\r` and line clear, its confirm prompt's
cursor-up) is let through only when written by that code of pyinfra's (`for_terminal`). Renderers
that lay host words out in columns (report/summary.py, report/status_view.py) know that what they
lay out is data: they use `one_line()`, which also escapes `\\n`, `\\t` and every SGR sequence, so
widths count what is shown and a newline in a host's word cannot start a row of its own.

Every escape written for a character that JSON leaves raw (DEL and above) is a JSON escape
(`\\uXXXX`, a surrogate pair above U+FFFF), so JSON text written through the stream stays valid and
decodes to the same string; JSON never holds a raw C0 control, whose escapes (`\\x1b`) are Python's.
"""

from __future__ import annotations

import re
import unicodedata

# What may be left as it is without a look at its category: printable ASCII, newline and tab.
_PLAIN = r"\x20-\x7e\n\t"
# The SGR sequences click.style writes, one parameter each: reset,
# bold/dim/italic/underline/blink/reverse/strike and their ends, overline, the 8 + 8 bright colours
# and default of foreground and background, 256 and RGB colours. Not conceal (8), which click never
# writes and which hides text.
_CLICK_SGR = (r"\x1b\[(?:0|[1-579]|2[2-579]|5[35]|[34][0-79]|9[0-7]|10[0-7]"
              r"|[34]8;5;[0-9]{1,3}|[34]8;2;[0-9]{1,3};[0-9]{1,3};[0-9]{1,3})m")
_SHOWN = re.compile(rf"(?P<sgr>{_CLICK_SGR})|[^{_PLAIN}]")
_NOT_PLAIN_ASCII = re.compile(r"[^\x20-\x7e]")
# Controls (C0, DEL, C1), format characters (bidi overrides and isolates, zero-width ones, tags),
# lone surrogates (which no stream can encode), line and paragraph separators. Private-use and
# unassigned code points are glyphs (or a box) to a terminal: they stay.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_SHORT = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}


def escape(ch: str) -> str:
    """One character as a visible escape: `\\r`, `\\n`, `\\t`, `\\xNN` below U+0020, else JSON's
    `\\uXXXX` (also valid Python)."""
    code = ord(ch)
    if ch in _SHORT:
        return _SHORT[ch]
    if code < 0x20:
        return f"\\x{code:02x}"
    if code > 0xFFFF:
        high, low = divmod(code - 0x10000, 0x400)
        return f"\\u{0xD800 + high:04x}\\u{0xDC00 + low:04x}"
    return f"\\u{code:04x}"


def _escaped(match: re.Match) -> str:
    ch = match.group(0)
    return escape(ch) if ch in _SHORT or unicodedata.category(ch) in _ESCAPED_CATEGORIES else ch


def _shown(match: re.Match) -> str:
    return match.group(0) if match.group("sgr") else _escaped(match)


def visible(text: str) -> str:
    """`text` with every control and format character but `\\n` and `\\t` (and so every escape
    sequence but click's SGR colours) written as a visible escape."""
    return _SHOWN.sub(_shown, text)


def one_line(text) -> str:
    """Host text as data, in a cell, a reason or a label that must stay on its line: every control
    and format character escaped, `\\n`, `\\t` and an SGR sequence too (the renderers write no
    colour of their own, so none in it is ours)."""
    return _NOT_PLAIN_ASCII.sub(_escaped, str(text))


# -- pyinfra's own drawing -------------------------------------------------------------------------

# The code of pyinfra that draws on the terminal (pyinfra 3.10; tests/unit/test_host_text.py runs it
# through the stream, so a release that moves it fails there, and its drawing then shows as escapes:
# safe, not pretty).
# writes `    - 50% (1/2) - {hosts}\r`, then `\x1b[K`
_SPINNER = ("pyinfra.progress", "_print_spinner")
# click.echo("\x1b[1A<spaces>\x1b[1A") after "Press enter to execute"
_CONFIRM = ("pyinfra_cli.cli", "_do_confirm")
_CLEAR_LINE = "\x1b[K"
_CURSOR_UP_OVER_BLANKS = re.compile(r"(?:\x1b\[1A| )+")


def _writer(frame) -> tuple[str, str]:
    """(module, function) of the code that wrote: the first frame outside click (click.echo writes
    for its caller)."""
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "click":
        frame = frame.f_back
    if frame is None:
        return "", ""
    return frame.f_globals.get("__name__", ""), frame.f_code.co_name


def for_terminal(text: str, frame) -> str:
    """`visible(text)`, but for pyinfra's own cursor control when `frame` (the caller of the
    stream's write) is the code of pyinfra that draws it: the spinner's closing `\\r` and its line
    clear, the confirm prompt's cursor-up over blanks. Their other text (host names in the spinner)
    is still made visible."""
    writer = _writer(frame)
    if writer == _SPINNER:
        if text == _CLEAR_LINE:
            return text
        if text.endswith("\r"):
            return visible(text[:-1]) + "\r"
    if writer == _CONFIRM and _CURSOR_UP_OVER_BLANKS.fullmatch(text):
        return text
    return visible(text)
