"""GPU facts and decisions: nvidia-smi's real output and the lab stand-in's in, facts and decisions out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configuration import group_files, settings
from configuration.settings import REPO_ROOT
from operations import remote
from operations.gpu import gpu_read, gpus
from tests.unit.hosts import make_host

# Real output of driver 580.159.04 on one H200 (shared/fixtures/h200-probe.txt).
H200_TABLE = """\
Sun Nov 29 22:02:23 2026       
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H200                    On  |   00000000:00:06.0 Off |                    0 |
| N/A   41C    P0            127W /  700W |       0MiB / 143771MiB |      0%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
"""
H200_QUERY_FIELDS = (
    "index,uuid,name,compute_cap,memory.total,memory.used,driver_version,pstate,temperature.gpu,utilization.gpu,"
    "ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure,clocks_throttle_reasons.hw_slowdown"
)
H200_QUERY = "0, GPU-f7c77805-5010-e7b3-2b81-4ad38173a1b2, NVIDIA H200, 9.0, 143771, 0, 580.159.04, P0, 41, 0, 0, [N/A], No, No, Not Active\n"
H200_Q_HEADER = """
==============NVSMI LOG==============

Timestamp                                              : Sun Nov 29 22:02:23 2026
Driver Version                                         : 580.159.04
CUDA Version                                           : 13.0

Attached GPUs                                          : 1
"""
STANDIN = REPO_ROOT / "lab" / "nvidia-smi"
TARGET, DRAFT = "Qwen3.6-27B", "Qwen3.6-27B-DFlash"


# Parsing ----------------------------------------------------------------------------------


def test_h200_header_gives_driver_and_cuda():
    assert gpu_read.parse_header(H200_TABLE) == ("580.159.04", "13.0")
    assert gpu_read.parse_header(H200_Q_HEADER) == ("580.159.04", "13.0")


def test_h200_query_row():
    (gpu,) = gpu_read.parse_query_gpu(H200_QUERY, H200_QUERY_FIELDS)
    assert gpu == gpu_read.Gpu(0, "GPU-f7c77805-5010-e7b3-2b81-4ad38173a1b2", "NVIDIA H200", "9.0", 143771, 0, "", ())
    assert gpu.healthy  # "[N/A]" retired pages (H200 uses row remapping) is not a problem


def test_h200_table_has_no_errors_and_empty_compute_apps():
    assert gpu_read.parse_table_errors(H200_TABLE) == set()
    assert gpu_read.parse_compute_apps("") == []


def test_health_fields_become_problems():
    fields = "index,uuid,name,compute_cap,memory.total,memory.used,driver_version,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure"
    text = (
        "0, GPU-a, NVIDIA H200, 9.0, 143771, 0, 580.159.04, 00000000:18:00.0, 2, Yes, Yes, Yes\n"
        "1, GPU-b, NVIDIA H200, 9.0, [GPU requires reset], [GPU requires reset], 580.159.04, 00000000:2A:00.0, "
        "[GPU requires reset], [GPU requires reset], [GPU requires reset], [GPU requires reset]\n"
    )
    first, second = gpu_read.parse_query_gpu(text, fields)
    assert first.problems == (
        "2 uncorrectable ECC errors since the driver loaded", "retired pages pending (reset the GPU)",
        "row remapping pending (reset the GPU)", "row remapping failed",
    )
    assert second.problems == ("nvidia-smi reads [GPU requires reset]",) and second.memory_total_mib is None


def test_missing_gpu_message_is_parsed_once_per_bus_id():
    err = "Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error\n" * 3
    assert gpu_read.parse_missing(err) == ["0000:2A:00.0"]


def test_h200_busy_with_a_real_process():
    # Real output on the H200 while a torch process held 8 GiB (driver 580.159.04).
    fields = "index,uuid,name,compute_cap,memory.total,memory.used,driver_version,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure"
    query = "0, GPU-51421db1-6b43-fafe-5aba-44453c3b6da5, NVIDIA H200, 9.0, 143771, 8719, 580.159.04, 00000000:00:06.0, 0, [N/A], No, No\n"
    apps = "452, GPU-51421db1-6b43-fafe-5aba-44453c3b6da5, 8710\n"
    (h200,) = gpu_read.parse_query_gpu(query, fields)
    assert (h200.memory_used_mib, h200.bus_id, h200.healthy) == (8719, "00000000:00:06.0", True)
    assert gpu_read.parse_compute_apps(apps) == [gpu_read.App(452, "GPU-51421db1-6b43-fafe-5aba-44453c3b6da5", 8710)]


def test_compute_apps_rows():
    assert gpu_read.parse_compute_apps("4242, GPU-a, 81234\n17, GPU-b, [N/A]\n") == [gpu_read.App(4242, "GPU-a", 81234), gpu_read.App(17, "GPU-b", None)]


# The fact script, run here against the lab's stand-in nvidia-smi --------------------------


def standin_config(tmp_path: Path, count=2, name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition", cap="12.0", mib=97887,
                   states=None, processes=()) -> Path:
    buses = ["18", "2A", "3A", "5D"]
    cfg = {
        "driver_version": "580.159.04", "cuda_version": "13.0",
        "gpus": [{
            "index": i, "name": name, "uuid": f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd", "serial": f"165372405088{i}",
            "bus_id": f"00000000:{buses[i]}:00.0", "compute_cap": cap, "memory_total_mib": mib, "memory_used_mib": 0,
            "state": (states or {}).get(i, "ok"),
        } for i in range(count)],
        "processes": [{"gpu_index": g, "pid": pid, "used_memory_mib": used, "name": "python3"} for g, pid, used in processes],
    }
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(cfg))
    return path


def run_fact_script(tmp_path: Path, config: Path | None, units: dict[str, str] | None = None, models: dict[str, dict[str, int]] | None = None) -> gpu_read.GpuFacts:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if config is not None:
        wrapper = bin_dir / "nvidia-smi"
        wrapper.write_text(f"#!/bin/sh\nLAB_GPUS_JSON={config} exec {sys.executable} {STANDIN} \"$@\"\n")
        wrapper.chmod(0o755)
    unit_dir = tmp_path / "units"
    unit_dir.mkdir(exist_ok=True)
    for name, text in (units or {}).items():
        (unit_dir / name).write_text(text)
    model_paths = []
    for model, files in (models or {}).items():
        folder = tmp_path / "models" / model
        folder.mkdir(parents=True)
        for rel, size in files.items():
            (folder / rel).write_bytes(size if isinstance(size, bytes) else b"\0" * size)  # content, or a size
        model_paths.append(str(folder))
    script = remote.script("gpu_state")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-", str(unit_dir), *model_paths], input=script, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return gpu_read.GpuState().process(proc.stdout.splitlines())


def test_fact_from_the_standin_defaults(tmp_path):
    facts = run_fact_script(tmp_path, standin_config(tmp_path))
    assert (facts.error, facts.driver_version, facts.cuda_version, facts.missing) == (None, "580.159.04", "13.0", ())
    assert [(g.index, g.compute_cap, g.memory_total_mib, g.healthy) for g in facts.gpus] == [(0, "12.0", 97887, True), (1, "12.0", 97887, True)]
    assert facts.gpus[1].bus_id == "00000000:2A:00.0" and facts.gpus[1].uuid.startswith("GPU-00000001")


def test_fact_marks_a_gpu_that_requires_reset(tmp_path):
    facts = run_fact_script(tmp_path, standin_config(tmp_path, states={1: "failed"}))
    assert facts.gpus[0].healthy
    assert facts.gpus[1].problems == ("nvidia-smi reads [GPU requires reset]",)


def test_fact_with_a_missing_gpu_still_answers_and_exits_0(tmp_path):
    # The stand-in prints the device-handle error on stderr and exits 15 for every query.
    facts = run_fact_script(tmp_path, standin_config(tmp_path, count=3, states={1: "missing"}))
    assert facts.error is None
    assert [g.index for g in facts.gpus] == [0, 2]
    assert facts.missing == ("0000:2A:00.0",)


def test_fact_lists_compute_apps(tmp_path):
    facts = run_fact_script(tmp_path, standin_config(tmp_path, processes=[(0, 4242, 81234)]))
    assert facts.apps == (gpu_read.App(4242, "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd", 81234),)
    assert facts.gpus[0].memory_used_mib == 81234


def test_fact_without_nvidia_smi(tmp_path):
    facts = run_fact_script(tmp_path, None)
    assert facts.error == "nvidia-smi not found (no NVIDIA driver on the host?)"


def test_fact_when_the_driver_does_not_answer(tmp_path):
    facts = run_fact_script(tmp_path, tmp_path / "no-such-config.json")
    assert facts.error.startswith("nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it couldn't communicate")


def test_fact_reads_our_units_and_the_models_weights(tmp_path):
    units = {
        "sglang-dflash.service": "# Managed by sglang-deploy (pyinfra) - local edits are overwritten.\n[Service]\nEnvironment=CUDA_VISIBLE_DEVICES=1\n",
        "sglang-mine.service": "[Service]\nEnvironment=\"CUDA_VISIBLE_DEVICES=0,1\"\n",
    }
    models = {TARGET: {"model-00001.safetensors": 3000, "model-00002.safetensors": 2000, "config.json": 500}, "tiny": {"config.json": 7}}
    facts = run_fact_script(tmp_path, standin_config(tmp_path), units=units, models=models)
    assert facts.units["sglang-dflash.service"].managed and facts.units["sglang-dflash.service"].gpus == (1,)
    assert not facts.units["sglang-mine.service"].managed and facts.units["sglang-mine.service"].gpus == (0, 1)
    sizes = {Path(p).name: n for p, n in facts.model_bytes.items()}
    assert sizes == {TARGET: 5000, "tiny": 7}  # weights only; all files when there are none


# Decisions --------------------------------------------------------------------------------


def lab_data(**services) -> dict:
    data = settings.load_group_yaml(str(REPO_ROOT / "group_data" / "all.py"))
    data.update(settings.load_group_yaml(str(REPO_ROOT / "lab" / "group_data" / "all.py")))
    for name, patch in services.items():
        data["services"][name] = {**data["services"].get(name, data["services"]["dflash"]), **patch}
    return data


@pytest.fixture(autouse=True)
def fresh_key_sources(monkeypatch):
    monkeypatch.setattr(group_files, "_KEY_SOURCES", {})


def config_for(run_services, host_data=None, **services):
    return settings.host_config(make_host(lab_data(**services), {"run_services": run_services, **(host_data or {})}))


def gpu(index, cap="12.0", mib=97887, problems=()):
    return gpu_read.Gpu(index, f"GPU-{index}", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", cap, mib, 0, f"00000000:{index:02X}:00.0", tuple(problems))


def facts(count=2, cap="12.0", mib=97887, sick=None, apps=(), units=None, sizes=None, missing=()):
    sick = sick or {}
    listed = [gpu(i, cap, mib, sick.get(i, ())) for i in range(count) if i not in missing]
    default_sizes = {"/root/models/Qwen3.6-27B": 4 * 1024 * 1024, "/root/models/Qwen3.6-27B-DFlash": 1024 * 1024}
    return gpu_read.GpuFacts("/usr/bin/nvidia-smi", None, "580.159.04", "13.0", tuple(listed),
                         tuple(f"0000:{i:02X}:00.0" for i in missing), tuple(apps), units or {}, sizes or default_sizes)


def unit(gpus_=(1,), active="active", pids=(), managed=True):
    return gpu_read.Unit(managed, tuple(gpus_), active, tuple(pids))


def argv_of(plan, name):
    return next(s for s in plan.config.services if s.name == name).argv()


def test_lab_services_converge_on_their_gpus():
    plan = gpus.decide(config_for(["ddtree", "dflash"]), facts())
    assert plan.ok and not plan.warnings
    assert plan.decisions[0] == "GPUs: 2 x NVIDIA RTX PRO 6000 Blackwell Workstation Edition (sm 12.0, 97887 MiB); driver 580.159.04, CUDA 13.0"
    assert [s.gpus for s in plan.config.services] == [(0,), (1,)]


def test_attention_backend_auto_is_triton_on_sm_12():
    plan = gpus.decide(config_for(["dflash"], dflash={"args": {"attention-backend": "auto", "grammar-backend": "none"}}), facts(cap="12.0"))
    argv = argv_of(plan, "dflash")
    assert argv[argv.index("--attention-backend") + 1] == "triton"
    assert any("attention-backend auto -> triton (sm 12.0" in d for d in plan.decisions)


def test_attention_backend_auto_is_sglangs_default_on_sm_9():
    plan = gpus.decide(config_for(["dflash"], dflash={"args": {"attention-backend": "auto", "grammar-backend": "none"}}), facts(cap="9.0", mib=143771))
    assert "--attention-backend" not in argv_of(plan, "dflash")
    assert "--grammar-backend" in argv_of(plan, "dflash")
    assert "dflash: attention-backend auto -> sglang's default (sm 9.0)" in plan.decisions


def test_an_explicit_attention_backend_is_kept():
    plan = gpus.decide(config_for(["dflash"], dflash={"args": {"attention-backend": "fa3"}}), facts(cap="12.0"))
    argv = argv_of(plan, "dflash")
    assert argv[argv.index("--attention-backend") + 1] == "fa3"


def test_group_data_says_auto_and_the_lab_renders_triton():
    data = lab_data()
    assert all(s["args"]["attention-backend"] == "auto" for s in data["services"].values())
    plan = gpus.decide(config_for(["ddtree", "dflash"]), facts())
    for service in plan.config.services:
        assert dict(service.args)["attention-backend"] == "triton"


def test_a_failed_gpu_fails_the_host_naming_the_healthy_free_gpus():
    plan = gpus.decide(config_for(["dflash"]), facts(count=3, sick={1: ["nvidia-smi reads [GPU requires reset]"]}))
    assert plan.errors == ("dflash: GPU 1 is unhealthy: nvidia-smi reads [GPU requires reset]; healthy free GPUs: 0, 2",)
    assert "GPU 1 (00000000:01:00.0) unhealthy: nvidia-smi reads [GPU requires reset]" in plan.decisions


def test_a_missing_gpu_fails_the_host():
    plan = gpus.decide(config_for(["dflash"]), facts(missing=(1,)))
    assert plan.errors == ("dflash: GPU 1 is missing (nvidia-smi lists GPUs 0; it cannot reach 0000:01:00.0); healthy free GPUs: 0",)


def test_a_gpu_marked_failed_by_the_operator_is_refused():
    plan = gpus.decide(config_for(["dflash"], {"failed_gpus": [1]}), facts())
    assert plan.errors == ("dflash: GPU 1 is marked failed (`failed_gpus` in the host's data); healthy free GPUs: 0",)


def test_a_gpu_busy_with_a_foreign_process_is_refused():
    plan = gpus.decide(config_for(["dflash"]), facts(apps=[gpu_read.App(4242, "GPU-1", 81234)]))
    assert plan.errors == ("dflash: GPU 1 is in use by pid 4242, 81234 MiB; healthy free GPUs: 0",)


def test_the_services_own_process_does_not_make_its_gpu_busy():
    units = {"sglang-dflash.service": unit((1,), pids=(4242, 4250))}
    plan = gpus.decide(config_for(["dflash"]), facts(apps=[gpu_read.App(4250, "GPU-1", 81234)], units=units))
    assert plan.ok


def test_a_gpu_used_by_another_of_our_services_is_refused_naming_it():
    units = {"sglang-tmp.service": unit((1,), pids=(77,))}
    plan = gpus.decide(config_for(["dflash"]), facts(apps=[gpu_read.App(77, "GPU-1", 1000)], units=units))
    assert plan.errors == ("dflash: GPU 1 is in use by sglang-tmp.service (pid 77, 1000 MiB); healthy free GPUs: 0",)


def test_an_unplaced_unit_of_ours_still_running_holds_its_gpu():
    units = {"sglang-old.service": unit((1,))}
    plan = gpus.decide(config_for(["dflash"]), facts(units=units))
    assert plan.errors == (
        "dflash: GPU 1 is in use by sglang-old.service (running, no longer placed here: removed after this run's readiness gates); healthy free GPUs: 0",
    )


def test_a_stopped_unit_of_ours_does_not_hold_its_gpu():
    plan = gpus.decide(config_for(["dflash"]), facts(units={"sglang-old.service": unit((1,), active="inactive")}))
    assert plan.ok


def test_gpu_auto_takes_the_lowest_healthy_free_gpu():
    plan = gpus.decide(config_for({"dflash": {"gpu": "auto"}}), facts(count=4, sick={0: ["x"]}, apps=[gpu_read.App(9, "GPU-1", 10)]))
    assert plan.ok and plan.config.services[0].gpus == (2,)
    assert "dflash: gpu auto -> GPU 2 (lowest healthy free GPU)" in plan.decisions


def test_gpu_auto_keeps_the_current_units_gpu():
    units = {"sglang-dflash.service": unit((3,))}
    plan = gpus.decide(config_for({"dflash": {"gpu": "auto"}}), facts(count=4, units=units))
    assert plan.config.services[0].gpus == (3,)
    assert "dflash: gpu auto -> GPU 3 (kept: its current unit's GPU)" in plan.decisions


def test_gpu_auto_moves_off_a_current_gpu_that_failed():
    units = {"sglang-dflash.service": unit((1,))}
    plan = gpus.decide(config_for({"dflash": {"gpu": "auto"}}), facts(count=3, sick={1: ["nvidia-smi reads ERR!"]}, units=units))
    assert plan.config.services[0].gpus == (0,)
    assert "dflash: gpu auto -> GPU 0 (lowest healthy free GPU (its current GPU 1 is unhealthy: nvidia-smi reads ERR!))" in plan.decisions


def test_gpu_auto_fits_around_fixed_gpus_and_other_autos():
    config = config_for(["dflash", "ddtree", "third"], dflash={"gpu": "auto"}, third={"gpu": "auto", "port": 30002})
    plan = gpus.decide(config, facts(count=3))
    assert {s.name: s.gpus for s in plan.config.services} == {"dflash": (1,), "ddtree": (0,), "third": (2,)}


def test_gpu_auto_without_a_free_gpu_fails_saying_why_for_each():
    plan = gpus.decide(config_for({"dflash": {"gpu": "auto"}}), facts(count=2, sick={0: ["row remapping failed"]}, apps=[gpu_read.App(5, "GPU-1", 10)]))
    assert plan.errors == (
        "dflash: gpu auto: no healthy free GPU on this host (GPU 0 is unhealthy: row remapping failed; GPU 1 is in use by pid 5, 10 MiB)",
    )


def test_no_nvidia_smi_is_an_error_for_services_that_need_a_gpu():
    missing = gpu_read.GpuFacts(None, "nvidia-smi not found (no NVIDIA driver on the host?)", None, None, (), (), ())
    plan = gpus.decide(config_for(["ddtree", "dflash"]), missing)
    assert plan.errors == ("nvidia-smi not found (no NVIDIA driver on the host?): services ddtree, dflash need a GPU",)
    assert gpus.decide(config_for([]), missing).ok  # a host without services needs no GPU


GIB = 1024**3


def test_models_larger_than_the_gpu_are_an_error_saying_by_how_much():
    sizes = {"/root/models/Qwen3.6-27B": 100 * GIB, "/root/models/Qwen3.6-27B-DFlash": 2 * GIB}
    plan = gpus.decide(config_for(["dflash"]), facts(mib=97887, sizes=sizes))
    assert plan.errors == (
        "dflash: models need 102.0 GiB per GPU (Qwen3.6-27B 100.0 GiB + Qwen3.6-27B-DFlash 2.0 GiB), GPU 1 has 95.6 GiB: short by 6.4 GiB; "
        "use more GPUs (tp-size) or a smaller model",
    )


def test_mem_fraction_too_small_is_an_error_with_the_fraction_needed():
    sizes = {"/root/models/Qwen3.6-27B": 54 * GIB, "/root/models/Qwen3.6-27B-DFlash": 1 * GIB}
    plan = gpus.decide(config_for(["dflash"], dflash={"args": {"mem-fraction-static": 0.5}}), facts(mib=97887, sizes=sizes))
    assert plan.errors == (
        "dflash: models need 55.0 GiB per GPU (Qwen3.6-27B 54.0 GiB + Qwen3.6-27B-DFlash 1.0 GiB), mem-fraction-static 0.5 of GPU 1's 95.6 GiB "
        "gives 47.8 GiB: short by 7.2 GiB; raise mem-fraction-static to more than 0.58 (and leave room for the KV cache)",
    )


def test_little_kv_room_is_a_warning():
    sizes = {"/root/models/Qwen3.6-27B": 80 * GIB, "/root/models/Qwen3.6-27B-DFlash": 1 * GIB}
    plan = gpus.decide(config_for(["dflash"], dflash={"args": {"mem-fraction-static": 0.88, "attention-backend": "triton"}}), facts(mib=97887, sizes=sizes))
    assert plan.ok
    assert plan.warnings == (
        "dflash: models 81.0 GiB per GPU (Qwen3.6-27B 80.0 GiB + Qwen3.6-27B-DFlash 1.0 GiB) leave 3.1 GiB (4%) of the static pool "
        "(mem-fraction-static 0.88 of 95.6 GiB) for the KV cache",
    )


def test_models_split_over_tensor_parallel_gpus():
    sizes = {"/root/models/Qwen3.6-27B": 150 * GIB, "/root/models/Qwen3.6-27B-DFlash": 2 * GIB}
    plan = gpus.decide(config_for(["dflash"], dflash={"gpu": [0, 1], "args": {"tp-size": 2}}), facts(mib=97887, sizes=sizes))
    assert plan.ok, plan.errors
    assert any("models 76.0 GiB per GPU" in d and "tp 2" in d for d in plan.decisions)


def test_model_not_in_the_store_skips_the_memory_check_and_says_so():
    plan = gpus.decide(config_for(["dflash"]), facts(sizes={"/root/models/Qwen3.6-27B": None, "/root/models/Qwen3.6-27B-DFlash": 10}))
    assert plan.ok
    assert "dflash: size of Qwen3.6-27B unknown (not in the model store yet): GPU memory not checked" in plan.decisions


def test_plan_is_deterministic():
    config = config_for({"dflash": {"gpu": "auto"}, "ddtree": None})
    assert gpus.decide(config, facts(count=4)) == gpus.decide(config, facts(count=4))


# The operation ----------------------------------------------------------------------------


def run_checked(plan, executing=False):
    from unittest import mock

    from pyinfra.context import ctx_host, ctx_state

    host = make_host({})
    host.state.is_executing = executing
    with (
        mock.patch.object(host, "noop") as noop, mock.patch.object(host, "log") as log, mock.patch.object(host, "log_styled") as styled,
        ctx_state.use(host.state), ctx_host.use(host),
    ):
        commands = list(gpus.checked._inner(plan=plan))
    return commands, [c.args[0] for c in noop.call_args_list], [c.args[0] for c in log.call_args_list], [c.args[0] for c in styled.call_args_list]


def test_checked_shows_decisions_and_is_a_noop_when_ok():
    plan = gpus.decide(config_for(["ddtree", "dflash"]), facts())
    commands, noops, logs, _ = run_checked(plan)
    assert commands == [] and noops == ["GPUs fit: ddtree on GPU 0, dflash on GPU 1"]
    assert logs == list(plan.decisions)


def test_checked_with_an_error_yields_the_refusal():
    plan = gpus.decide(config_for(["dflash"]), facts(sick={1: ["x"]}))
    commands, noops, _, styled = run_checked(plan)
    assert len(commands) == 1 and commands[0].function is gpus._refuse and not noops
    assert styled == ["GPU check will fail: dflash: GPU 1 is unhealthy: x; healthy free GPUs: 0"]


def test_gpu_state_fact_command_runs_the_script_with_quoted_paths():
    cmd = gpu_read.GpuState().command(models=["/root/models/a b"])
    assert cmd.startswith("(cd / && exec python3 -I - /etc/systemd/system '/root/models/a b' <<'PYEOF'")


def test_settings_accept_gpu_auto_and_failed_gpus():
    config = config_for({"dflash": {"gpu": "auto"}}, {"failed_gpus": [1]})
    assert config.services[0].gpus == () and config.failed_gpus == (1,)


def test_bad_failed_gpus_is_refused():
    from configuration.errors import DataError

    with pytest.raises(DataError, match="failed_gpus: .*must be a list of GPU indexes"):
        config_for(["dflash"], {"failed_gpus": "1"})


def test_a_planned_refusal_fails_a_dry_run_and_only_a_dry_run(monkeypatch):
    # `pyinfra --dry` exits 1 exactly when the state has failed hosts (issue 11: it used to exit 0).
    import sys

    bad = gpus.decide(config_for(["dflash"]), facts(sick={1: ["x"]}))
    good = gpus.decide(config_for(["dflash"]), facts())
    monkeypatch.setattr(sys, "argv", ["pyinfra", "inventory.py", "deploy.py", "--dry"])
    for plan, failed in ((bad, True), (good, False)):
        from pyinfra.context import ctx_host, ctx_state

        host = make_host({})
        with ctx_state.use(host.state), ctx_host.use(host):
            list(gpus.checked._inner(plan=plan))
        assert (host in host.state.failed_hosts) is failed
    monkeypatch.setattr(sys, "argv", ["pyinfra", "inventory.py", "deploy.py"])  # the planning pass of a real run
    host = make_host({})
    from pyinfra.context import ctx_host, ctx_state

    with ctx_state.use(host.state), ctx_host.use(host):
        list(gpus.checked._inner(plan=bad))
    assert host not in host.state.failed_hosts  # the operation fails it when it executes


def _standin(config: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"LAB_GPUS_JSON": str(config), "LAB_GPUS_CACHE": str(cache), "PATH": os.environ.get("PATH", "")}
    # The stand-in run as its launcher runs it (python -IS), then asked whether it imported json.
    probe = ("import sys, runpy\nsys.argv = sys.argv[1:]\ntry:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
             "finally:\n    print('json imported:', 'json' in sys.modules, file=sys.stderr)")
    return subprocess.run([sys.executable, "-IS", "-c", probe, str(STANDIN), *args], capture_output=True, text=True, env=env)


def _query(config: Path, cache: Path) -> tuple[str, bool]:
    proc = _standin(config, cache, "--query-gpu=index,name,memory.used", "--format=csv,noheader,nounits")
    return proc.stdout, "json imported: True" in proc.stderr


def test_standin_keeps_its_config_by_the_files_identity_and_reads_every_change(tmp_path):
    """The lab's stand-in keeps what gpus.json said (without importing json) until the file changes in any way:
    replaced, edited at the same size with its mtime put back, or the kept copy damaged or removed."""
    config, cache = standin_config(tmp_path), tmp_path / "cache"
    first, imported = _query(config, cache)
    assert imported and cache.exists() and first.count("\n") == 2
    assert _query(config, cache) == (first, False)  # answered from the kept copy

    def rewrite(change, keep_mtime):
        before = config.stat()
        text = json.dumps(change(json.loads(config.read_text())))
        if keep_mtime:  # same length, same mtime: only the inode's ctime tells
            assert len(text) == before.st_size
            with open(config, "r+") as handle:
                handle.write(text)
            os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
        else:
            tmp = config.with_suffix(".new")
            tmp.write_text(text)
            os.replace(tmp, config)

    def with_name(name):
        return lambda c: {**c, "gpus": [{**g, "name": name} for g in c["gpus"]]}

    same_length = "X" * len("NVIDIA H200")
    for change, keep_mtime, expected in (
        (with_name("NVIDIA H200"), False, "NVIDIA H200"),
        (with_name(same_length), True, same_length),
    ):
        rewrite(change, keep_mtime)
        out, imported = _query(config, cache)
        assert imported and out.count(expected) == 2, (expected, out)
        assert _query(config, cache) == (out, False)
    for damage in (lambda: cache.write_bytes(b"\x00garbage"), lambda: cache.unlink(), lambda: cache.write_bytes(b"")):
        damage()
        out2, imported = _query(config, cache)
        assert imported and out2 == out


def test_standin_given_a_config_keeps_nothing_unless_told_where(tmp_path):
    config, default_cache = standin_config(tmp_path), Path("/run/lab-nvidia-smi.cache")
    before = default_cache.stat().st_mtime_ns if default_cache.exists() else None
    env = {"LAB_GPUS_JSON": str(config), "PATH": os.environ.get("PATH", "")}
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(STANDIN), "-L"], capture_output=True, text=True, env=env)
        assert proc.returncode == 0 and proc.stdout.startswith("GPU 0:")
    assert (default_cache.stat().st_mtime_ns if default_cache.exists() else None) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpus.json"]
