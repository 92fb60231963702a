"""What every lab module may count on, whatever state a person or an earlier run left the lab in."""

from __future__ import annotations

import pytest

from tests.lab.labutil import SPARE, clean_host, lab, lab_hosts


@pytest.fixture(scope="session", autouse=True)
def lab_plugged_in():
    """No host left cut off (a person's `lab.py cut`, or a fault test stopped midway): each is restored first.

    Hosts are not started or reconfigured here (`lab.py up`, `gpus --reset`): those mount host root
    filesystems, and the modules that change stand-in GPUs reset them themselves.
    """
    for name, host in lab_hosts().items():
        if host.get("cut"):
            lab("restore", name)
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
