"""What a speculative service's gate check adds to a restart on the lab (issue 45 item 6).

gate.spec_check_adds_s  a restart of one DFLASH service on a lab host the demo places no service on
                        (bench/lab_hosts.py: gpu-b on the demo's lab) gated with its speculative check (4 probes of 64
                        tokens decoded, each re-scored in one prefill, acceptance read: the defaults) minus the same
                        restart with the check off (`lossless_check: false`, `min_accept_length: 0`), each net of
                        nothing: the same inventory but for those two keys and a warm-up written a new way each run
                        (so every run restarts). The stand-in takes `STANDIN_STEP_S` (0.01 s) per forward step: a
                        GPU's steps for a 27B target are a few times that, so a GPU adds proportionally more (the
                        note of issue 45 says what was measured there, if anything).
Runs alternate (with, without), 3 rounds, medians; both medians are printed too. The host is cleaned first (its GPUs
freed of what others' tests left; its venv kept) and again at the end; the demo's hosts are never touched.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.timing import PYINFRA, timed  # noqa: E402 - the one way a bench times a command

ROUNDS = 3


def _inventory(host: str, checked: bool, step: int) -> Path:
    from tests.lab.labutil import write_inventory

    spec = {"gpu": 0, "port": 30410, "model": "Qwen3.6-27B", "model_in": "store", "draft_model": "Qwen3.6-27B-DFlash",
            "draft_in": "store", "args": {"speculative-algorithm": "DFLASH", "speculative-dflash-block-size": 16},
            "env": {"STANDIN_WARMUP_S": "1." + "0" * step}}
    if not checked:
        spec.update(lossless_check=False, min_accept_length=0)
    return write_inventory(f"bench_spec_gate_{int(checked)}_{step}", {host: {"services": {"specbench": spec},
                                                                                "run_services": ["specbench"]}})


def adds() -> None:
    from bench.lab_hosts import free_lab_hosts
    from tests.lab.labutil import clean_host

    (host,) = free_lab_hosts(1)

    def restart(checked: bool, step: int) -> float:
        inventory = _inventory(host, checked, step)
        try:
            return timed([PYINFRA, str(inventory), "deploy.py", "-y"])
        finally:
            inventory.unlink(missing_ok=True)

    clean_host(host, keep_venv=True)  # its GPUs free of what others' tests left
    try:
        restart(True, 0)  # the venv and the service in place: the rounds restart only
        with_check, without = [], []
        for i in range(ROUNDS):
            with_check.append(restart(True, 2 * i + 1))
            without.append(restart(False, 2 * i + 2))
        w, o = statistics.median(with_check), statistics.median(without)
        print(f"bench.gate_host: {host}  (free of the demo's services)")
        print(f"gate.restart_with_spec_check_s: {w:.2f}")
        print(f"gate.restart_without_spec_check_s: {o:.2f}")
        print(f"gate.spec_check_adds_s: {w - o:.2f}")
    finally:
        clean_host(host, keep_venv=True)


def main() -> None:
    adds()


if __name__ == "__main__":
    main()
