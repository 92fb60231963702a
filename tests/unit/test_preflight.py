"""Environments per (stack, patch sets), and the preflight's command and verdict."""

import json
import shlex

import pytest
import yaml

from configuration import settings
from configuration.settings import REPO_ROOT
from operations import preflight
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
    words = shlex.split(first_line.split("<<")[0].removeprefix("cd / && "))
    assert words[:2] == ["env", "-i"]
    # A real engine's parser asks the GPU for defaults: hidden GPUs fail it on a GPU host (H200, sglang 0.5.11).
    assert "CUDA_VISIBLE_DEVICES=1" in words and "CUDA_VISIBLE_DEVICES=" not in words
    assert "SGLANG_X=a b" in words
    assert words[-5:] == ["/root/venv_sglang/bin/python", "-I", "-", json.dumps(["--port", "30000"]), "sglang.launch_server"]
    assert "prepare_server_args" in cmd


@pytest.mark.parametrize("name", [
    "LD_PRELOAD", "LD_LIBRARY_PATH", "ld_audit", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "BASH_ENV",
    "GCONV_PATH", "MALLOC_CHECK_", "GLIBC_TUNABLES", "HOME", "PATH", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH",
    "FLASHINFER_WORKSPACE_BASE", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME", "HF_MODULES_CACHE", "TORCH_EXTENSIONS_CACHE",
])
def test_the_root_preflight_takes_no_variable_that_steers_a_loader_or_points_at_the_engines_caches(name):
    """The preflight runs as root, unsandboxed: a unit variable such as LD_PRELOAD, or PYTHONPATH into a directory the
    engine writes, would run the engine's code as root. Whatever the data's validation lets through, it is not passed."""
    cmd = preflight.command("/root/v", "sglang.launch_server", [], {name: "/var/lib/sglang/x", "SGLANG_DDTREE_MAX_TOPK": "8"})
    words = shlex.split(cmd.splitlines()[0].split("<<")[0].removeprefix("cd / && "))
    assigned = dict(w.split("=", 1) for w in words[2:words.index("/root/v/bin/python")])
    assert assigned.get(name) != "/var/lib/sglang/x"
    assert assigned["SGLANG_DDTREE_MAX_TOPK"] == "8" and assigned["HOME"] == "/root"
    assert "-I" in words  # isolated: PYTHON* ignored even if one got through, no user site, no cwd on sys.path


def test_the_isolated_preflight_still_parses_in_a_real_venv(tmp_path):
    """`python -I -` with the script on stdin still finds the venv's packages (pyvenv.cfg), and ignores PYTHONPATH."""
    import subprocess
    import sys

    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "sglang.py").write_text("raise SystemExit('planted sglang imported')\n")
    cmd = preflight.command(sys.prefix, "json", [], {"PYTHONPATH": str(planted)}).replace(
        f"{sys.prefix}/bin/python", sys.executable)
    # The data's own checks would refuse PYTHONPATH; force it past the filter to show -I alone also holds.
    cmd = cmd.replace("env -i ", f"env -i PYTHONPATH={planted} ", 1)
    proc = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "planted" not in json.dumps(result)


@pytest.mark.parametrize(("result", "expected"), [
    ({"parser": "sglang 0.5.23", "parse_error": None, "import_error": None}, None),
    ({"parser": "sglang 0.5.23", "parse_error": "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer", "import_error": None},
     "sglang 0.5.23 refuses the flags: sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer"),
    ({"parser": None, "parse_error": None, "import_error": "import sglang.launch_server: ModuleNotFoundError: No module named 'soundfile'"},
     "the server cannot start: import sglang.launch_server: ModuleNotFoundError: No module named 'soundfile'"),
])
def test_verdict(result, expected):
    assert preflight.verdict(result) == expected


# --dry: the preflight runs at once (a read-only fact) -------------------------------------


def run_dry(monkeypatch, verdict, sha1="0" * 40, inputs_changed=None):
    import sys
    from unittest import mock

    from pyinfra.context import ctx_host, ctx_state
    from pyinfra.facts.files import Sha1File

    monkeypatch.setattr(sys, "argv", ["pyinfra", "inventory.py", "deploy.py", "--dry"])
    host = make_host({})
    answers = {Sha1File: sha1, preflight.Verdict: verdict}
    asked = []

    def get_fact(cls, **kwargs):
        asked.append(cls)
        return answers[cls]

    with (
        mock.patch.object(host, "get_fact", side_effect=get_fact), mock.patch.object(host, "log") as log,
        mock.patch.object(host, "log_styled") as styled, mock.patch.object(host, "noop"),
        ctx_state.use(host.state), ctx_host.use(host),
    ):
        commands = list(preflight.passed._inner(
            service="dflash", venv_path="/root/venv_sglang", launcher="sglang.launch_server", argv=["--port", "30001"],
            environment={}, endpoint="e", unit_path="/etc/systemd/system/sglang-dflash.service", unit_text="[Unit]\n",
            inputs_changed=inputs_changed,
        ))
    lines = [c.args[0] for c in log.call_args_list] + [c.args[0] for c in styled.call_args_list]
    return commands, lines, host in host.state.failed_hosts, asked


def test_dry_run_shows_the_parsers_refusal_and_fails(monkeypatch):
    refused = {"parser": "sglang 0.5.23", "parse_error": "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer", "import_error": None}
    _, lines, failed, asked = run_dry(monkeypatch, refused)
    assert preflight.Verdict in asked and failed
    assert ("dflash: PREFLIGHT WILL FAIL, unit and running service would be left as they are: sglang 0.5.23 refuses the flags: "
            "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer") in lines


def test_dry_run_that_passes_or_cannot_check_yet_does_not_fail(monkeypatch):
    _, lines, failed, _ = run_dry(monkeypatch, {"parser": "sglang 0.5.23", "parse_error": None, "import_error": None})
    assert not failed and "dflash: preflight would pass (sglang 0.5.23)" in lines
    _, lines, failed, _ = run_dry(monkeypatch, {"absent": True})
    assert not failed and "dflash: preflight runs once this run has built /root/venv_sglang" in lines


def test_dry_run_names_the_inputs_the_run_changes_first(monkeypatch):
    from pyinfra.api.operation import OperationMeta

    from operations.this_run import Inputs

    passing = {"parser": "sglang 0.5.23", "parse_error": None, "import_error": None}
    rebuilt, same, probe = OperationMeta("a", True), OperationMeta("b", False), OperationMeta("c", True)
    _, lines, failed, asked = run_dry(monkeypatch, passing, inputs_changed=Inputs((("b", same, False), ("a", rebuilt, False), ("c", probe, True))))
    assert preflight.Verdict in asked and not failed
    assert "dflash: preflight would pass (sglang 0.5.23) (the run first changes: a)" in lines
    _, lines, _, _ = run_dry(monkeypatch, passing, inputs_changed=Inputs((("b", same, False),)))
    assert "dflash: preflight would pass (sglang 0.5.23)" in lines


def test_verdict_fact_reports_a_missing_venv_without_running_it():
    cmd = preflight.Verdict().command(venv_path="/root/v", cmd="echo hi")
    assert cmd.startswith("if [ -x /root/v/bin/python ]; then\necho hi\nelse echo '{\"absent\": true}'; fi")
    assert preflight.Verdict().process(['{"absent": true}']) == {"absent": True}


def test_a_refusal_quoting_a_credential_is_masked():
    """The parser's message quotes what it refused: a credential the run was never told about is masked too."""
    reason = preflight.verdict({"parser": "sglang 0.5.23", "import_error": None,
                                "parse_error": "error: argument --hf-token: invalid value hf_token=hf_abcdefghijklmnopqrstu"})
    assert "hf_abcdefghijklmnopqrstu" not in reason and "hf_token=<redacted>" in reason
