"""measure.py on the lab: sglang's own benchmark client, run from each service's venv on its host, side by side.

HOST (LAB_MEASURE_HOST, default the spare host) runs two services on the stack that holds the client's own
dependencies (`files/stacks/lab-cpu-sglang-bench.yml`): `plain` (no speculative decoding: the stand-in gives one
token per step) and `dflash` (DFLASH: two tokens per step, `lab/standin/sglang_standin/bench_endpoints.py`). The
lab's stand-in models carry no vocabulary, so the client is given a tiny word-level tokenizer, built on the host
with the venv's own `tokenizers` (`lab/standin/tokenizer.py`, MEASURE_TOKENIZER). The module deploys once, then
runs `measure.py` through pyinfra as docs/measure.md says, with another control machine's deploy lock held on the
host all along:

- both rows in the printed table, `dflash` faster than `plain` and its ratio to `plain` the one the raw results
  give; the accept length shown is the probe requests' own (2.00), not the client's server-wide figure;
- the JSON file holds the client's raw results, the options and the probes;
- nothing restarted (units' MainPID, ActiveEnterTimestamp and NRestarts), the foreign lock untouched and not
  waited for;
- the client ran as the service user (`ran_as`: a transient unit in the service's sandbox, not root), and a
  tokenizer directory that is remote code (tokenizer_config.json's auto_map) is refused with transformers' own
  message, its Python never run (sglang's client passes trust_remote_code=True; the deploy turns it off).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lab.labutil import (
    PYINFRA,
    ROOT,
    SPARE,
    clean_host,
    deploy,
    impostor_source,
    ssh,
    write_inventory,
)

pytestmark = pytest.mark.lab

HOST = os.environ.get("LAB_MEASURE_HOST", SPARE)
STACK = "lab-cpu-sglang-bench"
VENV = "/root/venv_sglang"
TOKENIZER = "/root/measure-tokenizer"
STEP_S = "0.02"  # the stand-in's seconds per forward step: long enough that the sleeps, not the CPU, set the pace
SERVICES = {
    "plain": {"gpu": 0, "port": 30620, "model": "Qwen3.6-27B", "model_in": "store", "env": {"STANDIN_STEP_S": STEP_S}},
    "dflash": {"gpu": 1, "port": 30621, "model": "Qwen3.6-27B", "model_in": "store", "draft_model": "Qwen3.6-27B-DFlash",
               "draft_in": "store", "env": {"STANDIN_STEP_S": STEP_S}, "api_key_secret": "measure-key",
               "args": {"speculative-algorithm": "DFLASH", "speculative-dflash-block-size": 16}},
}
KEY = "lab-measure-key-2c9e41"  # a test value: dflash's API key, which the client reads on the host and sends
SECRETS = {"SGLANG_DEPLOY_SECRET_MEASURE_KEY": KEY}
UNITS = {name: f"sglang-{name}.service" for name in SERVICES}
OPTIONS = {"MEASURE_PROMPTS": "8", "MEASURE_INPUT_LEN": "32", "MEASURE_OUTPUT_LEN": "32", "MEASURE_CONCURRENCY": "4",
           "MEASURE_PROBE": "2", "MEASURE_TIMEOUT_S": "300", "MEASURE_TOKENIZER": TOKENIZER}
# Another control machine's deploy lock, as tests/lab/test_lock.py makes it: measure.py must neither wait for it
# nor touch it (with lock_wait_s 2, a run that took locks would fail this host within seconds).
HOLDER = '{"id": "by-hand", "who": "ops@ctl-2", "control": "ctl-2", "pid": 4242, "since": "2026-12-01 01:00:00 UTC"}'
LOCK = "/run/sglang-deploy.lock"
# Builds DIR/tokenizer.json with the venv's own `tokenizers` (run as `python -c SCRIPT DIR` on the host).
BUILD_TOKENIZER = (ROOT / "lab" / "standin" / "tokenizer.py").read_text()


def units() -> dict[str, dict[str, str]]:
    """Each unit's MainPID, ActiveEnterTimestamp and NRestarts: what any restart changes."""
    found = {}
    for name, unit in UNITS.items():
        out = ssh(HOST, f"systemctl show -p MainPID -p ActiveEnterTimestamp -p NRestarts {unit}").stdout
        found[name] = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return found


def lock_state() -> str:
    """The lock directory and its owner record (inode, mtime, ctime: a take, takeover or release changes them), and
    any half-made or half-removed lock beside it."""
    return ssh(HOST, f"stat -c '%n %i %Y %Z' {LOCK} {LOCK}/*; cat {LOCK}/owner.json; ls -d {LOCK}.new-* {LOCK}.old-* 2>&1",
               check=False).stdout


@dataclass
class Measured:
    proc: subprocess.CompletedProcess
    seconds: float
    out: Path
    raw: dict | None
    units_before: dict
    lock_before: str


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The deploy, then one measure.py run as docs/measure.md says, under another control machine's lock."""
    clean_host(HOST, keep_venv=True)
    inventory = write_inventory("test_measure", {HOST: {"stack": STACK, "services": SERVICES, "run_services": list(SERVICES),
                                                        "lock_wait_s": 2}})
    try:
        result = deploy(inventory, env=SECRETS)
        assert result.returncode == 0, result
        ssh(HOST, f"{VENV}/bin/python -c {shlex.quote(BUILD_TOKENIZER)} {TOKENIZER}")
        before, out = units(), tmp_path_factory.mktemp("measure") / "measure.json"
        ssh(HOST, f"mkdir {LOCK} && printf '%s' {shlex.quote(HOLDER)} > {LOCK}/owner.json")
        lock_before = lock_state()
        env = {**os.environ, **SECRETS, **OPTIONS, "MEASURE_SERVICES": "plain,dflash", "MEASURE_OUT": str(out)}
        start = time.monotonic()
        proc = subprocess.run([PYINFRA, str(inventory), "measure.py", "-y"], cwd=ROOT, capture_output=True, text=True,
                              timeout=900, env=env)
        seconds = time.monotonic() - start
        yield Measured(proc, seconds, out, json.loads(out.read_text()) if out.exists() else None, before, lock_before)
    finally:
        ssh(HOST, f"rm -rf {LOCK} {TOKENIZER}", check=False)
        clean_host(HOST, keep_venv=True)


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The printed table's rows by service: the header line starts with `service  host`."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if re.match(r"service\s+host\s+out tok/s", line))
    return {line.split()[0]: line.split() for line in lines[header + 1:header + 3]}


def test_both_services_are_measured_and_the_faster_one_is_faster(measured):
    proc, raw = measured.proc, measured.raw
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert raw is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = table_rows(proc.stdout)
    assert list(rows) == ["plain", "dflash"], proc.stdout[-3000:]
    assert "8 prompts of 32 random token ids, 32 output tokens each, at most 4 at a time" in proc.stdout
    assert re.search(r"service\s+host\s+out tok/s .* vs plain$", proc.stdout, re.M), proc.stdout[-3000:]
    results = raw["results"]
    plain, dflash = (results[name]["bench"]["output_throughput"] for name in ("plain", "dflash"))
    for name, throughput in (("plain", plain), ("dflash", dflash)):
        assert rows[name][:3] == [name, HOST, f"{throughput:.1f}"], rows[name]
    # Two tokens a step against one, the first token alike: 33 steps against 17, about 1.9 times the output rate.
    assert dflash > 1.4 * plain, (plain, dflash)
    # The last column: output tokens/s over the first service's, from the client's own figures.
    assert rows["plain"][-1] == "1.00" and rows["dflash"][-1] == f"{dflash / plain:.2f}", rows
    assert f"--> raw results: {measured.out}" in proc.stdout
    assert not re.search(r"^(plain|dflash): ", proc.stdout, re.M), proc.stdout[-3000:]  # no service's error line
    print(f"measure.py: {measured.seconds:.1f} s; out tok/s plain {plain:.1f}, dflash {dflash:.1f}")


def test_the_accept_length_is_the_probe_requests_own(measured):
    rows, results = table_rows(measured.proc.stdout), measured.raw["results"]
    # plain: no speculative decoding, so no verify steps and no accept length ("-").
    assert rows["plain"][-2] == "-" and results["plain"]["probe"]["accept_length"] is None
    assert results["plain"]["probe"]["verify_ct"] == 0
    # dflash's probe: 2 requests of 32 tokens, 1 from the prompt's step and 2 per verify step: 16 steps each.
    probe = results["dflash"]["probe"]
    assert [r["completion_tokens"] for r in probe["requests"]] == [32, 32] and probe["verify_ct"] == 32
    assert probe["accept_length"] == 2.0 and rows["dflash"][-2] == "2.00"
    # The client's own accept_length is /server_info's, counted since the server started: the benchmark's requests
    # (31 tokens per 16 steps) and, before them, the readiness gate's speculative probes (64 tokens: 63 per 32 steps,
    # docs/speculative-gate.md). Kept in the raw results, not the one the table shows.
    assert 31 / 16 < results["dflash"]["bench"]["accept_length"] < 63 / 32


def test_the_json_holds_the_clients_raw_results_and_the_options(measured):
    raw = measured.raw
    assert raw["services"] == ["plain", "dflash"]
    assert raw["options"] == {"prompts": 8, "input_len": 32, "output_len": 32, "concurrency": 4, "probe": 2,
                              "timeout_s": 300, "tokenizer": TOKENIZER}
    for name, service in SERVICES.items():
        result = raw["results"][name]
        bench = result["bench"]
        assert result["host"] == HOST and "error" not in result
        # sglang's client wrote these: its backend, dataset and load, all requests done, the server it drove.
        assert (bench["backend"], bench["dataset_name"], bench["completed"], bench["max_concurrency"]) == ("sglang", "random-ids", 8, 4)
        assert (bench["random_input_len"], bench["random_output_len"], bench["total_output_tokens"]) == (32, 32, 8 * 32)
        assert bench["server_info"]["port"] == service["port"]
        assert bench["server_info"]["speculative_algorithm"] == service.get("args", {}).get("speculative-algorithm")
    assert [r["service"] for r in raw["table"]] == ["plain", "dflash"] and raw["table"][0]["ratio"] == 1.0


def test_it_restarted_nothing_and_took_no_lock(measured):
    before = measured.units_before
    assert all(int(s["MainPID"]) > 0 and s["ActiveEnterTimestamp"] and s["NRestarts"] == "0" for s in before.values()), before
    assert units() == before
    # The foreign lock was there throughout: not waited for, not taken over, not released.
    assert "ops@ctl-2" in measured.lock_before and lock_state() == measured.lock_before
    assert "another deploy holds" not in measured.proc.stdout + measured.proc.stderr


def test_the_client_ran_as_the_service_user_in_its_sandbox(measured):
    """The client and the probes ran in a transient unit as the service user (not root), which read the key file."""
    uid = int(ssh(HOST, "id -u sglang").stdout)
    for name in SERVICES:
        assert measured.raw["results"][name]["ran_as"] == {"uid": uid, "user": "sglang"}, measured.raw["results"][name]


# A tokenizer directory whose tokenizer is remote code (tokenizer_config.json's auto_map): with trust_remote_code, as
# sglang's client passes it, transformers imports remote_tok.py from it. It leaves a mark where root or the service
# user could write, and says so.
REMOTE_CODE_TOK = "/root/measure-remote-code-tok"
MARK = "/var/cache/sglang/REMOTE-CODE-RAN"
REMOTE_TOKENIZER = {
    "tokenizer_config.json": json.dumps({"auto_map": {"AutoTokenizer": [None, "remote_tok.RemoteTokenizer"]}}),
    "remote_tok.py": f"import os\nopen({MARK!r}, 'w').write('uid %d' % os.getuid())\nraise SystemExit('REMOTE CODE RAN')\n",
}


def test_a_tokenizer_with_remote_code_is_refused_not_run(measured):
    """sglang 0.5.23's client loads every tokenizer with trust_remote_code=True (no flag turns it off): the deploy
    turns it off in transformers, so a tokenizer that is remote code is refused, its Python never imported."""
    files = " && ".join(f"printf '%s' {shlex.quote(text)} > {REMOTE_CODE_TOK}/{name}" for name, text in REMOTE_TOKENIZER.items())
    ssh(HOST, f"rm -rf {REMOTE_CODE_TOK} {MARK}; mkdir {REMOTE_CODE_TOK} && {files}")
    try:
        out = measured.out.with_name("remote-code.json")
        env = {**os.environ, **SECRETS, **OPTIONS, "MEASURE_PROMPTS": "1", "MEASURE_PROBE": "0", "MEASURE_TOKENIZER": REMOTE_CODE_TOK,
               "MEASURE_SERVICES": "plain", "MEASURE_OUT": str(out)}
        inventory = ROOT / "lab" / "test_measure.py"
        proc = subprocess.run([PYINFRA, str(inventory), "measure.py", "-y"], cwd=ROOT, capture_output=True, text=True,
                              timeout=600, env=env)
        result = json.loads(out.read_text())["results"]["plain"]
        assert "bench" not in result, result
        assert "contains custom code which must be executed" in result["error"], result
        assert "REMOTE CODE RAN" not in proc.stdout + proc.stderr + json.dumps(result)
        assert ssh(HOST, f"test -e {MARK}", check=False).returncode != 0, ssh(HOST, f"cat {MARK}", check=False).stdout
    finally:
        ssh(HOST, f"rm -rf {REMOTE_CODE_TOK} {MARK}", check=False)


# Another local user's HTTP server (test_peer_identity's impostor): prints every request it gets, key and all.
SQUATTER = "squatter"
IMPOSTOR_UNIT = f"lab-measure-impostor-{os.getpid()}.service"
IMPOSTOR = impostor_source(SERVICES["dflash"]["port"])


def test_the_key_goes_only_to_the_unit_when_the_engine_dies_mid_run(measured):
    """Root checks the port's listeners before the client and after it; in between the engine dies and another
    local user binds its port. Every connection of the client is checked on its own before its first byte
    (operations/transport/on_host/peer_guard.py): the first one to the squatter stops the run, which fails naming the holder,
    and the squatter hears nothing. Seen failing without the guard: the squatter's journal held
    `HEARD GET /v1/models Bearer <the key>`. Last in the module: it kills dflash's engine."""
    port, unit = SERVICES["dflash"]["port"], UNITS["dflash"]
    ssh(HOST, f"id {SQUATTER} >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin {SQUATTER}")
    ssh(HOST, f"printf %s {shlex.quote(IMPOSTOR)} > /var/tmp/lab-measure-impostor.py && chmod 644 /var/tmp/lab-measure-impostor.py")
    out = measured.out.with_name("squatted.json")
    env = {**os.environ, **SECRETS, **OPTIONS, "MEASURE_PROMPTS": "40", "MEASURE_CONCURRENCY": "1",
           "MEASURE_SERVICES": "dflash", "MEASURE_OUT": str(out)}
    try:
        run = subprocess.Popen([PYINFRA, str(ROOT / "lab" / "test_measure.py"), "measure.py", "-y"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        # Root's check before the client has passed once the client's transient unit runs; the client is still
        # importing its modules. Then the engine dies and the squatter binds its port.
        ssh(HOST, "for i in $(seq 600); do systemctl list-units --no-legend --plain --type=service "
                  "| grep -q 'sglang-deploy: measure dflash' && exit 0; sleep 0.05; done; exit 1")
        ssh(HOST, f"systemctl kill -s KILL {unit}; "
                  f"for i in $(seq 100); do systemd-run --quiet --unit {IMPOSTOR_UNIT} -p User={SQUATTER} "
                  f"/usr/bin/python3 /var/tmp/lab-measure-impostor.py && break; sleep 0.05; done; "
                  f"for i in $(seq 100); do ss -ltn 'sport = :{port}' | grep -q LISTEN && exit 0; sleep 0.05; done; exit 1")
        stdout, stderr = run.communicate(timeout=600)
        heard = ssh(HOST, f"journalctl -u {IMPOSTOR_UNIT} --no-pager -o cat").stdout
        uid = ssh(HOST, f"id -u {SQUATTER}").stdout.strip()
    finally:
        ssh(HOST, f"systemctl stop {IMPOSTOR_UNIT} 2>/dev/null; rm -f /var/tmp/lab-measure-impostor.py; "
                  f"userdel {SQUATTER}; true", check=False)
    assert KEY not in heard and "HEARD" not in heard, heard
    assert run.returncode != 0, stdout[-3000:] + stderr[-3000:]
    result = json.loads(out.read_text())["results"]["dflash"]
    assert result["refused"].startswith(f"port {port} is held by uid {uid} ({SQUATTER})"), result
    assert result["refused"].endswith(f"not by {unit}") and "bench" not in result, result
    assert "dflash: the key goes only to the unit: stopped before sending" in stdout + stderr, stdout[-3000:]
    assert KEY not in stdout + stderr
