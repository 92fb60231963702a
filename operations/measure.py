"""Served throughput, side by side: named services driven with identical load by the engine's own client.

`measure.py` (beside deploy.py) adds one `measure.served` operation per named service, in the order
given, on every host: the host that runs the service measures it, the others note nothing. pyinfra
runs an operation on every host before the next, so the services are measured one at a time. On the
service's host, from the service's own venv, against its local port:

    VENV/bin/python -m sglang.bench_serving --backend sglang --base-url http://127.0.0.1:PORT \\
        --dataset-name random-ids --num-prompts N --random-input-len I --random-output-len O \\
        --random-range-ratio 1 --max-concurrency C --request-rate inf --seed 1 --output-file F --disable-tqdm \\
        [--tokenizer=T]

(`--tokenizer` with MEASURE_TOKENIZER; without it the client loads the tokenizer of the model path
the server reports), then an accept-length probe: P requests to `/generate` (the same I and O,
greedy), whose own `meta_info` (completion tokens over verify steps) gives the accept length of
these requests alone.
`/server_info`'s `avg_spec_accept_length` (and so the client's `accept_length`) is cumulative since
the server started, warm-up, readiness checks and every earlier user included: it is kept in the
raw results but not shown. An API key is read on the host from the service's key file, never sent.

Nothing here restarts a service or takes the deploy lock: the operations only run read commands and
the benchmark's HTTP requests. At the end, one table and a JSON file of the raw results.
"""

from __future__ import annotations

import base64
import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation
from pyinfra.api.state import BaseStateCallback

from configuration import kinds
from operations import redact

MARK = "MEASURE-RESULT "
DEFAULTS = {"prompts": 64, "input_len": 256, "output_len": 256, "concurrency": 8, "probe": 4, "timeout_s": 1800}
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
    # MEASURE_TOKENIZER: the client's --tokenizer (a path on the service's host, or a name in its HF cache);
    # None: the one of the model path the server reports.
    tokenizer: str | None = None

    def bench_args(self, port: int, output_file: str) -> list[str]:
        return [
            "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", f"http://127.0.0.1:{port}",
            "--dataset-name", "random-ids", "--num-prompts", str(self.prompts),
            "--random-input-len", str(self.input_len), "--random-output-len", str(self.output_len),
            "--random-range-ratio", "1", "--max-concurrency", str(self.concurrency), "--request-rate", "inf",
            "--seed", "1", "--output-file", output_file, "--disable-tqdm",
            # One word with `=`: the client's argparse never reads the value as an option of its own.
            *([f"--tokenizer={self.tokenizer}"] if self.tokenizer else []),
        ]


def env_name(key: str) -> str:
    return f"MEASURE_{key.upper()}"


def options_from(environ) -> Options:
    """`MEASURE_PROMPTS=64 ...` in the environment: each a whole number (the probe may be 0); MEASURE_TOKENIZER a path."""
    tokenizer = (environ.get("MEASURE_TOKENIZER") or "").strip() or None
    if tokenizer is not None and (tokenizer.startswith("-") or kinds.control_character(tokenizer)):
        raise ValueError(f"MEASURE_TOKENIZER={environ['MEASURE_TOKENIZER']!r}: must be one line, a path on the service's "
                         "host or a model name, not starting with '-' (write ./-name for a relative path)")
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
        raise ValueError("name the services to compare: MEASURE_SERVICES=SERVICE[,SERVICE...] (the first is the baseline)")
    names = [n.strip() for n in raw.split(",")]
    if any(not n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"MEASURE_SERVICES={raw!r}: name each service once, comma-separated")
    return names


# On the host ------------------------------------------------------------------------------

HOST_SCRIPT = r'''
import json, os, subprocess, sys, tempfile, urllib.request
spec = json.loads(sys.argv[1])
key = None
if spec["key_file"] and os.path.exists(spec["key_file"]):
    for line in open(spec["key_file"], encoding="utf-8"):
        name, _, value = line.partition(":")
        if name.strip() == "api-key":
            key = json.loads(value.strip())
def redact(text):
    return text.replace(key, "<redacted>") if key else text
env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
headers = {"Content-Type": "application/json"}
if key:
    env["OPENAI_API_KEY"] = key
    headers["Authorization"] = "Bearer " + key
result = {"service": spec["service"]}
with tempfile.TemporaryDirectory(prefix="sglang-measure-") as tmp:
    env["HOME"] = tmp
    out_file = os.path.join(tmp, "bench.jsonl")
    args = [a if a != "@OUT@" else out_file for a in spec["bench_args"]]
    try:
        run = subprocess.run([sys.executable, *args], cwd=tmp, env=env, capture_output=True, text=True, timeout=spec["timeout_s"])
        result["rc"] = run.returncode
        tail = (run.stdout + run.stderr)[-3000:]
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
    body = {"input_ids": [(7 * i + j) % 1000 + 10 for j in range(spec["input_len"])],
            "sampling_params": {"max_new_tokens": spec["output_len"], "temperature": 0, "ignore_eos": True}}
    try:
        req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(), headers=headers)
        meta = json.loads(urllib.request.urlopen(req, timeout=600).read())["meta_info"]
    except Exception as exc:
        probe.append({"error": redact("%s: %s" % (type(exc).__name__, exc))})
        continue
    probe.append({k: meta.get(k) for k in ("completion_tokens", "spec_verify_ct", "spec_accept_length")})
    if meta.get("spec_verify_ct"):
        tokens += meta["completion_tokens"]
        verify += meta["spec_verify_ct"]
result["probe"] = {"requests": probe, "completion_tokens": tokens, "verify_ct": verify,
                   "accept_length": tokens / verify if verify else None}
print("MEASURE-RESULT " + redact(json.dumps(result)))
'''


def host_command(venv: str, spec: dict) -> str:
    script = base64.b64encode(HOST_SCRIPT.encode()).decode()
    return (f"cd / && {shlex.quote(venv + '/bin/python')} -c "
            f"'import base64,sys; exec(base64.b64decode(sys.argv.pop(1)))' {script} {shlex.quote(json.dumps(spec))}")


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


def rows(report: Report) -> list[dict]:
    """One row per requested service: its figures, accept length, and output throughput over the first's."""
    out, base = [], None
    for name in report.services:
        result = report.results.get(name)
        bench = (result or {}).get("bench") or {}
        row = {"service": name, "host": (result or {}).get("host", "-"), "error": None}
        if not result:
            row["error"] = "not measured (its host was not reached, or the service is placed on no host of this run)"
        elif not bench:
            row["error"] = (result.get("error") or "the client wrote no result").strip().splitlines()[-1][:200]
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
    lines = []
    for row in rows(report):
        cells = [row["service"], row["host"]]
        cells += ["-" if row[key] is None else fmt.format(row[key]) for _, key, fmt in COLUMNS]
        cells.append("-" if row["accept_length"] is None else f"{row['accept_length']:.2f}")
        cells.append("-" if row["ratio"] is None else f"{row['ratio']:.2f}")
        lines.append(cells)
    widths = [max(len(str(c)) for c in column) for column in zip(header, *lines)]
    text = ["  ".join(str(c).rjust(w) if i > 1 else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
            for cells in (header, *lines)]
    o = report.options
    text.insert(0, f"{o.prompts} prompts of {o.input_len} random token ids, {o.output_len} output tokens each, "
                   f"at most {o.concurrency} at a time (latencies in ms; accept length from {o.probe} probe requests "
                   "after each run; the last column is output tokens/s over the first service's)")
    for row in rows(report):
        if row["error"]:
            text.append(f"{row['service']}: {row['error']}")
    return "\n".join(text)


def raw_json(report: Report) -> str:
    return json.dumps({"options": report.options.__dict__, "services": report.services,
                       "results": {n: report.results.get(n) for n in report.services}, "table": rows(report)},
                      indent=1, sort_keys=True) + "\n"


def finish(report: Report) -> None:
    """Print the table and write the JSON, once."""
    if report.done:
        return
    report.done = True
    report.out.parent.mkdir(parents=True, exist_ok=True)
    report.out.write_text(raw_json(report), encoding="utf-8")
    print("\n" + table(report) + f"\n--> raw results: {report.out}\n", flush=True)


_REPORT: Report | None = None


def install(state, services: list[str], options: Options, out: Path | None) -> Report:
    """The run's one report, printed once every requested service's operation has ended."""
    global _REPORT
    if _REPORT is None or _REPORT.services != services:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        _REPORT = Report(services, options, out or Path(f"measure-{stamp}.json"))
        report = _REPORT

        class Callback(BaseStateCallback):
            @staticmethod
            def operation_end(state, op_hash):
                if all(n in report.results for n in report.services):
                    finish(report)

        state.add_callback_handler(Callback())
        import atexit

        atexit.register(lambda: report.results and finish(report))
    return _REPORT


def _run(state, host, service: str, venv: str, command: str, report: Report) -> bool:
    host.log(f"measuring {service} ({venv}): {report.options.prompts} prompts, then {report.options.probe} probe requests")
    ok, output = host.run_shell_command(command, print_output=False)
    # The engine's own text: secret-named values masked, registered ones redacted (operations/redact.py).
    result = parse_output(output.stdout) or {"error": redact.engine_text((output.stderr or output.stdout)[-2000:]) or "no output"}
    result["host"] = host.name
    report.results[service] = result
    if not result.get("bench"):
        logger.warning(f"{host.name}/{service}: the benchmark wrote no result: {str(result.get('error', '')).strip()[-500:]}")
    return True


@operation(is_idempotent=False)
def served(service: str, placed=None, report: Report | None = None):
    """Measure one service's served throughput with the engine's own benchmark client (read only).

    + service: the service's name (the run's `measure_services` entry)
    + placed: this host's `configuration.settings.Service` of that name, or None where it runs elsewhere
    + report: the run's report (`install`), which collects the result

    **Example:**

    .. code:: python

        measure.served(name="Measure ddtree", service="ddtree", placed=config.services[0], report=report)
    """
    if placed is None:
        host.noop(f"{service} does not run on this host")
        return
    spec = {
        "service": service, "port": placed.port,
        "key_file": placed.config_file if placed.api_key else None,
        "bench_args": report.options.bench_args(placed.port, "@OUT@"),
        "probe": report.options.probe, "input_len": report.options.input_len,
        "output_len": report.options.output_len, "timeout_s": report.options.timeout_s,
    }
    yield FunctionCommand(_run, (service, placed.environment.path, host_command(placed.environment.path, spec), report), {})



def combine(out: Path, parts: list[Path]) -> Report:
    """One report from several runs' JSON files (services measured in separate runs, e.g. one GPU in turn)."""
    services, results, options = [], {}, None
    for part in parts:
        raw = json.loads(part.read_text(encoding="utf-8"))
        options = options or Options(**raw["options"])
        for name in raw["services"]:
            if name in results:
                raise ValueError(f"{part}: {name} is in an earlier file too")
            services.append(name)
            results[name] = raw["results"][name]
    combined = Report(services, options or Options(), out, {k: v for k, v in results.items() if v is not None})
    finish(combined)
    return combined


if __name__ == "__main__":
    import sys

    if len(sys.argv) < 4 or sys.argv[1] != "combine":
        raise SystemExit("usage: python -m operations.measure combine OUT.json RUN.json [RUN.json ...]")
    combine(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
