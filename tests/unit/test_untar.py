"""Bytes from another host land as root's (operations/remote/untar_as_root.py, `streaming.unpack_command`).

A source host (a model in its store) or a donor host (its venv's files) sends a tar stream; `tar -x` as root
would make what the archive says: setuid files of any owner, device nodes, fifos, links and names out of the
tree. Hostile streams are built here in memory and fed to the unpacker exactly as the hosts run it (`sh -c`
the command `streaming.unpack_command` gives): each is refused, naming the member, or lands as root's (the
unpacker's own user here) with its mode stripped. Then a benign tree round-trips byte for byte, and the two
callers (a model into the store, a donor's venv files into a generation) are run end to end on this machine,
the SSH channel to the receiving host replaced by a local `sh -c`.
"""

from __future__ import annotations

import io
import os
import shlex
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from operations import remote, streaming, transfer, venv
from tests.unit.hosts import ThisMachine
from tests.unit.test_venv import _fake_venv

OTHER_UID = 1234
BIG = (1 << 22) + (1 << 20) + 3  # more than one 4 MiB block, not a multiple of anything


def entry(name: str, kind=tarfile.REGTYPE, data: bytes = b"", mode: int = 0o644, linkname: str = "", uid: int = 0, mtime: int = 1_600_000_000):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, info.uid, info.gid, info.mtime = kind, mode, linkname, uid, uid, mtime
    if kind == tarfile.REGTYPE:
        info.size = len(data)
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, (io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def stream(*entries) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for info, data in entries:
            archive.addfile(info, data)
    return out.getvalue()


def unpack(dest: Path, data: bytes) -> subprocess.CompletedProcess:
    dest.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["sh", "-c", streaming.unpack_command(str(dest))], input=data, capture_output=True, timeout=120)


def everything(root: Path) -> list[str]:
    """Every path under root (links not followed), our temporary names included."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# Refused, naming the member ----------------------------------------------------------------------------------------


REFUSED = {
    "a character device": ([entry("dev/mem", tarfile.CHRTYPE, mode=0o666)], "dev/mem", "a character device"),
    "a block device": ([entry("sda", tarfile.BLKTYPE, mode=0o666)], "sda", "a block device"),
    "a fifo": ([entry("model.fifo", tarfile.FIFOTYPE, mode=0o666)], "model.fifo", "a fifo"),
    "a symlink to /etc": ([entry("etc", tarfile.SYMTYPE, linkname="/etc")], "etc", "a symlink to /etc (absolute)"),
    "a symlink up out of the tree": ([entry("x", tarfile.SYMTYPE, linkname="../../x")], "x", "a symlink to ../../x, out of the tree"),
    "a symlink in a directory, up out of the tree": (
        [entry("sub", tarfile.DIRTYPE, mode=0o755), entry("sub/x", tarfile.SYMTYPE, linkname="../../x")], "sub/x", "out of the tree"),
    "a symlink down then up": ([entry("x", tarfile.SYMTYPE, linkname="sub/../../x")], "x", "'..' after a name"),
    # `sub -> .` is in the tree; a member below it would be written through it (`sub/up -> ..` is the parent of
    # the tree, though it reads as the tree itself): nothing passes through a link.
    "a link below a link": (
        [entry("sub", tarfile.SYMTYPE, linkname="."), entry("sub/up", tarfile.SYMTYPE, linkname="..")], "sub/up", "passes through sub"),
    "a file below a link": (
        [entry("real", tarfile.DIRTYPE, mode=0o755), entry("alias", tarfile.SYMTYPE, linkname="real"), entry("alias/f", data=b"x")],
        "alias/f", "passes through alias"),
    "a directory over a link": (
        [entry("real", tarfile.DIRTYPE, mode=0o755), entry("alias", tarfile.SYMTYPE, linkname="real"), entry("alias", tarfile.DIRTYPE)],
        "alias", "passes through alias"),
    "a hard link to /etc/passwd": ([entry("passwd", tarfile.LNKTYPE, linkname="/etc/passwd")], "passwd", "a hard link to /etc/passwd: an absolute target"),
    "a hard link up out of the tree": ([entry("h", tarfile.LNKTYPE, linkname="../outside")], "h", "a hard link to ../outside: a target with '..'"),
    "a hard link to a file not in the archive": ([entry("h", tarfile.LNKTYPE, linkname="config.json")], "h", "not a regular file this archive wrote"),
    "a hard link to a symlink": (
        [entry("f", data=b"x"), entry("s", tarfile.SYMTYPE, linkname="f"), entry("h", tarfile.LNKTYPE, linkname="s")], "h", "not a regular file"),
    "an absolute name": ([entry("/etc/cron.d/model", data=b"* * * * * root sh\n")], "/etc/cron.d/model", "an absolute name"),
    "a name with ..": ([entry("../escaped", data=b"x")], "../escaped", "a name with '..'"),
    "a name with .. inside": ([entry("a/../../escaped", data=b"x")], "a/../../escaped", "a name with '..'"),
    "a file over a directory": ([entry("d", tarfile.DIRTYPE, mode=0o755), entry("d", data=b"x")], "d", "d is a directory already"),
}


@pytest.mark.parametrize("case", REFUSED, ids=[case.replace(" ", "-") for case in REFUSED])
def test_a_hostile_member_is_refused_by_name_and_nothing_of_it_lands(tmp_path, case):
    entries, name, what = REFUSED[case]
    dest = tmp_path / "tree"
    result = unpack(dest, stream(*entries))
    assert result.returncode != 0
    assert f"untar: refused {name}: " in result.stderr.decode() and what in result.stderr.decode(), result.stderr
    # Nothing of the refused member, nothing out of the tree, no temporary file left behind.
    assert not any(".untar-" in p for p in everything(tmp_path)), everything(tmp_path)
    assert everything(tmp_path) == sorted(["tree", *(f"tree/{p}" for p in everything(dest))])
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "outside").exists()
    for path in dest.rglob("*"):
        st = path.lstat()
        assert not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISFIFO(st.st_mode)), path
        if stat.S_ISLNK(st.st_mode):
            assert os.readlink(path) in ("f", "real", "."), path  # only the in-tree links the case made first


# Landed as root's, mode stripped ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "kind", "landed"), [
    (0o4777, tarfile.REGTYPE, 0o755),  # setuid, written by all
    (0o6755, tarfile.REGTYPE, 0o755),  # setuid and setgid
    (0o2775, tarfile.REGTYPE, 0o755),  # setgid, group-writable
    (0o666, tarfile.REGTYPE, 0o644),
    (0o600, tarfile.REGTYPE, 0o600),  # what is private stays private
    (0o1777, tarfile.DIRTYPE, 0o755),  # sticky, written by all
    (0o2770, tarfile.DIRTYPE, 0o750),
], ids=["setuid-0o4777", "setuid-setgid", "setgid-group-writable", "file-0o666", "file-0o600", "dir-sticky-0o1777", "dir-setgid-0o2770"])
def test_a_member_of_another_owner_lands_as_the_unpackers_with_its_mode_stripped(tmp_path, mode, kind, landed):
    dest = tmp_path / "tree"
    data = b"#!/bin/sh\nid\n" if kind == tarfile.REGTYPE else b""
    result = unpack(dest, stream(entry("bin/run", kind, data=data, mode=mode, uid=OTHER_UID)))
    assert result.returncode == 0, result.stderr
    st = (dest / "bin/run").lstat()
    assert (st.st_uid, st.st_gid) == (os.geteuid(), os.getegid()) != (OTHER_UID, OTHER_UID)
    assert stat.S_IMODE(st.st_mode) == landed, oct(st.st_mode)
    if kind == tarfile.REGTYPE:
        assert (dest / "bin/run").read_bytes() == data


def test_a_file_of_another_owner_lands_as_root_on_the_host(tmp_path):
    """Where the tests run as root (as the deploy does on a host): the file is root's, not uid 1234's."""
    if os.geteuid() != 0:
        pytest.skip("needs root: as another user, a file cannot be given away anyway")
    dest = tmp_path / "tree"
    assert unpack(dest, stream(entry("suid", data=b"x", mode=0o4777, uid=OTHER_UID))).returncode == 0
    st = (dest / "suid").lstat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o755)


# Nothing half-written looks complete ---------------------------------------------------------------------------


def test_a_stream_cut_inside_a_file_leaves_no_file_under_its_name(tmp_path):
    data = stream(entry("config.json", data=b"{}"), entry("model.safetensors", data=os.urandom(BIG)))
    dest = tmp_path / "tree"
    result = unpack(dest, data[: len(data) // 2])
    assert result.returncode != 0 and b"untar: failed at model.safetensors" in result.stderr, result.stderr
    assert everything(dest) == ["config.json"]  # whole before the cut; nothing of the cut one, no temporary name


def test_a_refused_member_after_good_ones_fails_the_stream(tmp_path):
    """What came before stays (complete files only): the callers unpack into a directory of their own and use it
    only when the whole stream was taken (a model's `.NAME.partial`, removed; a generation, not stamped)."""
    dest = tmp_path / "tree"
    result = unpack(dest, stream(entry("config.json", data=b"{}"), entry("model.safetensors", data=os.urandom(BIG)),
                                 entry("zz", tarfile.SYMTYPE, linkname="/root/.ssh/authorized_keys")))
    assert result.returncode != 0 and b"untar: refused zz" in result.stderr
    assert everything(dest) == ["config.json", "model.safetensors"]


# A benign tree round-trips ---------------------------------------------------------------------------------------


def benign_tree(root: Path) -> Path:
    (root / "sub/deeper").mkdir(parents=True)
    (root / "empty-dir").mkdir()
    (root / "config.json").write_text('{"a": 1}\n')
    (root / "empty").write_bytes(b"")
    (root / "model-00001-of-00002.safetensors").write_bytes(os.urandom(BIG))
    (root / "sub/deeper/block").write_bytes(os.urandom(1 << 22))  # exactly one block
    (root / "sub" / ("long-name-" * 20)).write_bytes(b"long\n")  # a GNU long name
    (root / "sub/modèle.json").write_text("{}\n")
    (root / "bin").mkdir()
    (root / "bin/tool").write_text("#!/bin/sh\n")
    (root / "bin/tool").chmod(0o755)
    (root / "private").write_text("x")
    (root / "private").chmod(0o600)
    (root / "latest").symlink_to("sub/deeper/block")
    (root / "sub/deeper/back").symlink_to("../../config.json")
    (root / "sub/here").symlink_to(".")
    os.link(root / "config.json", root / "sub/config-link.json")
    for i, path in enumerate(sorted(root.rglob("*"))):
        os.utime(path, (1_600_000_000 + i, 1_600_000_000 + i), follow_symlinks=False)
    return root


def picture(root: Path) -> dict:
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", stat.S_IMODE(st.st_mode), int(st.st_mtime))
        else:
            out[rel] = ("file", stat.S_IMODE(st.st_mode), int(st.st_mtime), st.st_nlink, path.read_bytes())
    return out


@pytest.mark.parametrize("maker", ["gnu tar", "tarfile pax"])
def test_a_benign_tree_round_trips_byte_for_byte(tmp_path, maker):
    src = benign_tree(tmp_path / "src")
    if maker == "gnu tar":
        data = subprocess.run(["tar", "-C", str(src), "-cf", "-", "."], capture_output=True, check=True).stdout
    else:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
            archive.add(str(src), arcname=".")
        data = out.getvalue()
    dest = tmp_path / "dest"
    result = unpack(dest, data)
    assert result.returncode == 0, result.stderr
    assert picture(dest) == picture(src)
    assert (dest / "config.json").stat().st_ino == (dest / "sub/config-link.json").stat().st_ino


def test_the_unpacker_is_sent_as_an_argument_and_runs_isolated():
    # stdin is the stream: the script is an argument, and -I keeps PYTHON* variables and the directory out.
    command = streaming.unpack_command("/root/models/.M.partial")
    assert command.startswith("(cd / && exec ") and command.endswith(")")
    argv = shlex.split(command[len("(cd / && exec "):-1])
    assert argv == ["python3", "-I", "-c", remote.script("untar_as_root"), "/root/models/.M.partial"]


# The callers, end to end on this machine ----------------------------------------------------------------------------


class LocalChannel:
    """`streaming.channel` for a host that is this machine: the command runs under `sh -c`."""

    def __init__(self, host, command: str):
        self.proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.closed = False

    def sendall(self, block: bytes) -> None:
        try:
            self.proc.stdin.write(block)
            self.proc.stdin.flush()
        except OSError:
            self.closed = True
            raise

    def shutdown_write(self) -> None:
        self.proc.stdin.close()

    def recv_exit_status(self) -> int:
        return self.proc.wait()

    def recv_stderr(self, size: int) -> bytes:
        return self.proc.stderr.read(size)


@pytest.fixture
def this_machine(monkeypatch):
    monkeypatch.setattr(streaming, "channel", LocalChannel)
    return ThisMachine()


def test_a_model_with_a_link_out_of_its_directory_is_refused_and_leaves_nothing(tmp_path, this_machine):
    src = benign_tree(tmp_path / "source/Qwen3.6-27B")
    (src / "tokenizer.json").symlink_to("/etc/shadow")
    store = tmp_path / "store"
    store.mkdir()
    assert transfer._stream(None, this_machine, str(src), str(src), str(store / "Qwen3.6-27B")) is False
    assert any("untar: refused ./tokenizer.json: a symlink to /etc/shadow (absolute)" in line for line in this_machine.logs), this_machine.logs
    assert list(store.iterdir()) == []  # no model, no `.Qwen3.6-27B.partial` left


def test_a_model_with_a_fifo_is_refused(tmp_path, this_machine):
    src = benign_tree(tmp_path / "source/M")
    os.mkfifo(src / "sub/pipe")
    store = tmp_path / "store"
    store.mkdir()
    assert transfer._stream(None, this_machine, str(src), str(src), str(store / "M")) is False
    assert any("untar: refused ./sub/pipe: a fifo" in line for line in this_machine.logs), this_machine.logs
    assert list(store.iterdir()) == []


def test_a_models_setuid_file_lands_in_the_store_as_root_without_the_bit(tmp_path, this_machine):
    src = benign_tree(tmp_path / "source/M")
    (src / "run.sh").write_text("#!/bin/sh\n")
    if os.geteuid() == 0:
        os.chown(src / "run.sh", OTHER_UID, OTHER_UID)
    (src / "run.sh").chmod(0o6777)
    store = tmp_path / "store"
    store.mkdir()
    assert transfer._stream(None, this_machine, str(src), str(src), str(store / "M")) is True, this_machine.logs
    st = (store / "M/run.sh").lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o755)
    assert sorted(p.name for p in store.iterdir()) == ["M"]
    assert {k: v for k, v in picture(store / "M").items() if k != "run.sh"} == {k: v for k, v in picture(src).items() if k != "run.sh"}


@pytest.fixture
def donor_here(monkeypatch, this_machine):
    """The donor host is this machine too: its reader runs the donor's command under `sh -c`."""
    monkeypatch.setattr(streaming, "HostReader", lambda host, command: streaming.LocalReader(["sh", "-c", command]))

    class Donor(ThisMachine):
        connected = True

    monkeypatch.setattr(venv, "_donor_host", lambda name: Donor())
    return this_machine


def donor_venv(root: Path) -> Path:
    donor = _fake_venv(root, {"torch": ["torch/__init__.py", "torch/lib/libtorch.so", "torch/bin/helper"]})
    site = donor / "lib/python3.11/site-packages"
    (site / "torch/lib/libtorch.so").write_bytes(os.urandom(BIG))
    return donor


def test_a_donors_files_land_in_the_generation_as_root_without_setuid(tmp_path, donor_here):
    donor = donor_venv(tmp_path / "donor")
    helper = donor / "lib/python3.11/site-packages/torch/bin/helper"
    if os.geteuid() == 0:
        os.chown(helper, OTHER_UID, OTHER_UID)
    helper.chmod(0o4777)
    gen = venv.Generation(str(tmp_path / "venv"), "g1")
    Path(gen.path, "bin").mkdir(parents=True)
    assert venv._stream_from_donor(None, donor_here, "gpu-a", str(donor), gen, ["torch==1.0"]) is True, donor_here.logs
    site = Path(gen.path, "lib/python3.11/site-packages")
    assert (site / "torch/lib/libtorch.so").read_bytes() == (donor / "lib/python3.11/site-packages/torch/lib/libtorch.so").read_bytes()
    st = (site / "torch/bin/helper").lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o755)


def test_a_donors_link_out_of_its_venv_is_refused(tmp_path, donor_here):
    donor = donor_venv(tmp_path / "donor")
    site = donor / "lib/python3.11/site-packages"
    (site / "torch/hooks").symlink_to("/etc/cron.d")
    record = site / "torch-1.0.dist-info/RECORD"
    record.write_text(record.read_text() + "torch/hooks,,\n")
    gen = venv.Generation(str(tmp_path / "venv"), "g1")
    Path(gen.path, "bin").mkdir(parents=True)
    assert venv._stream_from_donor(None, donor_here, "gpu-a", str(donor), gen, ["torch==1.0"]) is False
    refused = "untar: refused lib/python3.11/site-packages/torch/hooks: a symlink to /etc/cron.d (absolute)"
    assert any(refused in line for line in donor_here.logs), donor_here.logs
    assert not os.path.lexists(Path(gen.path, "lib/python3.11/site-packages/torch/hooks"))


def test_a_suffix_lands_every_file_as_name_suffix_and_refuses_links(tmp_path):
    """Wheels read from another host of the run land as NAME.part, to be checked against their pins before they
    take their names (operations/fanout.py): never under the name a checked wheel has."""
    data = stream(entry("torch.whl", data=b"wheel bytes"), entry("sub/", tarfile.DIRTYPE, mode=0o755),
                  entry("sub/other.whl", data=b"more"))
    done = subprocess.run(["sh", "-c", streaming.unpack_command(str(tmp_path), suffix=".part")], input=data,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == ["sub/other.whl.part", "torch.whl.part"]
    assert (tmp_path / "torch.whl.part").read_bytes() == b"wheel bytes"
    linked = tmp_path / "linked"
    linked.mkdir()
    refused = subprocess.run(["sh", "-c", streaming.unpack_command(str(linked), suffix=".part")],
                             input=stream(entry("a.whl", data=b"x"), entry("b.whl", tarfile.LNKTYPE, linkname="a.whl")),
                             capture_output=True, timeout=60)
    assert refused.returncode != 0 and b"a link in a stream" in refused.stderr
    assert not (linked / "b.whl").exists() and not (linked / "b.whl.part").exists()
