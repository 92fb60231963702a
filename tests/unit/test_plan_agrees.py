"""Plan and apply agree, step by step (Terraform's re-plan check): from one recorded read of a host, each step's
plan (deploys/*.py `plan`) and the operation that applies it must say the same thing. Where the plan refuses, the
operation fails the host with the very same text; where the plan changes something, the operation has commands;
where the plan is converged, the operation has none.

Each case is one class of decision that used to be made twice (the plan beside the operation) and told two stories:
`--dry` said `create`/`update` where the deploy then failed the host.
"""

from __future__ import annotations

import dataclasses

import pytest
from pyinfra.api import OperationError
from pyinfra.facts.files import Directory

from operations.environment import patches, venv, venv_decide, venv_read
from operations.model import transfer
from operations.run import directory
from operations.service import lifecycle, readiness, rollback, service_inputs, service_user
from tests.unit.test_host_plan import converged_world, plan_of
from tests.unit.test_operations import FakeFs, run


def _with(config, **data):
    """The host's validated configuration with other data values (`HostConfig.data`)."""
    return dataclasses.replace(config, data=config.data.model_copy(update=data))


def _env(config, stack, patch_sets):
    env = config.environments[0]
    gen = venv_read.generation(env.path, stack, {name: patch_sets[name].digest for name in env.patch_sets})
    return env, gen


def _venv_key(config, gen) -> dict:
    return dict(live=gen.live, wanted=gen.path, host_cache=config.host_wheel_cache, verify=config.verify_env)


def _apply_venv(config, stack, gen, state, sources=None, installer=None):
    """`venv.environment` as the deploy adds it (deciding itself: no plan value), over the same read."""
    return run(venv.environment, {venv_read.VenvState: lambda **kw: state}, gen=gen, stack=stack,
               sources=sources if sources is not None else _sources(config),
               host_cache=config.host_wheel_cache, installer=installer or config.installer,
               verify=config.verify_env)


def _sources(config):
    return tuple(venv_decide.Source(*s) for s in config.stack_sources)


def _refusal(plan, step: str):
    found = [c for c in plan.refusals if c.step == step]
    assert len(found) == 1, plan.changes
    return found[0]


def _raises(apply) -> str:
    with pytest.raises(OperationError) as caught:
        apply()
    return str(caught.value)


# Environments: the venv ------------------------------------------------------------------------------------------

def _venv_state(world, config, gen) -> dict:
    return world.read(venv_read.VenvState, **_venv_key(config, gen))


@pytest.mark.parametrize("drift", ["untrusted", "other python"])
def test_a_venv_the_deploy_refuses_is_refused_by_the_plan_with_the_same_text(lab, drift):
    config, stack, patch_sets = lab
    world = converged_world(config, stack, patch_sets)
    _, gen = _env(config, stack, patch_sets)
    state = _venv_state(world, config, gen)
    if drift == "untrusted":
        state["untrusted"] = [f"{gen.live}: owned by uid 1000"]
    else:
        state["wanted"]["python"] = "3.9.2"
    world.set(venv_read.VenvState, state, **_venv_key(config, gen))
    refused = _refusal(plan_of(config, stack, patch_sets, world), "Environments")
    assert refused.why == _raises(lambda: _apply_venv(config, stack, gen, state))


@pytest.mark.parametrize("drift", ["a file no source has", "uv asked for and not shipped"])
def test_an_install_the_deploy_cannot_make_is_refused_by_the_plan(lab, tmp_path, drift):
    """The plan used to say `update` (its own StackDiff) where the build then failed: now both ask `venv_decide.decide`."""
    config, stack, patch_sets = lab
    empty = (("wheelhouse", str(tmp_path)),)  # a wheelhouse without the stack's files, or uv
    config = dataclasses.replace(_with(config, installer="uv" if drift.startswith("uv") else config.installer),
                                 stack_sources=empty)
    world = converged_world(config, stack, patch_sets)
    _, gen = _env(config, stack, patch_sets)
    state = _venv_state(world, config, gen)
    del state["wanted"]["dists"][stack.packages[0].name]  # one distribution to install
    state["uv"] = False
    world.set(venv_read.VenvState, state, **_venv_key(config, gen))
    plan = plan_of(config, stack, patch_sets, world)
    refused = _refusal(plan, "Environments")
    assert refused.why == _raises(lambda: _apply_venv(config, stack, gen, state, installer=config.installer))
    assert ("uv" in refused.why) == drift.startswith("uv")
    assert not [c for c in plan.changes if c.step == "Environments" and c.action == "update"], plan.changes


def test_the_build_applies_the_install_its_plan_decided(lab):
    """The plan's `Install` is the build's: a converged venv is a noop, one missing distribution is installed."""
    config, stack, patch_sets = lab
    world = converged_world(config, stack, patch_sets)
    env, gen = _env(config, stack, patch_sets)
    plan = plan_of(config, stack, patch_sets, world)
    install = plan.values[("install", env.path)]
    assert not install.needed
    result = run(venv.environment, {}, gen=gen, stack=stack, sources=_sources(config),
                 host_cache=config.host_wheel_cache, verify=config.verify_env, decided=install)
    assert result.commands == [] and result.noops, result


# Environments: the patch sets ------------------------------------------------------------------------------------

def _patch_key(stack, gen, patch_set) -> dict:
    return patches.read_arguments(patch_set, gen.path, f"{gen.path}/{stack.site_packages}")


def _apply_patches(stack, gen, patch_set, state, base_installed=False):
    site = f"{gen.path}/{stack.site_packages}"
    return run(patches.applied, {patches.InstalledFiles: lambda **kw: state, **FakeFs().facts()},
               patch_set=patch_set, venv_path=gen.path, site_packages=site, base_installed=base_installed)


def _patched_env(config):
    env = next(e for e in config.environments if e.patch_sets)
    return env


def test_a_patched_file_changed_with_no_backup_is_refused_by_plan_and_deploy_alike(lab):
    """The plan said `update` (patches.drift), the deploy failed the host (file_steps): now both ask `patches.decide`."""
    config, stack, patch_sets = lab
    world = converged_world(config, stack, patch_sets)
    env = _patched_env(config)
    gen = venv_read.generation(env.path, stack, {n: patch_sets[n].digest for n in env.patch_sets})
    patch_set = patch_sets[env.patch_sets[0]]
    state = world.read(patches.InstalledFiles, **_patch_key(stack, gen, patch_set))
    changed = next(f for f in patch_set.files if f.original is not None)
    state["files"][changed.path] = "e" * 64
    state["backups"][changed.path] = False
    world.set(patches.InstalledFiles, state, **_patch_key(stack, gen, patch_set))
    refused = _refusal(plan_of(config, stack, patch_sets, world), "Environments")
    assert refused.why == _raises(lambda: _apply_patches(stack, gen, patch_set, state))


def test_a_patch_set_over_a_base_this_run_reinstalls_is_planned_over_the_fresh_install(lab):
    """A generation whose base drifted: the venv step reinstalls it, so the set is neither refused nor kept."""
    config, stack, patch_sets = lab
    world = converged_world(config, stack, patch_sets)
    env = _patched_env(config)
    gen = venv_read.generation(env.path, stack, {n: patch_sets[n].digest for n in env.patch_sets})
    patch_set = patch_sets[env.patch_sets[0]]
    vstate = _venv_state(world, config, gen)
    vstate["wanted"]["dists"][patch_set.distribution] = {"version": "0.0.1"}
    world.set(venv_read.VenvState, vstate, **_venv_key(config, gen))
    pstate = world.read(patches.InstalledFiles, **_patch_key(stack, gen, patch_set))
    pstate["version"] = "0.0.1"
    world.set(patches.InstalledFiles, pstate, **_patch_key(stack, gen, patch_set))
    plan = plan_of(config, stack, patch_sets, world)
    assert not plan.refusals, plan.refusals
    assert any(c.what.startswith(f"patch set {patch_set.name}") and c.action == "update" for c in plan.changes)
    assert plan.values[("install", env.path)].installs(patch_set.distribution)
    result = _apply_patches(stack, gen, patch_set, pstate, base_installed=True)
    assert result.commands, result  # applied over the fresh install
    # Without the venv step's reinstall, the same read is a base of another version: refused by both.
    with pytest.raises(OperationError, match="was written for"):
        _apply_patches(stack, gen, patch_set, pstate)


# Directories, models, the service account ------------------------------------------------------------------------

def test_a_state_directory_that_is_a_file_is_refused_by_plan_and_deploy_alike(lab):
    config, stack, patch_sets = lab
    world = converged_world(config, stack, patch_sets)
    world.set(Directory, False, path=rollback.STATE_DIR)
    refused = _refusal(plan_of(config, stack, patch_sets, world), "Environments")
    assert refused.what == rollback.STATE_DIR
    assert refused.why == _raises(lambda: run(directory.present, {Directory: lambda path: False},
                                              path=rollback.STATE_DIR, mode="700", user="root", group="root"))


@pytest.mark.parametrize("source", [None, "gpu-a"])
def test_a_model_the_store_lacks_and_cannot_get_is_refused_by_plan_and_deploy_alike(lab, source):
    config, stack, patch_sets = lab
    model = config.store_models[0]
    config = _with(config, model_sources={model.name: source} if source else {})
    world = converged_world(config, stack, patch_sets)
    world.set(transfer.StoreListing, {}, path=model.store_path)
    refused = _refusal(plan_of(config, stack, patch_sets, world), "Models")
    assert refused.what == model.store_path
    assert refused.why == _raises(lambda: run(transfer.in_store, {transfer.StoreListing: lambda path: {}},
                                              model=model.name, path=model.store_path, source=source))


def test_gpu_devices_the_service_user_cannot_open_are_refused_by_plan_and_deploy_alike(lab):
    config, stack, patch_sets = lab
    world = converged_world(config, stack, patch_sets)
    closed = [("660", "root", "/dev/nvidia0")]
    world.set(service_user.GpuDevices, closed)
    refused = _refusal(plan_of(config, stack, patch_sets, world), "Service account")
    assert refused.why == _raises(lambda: run(service_user.devices_reachable,
                                              {service_user.GpuDevices: lambda: closed},
                                              user=config.service_user))


def test_an_account_that_is_someone_elses_is_refused_by_plan_and_deploy_alike(lab):
    config, stack, patch_sets = lab
    world = converged_world(config, stack, patch_sets)
    standing = world.read(service_user.AccountStanding, user=config.service_user)
    standing["listed_in"] = ["docker"]
    world.set(service_user.AccountStanding, standing)
    refused = _refusal(plan_of(config, stack, patch_sets, world), "Service account")
    assert refused.why == _raises(lambda: run(service_user.dedicated_account,
                                              {service_user.AccountStanding: lambda user: standing},
                                              user=config.service_user))


# Service: the unit's lifecycle -----------------------------------------------------------------------------------

# (the drift of a running, enabled, recorded service's state, what the plan and the operation must both do)
SERVICE_DRIFTS = [
    ("stopped", {"active": "inactive", "sub": "dead", "health": None}, {"start"}),
    ("failed", {"active": "failed", "sub": "failed", "health": None}, {"start"}),
    ("disabled", {"enabled": "disabled"}, {"enable"}),
    ("its venv link changed since it started", {"newer": ["venv"]}, {"restart"}),
    ("its unit file changed since it started, not reloaded", {"newer": ["unit"], "need_reload": True},
     {"reload", "restart"}),
    ("no record covers its process", {"recorded": False}, {"record"}),
]


def _lifecycle_of_plan(plan, name: str) -> set[str]:
    verbs = set()
    for c in plan.of_service(name):
        if c.action in ("start", "restart", "enable", "reload"):
            verbs.add(c.action)
        elif c.action == "update" and c.what.startswith("record of what"):
            verbs.add("record")
    return verbs


def _lifecycle_of_commands(commands) -> set[str]:
    verbs = set()
    for command in commands:
        text = command if isinstance(command, str) else str(command)
        verbs |= {"reload"} if text == "systemctl daemon-reload" else set()
        verbs |= {verb for verb in ("start", "restart", "enable") if text.startswith(f"systemctl {verb} ")}
        verbs |= {"record"} if text.startswith("(cd / && exec python3") and " --record " in text else set()
    # A (re)start writes its record too: the plan counts it in the (re)start.
    return verbs - {"record"} if verbs & {"start", "restart"} else verbs


@pytest.mark.parametrize(("what", "drift", "both"), SERVICE_DRIFTS, ids=[d[0] for d in SERVICE_DRIFTS])
def test_a_services_lifecycle_is_planned_as_its_operation_runs_it(lab, what, drift, both):
    config, stack, patch_sets = lab
    world = converged_world(config, stack, patch_sets)
    service = config.services[0]
    watched = service_inputs.watched_inputs(service, service.unit_path)
    key = dict(unit=service.unit_name, address=readiness.probe_address(service.bind), port=service.port,
               inputs=watched)
    state = world.read(readiness.ServiceState, **key)
    named = {"venv": service.environment.path, "unit": service.unit_path}
    state.update({k: [named[n] for n in v] if k == "newer" else v for k, v in drift.items()})
    world.set(readiness.ServiceState, state, **key)
    planned = _lifecycle_of_plan(plan_of(config, stack, patch_sets, world), service.name)
    result = run(lifecycle.running, {readiness.ServiceState: lambda **kw: state}, unit=service.unit_name,
                 unit_path=service.unit_path, bind=service.bind, port=service.port, inputs=watched)
    assert planned == _lifecycle_of_commands(result.commands) == both, (what, planned, result.commands)


@pytest.mark.parametrize("left", [[], ["f" * 16], ["f" * 16, "e" * 16]])
def test_kernel_caches_no_unit_names_are_planned_and_removed_alike(lab, left):
    # A cache of a key no unit names any more (an earlier generation, a service moved away): the plan's Cleanup
    # deletes exactly what the operation removes; the caches of the units it writes and of the saved ones stay.
    from deploys.cleanup import wanted_caches
    from operations.service import kernel_cache

    config, stack, patch_sets = lab
    w = converged_world(*lab)
    found = w.read(kernel_cache.KernelCaches, unit_dirs=kernel_cache.UNIT_DIRS)
    found["caches"].update({k: {"files": 1, "bytes": 1} for k in left})
    found["caches"]["d" * 16] = {"files": 1, "bytes": 1}
    found["named"]["/run/systemd/system/sglang-x.surge.service"] = ["d" * 16]  # a unit in place that this run keeps
    w.set(kernel_cache.KernelCaches, found, unit_dirs=kernel_cache.UNIT_DIRS)
    plan = plan_of(*lab, w)
    planned = sorted(c.what.rsplit("/", 1)[1] for c in plan.changes if c.step == "Cleanup")
    applied = run(kernel_cache.unused_removed, {kernel_cache.KernelCaches: found},
                  wanted=wanted_caches(config, stack, patch_sets), unit_dirs=kernel_cache.UNIT_DIRS)
    assert planned == sorted(left)
    assert bool(applied.commands) == bool(left)
    assert all(k in " ".join(applied.commands) for k in left) and "d" * 16 not in " ".join(applied.commands)
    assert plan.converged == (not left)


@pytest.mark.parametrize("restart", [True, False])
@pytest.mark.parametrize("cache", ["warm", "warm, unsealed", "empty, sealed here", "empty, model from gpu-b", "empty"])
def test_a_replicas_kernel_cache_is_seeded_and_sealed_as_planned(lab, restart, cache):
    # The Service step's plan and its operations (kernel_ship.warmed before the restart, .sealed after the gate)
    # decide from the same read: the plan names a seed or a seal exactly where the operation makes one.
    from hashlib import sha1

    from pyinfra.facts.files import FileContents, Sha1File

    from operations.service import kernel_cache, kernel_ship

    config, stack, patch_sets = lab
    if cache == "empty, model from gpu-b":
        config = _with(config, model_sources={config.services[0].target.name: "gpu-b"})
    w = converged_world(config, stack, patch_sets)
    service = config.services[0]
    key = service_inputs.cache_key(service, stack, patch_sets)
    found = w.read(kernel_cache.KernelCaches, unit_dirs=kernel_cache.UNIT_DIRS)
    if cache.startswith("empty"):
        found["caches"][key] = {"files": 0, "bytes": 0}
    if cache not in ("warm", "empty, sealed here"):
        found["sealed"] = {}
    w.set(kernel_cache.KernelCaches, found, unit_dirs=kernel_cache.UNIT_DIRS)
    if restart:
        w.set(Sha1File, sha1(b"another unit").hexdigest(), path=service.unit_path)
        w.set(FileContents, ["another unit"], path=service.unit_path)
    plan = plan_of(config, stack, patch_sets, w)
    starts = plan.restarts(service.name)
    assert starts == restart
    planned = {c.what for c in plan.of_service(service.name) if "/kernels/" in c.what}
    arch = "sm120"
    common = dict(replica=service.name, cache_key=key, arch=arch, starts=starts, sandbox=[])
    seeded = run(kernel_ship.warmed, {kernel_cache.KernelCaches: found},
                 source=config.model_sources.get(service.target.name), **common).commands
    sealed = run(kernel_ship.sealed, {kernel_cache.KernelCaches: found}, **common).commands
    assert (f"{kernel_cache.KERNELS_DIR}/{key}" in planned) == bool(seeded)
    assert (f"{kernel_cache.SEALED_DIR}/{kernel_cache.sealed_name(key, arch)}" in planned) == bool(sealed)
    assert bool(seeded) == (restart and cache in ("empty, sealed here", "empty, model from gpu-b"))
    assert bool(sealed) == (cache == "warm, unsealed" or (restart and cache in ("empty, model from gpu-b", "empty")))


def test_a_moved_away_services_kernel_caches_go_with_its_unit(lab):
    # A unit the Cleanup step removes (its service placed on another host now) names its caches only until then: the
    # plan deletes them, and so does the operation, given the units the step removes.
    from deploys.cleanup import replaced_units, wanted_caches
    from operations.service import kernel_cache, placement

    config, stack, patch_sets = lab
    w = converged_world(*lab)
    gone = f"{placement.UNIT_DIR}/sglang-moved.service"
    units = w.read(placement.ManagedUnits, unit_dir=placement.UNIT_DIR)
    units["sglang-moved.service"] = {"path": gone, "managed": True}
    w.set(placement.ManagedUnits, units, unit_dir=placement.UNIT_DIR)
    found = w.read(kernel_cache.KernelCaches, unit_dirs=kernel_cache.UNIT_DIRS)
    found["caches"]["9" * 16] = {"files": 1, "bytes": 1}
    found["named"][gone] = ["9" * 16]
    w.set(kernel_cache.KernelCaches, found, unit_dirs=kernel_cache.UNIT_DIRS)
    plan = plan_of(*lab, w)
    assert [c.what for c in plan.changes if c.step == "Cleanup" and "/kernels/" in c.what] == [
        f"{kernel_cache.KERNELS_DIR}/{'9' * 16}"]
    assert gone in replaced_units(units, config)
    # The operation reads the host after the removal: the unit is gone.
    after = {**found, "named": {p: k for p, k in found["named"].items() if p != gone}}
    applied = run(kernel_cache.unused_removed, {kernel_cache.KernelCaches: after},
                  wanted=wanted_caches(config, stack, patch_sets), unit_dirs=kernel_cache.UNIT_DIRS)
    assert len(applied.commands) == 1 and "9" * 16 in applied.commands[0]


def test_a_replaced_units_old_cache_goes_in_the_run_that_replaces_it_and_a_failed_preflight_changes_nothing(lab):
    # The unit in place names an older key (its flags changed in the data): the plan deletes that key's cache with this
    # run, and the operation, reading the host after the gate (the new unit in place), removes the same. Before, the
    # rollback's saved unit kept such a cache, and since a preflight replaces the saved unit, a run after a failed
    # preflight that changed nothing else removed it (test_patches' failed-preflight test saw a change).
    from deploys.cleanup import wanted_caches
    from operations.service import kernel_cache

    config, stack, patch_sets = lab
    service = config.services[0]
    w = converged_world(*lab)
    found = w.read(kernel_cache.KernelCaches, unit_dirs=kernel_cache.UNIT_DIRS)
    new = service_inputs.cache_key(service, stack, patch_sets)
    found["caches"]["7" * 16] = {"files": 1, "bytes": 1}
    found["named"][service.unit_path] = ["7" * 16]
    w.set(kernel_cache.KernelCaches, found, unit_dirs=kernel_cache.UNIT_DIRS)
    planned = [c.what for c in plan_of(*lab, w).changes if c.step == "Cleanup"]
    assert planned == [f"{kernel_cache.KERNELS_DIR}/{'7' * 16}"]
    after = {**found, "named": {**found["named"], service.unit_path: [new]}}
    applied = run(kernel_cache.unused_removed, {kernel_cache.KernelCaches: after},
                  wanted=wanted_caches(config, stack, patch_sets), unit_dirs=kernel_cache.UNIT_DIRS)
    assert len(applied.commands) == 1 and "7" * 16 in applied.commands[0] and new not in applied.commands[0]
    assert kernel_cache.UNIT_DIRS == (kernel_cache.UNIT_DIR, kernel_cache.surge.SURGE_DIR)  # no saved units
