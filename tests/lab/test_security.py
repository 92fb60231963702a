"""Secrets and exposure on the lab: an API key reaches the server through a root-only file and nowhere else."""

from __future__ import annotations

import pytest
import requests

from tests.lab.labutil import SPARE, clean_host, deploy, lab_hosts, main_pid, ssh, write_inventory

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
