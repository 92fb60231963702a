"""Model staging figures, one `name: value` line each, measured side by side in one run on a lab host.

models.stage_vs_cp   staging throughput (model/on_host/stage_model.py: copy into a temporary sibling, every byte
                     checked against the manifest, marker, rename) over a plain `cp -a` of the same
                     directory into the same shm dir on the same host; the source's manifest is cached
                     (as on every run after the first) and the page cache is warm for both. Runs
                     alternate; medians are used.
models.noop_s        the converged check of that staged model (the StagedModel fact script: names,
                     sizes, mtimes and manifests, no hashing), wall time on the host, median.
models.first_stage_s the first staging, which also hashes the source to build its manifest (once).

The model is generated in the host's store (64 files of 16 MiB = 1 GiB) and everything is deleted
afterwards. Host: LAB_MODELS_HOST (default gpu-b, which no lab service uses).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from operations import remote  # noqa: E402
from operations.model import models  # noqa: E402
from tests.lab.labutil import STATE, lab_hosts  # noqa: E402

HOST = os.environ.get("LAB_MODELS_HOST", "gpu-b")
NAME = "bench-stage-model"
SRC = f"/root/models/{NAME}"
DEST = f"/dev/shm/{NAME}"
CP_DEST = f"/dev/shm/{NAME}-cp"
SCRIPTS = "/tmp/sglang-bench"
FILES, FILE_MIB = 64, 16
ROUNDS = 3


def ssh(command: str, stdin: str | None = None, timeout: int = 600) -> str:
    argv = [
        "ssh", "-i", str(STATE / "id_ed25519"), "-o", f"UserKnownHostsFile={STATE / 'known_hosts'}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{lab_hosts()[HOST]['address']}", command,
    ]
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"bench models: {command[:200]!r} failed on {HOST}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def timed(command: str) -> float:
    """Wall seconds of `command` measured on the host (no SSH set-up in the figure)."""
    out = ssh(f"s=$(date +%s%N); {command} >/dev/null; e=$(date +%s%N); echo $(( e - s ))")
    return int(out.split()[-1]) / 1e9


def cleanup() -> None:
    ssh(f"rm -rf {SRC} {DEST} {CP_DEST} /dev/shm/.{NAME}.partial /dev/shm/.{NAME}.old {SCRIPTS}")


def main() -> None:
    cleanup()
    try:
        ssh(f"mkdir -p {SRC} {SCRIPTS} && for i in $(seq -w 1 {FILES}); do "
            f"head -c {FILE_MIB << 20} /dev/urandom > {SRC}/model-$i-of-{FILES}.safetensors; done && cat {SRC}/* > /dev/null")
        for name in ("stage_model", "model_state"):
            ssh(f"cat > {SCRIPTS}/{name}.py", stdin=remote.script(name))
        size = FILES * FILE_MIB * 2**20
        stage = f"python3 {SCRIPTS}/stage_model.py {SRC} {DEST} {models.MARKER} --progress 0"
        cp = f"cp -a {SRC} {CP_DEST}"
        first = timed(stage)
        stage_s, cp_s = [], []
        for i in range(ROUNDS):
            pair = [("stage", stage), ("cp", cp)] if i % 2 == 0 else [("cp", cp), ("stage", stage)]
            for kind, command in pair:
                ssh(f"rm -rf {DEST} {CP_DEST}")  # one copy in the shm dir at a time
                (stage_s if kind == "stage" else cp_s).append(timed(command))
        ssh(f"rm -rf {CP_DEST}; test -d {DEST} || {stage}")
        print(f"bench models: stage {[round(s, 3) for s in stage_s]} s, cp -a {[round(s, 3) for s in cp_s]} s", file=sys.stderr)
        check = f"python3 {SCRIPTS}/model_state.py {SRC} {DEST} {models.MARKER}"
        out = ssh(check)
        if models.drift(json.loads(out)) is not None:
            sys.exit(f"bench models: the staged copy does not check as converged: {out[:500]}")
        noop = [timed(check) for _ in range(5)]
        stage_rate, cp_rate = size / statistics.median(stage_s), size / statistics.median(cp_s)
        print(f"models.stage_gib_s: {stage_rate / 2**30:.2f}")
        print(f"models.cp_gib_s: {cp_rate / 2**30:.2f}")
        print(f"models.stage_vs_cp: {stage_rate / cp_rate:.2f}")
        print(f"models.noop_s: {statistics.median(noop):.3f}")
        print(f"models.first_stage_s: {first:.2f}")
    finally:
        cleanup()


if __name__ == "__main__":
    main()
