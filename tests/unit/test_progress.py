"""Progress of a long phase (issue 50 item 2): the line each tick prints, per kind of reader, and the watcher's start and
stop on pyinfra's operation callbacks (a tick runs its reader on the host, here a stand-in host)."""

from __future__ import annotations

import gevent
import pytest

from configuration import redaction
from operations.run import progress
from operations.run.progress import Reader, Watch, progress_line


def test_time_so_far_only():
    assert progress_line(Watch("checking flags"), 12.4, None, None) == ("checking flags: 12 s so far", None)
    assert progress_line(Watch("checking flags"), 125, "", None)[0] == "checking flags: 2m05s so far"


def test_bytes_with_their_rate_from_the_previous_tick():
    what = Watch("building generation g1", Reader("du", "bytes"))
    first, seen = progress_line(what, 10, "104857600\n", None)
    assert first == "building generation g1: 10 s so far, 100.0 MiB written" and seen == (10, 104857600)
    second, _ = progress_line(what, 20, "209715200", seen)
    assert second == "building generation g1: 20 s so far, 200.0 MiB written, 10.0 MiB/s"


def test_the_stage_scripts_own_line():
    line, _ = progress_line(Watch("staging m", Reader("tail", "line")), 30, "staging m: 1.00 GiB of 2.00 GiB (50%), ETA 30 s\n", None)
    assert line == "staging m: 30 s so far; staging m: 1.00 GiB of 2.00 GiB (50%), ETA 30 s"


def test_the_engines_line_is_redacted_and_cut_to_one_short_line():
    redaction.register("progress-key", "sk-progress-0123456789abcdef")
    out = "INFO server_args=ServerArgs(api_key='sk-progress-0123456789abcdef', hf_token='hf_x1234567', x=" + "y" * 400 + ")\x1b[2J"
    line, _ = progress_line(Watch("sglang-a.service starting", Reader("journal", "engine")), 40, out, None)
    assert "sk-progress" not in line and "hf_x1234567" not in line
    assert line.startswith("sglang-a.service starting: 40 s so far; the engine's latest line: INFO server_args=")
    assert "\x1b" not in line and len(line) < 300


class FakeHost:
    name = "h"
    print_prefix = "[h] "

    def __init__(self):
        self.logged, self.asked = [], []

    def run_shell_command(self, command, **kwargs):
        self.asked.append(command)

        class Out:
            stdout = "4096\n"
        return True, Out()

    def log(self, message, log_func=None):
        self.logged.append(message)


class Meta:
    def __init__(self):
        self.operation_meta = object()


class State:
    is_executing = True

    def __init__(self, host, meta):
        self.ops = {host: {"op1": meta}}


@pytest.mark.parametrize("outcome", ["operation_host_success", "operation_host_error"])
def test_a_watched_operation_ticks_while_it_runs_and_stops_when_it_ends(monkeypatch, outcome):
    monkeypatch.setattr(progress, "EVERY_S", 0.01)
    host, data = FakeHost(), Meta()
    watcher = progress.Watcher()
    watcher.watches[id(data.operation_meta)] = (data.operation_meta, Watch("building g1", Reader("du -sb /g1", "bytes")))
    state = State(host, data)
    watcher.operation_host_start(state, host, "op1")
    gevent.sleep(0.05)
    getattr(watcher, outcome)(state, host, "op1")
    ticks = len(host.logged)
    gevent.sleep(0.05)
    assert ticks >= 2 and len(host.logged) == ticks, host.logged  # stopped with its operation
    assert host.asked[0] == "du -sb /g1" and host.logged[0].startswith("building g1: 0 s so far, 4.0 KiB written")


def test_an_operation_not_watched_or_a_dry_run_starts_nothing(monkeypatch):
    monkeypatch.setattr(progress, "EVERY_S", 0.01)
    host, data = FakeHost(), Meta()
    watcher = progress.Watcher()
    watcher.operation_host_start(State(host, data), host, "op1")
    watcher.watches[id(data.operation_meta)] = (data.operation_meta, Watch("x"))
    dry = State(host, data)
    dry.is_executing = False
    watcher.operation_host_start(dry, host, "op1")
    gevent.sleep(0.05)
    assert host.logged == [] and watcher.running == {}
