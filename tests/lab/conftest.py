"""What every lab module may count on, whatever state a person or an earlier run left the lab in."""

from __future__ import annotations

import pytest

from tests.lab.labutil import SPARE, clean_host, lab, lab_hosts

LAB_HOSTS = "gpu-a,gpu-b,gpu-c,gpu-d,gpu-e"


@pytest.fixture(scope="session", autouse=True)
def lab_plugged_in():
    """Every host up, its network plugged in and its stand-in GPUs as the lab made them (idempotent, seconds)."""
    for name, host in lab_hosts().items():
        if host.get("cut"):
            lab("restore", name)
    lab("up", "--hosts", LAB_HOSTS)
    for name in lab_hosts():
        lab("gpus", name, "--reset")
    yield


@pytest.fixture
def spare():
    """The spare host (SPARE), emptied of everything a deploy puts there, before and after the test."""
    clean_host(SPARE)
    yield SPARE
    clean_host(SPARE)


@pytest.fixture
def spare_with_venv():
    """The spare host without services, units, staged models or config, before and after; its venv kept (faster)."""
    clean_host(SPARE, keep_venv=True)
    yield SPARE
    clean_host(SPARE, keep_venv=True)
