"""`make bench`: benchmark figures, one `name: value` line each, measured side by side in one run.

    .venv/bin/python bench/run.py                 # every figure (make bench)
    .venv/bin/python bench/run.py env fleet       # only these groups: deploy status fleet models env locks transfer rollout gate
                                                  # (make bench FIGURES="env fleet")

What it prints is also kept in `bench/results/lab-DATE-COMMIT-make-bench.txt`, which `python -m
bench.figures` reads to write docs/benchmarks.md's table of latest figures (commit both).

The run begins with a header: `bench.commit` (the commit of the deploy code measured: `git rev-parse --short HEAD`,
`-dirty` when tracked files differ from it) and `bench.floor` (what the deploy figures are divided by).
bench/compare.py measures two commits side by side in one run (`deploy.noop_vs_floor`, `deploy.services_8_vs_1`).

Each figure's script says how it is measured: bench/models.py (model staging), bench/env.py
(the environment step), bench/status.py (the status view), bench/locks.py (deploy locks under contention), bench/fleet.py (converged
re-runs with 8 services on a host, and over 16 hosts), bench/transfer.py (bulk bytes: wheels pushed, a model streamed
between hosts, against scp and an ssh pipe), bench/rollout.py (a rollout over 3 replicas against one replica's
restart), bench/spec_gate.py (what a speculative service's gate check adds to a restart), below (the deploy).
The groups that deploy services of their own take lab hosts the demo leaves free (bench/lab_hosts.py), so
`make bench` after `make demo` leaves the demo's services on gpu-a as they were.

deploy.noop_vs_floor  a converged re-run of the lab deploy over `pyinfra ... exec -- true` on the same hosts
                      (both include pyinfra's start-up and SSH connection; the ratio is what the deploy's
                      converged checks add). Runs alternate, and the median of each is used.
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.timing import (  # noqa: E402
    DEPLOY_ROUNDS,
    INVENTORY,
    PYINFRA,
    ROOT,
    compile_deploy_modules,
    floor_description,
    revision,
    side_by_side,
)


def header() -> None:
    """Which code each side of the figures ran."""
    print(f"bench.commit: {revision()} (the deploy code measured: {ROOT})")
    print(f"bench.floor: {floor_description()} on the same hosts, for deploy.* and status.*; env.*, models.* and "
          "locks.* name their own")


def deploy_noop_vs_floor() -> None:
    side_by_side(
        "deploy.noop_vs_floor",
        [PYINFRA, INVENTORY, "deploy.py", "-y"],
        [PYINFRA, INVENTORY, "exec", "-y", "--", "true"],
        ("deploy.noop_s", "deploy.floor_s"),
        rounds=DEPLOY_ROUNDS,
    )


GROUPS = ("deploy", "status", "fleet", "models", "env", "locks", "transfer", "rollout", "gate")


class Kept:
    """stdout, also written line by line to a results file (the figures' record)."""

    def __init__(self, stream, path: Path):
        self.stream, self.path = stream, path
        self.file = path.open("w")

    def write(self, text: str) -> int:
        self.file.write(text)
        self.file.flush()
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def results_file() -> Path:
    day = datetime.date.today().isoformat()
    return ROOT / "bench" / "results" / f"lab-{day}-{revision()}-make-bench.txt"


def main(groups: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    from bench import env, fleet, locks, models, rollout, spec_gate, status, transfer

    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        sys.exit(f"bench: unknown figure group(s) {', '.join(unknown)}; the groups: {' '.join(GROUPS)}")
    chosen = [g for g in GROUPS if g in groups] if groups else list(GROUPS)
    kept = results_file()
    sys.stdout = Kept(sys.stdout, kept)
    print(f"bench.results: {kept.relative_to(ROOT)} (then: python -m bench.figures)", file=sys.stderr)
    header()
    compile_deploy_modules()
    run = {"deploy": deploy_noop_vs_floor, "status": status.main, "fleet": fleet.main, "models": models.main,
           "env": env.main, "locks": locks.main, "transfer": transfer.main,
           "rollout": rollout.main, "gate": spec_gate.main}
    for group in chosen:
        run[group]()


if __name__ == "__main__":
    main(sys.argv[1:] or os.environ.get("BENCH_FIGURES", "").split())
