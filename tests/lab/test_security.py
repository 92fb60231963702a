"""Secrets and exposure on the lab: an API key reaches the server through a root-only file and nowhere else; the
engine's code outside its unit (the preflight) runs as the service user, with no variable off its allow list."""

from __future__ import annotations

import json
import shlex

import pytest
import requests

from tests.lab.labutil import (
    SPARE,
    clean_host,
    deploy,
    lab_hosts,
    main_pid,
    refused_by_its_preflight,
    ssh,
    write_inventory,
)

pytestmark = pytest.mark.lab

KEY = "lab-test-key-7f3a9c2e51d04b8a"  # a test value: never a real key
ADMIN = "lab-test-admin-key-c4e81b07aa92"  # a test value: never a real key
ENV = {"SGLANG_DEPLOY_SECRET_EXPOSED_KEY": KEY, "SGLANG_DEPLOY_SECRET_EXPOSED_ADMIN": ADMIN}
SERVICE = {
    "gpu": 0, "port": 30110, "bind": "0.0.0.0", "model": "Qwen3.6-27B-DFlash", "model_in": "store",
    "api_key_secret": "exposed-key", "admin_api_key_secret": "exposed-admin",
}


@pytest.fixture(scope="module")
def exposed():
    clean_host(SPARE, keep_venv=True)
    inventory = write_inventory("test_exposed", {SPARE: {"services": {"exposed": SERVICE}, "run_services": ["exposed"]}})
    # -vvv and --diff print commands, facts and file diffs: the key must be in none of them.
    result = deploy(inventory, "-vvv", "--diff", env=ENV, as_json=False)
    assert result.returncode == 0, result
    yield inventory, result
    clean_host(SPARE, keep_venv=True)


def test_the_key_is_in_no_pyinfra_output(exposed):
    _, result = exposed
    assert KEY not in result.stdout + result.stderr
    assert ADMIN not in result.stdout + result.stderr
    assert "(NO API KEY)" not in result.stderr


def test_the_key_is_in_no_unit_argv_or_journal_only_in_a_file_only_root_and_its_service_read(exposed):
    unit = ssh(SPARE, "cat /etc/systemd/system/sglang-exposed.service").stdout
    assert KEY not in unit and ADMIN not in unit and "--config /etc/sglang-deploy/secrets/exposed.yml" in unit
    pid = main_pid(SPARE, "sglang-exposed.service")
    for secret in (KEY, ADMIN):
        assert secret not in ssh(SPARE, f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
        # The engine logs its server_args, keys included (sgl-project/sglang#37457; the stand-in does as it does):
        # that line is the only one holding a key; nothing of the deploy's writes one (tests/lab/test_secret_redaction.py
        # shows that the deploy prints none when it prints the journal).
        journal = ssh(SPARE, "journalctl -u sglang-exposed.service --no-pager -o cat").stdout.splitlines()
        assert [line for line in journal if secret in line and "server_args=ServerArgs(" not in line] == []
    assert ssh(SPARE, "stat -c '%a %U %G' /etc/sglang-deploy/secrets /etc/sglang-deploy/secrets/exposed.yml").stdout.split() == ["710", "root", "sglang", "640", "root", "sglang"]
    assert ssh(SPARE, "cat /etc/sglang-deploy/secrets/exposed.yml").stdout.splitlines() == [
        f'api-key: "{KEY}"', f'admin-api-key: "{ADMIN}"',
    ]


def test_the_server_parsed_both_keys_from_the_config_file(exposed):
    """`admin_api_key_secret` end to end: the server's own parser read --admin-api-key from the file."""
    base = f"http://{lab_hosts()[SPARE]['address']}:30110"
    info = requests.get(f"{base}/server_info", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()
    assert (info["api_key"], info["admin_api_key"]) == ("<set>", "<set>")  # the stand-in masks what it was given


def test_the_server_demands_the_key_from_other_machines(exposed):
    base = f"http://{lab_hosts()[SPARE]['address']}:30110"
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
    assert requests.post(f"{base}/v1/chat/completions", json=body, timeout=10).status_code == 401
    ok = requests.post(f"{base}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]


def test_a_second_run_changes_nothing(exposed):
    inventory, _ = exposed
    result = deploy(inventory, env=ENV)
    assert result.returncode == 0 and result.changed == [], result


def test_a_secrets_directory_loosened_by_hand_is_put_back_and_the_service_keeps_running(exposed):
    inventory, _ = exposed
    pid = main_pid(SPARE, "sglang-exposed.service")
    ssh(SPARE, "chmod 755 /etc/sglang-deploy/secrets && chgrp root /etc/sglang-deploy/secrets")
    result = deploy(inventory, env=ENV)
    assert result.returncode == 0, result
    assert [name for name, _ in result.changed] == ["Secrets directory /etc/sglang-deploy/secrets is 710 root:sglang"], result
    assert ssh(SPARE, "stat -c '%a %U %G' /etc/sglang-deploy/secrets").stdout.split() == ["710", "root", "sglang"]
    assert main_pid(SPARE, "sglang-exposed.service") == pid  # the key did not change: no restart
    assert deploy(inventory, env=ENV).changed == []


def test_a_missing_secret_is_refused_before_any_host_is_touched(exposed):
    inventory, _ = exposed
    result = deploy(inventory, env={**ENV, "SGLANG_DEPLOY_SECRET_EXPOSED_KEY": ""})
    assert result.returncode != 0
    assert "services.exposed.api_key_secret: 'exposed-key': no such secret: set $SGLANG_DEPLOY_SECRET_EXPOSED_KEY" in result.stderr
    assert "Starting operation" not in result.stderr


def test_binding_beyond_loopback_without_a_key_is_refused_unless_allowed():
    open_service = {k: v for k, v in SERVICE.items() if k not in ("api_key_secret", "admin_api_key_secret")}
    inventory = write_inventory("test_open", {SPARE: {"services": {"open": open_service}, "run_services": ["open"]}})
    result = deploy(inventory)
    assert result.returncode != 0
    assert "services.open.bind: '0.0.0.0': binding beyond loopback without an API key" in result.stderr


def test_a_listener_the_engine_opens_by_default_counts_as_one_the_data_names():
    """Issue 46 item 5: a KV-events publisher set with no endpoint passes validation (no address in the data) and the
    engine, resolving it, binds its default on every interface (`tcp://*:5557`, KVEventsConfig in 0.5.23). The
    preflight reads the engine's resolved settings on the host and refuses that without an API key; the same publisher
    given a loopback endpoint serves."""
    # GPU 1: the module's exposed service holds GPU 0 until the module ends.
    events = {"gpu": 1, "port": 30111, "model": "Qwen3.6-27B-DFlash", "model_in": "store",
              "args": {"kv-events-config": '{"publisher": "zmq"}'}}
    inventory = write_inventory("test_events", {SPARE: {"services": {"events": events}, "run_services": ["events"]}})
    try:
        refused_by_its_preflight(SPARE, inventory, "events", "the engine resolves `kv_events_config.endpoint` to "
                                 "`tcp://*:5557`, naming `tcp://*:5557`")
        events["args"] = {"kv-events-config": '{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557"}'}
        inventory = write_inventory("test_events", {SPARE: {"services": {"events": events}, "run_services": ["events"]}})
        again = deploy(inventory)
        assert again.returncode == 0, again
    finally:
        clean_host(SPARE, keep_venv=True)


# Root runs nothing the service side can steer (issue #34, item 2) ----------------------------------------------------

# Records who opens a FIFO: each open for reading blocks until this writer opens it too; the writer then finds the
# process that holds it open (its uid, cgroup and command line), gives it an empty file, and logs one JSON line.
OPEN_TRACER = r"""
import json, os, sys, time
fifo, log = sys.argv[1], sys.argv[2]
while True:
    fd = os.open(fifo, os.O_WRONLY)
    who = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{n}") == fifo for n in os.listdir(f"/proc/{pid}/fd")):
                who.append({"pid": int(pid), "uid": os.stat(f"/proc/{pid}").st_uid,
                            "cgroup": open(f"/proc/{pid}/cgroup").read().strip(),
                            "cmdline": open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:300]})
        except OSError:
            pass
    os.write(fd, b"# empty\n")
    os.close(fd)
    with open(log, "a") as out:
        out.write(json.dumps({"t": time.time(), "who": who}) + "\n")
    time.sleep(0.05)
"""
TRACE_DIR = "/run/lab-steer"
OPENSSL_CONF = f"{TRACE_DIR}/openssl.cnf"


@pytest.fixture
def traced(spare_with_venv):
    """OPENSSL_CONF's file on the spare host is a FIFO that logs who opens it (a root transient unit)."""
    host = spare_with_venv
    ssh(host, f"systemctl stop lab-open-tracer.service 2>/dev/null; rm -rf {TRACE_DIR}; mkdir -m 755 {TRACE_DIR} && "
              f"mkfifo -m 644 {OPENSSL_CONF} && systemd-run --unit=lab-open-tracer --quiet /usr/bin/python3 -c "
              f"{shlex.quote(OPEN_TRACER)} {OPENSSL_CONF} {TRACE_DIR}/opened.jsonl", check=True)
    yield host
    # The service goes first: once the tracer stops, an open of the FIFO would block for good.
    clean_host(host, keep_venv=True)
    ssh(host, f"systemctl stop lab-open-tracer.service; rm -rf {TRACE_DIR}", check=False)


def test_the_preflight_runs_as_the_service_user_and_takes_no_variable_off_its_allow_list(traced):
    """A service's env data names OPENSSL_CONF (the data's checks let it through): OpenSSL reads that file when Python
    imports hashlib, and a config can load engines and providers, shared objects. The preflight (the engine's
    parser, outside the unit) ran as root with it; now it runs as the service user in a transient unit, with the
    few variables on its allow list: the file is opened by the service alone, never by root."""
    service = {"gpu": 0, "port": 30112, "model": "Qwen3.6-27B-DFlash", "model_in": "store", "env": {"OPENSSL_CONF": OPENSSL_CONF}}
    inventory = write_inventory("test_steer", {traced: {"services": {"steer": service}, "run_services": ["steer"]}})
    result = deploy(inventory, as_json=False)
    assert result.returncode == 0, result
    opened = [json.loads(line) for line in ssh(traced, f"cat {TRACE_DIR}/opened.jsonl 2>/dev/null; true").stdout.splitlines()]
    who = [w for entry in opened for w in entry["who"]]
    print(json.dumps(who, indent=1))
    # The variable is live: the service itself (its unit sets it) opened the file, as its user, in its cgroup.
    assert any("sglang-steer.service" in w["cgroup"] for w in who), opened
    uid = int(ssh(traced, "id -u sglang").stdout)
    assert [w for w in who if w["uid"] != uid or "sglang-steer.service" not in w["cgroup"]] == [], opened
    # The preflight says who it ran as: the service user, not root.
    assert "steer: preflight passed (sglang 0.5.23, as sglang)" in result.stderr + result.stdout, result
