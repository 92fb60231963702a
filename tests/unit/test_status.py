"""The status view (report/status_view.py, views/status.py's pure pieces): rows in, table, detail view,
JSON, exit code and Prometheus text out; the probe script run here against a tiny HTTP server and a lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from configuration.patch_sets import PatchFile, PatchSet
from operations.environment import patches
from operations.environment.patches import applied_record
from operations.gpu import gpu_read
from operations.service import readiness
from report import status_view as view
from tests.unit.remote_calls import own_control_group
from views import status


def service_row(**more) -> dict:
    row = {
        "host": "gpu-a", "reachable": True, "service": "ddtree", "port": 30000, "unit_name": "sglang-ddtree.service",
        "unit": {"load": "loaded", "active": "active", "sub": "running", "enabled": "enabled"},
        "pid": 4242, "uptime_s": 3725.0, "restarts": 0,
        "health": {"status": 200, "latency_ms": 3.4, "error": None},
        "gpus": [{"index": 0, "name": "NVIDIA H200", "missing": False, "healthy": True, "problems": [],
                  "memory_used_mib": 81234, "memory_total_mib": 143771, "foreign": []}],
        "gpu_error": None,
        "generation": {"stack": "sglang-0.5.23-cu130", "wanted": "g-1", "live": "g-1", "venv": "/root/venv_sglang"},
        "patch_sets": [{"name": "ddtree-sample", "applied": True, "drifted": [], "note": None}],
        "models": [{"name": "Qwen", "location": "shm", "verified": True, "why": None}],
        "changes": [], "healthy": True, "problems": [], "lock": None,
    }
    row["host_gpus"] = row["gpus"]
    row.update(more)
    return row


def host_row(**more) -> dict:
    row = {"host": "gpu-b", "reachable": True, "service": None, "lock": None, "gpus": [], "host_gpus": [],
           "gpu_error": None, "changes": [], "healthy": True, "problems": []}
    row.update(more)
    return row


# -- exit codes -----------------------------------------------------------------------------


@pytest.mark.parametrize(("rows", "code"), [
    ([service_row(), host_row()], 0),
    ([service_row(changes=["restart the service"]), host_row()], 2),
    ([service_row(), host_row(changes=["remove sglang-old.service (no longer placed here)"])], 2),
    ([service_row(healthy=False, problems=["/health answers 503"]), host_row()], 1),
    # unhealthy wins over drift, as a monitoring check's CRITICAL over WARNING
    ([service_row(changes=["start the service"], healthy=False), host_row(changes=["x"])], 1),
    ([service_row(), view.unreachable_row("gpu-c", "no answer from 10.0.0.3:22 within 1.5 s")], 1),
])
def test_exit_code_is_terraforms_detailed_exitcode(rows, code):
    assert view.exit_code(rows) == code
    assert view.document(rows, "covers")["exit_code"] == code


def test_a_held_lock_alone_is_no_drift():
    assert view.exit_code([service_row(lock={"who": "root@ctl", "pid": 7, "since": "today"})]) == 0


# -- the table and the detail view ------------------------------------------------------------


def test_wide_table_has_every_column_and_a_row_each():
    rows = [service_row(), host_row()]
    text = view.table(rows, 400)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["HOST", "SERVICE", "STATUS"]
    for header in ("PORT", "UNIT", "HEALTH", "DEPLOY WOULD", "PID/UPTIME", "GPU", "GENERATION", "PATCH SETS", "MODELS"):
        assert header in lines[0]
    assert "LOCK" not in lines[0]  # shown only when a lock is held
    assert len(lines) == 3
    unhealthy = view.table([service_row(healthy=False, problems=["/health answers 503"])], 400).splitlines()
    assert unhealthy[-1] == "! gpu-a/ddtree: /health answers 503"
    assert "gpu-a  ddtree" in lines[1] and "200 3ms" in lines[1] and "4242 1h02m" in lines[1]
    assert "0 79/140G ok" in lines[1]
    assert "ddtree-sample applied" in lines[1] and "Qwen verified" in lines[1]
    assert lines[2].startswith("gpu-b  -")


def test_narrow_table_folds_columns_by_priority_and_names_them():
    text = view.table([service_row()], 60)
    first = text.splitlines()[0]
    assert first.split()[:3] == ["HOST", "SERVICE", "STATUS"]
    assert "MODELS" not in first and "PATCH SETS" not in first
    assert all(len(line) <= 60 for line in text.splitlines()[:-1])
    assert "left out to fit 60 columns" in text and "MODELS" in text.splitlines()[-1]
    assert "STATUS_DETAIL=1" in text


def test_lock_column_appears_with_its_holder():
    text = view.table([service_row(lock={"who": "root@ctl", "pid": 4242, "since": "2026-12-01 02:00:00 UTC"})], 400)
    assert "LOCK" in text.splitlines()[0] and "root@ctl pid 4242" in text


def test_detail_view_shows_every_column_whole():
    long_change = "restart the service (/etc/systemd/system/sglang-ddtree.service changed since it started) " * 2
    row = service_row(changes=[long_change, "stage model Qwen (missing model.safetensors)"],
                      lock={"who": "root@ctl", "pid": 9, "since": "today"},
                      gpus=[{**service_row()["gpus"][0], "healthy": False, "problems": ["[GPU requires reset]"],
                             "foreign": ["pid 77 1000 MiB"]}])
    text = view.detail([row])
    assert text.splitlines()[0] == "gpu-a/ddtree: DRIFT"
    assert f"    - {long_change}" in text  # never cut
    assert "    - stage model Qwen (missing model.safetensors)" in text
    assert "GPU: 0 NVIDIA H200 81234/143771 MiB UNHEALTHY: [GPU requires reset]; other processes: pid 77 1000 MiB" in text
    assert "LOCK: root@ctl (pid 9) since today" in text


def test_unreachable_row_says_why():
    row = view.unreachable_row("gpu-c", "10.0.0.3:22: Connection refused")
    assert view.verdict(row) == "UNREACHABLE"
    assert "! gpu-c: not reached: 10.0.0.3:22: Connection refused" in view.table([row], 40).splitlines()
    assert "REACHABLE: no (10.0.0.3:22: Connection refused)" in view.detail([row])


@pytest.mark.parametrize(("seconds", "text"), [(None, "-"), (5.9, "5s"), (125, "2m05s"), (7260, "2h01m"), (90000, "1d01h")])
def test_duration(seconds, text):
    assert view.duration(seconds) == text


# -- JSON and options --------------------------------------------------------------------------


def test_json_document_holds_the_same_rows_and_verdicts():
    rows = [service_row(changes=["restart the service"]), host_row()]
    texts = view.render(rows, {"json": "-", "detail": False, "prom": None, "width": None}, "covers", 120)
    doc = json.loads(texts["json"])
    assert doc["schema"] == view.SCHEMA and doc["exit_code"] == 2 and doc["deploy_would_covers"] == "covers"
    assert [(r["host"], r["service"], r["status"]) for r in doc["rows"]] == [("gpu-a", "ddtree", "DRIFT"), ("gpu-b", None, "ok")]
    assert doc["rows"][0]["health"] == {"status": 200, "latency_ms": 3.4, "error": None}


def test_emit_sends_the_view_to_stderr_when_json_goes_to_stdout(capsys):
    import io

    out = io.StringIO()
    code = view.emit([service_row()], {"json": "-", "detail": False, "prom": None, "width": None}, "covers", 120, out=out)
    assert code == 0
    assert json.loads(out.getvalue())["rows"][0]["service"] == "ddtree"
    assert "HOST" in capsys.readouterr().err


def test_options_from_environment():
    assert view.options_from({}) == {"detail": False, "json": None, "prom": None, "width": None}
    assert view.options_from({"STATUS_DETAIL": "1", "STATUS_JSON": "-", "STATUS_PROM": "/x.prom", "STATUS_WIDTH": "80"}) == {
        "detail": True, "json": "-", "prom": "/x.prom", "width": 80}
    assert view.options_from({"STATUS_DETAIL": "0"})["detail"] is False
    with pytest.raises(ValueError, match="STATUS_WIDTH"):
        view.options_from({"STATUS_WIDTH": "wide"})


# -- Prometheus -----------------------------------------------------------------------------------


def test_prometheus_gauges_per_service_and_host():
    rows = [
        service_row(restarts=3, changes=["restart the service"]),
        service_row(service="dflash", port=30001, health={"status": None, "latency_ms": 3000.0, "error": "no answer"},
                    healthy=False),
        host_row(lock={"who": "root@ctl", "pid": 1, "since": "x"},
                 host_gpus=[{"index": 0, "name": 'odd "name"', "healthy": False, "missing": False}]),
        view.unreachable_row("gpu-c", "refused"),
    ]
    text = view.prometheus(rows)
    lines = text.splitlines()
    assert 'sglang_deploy_service_up{host="gpu-a",service="ddtree",port="30000"} 1' in lines
    assert 'sglang_deploy_service_up{host="gpu-a",service="dflash",port="30001"} 0' in lines
    assert 'sglang_deploy_service_health_latency_seconds{host="gpu-a",service="ddtree",port="30000"} 0.003400' in lines
    # no latency for a /health that did not answer: the gauge is absent, not a timeout's length
    assert not any(line.startswith('sglang_deploy_service_health_latency_seconds{host="gpu-a",service="dflash"') for line in lines)
    assert 'sglang_deploy_service_restarts{host="gpu-a",service="ddtree",port="30000"} 3' in lines
    assert 'sglang_deploy_service_drift{host="gpu-a",service="ddtree",port="30000"} 1' in lines
    assert 'sglang_deploy_service_drift{host="gpu-a",service="dflash",port="30001"} 0' in lines
    assert 'sglang_deploy_host_up{host="gpu-c"} 0' in lines and 'sglang_deploy_host_up{host="gpu-a"} 1' in lines
    assert 'sglang_deploy_host_lock_held{host="gpu-b"} 1' in lines
    assert 'sglang_deploy_gpu_healthy{host="gpu-b",gpu="0",name="odd \\"name\\""} 0' in lines
    assert "sglang_deploy_status_exit_code 1" in lines
    for name in view.METRICS:
        if any(line.startswith(name) for line in lines):
            assert f"# TYPE {name} gauge" in lines and any(line.startswith(f"# HELP {name} ") for line in lines)
    assert text.endswith("\n")


def test_files_are_written_whole_by_rename(tmp_path, monkeypatch):
    target = tmp_path / "sglang.prom"
    target.write_text("old\n")
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append((Path(src).name, Path(dst).read_text()))  # the old file is still whole when the new one lands
        assert not Path(src).name.endswith(".prom")  # node_exporter reads only *.prom: never a half-written one
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    view.write_atomically(target, "new\n")
    assert target.read_text() == "new\n" and seen[0][1] == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sglang.prom"]
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "sglang.prom"
    target.write_text("old\n")
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(OSError):
        view.write_atomically(target, "new\n")
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["sglang.prom"]


# -- views/status.py's pure pieces --------------------------------------------------------------


def patch_set() -> PatchSet:
    files = (PatchFile("sglang/a.py", "a" * 64, "o" * 64), PatchFile("sglang/b.py", "b" * 64, None))
    return PatchSet(name="ddtree-sample", distribution="sglang", version="0.5.23", files=files, root=Path("/nonexistent"))


def test_patch_drift_applied_drifted_original_and_wrong_base():
    ps = patch_set()
    good = {"version": "0.5.23", "files": {"sglang/a.py": "a" * 64, "sglang/b.py": "b" * 64}, "record": applied_record(ps)}
    assert patches.drift(ps, good) == {"name": "ddtree-sample", "applied": True, "drifted": [], "note": None}
    edited = {**good, "files": {"sglang/a.py": "e" * 64, "sglang/b.py": None}}
    got = patches.drift(ps, edited)
    assert not got["applied"]
    assert got["drifted"] == ["sglang/a.py changed on the host (sha256 eeeeeeeeeeee)", "sglang/b.py missing"]
    original = {**good, "files": {"sglang/a.py": "o" * 64, "sglang/b.py": "b" * 64}, "record": None}
    assert patches.drift(ps, original)["drifted"] == ["sglang/a.py is the original (not applied)", "applied-state record differs"]
    other = patches.drift(ps, {**good, "version": "0.5.11"})
    assert not other["applied"] and "sglang 0.5.11 in the venv, the set is for 0.5.23" in other["note"]
    assert not patches.drift(ps, None)["applied"]


def gpu_facts(**more) -> gpu_read.GpuFacts:
    base = dict(
        nvidia_smi="/usr/bin/nvidia-smi", error=None, driver_version="580", cuda_version="13.0",
        gpus=(gpu_read.Gpu(0, "U0", "NVIDIA H200", "9.0", 143771, 1000, "00:01"),
              gpu_read.Gpu(1, "U1", "NVIDIA H200", "9.0", 143771, 0, "00:02", ("[GPU requires reset]",))),
        missing=(), apps=(gpu_read.App(11, "U0", 900), gpu_read.App(4242, "U0", 100)),
        units={"sglang-ddtree.service": gpu_read.Unit(True, (0,), "active", (11,))},
    )
    base.update(more)
    return gpu_read.GpuFacts(**base)


def test_gpu_rows_name_foreign_processes_health_and_missing_gpus():
    rows = status.gpu_rows(gpu_facts())
    assert [r["index"] for r in rows] == [0, 1]
    assert rows[0]["foreign"] == ["pid 4242 100 MiB"]  # pid 11 is our unit's
    assert rows[0]["healthy"] and not rows[1]["healthy"] and rows[1]["problems"] == ["[GPU requires reset]"]
    missing = status.gpu_rows(gpu_facts(missing=("00:03",)), (2,))
    assert missing[0]["missing"] and "cannot reach 00:03" in missing[0]["problems"][0]
    assert status.gpu_rows(gpu_facts(error="nvidia-smi not found")) == []


# -- the probe script, here against a tiny server and a lock directory ---------------------------------


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def run_probe(lock: Path) -> dict:
    """The status view's probe (the lock's own `peek`), run here on a lock directory of the test's."""
    command = status.StatusProbe().command()
    env = {**os.environ, "SGLANG_DEPLOY_LOCK": str(lock)}
    out = subprocess.run(["sh", "-c", command.replace("python3 ", f"{sys.executable} ", 1)], capture_output=True,
                         text=True, timeout=30, check=True, env=env).stdout
    return status.StatusProbe().process(out.splitlines())


def health_of(address: str, port: int, tmp_path: Path) -> dict:
    """The row's /health, from the deploy's own ServiceState script run here against `address:port`, as a unit whose
    cgroup is this test's own (the server answers from this process: peer identity, tests/unit/test_peer_identity.py)."""
    command = readiness.ServiceState().command(unit="sglang-none.service", address=address, port=port)
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    (tools / "systemctl").write_text(f"#!/bin/sh\necho Id=sglang-none.service\necho ControlGroup={own_control_group()}\n")
    (tools / "systemctl").chmod(0o755)
    out = subprocess.run(["sh", "-c", command.replace("python3 ", f"{sys.executable} ", 1)], capture_output=True,
                         text=True, timeout=30, check=True, env={**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}).stdout
    return status.health_answer(readiness.ServiceState().process(out.splitlines()))


def test_probe_reads_the_lock_and_times_health_and_writes_nothing(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    closed = HTTPServer(("127.0.0.1", 0), _Health)
    closed_port = closed.server_address[1]
    closed.server_close()
    lock = tmp_path / "sglang-deploy.lock"
    try:
        got = run_probe(lock)
        assert got["lock"] is None
        ok = health_of("127.0.0.1", server.server_address[1], tmp_path)
        assert ok["status"] == 200 and ok["error"] is None and ok["latency_ms"] >= 0
        refused = health_of("127.0.0.1", closed_port, tmp_path)
        assert refused["status"] is None and refused["error"]
        lock.mkdir()
        (lock / "owner.json").write_text(json.dumps({"who": "root@ctl", "pid": 42, "since": "today", "token": "t" * 32}))
        before = sorted(p.name for p in tmp_path.rglob("*"))
        held = run_probe(lock)
        assert held["lock"] == {"who": "root@ctl", "pid": 42, "since": "today", "control": None}  # no token shown
        assert sorted(p.name for p in tmp_path.rglob("*")) == before
        (lock / "owner.json").unlink()
        assert run_probe(lock)["lock"] == {"who": "unknown (no owner.json)", "pid": None, "since": None, "control": None}
    finally:
        server.shutdown()


def test_an_engine_advisory_that_warns_here_is_shown_and_is_no_verdict():
    """The GPU check's warnings (files/engine_advisories.yml: an entry that holds on this GPU) are in the row, the
    table and the detail view, and change neither the verdict nor the exit code."""
    warning = "FlashInfer's JIT reads the CUDA version from the host's nvcc ... [flashinfer-jit-sm12; ...]: set `attention-backend: triton`"
    row = service_row(warnings=[warning])
    assert view.verdict(row) == view.verdict(service_row()) and view.exit_code([row]) == view.EXIT_OK
    assert f"~ gpu-a/ddtree: WARNING: {warning}" in view.table([row], 200)
    assert f"  WARNING: {warning}" in view.detail([row])


def test_the_acceptance_its_gate_read_is_shown_in_the_table_the_json_and_prometheus():
    """A speculative service's gate keeps its figures for the process it proved them of (operations/remote/
    wait_ready.py: keep_gate); the view shows the acceptance, and says when its tokens were not checked."""
    gate = {"accept_length": 2.0, "accept_source": "meta_info: completion_tokens / spec_verify_ct",
            "checked_tokens": 256, "near_ties": 0, "lossless": True, "probes": 4}
    rows = [service_row(gate=gate), service_row(service="dflash", port=30001, gate={**gate, "lossless": False}),
            service_row(service="plain", port=30002)]
    table = view.table(rows, 400)
    assert "ACCEPT" in table.splitlines()[0]
    assert " 2.00 " in table and "2.00 unchecked" in table
    lines = view.prometheus(rows).splitlines()
    assert 'sglang_deploy_service_accept_length{host="gpu-a",service="ddtree",port="30000"} 2.0000' in lines
    assert not any(line.startswith('sglang_deploy_service_accept_length{host="gpu-a",service="plain"') for line in lines)


def test_whether_a_services_kernel_cache_is_warm_is_shown_in_the_table_the_json_and_prometheus():
    rows = [service_row(kernels={"key": "0123456789abcdef", "warm": True, "files": 12, "bytes": 3 << 20}),
            service_row(service="cold", port=30001, kernels={"key": "fedcba9876543210", "warm": False, "files": 0, "bytes": 0}),
            service_row(service="unread", port=30002, kernels={"key": "0000000000000000", "warm": None})]
    table = view.table(rows, 400)
    assert "KERNELS" in table.splitlines()[0]
    assert "warm 3.0 MiB, 12 files (0123456789abcdef)" in table and "cold (fedcba9876543210)" in table
    assert view.document(rows, "x")["rows"][0]["kernels"]["warm"] is True
    lines = view.prometheus(rows).splitlines()
    assert 'sglang_deploy_service_kernel_cache_warm{host="gpu-a",service="ddtree",port="30000"} 1' in lines
    assert 'sglang_deploy_service_kernel_cache_warm{host="gpu-a",service="cold",port="30001"} 0' in lines
    assert not any('service="unread"' in line and "kernel_cache" in line for line in lines)
