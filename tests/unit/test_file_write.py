"""operations/run/file_write.py run for real on pyinfra's @local host: content, owner and mode land whole."""

from __future__ import annotations

import os

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.connect import connect_all

from operations.run.file_write import TMP_SUFFIX, replace_file


@pytest.fixture
def local_host():
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    return inventory.get_host("@local")


def apply(host, commands) -> None:
    for command in commands:
        if isinstance(command, FileUploadCommand):
            assert host.put_file(command.src, command.dest)
        else:
            ok, output = host.run_shell_command(command, print_output=False)
            assert ok, output.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="chown root:root needs root")
def test_text_with_every_shell_character_lands_byte_for_byte_with_its_mode(local_host, tmp_path):
    text = "line 'one'\n$HOME `x` \\ \"q\" %n\n" + "é" * 3
    path = tmp_path / "new dir" / "unit.service"
    apply(local_host, replace_file(str(path), text, "600"))
    assert path.read_text() == text
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o755"
    assert not list(path.parent.glob(f"*{TMP_SUFFIX}"))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown root:root needs root")
def test_a_replaced_file_is_a_new_inode_and_a_reader_of_the_old_one_keeps_its_content(local_host, tmp_path):
    path = tmp_path / "patched.py"
    path.write_text("old\n")
    with open(path) as reader:
        apply(local_host, replace_file(str(path), tmp_path.joinpath("src.py").write_text("new\n") and tmp_path / "src.py", "644"))
        assert reader.read() == "old\n"
    assert path.read_text() == "new\n"


def test_the_content_travels_as_an_upload_never_in_a_command():
    commands = list(replace_file("/etc/sglang-deploy/secrets/s.yml", b"api-key: hunter2\n", "640", group="sglang", make_parent="710",
                                 parent_group="sglang"))
    shell = [c for c in commands if isinstance(c, str)]
    assert len(commands) == 3 and isinstance(commands[1], FileUploadCommand)
    assert all("hunter2" not in c for c in shell)
    # The directory gets its final mode and group (never a narrower one that would lock the service out meanwhile),
    # and the file the upload fills is root-only before the upload.
    assert shell[0] == ("install -d -m 710 -o root -g sglang /etc/sglang-deploy/secrets && rm -f /etc/sglang-deploy/secrets/s.yml.sglang-deploy.tmp"
                        " && install -m 600 /dev/null /etc/sglang-deploy/secrets/s.yml.sglang-deploy.tmp")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_the_file_an_upload_fills_is_root_only_until_its_mode_is_set(local_host, tmp_path):
    path = tmp_path / "secrets" / "s.yml"
    first, upload, last = replace_file(str(path), "api-key: x\n", "640", group="nogroup", make_parent="710", parent_group="nogroup")
    apply(local_host, [first])
    tmp = path.with_name(path.name + TMP_SUFFIX)
    assert oct(tmp.stat().st_mode & 0o777) == "0o600" and tmp.stat().st_size == 0
    assert oct(path.parent.stat().st_mode & 0o777) == "0o710" and path.parent.group() == "nogroup"
    apply(local_host, [upload, last])
    assert path.read_text() == "api-key: x\n" and oct(path.stat().st_mode & 0o777) == "0o640" and path.group() == "nogroup"
