"""lab.py knows a mount point reached through a symlink (a worktree's lab/state is one): else it mounts twice."""

import importlib.util
from pathlib import Path

LAB = Path(__file__).resolve().parents[2] / "lab" / "lab.py"


def lab_module():
    spec = importlib.util.spec_from_file_location("lab_under_test", LAB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_mount_point_behind_a_symlink_is_mounted(tmp_path):
    lab = lab_module()
    (tmp_path / "state").symlink_to("/")  # like lab/state -> /work/main/lab/state
    (tmp_path / "proc-link").symlink_to("/proc")
    assert lab.is_mounted(Path("/proc"))
    assert lab.is_mounted(tmp_path / "proc-link")
    assert lab.is_mounted(tmp_path / "state" / "proc")
    assert not lab.is_mounted(tmp_path)
    assert "/proc" in lab.mounts_under(tmp_path / "proc-link")
