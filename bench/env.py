"""Environment figures, measured side by side on one lab host (gpu-a), in one run.

env.fresh_vs_plain_uv  a fresh environment built by our environment step over a plain
                       `python -m venv --without-pip` + `uv pip install --no-deps` of the same
                       wheel files into an empty venv on the same host. Ours is a pyinfra run of
                       bench/env_deploy.py (the venv fact, a new venv, the uv install, the switch)
                       less a `pyinfra ... exec -- true` run (pyinfra's start-up and SSH
                       connection, which every deploy pays once whatever it does); the plain one is
                       one `ssh` running both commands, less an `ssh ... true`. Both use the same
                       uv binary and the same warm uv cache; the wheels are already in the host's
                       cache for both (pushing them is a one-time cost, not measured).
env.noop_s             the converged environment step: the same pyinfra run once the venv holds
                       the stack, less the `exec -- true` run.
Runs alternate, and the median of each is used; the raw medians are printed too.
"""

from __future__ import annotations

import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.run import INVENTORY, PYINFRA, timed  # noqa: E402 - the one way a bench times a command

HOST = "gpu-a"
ROUNDS = 3
BENCH_VENV = "/root/bench_venv"
PLAIN_VENV = "/root/bench_plain_venv"


def _ssh(command: str) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from tests.lab.labutil import STATE, lab_hosts

    address = lab_hosts()[HOST]["address"]
    return [
        "ssh", "-i", str(STATE / "id_ed25519"), "-o", f"UserKnownHostsFile={STATE / 'known_hosts'}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{address}", command,
    ]


def main() -> None:
    sys.path.insert(0, str(ROOT))
    import yaml

    from configuration import settings, stacks
    from operations import installer

    lab_data = yaml.safe_load((ROOT / "lab" / "group_data" / "all.yml").read_text())
    stack = stacks.load_stack(lab_data["stack"])
    cache = settings.GLOBAL_KEYS["host_wheel_cache"].default
    uv = installer.uv_binary(cache)
    files = " ".join(shlex.quote(f"{cache}/{p.file}") for p in stack.packages)
    deploy = [PYINFRA, INVENTORY, "bench/env_deploy.py", "-y", "--limit", HOST]
    floor = [PYINFRA, INVENTORY, "exec", "-y", "--limit", HOST, "--", "true"]
    wipe = _ssh(f"rm -rf {BENCH_VENV} {BENCH_VENV}.generations {PLAIN_VENV}")
    plain = _ssh(
        f"python{stack.python} -m venv --without-pip {PLAIN_VENV} && "
        f"UV_CACHE_DIR={cache}/.uv-cache {uv} pip install --quiet --no-config --python {PLAIN_VENV}/bin/python "
        f"--no-deps --no-index --offline {files}"
    )
    timed(wipe)
    timed(deploy)  # wheels and uv onto the host, the uv cache warm: both sides start from there
    ssh_true = _ssh("true")
    ours, theirs, noop, base, ssh_base = [], [], [], [], []
    for _ in range(ROUNDS):
        timed(wipe)
        ours.append(timed(deploy))
        noop.append(timed(deploy))
        base.append(timed(floor))
        timed(wipe)
        theirs.append(timed(plain))
        ssh_base.append(timed(ssh_true))
    timed(wipe)
    med = statistics.median
    fresh, plain_s = med(ours) - med(base), med(theirs) - med(ssh_base)
    print(f"env.fresh_run_s: {med(ours):.2f}  (pyinfra floor {med(base):.2f})")
    print(f"env.plain_uv_run_s: {med(theirs):.2f}  (ssh floor {med(ssh_base):.2f})")
    print(f"env.fresh_s: {fresh:.2f}")
    print(f"env.plain_uv_s: {plain_s:.2f}")
    print(f"env.fresh_vs_plain_uv: {fresh / plain_s:.2f}")
    print(f"env.noop_s: {max(med(noop) - med(base), 0):.2f}")


if __name__ == "__main__":
    main()
