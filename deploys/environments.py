"""Environments: one venv per combination of stack and patch sets (settings.Environment).

Each is built as a generation beside the live one, patched there, proven by the ABI probe and
only then switched in (operations/venv.py); the previous generation stays for rollback. A host
with nothing placed on it gets none: it stays ready to receive a service. The deploy's state
directory (saved units for rollback, the records of what each service started with) is kept root's
alone, 0700.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyinfra.api import deploy
from pyinfra.api.operation import OperationMeta
from pyinfra.operations.util import any_changed

from operations import patches, progress, rollback, venv


@dataclass(frozen=True)
class BuiltEnvironment:
    """What the services of one venv depend on: its generation and the operations that (re)made
    it."""

    gen: venv.Generation
    probed: OperationMeta
    switched: OperationMeta

    def named_ops(self) -> list[tuple[str, OperationMeta, bool]]:
        """The operations that (re)made it, as `this_run.Inputs` names them; the probe runs under a
        condition (`_if`)."""
        return [(f"generation {self.gen.id} probed", self.probed, True),
                (f"{self.gen.live} switched to generation {self.gen.id}", self.switched, False)]


def _probe_needed(not_live: bool, changed) -> Callable[[], bool]:
    """A generation not yet live is probed even when nothing in it changed in this run."""
    return lambda: not_live or changed()


@deploy("Environments")
def environments(config, stack, patch_sets: dict, probe_args: dict) -> dict[str, BuiltEnvironment]:
    """Add each venv's build, patch sets, ABI probe and switch; venv path -> BuiltEnvironment."""
    sources = tuple(
        venv.Source(*source,
                    live_venv=config.peer_venvs.get(source[1]) if source[0] == "donor" else None)
        for source in config.stack_sources)
    probe = venv.probe_for(stack, config.launcher, probe_args)
    built_envs = {}
    # Made where services will run; elsewhere only an older deploy's (0755) is tightened.
    rollback.state_private(name=f"State directory {rollback.STATE_DIR} is root's alone",
                           create=bool(config.environments))
    for env in config.environments:
        gen = venv.generation(env.path, stack,
                              {name: patch_sets[name].digest for name in env.patch_sets})
        built = venv.environment(
            name=f"Venv generation {gen.id} holds stack {stack.name}",
            gen=gen,
            stack=stack,
            sources=sources,
            host_cache=config.host_wheel_cache,
            installer=config.installer,
            verify=config.verify_env,
        )
        progress.watch(built, f"venv generation {gen.id}", progress.bytes_under(gen.path))
        # Where the build changed nothing, the index it writes after an install may be missing or
        # stale.
        venv.record_index(
            name=f"Generation {gen.id}'s RECORD index is current",
            gen=gen,
            host_cache=config.host_wheel_cache,
            verify=config.verify_env,
            _if=built.did_not_change,
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
            _if=_probe_needed(was != gen.path, any_changed(built, *patched)),
        )
        progress.watch(probed, f"ABI probe of generation {gen.id}")
        switched = venv.switched(name=f"{env.path} is generation {gen.id}", gen=gen,
                                 live_target=was)
        built_envs[env.path] = BuiltEnvironment(gen, probed, switched)
    return built_envs
