"""The one way this deploy writes a file it owns on a host: whole, or not at all.

Unit files, the boot unit's script and model list, secret key files and patched package files
all go the same way: uploaded beside the target (`PATH.sglang-deploy.tmp`), given owner and
mode there, then renamed over the target. A reader sees the old file or the new one, never a
half-written one; and since the rename makes a new inode, a process (or a venv generation
that hard-links it) holding the old file keeps the old content. The content travels as an
upload (SFTP), never inside a command line, where `ps` or pyinfra's output could show it, and
never through /tmp (see `replace_file`).

Callers decide whether to write (from the hashes they read); this module only writes.
"""

from __future__ import annotations

import shlex
from io import BytesIO
from pathlib import Path, PurePosixPath
from typing import Iterator

from pyinfra.api.command import FileUploadCommand

TMP_SUFFIX = ".sglang-deploy.tmp"
# only where a connector argument changes user: see replace_file
UPLOAD_SUFFIX = ".sglang-deploy.upload"


def replace_file(path: str, content: bytes | str | Path, mode: str = "644", owner: str = "root",
                 group: str = "root", make_parent: str | None = "755",
                 parent_group: str | None = None) -> Iterator:
    """Commands that make `path` hold `content` (bytes, text, or a local file) with `mode` and
    `owner:group`.

    `make_parent`: the mode of the parent directory, which is created if need be and given that mode
    (None: it exists already and is left alone); `parent_group`: its owner root and this group too.

    The file beside the target is made empty and root-only (0600) before the upload fills it (an
    upload into an existing file keeps its mode), so its content is never readable by anyone else
    before its own mode is set, whatever the directory's mode.
    """
    tmp = path + TMP_SUFFIX
    parent = str(PurePosixPath(path).parent)
    first = f"rm -f {shlex.quote(tmp)} && install -m 600 /dev/null {shlex.quote(tmp)}"
    if make_parent is not None:
        group_flag = f" -o root -g {shlex.quote(parent_group)}" if parent_group else ""
        first = f"install -d -m {make_parent}{group_flag} {shlex.quote(parent)} && {first}"
    yield first
    source = (str(content) if isinstance(content, Path)
              else BytesIO(content.encode() if isinstance(content, str) else content))
    # Under a connector argument that changes user (`_sudo`, `_su_user`, `_doas`, `_dzdo`) pyinfra
    # uploads as the login user to a predictable file in its temp directory (/tmp), then copies it:
    # naming a file beside the target as that place keeps every upload, key files included, out of
    # /tmp. Where the login user cannot write beside the target (every directory this deploy writes
    # is root's) the upload fails instead. Without such an argument pyinfra ignores it.
    yield FileUploadCommand(source, tmp, remote_temp_filename=path + UPLOAD_SUFFIX)
    yield (
        f"chown {shlex.quote(f'{owner}:{group}')} {shlex.quote(tmp)} && chmod {mode} "
        f"{shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(path)}"
    )
