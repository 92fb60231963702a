"""Two commits of the deploy side by side in one run: the converged re-run figures of bench/run.py and bench/fleet.py.

    .venv/bin/python bench/compare.py BASE_REV [--rounds N] [--head REV]

BASE_REV is checked out in a git worktree outside the repository (/tmp/bench-base-<commit>, removed at the end);
the other side is the working tree as it is (`head`, named by its commit, `-dirty` when a tracked file differs),
or with --head another commit in a worktree of its own. Each side runs its own deploy.py with its own modules,
group_data/ and files/ (pyinfra runs in the side's directory and imports from there, so a module one side has and
the other lacks changes nothing); both run against the same lab hosts and inventory (the working tree's
lab/inventory.py and its lab/group_data) and the lab's wheelhouse and state (shared into the worktree by links).

Before measuring, each side converges: it runs once, then every side runs again and must change nothing (an
operation that changed something on the second run stops the comparison: that side is not converged, or the
two sides deploy different states and each undoes the other's). Every measured run is checked the same way.

deploy.noop_vs_floor     the converged re-run of each side (`pyinfra lab/inventory.py deploy.py -y`) over the
                         floor, `pyinfra lab/inventory.py exec -y -- true` on the same hosts: one floor,
                         measured in the same rounds, for both sides (bench/run.py)
deploy.services_8_vs_1   each side's converged re-run of gpu-e running 8 services over gpu-d running 1
                         (bench/fleet.py)
NAME.control_cpu         the same with the CPU seconds each command used on this (the control) machine

Runs alternate round by round (each run takes every place in a round in turn: `round_order`); the medians are used. Each
figure is one line naming both commits: `deploy.noop_vs_floor: base 7de5423 1.52 | head 71a2516 1.49 (11 rounds)`.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.timing import (  # noqa: E402
    INVENTORY,
    PYINFRA,
    compile_deploy_modules,
    floor_description,
    revision,
    timed_run,
)

ROUNDS = 11
# Ignored paths of the checkout the lab's deploy reads (the wheelhouse under lab/cache, the lab's keys): a worktree
# shares them, as tests/lab/labutil.repo_copy does.
SHARED = ("lab/state", "lab/cache", "lab/run", ".secrets")


@dataclass(frozen=True)
class Side:
    name: str  # "base" or "head"
    rev: str  # short commit, `-dirty` for a working tree that differs from it
    root: Path

    @property
    def label(self) -> str:
        return f"{self.name} {self.rev}"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def worktree(name: str, rev: str) -> Side:
    """A detached worktree of `rev` at /tmp/bench-<name>-<commit>, sharing the checkout's lab state and caches."""
    commit = _git("rev-parse", "--verify", "--short", f"{rev}^{{commit}}")
    path = Path(tempfile.gettempdir()) / f"bench-{name}-{commit}"
    remove_worktree(path)
    _git("worktree", "add", "--detach", "--quiet", str(path), commit)
    for rel in SHARED:
        if (ROOT / rel).exists() and not (path / rel).exists():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / rel).symlink_to((ROOT / rel).resolve())
    return Side(name, commit, path)


def remove_worktree(path: Path) -> None:
    if path.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, capture_output=True)
        shutil.rmtree(path, ignore_errors=True)
    subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)


def changed_operations(stdout: str) -> list[str] | None:
    """The operations pyinfra's results table says changed something (its Success column), or None without a table."""
    if "Grand total" not in stdout:
        return None
    changed = []
    rows = stdout.split("--> Results:", 1)[-1].split("Grand total", 1)[0].splitlines()
    for row in rows:
        cols = re.split(r"\s{2,}", row.strip())
        if len(cols) >= 5 and cols[0] != "Operation" and cols[-3] not in ("-", "0"):
            changed.append(f"{cols[0]} (on {cols[-3]} of {cols[-4]} hosts)")
    return changed


def deploy_run(side: Side, inventory: str, check: bool, when: str) -> tuple[float, float]:
    """One deploy of `side` (wall and control CPU seconds); with `check`, stop unless it changed nothing."""
    elapsed, cpu, proc = timed_run([PYINFRA, inventory, "deploy.py", "-y"], cwd=side.root)
    if check:
        output = proc.stdout + proc.stderr  # pyinfra prints its results table on stderr
        changed = changed_operations(output)
        if changed is None:
            sys.exit(f"compare: {side.label} on {inventory}: no results table in its output ({when})\n{output[-3000:]}")
        if changed:
            sys.exit(f"compare: {side.label} is not converged on {inventory}: {when}, it changed {len(changed)} "
                     f"operation(s): {'; '.join(changed)}. Not measured (the sides may deploy different states, "
                     "each undoing the other's)")
    return elapsed, cpu


def converge(sides: list[Side], inventories: list[str]) -> None:
    """Every side once over each inventory, then every side again, which must change nothing."""
    for side in sides:
        for inventory in inventories:
            deploy_run(side, inventory, check=False, when="converging")
    for side in sides:
        for inventory in inventories:
            deploy_run(side, inventory, check=True, when="on its second run")


def round_order(keys: list[str], i: int) -> list[str]:
    """Round `i`'s order: the keys rotated by i, reversed in every other cycle of len(keys) rounds (all 6 orders of 3
    keys in 6 rounds), so that each run takes every place in a round, after each of the others, as often."""
    n = len(keys)
    turned = keys[i % n:] + keys[:i % n]
    return turned[::-1] if (i // n) % 2 else turned


def alternate(runs: dict[str, tuple[Side | None, str]], rounds: int) -> dict[str, tuple[float, float]]:
    """`rounds` rounds of every run (key -> (side, inventory); side None: the floor on that inventory), in the orders
    of `round_order`; key -> (median wall s, median control CPU s)."""
    samples: dict[str, list[tuple[float, float]]] = {key: [] for key in runs}
    for i in range(rounds):
        for key in round_order(list(runs), i):
            side, inventory = runs[key]
            if side is None:
                elapsed, cpu, _ = timed_run([PYINFRA, inventory, "exec", "-y", "--", "true"])
                samples[key].append((elapsed, cpu))
            else:
                samples[key].append(deploy_run(side, inventory, check=True, when=f"in round {i + 1}"))
    return {key: (statistics.median(s[0] for s in values), statistics.median(s[1] for s in values))
            for key, values in samples.items()}


def line(name: str, sides: list[Side], values: list[float], rounds: int) -> None:
    both = " | ".join(f"{side.label} {value:.2f}" for side, value in zip(sides, values))
    print(f"{name}: {both} ({rounds} rounds)")


def noop_vs_floor(sides: list[Side], rounds: int) -> None:
    inventory = str(ROOT / INVENTORY)
    converge(sides, [inventory])
    med = alternate({**{s.name: (s, inventory) for s in sides}, "floor": (None, inventory)}, rounds)
    floor_s, floor_cpu = med["floor"]
    line("deploy.noop_s", sides, [med[s.name][0] for s in sides], rounds)
    print(f"deploy.floor_s: {floor_s:.2f} (one floor for both sides, {rounds} rounds)")
    line("deploy.noop_vs_floor", sides, [med[s.name][0] / floor_s for s in sides], rounds)
    line("deploy.noop_s.control_cpu_s", sides, [med[s.name][1] for s in sides], rounds)
    print(f"deploy.floor_s.control_cpu_s: {floor_cpu:.2f} (one floor for both sides, {rounds} rounds)")
    line("deploy.noop_vs_floor.control_cpu", sides, [med[s.name][1] / floor_cpu for s in sides], rounds)


def services_8_vs_1(sides: list[Side], rounds: int) -> None:
    from bench import fleet

    with fleet.eight_and_one() as (eight, one):
        converge(sides, [str(eight), str(one)])
        runs = {f"{s.name} {n}": (s, str(inv)) for s in sides for n, inv in (("8", eight), ("1", one))}
        med = alternate(runs, rounds)
    line("deploy.services_8_s", sides, [med[f"{s.name} 8"][0] for s in sides], rounds)
    line("deploy.services_1_s", sides, [med[f"{s.name} 1"][0] for s in sides], rounds)
    line("deploy.services_8_vs_1", sides, [med[f"{s.name} 8"][0] / med[f"{s.name} 1"][0] for s in sides], rounds)
    line("deploy.services_8_s.control_cpu_s", sides, [med[f"{s.name} 8"][1] for s in sides], rounds)
    line("deploy.services_1_s.control_cpu_s", sides, [med[f"{s.name} 1"][1] for s in sides], rounds)
    line("deploy.services_8_vs_1.control_cpu", sides, [med[f"{s.name} 8"][1] / med[f"{s.name} 1"][1] for s in sides], rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", metavar="BASE_REV", help="the commit to compare with (e.g. HEAD~3, a tag, a hash)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"alternating rounds per figure (default {ROUNDS})")
    parser.add_argument("--head", metavar="REV", help="compare with this commit instead of the working tree")
    args = parser.parse_args()

    from bench import fleet

    before = fleet._lab_host_names()
    sides: list[Side] = []
    try:
        base = worktree("base", args.base)
        sides.append(base)
        head = worktree("head", args.head) if args.head else Side("head", revision(ROOT), ROOT)
        sides.append(head)
        print(f"compare.base: {base.rev} ({args.base}, a worktree at {base.root}; its own deploy.py)")
        where = f"a worktree at {head.root}" if args.head else f"the working tree {ROOT}"
        print(f"compare.head: {head.rev} ({where}; its own deploy.py)")
        print(f"compare.inventory: {ROOT / INVENTORY} ({', '.join(before)}) and its lab/group_data, for both sides")
        print(f"compare.floor: {floor_description()} on the same hosts, for both sides")
        for side in sides:
            compile_deploy_modules(side.root)
        noop_vs_floor(sides, args.rounds)
        fleet._lab("up", "--hosts", ",".join(fleet.TEST_HOSTS))  # gpu-d and gpu-e, as bench/fleet.py
        try:
            services_8_vs_1(sides, args.rounds)
        finally:
            fleet._lab("up", "--hosts", ",".join(before))
    finally:
        for side in sides:
            if side.root != ROOT:
                remove_worktree(side.root)


if __name__ == "__main__":
    main()
