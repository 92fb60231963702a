"""status.vs_floor: the status view (`pyinfra INVENTORY status.py -y`) over `pyinfra INVENTORY exec -y -- true` on the
same hosts (the lab's inventory, as deploy.noop_vs_floor), side by side: alternating rounds, medians (bench/run.py).
Target at most 1.3: run every minute from cron, it should cost little more than reaching the hosts.

The status's exit code is its verdict (0 ok, 2 drift, 1 unhealthy or unreachable), not a failure: each is accepted
and the last one is printed (`status.exit_code`), so a figure over a lab left drifting says so.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.timing import INVENTORY, PYINFRA, side_by_side  # noqa: E402 - the one way a bench compares two commands

ROUNDS = 11


def main(inventory: str = INVENTORY, rounds: int = ROUNDS) -> None:
    status = [PYINFRA, inventory, "status.py", "-y"]
    side_by_side("status.vs_floor", status, [PYINFRA, inventory, "exec", "-y", "--", "true"],
                 ("status.status_s", "status.floor_s"), rounds=rounds, ok_codes=(0, 1, 2))
    code = subprocess.run(status, cwd=ROOT, capture_output=True, text=True).returncode
    print(f"status.exit_code: {code}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
