"""Create, then verify, through handles (issue #34, item 3): what root makes on a host it makes exclusively and
checks on the handle it got; an absent name under a world-writable directory is not "trusted because absent";
root keeps no state of its own under a world-writable directory; reads of trees others can write follow no link
and stop, with a judgement, past a depth or a number of entries.

Another local user is uid 65534 (`nobody`); a sticky, world-writable directory under tmp_path stands in for
/dev/shm. The owner cases need root to hand a directory to another uid.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from configuration.kinds import writable_by_others
from operations import remote
from operations.model import models
from tests.unit.remote_calls import load_remote_module
from tests.unit.test_models import FILES, make_model, script, stage, state

MARKER = models.MARKER
OTHER = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to another user needs root")


@pytest.fixture
def sticky(tmp_path) -> Path:
    """A directory like /dev/shm: root's, world-writable, sticky."""
    path = tmp_path / "sticky"
    path.mkdir()
    path.chmod(0o1777)
    return path


def squat(path: Path, uid: int = OTHER) -> Path:
    """What another user can do in a world-writable directory: make the name first."""
    path.mkdir()
    os.chown(path, uid, uid)
    return path


def deep_tree(root: Path, levels: int) -> Path:
    """`levels` nested directories under root, a file at the bottom (made by handle: no long path needed)."""
    root.mkdir(parents=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    return root


# The helper: make_dirs ------------------------------------------------------------------------


def test_make_dirs_makes_each_missing_directory_roots_with_its_mode_whatever_the_umask(sm, sticky):
    umask = os.umask(0o077)
    try:
        made = sm.make_dirs(str(sticky / "a" / "b"), 0o700)
    finally:
        os.umask(umask)
    assert made == [str(sticky / "a"), str(sticky / "a" / "b")]
    assert stat.S_IMODE((sticky / "a").stat().st_mode) == 0o755 and stat.S_IMODE((sticky / "a" / "b").stat().st_mode) == 0o700
    assert sm.make_dirs(str(sticky / "a" / "b"), 0o700) == []  # there, and root's: nothing made, nothing changed


@as_root
def test_a_directory_another_user_made_first_in_a_sticky_directory_is_refused_naming_path_and_owner(sm, sticky):
    squat(sticky / "models")
    with pytest.raises(sm.UntrustedPath) as refused:
        sm.make_dirs(str(sticky / "models" / "M"))
    assert str(refused.value).startswith(
        f"{sticky}/models: a parent directory not owned by root (found: owner uid {OTHER} (nobody), mode 0755): root makes "
    )
    assert not (sticky / "models" / "M").exists()  # nothing of root's was put in it
    with pytest.raises(sm.UntrustedPath, match=rf"{sticky}/models: a directory not owned by root \(found: owner uid {OTHER}"):
        sm.make_dirs(str(sticky / "models"))


@as_root
def test_a_directory_another_user_makes_between_the_check_and_the_creation_is_refused(sm, sticky, monkeypatch):
    target = str(sticky / "models")
    real_mkdir = os.mkdir

    def raced(path, mode=0o777, *, dir_fd=None):
        full = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path) if dir_fd is not None else os.fspath(path)
        if full == target and not os.path.lexists(full):
            real_mkdir(full)  # the other user, between root's look and root's mkdir
            os.chown(full, OTHER, OTHER)
        return real_mkdir(path, mode, dir_fd=dir_fd) if dir_fd is not None else real_mkdir(path, mode)

    monkeypatch.setattr(os, "mkdir", raced)
    with pytest.raises(sm.UntrustedPath, match=rf"\A{target}: a directory not owned by root \(found: owner uid {OTHER} \(nobody\)"):
        sm.make_dirs(target)


def test_a_link_of_roots_on_the_way_is_followed_and_judged_where_it_leads(sm, tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")  # as /var/run -> /run
    assert sm.make_dirs(str(tmp_path / "link" / "x")) == [str(tmp_path / "real" / "x")]
    (tmp_path / "real").chmod(0o777)
    with pytest.raises(sm.UntrustedPath, match="writable by its group or others, without the sticky bit"):
        sm.make_dirs(str(tmp_path / "link" / "y"))
    (tmp_path / "real").chmod(0o755)


@as_root
def test_a_link_of_another_users_is_never_followed(sm, sticky, tmp_path):
    (tmp_path / "theirs").mkdir()
    (sticky / "models").symlink_to(tmp_path / "theirs")
    os.lchown(sticky / "models", OTHER, OTHER)
    with pytest.raises(sm.UntrustedPath, match=rf"{sticky}/models: a symlink \(to {tmp_path}/theirs\)"):
        sm.make_dirs(str(sticky / "models" / "M"))
    assert list((tmp_path / "theirs").iterdir()) == []


@as_root
def test_a_private_dir_another_user_made_first_is_refused_and_a_link_is_never_tightened_through(sm, sticky, tmp_path):
    squat(sticky / "run")
    with pytest.raises(PermissionError, match=rf"{sticky}/run: a directory not owned by root \(found: owner uid {OTHER}"):
        sm.private_dir(str(sticky / "run"))
    assert stat.S_IMODE((sticky / "run").stat().st_mode) == 0o755  # not touched
    (tmp_path / "elsewhere").mkdir(mode=0o755)
    (tmp_path / "private").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PermissionError, match="a symlink"):
        sm.private_dir(str(tmp_path / "private"))
    assert stat.S_IMODE((tmp_path / "elsewhere").stat().st_mode) == 0o755


def test_a_new_file_is_never_written_through_a_link_planted_at_its_name(sm, tmp_path):
    (tmp_path / "target").write_text("theirs")
    (tmp_path / "x.tmp").symlink_to(tmp_path / "target")
    with sm.new_file(str(tmp_path / "x.tmp")) as handle:
        handle.write("ours")
    assert (tmp_path / "target").read_text() == "theirs" and not (tmp_path / "x.tmp").is_symlink()


# Absent is not trusted under a world-writable directory ---------------------------------------


def test_an_absent_name_under_a_world_writable_directory_is_not_trusted_under_roots_own_it_is(sm, sticky, tmp_path):
    assert sm.why_untrusted(str(sticky / "venv")) == (
        f"{sticky}/venv: absent, in {sticky} (owner uid 0 (root), mode 1777), which others can write: whoever makes it "
        "first owns it, so it is trusted only as root makes it (make_dirs: exclusively, then checked)"
    )
    assert sm.parents_untrusted(str(sticky / "models" / "M")).startswith(f"{sticky}/models: absent, in {sticky} ")
    assert sm.why_untrusted(str(tmp_path / "not-yet" / "venv")) is None  # below root's own: only root can make it


def test_a_venv_to_be_made_under_a_world_writable_directory_stops_the_venv_read(sticky, tmp_path):
    # As `venv_path: /run/lock/venv` would (the data refuses it too: tests/unit/bad_data/trusted_paths/).
    live = sticky / "venv"
    out = subprocess.run([sys.executable, "-", str(live), f"{live}.generations/g1", str(tmp_path / "cache"), str(tmp_path / "uv")],
                         input=remote.script("venv_state"), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)["untrusted"]
    assert f"{live}: absent, in {sticky} (owner uid 0 (root), mode 1777), which others can write: whoever makes it first owns it, " \
           "so it is trusted only as root makes it (make_dirs: exclusively, then checked)" in found


@as_root
def test_the_record_index_is_never_written_into_a_directory_of_another_users(tmp_path):
    from tests.unit.test_venv import _fake_venv

    gen = _fake_venv(tmp_path / "venv.generations" / "g1", {"torch": ["torch/__init__.py"]})
    squat(gen / ".sglang-deploy")
    out = subprocess.run([sys.executable, "-", str(gen), str(gen), str(tmp_path / "cache"), str(tmp_path / "uv"), "write-index"],
                         input=remote.script("venv_state"), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["written"] is False and f"{gen}/.sglang-deploy: a directory not owned by root (found: owner uid {OTHER}" in answer["why"]
    assert list((gen / ".sglang-deploy").iterdir()) == []


# Staging: the shm dir, made by the stage script ------------------------------------------------


@as_root
def test_a_shm_dir_another_user_makes_between_the_check_and_the_creation_is_moved_aside_and_made_afresh(sm, sticky, tmp_path, monkeypatch, capsys):
    src = make_model(tmp_path / "store" / "M", FILES)
    shm = sticky / "models"  # shm_dir: /dev/shm/models, `models` not there yet
    real_mkdir = os.mkdir
    raced = []

    def squatter_first(path, mode=0o777, *, dir_fd=None):
        full = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path) if dir_fd is not None else os.fspath(path)
        if full == str(shm) and not raced:
            raced.append(full)
            real_mkdir(full, 0o777)  # theirs, world-writable inside: they would swap what root copies in
            os.chmod(full, 0o777)
            os.chown(full, OTHER, OTHER)
        return real_mkdir(path, mode, dir_fd=dir_fd) if dir_fd is not None else real_mkdir(path, mode)

    monkeypatch.setattr(os, "mkdir", squatter_first)
    sm.stage(str(src), str(shm / "M"), MARKER, interval=0)
    out = capsys.readouterr().out
    assert raced and f"{shm}: a directory not owned by root (found: owner uid {OTHER} (nobody), mode 0777)" in out and "moved aside" in out
    st = shm.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755
    aside = list(sticky.glob(".models.untrusted-*"))
    assert len(aside) == 1 and aside[0].stat().st_uid == OTHER and list(aside[0].iterdir()) == []  # never deleted, nothing put in
    assert all(p.lstat().st_uid == 0 for p in [shm / "M", *(shm / "M").rglob("*")])
    monkeypatch.undo()
    assert models.drift(state(src, shm / "M")) is None


@as_root
def test_a_link_planted_where_the_shm_dir_goes_is_moved_aside_and_nothing_written_where_it_leads(sticky, tmp_path):
    src = make_model(tmp_path / "store" / "M", FILES)
    (tmp_path / "theirs").mkdir()
    os.chown(tmp_path / "theirs", OTHER, OTHER)
    shm = sticky / "models"
    shm.symlink_to(tmp_path / "theirs")
    os.lchown(shm, OTHER, OTHER)
    out = stage(src, shm / "M").stdout
    assert f"{shm}: a symlink (to {tmp_path}/theirs)" in out and "moved aside" in out
    assert not shm.is_symlink() and shm.stat().st_uid == 0
    assert list((tmp_path / "theirs").iterdir()) == []
    assert models.drift(state(src, shm / "M")) is None


# Reads of trees others can write: no link followed, bounded -----------------------------------


def test_a_link_planted_at_a_staged_dir_is_not_walked(sm, tmp_path):
    src = make_model(tmp_path / "store" / "M", FILES)
    dest = tmp_path / "shm" / "M"
    stage(src, tmp_path / "elsewhere" / "M")
    dest.parent.mkdir()
    dest.symlink_to(tmp_path / "elsewhere" / "M")  # a whole, real staged copy behind it
    fact = state(src, dest)
    assert fact["dest"] == {} and fact["untrusted"].startswith(f"{dest}: a symlink (to {tmp_path}/elsewhere/M)")
    assert sm.walk_files(str(dest)) is None  # lstat first: a link is no directory to walk
    assert set(sm.walk_files(str(dest), follow_root=True)) >= set(FILES)  # only where asked (a store's own link)


def test_a_tree_200_levels_deep_is_a_judgement_not_a_crash(sm, tmp_path):
    src = make_model(tmp_path / "store" / "M", FILES)
    dest = deep_tree(tmp_path / "shm" / "M", 200)  # root's: only root's own trees are walked at all
    fact = state(src, dest)
    assert fact["dest"] == {} and fact["untrusted"].startswith(f"{dest}: deeper than 32 levels")
    with pytest.raises(sm.Unwalkable, match=rf"\A{re.escape(str(dest))}: deeper than 32 levels \({re.escape(str(dest))}(/d){{33}}\): not read\Z"):
        sm.walk_files(str(dest))
    assert models.drift(fact).startswith("not staged by root (")
    out = stage(src, dest).stdout
    assert "deeper than 32 levels" in out and "moved aside" in out
    assert models.drift(state(src, dest)) is None
    deep_src = deep_tree(tmp_path / "store" / "Deep", 200)
    proc = stage(deep_src, tmp_path / "shm" / "Deep", check=False)
    assert proc.returncode == 1 and f"stage_model: {deep_src}: deeper than 32 levels" in proc.stderr and "Traceback" not in proc.stderr


def test_a_tree_of_more_entries_than_the_bound_is_a_judgement(sm, tmp_path, monkeypatch):
    root = tmp_path / "many"
    root.mkdir()
    for i in range(12):
        (root / f"f{i}").write_text("x")
    monkeypatch.setattr(sm, "WALK_MAX_ENTRIES", 10)
    with pytest.raises(sm.Unwalkable, match=rf"\A{root}: more than 10 entries: not read\Z"):
        sm.walk_files(str(root))
    monkeypatch.setattr(sm, "WALK_MAX_ENTRIES", 12)
    assert len(sm.walk_files(str(root))) == 12


@as_root
def test_another_users_tree_is_judged_by_its_owner_before_and_without_being_read(tmp_path, monkeypatch, capsys):
    src = make_model(tmp_path / "store" / "M", FILES)
    dest = deep_tree(tmp_path / "shm" / "M", 200)
    os.chown(dest, OTHER, OTHER)
    scanned = []
    real_scandir = os.scandir

    def recording(top="."):
        scanned.append(os.readlink(f"/proc/self/fd/{top}") if isinstance(top, int) else os.fspath(top))
        return real_scandir(top)

    monkeypatch.setattr(os, "scandir", recording)
    monkeypatch.setattr(sys, "argv", ["-", str(src), str(dest), MARKER])
    load_remote_module("model_state", "model_state_create_verify")  # the fact script, run here: it prints its answer
    fact = json.loads(capsys.readouterr().out)
    assert fact["untrusted"] == f"{dest}: not owned by root (found: owner uid {OTHER} (nobody), mode 0755)" and fact["dest"] == {}
    assert scanned and not [path for path in scanned if path.startswith(str(dest))]  # the source was read; nothing of theirs


def test_a_store_listing_too_deep_fails_naming_it(tmp_path):
    deep = deep_tree(tmp_path / "store" / "Deep", 200)
    proc = script("model_listing", str(deep), check=False)
    assert proc.returncode == 1 and proc.stderr.startswith(f"model_listing: {deep}: deeper than 32 levels") and not proc.stdout


# The staging lock ----------------------------------------------------------------------------


def test_the_staging_lock_lies_in_a_directory_of_roots_alone_never_a_world_writable_one(sm):
    if os.geteuid() == 0:
        assert sm.RUN_DIR == "/run/sglang-deploy" and sm.LOCK_PATH == "/run/sglang-deploy/stage.lock"
    assert writable_by_others(sm.LOCK_PATH) is None
    assert not any(inside in sm.LOCK_PATH for inside in ("/run/lock", "/var/lock", "/tmp", "/dev/shm"))


@as_root
def test_another_user_holding_the_old_lock_name_blocks_no_staging(tmp_path):
    src = make_model(tmp_path / "store" / "M", FILES)
    old = Path("/run/lock/sglang-deploy-stage.lock")  # where the lock was: /run/lock is world-writable
    if not old.parent.is_dir():
        pytest.skip(f"no {old.parent} here")
    planted = not old.exists()  # one an older version left stays as it is; else made as the other user's
    if planted:
        old.touch(mode=0o644)
        os.chown(old, OTHER, OTHER)
    holder = open(old)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # any local user can make this name and hold it
        proc = subprocess.run([sys.executable, "-", str(src), str(tmp_path / "shm" / "M"), MARKER, "--progress", "0"],
                              input=remote.script("stage_model"), capture_output=True, text=True, timeout=60)
    finally:
        holder.close()
        if planted:
            old.unlink()
    assert proc.returncode == 0, proc.stderr
    run_dir = Path("/run/sglang-deploy").lstat()
    assert stat.S_ISDIR(run_dir.st_mode) and run_dir.st_uid == 0 and stat.S_IMODE(run_dir.st_mode) == 0o700
    assert not list((tmp_path / "shm").glob("*.lock"))
