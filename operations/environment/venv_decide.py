"""The decision of the Environments step's venv: what `venv.environment` will do on a host, decided
from the venv's one read before anything on the host changes (`decide`, whose `Install` the
operation applies), with every refusal the host would fail with (`plan.Refusal`).

It holds what a generation must hold (`plan`: the distributions to install and remove), where each
distribution's file comes from (`Source`, `resolve`, a donor's venv read), the conflicts refused
before anything is installed (`shared_after`, `planned_overlaps`), and which installer runs.

Separate from the operations (venv.py) so that the step's plan (deploys/environments.py) and the
operation ask one decider, and nothing here yields a command: it is pure but for the donors' reads.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from pyinfra import host, logger

from configuration import wheels
from configuration.stacks import Package, Stack
from operations.environment import installer as installer_mod
from operations.environment.venv_copy import clone_command, donor_host
from operations.environment.venv_read import Generation, VenvState, refuse_untrusted
from operations.run import host_reads
from operations.run.plan import Refusal

# Installed with every venv by `python -m venv`; kept unless the stack pins them.
BOOTSTRAP = {"pip", "setuptools", "wheel"}


# Where a stack's files come from -------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One place a stack's files can come from: `wheelhouse` (a control-machine dir), `index` (a
    URL), or `donor` (an inventory host whose live venv - or the venv at `path` there - holds the
    same pins: its installed files are copied)."""

    kind: str
    location: str
    path: str | None = None
    # A donor named without `path`: its host's `venv_path` (its live venv), from that host's
    # validated configuration.
    live_venv: str | None = None

    @property
    def key(self) -> str:
        """How `resolve`'s `donors` map names this source: the host, or HOST:PATH for a venv at a
        path."""
        return f"{self.location}:{self.path}" if self.path else self.location

    def __str__(self) -> str:
        return f"{self.kind} {self.key}"


def resolve(
    stack: Stack, packages: list[Package], sources: tuple[Source, ...],
    donors: dict[str, dict | None] | None = None
) -> dict[str, tuple[Source, Path | None]]:
    """Pick, per distribution, the first source that has its pinned file; fail naming the file and
    every source tried.

    `donors` maps a donor source's `key` to its venv as `VenvState` reads it (None: no venv there).
    """
    chosen: dict[str, tuple[Source, Path | None]] = {}
    for package in packages:
        tried = []
        for source in sources:
            if source.kind == "wheelhouse":
                path = wheels.find(package, Path(source.location))
                if path is not None:
                    chosen[package.name] = (source, path)
                    break
                tried.append(f"{source} (no such file)")
            elif source.kind == "index":
                # An index is asked by the host; only a pinned hash makes its file exact.
                if package.sha256:
                    chosen[package.name] = (source, None)
                    break
                tried.append(f"{source} (needs a sha256 pin in the stack)")
            elif source.kind == "donor":
                donor = (donors or {}).get(source.key)
                have = (donor or {}).get("dists", {}).get(package.name)
                if have and have["version"] == package.version and not have.get("damaged_count"):
                    chosen[package.name] = (source, None)
                    break
                if have and have.get("damaged_count"):
                    # e.g. the GPU image's replaced certifi/cacert.pem: a copy would fail our own
                    # check on every run.
                    why = (f"{have['damaged_count']} of its installed file(s) differ from their "
                           f"RECORD: {', '.join(have['damaged'][:3])}")
                else:
                    why = ("no venv" if donor is None
                           else f"has {have['version']}" if have else "lacks it")
                tried.append(f"{source} ({why})")
        else:
            wanted = package.file or f"a wheel of {package.spec}"
            raise Refusal(
                f"stack {stack.name}: {wanted} is in none of the sources tried: "
                f"{'; '.join(tried)}. "
                f"Fill a wheelhouse with: python -m tools.wheelhouse {stack.name} DIR"
            )
    for name, (source, path) in chosen.items():
        package = next(p for p in packages if p.name == name)
        if path is not None and package.sha256 and wheels.sha256_of(path) != package.sha256:
            raise Refusal(
                f"stack {stack.name}: {path} has sha256 {wheels.sha256_of(path)}, the stack pins "
                f"{package.sha256}; delete the file and rebuild the wheelhouse, or correct "
                f"files/stacks/{stack.name}.yml"
            )
    return chosen


# Planning (pure) -------------------------------------------------------------------------


def python_matches(stack: Stack, venv_state: dict | None) -> bool:
    return venv_state is not None and venv_state["python"].rsplit(".", 1)[0] == stack.python


@dataclass
class StackDiff:
    install: list[str]  # distributions to (re)install
    remove: list[str]  # distributions the stack does not name
    reasons: list[str]  # one line per decision, for the log


def plan(stack: Stack, venv_state: dict | None) -> StackDiff:
    """What to remove and (re)install so that a venv holds exactly `stack`."""
    dists = (venv_state or {}).get("dists", {})
    install, reasons = [], []
    for p in stack.packages:
        found = dists.get(p.name)
        if found is None:
            install.append(p.name)
            reasons.append(f"add {p.name} {p.version}")
        elif found["version"] != p.version:
            install.append(p.name)
            reasons.append(f"{p.name} {found['version']} -> {p.version}")
        elif found.get("damaged_count"):
            install.append(p.name)
            shown = (", ".join(found["damaged"][:3])
                     + (", ..." if found["damaged_count"] > 3 else ""))
            reasons.append(f"{p.name} {p.version}: {found['damaged_count']} installed file(s) "
                           f"missing or altered ({shown}): reinstalling")
        elif found.get("linked_count"):
            # Hard links into uv's cache or another generation (a build by an older deploy): an edit
            # there would change this file unseen. Reinstalled as files of its own.
            install.append(p.name)
            shown = ", ".join(found["linked"][:3]) + (", ..." if found["linked_count"] > 3 else "")
            reasons.append(
                f"{p.name} {p.version}: {found['linked_count']} installed file(s) share their "
                f"inode with another path (uv's cache or another generation: {shown}): "
                "reinstalling as copies"
            )
    remove = sorted(set(dists) - set(stack.wanted()) - BOOTSTRAP)
    if remove:
        reasons.append(f"remove {', '.join(remove)} (not in stack {stack.name})")
    return StackDiff(install, remove, reasons)


def shared_after(venv_state: dict | None, stack: Stack, removed: list[str]) -> dict[str, list[str]]:
    """Files claimed by two distributions that both stay: refused (e.g. two kernels owning
    `sgl_kernel/`)."""
    out = {}
    for top, owners in ((venv_state or {}).get("shared") or {}).items():
        staying = [o for o in owners if o not in removed and o in stack.wanted()]
        if len(staying) > 1:
            out[top] = staying
    return out


def planned_overlaps(
    stack: Stack, install: list[str], sources: tuple[Source, ...],
    chosen: dict[str, tuple[Source, Path | None]], donors: dict[str, dict | None]
) -> list[str]:
    """What `shared_after` cannot see yet: files two of the stack's distributions will both install,
    one per pair.

    Read only when something is to be installed (`install` not empty; a converged venv opens no
    wheel): every distribution of the stack whose pinned wheel is on the control machine (the one
    chosen to push, or for those that stay, the same pinned file in a wheelhouse source) has its
    RECORD read; and a donor whose venv holds two of the stack's distributions, at the stack's
    versions, that own one package directory (its own `shared`, read on the host) would hand over
    the same conflict. Distributions fetched from an index by the host, or installed and found in no
    wheelhouse, are not seen here: the installed venv's check still finds them.
    """
    if not install:
        return []
    wheel_paths: dict[Package, Path] = {}
    houses = [Path(s.location) for s in sources if s.kind == "wheelhouse"]
    for package in stack.packages:
        path = (chosen.get(package.name) or (None, None))[1]
        if path is None and package.name not in chosen:
            path = next((found for house in houses
                         if (found := wheels.find(package, house)) is not None), None)
        if path is not None:
            wheel_paths[package] = path
    try:
        found = [f"{o.describe()} (read from their wheels' RECORD)"
                 for o in wheels.overlaps(wheel_paths)]
    except wheels.WheelhouseError as exc:
        raise Refusal(f"stack {stack.name}: {exc}") from exc
    wanted = stack.wanted()
    for key, donor in donors.items():
        for top, owners in ((donor or {}).get("shared") or {}).items():
            same = [o for o in owners if wanted.get(o) is not None
                    and (donor["dists"].get(o) or {}).get("version") == wanted[o]]
            if len(same) > 1 and any(chosen.get(o, (None,))[0] is not None
                                     and chosen[o][0].kind == "donor" for o in same):
                found.append(f"{top}/ is installed by both {' and '.join(same)} (as donor {key}'s "
                             "venv holds them)")
    return found


# `environment`, decided ------------------------------------------------------------------


@dataclass(frozen=True)
class Install:
    """What `environment` decided for one host before anything on it changes (`decide`); its
    commands are `venv._changes`."""

    gen: Generation
    stack: Stack
    facts: dict  # the venv as `VenvState` reads it (`state_of`)
    base: dict  # the venv the install starts from (VENV of `VenvState`; no dists when new)
    build: tuple[str, ...]  # the commands that build the generation where it is not there yet
    build_why: str  # the log line that says why it is built ("" when it is there)
    todo: StackDiff
    packages: list[Package]  # the distributions to install
    chosen: dict[str, tuple[Source, Path | None]]  # where each comes from (`resolve`)
    kind: str  # the installer: "uv" or "pip"
    tool: installer_mod.Installer
    sources: tuple[Source, ...]
    host_cache: str

    def installs(self, distribution: str) -> bool:
        """Does this run (re)install `distribution` (a fresh copy of its files, every patch gone)?
        A generation built from scratch installs every distribution (its base holds none)."""
        return distribution in self.todo.install

    @property
    def needed(self) -> bool:
        """Anything to do: a generation to build, distributions to install or to remove."""
        return bool(self.build or self.todo.install or self.todo.remove)

    def held(self) -> str:
        """The noop's text where nothing is needed."""
        wanted = self.facts["wanted"]
        # Say what was compared: a fast check does not see a same-size edit whose mtime was put
        # back.
        hashed = f", {wanted['hashed']} file(s) hashed" if wanted.get("hashed") else ""
        checked = f"{wanted.get('checked', 'size')}{hashed}"
        return (f"venv generation {self.gen.id} holds stack {self.stack.name} "
                f"({len(self.stack.packages)} distributions; checked: {checked})")

    def log(self, text: str) -> None:
        host.log(f"venv {self.gen.live}: {text}")


def decide(gen: Generation, stack: Stack, facts: dict, sources: tuple[Source, ...],
           host_cache: str, installer: str, verify: str) -> Install:
    """Everything `environment` will do, decided from the venv's read (`VenvState`, `facts`) before
    anything on the host changes: the one decider of the Environments step's venv, asked by its plan
    (deploys/environments.py), whose `Install` the operation applies. An untrusted venv or cache,
    another Python, a file that no source has or that differs from its pin, two kernels owning one
    package, uv asked for and not shipped: `plan.Refusal`, with the text the host fails with."""
    refuse_untrusted(facts, gen, host_cache)
    kind = _installer_kind(installer, sources, facts)
    tool = installer_mod.Installer(kind, gen.path, host_cache)
    base, build, build_why = _build_steps(gen, stack, facts)
    todo = plan(stack, base)
    _refuse_shared(gen, stack, base, todo)
    packages = [p for p in stack.packages if p.name in todo.install]
    chosen = _chosen_sources(gen, stack, packages, todo, sources, verify) if packages else {}
    if None in build:
        build[build.index(None)] = _new_venv_command(gen, stack, chosen, kind, tool)
    return Install(gen, stack, facts, base, tuple(build), build_why, todo, packages, chosen, kind,
                    tool, sources, host_cache)


def _build_steps(gen: Generation, stack: Stack, facts: dict) -> tuple[dict, list, str]:
    """The venv the install starts from, the commands that build the generation where it is not
    there yet (None in place of a new venv's: `_new_venv_command`), and why it is built."""
    wanted, live_state = facts["wanted"], facts["live_state"]
    if wanted is not None and not python_matches(stack, wanted):
        raise Refusal(f"{gen.path} holds Python {wanted['python']}, stack {stack.name} "
                             f"needs {stack.python}: remove it and re-run")
    if wanted is not None:
        return wanted, [], ""
    python = f"python{stack.python}"
    # One command per step: each is a round trip.
    build = [
        f"{{ command -v {python} >/dev/null || {{ echo '{python} not found on the host: stack "
        f"{stack.name} needs it' >&2; exit 1; }}; }} && "
    ]
    if python_matches(stack, live_state):
        build.append(
            clone_command(live_state["path"], gen, sorted({live_state["path"], gen.live})))
        build_why = (f"building generation {gen.id} beside the live {live_state['path']} (a "
                     "copy of it; only what differs is installed)")
        return live_state, build, build_why
    why = ("no venv yet" if live_state is None
           else f"the live one has Python {live_state['python']}")
    build.append(None)  # the new venv: with pip only if pip is to install into it
    build_why = (f"building generation {gen.id} from scratch ({why}; stack {stack.name} "
                 f"needs Python {stack.python})")
    return {"dists": {}}, build, build_why


def _refuse_shared(gen: Generation, stack: Stack, base: dict, todo: StackDiff) -> None:
    """Stop where two distributions that both stay would own one package directory."""
    conflicts = shared_after(base, stack, todo.remove)
    if conflicts:
        top, owners = next(iter(conflicts.items()))
        raise Refusal(
            f"{gen.path}: {top}/ is installed by both {' and '.join(owners)}: a stack may name "
            f"only one of them; drop the other from files/stacks/{stack.name}.yml"
        )


def _chosen_sources(gen: Generation, stack: Stack, packages: list[Package], todo: StackDiff,
                    sources: tuple[Source, ...],
                    verify: str) -> dict[str, tuple[Source, Path | None]]:
    """Where each of `packages` comes from (`resolve`); stops the host where two of the stack's
    distributions would install one file."""
    donors = {s.key: _donor_state(s, verify) for s in sources if s.kind == "donor"}
    chosen = resolve(stack, packages, sources, donors)
    # What the venv holds is checked before (`_refuse_shared`); what it will hold once these are in,
    # here, before anything is: found only on the installed venv, a second deploy would refuse the
    # generation the first one built.
    ahead = planned_overlaps(stack, todo.install, sources, chosen, donors)
    if ahead:
        more = f" (and {len(ahead) - 1} more pair(s))" if len(ahead) > 1 else ""
        raise Refusal(
            f"{gen.path}: stack {stack.name}: {ahead[0]}{more}; nothing was installed: a stack "
            "may name only one distribution of a file: drop the other from "
            f"files/stacks/{stack.name}.yml"
        )
    return chosen


def _new_venv_command(gen: Generation, stack: Stack, chosen: dict[str, tuple[Source, Path | None]],
                      kind: str, tool: installer_mod.Installer) -> str:
    """The generation made a new venv: with pip only if pip is to install into it."""
    installs = any(source.kind != "donor" for source, _ in chosen.values())
    new_venv = tool.new_venv(f"python{stack.python}", with_pip=installs and kind == "pip")
    return (f"mkdir -p {shlex.quote(gen.live + '.generations')} && "
            f"rm -rf {shlex.quote(gen.path)} && {new_venv}")


def donor_path(source: Source) -> str:
    """The donor's venv to copy from: the one at `path`, else its host's live venv."""
    path = source.path or source.live_venv
    if path is None:
        raise Refusal(f"{host.name}: donor {source.location}: no venv to copy from (neither "
                             "`path` nor its host's `venv_path` given)")
    return path



def _donor_state(source: Source, verify: str = "fast") -> dict | None:
    """The donor's venv, as `VenvState` reads it (one call to the donor); None when unreachable or
    absent.

    Read with this host's `verify_env`, so that a file the donor has altered (the GPU image's
    replaced `certifi/cacert.pem`) keeps its distribution from being copied: a copy would fail our
    own check on every run.
    """
    donor = donor_host(source.location)
    if not donor.connected:
        return None
    path = donor_path(source)
    facts = host_reads.get(donor, VenvState, live=path, wanted=path,
                           host_cache="/nonexistent", verify=verify)
    if facts is not None and facts.get("untrusted"):
        # Its files would become this generation's, run by root: a donor's venv must be root's too.
        logger.warning(f"{host.name}: donor {source.location}'s venv {path} is not used: "
                       f"{'; '.join(facts['untrusted'][:2])}")
        return None
    return None if facts is None else facts["wanted"]


def wheelhouse_of(sources: tuple[Source, ...]) -> str | None:
    return next((s.location for s in sources if s.kind == "wheelhouse"), None)


def _installer_kind(choice: str, sources: tuple[Source, ...], facts: dict) -> str:
    if choice == "pip":
        return "pip"
    house = wheelhouse_of(sources)
    available = facts["uv"] or (
        house is not None and installer_mod.uv_wheel(Path(house), facts["machine"]) is not None)
    if available:
        return "uv"
    if choice == "uv":
        raise Refusal(
            f"installer: uv, but no uv {installer_mod.UV_VERSION} wheel for {facts['machine']} "
            f"is in the wheelhouse ({house}); rebuild it with python -m tools.wheelhouse, "
            "or set installer: auto"
        )
    return "pip"
