"""What the deploy says when things are wrong: bad data before any host is touched, a unit that dies."""

from __future__ import annotations

import time

import pytest

from tests.lab.labutil import clean_host, deploy, ssh, write_inventory

pytestmark = pytest.mark.lab


def test_bad_data_stops_the_run_before_any_host_is_touched():
    before = ssh("gpu-b", "ls -A /etc/systemd/system /dev/shm /root | sort | sha256sum").stdout
    inventory = write_inventory("test_bad_data", {"gpu-b": {"run_services": {"dflash": {"port": 70000}}}})
    result = deploy(inventory)
    assert result.returncode != 0
    assert "inventory (host gpu-b): run_services.dflash.port: 70000: must be a TCP port" in result.stderr
    assert "Starting operation" not in result.stderr
    assert ssh("gpu-b", "ls -A /etc/systemd/system /dev/shm /root | sort | sha256sum").stdout == before


def test_unknown_flag_is_refused_by_sglangs_own_parser_and_fails_fast_with_the_journal():
    clean_host("gpu-b")
    services = {
        "bad": {"gpu": 0, "port": 30100, "model": "Qwen3.6-27B-DFlash", "model_in": "store",
                "args": {"mamba-scheduler-strategy": "extra_buffer"}},
    }
    inventory = write_inventory("test_bad_flag", {"gpu-b": {"services": services, "run_services": ["bad"]}})
    start = time.monotonic()
    result = deploy(inventory)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert "bad: NOT READY: sglang-bad.service is" in result.stderr
    # The parser's own words reach the operator, from the journal tail.
    assert "unrecognized arguments: --mamba-scheduler-strategy extra_buffer" in result.stderr
    assert "gpu-b/bad" in result.stderr and "FAILED" in result.stderr
    # Fail fast: the unit died, so the gate did not wait out readiness_timeout_s (120 s in the lab).
    assert elapsed < 100, elapsed
    clean_host("gpu-b")


def test_a_service_that_never_becomes_ready_fails_at_the_timeout():
    clean_host("gpu-b")
    services = {
        "slow": {"gpu": 0, "port": 30101, "model": "Qwen3.6-27B-DFlash", "model_in": "store",
                 "env": {"STANDIN_NEVER_READY": 1}},
    }
    inventory = write_inventory("test_never_ready", {"gpu-b": {"services": services, "run_services": ["slow"], "readiness_timeout_s": 5}})
    result = deploy(inventory)
    assert result.returncode != 0
    assert "did not answer http://127.0.0.1:30101/health with 200 within 5 s (last: HTTP 503)" in result.stderr
    clean_host("gpu-b")
