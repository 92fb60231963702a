"""Environment figures, measured side by side on one lab host (gpu-a), in one run.

env.fresh_vs_plain_uv  a fresh environment built by our environment step over the same work done plainly:
                       `python -m venv --without-pip` + `uv pip install --no-deps --link-mode copy` of the
                       same wheel files into an empty venv, then the imports the deploy's ABI probe makes
                       (operations/environment/on_host/abi_probe.py with `venv_probe.probe_for`'s arguments: torch, the stack's
                       kernel packages, flashinfer where installed, the launcher and sglang's server entry
                       point; printed as `env.probe_imports`), run by the new venv's python, on the same host.
                       Ours is a pyinfra run of bench/env_deploy.py (the venv fact, a new venv, the uv
                       install, the ABI probe, the switch) less a `pyinfra ... exec -- true` run (pyinfra's
                       start-up and SSH connection, which every deploy pays once whatever it does); the plain
                       one is one `ssh` running the three commands, less an `ssh ... true`. Both use the
                       same uv binary and the same warm uv cache, and both copy every file out of it; the
                       wheels are already in the host's cache for both (pushing them is a one-time cost, not
                       measured). Target at most 1.2.
env.fresh_vs_plain_uv_hardlink  the same, with the plain install hard-linking from uv's cache (uv's default on
                       Linux, which the deploy does not do: a serving venv owns its files); the figure this
                       bench printed as env.fresh_vs_plain_uv before 2026-12-03 (then without the imports).
env.noop_s             the converged environment step: the same pyinfra run once the venv holds the
                       stack, less the `exec -- true` run.
Runs alternate, and the median of each is used; the raw medians are printed too.
"""

from __future__ import annotations

import ast
import shlex
import statistics
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.timing import INVENTORY, PYINFRA, timed  # noqa: E402 - the one way a bench times a command

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


def probe_imports(stack, launcher: str, wheelhouse: Path) -> list[str]:
    """The modules the ABI probe imports in a generation of `stack`, in its order (operations/environment/on_host/abi_probe.py):
    torch where the stack has it, each kernel distribution's packages (its wheel's top_level.txt, else the probe's
    own KERNEL_IMPORTS), flashinfer where installed, then the probe's `modules` (the launcher, sglang's entry point)."""
    from operations.environment import venv_probe

    probe = venv_probe.probe_for(stack, launcher, {"driver_cuda": None, "compute_caps": []})
    source = (ROOT / "operations" / "environment" / "on_host" / "abi_probe.py").read_text()
    kernel_imports = next(ast.literal_eval(node.value) for node in ast.parse(source).body
                          if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "KERNEL_IMPORTS")
    modules = ["torch"] if probe["torch"] else []
    files = {p.name: p.file for p in stack.packages}
    for dist in probe["kernels"] if probe["torch"] else ():
        with zipfile.ZipFile(wheelhouse / files[dist]) as wheel:
            tops = [n for n in wheel.namelist() if n.endswith(".dist-info/top_level.txt")]
            top = wheel.read(tops[0]).decode().split() if tops else []
        modules += top or kernel_imports.get(dist, [dist.replace("-", "_")])
    if "flashinfer-python" in stack.wanted():
        modules.append("flashinfer")
    return list(dict.fromkeys(modules + probe["modules"]))


def main() -> None:
    sys.path.insert(0, str(ROOT))
    import yaml

    from configuration import settings, stacks
    from operations.environment import installer

    lab_data = yaml.safe_load((ROOT / "lab" / "group_data" / "all.yml").read_text())
    stack = stacks.load_stack(lab_data["stack"])
    cache = settings.GLOBAL_KEYS["host_wheel_cache"].default
    uv = installer.uv_binary(cache)
    files = " ".join(shlex.quote(f"{cache}/{p.file}") for p in stack.packages)
    deploy = [PYINFRA, INVENTORY, "bench/env_deploy.py", "-y", "--limit", HOST]
    floor = [PYINFRA, INVENTORY, "exec", "-y", "--limit", HOST, "--", "true"]
    wipe = _ssh(f"rm -rf {BENCH_VENV} {BENCH_VENV}.generations {PLAIN_VENV}")
    imports = probe_imports(stack, lab_data["launcher"], ROOT / lab_data["wheelhouse"])

    def plain(link_mode: str) -> list[str]:
        return _ssh(
            f"python{stack.python} -m venv --without-pip {PLAIN_VENV} && "
            f"UV_CACHE_DIR={cache}/.uv-cache {uv} pip install --quiet --no-config --python {PLAIN_VENV}/bin/python "
            f"--link-mode {link_mode} --no-deps --no-index --offline {files} && "
            f"{PLAIN_VENV}/bin/python -c {shlex.quote('; '.join(f'import {m}' for m in imports))}"
        )

    timed(wipe)
    timed(deploy)  # wheels and uv onto the host, the uv cache warm: both sides start from there
    ssh_true = _ssh("true")
    ours, copied, linked, noop, base, ssh_base = [], [], [], [], [], []
    for _ in range(ROUNDS):
        timed(wipe)
        ours.append(timed(deploy))
        noop.append(timed(deploy))
        base.append(timed(floor))
        timed(wipe)
        copied.append(timed(plain("copy")))
        ssh_base.append(timed(ssh_true))
        timed(wipe)
        linked.append(timed(plain("hardlink")))
    timed(wipe)
    med = statistics.median
    fresh = med(ours) - med(base)
    copy_s, link_s = med(copied) - med(ssh_base), med(linked) - med(ssh_base)
    print(f"env.probe_imports: {' '.join(imports)}  (both sides: the deploy's ABI probe, the plain venv's python -c)")
    print(f"env.fresh_run_s: {med(ours):.2f}  (pyinfra floor {med(base):.2f}: pyinfra ... exec -- true)")
    print(f"env.plain_uv_run_s: {med(copied):.2f}  (ssh floor {med(ssh_base):.2f}: ssh {HOST} true)")
    print(f"env.plain_uv_hardlink_run_s: {med(linked):.2f}")
    print(f"env.fresh_s: {fresh:.2f}")
    print(f"env.plain_uv_s: {copy_s:.2f}  (uv --link-mode copy, then the probe's imports)")
    print(f"env.plain_uv_hardlink_s: {link_s:.2f}  (uv --link-mode hardlink, then the probe's imports)")
    print(f"env.fresh_vs_plain_uv: {fresh / copy_s:.2f}")
    print(f"env.fresh_vs_plain_uv_hardlink: {fresh / link_s:.2f}")
    print(f"env.noop_s: {max(med(noop) - med(base), 0):.2f}")


if __name__ == "__main__":
    main()
