"""Environments: one venv per combination of stack and patch sets (settings.Environment).

Each is built as a generation beside the live one, patched there, proven by the ABI probe and
only then switched in (operations/environment/venv.py); the previous generation stays for rollback.
A host with nothing placed on it gets none: it stays ready to receive a service. The deploy's state
directory (saved units for rollback, the records of what each service started with) is kept root's
alone, 0700.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyinfra.api import deploy
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.files import Directory
from pyinfra.operations.util import any_changed

from deploys.planning import Reading, directory_change
from operations.environment import patches, venv, venv_decide, venv_probe, venv_read
from operations.run import progress
from operations.run.plan import Refusal
from operations.service import rollback

STEP = "Environments"


@dataclass(frozen=True)
class BuiltEnvironment:
    """What the services of one venv depend on: its generation and the operations that (re)made
    it."""

    gen: venv_read.Generation
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


def plan(reading: Reading) -> None:
    """The state directories, and per venv: its generation's build (`venv_decide.decide`, whose
    `Install` the build applies: `plan.values[("install", venv path)]`), its patch sets
    (`patches.decide`, over the install as this run leaves it), the ABI probe and the switch."""
    config, plan_, ask = reading.config, reading.plan, reading.ask
    for path in (rollback.STATE_DIR, rollback.RECORD_DIR, rollback.BACKUP_DIR):
        found = ask(Directory, path=path)
        if config.environments or found is not None:
            directory_change(plan_, STEP, path, found, "700", "root", "root")
    sources = _sources(config)
    for env in config.environments:
        gen = venv_read.generation(
            env.path, reading.stack,
            {name: reading.patch_sets[name].digest for name in env.patch_sets})
        facts = ask(venv_read.VenvState, live=gen.live, wanted=gen.path,
                    host_cache=config.host_wheel_cache, verify=reading.verify)
        before = len(plan_.changes)
        if facts is None:
            plan_.unread.append(f"venv {env.path}: no answer")
            continue
        try:
            install = venv_decide.decide(gen, reading.stack, facts, sources,
                                         config.host_wheel_cache, config.installer, reading.verify)
        except Refusal as refusal:
            plan_.refuse(STEP, refusal, env.path)
            continue
        plan_.values[("install", env.path)] = install
        # A RECORD index rewritten alone is a cache of what the RECORDs say: no probe, no restart.
        before += _generation(plan_, reading, env, gen, facts, install)
        live_target = (facts.get("live") or {}).get("target")
        if live_target != gen.path:
            plan_.add(STEP, f"generation {gen.id}", "check", "the ABI probe, before it goes live")
            live = live_target.rsplit("/", 1)[-1] if live_target else "none"
            plan_.add(STEP, env.path, "update", f"switch to generation {gen.id} (live: {live})")
        elif len(plan_.changes) > before:
            plan_.add(STEP, f"generation {gen.id}", "check", "the ABI probe, after the change")
        reading.changed[env.path] = len(plan_.changes) > before


def _generation(plan_, reading: Reading, env, gen: venv_read.Generation, facts: dict,
                install: venv_decide.Install) -> int:
    """The generation's build or update, its RECORD index, and its patch sets; 1 where the index
    is rewritten alone (it changes nothing the services run), else 0."""
    stack, wanted = reading.stack, facts.get("wanted")
    before = len(plan_.changes)
    if wanted is None:
        plan_.add(STEP, f"generation {gen.id}", "create",
                  f"stack {stack.name} with {', '.join(env.patch_sets) or 'no patch sets'}")
        return 0  # its patch sets go onto the fresh install (`patches.applied` previews them)
    for reason in install.todo.reasons:
        plan_.add(STEP, f"generation {gen.id}", "update", reason)
    index_alone = wanted.get("index") in venv_read.INDEX_REWRITTEN and len(plan_.changes) == before
    if index_alone:
        plan_.add(STEP, f"generation {gen.id}'s RECORD index", "update",
                  venv_read.INDEX_REWRITTEN[wanted["index"]])
    for name in env.patch_sets:
        patch_set = reading.patch_sets[name]
        site_packages = f"{gen.path}/{stack.site_packages}"
        installed = reading.ask(patches.InstalledFiles, **patches.read_arguments(
            patch_set, gen.path, site_packages))
        what = f"patch set {name} in generation {gen.id}"
        if installed is None:
            plan_.unread.append(f"{what}: no answer")
            continue
        fresh = patches.over_fresh_base(installed, True, install.installs(patch_set.distribution),
                                        executing=False)
        try:
            steps = patches.decide(patch_set, installed, gen.path, site_packages, fresh=fresh)
        except Refusal as refusal:
            plan_.refuse(STEP, refusal, what)
            continue
        if steps.commands:
            found = patches.drift(patch_set, installed)
            why = (f"applied again over {patch_set.distribution} {patch_set.version}, "
                   "reinstalled in this run" if fresh
                   else "; ".join(found["drifted"]) or found["note"])
            plan_.add(STEP, what, "update", why)
    return int(index_alone)


def _sources(config) -> tuple[venv_decide.Source, ...]:
    return tuple(
        venv_decide.Source(
            *source,
            live_venv=config.peer_venvs.get(source[1]) if source[0] == "donor" else None)
        for source in config.stack_sources)


@deploy(STEP)
def environments(config, stack, patch_sets: dict, probe_args: dict,
                 decided: dict | None = None) -> dict[str, BuiltEnvironment]:
    """Add each venv's build, patch sets, ABI probe and switch; venv path -> BuiltEnvironment.
    `decided`: the host plan's values (deploys/environments.py `plan`): each venv's `Install`,
    which its build applies and which says whether its patch sets go onto a fresh base."""
    decided = decided or {}
    sources = _sources(config)
    probe = venv_probe.probe_for(stack, config.launcher, probe_args)
    built_envs = {}
    # Made where services will run; elsewhere only an older deploy's (0755) is tightened.
    rollback.state_private(name=f"State directory {rollback.STATE_DIR} is root's alone",
                           create=bool(config.environments))
    for env in config.environments:
        gen = venv_read.generation(env.path, stack,
                                   {name: patch_sets[name].digest for name in env.patch_sets})
        built = venv.environment(
            name=f"Venv generation {gen.id} holds stack {stack.name}",
            gen=gen,
            stack=stack,
            sources=sources,
            host_cache=config.host_wheel_cache,
            installer=config.installer,
            verify=config.verify_env,
            decided=(install := decided.get(("install", env.path))),
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
                base_installed=bool(install and install.installs(patch_sets[name].distribution)),
            )
            for name in env.patch_sets
        ]
        was = venv.live_target(gen, config.host_wheel_cache)
        probed = venv_probe.probed(
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
