"""The host's plan as data (deploys/plan.py: each step's `plan`): facts in, changes out, no host.

A converged read of a lab host is built from the same functions the deploy writes with (the unit's text, the
key file's digest, the boot unit's files, the generation's id); each case changes one answer, the way a drifted
host would answer, and the plan must name that step and action, and nothing else where nothing else changed.
"""

from __future__ import annotations

import copy
import hashlib

import pytest
from pyinfra.facts.files import Directory, File, FileContents, Sha1File
from pyinfra.facts.server import Groups

from configuration import settings
from configuration.host_paths import SECRETS_DIR
from configuration.secrets import config_path
from deploys.plan import plan_host
from operations.environment import patches, venv_read
from operations.gpu import fit, gpus
from operations.model import models, transfer
from operations.run.plan import Change, HostPlan
from operations.service import (
    kernel_cache,
    placement,
    readiness,
    rollback,
    secrets,
    service_inputs,
    service_user,
    unit_file,
)
from tests.unit.test_units import LAB_GPUS


def _key(fact, kwargs) -> tuple:
    return (fact.__name__, tuple(sorted((k, repr(v)) for k, v in kwargs.items())))


class World:
    """A host's answers, keyed by fact and arguments; a question it has no answer for fails the test."""

    def __init__(self) -> None:
        self.answers: dict[tuple, object] = {}
        self.by_fact: dict[str, object] = {}

    def set(self, fact, value, **kwargs) -> None:
        if kwargs:
            self.answers[_key(fact, kwargs)] = value
        else:
            self.by_fact[fact.__name__] = value

    def read(self, fact, **kwargs):
        key = _key(fact, kwargs)
        if key in self.answers:
            return copy.deepcopy(self.answers[key])
        if fact.__name__ in self.by_fact:
            value = self.by_fact[fact.__name__]
            return copy.deepcopy(value(**kwargs) if callable(value) else value)
        raise AssertionError(f"the plan asked {fact.__name__}({kwargs}), which the world does not answer")


@pytest.fixture(autouse=True)
def fresh_key_sources(monkeypatch):
    monkeypatch.setattr(settings, "_KEY_SOURCES", {})


def converged_world(config, stack, patch_sets) -> World:
    w = World()
    user, group = config.service_user, service_user.group_of(config.service_user)
    for path in (rollback.STATE_DIR, rollback.RECORD_DIR, rollback.BACKUP_DIR):
        w.set(Directory, {"mode": 700, "user": "root", "group": "root"}, path=path)
    w.set(Directory, {"mode": int(secrets.file_modes(group)[0]), "user": "root", "group": group}, path=SECRETS_DIR)
    for env in config.environments:
        gen = venv_read.generation(env.path, stack, {name: patch_sets[name].digest for name in env.patch_sets})
        dists = {p.name: {"version": p.version} for p in stack.packages}
        w.set(venv_read.VenvState, {"wanted": {"python": f"{stack.python}.9", "dists": dists, "index": "current"},
                               "live": {"target": gen.path}, "live_state": None, "cache": {}, "uv": True,
                               "machine": "x86_64"},
              live=gen.live, wanted=gen.path, host_cache=config.host_wheel_cache, verify=config.verify_env)
        for name in env.patch_sets:
            ps = patch_sets[name]
            w.set(patches.InstalledFiles, {"version": ps.version, "files": {f.path: f.sha256 for f in ps.files},
                                           "backups": {f.path: True for f in ps.files}, "record": patches.applied_record(ps)},
                  **patches.read_arguments(ps, gen.path, f"{gen.path}/{stack.site_packages}"))
    w.set(transfer.StoreListing, {"model.safetensors": 1})
    w.set(models.OwnedInShm, {"owned": {m.name: "staged" for m in config.staged_models}, "in_units": []})
    w.set(models.StagedModel, {"src": {"a": 1}, "dest": {"a": 1}, "marker": {"files": {"a": [1, "h"]}}})
    wanted = models.boot_wanted(config)
    w.set(models.BootStaging, {"files": {p: hashlib.sha256(c.encode()).hexdigest() for p, (c, _) in wanted.items()},
                               "enabled": True}, paths=sorted(wanted), unit=models.BOOT_UNIT)
    w.set(service_user.GpuDevices, [("666", "root", "/dev/nvidia0")])
    w.set(service_user.AccountStanding, {"account": {"user": user, "uid": 990, "gid": 990, "home": service_user.STATE_DIR,
                                                     "shell": service_user.NOLOGIN},
                                         "group": {"name": group, "gid": 990, "members": []}, "sharing": [], "listed_in": []})
    w.set(Groups, [group, "root"])
    w.set(service_user.Account, {"user": user, "uid": 990, "home": service_user.STATE_DIR, "shell": service_user.NOLOGIN, "group": group})
    for s in config.services:
        if s.config_file:
            digest = secrets.key_file_digest(s.name, s.api_key, s.admin_api_key)
            w.set(secrets.SecretFileState, {"sha256": digest, "mode": secrets.file_modes(group)[1], "owner": "root", "group": group},
                  path=config_path(s.name))
        else:
            w.set(secrets.SecretFileState, None, path=config_path(s.name))
        text = service_inputs.unit_text(config, s, stack, patch_sets, ())
        w.set(File, {"mode": 644, "user": "root", "group": "root"}, path=s.unit_path)
        w.set(Sha1File, hashlib.sha1(text.encode()).hexdigest(), path=s.unit_path)
        w.set(FileContents, text.splitlines(), path=s.unit_path)
        w.set(readiness.ServiceState, {"active": "active", "sub": "running", "enabled": "enabled", "recorded": True,
                                       "newer": [], "health": 200, "pid": 11, "uptime_s": 60},
              unit=s.unit_name, address=readiness.probe_address(s.bind), port=s.port, inputs=service_inputs.watched_inputs(s, s.unit_path))
    w.set(placement.ManagedUnits, {s.unit_name: {"path": s.unit_path, "managed": True} for s in config.services})
    keys = sorted({service_inputs.cache_key(s, stack, patch_sets) for s in config.services})
    sealed = {kernel_cache.sealed_name(k, "sm120"): {"files": 3, "bytes": 300} for k in keys}  # LAB_GPUS: 12.0
    w.set(kernel_cache.KernelCaches, {"caches": {k: {"files": 3, "bytes": 300} for k in keys}, "sealed": sealed,
                                      "named": {s.unit_path: [service_inputs.cache_key(s, stack, patch_sets)]
                                                for s in config.services}},
          unit_dirs=kernel_cache.UNIT_DIRS)
    return w


def plan_of(config, stack, patch_sets, world: World, errors=()) -> HostPlan:
    decisions = gpus.GpuDecisions(config, errors=tuple(errors), facts=LAB_GPUS)
    return plan_host("gpu-a", decisions, stack, patch_sets, read=world.read)


def brief(plan: HostPlan) -> list[tuple]:
    return [(c.step, c.action, c.service) for c in plan.changes]


def test_a_converged_read_plans_nothing(lab):
    plan = plan_of(*lab, converged_world(*lab))
    assert plan.changes == [] and plan.unread == [] and plan.converged and plan.exit_code() == 0


def test_a_unit_whose_mode_drifted_is_put_back_without_a_restart(lab):
    config, stack, patch_sets = lab
    w = converged_world(*lab)
    ddtree = config.services[0]
    w.set(File, {"mode": 664, "user": "root", "group": "root"}, path=ddtree.unit_path)
    plan = plan_of(*lab, w)
    assert brief(plan) == [("Service", "update", ddtree.name)]
    assert "mode 664" in plan.changes[0].why and plan.exit_code() == 2


def test_a_unit_whose_content_differs_is_checked_rewritten_reloaded_restarted_and_gated(lab):
    config, stack, patch_sets = lab
    w = converged_world(*lab)
    ddtree = config.services[0]
    w.set(Sha1File, "0" * 40, path=ddtree.unit_path)
    plan = plan_of(*lab, w)
    assert [c.action for c in plan.of_service(ddtree.name)] == ["update", "check", "reload", "restart", "check"]
    assert plan.of_service(config.services[1].name) == []


def test_a_unit_edited_on_the_host_names_the_lines_that_differ_with_secrets_masked(lab):
    """`--dry` and the status view show which flags changed, as `terraform plan` does; a secret the host's
    copy holds (a token an operator pasted, the data's own key) is never shown."""
    config, stack, patch_sets = lab
    w = converged_world(*lab)
    ddtree = config.services[0]
    text = service_inputs.unit_text(config, ddtree, stack, patch_sets, ())
    assert "    --speculative-ddtree-budget 15 \\" in text.splitlines()
    edited = [line.replace("--speculative-ddtree-budget 15", "--speculative-ddtree-budget 31") for line in text.splitlines()]
    edited.insert(edited.index("[Service]") + 1, "Environment=HF_TOKEN=hf_pastedbyhand0123456789")
    edited.insert(edited.index("[Service]") + 1, "Environment=LEAK=" + "k" * 32)
    w.set(Sha1File, "0" * 40, path=ddtree.unit_path)
    w.set(FileContents, edited, path=ddtree.unit_path)
    plan = plan_of(*lab, w)
    (change,) = [c for c in plan.of_service(ddtree.name) if c.what == ddtree.unit_path]
    assert change.why == "differs from the data"
    assert "- --speculative-ddtree-budget 31" in change.diff and "+ --speculative-ddtree-budget 15" in change.diff, change.diff
    assert "- Environment=HF_TOKEN=<redacted>" in change.diff
    assert not any("hf_pasted" in line or "k" * 32 in line for line in change.diff), change.diff
    assert change.record()["diff"] == list(change.diff)
    # a unit whose content is the data's asks nothing more, and shows nothing
    assert plan_of(*lab, converged_world(*lab)).changes == []


def test_a_unit_rewritten_whole_shows_its_first_changed_lines_and_how_many_more(lab):
    config, stack, patch_sets = lab
    w = converged_world(*lab)
    ddtree = config.services[0]
    w.set(Sha1File, "0" * 40, path=ddtree.unit_path)
    w.set(FileContents, [f"# line {i}" for i in range(40)], path=ddtree.unit_path)
    (change,) = [c for c in plan_of(*lab, w).of_service(ddtree.name) if c.what == ddtree.unit_path]
    assert len(change.diff) == unit_file.DIFF_LINES + 1 and change.diff[-1].startswith("... and ")


def test_a_venv_change_restarts_every_service_of_that_venv_only(lab):
    config, stack, patch_sets = lab
    w = converged_world(*lab)
    env = config.services[0].environment
    gen = venv_read.generation(env.path, stack, {name: patch_sets[name].digest for name in env.patch_sets})
    state = w.read(venv_read.VenvState, live=gen.live, wanted=gen.path, host_cache=config.host_wheel_cache, verify=config.verify_env)
    first = stack.packages[0].name
    state["wanted"]["dists"][first] = {"version": "0.0.1"}
    w.set(venv_read.VenvState, state, live=gen.live, wanted=gen.path, host_cache=config.host_wheel_cache, verify=config.verify_env)
    plan = plan_of(*lab, w)
    restarted = {c.service for c in plan.changes if c.action == "restart"}
    sharing = {s.name for s in config.services if s.environment.path == env.path}
    assert restarted == sharing
    assert any(c.step == "Environments" and first in c.why for c in plan.changes)


def test_a_stale_record_index_is_rewritten_and_restarts_nothing(lab):
    config, stack, patch_sets = lab
    w = converged_world(*lab)
    env = config.environments[0]
    gen = venv_read.generation(env.path, stack, {name: patch_sets[name].digest for name in env.patch_sets})
    args = dict(live=gen.live, wanted=gen.path, host_cache=config.host_wheel_cache, verify=config.verify_env)
    state = w.read(venv_read.VenvState, **args)
    state["wanted"]["index"] = "stale"
    w.set(venv_read.VenvState, state, **args)
    assert brief(plan_of(*lab, w)) == [("Environments", "update", None)]


def test_a_patched_file_edited_on_the_host_is_restored_and_its_services_restart(lab):
    config, stack, patch_sets = lab
    patched = next(e for e in config.environments if e.patch_sets)
    gen = venv_read.generation(patched.path, stack, {name: patch_sets[name].digest for name in patched.patch_sets})
    ps = patch_sets[patched.patch_sets[0]]
    w = converged_world(*lab)
    args = patches.read_arguments(ps, gen.path, f"{gen.path}/{stack.site_packages}")
    state = w.read(patches.InstalledFiles, **args)
    state["files"][ps.files[0].path] = "e" * 64
    w.set(patches.InstalledFiles, state, **args)
    plan = plan_of(*lab, w)
    assert any(c.step == "Environments" and "changed on the host" in c.why for c in plan.changes)
    users = {s.name for s in config.services if s.environment.path == patched.path}
    assert {c.service for c in plan.changes if c.action == "restart"} == users


@pytest.mark.parametrize(("change", "step", "action"), [
    ("key file mode", "Service", "update"),
    ("service stopped", "Service", "start"),
    ("service disabled", "Service", "enable"),
    ("staged file changed", "Models", "update"),
    ("boot unit disabled", "Models", "enable"),
    ("secrets dir mode", "Service account", "update"),
    ("account shell", "Service account", "update"),
    ("state dir mode", "Environments", "update"),
    ("leftover unit", "Cleanup", "delete"),
    ("model missing from the store", "Models", "refuse"),  # the lab data names no model_sources
])
def test_each_drift_names_its_step(lab, change, step, action):
    config, stack, patch_sets = lab
    w = converged_world(*lab)
    s = next(x for x in config.services if x.config_file) if change == "key file mode" else config.services[0]
    group = service_user.group_of(config.service_user)
    if change == "key file mode":
        state = w.read(secrets.SecretFileState, path=config_path(s.name))
        w.set(secrets.SecretFileState, {**state, "mode": "644"}, path=config_path(s.name))
    elif change in ("service stopped", "service disabled"):
        args = dict(unit=s.unit_name, address=readiness.probe_address(s.bind), port=s.port,
                    inputs=service_inputs.watched_inputs(s, s.unit_path))
        state = w.read(readiness.ServiceState, **args)
        state.update({"active": "inactive", "sub": "dead", "health": None} if change == "service stopped" else {"enabled": "disabled"})
        w.set(readiness.ServiceState, state, **args)
    elif change == "staged file changed":
        w.set(models.StagedModel, {"src": {"a": 1}, "dest": {"a": 2}, "marker": {"files": {"a": [1, "h"]}}})
    elif change == "boot unit disabled":
        wanted = models.boot_wanted(config)
        state = w.read(models.BootStaging, paths=sorted(wanted), unit=models.BOOT_UNIT)
        w.set(models.BootStaging, {**state, "enabled": False}, paths=sorted(wanted), unit=models.BOOT_UNIT)
    elif change == "secrets dir mode":
        w.set(Directory, {"mode": 755, "user": "root", "group": group}, path=SECRETS_DIR)
    elif change == "account shell":
        w.set(service_user.Account, {**w.read(service_user.Account, user=config.service_user), "shell": "/bin/bash"})
    elif change == "state dir mode":
        w.set(Directory, {"mode": 755, "user": "root", "group": "root"}, path=rollback.STATE_DIR)
    elif change == "leftover unit":
        units = w.read(placement.ManagedUnits)
        w.set(placement.ManagedUnits, {**units, "sglang-old.service": {"path": "/etc/systemd/system/sglang-old.service", "managed": True}})
    elif change == "model missing from the store":
        w.set(transfer.StoreListing, lambda path: None if path == s.models[0].store_path else {"x": 1})
    plan = plan_of(config, stack, patch_sets, w)
    assert (step, action) in [(c.step, c.action) for c in plan.changes], plan.changes
    assert plan.exit_code() in (1, 2)


def test_a_gpu_refusal_is_a_refusal_and_its_service_gets_no_unit_plan(lab):
    config, stack, patch_sets = lab
    w = converged_world(*lab)
    w.set(Sha1File, "0" * 40, path=config.services[0].unit_path)
    plan = plan_of(config, stack, patch_sets, w, errors=(fit.Refusal(config.services[0], "GPU 0 is busy"),))
    assert [(c.step, c.action) for c in plan.of_service(config.services[0].name)] == [("GPU check", "refuse")]
    assert plan.exit_code() == 1 and not plan.converged


def test_whose_refusal_it_is_is_data_not_the_first_word_of_its_text(lab):
    """A refusal carries its service as made; text that happens to start with a service's name and a colon (a host's
    own error) is the host's: every service on it is refused."""
    config, stack, patch_sets = lab
    first, second = config.services[0].name, config.services[1].name
    w = converged_world(*lab)
    plan = plan_of(config, stack, patch_sets, w, errors=(f"{first}: looks like a service's, is the host's",))
    assert [(c.step, c.what, c.action, c.service) for c in plan.refusals] == [("GPU check", "this host", "refuse", None)]
    assert gpus.GpuDecisions.service_of(fit.Refusal(config.services[1], "x")) == second


def test_an_unanswered_read_is_named_and_never_converged(lab):
    config, stack, patch_sets = lab
    w = converged_world(*lab)
    del w.by_fact["ManagedUnits"]

    def failing(fact, **kwargs):
        if fact is placement.ManagedUnits:
            raise RuntimeError("connection dropped")
        return w.read(fact, **kwargs)

    plan = plan_host("gpu-a", gpus.GpuDecisions(config, facts=LAB_GPUS), stack, patch_sets, read=failing)
    assert plan.unread == ["ManagedUnits: connection dropped"] and not plan.converged and plan.exit_code() == 1


def test_a_change_record_is_what_the_json_and_the_status_view_carry():
    change = Change("Service", "/etc/systemd/system/sglang-x.service", "update", "differs from the data", "x")
    assert change.record() == {"step": "Service", "what": "/etc/systemd/system/sglang-x.service", "action": "update",
                               "why": "differs from the data", "service": "x", "diff": []}
    assert change.text == "update /etc/systemd/system/sglang-x.service: differs from the data"
    with pytest.raises(ValueError):
        Change("Service", "x", "frobnicate", "")


def test_every_cheap_read_the_plan_asks_can_join_the_hosts_one_read(lab):
    # A batched fact whose arguments are not plain words (a glob's `*`, say) is read on its own: a second call to the
    # host on every converged run (seen: the kernel caches' unit globs). The plan asks every fact a converged run does.
    from operations.run import read_batch

    w = converged_world(*lab)
    asked = []
    read = w.read

    def recording(fact, **kwargs):
        asked.append((fact, kwargs))
        return read(fact, **kwargs)

    w.read = recording
    plan_of(*lab, w)
    unplain = [(fact.__name__, kwargs) for fact, kwargs in asked if read_batch.cheap(fact, kwargs)
               and not read_batch.plain_arguments(read_batch.canonical(fact, kwargs))]
    assert asked and unplain == []
