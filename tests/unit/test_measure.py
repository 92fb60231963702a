"""The measurement (measure.py, operations/measure.py): its table, ratios and raw JSON, the host-side
script against the lab's stand-in server, and the stand-in's speed following its speculative flags."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from operations import measure

ROOT = Path(__file__).resolve().parents[2]
STANDIN_SRC = ROOT / "lab" / "standin"


def bench(throughput: float, **more) -> dict:
    figures = {key: 10.0 for _, key, _ in measure.COLUMNS}
    figures.update(output_throughput=throughput, request_throughput=throughput / 100, accept_length=9.9, **more)
    return figures


def report(results: dict, services=("plain", "dflash", "ddtree"), tmp_path: Path | None = None) -> measure.Report:
    out = (tmp_path or Path("/nonexistent")) / "m.json"
    return measure.Report(list(services), measure.Options(prompts=8, input_len=16, output_len=32, concurrency=2, probe=2), out, results)


def test_rows_give_each_service_its_ratio_to_the_first_and_the_probes_accept_length():
    rep = report({
        "plain": {"host": "gpu-c", "bench": bench(100.0), "probe": {"accept_length": None}},
        "dflash": {"host": "gpu-c", "bench": bench(190.0), "probe": {"accept_length": 1.94}},
        "ddtree": {"host": "gpu-d", "bench": bench(260.0), "probe": {"accept_length": 2.82}},
    })
    rows = measure.rows(rep)

    assert [(r["service"], r["host"], r["ratio"], r["accept_length"]) for r in rows] == [
        ("plain", "gpu-c", 1.0, None), ("dflash", "gpu-c", 1.9, 1.94), ("ddtree", "gpu-d", 2.6, 2.82)]
    # The client's own accept_length (cumulative since the server started) is not what the table shows.
    assert all(r["accept_length"] != 9.9 for r in rows)
    text = measure.table(rep)
    lines = text.splitlines()
    assert lines[1].split() == ["service", "host", "out", "tok/s", "req/s", "TTFT", "p50", "TTFT", "p99", "ITL", "p50",
                                "ITL", "p99", "E2E", "p50", "E2E", "p99", "accept", "len", "vs", "plain"]
    assert lines[2].split()[:3] == ["plain", "gpu-c", "100.0"] and lines[2].split()[-2:] == ["-", "1.00"]
    assert lines[4].split()[:3] == ["ddtree", "gpu-d", "260.0"] and lines[4].split()[-2:] == ["2.82", "2.60"]
    assert "8 prompts of 16 random token ids, 32 output tokens each, at most 2 at a time" in lines[0]


def test_a_failed_or_missing_service_is_named_and_the_ratio_keeps_the_first_that_ran(tmp_path):
    rep = report({
        "plain": {"host": "gpu-c", "error": "Traceback ...\nModuleNotFoundError: No module named 'transformers'\n"},
        "dflash": {"host": "gpu-c", "bench": bench(200.0), "probe": {"accept_length": 2.0}},
    }, tmp_path=tmp_path)
    rows = measure.rows(rep)

    assert rows[0]["error"] == "ModuleNotFoundError: No module named 'transformers'" and rows[0]["ratio"] is None
    assert rows[1]["ratio"] == 1.0  # the baseline is the first service that has a figure
    assert rows[2]["error"].startswith("not measured")
    measure.finish(rep)
    raw = json.loads((tmp_path / "m.json").read_text())
    assert raw["services"] == ["plain", "dflash", "ddtree"] and raw["results"]["ddtree"] is None
    assert raw["results"]["dflash"]["bench"]["output_throughput"] == 200.0
    assert raw["options"] == {"prompts": 8, "input_len": 16, "output_len": 32, "concurrency": 2, "probe": 2, "timeout_s": 1800,
                              "tokenizer": None}


def test_options_and_services_from_the_environment():
    assert measure.requested("a, b") == ["a", "b"]
    for bad in (None, "", "a,,b", "a,a"):
        with pytest.raises(ValueError, match="MEASURE_SERVICES"):
            measure.requested(bad)
    assert measure.options_from({"MEASURE_PROMPTS": "16", "MEASURE_PROBE": "0"}) == measure.Options(prompts=16, probe=0)
    with pytest.raises(ValueError, match=r"MEASURE_CONCURRENCY='0': must be a whole number of at least 1"):
        measure.options_from({"MEASURE_CONCURRENCY": "0"})
    args = measure.Options().bench_args(30001, "/tmp/x.jsonl")
    assert args[:8] == ["-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", "http://127.0.0.1:30001",
                        "--dataset-name", "random-ids"]
    assert "--tokenizer" not in args  # the client loads the served model's own


@pytest.mark.parametrize("raw", ["--help", "-h", "/root/tok\n--seed=2", "/root/\x1b[2Jtok", "/root/tok\u2028x"])
def test_a_tokenizer_the_client_would_read_as_options_or_another_line_is_refused(raw):
    with pytest.raises(ValueError, match=r"MEASURE_TOKENIZER=.*must be one line, a path on the service's host or a model name"):
        measure.options_from({"MEASURE_TOKENIZER": raw})


@pytest.mark.parametrize(("key", "raw"), [("MEASURE_PROMPTS", "\u0661\u0666"), ("MEASURE_PROMPTS", "2\u00b2"),
                                          ("MEASURE_PROBE", "-1"), ("MEASURE_INPUT_LEN", "1e3"), ("MEASURE_OUTPUT_LEN", "0x10")])
def test_a_count_that_is_not_ascii_digits_is_refused(key, raw):
    with pytest.raises(ValueError, match=f"{key}=.*must be a whole number"):
        measure.options_from({key: raw})


def test_a_tokenizer_is_passed_to_the_client_as_given():
    options = measure.options_from({"MEASURE_TOKENIZER": " /root/tok dir "})
    assert options == measure.Options(tokenizer="/root/tok dir")
    assert options.bench_args(30001, "/tmp/x.jsonl")[-1] == "--tokenizer=/root/tok dir"
    assert measure.options_from({"MEASURE_TOKENIZER": " "}).tokenizer is None
    assert measure.options_from({"MEASURE_TOKENIZER": "Qwen/Qwen3-8B"}).tokenizer == "Qwen/Qwen3-8B"
    # Runs combined from JSON files written before the option existed keep working.
    raw = {"prompts": 8, "input_len": 16, "output_len": 32, "concurrency": 2, "probe": 2, "timeout_s": 1800}
    assert measure.Options(**raw).tokenizer is None


# The host-side script and the stand-in ---------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def standin(tmp_path):
    """Start the stand-in (from source, its own parser) with the given flags; yield its port."""
    started = []
    target, draft = tmp_path / "target", tmp_path / "draft"
    for folder, config in ((target, {}), (draft, {"dflash_config": {"block_size": 16}})):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))

    def start(*flags: str) -> int:
        port = free_port()
        env = dict(os.environ, PYTHONPATH=str(STANDIN_SRC), STANDIN_PARSER="standin", STANDIN_LOAD_S="0",
                   STANDIN_WARMUP_S="0", STANDIN_STEP_S="0.005")
        flags = [f.replace("@DRAFT@", str(draft)) for f in flags]
        proc = subprocess.Popen([sys.executable, "-m", "sglang_standin.launch_server", "--model-path", str(target),
                                 "--port", str(port), *flags], env=env, stderr=subprocess.DEVNULL)
        started.append(proc)
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                return port
            except OSError:
                time.sleep(0.05)
        raise AssertionError("the stand-in did not answer /health")

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(10)


def generate_seconds(port: int, tokens: int) -> tuple[float, dict]:
    body = {"input_ids": list(range(8)), "sampling_params": {"max_new_tokens": tokens}, "stream": True}
    start = time.monotonic()
    raw = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(body).encode())).read()
    elapsed = time.monotonic() - start
    chunks = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert chunks[-1] == b"[DONE]"
    return elapsed, json.loads(chunks[-2])["meta_info"]


SPEEDS = {
    "plain": (),
    "dflash": ("--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "@DRAFT@"),
    "ddtree-15": ("--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "@DRAFT@", "--speculative-ddtree-budget", "15"),
    "ddtree-31": ("--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "@DRAFT@", "--speculative-ddtree-budget", "31"),
}


def test_the_standins_speed_and_accept_length_follow_its_speculative_flags(standin):
    found = {}
    for name, flags in SPEEDS.items():
        port = standin(*flags)
        found[name] = generate_seconds(port, 96)

    steps = {name: meta.get("spec_verify_ct") for name, (_, meta) in found.items()}
    assert all(meta["completion_tokens"] == 96 for _, meta in found.values())
    # Plain decoding: one token per step, no accept length; DFLASH and DDTREE's spine (budget 15 of a
    # 16-token block) accept 2 per step; a DDTREE tree (budget 31) 3.
    assert steps == {"plain": None, "dflash": 48, "ddtree-15": 48, "ddtree-31": 32}
    assert found["plain"][0] > found["dflash"][0] > found["ddtree-31"][0]


def test_the_host_script_runs_the_client_then_probes_accept_length(standin, tmp_path):
    port = standin(*SPEEDS["ddtree-31"])
    # A stand-in for the client: writes the one JSON line sglang's would, to the --output-file it is given.
    client = ("import json,sys; f=sys.argv[sys.argv.index('--output-file')+1]; "
              "open(f,'w').write(json.dumps({'output_throughput': 123.0, 'accept_length': 7.0, "
              "'server_info': {'api_key': 'sk-secret-value-123456'}})+'\\n')")
    spec = {"service": "ddtree", "port": port, "key_file": None, "probe": 3, "input_len": 8, "output_len": 40,
            "timeout_s": 60, "bench_args": ["-c", client, "--output-file", "@OUT@"]}
    script = base64.b64encode(measure.HOST_SCRIPT.encode()).decode()
    out = subprocess.run([sys.executable, "-c", "import base64,sys; exec(base64.b64decode(sys.argv.pop(1)))", script,
                          json.dumps(spec)], capture_output=True, text=True, timeout=120)
    result = measure.parse_output(out.stdout)

    assert result["bench"]["output_throughput"] == 123.0
    assert result["bench"]["server_info"]["api_key"] == "<set>"
    probe = result["probe"]
    assert [r["completion_tokens"] for r in probe["requests"]] == [40, 40, 40]
    assert probe["verify_ct"] == 3 * 13 and probe["accept_length"] == pytest.approx(120 / 39)


def test_the_command_takes_no_lock_and_restarts_nothing():
    """measure.py imports nothing that locks, reads for a deploy or changes a unit: only the data and the measurement."""
    import ast

    def imports(path: Path) -> set[str]:
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                found |= {f"{node.module}.{a.name}" for a in node.names}
        return found

    assert imports(ROOT / "measure.py") == {"os", "pathlib.Path", "pyinfra.host", "pyinfra.state",
                                            "configuration.settings", "operations.measure"}
    # Of the deploy's own modules only the redaction of what it prints (it locks, reads and changes nothing).
    assert {m for m in imports(ROOT / "operations" / "measure.py") if m.startswith(("operations", "deploys"))} <= {"operations.redact"}


def test_runs_made_one_service_at_a_time_combine_into_one_table(tmp_path, capsys):
    for name, throughput in (("plain", 50.0), ("ddtree31", 150.0)):
        rep = report({name: {"host": "@local", "bench": bench(throughput), "probe": {"accept_length": None}}},
                     services=(name,), tmp_path=tmp_path / name)
        measure.finish(rep)
    combined = measure.combine(tmp_path / "all.json", [tmp_path / "plain" / "m.json", tmp_path / "ddtree31" / "m.json"])

    assert [r["ratio"] for r in measure.rows(combined)] == [1.0, 3.0]
    assert any(line.rstrip().endswith("vs plain") for line in capsys.readouterr().out.splitlines())
    assert json.loads((tmp_path / "all.json").read_text())["services"] == ["plain", "ddtree31"]
