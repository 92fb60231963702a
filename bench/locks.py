"""Deploy locks under contention: the many-tries sweep of tests/lab/test_lock.py's opposite-order race.

Each try starts two deploys over the same two empty hosts at once, one inventory in each order
(`LOCK_BENCH_TRIES`, default 20; hosts `LOCK_LAB_HOSTS`, default gpu-c,gpu-d). Before the locks were
taken in one order, about 1 try in 8 deadlocked until `lock_wait_s`.

locks.race_tries           tries run
locks.race_both_ok         tries in which both deploys succeeded
locks.race_failed          tries in which a deploy failed or hung (a deadlock shows here)
locks.race_met             tries in which one deploy really found the other's lock and waited
locks.wait_vs_lone_deploy  median wait of the deploy that waited, over the median time of one deploy alone
                           doing what the first run of a try does (the held service's unit changed, so it
                           restarts and its readiness gate waits out its warm-up): about 1, since it
                           waited for the other's run and nothing more
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from bench.lab_hosts import running
    from tests.lab import test_lock
    from tests.lab.labutil import PYINFRA, clean_host, lab, ssh

    running([test_lock.STUCK, test_lock.OTHER])  # not among the hosts `make demo` starts
    tries = int(os.environ.get("LOCK_BENCH_TRIES", "20"))
    lab("restore", test_lock.STUCK)
    for host in (test_lock.STUCK, test_lock.OTHER):
        clean_host(host)
        ssh(host, "rm -rf /run/sglang-deploy.lock")
    lone = []
    test_lock.opposite_order_race(1)  # warms up: the venv and the held service exist
    for i in range(3):
        # What the race's first run does alone: the held service's unit changed, restarted, its warm-up waited for.
        inventory, _ = test_lock.race_inventories(f"lone{i}")
        start = time.monotonic()
        subprocess.run([PYINFRA, str(inventory), "deploy.py", "-y"], cwd=ROOT, capture_output=True, check=True)
        lone.append(time.monotonic() - start)
    rows = test_lock.opposite_order_race(tries)
    ok = sum(row["codes"] == [0, 0] for row in rows)
    met = sum(row["waiters"] == 1 for row in rows)
    waits = [w for row in rows for w in row["waited"]]
    print(f"locks.race_tries: {tries}")
    print(f"locks.race_both_ok: {ok}")
    print(f"locks.race_failed: {tries - ok}")
    print(f"locks.race_met: {met}")
    if waits:
        print(f"locks.wait_vs_lone_deploy: {statistics.median(waits) / statistics.median(lone):.2f}")


if __name__ == "__main__":
    main()
