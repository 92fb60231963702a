"""A service's kernel caches: keyed by what its kernels depend on, named by its unit, pruned to what a unit uses."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from configuration import stacks
from configuration.patch_sets import load_patch_set
from operations import remote
from operations.service import kernel_cache, service_inputs, surge, units
from tests.unit.test_units import fresh_key_sources, lab_config  # noqa: F401 - the fixture

GEN = "/root/venv_sglang.generations/g-0123456789abcdef"


def _service(**changes):
    service = lab_config().services[0]
    return dataclasses.replace(service, **changes) if changes else service


def _with_arg(service, flag, value):
    return dataclasses.replace(service, args=(*service.args, (flag, value)))


def test_every_flag_but_those_that_only_address_the_engine_keys_the_cache():
    service = _service()
    base = kernel_cache.key(service, GEN)
    # Flags that change what is compiled, one this file has never heard of among them: each a new key.
    for flag, value in [("cuda-graph-max-bs", 8), ("kv-cache-dtype", "fp8_e4m3"), ("tp-size", 2),
                        ("enable-torch-compile", True), ("some-flag-of-a-later-engine", "x")]:
        assert kernel_cache.key(_with_arg(service, flag, value), GEN) != base, flag
    # A flag the service has, changed.
    flag, value = next((f, v) for f, v in service.args if f not in kernel_cache.ADDRESSING)
    changed = dataclasses.replace(service, args=tuple((f, f"{v}x" if f == flag else v) for f, v in service.args))
    assert kernel_cache.key(changed, GEN) != base
    # The environment, the generation, the models.
    assert kernel_cache.key(dataclasses.replace(service, env=(*service.env, ("SGLANG_X", "1"))), GEN) != base
    assert kernel_cache.key(service, GEN + "0") != base
    assert kernel_cache.key(dataclasses.replace(service, target=dataclasses.replace(service.target, name="Other")), GEN) != base


def test_where_a_service_listens_runs_and_finds_its_models_does_not_key_its_cache():
    service = _service()
    base = kernel_cache.key(service, GEN)
    for flag, value in [("port", 31000), ("host", "0.0.0.0"), ("served-model-name", "x"), ("log-level", "debug")]:
        assert kernel_cache.key(_with_arg(service, flag, value), GEN) == base, flag
    moved = dataclasses.replace(service, gpus=(1,), target=dataclasses.replace(service.target, load_path="/elsewhere/m"),
                                env=(*service.env, ("CUDA_VISIBLE_DEVICES", "1")))
    assert kernel_cache.key(moved, GEN) == base
    # So a surge (its GPU and port replaced) compiles into the cache its replica then starts from.
    bridge = surge.surge_service(service, surge.Surge(service.name, (1,), service.port + 1))
    assert kernel_cache.key(bridge, GEN) == base


def _unit_env(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("Environment="):
            name, _, value = line.removeprefix("Environment=").strip('"').partition("=")
            out[name] = value
    return out


def test_the_unit_points_every_cache_of_the_engine_into_its_key_and_has_systemd_make_it():
    config = lab_config()
    service = config.services[0]
    stack = stacks.load_stack(config.stack)
    patch_sets = {name: load_patch_set(name) for name in config.patch_sets}
    text = service_inputs.unit_text(config, service, stack, patch_sets, ())
    key = service_inputs.cache_key(service, stack, patch_sets)
    env = _unit_env(text)
    cache_vars = kernel_cache.environment("X")
    assert cache_vars, "the engine has cache variables"
    for name in cache_vars:
        assert env[name].startswith(f"{kernel_cache.KERNELS_DIR}/{key}"), name
    assert f"CacheDirectory=sglang/kernels/{key} sglang/kernels/{key}/home" in text.splitlines()
    assert env["HOME"] == f"{kernel_cache.KERNELS_DIR}/{key}/home"  # what a library caches under ~ travels too
    # A run in the service's sandbox (no generation) makes no cache directory of a key.
    sandbox = units.render_unit(config, service, stack, units.inputs_digest(stack, {}))
    assert "/kernels/" not in sandbox


def test_only_caches_no_unit_names_are_removed_with_their_sealed_copies():
    found = {"caches": {"a" * 16: {"files": 3, "bytes": 9}, "b" * 16: {"files": 0, "bytes": 0},
                        "c" * 16: {"files": 1, "bytes": 1}}, "named": {"/etc/systemd/system/sglang-a.service": ["a" * 16]},
             "sealed": {f"{'a' * 16}.sm90": {"files": 3}, f"{'c' * 16}.sm90": {"files": 1}, f"{'c' * 16}.sm120": {"files": 1}}}
    assert kernel_cache.unused(found, ["b" * 16]) == sorted([
        f"{kernel_cache.KERNELS_DIR}/{'c' * 16}", f"{kernel_cache.SEALED_DIR}/{'c' * 16}.sm90",
        f"{kernel_cache.SEALED_DIR}/{'c' * 16}.sm120"])
    # A unit this run removes (its service moved away) keeps nothing.
    assert kernel_cache.unused(found, ["b" * 16], ["/etc/systemd/system/sglang-a.service"]) == sorted([
        f"{kernel_cache.KERNELS_DIR}/{'a' * 16}", f"{kernel_cache.KERNELS_DIR}/{'c' * 16}",
        f"{kernel_cache.SEALED_DIR}/{'a' * 16}.sm90", f"{kernel_cache.SEALED_DIR}/{'c' * 16}.sm90",
        f"{kernel_cache.SEALED_DIR}/{'c' * 16}.sm120"])
    assert kernel_cache.unused(None, []) == []
    assert kernel_cache.warm(found, "a" * 16) is True
    assert kernel_cache.warm(found, "b" * 16) is False
    assert kernel_cache.warm(None, "a" * 16) is None


def _run_script(root, *globs):
    text = remote.script("kernel_caches")
    out = subprocess.run([sys.executable, "-c", text, str(root), *globs], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_host_read_counts_each_cache_and_finds_the_keys_units_name(tmp_path):
    root, units_dir = tmp_path / "kernels", tmp_path / "units"
    (root / ("a" * 16) / "triton" / "x").mkdir(parents=True)
    (root / ("a" * 16) / "triton" / "x" / "k.cubin").write_bytes(b"12345")
    (root / ("a" * 16) / "nv").mkdir()
    (root / ("b" * 16)).mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "big").write_bytes(b"0" * 100)
    os.symlink(tmp_path / "elsewhere", root / ("c" * 16))  # a link is not a cache of ours: never counted
    os.symlink(tmp_path / "elsewhere" / "big", root / ("a" * 16) / "nv" / "link")  # a link inside: counted, not followed
    units_dir.mkdir()
    (units_dir / "sglang-x.service").write_text(
        f"Environment=TRITON_CACHE_DIR=/var/cache/sglang/kernels/{'d' * 16}/triton\nCacheDirectory=sglang/kernels/{'e' * 16}\n")
    sealed = tmp_path / "sealed"
    (sealed / f"{'a' * 16}.sm90").mkdir(parents=True)
    (sealed / f"{'a' * 16}.sm90" / "k").write_bytes(b"1")
    (sealed / f"{'a' * 16}.sm90" / ".sglang-deploy-manifest.json").write_bytes(b"{}")  # ours, not the cache's
    (sealed / f".{'b' * 16}.sm90.partial").mkdir()  # a seal in progress is no sealed copy
    found = _run_script(root, sealed, str(units_dir))
    assert found["caches"] == {"a" * 16: {"files": 2, "bytes": 5 + len(str(tmp_path / "elsewhere" / "big"))},
                               "b" * 16: {"files": 0, "bytes": 0}}
    assert found["sealed"] == {f"{'a' * 16}.sm90": {"files": 1, "bytes": 1}}
    assert found["named"] == {str(units_dir / "sglang-x.service"): ["d" * 16, "e" * 16]}
    assert _run_script(tmp_path / "absent", tmp_path / "absent") == {"caches": {}, "sealed": {}, "named": {}}


def test_a_removal_never_follows_a_link(tmp_path):
    kernels = tmp_path / "kernels"
    (kernels / ("a" * 16)).mkdir(parents=True)
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "f").write_text("x")
    os.symlink(tmp_path / "precious", kernels / ("b" * 16))
    command = kernel_cache.remove_command([str(kernels / ("a" * 16)), str(kernels / ("b" * 16))])
    subprocess.run(["sh", "-c", command], check=True)
    assert not (kernels / ("a" * 16)).exists()
    assert (tmp_path / "precious" / "f").read_text() == "x"


@pytest.mark.parametrize("cache_dir", ["/var/cache/sglang/kernels/0123456789abcdef"])
def test_the_unit_setting_is_relative_to_systemds_cache_root(cache_dir):
    assert kernel_cache.unit_setting(cache_dir) == "sglang/kernels/0123456789abcdef sglang/kernels/0123456789abcdef/home"


K = "0123456789abcdef"


def _found(live_files=0, sealed=None):
    return {"caches": {K: {"files": live_files, "bytes": live_files}} if live_files is not None else {},
            "sealed": {name: {"files": 2, "bytes": 2} for name in (sealed or [])}, "named": {"/u": [K]}}


def test_an_empty_cache_is_seeded_before_a_start_from_this_hosts_sealed_copy_else_from_the_models_source():
    from operations.service import kernel_ship

    sealed_here = kernel_ship.warm_up(_found(0, [f"{K}.sm90"]), K, "sm90", True, "gpu-b", "gpu-a")
    assert sealed_here == kernel_ship.Warmup(K, f"{K}.sm90", None)
    shipped = kernel_ship.warm_up(_found(None, [f"{K}.sm120"]), K, "sm90", True, "gpu-b", "gpu-a")
    assert shipped == kernel_ship.Warmup(K, f"{K}.sm90", "gpu-b")  # another architecture's copy is no copy
    # Nothing to do: a warm cache, no (re)start, no source but a directory or this host, GPUs not read.
    assert kernel_ship.warm_up(_found(3), K, "sm90", True, "gpu-b", "gpu-a") is None
    assert kernel_ship.warm_up(_found(0), K, "sm90", False, "gpu-b", "gpu-a") is None
    assert kernel_ship.warm_up(_found(0), K, "sm90", True, "/data/models/M", "gpu-a") is None
    assert kernel_ship.warm_up(_found(0), K, "sm90", True, "gpu-a", "gpu-a") is None
    assert kernel_ship.warm_up(_found(0), K, None, True, "gpu-b", "gpu-a") is None
    assert kernel_ship.warm_up(None, K, "sm90", True, "gpu-b", "gpu-a") is None


def test_a_cache_is_sealed_once_per_key_and_architecture():
    from operations.service import kernel_ship

    assert kernel_ship.seal_needed(_found(3), K, "sm90", False)  # warm, never sealed
    assert kernel_ship.seal_needed(_found(0), K, "sm90", True)  # (re)started in this run: it will hold kernels
    assert not kernel_ship.seal_needed(_found(0), K, "sm90", False)  # nothing compiled, nothing starting
    assert not kernel_ship.seal_needed(_found(3, [f"{K}.sm90"]), K, "sm90", True)
    assert kernel_ship.seal_needed(_found(3, [f"{K}.sm120"]), K, "sm90", False)
    assert not kernel_ship.seal_needed(_found(3), K, None, True)


def test_a_run_in_the_services_sandbox_makes_no_kernel_cache():
    # The preflight runs the engine's parser with the sandbox of the unit it would write (units.sandbox_properties of
    # that text): its CacheDirectory= made the key's directory of flags the preflight then refused, left for the next
    # run's Cleanup to remove (a change in a run that changed nothing else: test_patches' failed-preflight test).
    config = lab_config()
    service = config.services[0]
    stack = stacks.load_stack(config.stack)
    patch_sets = {name: load_patch_set(name) for name in config.patch_sets}
    sandbox = units.sandbox_properties(service_inputs.unit_text(config, service, stack, patch_sets, ()))
    assert "CacheDirectory=sglang" in sandbox
    assert not any("/kernels" in prop or "sglang/kernels" in prop for prop in sandbox), sandbox
