"""The serving environment on the lab: generations built beside the live venv, proven, switched, rolled back.

One service on the spare host. The lab's stacks differ in one pin each:
`lab-cpu-sglang-kernel-update` (the stand-in kernel 0.4.11+cpu, built for the lab's torch) and
`lab-cpu-sglang-abi-mismatch` (0.4.9+cpu, built for torch 2.12: an undefined symbol on import).
"""

from __future__ import annotations

import http.server
import json
import shlex
import signal
import subprocess
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from configuration.stacks import load_stack
from operations.environment.venv_read import generation
from tests.lab.labutil import (
    PYINFRA,
    ROOT,
    SPARE,
    clean_host,
    deploy,
    http_get,
    lab_hosts,
    main_pid,
    ssh,
    write_inventory,
)

pytestmark = pytest.mark.lab

LIVE = "/root/venv_sglang"
UNIT = "sglang-envsvc.service"
PORT = 30110
SERVICE = {"gpu": 0, "port": PORT, "model": "Qwen3.6-27B-DFlash", "model_in": "store"}
WHEELHOUSE = ROOT / "lab" / "cache" / "wheelhouse"


def inventory(stack: str = "lab-cpu-sglang", env: dict | None = None, **extra) -> Path:
    service = {**SERVICE, "env": env or {}}
    return write_inventory("test_environment", {SPARE: {"stack": stack, "services": {"envsvc": service}, "run_services": ["envsvc"], **extra}})


def live_target() -> str:
    return ssh(SPARE, f"readlink {LIVE}").stdout.strip()


def gen_path(stack: str) -> str:
    return generation(LIVE, load_stack(stack), {}).path


def dists(path: str) -> dict[str, str]:
    out = ssh(SPARE, f"{path}/bin/python -c 'import importlib.metadata as m, json; print(json.dumps({{d.metadata[\"Name\"]: d.version for d in m.distributions()}}))'").stdout
    return json.loads(out)


def inode(path: str) -> int:
    return int(ssh(SPARE, f"stat -c %i {shlex.quote(path)}").stdout)


def mtime(path: str) -> str:
    return ssh(SPARE, f"stat -c %y {shlex.quote(path)}").stdout.strip()


@pytest.fixture(scope="module", autouse=True)
def base():
    clean_host(SPARE)
    result = deploy(inventory())
    assert result.returncode == 0, result
    yield
    clean_host(SPARE)


@pytest.fixture(autouse=True)
def back_to_base():
    """Each test starts from the converged base stack, serving."""
    if live_target() != gen_path("lab-cpu-sglang") or http_get(SPARE, PORT, "/health")[0] != 200:
        result = deploy(inventory())
        assert result.returncode == 0, result


def test_second_run_changes_nothing_and_the_live_venv_is_a_generation():
    result = deploy(inventory())
    assert result.returncode == 0 and result.changed == [], result
    assert live_target() == gen_path("lab-cpu-sglang")
    assert dists(LIVE)["sglang-kernel"] == "0.4.10+cpu"


def test_one_pin_changed_replaces_only_that_distribution_in_a_new_generation():
    old = gen_path("lab-cpu-sglang")
    new = gen_path("lab-cpu-sglang-kernel-update")
    torch_init = "lib/python3.11/site-packages/torch/__init__.py"
    result = deploy(inventory("lab-cpu-sglang-kernel-update"), as_json=False)
    assert result.returncode == 0, result
    assert f"venv {LIVE}: sglang-kernel 0.4.10+cpu -> 0.4.11+cpu" in result.stderr
    assert result.stderr.count(f"venv {LIVE}: ") == 3, result.stderr  # building beside, the one pin, switching
    assert live_target() == new
    before, after = dists(old), dists(new)
    assert {k for k in after if after[k] != before.get(k)} == {"sglang-kernel"}
    # Every other distribution is the live one's files, copied with their mtimes (nothing was reinstalled),
    # each a file of its own: an edit in one generation never reaches the other.
    assert inode(f"{old}/{torch_init}") != inode(f"{new}/{torch_init}")
    assert mtime(f"{old}/{torch_init}") == mtime(f"{new}/{torch_init}")
    assert ssh(SPARE, f"find {new} -type f -links +1 | head -3").stdout == ""
    assert http_get(SPARE, PORT, "/health")[0] == 200
    # The previous generation is kept for rollback.
    assert json.loads(ssh(SPARE, f"cat {LIVE}.generations/state.json").stdout)["previous"] == Path(old).name
    again = deploy(inventory("lab-cpu-sglang-kernel-update"))
    assert again.returncode == 0 and again.changed == [], again


def test_mismatched_abi_fails_the_probe_in_one_line_and_the_old_environment_keeps_serving():
    pid = main_pid(SPARE, UNIT)
    result = deploy(inventory("lab-cpu-sglang-abi-mismatch"), as_json=False)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "ABI probe failed" in line]
    assert lines, result.stderr
    assert (
        "ABI probe failed: sglang-kernel 0.4.9+cpu (common_ops.abi3.so) was built against another torch than "
        "torch 2.13.0+cpu: undefined symbol _ZN3c1017RegisterOperatorsD1Ev"
    ) in lines[0]
    # Nothing switched, nothing restarted: the old environment keeps serving.
    assert live_target() == gen_path("lab-cpu-sglang")
    assert main_pid(SPARE, UNIT) == pid and http_get(SPARE, PORT, "/health")[0] == 200


def test_a_file_deleted_inside_an_installed_distribution_is_detected_and_repaired():
    victim = f"{LIVE}/lib/python3.11/site-packages/tqdm/std.py"
    ssh(SPARE, f"rm {victim}")
    result = deploy(inventory(), as_json=False)
    assert result.returncode == 0, result
    assert "tqdm 4.70.1: 1 installed file(s) missing or altered (tqdm/std.py): reinstalling" in result.stderr
    assert ssh(SPARE, f"test -f {victim} && echo back").stdout.strip() == "back"
    assert deploy(inventory()).changed == []


def test_an_interrupted_build_leaves_the_live_venv_and_service_alone_and_the_next_run_completes_it():
    new = gen_path("lab-cpu-sglang-kernel-update")
    ssh(SPARE, f"rm -rf {new}")  # an earlier test may have built it
    pid = main_pid(SPARE, UNIT)
    argv = [PYINFRA, str(inventory("lab-cpu-sglang-kernel-update")), "deploy.py", "-y"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if ssh(SPARE, f"test -d {new} -o -d {new}.partial && echo yes", check=False).stdout.strip() == "yes":
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the deploy ended before the build began"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert live_target() == gen_path("lab-cpu-sglang")
    assert main_pid(SPARE, UNIT) == pid and http_get(SPARE, PORT, "/health")[0] == 200
    result = deploy(inventory("lab-cpu-sglang-kernel-update"))
    assert result.returncode == 0, result
    assert live_target() == new and dists(LIVE)["sglang-kernel"] == "0.4.11+cpu"


def test_an_index_source_serves_what_the_wheelhouse_lacks(tmp_path):
    """The control machine serves a PEP 503 index of the wheelhouse; the host installs the changed pin from it."""
    stack = load_stack("lab-cpu-sglang-kernel-update")
    ssh(SPARE, f"rm -rf {gen_path('lab-cpu-sglang-kernel-update')}")
    simple = tmp_path / "simple"
    for package in stack.packages:
        page = simple / package.name
        page.mkdir(parents=True)
        (page / "index.html").write_text(f'<a href="/files/{package.file}#sha256={package.sha256}">{package.file}</a>\n')
    (tmp_path / "files").symlink_to(WHEELHOUSE.resolve())
    address = lab_hosts()[SPARE]["control_address"]
    server = http.server.ThreadingHTTPServer((address, 0), partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://{address}:{server.server_address[1]}/simple"
        result = deploy(inventory("lab-cpu-sglang-kernel-update", stack_sources=[{"index": url}]), as_json=False)
    finally:
        server.shutdown()
    assert result.returncode == 0, result
    assert dists(LIVE)["sglang-kernel"] == "0.4.11+cpu"


def test_a_change_that_crashes_at_start_is_rolled_back_and_the_previous_service_answers():
    unit_before = ssh(SPARE, f"cat /etc/systemd/system/{UNIT}").stdout
    result = deploy(inventory(env={"STANDIN_CRASH_AT_START": 1}), as_json=False)
    assert result.returncode != 0
    assert f"envsvc: ROLLED BACK unit {UNIT} (the previous one) because the change failed readiness" in result.stderr, result.stderr
    assert "the restored service is ready" in result.stderr
    assert "STANDIN_CRASH_AT_START" in result.stderr  # the journal tail of the failed start
    assert ssh(SPARE, f"cat /etc/systemd/system/{UNIT}").stdout == unit_before
    assert http_get(SPARE, PORT, "/health")[0] == 200


def test_a_new_environment_that_never_becomes_ready_is_rolled_back_with_its_unit():
    old = gen_path("lab-cpu-sglang")
    result = deploy(inventory("lab-cpu-sglang-kernel-update", env={"STANDIN_NEVER_READY": 1}, readiness_timeout_s=10), as_json=False)
    assert result.returncode != 0
    assert (
        f"envsvc: ROLLED BACK unit {UNIT} (the previous one), venv {LIVE} (the previous generation) because the change failed readiness"
    ) in result.stderr, result.stderr
    assert live_target() == old
    assert http_get(SPARE, PORT, "/health")[0] == 200
    assert "NEVER_READY" not in ssh(SPARE, f"cat /etc/systemd/system/{UNIT}").stdout


def test_two_services_sharing_a_venv_the_failed_one_switches_it_back_and_the_other_restarts_on_the_next_run():
    """The README's claim for a shared venv: the service that failed readiness switches the venv back; the
    other, restarted earlier in the run on the new generation, keeps that process until its next restart,
    which the next run makes (its recorded inputs name the generation that is no longer live)."""
    old, new = gen_path("lab-cpu-sglang"), gen_path("lab-cpu-sglang-kernel-update")
    second = {**SERVICE, "gpu": 1, "port": PORT + 1}

    def two(stack: str, second_env: dict | None = None, **extra) -> Path:
        services = {"envsvc": {**SERVICE, "env": {}}, "second": {**second, "env": second_env or {}}}
        return write_inventory("test_environment_shared", {SPARE: {
            "stack": stack, "services": services, "run_services": ["envsvc", "second"], **extra}})

    try:
        result = deploy(two("lab-cpu-sglang"))
        assert result.returncode == 0, result
        first_pid = main_pid(SPARE, UNIT)
        result = deploy(two("lab-cpu-sglang-kernel-update", {"STANDIN_NEVER_READY": 1}, readiness_timeout_s=10), as_json=False)
        assert result.returncode != 0
        assert f"second: ROLLED BACK unit sglang-second.service (the previous one), venv {LIVE} (the previous generation)" in result.stderr, result.stderr
        assert live_target() == old
        # envsvc was restarted on the new generation before `second` failed, and still runs it.
        moved_pid = main_pid(SPARE, UNIT)
        assert moved_pid != first_pid
        record = json.loads(ssh(SPARE, f"cat /var/lib/sglang-deploy/started/{UNIT}.json").stdout)
        assert record["pid"] == moved_pid and record["inputs"][LIVE].startswith(f"link {new} "), record
        for unit, port in ((UNIT, PORT), ("sglang-second.service", PORT + 1)):
            assert http_get(SPARE, port, "/health")[0] == 200, unit
        # The next run (the data back on the plain stack) restarts envsvc onto the live generation.
        result = deploy(two("lab-cpu-sglang"), as_json=False)
        assert result.returncode == 0, result
        assert f"envsvc: {LIVE} changed since the service started" in result.stderr, result.stderr
        assert main_pid(SPARE, UNIT) != moved_pid
        assert deploy(two("lab-cpu-sglang")).changed == []
    finally:
        ssh(SPARE, "systemctl disable --now sglang-second.service >/dev/null 2>&1; rm -f /etc/systemd/system/sglang-second.service; "
                   "systemctl daemon-reload; systemctl reset-failed 'sglang-*' 2>/dev/null; true")
