"""Root trusts only what root wrote (README "Models in RAM" and "Environments": trust).

Whatever root reads, runs, serves or deletes on a host must be root's, no symlink, writable by root alone,
under directories nobody else can write (a sticky one such as /dev/shm or /tmp aside), or made fresh by the
deploy. Each class below is played as the other party would: another local user (uid 65534 here, `nobody`)
or the service user plants something where root looks, with the right names, sizes and a copy of our marker.
The owner cases need root to hand files to another uid; the mode and symlink cases do not.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api import OperationError

from operations.model import models
from tests.unit.remote_calls import load_remote_module
from tests.unit.test_models import FILES, make_model, script, stage, state

MARKER = models.MARKER
OTHER = 65534  # another local user
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="handing a file to another user needs root")
common = load_remote_module("stage_model", "trust_under_test")


def give_away(root: Path, uid: int = OTHER) -> None:
    """Everything under root (and root itself) now belongs to another user, as if they had made it."""
    for path in [root, *root.rglob("*")]:
        os.lchown(path, uid, uid)


def plant_copy_of(staged: Path, at: Path) -> None:
    """What another user can make in a world-writable shm dir: the staged names and sizes (other bytes), and a
    copy of the real, world-readable marker."""
    at.mkdir(parents=True, exist_ok=True)
    for path in sorted(staged.rglob("*")):
        target = at / path.relative_to(staged)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.name == MARKER:
            shutil.copyfile(path, target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"P" * path.stat().st_size)
    give_away(at)


def served_equals_source(src: Path, dest: Path) -> bool:
    def files(root):
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.name.startswith(".sglang-deploy")}

    return files(src) == files(dest)


def aside(shm: Path, name: str) -> list[Path]:
    return sorted(shm.glob(f".{name}.untrusted-*"))


@pytest.fixture
def model(tmp_path):
    return make_model(tmp_path / "store" / "M", FILES), tmp_path / "shm" / "M"


# The one rule ------------------------------------------------------------------------------------


def test_root_owned_not_writable_under_root_owned_parents_is_trusted_and_a_sticky_parent_is_fine(tmp_path):
    # tmp_path lies under /tmp (root's, sticky, world-writable); the shm dir is the same case.
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    assert common.why_untrusted(str(tmp_path / "d" / "f")) is None
    assert common.why_untrusted(str(tmp_path / "d" / "not-yet")) is None  # below a directory of root's: only root can make it
    # Absent below a directory others can write: whoever makes it first owns it (tests/unit/test_create_verify.py).
    assert common.why_untrusted("/dev/shm/anything-not-there").startswith("/dev/shm/anything-not-there: absent, in /dev/shm (")


def test_a_symlink_a_write_bit_for_others_or_a_parent_others_can_write_is_named_with_owner_and_mode(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    assert "a symlink" in common.why_untrusted(str(tmp_path / "link"))
    assert common.why_untrusted(str(tmp_path / "link"), link_ok=True) is None  # a root link, followed
    (tmp_path / "d" / "f").chmod(0o666)
    assert common.why_untrusted(str(tmp_path / "d" / "f")) == (
        f"{tmp_path}/d/f: writable by its group or others (found: owner uid 0 (root), mode 0666)"
    )
    (tmp_path / "d" / "f").chmod(0o644)
    (tmp_path / "d").chmod(0o777)  # the service user could swap f for its own file
    assert "a parent directory writable by its group or others" in common.why_untrusted(str(tmp_path / "d" / "f"))
    assert common.why_untrusted(str(tmp_path / "link" / "f")).startswith(f"{tmp_path}/d: a parent directory")
    (tmp_path / "d").chmod(0o755)


@as_root
def test_another_owner_on_the_path_or_a_link_of_theirs_is_untrusted(tmp_path):
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "f").write_text("x")
    os.chown(tmp_path / "d", OTHER, OTHER)
    assert common.why_untrusted(str(tmp_path / "d" / "e" / "f")) == (
        f"{tmp_path}/d: a parent directory not owned by root (found: owner uid {OTHER} (nobody), mode 0755)"
    )
    os.chown(tmp_path / "d", 0, 0)
    (tmp_path / "their-link").symlink_to(tmp_path / "d")
    os.lchown(tmp_path / "their-link", OTHER, OTHER)
    assert "a symlink on the path, not owned by root" in common.why_untrusted(str(tmp_path / "their-link" / "e"))


# A squatted staged copy --------------------------------------------------------------------------


@as_root
def test_a_planted_copy_with_our_marker_is_not_staged_and_is_moved_aside_and_staged_afresh(model):
    src, dest = model
    stage(src, dest)
    real = dest.parent / "real"
    dest.rename(real)
    plant_copy_of(real, dest)  # another user's directory, right names and sizes, our marker copied
    shutil.rmtree(real)

    fact = state(src, dest)
    assert fact["untrusted"] == f"{dest}: not owned by root (found: owner uid {OTHER} (nobody), mode 0755)"
    assert models.drift(fact).startswith("not staged by root (")

    out = stage(src, dest).stdout
    assert "moved aside" in out and "4 copied" in out
    assert served_equals_source(src, dest) and dest.stat().st_uid == 0
    planted = aside(dest.parent, "M")
    assert len(planted) == 1 and planted[0].stat().st_uid == OTHER  # never deleted: it may be someone's data
    assert (planted[0] / "config.json").read_bytes() == b"P" * 100
    assert models.drift(state(src, dest)) is None


def test_a_symlink_where_the_model_goes_is_moved_aside_not_followed(model, tmp_path):
    src, dest = model
    stage(src, dest)
    elsewhere = tmp_path / "elsewhere"
    dest.rename(elsewhere)
    dest.symlink_to(elsewhere)  # a complete, real staged copy behind it: still not what root serves
    assert "a symlink" in state(src, dest)["untrusted"]
    stage(src, dest)
    assert not dest.is_symlink() and served_equals_source(src, dest)
    assert aside(dest.parent, "M")[0].is_symlink() and (elsewhere / MARKER).exists()


def test_a_directory_others_can_write_is_not_served_even_when_root_made_it(model):
    src, dest = model
    stage(src, dest)
    dest.chmod(0o777)  # the engine could swap any file in it
    assert "writable by its group or others" in state(src, dest)["untrusted"]
    stage(src, dest)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755 and served_equals_source(src, dest)


@as_root
def test_a_planted_copy_without_a_marker_is_never_adopted(model):
    src, dest = model
    dest.parent.mkdir(parents=True)
    shutil.copytree(src, dest)  # an exact copy, but another user's
    give_away(dest)
    out = stage(src, dest).stdout
    assert "marked as staged" not in out and "moved aside" in out
    assert dest.stat().st_uid == 0 and served_equals_source(src, dest)


@as_root
def test_a_planted_partial_with_a_planted_journal_is_never_resumed(model, tmp_path):
    src, dest = model
    stage(src, tmp_path / "ref" / "M")
    partial = dest.parent / ".M.partial"
    plant_copy_of(tmp_path / "ref" / "M", partial)
    os.lchown(partial / MARKER, 0, 0)
    (partial / MARKER).unlink()  # an interrupted copy has a journal, not a marker
    journal = [json.dumps([rel, size, *json.loads((tmp_path / "ref" / "M" / MARKER).read_text())["files"][rel][1:]])
               for rel, size in FILES.items()]
    (partial / ".sglang-deploy-partial.jsonl").write_text("\n".join(journal) + "\n")
    os.lchown(partial / ".sglang-deploy-partial.jsonl", OTHER, OTHER)

    out = stage(src, dest).stdout
    assert "4 copied" in out and served_equals_source(src, dest)
    assert len(aside(dest.parent, "M.partial")) == 1


@as_root
def test_a_planted_old_copy_is_neither_deleted_nor_in_the_way(model):
    src, dest = model
    stage(src, dest)
    old = dest.parent / ".M.old"
    plant_copy_of(dest, old)
    (src / "config.json").write_bytes(b"n" * 100)  # a change: the swap parks the previous copy as .M.old
    stage(src, dest)
    assert served_equals_source(src, dest) and not old.exists()
    assert (aside(dest.parent, "M.old")[0] / "config.json").read_bytes() == b"P" * 100


@as_root
def test_the_owned_fact_never_lists_another_users_directory_so_it_is_never_removed(model):
    src, dest = model
    stage(src, dest)
    plant_copy_of(dest, dest.parent / "Unused")
    plant_copy_of(dest, dest.parent / ".Gone.partial")
    (dest.parent / "Linked").symlink_to(dest)
    plant_copy_of(dest, dest.parent / "Theirs")
    os.lchown(dest.parent / "Theirs" / MARKER, 0, 0)  # a marker of root's (a hard link, say) in their directory
    shutil.copytree(dest, dest.parent / "Writable")
    (dest.parent / "Writable").chmod(0o777)  # root's, but anyone could have swapped what it holds
    owned = json.loads(script("model_owned", str(dest.parent), MARKER, models.JOURNAL).stdout)["owned"]
    assert owned == {"M": "staged"}
    assert models.unused(owned, []) == ["M"]


def test_the_boot_unit_moves_a_squat_aside_the_same_way(model, tmp_path):
    src, dest = model
    stage(src, dest)
    dest.chmod(0o777)
    listing = tmp_path / "models.json"
    listing.write_text(json.dumps({"marker": MARKER, "models": [{"name": "M", "src": str(src), "dest": str(dest)}]}))
    assert "moved aside" in script("stage_model", "--list", str(listing)).stdout
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755 and served_equals_source(src, dest)


# What is staged, and from where ------------------------------------------------------------------


def test_staged_files_keep_the_sources_read_bits_and_no_write_bit_but_roots_nor_set_id_bits(model):
    src, dest = model
    (src / "config.json").chmod(0o640)
    (src / "model-1.safetensors").chmod(0o4755)
    env = {**os.environ}
    proc = subprocess.run(["sh", "-c", 'umask 0; exec "$0" - "$@"', sys.executable, str(src), str(dest), MARKER, "--progress", "0"],
                          input=load_remote_script("stage_model"), capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    modes = {p.name: stat.S_IMODE(p.lstat().st_mode) for p in [dest, *dest.rglob("*")]}
    assert modes["config.json"] == 0o640 and modes["model-1.safetensors"] == 0o755
    assert all(not mode & 0o022 for mode in modes.values()), modes  # the marker and directories too, whatever the umask
    assert state(src, dest)["untrusted"] is None


def test_a_staged_file_an_older_deploy_left_writable_by_others_is_copied_again(model):
    src, dest = model
    stage(src, dest)
    (dest / "tok" / "vocab.json").chmod(0o666)  # root's, but the engine could rewrite it
    assert "tok/vocab.json: writable by its group or others" in state(src, dest)["untrusted"]
    out = stage(src, dest).stdout
    assert "1 copied" in out and "moved aside" not in out  # root's own copy: repaired, not parked
    assert stat.S_IMODE((dest / "tok" / "vocab.json").stat().st_mode) == 0o644
    assert state(src, dest)["untrusted"] is None and not aside(dest.parent, "M")


@as_root
def test_a_source_another_user_can_change_is_refused_with_the_fix(model):
    src, dest = model
    os.chown(src / "tok", OTHER, OTHER)
    fact = state(src, dest)
    assert fact["src_untrusted"] == f"{src}/tok: not owned by root (found: owner uid {OTHER} (nobody), mode 0755)"
    assert models.drift(fact).startswith("source not trusted")
    proc = stage(src, dest, check=False)
    assert proc.returncode == 1 and "chown root:" in proc.stderr and not dest.exists()


def test_a_symlink_in_the_source_is_refused_not_copied(model):
    src, dest = model
    (src / "secret").symlink_to("/etc/shadow")  # root would copy what it points at into a world-readable dir
    assert "secret: a symlink" in state(src, dest)["src_untrusted"]
    proc = stage(src, dest, check=False)
    assert proc.returncode == 1 and "only regular files can be staged" in proc.stderr and not dest.exists()


def test_a_manifest_others_can_write_is_not_believed(model, tmp_path):
    src, dest = model
    stage(src, dest)
    manifest = src / ".sglang-deploy-manifest.json"
    manifest.chmod(0o666)
    assert state(src, dest)["src_hashes"] is None  # not read: hashed again when staging


def load_remote_script(name: str) -> str:
    from operations import remote

    return remote.script(name)


# The venv root runs, and the wheels it installs ---------------------------------------------------

from tests.unit.test_venv import (  # noqa: E402, F401 - fixtures
    _fake_venv,
    _remote,
    facts,
    gen_of,
    house,
    run_env,
    stack,
    venv_facts,
)


def venv_read(live: Path, wanted: Path, cache: Path) -> dict:
    out = _remote("venv_state", str(live), str(wanted), str(cache), str(cache / ".tools" / "uv"))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_converged_venv_of_roots_reads_as_trusted(tmp_path):
    gen = _fake_venv(tmp_path / "venv.generations" / "g1", {"torch": ["torch/__init__.py"]})
    (tmp_path / "venv").symlink_to(gen)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "torch-1.0-py3-none-any.whl").write_bytes(b"w")
    assert venv_read(tmp_path / "venv", gen, tmp_path / "cache")["untrusted"] == []


def test_a_venv_under_a_directory_others_can_write_is_named_in_the_read(tmp_path):
    state_dir = tmp_path / "var-lib-sglang"  # as the unit's StateDirectory: the service user's to write
    gen = _fake_venv(state_dir / "venv.generations" / "g1", {})
    (state_dir / "venv").symlink_to(gen)
    state_dir.chmod(0o777)
    found = venv_read(state_dir / "venv", gen, tmp_path / "cache")["untrusted"]
    assert found and all(why.startswith(f"{state_dir}: a parent directory writable by its group or others") for why in found)


@as_root
def test_a_generation_or_a_wheel_of_another_user_is_named_in_the_read(tmp_path):
    gen = _fake_venv(tmp_path / "venv.generations" / "g1", {})
    (tmp_path / "venv").symlink_to(gen)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "torch-1.0-py3-none-any.whl").write_bytes(b"w")
    os.chown(tmp_path / "cache" / "torch-1.0-py3-none-any.whl", OTHER, OTHER)
    os.chown(gen / "bin", OTHER, OTHER)
    found = venv_read(tmp_path / "venv", gen, tmp_path / "cache")["untrusted"]
    assert f"{gen}/bin: not owned by root (found: owner uid {OTHER} (nobody), mode 0755)" in found
    assert f"{tmp_path}/cache/torch-1.0-py3-none-any.whl: not owned by root (found: owner uid {OTHER} (nobody), mode 0644)" in found


def test_the_venv_operation_stops_the_host_naming_path_owner_and_mode_before_any_command(stack, house):  # noqa: F811 - fixtures imported above
    gen = gen_of(stack)
    why = "/var/lib/sglang: a parent directory not owned by root (found: owner uid 999 (sglang), mode 0755)"
    fact = {**facts(gen, wanted=venv_facts(gen.path)), "untrusted": [why]}
    with pytest.raises(OperationError, match=re.escape(why)):
        run_env(fact, stack, house)


def test_the_switch_adopts_no_directory_that_is_not_a_venv_and_never_moves_it(tmp_path):
    live = tmp_path / "venv"
    (live / "data").mkdir(parents=True)  # someone's directory where venv_path points: no pyvenv.cfg
    (live / "data" / "keep").write_text("mine")
    _fake_venv(tmp_path / "venv.generations" / "g1", {})
    out = _remote("venv_switch", str(live), "g1")
    assert out.returncode != 0 and f"{live}: expected a venv (pyvenv.cfg, bin/python)" in out.stderr
    assert "found a directory without pyvenv.cfg or bin/python" in out.stderr
    assert (live / "data" / "keep").read_text() == "mine" and not live.is_symlink()
    assert sorted(p.name for p in (tmp_path / "venv.generations").iterdir()) == ["g1"]


@as_root
def test_the_switch_adopts_no_venv_of_another_user_and_deletes_no_generation_of_theirs(tmp_path):
    live = tmp_path / "venv"
    _fake_venv(live, {})
    give_away(live)
    gens = tmp_path / "venv.generations"
    for name in ("g1", "theirs"):
        _fake_venv(gens / name, {})
    out = _remote("venv_switch", str(live), "g1")
    assert out.returncode != 0 and f"{live}: not owned by root" in out.stderr and not live.is_symlink()
    shutil.rmtree(live)
    give_away(gens / "theirs")
    assert _remote("venv_switch", str(live), "g1").returncode == 0
    _fake_venv(gens / "g2", {})
    assert _remote("venv_switch", str(live), "g2").returncode == 0
    assert (gens / "theirs").is_dir()  # neither live nor previous, but not root's: never deleted
    give_away(gens / "g2")
    out = _remote("venv_switch", str(live), "--previous")  # back to g1: root's, fine
    assert out.returncode == 0, out.stderr
    out = _remote("venv_switch", str(live), "g2")
    assert out.returncode != 0 and f"{gens}/g2: not owned by root" in out.stderr and live.resolve() == gens / "g1"


# The deploy's state on the host: saved units, and the records that hold the key file's sha256 ------------

from operations.service import rollback  # noqa: E402
from tests.unit.test_operations import FakeFs, run, service_host  # noqa: E402, F401 - a fixture


def test_a_record_is_written_0600_in_directories_root_alone_may_enter_and_an_older_0755_one_is_tightened(tmp_path, service_host):  # noqa: F811 - fixtures imported above
    (tmp_path / "started").mkdir(mode=0o755)
    (tmp_path / "started").chmod(0o755)
    tmp_path.chmod(0o755)  # /var/lib/sglang-deploy, as an older deploy left it
    service_host("--record", "sglang-x.service")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path, tmp_path / "started", tmp_path / "started" / "sglang-x.service.json")}
    assert modes == {tmp_path.name: 0o700, "started": 0o700, "sglang-x.service.json": 0o600}


def test_a_record_root_did_not_write_alone_is_not_read(tmp_path, service_host):  # noqa: F811 - fixtures imported above
    service_host("--record", "sglang-x.service")
    assert service_host("sglang-x.service", "127.0.0.1", "1")["recorded"] is True
    record = tmp_path / "started" / "sglang-x.service.json"
    record.chmod(0o666)
    assert service_host("sglang-x.service", "127.0.0.1", "1")["recorded"] is False
    record.chmod(0o600)
    (tmp_path / "elsewhere.json").write_text(record.read_text())
    record.unlink()
    record.symlink_to(tmp_path / "elsewhere.json")
    assert service_host("sglang-x.service", "127.0.0.1", "1")["recorded"] is False


def test_a_record_directory_that_is_a_symlink_is_never_written_through(tmp_path, service_host):  # noqa: F811 - fixtures imported above
    (tmp_path / "real").mkdir()
    (tmp_path / "started").symlink_to(tmp_path / "real")
    with pytest.raises(AssertionError, match="a symlink"):
        service_host("--record", "sglang-x.service")
    assert list((tmp_path / "real").iterdir()) == []


def test_the_state_directory_is_made_root_only_and_an_older_one_tightened():
    fresh = run(rollback.state_private, {}, FakeFs())
    assert fresh.commands == [c for d in (rollback.STATE_DIR, rollback.RECORD_DIR, rollback.BACKUP_DIR)
                              for c in (f"mkdir -p {d}", f"chmod 700 {d}", f"chown root:root {d}")]
    older = run(rollback.state_private, {}, FakeFs(dirs={rollback.STATE_DIR, rollback.RECORD_DIR}), create=False)
    assert older.commands == [f"chmod 700 {rollback.STATE_DIR}", f"chmod 700 {rollback.RECORD_DIR}"]
    assert older.noops[-1] == f"directory {rollback.BACKUP_DIR} does not exist"
    assert rollback.save_command("/etc/systemd/system/x.service", "x.service").startswith(
        f"install -d -m 0700 {rollback.STATE_DIR} {rollback.BACKUP_DIR} && ")


def test_a_fifo_planted_where_a_marker_should_be_never_holds_a_read(tmp_path, service_host):  # noqa: F811 - fixtures imported above
    squat = tmp_path / "shm" / "M"
    squat.mkdir(parents=True)
    os.mkfifo(squat / MARKER)  # a read that never ends, if anything opened it
    (tmp_path / "store" / "M").mkdir(parents=True)
    (tmp_path / "store" / "M" / "config.json").write_text("{}")
    assert service_host("--record", "sglang-x.service", str(squat / MARKER))["inputs"][str(squat / MARKER)].startswith("not a file")
    fact = subprocess.run([sys.executable, "-", str(tmp_path / "store" / "M"), str(squat), MARKER], input=load_remote_script("model_state"),
                          capture_output=True, text=True, timeout=20)
    assert json.loads(fact.stdout)["marker"] is None


def test_a_venv_read_through_its_link_as_a_donors_is_trusted(tmp_path):
    gen = _fake_venv(tmp_path / "venv.generations" / "g1", {"torch": ["torch/__init__.py"]})
    (tmp_path / "venv").symlink_to(gen)
    # operations/environment/venv_decide.py reads a donor's venv with wanted = live = its venv_path, a symlink of root's.
    assert venv_read(tmp_path / "venv", tmp_path / "venv", Path("/nonexistent"))["untrusted"] == []
