# Preflight, run with the service's own venv Python, as the service user in the service's sandbox (a
# transient unit, operations/service/preflight.py), with the unit's GPUs and the few variables the
# preflight allows: parse the exact flags with the installed sglang's own `prepare_server_args`,
# then import the launcher and the server entry point; and read what the target model is (hybrid or
# dense, from its config.json at --model-path: the engine advisories' `target`). Prints one JSON
# line (with the user it ran as); exits 0 either way.
# Before that, each path the flags and environment name (NAMED_JSON: [[where, path], ...],
# configuration/engine_paths.py) is judged as this user: it and every directory above it must be
# root's or this user's and writable by them alone (_common.why_untrusted: its trusted owners are
# root and whoever runs it); what is not is listed in `untrusted`.
# argv: ARGV_JSON LAUNCHER [NAMED_JSON]
import contextlib
import importlib
import io
import json
import os
import pwd
import re
import sys
import traceback

from _common import model_kind, why_untrusted  # noqa: E402 - remote.script puts _common.py here

argv, launcher = json.loads(sys.argv[1]), sys.argv[2]
named = json.loads(sys.argv[3]) if len(sys.argv) > 3 else []
result = {"parser": None, "parse_error": None, "import_error": None, "uid": os.getuid(),
          "untrusted": []}
for where, path in named:
    # an absent path is judged by its parents: where it would be made
    why = why_untrusted(path, link_ok=True)
    if why:
        result["untrusted"].append([where, path, why])
if "--model-path" in argv[:-1]:
    result["target"] = model_kind(argv[argv.index("--model-path") + 1])
try:
    result["user"] = pwd.getpwuid(os.getuid()).pw_name
except KeyError:
    result["user"] = str(os.getuid())


# A resolved setting that may name an address: a URL, host:port, zmq's `*`, an IP address. The
# deploy judges each (configuration/exposure.py), defaults included: the data's values were judged
# before connecting, what the engine fills in only here.
_ADDRESS_LIKE = re.compile(r"://|\*|\b\d{1,3}(\.\d{1,3}){3}\b|::|[A-Za-z0-9.\]-]:\d{1,5}\b")


def resolved_addresses(server_args):
    """[setting, text] for every setting the engine resolved (its defaults included) whose text may
    name an address, and the listeners its nested configurations fill in: the KV-events publisher's
    endpoints (`KVEventsConfig`, whose endpoint defaults to every interface); one it cannot resolve
    is named as such."""
    found = []
    for name in sorted(vars(server_args)):
        value = getattr(server_args, name, None)
        if isinstance(value, str) and _ADDRESS_LIKE.search(value):
            found.append([name, value])
    events = getattr(server_args, "kv_events_config", None)
    if events:
        try:
            from sglang.srt.disaggregation.kv_events import KVEventsConfig

            config = KVEventsConfig.from_cli(events)
            if str(getattr(config, "publisher", "null")) != "null":
                for field in ("endpoint", "replay_endpoint"):
                    if getattr(config, field, None):
                        found.append([f"kv_events_config.{field}", str(getattr(config, field))])
        except Exception as exc:
            found.append(["kv_events_config", f"unresolved ({type(exc).__name__}: {exc})"])
    return found


def last_error_line(text, fallback):
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    return (errors or lines or [fallback])[-1]


try:
    import sglang
    from sglang.srt.server_args import prepare_server_args
except ModuleNotFoundError as exc:
    if exc.name != "sglang":
        result["import_error"] = f"sglang.srt.server_args: {exc}"
    else:
        result["parser"] = "none (sglang is not installed in this venv)"
except Exception as exc:  # an import chain that breaks (ABI, missing dependency) is the finding
    result["import_error"] = f"sglang.srt.server_args: {type(exc).__name__}: {exc}"
else:
    result["parser"] = f"sglang {getattr(sglang, '__version__', '?')}"
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(io.StringIO()):
            result["resolved"] = resolved_addresses(prepare_server_args(list(argv)))
    except SystemExit as exc:
        result["parse_error"] = last_error_line(captured.getvalue(),
                                                f"the parser exited with {exc.code}")
    except Exception as exc:
        result["parse_error"] = f"{type(exc).__name__}: {exc}"

modules = [launcher] + (
    ["sglang.launch_server"]
    if (result["parser"] and result["parser"].startswith("sglang ")
        and launcher != "sglang.launch_server")
    else [])
for module in modules:
    if result["import_error"]:
        break
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            importlib.import_module(module)
    except BaseException as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        result["import_error"] = f"import {module}: {type(exc).__name__}: {exc}{where}"
print(json.dumps(result))
