"""The whole path on the lab: deploy, converge again with zero changes, put drift back.

These run against real systemd hosts over real SSH (lab/lab.py); the served process is
the stand-in server (lab/standin). Tests in this module run in order and share the lab.
"""

from __future__ import annotations

import re

import pytest

from tests.lab.labutil import (
    SPARE,
    chat,
    clean_host,
    deploy,
    http_get,
    main_pid,
    ssh,
    write_inventory,
)

pytestmark = pytest.mark.lab

SERVICES = {"ddtree": 30000, "dflash": 30001}
UNITS = {name: f"sglang-{name}.service" for name in SERVICES}


@pytest.fixture(scope="module")
def first_run():
    for host in ("gpu-a", SPARE):
        clean_host(host)
    result = deploy()
    assert result.returncode == 0, result
    return result


def changed_names(result) -> list[str]:
    return [name for name, _hosts in result.changed]


def test_first_run_serves_every_placed_service(first_run):
    for name, port in SERVICES.items():
        status, _ = http_get("gpu-a", port, "/health")
        assert status == 200, f"{name} /health -> {status}"
        reply = chat("gpu-a", port, "hello")
        assert reply["choices"][0]["message"]["content"]
    assert "--> Services:" in first_run.stderr
    # deploy.py's steps, each a component whose operations pyinfra names after it, in order.
    assert first_run.components == ["GPU check", "Environments", "Models", "Service account", "Service", "Cleanup"], first_run.components
    for name, port in SERVICES.items():  # each service's own row says ready (not just the word somewhere)
        assert re.search(rf"gpu-a/{name}\s+http://127\.0\.0\.1:{port}\s+ready\b", first_run.stderr), first_run.stderr[-3000:]


def test_unit_carries_the_data_flags(first_run):
    unit = ssh("gpu-a", f"cat /etc/systemd/system/{UNITS['ddtree']}").stdout
    assert unit.startswith("# Managed by sglang-deploy")
    for line in ("--attention-backend triton", "--grammar-backend none", "--speculative-algorithm DDTREE",
                 "--port 30000", "--model-path /dev/shm/Qwen3.6-27B", "Environment=CUDA_VISIBLE_DEVICES=0"):
        assert line in unit
    status, body = http_get("gpu-a", 30001, "/server_info")
    assert status == 200
    assert '"CUDA_VISIBLE_DEVICES": "1"' in body


def test_the_real_sglang_parser_accepted_the_flags_with_the_patch_set(first_run):
    """The stand-in parses its argv with the venv's own sglang; DDTREE exists only through the patch set."""
    import json

    info = json.loads(http_get("gpu-a", 30000, "/server_info")[1])
    assert info["parser"] == "sglang 0.5.23"
    assert (info["speculative_algorithm"], info["speculative_ddtree_budget"]) == ("DDTREE", 15)
    assert info["attention_backend"] == "triton" and info["grammar_backend"] == "none"
    assert info["env"]["SGLANG_DDTREE_MAX_TOPK"] == "8"


def test_empty_host_gets_nothing(first_run):
    out = ssh(SPARE, "ls /etc/systemd/system/ | grep -c sglang- || true; test -e /root/venv_sglang && echo venv || echo novenv").stdout
    assert out.split() == ["0", "novenv"]


def test_second_run_reports_no_changes_and_restarts_nothing(first_run):
    pids = {name: main_pid("gpu-a", unit) for name, unit in UNITS.items()}
    result = deploy()
    assert result.returncode == 0, result
    assert result.changed == [], result
    assert {name: main_pid("gpu-a", unit) for name, unit in UNITS.items()} == pids


def test_a_converged_run_reads_each_host_in_one_call(first_run):
    """pyinfra's --debug log names each host's read calls (operations/run/host_reads.py): on a converged host one, the
    command that took its deploy lock; every fact the run asks comes from it."""
    result = deploy("lab/inventory.py", "--debug")
    assert result.returncode == 0 and result.changed == [], result
    calls = dict(re.findall(r"\b(gpu-[a-z]): (\d+) read call\(s\) to the host", result.stdout + result.stderr))
    assert {"gpu-a", SPARE} <= set(calls) and set(calls.values()) == {"1"}, calls


def test_dry_run_on_converged_hosts_plans_nothing_unconditional(first_run):
    result = deploy("lab/inventory.py", "--dry")
    assert result.returncode == 0, result
    plan = result.json["plan"]
    assert [op["name"] for op in plan if op["hosts_with_change"]] == []


def test_hand_edited_unit_is_put_back_and_only_its_service_restarts(first_run):
    pids = {name: main_pid("gpu-a", unit) for name, unit in UNITS.items()}
    path = f"/etc/systemd/system/{UNITS['dflash']}"
    ssh("gpu-a", f"sed -i 's/--grammar-backend none/--grammar-backend xgrammar/' {path}")
    # --dry names the lines that differ and exits with the plan's code (2: changes), with no variable set
    dry = deploy("lab/inventory.py", "--dry", as_json=False)
    assert dry.returncode == 2, dry
    assert f"gpu-a/dflash  [Service] update {path}: differs from the data\n        - --grammar-backend xgrammar\n" \
           "        + --grammar-backend none\n" in dry.stderr, dry
    result = deploy()
    assert result.returncode == 0, result
    names = changed_names(result)
    assert f"Unit {UNITS['dflash']}" in names
    assert f"Unit {UNITS['ddtree']}" not in names
    assert "--grammar-backend none" in ssh("gpu-a", f"cat {path}").stdout
    assert main_pid("gpu-a", UNITS["ddtree"]) == pids["ddtree"]
    assert main_pid("gpu-a", UNITS["dflash"]) != pids["dflash"]
    assert http_get("gpu-a", 30001, "/health")[0] == 200
    assert deploy().changed == []


def test_deleted_staged_model_is_staged_again(first_run):
    ssh("gpu-a", "rm -rf /dev/shm/Qwen3.6-27B")
    result = deploy()
    assert result.returncode == 0, result
    names = changed_names(result)
    assert "Model Qwen3.6-27B staged in /dev/shm" in names
    assert not any(name.startswith("Unit ") for name in names)
    listing = ssh("gpu-a", "ls -A /dev/shm/Qwen3.6-27B").stdout.split()
    assert "config.json" in listing and ".sglang-deploy-staged.json" in listing
    for port in SERVICES.values():
        assert http_get("gpu-a", port, "/health")[0] == 200
    assert deploy().changed == []


def test_truncated_staged_file_is_repaired(first_run):
    ssh("gpu-a", "truncate -s 100 /dev/shm/Qwen3.6-27B/model-00001-of-00002.safetensors")
    result = deploy()
    assert "Model Qwen3.6-27B staged in /dev/shm" in changed_names(result), result
    src = ssh("gpu-a", "sha256sum < /root/models/Qwen3.6-27B/model-00001-of-00002.safetensors").stdout
    dst = ssh("gpu-a", "sha256sum < /dev/shm/Qwen3.6-27B/model-00001-of-00002.safetensors").stdout
    assert src == dst


def test_overwritten_patch_file_is_named_by_a_dry_run_and_put_back(first_run):
    from operations.environment.patches import load_patch_set

    patch_set = load_patch_set("ddtree-sample")
    env = "/root/venv_sglang+ddtree-sample"
    target = patch_set.files[0].path
    site = ssh("gpu-a", f"ls -d {env}/lib/python3*/site-packages").stdout.strip()
    pid = main_pid("gpu-a", UNITS["ddtree"])
    ssh("gpu-a", f"echo '# edited by hand' >> {site}/{target}")
    dry = deploy("lab/inventory.py", "--dry", as_json=False)
    assert f"{target} was changed on the host" in dry.stdout + dry.stderr
    result = deploy()
    assert result.returncode == 0, result
    # The live generation (behind the env's symlink) is repaired in place: it is what serves.
    assert any(name.startswith("Patch set ddtree-sample applied in generation ") for name in changed_names(result)), result
    assert f"{target} was changed on the host" in result.stderr
    digest = ssh("gpu-a", f"sha256sum {site}/{target}").stdout.split()[0]
    assert digest == patch_set.files[0].sha256
    assert main_pid("gpu-a", UNITS["ddtree"]) != pid  # its process loaded the edited file: restarted
    assert deploy().changed == []


# Drained stops (issue 48 item 2) -------------------------------------------------------------------------

DRAIN_PORT = 30103
# 900 tokens at 0.05 s a step: a generation of about 45 s, longer than a converged run takes to reach the restart.
DRAIN_STEP_S, DRAIN_TOKENS = 0.05, 900


def drain_inventory(args: dict):
    services = {"drainy": {"gpu": 0, "port": DRAIN_PORT, "model": "Qwen3.6-27B-DFlash", "model_in": "store",
                           "stop_timeout_s": 90, "args": args, "env": {"STANDIN_STEP_S": DRAIN_STEP_S}}}
    return write_inventory("test_drain", {SPARE: {"services": services, "run_services": ["drainy"]}})


def test_a_restart_drains_the_request_in_flight_and_loses_none(spare_with_venv):
    """A long generation runs on the service while a deploy changes one of its flags: the restart stops it with
    SIGTERM and waits (TimeoutStopSec, from `stop_timeout_s`), the stand-in finishes the generation, the request gets
    its 200 and every token, and the new process passes its gate on /ready. Before drained stops the process died at
    SIGTERM and the request's connection was cut."""
    import json
    import shlex
    import threading

    unit = "sglang-drainy.service"
    first = deploy(drain_inventory({}))
    assert first.returncode == 0, first
    assert "TimeoutStopSec=90\n" in ssh(SPARE, f"cat /etc/systemd/system/{unit}").stdout
    assert ssh(SPARE, f"systemctl show -p TimeoutStopUSec --value {unit}").stdout.strip() == "1min 30s"
    assert http_get(SPARE, DRAIN_PORT, "/ready")[0] == 200
    old_pid = main_pid(SPARE, unit)

    client = (
        "import json, time, urllib.request\n"
        f"body = json.dumps({{'text': 'alpha beta', 'sampling_params': {{'max_new_tokens': {DRAIN_TOKENS}}}}}).encode()\n"
        f"req = urllib.request.Request('http://127.0.0.1:{DRAIN_PORT}/generate', data=body, "
        "headers={'Content-Type': 'application/json'})\n"
        "began = time.monotonic()\n"
        "try:\n"
        "    r = urllib.request.urlopen(req, timeout=300)\n"
        "    print(json.dumps({'status': r.status, 'tokens': len(json.loads(r.read())['output_ids']),"
        " 'took_s': time.monotonic() - began}))\n"
        "except Exception as e:\n"
        "    print(json.dumps({'status': None, 'error': repr(e), 'took_s': time.monotonic() - began}))\n"
    )
    answer = {}
    worker = threading.Thread(target=lambda: answer.update(
        out=ssh(SPARE, f"python3 -c {shlex.quote(client)}", timeout=360).stdout))
    worker.start()
    try:
        changed = deploy(drain_inventory({"max-running-requests": 8}), timeout=600)
    finally:
        worker.join(timeout=360)
    assert changed.returncode == 0, changed
    assert main_pid(SPARE, unit) != old_pid  # the flag change restarted it
    assert re.search(rf"{SPARE}/drainy\s+http://127\.0\.0\.1:{DRAIN_PORT}\s+ready\s+[0-9.]+ s after \(re\)start "
                     r"\(by /ready\)", changed.stderr), changed.stderr[-3000:]
    result = json.loads(answer["out"])
    assert (result["status"], result.get("tokens")) == (200, DRAIN_TOKENS), result
    # The restart came while the generation ran, and the old process drained it before it exited.
    journal = ssh(SPARE, f"journalctl -u {unit} --no-pager -o cat _PID={old_pid}").stdout
    assert "received SIGTERM: draining (1 request(s) in flight" in journal, journal[-3000:]
    assert "drained: no request in flight, exiting" in journal, journal[-3000:]
    assert "--max-running-requests" in ssh(SPARE, f"cat /etc/systemd/system/{unit}").stdout
