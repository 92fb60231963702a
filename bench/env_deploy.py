"""Bench-only deploy (bench/env.py): the environment step alone, into /root/bench_venv.

The same operations deploy.py runs for a venv (build a generation, switch to it), for the
host's stack from its group data, without patch sets, probe or services.
"""

from pyinfra import host

from configuration import settings, stacks
from operations import venv

BENCH_VENV = "/root/bench_venv"

config = settings.host_config(host)
stack = stacks.load_stack(config.stack)
gen = venv.generation(BENCH_VENV, stack, {})
venv.environment(
    name=f"Bench venv generation {gen.id}",
    gen=gen,
    stack=stack,
    sources=tuple(venv.Source(*source) for source in config.stack_sources),
    host_cache=config.host_wheel_cache,
    installer=config.installer,
)
venv.switched(name=f"{BENCH_VENV} is generation {gen.id}", gen=gen, live_target=venv.live_target(gen, config.host_wheel_cache))
