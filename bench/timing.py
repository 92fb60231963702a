"""The one way the benchmarks time a command and compare two: wall time and the control machine's CPU, side by side
in alternating rounds, medians; and what a figure names (the commit measured, the floor).

Imported by every bench script (bench/run.py, env.py, fleet.py, status.py, compare.py ...), which imports none of them back.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
INVENTORY = "lab/inventory.py"
ROUNDS = 5
# The 2-host figure is the one nearest its target, and a run of it takes a second or two: more rounds, so that its
# median moves less with this machine's noise (same-code ratios moved from 1.57 to 1.94 within minutes).
DEPLOY_ROUNDS = 11


def revision(root: Path = ROOT) -> str:
    """The commit checked out at `root` (`git rev-parse --short HEAD`), `-dirty` when a tracked file differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True,
                           check=True).stdout.strip()
    return f"{head}-dirty" if dirty else head


def floor_description(inventory: str = INVENTORY) -> str:
    return (f"`pyinfra {inventory} exec -y -- true` (pyinfra {version('pyinfra')}: its start-up, the SSH connections, "
            "`true` on each host; no deploy code loaded)")


def timed(argv: list[str], ok_codes: tuple[int, ...] = (0,), cwd: Path = ROOT) -> float:
    return timed_with_cpu(argv, ok_codes, cwd)[0]


def timed_with_cpu(argv: list[str], ok_codes: tuple[int, ...] = (0,), cwd: Path = ROOT) -> tuple[float, float]:
    elapsed, cpu, _ = timed_run(argv, ok_codes, cwd)
    return elapsed, cpu


def timed_run(argv: list[str], ok_codes: tuple[int, ...] = (0,), cwd: Path = ROOT) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds of the command, the CPU seconds it used on this (the control) machine, and its output; a command
    that exits with another code than `ok_codes` stops the bench."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in ok_codes:
        sys.exit(f"bench: {' '.join(argv)} (in {cwd}) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return elapsed, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), proc


def side_by_side(name: str, numerator: list[str], denominator: list[str], labels: tuple[str, str], rounds: int = ROUNDS,
                 ok_codes: tuple[int, ...] = (0,)) -> None:
    """Print the medians of `rounds` alternating runs of both commands and their ratio, after one run of each
    (the figures are about converged re-runs).

    Also printed: the CPU seconds each used on the control machine (medians, `LABEL.control_cpu_s`) and their
    ratio (`NAME.control_cpu`).
    On the lab the hosts share this machine's CPUs, so the wall-time ratio counts their reads too; on real
    hosts, each with its own CPUs, the control machine's CPU is what every further host adds to a fleet's run.
    """
    timed(numerator, ok_codes)
    timed(denominator)
    top, bottom = [], []
    for _ in range(rounds):
        top.append(timed_with_cpu(numerator, ok_codes))
        bottom.append(timed_with_cpu(denominator))
    top_s, bottom_s = statistics.median(t for t, _ in top), statistics.median(t for t, _ in bottom)
    top_cpu, bottom_cpu = statistics.median(c for _, c in top), statistics.median(c for _, c in bottom)
    print(f"{labels[0]}: {top_s:.2f}")
    print(f"{labels[1]}: {bottom_s:.2f}")
    print(f"{name}: {top_s / bottom_s:.2f}")
    print(f"{labels[0]}.control_cpu_s: {top_cpu:.2f}")
    print(f"{labels[1]}.control_cpu_s: {bottom_cpu:.2f}")
    print(f"{name}.control_cpu: {top_cpu / bottom_cpu:.2f}")


def compile_deploy_modules(root: Path = ROOT) -> None:
    """Byte-compile the deploy's own modules before measuring, as an operator's machine has them after its
    first run. Where PYTHONDONTWRITEBYTECODE is set (this workplace's machines) python never keeps them, and
    every run compiled the deploy's 37 modules again: about 0.1 s of the control machine's CPU that the floor
    (`pyinfra exec`, whose modules pip compiled at install) never pays. Python still checks each source's
    mtime, so a module edited since is compiled again, never used stale."""
    # Those of them a commit has (bench/compare.py compiles an older commit's too).
    present = [p for p in ("config.py", "deploy.py", "status.py", "configuration", "deploys", "operations", "report")
               if (root / p).exists()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *present], cwd=root, check=True, capture_output=True)


