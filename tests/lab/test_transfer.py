"""A model the host's store lacks is streamed from the host that `model_sources` names."""

from __future__ import annotations

import subprocess

import pytest

from tests.lab.labutil import SPARE, STATE, deploy, http_get, lab_hosts, ssh, write_inventory

pytestmark = pytest.mark.lab

MODEL = "Qwen3.6-27B-DFlash"
SERVICE = {"moved": {"gpu": 0, "port": 30130, "model": MODEL, "model_in": "store"}}


def digests(host: str) -> str:
    return ssh(host, f"cd /root/models/{MODEL} && find . -type f ! -name '.sglang-deploy-*' | sort | xargs sha256sum").stdout


def ssh_argv(host: str) -> list[str]:
    return ["ssh", "-i", str(STATE / "id_ed25519"), "-o", f"UserKnownHostsFile={STATE / 'known_hosts'}",
            "-o", "BatchMode=yes", f"root@{lab_hosts()[host]['address']}"]


@pytest.fixture(autouse=True)
def spare_store(spare_with_venv):
    """Each test removes the spare's copy of MODEL; other modules load it from there: put back whatever happens."""
    yield
    if digests(SPARE) != digests("gpu-a"):
        tar = subprocess.run([*ssh_argv("gpu-a"), f"tar -C /root/models -cf - {MODEL}"], capture_output=True, check=True, timeout=300).stdout
        ssh(SPARE, f"rm -rf /root/models/{MODEL} /root/models/.{MODEL}.partial")
        subprocess.run([*ssh_argv(SPARE), "tar -C /root/models -xf -"], input=tar, check=True, timeout=300)
        assert digests(SPARE) == digests("gpu-a")


def plant_poisoned_partial(host: str) -> str:
    """A `.MODEL.partial` on `host` as a run that stopped half way would leave it, holding the source's largest file
    with one byte changed, its size and mtime the source's (root's, one link): it looks whole, it is not."""
    rel = ssh("gpu-a", f"cd /root/models/{MODEL} && find . -type f ! -name '.sglang-deploy-*' -printf '%s %P\\n' "
                       "| sort -n | tail -1 | cut -d' ' -f2-").stdout.strip()
    mtime = ssh("gpu-a", f"stat -c %Y /root/models/{MODEL}/{rel}").stdout.strip()
    data = bytearray(subprocess.run([*ssh_argv("gpu-a"), f"cat /root/models/{MODEL}/{rel}"], capture_output=True,
                                    check=True, timeout=300).stdout)
    data[len(data) // 2] ^= 0xFF
    partial = f"/root/models/.{MODEL}.partial"
    ssh(host, f"rm -rf {partial} && mkdir -p {partial}/$(dirname {rel})")
    subprocess.run([*ssh_argv(host), f"cat > {partial}/{rel} && touch -d @{mtime} {partial}/{rel}"], input=bytes(data),
                   check=True, timeout=300)
    return rel


def test_missing_model_is_streamed_from_the_source_host_then_served():
    """...and a poisoned partial copy (right size and mtime, wrong bytes) left by an earlier run is sent again: what
    is kept is checked against the origin's digests, not its listing."""
    ssh(SPARE, f"rm -rf /root/models/{MODEL} /root/models/.{MODEL}.partial")
    plant_poisoned_partial(SPARE)
    placement = {"ddtree": {}, "dflash": {}} if "gpu-a" in lab_hosts() else {}
    inventory = write_inventory("test_transfer", {
        "gpu-a": {"run_services": placement},
        SPARE: {"services": SERVICE, "run_services": ["moved"], "model_sources": {MODEL: "gpu-a"}},
    })
    result = deploy(inventory, as_json=False)
    assert result.returncode == 0, result
    assert f"streamed {MODEL} from gpu-a" in result.stdout + result.stderr
    assert "already (a run that stopped half way)" not in result.stdout + result.stderr  # the planted file went
    assert digests(SPARE) == digests("gpu-a")
    assert http_get(SPARE, 30130, "/health")[0] == 200
    again = deploy(inventory)
    assert again.returncode == 0 and again.changed == [], again


def test_missing_model_without_a_source_is_a_clear_error():
    store = "ls -A /root/models | sort; ls /etc/systemd/system | grep -c '^sglang-' || true"
    before = ssh(SPARE, store).stdout
    assert "No-Such-Model" not in before
    service = {"lost": {"gpu": 0, "port": 30131, "model": "No-Such-Model", "model_in": "store"}}
    inventory = write_inventory("test_no_source", {SPARE: {"services": service, "run_services": ["lost"]}})
    result = deploy(inventory, as_json=False)
    assert result.returncode != 0
    assert "model No-Such-Model is not in /root/models/No-Such-Model on" in result.stdout + result.stderr
    assert "set model_sources: {No-Such-Model: <a host that has it>}" in result.stdout + result.stderr
    # Nothing was made for the missing model: no empty directory in the store, no unit.
    assert ssh(SPARE, store).stdout == before


def test_missing_model_is_streamed_from_a_directory_on_the_control_machine(tmp_path):
    # A local copy of the model, taken from gpu-a's store.
    tar = subprocess.run([*ssh_argv("gpu-a"), f"tar -C /root/models -cf - {MODEL}"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-C", str(tmp_path), "-xf", "-"], input=tar, check=True)

    ssh(SPARE, f"rm -rf /root/models/{MODEL}")
    inventory = write_inventory("test_transfer_local", {
        SPARE: {"services": SERVICE, "run_services": ["moved"], "model_sources": {MODEL: str(tmp_path / MODEL)}},
    })
    result = deploy(inventory, as_json=False)
    assert result.returncode == 0, result
    assert f"streamed {MODEL} from control machine:" in result.stdout + result.stderr
    assert digests(SPARE) == digests("gpu-a")
    assert deploy(inventory).changed == []


HOSTILE = "Hostile-Model"


@pytest.fixture
def hostile_model():
    """A model in gpu-a's store (a copy of MODEL) holding what `tar -x` would land as the source made it: a link
    out of the model to /etc/shadow, and a setuid, setgid file of nobody's written by all; gone from both hosts after."""
    ssh("gpu-a", (
        f"rm -rf /root/models/{HOSTILE} && cp -a /root/models/{MODEL} /root/models/{HOSTILE} && cd /root/models/{HOSTILE} && "
        "rm -f .sglang-deploy-* && head -c 64M /dev/urandom > extra.bin && printf '#!/bin/sh\\nid\\n' > run.sh && "
        "chown nobody:nogroup run.sh && chmod 6777 run.sh && ln -s /etc/shadow tokenizer.model"
    ))
    yield f"/root/models/{HOSTILE}"
    for host in ("gpu-a", SPARE):
        ssh(host, f"rm -rf /root/models/{HOSTILE} /root/models/.{HOSTILE}.partial")


def test_a_source_hosts_link_out_of_the_model_is_refused_and_its_setuid_file_lands_as_roots(hostile_model):
    service = {"hostile": {"gpu": 0, "port": 30132, "model": HOSTILE, "model_in": "store"}}
    inventory = write_inventory("test_transfer_hostile", {
        "gpu-a": {"run_services": []},
        SPARE: {"services": service, "run_services": ["hostile"], "model_sources": {HOSTILE: "gpu-a"}},
    })
    store = ssh(SPARE, "ls -A /root/models").stdout.split()
    result = deploy(inventory, "--limit", SPARE, as_json=False)
    assert result.returncode != 0, result
    assert "untar: refused ./tokenizer.model: a symlink to /etc/shadow (absolute)" in result.stdout + result.stderr, result
    # Nothing of it in the store: no model, no `.NAME.partial`, no file of nobody's or with a setuid or setgid bit.
    assert ssh(SPARE, "ls -A /root/models").stdout.split() == store
    assert ssh(SPARE, "find /root/models \\( -user nobody -o -perm /6000 \\) -print").stdout == ""

    # Without the link, the model comes over, and the source's setuid file lands as root's, with neither bit.
    ssh("gpu-a", f"rm {hostile_model}/tokenizer.model")
    result = deploy(inventory, "--limit", SPARE, as_json=False)
    assert result.returncode == 0, result
    assert f"streamed {HOSTILE} from gpu-a" in result.stdout + result.stderr
    assert ssh(SPARE, f"stat -c '%U:%G %a' {hostile_model}/run.sh").stdout.strip() == "root:root 755"
    same = f"cd {hostile_model} && find . -type f ! -name '.sglang-deploy-*' | sort | xargs sha256sum"
    assert ssh(SPARE, same).stdout == ssh("gpu-a", same).stdout
