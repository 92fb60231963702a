"""Served throughput, side by side: named services driven with identical load by the engine's own
client.

`measure.py` (beside deploy.py) adds one `measure.served` operation per named service, in the order
given, on every host: the host that runs the service measures it, the others note nothing. pyinfra
runs an operation on every host before the next, so the services are measured one at a time. On the
service's host, from the service's own venv, against its local port, as the service user in the
service's own sandbox (a transient unit: operations/environment/transient.py,
units.service_sandbox), never as root:

    VENV/bin/python -I -c CLIENT_SHIM sglang.bench_serving --backend sglang \\
        --base-url http://127.0.0.1:PORT --model=MODEL --tokenizer=TOKENIZER \\
        --dataset-name random-ids --num-prompts N --random-input-len I --random-output-len O \\
        --random-range-ratio 1 --max-concurrency C --request-rate inf --seed 1 \\
        --output-file F --disable-tqdm

The model and tokenizer are named, never asked of the server: MODEL is the path the deploy staged
the service's target model at, TOKENIZER that path or MEASURE_TOKENIZER (an absolute path on the
host). sglang 0.5.23's client loads a tokenizer with `trust_remote_code=True` hard-coded
(sglang/benchmark/utils.py `get_tokenizer`, and `check_chat_template` in
sglang/benchmark/serving.py), and has no flag to turn it off; without `--tokenizer` it loads the one
of the path `/model_info` names, and without `--model` the model `/v1/models` names, so whatever
answered on the port chose Python for it to import. CLIENT_SHIM turns remote code off in
transformers itself (every `trust_remote_code` resolves to False, a directory that holds only remote
code is refused with transformers' own message) before it runs the client's module as `__main__`.

Then an accept-length probe: P requests to `/generate` (the same I and O, greedy), whose own
`meta_info` (completion tokens over verify steps) gives the accept length of these requests alone.
`/server_info`'s `avg_spec_accept_length` (and so the client's `accept_length`) is cumulative since
the server started, warm-up, readiness checks and every earlier user included: it is kept in the
raw results but not shown. An API key is read on the host, inside the sandbox, by the service user
from the service's key file (root:<its group> 0640), never sent from here.

Nothing here restarts a service or takes the deploy lock: the operations only run read commands and
the benchmark's HTTP requests. At the end, one table and a JSON file of the raw results.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation
from pyinfra.api.state import BaseStateCallback

from configuration import kinds, run_scope
from configuration.typed import speculative_algorithm
from operations import remote
from operations.environment import transient
from operations.run import redact, remote_call
from operations.service import service_user, units

MARK = "MEASURE-RESULT "
DEFAULTS = {"prompts": 64, "input_len": 256, "output_len": 256, "concurrency": 8, "probe": 4,
            "timeout_s": 1800}
# (column, bench JSON key, format): what the table shows of each service's run.
COLUMNS = (
    ("out tok/s", "output_throughput", "{:.1f}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("TTFT p50", "median_ttft_ms", "{:.1f}"),
    ("TTFT p99", "p99_ttft_ms", "{:.1f}"),
    ("ITL p50", "median_itl_ms", "{:.2f}"),
    ("ITL p99", "p99_itl_ms", "{:.2f}"),
    ("E2E p50", "median_e2e_latency_ms", "{:.1f}"),
    ("E2E p99", "p99_e2e_latency_ms", "{:.1f}"),
)


@dataclass(frozen=True)
class Options:
    prompts: int = DEFAULTS["prompts"]
    input_len: int = DEFAULTS["input_len"]
    output_len: int = DEFAULTS["output_len"]
    concurrency: int = DEFAULTS["concurrency"]
    probe: int = DEFAULTS["probe"]
    timeout_s: int = DEFAULTS["timeout_s"]
    # MEASURE_TOKENIZER: the client's --tokenizer, an absolute path on the service's host;
    # None: the path the service's target model is staged at.
    tokenizer: str | None = None

    def bench_args(self, port: int, output_file: str, model_path: str) -> list[str]:
        """The client's arguments (after its module's name): the model and tokenizer named, never
        the server's."""
        return [
            "--backend", "sglang", "--base-url", f"http://127.0.0.1:{port}",
            # One word each, with `=`: the client's argparse never reads a value as an option of its
            # own.
            f"--model={model_path}", f"--tokenizer={self.tokenizer or model_path}",
            "--dataset-name", "random-ids", "--num-prompts", str(self.prompts),
            "--random-input-len", str(self.input_len), "--random-output-len", str(self.output_len),
            "--random-range-ratio", "1", "--max-concurrency", str(self.concurrency),
            "--request-rate", "inf", "--seed", "1", "--output-file", output_file, "--disable-tqdm",
        ]


CLIENT_MODULE = "sglang.bench_serving"
# An absolute host path of the characters the data's host paths may hold, less ':' (it is bound into
# the client's sandbox, `BindReadOnlyPaths=`, where ':' separates a bind's source from its
# destination).
_TOKENIZER_PATH = re.compile(r"/[A-Za-z0-9_./+@-]{0,4095}")


def env_name(key: str) -> str:
    return f"MEASURE_{key.upper()}"


def options_from(environ) -> Options:
    """`MEASURE_PROMPTS=64 ...` in the environment: each a whole number (the probe may be 0);
    MEASURE_TOKENIZER a path."""
    tokenizer = (environ.get("MEASURE_TOKENIZER") or "").strip() or None
    if (tokenizer is not None
            and (_TOKENIZER_PATH.fullmatch(tokenizer) is None or ".." in tokenizer.split("/"))):
        raise ValueError(f"MEASURE_TOKENIZER={environ['MEASURE_TOKENIZER']!r}: must be an absolute "
                         "path on the service's host (letters, digits and _ . / + @ -; no '..'), "
                         "e.g. /root/tokenizers/qwen: the client loads the tokenizer from there, "
                         "never a name it would look up")
    values: dict = {"tokenizer": tokenizer}
    for key, default in DEFAULTS.items():
        raw = environ.get(env_name(key))
        if raw is None or raw.strip() == "":
            values[key] = default
            continue
        # ASCII digits only: str.isdigit also takes '²' and Arabic-Indic digits.
        value = int(raw.strip()) if kinds.ASCII_DECIMAL.fullmatch(raw.strip()) else -1
        least = 0 if key == "probe" else 1
        if value < least:
            raise ValueError(f"{env_name(key)}={raw!r}: must be a whole number of at least {least}")
        values[key] = value
    return Options(**values)


def requested(raw: str | None) -> list[str]:
    """`MEASURE_SERVICES=a,b`: the services, in order, each once."""
    if raw is None or raw.strip() == "":
        raise ValueError("name the services to compare: MEASURE_SERVICES=SERVICE[,SERVICE...] (the "
                         "first is the baseline)")
    names = [n.strip() for n in raw.split(",")]
    if any(not n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"MEASURE_SERVICES={raw!r}: name each service once, comma-separated")
    return names


def replicas(names: list[str], configs: dict) -> list[tuple[str, str, str]]:
    """(row label, host, replica) per replica to measure, in order: a service's name is every
    replica of it (its label the name alone where it has one replica, else `host/replica`),
    `host/replica` one replica. `configs`: every host's validated configuration, in inventory
    order."""
    out: list[tuple[str, str, str]] = []
    for name in names:
        if "/" in name:
            host_name, _, replica = name.partition("/")
            if not any(s.name == replica for s in getattr(configs.get(host_name), "services", ())):
                raise ValueError(f"MEASURE_SERVICES: {name!r} is no replica of this inventory "
                                 "(host/replica, e.g. gpu-a/dflash@2)")
            out.append((name, host_name, replica))
            continue
        found = [(h, s.name) for h, c in configs.items() for s in c.services
                 if s.definition == name]
        if len(found) == 1:
            out.append((name, *found[0]))
        else:  # placed nowhere: one row that says so
            out += [(f"{h}/{r}", h, r) for h, r in found] or [(name, "", name)]
    return out


# On the host ------------------------------------------------------------------------------

# The client's whole environment (HOST_SCRIPT builds it, `env=`): names the deploy knows to be inert
# for it, each with its value's source. Nothing of the service's `env` data, root's or systemd's
# reaches it.
CLIENT_ENV = {
    "PATH": "the system's directories (transient.SYSTEM_PATH), none the service user writes",
    "HOME": "a new, empty directory in the run's private /tmp (PrivateTmp): the caches of the "
            "client and of transformers start empty and go with the run",
    "HF_HUB_OFFLINE": "1: huggingface_hub downloads nothing (the model and tokenizer are paths on "
                      "the host)",
    "TRANSFORMERS_OFFLINE": "1: transformers downloads nothing either",
    "LC_CTYPE": "C.UTF-8: text as UTF-8, what Python itself sets under the C locale (PEP 538); "
                "names no file of ours",
    "OPENAI_API_KEY": "only when the service has an API key: read from its key file by the service "
                      "user inside the sandbox; the client sends it as `Authorization: Bearer` "
                      "(sglang/benchmark/serving.py get_auth_headers)",
    "SGLANG_DEPLOY_PEER_GUARD": "the service's unit and control group, which every connection the "
                                "client makes must reach before its first byte leaves "
                                "(operations/transport/on_host/peer_guard.py); names no file",
}
CLIENT_FIXED_ENV = {"PATH": transient.SYSTEM_PATH, "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "LC_CTYPE": "C.UTF-8"}

# Runs the client's module as `__main__` (argv: MODULE ARGS...) with remote code off in
# transformers: sglang 0.5.23's client passes trust_remote_code=True to every tokenizer load, with
# no flag to turn it off. Every remote-code decision of transformers goes through
# `resolve_trust_remote_code` (tokenizers, configs, processors, models): it is told False, so a
# directory with only remote code is refused with transformers' own "contains custom code" message
# and one with a built-in class loads that; `get_class_from_dynamic_module`, which imports the code,
# refuses outright. The names are replaced where transformers' modules bound them too (read from
# their __dict__: no lazy import triggered).
CLIENT_SHIM = """
import runpy, sys
import transformers.dynamic_module_utils as dynamic

resolve = dynamic.resolve_trust_remote_code

def never_trust(trust_remote_code, *args, **kwargs):
    return resolve(False, *args, **kwargs)

def no_remote_code(*args, **kwargs):
    raise ValueError("sglang-deploy measure: the client runs no code from a model or tokenizer "
                     "directory (trust_remote_code is off)")

replaced = {"resolve_trust_remote_code": (resolve, never_trust),
            "get_class_from_dynamic_module": (dynamic.get_class_from_dynamic_module,
                                              no_remote_code)}
for module in list(sys.modules.values()):
    names = getattr(module, "__dict__", {})
    for name, (old, new) in replaced.items():
        if names.get(name) is old:
            setattr(module, name, new)
module = sys.argv.pop(1)
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""

# Runs in the transient unit, as the service user: reads the key, runs the client, then the probe
# requests; prints one MEASURE-RESULT line. argv: SPEC_JSON (the script itself on stdin).
HOST_SCRIPT = r'''
import json, os, pwd, subprocess, sys, tempfile, urllib.request
REFUSED_EXIT = 75  # the client's exit status when peer_guard stopped it
spec = json.loads(sys.argv[1])
result = {"service": spec["service"], "ran_as": {"uid": os.getuid()}}
# Every connection of this process and of the client is checked before its first byte leaves
# (peer_guard): the unit's control group is root's word for it (argv[2], from systemctl).
guard = {"unit": spec["unit"], "control_group": sys.argv[2] if len(sys.argv) > 2 else ""}
guard_ns = {"__name__": "peer_guard"}
os.environ["SGLANG_DEPLOY_PEER_GUARD"] = json.dumps(guard)
exec(compile(spec["peer_guard"], "peer_guard.py", "exec"), guard_ns)
client_guard = ("exec(compile(%r, 'peer_guard.py', 'exec'), {'__name__': 'peer_guard'})\n"
                % spec["peer_guard"])
try:
    result["ran_as"]["user"] = pwd.getpwuid(os.getuid()).pw_name
except KeyError:
    pass
key = None
if spec["key_file"]:
    try:
        with open(spec["key_file"], encoding="utf-8") as lines:
            for line in lines:
                name, _, value = line.partition(":")
                if name.strip() == "api-key":
                    key = json.loads(value.strip())
    except OSError as exc:
        result["error"] = "cannot read the API key file as uid %d: %s" % (os.getuid(), exc)
        print("MEASURE-RESULT " + json.dumps(result))
        sys.exit(0)
def redact(text):
    return text.replace(key, "<redacted>") if key else text
env = dict(spec["client_env"])
env["SGLANG_DEPLOY_PEER_GUARD"] = json.dumps({**guard, "exit_code": REFUSED_EXIT})
headers = {"Content-Type": "application/json"}
if key:
    env["OPENAI_API_KEY"] = key
    headers["Authorization"] = "Bearer " + key
with tempfile.TemporaryDirectory(prefix="sglang-measure-") as tmp:
    env["HOME"] = tmp
    out_file = os.path.join(tmp, "bench.jsonl")
    args = [a if a != "@OUT@" else out_file for a in spec["bench_args"]]
    try:
        run = subprocess.run(
            [sys.executable, "-I", "-c", client_guard + spec["client_shim"],
             spec["client_module"], *args],
            cwd=tmp, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=spec["timeout_s"])
        result["rc"] = run.returncode
        tail = (run.stdout + run.stderr)[-3000:]
        for line in run.stderr.splitlines():
            if line.startswith(guard_ns["REFUSED_MARK"]) and run.returncode == REFUSED_EXIT:
                guard_ns["refused"].append(line[len(guard_ns["REFUSED_MARK"]):])
    except subprocess.TimeoutExpired as exc:
        result["rc"] = "timeout"
        tail = "timed out after %ss" % spec["timeout_s"]
    lines = open(out_file, encoding="utf-8").read().splitlines() if os.path.exists(out_file) else []
    if lines:
        bench = json.loads(lines[-1])
        info = bench.get("server_info")
        if isinstance(info, dict):
            for secret in ("api_key", "admin_api_key"):
                if info.get(secret):
                    info[secret] = "<set>"
        result["bench"] = bench
    else:
        result["error"] = redact(tail)
base = "http://127.0.0.1:%d" % spec["port"]
tokens = verify = 0
probe = []
for i in range(spec["probe"]):
    if guard_ns["refused"]:
        break  # the run stops at the first connection that was not the unit's
    body = {"input_ids": [(7 * i + j) % 1000 + 10 for j in range(spec["input_len"])],
            "sampling_params": {"max_new_tokens": spec["output_len"], "temperature": 0,
                                "ignore_eos": True}}
    try:
        req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(),
                                     headers=headers)
        meta = json.loads(urllib.request.urlopen(req, timeout=600).read())["meta_info"]
    except Exception as exc:
        probe.append({"error": redact("%s: %s" % (type(exc).__name__, exc))})
        continue
    probe.append({k: meta.get(k)
                  for k in ("completion_tokens", "spec_verify_ct", "spec_accept_length")})
    if meta.get("spec_verify_ct"):
        tokens += meta["completion_tokens"]
        verify += meta["spec_verify_ct"]
result["probe"] = {"requests": probe, "completion_tokens": tokens, "verify_ct": verify,
                   "accept_length": tokens / verify if verify else None}
if guard_ns["refused"]:
    result["refused"] = guard_ns["refused"][0]
print("MEASURE-RESULT " + redact(json.dumps(result)))
'''


def client_sandbox(sandbox: list[str], tokenizer: str | None) -> list[str]:
    """The service's sandbox, and MEASURE_TOKENIZER bound in read-only where a home directory hides
    it (ProtectHome=tmpfs; '-': a path that does not exist is the client's error to report, not the
    unit's)."""
    if tokenizer and service_user.is_hidden(tokenizer):
        return [*sandbox, f"BindReadOnlyPaths=-{tokenizer}"]
    return list(sandbox)


def host_command(venv: str, spec: dict, sandbox: list[str], before: tuple[str, ...] = (),
                 after: tuple[str, ...] = ()) -> str:
    """Root's shell line on the host: `before`, the client and probes in a transient unit as the
    service user, `after`.

    What root runs here is the shell, `systemd-run` and the deploy's own checks: `before` and
    `after` (shell commands, root's, outside the sandbox: that the port's listeners are the
    service's own) each must pass, else the line exits non-zero and its output is not taken
    (`_run`). Everything the engine's code or the server's answers could steer (the client, the
    tokenizer it loads, the reading of the key file, the probes) runs in the transient unit.
    """
    limit = limit_s(spec.get("timeout_s", DEFAULTS["timeout_s"]), spec.get("probe", 0))
    run = transient.command(sandbox, {"PATH": transient.SYSTEM_PATH},
                            [venv + "/bin/python", "-I", "-", json.dumps(spec)],
                            f"measure {spec['service']}", limit)
    # The unit's control group, root's word for it (systemd's), is the script's argv[2]: the
    # identity every connection of the run is checked against (peer_guard).
    unit = shlex.quote(spec.get("unit", ""))
    client = (f"unit_cgroup=$(systemctl show -p ControlGroup --value {unit} 2>/dev/null)\n"
              f"{run} \"$unit_cgroup\" <<'PYEOF'\n{HOST_SCRIPT}\nPYEOF\n")
    # A check may be a heredoc command (a remote script): each goes in a brace group of its own
    # lines.
    checks_before = [f"{{ {check}\n}} || exit 96\n" for check in before]
    checks_after = ["rc=$?; [ $rc -eq 0 ] || exit $rc\n",
                    *(f"{{ {check}\n}} || exit 97\n" for check in after)] if after else []
    return "".join(["cd / || exit 1\n", *checks_before, client, *checks_after])


def parse_output(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    return None


# The table --------------------------------------------------------------------------------


@dataclass
class Report:
    services: list[str]
    options: Options
    out: Path
    results: dict[str, dict] = field(default_factory=dict)
    done: bool = False


def drafting(args: dict) -> str:
    """What the service drafts with, so that a comparison cannot credit the wrong thing: for DDTREE,
    whether a tree is built at all. Both public DDTree implementations run a budget of at most block
    size - 1 as a chain identical to DFLASH (the spine): with a 16-token draft block, budget 15
    builds no tree (docs/engine-advisories.md)."""
    algorithm = speculative_algorithm(args)
    if not algorithm:
        return "none"
    block = args.get("speculative-dflash-block-size") or args.get("speculative-num-draft-tokens")
    if algorithm != "DDTREE":
        return algorithm + (f" (block {block})" if block else "")
    budget = args.get("speculative-ddtree-budget")
    if budget is None:
        return ("DDTREE spine (no budget: block size - 1, a chain as "
                f"DFLASH{f', block {block}' if block else ''})")
    if block is None:
        return (f"DDTREE budget {budget} (block size not in the flags: a tree only if the budget "
                "exceeds the draft's block - 1)")
    if int(budget) <= int(block) - 1:
        return f"DDTREE spine (budget {budget} <= block {block} - 1: a chain, as DFLASH)"
    return f"DDTREE tree (budget {budget} > block {block} - 1)"


def rows(report: Report) -> list[dict]:
    """One row per requested service: its figures, accept length, and output throughput over the
    first's."""
    out, base = [], None
    for name in report.services:
        result = report.results.get(name)
        bench = (result or {}).get("bench") or {}
        row = {"service": name, "host": (result or {}).get("host", "-"),
               "drafting": (result or {}).get("drafting") or "-", "error": None}
        if not result:
            row["error"] = ("not measured (its host was not reached, or the service is placed on "
                            "no host of this run)")
        elif not bench:
            row["error"] = (result.get("error")
                            or "the client wrote no result").strip().splitlines()[-1][:200]
        for _, key, _ in COLUMNS:
            row[key] = bench.get(key)
        row["accept_length"] = ((result or {}).get("probe") or {}).get("accept_length")
        throughput = row["output_throughput"]
        if base is None and throughput:
            base = throughput
        row["ratio"] = throughput / base if throughput and base else None
        out.append(row)
    return out


def table(report: Report) -> str:
    first = report.services[0]
    header = ["service", "host", *(c for c, _, _ in COLUMNS), "accept len", f"vs {first}"]
    drafted = []
    lines = []
    for row in rows(report):
        cells = [row["service"], row["host"]]
        cells += ["-" if row[key] is None else fmt.format(row[key]) for _, key, fmt in COLUMNS]
        cells.append("-" if row["accept_length"] is None else f"{row['accept_length']:.2f}")
        cells.append("-" if row["ratio"] is None else f"{row['ratio']:.2f}")
        lines.append(cells)
        # no colon: `NAME: ...` is an error line
        drafted.append(f"{row['service']} drafts with {row['drafting']}")
    widths = [max(len(str(c)) for c in column) for column in zip(header, *lines)]
    text = ["  ".join(str(c).rjust(w) if i > 1 else str(c).ljust(w)
                      for i, (c, w) in enumerate(zip(cells, widths)))
            for cells in (header, *lines)]
    o = report.options
    text.insert(0, f"{o.prompts} prompts of {o.input_len} random token ids, {o.output_len} output "
                   f"tokens each, at most {o.concurrency} at a time (latencies in ms; accept "
                   f"length from {o.probe} probe requests after each run; the last column is "
                   "output tokens/s over the first service's)")
    text += drafted
    for row in rows(report):
        if row["error"]:
            text.append(f"{row['service']}: {row['error']}")
    return "\n".join(text)


def raw_json(report: Report) -> str:
    return json.dumps({"options": report.options.__dict__, "services": report.services,
                       "results": {n: report.results.get(n) for n in report.services},
                       "table": rows(report)},
                      indent=1, sort_keys=True) + "\n"


def finish(report: Report) -> None:
    """Print the table and write the JSON, once."""
    if report.done:
        return
    report.done = True
    report.out.parent.mkdir(parents=True, exist_ok=True)
    report.out.write_text(raw_json(report), encoding="utf-8")
    print("\n" + table(report) + f"\n--> raw results: {report.out}\n", flush=True)


@dataclass
class _Installed:
    """The run's one report (kept on the run: configuration/run_scope.py)."""

    report: Report | None = None


def install(state, services: list[str], options: Options, out: Path | None) -> Report:
    """The run's one report, printed once every requested service's operation has ended."""
    kept = run_scope.of(state, _Installed)
    if kept.report is None or kept.report.services != services:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        kept.report = report = Report(services, options, out or Path(f"measure-{stamp}.json"))

        class Callback(BaseStateCallback):
            @staticmethod
            def operation_end(state, op_hash):
                if all(n in report.results for n in report.services):
                    finish(report)

        state.add_callback_handler(Callback())
        import atexit

        atexit.register(lambda: report.results and finish(report))
    return kept.report


def limit_s(timeout_s: int, probes: int) -> int:
    """How long a measurement may run on its host: the client's own timeout, each probe's (600 s)
    and a margin; systemd stops a run whose caller went away, and the caller waits a minute more."""
    return timeout_s + 600 * probes + 120


def _run(state, host, service: str, venv: str, command: str, report: Report,
         how: str = "-") -> bool:
    host.log(f"measuring {service} ({venv}): {report.options.prompts} prompts, then "
             f"{report.options.probe} probe requests")
    ok, output = remote_call.run(
        host, command, f"measuring {service}",
        limit_s(report.options.timeout_s, report.options.probe) + 60)
    # The engine's own text: secret-named values masked, registered ones redacted
    # (operations/run/redact.py). A line that failed (the transient unit could not start, a check of
    # root's failed) gives no result, whatever it printed.
    printed = parse_output(output.stdout or "") or {}
    result = (printed if ok else None) or {
        "error": redact.engine_text((output.stderr or output.stdout)[-2000:]) or "no output"}
    # A connection whose server end was not the unit's stopped the run (peer_guard): whatever
    # root's later check says, that is the result, and it fails the host.
    refused = printed.get("refused")
    if refused:
        result = {"service": service, "refused": refused,
                  "error": f"stopped before sending on a connection to another holder: {refused}"}
    result["host"] = host.name
    result["drafting"] = how
    report.results[service] = result
    if refused:
        host.log_styled(f"{service}: the key goes only to the unit: {result['error']}", fg="red",
                        log_func=logger.error)
        return False
    if not result.get("bench"):
        logger.warning(f"{host.name}/{service}: the benchmark wrote no result: "
                       f"{str(result.get('error', '')).strip()[-500:]}")
    return True


@operation(is_idempotent=False)
def served(service: str, placed=None, report: Report | None = None, config=None):
    """Measure one service's served throughput with the engine's own benchmark client (read only).

    + service: the service's name (the run's `measure_services` entry)
    + placed: this host's `configuration.settings.Service` of that name, or None where it runs
      elsewhere
    + report: the run's report (`install`), which collects the result
    + config: this host's `configuration.settings.HostConfig`: the service's unit, whose user and
      sandbox the client runs in (`units.service_sandbox`)

    **Example:**

    .. code:: python

        measure.served(name="Measure ddtree", service="ddtree", placed=config.services[0],
                       report=report, config=config)
    """
    if placed is None:
        host.noop(f"{service} does not run on this host")
        return
    spec = {
        "service": service, "port": placed.port, "unit": placed.unit_name,
        # Run first by the host script and by the client: no byte of theirs leaves on a connection
        # whose server end is not the unit's (the key goes only to the unit).
        "peer_guard": remote.script("peer_guard"),
        "key_file": placed.config_file if placed.api_key else None,
        # The path the deploy staged the target model at: the client's model and, unless
        # MEASURE_TOKENIZER names another path, its tokenizer; never what the server names.
        "client_module": CLIENT_MODULE, "client_shim": CLIENT_SHIM, "client_env": CLIENT_FIXED_ENV,
        "bench_args": report.options.bench_args(placed.port, "@OUT@", placed.target.load_path),
        "probe": report.options.probe, "input_len": report.options.input_len,
        "output_len": report.options.output_len, "timeout_s": report.options.timeout_s,
    }
    sandbox = client_sandbox(units.service_sandbox(config, placed), report.options.tokenizer)
    # The client connects on its own: the port's every listener must be the unit's, before it runs
    # and after (peer identity, operations/service/on_host/port_holder.py), or its figures (and the
    # key it sent) went to someone else.
    holder = remote.command("port_holder", shlex.quote(placed.unit_name), str(int(placed.port)))
    command = host_command(placed.environment.path, spec, sandbox, before=(holder,),
                           after=(holder,))
    yield FunctionCommand(
        _run, (service, placed.environment.path, command, report, drafting(dict(placed.args))), {})


def combine(out: Path, parts: list[Path]) -> Report:
    """One report from several runs' JSON files (services measured in separate runs, e.g. one GPU in
    turn)."""
    services, results, options = [], {}, None
    for part in parts:
        raw = json.loads(part.read_text(encoding="utf-8"))
        options = options or Options(**raw["options"])
        for name in raw["services"]:
            if name in results:
                raise ValueError(f"{part}: {name} is in an earlier file too")
            services.append(name)
            results[name] = raw["results"][name]
    combined = Report(services, options or Options(), out,
                      {k: v for k, v in results.items() if v is not None})
    finish(combined)
    return combined


if __name__ == "__main__":
    import sys

    if len(sys.argv) < 4 or sys.argv[1] != "combine":
        raise SystemExit(
            "usage: python -m views.measure combine OUT.json RUN.json [RUN.json ...]")
    combine(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
