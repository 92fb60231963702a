"""A speculative service proves at its gate that it decodes its target's own tokens and accepts enough (issue 45).

On the lab's spare host, one DFLASH service through three changes: correct (it passes, and the run says what it
proved); its stand-in told to leave the target's choice at token 5 (`STANDIN_SPEC_DIVERGE_AT`: the gate fails, the
change is rolled back, the last working version serves again); told to accept about one token per step
(`STANDIN_ACCEPT_LENGTH`: refused the same way). Each refusal is the gate's own: with the check removed both
changes would pass (tests/unit/test_speculative_gate.py holds the check itself).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.lab.labutil import (
    PYINFRA,
    ROOT,
    SPARE,
    clean_host,
    deploy,
    http_get,
    lab_hosts,
    ssh,
    write_inventory,
)

pytestmark = pytest.mark.lab

PORT = 30140


def inventory(env: dict):
    service = {"spec": {"gpu": 0, "port": PORT, "model": "Qwen3.6-27B", "model_in": "store",
                        "draft_model": "Qwen3.6-27B-DFlash", "draft_in": "store",
                        "args": {"speculative-algorithm": "DFLASH", "speculative-dflash-block-size": 16},
                        "env": env}}
    return write_inventory("test_speculative_gate", {SPARE: {"services": service, "run_services": ["spec"]}})


def environment() -> str:
    return ssh(SPARE, "systemctl show sglang-spec.service -p Environment --value").stdout


def status_view(inventory_path, tmp_path) -> dict:
    env = {**os.environ, "STATUS_JSON": str(tmp_path / "status.json"), "STATUS_PROM": str(tmp_path / "sglang.prom")}
    subprocess.run([PYINFRA, str(inventory_path), "status.py", "-y"], cwd=ROOT, capture_output=True, text=True,
                   timeout=300, env=env)
    return {**json.loads((tmp_path / "status.json").read_text()), "prom": (tmp_path / "sglang.prom").read_text()}


def test_a_wrong_or_slow_speculative_service_fails_its_gate_and_the_last_good_one_serves(spare_with_venv, tmp_path):
    result = deploy(inventory({"SGLANG_TEST_MARK": "good"}), as_json=False)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "its target's own tokens over 256 tokens of 4 probes (0 near-ties); accept length 2." in out, out[-4000:]
    # The status view shows what the gate read of the running process (its JSON and Prometheus output too).
    shown = status_view(inventory({"SGLANG_TEST_MARK": "good"}), tmp_path)
    assert shown["rows"][0]["gate"]["accept_length"] == pytest.approx(2.0), shown
    assert 'sglang_deploy_service_accept_length{host="%s",service="spec",port="%d"} 2.0000' % (SPARE, PORT) in shown["prom"]

    wrong = deploy(inventory({"SGLANG_TEST_MARK": "good", "STANDIN_SPEC_DIVERGE_AT": "5"}), as_json=False)
    said = wrong.stdout + wrong.stderr
    assert wrong.returncode != 0
    assert "does not decode what its target would: probe 1 'The capital of France is', output token 5" in said, said[-4000:]
    assert "ROLLED BACK" in said and "the restored service is ready" in said, said[-4000:]
    assert "STANDIN_SPEC_DIVERGE_AT" not in environment() and http_get(SPARE, PORT, "/health")[0] == 200

    slow = deploy(inventory({"SGLANG_TEST_MARK": "good", "STANDIN_ACCEPT_LENGTH": "1.0"}), as_json=False)
    said = slow.stdout + slow.stderr
    assert slow.returncode != 0
    assert "accepts 1.02 tokens per verify step over its probes" in said and "below its min_accept_length 1.5" in said, said[-4000:]
    assert "ROLLED BACK" in said and "STANDIN_ACCEPT_LENGTH" not in environment()


CANARY_HOSTS = ("gpu-b", "gpu-c")


def replicated(name: str, env: dict):
    service = {"gpu": 0, "port": PORT + 1, "model": "Qwen3.6-27B", "model_in": "store",
               "draft_model": "Qwen3.6-27B-DFlash", "draft_in": "store", "canary": 1,
               "args": {"speculative-algorithm": "DFLASH", "speculative-dflash-block-size": 16}, "env": env}
    return write_inventory(f"test_speculative_canary_{name}", {h: {"services": {"spec": service}, "run_services": ["spec"]}
                                                               for h in CANARY_HOSTS})


@pytest.fixture
def two_replicas():
    assert set(CANARY_HOSTS) <= set(lab_hosts())
    for host in CANARY_HOSTS:
        clean_host(host, keep_venv=True)
    yield
    for host in CANARY_HOSTS:
        clean_host(host, keep_venv=True)


def test_a_canary_is_compared_with_a_replica_still_on_the_old_version(two_replicas):
    """gpu-b's replica is the canary, gpu-c's is still on the old version while it is gated: a change that keeps
    acceptance passes, with both figures side by side; one that lowers it (still above `min_accept_length`) halts the
    rollout and rolls the canary back, and gpu-c keeps the old version."""
    base = deploy(replicated("base", {"SGLANG_TEST_MARK": "1"}))
    assert base.returncode == 0, base

    same = deploy(replicated("same", {"SGLANG_TEST_MARK": "2"}), as_json=False)
    said = same.stdout + same.stderr
    assert same.returncode == 0, said[-4000:]
    assert "spec: canary against gpu-c/spec (old version): accept 2.00 (old 2.00)" in said, said[-4000:]
    assert "greedy output equal on 4 of 4 probes" in said

    worse = deploy(replicated("worse", {"SGLANG_TEST_MARK": "2", "STANDIN_ACCEPT_LENGTH": "1.6"}), as_json=False)
    said = worse.stdout + worse.stderr
    assert worse.returncode != 0
    assert "the canary regressed against gpu-c/spec, still on the old version: it accepts 1." in said, said[-4000:]
    assert "against the old version's 2.00 (more than 10% lower)" in said and "ROLLED BACK" in said, said[-4000:]
    for host in CANARY_HOSTS:  # the canary rolled back, the other never restarted
        env = ssh(host, "systemctl show sglang-spec.service -p Environment --value").stdout
        assert "STANDIN_ACCEPT_LENGTH" not in env and "SGLANG_TEST_MARK=2" in env
