"""One-time keys a run that died left between hosts are removed by the next deploy that reads the host (issue 46 item
8; operations/transport/peer_keys.py `swept`): from the host's one read (peer_access.py `left`), only while the run holds the
host's deploy lock (never under --dry, never in a view), and only those provably dead (`_stale`: expired, without
their record, or of a deploy of this control machine that is gone). A live run's grant stays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from operations import remote
from operations.lock import lock_record
from operations.transport import peer_keys

ME = lock_record.control_identity()
DEAD, LIVE, BARE, EXPIRED = "a" * 32, "b" * 32, "c" * 32, "d" * 32


def owner(pid: int, start: int | None, token: str, expires: float) -> dict:
    return {**ME, "pid": pid, "start": start, "token": token, "expires": expires}


def found(record: dict | None, expired: bool = False, entry: bool = True) -> dict:
    return {"owner": record, "expired": expired, "entry": entry, "record": record is not None}


class FakeHost:
    name = "gpu-x"


def left() -> dict:
    later = time.time() + 3600
    return {
        "keys": {DEAD: found(owner(2 ** 22 + 12345, 1, DEAD, later))},  # a pid no process has
        "grants": {LIVE: found(owner(os.getpid(), lock_record.process_start(os.getpid()), LIVE, later)),
                   BARE: found(None),  # an entry whose record /run lost (the host restarted)
                   EXPIRED: found(owner(os.getpid(), lock_record.process_start(os.getpid()), EXPIRED, 0), expired=True)},
    }


def test_the_next_run_that_holds_the_host_removes_what_dead_runs_left_and_nothing_else(monkeypatch):
    asked, said = [], []
    monkeypatch.setattr(peer_keys.lock, "holds", lambda host: True)
    monkeypatch.setattr(peer_keys.host_reads, "get", lambda host, fact: left() if fact is peer_keys.LeftAccess else None)
    monkeypatch.setattr(peer_keys, "_answer", lambda host, mode, *args, given=None: asked.append((mode, *args)) or {})
    removed = peer_keys.swept(FakeHost(), said.append)
    assert removed == sorted([DEAD, BARE, EXPIRED])
    assert asked == [("remove", *sorted([DEAD, BARE, EXPIRED]))]
    assert len(said) == 1 and said[0].startswith("removed 3 one-time key(s) a run that stopped left on gpu-x: ")
    assert "is gone" in said[0] and "the host restarted" in said[0] and "expired" in said[0]


def test_a_run_without_the_hosts_lock_only_reads(monkeypatch):
    """--dry and the views hold no lock: nothing is asked of the host, not even the listing."""
    monkeypatch.setattr(peer_keys.lock, "holds", lambda host: False)
    monkeypatch.setattr(peer_keys.host_reads, "get", lambda *a, **k: (_ for _ in ()).throw(AssertionError("read")))
    monkeypatch.setattr(peer_keys, "_answer", lambda *a, **k: (_ for _ in ()).throw(AssertionError("asked")))
    assert peer_keys.swept(FakeHost(), print) == []


def test_nothing_left_asks_nothing(monkeypatch):
    monkeypatch.setattr(peer_keys.lock, "holds", lambda host: True)
    monkeypatch.setattr(peer_keys.host_reads, "get", lambda host, fact: {"keys": {}, "grants": {}})
    monkeypatch.setattr(peer_keys, "_answer", lambda *a, **k: (_ for _ in ()).throw(AssertionError("asked")))
    assert peer_keys.swept(FakeHost(), print) == []


def test_the_listing_is_read_only_and_names_each_grant_and_key_of_ours(tmp_path):
    """peer_access.py `left`, as the host's read runs it, on directories and an authorized_keys of the test's own: every
    grant and key of ours (by directory or entry), its record and whether it expired; nothing else is listed and no
    file changes."""
    grants, keys, authorized = tmp_path / "grants", tmp_path / "keys", tmp_path / "authorized_keys"
    for parent, ident, expires in ((grants, LIVE, time.time() + 60), (keys, DEAD, 0)):
        (parent / ident).mkdir(parents=True)
        (parent / ident / "owner.json").write_text(json.dumps({"expires": expires}))
    (grants / "not-ours").mkdir()
    entry = (f'restrict,from="10.0.0.2",expiry-time="20261206120000",command="/usr/bin/python3 -I x" '
             f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB sglang-deploy-peer:{BARE}")
    authorized.write_text(f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC an-operator\n{entry}\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    text = (remote.script("peer_access")
            .replace('PEER_KEYS = "/run/sglang-deploy/peer-keys"', f"PEER_KEYS = {str(keys)!r}")
            .replace('PEER_GRANTS = "/run/sglang-deploy/peer-grants"', f"PEER_GRANTS = {str(grants)!r}")
            .replace("def authorized_keys():\n", f"def authorized_keys():\n    return {str(authorized)!r}\n"))
    ran = subprocess.run([sys.executable, "-I", "-", "left"], input=text, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    listed = json.loads(ran.stdout)
    assert set(listed["grants"]) == {LIVE, BARE} and set(listed["keys"]) == {DEAD}
    assert listed["grants"][LIVE]["expired"] is False and listed["grants"][LIVE]["entry"] is False
    assert listed["grants"][BARE] == {"owner": None, "expired": True, "entry": True, "record": False}
    assert listed["keys"][DEAD]["expired"] is True and listed["keys"][DEAD]["record"] is True
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
