"""No secret value in anything the deploy prints, on the lab, when the engine itself logs its keys.

sglang logs `server_args=ServerArgs(..., api_key='...', admin_api_key='...')` at start (sgl-project/sglang#37457),
and so does the lab's stand-in; a service that fails its readiness gate gets its journal tail printed, and a
restarted one that fails is rolled back. Each test first checks that the host's journal really holds the keys,
so that their absence from the deploy's output (stdout and stderr, at -vvv) means something.
"""

from __future__ import annotations

import re

import pytest

from tests.lab.labutil import SPARE, clean_host, deploy, main_pid, ssh, write_inventory

pytestmark = pytest.mark.lab

KEY = "lab-redaction-key-2b9d64f0c3e1a857"  # a test value: never a real key
ADMIN = "lab-redaction-admin-f51e08c2d7a9"  # a test value: never a real key
ENV = {"SGLANG_DEPLOY_SECRET_LEAKY_KEY": KEY, "SGLANG_DEPLOY_SECRET_LEAKY_ADMIN": ADMIN}
UNIT = "sglang-leaky.service"
SERVICE = {
    "gpu": 0, "port": 30115, "model": "Qwen3.6-27B-DFlash", "model_in": "store",
    "api_key_secret": "leaky-key", "admin_api_key_secret": "leaky-admin",
}
CRASH = {"STANDIN_CRASH_AT_START": 1}  # the stand-in logs its server_args, then exits 1


@pytest.fixture
def spare_host():
    clean_host(SPARE, keep_venv=True)
    yield SPARE
    clean_host(SPARE, keep_venv=True)


def inventory(env: dict | None = None):
    service = {**SERVICE, **({"env": env} if env else {})}
    return write_inventory("test_secret_redaction", {SPARE: {"services": {"leaky": service}, "run_services": ["leaky"]}})


def journal_holds_the_keys() -> bool:
    journal = ssh(SPARE, f"journalctl -u {UNIT} --no-pager -o cat").stdout
    return f"api_key='{KEY}'" in journal and f"admin_api_key='{ADMIN}'" in journal


def assert_no_key_in(result) -> None:
    printed = result.stdout + result.stderr
    for secret in (KEY, ADMIN):
        assert secret not in printed, f"a key is in the deploy's output:\n{printed[printed.find(secret) - 2000:][:4000]}"


def test_a_service_that_fails_its_first_start_prints_its_journal_tail_without_the_keys(spare_host):
    result = deploy(inventory(CRASH), "-vvv", "--diff", env=ENV, as_json=False)
    assert result.returncode != 0, result
    assert journal_holds_the_keys()  # the engine logged them: what follows can fail
    assert f"last journal lines of {UNIT}" in result.stderr, result
    # The engine's line was printed, its keys masked (on the host, or else on the control machine).
    assert re.search(r"server_args=ServerArgs\(.*api_key='<(redacted|secret leaky-key)>'", result.stderr), result
    assert_no_key_in(result)


def test_a_change_that_fails_readiness_is_rolled_back_and_nothing_printed_holds_the_keys(spare_host):
    first = deploy(inventory(), env=ENV)
    assert first.returncode == 0, first
    pid = main_pid(SPARE, UNIT)
    result = deploy(inventory(CRASH), "-vvv", env=ENV, as_json=False)
    assert result.returncode != 0, result
    assert "leaky: ROLLED BACK unit sglang-leaky.service (the previous one)" in result.stderr, result
    assert main_pid(SPARE, UNIT) not in (0, pid)  # restored and running again
    assert journal_holds_the_keys()
    assert f"last journal lines of {UNIT}" in result.stderr and "server_args=ServerArgs(" in result.stderr, result
    assert_no_key_in(result)
