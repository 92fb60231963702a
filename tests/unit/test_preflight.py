"""Environments per (stack, patch sets), and the preflight's command and verdict."""

import json
import shlex

import pytest
import yaml

from operations import preflight, settings
from operations.settings import REPO_ROOT
from tests.unit.hosts import make_host


def lab_data() -> dict:
    data = yaml.safe_load((REPO_ROOT / "group_data" / "all.yml").read_text())
    data.update(yaml.safe_load((REPO_ROOT / "lab" / "group_data" / "all.yml").read_text()))
    return data


def test_services_that_agree_on_patch_sets_share_a_venv_and_others_get_a_sibling():
    data = lab_data()
    data["services"]["third"] = {**data["services"]["dflash"], "gpu": 2, "port": 30002}
    config = settings.host_config(make_host(data, {"run_services": ["ddtree", "dflash", "third"]}))
    paths = {s.name: s.environment.path for s in config.services}
    assert paths == {
        "ddtree": "/root/venv_sglang+ddtree-sample",
        "dflash": "/root/venv_sglang",
        "third": "/root/venv_sglang",
    }
    assert [e.path for e in config.environments] == ["/root/venv_sglang+ddtree-sample", "/root/venv_sglang"]


def test_a_services_venv_does_not_depend_on_its_neighbours():
    alone = settings.host_config(make_host(lab_data(), {"run_services": ["ddtree"]}))
    together = settings.host_config(make_host(lab_data(), {"run_services": ["dflash", "ddtree"]}))
    assert alone.services[0].environment == [s for s in together.services if s.name == "ddtree"][0].environment


def test_preflight_command_runs_the_venv_python_in_a_clean_environment_with_the_units_gpus():
    cmd = preflight.command("/root/venv_sglang", "sglang.launch_server", ["--port", "30000"], {"CUDA_VISIBLE_DEVICES": "1", "SGLANG_X": "a b"})
    first_line = cmd.splitlines()[0]
    words = shlex.split(first_line.split("<<")[0])
    assert words[:2] == ["env", "-i"]
    # A real engine's parser asks the GPU for defaults: hidden GPUs fail it on a GPU host (H200, sglang 0.5.11).
    assert "CUDA_VISIBLE_DEVICES=1" in words and "CUDA_VISIBLE_DEVICES=" not in words
    assert "SGLANG_X=a b" in words
    assert words[-4:] == ["/root/venv_sglang/bin/python", "-", json.dumps(["--port", "30000"]), "sglang.launch_server"]
    assert "prepare_server_args" in cmd


@pytest.mark.parametrize(("result", "expected"), [
    ({"parser": "sglang 0.5.23", "parse_error": None, "import_error": None}, None),
    ({"parser": "sglang 0.5.23", "parse_error": "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer", "import_error": None},
     "sglang 0.5.23 refuses the flags: sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer"),
    ({"parser": None, "parse_error": None, "import_error": "import sglang.launch_server: ModuleNotFoundError: No module named 'soundfile'"},
     "the server cannot start: import sglang.launch_server: ModuleNotFoundError: No module named 'soundfile'"),
])
def test_verdict(result, expected):
    assert preflight.verdict(result) == expected
