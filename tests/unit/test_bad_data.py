"""The corpus of bad inputs (tests/unit/bad_data/<class>/<case>.yml): every case must be refused
by the whole-inventory validation with a `DataError` naming where, what and how to fix it.

A case file starts with `#!` header lines, then its content:

    #! expect: <a fragment the message must contain>
    #! kind: group | inventory | stack | patchset | secrets | stray     (default: group)

- group: the content is a group-data file (`group_data/case.yml`, loaded by its `.py` loader like
  the real ones) whose keys override `bad_data/base.yml`; maps merge key by key (a service's keys
  too), so a case names only what it breaks.
- inventory: the content is `{hosts: {name: host data}, data: {--data overrides}}` over base.yml.
- stack / patchset: the content is a stack file / a patch set's `patchset.yml`, used by base.yml.
- secrets: the content is the secrets file of base.yml (whose services then name secrets).
- stray: the content is a `.yml` left in group_data without its `.py` loader.

The base alone must validate (test below), so no case passes by accident; each case must name
its own file (or, for inventory cases, the inventory or --data) in the message. Add a case by
adding a file: nothing here lists them.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml
from pyinfra.api import Config, Inventory, State

from configuration import group_files, patch_sets, settings, stacks
from configuration.errors import DataError
from tests.served_sets import served_copy

CORPUS = Path(__file__).parent / "bad_data"
CASES = sorted(p for p in CORPUS.glob("*/*.yml"))
KINDS = ("group", "inventory", "stack", "patchset", "secrets", "stray")
LOADER = (Path(__file__).resolve().parents[2] / "group_data" / "all.py").read_text()


def header(path: Path) -> tuple[dict[str, str], bytes]:
    raw = path.read_bytes()
    meta: dict[str, str] = {}
    lines = raw.split(b"\n")
    while lines and lines[0].startswith(b"#!"):
        key, _, value = lines.pop(0)[2:].decode().partition(":")
        meta[key.strip()] = value.strip()
    return meta, b"\n".join(lines)


def deep(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A deploy dir of its own: group_data with the base, stacks and patch sets where cases can add theirs."""
    monkeypatch.setattr(group_files, "_KEY_SOURCES", {})
    monkeypatch.setattr(group_files, "_GROUP_DIRS", set())
    monkeypatch.setattr(group_files, "REPO_ROOT", tmp_path)  # the stray-file scan
    monkeypatch.chdir(tmp_path)
    group_data = tmp_path / "group_data"
    group_data.mkdir()
    stack_dir = tmp_path / "stacks"
    shutil.copytree(stacks.STACKS_DIR, stack_dir)
    monkeypatch.setattr(stacks, "STACKS_DIR", stack_dir)
    stacks._load_stack_file.cache_clear()
    shutil.copytree(patch_sets.PATCHES_DIR, tmp_path / "files" / "patches")
    monkeypatch.setattr(patch_sets, "PATCHES_DIR", tmp_path / "files" / "patches")
    patch_sets.load_patch_set.cache_clear()
    yield tmp_path
    stacks._load_stack_file.cache_clear()
    patch_sets.load_patch_set.cache_clear()


def load_group(folder: Path, name: str, content: bytes) -> dict:
    (folder / f"{name}.yml").write_bytes(content)
    (folder / f"{name}.py").write_text(LOADER)
    return settings.load_group_yaml(str(folder / f"{name}.py"))


def validate(world: Path, kind: str, content: bytes) -> dict:
    """Run the deploy's whole-inventory validation for one case; return the configs."""
    base = load_group(world / "group_data", "all", (CORPUS / "base.yml").read_bytes())
    hosts: dict = {"gpu-a": {"ssh_hostname": "10.0.0.1", "run_services": ["ddtree", "dflash"]}}
    override: dict = {}
    group: dict = {}
    if kind == "group":
        case = load_group(world / "group_data", "case", content)
        group = {key: deep(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
                 for key, value in case.items()}
    elif kind == "inventory":
        spec = yaml.safe_load(content)
        hosts, override = spec.get("hosts", hosts), spec.get("data", {})
    elif kind == "stack":
        (stacks.STACKS_DIR / "case-stack.yml").write_bytes(content)
        group = {"stack": "case-stack"}
    elif kind == "patchset":
        root = patch_sets.PATCHES_DIR / "case-set"
        shutil.copytree(patch_sets.PATCHES_DIR / "ddtree-sample", root)
        (root / "patchset.yml").write_bytes(content)
        group = {"services": deep(base["services"], {"ddtree": {"patch_sets": ["case-set"]}})}
    elif kind == "secrets":
        (world / "secrets.yml").write_bytes(content)
        (world / "secrets.yml").chmod(0o600)  # yours alone, as a private key (else refused for its mode)
        group = {"secrets_file": str(world / "secrets.yml"),
                 "services": deep(base["services"], {"ddtree": {"api_key_secret": "ddtree-key"}})}
    elif kind == "stray":
        (world / "group_data" / "gpus.yml").write_bytes(content)
    names = list(hosts)
    groups = {"case": (names, group)} if group else {}
    if group:
        for key in group:
            group_files._KEY_SOURCES[("case", key)] = "group_data/case.yml"
    inventory = Inventory((list(hosts.items()), base), override_data=override, **groups)
    state = State(inventory, Config())
    return settings.validate_inventory(state)


def test_the_corpus_covers_every_class_of_issue_11():
    classes = {p.parent.name for p in CASES}
    assert classes >= {
        "unit_injection", "engine_flags", "paths", "names", "yaml", "keys", "stacks", "patch_sets",
        "secrets", "ports", "engine_values", "group_files",
    }
    assert len(CASES) >= 80


def test_the_base_alone_is_valid(world):
    configs = validate(world, "group", b"launcher: sglang.launch_server\n")
    assert [s.name for s in configs["gpu-a"].services] == ["ddtree", "dflash"]


def served_on_triton(world: Path) -> None:
    """`served-triton`: ddtree-sample's files with the manifest naming triton as the one backend it served on."""
    served_copy(patch_sets.PATCHES_DIR, "served-triton")
    assert patch_sets.load_patch_set("served-triton").attention_backends == ("triton",)


def with_args(args: str) -> bytes:
    """The base's ddtree service on `served-triton` (which has no engine flag list of its own: no DDTREE flags)."""
    plain = "speculative-algorithm: null, speculative-dflash-block-size: null, speculative-ddtree-budget: null"
    return f"services:\n  ddtree:\n    patch_sets: [served-triton]\n    args: {{{plain}, {args}}}\n".encode()


@pytest.mark.parametrize(("args", "key", "value", "said"), [
    ("attention-backend: fa3", "services.ddtree.args.attention-backend", "fa3", "`attention-backend: fa3`"),
    ("attention-backend: triton, decode-attention: flashinfer", "services.ddtree.args.decode-attention", "flashinfer",
     "`decode-attention-backend: flashinfer`"),
    ("attention-backend: null", "services.ddtree.args", None, "without `attention-backend` sglang runs its default"),
    ("attention-backend: false", "services.ddtree.args", None, "without `attention-backend` sglang runs its default"),
    ("attention-backend: triton, decode-attention-backend: fa3", "services.ddtree.args.decode-attention-backend", "fa3",
     "`decode-attention-backend: fa3`"),
    ("attention-backend: triton, prefill-attention-backend: flashinfer", "services.ddtree.args.prefill-attention-backend",
     "flashinfer", "`prefill-attention-backend: flashinfer`"),
    ("attention-backend: triton, speculative-draft-attention-backend: fa3",
     "services.ddtree.args.speculative-draft-attention-backend", "fa3", "`speculative-draft-attention-backend: fa3`"),
], ids=["fa3", "a-prefix", "sglangs-default", "false-leaves-it-out", "decode", "prefill", "draft"])
def test_a_backend_the_patch_set_was_not_served_on_is_refused(world, args, key, value, said):
    """Every flag that picks an attention backend, and sglang's default where none is given, is held to the
    backends the patch set's manifest says it served on (DDTree's port died on fa3, served on triton)."""
    served_on_triton(world)
    with pytest.raises(DataError) as caught:
        validate(world, "group", with_args(args))
    error = caught.value
    assert (error.source.endswith("case.yml"), error.key_path, error.value) == (True, key, value), str(error)
    assert said in str(error) and "patch set served-triton was served only on triton" in str(error)
    assert "set `attention-backend: triton`" in str(error) and "--attention-backend" in str(error)


@pytest.mark.parametrize("args", [
    "attention-backend: triton",
    "attention-backend: triton, decode-attention-backend: triton, speculative-draft-attention-backend: triton",
    "attention-backend: auto",  # resolved from the GPU on the host, and checked there (operations/gpu/gpus.py)
])
def test_the_backends_it_served_on_are_accepted(world, args):
    served_on_triton(world)
    services = validate(world, "group", with_args(args))["gpu-a"].services
    assert services[0].patch_sets == ("served-triton",)


def test_a_set_that_names_no_backends_holds_nothing(world):
    """ddtree-sample was never served on a GPU (parser level only): its services may name any backend."""
    content = b"services:\n  ddtree:\n    args:\n      attention-backend: fa3\n      decode-attention-backend: flashinfer\n"
    assert [s.name for s in validate(world, "group", content)["gpu-a"].services] == ["ddtree", "dflash"]


@pytest.mark.parametrize("case", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_bad_input_is_refused_with_file_key_value_and_fix(world, case):
    meta, content = header(case)
    kind = meta.get("kind", "group")
    assert kind in KINDS and meta.get("expect"), f"{case}: needs `#! expect:` and a known `#! kind:`"
    with pytest.raises(DataError) as caught:
        validate(world, kind, content)
    error = caught.value
    message = str(error)
    assert meta["expect"] in message, message
    assert error.source and error.key_path and error.fix, message
    where = {
        "group": "case.yml", "stack": "case-stack.yml", "patchset": "case-set/patchset.yml", "secrets": "secrets.yml",
        "stray": "gpus.yml", "inventory": ("inventory (host", "--data"),
    }[kind]
    assert any(w in error.source for w in ((where,) if isinstance(where, str) else where)), message
    assert "Traceback" not in message


def test_the_readme_reports_the_corpus_size():
    text = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert f"holds {len(CASES)} bad inputs" in text and f"all {len(CASES)} are refused" in text
