"""What a host must have before anything is built (issue 50 item 1): the host's read (`HostBasics`, run here in
a real shell) and the judgement (`refusals`), one class per case, each refusal naming what to install or change."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from configuration import stacks
from operations.gpu import prerequisites as P
from tests.unit.test_units import LAB_GPUS, lab_config

REAL = stacks.load_stack("sglang-0.5.23-cu130")
OK = {"uid": 0, "init": "systemd", "glibc": (2, 36), "python": "/usr/bin/python3.12", "free": {}, "staged": {}}


@pytest.fixture
def config():
    return lab_config(run_services=("ddtree", "dflash"))


def shm_models(config):
    return [m for m in config.staged_models]


def test_a_host_with_everything_is_refused_nothing(config):
    assert P.refusals(config, REAL, OK, LAB_GPUS) == []


@pytest.mark.parametrize(("change", "expected"), [
    ({"uid": 1000}, "runs as uid 1000 there, not root"),
    ({"init": "init"}, "its init is init, not systemd"),
    ({"python": None}, "python3.12 not found on the host: stack sglang-0.5.23-cu130 builds its venv with it; install"),
    ({"glibc": (2, 31)}, "glibc 2.31 there, stack sglang-0.5.23-cu130's wheels need 2.34 or newer (cryptography-"),
], ids=["not-root", "no-systemd", "no-python", "old-glibc"])
def test_each_missing_prerequisite_is_one_refusal_naming_its_fix(config, change, expected):
    (refusal,) = P.refusals(config, REAL, {**OK, **change}, LAB_GPUS)
    assert expected in refusal, refusal


@pytest.mark.parametrize(("driver", "refused"), [("12.8", True), ("12.9", True), ("13.0", False), ("13.2", False)])
def test_a_driver_older_than_the_stacks_cuda_is_refused(config, driver, refused):
    facts = dataclasses.replace(LAB_GPUS, cuda_version=driver)
    found = P.refusals(config, REAL, OK, facts)
    assert bool(found) == refused, found
    if refused:
        assert found == [f"the driver supports CUDA {driver}, stack sglang-0.5.23-cu130 is built for CUDA 13.0: install an "
                         "NVIDIA driver that supports CUDA 13.0 (nvidia-smi's header says which), then reboot"]


def test_a_cpu_stack_needs_no_driver_and_the_real_stacks_name_theirs():
    assert stacks.load_stack("lab-cpu-sglang").cuda is None
    assert REAL.cuda == (13, 0)
    needs, wheel = P.stack_glibc(REAL)
    assert needs == (2, 34) and wheel.endswith(".whl")


@pytest.mark.parametrize(("filename", "glibc"), [
    ("x-1-py3-none-any.whl", None),
    ("x-1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", (2, 17)),
    ("x-1-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl", (2, 24)),
    ("x-1-cp312-cp312-manylinux_2_28_x86_64.whl", (2, 28)),
    ("x-1-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl", (2, 12)),
    ("x-1-cp312-cp312-manylinux1_x86_64.whl", (2, 5)),
    ("x-1-cp312-cp312-musllinux_1_2_x86_64.whl", None),
])
def test_a_wheel_runs_on_the_oldest_glibc_its_tags_name(filename, glibc):
    assert P.wheel_glibc(filename) == glibc


def test_models_still_to_stage_against_the_room_in_ram(config):
    sizes = {m.store_path: 30 * 2**30 for m in config.staged_models}
    facts = dataclasses.replace(LAB_GPUS, model_bytes=sizes)
    need = 30 * 2**30 * len(config.staged_models)
    assert P.refusals(config, REAL, {**OK, "free": {config.shm_dir: need}}, facts) == []
    (refusal,) = P.refusals(config, REAL, {**OK, "free": {config.shm_dir: need - 1}}, facts)
    assert refusal.startswith(f"{config.shm_dir} has ") and "model_in: store" in refusal and "remount" in refusal
    # what is staged already needs no more room
    staged = {m.load_path: 30 * 2**30 for m in config.staged_models}
    assert P.refusals(config, REAL, {**OK, "free": {config.shm_dir: 0}, "staged": staged}, facts) == []


def test_the_read_runs_in_a_plain_shell_and_is_parsed(tmp_path):
    staged = tmp_path / "model"
    staged.mkdir()
    (staged / "w.bin").write_bytes(b"x" * 5000)
    python = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    fact = P.HostBasics()
    for name, found in ((python, True), ("python9.99", False)):
        command = fact.command(python=name, paths=[str(tmp_path / "not-yet" / "venv")], staged=[str(staged), "/nonexistent"])
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
        read = fact.process(out.splitlines())
        assert bool(read["python"]) == found, out
        assert read["free"][str(tmp_path / "not-yet" / "venv")] > 0
        assert read["staged"] == {str(staged): pytest.approx(5000, abs=8192)}
        assert read["init"] and isinstance(read["uid"], int)
        assert read["glibc"] is None or read["glibc"] >= (2, 17)
