"""Fan-out as data: who serves whom when several hosts need the same bytes in one run (operations/transport/fanout.py)."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest

from operations.transport import fanout
from operations.transport.fanout import ORIGIN, WAIT, Coming, Holder, Swarm, choose

WANT = {"torch.whl": "aa", "sglang.whl": "bb"}


def host(name: str):
    return SimpleNamespace(name=name)


def decide(receiver="r", want=WANT, holders=(), busy=(), coming=None, served=None, control_origin=True, no_direct=(), now=0.0):
    return choose(receiver, want, list(holders), set(busy), coming or {}, served or Counter(), control_origin, set(no_direct), now)


def test_the_first_receiver_reads_from_the_origin():
    assert decide() == ORIGIN


def test_an_idle_holder_whose_files_cover_the_want_serves_it():
    a = Holder(host("a"), "/cache", dict(WANT))
    assert decide(holders=[a]) is a


def test_a_holder_with_another_pin_or_fewer_files_does_not_cover():
    other_pin = Holder(host("a"), "/cache", {**WANT, "torch.whl": "zz"})
    fewer = Holder(host("b"), "/cache", {"torch.whl": "aa"})
    assert decide(holders=[other_pin, fewer]) == ORIGIN


def test_a_busy_covering_holder_means_wait_not_the_origin_again():
    a = Holder(host("a"), "/cache", dict(WANT))
    assert decide(holders=[a], busy={"a"}) == WAIT


def test_one_on_its_way_means_wait_so_the_control_machine_carries_each_byte_once():
    assert decide(coming={"a": Coming(dict(WANT))}) == WAIT
    assert decide(coming={"a": Coming({"torch.whl": "aa"})}) == ORIGIN  # it will not hold all of ours


def test_one_that_landed_but_was_never_checked_stops_counting():
    landed = {"a": Coming(dict(WANT), landed_at=0.0)}
    assert decide(coming=landed, now=fanout.LANDED_GRACE_S - 1) == WAIT
    assert decide(coming=landed, now=fanout.LANDED_GRACE_S + 1) == ORIGIN


def test_the_least_used_idle_holder_serves_and_a_receiver_never_serves_itself():
    a, b = Holder(host("a"), "/c", dict(WANT)), Holder(host("b"), "/c", dict(WANT))
    assert decide(holders=[a, b], served=Counter(a=2, b=1)) is b
    assert decide(receiver="b", holders=[b]) == ORIGIN


def test_a_receiver_without_a_direct_path_reads_from_the_origin_at_once():
    a = Holder(host("a"), "/c", dict(WANT))
    assert decide(holders=[a], no_direct={"r"}) == ORIGIN


def test_a_host_origin_serves_one_at_a_time_and_peers_take_over():
    origin = Holder(host("gpu-a"), "/models/M", origin=True)
    peer = Holder(host("gpu-b"), "/models/M")
    assert decide(want={}, holders=[origin], busy={"gpu-a"}, control_origin=False) == WAIT
    assert decide(want={}, holders=[origin, peer], busy={"gpu-a"}, control_origin=False) is peer
    assert decide(want={}, holders=[origin, peer], control_origin=False) is peer  # the origin last among equals
    assert decide(want={}, control_origin=False) == ORIGIN  # nobody known: as without fan-out


def run_swarm(receivers: int, control_origin: bool = True, fail: set[str] = frozenset(), seconds: float = 0.05):
    want = dict(WANT) if control_origin else {}  # wheels by their pins; a model from a host: the whole of it
    """Every receiver at once in its own thread, each read taking `seconds`; returns (swarm, who read from whom,
    round of each receiver: 1 + the round of its source)."""
    swarm = Swarm("test", control_origin)
    if not control_origin:
        swarm.seed(Holder(host("origin"), "/m", {}, origin=True))
    rounds: dict[str, int] = {}
    lock = threading.Lock()

    def receive(name: str):
        with swarm.lease(name, want, timeout_s=600) as lease:
            source = lease.source.name if lease.source else ORIGIN
            time.sleep(seconds)
        with lock:
            rounds[name] = 1 + rounds.get(source, 0)
        if name in fail:
            swarm.gone(name)
        else:
            swarm.landed(name)
            swarm.hold(Holder(host(name), "/c", want))

    threads = [threading.Thread(target=receive, args=(f"h{i}",)) for i in range(receivers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a receiver waited forever"
    return swarm, rounds


@pytest.mark.parametrize("receivers", [1, 2, 4, 8, 16])
def test_hosts_holding_the_bytes_double_each_round_and_the_control_machine_sends_once(receivers):
    swarm, rounds = run_swarm(receivers)
    assert Counter(swarm.sources.values())[ORIGIN] == 1
    # The holders double each round after the first: 1, 1, 2, 4 ... so N receivers take log2(N) + 1 rounds, not N.
    assert max(rounds.values()) <= math.ceil(math.log2(receivers)) + 1
    assert all(count <= math.ceil(math.log2(receivers)) for name, count in swarm.served.items())


def test_without_the_rule_every_receiver_would_read_from_the_origin(monkeypatch):
    """The test above fails without the wait for one on its way: each receiver then goes to the origin at once."""
    monkeypatch.setattr(fanout, "choose", lambda *args: ORIGIN)
    swarm, _ = run_swarm(4)
    assert Counter(swarm.sources.values())[ORIGIN] == 4


def test_a_receiver_that_fails_wakes_those_waiting_for_it_and_one_of_them_goes_to_the_origin():
    swarm, rounds = run_swarm(4, fail={"h0", "h1", "h2", "h3"})
    assert Counter(swarm.sources.values())[ORIGIN] == 4  # each failed in turn: the next went to the origin, none hung


def test_from_a_host_origin_the_copies_spread_over_the_receivers():
    swarm, rounds = run_swarm(8, control_origin=False)
    assert swarm.served["origin"] <= 4 and sum(swarm.served.values()) == 8
    assert max(rounds.values()) <= math.ceil(math.log2(8 + 1))
