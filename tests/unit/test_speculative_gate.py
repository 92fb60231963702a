"""A speculative service's gate (operations/service/on_host/wait_ready.py, issue 45): its greedy tokens are its target's, its
acceptance at least its floor.

The gate's functions are loaded from the script as the host runs it; its requests go to the lab's stand-in's own
`/generate` (lab/standin/sglang_standin/bench_endpoints.py), called in-process, whose "target" is a deterministic
function of the prefix and which departs from it where told (`STANDIN_SPEC_DIVERGE_AT`). The same pair runs end to
end on the lab (tests/lab/test_speculative_gate.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from operations.service import readiness
from tests.unit.remote_calls import load_remote_module

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab" / "standin"))
from sglang_standin import bench_endpoints  # noqa: E402

DDTREE = {"speculative_algorithm": "DDTREE", "speculative_dflash_block_size": 16, "speculative_ddtree_budget": 22}


class Died(Exception):
    pass


class Handler:
    """What bench_endpoints.generate needs of launch_server's request handler."""

    def __init__(self, args):
        self.state = type("State", (), {"args": args, "ready": lambda self: True})()
        self.answer = None

    def _json(self, code, obj):
        assert code == 200
        self.answer = obj


@pytest.fixture
def gate(monkeypatch):
    """wait_ready's functions, asking an in-process stand-in that serves DDTREE."""
    monkeypatch.setenv("STANDIN_STEP_S", "0")
    module = load_remote_module("wait_ready")
    module.unit = "sglang-x.service"

    def generate(payload):
        handler = Handler(DDTREE)
        bench_endpoints.generate(handler, payload)
        return handler.answer

    def die(reason):
        raise Died(reason)

    monkeypatch.setattr(module, "generate", generate, raising=False)
    module.generate = generate
    module.die = die
    module.served_model = lambda: "/dev/shm/Qwen3.6-27B"
    return module


def spec(**changes):
    base = {"prompts": list(readiness.PROBES), "tokens": 32, "near_tie": readiness.NEAR_TIE_NATS, "lossless": True,
            "min_accept": 1.5}
    return {**base, **changes}


def test_a_service_that_decodes_its_targets_tokens_passes_with_its_acceptance(gate):
    figures = gate.speculative_check(spec())
    assert figures["checked_tokens"] == 32 * 4 and figures["probes"] == 4 and figures["near_ties"] == 0
    assert figures["accept_length"] == pytest.approx(32 / 11)  # the stand-in's tree: 3 per step after the first
    assert figures["accept_source"] == "meta_info: completion_tokens / spec_verify_ct"


@pytest.mark.parametrize("at", [0, 5, 31])
def test_a_service_whose_tokens_leave_its_targets_fails_naming_where(gate, monkeypatch, at):
    monkeypatch.setenv("STANDIN_SPEC_DIVERGE_AT", str(at))
    with pytest.raises(Died) as died:
        gate.speculative_check(spec())
    said = str(died.value)
    assert "does not decode what its target would: probe 1 'The capital of France is'" in said
    assert f"output token {at}: served id " in said and "by 3.000 nats" in said, said


def test_the_check_reaches_past_the_prompt_it_was_asked(gate, monkeypatch):
    """A departure beyond the tokens checked passes: the check proves what it decoded, no more."""
    monkeypatch.setenv("STANDIN_SPEC_DIVERGE_AT", "40")
    assert gate.speculative_check(spec(tokens=32))["checked_tokens"] == 128


def test_an_acceptance_below_the_floor_fails_and_says_where_it_read_it(gate, monkeypatch):
    monkeypatch.setenv("STANDIN_ACCEPT_LENGTH", "1.0")
    with pytest.raises(Died) as died:
        gate.speculative_check(spec())
    assert "accepts 1.03 tokens per verify step" in str(died.value) and "below its min_accept_length 1.5" in str(died.value)
    assert gate.speculative_check(spec(min_accept=0))["accept_length"] == pytest.approx(32 / 31)  # the prefill's token counts


def test_without_the_lossless_check_only_acceptance_is_read(gate, monkeypatch):
    monkeypatch.setenv("STANDIN_SPEC_DIVERGE_AT", "3")
    figures = gate.speculative_check(spec(lossless=False))
    assert figures["lossless"] is False and figures["checked_tokens"] == 0


# The near-tie rule, on its own ---------------------------------------------------------------------------------------


def tops(*pairs):
    return [[[a, ida, f"t{ida}"], [b, idb, f"t{idb}"]] for (a, ida), (b, idb) in pairs]


def test_the_near_tie_rule(gate):
    clear = ((-0.1, 7), (-2.0, 8))
    tie = ((-0.50, 7), (-0.55, 8))
    rule = gate.first_departure
    assert rule([7, 7], tops(clear, clear), 0.1) == (None, 0)
    assert rule([7, 8], tops(clear, tie), 0.1) == (None, 1)  # a flip at a near-tie does not count
    assert rule([7, 9], tops(clear, tie), 0.1)[0][:3] == (1, 9, 7)  # neither of the two: it does
    assert rule([8, 7], tops(clear, clear), 0.1)[0][:4] == (0, 8, 7, pytest.approx(1.9))


def test_an_engine_that_cannot_rescore_says_so(gate):
    def no_logprobs(payload):
        return {"output_ids": [1, 2], "meta_info": {"spec_verify_ct": 1, "completion_tokens": 2}}

    gate.generate = no_logprobs
    with pytest.raises(Died) as died:
        gate.speculative_check(spec())
    assert "cannot be checked against its target" in str(died.value) and "lossless_check: false" in str(died.value)


def test_acceptance_from_either_field_the_engine_gives(gate):
    assert gate.acceptance([{"spec_verify_ct": 4, "completion_tokens": 12}])[0] == 3.0
    assert gate.acceptance([{"spec_accept_length": 2.5}, {"spec_accept_length": 3.5}]) == (3.0, "meta_info: spec_accept_length")
    assert gate.acceptance([{}])[0] is None


def test_which_services_the_gate_checks():
    class Service:
        lossless_tokens, lossless_check, min_accept_length = 64, True, 1.5
        canary_accept_drop, canary_slowdown = 0.1, 0.25

        def __init__(self, algorithm):
            self.speculative_algorithm = algorithm

    assert readiness.speculative_check(Service(None)) is None
    assert readiness.speculative_check(Service("DDTREE"))["algorithm"] == "DDTREE"
    off = Service("DFLASH")
    off.lossless_check, off.min_accept_length = False, 0
    assert readiness.speculative_check(off) is None  # both checks off: nothing to ask beyond serving
    off.min_accept_length = 1.2
    assert readiness.speculative_check(off)["lossless"] is False


# A canary against a replica still on the old version (issue 45 item 3) -------------------------------------------


OLD = {"model_path": "/dev/shm/Qwen3.6-27B", "outputs": ["a1", "b2", "c3", "a1"], "accept_length": 3.0,
       "decode_tok_s": 200.0}


@pytest.mark.parametrize("new, said", [
    ({**OLD, "outputs": ["a1", "XX", "c3", "a1"]}, "its greedy output differs from the old version's on probe(s) 2"),
    ({**OLD, "accept_length": 2.6}, "it accepts 2.60 tokens per verify step against the old version's 3.00"),
    ({**OLD, "decode_tok_s": 140.0}, "it decodes 140.0 tokens/s on one request against the old version's 200.0"),
])
def test_a_canary_worse_than_the_old_version_is_a_regression(new, said):
    assert said in readiness.canary_regression(new, OLD, 0.1, 0.25)


@pytest.mark.parametrize("new", [
    OLD,
    {**OLD, "accept_length": 2.75, "decode_tok_s": 151.0},  # within the margins
    {**OLD, "model_path": "/dev/shm/Qwen3.7-27B", "outputs": ["z"] * 4},  # another model: other tokens are expected
    {**OLD, "accept_length": None},  # an engine that reports none: nothing to compare
])
def test_a_canary_within_its_margins_or_on_another_model_passes(new):
    assert readiness.canary_regression(new, OLD, 0.1, 0.25) is None


def test_the_canarys_baseline_is_a_replica_of_a_later_wave():
    from operations.service import rollout

    class Config:
        def __init__(self, *services):
            self.services = services

    class Svc:
        def __init__(self, name):
            self.name, self.definition, self.canary, self.max_unavailable = name, "spec", 1, 1

    a, b, c = Svc("spec"), Svc("spec"), Svc("spec")
    configs = {"gpu-a": Config(a), "gpu-b": Config(b), "gpu-c": Config(c)}
    plan = rollout.fleet(configs)["spec"]
    assert [str(r) for r in plan.canaries] == ["gpu-a/spec"]
    assert rollout.old_replica(plan, configs) == ("gpu-b", b)
    no_canary = rollout.Rollout(plan.service, plan.waves)
    a.canary = 0
    assert rollout.old_replica(no_canary, configs) is None
