"""Stack files (`files/stacks/*.yml`) and the control machine's wheelhouse."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from configuration import stacks, wheels
from configuration.errors import DataError
from configuration.settings import GLOBAL_KEYS, REPO_ROOT
from configuration.stacks import Package, Stack
from tools import wheelhouse

SHA = "a" * 64
REAL_STACKS = sorted(stacks.STACKS_DIR.glob("*.yml"))


# The repository's own stacks -----------------------------------------------------------


def test_there_is_at_least_one_stack():
    assert REAL_STACKS


@pytest.mark.parametrize("path", REAL_STACKS, ids=[p.stem for p in REAL_STACKS])
def test_every_stack_file_loads(path: Path):
    stack = stacks.load_stack(path.stem)

    assert stack.name == path.stem
    assert stack.path == path
    assert stack.packages
    assert [p.name for p in stack.packages] == sorted(p.name for p in stack.packages)
    assert stack.site_packages == f"lib/python{stack.python}/site-packages"
    for package in stack.packages:
        assert package.file or package.build or package.sha256 is None
        if package.build:
            assert (REPO_ROOT / package.build).is_file(), f"{path.name}: {package.name}: build script {package.build} is missing"


def test_lab_standin_stack():
    stack = stacks.load_stack("lab-standin")
    assert stack.python == "3.11"
    assert stack.wanted() == {"sglang-standin": "0.1.6"}
    (package,) = stack.packages
    assert package == Package("sglang-standin", "0.1.6", "sglang_standin-0.1.6-py3-none-any.whl", package.sha256, "lab/standin/build.py")
    assert package.spec == "sglang-standin==0.1.6"


def test_the_default_stack_and_the_deployments_stack_exist():
    deploy_stack = yaml.safe_load((REPO_ROOT / "group_data" / "all.yml").read_text())["stack"]
    for name in {GLOBAL_KEYS["stack"].default, deploy_stack}:
        assert stacks.load_stack(name).name == name


@pytest.mark.parametrize(
    ("raw", "normal"),
    [("Sglang_Kernel", "sglang-kernel"), ("zope.interface", "zope-interface"), ("a__b--c..d", "a-b-c-d"), ("torch", "torch")],
)
def test_normalize(raw, normal):
    assert stacks.normalize(raw) == normal


# Bad stack files -----------------------------------------------------------------------


@pytest.fixture
def stack_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(stacks, "STACKS_DIR", tmp_path)
    stacks._load_stack_file.cache_clear()
    yield tmp_path
    stacks._load_stack_file.cache_clear()


GOOD = """\
name: demo
python: "3.11"
packages:
  torch: {version: "2.11.0+cu130", file: torch-2.11.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl, sha256: %s}
  sglang: {version: "0.5.23", file: sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl, sha256: %s}
""" % (SHA, SHA)
SGLANG = 'sglang: {version: "0.5.23", file: sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl, sha256: %s}' % SHA


def test_a_good_stack_file_loads(stack_dir):
    (stack_dir / "demo.yml").write_text(GOOD)
    stack = stacks.load_stack("demo")

    assert stack == Stack(
        "demo",
        "3.11",
        (
            Package("sglang", "0.5.23", "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl", SHA),
            Package("torch", "2.11.0+cu130", "torch-2.11.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", SHA),
        ),
        stack_dir / "demo.yml",
    )
    assert stack.wanted() == {"sglang": "0.5.23", "torch": "2.11.0+cu130"}


BAD_STACKS = [
    # id, file text (the file is demo.yml), key path, value repr, fix phrase
    ("name-mismatch", GOOD.replace("name: demo", "name: other"), "name", "'other'", "must equal the file name 'demo'"),
    ("name-missing", GOOD.replace("name: demo\n", ""), "name", "None", "must equal the file name 'demo'"),
    ("python-3", GOOD.replace('"3.11"', '"3"'), "python", "'3'", 'must be a quoted major.minor version such as "3.11"'),
    ("python-patch", GOOD.replace('"3.11"', '"3.11.2"'), "python", "'3.11.2'", "must be a quoted major.minor version"),
    ("python-missing", GOOD.replace('python: "3.11"\n', ""), "python", "None", "must be a quoted major.minor version"),
    ("not-normalised", GOOD.replace("  torch:", "  Torch:"), "packages.Torch", "'Torch'", "write distribution names PEP 503-normalised: 'torch'"),
    ("underscore-name", GOOD.replace("  sglang:", "  sglang_kernel:"), "packages.sglang_kernel", "'sglang_kernel'", "PEP 503-normalised: 'sglang-kernel'"),
    ("bad-sha", GOOD.replace(SHA, "abc123"), "packages.torch.sha256", "'abc123'", "must be 64 lowercase hex digits"),
    ("uppercase-sha", GOOD.replace(SHA, "A" * 64), "packages.torch.sha256", repr("A" * 64), "must be 64 lowercase hex digits"),
    ("unknown-key", GOOD + "pins: {}\n", "pins", "{}", "unknown key; allowed: name, python, packages, description"),
    ("unknown-package-key", GOOD.replace(SGLANG, 'sglang: {version: "0.5.23", url: "http://x"}'), "packages.sglang", "['url']", "unknown keys; allowed: version, file, sha256, build"),
    ("version-range", GOOD.replace(SGLANG, 'sglang: ">=0.5"'), "packages.sglang.version", "'>=0.5'", "must be an exact version, quoted"),
    ("version-missing", GOOD.replace(SGLANG, "sglang: {file: x.whl}"), "packages.sglang.version", "None", "must be an exact version"),
    ("file-not-a-wheel", GOOD.replace(SGLANG, 'sglang: {version: "0.5.23", file: sglang-0.5.23.tar.gz}'), "packages.sglang.file", "'sglang-0.5.23.tar.gz'", "must be a wheel file name (*.whl)"),
    ("package-spec-list", GOOD.replace(SGLANG, 'sglang: ["0.5.23"]'), "packages.sglang", "['0.5.23']", "must be a version string or {version, file, sha256}"),
    ("packages-empty", 'name: demo\npython: "3.11"\npackages: {}\n', "packages", "{}", "must be a non-empty map of distribution"),
    ("packages-list", 'name: demo\npython: "3.11"\npackages: [torch]\n', "packages", "['torch']", "must be a non-empty map"),
    ("top-level-list", "- demo\n", "(top level)", "['demo']", "must be a mapping with name, python, packages"),
]


@pytest.mark.parametrize(("text", "key", "value", "fix"), [c[1:] for c in BAD_STACKS], ids=[c[0] for c in BAD_STACKS])
def test_bad_stack_file_names_file_key_value_and_fix(stack_dir, text, key, value, fix):
    (stack_dir / "demo.yml").write_text(text)
    with pytest.raises(DataError) as caught:
        stacks.load_stack("demo")
    message = str(caught.value)
    assert message.startswith(f"files/stacks/demo.yml: {key}: {value}: ")
    assert fix in message


def test_stack_file_with_bad_yaml(stack_dir):
    (stack_dir / "demo.yml").write_text("name: demo\npackages: {torch: [\n")
    with pytest.raises(DataError) as caught:
        stacks.load_stack("demo")
    assert str(caught.value).startswith("files/stacks/demo.yml: line 3, column 1: ")  # where, not only "(file)"
    assert ": not valid YAML" in str(caught.value)


def test_unknown_stack_lists_the_available_ones(stack_dir):
    (stack_dir / "b.yml").write_text(GOOD.replace("name: demo", "name: b"))
    (stack_dir / "a.yml").write_text(GOOD.replace("name: demo", "name: a"))
    with pytest.raises(DataError) as caught:
        stacks.load_stack("c", source="inventory (host gpu-a)", key_path="stack")
    assert str(caught.value) == "inventory (host gpu-a): stack: 'c': unknown stack; available: a, b (files/stacks/<name>.yml)"


@pytest.mark.parametrize("name", [None, 3, "demo.yml", ""])
def test_stack_names_that_are_not_stack_files_are_unknown(stack_dir, name):
    (stack_dir / "demo.yml").write_text(GOOD)
    with pytest.raises(DataError, match="unknown stack; available: demo"):
        stacks.load_stack(name)


def test_stack_name_cannot_reach_outside_the_stacks_dir(tmp_path, monkeypatch):
    inside = tmp_path / "stacks"
    inside.mkdir()
    (tmp_path / "evil.yml").write_text(GOOD.replace("name: demo", "name: evil"))
    monkeypatch.setattr(stacks, "STACKS_DIR", inside)
    stacks._load_stack_file.cache_clear()
    with pytest.raises(DataError, match="unknown stack"):
        stacks.load_stack("../evil")


def test_unquoted_python_version_is_rejected(stack_dir):
    (stack_dir / "demo.yml").write_text(GOOD.replace('"3.11"', "3.10"))
    with pytest.raises(DataError) as caught:
        stacks.load_stack("demo")
    assert caught.value.key_path == "python"


def test_unquoted_package_version_as_a_bare_value_is_rejected(stack_dir):
    (stack_dir / "demo.yml").write_text(GOOD.replace(SGLANG, "numpy: 2.10"))
    with pytest.raises(DataError) as caught:
        stacks.load_stack("demo")
    assert str(caught.value) == "files/stacks/demo.yml: packages.numpy: 2.1: must be a version string or {version, file, sha256}"


def test_unquoted_package_version_in_a_map_is_rejected(stack_dir):
    (stack_dir / "demo.yml").write_text(GOOD.replace(SGLANG, "numpy: {version: 2.10}"))
    with pytest.raises(DataError) as caught:
        stacks.load_stack("demo")
    assert caught.value.key_path == "packages.numpy.version"


# Stacks that extend another ---------------------------------------------------------------


CHILD = """\
name: child
extends: demo
packages:
  torch: {version: "2.12.0+cu130", file: torch-2.12.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl, sha256: %s}
  numpy: {version: "2.4.6", file: numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl, sha256: %s}
  sglang: null
""" % ("b" * 64, "c" * 64)


def test_an_extending_stack_overrides_adds_and_removes(stack_dir):
    (stack_dir / "demo.yml").write_text(GOOD)
    (stack_dir / "child.yml").write_text(CHILD)
    child = stacks.load_stack("child")

    assert child == Stack(
        "child",
        "3.11",
        (
            Package("numpy", "2.4.6", "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl", "c" * 64),
            Package("torch", "2.12.0+cu130", "torch-2.12.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", "b" * 64),
        ),
        stack_dir / "child.yml",
    )
    assert stacks.load_stack("demo").wanted() == {"sglang": "0.5.23", "torch": "2.11.0+cu130"}  # the base is unchanged


def test_an_extending_stack_may_override_python_and_omit_packages(stack_dir):
    (stack_dir / "demo.yml").write_text(GOOD.replace("cp311-cp311", "cp311-abi3"))  # stable-ABI wheels: 3.12 installs them
    (stack_dir / "alias.yml").write_text('name: alias\nextends: demo\npython: "3.12"\n')
    alias = stacks.load_stack("alias")
    assert alias.python == "3.12"
    assert alias.packages == stacks.load_stack("demo").packages
    assert alias.path == stack_dir / "alias.yml"


def test_extends_chains(stack_dir):
    (stack_dir / "demo.yml").write_text(GOOD)
    (stack_dir / "child.yml").write_text(CHILD)
    (stack_dir / "grandchild.yml").write_text('name: grandchild\nextends: child\npackages:\n  numpy: null\n  pyyaml: {version: "6.0.4", file: pyyaml-6.0.4-py3-none-any.whl, sha256: %s}\n' % SHA)
    assert stacks.load_stack("grandchild").wanted() == {"pyyaml": "6.0.4", "torch": "2.12.0+cu130"}


BAD_EXTENDS = [
    # id, files {stem: text}, the stack loaded, the message's start, fix phrase
    ("unknown-base", {"child": "name: child\nextends: nope\n"}, "child",
     "files/stacks/child.yml: extends: 'nope': ", "unknown stack; available: demo"),
    ("base-not-a-name", {"child": "name: child\nextends: [demo]\n"}, "child",
     "files/stacks/child.yml: extends: ['demo']: ", "unknown stack"),
    ("self", {"child": "name: child\nextends: child\n"}, "child",
     "files/stacks/child.yml: extends: 'child': ", "in a cycle (child -> child)"),
    ("cycle", {"a": "name: a\nextends: b\n", "b": "name: b\nextends: a\n"}, "a",
     "files/stacks/b.yml: extends: 'a': ", "in a cycle (a -> b -> a): extend a stack that does not extend this one"),
    ("remove-missing", {"child": "name: child\nextends: demo\npackages:\n  numpy: null\n"}, "child",
     "files/stacks/child.yml: packages.numpy: None: ", "the base stack demo has no numpy to remove; drop this line"),
    ("remove-everything", {"child": "name: child\nextends: demo\npackages: {torch: null, sglang: null}\n"}, "child",
     "files/stacks/child.yml: packages: ", "removes every distribution of demo"),
    ("bad-python", {"child": 'name: child\nextends: demo\npython: "3"\n'}, "child",
     "files/stacks/child.yml: python: '3': ", "must be a quoted major.minor version"),
    ("bad-override", {"child": 'name: child\nextends: demo\npackages:\n  torch: ">=2"\n'}, "child",
     "files/stacks/child.yml: packages.torch.version: '>=2': ", "must be an exact version"),
    ("bad-base", {"child": "name: child\nextends: broken\n", "broken": 'name: broken\npython: "3.11"\npackages: {}\n'}, "child",
     "files/stacks/broken.yml: packages: {}: ", "must be a non-empty map"),
    ("null-without-extends", {"child": 'name: child\npython: "3.11"\npackages:\n  torch: null\n'}, "child",
     "files/stacks/child.yml: packages.torch: None: ", "must be a version string"),
]


@pytest.mark.parametrize(("files", "name", "start", "fix"), [c[1:] for c in BAD_EXTENDS], ids=[c[0] for c in BAD_EXTENDS])
def test_bad_extends_names_file_key_value_and_fix(stack_dir, files, name, start, fix):
    (stack_dir / "demo.yml").write_text(GOOD)
    for stem, text in files.items():
        (stack_dir / f"{stem}.yml").write_text(text)
    with pytest.raises(DataError) as caught:
        stacks.load_stack(name)
    message = str(caught.value)
    assert message.startswith(start)
    assert fix in message


def test_content_digest_follows_the_resolved_pins_and_the_base(stack_dir):
    (stack_dir / "demo.yml").write_text(GOOD)
    (stack_dir / "child.yml").write_text(CHILD)
    (stack_dir / "same.yml").write_text(GOOD.replace("name: demo", "name: same") + "# only a comment differs\n")
    demo, child = stacks.load_stack("demo"), stacks.load_stack("child")
    assert len(demo.content_digest) == 64
    assert demo.content_digest != child.content_digest
    assert stacks.load_stack("same").content_digest == demo.content_digest

    # The base changes (a pin the child inherits); child.yml does not. (This used to change the base's
    # python to 3.12 under the child's cp311 wheels: a stack no Python can install, refused now.)
    (stack_dir / "demo.yml").write_text(GOOD + '  pyyaml: {version: "6.0.4", file: pyyaml-6.0.4-py3-none-any.whl, sha256: %s}\n' % SHA)
    stacks._load_stack_file.cache_clear()
    assert stacks.load_stack("child").content_digest != child.content_digest


def test_the_labs_abi_mismatch_stack_differs_from_the_lab_stack_only_in_the_kernel():
    good, bad = stacks.load_stack("lab-cpu-sglang"), stacks.load_stack("lab-cpu-sglang-abi-mismatch")
    assert bad.python == good.python
    assert {p for p in bad.packages if p.name != "sglang-kernel"} == {p for p in good.packages if p.name != "sglang-kernel"}
    assert good.wanted()["sglang-kernel"] == "0.4.10+cpu"
    assert bad.wanted()["sglang-kernel"] == "0.4.9+cpu"
    assert bad.path == stacks.STACKS_DIR / "lab-cpu-sglang-abi-mismatch.yml"


# The wheelhouse ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "package", "matches"),
    [
        ("torch-2.11.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", Package("torch", "2.11.0+cu130"), True),
        ("torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl", Package("torch", "2.11.0+cu130"), False),
        ("torch-2.11.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl", Package("torch", "2.11.0+cu130"), False),
        ("torch-2.11.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", Package("torch", "2.11.0"), False),
        ("sglang_kernel-0.3.1-cp310-abi3-manylinux2014_x86_64.whl", Package("sglang-kernel", "0.3.1"), True),
        ("Sglang_Kernel-0.3.1-cp310-abi3-manylinux2014_x86_64.whl", Package("sglang-kernel", "0.3.1"), True),
        ("zope.interface-7.0-cp311-cp311-linux_x86_64.whl", Package("zope-interface", "7.0"), True),
        ("sglang_standin-0.1.0-py3-none-any.whl", Package("sglang-standin", "0.1.0"), True),
        ("sglang_standin-0.1.0-1-py3-none-any.whl", Package("sglang-standin", "0.1.0"), True),  # build tag
        ("sglang_standin-0.1.0-py3-none-any.whl", Package("sglang", "0.1.0"), False),
        ("sglang-0.5.23-py3-none-any.whl", Package("sglang-router", "0.5.23"), False),
        ("sglang-0.5.23.tar.gz", Package("sglang", "0.5.23"), False),
        ("sglang-0.5.23.whl", Package("sglang", "0.5.23"), False),
    ],
)
def test_wheel_matches(filename, package, matches):
    assert wheels.wheel_matches(filename, package) is matches


def _stack(tmp_path: Path, *packages: Package) -> Stack:
    return Stack("demo", "3.11", tuple(packages), tmp_path / "demo.yml")


@pytest.fixture
def house(tmp_path) -> Path:
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    return folder


def _wheel(house: Path, name: str, content: bytes = b"wheel bytes") -> tuple[Path, str]:
    path = house / name
    path.write_bytes(content)
    return path, hashlib.sha256(content).hexdigest()


def test_locate_finds_named_files_and_wheels_by_name_and_version(tmp_path, house):
    torch, torch_sha = _wheel(house, "torch-2.11.0+cu130-cp311-cp311-linux_x86_64.whl")
    kernel, _ = _wheel(house, "sglang_kernel-0.3.1-cp310-abi3-linux_x86_64.whl")
    _wheel(house, "sglang_kernel-0.3.0-cp310-abi3-linux_x86_64.whl")
    stack = _stack(
        tmp_path,
        Package("sglang-kernel", "0.3.1"),
        Package("torch", "2.11.0+cu130", torch.name, torch_sha),
    )

    assert wheels.locate(stack, house) == {"sglang-kernel": kernel, "torch": torch}


def test_locate_only_the_packages_asked_for(tmp_path, house):
    kernel, _ = _wheel(house, "sglang_kernel-0.3.1-cp310-abi3-linux_x86_64.whl")
    wanted = Package("sglang-kernel", "0.3.1")
    stack = _stack(tmp_path, wanted, Package("torch", "2.11.0+cu130", "torch-missing.whl"))

    assert wheels.locate(stack, house, [wanted]) == {"sglang-kernel": kernel}


def test_locate_names_the_missing_file_and_the_wheelhouse(tmp_path, house):
    stack = _stack(tmp_path, Package("torch", "2.11.0+cu130", "torch-2.11.0+cu130-cp311-cp311-linux_x86_64.whl", SHA))
    with pytest.raises(wheels.WheelhouseError) as caught:
        wheels.locate(stack, house)
    message = str(caught.value)
    assert "torch-2.11.0+cu130-cp311-cp311-linux_x86_64.whl not found" in message
    assert f"looked in wheelhouse {house.resolve()}" in message
    assert f"python -m tools.wheelhouse demo {house}" in message


def test_locate_names_the_missing_distribution_when_no_file_is_pinned(tmp_path, house):
    _wheel(house, "torch-2.10.0-cp311-cp311-linux_x86_64.whl")
    with pytest.raises(wheels.WheelhouseError, match=r"stack demo: a wheel of torch==2\.11\.0\+cu130 not found"):
        wheels.locate(_stack(tmp_path, Package("torch", "2.11.0+cu130")), house)


def test_locate_detects_a_sha256_mismatch(tmp_path, house):
    path, actual = _wheel(house, "torch-2.11.0+cu130-cp311-cp311-linux_x86_64.whl", b"truncated")
    stack = _stack(tmp_path, Package("torch", "2.11.0+cu130", path.name, SHA))
    with pytest.raises(wheels.WheelhouseError) as caught:
        wheels.locate(stack, house)
    message = str(caught.value)
    assert f"{path} has sha256 {actual}, the stack pins {SHA}" in message
    assert "files/stacks/demo.yml" in message


def test_locate_without_verify_skips_the_hash(tmp_path, house):
    path, _ = _wheel(house, "torch-2.11.0+cu130-cp311-cp311-linux_x86_64.whl")
    stack = _stack(tmp_path, Package("torch", "2.11.0+cu130", path.name, SHA))
    assert wheels.locate(stack, house, verify=False) == {"torch": path}


def test_sha256_of_is_cached_and_follows_a_changed_file(house):
    path, first = _wheel(house, "a-1-py3-none-any.whl", b"one")
    assert wheels.sha256_of(path) == first
    assert (house / ".sha256-cache.json").is_file()
    path.write_bytes(b"three")  # another size: a new cache key
    assert wheels.sha256_of(path) == hashlib.sha256(b"three").hexdigest()


def test_wheelhouse_cli_help_exits_zero(capsys):
    assert wheelhouse.main(["--help"]) == 0
    assert "python -m tools.wheelhouse STACK" in capsys.readouterr().out
    assert wheelhouse.main([]) == 2


BUILT = [(name, p) for name in stacks.available_stacks() for p in stacks.load_stack(name).packages if p.build]


def test_the_stacks_have_stand_ins_of_each_build_script():
    assert {p.build for _, p in BUILT} >= {"lab/standin/build.py", "lab/standin_kernel/build.py"}


@pytest.mark.parametrize(("stack_name", "package"), BUILT, ids=[f"{n}:{p.name}=={p.version}" for n, p in BUILT])
def test_stand_in_wheel_pins_match_a_fresh_build(tmp_path, stack_name, package):
    """Every `build:` package of every stack: a changed stand-in must come with a new pin (and, to reach hosts, a new version)."""
    built = wheelhouse._build_standin(package, tmp_path)
    assert built.name == package.file, f"{stack_name}: {package.name} builds {built.name}, the stack names {package.file}"
    assert wheels.wheel_matches(built.name, package)
    assert wheels.sha256_of(built) == package.sha256, f"{stack_name}: {package.name} {package.version} pin is stale"


def test_build_standin_passes_the_version_only_to_scripts_that_take_it(tmp_path):
    one = tmp_path / "one.py"
    one.write_text("from pathlib import Path\ndef build_wheel(out_dir):\n    return Path(out_dir) / 'one-1-py3-none-any.whl'\n")
    two = tmp_path / "two.py"
    two.write_text("from pathlib import Path\ndef build_wheel(out_dir, version):\n    return Path(out_dir) / f'two-{version}-py3-none-any.whl'\n")
    assert wheelhouse._build_standin(Package("one", "1", build=str(one)), tmp_path).name == "one-1-py3-none-any.whl"
    assert wheelhouse._build_standin(Package("two", "2+x", build=str(two)), tmp_path).name == "two-2+x-py3-none-any.whl"


# The wheelhouse carries uv; the CLI builds several stacks ---------------------------------------


UV_X86 = Package("uv", "0.13.9", "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", hashlib.sha256(b"uv x86_64").hexdigest())
UV_ARM = Package(
    "uv", "0.13.9", "uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl",
    hashlib.sha256(b"uv aarch64").hexdigest(),
)


@pytest.fixture
def fake_index(monkeypatch):
    """`pip download` replaced: it writes the pinned file with `content[name]` (default: the bytes its pin expects)."""
    from operations.environment import installer

    monkeypatch.setitem(installer.UV_WHEELS, "x86_64", UV_X86)
    monkeypatch.setitem(installer.UV_WHEELS, "aarch64", UV_ARM)
    calls = []
    content = {"uv": None}

    def download(stack, house, packages, tags):
        calls.append(([p.spec for p in packages], tags))
        for p in packages:
            data = content.get(p.name) or {UV_X86.sha256: b"uv x86_64", UV_ARM.sha256: b"uv aarch64"}.get(p.sha256, b"wheel bytes")
            (house / p.file).write_bytes(data)

    monkeypatch.setattr(wheelhouse, "_download", download)
    return calls, content


def _pinned(house: Path, name: str, file: str) -> Package:
    """A real (tiny) wheel at `file`: `build` reads each stack wheel's RECORD (tests/unit/test_wheel_overlap.py)."""
    from tests.unit.test_wheel_overlap import make_wheel

    version = file.split("-")[1]
    made = make_wheel(house, name, version, {f"{name.replace('-', '_')}/__init__.py": b"x = 1\n"})
    made.rename(house / file)
    return Package(name, version, file, hashlib.sha256((house / file).read_bytes()).hexdigest())


def test_build_adds_the_uv_wheel_for_the_stacks_architecture(tmp_path, house, fake_index):
    calls, _ = fake_index
    torch = _pinned(house, "torch", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    files = wheelhouse.build(_stack(tmp_path, torch), house)

    assert files == [house / torch.file, house / UV_X86.file]
    assert calls == [(["uv==0.13.9"], (("none",), ("manylinux_2_17_x86_64", "manylinux2014_x86_64")))]
    assert wheels.sha256_of(house / UV_X86.file) == UV_X86.sha256

    calls.clear()
    assert wheelhouse.build(_stack(tmp_path, torch), house) == files  # all there and intact: nothing fetched
    assert calls == []


def test_an_aarch64_stack_gets_the_aarch64_uv_wheel(tmp_path, house, fake_index):
    calls, _ = fake_index
    torch = _pinned(house, "torch", "torch-2.13.0-cp311-cp311-manylinux_2_28_aarch64.whl")
    stack = _stack(tmp_path, torch)
    assert wheelhouse.architecture(stack) == "aarch64"
    assert wheelhouse.build(stack, house) == [house / torch.file, house / UV_ARM.file]
    assert [spec for spec, _ in calls] == [["uv==0.13.9"]]
    assert not (house / UV_X86.file).exists()


def test_a_pure_python_stack_is_for_x86_64(tmp_path):
    assert wheelhouse.architecture(_stack(tmp_path, Package("a", "1", "a-1-py3-none-any.whl"))) == "x86_64"
    assert wheelhouse.architecture(_stack(tmp_path, Package("a", "1"))) == "x86_64"


def test_an_altered_uv_wheel_is_fetched_again_and_a_bad_download_is_refused(tmp_path, house, fake_index):
    calls, content = fake_index
    (house / UV_X86.file).write_bytes(b"truncated")
    torch = _pinned(house, "torch", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert wheelhouse.build(_stack(tmp_path, torch), house)[-1] == house / UV_X86.file
    assert (house / UV_X86.file).read_bytes() == b"uv x86_64"
    assert len(calls) == 1

    (house / UV_X86.file).write_bytes(b"truncated")
    content["uv"] = b"not what the pin says"
    with pytest.raises(wheels.WheelhouseError, match=rf"{UV_X86.file} has sha256 .*, the stack pins {UV_X86.sha256}"):
        wheelhouse.build(_stack(tmp_path, torch), house)


def test_a_stack_that_pins_uv_itself_gets_no_second_one(tmp_path, house, fake_index):
    calls, _ = fake_index
    own = _pinned(house, "uv", "uv-0.13.8-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    assert wheelhouse.uv_package(_stack(tmp_path, own)) is None
    assert wheelhouse.build(_stack(tmp_path, own), house) == [house / own.file]
    assert calls == []


def test_the_real_stacks_uv_wheel_is_installers_pin():
    from operations.environment import installer

    assert wheelhouse.uv_package(stacks.load_stack("lab-cpu-sglang")) == installer.UV_WHEELS["x86_64"]


def test_wheelhouse_cli_builds_every_stack_given(tmp_path, monkeypatch, capsys, stack_dir):
    (stack_dir / "demo.yml").write_text(GOOD)
    (stack_dir / "child.yml").write_text(CHILD)
    built = []

    def fake_build(stack, house):
        built.append((stack.name, house))
        path = house / f"{stack.name}-1-py3-none-any.whl"
        house.mkdir(exist_ok=True)
        path.write_bytes(b"x" * 1024)
        return [path]

    monkeypatch.setattr(wheelhouse, "build", fake_build)
    assert wheelhouse.main(["demo,child", str(tmp_path / "wh")]) == 0
    assert built == [("demo", tmp_path / "wh"), ("child", tmp_path / "wh")]
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"wheelhouse {tmp_path / 'wh'}: 1 files for stack demo (uv 0.13.9 for x86_64 included), 0.0 MiB",
        f"wheelhouse {tmp_path / 'wh'}: 1 files for stack child (uv 0.13.9 for x86_64 included), 0.0 MiB",
    ]


def test_wheelhouse_cli_checks_every_stack_name_before_building(tmp_path, monkeypatch, capsys, stack_dir):
    (stack_dir / "demo.yml").write_text(GOOD)
    monkeypatch.setattr(wheelhouse, "build", lambda stack, house: pytest.fail("built before every name was checked"))
    assert wheelhouse.main(["demo,nope", str(tmp_path / "wh")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: command line: STACK: 'nope': unknown stack; available: demo")


def test_pip_download_is_given_the_pinned_files_newest_platform_first(tmp_path, monkeypatch):
    """regex 2026.11.19 has two cp311 x86_64 files that fit `manylinux2014`: in the file name's order pip took the
    other one (the index lists it first); the pinned file's own newest tag, first, makes pip take the pinned one."""
    seen = []
    monkeypatch.setattr(wheelhouse.subprocess, "run", lambda cmd, **kwargs: seen.append(cmd))
    pin = Package("regex", "2026.11.19", "regex-2026.11.19-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl", SHA)
    (tags, group), = wheelhouse._by_wheel_tags([pin]).items()
    wheelhouse._download(_stack(tmp_path, pin), tmp_path, group, tags)

    (cmd,) = seen
    assert [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--platform"] == [
        "manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64"]
    assert cmd[-1] == "regex==2026.11.19"
    assert wheelhouse.platform_order(("manylinux1_x86_64", "manylinux_2_28_x86_64", "manylinux_2_5_x86_64", "any")) == [
        "manylinux_2_28_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64", "any"]
