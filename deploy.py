"""Stand up and keep converged the SGLang services placed on each host.

    pyinfra inventory.py deploy.py          # real hosts
    pyinfra lab/inventory.py deploy.py -y   # the local lab (make demo)

The whole path, each step an idempotent operation: the data is validated (a bad value
stops the run before any operation is added) and the host's deploy lock taken; GPU facts
decide and check the placement; a venv per stack and patch sets holds the pinned stack
with its patch sets; models are in the store (streamed from another host if need be) and
staged into the shm dir; per service, its API keys go to a root-only file, its exact
flags pass the engine's own parser (preflight), its unit is written, and it is
(re)started only when something it depends on changed; readiness is gated on /health
and a smoke completion; services no longer placed on the host are removed last.
"""

from pyinfra import host, state
from pyinfra.operations import systemd
from pyinfra.operations.util import any_changed

from configuration import settings, stacks
from operations import (
    gpus,
    host_reads,
    lock,
    models,
    patches,
    placement,
    preflight,
    readiness,
    rollback,
    secrets,
    transfer,
    units,
    venv,
)
from operations.service_user import ensure_account, gpu_device_groups, group_of
from operations.unit_file import written as unit_written
from report import health_timer, summary

# The whole inventory (every host, every service placed or not, the stacks and patch sets they use) is
# validated once per run by the first host to get here; every host's load raises the same DataError,
# so a bad value anywhere stops the run before any host's lock is taken (configuration/settings.py).
config = settings.host_config(host)
stack = stacks.load_stack(config.stack)
patch_sets = {name: patches.load_patch_set(name) for name in config.patch_sets}
summary.install_summary(state)
lock.acquire(host, state, config.lock_wait_s)
# From here every fact of this host is read once (one batched call on a converged host) and again
# only after a command ran there (operations/host_reads.py).
host_reads.install(state, host, config_digest=repr(config))
health_timer.install_timer(state)

# GPUs: one nvidia-smi fact per host, read now (before this deploy changes anything), resolves
# `gpu: auto` and `attention-backend: auto` for the units below. The check shows every decision
# (also with --dry) and fails the host, before any change, if a service's GPU is missing,
# unhealthy, busy or too small for its models.
gpu_plan = gpus.plan_for_host(config, stack)
config = gpu_plan.config
gpus.checked(name="GPUs fit the services placed on this host", plan=gpu_plan)

# One venv per combination of stack and patch sets (settings.Environment); a host with
# nothing placed on it gets none: it stays ready to receive a service. Each is built as a
# generation beside the live one, patched there, proven by the ABI probe and only then
# switched in (operations/venv.py); the previous generation stays for rollback.
sources = tuple(venv.Source(*source) for source in config.stack_sources)
probe = venv.probe_for(stack, config.launcher, gpu_plan.probe_args())
env_ops, env_gens = {}, {}
for env in config.environments:
    gen = env_gens[env.path] = venv.generation(env.path, stack, {name: patch_sets[name].digest for name in env.patch_sets})
    built = venv.environment(
        name=f"Venv generation {gen.id} holds stack {stack.name}",
        gen=gen,
        stack=stack,
        sources=sources,
        host_cache=config.host_wheel_cache,
        installer=config.installer,
    )
    patched = [
        patches.applied(
            name=f"Patch set {name} applied in generation {gen.id}",
            patch_set=patch_sets[name],
            venv_path=gen.path,
            site_packages=f"{gen.path}/{stack.site_packages}",
        )
        for name in env.patch_sets
    ]
    was = venv.live_target(gen, config.host_wheel_cache)
    probed = venv.probed(
        name=f"Generation {gen.id} passes the ABI probe",
        gen=gen,
        probe=probe,
        _if=lambda not_live=was != gen.path, changed=any_changed(built, *patched): not_live or changed(),
    )
    env_ops[env.path] = (probed, venv.switched(name=f"{env.path} is generation {gen.id}", gen=gen, live_target=was))

# The store holds each model's durable copy; a host that lacks one (a host moved to)
# gets it streamed from the host that `model_sources` names.
store_ops = {
    model.name: transfer.in_store(
        name=f"Model {model.name} in the store",
        model=model.name,
        path=model.store_path,
        source=config.model_sources.get(model.name),
    )
    for model in config.store_models
}
model_ops = models.stage_for_host(config)

# The account the services run as (`service_user`, a system user; root where the data says so),
# and the groups of this host's GPU device files, for the units' sandbox.
device_groups: tuple[str, ...] = ()
if config.services:
    ensure_account(config.service_user)
    device_groups = gpu_device_groups(config.service_user)

for service in config.services:
    env = service.environment
    unit_path = f"/etc/systemd/system/{service.unit_name}"
    digests = {name: patch_sets[name].digest for name in service.patch_sets}
    staging = models.boot_unit_name(config) if any(m.location == "shm" for m in service.models) else None
    unit_text = units.render_unit(
        config, service, stack, units.inputs_digest(stack, digests), after_units=(staging,) if staging else (),
        supplementary_groups=device_groups,
    )

    # What this service's process loads besides its unit: its venv, patch sets and staged models.
    inputs = list(env_ops[env.path])
    inputs += [model_ops[m.name] for m in service.models if m.name in model_ops]
    inputs += [store_ops[m.name] for m in service.models if m.location == "store"]

    key_file = secrets.config_file(
        name=f"API keys of {service.name} in a file only root and its service read",
        service=service.name,
        api_key=service.api_key,
        admin_api_key=service.admin_api_key,
        present=bool(service.config_file),
        group=group_of(config.service_user),
    )
    inputs.append(key_file)

    preflight.passed(
        name=f"{service.unit_name} flags pass the engine's own parser",
        service=service.name,
        venv_path=env_gens[env.path].path,
        launcher=config.launcher,
        argv=service.argv(),
        environment=service.environment_variables(),
        endpoint=service.endpoint,
        unit_path=unit_path,
        unit_text=unit_text,
        inputs_changed=any_changed(*inputs),
    )
    unit_file = unit_written(name=f"Unit {service.unit_name}", path=unit_path, text=unit_text)
    systemd.daemon_reload(name=f"systemd reloads {service.unit_name}", _if=unit_file.did_change)
    systemd.service(name=f"{service.unit_name} enabled", service=service.unit_name, running=None, enabled=True)
    started = systemd.service(name=f"{service.unit_name} running", service=service.unit_name, running=True)
    deps_changed = any_changed(unit_file, *inputs)
    # Inputs whose content differs from what the running process was started with (recorded at
    # each (re)start): an earlier run stopped between a change and its restart. A touched file,
    # or a file dropped beside a staged model, is no change.
    watched = (unit_path, env.path, *(f"{m.load_path}/{models.MARKER}" for m in service.models if m.location == "shm"))
    watched += (service.config_file,) if service.config_file else ()
    stale, recorded = readiness.changed_since_start(service.unit_name, service.bind, service.port, watched)
    if stale:
        host.log(f"{service.name}: {', '.join(stale)} changed since the service started (an earlier deploy stopped before restarting it): restarting")
    restarted = systemd.service(
        name=f"{service.unit_name} restarted (its inputs changed)",
        service=service.unit_name,
        running=None,
        restarted=True,
        _if=lambda deps_changed=deps_changed, started=started, stale=bool(stale): (deps_changed() or stale) and not started.did_change(),
    )
    # Right after the (re)start, before the readiness wait: a run that dies while waiting does
    # not make the next one restart a service that already runs what the data asks for.
    readiness.inputs_recorded(
        name=f"{service.unit_name}: what it was started with recorded",
        unit=service.unit_name,
        inputs=watched,
        _if=lambda started=started, restarted=restarted, recorded=recorded: started.did_change() or restarted.did_change() or not recorded,
    )
    readiness.ready(
        name=f"{service.unit_name} answers /health",
        service=service.name,
        unit=service.unit_name,
        bind=service.bind,
        port=service.port,
        timeout=config.readiness_timeout_s,
        smoke=config.smoke_test,
        config_file=service.config_file,
        open_to_all=service.exposed_without_key,
        restarted=any_changed(started, restarted),
        inputs=watched,
        rollback_plan=rollback.Restorable(unit_path, service.unit_name, unit_file.did_change, [(env.path, env_ops[env.path][1].did_change)]),
    )

# Services no longer placed here go after the readiness gates: pyinfra runs each operation on
# every host before the next, so a service moved to another host stops here only once it
# answers /health there.
placement.remove_unplaced(config)
models.release_unused(config)
