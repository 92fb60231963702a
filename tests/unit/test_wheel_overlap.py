"""Two distributions that install one file: found in the wheels' RECORDs, before any host installs them.

The case that set this up: sglang-0.5.13-cu130 named nvidia-cutlass-dsl-libs-base and -libs-cu13 4.5.2, whose
wheels both install 177 files under nvidia_cutlass_dsl/ (99 differ); only a second deploy saw it, on the
installed venv. These wheels are small synthetic ones: zip files with a RECORD, as pip and uv read them.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from configuration import wheels
from configuration.stacks import Package, Stack
from tools import wheelhouse


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes], tag: str = "py3-none-any") -> Path:
    """A wheel `name-version-tag.whl` in `folder` installing `files` (path -> content), with its RECORD."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    members = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
               f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rows = []
    for rel, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{rel},sha256={digest},{len(data)}")
    rows.append(f"{info}/RECORD,,")
    path = folder / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for rel, data in members.items():
            wheel.writestr(rel, data)
        wheel.writestr(f"{info}/RECORD", "\n".join(rows) + "\n")
    return path


def pin(path: Path, name: str, version: str) -> Package:
    return Package(name, version, path.name, hashlib.sha256(path.read_bytes()).hexdigest())


# libs-base and libs-cu13 4.5.2 in small: cu13 has every file of base but its LICENSE, some with other bytes.
BASE = {
    "nvidia_cutlass_dsl/LICENSE": b"license\n",
    "nvidia_cutlass_dsl/lib/libcute_dsl_runtime.so": b"cu12 runtime\n",
    "nvidia_cutlass_dsl/python_packages/cutlass/__init__.py": b"base\n",
    "nvidia_cutlass_dsl/python_packages/cutlass/py.typed": b"",
    "nvidia_cutlass_dsl.pth": b"nvidia_cutlass_dsl/python_packages\n",
}
CU13 = {
    "nvidia_cutlass_dsl/lib/libcute_dsl_runtime.so": b"cu13 runtime, longer\n",
    "nvidia_cutlass_dsl/python_packages/cutlass/__init__.py": b"base\n",
    "nvidia_cutlass_dsl/python_packages/cutlass/py.typed": b"",
    "nvidia_cutlass_dsl/python_packages/cutlass/cute/experimental/core.py": b"new in cu13\n",
    "nvidia_cutlass_dsl.pth": b"nvidia_cutlass_dsl/python_packages\n",
}


@pytest.fixture
def cutlass(tmp_path) -> dict[str, Package]:
    house = tmp_path / "wheelhouse"
    house.mkdir()
    return {
        "base": pin(make_wheel(house, "nvidia-cutlass-dsl-libs-base", "4.5.2", BASE), "nvidia-cutlass-dsl-libs-base", "4.5.2"),
        "cu13": pin(make_wheel(house, "nvidia-cutlass-dsl-libs-cu13", "4.5.2", CU13), "nvidia-cutlass-dsl-libs-cu13", "4.5.2"),
        # 4.8.0's layout: one directory, no file in common (cu12/ and cu13/ beside each other): no conflict.
        "cu12-split": pin(make_wheel(house, "nvidia-cutlass-dsl-libs-cu12", "4.8.0", {"nvidia_cutlass_dsl/cu12/lib/libcute_dsl_runtime.so": b"12\n"}), "nvidia-cutlass-dsl-libs-cu12", "4.8.0"),
        "cu13-split": pin(make_wheel(house, "nvidia-cutlass-dsl-libs-cu13", "4.8.0", {"nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so": b"13\n"}), "nvidia-cutlass-dsl-libs-cu13", "4.8.0"),
    }


def _stack(tmp_path, *packages) -> Stack:
    return Stack("demo", "3.12", tuple(sorted(packages, key=lambda p: p.name)), tmp_path / "demo.yml")


def test_wheel_files_lists_what_lands_in_site_packages(tmp_path):
    path = make_wheel(tmp_path, "demo", "1.0", {
        "demo/a.py": b"a\n", "demo-1.0.data/purelib/demo/b.py": b"bb\n", "demo-1.0.data/scripts/demo-tool": b"#!python\n",
    })
    files = wheels.wheel_files(path)
    assert sorted(files) == ["demo/a.py", "demo/b.py"]  # .dist-info and scripts are not site-packages files of a package
    assert files["demo/b.py"][1] == "3"


def test_wheel_files_refuses_a_file_that_is_not_a_wheel(tmp_path):
    path = tmp_path / "demo-1.0-py3-none-any.whl"
    path.write_bytes(b"not a zip")
    with pytest.raises(wheels.WheelhouseError, match=r"demo-1\.0-py3-none-any\.whl: not a wheel: its RECORD cannot be read"):
        wheels.wheel_files(path)


def test_overlaps_names_the_pair_the_shared_and_the_differing_files(tmp_path, cutlass):
    house = tmp_path / "wheelhouse"
    (found,) = wheels.overlaps({p: house / p.file for p in (cutlass["base"], cutlass["cu13"])})
    assert (found.first.name, found.second.name, found.top) == ("nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-cu13", "nvidia_cutlass_dsl")
    # py.typed is empty and the .pth a loose top-level file: no claim, as on the host (environment/on_host/venv_state.py).
    assert found.paths == ("nvidia_cutlass_dsl/lib/libcute_dsl_runtime.so", "nvidia_cutlass_dsl/python_packages/cutlass/__init__.py")
    assert found.differ == ("nvidia_cutlass_dsl/lib/libcute_dsl_runtime.so",)
    assert "2 file(s) are in both wheels, 1 of them differ (e.g. nvidia_cutlass_dsl/lib/libcute_dsl_runtime.so)" in found.describe()


def test_one_directory_without_a_common_file_is_no_overlap(tmp_path, cutlass):
    house = tmp_path / "wheelhouse"
    assert wheels.overlaps({p: house / p.file for p in (cutlass["cu12-split"], cutlass["cu13-split"])}) == []


def test_build_refuses_a_stack_of_two_wheels_of_one_file_naming_both_the_path_and_the_fix(tmp_path, cutlass):
    house = tmp_path / "wheelhouse"
    stack = _stack(tmp_path, cutlass["base"], cutlass["cu13"])
    with pytest.raises(wheels.WheelhouseError) as caught:
        wheelhouse.build(stack, house)
    message = str(caught.value)
    assert "stack demo: nvidia_cutlass_dsl/ is installed by both nvidia-cutlass-dsl-libs-base 4.5.2 and nvidia-cutlass-dsl-libs-cu13 4.5.2" in message
    assert "nvidia_cutlass_dsl/lib/libcute_dsl_runtime.so" in message
    assert "drop the other from files/stacks/demo.yml" in message


def test_build_accepts_the_stack_once_one_of_them_is_dropped(tmp_path, cutlass):
    house = tmp_path / "wheelhouse"
    stack = _stack(tmp_path, cutlass["cu13"], cutlass["cu12-split"])
    files = wheelhouse.build(stack, house)
    assert {f.name for f in files} >= {cutlass["cu13"].file, cutlass["cu12-split"].file}


def test_the_cli_says_it_and_fails(tmp_path, cutlass, monkeypatch, capsys):
    house = tmp_path / "wheelhouse"
    stack = _stack(tmp_path, cutlass["base"], cutlass["cu13"])
    monkeypatch.setattr(wheelhouse, "load_stack", lambda name, *a: stack)
    assert wheelhouse.main(["demo", str(house)]) == 1
    assert "is installed by both nvidia-cutlass-dsl-libs-base 4.5.2 and nvidia-cutlass-dsl-libs-cu13 4.5.2" in capsys.readouterr().err
