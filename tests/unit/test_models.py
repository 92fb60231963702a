"""Model staging without a host: drift decisions, operations (facts in, commands out), and the
remote scripts run here on temporary directories (they are stdlib scripts for any Linux host)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configuration import settings
from configuration.settings import HostConfig
from operations import remote
from operations.model import models
from tests.unit.hosts import make_host
from tests.unit.remote_calls import load_remote_module, remote_call
from tests.unit.test_operations import run

MARKER = models.MARKER
SRC = "/root/models/Qwen3.6-27B"
DEST = "/dev/shm/Qwen3.6-27B"
LISTING = {"config.json": 812, "model-00001-of-00002.safetensors": 4_000_000_000, "tokenizer/vocab.json": 2_000_000}
HASHES = {rel: f"{i:064x}" for i, rel in enumerate(LISTING)}


def converged() -> dict:
    marker = {"files": {rel: [size, HASHES[rel], 7] for rel, size in LISTING.items()}}
    return {"src": dict(LISTING), "src_hashes": dict(HASHES), "dest": dict(LISTING), "marker": marker, "free": 64 * 2**30}


# drift ---------------------------------------------------------------------------------

DRIFTS = [
    ("converged", {}, None),
    ("source-manifest-stale", {"src_hashes": None}, "source manifest missing or out of date (files touched since they were hashed)"),
    ("source-content-changed", {"src_hashes": {**HASHES, "config.json": "e" * 64}}, "source changed since staging"),
    ("full-verify-clean", {"dest_hashes": dict(HASHES)}, None),
    ("full-verify-corrupt", {"dest_hashes": {**HASHES, "tokenizer/vocab.json": "0" * 64}}, "content differs (full verify): tokenizer/vocab.json"),
    ("full-verify-all-differ", {"dest_hashes": {}}, "content differs (full verify): config.json, model-00001-of-00002.safetensors, tokenizer/vocab.json"),
    ("not-staged", {"dest": None, "marker": None}, "not staged"),
    ("marker-without-files", {"marker": {"source": SRC}}, "no staging manifest (not staged by us, or interrupted)"),
]


@pytest.mark.parametrize(("changes", "reason"), [c[1:] for c in DRIFTS], ids=[c[0] for c in DRIFTS])
def test_drift(changes, reason):
    assert models.drift({**converged(), **changes}) == reason


def test_drift_without_source_hashes_in_the_fact_decides_on_names_and_sizes():
    state = converged()
    del state["src_hashes"]
    assert models.drift(state) is None


# models.staged -------------------------------------------------------------------------


def run_staged(state, **kwargs):
    calls = []

    def fact(src, dest, verify="fast"):
        calls.append(verify)
        return copy.deepcopy(state)

    result = run(models.staged, {models.StagedModel: fact}, src=SRC, dest=DEST, **kwargs)
    return result, calls


def test_converged_model_is_one_cheap_fact_and_no_command():
    result, calls = run_staged(converged())
    assert result.commands == [] and calls == ["fast"]
    assert result.noops == [f"model {DEST} is staged and matches {SRC} (checked: names, sizes, mtimes)"]


def test_a_file_modified_after_staging_is_repaired_by_a_stage_that_hashes_the_staged_copy():
    state = {**converged(), "suspect_hashes": {"config.json": "e" * 64}}
    result, calls = run_staged(state)
    assert calls == ["fast"]
    assert [remote_call(c) for c in result.commands] == [("stage_model", [SRC, DEST, ".sglang-deploy-staged.json", "--verify", "full"])]
    assert any("content differs (modified after staging): config.json" in line for line in result.logs)
    # Touched, content unchanged: nothing to do, and the no-op says what was hashed.
    touched = {**converged(), "suspect_hashes": {"config.json": HASHES["config.json"]}}
    result, _ = run_staged(touched)
    assert result.commands == [] and "1 file(s) modified after staging hashed: content unchanged" in result.noops[0]


def test_full_verify_asks_the_fact_to_hash_and_repairs_with_a_full_stage():
    state = {**converged(), "dest_hashes": {**HASHES, "config.json": "f" * 64}}
    result, calls = run_staged(state, verify="full")
    assert calls == ["full"]
    assert [remote_call(c) for c in result.commands] == [("stage_model", [SRC, DEST, ".sglang-deploy-staged.json", "--verify", "full"])]
    assert result.logs == [f"model {DEST}: content differs (full verify): config.json: staging from {SRC}"]


def test_other_models_of_the_host_travel_for_the_free_space_check():
    state = {**converged(), "dest": None, "marker": None}
    result, _ = run_staged(state, others=(("/root/models/Draft", "/dev/shm/Draft"),))
    assert [remote_call(c) for c in result.commands] == [
        ("stage_model", [SRC, DEST, ".sglang-deploy-staged.json", "--also", "/root/models/Draft", "/dev/shm/Draft"])
    ]


def test_fact_commands_quote_paths():
    fact = models.StagedModel()
    assert fact.command("/a b", "/c d", "full").startswith("(cd / && exec python3 -I - '/a b' '/c d' .sglang-deploy-staged.json full <<'PYEOF'\n")
    assert fact.command("/a", "/c").startswith("(cd / && exec python3 -I - /a /c .sglang-deploy-staged.json <<'PYEOF'\n")


def test_unknown_verify_mode_is_refused():
    with pytest.raises(ValueError, match="verify must be one of"):
        run_staged(converged(), verify="paranoid")


# models.unused_removed -----------------------------------------------------------------

OWNED = {"Qwen3.6-27B": "staged", "Old-Model": "staged", ".Old-Model.partial": "partial", ".Qwen3.6-27B.partial": "partial", ".Qwen3.6-27B.old": "old"}


def test_unused_keeps_models_in_use_and_their_interrupted_copies():
    assert models.unused(OWNED, ["Qwen3.6-27B"]) == [".Old-Model.partial", ".Qwen3.6-27B.old", "Old-Model"]
    assert models.unused(OWNED, []) == sorted(OWNED)
    assert models.unused({}, ["x"]) == []


def test_unused_removed_yields_one_rm_per_unused_copy_and_nothing_when_clean():
    result = run(models.unused_removed, {models.OwnedInShm: lambda shm_dir: {"owned": dict(OWNED), "in_units": []}}, shm_dir="/dev/shm", keep=["Qwen3.6-27B", "Old-Model"])
    assert result.commands == ["rm -rf -- /dev/shm/.Qwen3.6-27B.old"]
    result = run(models.unused_removed, {models.OwnedInShm: lambda shm_dir: {"owned": {"Qwen3.6-27B": "staged"}, "in_units": []}}, shm_dir="/dev/shm", keep=["Qwen3.6-27B"])
    assert result.commands == [] and result.noops == ["no unused staged models in /dev/shm"]


# models.boot_staging and the host's operations ----------------------------------------


def config(models_in=("shm", "store"), verify="fast") -> HostConfig:
    service = {"gpu": 1, "port": 30001, "model": "Qwen3.6-27B", "model_in": models_in[0], "draft_model": "Draft", "draft_in": models_in[1]}
    data = {"stack": "lab-standin", "verify_models": verify, "services": {"dflash": service}}
    return settings.host_config(make_host(data, {"run_services": ["dflash"]}, name="gpu-b"))


def test_boot_unit_name_only_when_the_host_stages_something():
    assert models.boot_unit_name(config()) == "sglang-stage-models.service"
    assert models.boot_unit_name(config(("store", "store"))) is None


def test_boot_files_are_deterministic_and_name_the_script_and_list():
    wanted = models.boot_files(config(("shm", "shm")))
    assert wanted == models.boot_files(config(("shm", "shm"), verify="full"))
    unit, mode = wanted[models.BOOT_UNIT_PATH]
    assert mode == "644" and unit.startswith("# Managed by sglang-deploy")
    for line in ("Type=oneshot", "RemainAfterExit=yes", "WantedBy=multi-user.target",
                 f"ExecStart=/usr/bin/python3 -I {models.BOOT_SCRIPT} --list {models.BOOT_LIST}",
                 "RequiresMountsFor=/dev/shm /root/models/Draft /root/models/Qwen3.6-27B"):
        assert line in unit
    listing = json.loads(wanted[models.BOOT_LIST][0])
    assert listing == {"marker": MARKER, "models": [
        {"name": "Qwen3.6-27B", "src": "/root/models/Qwen3.6-27B", "dest": "/dev/shm/Qwen3.6-27B"},
        {"name": "Draft", "src": "/root/models/Draft", "dest": "/dev/shm/Draft"},
    ]}
    assert wanted[models.BOOT_SCRIPT] == (remote.script("stage_model"), "755")


def boot_fact(files=None, enabled=True):
    return {models.BootStaging: lambda paths, unit: {"files": dict(files or {}), "enabled": enabled}}


def test_boot_staging_converged_is_a_noop():
    wanted = models.boot_files(config())
    installed = {path: models._sha256(content) for path, (content, _mode) in wanted.items()}
    result = run(models.boot_staging, boot_fact(installed), wanted=wanted)
    assert result.commands == [] and result.noops == ["unit sglang-stage-models.service is installed and enabled"]


def test_boot_staging_writes_what_differs_then_reloads_and_enables():
    wanted = models.boot_files(config())
    installed = {path: models._sha256(content) for path, (content, _mode) in wanted.items()}
    installed[models.BOOT_LIST] = "0" * 64
    result = run(models.boot_staging, boot_fact(installed, enabled=False), wanted=wanted)
    tmp = f"{models.BOOT_LIST}.sglang-deploy.tmp"
    assert result.commands == [
        f"install -d -m 755 /etc/sglang-deploy && rm -f {tmp} && install -m 600 /dev/null {tmp}",
        ("put", "<bytes>", tmp),
        f"chown root:root {tmp} && chmod 644 {tmp} && mv -f {tmp} {models.BOOT_LIST}",
        "systemctl enable sglang-stage-models.service",
    ]
    result = run(models.boot_staging, boot_fact({}, enabled=False), wanted=wanted)
    assert result.commands[-2:] == ["systemctl daemon-reload", "systemctl enable sglang-stage-models.service"]


def test_boot_staging_absent_removes_without_stopping():
    result = run(models.boot_staging, boot_fact({models.BOOT_LIST: "x", models.BOOT_UNIT_PATH: "y"}), wanted={}, present=False)
    assert result.commands == [
        "systemctl disable sglang-stage-models.service",
        f"rm -f -- {models.BOOT_LIST} {models.BOOT_UNIT_PATH}",
        "systemctl daemon-reload",
    ]
    result = run(models.boot_staging, boot_fact({}, enabled=False), wanted={}, present=False)
    assert result.commands == [] and result.noops == ["unit sglang-stage-models.service is absent"]


def test_boot_fact_parses_sha256sum_and_is_enabled():
    fact = models.BootStaging()
    assert fact.process([f"{'a' * 64}  /etc/sglang-deploy/models.json", "enabled=enabled"]) == {"files": {"/etc/sglang-deploy/models.json": "a" * 64}, "enabled": True}
    assert fact.process(["enabled="]) == {"files": {}, "enabled": False}


# The remote scripts, run here ----------------------------------------------------------


stage_model = load_remote_module("stage_model")


def make_model(root: Path, files: dict[str, int]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, (rel, size) in enumerate(files.items()):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([i % 251]) * size)
    return root


def script(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-", *args], input=remote.script(name), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stderr)
    return proc


def stage(src: Path, dest: Path, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
    return script("stage_model", str(src), str(dest), MARKER, "--progress", "0", *extra, check=check)


def state(src: Path, dest: Path, full: bool = False) -> dict:
    return json.loads(script("model_state", str(src), str(dest), MARKER, *(["full"] if full else [])).stdout)


FILES = {"config.json": 100, "model-1.safetensors": 300_000, "model-2.safetensors": 200_000, "tok/vocab.json": 5_000}


def tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """relpath -> (inode, mtime_ns, size)."""
    return {str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def model(tmp_path):
    return make_model(tmp_path / "store" / "M", FILES), tmp_path / "shm" / "M"


def test_stage_then_converged_then_one_deleted_file_copied_alone(model):
    src, dest = model
    before = {rel: p.read_bytes() for rel, p in ((str(p.relative_to(src)), p) for p in src.rglob("*") if p.is_file())}
    out = stage(src, dest).stdout
    assert "4 copied" in out
    s = state(src, dest)
    assert models.drift(s) is None and s["src_hashes"] is not None
    assert "already staged" in stage(src, dest).stdout
    first = tree(dest)
    (dest / "model-2.safetensors").unlink()
    assert models.drift(state(src, dest)) == "missing model-2.safetensors"
    assert "1 copied" in stage(src, dest).stdout
    after = tree(dest)
    for rel in FILES:
        if rel != "model-2.safetensors":
            assert after[rel] == first[rel], rel  # the same inode: hard-linked, not copied
    assert (dest / "model-2.safetensors").read_bytes() == (src / "model-2.safetensors").read_bytes()
    # The source is only read; the manifest cache is the one file added beside it.
    now = {str(p.relative_to(src)): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    assert set(now) - set(before) == {".sglang-deploy-manifest.json"}
    assert all(now[rel] == data for rel, data in before.items())
    assert sorted(os.listdir(dest.parent)) == ["M"]


def test_same_size_corruption_with_its_mtime_put_back_is_found_only_by_full_verify_and_repaired(model):
    src, dest = model
    stage(src, dest)
    victim = dest / "model-1.safetensors"
    kept = victim.stat().st_mtime_ns
    with open(victim, "r+b") as handle:
        handle.seek(1000)
        handle.write(b"\xff\xfe")
    os.utime(victim, ns=(kept, kept))
    assert models.drift(state(src, dest)) is None
    assert models.drift(state(src, dest, full=True)) == "content differs (full verify): model-1.safetensors"
    out = stage(src, dest, "--verify", "full").stdout
    assert "1 copied" in out
    assert (dest / "model-1.safetensors").read_bytes() == (src / "model-1.safetensors").read_bytes()
    assert models.drift(state(src, dest, full=True)) is None


def test_same_size_corruption_with_a_new_mtime_is_found_by_the_fast_check_and_repaired(model):
    src, dest = model
    stage(src, dest)
    first = tree(dest)
    with open(dest / "model-1.safetensors", "r+b") as handle:
        handle.seek(1000)
        handle.write(b"\xff\xfe")
    s = state(src, dest)
    assert list(s["suspect_hashes"]) == ["model-1.safetensors"]  # only the modified file is hashed
    assert models.drift(s) == "content differs (modified after staging): model-1.safetensors"
    # What models.staged runs for that reason: a stage that hashes the staged copy, so the bad file is copied again.
    assert "1 copied" in stage(src, dest, "--verify", "full").stdout
    assert (dest / "model-1.safetensors").read_bytes() == (src / "model-1.safetensors").read_bytes()
    assert tree(dest)["model-2.safetensors"][0] == first["model-2.safetensors"][0]
    again = state(src, dest)
    assert models.drift(again) is None and not again.get("suspect_hashes")


def test_a_junk_file_beside_a_staged_model_is_not_drift_and_stays(model):
    src, dest = model
    stage(src, dest)
    (dest / "notes.txt").write_text("an operator's file")
    os.utime(dest / "config.json")  # touched: hashed, content unchanged
    s = state(src, dest)
    assert models.drift(s) is None and list(s["suspect_hashes"]) == ["config.json"]
    assert (dest / "notes.txt").exists()


def test_touched_source_is_rehashed_without_copying(model):
    src, dest = model
    stage(src, dest)
    first = tree(dest)
    os.utime(src / "config.json")
    assert models.drift(state(src, dest)).startswith("source manifest missing or out of date")
    out = stage(src, dest).stdout  # once: a second call would say "already staged" whatever the first did
    assert "already staged" in out or " 0 copied" in out, out
    assert tree(dest) == first  # same inodes: nothing was copied
    assert models.drift(state(src, dest)) is None


def test_changed_source_file_is_restaged_and_extra_files_dropped(model):
    src, dest = model
    stage(src, dest)
    (src / "config.json").write_text("{}")
    (src / "tok" / "vocab.json").unlink()
    assert models.drift(state(src, dest)) == "source changed since staging"
    assert "1 copied" in stage(src, dest).stdout
    assert sorted(tree(dest)) == sorted(["config.json", "model-1.safetensors", "model-2.safetensors", MARKER])
    assert models.drift(state(src, dest)) is None


def test_interrupted_copy_leaves_no_staged_dir_and_is_resumed(model, tmp_path):
    src, dest = model
    stage(src, dest)
    # What a kill mid-copy leaves: the partial sibling with a journal of finished files and a half-written file.
    partial = dest.parent / ".M.partial"
    dest.rename(partial)
    (partial / MARKER).unlink()
    finished = ["model-1.safetensors"]
    manifest = json.loads((src / ".sglang-deploy-manifest.json").read_text())["files"]
    (partial / stage_model.JOURNAL_NAME).write_text("".join(
        json.dumps([rel, manifest[rel]["size"], manifest[rel]["sha256"], manifest[rel]["crc32"]]) + "\n" for rel in finished
    ) + '["model-2.safet')
    (partial / "model-2.safetensors").unlink()
    (partial / "model-2.safetensors.sglang-part").write_bytes(b"x" * 10)
    kept = tree(partial)["model-1.safetensors"]
    assert models.drift(state(src, dest)) == "not staged"
    owned = json.loads(script("model_owned", str(dest.parent), MARKER, models.JOURNAL).stdout)["owned"]
    assert owned == {".M.partial": "partial"}
    out = stage(src, dest).stdout
    assert "3 copied" in out and "1 kept" in out
    assert tree(dest)["model-1.safetensors"] == kept
    assert sorted(os.listdir(dest.parent)) == ["M"]
    assert models.drift(state(src, dest, full=True)) is None


def test_not_enough_space_fails_before_copying_with_the_numbers(model, monkeypatch, tmp_path, capsys):
    src, dest = model
    other_src = make_model(tmp_path / "store" / "Other", {"w.bin": 1 << 20})

    class Small:
        f_bavail, f_frsize = 100, 4096  # 400 KiB

    monkeypatch.setattr(stage_model.os, "statvfs", lambda path: Small)
    with pytest.raises(stage_model.StageError) as caught:
        stage_model.stage(str(src), str(dest), MARKER, others=[(str(other_src), str(tmp_path / "shm" / "Other"))], interval=0)
    message = str(caught.value)
    assert f"{dest.parent} has 400.00 KiB free" in message
    assert "this host must stage 1.48 MiB more (M 493.26 KiB, Other 1.00 MiB)" in message
    assert not (dest.parent).exists() or os.listdir(dest.parent) == []


def test_pending_bytes_counts_only_what_is_not_staged(model):
    src, dest = model
    total = sum(FILES.values())
    assert stage_model.pending_bytes(str(src), str(dest), MARKER) == total
    stage(src, dest)
    assert stage_model.pending_bytes(str(src), str(dest), MARKER) == 0
    (dest / "model-1.safetensors").unlink()
    assert stage_model.pending_bytes(str(src), str(dest), MARKER) == FILES["model-1.safetensors"]


def test_missing_source_fails_with_the_fix(tmp_path):
    proc = stage(tmp_path / "nope", tmp_path / "shm" / "nope", check=False)
    assert proc.returncode == 1
    assert "model source" in proc.stderr and "does not exist on this host" in proc.stderr


def test_a_directory_we_did_not_stage_is_adopted_if_identical_and_never_removed_otherwise(model):
    src, dest = model
    dest.parent.mkdir(parents=True)
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
    assert "marked as staged" in stage(src, dest).stdout
    assert models.drift(state(src, dest)) is None
    other = dest.parent / "Hand"
    subprocess.run(["cp", "-a", str(src), str(other)], check=True)
    (other / "config.json").write_text("edited")
    proc = stage(src, other, check=False)
    assert proc.returncode == 1 and "was not staged by sglang-deploy" in proc.stderr
    assert (other / "config.json").read_text() == "edited"
    owned = json.loads(script("model_owned", str(dest.parent), MARKER, models.JOURNAL).stdout)["owned"]
    assert owned == {"M": "staged"}


def test_read_only_store_caches_the_manifest_elsewhere(model, monkeypatch, tmp_path):
    src, dest = model
    monkeypatch.setattr(stage_model, "MANIFEST_FALLBACK_DIR", str(tmp_path / "cache"))
    real_open = open

    def no_write_in_src(path, mode="r", *args, **kwargs):
        if "w" in mode and str(path).startswith(str(src)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, mode, *args, **kwargs)

    real_os_open = os.open

    def no_new_file_in_src(path, flags, *args, **kwargs):  # the stage script makes its files with os.open (O_EXCL)
        if flags & (os.O_WRONLY | os.O_RDWR) and str(path).startswith(str(src)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_write_in_src)
    monkeypatch.setattr(os, "open", no_new_file_in_src)
    stage_model.stage(str(src), str(dest), MARKER, interval=0)
    assert not (src / ".sglang-deploy-manifest.json").exists()
    cached = list((tmp_path / "cache").glob("M-*.json"))
    assert len(cached) == 1 and set(json.loads(cached[0].read_text())["files"]) == set(FILES)


def test_list_mode_stages_every_model_of_the_boot_list(tmp_path):
    a = make_model(tmp_path / "store" / "A", {"a.bin": 1000})
    b = make_model(tmp_path / "store" / "B", {"b.bin": 2000})
    listing = tmp_path / "models.json"
    listing.write_text(json.dumps({"marker": MARKER, "verify": "fast", "models": [
        {"name": "A", "src": str(a), "dest": str(tmp_path / "shm" / "A")},
        {"name": "B", "src": str(b), "dest": str(tmp_path / "shm" / "B")},
    ]}))
    script("stage_model", "--list", str(listing))
    assert (tmp_path / "shm" / "A" / "a.bin").stat().st_size == 1000
    assert (tmp_path / "shm" / "B" / MARKER).exists()


def test_progress_line_says_bytes_rate_and_eta():
    progress = stage_model.Progress("M", 10 * 2**30, 0)
    progress.add(2 * 2**30)
    line = progress.line()
    assert line.startswith("staging M: 2.00 GiB of 10.00 GiB (20%), ") and "/s, ETA " in line


def test_a_model_an_installed_unit_still_loads_is_kept_until_the_unit_goes():
    fact = {"owned": {"Qwen3.6-27B": "staged", "Moved-Away": "staged"}, "in_units": ["Moved-Away"]}
    result = run(models.unused_removed, {models.OwnedInShm: lambda shm_dir: fact}, shm_dir="/dev/shm", keep=["Qwen3.6-27B"])
    assert result.commands == []
    fact["in_units"] = []
    result = run(models.unused_removed, {models.OwnedInShm: lambda shm_dir: fact}, shm_dir="/dev/shm", keep=["Qwen3.6-27B"])
    assert result.commands == ["rm -rf -- /dev/shm/Moved-Away"]


def test_owned_fact_names_the_shm_models_installed_units_load(tmp_path):
    shm, units = tmp_path / "shm", tmp_path / "units"
    shm.mkdir()
    units.mkdir()
    (units / "sglang-moved.service").write_text(
        "ExecStart=/v/bin/python -m sglang.launch_server \\\n"
        f"    --model-path {shm}/Target-Model \\\n"
        f"    --speculative-draft-model-path {shm}/Draft-Model \\\n    --port 30001\n"
    )
    (units / "other.service").write_text(f"ExecStart=/bin/x --model-path {shm}/Not-Ours\n")
    (units / "sglang-store.service").write_text("ExecStart=/v/bin/python -m x --model-path /root/models/In-Store\n")
    fact = json.loads(script("model_owned", str(shm), MARKER, models.JOURNAL, str(units)).stdout)
    assert fact == {"owned": {}, "in_units": ["Draft-Model", "Target-Model"]}
