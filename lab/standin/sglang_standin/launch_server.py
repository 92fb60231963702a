"""``python -m sglang_standin.launch_server``: a stand-in for ``sglang.launch_server``.

No GPU, no model weights: this process only mimics the real server's command
line and its HTTP readiness behaviour, so that a deployment (systemd unit,
readiness poll, smoke request) can be exercised on hosts without GPUs.

Behaviour, in order:

1. Parse argv. If the real ``sglang`` package is importable in this
   interpreter, parse with its own ``prepare_server_args`` (stale or unknown
   flags are rejected exactly as the real server would: exit 2 with the
   parser's message). Otherwise parse with a small argparse parser that knows
   ``--model-path``, ``--host``, ``--port`` and accepts any other flag.
   Then log ``server_args=ServerArgs(...)``, API keys in the clear, as the real
   server does (sgl-project/sglang#37457): the deploy must keep them out of
   what it prints, and the lab must be able to show it does.
2. ``STANDIN_CRASH_AT_START=1``: print an error and exit 1.
3. Check that ``--model-path`` (and ``--speculative-draft-model-path`` when
   given) is a directory holding a ``config.json``; exit 1 otherwise.
4. "Load" for ``STANDIN_LOAD_S`` seconds (default 1.0) with the port closed
   (clients see connection refused), then listen.
5. ``/health`` and ``/health_generate`` answer 503 ``{"status":"warming up"}``
   for ``STANDIN_WARMUP_S`` seconds (default 2.0) after the port opens, then
   200 (forever 503 with ``STANDIN_NEVER_READY=1``). ``/ready`` (sglang 0.5.23's)
   answers the same way, but 503 also while draining; ``STANDIN_NO_READY=1``
   makes it answer 404, as an engine without it does.

SIGTERM drains, as sglang does: the server stops taking new work (a new
request is answered 503, ``/ready`` and ``/health`` answer 503), finishes
the requests in flight (a generation in flight completes), then exits with
status 0; it checks every ``STANDIN_DRAIN_POLL_S`` seconds (default 0.05)
whether any is left. (sglang 0.5.23 still takes new requests while it
drains: a load balancer must take it out of rotation by ``/ready``.)
SIGTERM before the port opens, and SIGINT, stop it at once, status 0.
Stdlib only.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import __version__, bench_endpoints

DIST_NAME = "sglang-standin"
STANDIN_VERSION = __version__ + "-standin"
BANNER = (
    "sglang-standin %s (a stand-in for sglang.launch_server, "
    "no GPU, no model weights loaded)" % __version__
)
STANDIN_PARSER_LABEL = "standin-argparse"
ENV_PREFIXES = ("SGLANG_", "CUDA_VISIBLE_DEVICES", "FLASHINFER_")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000


class ArgsError(Exception):
    """Command line rejected: message printed to stderr, exit status 2."""


class ModelPathError(Exception):
    """Model directory unusable: message printed to stderr, exit status 1."""


class _Terminate(BaseException):
    """Raised from the SIGTERM/SIGINT handler to unwind the main thread."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


SECRET_ARGS = ("api_key", "admin_api_key")


def masked(args: dict) -> dict:
    """The args with API keys replaced, for the endpoints and the stand-in's own args line."""
    return {k: ("<set>" if k in SECRET_ARGS and v else v) for k, v in args.items()}


def server_args_line(args: dict) -> str:
    """What the real server logs at start (`logger.info(f"{server_args=}")`): every arg's repr, keys unmasked."""
    return "server_args=ServerArgs(%s)" % ", ".join("%s=%r" % (k, v) for k, v in args.items())


def log(msg: str) -> None:
    sys.stderr.write("[sglang-standin] %s\n" % msg)
    sys.stderr.flush()


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    if raw.strip() == "":
        return default
    try:
        return max(0.0, float(raw))
    except ValueError:
        log("ignoring %s=%r (not a number); using %s" % (name, raw, default))
        return default


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


# ---------------------------------------------------------------------------
# Argument parsing
# ---------------------------------------------------------------------------


def flag_to_key(flag: str) -> str:
    """``--speculative-algorithm`` -> ``speculative_algorithm`` (sglang's dest names)."""
    return flag.lstrip("-").replace("-", "_")


def _looks_like_value(token: str) -> bool:
    if not token.startswith("-"):
        return True
    # negative numbers ("-1", "-0.5") are values, not flags
    try:
        float(token)
        return True
    except ValueError:
        return False


def _parse_generic(tokens: list[str]) -> dict:
    """Accept any ``--flag value [value...]``, ``--flag=value`` or bare ``--flag``.

    One value is stored as a string, several as a list of strings, none as True.
    """
    out: dict = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("-") or _looks_like_value(tok):
            raise ArgsError("unrecognized arguments: %s" % " ".join(tokens[i:]))
        if "=" in tok and tok.startswith("--"):
            name, value = tok.split("=", 1)
            out[flag_to_key(name)] = value
            i += 1
            continue
        values = []
        j = i + 1
        while j < len(tokens) and _looks_like_value(tokens[j]):
            values.append(tokens[j])
            j += 1
        key = flag_to_key(tok)
        if not values:
            out[key] = True
        elif len(values) == 1:
            out[key] = values[0]
        else:
            out[key] = values
        i = j
    return out


class _StandinArgParser(argparse.ArgumentParser):
    def error(self, message):  # argparse calls exit(2) by default; raise instead
        raise ArgsError(message)


def _standin_parser() -> argparse.ArgumentParser:
    p = _StandinArgParser(
        prog="python -m sglang_standin.launch_server",
        description=BANNER + ". Flags other than those below are accepted and "
        "reported in /server_info without being checked.",
        allow_abbrev=False,
    )
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--host", default=DEFAULT_HOST)
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--served-model-name", dest="served_model_name", default=None)
    p.add_argument(
        "--speculative-draft-model-path",
        "--speculative-draft-model",
        dest="speculative_draft_model_path",
        default=None,
    )
    p.add_argument("--api-key", dest="api_key", default=None)
    return p


def _parse_standin(argv: list[str]) -> dict:
    ns, rest = _standin_parser().parse_known_args(argv)
    extra = _parse_generic(rest)
    args = dict(extra)
    args.update(vars(ns))  # known flags win over generic spellings
    if args.get("served_model_name") is None:
        args["served_model_name"] = args["model_path"]
    return args


def sglang_available() -> bool:
    try:
        return importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):
        return False


def _sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        pass
    try:
        import sglang  # noqa: F401

        return str(getattr(sglang, "__version__", "unknown"))
    except Exception:
        return "unknown"


def _server_args_to_dict(server_args) -> dict:
    if dataclasses.is_dataclass(server_args) and not isinstance(server_args, type):
        return {f.name: getattr(server_args, f.name, None) for f in dataclasses.fields(server_args)}
    # sglang 0.5.23's ServerArgs is a msgspec.Struct: its fields are named in __struct_fields__.
    struct_fields = getattr(type(server_args), "__struct_fields__", None)
    if struct_fields:
        return {name: getattr(server_args, name, None) for name in struct_fields}
    return {k: v for k, v in vars(server_args).items() if not k.startswith("_")}


def _parse_sglang(argv: list[str]) -> dict:
    """Parse with the installed sglang's own parser (exactly the real server's check)."""
    try:
        from sglang.srt.server_args import prepare_server_args
    except Exception as exc:  # sglang present but its import chain is broken
        raise ModelPathError(
            "sglang is installed but sglang.srt.server_args failed to import "
            "(the real server would crash here too): %s: %s" % (type(exc).__name__, exc)
        )
    try:
        server_args = prepare_server_args(list(argv))
    except SystemExit as exc:
        # argparse has already printed usage and its message to stderr.
        code = exc.code if isinstance(exc.code, int) else 2
        if code == 0:  # --help
            raise
        raise ArgsError("sglang's parser rejected the arguments (see message above)")
    except Exception as exc:
        raise ArgsError("%s: %s" % (type(exc).__name__, exc))
    return _server_args_to_dict(server_args)


def parse_args_with_parser(argv: list[str], use_sglang: bool | None = None) -> tuple[dict, str]:
    """Return ``(args, parser_label)``.

    ``use_sglang``: None = use sglang's parser when sglang is importable
    (env ``STANDIN_PARSER=standin`` forces the stand-in parser).
    """
    if use_sglang is None:
        use_sglang = os.environ.get("STANDIN_PARSER", "").strip() != "standin" and sglang_available()
    if use_sglang:
        return _parse_sglang(argv), "sglang %s" % _sglang_version()
    return _parse_standin(argv), STANDIN_PARSER_LABEL


def parse_args(argv: list[str], use_sglang: bool | None = None) -> dict:
    """Parse a ``sglang.launch_server`` command line into a dict of snake_case args.

    Raises ``ArgsError`` when the command line is rejected.
    """
    return parse_args_with_parser(argv, use_sglang)[0]


# ---------------------------------------------------------------------------
# Model directory check
# ---------------------------------------------------------------------------


def check_model_dir(path, what: str = "--model-path") -> dict:
    """Return the parsed ``config.json`` of a model directory or raise ModelPathError."""
    if path is None or str(path).strip() == "":
        raise ModelPathError("%s is empty" % what)
    path = str(path)
    if not os.path.isdir(path):
        raise ModelPathError(
            "%s %s: no such directory (the real server would fail to load the model)" % (what, path)
        )
    cfg = os.path.join(path, "config.json")
    if not os.path.isfile(cfg):
        raise ModelPathError(
            "%s %s: no config.json in this directory (the real server would fail to load the model)"
            % (what, path)
        )
    try:
        with open(cfg, "rb") as fh:
            data = json.loads(fh.read().decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelPathError("%s %s: config.json is unreadable or not JSON: %s" % (what, path, exc))
    if not isinstance(data, dict):
        raise ModelPathError("%s %s: config.json is not a JSON object" % (what, path))
    return data


# ---------------------------------------------------------------------------
# HTTP server
# ---------------------------------------------------------------------------


def _json_default(obj):
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _dumps(obj) -> bytes:
    return json.dumps(obj, default=_json_default, sort_keys=True).encode("utf-8")


def collect_env(environ=None) -> dict:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES)}


def _content_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return " ".join(parts)
    return str(content)


def chat_completion(body: dict, model_name: str) -> dict:
    """Deterministic OpenAI chat.completion for a validated request body."""
    messages = body["messages"]
    last = None
    for m in reversed(messages):
        if m.get("role") == "user":
            last = m
            break
    if last is None:
        last = messages[-1]
    prompt_text = _content_text(last.get("content"))
    reply = "standin reply: " + prompt_text[::-1]
    finish = "stop"
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if isinstance(max_tokens, int) and max_tokens >= 0:
        words = reply.split()
        if len(words) > max_tokens:
            reply = " ".join(words[:max_tokens])
            finish = "length"
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), default=_json_default)
    digest = hashlib.sha256(canon.encode("utf-8")).hexdigest()
    prompt_tokens = sum(len(_content_text(m.get("content")).split()) for m in messages)
    completion_tokens = len(reply.split())
    return {
        "id": "chatcmpl-" + digest[:32],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or model_name,
        "system_fingerprint": "sglang-standin-" + __version__,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _validate_chat(body) -> str | None:
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return "'messages' must be a non-empty list"
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return "messages[%d] must be an object with a string 'role'" % i
    return None


class StandinState:
    def __init__(self, args: dict, parser_label: str, argv: list[str], warmup_s: float, never_ready: bool):
        self.args = args
        self.parser_label = parser_label
        self.argv = list(argv)
        self.warmup_s = warmup_s
        self.never_ready = never_ready
        self.model_path = str(args.get("model_path"))
        self.model_name = str(args.get("served_model_name") or self.model_path)
        self.api_key = args.get("api_key") or None
        self.ready_at: float | None = None  # set when the port opens
        self.created = int(time.time())
        self.no_ready = _env_flag("STANDIN_NO_READY")  # /ready answers 404 (an older engine)
        self.draining = False  # SIGTERM: no new work, the requests in flight finish
        self.in_flight = 0
        self._lock = threading.Lock()
        self.kernel_cache: dict = {}  # what `compiled_kernels` found at start

    def ready(self) -> bool:
        if self.never_ready or self.ready_at is None or self.draining:
            return False
        return time.monotonic() >= self.ready_at

    def not_ready_status(self) -> str:
        return "draining" if self.draining else "warming up"

    def busy(self, delta: int) -> None:
        """A request begins (+1) or ends (-1): a drain waits until none is in flight."""
        with self._lock:
            self.in_flight += delta

    def server_info(self) -> dict:
        info = masked(self.args)
        info.update(
            {
                "version": STANDIN_VERSION,
                "standin": True,
                "parser": self.parser_label,
                "env": collect_env(),
                "argv": self.argv,
                "kernel_cache": self.kernel_cache,
            }
        )
        return info


class StandinHandler(BaseHTTPRequestHandler):
    server_version = "sglang-standin/" + __version__
    sys_version = ""
    protocol_version = "HTTP/1.1"

    @property
    def state(self) -> StandinState:
        return self.server.standin_state  # type: ignore[attr-defined]

    _resp_size = "-"

    # -- logging: one line per request to stderr (the journal) --
    def log_request(self, code="-", size="-"):
        if size == "-":
            size = self._resp_size
        super().log_request(code, size)

    def log_message(self, format, *args):  # noqa: A002 (signature from the base class)
        sys.stderr.write("[sglang-standin] %s %s\n" % (self.client_address[0], format % args))
        sys.stderr.flush()

    # -- helpers --
    def _send(self, code: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self._resp_size = len(body)
        self.send_response(code)
        if body or ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, obj) -> None:
        self._send(code, _dumps(obj))

    def _error(self, code: int, message: str, etype: str) -> None:
        self._json(code, {"object": "error", "message": message, "type": etype, "code": code})

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def _authorized(self, path: str) -> bool:
        key = self.state.api_key
        if not key or path in ("/health", "/health_generate", "/ready", "/metrics"):
            return True
        auth = self.headers.get("Authorization", "")
        return auth == "Bearer " + key

    # -- routes --
    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        path = self._path()
        if not self._authorized(path):
            return self._error(401, "Unauthorized", "AuthenticationError")
        if bench_endpoints.handle(self, "GET", path):  # /server_info with internal_states
            return
        st = self.state
        if path in ("/health", "/health_generate"):
            if st.ready():
                return self._send(200, b"", "")
            return self._json(503, {"status": st.not_ready_status()})
        if path == "/ready" and not st.no_ready:
            # sglang 0.5.23: 200 when startup is done and it is neither paused nor shutting down
            return self._send(200 if st.ready() else 503, b"", "")
        if path == "/v1/models":
            return self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": st.model_name,
                            "object": "model",
                            "created": st.created,
                            "owned_by": DIST_NAME,
                            "root": st.model_path,
                        }
                    ],
                },
            )
        if path in ("/server_info", "/get_server_info"):
            return self._json(200, st.server_info())
        if path in ("/model_info", "/get_model_info"):
            return self._json(
                200,
                {
                    "model_path": st.model_path,
                    "tokenizer_path": st.args.get("tokenizer_path") or st.model_path,
                    "is_generation": True,
                    "standin": True,
                },
            )
        return self._error(404, "Not Found: %s" % path, "NotFoundError")

    def do_POST(self):
        self.state.busy(+1)
        try:
            self._post()
        finally:
            self.state.busy(-1)

    def _post(self):
        path = self._path()
        if not self._authorized(path):
            return self._error(401, "Unauthorized", "AuthenticationError")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        raw = self.rfile.read(length) if length > 0 else b""
        if bench_endpoints.handle(self, "POST", path, raw):  # /generate, /flush_cache
            return
        if path != "/v1/chat/completions":
            return self._error(404, "Not Found: %s" % path, "NotFoundError")
        if not self.state.ready():
            return self._error(503, "server is %s (sglang-standin)" % self.state.not_ready_status(),
                               "ServiceUnavailableError")
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            return self._error(400, "invalid JSON body: %s" % exc, "BadRequestError")
        problem = _validate_chat(body)
        if problem:
            return self._error(400, problem, "BadRequestError")
        resp = chat_completion(body, self.state.model_name)
        if body.get("stream"):
            return self._stream(resp)
        return self._json(200, resp)

    def _stream(self, resp: dict) -> None:
        choice = resp["choices"][0]
        base = {k: resp[k] for k in ("id", "created", "model", "system_fingerprint")}
        base["object"] = "chat.completion.chunk"
        chunks = [
            dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": choice["message"]["content"]}, "finish_reason": None}]),
            dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}], usage=resp["usage"]),
        ]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for c in chunks:
            self.wfile.write(b"data: " + _dumps(c) + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def make_server(host: str, port: int, state: StandinState) -> ThreadingHTTPServer:
    cls = _Server6 if ":" in host else _Server
    srv = cls((host, port), StandinHandler)
    srv.standin_state = state  # type: ignore[attr-defined]
    return srv


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


# The running server and its state, once the port is open: SIGTERM drains it.
_RUNNING: dict = {}


def _drain(srv, state: StandinState, poll_s: float) -> None:
    poll_s = max(0.01, poll_s)
    time.sleep(poll_s)  # a request accepted just before the signal has counted itself by now
    while True:
        with state._lock:
            left = state.in_flight
        if left == 0:
            break
        time.sleep(poll_s)
    log("drained: no request in flight, exiting")
    srv.shutdown()


def _on_signal(signum, frame):
    srv, state = _RUNNING.get("srv"), _RUNNING.get("state")
    if signum != signal.SIGTERM or srv is None:
        raise _Terminate(signum)
    if state.draining:
        return
    state.draining = True
    log("received SIGTERM: draining (%d request(s) in flight; new requests and /ready answer 503)"
        % state.in_flight)
    threading.Thread(target=_drain, args=(srv, state, _env_float("STANDIN_DRAIN_POLL_S", 0.05)),
                     daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        return _main(argv)
    except _Terminate as t:
        log("received %s, exiting" % signal.Signals(t.signum).name)
        return 0


# Flags that say only where the server listens or reads from: the same kernels whatever they are.
NOT_KERNEL_ARGS = ("host", "port", "model_path", "speculative_draft_model_path", "config", "api_key")


def compiled_kernels(args: dict) -> dict:
    """The engine's compile at start, as a GPU engine does it (triton, flashinfer's JIT, CUDA
    graphs): where `$TRITON_CACHE_DIR` already holds this configuration's kernels the start is
    warm and skips it; else it takes STANDIN_COMPILE_S seconds (default 0) and writes them there
    (atomically). Returns what /server_info reports as `kernel_cache`."""
    root = os.environ.get("TRITON_CACHE_DIR", "")
    if not root:
        return {"state": "none", "why": "TRITON_CACHE_DIR is not set"}
    wanted = {k: v for k, v in sorted(args.items()) if k not in NOT_KERNEL_ARGS}
    ident = hashlib.sha256(json.dumps(wanted, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = os.path.join(root, "standin", ident + ".kernels")
    if os.path.isfile(path):
        log("kernel cache warm: %s" % path)
        return {"state": "warm", "path": path, "compile_s": 0.0}
    compile_s = _env_float("STANDIN_COMPILE_S", 0.0)
    log("kernel cache cold (%s absent): compiling for %.2fs" % (path, compile_s))
    time.sleep(compile_s)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = "%s.%d.tmp" % (path, os.getpid())
        with open(tmp, "w") as handle:
            json.dump(wanted, handle, default=str)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only cache: compiled, not kept (the next start is cold again)
        log("kernel cache not written: %s" % exc)
        return {"state": "cold", "path": path, "compile_s": compile_s, "kept": False}
    return {"state": "cold", "path": path, "compile_s": compile_s, "kept": True}


def _main(argv: list[str]) -> int:
    try:
        args, parser_label = parse_args_with_parser(argv)
    except ArgsError as exc:
        sys.stderr.write("launch_server: error: %s\n" % exc)
        return 2
    except ModelPathError as exc:
        log("error: %s" % exc)
        return 1

    log("%s; parser: %s; args: %s" % (BANNER, parser_label, json.dumps(masked(args), default=_json_default, sort_keys=True)))
    log(server_args_line(args))

    if _env_flag("STANDIN_CRASH_AT_START"):
        log("error: simulated crash at start (STANDIN_CRASH_AT_START is set)")
        return 1

    try:
        check_model_dir(args.get("model_path"), "--model-path")
        draft = args.get("speculative_draft_model_path")
        if draft:
            check_model_dir(draft, "--speculative-draft-model-path")
    except ModelPathError as exc:
        log("error: %s" % exc)
        return 1

    host = str(args.get("host") or DEFAULT_HOST)
    try:
        port = int(args.get("port") or DEFAULT_PORT)
    except (TypeError, ValueError):
        sys.stderr.write("launch_server: error: --port must be an integer, got %r\n" % args.get("port"))
        return 2

    load_s = _env_float("STANDIN_LOAD_S", 1.0)
    warmup_s = _env_float("STANDIN_WARMUP_S", 2.0)
    never_ready = _env_flag("STANDIN_NEVER_READY")
    state = StandinState(args, parser_label, argv, warmup_s, never_ready)

    log("simulating model load for %.2fs (port %d closed)" % (load_s, port))
    time.sleep(load_s)
    state.kernel_cache = compiled_kernels(args)

    try:
        srv = make_server(host, port, state)
    except OSError as exc:
        log("error: cannot listen on %s:%d: %s" % (host, port, exc))
        return 1
    state.ready_at = time.monotonic() + warmup_s
    log(
        "listening on http://%s:%d; /health answers 503 %s"
        % (host, port, "forever (STANDIN_NEVER_READY)" if never_ready else "for %.2fs (warm-up)" % warmup_s)
    )
    _RUNNING.update(srv=srv, state=state)
    try:
        srv.serve_forever(poll_interval=0.2)
    finally:
        _RUNNING.clear()
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
