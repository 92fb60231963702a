"""stage_model.py's refusals and its test hook, run for real against directories under tmp_path.

The README promises that staging stops, naming the path and the fix, when a source file changes while it
is copied, when the host lacks the memory or space, when the source holds something other than regular
files, and when a `.NAME.partial` it did not make is in the way; and that DEST is never replaced then.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from operations.model import models

MARKER = models.MARKER
SCRIPT = Path(__file__).resolve().parents[2] / "operations" / "model" / "on_host" / "stage_model.py"


@pytest.fixture
def model(tmp_path):
    src = tmp_path / "store" / "M"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "w1.bin").write_bytes(os.urandom(300_000))
    (src / "sub" / "w2.bin").write_bytes(os.urandom(100_000))
    return src, tmp_path / "shm" / "M"


def stage(sm, src, dest, **kw):
    return sm.stage(str(src), str(dest), MARKER, interval=0, **kw)


def listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def without_ours(files: dict[str, bytes]) -> dict[str, bytes]:
    return {rel: data for rel, data in files.items() if not Path(rel).name.startswith(".sglang-deploy")}


def in_thread(fn):
    """Run fn in a thread; return (thread, outcome) where outcome gets "result" or "error"."""
    outcome = {}

    def body():
        try:
            outcome["result"] = fn()
        except Exception as exc:  # the test reads it
            outcome["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


def wait_for(path: Path, thread: threading.Thread, seconds: float = 20) -> str:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert thread.is_alive(), "staging ended without reaching the hold"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)
    return path.read_text()


def test_the_hold_hook_holds_the_named_model_inside_staging_until_released(sm, model, tmp_path):
    src, dest = model
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "hold-staging").write_text("M\n")
    thread, outcome = in_thread(lambda: stage(sm, src, dest))
    reached = wait_for(hooks / "reached-staging", thread)
    assert reached.split() == ["M", str(os.getpid())]
    # Held inside staging: the partial copy and its journal exist, nothing is copied, DEST not made.
    partial = dest.parent / ".M.partial"
    assert (partial / sm.JOURNAL_NAME).exists() and not dest.exists()
    assert [p.name for p in partial.rglob("*.bin")] == []
    time.sleep(0.3)
    assert thread.is_alive(), "the hold let go while its file is there"
    (hooks / "hold-staging").unlink()
    thread.join(20)
    assert outcome == {"result": {"copied": 3, "bytes": 400_002}}
    assert without_ours(listing(dest)) == without_ours(listing(src)) and (dest / MARKER).exists()


@pytest.mark.parametrize("content", ["", "Other\n", "M-big\n", " \n"])
def test_the_hold_hook_ignores_a_file_that_does_not_name_the_model(sm, model, tmp_path, content):
    src, dest = model
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "hold-staging").write_text(content)
    assert stage(sm, src, dest)["copied"] == 3
    assert not (tmp_path / "hooks" / "reached-staging").exists()


def test_without_the_hook_directory_nothing_is_held(sm, model, tmp_path):
    src, dest = model
    assert stage(sm, src, dest)["copied"] == 3
    assert not (tmp_path / "hooks").exists()


def test_a_hold_never_released_ends_at_its_limit(sm, model, tmp_path, monkeypatch):
    src, dest = model
    monkeypatch.setattr(sm, "HOLD_LIMIT_S", 0.5)
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "hold-staging").write_text("M\n")
    start = time.monotonic()
    assert stage(sm, src, dest)["copied"] == 3
    assert time.monotonic() - start >= 0.5
    assert (tmp_path / "hooks" / "reached-staging").exists()


def test_a_source_file_that_changes_while_it_is_copied_stops_staging_and_replaces_nothing(sm, model, tmp_path):
    src, dest = model
    stage(sm, src, dest)
    before = listing(dest)
    (src / "w1.bin").write_bytes(os.urandom(300_000))  # a new version: staging starts
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "hold-staging").write_text("M\n")
    thread, outcome = in_thread(lambda: stage(sm, src, dest))
    wait_for(hooks / "reached-staging", thread)
    with open(src / "w1.bin", "ab") as handle:  # listed at 300000 bytes; grows before it is read
        handle.write(b"more")
    (hooks / "hold-staging").unlink()
    thread.join(20)
    error = outcome.get("error")
    assert isinstance(error, sm.StageError), outcome
    assert str(error) == f"{src}/w1.bin changed while it was copied (300000 bytes listed, 300004 read): run again"
    assert listing(dest) == before  # the staged copy in place is the previous one
    assert not list((dest.parent / ".M.partial").rglob("*.sglang-part"))


def test_not_enough_memory_stops_before_copying_with_the_numbers(sm, model, monkeypatch):
    src, dest = model
    monkeypatch.setattr(sm, "mem_available", lambda: 100 << 10)
    with pytest.raises(sm.StageError) as caught:
        stage(sm, src, dest)
    assert str(caught.value) == (
        "not enough space to stage: the host has 100.00 KiB of memory available, this host must stage 390.63 KiB more "
        f"(M 390.63 KiB): free space there, give {dest.parent} more room, or load a model from the store (`model_in: store`)"
    )
    assert not dest.exists() and not (dest.parent / ".M.partial").exists()


@pytest.mark.parametrize("kind", ["symlink", "fifo", "dangling symlink"])
def test_a_source_with_something_other_than_regular_files_is_refused(sm, model, kind):
    src, dest = model
    odd = src / "sub" / "odd.bin"
    if kind == "symlink":
        odd.symlink_to(src / "w1.bin")
    elif kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.symlink_to(src / "nowhere")
    with pytest.raises(sm.StageError) as caught:
        stage(sm, src, dest)
    assert str(caught.value) == f"{odd}: only regular files can be staged (found a link or special file)"
    assert not dest.exists() and not (dest.parent / ".M.partial").exists()


def test_a_partial_directory_we_did_not_make_is_refused_and_kept(sm, model):
    src, dest = model
    partial = dest.parent / ".M.partial"
    partial.mkdir(parents=True)
    (partial / "theirs.txt").write_text("someone else's")
    with pytest.raises(sm.StageError) as caught:
        stage(sm, src, dest)
    assert str(caught.value) == f"{partial} exists and was not made by sglang-deploy: move it away, then run again"
    assert listing(partial) == {"theirs.txt": b"someone else's"} and not dest.exists()


def test_an_empty_partial_directory_or_one_of_ours_is_taken_over(sm, model):
    src, dest = model
    partial = dest.parent / ".M.partial"
    partial.mkdir(parents=True)
    assert stage(sm, src, dest)["copied"] == 3
    assert not partial.exists()
