"""Bytes from another host land as root's (operations/transport/on_host/untar_as_root.py, `streaming.unpack_command`).

A source host (a model in its store) or a donor host (its venv's files) sends a tar stream; `tar -x` as root
would make what the archive says: setuid files of any owner, device nodes, fifos, links and names out of the
tree. Hostile streams are built here in memory and fed to the unpacker exactly as the hosts run it (`sh -c`
the command `streaming.unpack_command` gives): each is refused, naming the member, or lands as root's (the
unpacker's own user here) with its mode stripped. Then a benign tree round-trips byte for byte, and the two
callers (a model into the store, a donor's venv files into a generation) are run end to end on this machine,
the SSH channel to the receiving host replaced by a local `sh -c`.
"""

from __future__ import annotations

import hashlib
import io
import os
import shlex
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from operations import remote
from operations.environment import venv_copy, venv_read
from operations.model import model_digests, transfer
from operations.transport import stream_ends, streaming
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
    monkeypatch.setattr(stream_ends, "channel", LocalChannel)
    return ThisMachine()


def test_a_model_with_a_link_out_of_its_directory_is_refused_and_leaves_nothing(tmp_path, this_machine):
    src = benign_tree(tmp_path / "source/Qwen3.6-27B")
    (src / "tokenizer.json").symlink_to("/etc/shadow")
    store = tmp_path / "store"
    store.mkdir()
    assert transfer._stream(None, this_machine, str(src), str(src), str(store / "Qwen3.6-27B"), model_digests.local(str(src))) is False
    assert any("untar: refused ./tokenizer.json: a symlink to /etc/shadow (absolute)" in line for line in this_machine.logs), this_machine.logs
    assert list(store.iterdir()) == []  # no model, no `.Qwen3.6-27B.partial` left


def test_a_model_with_a_fifo_is_refused_at_its_origin_and_by_the_receiving_end(tmp_path, this_machine):
    src = benign_tree(tmp_path / "source/M")
    digests = model_digests.local(str(src))
    os.mkfifo(src / "sub/pipe")
    with pytest.raises(model_digests.OriginUnreadable, match="sub/pipe: a model holds files and links, not a special file"):
        model_digests.local(str(src))
    # A sender that sends one anyway, where the origin listed a file: refused at the receiving end.
    digests["sub/pipe"] = [0, hashlib.sha256(b"").hexdigest()]
    store = tmp_path / "store"
    store.mkdir()
    assert transfer._stream(None, this_machine, str(src), str(src), str(store / "M"), digests) is False
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
    assert transfer._stream(None, this_machine, str(src), str(src), str(store / "M"), model_digests.local(str(src))) is True, this_machine.logs
    st = (store / "M/run.sh").lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o755)
    assert sorted(p.name for p in store.iterdir()) == ["M"]
    assert {k: v for k, v in picture(store / "M").items() if k != "run.sh"} == {k: v for k, v in picture(src).items() if k != "run.sh"}


@pytest.fixture
def donor_here(monkeypatch, this_machine):
    """The donor host is this machine too: its reader runs the donor's command under `sh -c`."""
    monkeypatch.setattr(stream_ends, "HostReader", lambda host, command: stream_ends.LocalReader(["sh", "-c", command]))

    class Donor(ThisMachine):
        connected = True

    monkeypatch.setattr(venv_copy, "donor_host", lambda name: Donor())
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
    gen = venv_read.Generation(str(tmp_path / "venv"), "g1")
    Path(gen.path, "bin").mkdir(parents=True)
    assert venv_copy.stream_from_donor(None, donor_here, "gpu-a", str(donor), gen, ["torch==1.0"]) is True, donor_here.logs
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
    gen = venv_read.Generation(str(tmp_path / "venv"), "g1")
    Path(gen.path, "bin").mkdir(parents=True)
    assert venv_copy.stream_from_donor(None, donor_here, "gpu-a", str(donor), gen, ["torch==1.0"]) is False
    refused = "untar: refused lib/python3.11/site-packages/torch/hooks: a symlink to /etc/cron.d (absolute)"
    assert any(refused in line for line in donor_here.logs), donor_here.logs
    assert not os.path.lexists(Path(gen.path, "lib/python3.11/site-packages/torch/hooks"))


def test_a_suffix_lands_every_file_as_name_suffix_and_refuses_links(tmp_path):
    """Wheels read from another host of the run land as NAME.part, to be checked against their pins before they
    take their names (operations/transport/fanout.py): never under the name a checked wheel has."""
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


# The listing: only the origin's files, as the origin has them (issue 46 item 2) ------------------------------------


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unpack_listed(dest: Path, data: bytes, listing: dict, *extra: str) -> subprocess.CompletedProcess:
    dest.mkdir(parents=True, exist_ok=True)
    command = streaming.unpack_command(str(dest), listing=listing)
    if extra:  # the bound under test in place of the computed one (the script takes the last)
        command = command[:-1] + " " + " ".join(extra) + ")"
    return subprocess.run(["sh", "-c", command], input=data, capture_output=True, timeout=120)


GOOD, BAD = b"the origin's weights\n", b"a holder's own bytes\n"
LISTING = {"model.safetensors": [len(GOOD), sha(GOOD)], "config.json": [2, sha(b"{}")]}

LISTED_REFUSED = {
    "bytes that differ, same size": ([entry("model.safetensors", data=BAD[:len(GOOD)].ljust(len(GOOD), b"x"))],
                                     "model.safetensors", "its bytes differ from the origin's"),
    "another size": ([entry("model.safetensors", data=GOOD + b"more")], "model.safetensors",
                     f"{len(GOOD) + 4} bytes, the origin's file has {len(GOOD)}"),
    "a name the origin does not list": ([entry("extra.py", data=b"import os")], "extra.py", "not in the origin's listing"),
    "a name sent twice": ([entry("config.json", data=b"{}"), entry("config.json", data=b"{}")], "config.json", "a name sent twice"),
    "a symlink the origin does not list": ([entry("config.json", tarfile.SYMTYPE, linkname="model.safetensors")], "config.json",
                                           "a symlink to model.safetensors, which the origin does not list"),
    "a hard link to a file with other bytes": (
        [entry("model.safetensors", data=GOOD), entry("config.json", tarfile.LNKTYPE, linkname="model.safetensors")],
        "config.json", "a hard link to model.safetensors, whose bytes are not the origin's file config.json"),
}


@pytest.mark.parametrize("case", LISTED_REFUSED, ids=[case.replace(" ", "-") for case in LISTED_REFUSED])
def test_what_the_origin_does_not_list_is_refused_and_never_lands(tmp_path, case):
    entries, name, what = LISTED_REFUSED[case]
    dest = tmp_path / "partial"
    result = unpack_listed(dest, stream(*entries), LISTING)
    said = result.stderr.decode()
    assert result.returncode != 0 and f"untar: refused {name}: " in said and what in said, said
    # nothing under the refused name, no temporary file; what came whole and right before it stays
    assert everything(dest) in ([], ["model.safetensors"], ["config.json"]), everything(dest)
    assert not (dest / "model.safetensors").exists() or (dest / "model.safetensors").read_bytes() == GOOD


def test_the_origins_files_links_and_directories_pass(tmp_path):
    listing = {**LISTING, "sub/same.json": [2, sha(b"{}")], "latest": ["symlink", "model.safetensors"]}
    entries = [entry("sub", tarfile.DIRTYPE, mode=0o755), entry("model.safetensors", data=GOOD),
               entry("config.json", data=b"{}"), entry("sub/same.json", tarfile.LNKTYPE, linkname="config.json"),
               entry("latest", tarfile.SYMTYPE, linkname="model.safetensors")]
    dest = tmp_path / "partial"
    result = unpack_listed(dest, stream(*entries), listing)
    assert result.returncode == 0, result.stderr
    assert (dest / "latest").read_bytes() == GOOD and (dest / "sub/same.json").read_bytes() == b"{}"


def sparse_pax(real_size: int) -> bytes:
    """A pax (GNU 1.0) sparse member: a few KiB that `tar -x` expands to `real_size` bytes of holes."""
    info = tarfile.TarInfo("model.safetensors")
    data = b"1\n0\n512\n".ljust(512, b"\0") + b"x" * 512
    info.size = len(data)
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "model.safetensors",
                        "GNU.sparse.realsize": str(real_size)}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def old_gnu_sparse() -> bytes:
    info = tarfile.TarInfo("model.safetensors")
    info.type = tarfile.GNUTYPE_SPARSE
    return info.tobuf(tarfile.GNU_FORMAT) + b"\0" * 1024


def huge_pax_header(size: int) -> bytes:
    """A pax header announcing `size` bytes, which tarfile would read whole into memory."""
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, size
    return info.tobuf(tarfile.USTAR_FORMAT) + b"\0" * 1024


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "unlisted"])
@pytest.mark.parametrize("data, what", [
    (sparse_pax(200 << 20), "a sparse member"), (old_gnu_sparse(), "a sparse member"),
    (huge_pax_header(64 << 20), f"a header of {64 << 20} bytes (at most 65536)")], ids=["pax-sparse", "gnu-sparse", "huge-header"])
def test_a_stream_that_would_expand_or_fill_memory_is_refused_whatever_the_listing(tmp_path, data, what, listed):
    """Bounded with or without a listing (a donor's venv files have none): nothing is written, nothing read whole."""
    dest = tmp_path / "partial"
    result = (unpack_listed(dest, data, {"model.safetensors": [200 << 20, None]}) if listed else unpack(dest, data))
    said = result.stderr.decode()
    assert result.returncode != 0 and what in said and "untar: refused" in said, said
    assert everything(dest) == []


def test_more_members_than_the_listing_allows_are_refused(tmp_path):
    entries = [entry(f"d{i}", tarfile.DIRTYPE, mode=0o755) for i in range(10_001)]
    result = unpack_listed(tmp_path / "partial", stream(*entries), {})
    assert result.returncode != 0 and b"more than 10000 members" in result.stderr, result.stderr


def test_a_listing_larger_than_the_free_space_is_refused_before_a_byte_is_read(tmp_path):
    result = unpack_listed(tmp_path / "partial", stream(entry("model.safetensors", data=GOOD)),
                           {"model.safetensors": [1 << 60, sha(GOOD)]})
    assert result.returncode != 0 and b"the listed files need 1152921504606846976 bytes" in result.stderr, result.stderr
    assert everything(tmp_path / "partial") == []


def test_a_stream_that_stalls_past_its_deadline_stops_and_says_so(tmp_path):
    dest = tmp_path / "partial"
    dest.mkdir()
    command = streaming.unpack_command(str(dest), listing=LISTING)[:-1] + " --deadline-s 1)"
    head = stream(entry("config.json", data=b"{}"))[:1024]  # the first member, then nothing: the sender hangs
    with subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.stdin.write(head)
        proc.stdin.flush()  # and kept open: no end of stream, no more bytes
        rc = proc.wait(timeout=30)
        err = proc.stderr.read()
        proc.stdin.close()
    assert rc != 0 and b"untar: stopped waiting: the stream took longer than 1 s" in err, err
    assert [p for p in everything(dest) if p.startswith(".untar-")] == []


def test_the_listed_stream_has_a_time_bound_from_its_size():
    command = streaming.unpack_command("/root/models/.M.partial", listing={"a": [50 << 30, None], "b": ["symlink", "a"]})
    assert command.endswith(f" --deadline-s {600 + (50 << 30) // (10 << 20)})")


# The origin's digests --------------------------------------------------------------------------------------------


def test_both_origins_say_the_same_of_one_model_links_included(tmp_path):
    """The control machine's directory (model_digests.local) and a host's store (stage_model.py --digests) agree."""
    src = benign_tree(tmp_path / "M")
    (src / "current").symlink_to("config.json")
    (src / ".sglang-deploy-manifest.json").write_text("{}")  # ours: never listed
    here = model_digests.local(str(src))
    done = subprocess.run(["sh", "-c", remote.command("stage_model", "--digests", shlex.quote(str(src)))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json_last(done.stdout) == here
    assert here["current"] == ["symlink", "config.json"] and ".sglang-deploy-manifest.json" not in here
    assert all(here[rel] == [p.stat().st_size, sha(p.read_bytes())] for rel, p in
               ((str(p.relative_to(src)), p) for p in src.rglob("*") if p.is_file() and not p.is_symlink()
                and not p.name.startswith(".sglang-deploy-")))


def json_last(text: str):
    import json

    return json.loads(text.strip().splitlines()[-1])


def test_the_run_asks_the_origin_once_whoever_asks(tmp_path):
    import threading

    calls = []

    def compute():
        calls.append(1)
        return {"a": [1, "0" * 64]}

    class Run:  # a state: weakly referenced, hashable
        pass

    run = Run()
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(model_digests.of_origin(run, ("model", "gpu-a", "/m"), compute)))
               for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert calls == [1] and len(answers) == 8 and all(a == {"a": [1, "0" * 64]} for a in answers)


# A holder's bytes against the origin's, end to end on this machine ------------------------------------------------


def test_a_holder_that_rewrote_bytes_keeping_size_and_mtime_poisons_nothing(tmp_path, this_machine):
    """A host that got the model in this run serves it on: if its copy changed (same size, same mtime), the receiver
    refuses it by the origin's digests and keeps nothing of it; from the origin it then comes whole."""
    origin = benign_tree(tmp_path / "origin/M")
    digests = model_digests.local(str(origin))
    holder = tmp_path / "holder/M"
    holder.parent.mkdir()
    subprocess.run(["cp", "-a", str(origin), str(holder)], check=True)
    victim = max((p for p in holder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    store = tmp_path / "store"
    store.mkdir()
    assert transfer._stream(None, this_machine, str(holder), str(holder), str(store / "M"), digests) is False
    assert any("its bytes differ from the origin's" in line for line in this_machine.logs), this_machine.logs
    assert not (store / "M").exists()
    assert transfer._stream(None, this_machine, str(origin), str(origin), str(store / "M"), digests) is True, this_machine.logs
    assert picture(store / "M") == picture(origin)


def test_a_poisoned_partial_of_the_right_size_and_mtime_is_sent_again(tmp_path, this_machine):
    origin = benign_tree(tmp_path / "origin/M")
    digests = model_digests.local(str(origin))
    store = tmp_path / "store"
    partial = store / ".M.partial"
    partial.mkdir(parents=True)
    rel, (size, _) = next((r, e) for r, e in sorted(digests.items()) if e[0] != "symlink" and e[0] > 0)
    (partial / rel).parent.mkdir(parents=True, exist_ok=True)
    (partial / rel).write_bytes(b"\0" * size)  # whole-looking: the origin's size, root's, one link
    os.utime(partial / rel, ns=(0, (origin / rel).stat().st_mtime_ns))
    assert transfer._stream(None, this_machine, str(origin), str(origin), str(store / "M"), digests) is True, this_machine.logs
    assert (store / "M" / rel).read_bytes() == (origin / rel).read_bytes()
    assert not any("whole in" in line for line in this_machine.logs), this_machine.logs
