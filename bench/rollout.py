"""A rollout's time over its replicas, against one replica's restart and gate.

rollout.vs_waves   a change rolled out to service `rep`'s 3 replicas (3 lab hosts the demo places no service on:
                   bench/lab_hosts.py, gpu-b, gpu-c, gpu-d on the demo's lab; `max_unavailable: 1`, so 3 waves) over
                   3 times the same change to one replica (an inventory of the first alone), each net of a
                   converged re-run of the same inventory (pyinfra's start-up, connections and the one read, which a
                   rollout pays once): (rollout - its converged re-run) / (3 x (one - its converged re-run)). Target:
                   at most 1.1 (waves x one restart-and-gate, plus at most 10%). The change is the stand-in's
                   warm-up (`STANDIN_WARMUP_S`, 2 s: what a real engine spends loading and capturing graphs is
                   minutes), written a new way each run so every run restarts. The raw medians are printed too.
Runs alternate (rollout, one), 3 rounds, medians. The hosts are cleaned first (what others' tests left there; venvs
kept) and the services removed at the end; the demo's hosts are never touched.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.timing import PYINFRA, timed  # noqa: E402 - the one way a bench times a command

ROUNDS = 3
REPLICAS = 3


def _inventory(hosts: tuple[str, ...], step: int) -> Path:
    """`rep` on `hosts`, its warm-up written the `step`-th way ("2", "2.0", "2.00", ...): each run's unit differs from
    the one before (a restart), and every replica takes the same time to serve."""
    from tests.lab.labutil import write_inventory

    warmup = "2." + "0" * step if step else "2"
    rep = {"gpu": 0, "port": 30400, "model": "Qwen3.6-27B-DFlash", "model_in": "store", "args": {"attention-backend": "auto"},
           "env": {"STANDIN_WARMUP_S": warmup}}
    return write_inventory(f"bench_rollout_{len(hosts)}_{step}", {h: {"services": {"rep": rep}, "run_services": ["rep"]} for h in hosts})


def vs_waves() -> None:
    from bench.lab_hosts import free_lab_hosts
    from tests.lab.labutil import clean_host

    replica_hosts = tuple(free_lab_hosts(REPLICAS))

    def run(hosts: tuple[str, ...], step: int) -> tuple[float, float]:
        """A deploy that restarts `rep` on `hosts`, then its converged re-run."""
        inventory = _inventory(hosts, step)
        try:
            return timed([PYINFRA, str(inventory), "deploy.py", "-y"]), timed([PYINFRA, str(inventory), "deploy.py", "-y"])
        finally:
            inventory.unlink(missing_ok=True)

    for host in replica_hosts:
        clean_host(host, keep_venv=True)  # their GPUs free of what others' tests left
    try:
        run(replica_hosts, 0)  # venvs and models in place, so the rounds restart only
        roll, one = [], []
        for i in range(ROUNDS):
            roll.append(run(replica_hosts, 2 * i + 1))  # the three replicas, in 3 waves
            one.append(run(replica_hosts[:1], 2 * i + 2))  # the first replica alone (the others not in the inventory)
        r, rn = statistics.median(t for t, _ in roll), statistics.median(n for _, n in roll)
        o, on = statistics.median(t for t, _ in one), statistics.median(n for _, n in one)
        waves = len(replica_hosts)
        print(f"bench.rollout_hosts: {' '.join(replica_hosts)}  (free of the demo's services)")
        print(f"rollout.rollout_3_replicas_s: {r:.2f}")
        print(f"rollout.converged_3_replicas_s: {rn:.2f}")
        print(f"rollout.one_replica_s: {o:.2f}")
        print(f"rollout.converged_one_replica_s: {on:.2f}")
        print(f"rollout.vs_waves: {(r - rn) / (waves * (o - on)):.2f}")
    finally:
        for host in replica_hosts:
            clean_host(host, keep_venv=True)


def main() -> None:
    vs_waves()


if __name__ == "__main__":
    main()
