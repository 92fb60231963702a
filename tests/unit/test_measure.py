"""The measurement (measure.py, views/measure.py): its table, ratios and raw JSON, the host-side
script against the lab's stand-in server, and the stand-in's speed following its speculative flags."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from operations import remote
from tests.unit.remote_calls import own_control_group
from tests.unit.test_peer_identity import NOT_HERE, as_root, heard, impostor  # noqa: F401 - fixtures
from views import measure

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
    args = measure.Options().bench_args(30001, "/tmp/x.jsonl", "/dev/shm/Qwen3.6-27B")
    assert args[:8] == ["--backend", "sglang", "--base-url", "http://127.0.0.1:30001",
                        "--model=/dev/shm/Qwen3.6-27B", "--tokenizer=/dev/shm/Qwen3.6-27B", "--dataset-name", "random-ids"]


@pytest.mark.parametrize("raw", ["--help", "-h", "/root/tok\n--seed=2", "/root/\x1b[2Jtok", "/root/tok\u2028x",
                                 # a name the client would look up, relative paths, what a sandbox's bind would misread
                                 "Qwen/Qwen3-8B", "./tok", "tok", "/root/../etc/tok", "/root/tok dir", "/root/a:/b",
                                 "/root/tok%i"])
def test_a_tokenizer_that_is_not_a_plain_absolute_path_is_refused(raw):
    with pytest.raises(ValueError, match=r"MEASURE_TOKENIZER=.*must be an absolute path on the service's host"):
        measure.options_from({"MEASURE_TOKENIZER": raw})


@pytest.mark.parametrize(("key", "raw"), [("MEASURE_PROMPTS", "\u0661\u0666"), ("MEASURE_PROMPTS", "2\u00b2"),
                                          ("MEASURE_PROBE", "-1"), ("MEASURE_INPUT_LEN", "1e3"), ("MEASURE_OUTPUT_LEN", "0x10")])
def test_a_count_that_is_not_ascii_digits_is_refused(key, raw):
    with pytest.raises(ValueError, match=f"{key}=.*must be a whole number"):
        measure.options_from({key: raw})


def test_the_client_gets_the_model_and_tokenizer_paths_and_never_trusts_remote_code():
    """The client is told the model and tokenizer (the staged model's path, or MEASURE_TOKENIZER): it asks the server
    for neither, and nothing passes it a trust-remote-code flag."""
    options = measure.options_from({"MEASURE_TOKENIZER": " /root/tok "})
    assert options == measure.Options(tokenizer="/root/tok")
    args = options.bench_args(30001, "/tmp/x.jsonl", "/root/models/Qwen3.6-27B")
    assert [a for a in args if a.startswith(("--model", "--tokenizer"))] == ["--model=/root/models/Qwen3.6-27B", "--tokenizer=/root/tok"]
    assert not any("trust" in a or "remote" in a for a in args)
    assert measure.options_from({"MEASURE_TOKENIZER": " "}).tokenizer is None
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


# A stand-in for transformers' remote-code gate, as transformers 5.19 has it (dynamic_module_utils), one module that
# bound its names at import (as transformers.models.auto.* do), and a stand-in for the client: it writes the one JSON
# line sglang's would to its --output-file, with what it saw: its environment, argv, and what the gate let through.
FAKE_TRANSFORMERS = {
    "transformers/__init__.py": "from . import early\n",
    "transformers/dynamic_module_utils.py": (
        "def resolve_trust_remote_code(trust_remote_code, model_name, has_local_code, has_remote_code, error_message=None,\n"
        "                              upstream_repo=None):\n"
        "    if has_remote_code and not has_local_code and not trust_remote_code:\n"
        "        raise ValueError(f'The repository {model_name} contains custom code which must be executed')\n"
        "    return trust_remote_code\n"
        "def get_class_from_dynamic_module(class_ref, repo, **kwargs):\n"
        "    return 'REMOTE CODE IMPORTED'\n"),
    "transformers/early.py": "from .dynamic_module_utils import get_class_from_dynamic_module, resolve_trust_remote_code\n",
    "fakeclient.py": (
        "import json, os, sys\n"
        "import transformers.early as early\n"
        "from transformers.dynamic_module_utils import resolve_trust_remote_code as late\n"
        "def outcome(call):\n"
        "    try:\n"
        "        return repr(call())\n"
        "    except ValueError as exc:\n"
        "        return 'refused: ' + str(exc)\n"
        "seen = {'env': dict(os.environ), 'argv': sys.argv[1:], 'uid': os.getuid(),\n"
        "        'early': outcome(lambda: early.resolve_trust_remote_code(True, '/m', False, True)),\n"
        "        'late': outcome(lambda: late(True, '/m', False, True)),\n"
        "        'local': outcome(lambda: late(True, '/m', True, True)),\n"
        "        'import': outcome(lambda: early.get_class_from_dynamic_module('x.Y', '/m'))}\n"
        "f = sys.argv[sys.argv.index('--output-file') + 1]\n"
        "open(f, 'w').write(json.dumps({'output_throughput': 123.0, 'accept_length': 7.0, 'seen': seen,\n"
        "                               'server_info': {'api_key': 'sk-secret-value-123456'}}) + '\\n')\n"),
}
KEY = "measure-test-key-0123456789abcdef"  # a test value


def run_on_this_machine(command: str, venv: str, environ: dict, forced: str = "") -> subprocess.CompletedProcess:
    """The host command without systemd (none here): the words from `env -i` on, as the transient unit runs them;
    `forced` assignments are put past `env -i`, to show that the client's own environment holds without it."""
    words = command.split(" -- /usr/bin/env -i ", 1)
    assert words[0].split("\n")[-1].startswith("systemd-run --wait --pipe --collect --quiet ")
    local = words[0].rsplit("\n", 1)[0] + f"\n/usr/bin/env -i {forced} " + words[1]
    local = local.replace(f"{venv}/bin/python", sys.executable)
    return subprocess.run(["sh", "-c", local], capture_output=True, text=True, timeout=120, env=environ)


def systemctl_naming(tmp_path: Path, control_group: str) -> Path:
    """A directory with a systemctl stand-in that answers `show -p ControlGroup --value` as systemd would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\necho {control_group}\n")
    (bin_dir / "systemctl").chmod(0o755)
    return bin_dir


def test_the_host_script_runs_the_client_then_probes_accept_length(standin, tmp_path):
    port = standin(*SPEEDS["ddtree-31"])
    fake = tmp_path / "fake"
    for rel, text in FAKE_TRANSFORMERS.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(text)
    key_file = tmp_path / "ddtree.yml"
    key_file.write_text(f'api-key: "{KEY}"\n')
    options = measure.Options(prompts=2, input_len=8, output_len=40, probe=3, timeout_s=60)
    spec = {"service": "ddtree", "port": port, "key_file": str(key_file), "probe": 3, "input_len": 8, "output_len": 40,
            "timeout_s": 60, "client_module": "fakeclient", "client_env": measure.CLIENT_FIXED_ENV,
            # -I keeps PYTHONPATH out: the fake transformers and client are put on sys.path by the test, then the shim.
            "client_shim": f"import sys; sys.path.insert(0, {str(fake)!r})\n" + measure.CLIENT_SHIM,
            "bench_args": options.bench_args(port, "@OUT@", "/dev/shm/Qwen3.6-27B"),
            "unit": "sglang-ddtree.service", "peer_guard": remote.script("peer_guard")}
    command = measure.host_command("/root/venv_sglang", spec, ["User=sglang", "Group=sglang", "PrivateTmp=yes"])
    # What a service's env data or root's session could hold: none of it reaches the client.
    environ = {**os.environ, "PATH": f"{systemctl_naming(tmp_path, own_control_group())}:{os.environ['PATH']}",
               "OPENSSL_CONF": "/var/lib/sglang/openssl.cnf", "GCONV_PATH": "/var/lib/sglang", "LANG": "C",
               "PYTHONPATH": str(tmp_path / "nowhere"), "HF_HOME": "/var/lib/sglang/hf"}
    # And past `env -i` (the transient run's environment): the client's is built whole, so none reaches it either.
    out = run_on_this_machine(command, "/root/venv_sglang", environ, forced="OPENSSL_CONF=/var/lib/sglang/openssl.cnf LOCPATH=/x")
    result = measure.parse_output(out.stdout)

    assert result is not None, out.stdout + out.stderr
    assert result["bench"]["output_throughput"] == 123.0
    assert result["bench"]["server_info"]["api_key"] == "<set>"
    seen = result["bench"]["seen"]
    # The client's environment is the allow list, the key read from the key file by the run itself.
    assert set(seen["env"]) == set(measure.CLIENT_ENV), seen["env"]
    assert seen["env"]["OPENAI_API_KEY"] == "<redacted>" and KEY not in out.stdout
    assert seen["env"]["HF_HUB_OFFLINE"] == "1" and seen["env"]["HOME"].startswith("/tmp/sglang-measure-")
    # The model and tokenizer are named; remote code is refused, wherever the gate was bound, and never imported.
    assert "--model=/dev/shm/Qwen3.6-27B" in seen["argv"] and "--tokenizer=/dev/shm/Qwen3.6-27B" in seen["argv"]
    assert seen["early"].startswith("refused: ") and seen["late"].startswith("refused: ") and seen["local"] == "False"
    assert seen["import"].startswith("refused: ") and "trust_remote_code is off" in seen["import"]
    assert result["ran_as"]["uid"] == os.getuid()
    probe = result["probe"]
    assert [r["completion_tokens"] for r in probe["requests"]] == [40, 40, 40]
    assert probe["verify_ct"] == 3 * 13 and probe["accept_length"] == pytest.approx(120 / 39)


KEY_CLIENT = (
    "import os, sys, urllib.request\n"
    "base = next(a for a in sys.argv if a.startswith('http://'))\n"
    "req = urllib.request.Request(base + '/v1/models', headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n"
    "print(urllib.request.urlopen(req, timeout=10).status)\n")


@as_root
def test_a_run_whose_connection_reaches_another_holder_stops_there_and_says_so(impostor, tmp_path):  # noqa: F811
    """The engine died and another local user holds its port when the client connects: the client's first
    connection is refused before its first byte, the client stops, no probe is sent, and the result names the holder
    (operations/transport/on_host/peer_guard.py). Seen failing without the guard: the impostor printed the key."""
    port, proc = impostor
    fake = tmp_path / "fake"
    for rel, text in {**FAKE_TRANSFORMERS, "keyclient.py": KEY_CLIENT}.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(text)
    key_file = tmp_path / "x.yml"
    key_file.write_text(f'api-key: "{KEY}"\n')
    spec = {"service": "x", "port": port, "key_file": str(key_file), "probe": 2, "input_len": 8, "output_len": 8,
            "timeout_s": 60, "client_module": "keyclient", "client_env": measure.CLIENT_FIXED_ENV,
            "client_shim": f"import sys; sys.path.insert(0, {str(fake)!r})\n" + measure.CLIENT_SHIM,
            "bench_args": measure.Options().bench_args(port, "@OUT@", "/m"),
            "unit": "sglang-x.service", "peer_guard": remote.script("peer_guard")}
    command = measure.host_command("/root/venv_sglang", spec, ["User=sglang"])
    environ = {**os.environ, "PATH": f"{systemctl_naming(tmp_path, NOT_HERE)}:{os.environ['PATH']}"}
    out = run_on_this_machine(command, "/root/venv_sglang", environ)
    result = measure.parse_output(out.stdout)
    assert result is not None, out.stdout + out.stderr
    assert result["rc"] == 75 and result["refused"].startswith(f"port {port} is held by uid 65534 (nobody)"), result
    assert result["probe"]["requests"] == [] and "bench" not in result
    assert heard(proc) == ""


def test_the_client_runs_as_the_service_user_in_the_services_sandbox():
    """The host command's one engine-side step is a transient unit with the unit's own sandbox, as its user; a
    tokenizer under a hidden home directory is bound in read-only; the run's environment is only PATH."""
    import shlex

    from operations.service import units
    from tests.unit.test_units import lab_config, render

    config = lab_config()
    service = config.services[0]
    sandbox = measure.client_sandbox(units.service_sandbox(config, service), "/root/tok")
    assert sandbox[:-1] == units.sandbox_properties(render(config)) and sandbox[-1] == "BindReadOnlyPaths=-/root/tok"
    assert measure.client_sandbox(["User=sglang"], "/srv/tok") == ["User=sglang"]
    spec = {"service": "ddtree", "port": 30000, "key_file": None, "unit": "sglang-ddtree.service"}
    command = measure.host_command(service.environment.path, spec, sandbox)
    lines = command.splitlines()
    assert lines[0] == "cd / || exit 1"
    # The unit's control group, systemd's word for it, is the run's argv[2]: what every connection is checked against.
    assert lines[1] == "unit_cgroup=$(systemctl show -p ControlGroup --value sglang-ddtree.service 2>/dev/null)"
    words = shlex.split(lines[2].split("<<")[0])
    assert words[:5] == ["systemd-run", "--wait", "--pipe", "--collect", "--quiet"]
    properties = [words[i + 1] for i, w in enumerate(words) if w == "-p"]
    # The client's timeout (default 1800 s) and a margin: systemd stops a run whose caller went away.
    assert properties == [*sandbox, "RuntimeMaxSec=1920"] and "User=sglang" in properties and "Group=sglang" in properties
    rest = words[words.index("--") + 1:]
    assert rest == ["/usr/bin/env", "-i", f"PATH={measure.transient.SYSTEM_PATH}", f"{service.environment.path}/bin/python",
                    "-I", "-", json.dumps(spec), "$unit_cgroup"]


def test_checks_of_roots_run_before_and_after_the_client_and_a_failed_one_fails_the_line(tmp_path):
    """Where a check of the port's listener goes: before the client and after it, outside the sandbox."""
    spec = {"service": "x", "port": 1, "key_file": None}

    def line(before, after, client_rc=0):
        command = measure.host_command("/v", spec, ["User=nobody"], before, after)
        # No systemd here: the transient run is replaced by a shell that says it ran and exits with client_rc.
        head, tail = command.split("systemd-run ", 1)
        tail = tail.split("\nPYEOF\n", 1)[1]
        return subprocess.run(["sh", "-c", f"{head}(echo client; exit {client_rc})\n{tail}"], capture_output=True, text=True)

    ran = line(("echo before",), ("echo after",))
    assert ran.returncode == 0 and ran.stdout.split() == ["before", "client", "after"]
    assert line(("false",), ()).returncode == 96 and "client" not in line(("false",), ()).stdout
    assert line((), ("false",)).returncode == 97
    assert line((), ("echo after",), client_rc=3).returncode == 3


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
                                            "deploys.run.HostRun", "views.measure"}
    # Of the run's machinery (deploys/run.py) the validated data only: not a deploy's lock and read, nor a view's read.
    called = {node.func.attr for node in ast.walk(ast.parse((ROOT / "measure.py").read_text()))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert "of" in called and not called & {"deploying", "observing"}, called
    # Of the deploy's own modules only the redaction of what it prints, the unit's rendering (the sandbox the client
    # runs in), the transient run's command line, where a home directory hides a path, the remote scripts (the
    # read-only check of the port's holder): none locks, reads for a deploy or changes.
    assert {m for m in imports(ROOT / "views" / "measure.py") if m.startswith(("operations", "deploys"))} <= {
        "operations.run.redact", "operations.service.units", "operations.environment.transient", "operations.service.service_user", "operations.remote",
        "operations.run.remote_call"}


def test_runs_made_one_service_at_a_time_combine_into_one_table(tmp_path, capsys):
    for name, throughput in (("plain", 50.0), ("ddtree31", 150.0)):
        rep = report({name: {"host": "@local", "bench": bench(throughput), "probe": {"accept_length": None}}},
                     services=(name,), tmp_path=tmp_path / name)
        measure.finish(rep)
    combined = measure.combine(tmp_path / "all.json", [tmp_path / "plain" / "m.json", tmp_path / "ddtree31" / "m.json"])

    assert [r["ratio"] for r in measure.rows(combined)] == [1.0, 3.0]
    assert any(line.rstrip().endswith("vs plain") for line in capsys.readouterr().out.splitlines())
    assert json.loads((tmp_path / "all.json").read_text())["services"] == ["plain", "ddtree31"]


@pytest.mark.parametrize(("args", "said"), [
    ({}, "none"),
    ({"speculative-algorithm": "DFLASH", "speculative-dflash-block-size": 16}, "DFLASH (block 16)"),
    # The operator's tuning claim: budget 15 with a 16-token block builds no tree in either public implementation.
    ({"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 15, "speculative-dflash-block-size": 16},
     "DDTREE spine (budget 15 <= block 16 - 1: a chain, as DFLASH)"),
    ({"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 16, "speculative-dflash-block-size": 16},
     "DDTREE tree (budget 16 > block 16 - 1)"),
    ({"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 31, "speculative-num-draft-tokens": 16},
     "DDTREE tree (budget 31 > block 16 - 1)"),
    ({"speculative-algorithm": "DDTREE", "speculative-dflash-block-size": 16},
     "DDTREE spine (no budget: block size - 1, a chain as DFLASH, block 16)"),
])
def test_the_table_says_whether_a_ddtree_service_built_a_tree_or_ran_the_spine(args, said):
    assert measure.drafting(args) == said


def test_the_drafting_line_is_in_the_table_and_the_json():
    report = measure.Report(["ddtree15"], measure.Options(), Path("unused.json"))
    report.results["ddtree15"] = {"host": "h", "bench": {"output_throughput": 10.0}, "drafting": measure.drafting(
        {"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 15, "speculative-dflash-block-size": 16})}
    assert "ddtree15 drafts with DDTREE spine (budget 15 <= block 16 - 1" in measure.table(report)
    assert json.loads(measure.raw_json(report))["table"][0]["drafting"].startswith("DDTREE spine")


def test_a_service_name_measures_every_replica_and_host_slash_replica_one():
    from types import SimpleNamespace as NS

    def cfg(*names):
        return NS(services=tuple(NS(name=n, definition=n.split("@")[0]) for n in names))

    configs = {"gpu-a": cfg("rep", "one"), "gpu-b": cfg("rep"), "gpu-c": cfg("rep", "rep@2")}
    assert measure.replicas(["one", "rep"], configs) == [
        ("one", "gpu-a", "one"), ("gpu-a/rep", "gpu-a", "rep"), ("gpu-b/rep", "gpu-b", "rep"), ("gpu-c/rep", "gpu-c", "rep"),
        ("gpu-c/rep@2", "gpu-c", "rep@2")]
    assert measure.replicas(["gpu-c/rep@2", "one"], configs) == [("gpu-c/rep@2", "gpu-c", "rep@2"), ("one", "gpu-a", "one")]
    assert measure.replicas(["nowhere"], configs) == [("nowhere", "", "nowhere")]
    with pytest.raises(ValueError, match="is no replica of this inventory"):
        measure.replicas(["gpu-b/rep@2"], configs)
