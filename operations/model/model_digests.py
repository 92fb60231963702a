"""What a model's files must be, taken from its origin: `{relpath: [size, sha256]}`, once per run.

A model moved host to host, fanned out or resumed is checked file by file against these digests
before it is kept or served on (transfer.py: root's unpacker hashes each file as it writes it and
refuses one that differs; a resumed `.NAME.partial` keeps only files whose sha256 matches). They
come from the origin alone, never from a host that got the model in this run: the control machine's
own directory, hashed here, or the source host's store, read over pyinfra's connection to that host
(its host key checked) by the staging script (`stage_model.py --digests`, which reuses the store's
cached manifest where its files have not changed since they were hashed, and hashes the rest).

Every host of a run that needs the same model from the same origin asks once: the first computes,
the others wait for its answer.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import stat
import threading
from concurrent.futures import ThreadPoolExecutor

from operations import remote
from operations.run import remote_call, run_state

# Hashing a model, or a partial copy of one, on a host: a 54 GB target at 100 MB/s in nine
# minutes, and a store on a slower disk in more.
HASH_TIMEOUT_S = 3600
OURS = (".sglang-deploy-",)  # our marker, manifest and journal files: never part of a model
BLOCK = 1 << 22
_WORKERS = max(1, min(8, os.cpu_count() or 1))

Digests = dict  # {relpath: [size, sha256 hex]}, or [SYMLINK, its target] for a symbolic link
SYMLINK = "symlink"



class OriginUnreadable(OSError):
    """The origin could not say what its files are: nothing is sent or kept on its word."""


def of_origin(state, key: tuple, compute) -> Digests:
    """The run's digests for `key` (one model from one origin), `compute()`d by the first host that
    asks; the others wait for it. A failure is not kept: the next host asks again."""
    run = run_state.of(state)
    with run.digests_lock:
        slot = run.digests.setdefault(key, [threading.Lock(), None])
    with slot[0]:
        if slot[1] is None:
            slot[1] = compute()
        return slot[1]


def local(path: str) -> Digests:
    """Hash the control machine's model directory (our own files left out), the largest files
    first, several at once; a symbolic link is listed as one (the receiving end judges where it
    points), a special file is refused here, naming it, before anything is sent."""
    root = os.path.realpath(path)
    if not os.path.isdir(root):
        raise OriginUnreadable(f"no model directory at {path}")
    files, links = {}, {}
    for top, dirs, names in os.walk(root):
        dirs.sort()
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]:
            full = os.path.join(top, name)
            if name.startswith(OURS):
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                links[os.path.relpath(full, root)] = [SYMLINK, os.readlink(full)]
            elif stat.S_ISREG(st.st_mode):
                files[os.path.relpath(full, root)] = (full, st.st_size)
            else:
                raise OriginUnreadable(f"{full}: a model holds files and links, not a special "
                                       "file: remove it")
    if not files:
        raise OriginUnreadable(f"no model files under {path}")

    def one(item):
        rel, (full, size) = item
        sha = hashlib.sha256()
        with open(full, "rb", buffering=0) as handle:
            while block := handle.read(BLOCK):
                sha.update(block)
        return rel, [size, sha.hexdigest()]

    with ThreadPoolExecutor(_WORKERS) as pool:
        hashed = dict(pool.map(one, sorted(files.items(), key=lambda item: -item[1][1])))
    return {**hashed, **links}


def on_host(host, path: str) -> Digests:
    """The source host's own answer for its store's model directory, over pyinfra's connection."""
    if not host.connected:
        raise OriginUnreadable(f"source host {host.name} is unreachable")
    ok, output = remote_call.run(
        host, remote.command("stage_model", "--digests", shlex.quote(path)),
        f"hashing {path} on the source host", HASH_TIMEOUT_S)
    lines = output.stdout.strip().splitlines()
    if not ok or not lines:
        said = (output.stderr.strip().splitlines() or ["no answer"])[-1]
        raise OriginUnreadable(f"{host.name} could not hash {path}: {said}")
    try:
        digests = json.loads(lines[-1])
    except ValueError:
        raise OriginUnreadable(f"{host.name} answered no digests for {path}") from None
    if not isinstance(digests, dict) or not sizes(digests) or not all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[1], str)
            and (v[0] == SYMLINK or (isinstance(v[0], int) and len(v[1]) == 64))
            for v in digests.values()):
        raise OriginUnreadable(f"{host.name} answered no digests for {path}")
    return digests


def sizes(digests: Digests) -> dict[str, int]:
    """The regular files the digests list: {relpath: size}."""
    return {rel: size for rel, (size, _) in digests.items() if size != SYMLINK}


def sent_size(entry: list) -> int:
    """What a listed entry weighs in a stream (a link: nothing)."""
    return 0 if entry[0] == SYMLINK else entry[0]
