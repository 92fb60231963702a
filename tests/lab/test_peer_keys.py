"""Host to host on a one-time key (operations/transport/peer_keys.py), on the lab, over real SSH: a model moves from gpu-d to
gpu-e with no byte through the deploy, the key reads its file list and nothing else, no key is left after a run, one
left by a killed run is removed by the next, and where gpu-e cannot reach gpu-d the bytes go through this machine and
the run says so.

The lab's hosts do not reach one another (each has only its link to this machine): `routed` gives gpu-d and gpu-e a
route to each other through this machine's kernel (forwarding on their two links alone), and takes it back after.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests.lab import labutil
from tests.lab.labutil import PYINFRA, ROOT, lab_hosts, ssh, wait_until, write_inventory

pytestmark = pytest.mark.lab

SOURCE, RECEIVER = "gpu-d", "gpu-e"
STORE = "/root/models"
MODEL = "Peer-Model"
BASE = "Qwen3.6-27B-DFlash"
KEYS = "/root/.ssh/authorized_keys"
MARK = "sglang-deploy-peer"


def digests(host: str, path: str) -> str:
    return ssh(host, f"cd {path} && find . -type f ! -name '.sglang-deploy-*' | sort | xargs sha256sum").stdout


def leftovers(host: str) -> str:
    """Our grants, keys and entries on a host (empty: none)."""
    return ssh(host, f"ls -A /run/sglang-deploy/peer-grants /run/sglang-deploy/peer-keys 2>/dev/null | grep -E '^[0-9a-f]{{32}}$'; "
                     f"grep -E '^restrict,.* {MARK}:' {KEYS} || true").stdout.strip()


def run_deploy(*extra: str, log=None):
    inventory = write_inventory("test_peer_keys", {SOURCE: {}, RECEIVER: {}})
    argv = [str(inventory), "tests/lab/deploys/model_in_store.py", "-y", "--limit", RECEIVER, "--data", f"model={MODEL}",
            "--data", f"source={SOURCE}", *extra]
    if log is not None:  # in the background, its output to `log`
        return subprocess.Popen([PYINFRA, *argv], cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT, text=True)
    proc = subprocess.run([PYINFRA, *argv], cwd=ROOT, capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def routed():
    """gpu-d and gpu-e reach each other (through this machine's kernel); as before after the test."""
    with labutil.routed([SOURCE, RECEIVER]):
        yield


def model(files: int = 0, mib: int = 0):
    ssh(SOURCE, (f"rm -rf {STORE}/{MODEL} && cp -a {STORE}/{BASE} {STORE}/{MODEL} && rm -f {STORE}/{MODEL}/.sglang-deploy-* && "
                 f"for i in $(seq -w 1 {files}); do head -c {mib << 20} /dev/urandom > {STORE}/{MODEL}/extra-$i.bin; done"),
        timeout=600)
    ssh(RECEIVER, f"rm -rf {STORE}/{MODEL} {STORE}/.{MODEL}.partial")


@pytest.fixture
def keys_file():
    """gpu-d's authorized_keys with a look-alike line of an operator's; its bytes after the test as before it, and
    our grants' leftovers cleared on both hosts whatever happened. Yields the sha256 it must keep."""
    original = ssh(SOURCE, f"base64 -w0 {KEYS}").stdout.strip()
    # An operator's own key whose comment looks like ours, without our options: never touched.
    decoy = ssh(SOURCE, f"rm -f /tmp/decoy /tmp/decoy.pub && ssh-keygen -q -t ed25519 -N '' -C {MARK}:{'0' * 32} -f /tmp/decoy && "
                        "cat /tmp/decoy.pub && rm -f /tmp/decoy /tmp/decoy.pub").stdout.strip()
    ssh(SOURCE, f"echo {shlex.quote(decoy)} >> {KEYS}")
    expected = ssh(SOURCE, f"sha256sum {KEYS}").stdout.split()[0]
    yield expected
    ssh(SOURCE, f"echo {original} | base64 -d > {KEYS}.t && mv {KEYS}.t {KEYS} && chmod 600 {KEYS}")
    for host in (SOURCE, RECEIVER):
        ssh(host, "rm -rf /run/sglang-deploy/peer-grants /run/sglang-deploy/peer-keys")
        ssh(host, f"rm -rf {STORE}/{MODEL} {STORE}/.{MODEL}.partial")


def test_a_model_moves_host_to_host_on_a_one_time_key_and_no_key_is_left_after_the_run(routed, keys_file):
    model()
    status, out = run_deploy()
    assert status == 0, out[-4000:]
    assert f"{RECEIVER} reads from {SOURCE} directly: a one-time key for 3 file(s) under {STORE}/{MODEL}" in out, out[-4000:]
    assert f"over OpenSSH, {RECEIVER} reading from {SOURCE} directly" in out, out[-4000:]
    assert digests(RECEIVER, f"{STORE}/{MODEL}") == digests(SOURCE, f"{STORE}/{MODEL}")
    assert leftovers(SOURCE) == "" and leftovers(RECEIVER) == ""
    assert ssh(SOURCE, f"sha256sum {KEYS}").stdout.split()[0] == keys_file  # every other line as it was, byte for byte


def on_receiver(argv: list[str], command: list[str], stdin: bytes = b"", *extra: str) -> subprocess.CompletedProcess:
    """`command` asked of the source by the receiver's ssh with the one-time key (`argv`; options `extra` first, so
    that they win over the deploy's own), its output in bytes."""
    command = shlex.join([argv[0], *extra, *argv[1:], *command])
    address = lab_hosts()[RECEIVER]["address"]
    base = ["ssh", "-i", str(ROOT / "lab/state/id_ed25519"), "-o", f"UserKnownHostsFile={ROOT / 'lab/state/known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{address}"]
    return subprocess.run([*base, command], input=stdin, capture_output=True, timeout=120)


def tar_names(data: bytes) -> list[str]:
    proc = subprocess.run(["tar", "-t"], input=data, capture_output=True, check=True)
    return proc.stdout.decode().split()


def test_the_one_time_key_reads_its_file_list_and_nothing_else(routed, keys_file):
    model()
    holder = subprocess.Popen([sys.executable, "-m", "tests.lab.peer_grant", SOURCE, RECEIVER, f"{STORE}/{MODEL}", "config.json"],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        grant = json.loads(holder.stdout.readline())
        assert "argv" in grant, grant
        argv = grant["argv"]
        shadow = ssh(SOURCE, "head -c 5 /etc/shadow").stdout

        # What it was made for: the listed file, as a tar stream.
        got = on_receiver(argv, ["send"], b"config.json\0")
        assert got.returncode == 0 and tar_names(got.stdout) == ["./config.json"], got.stderr

        def refused(result, what):
            assert result.returncode != 0, f"{what}: ran ({result.stdout[:200]!r})"
            assert shadow.encode() not in result.stdout and b"ustar" not in result.stdout, what
            return result.stderr.decode(errors="replace")

        # Another file of the same model, a file outside it, the listed file with another beside it: no byte of any.
        for names in (b"model.safetensors\0", b"../../../etc/shadow\0", b"/etc/shadow\0", b"config.json\0../Qwen3.6-27B/config.json\0",
                      b"./config.json\0"):
            said = refused(on_receiver(argv, ["send"], names), names)
            assert "refused" in said and "not in the list" in said, said
        # Commands other than its own: a file read, a shell, scp, sftp, a terminal.
        for command in (["cat", "/etc/shadow"], ["sh", "-c", "cat /etc/shadow"], ["bash"], ["scp", "-f", "/etc/shadow"]):
            said = refused(on_receiver(argv, command), command)
            assert "may run only the transfer it was made for" in said, said
        refused(on_receiver(argv, ["sftp"], b"", "-s"), "sftp")
        refused(on_receiver(argv, [], b"", "-tt"), "a terminal")
        # No forwarding of any kind (`restrict`).
        forward = on_receiver(argv, ["probe"], b"", "-o", "ClearAllForwardings=no", "-o", "ExitOnForwardFailure=yes", "-R", "127.0.0.1:40999:127.0.0.1:22")
        assert forward.returncode != 0 and b"sglang-deploy-peer ok" not in forward.stdout, forward.stderr
        # From another address than the receiver's (the source itself, with the receiver's key): not let in.
        key = f"/run/sglang-deploy/peer-keys/{grant['ident']}"
        ssh(SOURCE, "mkdir -p -m 700 /tmp/peer-test")
        for name in ("key", "known_hosts"):
            data = ssh(RECEIVER, f"base64 -w0 {key}/{name}").stdout.strip()
            ssh(SOURCE, f"echo {data} | base64 -d > /tmp/peer-test/{name} && chmod 600 /tmp/peer-test/{name}")
        elsewhere = [a.replace(key, "/tmp/peer-test") for a in argv]
        stranger = ssh(SOURCE, shlex.join([*elsewhere, "probe"]), check=False)
        assert stranger.returncode != 0 and "sglang-deploy-peer ok" not in stranger.stdout, stranger.stdout
        assert "Permission denied" in stranger.stderr, stranger.stderr
        assert on_receiver(argv, ["probe"]).stdout == b"sglang-deploy-peer ok\n"  # the receiver itself still is
        # The list is fixed by the entry: a grant.json changed on the source (root adds a name) is not honoured.
        grant_json = f"/run/sglang-deploy/peer-grants/{grant['ident']}/grant.json"
        ssh(SOURCE, f"python3 -c \"import json; p='{grant_json}'; g=json.load(open(p)); g['names'].append('model.safetensors'); "
                    f"json.dump(g, open(p, 'w'))\"")
        said = refused(on_receiver(argv, ["send"], b"model.safetensors\0"), "a grant changed after the fact")
        assert "not the one this key was given for" in said, said
    finally:
        ssh(SOURCE, "rm -rf /tmp/peer-test", check=False)
        holder.stdin.close()
        holder.wait(timeout=120)
    assert leftovers(SOURCE) == "" and leftovers(RECEIVER) == ""
    assert ssh(SOURCE, f"sha256sum {KEYS}").stdout.split()[0] == keys_file


def test_a_key_a_killed_run_left_is_removed_by_the_next_run(routed, keys_file, tmp_path):
    model(files=16, mib=64)
    log = tmp_path / "deploy.log"
    proc = run_deploy(log=log)
    try:
        wait_until(lambda: proc.poll() is not None or f"{MARK}:" in leftovers(SOURCE), 300, interval=0.05, what="the one-time key on the source")
        assert proc.poll() is None, f"the deploy ended before it was killed:\n{log.read_text()[-3000:]}"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    time.sleep(1)
    left = leftovers(SOURCE)
    assert f"{MARK}:" in left and leftovers(RECEIVER), (left, log.read_text()[-3000:])  # the killed run's key is there

    # The next deploy that reads the source removes its grant, from the host's read, without a transfer of its own;
    # under --dry (no lock) it only reads.
    alone = write_inventory("test_peer_keys_sweep", {SOURCE: {"run_services": []}})
    dry = labutil.deploy(alone, "--dry", as_json=False)
    assert f"{MARK}:" in leftovers(SOURCE), dry.stdout[-3000:] + dry.stderr[-3000:]
    swept = labutil.deploy(alone, as_json=False)
    said = swept.stdout + swept.stderr
    assert swept.returncode == 0, said[-4000:]
    assert f"removed 1 one-time key(s) a run that stopped left on {SOURCE}" in said, said[-4000:]
    assert "is gone" in said, said[-4000:]  # proven dead: its deploy's pid is gone
    assert leftovers(SOURCE) == "" and leftovers(RECEIVER), said[-4000:]  # the receiver's: for a run that reads it
    assert ssh(SOURCE, f"sha256sum {KEYS}").stdout.split()[0] == keys_file

    status, out = run_deploy()
    assert status == 0, out[-4000:]
    assert f"removed 1 one-time key(s) a run that stopped left on {RECEIVER}" in out, out[-4000:]
    assert f"left on {SOURCE}" not in out, out[-4000:]
    assert digests(RECEIVER, f"{STORE}/{MODEL}") == digests(SOURCE, f"{STORE}/{MODEL}")
    assert leftovers(SOURCE) == "" and leftovers(RECEIVER) == ""
    assert ssh(SOURCE, f"sha256sum {KEYS}").stdout.split()[0] == keys_file


def test_where_the_receiver_cannot_reach_the_source_the_bytes_go_through_this_machine_and_the_run_says_so(keys_file):
    model()
    # The lab as it is: gpu-e has no route to gpu-d.
    assert "Network is unreachable" in ssh(RECEIVER, f"timeout 5 bash -c '</dev/tcp/{lab_hosts()[SOURCE]['address']}/22' 2>&1 || true").stdout
    status, out = run_deploy()
    assert status == 0, out[-4000:]
    said = f"{RECEIVER} does not read from {SOURCE} directly (no route to {lab_hosts()[SOURCE]['address']}"
    assert said in out and "the bytes go through this machine" in out, out[-4000:]
    assert f"streamed {MODEL} from {SOURCE}:{STORE}/{MODEL}" in out and "over OpenSSH (" in out and "reading from" not in out, out[-4000:]
    assert digests(RECEIVER, f"{STORE}/{MODEL}") == digests(SOURCE, f"{STORE}/{MODEL}")
    assert leftovers(SOURCE) == "" and leftovers(RECEIVER) == ""
    assert ssh(SOURCE, f"sha256sum {KEYS}").stdout.split()[0] == keys_file
