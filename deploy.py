"""Stand up and keep converged the SGLang services placed on each host.

    pyinfra inventory.py deploy.py          # real hosts
    pyinfra lab/inventory.py deploy.py -y   # the local lab (make demo)

The whole path, each step an idempotent operation: the venv holds the pinned stack;
patch sets are copied into the installed engine; models are staged into the shm dir;
one systemd unit per service; a service is (re)started only when something it depends
on changed; then readiness is gated on /health and a smoke completion. The data is
validated first: a bad value stops the run before any operation is added.
"""

from io import StringIO

from pyinfra import host, state
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from operations import models, patches, readiness, settings, stacks, units, venv

config = settings.host_config(host)
stack = stacks.load_stack(config.stack)
patch_sets = {name: patches.load_patch_set(name) for name in config.patch_sets}
readiness.install_summary(state)

# A host with nothing placed on it gets nothing (no venv, no models): it stays ready to
# receive a service. The loop below is empty for it too.
environment = None
if config.services:
    environment = venv.environment(
        name=f"Venv {config.venv_path} holds stack {stack.name}",
        path=config.venv_path,
        stack=stack,
        wheelhouse=config.wheelhouse,
        host_cache=config.host_wheel_cache,
    )

site_packages = f"{config.venv_path}/{stack.site_packages}"
patch_ops = {
    name: patches.applied(
        name=f"Patch set {name} applied",
        patch_set=patch_set,
        venv_path=config.venv_path,
        site_packages=site_packages,
    )
    for name, patch_set in patch_sets.items()
}

model_ops = models.stage_for_host(config)

for service in config.services:
    digests = {name: patch_sets[name].digest for name in service.patch_sets}
    unit_file = files.put(
        name=f"Unit {service.unit_name}",
        src=StringIO(units.render_unit(config, service, stack, units.inputs_digest(stack, digests))),
        dest=f"/etc/systemd/system/{service.unit_name}",
        mode="644",
    )
    systemd.daemon_reload(name=f"systemd reloads {service.unit_name}", _if=unit_file.did_change)
    systemd.service(name=f"{service.unit_name} enabled", service=service.unit_name, running=None, enabled=True)
    started = systemd.service(name=f"{service.unit_name} running", service=service.unit_name, running=True)

    # What this service's process loads: its unit, the venv, its patch sets, its staged models.
    depends_on = [unit_file, environment]
    depends_on += [patch_ops[name] for name in service.patch_sets]
    depends_on += [model_ops[m.name] for m in service.models if m.name in model_ops]
    deps_changed = any_changed(*depends_on)
    restarted = systemd.service(
        name=f"{service.unit_name} restarted (its inputs changed)",
        service=service.unit_name,
        running=None,
        restarted=True,
        _if=lambda deps_changed=deps_changed, started=started: deps_changed() and not started.did_change(),
    )
    readiness.ready(
        name=f"{service.unit_name} answers /health",
        service=service.name,
        unit=service.unit_name,
        bind=service.bind,
        port=service.port,
        timeout=config.readiness_timeout_s,
        smoke=config.smoke_test,
        restarted=any_changed(started, restarted),
    )
