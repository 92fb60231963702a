"""The lab's cap of the control machine's link (lab/link_cap.py): only this machine's own traffic with the hosts goes
through the capped devices, one shared bucket per direction; host-to-host traffic is never redirected."""

from __future__ import annotations

import pytest

from lab import link_cap

LINKS = {"ve-gpu-a": "10.213.0.1", "ve-gpu-b": "10.213.0.5"}


def filters(commands):
    return [c for c in commands if c[:3] == ["tc", "filter", "add"]]


def test_only_this_machines_addresses_are_redirected_both_ways_on_every_veth():
    commands = link_cap.apply_commands(LINKS, "40mibps")
    got = {(c[4], c[5], c[13], c[14], c[-1]) for c in filters(commands)}
    want = {(veth, way, field, f"{address}/32", ifb)
            for veth in LINKS for address in LINKS.values()
            for way, field, ifb in (("egress", "src", link_cap.LINK_UP), ("ingress", "dst", link_cap.LINK_DOWN))}
    assert got == want
    # a host's own address (10.213.0.2, 10.213.0.6: what it forwards to another host) is matched nowhere
    assert not any(a in " ".join(c) for c in commands for a in ("10.213.0.2", "10.213.0.6"))


def test_one_bucket_per_direction_at_the_rate_shared_by_every_host():
    commands = link_cap.apply_commands(LINKS, "40MiB/s")
    classes = [c for c in commands if c[:3] == ["tc", "class", "replace"]]
    assert [(c[4], c[-3], c[-1]) for c in classes] == [(link_cap.LINK_UP, "40mibps", "40mibps"),
                                                     (link_cap.LINK_DOWN, "40mibps", "40mibps")]
    assert len([c for c in commands if c[:3] == ["ip", "link", "add"]]) == 2


def test_removal_takes_away_what_apply_made():
    removed = link_cap.remove_commands(list(LINKS))
    assert ["tc", "qdisc", "del", "dev", "ve-gpu-a", "clsact"] in removed
    assert ["ip", "link", "del", link_cap.LINK_UP] in removed and ["ip", "link", "del", link_cap.LINK_DOWN] in removed


@pytest.mark.parametrize("rate, want", [("40mibps", "40mibps"), ("320mbit", "320mbit"), ("40MiB/s", "40mibps"),
                                        ("1.5GiB/s", "1.5gibps"), ("100MB/s", "100mbps")])
def test_rates(rate, want):
    assert link_cap.tc_rate(rate) == want


@pytest.mark.parametrize("rate", ["fast", "40", "40 mib", "-1mbit", "40mibps; reboot"])
def test_a_rate_tc_would_not_read_is_refused(rate):
    with pytest.raises(link_cap.CapError, match="tc's units"):
        link_cap.tc_rate(rate)
