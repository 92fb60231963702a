"""Source overlays: `patches.applied(patch_set, ...)` copies a tracked patch set into an installed
package.

A patch set is `files/patches/<name>/`, its manifest read and checked on the control machine with
the data (configuration/patch_sets.py: `load_patch_set`, `PatchSet`). Originals are backed up inside
the venv before they are first replaced, so `present=False` restores them byte for byte.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from pyinfra import host
from pyinfra.api import FactBase

# PATCHES_DIR and load_patch_set are re-exported: tests/lab and bench read them here
from configuration.patch_sets import PATCHES_DIR as PATCHES_DIR
from configuration.patch_sets import PatchSet
from configuration.patch_sets import load_patch_set as load_patch_set
from operations import remote
from operations.run import host_reads, read_batch, this_run
from operations.run.file_write import replace_file
from operations.run.host_reads import operation
from operations.run.plan import Refusal

_TMP = ".sglang-deploy-tmp"


@read_batch.batched()
class InstalledFiles(FactBase):
    """Installed version of ``distribution`` and sha256 (or None) of each path under
    ``site_packages``."""

    def command(self, site_packages: str, distribution: str, backup_dir: str, record: str,
                paths: tuple[str, ...]) -> str:
        quoted = " ".join(shlex.quote(p) for p in paths)
        return remote.command(
            "installed_files", shlex.quote(site_packages), shlex.quote(distribution),
            shlex.quote(backup_dir), shlex.quote(record), quoted,
        )

    def process(self, output):
        return json.loads("\n".join(output))


def _backup_dir(venv_path: str, name: str) -> str:
    return f"{venv_path}/.sglang-deploy/patches/{name}/original"


def _record_path(venv_path: str, name: str) -> str:
    return f"{venv_path}/.sglang-deploy/patches/{name}/applied.json"


def read_arguments(patch_set: PatchSet, venv_path: str, site_packages: str) -> dict:
    """The `InstalledFiles` read of `patch_set` in a generation: the same arguments for the
    operation and the plan."""
    return {"site_packages": site_packages, "distribution": patch_set.distribution,
            "backup_dir": _backup_dir(venv_path, patch_set.name),
            "record": _record_path(venv_path, patch_set.name),
            "paths": tuple(f.path for f in patch_set.files)}


def drift(patch_set: PatchSet, installed: dict | None) -> dict:
    """What `applied` would find, from `InstalledFiles`: applied (every file and the record as the
    set says), or what drifted: {"name", "applied", "drifted": [...], "note"}."""
    if not installed:
        return {"name": patch_set.name, "applied": False, "drifted": [],
                "note": "not read (the generation is not built)"}
    if installed.get("version") != patch_set.version:
        found = installed.get("version") or "(not installed)"
        return {"name": patch_set.name, "applied": False, "drifted": [],
                "note": f"{patch_set.distribution} {found} in the venv, the set is for "
                        f"{patch_set.version}"}
    drifted = []
    for f in patch_set.files:
        found = (installed.get("files") or {}).get(f.path)
        if found == f.sha256:
            continue
        if found is None:
            drifted.append(f"{f.path} missing")
        elif found == f.original:
            drifted.append(f"{f.path} is the original (not applied)")
        else:
            drifted.append(f"{f.path} changed on the host (sha256 {found[:12]})")
    if installed.get("record") != applied_record(patch_set):
        drifted.append("applied-state record differs")
    return {"name": patch_set.name, "applied": not drifted, "drifted": drifted, "note": None}


def applied_record(patch_set: PatchSet) -> dict:
    """What the host records once the set is applied: enough to name what changed later."""
    return {
        "name": patch_set.name,
        "digest": patch_set.digest,
        "base": f"{patch_set.distribution}=={patch_set.version}",
        "files": {f.path: f.sha256 for f in patch_set.files},
    }


def _explain_record(patch_set: PatchSet, record: dict | None,
                    found_version: str | None) -> list[str]:
    """Name, from the applied-state record, what changed since the set was last applied."""
    if not record or record.get("corrupt"):
        return []
    said = []
    if record.get("base") != f"{patch_set.distribution}=={found_version}":
        said.append(f"patch set {patch_set.name}: the base changed since it was applied: "
                    f"{record.get('base')} -> {patch_set.distribution}=={found_version}")
    if record.get("digest") != patch_set.digest:
        old = record.get("files", {})
        changed = sorted(f.path for f in patch_set.files if old.get(f.path) != f.sha256)
        dropped = sorted(set(old) - {f.path for f in patch_set.files})
        what = ", ".join(changed + [f"{p} (dropped)" for p in dropped]) or "its manifest"
        said.append(f"patch set {patch_set.name} changed since it was applied: {what}")
    return said


def file_steps(patch_set: PatchSet, patch_file, found: str | None, has_backup: bool, present: bool,
               site_packages: str, backups: str) -> tuple[str | None, list]:
    """What one file of the set needs, from its sha256 on the host (`found`) and whether its
    original is backed up: (the line to log or None, the commands; none when the file is as wanted).
    Refuses a file it cannot account for."""
    target = f"{site_packages}/{patch_file.path}"
    backup = f"{backups}/{patch_file.path}"
    said = None
    commands: list = []
    if present:
        if found == patch_file.sha256:
            return None, []
        if found is None:
            said = f"patch {patch_set.name}: {patch_file.path} is missing: copying it"
        elif found == patch_file.original:
            said = f"patch {patch_set.name}: {patch_file.path}: replacing the original"
            commands.append(f"mkdir -p {shlex.quote(str(PurePosixPath(backup).parent))} && [ -e "
                            f"{shlex.quote(backup)} ] || cp -p {shlex.quote(target)} "
                            f"{shlex.quote(backup)}")
        elif not has_backup and patch_file.original is not None:
            raise Refusal(
                f"patch set {patch_set.name}: {target} has sha256 {found}, neither the original it "
                f"was written against ({patch_file.original}) nor the patched file "
                f"({patch_file.sha256}): someone else changed the installed package and its RECORD "
                f"does not show it; reinstall {patch_set.distribution} {patch_set.version} (remove "
                "the venv generation) and re-run"
            )
        else:
            said = (f"patch {patch_set.name}: {patch_file.path} was changed on the host "
                    f"(sha256 {found[:12]}, expected {patch_file.sha256[:12]}): restoring the "
                    "patched file")
        # Written beside and renamed over: a venv generation may share the file's inode
        # (a hard link) with the live generation, which must not change under the service.
        commands += list(replace_file(target, patch_set.local(patch_file), "644"))
    elif patch_file.original is None:
        if found is None:
            return None, []
        commands.append(f"rm -f {shlex.quote(target)}")
    else:
        if found == patch_file.original:
            return None, []
        if not has_backup:
            raise Refusal(
                f"patch set {patch_set.name}: cannot restore {target}: no backup of its original "
                f"at {backup}; reinstall {patch_set.distribution} {patch_set.version} to get the "
                "pristine file back"
            )
        commands.append(f"cp -p {shlex.quote(backup)} {shlex.quote(target + _TMP)} && mv -f "
                        f"{shlex.quote(target + _TMP)} {shlex.quote(target)}")
    pycache = PurePosixPath(target).parent / "__pycache__"
    # its stale bytecode
    commands.append("rm -f "
                    f"{shlex.quote(str(pycache))}/{shlex.quote(PurePosixPath(target).stem)}.*.pyc")
    return said, commands


def record_steps(patch_set: PatchSet, record_path: str, record: dict | None,
                 present: bool) -> list[str]:
    """The commands that make the applied-state record what the set wants (none when it already
    is)."""
    wanted = applied_record(patch_set) if present else None
    if record == wanted:
        return []
    if not present:
        return [f"rm -f {shlex.quote(record_path)}"]
    text = json.dumps(wanted, sort_keys=True)
    return [f"mkdir -p {shlex.quote(str(PurePosixPath(record_path).parent))} && "
            f"printf '%s\\n' {shlex.quote(text)} > {shlex.quote(record_path)}.tmp && "
            f"mv {shlex.quote(record_path)}.tmp {shlex.quote(record_path)}"]


@dataclass(frozen=True)
class PatchSteps:
    """What `applied` does to one patch set (`decide`): the lines it logs and its commands (none
    where the set is as wanted)."""

    said: tuple[str, ...]
    commands: tuple


def decide(patch_set: PatchSet, state: dict, venv_path: str, site_packages: str,
           present: bool = True, fresh: bool = False) -> PatchSteps:
    """The one decider of a patch set, asked by the Environments step's plan and by `applied`, from
    `InstalledFiles` (`state`). `fresh`: decide over a fresh install of the set's base (every file
    its original), as the run will find it where the venv step (re)installs the base or builds the
    generation. A base of another version, or a file changed on the host with no backup of its
    original: `plan.Refusal`."""
    said: list[str] = []
    if fresh:
        said.append(f"patch set {patch_set.name}: {venv_path} gets a fresh "
                    f"{patch_set.distribution} {patch_set.version} in this run: the set is planned "
                    "over it")
        state = {"version": patch_set.version,
                 "files": {f.path: f.original for f in patch_set.files},
                 "backups": {f.path: False for f in patch_set.files}, "record": None}
    found_version = state["version"]
    if found_version != patch_set.version:
        raise Refusal(
            f"patch set {patch_set.name} was written for {patch_set.distribution} "
            f"{patch_set.version}, the venv {venv_path} has {patch_set.distribution} "
            f"{found_version or '(not installed)'}: use a stack with {patch_set.distribution} "
            f"{patch_set.version}, or port the patch set", what=f"patch set {patch_set.name}")
    backups = _backup_dir(venv_path, patch_set.name)
    commands: list = []
    for patch_file in patch_set.files:
        line, steps = file_steps(patch_set, patch_file, state["files"][patch_file.path],
                                 state["backups"][patch_file.path], present,
                                 site_packages, backups)
        said += [line] if line else []
        commands += steps
    commands += record_steps(patch_set, _record_path(venv_path, patch_set.name), state["record"],
                             present)
    return PatchSteps(tuple(said), tuple(commands))


def over_fresh_base(state: dict, present: bool, base_installed: bool, executing: bool) -> bool:
    """Is the set decided over a fresh install of its base? While the run is planned (the change
    check, --dry, the host's plan), where the venv step leaves one: it builds the generation (no
    base read yet) or reinstalls the base (`base_installed`). Executing, never: the run reads what
    the host then holds."""
    return not executing and ((state["version"] is None and present) or base_installed)


@operation()
def applied(patch_set: PatchSet, venv_path: str, site_packages: str, present: bool = True,
            base_installed: bool = False):
    """
    Make the installed package hold the files of ``patch_set`` (or its originals).

    + patch_set: a `PatchSet` (from `load_patch_set`)
    + venv_path: the venv the package is installed in
    + site_packages: that venv's site-packages directory
    + present: ``False`` restores every original and removes the files the set added
    + base_installed: the venv step of this run (re)installs the base distribution (its plan's
      `venv_decide.Install.installs`): planned over a fresh install of it, as the run will find it

    Pinned base:
        The set is refused unless the installed base distribution has exactly the
        version the set was written for. Each replaced original is backed up once;
        stale bytecode of a replaced file is removed. The applied state is recorded in
        the venv, so that a changed set, a changed base or a file edited on the host
        is named by the next run (and by ``--dry``).

    **Example:**

    .. code:: python

        patches.applied(
            name="DDTree patch set on sglang 0.5.23",
            patch_set=load_patch_set("ddtree-sample"),
            venv_path="/root/venv_sglang",
            site_packages="/root/venv_sglang/lib/python3.11/site-packages",
        )
    """
    state = host_reads.get(host, InstalledFiles,
                           **read_arguments(patch_set, venv_path, site_packages))
    fresh = over_fresh_base(state, present, base_installed, this_run.executing())
    if not fresh:  # what changed since it was applied, named before any refusal
        for line in _explain_record(patch_set, state["record"], state["version"]):
            host.log(line)
    steps = decide(patch_set, state, venv_path, site_packages, present, fresh=fresh)
    for line in steps.said:
        host.log(line)
    yield from steps.commands
    if not steps.commands:
        state_word = "applied" if present else "reverted"
        host.noop(f"patch set {patch_set.name} is {state_word} ({len(patch_set.files)} files)")
