"""Models in RAM: verified, atomic, incremental copies of the model store in the shm dir.

`/dev/shm` is a tmpfs: it is emptied on every reboot, and a half-finished copy there looks
like a model. So:

- `models.staged(src, dest)` keeps a verified copy of one model directory. The converged check
  is one remote call that reads names, sizes and mtimes: the staged copy against its marker
  (the manifest it was staged with; a staged file modified after the marker was written is
  hashed and compared with it), the source against its cached manifest. Files the manifest
  does not name (an operator's junk file) are ignored: never loaded by us, never deleted. Drift runs
  `model/on_host/stage_model.py`, which copies only the files that differ into a temporary sibling
  (the rest are hard-linked), checks each against the manifest and renames the directory into
  place. `verify="full"` re-hashes the staged copy in the check and repairs what differs.
- `models.unused_removed(shm_dir, keep)` removes the copies we staged that no service on the
  host uses any more; anything without our marker is never touched.
- `models.boot_staging(...)` installs `sglang-stage-models.service`, a oneshot unit that runs
  the same script at boot from `/etc/sglang-deploy/models.json`, so a rebooted host serves
  again without a deploy run. The service units are ordered after it and require it
  (`boot_unit_name(config)`).
- `stage_for_host(config)` adds all of these for a host (the `Models` component); a service is
  restarted when one of its models' operations changed something.
"""

from __future__ import annotations

import hashlib
import json
import shlex

from pyinfra import host
from pyinfra.api import FactBase

from configuration import host_paths
from configuration.host_paths import BOOT_LIST, BOOT_SCRIPT
from configuration.settings import HostConfig
from operations import remote
from operations.run import host_reads, progress, read_batch, templates
from operations.run.file_write import replace_file
from operations.run.host_reads import operation

MARKER = ".sglang-deploy-staged.json"
# The stage script's latest progress line (model/on_host/stage_model.py: PROGRESS_PATH), read by the
# progress watch while a model is staged.
STAGING_PROGRESS = "/run/sglang-deploy/staging.progress"
JOURNAL = ".sglang-deploy-partial.jsonl"
BOOT_UNIT = "sglang-stage-models.service"
BOOT_UNIT_PATH = host_paths.unit_path(BOOT_UNIT)
VERIFY_MODES = ("fast", "full")


# models.staged -------------------------------------------------------------------------


@read_batch.batched()
class StagedModel(FactBase):
    """Source listing and staged listing (``{relpath: size}`` or None), the source's cached hashes
    (``{relpath: sha256}``, None when missing or out of date), the staged marker and free bytes;
    why root may not trust the staged copy (``untrusted``) or the source (``src_untrusted``), or
    None; the sha256 of staged files modified after the marker (``suspect_hashes``); with
    ``verify="full"`` instead the sha256 of every staged file (``dest_hashes``)."""

    def command(self, src: str, dest: str, verify: str = "fast") -> str:
        extra = ("full",) if verify == "full" else ()
        return remote.command("model_state", shlex.quote(src), shlex.quote(dest), MARKER, *extra)

    def process(self, output):
        return json.loads("\n".join(output))


def _some(names, limit: int = 3) -> str:
    names = sorted(names)
    return ", ".join(names[:limit]) + (" ..." if len(names) > limit else "")


def drift(state: dict) -> str | None:
    """Why the staged copy is not a verified copy of the source, or None if it is.

    Decided from names and sizes, the marker and the source's cached manifest; ``suspect_hashes``
    (files modified after staging) and ``dest_hashes`` (a full verify: every file) add a content
    check. Staged files the source does not have are not drift: the stage script never puts
    one there, so it is someone else's; the engine loads the files its config and weight index
    name, and a later re-stage (for a real change) builds the copy from the manifest alone.
    """
    src, dest, marker = state["src"], state["dest"], state["marker"]
    if state.get("src_untrusted"):
        # The stage script refuses it, with what to change.
        return f"source not trusted ({state['src_untrusted']})"
    if dest is None:
        return "not staged"
    if state.get("untrusted"):
        # Another user's directory (or the engine's) with the right names, sizes and a copy of our
        # marker: the stage script moves it aside and stages afresh.
        return f"not staged by root ({state['untrusted']})"
    if not marker or not isinstance(marker.get("files"), dict):
        return "no staging manifest (not staged by us, or interrupted)"
    staged = marker["files"]
    if {rel: entry[0] for rel, entry in staged.items()} != src:
        return "source changed since staging"
    if "src_hashes" in state:
        if state["src_hashes"] is None:
            return "source manifest missing or out of date (files touched since they were hashed)"
        if {rel: entry[1] for rel, entry in staged.items()} != state["src_hashes"]:
            return "source changed since staging"
    missing = set(src) - set(dest)
    if missing:
        return f"missing {_some(missing)}"
    wrong = [rel for rel in src if dest.get(rel) != src[rel]]
    if wrong:
        return f"size differs: {_some(wrong)}"
    suspects = state.get("suspect_hashes") or {}
    differ = [rel for rel in src if rel in suspects and suspects[rel] != staged[rel][1]]
    if differ:
        return f"content differs (modified after staging): {_some(differ)}"
    hashes = state.get("dest_hashes")
    if hashes is not None:
        differ = [rel for rel in src if hashes.get(rel) != staged[rel][1]]
        if differ:
            return f"content differs (full verify): {_some(differ)}"
    return None


def staged_read(src: str, dest: str, verify: str) -> dict:
    """The `StagedModel` read's arguments: the same for the operation and the plan (one answer from
    the read)."""
    return {"src": src, "dest": dest, **({"verify": "full"} if verify == "full" else {})}


def stage_reason(state: dict) -> str | None:
    """Why the model must be staged (again), from its `StagedModel` read; None when its copy is
    current."""
    if state["src"] is None:
        # nothing to copy from: the stage script fails with the message that says so
        return "source missing"
    return drift(state)


def stage_command(src: str, dest: str, verify: str = "fast",
                  others: tuple[tuple[str, str], ...] = ()) -> str:
    args = [shlex.quote(src), shlex.quote(dest), MARKER]
    if verify == "full":
        args += ["--verify", "full"]
    for other_src, other_dest in others:
        args += ["--also", shlex.quote(other_src), shlex.quote(other_dest)]
    return remote.command("stage_model", *args)


@operation()
def staged(src: str, dest: str, verify: str = "fast", others: tuple[tuple[str, str], ...] = ()):
    """
    Keep a verified copy of the model directory ``src`` at ``dest``.

    + src: the model's durable directory on the host (in the model store); only read
    + dest: where the service loads it from (in the shm dir)
    + verify: ``fast`` (names, sizes and mtimes against the manifests; files modified after staging
      are hashed) or ``full`` (re-hash the staged copy)
    + others: ``(src, dest)`` of the host's other staged models, counted in the free-space check

    Staging:
        The manifest (per file: size, mtime, sha256 and crc32) is computed once and cached
        beside the source (``.sglang-deploy-manifest.json``, or under
        ``/var/cache/sglang-deploy/manifests`` if the store is read-only); a file is hashed
        again only when its size or mtime changed. The new copy is built in ``.<name>.partial``
        beside ``dest``: unchanged files are hard-linked from the current copy, the others copied
        and checked against the manifest; then the marker is written and the directory renamed
        into place. An interrupted copy is resumed by the next run; ``dest`` is never half-written.
        Free space (and available memory) is checked against everything the host still has to
        stage, before anything is copied.

    Trust:
        A staged copy is served only if it, its marker and everything in it are root's, no symlink,
        writable by root alone, under directories nobody else can write (``/dev/shm`` is sticky): a
        directory another user (or the engine) made there, a copy of our marker and all, is not
        staged, whatever it holds. The stage script renames it aside (``.<name>.untrusted-<time>``,
        never deleted) and stages afresh; a planted ``.<name>.partial`` is never resumed. A source
        that is not root's throughout is refused. What the script makes (the shm dir when missing,
        the partial copy and everything in it) it makes exclusively and checks on the handle; a
        directory is judged before it is read, and read without following a link, at most 32 levels
        deep.

    **Example:**

    .. code:: python

        models.staged(
            name="Stage Qwen3.6-27B into /dev/shm",
            src="/root/models/Qwen3.6-27B",
            dest="/dev/shm/Qwen3.6-27B",
        )
    """
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, not {verify!r}")
    state = host_reads.get(host, StagedModel, **staged_read(src, dest, verify))
    reason = stage_reason(state)
    if reason is None:
        touched = len(state.get("suspect_hashes") or {})
        hashed = (f"; {touched} file(s) modified after staging hashed: content unchanged"
                  if touched else "")
        host.noop(f"model {dest} is staged and matches {src} (checked: "
                  f"{'sha256' if verify == 'full' else 'names, sizes, mtimes'}{hashed})")
        return
    host.log(f"model {dest}: {reason}: staging from {src}")
    # A file whose content is wrong at the right size would be hard-linked into the new copy by a
    # fast stage (it trusts sizes): re-stage with the staged files hashed, so that it is copied
    # again.
    content = reason.startswith("content differs")
    yield stage_command(src, dest, "full" if content else verify, tuple(others))


# models.unused_removed -----------------------------------------------------------------


@read_batch.batched()
class OwnedInShm(FactBase):
    """``{"owned": {entry: "staged" | "partial" | "old"}, "in_units": [model, ...]}``: directories
    in the shm dir that carry our marker or journal, and the models there that an installed unit
    loads."""

    def command(self, shm_dir: str) -> str:
        return remote.command("model_owned", shlex.quote(shm_dir), MARKER, JOURNAL,
                              shlex.quote(host_paths.UNIT_DIR))

    def process(self, output):
        return json.loads("\n".join(output))


def unused(owned: dict[str, str], keep: tuple[str, ...] | list[str]) -> list[str]:
    """Entries of the shm dir to remove: our copies of models not in ``keep``, their interrupted
    copies, and any replaced copy (``.<name>.old``) left by an interrupted swap."""
    out = []
    for entry, kind in sorted(owned.items()):
        if kind == "staged" and entry not in keep:
            out.append(entry)
        elif kind == "partial" and entry[1:-len(".partial")] not in keep:
            out.append(entry)
        elif kind == "old":
            out.append(entry)
    return out


@operation()
def unused_removed(shm_dir: str, keep: tuple[str, ...] | list[str] = ()):
    """
    Remove from ``shm_dir`` the models we staged that are not in ``keep``.

    + shm_dir: the RAM disk models are staged into
    + keep: names of the models the host's services still load from it (models that an
      installed ``sglang-*`` unit loads are kept too)

    Ownership:
        Only directories carrying our marker (``.sglang-deploy-staged.json``) or the journal
        of an interrupted copy are candidates; anything else in ``shm_dir`` is never removed.

    **Example:**

    .. code:: python

        models.unused_removed(
            name="Unused staged models removed from /dev/shm",
            shm_dir="/dev/shm",
            keep=["Qwen3.6-27B"],
        )
    """
    state = host_reads.get(host, OwnedInShm, shm_dir=shm_dir)
    # A model an installed unit still loads stays: a service moved away keeps its models until
    # its unit is removed (after its new host answers), then the last pass releases them.
    remove = unused(state["owned"], [*keep, *state["in_units"]])
    if not remove:
        host.noop(f"no unused staged models in {shm_dir}")
        return
    for entry in remove:
        host.log(f"{shm_dir}/{entry}: staged by us, used by no service on this host: removing")
        yield f"rm -rf -- {shlex.quote(f'{shm_dir}/{entry}')}"


# models.boot_staging -------------------------------------------------------------------


@read_batch.batched()
class BootStaging(FactBase):
    """``{"files": {path: sha256}, "enabled": bool}`` for the boot unit's files (absent ones left
    out)."""

    def command(self, paths: tuple[str, ...] | list[str], unit: str) -> str:
        quoted = " ".join(shlex.quote(p) for p in paths)
        return (
            f"for f in {quoted}; do if [ -f \"$f\" ]; then sha256sum \"$f\"; fi; done; "
            f"echo \"enabled=$(systemctl is-enabled {shlex.quote(unit)} 2>/dev/null)\""
        )

    def process(self, output):
        found, enabled = {}, False
        for line in output:
            if line.startswith("enabled="):
                enabled = line.split("=", 1)[1].strip() == "enabled"
            elif line.strip():
                digest, path = line.split(None, 1)
                found[path.strip()] = digest
        return {"files": found, "enabled": enabled}


def boot_unit_name(config: HostConfig) -> str | None:
    """The unit that stages the host's shm models at boot (services: After= and Requires=), or
    None."""
    return BOOT_UNIT if config.staged_models else None


def boot_files(config: HostConfig) -> dict[str, tuple[str, str]]:
    """path -> (content, mode) of what the boot unit needs on the host (pure: tested without
    one)."""
    models = [{"name": m.name, "src": m.store_path, "dest": m.load_path}
              for m in config.staged_models]
    # No verify mode here: at boot the shm dir is empty and every file is copied and checked anyway,
    # and a one-off `--data verify_models=full` run must not rewrite the list.
    listing = json.dumps({"marker": MARKER, "models": models}, indent=2, sort_keys=True) + "\n"
    unit = templates.template("sglang-stage.service.j2").render(
        host_name=config.host,
        shm_dir=config.shm_dir,
        mounts=sorted({config.shm_dir, *(m.store_path for m in config.staged_models)}),
        models=[m.name for m in config.staged_models],
        script=BOOT_SCRIPT,
        listing=BOOT_LIST,
    )
    return {
        BOOT_SCRIPT: (remote.script("stage_model"), "755"),
        BOOT_LIST: (listing, "644"),
        BOOT_UNIT_PATH: (unit, "644"),
    }


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def boot_stale(state: dict, wanted: dict[str, tuple[str, str]]) -> list[str]:
    """The boot unit's files (`BootStaging` fact) whose content is not the wanted one, in order."""
    return [path for path, (content, _mode) in sorted(wanted.items())
            if state["files"].get(path) != _sha256(content)]


def boot_wanted(config: HostConfig) -> dict[str, tuple[str, str]]:
    """What `boot_staging` is given for `config`: the files to keep (shm models), or the paths to
    remove."""
    return (boot_files(config) if config.staged_models
            else {p: ("", "644") for p in (BOOT_SCRIPT, BOOT_LIST, BOOT_UNIT_PATH)})


@operation()
def boot_staging(wanted: dict[str, tuple[str, str]], unit: str = BOOT_UNIT, present: bool = True):
    """
    Install (or remove) the oneshot unit that stages the host's models at boot.

    + wanted: path -> (content, mode) of the script, the model list and the unit
      (``boot_files(config)``)
    + unit: the unit's name
    + present: install and enable it, or disable it and remove its files

    Boot:
        ``/dev/shm`` is empty after a reboot; the unit runs the deploy's own stage script
        (installed at ``/usr/local/lib/sglang-deploy/stage_model.py``) over the list in
        ``/etc/sglang-deploy/models.json``, with the same manifests and checks. It is not
        stopped on removal: services that still require it would be stopped with it.

    **Example:**

    .. code:: python

        models.boot_staging(
            name="Boot unit sglang-stage-models.service stages models into /dev/shm",
            wanted=models.boot_files(config),
        )
    """
    state = host_reads.get(host, BootStaging, paths=sorted(wanted), unit=unit)
    if present:
        stale = boot_stale(state, wanted)
        for path in stale:
            host.log(f"{path}: {'differs' if path in state['files'] else 'missing'}: writing it")
            yield from replace_file(path, wanted[path][0], wanted[path][1])
        if any(path.endswith(".service") for path in stale):
            yield "systemctl daemon-reload"
        if not state["enabled"]:
            yield f"systemctl enable {shlex.quote(unit)}"
        if not stale and state["enabled"]:
            host.noop(f"unit {unit} is installed and enabled")
        return
    if not state["files"] and not state["enabled"]:
        host.noop(f"unit {unit} is absent")
        return
    if state["enabled"]:
        yield f"systemctl disable {shlex.quote(unit)}"
    yield "rm -f -- " + " ".join(shlex.quote(path) for path in sorted(state["files"]))
    yield "systemctl daemon-reload"


# The host's models ---------------------------------------------------------------------


def stage_for_host(config: HostConfig) -> dict:
    """Add the operations that stage every `shm` model of the host's services; name -> operation.

    Unused copies go first (they free space for new ones); the boot unit comes last. A host
    with no `shm` models gets only checks, which find nothing on a host we never staged to.
    The shm dir is made by the stage script itself (remote/_common.make_dirs: exclusively, then
    checked on its handle), never by a `mkdir -p` after a check: in a world-writable /dev/shm
    another user could make it first.
    """
    models = config.staged_models
    keep = [m.name for m in models]
    unused_removed(name=f"Unused staged models removed from {config.shm_dir}",
                   shm_dir=config.shm_dir, keep=keep)
    ops = {}
    for i, model in enumerate(models):
        ops[model.name] = staged(
            name=f"Model {model.name} staged in {config.shm_dir}",
            src=model.store_path,
            dest=model.load_path,
            verify=config.verify_models,
            # Later models count in this one's free-space check: a shortfall stops before any copy.
            others=tuple((m.store_path, m.load_path) for m in models[i + 1:]),
        )
        progress.watch(ops[model.name], f"staging {model.name} into {config.shm_dir}",
                       progress.last_line(STAGING_PROGRESS))
    boot_staging(
        name=f"Boot unit {BOOT_UNIT} stages models into {config.shm_dir}",
        wanted=boot_wanted(config),
        present=bool(models),
    )
    return ops


def release_unused(config: HostConfig) -> None:
    """The last pass, after services no longer placed here are removed: release their models."""
    unused_removed(
        name=f"Staged models of removed services released from {config.shm_dir}",
        shm_dir=config.shm_dir,
        keep=[m.name for m in config.staged_models],
    )
