"""Tests of the sglang stand-in (lab/standin): wheel build, install, CLI and HTTP behaviour.

No network, no root. The server tests install the wheel into a temporary venv and run
``python -m sglang_standin.launch_server`` from it, as the lab hosts do.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STANDIN_DIR = ROOT / "lab" / "standin"
WHEEL_NAME = "sglang_standin-0.1.6-py3-none-any.whl"
BANNER = "sglang-standin 0.1.6 (a stand-in for sglang.launch_server, no GPU, no model weights loaded)"

# Direct opener: never route loopback test traffic through an http_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _load_build():
    spec = importlib.util.spec_from_file_location("standin_build", STANDIN_DIR / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build = _load_build()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env(**extra) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STANDIN_", "SGLANG_", "FLASHINFER_", "CUDA_VISIBLE_DEVICES", "PYTHON"))
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INDEX"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _http(method: str, url: str, body=None, timeout: float = 2.0):
    """(status, body bytes), or (None, reason) when the connection fails."""
    data = None
    headers = {}
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, socket.timeout) as e:
        return None, str(e)


# ---------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build.build_wheel(tmp_path_factory.mktemp("wheel-a"))


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory, wheel) -> Path:
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=_clean_env(), timeout=120)
    py = venv / "bin" / "python"
    r = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)],
        capture_output=True, text=True, env=_clean_env(), timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return py


@pytest.fixture
def model_dir(tmp_path) -> Path:
    d = tmp_path / "Qwen-fake"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["FakeForCausalLM"]}))
    return d


def _run(py: Path, args: list, env: dict, cwd, timeout: float = 15) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(py), "-m", "sglang_standin.launch_server", *map(str, args)],
        capture_output=True, text=True, env=env, cwd=str(cwd), timeout=timeout,
    )


# ---------------------------------------------------------------------------
# wheel
# ---------------------------------------------------------------------------


def test_wheel_is_deterministic_and_well_formed(tmp_path, wheel):
    again = build.build_wheel(tmp_path / "b")
    assert wheel.name == again.name == WHEEL_NAME
    assert _sha256(wheel) == _sha256(again)
    assert wheel.read_bytes() == again.read_bytes()

    with zipfile.ZipFile(wheel) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        assert "sglang_standin/__init__.py" in names
        assert "sglang_standin/launch_server.py" in names
        assert names[-1] == "sglang_standin-0.1.6.dist-info/RECORD"
        assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
        for i in infos:
            assert i.date_time == (1980, 1, 1, 0, 0, 0)
            assert (i.external_attr >> 16) == 0o100644

        meta = zf.read("sglang_standin-0.1.6.dist-info/METADATA").decode()
        head = meta.split("\n\n", 1)[0].splitlines()
        assert "Metadata-Version: 2.1" in head
        assert "Name: sglang-standin" in head
        assert "Version: 0.1.6" in head
        summary = [line_ for line_ in head if line_.startswith("Summary: ")]
        assert summary and "stand-in" in summary[0]

        wheel_meta = zf.read("sglang_standin-0.1.6.dist-info/WHEEL").decode().splitlines()
        assert "Wheel-Version: 1.0" in wheel_meta
        assert "Root-Is-Purelib: true" in wheel_meta
        assert "Tag: py3-none-any" in wheel_meta
        assert any(line_.startswith("Generator: ") for line_ in wheel_meta)

        rows = list(csv.reader(io.StringIO(zf.read("sglang_standin-0.1.6.dist-info/RECORD").decode())))
        recorded = {r[0] for r in rows}
        assert recorded == set(names)
        for path, digest, size in rows:
            if path.endswith("/RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = zf.read(path)
            expect = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == "sha256=" + expect, path
            assert int(size) == len(data), path


def test_build_cli_prints_path_and_sha256(tmp_path, wheel):
    r = subprocess.run(
        [sys.executable, str(STANDIN_DIR / "build.py"), str(tmp_path / "out")],
        capture_output=True, text=True, env=_clean_env(), timeout=30,
    )
    assert r.returncode == 0, r.stderr
    digest, path = r.stdout.strip().split("  ", 1)
    assert Path(path) == tmp_path / "out" / WHEEL_NAME
    assert digest == _sha256(Path(path)) == _sha256(wheel)


# ---------------------------------------------------------------------------
# argument parsing (in process, stand-in parser)
# ---------------------------------------------------------------------------


def test_parse_args_standin_parser(monkeypatch):
    monkeypatch.syspath_prepend(str(STANDIN_DIR))
    from sglang_standin import launch_server as ls

    a = ls.parse_args(
        [
            "--model-path", "/dev/shm/M", "--port", "30001",
            "--speculative-algorithm", "DFLASH", "--speculative-dflash-block-size", "16",
            "--attention-backend=triton", "--trust-remote-code",
            "--cuda-graph-bs", "1", "2", "4", "--some-offset", "-1",
        ],
        use_sglang=False,
    )
    assert a["model_path"] == "/dev/shm/M"
    assert a["port"] == 30001 and a["host"] == "127.0.0.1"
    assert a["speculative_algorithm"] == "DFLASH"
    assert a["speculative_dflash_block_size"] == "16"
    assert a["attention_backend"] == "triton"
    assert a["trust_remote_code"] is True
    assert a["cuda_graph_bs"] == ["1", "2", "4"]
    assert a["some_offset"] == "-1"
    assert a["served_model_name"] == "/dev/shm/M"

    d = ls.parse_args(["--model-path", "m"], use_sglang=False)
    assert d["port"] == 30000 and d["host"] == "127.0.0.1"

    with pytest.raises(ls.ArgsError, match="model-path"):
        ls.parse_args(["--port", "1"], use_sglang=False)
    with pytest.raises(ls.ArgsError, match="unrecognized"):
        ls.parse_args(["stray", "--model-path", "m"], use_sglang=False)


# ---------------------------------------------------------------------------
# the server, from the installed wheel
# ---------------------------------------------------------------------------

SERVER_FLAGS = ["--speculative-algorithm", "DFLASH", "--attention-backend", "triton", "--grammar-backend", "none"]


def test_server_readiness_endpoints_and_sigterm(venv_python, model_dir, tmp_path):
    port = _free_port()
    base = "http://127.0.0.1:%d" % port
    env = _clean_env(
        STANDIN_WARMUP_S="1", STANDIN_LOAD_S="0.2",
        SGLANG_STANDIN_TEST_MARKER="unit-env-reached", CUDA_VISIBLE_DEVICES="3",
        FLASHINFER_CUDA_ARCH_LIST="12.0a", UNRELATED_VAR="x",
    )
    log_path = tmp_path / "stderr.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(venv_python), "-m", "sglang_standin.launch_server", "--model-path", str(model_dir),
             "--port", str(port), *SERVER_FLAGS],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(tmp_path),
        )
    try:
        states = []
        warmup_checked = False
        port_open_t = ready_t = None
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            code, _ = _http("GET", base + "/health", timeout=1)
            now = time.monotonic()
            if not states or states[-1] != code:
                states.append(code)
            if code is not None and port_open_t is None:
                port_open_t = now
            if code == 503 and not warmup_checked:
                # during warm-up: /v1/models answers, chat is refused
                mc, mb = _http("GET", base + "/v1/models")
                assert mc == 200
                cc, cb = _http("POST", base + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
                assert cc == 503, cb
                hc, hb = _http("GET", base + "/health_generate")
                assert hc == 503 and json.loads(hb) == {"status": "warming up"}
                warmup_checked = True
            if code == 200:
                ready_t = now
                break
            assert proc.poll() is None, log_path.read_text()
            time.sleep(0.05)
        assert states == [None, 503, 200], (states, log_path.read_text())
        assert warmup_checked
        assert ready_t - port_open_t >= 0.7  # STANDIN_WARMUP_S=1 after the port opened

        assert _http("GET", base + "/health_generate")[0] == 200

        code, body = _http("GET", base + "/v1/models")
        assert code == 200
        models = json.loads(body)
        assert models["object"] == "list"
        m = models["data"][0]
        assert m["id"] == str(model_dir) and m["root"] == str(model_dir)
        assert m["object"] == "model" and m["owned_by"] == "sglang-standin"

        for path in ("/server_info", "/get_server_info"):
            code, body = _http("GET", base + path)
            assert code == 200
            info = json.loads(body)
            assert info["model_path"] == str(model_dir)
            assert info["port"] == port
            assert info["speculative_algorithm"] == "DFLASH"
            assert info["attention_backend"] == "triton"
            assert info["grammar_backend"] == "none"
            assert info["version"] == "0.1.6-standin"
            assert info["standin"] is True
            assert info["parser"] == "standin-argparse"
            assert info["env"] == {
                "CUDA_VISIBLE_DEVICES": "3",
                "FLASHINFER_CUDA_ARCH_LIST": "12.0a",
                "SGLANG_STANDIN_TEST_MARKER": "unit-env-reached",
            }

        req = {"model": "default", "messages": [{"role": "system", "content": "be brief"},
                                                {"role": "user", "content": "hello world"}]}
        c1, b1 = _http("POST", base + "/v1/chat/completions", req)
        c2, b2 = _http("POST", base + "/v1/chat/completions", req)
        assert c1 == c2 == 200
        r1, r2 = json.loads(b1), json.loads(b2)
        assert r1["object"] == "chat.completion"
        assert r1["id"] == r2["id"] and r1["id"].startswith("chatcmpl-")
        content = r1["choices"][0]["message"]["content"]
        assert content == r2["choices"][0]["message"]["content"]
        assert content.startswith("standin reply: ") and "dlrow olleh" in content
        assert r1["choices"][0]["message"]["role"] == "assistant"
        assert r1["usage"]["total_tokens"] == r1["usage"]["prompt_tokens"] + r1["usage"]["completion_tokens"]
        other = json.loads(_http("POST", base + "/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "another"}]})[1])
        assert other["id"] != r1["id"] and other["choices"][0]["message"]["content"] != content

        assert _http("POST", base + "/v1/chat/completions", b"{not json")[0] == 400
        assert _http("POST", base + "/v1/chat/completions", {"prompt": "x"})[0] == 400
        assert _http("GET", base + "/nope")[0] == 404

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = log_path.read_text()
    assert BANNER in log
    assert "speculative_algorithm" in log and "DFLASH" in log
    assert '"GET /health HTTP/1.1" 503' in log and '"GET /health HTTP/1.1" 200' in log
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in log
    assert "SIGTERM" in log
    assert "Traceback" not in log


def test_never_ready_keeps_health_503(venv_python, model_dir, tmp_path):
    port = _free_port()
    env = _clean_env(STANDIN_WARMUP_S="0", STANDIN_LOAD_S="0", STANDIN_NEVER_READY="1")
    proc = subprocess.Popen(
        [str(venv_python), "-m", "sglang_standin.launch_server", "--model-path", str(model_dir), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=str(tmp_path),
    )
    try:
        seen = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len([s for s in seen if s == 503]) < 3:
            code, _ = _http("GET", "http://127.0.0.1:%d/health" % port, timeout=1)
            seen.append(code)
            time.sleep(0.1)
        assert 200 not in seen and seen.count(503) >= 3, seen
    finally:
        proc.terminate()
        assert proc.wait(timeout=5) == 0


def _started(venv_python, model_dir, tmp_path, **env):
    """A stand-in on a free port, its log file, and its base URL, once /health answers 200."""
    port = _free_port()
    base = "http://127.0.0.1:%d" % port
    log_path = tmp_path / "stderr.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(venv_python), "-m", "sglang_standin.launch_server", "--model-path", str(model_dir),
             "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path),
            env=_clean_env(STANDIN_WARMUP_S="0", STANDIN_LOAD_S="0", **env),
        )
    deadline = time.monotonic() + 8
    while _http("GET", base + "/health", timeout=1)[0] != 200:
        assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text()
        time.sleep(0.05)
    return proc, base, log_path


def test_ready_answers_200_when_serving_and_404_without_it(venv_python, model_dir, tmp_path):
    """/ready as sglang 0.5.23 serves it (no key needed), and STANDIN_NO_READY=1: an engine without it."""
    for no_ready, expected in (("", 200), ("1", 404)):
        proc, base, log_path = _started(venv_python, model_dir, tmp_path, STANDIN_NO_READY=no_ready)
        try:
            assert _http("GET", base + "/ready")[0] == expected, log_path.read_text()
            assert _http("GET", base + "/health")[0] == 200
        finally:
            proc.terminate()
            assert proc.wait(timeout=5) == 0


def test_sigterm_drains_the_generation_in_flight_then_exits(venv_python, model_dir, tmp_path):
    """A SIGTERM while a generation runs: /ready and /health answer 503 at once, a new request is refused, the one in
    flight completes with all its tokens, and only then does the process exit (status 0). Seen failing before the
    drain: the process exited at once and the generation's connection was cut."""
    import threading

    proc, base, log_path = _started(venv_python, model_dir, tmp_path, STANDIN_STEP_S="0.02",
                                    STANDIN_DRAIN_POLL_S="0.02")
    answer = {}

    def generate():
        answer["result"] = _http("POST", base + "/generate",
                                 {"text": "alpha beta", "sampling_params": {"max_new_tokens": 100}}, timeout=30)

    try:
        worker = threading.Thread(target=generate)
        worker.start()
        time.sleep(0.5)  # about a quarter of its 100 steps of 0.02 s
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert proc.poll() is None, "it exited with a generation in flight"
        assert _http("GET", base + "/ready")[0] == 503
        assert _http("GET", base + "/health")[0] == 503
        refused = _http("POST", base + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1}})
        assert refused[0] == 503 and b"draining" in refused[1], refused
        worker.join(timeout=30)
        code, body = answer["result"]
        assert code == 200, (code, body)
        assert len(json.loads(body)["output_ids"]) == 100
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = log_path.read_text()
    assert "received SIGTERM: draining (1 request(s) in flight" in log and "drained" in log, log
    assert "Traceback" not in log


def test_crash_at_start_exits_nonzero(venv_python, model_dir, tmp_path):
    r = _run(venv_python, ["--model-path", model_dir, "--port", _free_port()],
             _clean_env(STANDIN_CRASH_AT_START="1"), tmp_path)
    assert r.returncode == 1
    assert "STANDIN_CRASH_AT_START" in r.stderr and "error" in r.stderr
    assert "Traceback" not in r.stderr


def test_it_logs_its_server_args_with_the_keys_in_the_clear_as_the_real_server_does(venv_python, model_dir, tmp_path):
    """sgl-project/sglang#37457: the real server logs `server_args=ServerArgs(...)`, keys included, before it
    loads anything; so does the stand-in, so that a lab test can see a deploy that prints its journal leak it."""
    key = "unit-standin-key-41c7e0b2"  # a test value
    r = _run(venv_python, ["--model-path", model_dir, "--port", _free_port(), "--api-key", key],
             _clean_env(STANDIN_CRASH_AT_START="1", STANDIN_PARSER="standin"), tmp_path)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    args_at = next(i for i, line in enumerate(lines) if "server_args=ServerArgs(" in line)
    crash_at = next(i for i, line in enumerate(lines) if "STANDIN_CRASH_AT_START" in line)
    assert f"api_key={key!r}" in lines[args_at] and f"model_path={str(model_dir)!r}" in lines[args_at]
    assert args_at < crash_at  # logged before anything can fail, as the real server does


def test_missing_model_dir_names_the_path(venv_python, tmp_path):
    missing = tmp_path / "no-such-model"
    r = _run(venv_python, ["--model-path", missing, "--port", _free_port()], _clean_env(), tmp_path)
    assert r.returncode != 0
    assert str(missing) in r.stderr
    assert "Traceback" not in r.stderr


def test_model_dir_without_config_and_missing_draft(venv_python, model_dir, tmp_path):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    r = _run(venv_python, ["--model-path", empty], _clean_env(), tmp_path)
    assert r.returncode == 1 and str(empty) in r.stderr and "config.json" in r.stderr

    draft = tmp_path / "no-draft"
    r = _run(venv_python, ["--model-path", model_dir, "--speculative-algorithm", "DFLASH",
                           "--speculative-draft-model-path", draft], _clean_env(), tmp_path)
    assert r.returncode == 1 and str(draft) in r.stderr and "speculative-draft-model-path" in r.stderr


def test_missing_model_path_flag_is_a_usage_error(venv_python, tmp_path):
    r = _run(venv_python, ["--port", "30000"], _clean_env(), tmp_path)
    assert r.returncode == 2
    assert "--model-path" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------
# when sglang is importable, its own parser decides (a minimal fake sglang here)
# ---------------------------------------------------------------------------

FAKE_SERVER_ARGS = '''
import argparse, dataclasses

@dataclasses.dataclass
class ServerArgs:
    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    served_model_name: str = None
    speculative_algorithm: str = None
    speculative_draft_model_path: str = None
    attention_backend: str = None
    grammar_backend: str = None

    def __post_init__(self):
        if self.served_model_name is None:
            self.served_model_name = self.model_path
        if self.speculative_algorithm == "DFLASH" and not self.speculative_draft_model_path:
            raise ValueError("DFLASH requires --speculative-draft-model-path")

def prepare_server_args(argv):
    p = argparse.ArgumentParser()
    for f in dataclasses.fields(ServerArgs):
        p.add_argument("--" + f.name.replace("_", "-"), type=int if f.name == "port" else str,
                       required=f.name == "model_path")
    return ServerArgs(**{k: v for k, v in vars(p.parse_args(argv)).items() if v is not None})
'''


@pytest.fixture
def fake_sglang(tmp_path) -> Path:
    root = tmp_path / "fake_site"
    pkg = root / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text('__version__ = "0.5.23.fake"\n')
    (pkg / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text(textwrap.dedent(FAKE_SERVER_ARGS))
    return root


def test_sglang_parser_is_used_when_importable(venv_python, model_dir, tmp_path, fake_sglang):
    env = _clean_env(PYTHONPATH=fake_sglang)
    code = (
        "import json, sys; from sglang_standin.launch_server import parse_args_with_parser as p; "
        "a, label = p(sys.argv[1:]); print(json.dumps({'args': a, 'parser': label}))"
    )
    r = subprocess.run(
        [str(venv_python), "-c", code, "--model-path", str(model_dir), "--attention-backend", "triton",
         "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(model_dir)],
        capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=15,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["parser"] == "sglang 0.5.23.fake"
    assert out["args"]["attention_backend"] == "triton"
    assert out["args"]["port"] == 30000 and out["args"]["served_model_name"] == str(model_dir)

    # a stale flag: the parser's own message, exit 2, no traceback
    r = _run(venv_python, ["--model-path", model_dir, "--mamba-scheduler-strategy", "extra_buffer"], env, tmp_path)
    assert r.returncode == 2
    assert "unrecognized arguments: --mamba-scheduler-strategy extra_buffer" in r.stderr
    assert "Traceback" not in r.stderr

    # a validation error raised by ServerArgs: message, exit 2, no traceback
    r = _run(venv_python, ["--model-path", model_dir, "--speculative-algorithm", "DFLASH"], env, tmp_path)
    assert r.returncode == 2
    assert "DFLASH requires --speculative-draft-model-path" in r.stderr
    assert "Traceback" not in r.stderr


def test_broken_sglang_install_fails_like_the_real_server(venv_python, model_dir, tmp_path, fake_sglang):
    (fake_sglang / "sglang" / "srt" / "server_args.py").write_text("import flashinfer_mm_mxfp8_missing\n")
    r = _run(venv_python, ["--model-path", model_dir], _clean_env(PYTHONPATH=fake_sglang), tmp_path)
    assert r.returncode == 1
    assert "sglang.srt.server_args failed to import" in r.stderr and "flashinfer_mm_mxfp8_missing" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_cold_start_compiles_into_the_cache_and_the_next_start_is_warm(venv_python, model_dir, tmp_path):
    """The stand-in's start as a GPU engine's: STANDIN_COMPILE_S where $TRITON_CACHE_DIR lacks its kernels, none
    where they are there; /server_info says which."""
    cache = tmp_path / "kernels" / "triton"
    states = []
    for _ in range(2):
        started = time.monotonic()
        proc, base, log_path = _started(venv_python, model_dir, tmp_path, TRITON_CACHE_DIR=str(cache),
                                        STANDIN_COMPILE_S="1.0")
        try:
            took = time.monotonic() - started
            info = json.loads(_http("GET", base + "/server_info")[1])
            states.append((info["kernel_cache"]["state"], took))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    (cold, cold_s), (warm, _) = states
    assert (cold, warm) == ("cold", "warm")
    assert cold_s >= 1.0  # it compiled (a lower bound only: a warm start's time is the machine's)
    assert len(list((cache / "standin").glob("*.kernels"))) == 1
