"""`python -m tools.patchset_build`: patch set manifests from patched files and a pristine package."""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import pytest
import yaml

from configuration import patch_sets, stacks
from configuration.settings import REPO_ROOT
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


def read_back(out: Path, name: str, monkeypatch) -> patch_sets.PatchSet:
    """The set as the deploy's own reader (configuration.patch_sets) loads it from `out`."""
    monkeypatch.setattr(patch_sets, "PATCHES_DIR", out)
    patch_sets.load_patch_set.cache_clear()
    try:
        return patch_sets.load_patch_set(name)
    finally:
        patch_sets.load_patch_set.cache_clear()


def test_the_deploy_reads_what_it_builds(pristine, patched, out, monkeypatch):
    build("demo-set", "demo==1.0", patched, pristine, out)
    patch_set = read_back(out, "demo-set", monkeypatch)

    assert (patch_set.distribution, patch_set.version) == ("demo", "1.0")
    assert [(f.path, f.original) for f in patch_set.files] == [
        ("demo/core.py", sha256(ORIGINAL)), ("demo/sub/extra.py", None),
    ]


def test_the_backends_it_served_on_go_into_the_manifest_and_the_deploy_reads_them(pristine, patched, out, monkeypatch, capsys):
    argv = ["demo-set", "--base", "demo==1.0", "--patched", str(patched), "--pristine", str(pristine), "--out", str(out),
            "--attention-backend", "triton", "--attention-backend", "fa3"]
    assert main(argv) == 0, capsys.readouterr().err
    text = (out / "demo-set" / "patchset.yml").read_text()
    assert 'base: {distribution: demo, version: "1.0"}\nattention_backends: [triton, fa3]\nfiles:\n' in text
    assert read_back(out, "demo-set", monkeypatch).attention_backends == ("triton", "fa3")
    # The backends say nothing of the files: the generation a set makes keeps its name.
    plain = build("demo-plain", "demo==1.0", patched, pristine, out)
    assert manifest(plain)["files"] == manifest(out / "demo-set")["files"] and "attention_backends" not in manifest(plain)


@pytest.mark.parametrize(("backends", "message"), [
    (("Triton",), "must be sglang's name for it, lower case"),
    (("triton\n",), "must be sglang's name for it, lower case"),
    (("",), "must be sglang's name for it, lower case"),
    (("triton", "triton"), "names one backend twice"),
], ids=["upper-case", "trailing-newline", "empty", "twice"])
def test_a_backend_name_the_deploy_would_refuse_is_refused_at_build(pristine, patched, out, backends, message):
    with pytest.raises(BuildError, match=message):
        build("demo-set", "demo==1.0", patched, pristine, out, attention_backends=backends)
    assert not (out / "demo-set").exists()


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
    patch_sets.load_patch_set.cache_clear()
    patch_set = patch_sets.load_patch_set("ddtree-sample")

    assert (patch_set.name, patch_set.distribution, patch_set.version) == ("ddtree-sample", "sglang", "0.5.23")
    assert any(f.original is None for f in patch_set.files) and any(f.original for f in patch_set.files)
    for patch_file in patch_set.files:
        head = patch_set.local(patch_file).read_text(encoding="utf-8").splitlines()[0]
        assert head.startswith("# ddtree-sample patch set for sglang 0.5.23"), patch_file.path


def test_ddtree_sample_originals_are_the_pinned_wheels_files(tmp_path):
    wheel = _sglang_wheel()
    if wheel is None:
        pytest.skip("the sglang 0.5.23 wheel is not in a local wheelhouse (make wheelhouse)")
    patch_set = patch_sets.load_patch_set("ddtree-sample")
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
    rebuilt = build("ddtree-sample", "sglang==0.5.23", patch_set.root, wheel, tmp_path, description=description,
                    parser_only=patch_set.parser_only)
    assert patch_set.parser_only  # it decodes nothing: a GPU stack refuses it
    assert (rebuilt / "patchset.yml").read_text(encoding="utf-8") == committed


def test_module_docstring_shows_the_command():
    assert "python -m tools.patchset_build NAME --base sglang==0.5.23" in patchset_build.__doc__


# From a change: a three-way merge into the release's own files ---------------------------

# The release (demo 1.0) and the change's base differ in the header; the change edits the body.
CHANGE_BASE = b"# demo, upstream main\nimport os\n\n\ndef draft():\n    return 'original'\n\n\nLIMIT = 4\n"
RELEASE = b"# demo 1.0, as released\nimport os\n\n\ndef draft():\n    return 'original'\n\n\nLIMIT = 4\n"
CHANGED = b"# demo, upstream main\nimport os\n\n\ndef draft():\n    return 'tree'\n\n\nLIMIT = 4\n"
MERGED = b"# demo 1.0, as released\nimport os\n\n\ndef draft():\n    return 'tree'\n\n\nLIMIT = 4\n"


@pytest.fixture
def release_wheel(tmp_path) -> Path:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo/__init__.py", "")
        zf.writestr("demo/core.py", RELEASE)
        zf.writestr("demo/same.py", b"X = 1\n")
        zf.writestr("demo/gone.py", b"OLD = 1\n")
        zf.writestr("demo-1.0.dist-info/METADATA", METADATA)
    return wheel


def change_trees(tmp_path, base_files: dict, change_files: dict) -> tuple[Path, Path]:
    """The change's base and its change as two directories laid out as the upstream repository (python/...)."""
    base, change = tmp_path / "upstream-base", tmp_path / "upstream-change"
    for folder, files in ((base, base_files), (change, change_files)):
        folder.mkdir()
        for rel, data in files.items():
            write(folder / rel, data)
    return base, change


def from_dirs(tmp_path, base_files, change_files, wheel, out, **kw):
    base, change = change_trees(tmp_path, base_files, change_files)
    return patchset_build.build_from_change(
        "demo-port", "demo==1.0", patchset_build.change_from_dirs(base, change, "python"), wheel, out, **kw)


def test_change_merges_into_the_releases_own_file(tmp_path, release_wheel, out):
    target, report = from_dirs(
        tmp_path,
        {"python/demo/core.py": CHANGE_BASE, "python/demo/same.py": b"X = 1\n", "tests/test_core.py": b"old\n"},
        {"python/demo/core.py": CHANGED, "python/demo/same.py": b"X = 1\n", "tests/test_core.py": b"new\n",
         "python/demo/tree.py": ADDED},
        release_wheel, out,
    )

    # The release keeps its own header and gains the change's body: neither side's whole file.
    assert (target / "demo" / "core.py").read_bytes() == MERGED
    assert (target / "demo" / "tree.py").read_bytes() == ADDED
    assert manifest(target)["files"] == {
        "demo/core.py": {"sha256": sha256(MERGED), "original": sha256(RELEASE)},  # the release's original
        "demo/tree.py": {"sha256": sha256(ADDED), "original": None},
    }
    assert report.lines() == [
        "demo/core.py: merged cleanly (three-way: the release's file differs from the change's base)",
        "demo/tree.py: added (new file, original null)",
        "tests/test_core.py: outside the installed package (--change-root): left out",
    ]


def test_a_release_file_equal_to_the_base_takes_the_change_as_is(tmp_path, release_wheel, out):
    target, report = from_dirs(tmp_path, {"python/demo/core.py": RELEASE},
                               {"python/demo/core.py": RELEASE.replace(b"'original'", b"'tree'")}, release_wheel, out)

    assert (target / "demo" / "core.py").read_bytes() == RELEASE.replace(b"'original'", b"'tree'")
    assert report.outcomes == {"demo/core.py": "merged cleanly (the release's file is the change's base)"}


def test_conflict_names_the_file_and_the_hunk_and_writes_nothing(tmp_path, release_wheel, out):
    # The change edits the very line the release changed: no merge can choose.
    conflicting = CHANGE_BASE.replace(b"# demo, upstream main", b"# demo, with trees")

    with pytest.raises(BuildError) as refused:
        from_dirs(tmp_path, {"python/demo/core.py": CHANGE_BASE},
                  {"python/demo/core.py": conflicting, "python/demo/tree.py": ADDED}, release_wheel, out)

    message = str(refused.value)
    conflicts = out / ".demo-port.conflicts"
    assert f"demo/core.py: does not merge cleanly into demo 1.0's file (1 conflicting hunk); the merge with its markers: {conflicts.resolve() / 'demo/core.py'}" in message
    assert "  hunk 1 of 1, at demo 1.0 lines 1-1:\n" in message
    assert "    <<<<<<< demo 1.0\n    # demo 1.0, as released\n    ||||||| change base upstream-base\n    # demo, upstream main\n    =======\n    # demo, with trees\n    >>>>>>> change upstream-change" in message
    assert f"--resolved {conflicts.resolve()}" in message
    assert not (out / "demo-port").exists()
    assert (conflicts / "demo" / "core.py").read_text().startswith("<<<<<<< demo 1.0\n# demo 1.0, as released\n")
    recorded = yaml.safe_load((conflicts / "conflicts.yml").read_text())
    assert recorded == {"files": {"demo/core.py": {
        "release": sha256(RELEASE), "base": sha256(CHANGE_BASE), "change": sha256(conflicting)}}}


def test_hunk_is_placed_in_the_releases_lines(tmp_path, out):
    release = b"".join(b"line %d\n" % n for n in range(1, 31))
    base = release.replace(b"line 1\n", b"line one\n").replace(b"line 20\n", b"line twenty\n")
    change = base.replace(b"line twenty\n", b"line XX\nline XXb\n")
    release_changed = release.replace(b"line 20\n", b"line 20 (release)\n")
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo/core.txt", release_changed)
        zf.writestr("demo-1.0.dist-info/METADATA", METADATA)

    with pytest.raises(BuildError, match=r"hunk 1 of 1, at demo 1\.0 lines 20-20:"):
        from_dirs(tmp_path, {"python/demo/core.txt": base}, {"python/demo/core.txt": change}, wheel, out)


def test_a_resolution_is_used_only_for_its_own_inputs_and_without_markers(tmp_path, release_wheel, out):
    conflicting = CHANGE_BASE.replace(b"# demo, upstream main", b"# demo, with trees")
    base, change = change_trees(tmp_path, {"python/demo/core.py": CHANGE_BASE}, {"python/demo/core.py": conflicting})
    the_change = patchset_build.change_from_dirs(base, change, "python")
    conflicts = tmp_path / "conflicts"
    with pytest.raises(BuildError):
        patchset_build.build_from_change("demo-port", "demo==1.0", the_change, release_wheel, out, conflicts_dir=conflicts)

    # Markers left in: refused.
    with pytest.raises(BuildError, match=r"demo/core.py: the resolution in .* still holds conflict markers"):
        patchset_build.build_from_change("demo-port", "demo==1.0", the_change, release_wheel, out, resolved=conflicts)

    resolved = RELEASE.replace(b"# demo 1.0, as released", b"# demo 1.0, with trees")
    write(conflicts / "demo" / "core.py", resolved)
    target, report = patchset_build.build_from_change("demo-port", "demo==1.0", the_change, release_wheel, out, resolved=conflicts)
    assert (target / "demo" / "core.py").read_bytes() == resolved
    assert manifest(target)["files"]["demo/core.py"] == {"sha256": sha256(resolved), "original": sha256(RELEASE)}
    assert report.outcomes == {"demo/core.py": "resolved by hand (--resolved)"}

    # The same resolution over another change: made for other inputs, refused.
    write(change / "python" / "demo" / "core.py", conflicting + b"# and more\n")
    other = patchset_build.change_from_dirs(base, change, "python")
    with pytest.raises(BuildError, match=r"demo/core.py: the resolution in .* was made for other inputs"):
        patchset_build.build_from_change("demo-port", "demo==1.0", other, release_wheel, out, force=True, resolved=conflicts)

    # A resolution for a file that merges cleanly now: stale, refused.
    write(change / "python" / "demo" / "core.py", CHANGED)
    clean = patchset_build.change_from_dirs(base, change, "python")
    with pytest.raises(BuildError, match=r"demo/core.py: a resolution in .*, but this build has no conflict in it"):
        patchset_build.build_from_change("demo-port", "demo==1.0", clean, release_wheel, out, force=True, resolved=conflicts)


@pytest.mark.parametrize(
    "base_files, change_files, message",
    [
        # A file the change deletes, which the release has.
        ({"python/demo/gone.py": b"OLD = 1\n"}, {}, r"demo/gone.py: the change deletes it and demo 1\.0 has it: a patch set cannot delete a file"),
        # A file the change edits, which the release lacks.
        ({"python/demo/later.py": b"A = 1\n"}, {"python/demo/later.py": b"A = 2\n"},
         r"demo/later.py: the change edits it, but demo 1\.0 has no such file"),
        # A file the change adds, which the release already has, differently.
        ({}, {"python/demo/same.py": b"X = 2\n"}, r"demo/same.py: the change adds it, but demo 1\.0 already has a different demo/same.py"),
        # A merge that no longer compiles.
        ({"python/demo/core.py": CHANGE_BASE}, {"python/demo/core.py": CHANGE_BASE.replace(b"def draft():", b"def draft(:")},
         r"demo/core.py: the merged file does not compile \(SyntaxError"),
    ],
    ids=["deleted", "release-lacks-it", "added-but-present", "does-not-compile"],
)
def test_what_a_patch_set_cannot_carry_is_refused(tmp_path, release_wheel, out, base_files, change_files, message):
    with pytest.raises(BuildError, match=message):
        from_dirs(tmp_path, base_files, change_files, release_wheel, out)
    assert not (out / "demo-port").exists()


def test_already_in_the_release_is_left_out(tmp_path, release_wheel, out):
    target, report = from_dirs(
        tmp_path,
        {"python/demo/core.py": CHANGE_BASE, "python/demo/gone2.py": b"Z\n"},
        {"python/demo/core.py": CHANGED, "python/demo/same.py": b"X = 1\n"},  # same.py: added upstream, the release has it
        release_wheel, out,
    )
    assert sorted(manifest(target)["files"]) == ["demo/core.py"]
    assert report.outcomes["demo/same.py"] == "added by the change, already in demo 1.0 as is: left out"
    assert report.outcomes["demo/gone2.py"] == "deleted by the change and absent from demo 1.0: nothing to do"


def git(repo: Path, *args: str) -> str:
    import subprocess

    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout.strip()


def test_command_from_two_commits_of_a_clone(tmp_path, release_wheel, out, capsys):
    repo = tmp_path / "fork"
    write(repo / "python" / "demo" / "core.py", CHANGE_BASE)
    write(repo / "docs" / "notes.md", "old\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    write(repo / "python" / "demo" / "core.py", CHANGED)
    write(repo / "python" / "demo" / "tree.py", ADDED)
    write(repo / "docs" / "notes.md", "new\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "change")
    bare = tmp_path / "fork.git"  # what the fetch of a fork gives: a bare repository
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    argv = ["demo-port", "--base", "demo==1.0", "--pristine", str(release_wheel), "--out", str(out),
            "--git", str(bare), "--change-base", base, "--change", "main", "--change-root", "python"]

    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines() == [
        "demo/core.py: merged cleanly (three-way: the release's file differs from the change's base)",
        "demo/tree.py: added (new file, original null)",
        "docs/notes.md: outside the installed package (--change-root): left out",
        f"patch set demo-port: 1 replaced, 1 added, over demo 1.0 -> {(out / 'demo-port').resolve()}/patchset.yml",
    ]
    assert (out / "demo-port" / "demo" / "core.py").read_bytes() == MERGED
    first_line = (out / "demo-port" / "patchset.yml").read_text().splitlines()[0]
    assert first_line == (f"# demo-port: 1 replaced and 1 added files over demo 1.0 (python -m tools.patchset_build: "
                          f"change base {base[:12]} to change {git(bare, 'rev-parse', 'main')[:12]}, three-way merged)")

    # A conflict through the command: exit 1, the file and hunk on stderr.
    git(repo, "checkout", "-q", base)
    write(repo / "python" / "demo" / "core.py", CHANGE_BASE.replace(b"# demo, upstream main", b"# demo, with trees"))
    git(repo, "commit", "-q", "-am", "conflicting")
    conflicting = git(repo, "rev-parse", "HEAD")
    argv = [*argv[:7], "--git", str(repo), "--change-base", base, "--change", conflicting, "--change-root", "python", "--force"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "patchset_build: error: demo/core.py: does not merge cleanly into demo 1.0's file (1 conflicting hunk)" in err
    assert "patchset_build: error:   hunk 1 of 1, at demo 1.0 lines 1-1:" in err
    assert (out / "demo-port" / "demo" / "core.py").read_bytes() == MERGED  # the earlier build is left as it was


def test_command_needs_one_source(release_wheel, patched, out, capsys):
    with pytest.raises(SystemExit):
        main(["x", "--base", "demo==1.0", "--pristine", str(release_wheel), "--patched", str(patched), "--change", "a", "--change-base", "b"])
    with pytest.raises(SystemExit):
        main(["x", "--base", "demo==1.0", "--pristine", str(release_wheel), "--change", "a"])
    assert "give either --patched DIR or --change-base and --change" in capsys.readouterr().err


def fix_file(tmp_path, name: str, rel: str, before: bytes, after: bytes) -> Path:
    """An operator's fix as `git diff` writes it: a/REL -> b/REL over site-packages paths."""
    a, b = tmp_path / f"{name}-a", tmp_path / f"{name}-b"
    for root, data in ((a, before), (b, after)):
        if data is not None:
            write(root / rel, data)
    import subprocess

    diff = subprocess.run(["git", "diff", "--no-index", "--no-color", f"{name}-a/{rel}" if before is not None else "/dev/null",
                           f"{name}-b/{rel}"], cwd=tmp_path, capture_output=True, text=True).stdout
    text = diff.replace(f"a/{name}-a/", "a/").replace(f"b/{name}-b/", "b/").replace(f"a/{name}-b/", "a/")
    assert text, "the fix is empty"
    return write(tmp_path / f"{name}.patch", "A comment before the diff says why.\n\n" + text)


def test_a_fix_goes_on_top_of_the_merge_and_on_a_release_file_the_change_left(tmp_path, release_wheel, out, capsys):
    fixed = MERGED.replace(b"LIMIT = 4", b"LIMIT = 8")
    core_fix = fix_file(tmp_path, "limit", "demo/core.py", MERGED, fixed)
    same_fix = fix_file(tmp_path, "same", "demo/same.py", b"X = 1\n", b"X = 2\n")
    target, report = from_dirs(tmp_path, {"python/demo/core.py": CHANGE_BASE}, {"python/demo/core.py": CHANGED},
                               release_wheel, out, fixes=[core_fix, same_fix])

    assert (target / "demo" / "core.py").read_bytes() == fixed
    assert (target / "demo" / "same.py").read_bytes() == b"X = 2\n"
    assert manifest(target)["files"] == {
        "demo/core.py": {"sha256": sha256(fixed), "original": sha256(RELEASE)},
        "demo/same.py": {"sha256": sha256(b"X = 2\n"), "original": sha256(b"X = 1\n")},
    }
    assert report.outcomes == {
        "demo/core.py": "merged cleanly (three-way: the release's file differs from the change's base); then --fix limit.patch",
        "demo/same.py": "demo 1.0's own file; then --fix same.patch",
    }
    assert (target / "patchset.yml").read_text().splitlines()[0].endswith(
        "three-way merged, then limit.patch, then same.patch)")


def test_a_fix_that_does_not_apply_names_the_fix_and_the_file_and_writes_nothing(tmp_path, release_wheel, out):
    stale = fix_file(tmp_path, "stale", "demo/core.py", RELEASE.replace(b"LIMIT = 4", b"LIMIT = 5"),
                     RELEASE.replace(b"LIMIT = 4", b"LIMIT = 6"))
    with pytest.raises(patchset_build.BuildError) as err:
        from_dirs(tmp_path, {"python/demo/core.py": CHANGE_BASE}, {"python/demo/core.py": CHANGED},
                  release_wheel, out, fixes=[stale])
    message = str(err.value)
    assert f"--fix {stale}: does not apply to the merged files of demo 1.0" in message
    assert "patch failed: demo/core.py:" in message  # git's file and hunk line
    assert not (out / "demo-port").exists()


@pytest.mark.parametrize("before, after, message", [
    (b"X = 1\n", None, "deletes demo/same.py: a patch set cannot delete a file"),
    (b"X = 1\n", b"X = (\n", "demo/same.py does not compile after it"),
])
def test_what_a_fix_cannot_do_is_refused(tmp_path, release_wheel, out, before, after, message):
    if after is None:
        fix = write(tmp_path / "gone.patch", "diff --git a/demo/same.py b/demo/same.py\ndeleted file mode 100644\n"
                    "--- a/demo/same.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-X = 1\n")
    else:
        fix = fix_file(tmp_path, "bad", "demo/same.py", before, after)
    with pytest.raises(patchset_build.BuildError, match=re.escape(message)):
        from_dirs(tmp_path, {"python/demo/core.py": CHANGE_BASE}, {"python/demo/core.py": CHANGED},
                  release_wheel, out, fixes=[fix])


@pytest.mark.parametrize("diff, message", [
    ("diff --git a/demo/same.py b/demo/moved.py\nsimilarity index 100%\nrename from demo/same.py\nrename to demo/moved.py\n",
     "rename demo/{same.py => moved.py} (100%): a patch set cannot rename or copy a file"),
    ("diff --git a/demo/same.py b/demo/copy.py\nsimilarity index 100%\ncopy from demo/same.py\ncopy to demo/copy.py\n",
     "copy demo/{same.py => copy.py} (100%): a patch set cannot rename or copy a file"),
    ("diff --git a/demo/same.py b/demo/same.py\nold mode 100644\nnew mode 100755\n",
     "mode change 100644 => 100755 demo/same.py: a patch set holds file contents, not modes"),
    ("just some words\n", "git cannot read it as a diff (error: No valid patches in input"),
], ids=["rename", "copy", "mode", "no-diff"])
def test_what_a_fix_cannot_carry_is_named_as_git_reads_it(tmp_path, release_wheel, out, diff, message):
    fix = write(tmp_path / "odd.patch", "Why: a comment.\n\n" + diff)
    with pytest.raises(patchset_build.BuildError, match=re.escape(message)):
        from_dirs(tmp_path, {"python/demo/core.py": CHANGE_BASE}, {"python/demo/core.py": CHANGED},
                  release_wheel, out, fixes=[fix])
    assert not (out / "demo-port").exists()


def test_a_quoted_path_in_a_fix_is_read_as_git_reads_it(tmp_path):
    """git C-quotes a path with a tab, a quote or (by default) a non-ASCII byte in its headers."""
    fix = write(tmp_path / "q.patch", 'diff --git "a/demo/caf\\303\\251.py" "b/demo/caf\\303\\251.py"\n'
                '--- "a/demo/caf\\303\\251.py"\n+++ "b/demo/caf\\303\\251.py"\n@@ -1 +1 @@\n-X = 1\n+X = 2\n')
    assert patchset_build._fix_paths(fix) == ["demo/caf\u00e9.py"]


def test_fix_goes_with_a_change_only(release_wheel, patched, out, capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["x", "--base", "demo==1.0", "--pristine", str(release_wheel), "--patched", str(patched),
              "--fix", str(tmp_path / "a.patch")])
    assert "--fix go with --change-base/--change" in capsys.readouterr().err


def test_the_ddtree_port_fix_is_a_diff_of_site_packages_paths():
    fix = Path(__file__).resolve().parents[2] / "bench" / "ddtree" / "fixes" / "ddtree-verify-width.patch"
    assert patchset_build._fix_paths(fix) == [
        "sglang/srt/layers/attention/triton_backend.py", "sglang/srt/model_executor/cuda_graph_runner.py",
    ]
