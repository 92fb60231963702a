"""What the lab makes at run time is never committed, whatever form it takes in a checkout."""

from __future__ import annotations

import subprocess

import pytest

from configuration.settings import REPO_ROOT


@pytest.mark.parametrize("path", ["lab/state", "lab/cache", "lab/run", "lab/inventory.py", ".venv"])
def test_the_labs_runtime_paths_are_ignored_as_directories_and_as_links(path):
    # A worktree links lab/state and lab/cache to the checkout's; a link is no directory, so a `lab/state/` pattern
    # let `git add -A` commit it, and checking that commit out over the real directory deleted the lab's hosts (their
    # root filesystems are mounts under it) and its wheelhouse. `--no-index` judges the path as a file: a link.
    found = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=REPO_ROOT)
    assert found.returncode == 0, f"{path} is not ignored as a file or link: name it without a trailing `/` in .gitignore"
