"""A service's replicas in waves (operations/rollout.py): sizes, canaries, and the same waves on every host."""

from __future__ import annotations

import pytest

from configuration.schema import GroupData, ServiceSpec
from configuration.typed import Environment, HostConfig, ModelUse, Service
from operations import rollout
from operations.rollout import Replica


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
