"""What the deploy says when things are wrong: bad data before any host is touched, a unit that dies."""

from __future__ import annotations

import re

import pytest

from tests.lab.labutil import SPARE, deploy, ssh, write_inventory

pytestmark = pytest.mark.lab


def test_bad_data_stops_the_run_before_any_host_is_touched(spare_with_venv):
    before = ssh(SPARE, "ls -A /etc/systemd/system /dev/shm /root | sort | sha256sum").stdout
    inventory = write_inventory("test_bad_data", {SPARE: {"run_services": {"dflash": {"port": 70000}}}})
    result = deploy(inventory)
    assert result.returncode != 0
    assert f"inventory (host {SPARE}): run_services.dflash.port: 70000: must be a TCP port" in result.stderr
    assert "Starting operation" not in result.stderr
    assert ssh(SPARE, "ls -A /etc/systemd/system /dev/shm /root | sort | sha256sum").stdout == before


def bad_flag_inventory(args: dict):
    services = {"bad": {"gpu": 0, "port": 30100, "model": "Qwen3.6-27B-DFlash", "model_in": "store", "args": args}}
    return write_inventory("test_bad_flag", {SPARE: {"services": services, "run_services": ["bad"]}})


def test_a_value_only_the_engines_parser_can_judge_is_refused_by_the_preflight_before_any_unit_is_written(spare_with_venv):
    """The flag list knows every flag but not every value's type: a number the parser cannot read is its to refuse.
    (A flag the engine does not have is refused on the control machine: tests/unit/bad_data/engine_flags/.)"""
    result = deploy(bad_flag_inventory({"max-running-requests": "lots"}))
    assert result.returncode != 0
    # The parser's own words, in one line, and the summary names the flag.
    assert "bad: PREFLIGHT FAILED, unit and running service left as they were: sglang 0.5.23 refuses the flags: " in result.stderr
    assert "--max-running-requests" in result.stderr and "'lots'" in result.stderr, result.stderr[-3000:]
    assert f"{SPARE}/bad" in result.stderr and "FAILED  preflight: sglang 0.5.23 refuses" in result.stderr
    assert ssh(SPARE, "test -e /etc/systemd/system/sglang-bad.service || echo absent").stdout.strip() == "absent"


def test_a_flag_the_engine_does_not_have_is_refused_before_any_host_is_touched(spare_with_venv):
    """The operator's own flags on the default stack: `--mamba-scheduler-strategy` is gone from sglang 0.5.20 on.
    Refused on the control machine, with its replacement (files/engine_advisories.yml); the host is not reached."""
    result = deploy(bad_flag_inventory({"mamba-scheduler-strategy": "extra_buffer"}))
    assert result.returncode != 0
    assert ("services.bad.args.mamba-scheduler-strategy: 'extra_buffer': `--mamba-scheduler-strategy` is not a flag of "
            "sglang 0.5.23: ") in result.stderr and "write `mamba-radix-cache-strategy: <the same value>` instead" in result.stderr
    assert "Starting operation" not in result.stderr


def test_a_unit_that_dies_fails_the_gate_fast_with_the_journal_tail(spare_with_venv):
    services = {
        "crashy": {"gpu": 0, "port": 30102, "model": "Qwen3.6-27B-DFlash", "model_in": "store",
                   "env": {"STANDIN_CRASH_AT_START": 1}},
    }
    inventory = write_inventory("test_crashy", {SPARE: {"services": services, "run_services": ["crashy"]}})
    result = deploy(inventory)
    assert result.returncode != 0
    # Fail fast: the gate stopped on the unit's own state (dead or restarting), not at readiness_timeout_s
    # (120 s in the lab): a reason, not a clock, shows which way it ended.
    assert re.search(r"crashy: NOT READY: sglang-crashy\.service is (failed|inactive|activating)/(failed|dead|auto-restart) "
                     r"\(result: [a-z-]+\) before it became ready", result.stderr), result.stderr[-3000:]
    assert "did not answer" not in result.stderr
    assert "last journal lines of sglang-crashy.service" in result.stderr
    assert "STANDIN_CRASH_AT_START" in result.stderr  # the stand-in's own last words, from the journal


def test_a_service_that_never_becomes_ready_fails_at_the_timeout(spare_with_venv):
    services = {
        "slow": {"gpu": 0, "port": 30101, "model": "Qwen3.6-27B-DFlash", "model_in": "store",
                 "env": {"STANDIN_NEVER_READY": 1}},
    }
    inventory = write_inventory("test_never_ready", {SPARE: {"services": services, "run_services": ["slow"], "readiness_timeout_s": 5}})
    result = deploy(inventory)
    assert result.returncode != 0
    assert "did not answer http://127.0.0.1:30101/ready with 200 within 5 s (last: HTTP 503)" in result.stderr
