"""Bulk bytes over OpenSSH (operations/transport/openssh.py, configuration/ssh_login.py, operations/transport/streaming.py's "Bulk bytes").

The `ssh` command line is built from a host's pyinfra data (hosts from plain data, tests/unit/hosts.py; none contacted)
and read back by OpenSSH itself (`ssh -G`: its effective settings, no connection). Then the transfers run end to end
on this machine with `sh -c` standing in for `ssh HOST` (`openssh.route` patched), so the processes, the streams at
once, the resumption of a transfer that stopped half way and the push of wheels are the deploy's own code.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import subprocess
import tarfile
import threading
from pathlib import Path
from types import SimpleNamespace

import paramiko
import pytest

from configuration import connection, schema, ssh_login
from operations.model import model_digests, transfer
from operations.transport import openssh, stream_ends, streaming
from tests.unit.hosts import ThisMachine, make_host

LAB = {"ssh_hostname": "10.213.0.2", "ssh_user": "root", "ssh_key": "/srv/lab/id_ed25519",
       "ssh_known_hosts_file": "/srv/lab/known_hosts", "ssh_strict_host_key_checking": "yes"}


def options(argv: list[str]) -> dict[str, str]:
    return {argv[i + 1].split("=", 1)[0]: argv[i + 1].split("=", 1)[1] for i, a in enumerate(argv) if a == "-o"}


def effective(argv: list[str]) -> dict[str, str]:
    """What OpenSSH makes of the command line (`ssh -G`: the settings it would connect with; nothing is contacted)."""
    proc = subprocess.run([argv[0], "-G", *argv[1:]], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        out[key] = f"{out[key]} {value}" if key in out else value
    return out


needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client on this machine")


# The command line, from the host's data ------------------------------------------------------------------------------


def test_the_command_line_logs_in_as_pyinfra_does_with_the_deploys_transfer_options():
    argv = openssh.ssh_argv(make_host({}, LAB))
    assert argv[-2:] == ["--", "10.213.0.2"] and argv[argv.index("-l") + 1] == "root" and "-p" not in argv
    assert argv[argv.index("-F") + 1] == os.devnull or argv[argv.index("-F") + 1] == os.path.expanduser("~/.ssh/config")
    assert argv[argv.index("-i") + 1] == "/srv/lab/id_ed25519"
    said = options(argv)
    assert said["UserKnownHostsFile"] == "/srv/lab/known_hosts" and said["GlobalKnownHostsFile"] == "none"
    assert said["StrictHostKeyChecking"] == "yes" and said["UpdateHostKeys"] == "no" and said["VerifyHostKeyDNS"] == "no"
    assert said["IdentitiesOnly"] == "yes" and said["IdentityAgent"] == "none"  # pyinfra logs in with ssh_key alone
    assert said["Ciphers"].split(",")[0] == "aes128-gcm@openssh.com"
    assert said["Compression"] == "no" and said["BatchMode"] == "yes" and said["ForwardAgent"] == "no"
    assert said["ControlPath"] == "none" and said["ClearAllForwardings"] == "yes" and said["PermitLocalCommand"] == "no"


def test_pyinfras_defaults_hold_where_the_data_says_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/config: pyinfra reads no config file, nor does ours
    argv = openssh.ssh_argv(make_host({}, {"ssh_hostname": "gpu.example"}))
    said = options(argv)
    assert argv[argv.index("-F") + 1] == os.devnull
    assert said["UserKnownHostsFile"] == str(tmp_path / ".ssh/known_hosts")  # pyinfra's one file, not known_hosts2
    assert said["StrictHostKeyChecking"] == "accept-new"  # pyinfra's default, which wins over a config file's
    assert "-i" not in argv and "-l" not in argv and "IdentityAgent" not in said and "IdentityFile" not in said
    off = options(openssh.ssh_argv(make_host({}, {"ssh_hostname": "gpu.example", "ssh_allow_agent": False, "ssh_look_for_keys": False})))
    assert off["IdentityAgent"] == "none" and off["IdentityFile"] == "none"


@needs_ssh
def test_openssh_reads_the_settings_pyinfra_reads_jump_host_and_known_hosts_from_the_config_file(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host gpu-x.internal\n  ProxyJump ops@bastion.example:2222\n  UserKnownHostsFile ~/fleet_known_hosts\n"
                      "  Port 2200\n  ForwardAgent yes\n  Compression yes\n  ControlMaster auto\n  ControlPath ~/.ssh/cm-%r@%h\n")
    (tmp_path / "key").write_text("")  # ssh -G lists a key file only where it exists
    host = make_host({}, {"ssh_hostname": "gpu-x.internal", "ssh_user": "deploy", "ssh_config_file": str(config),
                          "ssh_key": str(tmp_path / "key")})
    argv = openssh.ssh_argv(host)
    assert argv[argv.index("-F") + 1] == str(config)
    seen = effective(argv)
    assert seen["hostname"] == "gpu-x.internal" and seen["user"] == "deploy" and seen["port"] == "2200"
    assert seen["proxyjump"] == "ops@bastion.example:2222"  # the jump host, as pyinfra takes it from the config
    assert seen["userknownhostsfile"] == os.path.expanduser("~/fleet_known_hosts")
    assert seen["globalknownhostsfile"] == "none" and seen["stricthostkeychecking"] == "accept-new"
    assert seen["identityfile"] == str(tmp_path / "key") and seen["identitiesonly"] == "yes"
    assert seen["ciphers"].startswith("aes128-gcm@openssh.com,") and seen["compression"] == "no" and seen["batchmode"] == "yes"
    assert seen["forwardagent"] == "no" and seen["controlmaster"] == "false" and "controlpath" not in seen
    # A `%` in a path is the path's (pyinfra expands no token), a space too.
    literal = tmp_path / "known %h hosts"
    assert effective(openssh.ssh_argv(make_host({}, {"ssh_hostname": "gpu-x.internal", "ssh_known_hosts_file": str(literal)})))[
        "userknownhostsfile"] == str(literal)
    # The data's own settings win over the file's, as in pyinfra.
    seen = effective(openssh.ssh_argv(make_host({}, {"ssh_hostname": "gpu-x.internal", "ssh_port": 22, "ssh_config_file": str(config),
                                                     "ssh_known_hosts_file": str(tmp_path / "kh")})))
    assert seen["port"] == "22" and seen["userknownhostsfile"] == str(tmp_path / "kh")


@pytest.mark.parametrize("data, why", [
    ({"ssh_paramiko_connect_kwargs": {"sock": object()}}, "ssh_paramiko_connect_kwargs.sock"),
    ({"ssh_paramiko_connect_kwargs": {"disabled_algorithms": {"ciphers": ["aes128-ctr"]}}}, "disabled_algorithms"),
    ({"ssh_password": "x" * 20}, "`ssh_password` is set"),
])
def test_what_openssh_cannot_reproduce_is_named(data, why):
    with pytest.raises(openssh.Unavailable, match=why):
        openssh.ssh_argv(make_host({}, {"ssh_hostname": "gpu.example", **data}))


def test_paramiko_arguments_with_an_openssh_equivalent_are_used():
    argv = openssh.ssh_argv(make_host({}, {"ssh_hostname": "gpu.example", "ssh_paramiko_connect_kwargs": {
        "key_filename": ["/k/one", "/k/two"], "timeout": 3, "compress": True, "banner_timeout": 5}}))
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-i"] == ["/k/one", "/k/two"]
    assert options(argv)["ConnectTimeout"] == "3" and options(argv)["Compression"] == "no"


def test_another_connector_is_not_reached_by_openssh():
    with pytest.raises(openssh.Unavailable, match="not reached through pyinfra's SSH connector"):
        openssh.ssh_argv(make_host({}, {}, name="@local"))


def test_every_key_of_pyinfras_ssh_connector_is_classified_with_pyinfras_defaults():
    """A key a later pyinfra's SSH connector reads fails here until ssh_login says how OpenSSH takes it."""
    from pyinfra.connectors.ssh import SSHConnector

    keys = set(SSHConnector.data_meta)
    assert sorted(keys - set(ssh_login.SSH_KEYS)) == []
    assert set(ssh_login.SSH_KEYS) <= set(connection.CONNECTOR_KEYS)
    for key, default in ssh_login.PYINFRA_DEFAULTS.items():
        assert SSHConnector.data_meta[key].default == default, key
    assert set(ssh_login.PARAMIKO_ARGUMENTS) <= set(inspect.signature(paramiko.SSHClient.connect).parameters)


# The route: OpenSSH where it reaches the host, said once where it does not -------------------------------------------


def test_without_ssh_on_this_machine_the_bytes_go_over_pyinfras_connection_and_the_run_says_so(monkeypatch):
    monkeypatch.setattr(openssh.shutil, "which", lambda name: None)
    said = []
    host = make_host({}, LAB)  # a run of its own: nothing decided yet
    assert openssh.route(host, said.append) is None and openssh.route(host, said.append) is None
    assert said == ["bulk bytes go over pyinfra's paramiko connection (slower): OpenSSH's `ssh` is not installed on this "
                    "machine (Debian/Ubuntu: apt-get install openssh-client)"]


def test_a_host_openssh_cannot_log_in_to_goes_over_pyinfras_connection(monkeypatch):
    monkeypatch.setattr(openssh.shutil, "which", lambda name: "/bin/false")  # `ssh HOST true` fails
    said = []
    assert openssh.route(make_host({}, LAB), said.append) is None
    assert len(said) == 1 and "`ssh gpu-a true` with its pyinfra settings failed (exit 1" in said[0]


def test_transfer_streams_comes_from_the_data_with_the_schemas_default():
    assert schema.default_of(schema.GroupData, "transfer_streams") == 4
    assert openssh.streams(make_host({}, LAB)) == 4
    assert openssh.streams(make_host({"transfer_streams": 8}, LAB)) == 8


def test_batches_balance_bytes_never_split_a_file_and_keep_hard_links_together():
    sizes = {"a": 100, "b": 90, "c": 50, "d": 40, "e": 10, "f": 10}
    got = streaming.batches(sizes, 4)
    assert len(got) == 4 and sorted(n for b in got for n in b) == sorted(sizes)
    assert max(sum(sizes[n] for n in b) for b in got) == 100
    assert streaming.batches({"x": 1}, 4) == [["x"]]
    linked = streaming.batches({"a": 100, "b": 1, "c": 1}, 4, together=lambda n: "bc" if n in "bc" else n)
    assert ["b", "c"] in linked


# Transfers end to end on this machine: `sh -c` in place of `ssh HOST` -------------------------------------------------


class Here(ThisMachine):
    """A host that is this machine (tests/unit/hosts.py), that pyinfra's upload also reaches."""

    def put_file(self, src, dest, **_):
        self.logs.append(f"pyinfra put {dest}")
        shutil.copyfile(src, dest)
        return True


@pytest.fixture
def local_ssh(monkeypatch):
    """`ssh HOST COMMAND` is `sh -c COMMAND` here; the receiving ends started are counted, and how many ran at once."""
    monkeypatch.setattr(openssh, "route", lambda host, log=None: ["sh", "-c"])
    monkeypatch.setattr(openssh, "decide", lambda hosts, log=None: None)
    seen = {"started": 0, "live": 0, "most": 0}
    lock = threading.Lock()
    real_init, real_finish = stream_ends.ProcessSink.__init__, stream_ends.ProcessSink.finish

    def init(self, argv, host=None):
        real_init(self, argv, host)
        with lock:
            seen["started"] += 1
            seen["live"] += 1
            seen["most"] = max(seen["most"], seen["live"])

    def finish(self):
        try:
            return real_finish(self)
        finally:
            with lock:
                seen["live"] -= 1

    monkeypatch.setattr(stream_ends.ProcessSink, "__init__", init)
    monkeypatch.setattr(stream_ends.ProcessSink, "finish", finish)
    return seen


def model(root: Path, files: int = 8, size: int = 3 << 20, links: bool = True) -> Path:
    (root / "sub").mkdir(parents=True)
    for i in range(files):
        (root / ("sub" if i % 3 == 0 else ".") / f"model-{i:05}.safetensors").write_bytes(os.urandom(size + i))
    (root / "config.json").write_text("{}\n")
    (root / ".sglang-deploy-manifest.json").write_text("{}")  # ours: never sent
    if links:
        os.link(root / "config.json", root / "sub/config-link.json")  # a hard link: one stream, linked again
        (root / "latest").symlink_to("sub/model-00000.safetensors")
    for i, path in enumerate(sorted(root.rglob("*"))):
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    return root


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (os.readlink(p),) if p.is_symlink() else
            (p.read_bytes() if p.is_file() else "dir", int(p.stat().st_mtime), p.stat().st_nlink if p.is_file() else 0)
            for p in sorted(root.rglob("*")) if not p.name.startswith(transfer.OURS)}


def test_a_model_goes_in_several_streams_at_once_through_processes(tmp_path, local_ssh):
    src = model(tmp_path / "source/M")
    store = tmp_path / "store"
    store.mkdir()
    here = Here()
    assert transfer._stream(None, here, str(src), str(src), str(store / "M"), model_digests.local(str(src))) is True, here.logs
    assert tree(store / "M") == tree(src) and not (store / "M/.sglang-deploy-manifest.json").exists()
    assert sorted(p.name for p in store.iterdir()) == ["M"]
    assert local_ssh["most"] == 4  # transfer_streams' default, at once; then one more for the directories
    assert local_ssh["started"] == 5
    assert "streamed M from control machine:" in here.logs[-1] and "over OpenSSH (4 stream(s))" in here.logs[-1]


def test_a_model_stream_that_stopped_half_way_resumes_with_what_came_whole(tmp_path, local_ssh, monkeypatch):
    src = model(tmp_path / "source/M", links=False)
    store = tmp_path / "store"
    store.mkdir()
    here = Here()
    # The first run stops at its third file (the source cannot be read past it: a cut): what came whole stays.
    real, added = tarfile.TarFile.gettarinfo, []

    def cut(self, name=None, arcname=None, fileobj=None):
        if len(added) >= 2:
            raise OSError(5, "Input/output error", name)
        added.append(arcname)
        return real(self, name, arcname, fileobj)

    monkeypatch.setattr(tarfile.TarFile, "gettarinfo", cut)
    monkeypatch.setattr(openssh, "streams", lambda host: 1)
    assert transfer._stream(None, here, str(src), str(src), str(store / "M"), model_digests.local(str(src))) is False
    partial = store / ".M.partial"
    assert "the next run sends only the rest" in here.logs[-1], here.logs
    assert sorted(str(p.relative_to(partial)) for p in partial.rglob("*") if p.is_file()) == sorted(a[2:] for a in added)
    (partial / ".untar-1-1.partial").write_bytes(b"half")  # an unpacker killed mid-file leaves its temporary name
    (partial / added[1][2:]).write_bytes(b"not the source's")  # and a file that differs: both go

    sent = []

    def sending(self, name=None, arcname=None, fileobj=None):
        sent.append(arcname)
        return real(self, name, arcname, fileobj)

    monkeypatch.setattr(tarfile.TarFile, "gettarinfo", sending)
    assert transfer._stream(None, here, str(src), str(src), str(store / "M"), model_digests.local(str(src))) is True, here.logs
    assert tree(store / "M") == tree(src) and sorted(p.name for p in store.iterdir()) == ["M"]
    kept = sorted(a for a in (f"./{p.relative_to(src)}" for p in src.rglob("*") if p.is_file()) if a not in sent and "manifest" not in a)
    assert len(kept) == 1  # the first file of the first run, whole and as the source's: not sent again
    assert any("1 of 9 files of M are whole in" in line and "not sent again" in line for line in here.logs), here.logs


def test_a_refused_model_in_several_streams_leaves_nothing(tmp_path, local_ssh):
    src = model(tmp_path / "source/M")
    (src / "sub/tokenizer.json").symlink_to("/etc/shadow")
    store = tmp_path / "store"
    store.mkdir()
    here = Here()
    assert transfer._stream(None, here, str(src), str(src), str(store / "M"), model_digests.local(str(src))) is False
    assert "untar: refused ./sub/tokenizer.json: a symlink to /etc/shadow (absolute)" in here.logs[-1], here.logs
    assert "nothing of it is kept" in here.logs[-1] and list(store.iterdir()) == []


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_wheels_are_pushed_in_several_streams_and_a_checked_part_is_not_sent_again(tmp_path, local_ssh):
    house, cache = tmp_path / "house", tmp_path / "cache"
    house.mkdir()
    cache.mkdir()
    wheels = []
    for i in range(6):
        path = house / f"pkg{i}-1.0-py3-none-any.whl"
        path.write_bytes(os.urandom((1 << 20) * (i + 1)))
        wheels.append(path)
    shutil.copyfile(wheels[5], cache / f"{wheels[5].name}.part")  # a run that stopped half way: whole, right
    (cache / f"{wheels[4].name}.part").write_bytes(os.urandom(wheels[4].stat().st_size))  # same size, wrong bytes
    here = Here()
    pushes = streaming.Pushes("wheel")
    uploads = [pushes.upload(str(w), f"{cache}/{w.name}.part", sha256(w)) for w in wheels]
    assert all(u.execute(None, here, {}) for u in uploads), here.logs
    assert all(sha256(cache / f"{w.name}.part") == sha256(w) for w in wheels)
    assert local_ssh["started"] == 4 and local_ssh["most"] == 4  # five files to send, four streams at once
    assert "1 wheel file(s) already whole on the host with their sha256" in here.logs[0]
    assert "pushed 5 wheel(s)" in here.logs[-1] and "over OpenSSH (4 stream(s)" in here.logs[-1]
    assert sorted(p.name for p in cache.iterdir()) == sorted(f"{w.name}.part" for w in wheels)  # nothing else left


def test_where_openssh_does_not_reach_the_host_each_wheel_goes_by_pyinfras_upload(tmp_path, monkeypatch):
    monkeypatch.setattr(openssh, "route", lambda host, log=None: None)
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    here = Here()
    upload = streaming.Pushes("wheel").upload(str(wheel), str(tmp_path / "pkg.whl.part"))
    assert upload.execute(SimpleNamespace(print_output=False, print_input=False), here, {}) is True
    assert here.logs == [f"pyinfra put {tmp_path / 'pkg.whl.part'}"]
