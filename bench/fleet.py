"""Converged re-runs as the fleet grows: more services on a host, more hosts.

deploy.services_8_vs_1       the converged re-run of one host running 8 services (8 stand-in GPUs, as the
                             real deployment's 8-GPU host) over the same kind of host running 1: gpu-e runs
                             8, gpu-d runs 1 (both 8 stand-in GPUs, the lab's stack, models from the store);
                             each measured as a deploy limited to that host. At most 1.2: a service costs
                             little once its facts come in the host's one read.
deploy.noop_vs_floor_16_hosts  a converged re-run over 16 lab hosts (gpu-a..gpu-p; the 11 beyond the test
                             lab run one service each on the light `lab-standin` stack, the stand-in server
                             alone, as the issue allows) over `pyinfra ... exec -- true` on the same 16 hosts.
                             The first (converging) run builds 11 small venvs. Its figure is
                             `deploy.noop_vs_floor_16_hosts.control_cpu`, the control machine's CPU over the
                             floor's (at most 1.3), printed beside the wall ratio: the lab's hosts share the
                             control machine's CPUs, so the wall ratio is bound by 16 hosts' reads competing
                             with the control process; real hosts bring their own CPUs, and what each further
                             host adds to a fleet's run is the control machine's work.
Runs alternate, and the median of each is used; the raw medians are printed too. The lab hosts this adds
(gpu-f..gpu-p) and the services on gpu-d/gpu-e are removed at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.timing import PYINFRA, side_by_side  # noqa: E402 - the one way a bench compares two commands

ROUNDS = 5
ONE, EIGHT = "gpu-d", "gpu-e"
EXTRA = [f"gpu-{c}" for c in "fghijklmnop"]
TEST_HOSTS = ["gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e"]
MODEL = "Qwen3.6-27B-DFlash"


def _lab(*args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "lab" / "lab.py"), *args], cwd=ROOT, check=True, capture_output=True, text=True)


def _services(count: int, base_port: int, prefix: str = "svc") -> dict:
    return {f"{prefix}{i}": {"gpu": i, "port": base_port + i, "model": MODEL, "model_in": "store"} for i in range(count)}


def _lab_host_names() -> list[str]:
    namespace: dict = {}
    exec(compile((ROOT / "lab" / "inventory.py").read_text(), "lab/inventory.py", "exec"), namespace)
    return [name for name, _data in namespace["lab_hosts"]]


@contextmanager
def eight_and_one():
    """The inventories of `deploy.services_8_vs_1` (gpu-e running 8 services, gpu-d running 1: both with 8 stand-in
    GPUs), as (eight, one); the services and the stand-in GPUs are removed afterwards. Also used by bench/compare.py."""
    from tests.lab.labutil import clean_host, write_inventory

    for host in (ONE, EIGHT):
        _lab("gpus", host, "--count", "8")
    one = write_inventory("bench_one_service", {ONE: {"services": _services(1, 30300), "run_services": ["svc0"]}})
    eight = write_inventory("bench_eight_services", {EIGHT: {"services": _services(8, 30300), "run_services": [f"svc{i}" for i in range(8)]}})
    try:
        yield eight, one
    finally:
        for host in (ONE, EIGHT):
            clean_host(host, keep_venv=True)
            _lab("gpus", host, "--reset")
        one.unlink(missing_ok=True)
        eight.unlink(missing_ok=True)


def services_8_vs_1() -> None:
    with eight_and_one() as (eight, one):
        side_by_side(
            "deploy.services_8_vs_1",
            [PYINFRA, str(eight), "deploy.py", "-y"],
            [PYINFRA, str(one), "deploy.py", "-y"],
            ("deploy.services_8_s", "deploy.services_1_s"),
            rounds=ROUNDS,
        )


def noop_vs_floor_16_hosts() -> None:
    from tests.lab.labutil import write_inventory

    _lab("up", "--hosts", ",".join(TEST_HOSTS + EXTRA))
    namespace: dict = {}
    exec(compile((ROOT / "lab" / "inventory.py").read_text(), "lab/inventory.py", "exec"), namespace)
    rows = {name: {k: v for k, v in data.items() if not k.startswith("ssh_")} for name, data in namespace["lab_hosts"]}
    for name in EXTRA:
        # A service runs on one host: each extra host gets its own (one-f0, one-g0, ...).
        prefix = f"one-{name.split('-')[-1]}"
        rows[name] = {"stack": "lab-standin", "services": _services(1, 30400, prefix), "run_services": [f"{prefix}0"]}
    inventory = write_inventory("bench_16_hosts", rows)
    try:
        side_by_side(
            "deploy.noop_vs_floor_16_hosts",
            [PYINFRA, str(inventory), "deploy.py", "-y"],
            [PYINFRA, str(inventory), "exec", "-y", "--", "true"],
            ("deploy.noop_16_hosts_s", "deploy.floor_16_hosts_s"),
            rounds=ROUNDS,
        )
        print(f"deploy.noop_vs_floor_16_hosts.read_as: .control_cpu, target at most 1.3; the wall ratio is bound by the lab's "
              f"16 hosts sharing this control machine's {len(os.sched_getaffinity(0))} CPUs, their reads competing with "
              "the control process")
    finally:
        inventory.unlink(missing_ok=True)
        _lab("down", "--purge", *EXTRA)  # forgotten: addresses freed, the lab as it was


def main() -> None:
    before = _lab_host_names()
    _lab("up", "--hosts", ",".join(TEST_HOSTS))
    try:
        services_8_vs_1()
        noop_vs_floor_16_hosts()
    finally:
        _lab("up", "--hosts", ",".join(before))  # lab/inventory.py lists the hosts it listed before


if __name__ == "__main__":
    main()
