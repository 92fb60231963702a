"""`make bench` after `make demo` (issue 48 item 7): a bench group deploys its own services only onto lab hosts where
the demo's placement puts none, so the demo keeps serving and the group's GPU check finds its GPUs free."""

from __future__ import annotations

import pytest

from bench import lab_hosts

DEMO = {"gpu-a": ["ddtree", "dflash"], "gpu-b": []}


def test_the_demos_host_is_never_free():
    assert lab_hosts.free_hosts(DEMO, ["gpu-a", "gpu-b", "gpu-c", "gpu-d"], 3) == ["gpu-b", "gpu-c", "gpu-d"]
    assert lab_hosts.free_hosts(DEMO, ["gpu-a", "gpu-b"], 1) == ["gpu-b"]


def test_a_host_the_placement_does_not_name_is_free():
    assert lab_hosts.free_hosts({"gpu-b": ["x"]}, ["gpu-a", "gpu-b", "gpu-c"], 2) == ["gpu-a", "gpu-c"]


def test_too_few_free_hosts_says_what_is_missing():
    with pytest.raises(SystemExit) as caught:
        lab_hosts.free_hosts(DEMO, ["gpu-a", "gpu-b"], 3)
    message = str(caught.value)
    assert "needs 3 lab host(s) where the demo places no service, has 1 (gpu-b)" in message
    assert "the demo uses gpu-a (ddtree, dflash)" in message
    assert "lab/lab.py up --hosts gpu-a,gpu-b,gpu-c,gpu-d" in message


def test_the_placement_is_the_labs_and_its_inventorys(monkeypatch, tmp_path):
    inventory = tmp_path / "inventory.py"
    inventory.write_text('lab_hosts = [("gpu-a", {"run_services": ["ddtree", "dflash"]}), ("gpu-c", {"run_services": {"x": {}}}),'
                         ' ("gpu-b", {"run_services": []})]\n')
    monkeypatch.setattr(lab_hosts, "INVENTORY", inventory)
    placement = lab_hosts.demo_placement()
    assert placement["gpu-a"] == ["ddtree", "dflash"] and placement["gpu-c"] == ["x"] and not placement["gpu-b"]
    monkeypatch.setattr(lab_hosts, "listed_hosts", lambda: ["gpu-a", "gpu-b", "gpu-c", "gpu-d"])
    assert lab_hosts.free_lab_hosts(2, start=False) == ["gpu-b", "gpu-d"]


def test_on_the_demos_lab_spare_hosts_are_started_and_the_inventory_kept(monkeypatch, tmp_path):
    """`make demo` starts gpu-a and gpu-b only: a group needing 3 free hosts starts gpu-c and gpu-d, then has
    lab/inventory.py list gpu-a and gpu-b again."""
    inventory = tmp_path / "inventory.py"
    inventory.write_text('lab_hosts = [("gpu-a", {"run_services": ["ddtree", "dflash"]}), ("gpu-b", {"run_services": []})]\n')
    monkeypatch.setattr(lab_hosts, "INVENTORY", inventory)
    up = ["gpu-a", "gpu-b"]
    calls = []

    def lab(*args):
        calls.append(args)
        up.extend(h for h in args[2].split(",") if h not in up)

    monkeypatch.setattr(lab_hosts, "_lab", lab)
    monkeypatch.setattr(lab_hosts, "listed_hosts", lambda: list(up))
    assert lab_hosts.free_lab_hosts(3) == ["gpu-b", "gpu-c", "gpu-d"]
    assert calls == [("up", "--hosts", "gpu-a,gpu-b,gpu-c,gpu-d"), ("up", "--hosts", "gpu-a,gpu-b")]
    calls.clear()
    assert lab_hosts.free_lab_hosts(3) == ["gpu-b", "gpu-c", "gpu-d"] and calls == []
