"""Bulk bytes over OpenSSH on the lab: a model from another host in several streams, resumed after the deploy was
killed half way; wheels pushed in several streams, a whole and checked `.part` not sent again; a donor's files."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import time

import pytest

from tests.lab.labutil import (
    SPARE,
    STATE,
    deploy,
    lab_hosts,
    ssh,
    start_deploy,
    wait_until,
    write_inventory,
)

pytestmark = pytest.mark.lab

STORE = "/root/models"
MODEL = "OpenSSH-Model"
BASE = "Qwen3.6-27B-DFlash"  # what the stand-in server loads; the extra files ride along
EXTRA, EXTRA_MIB = 8, 64
SERVICE = {"viassh": {"gpu": 0, "port": 30133, "model": MODEL, "model_in": "store"}}


def digests(host: str, path: str) -> str:
    return ssh(host, f"cd {path} && find . -type f ! -name '.sglang-deploy-*' | sort | xargs sha256sum").stdout


@pytest.fixture
def big_model(spare_with_venv):
    """A model in gpu-a's store of EXTRA files of EXTRA_MIB beside a copy of BASE; gone from both hosts after."""
    ssh("gpu-a", (f"rm -rf {STORE}/{MODEL} && cp -a {STORE}/{BASE} {STORE}/{MODEL} && rm -f {STORE}/{MODEL}/.sglang-deploy-* && "
                  f"for i in $(seq -w 1 {EXTRA}); do head -c {EXTRA_MIB << 20} /dev/urandom > {STORE}/{MODEL}/extra-$i.bin; done"),
        timeout=300)
    yield f"{STORE}/{MODEL}"
    for host in ("gpu-a", SPARE):
        ssh(host, f"rm -rf {STORE}/{MODEL} {STORE}/.{MODEL}.partial")


def inventory(name: str, **spare_data):
    placement = {"ddtree": {}, "dflash": {}} if "gpu-a" in lab_hosts() else {}
    return write_inventory(name, {
        "gpu-a": {"run_services": placement},
        SPARE: {"services": SERVICE, "run_services": ["viassh"], "model_sources": {MODEL: "gpu-a"}, **spare_data},
    })


def test_a_model_killed_half_way_resumes_over_openssh_in_several_streams_sending_only_the_rest(big_model, tmp_path):
    partial = f"{STORE}/.{MODEL}.partial"
    whole = f"find {partial} -name 'extra-*.bin' -size {EXTRA_MIB << 10}k 2>/dev/null | wc -l"
    # One stream, so the files come in name order; the deploy is killed once the first of them is whole.
    log = tmp_path / "deploy.log"
    proc = start_deploy(inventory("test_transfer_openssh_cut", transfer_streams=1), log, "--limit", SPARE)
    try:
        wait_until(lambda: proc.poll() is not None or int(ssh(SPARE, whole).stdout.strip() or 0) >= 1, 300, interval=0.1,
                   what="the first extra file whole on the receiver")
        assert proc.poll() is None, f"the deploy ended before it was killed:\n{log.read_text()[-3000:]}"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    time.sleep(2)  # the receiving ends see their input end
    left = ssh(SPARE, f"cd {partial} && find . -type f -printf '%s %P\\n' | sort -k2").stdout.splitlines()
    got = dict(reversed(line.split(" ", 1)) for line in left)
    assert not any(".untar-" in name for name in got), left  # no unpacker's temporary name left behind
    extra = [n for n in got if n.startswith("extra-")]
    assert 1 <= len(extra) < EXTRA, left
    assert all(int(got[n]) == EXTRA_MIB << 20 for n in extra), left  # nothing under a real name is short

    result = deploy(inventory("test_transfer_openssh"), "--limit", SPARE, as_json=False)
    out = result.stdout + result.stderr
    assert result.returncode == 0, result
    assert f"files of {MODEL} are whole in {partial} already" in out and "not sent again" in out, out[-4000:]
    assert f"streamed {MODEL} from gpu-a:{STORE}/{MODEL}" in out and "over OpenSSH (4 stream(s)" in out, out[-4000:]
    assert digests(SPARE, f"{STORE}/{MODEL}") == digests("gpu-a", f"{STORE}/{MODEL}")
    assert ssh(SPARE, f"ls -A {STORE}").stdout.split().count(f".{MODEL}.partial") == 0


# Damaged distributions are repaired from their wheels; their wheels are missing from the host's cache, so they are pushed.
REPAIRED = ("idna", "certifi", "urllib3", "tqdm", "pygments", "packaging")
CACHE = "/var/cache/sglang-deploy/wheels"
VENV_PYTHON = "/root/venv_sglang/bin/python"
HOUSE = STATE.parent / "cache" / "wheelhouse"


def test_wheels_are_pushed_over_openssh_in_several_streams_and_a_checked_part_is_not_pushed_again(spare_with_venv):
    served = write_inventory("test_transfer_openssh_wheels", {SPARE: {
        "services": {"wheels": {"gpu": 0, "port": 30134, "model": BASE, "model_in": "store"}}, "run_services": ["wheels"]}})
    first = deploy(served, "--limit", SPARE)
    assert first.returncode == 0, first
    wheels = {}
    for dist in REPAIRED:
        where = ssh(SPARE, f"{VENV_PYTHON} -c 'import {dist}, os; print(os.path.dirname({dist}.__file__))'").stdout.strip()
        ssh(SPARE, f"echo '# damaged' >> {where}/__init__.py")  # its size is no longer what its RECORD says
        wheels[dist] = ssh(SPARE, f"cd {CACHE} && ls | grep -i '^{dist}-.*[.]whl$'").stdout.split()[0]
    # A run that stopped half way left one wheel whole as its `.part`: checked against its pin, it is not sent again.
    kept = wheels["certifi"]
    ssh(SPARE, f"mv {CACHE}/{kept} {CACHE}/{kept}.part && rm -f " + " ".join(f"{CACHE}/{w}" for d, w in wheels.items() if d != "certifi"))

    result = deploy(served, "--limit", SPARE, as_json=False)
    out = result.stdout + result.stderr
    assert result.returncode == 0, result
    assert "1 wheel file(s) already whole on the host with their sha256" in out, out[-4000:]
    assert f"pushed {len(REPAIRED) - 1} wheel(s)" in out and "over OpenSSH (4 stream(s)" in out, out[-4000:]
    for dist, name in wheels.items():
        assert ssh(SPARE, f"sha256sum {CACHE}/{name}").stdout.split()[0] == hashlib.sha256((HOUSE / name).read_bytes()).hexdigest(), dist
        assert ssh(SPARE, f"stat -c '%U %a' {CACHE}/{name}").stdout.split() == ["root", "644"]
    assert ssh(SPARE, f"ls -A {CACHE} | grep -c '[.]part$' || true").stdout.strip() == "0"
    assert deploy(served, "--limit", SPARE).changed == []


def test_a_donors_venv_files_come_over_openssh(spare):
    assert deploy().returncode == 0  # the donor holds the lab's stack
    inventory = write_inventory("test_transfer_openssh_donor", {
        "gpu-a": {"run_services": []},
        SPARE: {"stack_sources": [{"donor": "gpu-a"}], "run_services": ["donated"],
                "services": {"donated": {"gpu": 0, "port": 30135, "model": BASE, "model_in": "store"}}},
    })
    result = deploy(inventory, "--limit", SPARE, as_json=False)
    out = result.stdout + result.stderr
    assert result.returncode == 0, result
    assert re.search(r"copied \d+ distribution\(s\) from gpu-a: \d+ MiB in [0-9.]+ s over OpenSSH", out), out[-4000:]
    listing = ("/root/venv_sglang/bin/python -c 'import importlib.metadata as m; "
               "print(sorted((d.metadata[\"Name\"], d.version) for d in m.distributions()))'")
    assert ssh(SPARE, listing).stdout == ssh("gpu-a", listing).stdout != ""
