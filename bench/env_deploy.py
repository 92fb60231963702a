"""Bench-only deploy (bench/env.py): the environment step alone, into /root/bench_venv.

The operations deploy.py runs for a venv (deploys/environments.py: build a generation, prove it with the
ABI probe, switch to it), for the host's stack from its group data, without patch sets or services. The
probe's arguments are the deploy's (`venv_probe.probe_for`) without the GPU step's driver CUDA version and compute
capabilities: with the lab's CPU torch the probe compares neither, so it imports the same modules either way.
"""

from pyinfra import host
from pyinfra.operations.util import any_changed

from configuration import settings, stacks
from operations.environment import venv, venv_decide, venv_probe, venv_read

BENCH_VENV = "/root/bench_venv"
GPU_ARGS = {"driver_cuda": None, "compute_caps": []}

config = settings.host_config(host)
stack = stacks.load_stack(config.stack)
gen = venv_read.generation(BENCH_VENV, stack, {})
built = venv.environment(
    name=f"Bench venv generation {gen.id}",
    gen=gen,
    stack=stack,
    sources=tuple(venv_decide.Source(*source) for source in config.stack_sources),
    host_cache=config.host_wheel_cache,
    installer=config.installer,
    verify=config.verify_env,
)
was = venv.live_target(gen, config.host_wheel_cache)
changed = any_changed(built)
venv_probe.probed(
    name=f"Bench generation {gen.id} passes the ABI probe",
    gen=gen,
    probe=venv_probe.probe_for(stack, config.launcher, GPU_ARGS),
    _if=lambda: was != gen.path or changed(),  # as deploys/environments.py: a generation not yet live is probed
)
venv.switched(name=f"{BENCH_VENV} is generation {gen.id}", gen=gen, live_target=was)
