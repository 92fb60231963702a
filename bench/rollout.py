"""A rollout's time over its replicas, against one replica's restart and gate.

rollout.vs_waves   a change rolled out to service `rep`'s 3 replicas (gpu-a, gpu-b, gpu-c; `max_unavailable: 1`, so 3
                   waves) over 3 times the same change to a one-replica service (`solo` on gpu-d), each net of a
                   converged re-run of the same inventory (pyinfra's start-up, connections and the one read, which a
                   rollout pays once): (rollout - its converged re-run) / (3 x (one - its converged re-run)). Target:
                   at most 1.1 (waves x one restart-and-gate, plus at most 10%). The change is the stand-in's
                   warm-up (`STANDIN_WARMUP_S`, 2 s: what a real engine spends loading and capturing graphs is
                   minutes), alternated between two values so every round restarts. The raw medians are printed too.
Runs alternate (rollout, one), 3 rounds, medians. The services are removed at the end.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.timing import PYINFRA, timed  # noqa: E402 - the one way a bench times a command

ROUNDS = 3
REPLICA_HOSTS = ("gpu-a", "gpu-b", "gpu-c")
SOLO_HOST = "gpu-d"


def _service(warmup: str, port: int) -> dict:
    return {"gpu": 0, "port": port, "model": "Qwen3.6-27B-DFlash", "model_in": "store", "args": {"attention-backend": "auto"},
            "env": {"STANDIN_WARMUP_S": warmup}}


def _inventories(warmup: str) -> tuple[Path, Path]:
    from tests.lab.labutil import write_inventory

    rep = write_inventory(f"bench_rollout_rep_{warmup.replace('.', '_')}",
                          {h: {"services": {"rep": _service(warmup, 30400)}, "run_services": ["rep"]} for h in REPLICA_HOSTS})
    solo = write_inventory(f"bench_rollout_solo_{warmup.replace('.', '_')}",
                           {SOLO_HOST: {"services": {"solo": _service(warmup, 30400)}, "run_services": ["solo"]}})
    return rep, solo


def vs_waves() -> None:
    from tests.lab.labutil import clean_host

    deploy = lambda inv: [PYINFRA, str(inv), "deploy.py", "-y"]  # noqa: E731
    warmups = ("2", "2.0")  # the same warm-up, written two ways: a unit change, the same time to serve
    inventories = {w: _inventories(w) for w in warmups}
    try:
        for rep, solo in inventories.values():  # both built once (venvs, models), so the rounds restart only
            timed(deploy(rep))
            timed(deploy(solo))
        roll, one, roll_noop, one_noop = [], [], [], []
        for i in range(ROUNDS):
            rep, solo = inventories[warmups[i % 2]]
            roll.append(timed(deploy(rep)))
            one.append(timed(deploy(solo)))
            roll_noop.append(timed(deploy(rep)))
            one_noop.append(timed(deploy(solo)))
        r, o, rn, on = (statistics.median(x) for x in (roll, one, roll_noop, one_noop))
        waves = len(REPLICA_HOSTS)
        print(f"rollout.rollout_3_replicas_s: {r:.2f}")
        print(f"rollout.one_replica_s: {o:.2f}")
        print(f"rollout.converged_3_replicas_s: {rn:.2f}")
        print(f"rollout.converged_one_replica_s: {on:.2f}")
        print(f"rollout.vs_waves: {(r - rn) / (waves * (o - on)):.2f}")
    finally:
        for host in (*REPLICA_HOSTS, SOLO_HOST):
            clean_host(host, keep_venv=True)
        for pair in inventories.values():
            for path in pair:
                path.unlink(missing_ok=True)


def main() -> None:
    vs_waves()


if __name__ == "__main__":
    main()
