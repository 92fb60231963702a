"""Replicated services and their rollouts on the lab: one service `rep` with a replica on gpu-a and gpu-b and two on
gpu-c (`rep`, `rep@2`), and a probe loop polling every replica's /health from this machine throughout a deploy that
changes the service.

- waves of one (`max_unavailable: 1`, the default): at no probe instant is more than one replica down, and every
  replica was restarted, one wave after another;
- `max_unavailable: 2`: two replicas down at once at some instant, never three;
- a canary goes first, alone, and nothing else goes down until it answers again;
- a change that fails at start on one replica halts the rollout: the replicas after it keep their process (same PID)
  and old unit, the run ends non-zero naming the service, the replica and how many run the old version, the status
  view shows the rollout in progress, and the run after the fix goes on.
- a replica already down counts: with two replicas of a service and one stopped by hand, a change does not take the
  other down (held before its restart, same PID and unit); the run ends non-zero naming the replica that is down, the
  down one is started, and the next run goes on.

Hosts gpu-a, gpu-b, gpu-c; each left without services.
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.lab.labutil import (
    PYINFRA,
    ROOT,
    clean_host,
    deploy,
    health_inside,
    lab_hosts,
    main_pid,
    ssh,
    write_inventory,
)

pytestmark = pytest.mark.lab

HOSTS = ("gpu-a", "gpu-b", "gpu-c")
REP = {"gpu": 0, "port": 30100, "bind": "0.0.0.0", "allow_unauthenticated": True, "model": "Qwen3.6-27B", "model_in": "store",
       "args": {"attention-backend": "auto"}, "env": {"STANDIN_WARMUP_S": "2"}}
# host -> its replicas' (name, port)
REPLICAS = {"gpu-a": [("rep", 30100)], "gpu-b": [("rep", 30100)], "gpu-c": [("rep", 30100), ("rep@2", 30101)]}


def inventory(name: str, rep: dict | None = None, per_host: dict | None = None) -> str:
    """`rep` defined with `rep`'s keys changed; `per_host`: host -> overrides of its first replica."""
    definition = {**REP, **(rep or {})}
    data = {}
    for host in HOSTS:
        first = {**(per_host or {}).get(host, {})}
        placed = [first, {"gpu": 1, "port": 30101}] if host == "gpu-c" else first or None
        data[host] = {"services": {"rep": definition}, "run_services": {"rep": placed}}
    return str(write_inventory(f"test_rollout_{name}", data))


def pids() -> dict[str, int]:
    return {f"{host}/{name}": main_pid(host, f"sglang-{name}.service") for host, replicas in REPLICAS.items() for name, _ in replicas}


class Probe:
    """Polls every replica's /health from this machine every 50 ms; `down` holds, per instant, the replicas not at 200."""

    def __init__(self) -> None:
        hosts = lab_hosts()
        self.targets = {f"{h}/{n}": f"http://{hosts[h]['address']}:{p}/health" for h, rs in REPLICAS.items() for n, p in rs}
        self.samples: list[tuple[float, frozenset[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _up(self, url: str) -> bool:
        try:
            return urllib.request.urlopen(url, timeout=2).status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            down = frozenset(name for name, url in self.targets.items() if not self._up(url))
            self.samples.append((t, down))
            time.sleep(0.05)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def most_down(self) -> int:
        return max((len(d) for _, d in self.samples), default=0)

    def ever_down(self) -> set[str]:
        return set().union(*(d for _, d in self.samples))

    def first_down(self) -> list[frozenset[str]]:
        """The distinct sets of replicas down, in the order they were seen."""
        out: list[frozenset[str]] = []
        for _, down in self.samples:
            if down and (not out or out[-1] != down):
                out.append(down)
        return out


def converged(inv: str) -> None:
    first = deploy(inv)
    assert first.returncode == 0, first
    again = deploy(inv)
    assert again.returncode == 0 and again.changed == [], again


@pytest.fixture(scope="module", autouse=True)
def own_hosts():
    assert set(HOSTS) <= set(lab_hosts()), "run: python3 lab/lab.py up --hosts gpu-a,gpu-b,gpu-c,gpu-d,gpu-e"
    for host in HOSTS:
        clean_host(host, keep_venv=True)
    converged(inventory("base"))
    yield
    for host in HOSTS:
        clean_host(host, keep_venv=True)


@pytest.fixture(autouse=True)
def at_base():
    """Each test starts from the base definition, deployed and converged."""
    result = deploy(inventory("base"))
    assert result.returncode == 0, result
    yield


def test_dry_shows_the_waves():
    inv = inventory("warm3", rep={"env": {"STANDIN_WARMUP_S": "3"}})
    proc = subprocess.run([PYINFRA, inv, "deploy.py", "--dry"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]  # the plan's code: changes (each replica restarts)
    assert "rep: 4 replicas, at most 1 not serving at once" in out, out[-3000:]
    for i, replica in enumerate(("gpu-a/rep", "gpu-b/rep", "gpu-c/rep", "gpu-c/rep@2"), start=1):
        assert f"wave {i}: {replica} (restart)" in out, out[-3000:]


def test_one_replica_down_at_a_time_and_each_restarted():
    before = pids()
    with Probe() as probe:
        result = deploy(inventory("warm3", rep={"env": {"STANDIN_WARMUP_S": "3"}}))
    assert result.returncode == 0, result
    after = pids()
    assert all(after[r] != before[r] for r in before), (before, after)
    assert probe.ever_down() == set(before), probe.first_down()  # each one restarted (and seen down while it warmed up)
    assert probe.most_down() == 1, probe.first_down()
    assert [sorted(d) for d in probe.first_down()] == [["gpu-a/rep"], ["gpu-b/rep"], ["gpu-c/rep"], ["gpu-c/rep@2"]]


def test_max_unavailable_two_restarts_two_at_once():
    before = pids()
    with Probe() as probe:
        result = deploy(inventory("two", rep={"max_unavailable": 2, "env": {"STANDIN_WARMUP_S": "3"}}))
    assert result.returncode == 0, result
    assert all(pids()[r] != before[r] for r in before)
    assert probe.most_down() == 2, probe.first_down()
    assert {"gpu-a/rep", "gpu-b/rep"} in [set(d) for d in probe.first_down()], probe.first_down()


def test_a_canary_goes_first_alone():
    with Probe() as probe:
        result = deploy(inventory("canary", rep={"canary": ["gpu-c/rep@2"], "env": {"STANDIN_WARMUP_S": "3"}}))
    assert result.returncode == 0, result
    seen = probe.first_down()
    assert seen[0] == {"gpu-c/rep@2"} and probe.most_down() == 1, seen
    assert "gpu-c/rep@2" not in set().union(*seen[1:]), seen


def test_a_failing_change_halts_the_rollout_and_the_next_run_goes_on():
    before = pids()
    # The change (a longer warm-up) reaches every replica; on gpu-b's replica it also makes the engine exit at start.
    bad = inventory("halt", rep={"env": {"STANDIN_WARMUP_S": "3"}},
                    per_host={"gpu-b": {"env": {"STANDIN_WARMUP_S": "3", "STANDIN_CRASH_AT_START": "1"}}})
    with Probe() as probe:
        result = deploy(bad, as_json=False)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out[-3000:]
    after = pids()
    assert after["gpu-a/rep"] != before["gpu-a/rep"]  # wave 1 passed
    # gpu-b's replica failed, was rolled back; gpu-c's two were never touched.
    assert after["gpu-c/rep"] == before["gpu-c/rep"] and after["gpu-c/rep@2"] == before["gpu-c/rep@2"]
    assert "3" not in ssh("gpu-c", "cat /etc/systemd/system/sglang-rep.service").stdout.split("STANDIN_WARMUP_S=")[1][:1]
    assert probe.most_down() == 1 and "gpu-c/rep" not in probe.ever_down(), probe.first_down()
    assert "ROLLOUT HALTED: service rep: replica gpu-b/rep failed its readiness gate" in out, out[-3000:]
    assert "3 replica(s) still run the old version (gpu-b/rep, gpu-c/rep, gpu-c/rep@2)" in out, out[-3000:]
    assert "HELD" in out

    # The status view: replicas on two versions.
    status = subprocess.run([PYINFRA, bad, "status.py", "-y"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    view = status.stdout + status.stderr
    assert "ROLLOUT IN PROGRESS: rep: current on gpu-a/rep; old on gpu-b/rep, gpu-c/rep, gpu-c/rep@2" in view, view[-3000:]

    # Fixed: the run goes on from where it stopped.
    fixed = inventory("fixed", rep={"env": {"STANDIN_WARMUP_S": "3"}})
    done = deploy(fixed)
    assert done.returncode == 0, done
    final = pids()
    assert final["gpu-a/rep"] == after["gpu-a/rep"]  # already on the new version
    assert all(final[r] != after[r] for r in ("gpu-b/rep", "gpu-c/rep", "gpu-c/rep@2"))
    again = deploy(fixed)
    assert again.returncode == 0 and again.changed == [], again


# A second service with two replicas, beside `rep`'s base (GPU 1 of gpu-a and gpu-b).
PAIR = {"gpu": 1, "port": 30110, "bind": "0.0.0.0", "allow_unauthenticated": True, "model": "Qwen3.6-27B", "model_in": "store",
        "args": {"attention-backend": "auto"}, "env": {"STANDIN_WARMUP_S": "2"}}


def with_pair(name: str, pair: dict | None = None) -> str:
    definition = {**PAIR, **(pair or {})}
    data = {}
    for host in HOSTS:
        placed = [{}, {"gpu": 1, "port": 30101}] if host == "gpu-c" else None
        data[host] = {"services": {"rep": REP, "pair": definition},
                      "run_services": {"rep": placed, **({"pair": None} if host in ("gpu-a", "gpu-b") else {})}}
    return str(write_inventory(f"test_rollout_{name}", data))


def test_a_replica_already_down_holds_the_wave_that_would_leave_too_few_serving():
    unit = "/etc/systemd/system/sglang-pair.service"
    first = deploy(with_pair("pair"))
    assert first.returncode == 0, first
    ssh("gpu-b", "systemctl stop sglang-pair.service")
    serving_pid, serving_unit = main_pid("gpu-a", "sglang-pair.service"), ssh("gpu-a", f"cat {unit}").stdout

    # Its flags change: gpu-a/pair (wave 1) would restart while gpu-b/pair is down, leaving none.
    changed = with_pair("pair_changed", {"args": {"attention-backend": "auto", "max-running-requests": 8}})
    result = deploy(changed, as_json=False)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out[-3000:]
    assert "ROLLOUT HALTED: service pair: replica gpu-a/pair was held before its restart" in out, out[-3000:]
    assert "restarting gpu-a/pair now would leave 0 of 2 replicas of pair serving" in out, out[-3000:]
    assert "not serving now: gpu-b/pair (sglang-pair.service on gpu-b is inactive" in out, out[-3000:]
    # The serving replica still serves its old version: same process, same unit.
    assert main_pid("gpu-a", "sglang-pair.service") == serving_pid
    assert ssh("gpu-a", f"cat {unit}").stdout == serving_unit and "max-running-requests" not in serving_unit
    assert health_inside("gpu-a", 30110) == 200
    # The replica that was down only adds a serving one: it was started, on the new version.
    assert health_inside("gpu-b", 30110) == 200
    assert "max-running-requests" in ssh("gpu-b", f"cat {unit}").stdout

    # Both serve now: the next run restarts gpu-a's replica, and then changes nothing.
    done = deploy(changed)
    assert done.returncode == 0, done
    assert main_pid("gpu-a", "sglang-pair.service") != serving_pid
    assert "max-running-requests" in ssh("gpu-a", f"cat {unit}").stdout
    again = deploy(changed)
    assert again.returncode == 0 and again.changed == [], again


class Serving:
    """Counts, every 0.25 s from this machine, the instances of `rep` that serve on each of `hosts`: its own port 30100
    and its surge's 30101 (operations/service/surge.py), each /health at 200."""

    def __init__(self, hosts: tuple[str, ...]) -> None:
        known = lab_hosts()
        self.urls = {h: [f"http://{known[h]['address']}:{p}/health" for p in (30100, 30101)] for h in hosts}
        self.samples: list[dict[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append({h: sum(Probe._up(self, u) for u in urls) for h, urls in self.urls.items()})
            time.sleep(0.25)

    def __enter__(self) -> Serving:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def fewest(self) -> int:
        return min(sum(s.values()) for s in self.samples)

    def most(self, host: str) -> int:
        return max(s[host] for s in self.samples)


def test_a_surge_never_lowers_the_serving_replicas_and_a_failed_one_changes_nothing():
    """`max_surge: 1`: gpu-a's and gpu-b's replicas (their GPU 1 free) surge on GPU 1, port 30101; gpu-c's two (both GPUs
    taken) roll in place. First gpu-b's new version fails at start: its surge is removed and its old process and unit
    serve on untouched, the rollout halts; then the fix goes on; then nothing changes. Throughout, the replicas of gpu-a
    and gpu-b that serve (own port or surge) never number fewer than the 2 they were."""
    surge_unit = "/run/systemd/system/sglang-rep.surge.service"
    before, base_unit = pids(), ssh("gpu-b", "cat /etc/systemd/system/sglang-rep.service").stdout
    change = {"max_surge": 1, "env": {"STANDIN_WARMUP_S": "3"}}
    bad = inventory("surge_bad", rep=change, per_host={"gpu-b": {"env": {"STANDIN_WARMUP_S": "3", "STANDIN_CRASH_AT_START": "1"}}})
    dry = subprocess.run([PYINFRA, bad, "deploy.py", "--dry"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    plan_text = dry.stdout + dry.stderr
    assert "surge on GPU 1 (port 30101, sglang-rep.surge.service)" in plan_text, plan_text[-3000:]
    assert "in place (no free GPU" in plan_text, plan_text[-3000:]
    fixed = inventory("surge_fixed", rep=change)
    with Serving(("gpu-a", "gpu-b")) as serving:
        failed = deploy(bad, as_json=False)
        out = failed.stdout + failed.stderr
        assert failed.returncode != 0, out[-3000:]
        assert "SURGE NOT READY, removed; the old version keeps serving untouched" in out, out[-3000:]
        assert "ROLLOUT HALTED: service rep: replica gpu-b/rep failed its readiness gate (its surge on GPU 1" in out, out[-3000:]
        after = pids()
        assert after["gpu-a/rep"] != before["gpu-a/rep"]  # surged, then restarted on its own GPU and port
        assert after["gpu-b/rep"] == before["gpu-b/rep"] and ssh("gpu-b", "cat /etc/systemd/system/sglang-rep.service").stdout == base_unit
        assert after["gpu-c/rep"] == before["gpu-c/rep"]  # the rollout halted before it
        for host in ("gpu-a", "gpu-b"):
            assert ssh(host, f"test -e {surge_unit}", check=False).returncode != 0, host
            assert health_inside(host, 30101) is None and health_inside(host, 30100) == 200, host
        done = deploy(fixed)
        assert done.returncode == 0, done
    assert serving.fewest() >= 2, serving.samples
    assert serving.most("gpu-a") == 2 and serving.most("gpu-b") == 2, "no surge was seen serving"
    final = pids()
    assert final["gpu-a/rep"] == after["gpu-a/rep"] and all(final[r] != after[r] for r in ("gpu-b/rep", "gpu-c/rep", "gpu-c/rep@2"))
    assert "STANDIN_WARMUP_S=3" in ssh("gpu-b", "cat /etc/systemd/system/sglang-rep.service").stdout
    again = deploy(fixed)
    assert again.returncode == 0 and again.changed == [], again
