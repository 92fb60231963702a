"""The deploy's own operations on a GPU machine without systemd (bench/gpu_serve_check.sh, bench/ddtree/gpu_run.sh).

As in deploys/environments.py: a generation per venv and patch-set combination, each set applied
(`patches.applied`) before the ABI probe.

Same code as deploy.py for everything up to the unit file: the data validated, the GPU check
(`nvidia-smi`), the environment built as a generation from a donor venv and the wheelhouse,
the ABI probe in it, the switch, the engine's own parser on each service's exact flags
(preflight), and the unit rendered and written. Not run here: what needs systemd (the service
account's sandbox, enable/start, the boot staging unit); bench/gpu/serve.py starts each unit's
exact ExecStart line with its environment instead.
"""

import dataclasses
from io import StringIO

from pyinfra import host
from pyinfra.operations import files

from configuration import settings, stacks
from operations.environment import patches, venv, venv_decide, venv_probe, venv_read
from operations.gpu import gpus
from operations.service import preflight, service_inputs

config = settings.host_config(host)
stack = stacks.load_stack(config.stack)
patch_sets = {name: patches.load_patch_set(name) for name in config.patch_sets}

gpu_plan = gpus.plan_for_host(config, stack)
# The GPU machine has no systemd (PID 1 is not systemd): bench/gpu's systemctl, journalctl and systemd-run stand in
# for it, so the prerequisite that refuses such a host (operations/gpu/prerequisites.py) is set aside here, and only here.
gpu_plan = dataclasses.replace(gpu_plan, errors=tuple(e for e in gpu_plan.errors if not e.startswith("its init is ")))
config = gpu_plan.config
gpus.checked(name="GPUs fit the services placed on this host", plan=gpu_plan)

sources = tuple(venv_decide.Source(*source) for source in config.stack_sources)
probe = venv_probe.probe_for(stack, config.launcher, gpu_plan.probe_args())
gens = {}
for env in config.environments:
    gen = gens[env.path] = venv_read.generation(env.path, stack, {name: patch_sets[name].digest for name in env.patch_sets})
    built = venv.environment(
        name=f"Venv generation {gen.id} holds stack {stack.name}",
        gen=gen, stack=stack, sources=sources, host_cache=config.host_wheel_cache, installer=config.installer,
    )
    patched = [
        patches.applied(
            name=f"Patch set {name} applied in generation {gen.id}", patch_set=patch_sets[name],
            venv_path=gen.path, site_packages=f"{gen.path}/{stack.site_packages}",
        )
        for name in env.patch_sets
    ]
    was = venv.live_target(gen, config.host_wheel_cache)
    venv_probe.probed(
        name=f"Generation {gen.id} passes the ABI probe", gen=gen, probe=probe,
        _if=lambda not_live=was != gen.path, built=built, patched=tuple(patched): not_live or built.did_change() or any(p.did_change() for p in patched),
    )
    venv.switched(name=f"{env.path} is generation {gen.id}", gen=gen, live_target=was)

for service in config.services:
    unit_path = f"/etc/systemd/system/{service.unit_name}"
    # The unit the deploy writes (its generation and kernel cache named), not a sandbox's rendering.
    unit_text = service_inputs.unit_text(config, service, stack, patch_sets, ())
    preflight.passed(
        name=f"{service.unit_name} flags pass the engine's own parser",
        service=service.name, venv_path=gens[service.environment.path].path, launcher=config.launcher,
        argv=service.argv(), environment=service.environment_variables(), endpoint=service.endpoint,
        unit_path=unit_path, unit_text=unit_text, inputs_changed=lambda: False,
    )
    files.put(name=f"Unit {service.unit_name}", src=StringIO(unit_text), dest=unit_path, mode="644")
