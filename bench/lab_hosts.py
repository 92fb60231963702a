"""The lab hosts a bench group may deploy its own services onto without touching the demo's.

`make demo` places the lab's services by lab/lab.py's PLACEMENT, written into lab/inventory.py as each host's
`run_services` (on the demo's lab: `ddtree` and `dflash` on gpu-a, gpu-b empty). A bench group that deploys a
service of its own (bench/rollout.py, bench/spec_gate.py) takes hosts where that placement puts nothing, so its
units, GPUs and clean-up never meet the demo's: after `make demo`, `make bench` leaves the demo serving.

    free_hosts(placement, hosts, n)  the first n of `hosts` that `placement` gives no service (pure)
    listed_hosts()                   the lab's running hosts (lab/state/hosts.json, as lab/lab.py keeps it)
    demo_placement()                 host -> the services the demo places there (PLACEMENT, then lab/inventory.py)
    free_lab_hosts(n)                n such hosts on this lab, starting spare lab hosts (gpu-c, ...) where fewer
                                     are running
    running(names)                   start those of the named lab hosts that do not run; lab/inventory.py
                                     lists the hosts it listed before

Others' tests may have left services on a free host: a free host is one the demo does not use, not an empty one;
a group cleans its hosts as it always did (tests/lab/labutil.py `clean_host`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAB_PY = ROOT / "lab" / "lab.py"
INVENTORY = ROOT / "lab" / "inventory.py"
# The hosts `make test` starts (the Makefile's TEST_LAB_HOSTS), in order: the spares a bench may start.
LAB_HOST_NAMES = ("gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e")


class NotEnoughFreeHosts(SystemExit):
    """Fewer lab hosts than a bench group needs are free of the demo's services (a SystemExit: the bench stops
    with the message)."""


def free_hosts(placement: dict[str, list], hosts: list[str], n: int) -> list[str]:
    """The first `n` of `hosts` on which `placement` (host -> the services placed there) places no service; fails
    naming the hosts taken and by what when fewer are free."""
    free = [h for h in hosts if not placement.get(h)]
    if len(free) < n:
        taken = ", ".join(f"{h} ({', '.join(map(str, placement[h]))})" for h in hosts if placement.get(h))
        raise NotEnoughFreeHosts(
            f"bench: needs {n} lab host(s) where the demo places no service, has {len(free)}"
            f" ({', '.join(free) or 'none'}); the lab's hosts: {', '.join(hosts) or 'none'}"
            f"{'; the demo uses ' + taken if taken else ''}. Start more: python3 lab/lab.py up --hosts "
            f"{','.join(list(hosts) + [h for h in LAB_HOST_NAMES if h not in hosts][:n - len(free)])}")
    return free[:n]


def _lab_module():
    sys.path.insert(0, str(ROOT))
    from lab import lab

    return lab


def listed_hosts() -> list[str]:
    """The lab's running hosts, in lab/state/hosts.json's order (a host stopped by `lab.py down` is not listed)."""
    lab = _lab_module()
    hosts = lab.load_hosts()
    return [name for name, rec in hosts.items() if lab.host_running(name, rec)]


def _inventory_rows() -> list[tuple[str, dict]]:
    if not INVENTORY.exists():
        return []
    namespace: dict = {}
    exec(compile(INVENTORY.read_text(), str(INVENTORY), "exec"), namespace)
    return list(namespace.get("lab_hosts", []))


def demo_placement() -> dict[str, list]:
    """host -> the services the demo places there: lab/lab.py's PLACEMENT, and each host's `run_services` in
    lab/inventory.py (what `make demo` deployed; a dict's keys where overrides are given)."""
    placement = {host: list(services) for host, services in _lab_module().PLACEMENT.items()}
    for host, data in _inventory_rows():
        placed = list(data.get("run_services") or [])
        placement[host] = sorted(set(placement.get(host, [])) | set(placed))
    return placement


def _lab(*args: str) -> None:
    proc = subprocess.run([sys.executable, str(LAB_PY), *args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench: lab.py {' '.join(args)} failed ({proc.returncode}): {proc.stdout[-1500:]}{proc.stderr[-1500:]}")


def running(names: list[str]) -> None:
    """Start those of `names` that do not run (`lab.py up`; a group that names its hosts, such as bench/locks.py's
    gpu-c and gpu-d, runs on the lab `make demo` leaves, which starts gpu-a and gpu-b only); lab/inventory.py then
    lists the hosts it listed before again, as bench/fleet.py leaves it."""
    missing = [h for h in names if h not in listed_hosts()]
    if missing:
        before = [name for name, _ in _inventory_rows()]
        _lab("up", "--hosts", ",".join(dict.fromkeys(before + missing)))
        if before:
            _lab("up", "--hosts", ",".join(before))


def free_lab_hosts(n: int, start: bool = True) -> list[str]:
    """`n` running lab hosts on which the demo places no service. Where fewer run and `start`, the first spare
    lab hosts (LAB_HOST_NAMES) that the demo leaves free are started (`running`)."""
    placement, up = demo_placement(), listed_hosts()
    missing = n - len([h for h in up if not placement.get(h)])
    if missing > 0 and start:
        running([h for h in LAB_HOST_NAMES if h not in up and not placement.get(h)][:missing])
        up = listed_hosts()
    return free_hosts(placement, up, n)
