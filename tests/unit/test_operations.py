"""Operations with facts given: facts in, commands (or a no-op) out. No SSH, no root.

Each operation body (`op._inner`, the undecorated generator) runs against a pyinfra host
whose `get_fact` answers from a dict, so a case is just the facts and what must be yielded.
pyinfra's own `files.put`, nested in our operations, reads `File`/`Directory`/`Sha1File`
facts; `FakeFs` answers those from a small picture of the host's files.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import pytest
from pyinfra.api import FunctionCommand, OperationError, State
from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra.facts.server import TmpDir

from configuration import patch_sets
from configuration.errors import DataError
from operations import remote
from operations.environment import patches
from operations.model import models
from operations.service import lifecycle, readiness, service_user
from report import summary
from tests.unit.hosts import make_host
from tests.unit.remote_calls import remote_call

# Running an operation against given facts ----------------------------------------------


@dataclass
class FakeFs:
    """The host's files as pyinfra's file facts see them: path -> sha1 of content, and directories."""

    files: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)

    def facts(self) -> dict[type, Callable[..., Any]]:
        return {
            File: lambda path: {"size": 1, "mode": 644, "user": "root", "group": "root"} if path in self.files else None,
            Directory: lambda path: {"mode": 755, "user": "root", "group": "root"} if path in self.dirs else None,
            Sha1File: lambda path: self.files.get(path),
            TmpDir: lambda: "/tmp",
        }


@dataclass
class Result:
    commands: list  # str, or ("put", local, remote), or ("call", function name)
    noops: list[str]
    logs: list[str]
    summary: dict = field(default_factory=dict)  # the run's summary rows (report/summary.py)


def _shown(command) -> Any:
    if isinstance(command, str):
        return command
    if isinstance(command, FileUploadCommand):
        return ("put", str(command.src) if isinstance(command.src, (str, Path)) else "<bytes>", command.dest)
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    if isinstance(command, FunctionCommand):
        return ("call", command.function.__name__)
    raise AssertionError(f"unexpected command {command!r}")


def run(op, facts: dict[type, Any], fs: FakeFs | None = None, data: dict | None = None, executing: bool = False, **kwargs) -> Result:
    """Run `op`'s body on a fresh host (with host data `data`) whose facts come from `facts` (values or callables of the fact's kwargs).

    `executing`: as pyinfra runs it to execute it (other operations' did_change known), not in its change check."""
    host = make_host({}, data)
    if executing:
        host.state.is_executing = True
    answers = {**(fs or FakeFs()).facts(), **facts}

    def get_fact(cls, *args, **fact_kwargs):
        if cls not in answers:
            raise AssertionError(f"operation asked for an unexpected fact {cls.__name__}({fact_kwargs})")
        value = answers[cls]
        return value(**fact_kwargs) if callable(value) else copy.deepcopy(value)

    with (
        mock.patch.object(host, "get_fact", side_effect=get_fact),
        mock.patch.object(host, "noop") as noop,
        mock.patch.object(host, "log") as log,
        ctx_state.use(host.state),
        ctx_host.use(host),
    ):
        commands = [_shown(c) for c in op._inner(**kwargs)]
    return Result(commands, [c.args[0] for c in noop.call_args_list], [c.args[0] for c in log.call_args_list],
                  summary.rows(host.state))


def sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


# models.staged -------------------------------------------------------------------------

SRC = "/root/models/Qwen3.6-27B"
DEST = "/dev/shm/Qwen3.6-27B"
STAGE = ("stage_model", [SRC, DEST, ".sglang-deploy-staged.json"])
LISTING = {"config.json": 812, "model-00001-of-00002.safetensors": 4_000_000_000, "tokenizer/vocab.json": 2_000_000}


def model_state() -> dict:
    """A StagedModel fact for a converged copy (manifest entries are [size, sha256])."""
    marker = {"files": {rel: [size, "f" * 64] for rel, size in LISTING.items()}}
    return {"src": dict(LISTING), "dest": dict(LISTING), "marker": marker, "free": 64 * 2**30}


def run_staged(state) -> Result:
    return run(models.staged, {models.StagedModel: lambda src, dest: copy.deepcopy(state)}, src=SRC, dest=DEST)


def test_model_staged_and_matching_yields_nothing():
    result = run_staged(model_state())
    assert result.commands == []
    assert result.noops == [f"model {DEST} is staged and matches {SRC} (checked: names, sizes, mtimes)"]


MODEL_DRIFTS = [
    ("not-staged", {"dest": None, "marker": None}, "not staged"),
    ("missing-file", {"dest": {k: v for k, v in LISTING.items() if k != "config.json"}}, "missing config.json"),
    ("size-differs", {"dest": {**LISTING, "model-00001-of-00002.safetensors": 1_000}}, "size differs: model-00001-of-00002.safetensors"),
    ("no-marker", {"marker": None}, "no staging manifest (not staged by us, or interrupted)"),
    ("corrupt-marker", {"marker": {"corrupt": True}}, "no staging manifest (not staged by us, or interrupted)"),
    ("source-changed", {"src": {**LISTING, "model-00002-of-00002.safetensors": 3}}, "source changed since staging"),
    ("source-file-resized", {"src": {**LISTING, "config.json": 813}}, "source changed since staging"),
]


def test_a_file_beside_a_staged_model_that_its_manifest_does_not_name_is_not_drift():
    assert models.drift({**model_state(), "dest": {**LISTING, "stray.bin": 1}}) is None


@pytest.mark.parametrize(("changes", "reason"), [c[1:] for c in MODEL_DRIFTS], ids=[c[0] for c in MODEL_DRIFTS])
def test_model_drift_yields_one_stage_command(changes, reason):
    state = {**model_state(), **changes}

    assert models.drift(state) == reason
    result = run_staged(state)
    assert [remote_call(c) for c in result.commands] == [STAGE]
    assert result.noops == []
    assert result.logs == [f"model {DEST}: {reason}: staging from {SRC}"]


def test_model_file_modified_after_staging_is_restaged_with_the_staged_copy_hashed():
    state = {**model_state(), "suspect_hashes": {"config.json": "0" * 64}}
    assert models.drift(state) == "content differs (modified after staging): config.json"
    # A fast stage would hard-link the same-size bad file back: this one hashes what it keeps.
    assert [remote_call(c) for c in run_staged(state).commands] == [("stage_model", [SRC, DEST, ".sglang-deploy-staged.json", "--verify", "full"])]


def test_model_source_missing_still_runs_the_stage_script_which_says_so():
    result = run_staged({**model_state(), "src": None})
    assert [remote_call(c) for c in result.commands] == [STAGE]
    assert result.logs == [f"model {DEST}: source missing: staging from {SRC}"]


def test_model_drift_lists_at_most_three_missing_files():
    state = {**model_state(), "dest": {}}
    assert models.drift(state) == "missing config.json, model-00001-of-00002.safetensors, tokenizer/vocab.json"
    many = {f"f{i}": 1 for i in range(5)}
    state = {"src": many, "dest": {}, "marker": {"files": {k: [1, "x"] for k in many}}}
    assert models.drift(state) == "missing f0, f1, f2 ..."


def test_stage_command_quotes_paths_and_carries_the_script():
    command = models.StagedModel().command("/root/models/my model", "/dev/shm/my model")
    assert command.startswith("(cd / && exec python3 -I - '/root/models/my model' '/dev/shm/my model' .sglang-deploy-staged.json <<'PYEOF'\n")
    assert command.endswith("\nPYEOF\n)")


# patches.applied -----------------------------------------------------------------------

VENV = "/root/venv_sglang"
SITE = f"{VENV}/lib/python3.11/site-packages"
BACKUPS = f"{VENV}/.sglang-deploy/patches/demo/original"
REPLACED = "sglang/srt/speculative/ddtree.py"  # the set replaces this file
ADDED = "sglang/srt/speculative/ddtree_kernels.py"  # the set adds this one
ORIGINAL_TEXT = b"def draft():\n    return 'original'\n"
PATCHED_TEXT = b"def draft():\n    return 'patched'\n"
ADDED_TEXT = b"KERNELS = ()\n"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def patch_set(tmp_path, monkeypatch) -> patch_sets.PatchSet:
    root = tmp_path / "patches"
    folder = root / "demo"
    for rel, text in ((REPLACED, PATCHED_TEXT), (ADDED, ADDED_TEXT)):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(text)
    (folder / "patchset.yml").write_text(
        "name: demo\n"
        'base: {distribution: sglang, version: "0.5.23"}\n'
        "files:\n"
        f"  {REPLACED}: {{sha256: {sha256(PATCHED_TEXT)}, original: {sha256(ORIGINAL_TEXT)}}}\n"
        f"  {ADDED}: {{sha256: {sha256(ADDED_TEXT)}, original: null}}\n"
    )
    monkeypatch.setattr(patch_sets, "PATCHES_DIR", root)
    patch_sets.load_patch_set.cache_clear()
    yield patch_sets.load_patch_set("demo")
    patch_sets.load_patch_set.cache_clear()


_UNSET = object()


def installed(version="0.5.23", replaced=sha256(PATCHED_TEXT), added=sha256(ADDED_TEXT), backups=(), record=_UNSET) -> dict:
    """An InstalledFiles fact: by default the set is applied (and, see run_patches, recorded as such)."""
    fact = {
        "version": version,
        "files": {REPLACED: replaced, ADDED: added},
        "backups": {REPLACED: REPLACED in backups, ADDED: ADDED in backups},
    }
    if record is not _UNSET:
        fact["record"] = record
    return fact


def record_written(patch_set, command) -> bool:
    record = f"{VENV}/.sglang-deploy/patches/{patch_set.name}/applied.json"
    return isinstance(command, str) and command.endswith(f"mv {record}.tmp {record}") and patch_set.digest in command


def run_patches(patch_set, state, present=True) -> Result:
    # The installed files exist (with other content) unless the fact says they are missing.
    fs = FakeFs(
        files={f"{SITE}/{rel}": "0" * 40 for rel, sha in state["files"].items() if sha is not None},
        dirs={f"{SITE}/sglang/srt/speculative"},
    )
    if "record" not in state:
        # The host records the set as applied exactly when every file holds the patched content.
        fully = all(state["files"][f.path] == f.sha256 for f in patch_set.files)
        state = {**state, "record": patches.applied_record(patch_set) if fully else None}
    facts = {patches.InstalledFiles: lambda **kw: copy.deepcopy(state)}
    return run(patches.applied, facts, fs, patch_set=patch_set, venv_path=VENV, site_packages=SITE, present=present)


def put(patch_set, rel) -> list:
    """The patched file is uploaded into a root-only file beside its target and renamed over it (a new inode)."""
    tmp = f"{SITE}/{rel}.sglang-deploy.tmp"
    return [
        f"install -d -m 755 {SITE}/{Path(rel).parent} && rm -f {tmp} && install -m 600 /dev/null {tmp}",
        ("put", str(patch_set.root / rel), tmp),
        f"chown root:root {tmp} && chmod 644 {tmp} && mv -f {tmp} {SITE}/{rel}",
    ]


def pycache(rel) -> str:
    stem = Path(rel).stem
    return f"rm -f {SITE}/{Path(rel).parent}/__pycache__/{stem}.*.pyc"


BACKUP_REPLACED = (
    f"mkdir -p {BACKUPS}/sglang/srt/speculative && [ -e {BACKUPS}/{REPLACED} ] || cp -p {SITE}/{REPLACED} {BACKUPS}/{REPLACED}"
)


def test_patch_set_loads(patch_set):
    assert (patch_set.name, patch_set.distribution, patch_set.version) == ("demo", "sglang", "0.5.23")
    assert [(f.path, f.original) for f in patch_set.files] == [(REPLACED, sha256(ORIGINAL_TEXT)), (ADDED, None)]


def test_patch_set_applied_yields_nothing(patch_set):
    result = run_patches(patch_set, installed())
    assert result.commands == []
    assert result.noops == ["patch set demo is applied (2 files)"]


def test_patch_over_the_original_backs_it_up_then_puts(patch_set):
    result = run_patches(patch_set, installed(replaced=sha256(ORIGINAL_TEXT)))
    assert result.commands[:-1] == [BACKUP_REPLACED, *put(patch_set, REPLACED), pycache(REPLACED)]
    assert record_written(patch_set, result.commands[-1])
    assert result.noops == []


def test_patch_fresh_install_backs_up_and_adds(patch_set):
    result = run_patches(patch_set, installed(replaced=sha256(ORIGINAL_TEXT), added=None))
    assert result.commands == [
        BACKUP_REPLACED, *put(patch_set, REPLACED), pycache(REPLACED),
        *put(patch_set, ADDED), pycache(ADDED), result.commands[-1],
    ]
    assert record_written(patch_set, result.commands[-1])


def test_patched_file_drifted_with_a_backup_is_put_again(patch_set):
    result = run_patches(patch_set, installed(replaced="e" * 64, backups=(REPLACED,), record=patches.applied_record(patch_set)))
    assert result.commands == [*put(patch_set, REPLACED), pycache(REPLACED)]
    assert any("was changed on the host (sha256 eeeeeeeeeeee" in line for line in result.logs)


def test_added_file_drifted_is_put_again_without_a_backup(patch_set):
    result = run_patches(patch_set, installed(added="e" * 64, record=patches.applied_record(patch_set)))
    assert result.commands == [*put(patch_set, ADDED), pycache(ADDED)]


def test_replaced_file_missing_is_copied(patch_set):
    result = run_patches(patch_set, installed(replaced=None, record=patches.applied_record(patch_set)))
    assert result.commands == [*put(patch_set, REPLACED), pycache(REPLACED)]


def test_unexpected_content_without_backup_fails_naming_the_file_and_the_hashes(patch_set):
    with pytest.raises(OperationError) as caught:
        run_patches(patch_set, installed(replaced="e" * 64))
    message = str(caught.value)
    assert f"{SITE}/{REPLACED} has sha256 {'e' * 64}" in message
    assert f"the original it was written against ({sha256(ORIGINAL_TEXT)})" in message
    assert f"the patched file ({sha256(PATCHED_TEXT)})" in message


@pytest.mark.parametrize(("found", "shown"), [("0.5.22", "sglang 0.5.22"), (None, "sglang (not installed)")])
def test_wrong_base_version_fails_naming_both_versions(patch_set, found, shown, monkeypatch):
    monkeypatch.setattr(State, "is_executing", True, raising=False)  # planning previews a venv not built yet (below)
    with pytest.raises(OperationError) as caught:
        run_patches(patch_set, installed(version=found))
    assert str(caught.value).startswith(f"patch set demo was written for sglang 0.5.23, the venv {VENV} has {shown}: ")


def test_planning_previews_the_set_over_a_generation_this_run_builds(patch_set):
    # --dry (and the diff before a run) reads a generation an earlier operation of the run builds:
    # it does not exist yet, so the set is shown as applied over a fresh install (issue 11).
    result = run_patches(patch_set, installed(version=None, replaced=None, added=None))
    assert result.commands == [
        f"mkdir -p {BACKUPS}/sglang/srt/speculative && [ -e {BACKUPS}/{REPLACED} ] || cp -p {SITE}/{REPLACED} {BACKUPS}/{REPLACED}",
        *put(patch_set, REPLACED), pycache(REPLACED), *put(patch_set, ADDED), pycache(ADDED),
        result.commands[-1],
    ]
    assert record_written(patch_set, result.commands[-1])
    assert any(f"{VENV} gets a fresh" in line for line in result.logs)


def test_revert_restores_the_original_and_removes_the_added_file(patch_set):
    result = run_patches(patch_set, installed(backups=(REPLACED,)), present=False)
    assert result.commands == [
        f"cp -p {BACKUPS}/{REPLACED} {SITE}/{REPLACED}.sglang-deploy-tmp && mv -f {SITE}/{REPLACED}.sglang-deploy-tmp {SITE}/{REPLACED}", pycache(REPLACED),
        f"rm -f {SITE}/{ADDED}", pycache(ADDED),
        f"rm -f {VENV}/.sglang-deploy/patches/demo/applied.json",
    ]


def test_revert_when_reverted_yields_nothing(patch_set):
    result = run_patches(patch_set, installed(replaced=sha256(ORIGINAL_TEXT), added=None), present=False)
    assert (result.commands, result.noops) == ([], ["patch set demo is reverted (2 files)"])


def test_revert_without_a_backup_fails_naming_the_file(patch_set):
    with pytest.raises(OperationError) as caught:
        run_patches(patch_set, installed(), present=False)
    assert f"{SITE}/{REPLACED}" in str(caught.value) and "backup" in str(caught.value)


def test_patch_set_digest_follows_its_files(patch_set, tmp_path):
    other = patch_sets.PatchSet("demo", "sglang", "0.5.23", (patch_sets.PatchFile(REPLACED, "1" * 64, None),), tmp_path)
    same = patch_sets.PatchSet("demo", "sglang", "0.5.23", (patch_sets.PatchFile(REPLACED, "1" * 64, None),), tmp_path / "x")
    assert other.digest == same.digest
    assert other.digest != patch_set.digest
    assert dataclasses.replace(other, version="0.5.24").digest != other.digest


@pytest.mark.parametrize(
    ("edit", "key", "fix"),
    [
        (lambda text: text.replace("name: demo", "name: other"), "name", "must be 'demo' (the directory name)"),
        (lambda text: text.replace('version: "0.5.23"', "version: null"), "base", "must be {distribution: sglang"),
        (lambda text: text.replace(sha256(ADDED_TEXT), "1" * 64), f"files.{ADDED}.sha256", "has sha256"),
        (lambda text: text.replace(f"  {ADDED}:", "  ../evil.py:"), "files.../evil.py", "without '..'"),
        (lambda text: text.replace(f"  {ADDED}:", "  sglang/missing.py:"), "files.sglang/missing.py", "is missing beside patchset.yml"),
        (lambda text: text.replace("original: null", "original: abc"), f"files.{ADDED}.original", "must be the sha256 of the replaced original"),
    ],
    ids=["name", "base-version", "stale-manifest", "dotdot", "file-missing", "bad-original"],
)
def test_bad_patch_set_manifest(patch_set, edit, key, fix):
    manifest = patch_set.root / "patchset.yml"
    manifest.write_text(edit(manifest.read_text()))
    patch_sets.load_patch_set.cache_clear()
    with pytest.raises(DataError) as caught:
        patch_sets.load_patch_set("demo")
    assert str(caught.value).startswith(f"files/patches/demo/patchset.yml: {key}: ")
    assert fix in caught.value.fix


def test_unknown_patch_set(patch_set):
    with pytest.raises(DataError, match="files/patches/nope/patchset.yml: \\(file\\): .*must exist and be valid YAML"):
        patch_sets.load_patch_set("nope")


# readiness.ready -----------------------------------------------------------------------


def run_ready(state, restarted=None) -> Result:
    return run(
        readiness.ready,
        {readiness.ServiceState: lambda **kw: copy.deepcopy(state)},
        service="ddtree", unit="sglang-ddtree.service", bind="0.0.0.0", port=30000, timeout=1800, restarted=restarted,
    )


def test_ready_service_not_restarted_is_a_noop():
    result = run_ready({"active": "active", "health": 200, "uptime_s": 61.4, "pid": 4242})
    assert result.commands == []
    assert result.noops == ["service ddtree answers /health on port 30000"]
    assert result.summary == {"gpu-a": {"ddtree": {"endpoint": "http://0.0.0.0:30000", "state": "ready", "ready": "already (up 61 s, pid 4242)"}}}


def test_the_verdict_that_a_service_serves_is_read_no_earlier_than_its_max_age(monkeypatch):
    """The host's read at the lock may be minutes old when a late gate decides (hosts run operations in step): the
    gate asks host_reads for an answer no older than VERDICT_MAX_AGE_S (host_reads.fresh, tested in test_host_reads)
    before it reads the state it decides from."""
    order = []
    monkeypatch.setattr(readiness.host_reads, "fresh", lambda host, cls, age: order.append(("fresh", cls, age)))
    result = run(
        readiness.ready,
        {readiness.ServiceState: lambda **kw: order.append(("read",)) or {"active": "active", "health": 200, "uptime_s": 1.0, "pid": 7}},
        service="ddtree", unit="sglang-ddtree.service", bind="0.0.0.0", port=30000, timeout=1800,
    )
    assert result.commands == []
    assert order == [("fresh", readiness.ServiceState, readiness.VERDICT_MAX_AGE_S), ("read",)]
    assert readiness.VERDICT_MAX_AGE_S <= 60


@pytest.mark.parametrize(
    "state",
    [
        {"active": "active", "health": 503, "uptime_s": 5.0, "pid": 1},
        {"active": "activating", "health": None, "uptime_s": None, "pid": None},
        {"active": "failed", "health": None, "uptime_s": None, "pid": None},
    ],
    ids=["warming-up", "activating", "failed"],
)
def test_service_not_answering_is_waited_for(state):
    assert run_ready(state).commands == [("call", "_gate")]


def test_restarted_service_is_always_waited_for_without_reading_facts(monkeypatch):
    # No ServiceState answer is given: reading it would fail the test.
    monkeypatch.setattr(State, "is_executing", True, raising=False)
    result = run(
        readiness.ready, {},
        service="ddtree", unit="sglang-ddtree.service", bind="127.0.0.1", port=30000, timeout=1800, restarted=lambda: True,
    )
    assert result.commands == [("call", "_gate")]


@pytest.mark.parametrize(("bind", "address"), [("0.0.0.0", "127.0.0.1"), ("::", "127.0.0.1"), ("localhost", "127.0.0.1"), ("10.0.0.5", "10.0.0.5")])
def test_probe_address(bind, address):
    assert readiness.probe_address(bind) == address


def test_changed_patch_set_is_named_from_the_applied_record(patch_set):
    old = patches.applied_record(patch_set)
    old["digest"], old["files"][ADDED] = "0" * 64, "1" * 64
    result = run_patches(patch_set, installed(record=old))
    assert any(f"patch set demo changed since it was applied: {ADDED}" in line for line in result.logs)
    assert record_written(patch_set, result.commands[-1])


def test_changed_base_is_named_from_the_applied_record_before_refusing(patch_set):
    assert patches._explain_record(patch_set, patches.applied_record(patch_set), "0.5.24") == [f"patch set {patch_set.name}: the base changed since it was applied: sglang==0.5.23 -> sglang==0.5.24"]
    with pytest.raises(OperationError, match=r"was written for sglang 0\.5\.23, the venv /root/venv_sglang has sglang 0\.5\.24: "
                       r"use a stack with sglang 0\.5\.23, or port the patch set"):
        run_patches(patch_set, installed(version="0.5.24", record=patches.applied_record(patch_set)))


def test_ready_with_no_state_read_stops_the_host_with_a_message():
    with pytest.raises(OperationError, match="could not read the state of sglang-x.service .*the connection dropped"):
        run(readiness.ready, {readiness.ServiceState: lambda **kw: None}, service="x", unit="sglang-x.service", bind="127.0.0.1", port=30000, timeout=60)


# lifecycle.running ----------------------------------------------------------------------

UNIT = "sglang-x.service"
WATCHED = ("/etc/systemd/system/sglang-x.service", "/root/venv_sglang")
RECORD = ("service_state", ["--record", UNIT, *WATCHED])


def unit_state(**changes) -> dict:
    """A ServiceState answer for a converged service: loaded, enabled, running, nothing newer, recorded."""
    state = {"load": "loaded", "active": "active", "sub": "running", "pid": 4242, "restarts": 0, "health": 200,
             "health_error": None, "uptime_s": 100.0, "newer": [], "recorded": True, "enabled": "enabled", "need_reload": False}
    return {**state, **changes}


def run_lifecycle(state: dict, executing: bool = False, unit_changed=None, inputs_changed=None, outcome=None, held=None) -> Result:
    asked = []

    def fact(**kwargs):
        asked.append(kwargs)
        return state

    result = run(lifecycle.running, {readiness.ServiceState: fact}, executing=executing, unit=UNIT, unit_path=WATCHED[0], bind="0.0.0.0", port=30000,
                 inputs=WATCHED, unit_changed=unit_changed, inputs_changed=inputs_changed, outcome=outcome, held=held)
    # The very read that changed_since_start and ready make: one answer from the host's read.
    assert asked == [{"unit": UNIT, "address": "127.0.0.1", "port": 30000, "inputs": WATCHED}]
    return result


def calls(result: Result) -> list:
    return [remote_call(c) if c.startswith("(cd / && exec python3 ") else c for c in result.commands]


def never():
    raise AssertionError("did_change asked before the operation executes")


def test_lifecycle_of_a_converged_service_changes_nothing():
    result = run_lifecycle(unit_state(), executing=True, unit_changed=lambda: False, inputs_changed=lambda: False)
    assert result.commands == [] and result.noops == [f"{UNIT} is enabled", f"{UNIT} runs its current inputs"]


def test_lifecycle_enables_starts_and_records_a_stopped_disabled_service():
    outcome = lifecycle.Restarted()
    result = run_lifecycle(unit_state(active="inactive", sub="dead", enabled="disabled", recorded=False), executing=True,
                           unit_changed=lambda: False, inputs_changed=lambda: False, outcome=outcome)
    assert calls(result) == [f"systemctl enable {UNIT}", f"systemctl start {UNIT}", RECORD]
    assert outcome() is True


@pytest.mark.parametrize("enabled", [None, "", "disabled", "masked", "linked", "enabled-runtime"])
def test_lifecycle_enables_a_unit_not_enabled_at_boot(enabled):
    assert calls(run_lifecycle(unit_state(enabled=enabled))) == [f"systemctl enable {UNIT}"]


@pytest.mark.parametrize("sub", ["failed", "dead", "auto-restart", "start-pre", None])
def test_lifecycle_starts_a_unit_that_is_not_running(sub):
    assert calls(run_lifecycle(unit_state(sub=sub))) == [f"systemctl start {UNIT}", RECORD]


def test_lifecycle_reloads_and_restarts_when_this_run_rewrote_the_unit():
    outcome = lifecycle.Restarted()
    result = run_lifecycle(unit_state(), executing=True, unit_changed=lambda: True, inputs_changed=lambda: True, outcome=outcome)
    assert calls(result) == ["systemctl daemon-reload", f"systemctl restart {UNIT}", RECORD]
    assert outcome() is True


def test_a_held_replica_is_not_restarted_and_says_why():
    """Its service's rollout halted earlier in this run: no reload, restart or record; the outcome carries why."""
    outcome = lifecycle.Restarted()
    result = run_lifecycle(unit_state(), executing=True, unit_changed=lambda: True, inputs_changed=lambda: True, outcome=outcome,
                           held=lambda restarting: "the rollout of x halted")
    assert result.commands == [] and outcome() is False and outcome.held == "the rollout of x halted"


def test_a_hold_touches_only_what_would_restart():
    """A replica with nothing to (re)start is not held: it only gets what it needs (an enable)."""
    outcome = lifecycle.Restarted()
    result = run_lifecycle(unit_state(enabled="disabled"), executing=True, unit_changed=lambda: False, inputs_changed=lambda: False,
                           outcome=outcome, held=lambda restarting: "halted")
    assert calls(result) == [f"systemctl enable {UNIT}"] and outcome.held is None


def test_a_hold_is_asked_whether_it_restarts_the_running_replica_or_starts_a_stopped_one():
    """A restart takes a serving replica down (counted against the others: rollout.Hold); a start only adds one."""
    asked = []

    def held(restarting):
        asked.append(restarting)
        return None

    run_lifecycle(unit_state(), executing=True, unit_changed=lambda: True, inputs_changed=lambda: True, held=held)
    run_lifecycle(unit_state(active="inactive", sub="dead"), executing=True, unit_changed=lambda: True,
                  inputs_changed=lambda: True, held=held)
    assert asked == [True, False]


def test_lifecycle_restarts_when_another_input_changed_in_this_run():
    result = run_lifecycle(unit_state(), executing=True, unit_changed=lambda: False, inputs_changed=lambda: True)
    assert calls(result) == [f"systemctl restart {UNIT}", RECORD]


def test_lifecycle_restarts_onto_inputs_that_changed_since_the_process_started():
    # An earlier run changed the venv link and stopped before its restart.
    result = run_lifecycle(unit_state(newer=["/root/venv_sglang"]), executing=True, unit_changed=lambda: False, inputs_changed=lambda: False)
    assert calls(result) == [f"systemctl restart {UNIT}", RECORD]


def test_lifecycle_reloads_a_unit_systemd_holds_an_old_copy_of_before_restarting_onto_it():
    # An earlier run wrote the unit and died before daemon-reload and restart: its content is not the one
    # the process was started with, and systemd still holds the old copy.
    result = run_lifecycle(unit_state(need_reload=True, newer=[WATCHED[0]]), executing=True, unit_changed=lambda: False, inputs_changed=lambda: False)
    assert calls(result) == ["systemctl daemon-reload", f"systemctl restart {UNIT}", RECORD]


def test_lifecycle_reloads_a_unit_systemd_holds_an_old_copy_of_before_starting_it():
    result = run_lifecycle(unit_state(need_reload=True, sub="dead", recorded=False), executing=True, unit_changed=lambda: False, inputs_changed=lambda: False)
    assert calls(result) == ["systemctl daemon-reload", f"systemctl start {UNIT}", RECORD]


def test_lifecycle_leaves_a_touched_unit_of_a_running_service_alone():
    # A touch makes systemd flag the file as newer than its loaded copy; the content is what the process runs.
    result = run_lifecycle(unit_state(need_reload=True), executing=True, unit_changed=lambda: False, inputs_changed=lambda: False)
    assert calls(result) == []


def test_lifecycle_records_a_running_process_no_record_covers():
    outcome = lifecycle.Restarted()
    result = run_lifecycle(unit_state(recorded=False), executing=True, unit_changed=lambda: False, inputs_changed=lambda: False, outcome=outcome)
    assert calls(result) == [RECORD] and outcome() is False


def test_lifecycle_judges_by_the_host_alone_before_executing():
    # pyinfra's change check (and --dry) run the body before other operations executed: their
    # did_change cannot be asked, and the outcome is left for the executing run to set.
    outcome = lifecycle.Restarted()
    assert calls(run_lifecycle(unit_state(), unit_changed=never, inputs_changed=never, outcome=outcome)) == []
    assert calls(run_lifecycle(unit_state(sub="dead"), unit_changed=never, inputs_changed=never, outcome=outcome)) == [
        f"systemctl start {UNIT}", RECORD]
    assert outcome() is False


# operations/service/on_host/service_state.py, run here against a stand-in systemctl ---------------------


@pytest.fixture
def service_host(tmp_path, monkeypatch):
    """A `systemctl` that reports an active unit with MainPID from $PID, in this test's own cgroup (the servers the
    tests start answer from this process: peer identity), and a record dir in tmp_path."""
    import os
    import subprocess
    import sys
    import time

    from tests.unit.remote_calls import own_control_group

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text(
        "#!/bin/sh\n"
        "echo LoadState=loaded; echo ActiveState=active; echo SubState=running; echo MainPID=$PID; echo NRestarts=0\n"
        f"echo ActiveEnterTimestampMonotonic=$ENTERED; echo ControlGroup={own_control_group()}\n"
    )
    (bindir / "systemctl").chmod(0o755)
    script = remote.script("service_state").replace('"/var/lib/sglang-deploy/started"', repr(str(tmp_path / "started")))
    entered = int((time.monotonic() - 100) * 1e6)  # started 100 s ago

    def call(*args, pid=4242):
        env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "PID": str(pid), "ENTERED": str(entered)}
        out = subprocess.run([sys.executable, "-", *args], input=script, capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    return call


def test_service_state_compares_content_with_what_the_process_was_started_with(tmp_path, service_host):
    import os

    unit = tmp_path / "sglang-x.service"
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    gens = tmp_path / "venv.generations"
    for gen in ("g1", "g2"):
        (gens / gen / ".sglang-deploy").mkdir(parents=True)
        (gens / gen / ".sglang-deploy" / "installed").write_text("")
    venv_link = tmp_path / "venv"
    venv_link.symlink_to(gens / "g1")
    model = tmp_path / "shm" / "M"
    model.mkdir(parents=True)
    marker = model / models.MARKER
    marker.write_text('{"files": {"a": [1, "x", 2]}}')
    inputs = [str(unit), str(venv_link), str(marker)]
    read = lambda **kw: service_host("sglang-x.service", "127.0.0.1", "1", *inputs, **kw)  # noqa: E731

    # Before any record, the older rule: inputs modified after the process started (all of them, here).
    first = read()
    assert first["recorded"] is False and first["newer"] == inputs
    service_host("--record", "sglang-x.service", *inputs)
    again = read()
    assert (again["recorded"], again["newer"], again["pid"]) == (True, [], 4242)

    # Touched, rewritten with the same bytes, a file dropped beside the model: no change.
    os.utime(unit)
    unit.write_text(unit.read_text())
    (model / "notes.txt").write_text("junk")
    os.utime(marker)
    assert read()["newer"] == []

    # Content: the unit edited; a re-stage (a new marker, same manifest); the venv switched or repaired in place.
    unit.write_text("[Service]\nExecStart=/bin/false\n")
    assert read()["newer"] == [str(unit)]
    service_host("--record", "sglang-x.service", *inputs)
    (model / "new").write_text(marker.read_text())
    os.rename(model / "new", marker)
    assert read()["newer"] == [str(marker)]
    service_host("--record", "sglang-x.service", *inputs)
    stamp = gens / "g1" / ".sglang-deploy" / "installed"
    os.utime(stamp, ns=(stamp.stat().st_atime_ns, stamp.stat().st_mtime_ns + 10**9))
    assert read()["newer"] == [str(venv_link)]
    service_host("--record", "sglang-x.service", *inputs)
    venv_link.unlink()
    venv_link.symlink_to(gens / "g2")
    assert read()["newer"] == [str(venv_link)]

    # A process started outside the deploy (another PID; a reboot re-staged its model before it started,
    # 100 s ago): it loaded what is there now. An input changed after its start still counts.
    service_host("--record", "sglang-x.service", *inputs)
    old = marker.stat().st_mtime_ns - 200 * 10**9
    (model / "new").write_text(marker.read_text())
    os.utime(model / "new", ns=(old, old))
    os.rename(model / "new", marker)
    assert read()["newer"] == [str(marker)]  # the process the deploy started did not load it
    assert (read(pid=999)["recorded"], read(pid=999)["newer"]) == (True, [])
    unit.write_text("[Service]\nExecStart=/bin/sh\n")
    assert read(pid=999)["newer"] == [str(unit)]


def test_service_state_reports_a_port_that_does_not_speak_http(tmp_path, service_host):
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def banner():
        conn, _ = server.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.2p1\r\n")
        conn.recv(1024)
        conn.close()

    threading.Thread(target=banner, daemon=True).start()
    state = service_host("sglang-x.service", "127.0.0.1", str(server.getsockname()[1]))
    server.close()
    assert state["health"] is None and "not with HTTP" in state["health_error"]


@pytest.mark.parametrize(
    "answer, health, error",
    [
        ([b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"], 200, None),
        ([b"HTTP/1.1 503 Service Unavailable\r\n\r\n"], 503, None),
        ([b"HTTP/1.0 30", b"2 Found\r\nLocation: /elsewhere\r\n\r\n"], 302, None),  # status line in two packets; not followed
        ([], None, None),  # accepted, then closed without a word: nothing answers
        ([b"220 smtp.example ESMTP\r\n"], None, "not with HTTP"),
        ([b"HTTP/1.1 OK\r\n\r\n"], None, "not with HTTP"),
    ],
)
def test_service_state_reads_the_health_status_line_as_http_defines_it(service_host, answer, health, error):
    import socket
    import threading
    import time

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    asked = []

    def serve():
        conn, _ = server.accept()
        asked.append(conn.recv(4096))
        for part in answer:
            conn.sendall(part)
            time.sleep(0.1)  # each part arrives on its own
        conn.close()
        if health == 200:  # /ready is asked next: an engine without it
            conn, _ = server.accept()
            asked.append(conn.recv(4096))
            conn.sendall(b"HTTP/1.1 404 Not Found\r\n\r\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    state = service_host("sglang-x.service", "127.0.0.1", str(server.getsockname()[1]))
    thread.join(5)
    server.close()
    assert (state["health"], state["health_error"] and "not with HTTP") == (health, error)
    assert asked and asked[0].startswith(b"GET /health HTTP/1.1\r\n")
    assert state["ready"] is None  # not asked, or the engine has no /ready (404)


@pytest.mark.parametrize(("ready_answer", "ready"), [(b"200 OK", 200), (b"503 Service Unavailable", 503),
                                                     (b"404 Not Found", None), (b"401 Unauthorized", None)])
def test_service_state_asks_ready_once_health_answers(service_host, ready_answer, ready):
    """Who serves now is judged as the gate judges it: /ready where the engine has it (503 while draining or paused);
    an engine without it (404, or 401 where an older engine guards unknown paths with its key) is judged by /health."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(2)
    asked = []

    def serve():
        for status in (b"200 OK", ready_answer):
            conn, _ = server.accept()
            asked.append(conn.recv(4096).split(b"\r\n", 1)[0])
            conn.sendall(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\n\r\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    state = service_host("sglang-x.service", "127.0.0.1", str(server.getsockname()[1]))
    thread.join(5)
    server.close()
    assert asked == [b"GET /health HTTP/1.1", b"GET /ready HTTP/1.1"]
    assert (state["health"], state["ready"]) == (200, ready)


def test_service_state_says_nothing_answers_on_a_closed_port(service_host):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        state = service_host("sglang-x.service", "127.0.0.1", str(port))
    assert (state["health"], state["health_error"]) == (None, None)


# service_user.account ---------------------------------------------------------------------


def test_account_fact_reads_one_passwd_entry_and_its_primary_group():
    fact = service_user.Account()
    assert fact.process(["sglang:x:999:997::/var/lib/sglang:/usr/sbin/nologin", "@@", "sglang"]) == {
        "user": "sglang", "uid": 999, "home": "/var/lib/sglang", "shell": "/usr/sbin/nologin", "group": "sglang"}
    assert fact.process(["@@"]) is None
    assert fact.process([]) is None
    # The command answers for an absent account too (getent exits 2): the read must not fail the host.
    proc = subprocess.run(["sh", "-c", fact.command(user="no-such-account-here")], capture_output=True, text=True)
    assert proc.returncode == 0 and fact.process(proc.stdout.splitlines()) is None
    proc = subprocess.run(["sh", "-c", fact.command(user="root")], capture_output=True, text=True)
    assert fact.process(proc.stdout.splitlines())["uid"] == 0


ACCOUNT = {"user": "sglang", "group": "sglang", "home": "/var/lib/sglang", "shell": "/usr/sbin/nologin"}


def test_account_is_created_as_a_system_user_without_a_home_dir():
    result = run(service_user.account, {service_user.Account: None}, **ACCOUNT)
    assert result.commands == ["useradd -d /var/lib/sglang -s /usr/sbin/nologin -g sglang -r -M sglang"]


def test_account_that_matches_changes_nothing():
    found = {"user": "sglang", "uid": 999, "home": "/var/lib/sglang", "shell": "/usr/sbin/nologin", "group": "sglang"}
    result = run(service_user.account, {service_user.Account: found}, **ACCOUNT)
    assert result.commands == [] and result.noops


def test_account_drifted_by_hand_is_put_back():
    found = {"user": "sglang", "uid": 999, "home": "/home/sglang", "shell": "/bin/bash", "group": "users"}
    result = run(service_user.account, {service_user.Account: found}, **ACCOUNT)
    assert result.commands == ["usermod -d /var/lib/sglang -s /usr/sbin/nologin -g sglang sglang"]

