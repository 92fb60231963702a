"""The systemd unit of a service, rendered in plain pytest (no host): layout, quoting, determinism."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from configuration import group_files, settings, stacks
from configuration.errors import DataError
from configuration.patch_sets import load_patch_set
from configuration.settings import REPO_ROOT
from operations.environment import venv_read
from operations.gpu import gpu_read, gpus
from operations.run import templates
from operations.service import service_inputs, service_user, units
from tests.unit.hosts import make_host

HEADER = "# Managed by sglang-deploy (pyinfra) - local edits are overwritten on the next deploy."


@pytest.fixture(autouse=True)
def fresh_key_sources(monkeypatch):
    monkeypatch.setattr(group_files, "_KEY_SOURCES", {})


def lab_data() -> dict:
    """The lab's data as pyinfra sees it: group_data/all.yml, then lab/group_data/all.yml key by key."""
    data = settings.load_group_yaml(str(REPO_ROOT / "group_data" / "all.py"))
    data.update(settings.load_group_yaml(str(REPO_ROOT / "lab" / "group_data" / "all.py")))
    return data


# The lab's stand-in GPUs (sm 12.0): the deploy renders units from the GPU plan, where
# `attention-backend: auto` becomes triton.
LAB_GPUS = gpu_read.GpuFacts(
    "/usr/bin/nvidia-smi", None, "580.159.04", "13.0",
    tuple(gpu_read.Gpu(i, f"GPU-{i}", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "12.0", 97887, 0, f"00000000:{i}:00.0") for i in range(2)),
    (), (),
)


def lab_config(run_services=("ddtree",), **service_patch):
    data = lab_data()
    if service_patch:
        data["services"] = {**data["services"], "ddtree": {**data["services"]["ddtree"], **service_patch}}
    return gpus.decide(settings.host_config(make_host(data, {"run_services": list(run_services)})), LAB_GPUS).config


def render(config, service=None, patch_digests=None, after_units=()):
    service = service or config.services[0]
    stack = stacks.load_stack(config.stack)
    return units.render_unit(config, service, stack, units.inputs_digest(stack, patch_digests or {}), after_units)


def exec_start_words(text: str) -> list[str]:
    """ExecStart= as systemd reads it: continuation lines joined, words unquoted, %% and $$ unescaped."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    logical = lines[start].removeprefix("ExecStart=")
    i = start
    while logical.endswith("\\"):
        i += 1
        logical = logical[:-1] + " " + lines[i]
    return [word.replace("%%", "%").replace("$$", "$") for word in shlex.split(logical)]


def environment_lines(text: str, sandbox: bool = False) -> dict[str, str]:
    """Environment= lines as systemd reads them: unquoted, %% unescaped, no $ expansion.

    Without `sandbox`, the service's own variables only (the sandbox's HOME and cache
    variables, the same in every unit, are tested in test_unit_sandbox.py).
    """
    out = {}
    for line in text.splitlines():
        if line.startswith("Environment="):
            (assignment,) = shlex.split(line.removeprefix("Environment="))
            name, _, value = assignment.replace("%%", "%").partition("=")
            out[name] = value
    if not sandbox:
        # PATH (the venv's bin/ first) is the unit's, like the sandbox's variables: tested in test_real_gpu_findings.py.
        # CUDA_DEVICE_ORDER is every unit's too: tested below.
        out = {k: v for k, v in out.items() if k not in service_user.runtime_environment() and k not in ("PATH", *units.GPU_ORDER)}
    return out


def test_every_unit_numbers_gpus_as_nvidia_smi_does():
    # `gpu` is nvidia-smi's index (the GPU check reads it); CUDA's own default order is fastest first.
    for name in ("ddtree", "dflash"):
        config = lab_config(run_services=("ddtree", "dflash"))
        text = render(config, next(s for s in config.services if s.name == name))
        assert environment_lines(text, sandbox=True)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


# The lab's unit ------------------------------------------------------------------------


def test_lab_unit_layout():
    config = lab_config()
    text = render(config)
    lines = text.splitlines()

    assert lines[0] == HEADER
    assert lines[1] == "# Service ddtree on gpu-a: stack lab-cpu-sglang, patch sets ddtree-sample."
    assert lines[2].startswith("# Inputs: stack lab-cpu-sglang ")
    assert "Description=SGLang server ddtree (port 30000, GPU 0)" in lines
    assert "After=network-online.target" in lines
    assert "Environment=CUDA_VISIBLE_DEVICES=0" in lines
    assert "Environment=SGLANG_DDTREE_MAX_TOPK=8" in lines
    assert "WorkingDirectory=/root/venv_sglang+ddtree-sample" in lines
    assert "ExecStart=/root/venv_sglang+ddtree-sample/bin/python -m sglang_standin.launch_server \\" in lines
    assert "[Install]" in lines and lines[-1] == "WantedBy=multi-user.target"


def test_lab_unit_has_one_flag_per_line():
    text = render(lab_config())
    lines = text.splitlines()
    start = lines.index("ExecStart=/root/venv_sglang+ddtree-sample/bin/python -m sglang_standin.launch_server \\")
    flags = []
    for line in lines[start + 1:]:
        flags.append(line)
        if not line.endswith(" \\"):
            break

    assert flags == [
        "    --model-path /dev/shm/Qwen3.6-27B \\",
        "    --speculative-draft-model-path /root/models/Qwen3.6-27B-DFlash \\",
        "    --host 127.0.0.1 \\",
        "    --port 30000 \\",
        "    --speculative-algorithm DDTREE \\",
        "    --speculative-dflash-block-size 16 \\",
        "    --speculative-ddtree-budget 15 \\",
        "    --attention-backend triton \\",
        "    --grammar-backend none",
    ]
    assert lines[start + 1 + len(flags)] == ""


def test_lab_unit_exec_start_is_the_services_argv():
    config = lab_config()
    service = config.services[0]
    assert exec_start_words(render(config)) == [f"{service.environment.path}/bin/python", "-m", "sglang_standin.launch_server", *service.argv()]


def test_each_service_gets_its_own_gpu_and_port():
    config = lab_config(run_services=("ddtree", "dflash"))
    dflash = config.services[1]
    text = render(config, dflash)

    assert environment_lines(text) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert "    --port 30001 \\" in text.splitlines()
    assert "Description=SGLang server dflash (port 30001, GPU 1)" in text.splitlines()


def test_several_gpus_and_patch_sets_in_the_unit():
    config = lab_config(gpu=[0, 1])
    service = dataclasses.replace(config.services[0], patch_sets=("ddtree-sample", "fix-2"))
    text = render(config, service, {"ddtree-sample": "1" * 64, "fix-2": "2" * 64}, after_units=("sglang-dflash.service",))
    lines = text.splitlines()

    assert lines[1] == "# Service ddtree on gpu-a: stack lab-cpu-sglang, patch sets ddtree-sample, fix-2."
    assert "Environment=CUDA_VISIBLE_DEVICES=0,1" in lines
    assert "Description=SGLang server ddtree (port 30000, GPU 0,1)" in lines
    assert "After=network-online.target sglang-dflash.service" in lines


def test_rendering_is_deterministic():
    first = render(lab_config())
    again = render(lab_config())
    assert first == again
    assert render(lab_config(), patch_digests={"p": "a"}) == render(lab_config(), patch_digests={"p": "a"})


# Quoting -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("triton", "triton"),
        ("/dev/shm/Qwen3.6-27B", "/dev/shm/Qwen3.6-27B"),
        ("CUDA_VISIBLE_DEVICES=0,1", "CUDA_VISIBLE_DEVICES=0,1"),
        ("0.85", "0.85"),
        ("50%", '"50%%"'),
        ("%h", '"%%h"'),
        ("$HOME", '"$$HOME"'),
        ("${X}", '"$${X}"'),
        ("a b", '"a b"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("it's", '"it\'s"'),
        ("back\\slash", '"back\\\\slash"'),
        ("semi;colon", '"semi;colon"'),
        ("", '""'),
    ],
)
def test_systemd_quote(value, quoted):
    assert templates.systemd_quote(value) == quoted


def test_flag_lines_group_values_with_their_flag():
    assert units.flag_lines(["--a", "1", "--b", "--c", "x y", "z"]) == ["--a 1", "--b", '--c "x y" z']


def test_awkward_values_survive_the_round_trip_through_exec_start():
    args = {
        "chat-template": "my template.jinja",
        "json-model-override-args": '{"rope_scaling": {"type": "yarn", "factor": 4.0}}',
        "served-model-name": "100% $HOME's model",
        "tokenizer-path": "C:\\tok\\",
        "cuda-graph-bs-decode": [1, "2 4"],
        "enable-metrics": True,
    }
    config = lab_config(args=args)
    service = config.services[0]
    words = exec_start_words(render(config))

    assert words == [f"{service.environment.path}/bin/python", "-m", "sglang_standin.launch_server", *service.argv()]
    assert "my template.jinja" in words and "100% $HOME's model" in words and "2 4" in words


def test_awkward_environment_values_are_quoted():
    config = lab_config(env={"SGLANG_NOTE": "two words", "SGLANG_PCT": "50%", "SGLANG_Q": 'say "hi"'})
    assert environment_lines(render(config)) == {
        "CUDA_VISIBLE_DEVICES": "0",
        "SGLANG_NOTE": "two words",
        "SGLANG_PCT": "50%",
        "SGLANG_Q": 'say "hi"',
    }


def test_dollar_in_an_environment_value_reaches_the_process_unchanged():
    config = lab_config(env={"SGLANG_TEMPLATE": "$HOME/x"})
    assert environment_lines(render(config))["SGLANG_TEMPLATE"] == "$HOME/x"


@pytest.mark.parametrize("path", ["/opt/sglang env", "/opt/sglang$x", "/opt/50%", '/opt/"q"'])
def test_venv_path_that_a_unit_file_would_split_or_expand_is_refused(path):
    data = lab_data()
    data["venv_path"] = path
    with pytest.raises(DataError) as caught:
        settings.host_config(make_host(data, {"run_services": ["ddtree"]}))
    assert "venv_path" in str(caught.value) and "it is written into unit files" in str(caught.value)


# Inputs digest -------------------------------------------------------------------------


def test_inputs_digest_changes_with_a_patch_digest_and_not_with_order():
    stack = stacks.load_stack("lab-standin")
    base = units.inputs_digest(stack, {})
    one = units.inputs_digest(stack, {"ddtree-sample": "a" * 64})
    other = units.inputs_digest(stack, {"ddtree-sample": "b" * 64})

    assert base.startswith("stack lab-standin ") and len(base.split()[-1]) == 16
    assert len({base, one, other}) == 3
    assert units.inputs_digest(stack, {"x": "1", "y": "2"}) == units.inputs_digest(stack, {"y": "2", "x": "1"})
    assert units.inputs_digest(stack, {"ddtree-sample": "a" * 64}) == one


def test_inputs_digest_follows_the_stacks_pins_not_its_file(tmp_path):
    stack = stacks.load_stack("lab-standin")
    (package,) = stack.packages
    repinned = dataclasses.replace(stack, packages=(dataclasses.replace(package, sha256="b" * 64),))
    assert units.inputs_digest(repinned, {}) != units.inputs_digest(stack, {})
    copy = tmp_path / "lab-standin.yml"
    copy.write_bytes(stack.path.read_bytes() + b"# a comment changes the file, not the stack\n")
    assert units.inputs_digest(dataclasses.replace(stack, path=copy), {}) == units.inputs_digest(stack, {})


def test_a_new_patch_digest_changes_the_unit_text():
    config = lab_config()
    service = dataclasses.replace(config.services[0], patch_sets=("ddtree-sample",))
    assert render(config, service, {"ddtree-sample": "a" * 64}) != render(config, service, {"ddtree-sample": "b" * 64})


# Drained stops (issue 48 item 2) ---------------------------------------------------------------

# The unit's stop lines as they were rendered before `stop_timeout_s` existed (TimeoutStopSec=60).
STOP_LINES = ("# SGLang has no sd_notify: the deploy polls /health for readiness; loading can take long.\n"
              "TimeoutStartSec=infinity\nTimeoutStopSec={}\nKillMode=mixed\nRestart=on-failure\n")


def test_the_default_stop_timeout_leaves_the_unit_as_it_was():
    """A converged host must not restart on upgrade: `stop_timeout_s: 60` (the default, written or not) renders the
    lines the unit always had, and the template's note about them stays in the template."""
    text = render(lab_config(stop_timeout_s=60))
    assert text == render(lab_config())
    assert STOP_LINES.format(60) in text
    assert "{#" not in text and "stop_timeout_s" not in text
    assert "KillSignal" not in text  # systemd's default, SIGTERM, on which sglang drains


def test_stop_timeout_s_is_the_units_timeout_stop_sec():
    text = render(lab_config(stop_timeout_s=120))
    assert STOP_LINES.format(120) in text
    assert text.replace("TimeoutStopSec=120\n", "TimeoutStopSec=60\n") == render(lab_config())


@pytest.mark.parametrize("value", [0, 3601, -5, "60", 1.5, True])
def test_a_stop_timeout_out_of_bounds_is_refused_naming_field_value_and_fix(value):
    with pytest.raises(DataError) as caught:
        lab_config(stop_timeout_s=value)
    error = caught.value
    assert (error.key_path, error.value) == ("services.ddtree.stop_timeout_s", value), str(error)
    assert error.fix == "must be whole seconds from 1 to 3600", str(error)
    assert "stop_timeout_s" in str(error) and "must be whole seconds from 1 to 3600" in str(error)


@pytest.mark.parametrize("value", [1, 3600])
def test_a_stop_timeout_at_its_bounds_passes(value):
    assert f"TimeoutStopSec={value}\n" in render(lab_config(stop_timeout_s=value))


def test_a_unit_runs_its_generation_not_the_live_link():
    """ExecStart and PATH name the venv generation of the service's stack and patch sets, so a replica kept on its
    old version (its rollout held) restarts on what it ran, whatever the live link says; the working directory stays
    the live venv."""
    config = lab_config()
    service = config.services[0]
    stack = stacks.load_stack(config.stack)
    patch_sets = {name: load_patch_set(name) for name in config.patch_sets}
    gen = venv_read.generation(service.environment.path, stack,
                          {name: patch_sets[name].digest for name in service.environment.patch_sets})
    text = service_inputs.unit_text(config, service, stack, patch_sets, ())
    assert f"ExecStart={gen.path}/bin/python -m " in text
    assert f"PATH={gen.path}/bin:" in text
    assert f"WorkingDirectory={service.environment.path}\n" in text
    assert f"{service.environment.path}/bin/python" not in text
