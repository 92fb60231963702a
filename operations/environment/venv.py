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
3. `venv.probed` runs the ABI probe (operations/environment/on_host/abi_probe.py) in it and, only if
   the probe passes, `venv.switched` points `venv_path` at it in one rename. The previous generation
   is kept (one) for rollback; older ones are deleted.

Trust: root runs `<venv_path>/bin/python` and installs from `host_wheel_cache`. The venv fact also
says why any of them (the link and where it leads, the generations, the wheel cache, uv, each wheel,
and every directory above them) is not root's alone; the host then stops before anything runs from
them (`refuse_untrusted`). The switch adopts only a venv of root's, and never deletes what is not.

Facts read every installed distribution (name, version with its local tag, installer, and
the files its RECORD names that are damaged: `verify_env: fast` compares sizes, and hashes
files modified after the generation's install stamp; `full` compares every file's sha256
with RECORD) of the wanted and the live generation in one fact, which a converged host's one
read returns with the others (operations/run/host_reads.py). A damaged distribution is reinstalled
from its sha256-checked wheel, re-extracted (its uv cache entry is dropped first).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand, OperationError

from configuration import wheels
from configuration.stacks import Package, Stack
from operations import remote
from operations.environment import installer as installer_mod
from operations.environment import transient
from operations.run import host_reads, read_batch, remote_call
from operations.run.host_reads import operation
from operations.run.plan import Refusal
from operations.transport import fanout, peer_keys, stream_ends, streaming

# Installed with every venv by `python -m venv`; kept unless the stack pins them.
BOOTSTRAP = {"pip", "setuptools", "wheel"}
VERIFY_MODES = ("fast", "full")
# Touched after every install into a generation: a fast check hashes the files modified after it.
STAMP = ".sglang-deploy/installed"


@dataclass(frozen=True)
class Generation:
    """One exact environment: the stack's pins plus the patch sets applied in it."""

    live: str  # venv_path, the symlink units run
    id: str

    @property
    def path(self) -> str:
        return f"{self.live}.generations/{self.id}"

    @property
    def python(self) -> str:
        return f"{self.path}/bin/python"


def generation(live: str, stack: Stack, patch_digests: dict[str, str]) -> Generation:
    """The generation for `stack` with these patch sets (name -> digest, in the order applied)."""
    digest = hashlib.sha256(f"python {stack.python}\n".encode())
    for p in stack.packages:
        digest.update(f"{p.name}=={p.version} {p.sha256 or p.file or ''}\n".encode())
    for name, patch_digest in patch_digests.items():
        digest.update(f"patch {name} {patch_digest}\n".encode())
    return Generation(live, f"{stack.name}-{digest.hexdigest()[:10]}")


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


# Facts ---------------------------------------------------------------------------------


@read_batch.batched(slow=True)
class VenvState(FactBase):
    """The live link, the wanted and live generations' distributions, the host's wheel cache.

    ``{"live": {"kind": "link"|"dir"|"absent", "target": ...}, "wanted": VENV|None,
    "live_state": VENV|None, "cache": {file: size},
    "uv": bool, "machine": "x86_64"}`` where VENV is ``{"python": "3.11.2", "dists":
    {name: {"version", "installer", "damaged": [...], "damaged_count"}},
    "shared": {top: [dists]}}``.
    """

    def command(self, live: str, wanted: str, host_cache: str, verify: str = "fast") -> str:
        return _venv_script(live, wanted, host_cache, verify)

    def process(self, output):
        return json.loads("\n".join(output))


# What a fast check said of a generation's RECORD index (environment/on_host/venv_state.py) that the
# deploy writes again.
INDEX_REWRITTEN = {
    "missing": "missing (a generation from before the deploy wrote indexes, "
               "or one it did not finish)",
    "stale": "stale (written for other .dist-info files than the generation holds now, "
             "or unreadable)",
}


def _venv_script(live: str, wanted: str, host_cache: str, mode: str) -> str:
    """environment/on_host/venv_state.py with its arguments: a read (`fast`, `full`: the fact), or
    `write-index`."""
    return remote.command(
        "venv_state", shlex.quote(live), shlex.quote(wanted), shlex.quote(host_cache),
        shlex.quote(installer_mod.uv_binary(host_cache)), shlex.quote(mode),
    )


def index_command(gen: Generation, host_cache: str) -> str:
    """Write the generation's RECORD index (environment/on_host/venv_state.py `write-index`)."""
    return _venv_script(gen.live, gen.path, host_cache, "write-index")


def unread(what: str, where: str) -> OperationError:
    """A fact that came back empty: pyinfra has already failed the host (its connection dropped, or
    the command died)."""
    return OperationError(
        f"{host.name}: could not read {what} ({where}): the connection dropped or the command "
        "failed (pyinfra's error above says which); nothing was changed on the host by this step: "
        "run the deploy again once it answers"
    )


def state_of(gen: Generation, host_cache: str, verify: str = "fast") -> dict:
    # the data's `verify_env` is validated before any host is touched
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, not {verify!r}")
    facts = host_reads.get(host, VenvState, live=gen.live, wanted=gen.path,
                           host_cache=host_cache, verify=verify)
    if facts is None:
        raise unread("the serving venv", gen.live)
    refuse_untrusted(facts, gen, host_cache)
    return facts


def refuse_untrusted(facts: dict, gen: Generation, host_cache: str) -> None:
    """Stop the host before anything runs from a venv, or installs from a wheel cache, that another
    user could have written or swapped (environment/on_host/venv_state.py: `untrusted`)."""
    found = facts.get("untrusted") or []
    if found:
        raise Refusal(
            f"root runs {gen.live}/bin/python and installs from {host_cache}, so "
            "they, what they hold and every directory above them must be root's and writable by "
            f"root alone: {'; '.join(found[:3])}"
            f"{f' (and {len(found) - 3} more)' if len(found) > 3 else ''}. "
            "Nothing was run or changed: make them root's (chown root:, chmod go-w), or set "
            "venv_path / host_wheel_cache to a place only root can write"
        )


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


_FIX_PATHS = r"""
import os, sys
where, venv, old = sys.argv[1], sys.argv[2], sys.argv[3:]
bindir = os.path.join(where, "bin")
for name in os.listdir(bindir):
    path = os.path.join(bindir, name)
    if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 1 << 20:
        continue
    with open(path, "rb") as handle:
        data = handle.read()
    new = data
    for prefix in old:
        new = new.replace(prefix.encode() + b"/", venv.encode() + b"/").replace(
            b"'" + prefix.encode() + b"'", b"'" + venv.encode() + b"'")
    if new != data:  # a new file: the old one may be a hard link shared with the live generation
        with open(path + ".tmp", "wb") as handle:
            handle.write(new)
        os.chmod(path + ".tmp", os.stat(path).st_mode & 0o7777)
        os.rename(path + ".tmp", path)
"""


def clone_command(source: str, gen: Generation, old_prefixes: list[str]) -> str:
    """A copy of `source` as the new generation; scripts' paths pointed at it; renamed in when
    whole.

    `--reflink=auto` shares extents only where the filesystem copies on write (btrfs, XFS): an
    edit there writes new blocks. Never hard links: a hand edit in one generation would reach
    the other, and a repair would find nothing to compare against.
    """
    # One partial directory per attempt: the copy of a deploy killed mid-build can go on running on
    # the host (it takes seconds for a real venv), and would refill a shared name while the next run
    # empties it. Whichever attempt completes first is renamed in; a later one finds the generation
    # there and leaves.
    partial = '"$partial"'
    prefixes = " ".join(shlex.quote(p) for p in old_prefixes)
    target = shlex.quote(gen.path)
    fix_paths = remote.isolated("python3",
                                f"-c {shlex.quote(_FIX_PATHS)} {partial} {target} {prefixes}")
    return (
        f"mkdir -p {shlex.quote(gen.live + '.generations')} && "
        f"{{ rm -rf {shlex.quote(gen.path)}.partial-* 2>/dev/null; true; }} && "
        f"partial=$(mktemp -d {target}.partial-XXXXXX) && rmdir \"$partial\" && "
        f"cp -a --reflink=auto {shlex.quote(source)} {partial} && "
        f"{fix_paths} && "
        f"sed -i '/^command *=/d' {partial}/pyvenv.cfg && "
        f"{{ mv -T {partial} {target} 2>/dev/null "
        f"|| {{ test -d {target} && rm -rf {partial}; }}; }}"
    )


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

    + gen: the wanted `Generation` (from `venv.generation`)
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
            gen=venv.generation("/root/venv_sglang", stack, {}),
            stack=stack,
            sources=(venv.Source("wheelhouse", "wheelhouse"),),
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


# `environment`, decided ------------------------------------------------------------------


@dataclass(frozen=True)
class Install:
    """What `environment` decided for one host before anything on it changes (`decide`); its
    commands are `_changes`."""

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
    wheel = installer_mod.uv_wheel(Path(_wheelhouse(install.sources)), facts["machine"])
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
                    f"{donor.location}:{_donor_path(donor)}: {', '.join(p.name for p in group)}")
        specs = [p.spec for p in group]
        if donor.location == host.name:
            # A venv on this very host: one pipe there, nothing through the control machine.
            yield _copy_within_host(_donor_path(donor), gen, specs)
        else:
            yield FunctionCommand(_stream_from_donor,
                                  (donor.location, _donor_path(donor), gen, specs), {})


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


def _donor_path(source: Source) -> str:
    """The donor's venv to copy from: the one at `path`, else its host's live venv."""
    path = source.path or source.live_venv
    if path is None:
        raise Refusal(f"{host.name}: donor {source.location}: no venv to copy from (neither "
                             "`path` nor its host's `venv_path` given)")
    return path


def _donor_host(name: str):
    donor = host.inventory.get_host(name)
    if not donor.connected:
        donor.connect(reason=f"to copy installed distributions to {host.name}",
                      raise_exceptions=False)
    return donor


def _donor_state(source: Source, verify: str = "fast") -> dict | None:
    """The donor's venv, as `VenvState` reads it (one call to the donor); None when unreachable or
    absent.

    Read with this host's `verify_env`, so that a file the donor has altered (the GPU image's
    replaced `certifi/cacert.pem`) keeps its distribution from being copied: a copy would fail our
    own check on every run.
    """
    donor = _donor_host(source.location)
    if not donor.connected:
        return None
    path = _donor_path(source)
    facts = host_reads.get(donor, VenvState, live=path, wanted=path,
                           host_cache="/nonexistent", verify=verify)
    if facts is not None and facts.get("untrusted"):
        # Its files would become this generation's, run by root: a donor's venv must be root's too.
        logger.warning(f"{host.name}: donor {source.location}'s venv {path} is not used: "
                       f"{'; '.join(facts['untrusted'][:2])}")
        return None
    return None if facts is None else facts["wanted"]


def _copy_within_host(donor_venv: str, gen: Generation, specs: list[str]) -> str:
    """Copy the donor venv's files of `specs` into the generation on the same host, then point its
    scripts at it.

    `cp -a` (not a pipe, so any failure is the command's status) makes new inodes: the
    generation shares no file with the donor, whose owner may edit or delete it.
    """
    args = " ".join(shlex.quote(a) for a in (donor_venv, *specs))
    prefixes = f"{shlex.quote(donor_venv)} \"$(readlink -f {shlex.quote(donor_venv)})\""
    fix_paths = remote.isolated("python3", f"-c {shlex.quote(_FIX_PATHS)} {shlex.quote(gen.path)} "
                                           f"{shlex.quote(gen.path)} {prefixes}")
    return (
        f"list=$(mktemp) && {remote.heredoc('python3', args, remote.script('donor_files'))}"
        f" > \"$list\" && "
        f"(cd {shlex.quote(donor_venv)}/ && xargs -d '\\n' -a \"$list\" cp -a --parents "
        f"-t {shlex.quote(gen.path)}) && rm -f \"$list\" && {fix_paths}"
    )


def _stream_from_donor(state, host, donor_name: str, donor_live: str, gen: Generation,
                       specs: list[str]) -> bool:
    """tar on the donor -> root's unpacker into the generation (no owner, setuid bit, device or link
    out of the tree of the donor's: streaming.unpack_command), relayed here between two OpenSSH
    processes (each over pyinfra's connection where OpenSSH does not reach that host); nothing lands
    on disk twice."""
    donor = _donor_host(donor_name)
    if not donor.connected:
        host.log_styled(f"donor {donor_name} is unreachable", fg="red", log_func=logger.error)
        return False
    args = " ".join(shlex.quote(a) for a in (donor_live, *specs))

    def listing(then: str = "") -> str:  # the donor's file list, `then` piped on
        return remote.heredoc("python3", args, remote.script("donor_files")) + then

    # Host to host where this host reaches the donor: a one-time key for exactly the distributions'
    # files, listed first.
    listed, output = remote_call.run(donor, listing(), f"listing donor {donor_name}'s files", 300)
    names = [line for line in output.stdout.splitlines() if line] if listed else []
    direct = peer_keys.granted(donor, host, donor_live, names, host.log) if names else None
    if direct:
        job = direct.job(f"from donor {donor_name}", 0, names, streaming.unpack_command(gen.path))
    else:
        tar = f"tar -C {shlex.quote(donor_live)}/ -cf - -T -"
        job = streaming.Job(f"from donor {donor_name}", 0,
                            stream_ends.sending_end(donor, listing(f" | {tar}"), log=host.log),
                            # as root's files
                            stream_ends.receiving_end(host, streaming.unpack_command(gen.path),
                                                    host.log))
    try:
        moved = streaming.transfer([job], 1)
    finally:
        if direct:
            direct.close()
    if not moved.ok:
        host.log_styled(f"copy from donor {donor_name} failed: {moved.why}", fg="red",
                        log_func=logger.error)
        return False
    # Console scripts name the donor's interpreter; point them at this generation's.
    resolved = remote_call.run(donor, f"readlink -f {shlex.quote(donor_live)}",
                               f"resolving donor {donor_name}'s venv", 60)[1].stdout.strip()
    prefixes = " ".join(shlex.quote(p) for p in sorted({resolved, donor_live}) if p)
    ok, _ = remote_call.run(
        host, remote.isolated("python3", f"-c {shlex.quote(_FIX_PATHS)} {shlex.quote(gen.path)} "
                                         f"{shlex.quote(gen.path)} {prefixes}"),
        "pointing the copied scripts at this generation", 300)
    via = (f"OpenSSH, {host.name} reading from {donor_name} directly" if direct
           else streaming.carried_by(donor, host))
    host.log(f"copied {len(specs)} distribution(s) from {donor_name}: {moved.sent / 2**20:.0f} MiB "
             f"in {moved.elapsed_s:.1f} s over {via}")
    return ok


def _wheelhouse(sources: tuple[Source, ...]) -> str | None:
    return next((s.location for s in sources if s.kind == "wheelhouse"), None)


def _installer_kind(choice: str, sources: tuple[Source, ...], facts: dict) -> str:
    if choice == "pip":
        return "pip"
    house = _wheelhouse(sources)
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


def probe_for(stack: Stack, launcher: str, gpu_args: dict) -> dict:
    """The ABI probe's arguments: the GPUs' (`gpus.GpuDecisions.probe_args`), the stack's kernel
    distributions, and the modules to import (the unit's launcher, and sglang's server entry point
    when the stack has sglang)."""
    modules = [launcher, "sglang.launch_server"] if "sglang" in stack.wanted() else [launcher]
    return {
        **gpu_args,
        "kernels": [p.name for p in stack.packages if p.name in ("sgl-kernel", "sglang-kernel")],
        "modules": list(dict.fromkeys(modules)),
        "torch": "torch" in stack.wanted(),
    }


@operation()
def probed(gen: Generation, probe: dict):
    """
    Run the ABI probe in generation ``gen``: it prints one line and fails the host when the
    environment cannot work (operations/environment/on_host/abi_probe.py).

    + gen: the `Generation` built by `venv.environment`
    + probe: the probe's arguments (kernel distributions, entry point modules, the driver's
      CUDA version and the GPUs' compute capabilities)

    Run it with ``_if`` set to "the generation or its patch sets changed, or it is not live yet".

    It imports the engine, so it runs as the preflight does, never as root: in a transient unit of
    its own, as a dynamic user (the service account may not exist yet: it is made after the
    environments), in the services' sandbox, with the generation bound read-only into an empty
    home and nothing of the caller's environment (`probe_command`).
    """
    yield probe_command(gen, probe)


# The sandbox the ABI probe runs in: the service unit's protections, with a throwaway user.
PROBE_SANDBOX = ("DynamicUser=yes", "ProtectHome=tmpfs", "ProtectSystem=strict", "PrivateTmp=yes",
                 "NoNewPrivileges=yes", "CapabilityBoundingSet=", "RestrictSUIDSGID=yes",
                 "UMask=0077")
PROBE_TIMEOUT_S = 600


# Root's half, after the probe: the bytecode of the sources the probe imported, written into the
# generation (which the service user cannot write), so that a service's start reads what was
# compiled here instead of compiling the engine from source at every start. argv: the generation;
# stdin: the probe's list. Only compiling, never importing (`-S`: not even site-packages' .pth
# files run), and only regular `.py` files inside the generation that root owns and no one else may
# write; a path the probe names elsewhere is skipped. As the import system writes bytecode: only
# where none is current for the source's mtime (compileall's own check), so a probe run again does
# not compile a source edited in place with its mtime kept over the bytecode the engine still runs
# (the venv check finds such an edit by its digest, tests/lab/test_convergence.py).
COMPILE_IMPORTED = """
import compileall, os, stat, sys
top = os.path.realpath(sys.argv[1]) + os.sep
compiled = 0
for line in sys.stdin:
    real = os.path.realpath(line.rstrip("\\n"))
    if not real.startswith(top) or not real.endswith(".py") or compiled >= 100000:
        continue
    try:
        st = os.lstat(real)
    except OSError:
        continue
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        continue
    try:
        compiled += compileall.compile_file(real, quiet=2)
    except OSError:
        pass
"""
IMPORTED_MARK = "SGLANG-DEPLOY-IMPORTED "


def probe_command(gen: Generation, probe: dict) -> str:
    """The probe in its transient unit, its output but the list of what it imported passed on; once
    it passed, root compiles that list (COMPILE_IMPORTED)."""
    run = transient.command(
        [*PROBE_SANDBOX, f"BindReadOnlyPaths={gen.path}"],
        {"PATH": transient.SYSTEM_PATH, "HOME": "/tmp"},
        [gen.python, "-I", "-", json.dumps(probe, sort_keys=True)],
        f"ABI probe of generation {gen.id}", PROBE_TIMEOUT_S)
    compile_ = remote.isolated(shlex.quote(gen.python),
                               f"-S -c {shlex.quote(COMPILE_IMPORTED)} {shlex.quote(gen.path)}")
    # time bound: the probe's own (RuntimeMaxSec); compiling is bounded by the list's length.
    return (f"cd / && probe_out=$({run} <<'PYEOF'\n{remote.script('abi_probe')}\nPYEOF\n); "
            f"probe_rc=$?; printf '%s\\n' \"$probe_out\" | grep -v '^{IMPORTED_MARK}'; "
            f"[ $probe_rc -eq 0 ] || exit $probe_rc; "
            f"printf '%s\\n' \"$probe_out\" | sed -n 's/^{IMPORTED_MARK}//p' | {compile_}")


@operation()
def switched(gen: Generation, live_target: str | None):
    """
    Make ``gen`` the live generation (``venv_path`` -> it, one rename), after `venv.probed`.

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
