"""What the real stack on a real GPU showed that the lab could not (bench/gpu_serve_check.sh on an H200,
bench/results/h200-2026-12-01-*), each kept from coming back by a test that runs without a GPU."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from configuration import settings
from configuration.errors import DataError
from configuration.settings import REPO_ROOT
from operations import remote
from operations.gpu import gpu_read, gpus
from operations.service import preflight
from tests.served_sets import served_copy
from tests.unit.hosts import make_host
from tests.unit.test_units import lab_config, lab_data, render
from tests.unit.test_venv import _fake_venv, _remote

H200 = gpu_read.GpuFacts("/usr/bin/nvidia-smi", None, "580.159.04", "13.0", (gpu_read.Gpu(0, "GPU-0", "NVIDIA H200", "9.0", 143771, 0, "00000000:00:06.0"),), (), ())


def _serve_module():
    spec = importlib.util.spec_from_file_location("gpu_serve", REPO_ROOT / "bench/gpu/serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# 1. sglang-kernel 0.4.2's wheel has no top_level.txt: the probe imported `sglang_kernel` and failed.


def _probe(tmp_path: Path, dist: str, top_level: str | None) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch/__init__.py").write_text(
        "__version__ = '2.11.0+cu130'\nclass version:\n    cuda = '13.0'\nclass cuda:\n    is_available = staticmethod(lambda: False)\n"
    )
    (site / "sgl_kernel").mkdir()
    (site / "sgl_kernel/__init__.py").write_text("LOADED = True\n")
    info = site / f"{dist.replace('-', '_')}-0.4.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.4.2\n\n")
    (info / "RECORD").write_text("sgl_kernel/__init__.py,,\n")
    if top_level is not None:
        (info / "top_level.txt").write_text(top_level)
    args = json.dumps({"kernels": [dist], "modules": [], "driver_cuda": "13.0", "compute_caps": []})
    return subprocess.run([sys.executable, "-", args], input=remote.script("abi_probe"), capture_output=True, text=True, env={"PYTHONPATH": str(site)})


@pytest.mark.parametrize("dist", ["sglang-kernel", "sgl-kernel"])
def test_probe_imports_a_kernel_wheel_without_top_level_txt_by_its_package(tmp_path, dist):
    result = _probe(tmp_path, dist, None)
    assert result.returncode == 0, result.stdout + result.stderr


def test_probe_still_fails_when_the_kernel_package_is_missing(tmp_path):
    result = _probe(tmp_path, "sglang-kernel", "no_such_package\n")
    assert result.returncode != 0
    assert "no_such_package" in result.stdout + result.stderr


# 2. flashinfer-python and torch-c-dlpack-ext both ship a top-level build_backend.py of their own.


def test_a_loose_file_two_wheels_ship_is_neither_damage_nor_a_conflict(tmp_path):
    venv = _fake_venv(tmp_path / "g", {"flashinfer-python": ["flashinfer/__init__.py", "build_backend.py"], "torch-c-dlpack-ext": ["torch_c_dlpack_ext/__init__.py", "build_backend.py"]})
    out = json.loads(_remote("venv_state", str(venv), str(venv), str(tmp_path / "cache"), "/nonexistent/uv").stdout)["wanted"]
    assert out["shared"] == {}
    assert [d["damaged_count"] for d in out["dists"].values()] == [0, 0]


def test_a_loose_shared_file_matching_neither_claimant_is_damage(tmp_path):
    venv = _fake_venv(tmp_path / "g", {"flashinfer-python": ["build_backend.py"], "torch-c-dlpack-ext": ["build_backend.py"]})
    (venv / "lib/python3.11/site-packages/build_backend.py").write_text("edited by hand, another size\n")
    out = json.loads(_remote("venv_state", str(venv), str(venv), str(tmp_path / "cache"), "/nonexistent/uv").stdout)["wanted"]
    assert [d["damaged"] for d in out["dists"].values()] == [["build_backend.py"], ["build_backend.py"]]


def test_a_package_directory_two_wheels_ship_is_still_a_conflict(tmp_path):
    venv = _fake_venv(tmp_path / "g", {"sgl-kernel": ["sgl_kernel/__init__.py"], "sglang-kernel": ["sgl_kernel/__init__.py"]})
    out = json.loads(_remote("venv_state", str(venv), str(venv), str(tmp_path / "cache"), "/nonexistent/uv").stdout)["wanted"]
    assert out["shared"] == {"sgl_kernel": ["sgl-kernel", "sglang-kernel"]}


# 3. The preflight hid the GPUs: sglang 0.5.11's parser on an H200 stopped with "No accelerator ... is available".


def test_preflight_sees_the_units_gpus():
    cmd = preflight.command("/root/venv_sglang", "sglang.launch_server", [], {"CUDA_VISIBLE_DEVICES": "3"})
    words = shlex.split(cmd.splitlines()[0].split("<<")[0])
    assert [w for w in words if w.startswith("CUDA_VISIBLE_DEVICES=")] == ["CUDA_VISIBLE_DEVICES=3"]


# 4. sglang 0.5.11's JIT kernels build with the venv's `ninja`: the unit's PATH must hold the venv's bin/.


def test_the_units_path_starts_with_its_venvs_bin():
    config = lab_config()
    unit = _serve_module().parse_unit(render(config))
    venv = config.services[0].environment.path
    assert unit["env"]["PATH"].split(":")[0] == f"{venv}/bin"
    assert unit["argv"][0] == f"{venv}/bin/python"


def test_a_path_set_in_the_services_env_wins():
    config = lab_config(env={"PATH": "/opt/tools/bin:/usr/bin:/bin"})
    assert _serve_module().parse_unit(render(config))["env"]["PATH"] == "/opt/tools/bin:/usr/bin:/bin"


def test_the_serve_check_starts_exactly_the_units_argv_and_environment():
    config = lab_config(env={"SGLANG_NOTE": "two words", "SGLANG_PCT": "50%", "SGLANG_TEMPLATE": "$HOME/x"})
    service = config.services[0]
    unit = _serve_module().parse_unit(render(config))
    assert unit["argv"][unit["argv"].index("-m") + 2:] == service.argv()
    assert {k: unit["env"][k] for k in ("SGLANG_NOTE", "SGLANG_PCT", "SGLANG_TEMPLATE")} == {"SGLANG_NOTE": "two words", "SGLANG_PCT": "50%", "SGLANG_TEMPLATE": "$HOME/x"}
    assert unit["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, service.gpus))


# 5. sglang 0.5.11, fa3 (its default on sm 9.0) and its piecewise CUDA graph: CUBLAS_STATUS_EXECUTION_FAILED at start.


def _h200_config(engine=None, **args):
    """A service on the engine's own stack: its flags are validated against that engine's flag list."""
    data = lab_data()
    if engine == "0.5.11":
        data["stack"] = "sglang-0.5.11-cu130"
    data["services"] = {"svc": {"gpu": 0, "port": 30100, "model": "Qwen3.6-27B", "args": {"attention-backend": "auto", **args}}}
    return settings.host_config(make_host(data, {"run_services": ["svc"]}))


@pytest.mark.parametrize(
    ("engine", "args", "refused"),
    [
        ("0.5.11", {}, True),
        ("0.5.11", {"attention-backend": "fa3"}, True),
        ("0.5.11", {"disable-piecewise-cuda-graph": True}, False),
        ("0.5.11", {"attention-backend": "triton"}, False),
        ("0.5.23", {}, False),
        (None, {}, False),
    ],
)
def test_the_gpu_check_refuses_the_combination_that_died_on_the_h200(engine, args, refused):
    plan = gpus.decide(_h200_config(engine, **args), H200, engine)
    errors = [e for e in plan.errors if "piecewise CUDA graph" in e]
    assert bool(errors) == refused
    if refused:
        assert errors[0].startswith("svc: sglang 0.5.11") and "disable-piecewise-cuda-graph: true" in errors[0]


def test_the_combination_is_not_refused_on_sm_12():
    blackwell = dataclasses.replace(H200, gpus=(gpu_read.Gpu(0, "GPU-0", "NVIDIA RTX PRO 6000", "12.0", 97887, 0, "b"),))
    assert not [e for e in gpus.decide(_h200_config("0.5.11"), blackwell, "0.5.11").errors if "piecewise" in e]


# 7. DDTree's port (sglang 0.5.13 + PR #27509 + the fixes) served on triton and died on fa3, sglang's default on sm 9.0
#    (bench/results/h200-2026-12-03-b2ac97c-ddtree-auto.txt): its manifest names triton, and `auto` is held to it here.


@pytest.fixture
def served_on_triton(tmp_path, monkeypatch):
    """ddtree-sample's files as `served-triton`, whose manifest names triton as the one backend it served on."""
    from configuration import patch_sets
    shutil.copytree(patch_sets.PATCHES_DIR, tmp_path / "patches")
    served_copy(tmp_path / "patches", "served-triton")
    monkeypatch.setattr(patch_sets, "PATCHES_DIR", tmp_path / "patches")
    patch_sets.load_patch_set.cache_clear()
    yield
    patch_sets.load_patch_set.cache_clear()


def _served_config(**args):
    data = lab_data()
    data["services"] = {"svc": {"gpu": 0, "port": 30100, "model": "Qwen3.6-27B", "patch_sets": ["served-triton"],
                                "args": {"attention-backend": "auto", **args}}}
    return settings.host_config(make_host(data, {"run_services": ["svc"]}))


def test_auto_resolved_to_sglangs_default_is_refused_for_a_set_served_only_on_triton(served_on_triton):
    plan = gpus.decide(_served_config(), H200, "0.5.23")
    assert plan.errors == (
        "svc: `attention-backend: auto` gives sglang's default on sm 9.0 here, and patch set served-triton was served "
        "only on triton (its manifest's attention_backends): set `attention-backend: triton`, or serve the set on that "
        "backend on a GPU first (bench/ddtree/gpu_run.sh) and add it with `python -m tools.patchset_build --attention-backend`",
    )


def test_auto_resolved_to_triton_is_accepted(served_on_triton):
    blackwell = dataclasses.replace(H200, gpus=(gpu_read.Gpu(0, "GPU-0", "NVIDIA RTX PRO 6000", "12.0", 97887, 0, "b"),))
    plan = gpus.decide(_served_config(), blackwell, "0.5.23")
    assert plan.errors == () and dict(plan.config.services[0].args)["attention-backend"] == "triton"


def test_a_backend_named_in_the_data_is_the_control_machines_to_refuse(served_on_triton):
    with pytest.raises(DataError, match="patch set served-triton was served only on triton"):
        _served_config(**{"attention-backend": "fa3"})
    plan = gpus.decide(_served_config(**{"attention-backend": "triton"}), H200, "0.5.23")
    assert plan.errors == ()


# 6. The donor of the real story is a venv beside the one the deploy builds, on the same host.


def test_a_donor_may_be_a_venv_at_a_path_on_this_host():
    data = {**lab_data(), "stack_sources": [{"donor": "gpu-a", "path": "/opt/torch/.venv"}, "wheelhouse"]}
    config = settings.host_config(make_host(data, {"run_services": ["ddtree"]}, name="gpu-a"))
    assert config.stack_sources[0] == ("donor", "gpu-a", "/opt/torch/.venv")


@pytest.mark.parametrize(
    ("entry", "key", "fix"),
    [
        ({"donor": "gpu-a"}, "stack_sources[0].donor", "add `path:`"),
        ({"donor": "gpu-a", "path": "/root/venv_sglang"}, "stack_sources[0].path", "is this host's own venv_path"),
        ({"donor": "gpu-a", "path": "relative/venv"}, "stack_sources[0].path", "must be an absolute path"),
        ({"donor": "gpu-z", "path": "/opt/v"}, "stack_sources[0].donor", "must name a host of the inventory"),
    ],
)
def test_a_bad_donor_entry_names_the_key_and_the_fix(entry, key, fix):
    data = {**lab_data(), "stack_sources": [entry]}
    with pytest.raises(DataError) as caught:
        settings.host_config(make_host(data, {"run_services": ["ddtree"]}, name="gpu-a"))
    assert key in str(caught.value) and fix in str(caught.value)


def test_a_same_host_donor_copies_with_cp_on_the_host_and_rewrites_the_scripts(tmp_path):
    from operations.environment import venv_copy, venv_read

    donor = _fake_venv(tmp_path / "donor", {"torch": ["torch/__init__.py", "torch/lib/x.so"], "numpy": ["numpy/__init__.py"]})
    (donor / "bin/torchrun").write_text(f"#!{donor}/bin/python\nimport torch\n")
    gen = venv_read.Generation(str(tmp_path / "venv"), "g1")
    Path(gen.path, "lib/python3.11/site-packages").mkdir(parents=True)
    Path(gen.path, "bin").mkdir()
    for name in ("torch", "numpy"):
        info = donor / f"lib/python3.11/site-packages/{name}-1.0.dist-info/RECORD"
        info.write_text(info.read_text() + ("../../../bin/torchrun,,\n" if name == "torch" else ""))
    result = subprocess.run(["sh", "-c", venv_copy.copy_within_host(str(donor), gen, ["torch==1.0"])], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    site = Path(gen.path, "lib/python3.11/site-packages")
    assert (site / "torch/lib/x.so").read_text() == "torch torch/lib/x.so\n"
    assert not (site / "numpy").exists()  # only what was asked for
    assert (site / "torch/lib/x.so").stat().st_ino != (donor / "lib/python3.11/site-packages/torch/lib/x.so").stat().st_ino
    assert Path(gen.path, "bin/torchrun").read_text().startswith(f"#!{gen.path}/bin/python")


def test_a_same_host_donor_copy_fails_when_the_donor_lacks_the_pin(tmp_path):
    from operations.environment import venv_copy, venv_read

    donor = _fake_venv(tmp_path / "donor", {"torch": ["torch/__init__.py"]})
    gen = venv_read.Generation(str(tmp_path / "venv"), "g1")
    Path(gen.path, "bin").mkdir(parents=True)
    result = subprocess.run(["sh", "-c", venv_copy.copy_within_host(str(donor), gen, ["torch==9.9"])], capture_output=True, text=True)
    assert result.returncode != 0


# 3. The lab's lightest stack (lab-standin: the stand-in server alone) has no torch: the probe imported it anyway.


def _probe_without_torch(tmp_path: Path, with_kernel: bool) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    (site / "standin_entry").mkdir(parents=True)
    (site / "standin_entry/__init__.py").write_text("ENTRY = True\n")
    kernels = []
    if with_kernel:
        info = site / "sglang_kernel-0.4.2.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-kernel\nVersion: 0.4.2\n\n")
        kernels = ["sglang-kernel"]
    args = json.dumps({"kernels": kernels, "modules": ["standin_entry"], "driver_cuda": None, "compute_caps": [], "torch": False})
    return subprocess.run([sys.executable, "-", args], input=remote.script("abi_probe"), capture_output=True, text=True, env={"PYTHONPATH": str(site)})


def test_a_stack_without_torch_is_probed_for_its_entry_point_alone(tmp_path):
    result = _probe_without_torch(tmp_path, with_kernel=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["torch"] is None


def test_a_kernel_in_a_stack_without_torch_fails_the_probe_and_says_why(tmp_path):
    result = _probe_without_torch(tmp_path, with_kernel=True)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "ABI probe failed: sglang-kernel 0.4.2 is installed, and the stack names no torch for it: add torch to the stack"
    )


def test_the_probe_is_told_whether_the_stack_has_torch():
    from configuration import stacks
    from operations.environment import venv_probe

    assert venv_probe.probe_for(stacks.load_stack("lab-standin"), "sglang.launch_server", {})["torch"] is False
    assert venv_probe.probe_for(stacks.load_stack("lab-cpu-sglang"), "sglang.launch_server", {})["torch"] is True
