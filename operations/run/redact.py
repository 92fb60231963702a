"""Redaction: no secret value the run knows reaches anything the run prints; and no host's text acts
on the terminal.

Every secret value is registered once, where secrets are loaded (configuration/secrets.py), in the
registry of configuration/redaction.py, which this module reads. A pyinfra CLI run's output streams
(`sys.stdout`, `sys.stderr`, and the logging handlers that write to them) are wrapped as this module
loads, secrets or not (an entry point's imports, before its first line runs; what pyinfra prints
while it connects, before it loads the entry point, is not wrapped yet). They replace each value
with `<secret NAME>`, then write every control character and escape sequence in what is printed as a
visible escape (report/terminal_text.py: the one gate for text from hosts, which pyinfra's own
colours, spinner and prompt pass). pyinfra prints everything through `click.echo`, which looks
`sys.stdout`/`sys.stderr` up at each call: our `host.log` lines, journal tails and failure reasons,
exceptions and their tracebacks, the commands and output `-vvv` shows, the end-of-run summary all
pass here, whoever wrote them.

A value is replaced in every form it is likely printed in (`forms()`): as it is, escaped the way
Python's repr, JSON and shell quoting escape it, URL-encoded, inside base64 (an `Authorization:
Basic` header), and broken across lines. Within one write only: a value split between two writes is
not seen (click and logging write a message and its newline at once).

Text that comes from the engine (the journal, a remote command's stderr) may also hold credentials
the run was never told about (an `hf_token` in sglang's `server_args=ServerArgs(...)` line):
`engine_text()` also masks the value of every secret-named `key=value`, `'key': 'value'`,
`Bearer TOKEN` and `scheme://user:password@host` in it. That rule is not applied to everything
printed: the deploy's own messages name secrets (`api_key_secret: 'ddtree-key'`), which are not
secret. `operations/service/on_host/wait_ready.py` applies the same rule on the host (a test keeps
the two patterns equal).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import sys
import urllib.parse

from configuration import redaction
from configuration.redaction import MIN_LENGTH
from report import terminal_text

# A line break in printed text, with the indentation around it (journal tails are indented by 4).
_LINE_BREAK = r"(?:[ \t]*\r?\n[ \t]*)?"

# value -> the compiled pattern of every form of it (the values and their names:
# configuration/redaction.py)
_PATTERNS: dict[str, re.Pattern] = {}

# A secret-named key (`api_key`, `admin-api-key`, `hf_token`, `ssl_keyfile_password`,
# `client_secret`, `"apiKey"`), optionally quoted, then `=` or `:` and its value, quoted or bare.
# Plurals (`max_tokens`) are counts, not secrets. Keep equal to wait_ready.py's SECRET_ASSIGNMENT
# (tests/unit/test_redact.py).
SECRET_ASSIGNMENT = re.compile(
    r"""(?P<name>\b[\w.-]*?(?:api[_-]?key|access[_-]?key|private[_-]?key|secret|token"""
    r"""|passw(?:or)?d|credentials?)['"]?\s*[=:]\s*)"""
    r"""(?:(?P<quote>['"])(?P<quoted>(?:\\.|(?!(?P=quote))[^\\\n])*)(?P=quote)"""
    r"""|(?P<bare>[^\s'",)}\]]+))""",
    re.IGNORECASE,
)
# `Authorization: Bearer TOKEN`, and the password of `scheme://user:password@host`.
BEARER = re.compile(r"(?P<name>\bBearer\s+)(?P<bare>[^\s'\",)}\]]+)", re.IGNORECASE)
URL_PASSWORD = re.compile(r"(?P<name>\b[a-z][a-z0-9+.-]*://[^\s:/@]+:)(?P<bare>[^\s/@]+)(?=@)",
                          re.IGNORECASE)
NOT_A_VALUE = {"", "none", "null", "true", "false", "<redacted>"}
REDACTED = "<redacted>"


def register(name: str, value: str) -> None:
    """Redact `value` from everything printed from now on, as `<secret NAME>` (the name it was last
    registered under)."""
    redaction.register(name, value)


def known(value: str) -> bool:
    """Is `value` registered already (under whatever name)?"""
    return redaction.known(value)


def _registered(value: str) -> None:
    """Told of each registration (whoever registered it): its pattern ready, the CLI's output
    wrapped (if it is not yet)."""
    _pattern_of(value)
    _install_on_output()


# Registered with the registry when this module loads: every entry point imports it before it loads
# the data (tests/unit/test_layers.py checks that), so no value is registered before the output can
# be wrapped.
redaction.on_register(lambda value: _registered(value))


def forms(value: str) -> set[str]:
    """The ways `value` may appear in printed text."""
    quoted = urllib.parse.quote
    found = {
        value,
        # Python's repr (sglang's server_args line, a bytes header in an exception)
        repr(value)[1:-1],
        json.dumps(value)[1:-1],  # JSON, and the YAML of the key file
        json.dumps(value)[1:-1].replace("/", "\\/"),  # JSON encoders that escape "/"
        # URLs and form bodies
        quoted(value, safe=""), quoted(value), urllib.parse.quote_plus(value),
        value.replace("'", "'\"'\"'"),  # inside shlex.quote's single quotes
    }
    found.update(_base64_cores(value))
    return {form for form in found if len(form) >= MIN_LENGTH}


def _base64_cores(value: str) -> set[str]:
    """The base64 characters that only `value`'s bytes decide, at each of the 3 byte offsets it may
    sit at inside a longer encoded string (`user:KEY` in a Basic header), standard and URL-safe
    alphabets."""
    raw = value.encode()
    cores = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        first, last = -(-4 * offset // 3), 4 * (offset + len(raw)) // 3
        core = encoded[first:last]
        cores.update({core, core.replace("+", "-").replace("/", "_")})
    return cores


def _pattern(value: str) -> re.Pattern:
    """Every form of `value`, longest first, each allowed to be broken across lines between any two
    characters."""
    alternatives = sorted(forms(value), key=len, reverse=True)
    return re.compile("|".join(_LINE_BREAK.join(map(re.escape, form)) for form in alternatives))


def _pattern_of(value: str) -> re.Pattern:
    pattern = _PATTERNS.get(value)
    if pattern is None:
        pattern = _PATTERNS[value] = _pattern(value)
    return pattern


def redact(text: str) -> str:
    """`text` with every registered secret value, in any of its forms, replaced by `<secret
    NAME>`."""
    for value, name in redaction.registered():
        text = _pattern_of(value).sub(f"<secret {name}>", text)
    return text


def engine_text(text: str) -> str:
    """Text the engine or a host wrote: registered values redacted, and every secret-named value
    masked."""
    return mask_assignments(redact(text))


def mask_assignments(text: str) -> str:
    """`text` with the value of each secret-named `key=value`, `Bearer TOKEN` and URL password
    replaced."""
    for pattern in (SECRET_ASSIGNMENT, BEARER, URL_PASSWORD):
        text = pattern.sub(_masked, text)
    return text


def _masked(match: re.Match) -> str:
    groups = match.groupdict()
    value = groups.get("quoted") if groups.get("quote") else groups["bare"]
    if value.lower() in NOT_A_VALUE or value.startswith("<secret "):
        return match.group(0)
    quote = groups.get("quote") or ""
    return f"{match.group('name')}{quote}{REDACTED}{quote}"


class RedactingStream:
    """A text stream that redacts what is written, makes every control in it visible
    (terminal_text.for_terminal), then passes it to `stream`.

    It has no `buffer`: bytes cannot go around it (click writes bytes to a stream's buffer), and
    `write(b"")` raises, so click takes it for the text stream it is and writes to it as it is.
    """

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.stream.write(terminal_text.for_terminal(redact(text), _caller()))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):
        if name == "buffer":
            raise AttributeError("a redacting stream lets no bytes around it")
        return getattr(self.stream, name)


def _caller():
    """The frame that called the stream's write: it tells pyinfra's own spinner and prompt (which
    move the cursor) from everything else. None when Python itself writes with no frame of ours
    below (an uncaught exception's traceback)."""
    try:
        return sys._getframe(2)
    except ValueError:
        return None


def _install_on_output() -> None:
    """Wrap the CLI's stdout and stderr, once. Only under the pyinfra CLI: a program using the
    API (the tests) keeps its own streams."""
    import pyinfra

    if not getattr(pyinfra, "is_cli", False):
        return
    for stream_name in ("stdout", "stderr"):
        stream = getattr(sys, stream_name)
        if not isinstance(stream, RedactingStream):
            wrapped = RedactingStream(stream)
            setattr(sys, stream_name, wrapped)
            _point_log_handlers(stream, wrapped)


def _point_log_handlers(stream, wrapped: RedactingStream) -> None:
    """Logging handlers made before the streams were wrapped (logging.basicConfig's, under pyinfra's
    --debug-all) hold the stream itself: give them the wrapper."""
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for handler in (h for lg in loggers for h in lg.handlers):
        if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
            handler.setStream(wrapped)


# Under the CLI, wrapped as this module loads, secrets or not: host text is escaped from the first
# line a deploy file prints (tests/unit/test_host_text.py checks that every entry point imports this
# module).
_install_on_output()
