"""A service's replicas in waves (operations/service/rollout.py): sizes, canaries, and the same waves on every host."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from configuration.schema import GroupData, ServiceSpec
from configuration.typed import Environment, HostConfig, ModelUse, Service
from operations.service import rollout
from operations.service.rollout import Replica
from report import rollouts


@pytest.mark.parametrize(("given", "replicas", "size"), [
    (1, 4, 1), (2, 4, 2), (10, 4, 10), ("25%", 4, 1), ("50%", 4, 2), ("10%", 4, 1), ("100%", 3, 3), ("34%", 3, 1), ("67%", 3, 2),
])
def test_wave_size_is_a_number_or_a_percentage_rounded_down_at_least_one(given, replicas, size):
    assert rollout.wave_size(given, replicas) == size


def reps(*names: str) -> list[Replica]:
    return [Replica(n.split("/")[0], n.split("/")[1] if "/" in n else "s", "s") for n in names]


def shown(waves) -> list[list[str]]:
    return [[str(r) for r in wave] for wave in waves]


def test_waves_in_inventory_order_at_most_max_unavailable_each():
    five = reps("a", "b", "c", "d", "e")
    assert shown(rollout.service_waves(five, 1, 0)) == [["a/s"], ["b/s"], ["c/s"], ["d/s"], ["e/s"]]
    assert shown(rollout.service_waves(five, 2, 0)) == [["a/s", "b/s"], ["c/s", "d/s"], ["e/s"]]


def test_canaries_go_first_and_alone():
    five = reps("a", "b", "c", "d", "e")
    assert shown(rollout.service_waves(five, 2, 1)) == [["a/s"], ["b/s", "c/s"], ["d/s", "e/s"]]
    # Named: a host's one replica, or host/replica; more canaries than a wave holds still respect max_unavailable.
    three_on_c = reps("a", "c", "c/s@2", "d")
    assert shown(rollout.service_waves(three_on_c, 1, ("c/s@2", "d"))) == [["c/s@2"], ["d/s"], ["a/s"], ["c/s"]]
    assert shown(rollout.service_waves(reps("a", "b", "c"), 3, ("b",))) == [["b/s"], ["a/s", "c/s"]]


def service(name: str, replica: str, port: int, canary: int | tuple[str, ...] = 0, **rollout_keys) -> Service:
    model = ModelUse("m", "store", "/root/models/m", "/root/models/m")
    spec = ServiceSpec.model_construct(port=port, bind="127.0.0.1", **{"max_unavailable": 1, "canary_soak_s": 0, **rollout_keys})
    return Service(name=replica, definition=name, spec=spec, environment=Environment("/root/venv", ()), gpus=(0,),
                   target=model, draft=None, patch_sets=(), args=(), env=(), canary=canary)


def config(host: str, *services: Service) -> HostConfig:
    return HostConfig(host=host, data=GroupData.model_construct(stack="s"), wheelhouse=None, stack_sources=(),
                      services=services, failed_gpus=())


def test_every_host_gets_as_many_waves_so_they_line_up():
    configs = {
        "a": config("a", service("rep", "rep", 30000), service("one", "one", 30001)),
        "b": config("b", service("rep", "rep", 30000)),
        "c": config("c", service("rep", "rep", 30000), service("rep", "rep@2", 30002)),
    }
    fleet = rollout.fleet(configs)
    names = lambda host: [[name for name, _ in wave] for wave in rollout.host_waves(fleet, host)]  # noqa: E731
    assert names("a") == [["one", "rep"], [], [], []]
    assert names("b") == [[], ["rep"], [], []]
    assert names("c") == [[], [], ["rep"], ["rep@2"]]
    described = {name: r.described() for name, r in fleet.items()}
    assert described["rep"]["waves"] == [["a/rep"], ["b/rep"], ["c/rep"], ["c/rep@2"]] and described["one"]["replicas"] == 1


def test_the_waves_follow_each_services_own_keys():
    configs = {
        "a": config("a", service("rep", "rep", 30000, max_unavailable="50%", canary=("c/rep@2",))),
        "b": config("b", service("rep", "rep", 30000, max_unavailable="50%", canary=("c/rep@2",))),
        "c": config("c", service("rep", "rep", 30000, max_unavailable="50%", canary=("c/rep@2",)),
                    service("rep", "rep@2", 30002, max_unavailable="50%", canary=("c/rep@2",))),
    }
    fleet = rollout.fleet(configs)
    assert fleet["rep"].waves == [[Replica("c", "rep@2", "rep")], [Replica("a", "rep", "rep"), Replica("b", "rep", "rep")],
                                  [Replica("c", "rep", "rep")]]
    assert set(fleet["rep"].canaries) == {Replica("c", "rep@2", "rep")}
    assert rollout.host_waves(fleet, "c") == [[("rep@2", True)], [], [("rep", False)]]


# Who serves now, before a restart (rollout.down_beside, rollout.hold_reason).

@pytest.fixture
def run():
    """A run of the test's own: its halts, failed gates and restarting replicas (report/rollouts.py)."""
    return SimpleNamespace()


def replicated(hosts: tuple[str, ...], **rollout_keys) -> tuple[dict, rollout.Rollout]:
    configs = {h: config(h, service("rep", "rep", 30000, **rollout_keys)) for h in hosts}
    return configs, rollout.fleet(configs)["rep"]


class Answers:
    """A probe answering from `down` (host -> why its replica `rep` does not serve); records who was asked."""

    def __init__(self, **down: str) -> None:
        self.down = {f"{host}/rep": why for host, why in down.items()}
        self.asked: list[str] = []

    def __call__(self, replica) -> str | None:
        self.asked.append(str(replica))
        return self.down.get(str(replica))


def rep_of(configs: dict, host: str) -> Service:
    return configs[host].services[0]


def test_down_beside_asks_every_other_replica_now():
    configs, rep = replicated(("a", "b", "c"))
    probe = Answers(b="sglang-rep.service on b is inactive, /health None now")
    assert rollout.down_beside(rep_of(configs, "a"), "a", rep, probe) == {
        "b/rep": "sglang-rep.service on b is inactive, /health None now"}
    assert probe.asked == ["b/rep", "c/rep"]  # not its own replica


def test_two_replicas_one_down_holds_the_restart_of_the_other(run):
    configs, rep = replicated(("a", "b"))
    held = rollout.hold_reason(run, rep_of(configs, "a"), "a", rep, Answers(b="inactive"), planned=True)
    why = held(restarting=True)
    assert why is not None and "b/rep (inactive)" in why and "leave 0 of 2 replicas of rep serving" in why
    # The rollout halts, held before its restart, and the host fails after its waves.
    assert rollouts.of(run).halts["rep"].what == rollouts.HELD_BEFORE_RESTART and rollouts.of(run).halts["rep"].replica == "a/rep"
    assert [line.split(": ")[0] for line in rollouts.of(run).failed_gates["a"]] == ["rep"]
    assert "was held before its restart" in rollouts.lines(run)[0] and "b/rep (inactive)" in rollouts.lines(run)[0]
    # Held for the rest of the run, whatever the gate asks afterwards.
    assert held() == why


def test_three_replicas_max_unavailable_one_with_one_down_holds(run):
    configs, rep = replicated(("a", "b", "c"), max_unavailable=1)
    held = rollout.hold_reason(run, rep_of(configs, "a"), "a", rep, Answers(c="failed"))
    why = held(restarting=True)
    assert why is not None and "c/rep (failed)" in why and "fewer than the 2" in why


def test_all_serving_is_not_held(run):
    configs, rep = replicated(("a", "b", "c"), max_unavailable=1)
    probe = Answers()
    assert rollout.hold_reason(run, rep_of(configs, "b"), "b", rep, probe, planned=True)(restarting=True) is None
    assert rollouts.of(run).halts == {} and rollouts.of(run).failed_gates == {} and probe.asked == ["a/rep", "c/rep"]


def test_max_unavailable_covers_the_down_replica(run):
    configs, rep = replicated(("a", "b", "c"), max_unavailable=2)
    assert rollout.hold_reason(run, rep_of(configs, "a"), "a", rep, Answers(c="failed"))(restarting=True) is None


def test_a_wave_mate_that_restarts_counts_as_going_down(run):
    configs, rep = replicated(("a", "b", "c", "d"), max_unavailable=2)  # waves [a, b], [c, d]; 2 must serve
    probe = Answers(d="failed")
    assert rollout.hold_reason(run, rep_of(configs, "a"), "a", rep, probe)(restarting=True) is None  # b does not restart
    rollout.hold_reason(run, rep_of(configs, "b"), "b", rep, probe, planned=True)
    assert "leave 1 of 4" in rollout.hold_reason(run, rep_of(configs, "a"), "a", rep, probe)(restarting=True)


def test_the_down_replica_itself_may_start(run):
    configs, rep = replicated(("a", "b"))
    probe = Answers(a="inactive")
    # a is down: starting it only adds a serving replica; nothing is asked.
    assert rollout.hold_reason(run, rep_of(configs, "a"), "a", rep, probe)(restarting=False) is None
    assert probe.asked == [] and rollouts.of(run).halts == {}
    # ... also once the rollout halted because too few serve (the held replica was b).
    rollouts.halt(run, "rep", "b/rep", "too few", what=rollouts.HELD_BEFORE_RESTART)
    assert rollout.hold_reason(run, rep_of(configs, "a"), "a", rep, probe)(restarting=False) is None
    # A restart after that halt is held, and so is any (re)start after a failed gate.
    assert "b/rep was held before its restart" in rollout.hold_reason(run, rep_of(configs, "a"), "a", rep, probe)(
        restarting=True)
    rollouts.of(run).halts.clear()
    rollouts.halt(run, "rep", "b/rep", "exited at start")
    assert "b/rep failed its readiness gate" in rollout.hold_reason(run, rep_of(configs, "a"), "a", rep, probe)()


def test_one_replica_is_never_counted(run):
    configs, rep = replicated(("a",))
    probe = Answers()
    assert rollout.hold_reason(run, rep_of(configs, "a"), "a", rep, probe)(restarting=True) is None and probe.asked == []


def test_the_probe_keeps_a_serving_answer_and_asks_a_down_one_again(monkeypatch):
    from operations.service import placement

    configs, rep = replicated(("a", "b", "c"))
    answers = {"b": None, "c": "sglang-rep.service on c is inactive, /health None now"}
    asked = []

    def answers_now(state, placed):
        asked.append(placed.host)
        return answers[placed.host]

    monkeypatch.setattr(placement, "answers_now", answers_now)
    probe = rollout.probe_of(None, configs)
    me = rep_of(configs, "a")
    assert list(rollout.down_beside(me, "a", rep, probe)) == ["c/rep"]
    answers["c"] = None
    assert rollout.down_beside(me, "a", rep, probe) == {}
    assert asked == ["b", "c", "c"]  # b's answer kept, c asked again
    # A new wave's probe asks afresh (a replica that served may have died since).
    answers["b"] = "sglang-rep.service on b is failed, /health None now"
    assert list(rollout.down_beside(me, "a", rep, rollout.probe_of(None, configs))) == ["b/rep"]
