# Preflight, run with the service's own venv Python, as the service user in the service's sandbox (a
# transient unit, operations/preflight.py), with the unit's GPUs and the few variables the preflight
# allows: parse the exact flags with the installed sglang's own `prepare_server_args`, then import
# the launcher and the server entry point; and read what the target model is (hybrid or dense, from
# its config.json at --model-path: the engine advisories' `target`). Prints one JSON line (with the
# user it ran as); exits 0 either way.
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
            prepare_server_args(list(argv))
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
