"""Placement: which of a host's units go, and when (facts in, commands or a no-op out)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace
from unittest import mock

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_host, ctx_state

from operations import remote
from operations.service import placement
from report import rollouts, summary

HEADER = "# Managed by sglang-deploy (pyinfra) - local edits are overwritten on the next deploy.\n"


def unit(managed=True, active="active"):
    return {"path": "/etc/systemd/system/x", "managed": managed, "active": active, "enabled": "enabled", "pid": 10}


def test_leftovers_are_our_units_that_no_placed_service_owns():
    units = {
        "sglang-ddtree.service": unit(),
        "sglang-dflash.service": unit(),
        "sglang-stage-models.service": unit(),  # the models' boot unit: theirs
        "sglang-handmade.service": unit(managed=False),  # no header: not ours
    }
    assert placement.leftovers(units, ["sglang-ddtree.service"]) == ["sglang-dflash.service"]
    assert placement.leftovers(units, ["sglang-ddtree.service", "sglang-dflash.service"]) == []


def _config(*services):
    return SimpleNamespace(services=tuple(
        SimpleNamespace(name=name, definition=name.split("@")[0], unit_name=f"sglang-{name}.service", bind=bind, port=port,
                        stop_timeout_s=rest[0] if rest else 60)
        for name, bind, port, *rest in services
    ))


def test_placements_read_every_hosts_validated_replicas():
    configs = {
        "gpu-d": _config(),
        "gpu-e": _config(("dflash", "0.0.0.0", 30001), ("tmp", "127.0.0.1", 30002), ("tmp@2", "127.0.0.1", 30003)),
        "gpu-f": _config(("dflash", "10.0.0.7", 30001)),
    }
    elsewhere = placement.placements(configs)
    assert {s: [str(p) for p in placed] for s, placed in elsewhere.items()} == {"dflash": ["gpu-e", "gpu-f"], "tmp": ["gpu-e", "gpu-e/tmp@2"]}
    assert elsewhere["dflash"][0] == placement.Placed("gpu-e", "sglang-dflash.service", "127.0.0.1", 30001, "dflash")  # probed from its own host
    assert elsewhere["dflash"][1] == placement.Placed("gpu-f", "sglang-dflash.service", "10.0.0.7", 30001, "dflash")
    # A host's own other replicas count too: removing a replica there (scaling down) keeps the service answering.
    assert [str(p) for p in placement.placements(configs)["tmp"]] == ["gpu-e", "gpu-e/tmp@2"]


def placed(name="gpu-e", service="dflash"):
    return placement.Placed(name, f"sglang-{service}.service", "127.0.0.1", 30001, service)


def test_ready_elsewhere_needs_a_ready_row_in_this_runs_report():
    report = {"gpu-e": {"dflash": {"state": "ready"}}, "gpu-f": {"dflash": {"state": "FAILED"}}}
    e, f, g = placed("gpu-e"), placed("gpu-f"), placed("gpu-g")
    assert placement.ready_elsewhere("dflash", [e, f, g], report) == ([e], [f, g])


def test_a_replica_is_ready_by_its_own_row():
    report = {"gpu-e": {"dflash": {"state": "FAILED"}, "dflash@2": {"state": "ready"}}}
    first, second = placed("gpu-e", "dflash"), placed("gpu-e", "dflash@2")
    assert placement.ready_elsewhere("dflash", [first, second], report) == ([second], [first])
    assert placement.service_of("sglang-dflash@2.service") == "dflash" and placement.replica_of("sglang-dflash@2.service") == "dflash@2"


def test_removal_commands_stop_disable_remove_reload():
    assert placement.removal_commands("sglang-dflash.service", "/etc/systemd/system/sglang-dflash.service") == [
        "systemctl disable --now sglang-dflash.service",
        "rm -f -- /etc/systemd/system/sglang-dflash.service",
        "systemctl daemon-reload",
        "{ systemctl reset-failed sglang-dflash.service 2>/dev/null || true; }",
    ]


def test_a_failing_step_of_the_removal_fails_it_in_a_real_shell(tmp_path):
    """The steps are joined with `&&` and run by sh: a failed stop must fail the removal; reset-failed may fail."""
    fake = tmp_path / "systemctl"
    fake.write_text('#!/bin/sh\necho "$*" >> "$(dirname "$0")/calls"\ncase "$1" in "$FAIL") exit 1;; esac\n')
    fake.chmod(0o755)
    unit_file = tmp_path / "sglang-x.service"
    chain = " && ".join(placement.removal_commands("sglang-x.service", str(unit_file)))
    for fail, code in (("disable", 1), ("daemon-reload", 1), ("reset-failed", 0), ("none", 0)):
        unit_file.write_text("[Unit]\n")
        env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "FAIL": fail}
        assert subprocess.run(["sh", "-c", chain], env=env).returncode == code, fail
        assert unit_file.exists() == (fail == "disable"), fail  # the file stays when the stop failed


def run_op(units, keep, elsewhere=None):
    inventory = Inventory(([("gpu-d", {})], {}))
    State(inventory, Config())
    host = inventory.get_host("gpu-d")
    with (
        mock.patch.object(host, "get_fact", return_value=units), mock.patch.object(host, "noop") as noop, mock.patch.object(host, "log") as log,
        ctx_state.use(host.state), ctx_host.use(host),
    ):
        commands = list(placement.unplaced_removed._inner(keep=keep, elsewhere=elsewhere))
    return commands, [c.args[0] for c in noop.call_args_list], [c.args[0] for c in log.call_args_list]


def test_nothing_unplaced_is_a_noop():
    commands, noops, _ = run_op({"sglang-ddtree.service": unit()}, ["sglang-ddtree.service"])
    assert commands == [] and noops == ["no unit of an unplaced service on this host"]


def test_an_unplaced_unit_is_removed_once_ready_elsewhere():
    commands, _, logs = run_op({"sglang-dflash.service": unit()}, [], {"dflash": [placed()]})
    assert [(c.function, c.args[1:]) for c in commands] == [(placement._remove, ("/etc/systemd/system/x", "dflash", (placed(),), None))]
    assert logs == ["sglang-dflash.service: service dflash is no longer placed on this host: stop, disable and remove it once it answers /health on gpu-e"]


class FakeHost:
    def __init__(self, ok=True):
        self.name = "gpu-d"
        self.state = SimpleNamespace()  # a run of its own
        self.ok = ok
        self.commands = []
        self.timeouts = []
        self.logs = []

    def run_shell_command(self, command, print_output=False, _timeout=None):
        self.commands.append(command)
        self.timeouts.append(_timeout)
        return self.ok, SimpleNamespace(stdout="", stderr="boom")

    def log(self, text, **_):
        self.logs.append(text)

    log_styled = log


def test_remove_keeps_the_unit_when_the_new_host_is_not_ready(monkeypatch):
    monkeypatch.setattr(placement, "answers_now", lambda state, p: None)  # answering now does not replace the gate
    host = FakeHost()
    summary.rows(host.state).update({"gpu-e": {"dflash": {"state": "FAILED"}}})
    assert placement._remove(None, host, "sglang-dflash.service", "/p", "dflash", (placed(),)) is True
    assert host.commands == []
    assert host.logs[0].startswith("sglang-dflash.service KEPT running here: service dflash is placed on gpu-e but did not answer /health")
    assert summary.rows(host.state)["gpu-d"]["dflash"]["state"] == "kept"


def test_remove_stops_the_unit_once_ready_elsewhere(monkeypatch):
    asked = []
    monkeypatch.setattr(placement, "answers_now", lambda state, p: asked.append(p))
    host = FakeHost()
    summary.rows(host.state).update({"gpu-e": {"dflash": {"state": "ready"}}})
    assert placement._remove(None, host, "sglang-dflash.service", "/p", "dflash", (placed(),)) is True
    assert asked == [placed()]  # read at the moment of the decision
    assert host.commands == [
        "systemctl disable --now sglang-dflash.service && rm -f -- /p && systemctl daemon-reload"
        " && { systemctl reset-failed sglang-dflash.service 2>/dev/null || true; }"
    ]
    assert host.logs == ["sglang-dflash.service: stopped, disabled and removed (no longer placed here; it answers on gpu-e)"]
    assert summary.rows(host.state)["gpu-d"]["dflash"]["state"] == "removed"


def test_remove_of_a_service_placed_nowhere_else_needs_no_wait(monkeypatch):
    host = FakeHost()
    assert placement._remove(None, host, "sglang-tmp.service", "/p", "tmp", ()) is True
    assert host.commands == [
        "systemctl disable --now sglang-tmp.service && rm -f -- /p && systemctl daemon-reload"
        " && { systemctl reset-failed sglang-tmp.service 2>/dev/null || true; }"
    ]


def test_placements_carry_each_replicas_stop_timeout():
    configs = {"gpu-e": _config(("dflash", "127.0.0.1", 30001, 600)), "gpu-f": _config(("dflash", "127.0.0.1", 30001))}
    assert [p.stop_timeout_s for p in placement.placements(configs)["dflash"]] == [600, 60]


def test_a_removal_is_bounded_by_the_longest_drain_of_the_services_placements_and_a_margin():
    """The unit's stop waits for the engine to drain (TimeoutStopSec, from `stop_timeout_s`): the removal's own bound
    is the largest `stop_timeout_s` among the service's placements, never below the default, plus the margin (it was
    a fixed 180 s, which a drain of 600 s outlasts)."""
    margin = placement.REMOVAL_MARGIN_S
    slow = placement.Placed("gpu-e", "sglang-dflash.service", "127.0.0.1", 30001, "dflash", 600)
    quick = placement.Placed("gpu-f", "sglang-dflash.service", "127.0.0.1", 30001, "dflash", 5)
    assert placement.removal_timeout_s((slow, quick)) == 600 + margin
    assert placement.removal_timeout_s((quick,)) == 60 + margin  # a unit written with the default before
    assert placement.removal_timeout_s(()) == 60 + margin  # a service gone from the data: the default
    # The unit as the host has it says its own drain: a service gone from the data, written with 900 s.
    assert placement.removal_timeout_s((), own=900) == 900 + margin
    assert placement.removal_timeout_s((slow,), own=30) == 600 + margin
    assert 60 + margin == 180  # today's figure where nothing says more


def test_remove_waits_as_long_as_the_drain_may_take(monkeypatch):
    monkeypatch.setattr(placement, "answers_now", lambda state, p: None)
    host = FakeHost()
    summary.rows(host.state).update({"gpu-e": {"dflash": {"state": "ready"}}})
    slow = placement.Placed("gpu-e", "sglang-dflash.service", "127.0.0.1", 30001, "dflash", 900)
    assert placement._remove(None, host, "sglang-dflash.service", "/p", "dflash", (slow,)) is True
    assert host.timeouts == [900 + placement.REMOVAL_MARGIN_S]
    # A service gone from the data: its unit's own TimeoutStopSec, as the host's file says it.
    host = FakeHost()
    assert placement._remove(None, host, "sglang-gone.service", "/p", "gone", (), 1200) is True
    assert host.timeouts == [1200 + placement.REMOVAL_MARGIN_S]


def test_remove_keeps_the_unit_when_the_new_host_passed_its_gate_but_does_not_answer_now(monkeypatch):
    """A gate passed earlier in the run does not decide a stop: the new host is read again right before it."""
    monkeypatch.setattr(placement, "answers_now", lambda state, p: f"{p.unit} on {p.host} is failed, /health None now")
    host = FakeHost()
    summary.rows(host.state).update({"gpu-e": {"dflash": {"state": "ready"}}})
    assert placement._remove(None, host, "sglang-dflash.service", "/p", "dflash", (placed(),)) is True
    assert host.commands == []
    assert host.logs[0] == (
        "sglang-dflash.service KEPT running here: service dflash passed its readiness gate on gpu-e in this run but does not "
        "answer there now (sglang-dflash.service on gpu-e is failed, /health None now); run the deploy again once it is ready there"
    )
    assert summary.rows(host.state)["gpu-d"]["dflash"]["state"] == "kept"


class OtherHost:
    """A host of the run whose service_state script answers `answer` (or whose command fails)."""

    def __init__(self, answer, ok=True):
        self.answer, self.ok, self.commands = answer, ok, []

    def run_shell_command(self, command, print_output=False, _timeout=None):
        self.commands.append(command)
        return self.ok, SimpleNamespace(stdout=json.dumps(self.answer) + "\n", stderr="")


def _state(other, active=True, failed=False):
    return SimpleNamespace(
        inventory=SimpleNamespace(get_host=lambda name: other if name == "gpu-e" else None),
        activated_hosts={other} if active else set(), failed_hosts={other} if failed else set(),
    )


def test_answers_now_runs_the_service_state_script_on_the_other_host_at_the_moment_of_asking():
    other = OtherHost({"active": "active", "health": 200})
    assert placement.answers_now(_state(other), placed()) is None
    assert len(other.commands) == 1 and "sglang-dflash.service 127.0.0.1 30001" in other.commands[0]
    other.answer = {"active": "failed", "health": None}
    assert placement.answers_now(_state(other), placed()) == "sglang-dflash.service on gpu-e is failed, /health None now"
    assert len(other.commands) == 2  # asked again: no answer is kept between two decisions
    assert placement.answers_now(_state(OtherHost({}, ok=False)), placed()) == "gpu-e could not be read now"
    assert placement.answers_now(_state(other, failed=True), placed()) == "gpu-e is not in this run or has failed"
    assert placement.answers_now(_state(other, active=False), placed()) == "gpu-e is not in this run or has failed"
    # Another process answers on the port there (the read asked it nothing): no answer at all, not a working copy.
    stranger = "port 30001 is held by uid 65534 (nobody), pid 77 in /user.slice, not by sglang-dflash.service"
    other.answer = {"active": "active", "health": None, "health_error": stranger, "stranger": stranger}
    assert placement.answers_now(_state(other), placed()) == f"sglang-dflash.service on gpu-e cannot be asked now: {stranger}"


def test_a_failed_removal_fails_the_host(monkeypatch):
    assert placement._remove(None, FakeHost(ok=False), "sglang-tmp.service", "/p", "tmp", ()) is False


def test_units_fact_script_reads_the_header(tmp_path):
    (tmp_path / "sglang-a.service").write_text(HEADER + "[Unit]\n[Service]\nTimeoutStopSec=240\n")
    (tmp_path / "sglang-b.service").write_text("[Unit]\n")
    (tmp_path / "other.service").write_text(HEADER)
    proc = subprocess.run([sys.executable, "-", str(tmp_path)], input=remote.script("placement_units"), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert {name: u["managed"] for name, u in found.items()} == {"sglang-a.service": True, "sglang-b.service": False}
    # the drain each unit was written with, for its removal's bound
    assert {name: u["stop_timeout_s"] for name, u in found.items()} == {"sglang-a.service": 240, "sglang-b.service": None}


def test_a_halted_rollout_keeps_the_unplaced_replica(monkeypatch):
    """A replica of the service failed its gate in this run: the replica no longer placed may be the last one on the
    version that works, so it stays, whatever answers elsewhere."""
    monkeypatch.setattr(placement, "answers_now", lambda state, p: None)
    host = FakeHost()
    summary.rows(host.state).update({"gpu-e": {"dflash": {"state": "ready"}}})
    rollouts.of(host.state).halts.update({"dflash": rollouts.Halt("gpu-f/dflash", "exited at start")})
    assert placement._remove(None, host, "sglang-dflash@2.service", "/p", "dflash", (placed(),)) is True
    assert host.commands == []
    assert summary.rows(host.state)["gpu-d"]["dflash@2"]["state"] == "kept"
    assert "the rollout of service dflash halted in this run (gpu-f/dflash failed" in summary.rows(host.state)["gpu-d"]["dflash@2"]["ready"]


@pytest.mark.parametrize(("ready", "serves"), [(200, True), (None, True), (503, False), (0, False)])
def test_a_replica_that_answers_health_but_not_ready_does_not_serve_now(ready, serves):
    """Draining after a SIGTERM, or paused, sglang 0.5.23 still answers /health 200: /ready says it does not serve
    (None: an engine without /ready, judged by /health alone; 0: /ready did not answer)."""
    other = OtherHost({"active": "active", "health": 200, "ready": ready})
    why = placement.answers_now(_state(other), placed())
    assert (why is None) == serves, why
    if not serves:
        assert "answers /health but not /ready" in why
