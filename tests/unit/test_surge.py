"""Surge (operations/service/surge.py): the plan decides, per replica it restarts, surge on a free GPU or in place; `max_surge`
is validated with the field, the value and the fix."""

from __future__ import annotations

import hashlib

import pytest
from pyinfra.facts.files import Sha1File

from configuration import stacks
from configuration.errors import DataError
from configuration.patch_sets import load_patch_set
from operations.gpu import gpu_read, gpus
from operations.service import readiness, surge
from tests.unit.test_host_plan import converged_world, plan_of
from tests.unit.test_units import lab_config

FREE = {"active": "inactive", "sub": "dead", "health": None, "health_error": "connection refused", "stranger": None}


def lab_of(run_services=("ddtree",), **patch):
    config = lab_config(run_services=run_services, **patch)
    stack = stacks.load_stack(config.stack)
    return config, stack, {name: load_patch_set(name) for name in config.patch_sets}


def surge_world(config, stack, patch_sets, surge_port_state=FREE):
    """A converged host, and for ddtree the answer of its surge unit on the port a surge would take."""
    w = converged_world(config, stack, patch_sets)
    ddtree = config.services[0]
    w.set(readiness.ServiceState, surge_port_state, unit=surge.unit_name(ddtree.name), address=readiness.probe_address(ddtree.bind),
          port=surge.port_for(config, ddtree, set()), inputs=())
    return w


def changed_world(config, stack, patch_sets, surge_port_state=FREE):
    """`surge_world` whose ddtree unit differs (so the plan restarts it where it runs)."""
    w = surge_world(config, stack, patch_sets, surge_port_state)
    w.set(Sha1File, "0" * 40, path=config.services[0].unit_path)
    return w


def restart_of(plan, name):
    return next(c for c in plan.of_service(name) if c.action == "restart")


def test_a_free_gpu_surges_there_on_the_next_free_port(monkeypatch):
    monkeypatch.setenv("SGLANG_DEPLOY_SECRET_DDTREE_KEY", "k" * 32)
    lab = lab_of(max_surge=1)
    config = lab[0]
    ddtree = config.services[0]
    assert ddtree.gpus == (0,)  # GPU 1 of the two is free: no service placed there, no process on it
    plan = plan_of(*lab, changed_world(*lab))
    text = restart_of(plan, ddtree.name).why
    assert f"surge on GPU 1 (port {ddtree.port + 1}, sglang-ddtree.surge.service)" in text, text
    assert plan.values[("surge", ddtree.name)] == surge.Surge(ddtree.name, (1,), ddtree.port + 1)


def test_no_free_gpu_rolls_in_place_and_says_why(monkeypatch):
    lab = lab_of(run_services=("ddtree", "dflash"), max_surge=1)  # dflash takes GPU 1
    plan = plan_of(*lab, changed_world(*lab))
    text = restart_of(plan, "ddtree").why
    assert "in place (no free GPU: 0 free GPU(s) beside its own, it needs 1 (GPU 1 is given to service dflash" in text, text
    assert ("surge", "ddtree") not in plan.values


def test_max_surge_0_rolls_in_place_and_the_restart_reads_as_before():
    lab = lab_of()  # the default: max_surge 0
    plan = plan_of(*lab, changed_world(*lab))
    assert restart_of(plan, "ddtree").why == "what it loads changes in this run"
    assert ("surge", "ddtree") not in plan.values
    assert surge.decide(lab[0].services[0], True, (1,), "", 30001, None) == surge.Decision(None, "max_surge 0")


def test_a_busy_surge_port_rolls_in_place():
    lab = lab_of(max_surge=1)
    busy = {**FREE, "stranger": "port 30001 answered from pid 77, not a process of sglang-ddtree.surge.service"}
    plan = plan_of(*lab, changed_world(*lab, surge_port_state=busy))
    assert "in place (port 30001 is not free: another process answers there (port 30001 answered from pid 77" in \
        restart_of(plan, "ddtree").why
    assert ("surge", "ddtree") not in plan.values


def test_a_converged_surge_service_plans_nothing():
    lab = lab_of(max_surge=1)
    plan = plan_of(*lab, surge_world(*lab))
    assert plan.converged and plan.changes == [] and plan.unread == [], plan
    assert not [k for k in plan.values if k[0].startswith("surge")]


def test_a_surge_an_earlier_run_left_running_is_removed_and_this_run_rolls_in_place():
    lab = lab_of(max_surge=1)
    left = {**FREE, "active": "active", "sub": "running", "health": 200}
    converged = plan_of(*lab, surge_world(*lab, surge_port_state=left))
    assert [(c.what, c.action) for c in converged.changes] == [("sglang-ddtree.surge.service", "delete")], converged.changes
    assert "an earlier run left it active" in converged.changes[0].why
    assert converged.values[("surge left", "ddtree")] == surge.Surge("ddtree", (), 30001)
    changed = plan_of(*lab, changed_world(*lab, surge_port_state=left))
    assert "in place (sglang-ddtree.surge.service, left by an earlier run, is there" in restart_of(changed, "ddtree").why
    assert ("surge", "ddtree") not in changed.values


def test_a_stopped_surge_unit_an_earlier_run_left_is_removed_too():
    # Its file in /run/systemd/system, the unit stopped (a run killed after it stopped the surge, before it removed
    # the file): it names a GPU and a port no placement owns, and the next surge's unit name. Seen kept for ever.
    lab = lab_of(max_surge=1)
    stopped = {**FREE, "load": "loaded"}
    plan = plan_of(*lab, surge_world(*lab, surge_port_state=stopped))
    assert [(c.what, c.action) for c in plan.changes] == [("sglang-ddtree.surge.service", "delete")], plan.changes
    assert "an earlier run left it inactive" in plan.changes[0].why
    # No file: nothing left (FREE has no load state; systemd says not-found).
    assert plan_of(*lab, surge_world(*lab, surge_port_state={**FREE, "load": "not-found"})).changes == []


def test_the_gpu_check_rule_decides_which_gpu_is_free():
    config = lab_config(run_services=("ddtree",), max_surge=1)
    ddtree = config.services[0]
    three = gpu_read.GpuFacts("/usr/bin/nvidia-smi", None, "580", "13.0",
                          tuple(gpu_read.Gpu(i, f"GPU-{i}", "G", "12.0", 97887, 0, f"00000000:{i}:00.0",
                                         ("the table shows ERR!",) if i == 1 else ()) for i in range(3)),
                          (), (gpu_read.App(4242, "GPU-2", 1000),))
    decisions = gpus.GpuDecisions(config, facts=three)
    found, why = gpus.surge_gpus(decisions, ddtree, {})
    assert found == () and "GPU 1 is unhealthy" in why and "GPU 2 is in use by pid 4242" in why, why
    healthy = gpu_read.GpuFacts("/usr/bin/nvidia-smi", None, "580", "13.0", three.gpus[:1] + (three.gpus[2],), (), ())
    assert gpus.surge_gpus(gpus.GpuDecisions(config, facts=healthy), ddtree, {}) == ((2,), "")
    # one surge per free GPU in a run
    found, why = gpus.surge_gpus(gpus.GpuDecisions(config, facts=healthy), ddtree, {2: "the surge of other"})
    assert found == () and "GPU 2 is given to service the surge of other" in why
    failed = lab_config(run_services=("ddtree",), max_surge=1)
    assert gpus.surge_gpus(gpus.GpuDecisions(failed, facts=None), ddtree, {}) == ((), "the host's GPUs were not read")


def test_the_surge_unit_differs_from_the_replicas_only_in_gpu_and_port():
    lab = lab_of(max_surge=1)
    config, stack, patch_sets = lab
    ddtree = config.services[0]
    from operations.service.service_inputs import unit_text
    own = unit_text(config, ddtree, stack, patch_sets, ())
    planned = surge.Surge(ddtree.name, (1,), ddtree.port + 1)
    beside = unit_text(config, surge.surge_service(ddtree, planned), stack, patch_sets, ())
    changed = [(a, b) for a, b in zip(own.splitlines(), beside.splitlines()) if a != b]
    assert len(own.splitlines()) == len(beside.splitlines())
    assert all(str(ddtree.port) in a and str(ddtree.port + 1) in b or ("GPU 0" in a or "VISIBLE_DEVICES=0" in a)
               for a, b in changed), changed
    assert hashlib.sha1(own.encode()).hexdigest() != hashlib.sha1(beside.encode()).hexdigest()


@pytest.mark.parametrize("value", [2, -1, "1", True, 0.5])
def test_a_bad_max_surge_names_the_field_the_value_and_the_fix(value):
    with pytest.raises(DataError) as caught:
        lab_config(max_surge=value)
    text = str(caught.value)
    assert f"services.ddtree.max_surge: {value!r}: must be 0 (a rollout restarts the replica in place) or 1" in text, text


def test_a_free_gpu_too_small_for_the_models_is_no_place_to_surge():
    config = lab_config(run_services=("ddtree",), max_surge=1)
    ddtree = config.services[0]
    sizes = {m.store_path: 4 * 1024 * 1024 for m in ddtree.models}
    listed = (gpu_read.Gpu(0, "GPU-0", "G", "12.0", 97887, 0, "00000000:0:00.0"), gpu_read.Gpu(1, "GPU-1", "G", "12.0", 4, 0, "00000000:1:00.0"))
    small = gpu_read.GpuFacts("/usr/bin/nvidia-smi", None, "580", "13.0", listed, (), (), {}, sizes)
    found, why = gpus.surge_gpus(gpus.GpuDecisions(config, facts=small), ddtree, {})
    assert found == () and why.startswith("GPU 1 is free but too small: models need"), why


def test_the_replicas_restart_asks_its_hold_as_the_surge_left_it():
    asked = []

    def hold(restarting=False):
        asked.append(restarting)
        return None

    outcome = surge.Outcome()
    ask = outcome.held(hold)
    assert ask(restarting=True) is None and asked == [True]  # no surge served (yet): counted as going down
    outcome.serving = True
    assert ask(restarting=True) is None and asked == [True, False]  # the surge serves: it takes no replica away
    outcome.failed = "its surge on GPU 1, port 30101 failed its gate: exit 1"
    assert ask(restarting=True).startswith("its surge failed its gate: its surge on GPU 1") and asked == [True, False]
