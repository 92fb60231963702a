"""transfer.in_store with facts given (the streaming itself is exercised on the lab)."""

import pytest
from pyinfra.api import OperationError

from operations.model import transfer
from tests.unit.test_operations import run

PATH = "/root/models/Qwen3.6-27B"


def test_model_in_the_store_is_a_noop():
    result = run(transfer.in_store, {transfer.StoreListing: {"config.json": 10}}, model="Qwen3.6-27B", path=PATH, source="gpu-b")
    assert result.commands == [] and result.noops == [f"model Qwen3.6-27B is in the store at {PATH}"]


def test_missing_model_without_a_source_names_the_fix():
    with pytest.raises(OperationError) as caught:
        run(transfer.in_store, {transfer.StoreListing: None}, model="Qwen3.6-27B", path=PATH)
    assert f"model Qwen3.6-27B is not in {PATH} on gpu-a" in str(caught.value)
    assert "model_sources: {Qwen3.6-27B: <a host that has it>}" in str(caught.value)


def test_a_host_cannot_be_its_own_source():
    with pytest.raises(OperationError) as caught:
        run(transfer.in_store, {transfer.StoreListing: None}, model="Qwen3.6-27B", path=PATH, source="gpu-a")
    assert "names gpu-a itself" in str(caught.value)


def test_a_model_is_streamed_from_the_source_hosts_validated_store():
    result = run(transfer.in_store, {transfer.StoreListing: None}, model="Qwen3.6-27B", path=PATH, source="gpu-b",
                 source_store="/srv/models")
    assert "streaming it from gpu-b:/srv/models/Qwen3.6-27B" in result.logs[0]
    with pytest.raises(OperationError, match="the model store of gpu-b is not known"):
        run(transfer.in_store, {transfer.StoreListing: None}, model="Qwen3.6-27B", path=PATH, source="gpu-b")


def test_the_receiving_end_unpacks_as_root_and_a_refused_stream_leaves_no_partial(tmp_path):
    """The store's side of a stream (`receive_command`) is the unpacker, not `tar -x`: a model holding a link out of
    its directory is refused by name and its `.NAME.partial` removed; a benign one lands, without its setuid bit."""
    import io
    import os
    import subprocess
    import tarfile

    def stream(*members):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as archive:
            for info, data in members:
                archive.addfile(info, io.BytesIO(data))
        return out.getvalue()

    def member(name, data=b"", mode=0o644, link=""):
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.uid = len(data), mode, 1234
        if link:
            info.type, info.linkname = tarfile.SYMTYPE, link
        return info, data

    partial = tmp_path / ".Qwen3.6-27B.partial"
    hostile = stream(member("./config.json", b"{}"), member("./tokenizer.json", link="/etc/shadow"))
    result = subprocess.run(["sh", "-c", transfer.receive_command(str(partial))], input=hostile, capture_output=True)
    assert result.returncode != 0 and b"untar: refused ./tokenizer.json: a symlink to /etc/shadow (absolute)" in result.stderr
    assert list(tmp_path.iterdir()) == []
    benign = stream(member("./config.json", b"{}"), member("./run.sh", b"#!/bin/sh\n", mode=0o4777))
    result = subprocess.run(["sh", "-c", transfer.receive_command(str(partial))], input=benign, capture_output=True)
    assert result.returncode == 0, result.stderr
    assert (partial / "config.json").read_bytes() == b"{}" and (partial / "run.sh").stat().st_mode & 0o7777 == 0o755
    assert (partial / "run.sh").stat().st_uid == os.geteuid()
