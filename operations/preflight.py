"""Preflight: prove a service's exact flags parse, with its own engine, before any (re)start.

`preflight.passed(...)` runs on the host, in the service's venv and with the unit's
environment (GPUs hidden), the installed sglang's own `prepare_server_args` on the exact
argv the unit will run, then imports the launcher and the server entry point. It runs
only when the unit is about to change or the service's inputs changed; if it fails, the
host fails with the parser's own message before the unit is written, so the running
service keeps running.

Under `--dry` the same check runs at once, through the
`Verdict` fact: it only reads (a Python process parses the flags and imports modules), so a
dry run shows the parser's refusal, and `--dry` exits 1 for it. When the venv generation the
unit will run is built by this very run, it does not exist yet and the check waits for the run
(the engine flags were already resolved against the generated flag list, configuration/engine_flags.py).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import PurePosixPath
from typing import Callable

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand
from pyinfra.facts.files import Sha1File

from configuration.errors import fail_dry_run, is_dry_run
from operations import host_reads, redact, remote, rollback, service_user, this_run
from operations.host_reads import operation
from report import summary

# The preflight runs as root, outside the unit's sandbox: the environment it takes from the unit must not make root's
# python load code from somewhere else. Refused in the data already (configuration); left out here as well, so
# that no path to root's process depends on one check. The engine's caches and home (service_user.runtime_environment)
# are the service user's to write: root's parser never reads them.
_LOADER_PREFIXES = ("LD_", "PYTHON", "MALLOC_", "GLIBC_")
_LOADER_NAMES = frozenset({"BASH_ENV", "ENV", "GCONV_PATH", "HOSTALIASES", "LOCALDOMAIN", "NLSPATH", "RES_OPTIONS", "TMPDIR",
                           "HOME", "PATH", "PERL5LIB", "PERL5OPT", "RUBYOPT", "NODE_OPTIONS",
                           # huggingface's caches hold the python of trust_remote_code models
                           "HF_HOME", "HF_MODULES_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"})
_CACHE_SUFFIXES = ("_CACHE", "_CACHE_DIR", "_CACHE_PATH", "_CACHE_HOME", "_WORKSPACE_BASE")


def root_may_inherit(name: str) -> bool:
    """Whether the root preflight takes the unit's variable `name` (loader, interpreter and cache variables: no)."""
    upper = name.upper()
    return not (upper.startswith(_LOADER_PREFIXES) or upper in _LOADER_NAMES or upper.startswith("XDG_")
                or upper.endswith(_CACHE_SUFFIXES) or name in service_user.runtime_environment())


def command(venv_path: str, launcher: str, argv: list[str], environment: dict[str, str]) -> str:
    """The remote command: a clean environment holding only the unit's variables, its GPUs included.

    The service's GPUs stay visible: a real engine's parser asks the device for its defaults
    (sglang 0.5.11 on an H200 stops with "No accelerator ... is available" when they are hidden).
    Python runs isolated (`-I`: no PYTHON* variable, no user site-packages, not the current
    directory on sys.path), with none of the variables that steer a loader or point at the engine's
    writable caches (`root_may_inherit`).
    """
    kept = {k: v for k, v in environment.items() if root_may_inherit(k)}
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", **kept}
    assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    script = remote.script("preflight")
    return (
        f"cd / && env -i {assignments} {shlex.quote(venv_path + '/bin/python')} -I - "
        f"{shlex.quote(json.dumps(argv))} {shlex.quote(launcher)} <<'PYEOF'\n{script}\nPYEOF"
    )


class Verdict(FactBase):
    """The preflight's JSON result, read without changing anything; `{"absent": true}` when the venv
    does not exist yet (a generation this run builds)."""

    def command(self, venv_path: str, cmd: str) -> str:
        python = shlex.quote(venv_path + "/bin/python")
        return f"if [ -x {python} ]; then\n{cmd}\nelse echo '{{\"absent\": true}}'; fi"

    def process(self, output):
        try:
            return json.loads(output[-1])
        except (ValueError, IndexError):
            return {"import_error": f"preflight did not run: {' '.join(output)[-500:]}"}


def verdict(result: dict) -> str | None:
    """The one-line reason a preflight result refuses the start, or None if it passes.

    The engine wrote it (a parser error quotes the flag it refused, an import error its value): secret-named
    values in it are masked like any text from the engine (operations/redact.py)."""
    if result.get("parse_error"):
        return redact.engine_text(f"{result['parser']} refuses the flags: {result['parse_error']}")
    if result.get("import_error"):
        return redact.engine_text(f"the server cannot start: {result['import_error']}")
    return None


def _run(state, host, service: str, endpoint: str, cmd: str) -> bool:
    ok, output = host.run_shell_command(cmd, print_output=False, _timeout=300)
    try:
        result = json.loads(output.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"import_error": f"preflight did not run: {(output.stderr or output.stdout).strip()[-500:]}"}
    reason = verdict(result) if ok else (verdict(result) or "preflight failed to run")
    if reason:
        host.log_styled(f"{service}: PREFLIGHT FAILED, unit and running service left as they were: {reason}", fg="red", log_func=logger.error)
        summary.record(host.name, service, endpoint, "FAILED", f"preflight: {reason}")
        return False
    host.log(f"{service}: preflight passed ({result['parser']})")
    return True


def _planned_changes(inputs_changed) -> list[str]:
    """Under --dry: the input operations (venv, patch sets, models, keys) this run will change, by name
    (`this_run.Inputs.planned`); inputs given only as a callable count as a change."""
    if inputs_changed is None:
        return []
    if isinstance(inputs_changed, this_run.Inputs):
        return inputs_changed.planned()
    return ["(its inputs)"]


def _preview(service: str, venv_path: str, cmd: str, inputs_change: list[str]) -> None:
    """Planning (--dry): run the read-only check now and say what the run will do.

    A generation's path names its content (stack and patch-set digests, operations/venv.py), so
    an existing one holds the engine the unit will run; the run may still repair it or stage
    models first, which the message says, but the parser's verdict is the one that counts."""
    result = host_reads.get(host, Verdict, venv_path=venv_path, cmd=cmd)
    if result.get("absent"):
        host.log(f"{service}: preflight runs once this run has built {venv_path}")
        return
    first = f" (the run first changes: {'; '.join(inputs_change)})" if inputs_change else ""
    reason = verdict(result)
    if reason:
        host.log_styled(f"{service}: PREFLIGHT WILL FAIL, unit and running service would be left as they are: {reason}{first}",
                        fg="red", log_func=logger.error)
        fail_dry_run(host)
    else:
        host.log(f"{service}: preflight would pass ({result.get('parser')}){first}")


@operation()
def passed(
    service: str,
    venv_path: str,
    launcher: str,
    argv: list[str],
    environment: dict[str, str],
    endpoint: str,
    unit_path: str,
    unit_text: str,
    inputs_changed: Callable[[], bool] | None = None,
):
    """
    Require the exact flags and environment of a unit to pass the engine's own parser.

    + service: the service's name (messages, summary)
    + venv_path: the venv the unit runs
    + launcher: the module the unit runs (imported too, with ``sglang.launch_server``)
    + argv: the flags exactly as the unit passes them
    + environment: the unit's environment
    + endpoint: the service's endpoint (summary)
    + unit_path, unit_text: the unit on the host and its new content: a preflight runs when they differ,
      and the unit in use is then saved for rollback (`operations/rollback.py`)
    + inputs_changed: callable, true when the venv, patch sets or models changed in this run

    **Example:**

    .. code:: python

        preflight.passed(
            name="sglang-ddtree.service flags pass sglang's parser",
            service="ddtree", venv_path="/root/venv_sglang", launcher="sglang.launch_server",
            argv=["--model-path", "/dev/shm/Qwen3.6-27B", "--port", "30000"], environment={"CUDA_VISIBLE_DEVICES": "0"},
            endpoint="http://127.0.0.1:30000", unit_path="/etc/systemd/system/sglang-ddtree.service", unit_text="...",
        )
    """
    current = host_reads.get(host, Sha1File, path=unit_path)
    unit_changes = current != hashlib.sha1(unit_text.encode()).hexdigest()
    inputs_change = this_run.changed(inputs_changed)
    if not unit_changes and not inputs_change:
        host.noop(f"service {service}: unit and inputs unchanged, no preflight needed")
        return
    if is_dry_run(host):
        _preview(service, venv_path, command(venv_path, launcher, argv, environment), _planned_changes(inputs_changed))
    yield FunctionCommand(_run, (service, endpoint, command(venv_path, launcher, argv, environment)), {})
    if unit_changes and current is not None:
        # Passed: the unit in use is kept for rollback before the new one replaces it.
        yield rollback.save_command(unit_path, PurePosixPath(unit_path).name)
