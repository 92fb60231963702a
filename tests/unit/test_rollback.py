"""Rollback decisions with a scripted host: what is restored, in which order, and what the run says."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from operations.service import readiness, rollback, rollout
from report import summary
from tests.unit.test_operations import run

UNIT = "sglang-x.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"


class ScriptedHost:
    """Answers run_shell_command from a list of (ok, stdout) in order; records commands and log lines."""

    name = "gpu-a"

    def __init__(self, answers):
        self.answers = list(answers)
        self.commands, self.lines, self.timeouts = [], [], []

    def run_shell_command(self, command, print_output=False, _timeout=None):
        self.commands.append(command)
        self.timeouts.append(_timeout)
        ok, stdout = self.answers.pop(0) if self.answers else (True, "")
        return ok, SimpleNamespace(stdout=stdout, stderr="" if ok else "boom")

    def log(self, text, log_func=None):
        self.lines.append(text)

    def log_styled(self, text, fg=None, log_func=None):
        self.lines.append(text)


def plan(unit_changed=True, switched=("/root/venv_sglang",)):
    return rollback.Restorable(UNIT_PATH, UNIT, lambda: unit_changed, [(p, (lambda: True)) for p in switched] + [("/root/other", lambda: False)])


@pytest.mark.parametrize(("stop_timeout_s", "restart_bound"), [(60, 300), (600, 720)])
def test_the_rollbacks_restart_waits_out_the_units_drain(stop_timeout_s, restart_bound):
    """The restart first stops the failed change, which drains up to its `stop_timeout_s`: its bound follows."""
    host = ScriptedHost([])
    restorable = rollback.Restorable(UNIT_PATH, UNIT, lambda: True, [], stop_timeout_s=stop_timeout_s)
    assert rollback.undo(host, restorable) == ([f"unit {UNIT} (the previous one)"], None)
    assert host.commands[-1] == f"systemctl restart {UNIT}"
    assert host.timeouts == [rollback.STEP_TIMEOUT_S, restart_bound]


def waited(ok, reason="", ready_s=3.0):
    body = {"ok": ok, "reason": reason, "journal": "last words" if not ok else "", "ready_s": ready_s, "reply": "hi"}
    return (True, json.dumps(body))


@pytest.fixture(autouse=True)
def report(monkeypatch):
    """The summary rows of a run of this test's own: every ScriptedHost is a host of it."""
    monkeypatch.setattr(ScriptedHost, "state", SimpleNamespace(), raising=False)
    return summary.rows(ScriptedHost.state)


def test_undo_restores_the_saved_unit_then_switches_back_the_venvs_this_run_switched_then_restarts():
    host = ScriptedHost([])
    done, error = rollback.undo(host, plan())
    assert error is None
    assert done == [f"unit {UNIT} (the previous one)", "venv /root/venv_sglang (the previous generation)"]
    restore, switch, restart = host.commands
    assert restore == f"test -f {rollback.BACKUP_DIR}/{UNIT} && cp -p {rollback.BACKUP_DIR}/{UNIT} {UNIT_PATH} && systemctl daemon-reload"
    assert switch.startswith("(cd / && exec python3 -I - /root/venv_sglang --previous <<'PYEOF'")
    assert restart == f"systemctl restart {UNIT}"


def test_undo_with_nothing_this_run_changed_does_nothing_and_says_why():
    host = ScriptedHost([])
    done, error = rollback.undo(host, plan(unit_changed=False, switched=()))
    assert done == [] and host.commands == []
    assert "nothing this run changed can be rolled back" in error


def test_undo_stops_at_a_failed_step_and_names_it():
    host = ScriptedHost([(False, "")])
    done, error = rollback.undo(host, plan())
    assert error.startswith("rollback step failed: test -f ") and "boom" in error
    assert len(host.commands) == 1  # no restart of a half-restored service


def test_failed_readiness_rolls_back_and_confirms_the_restored_service(report):
    host = ScriptedHost([waited(False, "sglang-x.service is failed/failed"), (True, ""), (True, ""), (True, ""), waited(True)])
    ok = readiness._wait(None, host, UNIT, "x", "http://127.0.0.1:30000", "127.0.0.1", 30000, 60, True, "-", plan())
    assert ok is False  # the host still fails: the change did not work
    said = "\n".join(host.lines)
    assert "x: NOT READY: sglang-x.service is failed/failed" in said and "last words" in said
    assert (
        f"x: ROLLED BACK unit {UNIT} (the previous one), venv /root/venv_sglang (the previous generation) because the "
        "change failed readiness (sglang-x.service is failed/failed); the restored service is ready"
    ) in said
    assert report["gpu-a"]["x"]["state"] == "ROLLED BACK"


def test_restored_service_that_is_not_ready_either_is_reported_failed(report):
    host = ScriptedHost([waited(False, "timeout"), (True, ""), (True, ""), (True, ""), waited(False, "still dead")])
    readiness._wait(None, host, UNIT, "x", "e", "127.0.0.1", 30000, 60, True, "-", plan())
    assert "the restored service is NOT ready either: still dead" in "\n".join(host.lines)
    assert report["gpu-a"]["x"]["state"] == "FAILED"


def test_without_a_plan_a_failed_gate_only_fails(report):
    host = ScriptedHost([waited(False, "timeout")])
    assert readiness._wait(None, host, UNIT, "x", "e", "127.0.0.1", 30000, 60, True, "-", None) is False
    assert len(host.commands) == 1 and report["gpu-a"]["x"]["state"] == "FAILED"


def test_the_unit_in_use_is_saved_only_when_it_is_about_to_change():
    """The preflight, which already reads the unit's sha1, saves the unit in use once the new one passed."""
    import hashlib

    from pyinfra.facts.files import Sha1File

    from operations.service import preflight

    text = "[Unit]\n"
    args = dict(service="x", venv_path="/root/venv_sglang", launcher="sglang.launch_server", argv=["--port", "30000"],
                environment={}, endpoint="e", unit_path=UNIT_PATH, unit_text=text)

    def saves(result):
        return [c for c in result.commands if isinstance(c, str)]

    same = run(preflight.passed, {Sha1File: hashlib.sha1(text.encode()).hexdigest()}, **args)
    assert same.commands == []
    new = run(preflight.passed, {Sha1File: None}, **args)
    assert saves(new) == []  # a new service: nothing in use to save
    changed = run(preflight.passed, {Sha1File: "0" * 40}, **args)
    call, save = changed.commands
    assert call == ("call", "_run")  # the preflight itself, before the save
    assert f"cp -p {UNIT_PATH} {rollback.BACKUP_DIR}/{UNIT}.tmp && mv -f" in save


@pytest.fixture
def halts(report):
    from report import rollouts

    return rollouts.of(ScriptedHost.state).halts


def test_a_failed_gate_halts_its_services_rollout_and_fails_its_host_after_the_waves(report, halts, monkeypatch):
    from report import rollouts

    host = ScriptedHost([waited(False, "exited at start"), (True, ""), (True, ""), (True, ""), waited(True)])
    # The gate's operation goes on (the wave's other gates on this host still run) ...
    assert readiness._gate(None, host, UNIT, "x@2", "e", "127.0.0.1", 30000, 60, True, "-", plan(), rollout="x") is True
    assert halts["x"].replica == "gpu-a/x@2" and halts["x"].reason == "exited at start"
    # ... and the host fails once its waves are done.
    assert rollouts.of(host.state).failed_gates == {"gpu-a": ["x@2: exited at start"]}
    assert rollout._failed_gates(None, host) is False and "readiness gates failed on this host: x@2: exited at start" in host.lines


def test_a_canary_that_stops_serving_in_its_soak_fails_and_halts(report, halts, monkeypatch):
    slept = []
    monkeypatch.setattr(readiness.gevent, "sleep", slept.append)
    host = ScriptedHost([waited(True), waited(False, "/health 503"), (True, ""), (True, ""), (True, ""), waited(True)])
    assert readiness._wait(None, host, UNIT, "x", "e", "127.0.0.1", 30000, 60, True, "-", plan(), rollout="x", soak_s=120) is False
    assert slept == [120]
    assert "failed 120 s later, in the canary's soak: /health 503" in halts["x"].reason
    assert report["gpu-a"]["x"]["state"] == "ROLLED BACK"


def test_a_canary_still_serving_after_its_soak_passes(report, halts, monkeypatch):
    monkeypatch.setattr(readiness.gevent, "sleep", lambda s: None)
    host = ScriptedHost([waited(True, ready_s=4.0), waited(True, ready_s=0.1)])
    assert readiness._wait(None, host, UNIT, "x", "e", "127.0.0.1", 30000, 60, True, "-", plan(), rollout="x", soak_s=60) is True
    assert halts == {} and report["gpu-a"]["x"]["ready"] == "4.0 s after (re)start"


@pytest.mark.parametrize("by", ["/ready", "/health"])
def test_the_gate_says_which_endpoint_proved_readiness(report, halts, monkeypatch, by):
    """`ready_by` from the host's gate: /ready on sglang 0.5.23, /health on an engine without it; the deploy's log
    line and its summary row say it, after the canary's soak too."""
    monkeypatch.setattr(readiness.gevent, "sleep", lambda s: None)
    body = {"ok": True, "ready_s": 4.0, "ready_by": by, "reply": "hi"}
    host = ScriptedHost([(True, json.dumps(body)), waited(True, ready_s=0.1)])
    assert readiness._wait(None, host, UNIT, "x", "e", "127.0.0.1", 30000, 60, True, "-", plan(), rollout="x", soak_s=60) is True
    assert report["gpu-a"]["x"]["ready"] == f"4.0 s after (re)start (by {by})"
    assert f"x: ready in 4.0 s on e (by {by}), smoke reply 'hi'" in host.lines


def test_a_gate_that_ends_without_a_verdict_halts_its_rollout(report, halts, monkeypatch):
    from report import rollouts

    class Dropped(ScriptedHost):
        def run_shell_command(self, command, print_output=False, _timeout=None):
            raise TimeoutError("the connection to gpu-a timed out")

    with pytest.raises(TimeoutError):
        readiness._gate(None, Dropped([]), UNIT, "x@2", "e", "127.0.0.1", 30000, 60, True, "-", plan(), rollout="x")
    # No later wave restarts another replica of x, and the host fails after its waves.
    assert halts["x"].replica == "gpu-a/x@2"
    assert halts["x"].reason == "its readiness gate ended without a verdict (TimeoutError: the connection to gpu-a timed out)"
    assert rollouts.of(ScriptedHost.state).failed_gates["gpu-a"] == [f"x@2: {halts['x'].reason}"]
