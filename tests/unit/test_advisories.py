"""Engine advisories as data (files/engine_advisories.yml, configuration/advisories.py): each entry, a case inside its
condition (refused or warned, with its id, reference and fix) and one just outside it (not a word), through the path
that decides it: validation on the control machine where the data decides, the GPU check where the GPU does, and the
advisories themselves for engine versions no stack pins (the engine's flag list for those is not in this checkout).
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import yaml

from configuration import advisories, engine_flags, patch_sets, settings
from configuration.errors import DataError
from operations.gpu import gpu_read, gpus
from tests.unit.hosts import make_host
from tests.unit.test_units import lab_data

STACKS = {"0.5.11": "sglang-0.5.11-cu130", "0.5.13": "sglang-0.5.13-cu130", "0.5.23": None}  # None: the lab's own (0.5.23)


def facts(cap: str, kinds: dict[str, str | None] | None = None) -> gpu_read.GpuFacts:
    return gpu_read.GpuFacts("/usr/bin/nvidia-smi", None, "580.159.04", "13.0",
                         (gpu_read.Gpu(0, "GPU-0", "a GPU", cap, 143771, 0, "00000000:00:06.0"),), (), (), {}, {},
                         kinds or {})


def verdict(engine: str, args: dict, cap: str = "9.0", patch: tuple[str, ...] = (), target: str | None = "absent") -> str:
    """What the deploy says of one DFLASH service on `engine` with `args` (and patch sets `patch`) on a GPU of compute
    capability `cap`, its target model `target` (hybrid, dense, None: no config.json, absent: not on the host yet):
    `refused: ...` (validation), `gpu error: ...`, `gpu warning: ...`, `after staging: ...` (left to the preflight),
    or `fine`."""
    data = lab_data()
    if STACKS[engine]:
        data["stack"] = STACKS[engine]
    dflash = data["services"]["dflash"]
    data["services"] = {"svc": {**dflash, "gpu": 0, "port": 30100, "patch_sets": list(patch), "args": {**dflash["args"], **args}}}
    try:
        config = settings.host_config(make_host(data, {"run_services": ["svc"]}))
    except DataError as error:
        return f"refused: {error}"
    kinds = {} if target == "absent" else {config.services[0].target.store_path: target}
    plan = gpus.decide(config, facts(cap, kinds), engine)
    said = [f"gpu error: {e}" for e in plan.errors] + [f"gpu warning: {w}" for w in plan.warnings]
    said += [f"after staging: {kind}: {a.effect}: {a.text()}" for kind, held in plan.after_staging.get("svc", {}).items()
             for a in held]
    return "\n".join(said) or "fine"


def by_id(name: str) -> advisories.Advisory:
    return next(a for a in advisories.load_advisories() if a.id == name)


# (id, engine, args inside, GPU inside, what it says, args just outside, GPU just outside)
THROUGH_THE_DEPLOY = [
    ("mamba-scheduler-strategy-renamed", "0.5.23", {"mamba-scheduler-strategy": "extra_buffer"}, "9.0", "refused",
     None, None),  # outside: 0.5.13 has the flag (below)
    ("dflash-draft-window-size-renamed", "0.5.23", {"speculative-dflash-draft-window-size": 2048}, "9.0", "refused", None, None),
    ("disable-piecewise-cuda-graph-renamed", "0.5.23", {"disable-piecewise-cuda-graph": True}, "9.0", "refused", None, None),
    ("extra-buffer-lazy-with-dflash", "0.5.13", {"mamba-scheduler-strategy": "extra_buffer_lazy"}, "9.0", "refused",
     {"mamba-scheduler-strategy": "extra_buffer"}, None),
    ("dflash-prefill-cuda-graph-sm12", "0.5.23", {"attention-backend": "triton"}, "12.0", "gpu warning",
     {"attention-backend": "triton", "cuda-graph-backend-prefill": "disabled"}, "9.0"),
    ("flashinfer-jit-sm12", "0.5.23", {"attention-backend": "flashinfer", "cuda-graph-backend-prefill": "disabled"}, "12.0",
     "gpu warning", {"attention-backend": "triton", "cuda-graph-backend-prefill": "disabled"}, "9.0"),
    ("sglang-0.5.11-fa3-piecewise-cuda-graph", "0.5.11", {"attention-backend": "fa3"}, "9.0", "gpu error",
     {"attention-backend": "fa3", "disable-piecewise-cuda-graph": True}, "12.0"),
    # The operator's hybrid DFLASH service on 0.5.13 (bench/results/h100-2026-12-05-84cb7e5-hybrid-weights.txt); just
    # outside: the radix cache off, which 0.5.13 allows only with no_buffer.
    ("dflash-hybrid-radix-hit-0.5.13", "0.5.13", {"mamba-scheduler-strategy": "extra_buffer"}, "9.0", "gpu warning",
     {"mamba-scheduler-strategy": "no_buffer", "disable-radix-cache": True}, None),
]


@pytest.mark.parametrize(("name", "engine", "inside", "cap", "says", "outside", "cap_outside"), THROUGH_THE_DEPLOY,
                         ids=[case[0] for case in THROUGH_THE_DEPLOY])
def test_each_advisory_is_said_inside_its_condition_and_not_just_outside(name, engine, inside, cap, says, outside, cap_outside):
    advisory = by_id(name)
    target = (advisory.target or ("absent",))[0]  # an entry on the target's kind: a target of that kind on the host
    said = verdict(engine, inside, cap, target=target)
    assert said.startswith(says), said
    assert f"[{advisory.id}; {advisory.reference}]: {advisory.fix}" in said, said
    if outside is not None:
        assert advisory.id not in verdict(engine, outside, cap, target=target), "just outside its flags"
    if advisory.target is not None:
        other = next(k for k in advisories.TARGET_KINDS if k not in advisory.target)
        assert advisory.id not in verdict(engine, inside, cap, target=other), "just outside its target"
    if cap_outside is not None:
        assert advisory.id not in verdict(engine, inside, cap_outside), "just outside its GPU"


@pytest.mark.parametrize("flag", ["mamba-scheduler-strategy", "speculative-dflash-draft-window-size", "disable-piecewise-cuda-graph"])
def test_a_flag_renamed_in_0_5_20_is_still_the_old_engines(flag):
    """Just outside the renames: an engine that still has the flag takes it."""
    value = {"mamba-scheduler-strategy": "extra_buffer", "speculative-dflash-draft-window-size": 2048}.get(flag, True)
    engine = "0.5.11" if flag == "disable-piecewise-cuda-graph" else "0.5.13"
    assert "renamed" not in verdict(engine, {flag: value, "attention-backend": "triton"}, "12.0")


# Engine versions no stack pins: the advisories alone, with the flags as written.
BY_VERSION = [
    ("mamba-scheduler-strategy-deprecated", {"mamba-scheduler-strategy": "extra_buffer"}, "0.5.17", "0.5.13"),
    ("extra-buffer-lazy-with-dflash-radix", {"mamba-radix-cache-strategy": "extra_buffer_lazy"}, "0.5.15", "0.5.18"),
    ("dflash-mamba-track-boundary", {}, "0.5.19", "0.5.20"),  # on a hybrid target (below: on a dense one)
]


@pytest.mark.parametrize(("name", "args", "inside", "outside"), BY_VERSION, ids=[case[0] for case in BY_VERSION])
def test_each_advisory_for_an_unpinned_version_holds_inside_and_not_just_outside(name, args, inside, outside):
    advisory = by_id(name)
    service = {"speculative-algorithm": "DFLASH", **args}
    target = (advisory.target or (None,))[0]
    assert advisories.holds(advisory, advisories.EngineUse(inside, service), target=target) is True
    assert advisories.holds(advisory, advisories.EngineUse(outside, service), target=target) is False


def test_the_track_boundary_advisory_is_outside_with_the_radix_cache_off_or_a_dense_target():
    advisory = by_id("dflash-mamba-track-boundary")
    service = advisories.EngineUse("0.5.19", {"speculative-algorithm": "DFLASH", "disable-radix-cache": True})
    assert advisories.holds(advisory, service, target="hybrid") is False
    service = advisories.EngineUse("0.5.19", {"speculative-algorithm": "DFLASH"})
    assert advisories.holds(advisory, service, target="dense") is False
    assert advisories.holds(advisory, service) is None, "the target's kind unknown: the host decides"


@pytest.fixture
def ddtree_0_5_13(tmp_path, monkeypatch):
    """A stand-in for the ddtree-0_5_13 patch set, whose files are the operator's and not in this checkout
    (bench/ddtree/build_patchset.sh builds them): its name, base and served backend, so that validation reads the
    service with sglang 0.5.13's flags as the set extends them (files/engine_flags/sglang-0.5.13+ddtree-0_5_13.json)."""
    root = tmp_path / "patches" / "ddtree-0_5_13"
    worker = root / "sglang" / "srt" / "speculative" / "ddtree_worker.py"
    worker.parent.mkdir(parents=True)
    worker.write_text("# a stand-in\n")
    (root / "patchset.yml").write_text(yaml.safe_dump({
        "name": "ddtree-0_5_13", "base": {"distribution": "sglang", "version": "0.5.13"}, "attention_backends": ["triton"],
        "files": {"sglang/srt/speculative/ddtree_worker.py": {"sha256": hashlib.sha256(worker.read_bytes()).hexdigest(), "original": None}},
    }))
    monkeypatch.setattr(patch_sets, "PATCHES_DIR", tmp_path / "patches")
    patch_sets.load_patch_set.cache_clear()
    yield "ddtree-0_5_13"
    patch_sets.load_patch_set.cache_clear()


# DDTREE exists only with the patch set (bench/results/h100-2026-12-05-*-hybrid-*.txt). The target's kind is read from
# its config.json on the host, not guessed from the flags: a hybrid target served with no mamba-* flag (sglang's
# defaults) is refused too; just outside, the same service on a dense target, and DFLASH on the hybrid one.
DDTREE = {"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 15, "attention-backend": "triton"}


@pytest.mark.parametrize("mamba", [{}, {"mamba-scheduler-strategy": "extra_buffer"}], ids=["no mamba flag", "mamba flag"])
def test_ddtree_on_a_hybrid_target_is_refused_and_not_just_outside(ddtree_0_5_13, mamba):
    advisory = by_id("ddtree-hybrid-linear-state")
    said = verdict("0.5.13", {**DDTREE, **mamba}, "9.0", (ddtree_0_5_13,), target="hybrid")
    assert said.startswith("gpu error: svc: "), said
    assert f"[{advisory.id}; {advisory.reference}]: {advisory.fix}" in said, said
    assert advisory.id not in verdict("0.5.13", {**DDTREE, **mamba}, "9.0", (ddtree_0_5_13,), target="dense"), "a dense target"
    dflash = {**DDTREE, **mamba, "speculative-algorithm": "DFLASH"}
    del dflash["speculative-ddtree-budget"]
    assert advisory.id not in verdict("0.5.13", dflash, "9.0", (ddtree_0_5_13,), target="hybrid"), "DFLASH"


def test_a_target_not_on_the_host_yet_leaves_its_kind_to_the_preflight(ddtree_0_5_13):
    """A first deploy or a move: the store does not hold the target when the host is read; the advisories on its kind
    are not dropped (nor guessed): the preflight decides them once the model is staged."""
    advisory = by_id("ddtree-hybrid-linear-state")
    said = verdict("0.5.13", DDTREE, "9.0", (ddtree_0_5_13,), target="absent")
    assert said == f"after staging: hybrid: refuse: {advisory.text()}", said
    assert verdict("0.5.13", DDTREE, "9.0", (ddtree_0_5_13,), target=None).startswith("after staging: hybrid: refuse")
    data = lab_data()
    data["stack"] = STACKS["0.5.13"]
    data["services"] = {"svc": {**data["services"]["dflash"], "gpu": 0, "port": 30100, "patch_sets": [ddtree_0_5_13],
                                "args": {**data["services"]["dflash"]["args"], **DDTREE}}}
    config = settings.host_config(make_host(data, {"run_services": ["svc"]}))
    plan = gpus.decide(config, facts("9.0"), "0.5.13")
    assert any("is not in" in d and "ddtree-hybrid-linear-state" in d and "decided by its preflight" in d
               for d in plan.decisions), plan.decisions


def test_the_ddtree_hybrid_advisory_holds_for_its_patch_set_and_engine_only():
    """The flags as the patched engine's parser reads them (a prefix is the flag); the patch set and engine as named."""
    engine = engine_flags.for_engine("0.5.13", ("ddtree-0_5_13",))
    advisory = by_id("ddtree-hybrid-linear-state")
    prefixed = advisories.EngineUse("0.5.13", {"speculative-algor": "DDTREE"}, engine, ("ddtree-0_5_13",))
    assert advisories.holds(advisory, prefixed, target="hybrid") is True
    assert advisories.holds(advisory, prefixed) is None, "the target's kind unknown: the host decides"
    other_set = dataclasses.replace(prefixed, patch_sets=("ddtree-0_5_13-copy",))
    assert advisories.holds(advisory, other_set, target="hybrid") is False, "another patch set"
    assert advisories.holds(advisory, dataclasses.replace(prefixed, patch_sets=()), target="hybrid") is False
    assert advisories.holds(advisory, advisories.EngineUse("0.5.23", dict(DDTREE), None, ("ddtree-0_5_13",)),
                            target="hybrid") is False, "another engine"


def test_every_advisory_has_a_case_here():
    covered = {c[0] for c in THROUGH_THE_DEPLOY} | {c[0] for c in BY_VERSION} | {"ddtree-hybrid-linear-state"}
    assert sorted(a.id for a in advisories.load_advisories() if a.id not in covered) == []


def test_auto_on_sm_12_resolves_to_what_the_advisory_prefers():
    said = verdict("0.5.23", {"attention-backend": "auto", "cuda-graph-backend-prefill": "disabled"}, "12.0")
    assert said == "fine", said  # auto -> triton: the flashinfer advisory no longer holds
    data = lab_data()
    config = settings.host_config(make_host(data, {"run_services": {"dflash": {"gpu": 0}}}))
    plan = gpus.decide(config, facts("12.0"), "0.5.23")
    assert any("attention-backend auto -> triton (sm 12.0: FlashInfer's JIT" in d and "[flashinfer-jit-sm12]" in d for d in plan.decisions)


def test_the_gpu_decides_what_the_data_cannot():
    """An entry with a compute capability, or a backend `auto` leaves open, waits for the host; the rest is decided."""
    engine = engine_flags.for_engine("0.5.23")
    service = advisories.EngineUse("0.5.23", {"speculative-algorithm": "DFLASH", "attention-backend": "auto"}, engine)
    waiting = {a.id for a in advisories.deferred(service)}
    assert {"dflash-prefill-cuda-graph-sm12", "flashinfer-jit-sm12"} <= waiting
    assert "mamba-scheduler-strategy-renamed" not in waiting


def test_an_alias_or_prefix_is_the_flag_it_resolves_to():
    """Conditions read the flags as the engine's parser does: a prefix of `--disable-radix-cache` is that flag."""
    engine = engine_flags.for_engine("0.5.23")
    service = advisories.EngineUse("0.5.19", {"speculative-algorithm": "DFLASH", "disable-radix-cach": True}, engine)
    assert advisories.holds(by_id("dflash-mamba-track-boundary"), service) is False


@pytest.mark.parametrize(("entry", "message"), [
    ({"id": "x", "summary": "s", "effect": "block", "reference": "r", "fix": "f"}, "one of refuse, warn"),
    ({"id": "x", "summary": "s", "effect": "warn", "reference": "r", "fix": "f", "engine": "0.5.x"}, "a PEP 440 specifier"),
    ({"id": "x", "summary": "s", "effect": "warn", "reference": "r"}, "fix: None: required"),
    ({"id": "x", "summary": "s", "effect": "warn", "reference": "r", "fix": "f", "flags": {"a": "set"}}, "a list of `set`"),
    ({"id": "x", "summary": "s", "effect": "warn", "reference": "r", "fix": "f", "when": 1}, "unknown key"),
    ({"id": "x", "summary": "s", "effect": "warn", "reference": "r", "fix": "f", "target": ["moe"]}, "hybrid, dense"),
    ({"id": "x", "summary": "s", "effect": "warn", "reference": "r", "fix": "f", "patch_set": "ddtree"}, "a list of strings"),
])
def test_a_wrong_entry_is_refused_naming_its_key(tmp_path, entry, message):
    import yaml

    path = tmp_path / "advisories.yml"
    path.write_text(yaml.safe_dump({"advisories": [entry]}))
    with pytest.raises(DataError) as caught:
        advisories.load_advisories(path)
    assert message in str(caught.value)


def test_the_file_loads_and_every_entry_says_where_it_was_seen():
    for advisory in advisories.load_advisories():
        assert advisory.reference and advisory.fix and advisory.summary
        assert dataclasses.replace(advisory) == advisory
