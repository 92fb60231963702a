"""The serving virtualenv, built beside the live one and switched in only once proven.

`venv_path` (what units run: `<venv_path>/bin/python`) is a symlink to a *generation*:
`<venv_path>.generations/<stack>-<digest>`, one directory per exact content (the stack's
pins and the patch sets applied in it). A deploy that changes the environment:

1. `venv.environment` builds the wanted generation beside the live one: a copy of the live
   generation (`cp --reflink=auto`: free on a copy-on-write filesystem, a full copy elsewhere;
   never hard links) in which only the distributions that differ are removed and installed; or
   a fresh venv. uv installs with `--link-mode copy`: no file a service runs shares its inode
   with uv's cache or with another generation, so an edit in place reaches one file only.
   An interrupted build leaves a generation that is not live; the next run completes it.
2. `patches.applied` applies the patch sets inside it.
3. `venv_probe.probed` runs the ABI probe (operations/environment/on_host/abi_probe.py) in it
   and, only if the probe passes, `venv.switched` points `venv_path` at it in one rename. The
   previous generation is kept (one) for rollback; older ones are deleted.

Here, the operations that carry the decision out (`environment`, `record_index`, `switched`) and
the commands of a build. Beside them: what a generation is and its one read (venv_read.py), the
decision of what a build does (venv_decide.py), installed files copied in from the live generation
or a donor (venv_copy.py), and the ABI probe (venv_probe.py).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FunctionCommand

from configuration.stacks import Package, Stack
from operations import remote
from operations.environment import installer as installer_mod
from operations.environment.venv_copy import copy_within_host, stream_from_donor
from operations.environment.venv_decide import (
    Install,
    Source,
    decide,
    donor_path,
    wheelhouse_of,
)
from operations.environment.venv_read import (
    INDEX_REWRITTEN,
    Generation,
    index_command,
    state_of,
)
from operations.run.host_reads import operation
from operations.transport import fanout, streaming

# Touched after every install into a generation: a fast check hashes the files modified after it.
STAMP = ".sglang-deploy/installed"


# Operations ------------------------------------------------------------------------------


@operation()
def environment(
    gen: Generation,
    stack: Stack,
    sources: tuple[Source, ...],
    host_cache: str,
    installer: str = "auto",
    verify: str = "fast",
    decided: Install | None = None,
):
    """
    Make the generation ``gen`` hold exactly the distributions of ``stack``, beside the live one.

    + gen: the wanted `Generation` (from `venv_read.generation`)
    + stack: the `Stack` to install (from `configuration.stacks.load_stack`)
    + sources: where files come from, tried in order (`Source("wheelhouse", dir)`,
      `Source("index", url)`)
    + host_cache: directory on the host where pushed wheels (and uv) are kept
    + installer: ``auto`` (uv when the wheelhouse ships it for the host's architecture), ``uv`` or
      ``pip``
    + verify: ``fast`` or ``full``, how the installed files are checked against their RECORD (the
      validated ``verify_env``)
    + decided: the plan's `Install` for this generation (`decide`, asked by the step's plan from
      the same read); None asks `decide` here

    Exactness:
        Every distribution is installed ``--no-deps`` from a pinned file; versions are
        compared with their local tag (``2.11.0+cu130``), which pip's freeze-based checks
        drop. Distributions the stack does not name are removed before anything is
        installed, so two kernel builds never both own ``sgl_kernel/``.

    **Example:**

    .. code:: python

        venv.environment(
            name="Serving venv holds stack sglang-0.5.23-cu130",
            gen=venv_read.generation("/root/venv_sglang", stack, {}),
            stack=stack,
            sources=(venv_decide.Source("wheelhouse", "wheelhouse"),),
            host_cache="/var/cache/sglang-deploy/wheels",
        )
    """
    install = decided or decide(gen, stack, state_of(gen, host_cache, verify), sources,
                                host_cache, installer, verify)
    if not install.needed:
        host.noop(install.held())
        return
    yield from _changes(install)
    yield from _stamped(gen, host_cache)


@operation()
def record_index(gen: Generation, host_cache: str, verify: str = "fast"):
    """
    Keep the generation's RECORD index current: the list of every distribution's files that a fast
    check reads instead of each RECORD (environment/on_host/venv_state.py). `environment` writes it
    after each install; this writes it where a check found it missing (a generation from before
    indexes) or stale (a .dist-info file changed since). Only a cache of what the RECORDs say:
    writing it changes nothing the services run, and restarts nothing.

    + gen: the `Generation` whose index to keep
    + host_cache, verify: as for `environment` (the venv read is the same, shared with it)
    """
    wanted = state_of(gen, host_cache, verify)["wanted"]
    if wanted is None or wanted.get("index") not in INDEX_REWRITTEN:
        host.noop(f"generation {gen.id}'s RECORD index: "
                  f"{(wanted or {}).get('index', 'no generation')}")
        return
    host.log(f"venv {gen.live}: generation {gen.id}: its RECORD index is "
             f"{INDEX_REWRITTEN[wanted['index']]}: writing it")
    yield index_command(gen, host_cache)


# `environment`'s commands ----------------------------------------------------------------


def _changes(install: Install):
    """The commands of `environment` once everything is decided."""
    todo, tool = install.todo, install.tool
    if install.build:
        install.log(install.build_why)
        yield "".join(install.build)
    for line in todo.reasons:
        install.log(line)
    if install.kind == "pip" and "pip" not in install.base["dists"] and install.base.get("path"):
        # a generation uv built has no pip
        yield remote.isolated(shlex.quote(install.gen.python), "-m ensurepip --default-pip")
    if todo.remove:
        yield tool.uninstall(todo.remove)
    if not todo.install:
        return
    if install.kind == "uv" and not install.facts["uv"]:
        yield from _uv_unpacked(install)
    local = {name: path for name, (source, path) in install.chosen.items() if path is not None}
    if local:
        yield from _from_wheels(install, local)
    by_index, by_donor = _by_source(install)
    yield from _from_donors(install, by_donor)
    yield from _from_indexes(install, by_index)


def _uv_unpacked(install: Install):
    """uv on the host, from its wheel in the wheelhouse (pushed where the host's cache lacks it)."""
    host_cache, facts = install.host_cache, install.facts
    wheel = installer_mod.uv_wheel(Path(wheelhouse_of(install.sources)), facts["machine"])
    remote_wheel = f"{host_cache}/{wheel.name}"
    yield f"mkdir -p {shlex.quote(host_cache)}"
    if facts["cache"].get(wheel.name) != wheel.stat().st_size:
        # over OpenSSH where it reaches the host
        yield streaming.Pushes("uv wheel").upload(str(wheel), remote_wheel)
    yield installer_mod.unpack_uv_command(remote_wheel, host_cache)


def _from_wheels(install: Install, local: dict[str, Path]):
    """The distributions whose wheels are on this machine (`local`): pushed where the host's cache
    lacks them, then installed from that cache."""
    stack, base, facts, host_cache = install.stack, install.base, install.facts, install.host_cache
    if (any(facts["cache"].get(path.name) != path.stat().st_size for path in local.values())
            and not (install.kind == "uv" and not facts["uv"])):
        # pushes need it (the uv step above made it already)
        yield f"mkdir -p {shlex.quote(host_cache)}"
    remote_files, pushed, uploads = _uploads(install, local)
    yield from uploads
    yield from _pushed_named(install, local, pushed)
    repair = sorted(n for n in local
                    if (base["dists"].get(n) or {}).get("version") == stack.wanted()[n])
    recheck = [(p.sha256, f"{host_cache}/{local[p.name].name}") for p in install.packages
               if p.name in repair and p.name not in pushed and p.sha256]
    if recheck:
        # A repair re-extracts from the wheel: check the cached wheel against its pin first.
        check = "\n".join(f"{sha}  {path}" for sha, path in recheck)
        yield f"printf '%s\\n' {shlex.quote(check)} | sha256sum --check --quiet --strict -"
    yield install.tool.install_files(remote_files, repair)


def _uploads(install: Install, local: dict[str, Path]) -> tuple[list[str], set[str], list]:
    """The wheels' paths in the host's cache, the distributions whose wheel is pushed there (as
    `NAME.part`), and those pushes."""
    remote_files, pushed, uploads = [], set(), []
    # Every push of this operation in one transfer, several streams at once over OpenSSH where it
    # reaches the host (streaming.Pushes); a `.part` a run that stopped half way left whole, with
    # its pinned sha256, is not sent again.
    pushes = fanout.WheelPushes("wheel")  # from a host of this run that holds them, where one does
    pins = {p.name: p.sha256 for p in install.packages}
    for name, path in sorted(local.items()):
        dest = f"{install.host_cache}/{path.name}"
        if install.facts["cache"].get(path.name) != path.stat().st_size:
            uploads.append(pushes.upload(str(path), f"{dest}.part", pins.get(name) or None))
            pushed.add(name)
        remote_files.append(dest)
    return remote_files, pushed, uploads


def _pushed_named(install: Install, local: dict[str, Path], pushed: set[str]):
    """The pushed wheels given their names: a pinned one only once the host checked it."""
    host_cache, packages = install.host_cache, install.packages
    pinned = [(p.sha256, f"{host_cache}/{local[p.name].name}") for p in packages
              if p.name in pushed and p.sha256]
    if pinned:
        # The host checks each pushed file against its pin before it takes the file's name, so
        # the cache holds only checked files (and a push cut short is never mistaken for one).
        check = "\n".join(f"{sha}  {path}.part" for sha, path in pinned)
        renames = " && ".join(f"mv -f {shlex.quote(path)}.part {shlex.quote(path)}"
                              for _, path in pinned)
        # Once it passed, this host may serve the same files to the next hosts of the run
        # (operations/transport/fanout.py).
        yield fanout.CheckedWheels(f"printf '%s\\n' {shlex.quote(check)} "
                                   f"| sha256sum --check --quiet --strict - && {renames}",
                                   host_cache, {Path(path).name: sha for sha, path in pinned})
    unpinned = [f"{host_cache}/{local[n].name}" for n in pushed
                if not next(p for p in packages if p.name == n).sha256]
    if unpinned:
        yield " && ".join(f"mv -f {shlex.quote(path)}.part {shlex.quote(path)}"
                          for path in unpinned)


def _by_source(install: Install) -> tuple[dict[str, list[Package]], dict[Source, list[Package]]]:
    """The distributions that come without a wheel of this machine: by index URL, and by donor."""
    by_index: dict[str, list[Package]] = {}
    by_donor: dict[Source, list[Package]] = {}
    for name, (source, path) in install.chosen.items():
        if path is None:
            group = by_index if source.kind == "index" else by_donor
            group.setdefault(source.location if source.kind == "index" else source,
                             []).append(next(p for p in install.packages if p.name == name))
    return by_index, by_donor


def _from_donors(install: Install, by_donor: dict[Source, list[Package]]):
    """Each donor's distributions: the installed files of its venv, copied into the generation."""
    gen = install.gen
    for donor, group in by_donor.items():
        present = [p.name for p in group if p.name in install.base["dists"]]
        if present:
            yield install.tool.uninstall(present)  # the donor's files replace these whole
        install.log(f"copying {len(group)} installed distribution(s) from "
                    f"{donor.location}:{donor_path(donor)}: {', '.join(p.name for p in group)}")
        specs = [p.spec for p in group]
        if donor.location == host.name:
            # A venv on this very host: one pipe there, nothing through the control machine.
            yield copy_within_host(donor_path(donor), gen, specs)
        else:
            yield FunctionCommand(stream_from_donor,
                                  (donor.location, donor_path(donor), gen, specs), {})


def _from_indexes(install: Install, by_index: dict[str, list[Package]]):
    """Each index's distributions, fetched by the host: a requirements file of their pins."""
    host_cache = install.host_cache
    for url, group in by_index.items():
        reqs = f"{host_cache}/requirements-{install.gen.id}.txt"
        text = "\n".join(f"{p.spec} --hash=sha256:{p.sha256}" for p in group)
        yield (f"mkdir -p {shlex.quote(host_cache)} && printf '%s\\n' {shlex.quote(text)} "
               f"> {shlex.quote(reqs)}")
        yield install.tool.install_from_index(url, reqs)


def _stamped(gen: Generation, host_cache: str):
    """Once everything is in: the index a later fast check reads instead of every RECORD, then,
    last, the stamp: that check hashes the files modified after it."""
    yield index_command(gen, host_cache)
    stamp = f"{gen.path}/{STAMP}"
    yield f"mkdir -p {shlex.quote(str(Path(stamp).parent))} && touch {shlex.quote(stamp)}"



@operation()
def switched(gen: Generation, live_target: str | None):
    """
    Make ``gen`` the live generation (``venv_path`` -> it, one rename), after `venv_probe.probed`.

    + gen: the `Generation` built by `venv.environment`
    + live_target: what ``venv_path`` pointed at when the deploy began (`venv.live_target`); read
      once then, so that switching costs no second read of the whole venv

    The previous generation stays on disk for rollback; older ones are deleted.
    """
    if live_target == gen.path:
        host.noop(f"{gen.live} is generation {gen.id}")
        return
    host.log(f"venv {gen.live}: switching from {live_target or 'nothing'} to generation {gen.id} "
             "(the previous one is kept for rollback)")
    yield remote.command("venv_switch", shlex.quote(gen.live), shlex.quote(gen.id))


def live_target(gen: Generation, host_cache: str) -> str | None:
    """The generation `venv_path` points at, read at deploy load, so that `venv.switched` need not
    read the venv again."""
    facts = state_of(gen, host_cache, "fast")
    return facts["live"]["target"]
