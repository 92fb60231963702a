"""`python -m tools.patchset_build`: patch set manifests from patched files and a pristine package."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
import yaml

from configuration import stacks
from configuration.settings import REPO_ROOT
from operations import patches
from tools import patchset_build
from tools.patchset_build import BuildError, build, main

ORIGINAL = b"def draft():\n    return 'original'\n"
PATCHED = b"def draft():\n    return 'patched'\n"
ADDED = b"BUDGET = 15\n"
METADATA = "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nSummary: a demo distribution\n"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    return path


@pytest.fixture
def pristine(tmp_path) -> Path:
    """A site-packages directory with demo 1.0 installed (and an unrelated distribution)."""
    site = tmp_path / "site-packages"
    write(site / "demo-1.0.dist-info" / "METADATA", METADATA)
    write(site / "demo" / "__init__.py", "")
    write(site / "demo" / "core.py", ORIGINAL)
    write(site / "other-2.0.dist-info" / "METADATA", "Metadata-Version: 2.1\nName: other\nVersion: 2.0\n")
    return site


@pytest.fixture
def patched(tmp_path) -> Path:
    folder = tmp_path / "patched"
    write(folder / "demo" / "core.py", PATCHED)
    write(folder / "demo" / "sub" / "extra.py", ADDED)
    write(folder / "demo" / "__pycache__" / "core.cpython-311.pyc", b"\0stale")  # never part of a set
    return folder


@pytest.fixture
def out(tmp_path) -> Path:
    return tmp_path / "out"


def manifest(folder: Path) -> dict:
    return yaml.safe_load((folder / "patchset.yml").read_text(encoding="utf-8"))


def test_manifest_names_base_and_every_file(pristine, patched, out):
    target = build("demo-set", "demo==1.0", patched, pristine, out)

    assert target == (out / "demo-set").resolve()
    assert manifest(target) == {
        "name": "demo-set",
        "base": {"distribution": "demo", "version": "1.0"},
        "files": {
            "demo/core.py": {"sha256": sha256(PATCHED), "original": sha256(ORIGINAL)},
            "demo/sub/extra.py": {"sha256": sha256(ADDED), "original": None},
        },
    }
    assert (target / "demo" / "core.py").read_bytes() == PATCHED
    assert (target / "demo" / "sub" / "extra.py").read_bytes() == ADDED
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == [
        "demo/core.py", "demo/sub/extra.py", "patchset.yml",
    ]


def test_manifest_text_is_the_documented_format(pristine, patched, out):
    text = (build("demo-set", "demo==1.0", patched, pristine, out, description="the demo set") / "patchset.yml").read_text()

    assert text == (
        "# the demo set\n"
        "name: demo-set\n"
        'base: {distribution: demo, version: "1.0"}\n'  # quoted: a plain 1.0 would read as a float
        "files:\n"
        f'  demo/core.py: {{sha256: "{sha256(PATCHED)}", original: "{sha256(ORIGINAL)}"}}\n'
        f'  demo/sub/extra.py: {{sha256: "{sha256(ADDED)}", original: null}}\n'
    )


def test_output_is_deterministic_and_rebuilds_in_place(pristine, patched, out):
    first = (build("demo-set", "demo==1.0", patched, pristine, out) / "patchset.yml").read_bytes()
    again = (build("demo-set", "demo==1.0", patched, pristine, out, force=True) / "patchset.yml").read_bytes()
    # DIR may be the set itself: edit a file there, rebuild, and the manifest follows.
    write(out / "demo-set" / "demo" / "core.py", PATCHED + b"# more\n")
    in_place = build("demo-set", "demo==1.0", out / "demo-set", pristine, out)

    assert first == again
    assert manifest(in_place)["files"]["demo/core.py"]["sha256"] == sha256(PATCHED + b"# more\n")
    assert manifest(in_place)["files"]["demo/sub/extra.py"]["original"] is None


def test_the_deploy_reads_what_it_builds(pristine, patched, out, monkeypatch):
    build("demo-set", "demo==1.0", patched, pristine, out)
    monkeypatch.setattr(patches, "PATCHES_DIR", out)
    patches.load_patch_set.cache_clear()
    try:
        patch_set = patches.load_patch_set("demo-set")
    finally:
        patches.load_patch_set.cache_clear()

    assert (patch_set.distribution, patch_set.version) == ("demo", "1.0")
    assert [(f.path, f.original) for f in patch_set.files] == [
        ("demo/core.py", sha256(ORIGINAL)), ("demo/sub/extra.py", None),
    ]


def test_unchanged_file_is_refused(pristine, patched, out):
    write(patched / "demo" / "__init__.py", b"")  # the same bytes as the installed file

    with pytest.raises(BuildError, match=r"demo/__init__.py: identical to the original .*nothing to patch"):
        build("demo-set", "demo==1.0", patched, pristine, out)
    assert not (out / "demo-set").exists()


def test_version_mismatch_is_refused(pristine, patched, out):
    with pytest.raises(BuildError, match=r"--base demo==1\.1, but the pristine site-packages .* has demo 1\.0"):
        build("demo-set", "demo==1.1", patched, pristine, out)


def test_distribution_missing_from_pristine_is_refused(pristine, patched, out):
    with pytest.raises(BuildError, match=r"no sglang installed there .*demo-1\.0\.dist-info, other-2\.0\.dist-info"):
        build("demo-set", "sglang==1.0", patched, pristine, out)


def test_pristine_from_a_wheel(tmp_path, patched, out):
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo/__init__.py", "")
        zf.writestr("demo/core.py", ORIGINAL)
        zf.writestr("demo-1.0.dist-info/METADATA", METADATA)
        zf.writestr("demo-1.0.dist-info/RECORD", "")

    files = manifest(build("demo-set", "demo==1.0", patched, wheel, out))["files"]

    assert files["demo/core.py"] == {"sha256": sha256(PATCHED), "original": sha256(ORIGINAL)}
    assert files["demo/sub/extra.py"]["original"] is None
    with pytest.raises(BuildError, match=r"pristine wheel .* has demo 1\.0"):
        build("demo-set", "demo==2.0", patched, wheel, out, force=True)


def test_existing_set_needs_force(pristine, patched, out):
    build("demo-set", "demo==1.0", patched, pristine, out)

    with pytest.raises(BuildError, match="already exists: pass --force"):
        build("demo-set", "demo==1.0", patched, pristine, out)


@pytest.mark.parametrize(
    "name, base, message",
    [
        ("Demo Set", "demo==1.0", "NAME 'Demo Set': must match"),
        ("demo-set", "demo>=1.0", "--base 'demo>=1.0': must be DISTRIBUTION==VERSION"),
    ],
)
def test_bad_name_or_base_is_refused(pristine, patched, out, name, base, message):
    with pytest.raises(BuildError, match=message):
        build(name, base, patched, pristine, out)


def test_command_exits_non_zero_with_the_reason(pristine, patched, out, capsys):
    write(patched / "demo" / "__init__.py", b"")
    argv = ["demo-set", "--base", "demo==1.0", "--patched", str(patched), "--pristine", str(pristine), "--out", str(out)]

    assert main(argv) == 1
    assert "patchset_build: error: demo/__init__.py: identical to the original" in capsys.readouterr().err

    (patched / "demo" / "__init__.py").unlink()
    assert main(argv) == 0
    assert "patch set demo-set: 1 replaced, 1 added, over demo 1.0" in capsys.readouterr().out


# The repository's ddtree-sample ------------------------------------------------------------


def _sglang_wheel() -> Path | None:
    """The pinned sglang 0.5.23 wheel, if a local wheelhouse holds it (sha256 checked)."""
    pin = next(p for p in stacks.load_stack("lab-cpu-sglang").packages if p.name == "sglang")
    for folder in (REPO_ROOT / "lab" / "cache" / "wheelhouse", REPO_ROOT / "wheelhouse"):
        wheel = folder / pin.file
        if wheel.is_file() and sha256(wheel.read_bytes()) == pin.sha256:
            return wheel
    return None


def test_ddtree_sample_loads():
    patches.load_patch_set.cache_clear()
    patch_set = patches.load_patch_set("ddtree-sample")

    assert (patch_set.name, patch_set.distribution, patch_set.version) == ("ddtree-sample", "sglang", "0.5.23")
    assert any(f.original is None for f in patch_set.files) and any(f.original for f in patch_set.files)
    for patch_file in patch_set.files:
        head = patch_set.local(patch_file).read_text(encoding="utf-8").splitlines()[0]
        assert head.startswith("# ddtree-sample patch set for sglang 0.5.23"), patch_file.path


def test_ddtree_sample_originals_are_the_pinned_wheels_files(tmp_path):
    wheel = _sglang_wheel()
    if wheel is None:
        pytest.skip("the sglang 0.5.23 wheel is not in a local wheelhouse (make wheelhouse)")
    patch_set = patches.load_patch_set("ddtree-sample")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for patch_file in patch_set.files:
            if patch_file.original is None:
                assert patch_file.path not in names
            else:
                assert sha256(zf.read(patch_file.path)) == patch_file.original, patch_file.path

    # And the builder reproduces the committed manifest byte for byte.
    committed = (patch_set.root / "patchset.yml").read_text(encoding="utf-8")
    description = committed.splitlines()[0].removeprefix("# ")
    rebuilt = build("ddtree-sample", "sglang==0.5.23", patch_set.root, wheel, tmp_path, description=description)
    assert (rebuilt / "patchset.yml").read_text(encoding="utf-8") == committed


def test_module_docstring_shows_the_command():
    assert "python -m tools.patchset_build NAME --base sglang==0.5.23" in patchset_build.__doc__
