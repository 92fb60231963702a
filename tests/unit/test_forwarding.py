"""Holders forward while they receive (operations/model/forwarding.py, fanout.choose's `follow`): a receiver follows one that
is getting the bytes, reading only files whole and checked there, and a forwarder's copy is never renamed while read."""

from __future__ import annotations

import threading
import time
from collections import Counter
from types import SimpleNamespace

from operations.model import forwarding
from operations.transport import fanout
from operations.transport.fanout import ORIGIN, WAIT, Coming, Holder, Swarm, choose

DIGESTS = {"a.safetensors": [100, "aa"], "b.safetensors": [200, "bb"], "sub/c.json": [3, "cc"],
           "link": ["symlink", "a.safetensors"]}


def host(name: str):
    return SimpleNamespace(name=name)


def forwarder(name="h1", root="/m/.x.partial", **kw):
    return Coming({}, host=host(name), root=root, **kw)


def decide(receiver="r", holders=(), busy=(), coming=None, control_origin=True, no_direct=(), follow=True):
    return choose(receiver, {}, list(holders), set(busy), coming or {}, Counter(), control_origin, set(no_direct),
                  0.0, follow)


def test_a_receiver_follows_one_that_forwards_instead_of_waiting_for_it():
    got = decide(coming={"h1": forwarder()})
    assert isinstance(got, Holder) and got.following and got.name == "h1" and got.root == "/m/.x.partial"
    # without `follow` (the wheels, or forwarding off), it waits for it as before
    assert decide(coming={"h1": forwarder()}, follow=False) == WAIT


def test_one_on_its_way_that_does_not_forward_yet_is_waited_for_not_followed():
    assert decide(coming={"h1": Coming({})}) == WAIT


def test_the_followers_form_a_chain_one_reader_per_forwarder():
    coming = {"h1": forwarder("h1"), "h2": forwarder("h2")}
    assert decide("h3", coming=coming, busy={"h1"}).name == "h2"
    assert decide("h3", coming=coming, busy={"h1", "h2"}) == WAIT


def test_an_idle_holder_comes_first_and_one_renaming_its_copy_is_not_followed():
    whole = Holder(host("h0"), "/m/x")
    assert decide(holders=[whole], coming={"h1": forwarder()}) is whole
    assert decide(coming={"h1": forwarder(closing=True)}) == WAIT


def test_a_receiver_without_a_direct_path_never_follows():
    assert decide(coming={"h1": forwarder()}, no_direct={"r"}) == ORIGIN
    assert decide(coming={"h1": forwarder()}, no_direct={"r"}, control_origin=False,
                  holders=[Holder(host("o"), "/m/x", origin=True)]) == Holder(host("o"), "/m/x", origin=True)


def test_only_files_the_origin_lists_at_its_size_and_not_had_yet_are_read():
    listing = {"a.safetensors": 100, "b.safetensors": 150, "sub/c.json": 3, "extra.bin": 5,
               ".untar-77-1.partial": 100, "link": 100}
    assert forwarding.ready(listing, DIGESTS, set()) == ["a.safetensors", "sub/c.json"]
    assert forwarding.ready(listing, DIGESTS, {"a.safetensors"}) == ["sub/c.json"]
    assert forwarding.ready(None, DIGESTS, set()) == []


def test_a_forwarder_renames_its_copy_only_once_no_read_of_it_goes_on():
    swarm = Swarm("model", control_origin=True)
    with swarm.lease("h1", {}, follow=True):
        pass
    swarm.receiving("h1", host("h1"), "/m/.x.partial")
    assert swarm.forwarder("h1") == ("coming", "/m/.x.partial")
    assert swarm.start_reading("h1") == "/m/.x.partial"
    closed = threading.Event()

    def close():
        swarm.closing("h1")
        closed.set()

    threading.Thread(target=close, daemon=True).start()
    time.sleep(0.2)
    assert not closed.is_set(), "renamed while a follower reads its copy"
    assert swarm.forwarder("h1") == ("closing", None) and swarm.start_reading("h1") is None
    swarm.done_reading("h1")
    assert closed.wait(2)
    swarm.hold(Holder(host("h1"), "/m/x"))
    assert swarm.forwarder("h1") == ("held", "/m/x")
    swarm.gone("h9")
    assert swarm.forwarder("h9") == ("gone", None)


def test_a_follower_reads_each_file_as_its_forwarder_checks_it(monkeypatch):
    swarm = Swarm("model", control_origin=True)
    with swarm.lease("h1", {}, follow=True):
        pass
    swarm.receiving("h1", host("h1"), "/m/.x.partial")
    listings = iter([{}, {"a.safetensors": 100, "b.safetensors": 10}, {"a.safetensors": 100, "b.safetensors": 200,
                                                                     "sub/c.json": 3}])
    reads = []
    monkeypatch.setattr(forwarding, "POLL_S", 0.01)
    monkeypatch.setattr(forwarding, "_listing", lambda h, root: next(listings))
    monkeypatch.setattr(forwarding.openssh, "streams", lambda h: 4)

    grants = []

    def granted(source, receiver, root, names, log):
        grants.append((root, names))
        return SimpleNamespace(root=root, close=lambda: grants.append("closed"))

    def read(grant, h, partial, names, digests, streams):
        reads.append((grant.root, names))
        return forwarding.streaming.Moved(True, 1, 0.1)

    monkeypatch.setattr(forwarding.peer_keys, "granted", granted)
    monkeypatch.setattr(forwarding, "_read", read)
    ok, why = forwarding.follow(swarm, "h1", host("h1"), host("h2"), "/m/.x.partial2", DIGESTS, set(), lambda _: None)
    assert ok, why
    assert reads == [("/m/.x.partial", ["a.safetensors"]), ("/m/.x.partial", ["b.safetensors", "sub/c.json"])]
    assert swarm.reading["h1"] == 0
    # one key for the whole following, for exactly the model's files (no link), taken back at its end
    assert grants == [("/m/.x.partial", ["a.safetensors", "b.safetensors", "sub/c.json"]), "closed"]


def test_a_follower_whose_forwarder_gave_up_stops_and_says_so(monkeypatch):
    swarm = Swarm("model", control_origin=True)
    with swarm.lease("h1", {}, follow=True):
        pass
    swarm.gone("h1")
    ok, why = forwarding.follow(swarm, "h1", host("h1"), host("h2"), "/p", DIGESTS, set(), lambda _: None)
    assert not ok and "stopped" in why


def test_forwarding_is_on_for_models(monkeypatch):
    from operations.model import transfer

    assert transfer.FOLLOW and fanout.ENABLED


def test_a_receiver_others_wait_for_is_told_so_one_alone_is_not():
    swarm = Swarm("model", control_origin=True)
    with swarm.lease("h1", {}, follow=True):
        assert not swarm.awaited("h1")
        waiter = threading.Thread(target=lambda: swarm.lease("h2", {}, timeout_s=0.5, follow=True).ended(), daemon=True)
        waiter.start()
        time.sleep(0.1)
        assert swarm.awaited("h1"), "h2 waits for a source"
        waiter.join()


def test_a_second_receiver_follows_the_first_and_finishes_from_the_origin_with_its_files_as_they_are(monkeypatch):
    """transfer._fanned_out: gpu-b reads from the origin and forwards; gpu-c follows it, then takes only the rest (the
    directories and links) from the origin, its followed files not checked again, and says it read them from gpu-b."""
    from operations.model import transfer

    state = SimpleNamespace(inventory=None)
    digests = {"a.safetensors": [100, "aa"], "b.safetensors": [200, "bb"]}
    first_receiving, calls = threading.Event(), []
    monkeypatch.setattr(transfer, "_origin_digests", lambda *a: digests)
    monkeypatch.setattr(transfer, "_resumable", lambda h, partial, d: set())

    def stream(state, h, source, src, dest, d, swarm=None, whole=None, forwarder=None):
        calls.append((h.name, source, whole, forwarder))
        if h.name == "gpu-b":  # the first receiver registers as a forwarder, then takes a while
            swarm.receiving(h.name, h, "/m/.x.partial")
            first_receiving.set()
            time.sleep(0.3)
            swarm.closing(h.name)
        return True

    def follow(swarm, name, forwarder_host, h, partial, d, have, log):
        calls.append((h.name, "follows", name, partial))
        return True, ""

    monkeypatch.setattr(transfer, "_stream", stream)
    monkeypatch.setattr(transfer.forwarding, "follow", follow)
    gpu_b = SimpleNamespace(name="gpu-b", log=lambda *a, **k: None, log_styled=lambda *a, **k: None)
    gpu_c = SimpleNamespace(name="gpu-c", log=lambda *a, **k: None, log_styled=lambda *a, **k: None)
    results = {}
    first = threading.Thread(target=lambda: results.update(b=transfer._fanned_out(state, gpu_b, "/data/x", "/data/x",
                                                                                   "/m/x")))
    first.start()
    assert first_receiving.wait(2)
    results["c"] = transfer._fanned_out(state, gpu_c, "/data/x", "/data/x", "/m/x")
    first.join()
    assert results == {"b": True, "c": True}
    assert ("gpu-b", "/data/x", None, None) in calls
    assert ("gpu-c", "follows", "gpu-b", "/m/.x.partial") in calls
    assert ("gpu-c", "/data/x", {"a.safetensors", "b.safetensors"}, "gpu-b") in calls
