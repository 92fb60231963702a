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
(the engine flags were already resolved against the generated flag list,
configuration/engine_flags.py).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import PurePosixPath
from typing import Callable, Sequence

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand
from pyinfra.facts.files import Sha1File

from configuration import engine_paths
from configuration.advisories import Advisory
from configuration.errors import fail_dry_run, is_dry_run
from configuration.exposure import resolved_beyond_loopback
from operations import remote
from operations.environment import transient
from operations.run import host_reads, redact, this_run
from operations.run.host_reads import operation
from operations.service import rollback, service_user, units
from report import summary

# The preflight runs the engine's code (its parser, its launcher's imports) outside the service's
# unit: as the service user, in a transient unit with the sandbox of the unit it is about to install
# (operations/environment/transient.py, units.sandbox_properties), never as root. Its environment is
# an ALLOW list: of the unit's variables (the service's `env` data and the GPUs the deploy derives)
# it takes only the names below, each inert for the engine's parser; everything else is dropped for
# this run (OPENSSL_CONF, GCONV_PATH, LOCPATH, a cache or config directory, a name the data's checks
# do not know...). A parse that depends on a dropped variable shows when the service starts, where
# the readiness gate rolls it back.
PARSER_ENV: dict[str, str] = {
    "CUDA_VISIBLE_DEVICES": "the unit's GPUs, derived from `gpu` (digits and commas; the data may "
                            "not set it): a real engine's parser asks the device for its defaults "
                            "(sglang 0.5.11 on an H200 stops with \"No accelerator ... is "
                            "available\" when they are hidden)",
    "CUDA_DEVICE_ORDER": "set by the unit to PCI_BUS_ID (units.GPU_ORDER; the data may not set "
                         "it): the GPUs above numbered as nvidia-smi numbers them",
    "SGLANG_DDTREE_MAX_TOPK": "a whole number the ddtree patch set reads and checks while the "
                              "command line is parsed "
                              "(files/patches/ddtree-sample/.../ddtree_utils.py); names no file, "
                              "loads nothing",
    "SGLANG_DDTREE_DEPTH_BONUS": "a number the ddtree patch set reads and checks while the command "
                                 "line is parsed; names no file, loads nothing",
}
# Besides those, the run's own values (never the data's): PATH the system's directories only, HOME
# the service user's (its StateDirectory, which the sandbox makes writable; a parser that caches
# something writes it there).
PARSER_HOME = service_user.runtime_environment()["HOME"]
# A caller that names no sandbox (a test) still never parses as root: a throwaway user systemd makes
# for the run.
NO_SANDBOX = ("DynamicUser=yes",)
# How long a preflight may take (the SSH command's timeout, and the transient unit's
# RuntimeMaxSec=).
PREFLIGHT_TIMEOUT_S = 300


def parser_environment(environment: dict[str, str]) -> dict[str, str]:
    """The preflight's whole environment: the deploy's PATH and HOME, then the unit's variables
    named in PARSER_ENV."""
    kept = {k: v for k, v in environment.items() if k in PARSER_ENV}
    return {"PATH": transient.SYSTEM_PATH, "HOME": PARSER_HOME, **kept}


def command(venv_path: str, launcher: str, argv: list[str], environment: dict[str, str],
            sandbox: Sequence[str] = NO_SANDBOX, service: str = "") -> str:
    """The remote command: the venv's python in a transient unit with the service's sandbox and
    `parser_environment`.

    `sandbox`: the unit's (`units.sandbox_properties`), so its User=, Group=, SupplementaryGroups=
    (the GPU devices' groups), its binds and protections. The service's GPUs stay visible (no
    PrivateDevices in the sandbox; the unit's CUDA_VISIBLE_DEVICES is on the allow list). Python
    runs isolated (`-I`: no PYTHON* variable, no user site-packages, not the current directory on
    sys.path) from `/`, the script on stdin.
    """
    # Every path the flags and environment name, judged where the engine will run, as its user
    # (configuration/engine_paths.py).
    named = engine_paths.in_argv(argv, environment)
    run = transient.command(sandbox, parser_environment(environment),
                            [venv_path + "/bin/python", "-I", "-", json.dumps(argv), launcher,
                             json.dumps(named)],
                            f"preflight{' of ' + service if service else ''}", PREFLIGHT_TIMEOUT_S)
    script = remote.script("preflight")
    return f"cd / && {run} <<'PYEOF'\n{script}\nPYEOF"


class Verdict(FactBase):
    """The preflight's JSON result, read without changing anything; `{"absent": true}` when the venv
    does not exist yet (a generation this run builds), `{"absent_user": true}` when the account the
    preflight runs as does not (the run creates it first)."""

    def command(self, venv_path: str, cmd: str, user: str | None = None) -> str:
        python = shlex.quote(venv_path + "/bin/python")
        if user is None:
            return f"if [ -x {python} ]; then\n{cmd}\nelse echo '{{\"absent\": true}}'; fi"
        return (f"if [ -x {python} ] && getent passwd {shlex.quote(user)} >/dev/null; then\n{cmd}\n"
                f"elif [ -x {python} ]; then echo '{{\"absent_user\": true}}'; else echo "
                "'{\"absent\": true}'; fi")

    def process(self, output):
        try:
            return json.loads(output[-1])
        except (ValueError, IndexError):
            return {"import_error": f"preflight did not run: {' '.join(output)[-500:]}"}


def verdict(result: dict, open_ok: bool = False) -> str | None:
    """The one-line reason a preflight result refuses the start, or None if it passes. `open_ok`:
    the service may listen beyond loopback (it has an API key, or `allow_unauthenticated`).

    The engine wrote it (a parser error quotes the flag it refused, an import error its value):
    secret-named values in it are masked like any text from the engine
    (operations/run/redact.py)."""
    for where, path, why in result.get("untrusted") or ():
        return (f"the {where} names {path}, which the engine loads, runs or searches, and {why}: "
                "only root or the service account may write what the engine loads; give it to "
                "root (or the service account) and make it writable by its owner alone, or use "
                "another directory")
    if result.get("parse_error"):
        return redact.engine_text(f"{result['parser']} refuses the flags: {result['parse_error']}")
    if result.get("import_error"):
        return redact.engine_text(f"the server cannot start: {result['import_error']}")
    beyond = None if open_ok else resolved_beyond_loopback(result.get("resolved") or [])
    if beyond:
        return redact.engine_text(
            f"{beyond}: without an API key anyone who reaches it can use it; name a loopback "
            "address for it in the service's args (e.g. tcp://127.0.0.1:5557), or set "
            "`api_key_secret` (or `allow_unauthenticated: true` to accept that)")
    return None


def ran_as(result: dict) -> str:
    """`sglang 0.5.23, as sglang`: the parser, and the user the preflight ran as (when the result
    says)."""
    return (f"{result.get('parser')}, as {result['user']}" if result.get("user")
            else str(result.get("parser")))


def advised(result: dict, by_target: dict[str, tuple[Advisory, ...]]) -> tuple[str | None,
                                                                               list[str]]:
    """What the engine advisories on the target's kind say once the preflight read the staged
    model (`by_target`: `gpus.GpuDecisions.after_staging` of the service): the refusal, if one
    holds, and the warnings. A target whose kind cannot be read is said, not guessed."""
    if not by_target:
        return None, []
    kind = result.get("target")
    if kind is None:
        ids = sorted({a.id for held in by_target.values() for a in held})
        return None, [f"the target's kind could not be read (no readable config.json at its "
                      f"--model-path): advisories {', '.join(ids)} not checked"]
    held = by_target.get(kind, ())
    refusals = [f"{a.text()} (the target is {kind})" for a in held if a.effect == "refuse"]
    warnings = [f"{a.text()} (the target is {kind})" for a in held if a.effect != "refuse"]
    return (refusals[0] if refusals else None), warnings


def _run(state, host, service: str, endpoint: str, cmd: str,
         by_target: dict[str, tuple[Advisory, ...]], open_ok: bool = False) -> bool:
    ok, output = host.run_shell_command(cmd, print_output=False, _timeout=PREFLIGHT_TIMEOUT_S)
    try:
        result = json.loads(output.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"import_error": "preflight did not run: "
                                  f"{(output.stderr or output.stdout).strip()[-500:]}"}
    reason = (verdict(result, open_ok) if ok
              else (verdict(result, open_ok) or "preflight failed to run"))
    refusal, warnings = advised(result, by_target)
    for warning in warnings:
        host.log_styled(f"{service}: {warning}", fg="yellow", log_func=logger.warning)
    reason = reason or refusal
    if reason:
        host.log_styled(f"{service}: PREFLIGHT FAILED, unit and running service left as they were: "
                        f"{reason}", fg="red", log_func=logger.error)
        summary.record(host, service, endpoint, "FAILED", f"preflight: {reason}")
        return False
    host.log(f"{service}: preflight passed ({ran_as(result)})")
    return True


def _planned_changes(inputs_changed) -> list[str]:
    """Under --dry: the input operations (venv, patch sets, models, keys) this run will change, by
    name (`this_run.Inputs.planned`); inputs given only as a callable count as a change."""
    if inputs_changed is None:
        return []
    if isinstance(inputs_changed, this_run.Inputs):
        return inputs_changed.planned()
    return ["(its inputs)"]


def _preview(service: str, venv_path: str, cmd: str, inputs_change: list[str],
             user: str | None = None, open_ok: bool = False) -> None:
    """Planning (--dry): run the read-only check now and say what the run will do.

    A generation's path names its content (stack and patch-set digests,
    operations/environment/venv_read.py), so an existing one holds the engine the unit will run;
    the run may still repair it or stage models first, which the message says, but the parser's
    verdict is the one that counts."""
    result = host_reads.get(host, Verdict, venv_path=venv_path, cmd=cmd,
                            **({"user": user} if user else {}))
    if result.get("absent"):
        host.log(f"{service}: preflight runs once this run has built {venv_path}")
        return
    if result.get("absent_user"):
        host.log(f"{service}: preflight runs once this run has created the account {user}, which "
                 "it runs as")
        return
    first = f" (the run first changes: {'; '.join(inputs_change)})" if inputs_change else ""
    reason = verdict(result, open_ok)
    if reason:
        host.log_styled(f"{service}: PREFLIGHT WILL FAIL, unit and running service would be left "
                        f"as they are: {reason}{first}",
                        fg="red", log_func=logger.error)
        fail_dry_run(host)
    else:
        host.log(f"{service}: preflight would pass ({ran_as(result)}){first}")


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
    by_target: dict[str, tuple[Advisory, ...]] | None = None,
    open_ok: bool = False,
):
    """
    Require the exact flags and environment of a unit to pass the engine's own parser.

    + service: the service's name (messages, summary)
    + venv_path: the venv the unit runs
    + launcher: the module the unit runs (imported too, with ``sglang.launch_server``)
    + argv: the flags exactly as the unit passes them
    + environment: the unit's environment (the preflight takes only the names in ``PARSER_ENV``)
    + endpoint: the service's endpoint (summary)
    + unit_path, unit_text: the unit on the host and its new content: a preflight runs when they
      differ, and the unit in use is then saved for rollback (`operations/service/rollback.py`); the
      preflight runs as the user and in the sandbox this unit names (`units.sandbox_properties`)
    + inputs_changed: callable, true when the venv, patch sets or models changed in this run
    + by_target: the engine advisories that depend on the target model's kind where the GPU check
      could not read it (`gpus.GpuDecisions.after_staging`): decided here from the staged model
    + open_ok: the service may listen beyond loopback (an API key, or ``allow_unauthenticated``);
      else an address beyond loopback among the engine's resolved settings, defaults included,
      fails the preflight

    **Example:**

    .. code:: python

        preflight.passed(
            name="sglang-ddtree.service flags pass sglang's parser",
            service="ddtree", venv_path="/root/venv_sglang", launcher="sglang.launch_server",
            argv=["--model-path", "/dev/shm/Qwen3.6-27B", "--port", "30000"],
            environment={"CUDA_VISIBLE_DEVICES": "0"}, endpoint="http://127.0.0.1:30000",
            unit_path="/etc/systemd/system/sglang-ddtree.service", unit_text="...",
        )
    """
    current = host_reads.get(host, Sha1File, path=unit_path)
    unit_changes = current != hashlib.sha1(unit_text.encode()).hexdigest()
    inputs_change = this_run.changed(inputs_changed)
    if not unit_changes and not inputs_change:
        host.noop(f"service {service}: unit and inputs unchanged, no preflight needed")
        return
    # The unit's own sandbox and user (a text with no [Service] section, a test's, gets a throwaway
    # user: NO_SANDBOX).
    sandbox = units.sandbox_properties(unit_text) or list(NO_SANDBOX)
    user = transient.runs_as(sandbox)
    cmd = command(venv_path, launcher, argv, environment, sandbox, service)
    if is_dry_run(host):
        _preview(service, venv_path, cmd, _planned_changes(inputs_changed),
                 None if user == "DynamicUser" else user, open_ok)
    yield FunctionCommand(_run, (service, endpoint, cmd, by_target or {}, open_ok), {})
    if unit_changes and current is not None:
        # Passed: the unit in use is kept for rollback before the new one replaces it.
        yield rollback.save_command(unit_path, PurePosixPath(unit_path).name)
