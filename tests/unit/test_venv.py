"""venv.environment / venv.switched with facts given: what a generation build yields, and why."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api import OperationError

from configuration.stacks import Package, Stack
from operations import remote
from operations.environment import installer, venv, venv_copy, venv_decide, venv_probe, venv_read
from tests.unit.test_operations import FakeFs, Result, run
from tests.unit.test_wheel_overlap import BASE, CU13, make_wheel, pin

LIVE = "/root/venv_sglang"
CACHE = "/var/cache/sglang-deploy/wheels"
UV_BIN = f"UV_CACHE_DIR={CACHE}/.uv-cache {CACHE}/.tools/uv-{installer.UV_VERSION}/uv pip"


def UV(sub: str, python: str) -> str:  # noqa: N802 - reads like the command
    return f"{UV_BIN} {sub} --quiet --no-config --python {python}" + (" --link-mode copy" if sub == "install" else "")
WHEELS = {
    "sglang-kernel": "sglang_kernel-0.3.1+cu130-cp310-abi3-manylinux2014_x86_64.whl",
    "sglang-standin": "sglang_standin-0.1.0-py3-none-any.whl",
    "torch": "torch-2.11.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
}


@pytest.fixture
def house(tmp_path) -> Path:
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    for name in WHEELS.values():
        # Real (tiny) wheels: a build reads each one's RECORD before installing (planned_overlaps).
        dist, version = name.split("-")[:2]
        make_wheel(folder, dist, version, {f"{dist}/__init__.py": f"contents of {name}".encode()}).rename(folder / name)
    return folder


def _pin(house: Path, name: str, version: str) -> Package:
    path = house / WHEELS[name]
    return Package(name, version, path.name, hashlib.sha256(path.read_bytes()).hexdigest())


@pytest.fixture
def stack(tmp_path, house) -> Stack:
    return Stack(
        "demo",
        "3.11",
        (_pin(house, "sglang-kernel", "0.3.1+cu130"), Package("sglang-standin", "0.1.0", WHEELS["sglang-standin"]), _pin(house, "torch", "2.11.0+cu130")),
        tmp_path / "demo.yml",
    )


def gen_of(stack) -> venv_read.Generation:
    return venv_read.generation(LIVE, stack, {})


def venv_facts(path, python="3.11.7", **versions) -> dict:
    """One venv as the fact reads it: the stack's distributions, `versions` changed (None removes one)."""
    dists = {
        "pip": {"version": "24.0", "installer": "pip"},
        "sglang-kernel": {"version": "0.3.1+cu130", "installer": "uv"},
        "sglang-standin": {"version": "0.1.0", "installer": "uv"},
        "torch": {"version": "2.11.0+cu130", "installer": "uv"},
    }
    for name, version in versions.items():
        name = name.replace("_", "-")
        if version is None:
            dists.pop(name, None)
        else:
            dists[name] = {"version": version, "installer": "uv"}
    for info in dists.values():
        info.update(damaged=[], damaged_count=0, linked=[], linked_count=0)
    return {"path": path, "python": python, "dists": dists, "shared": {}, "checked": "size, mtime", "hashed": 0}


def facts(gen, wanted=None, live_state=None, live="link", cache=None, uv=True) -> dict:
    target = {"link": gen.path if wanted is not None and live_state is None else (live_state or {}).get("path"), "absent": None}.get(live, LIVE)
    return {
        "machine": "x86_64",
        "live": {"kind": live if live != "dir" else "dir", "target": target},
        "wanted": wanted,
        "live_state": live_state,
        "cache": cache or {},
        "uv": uv,
    }


def run_env(fact, stack, house, installer_choice="auto", sources=None) -> Result:
    gen = gen_of(stack)
    return run(
        venv.environment,
        {venv_read.VenvState: lambda **kw: copy.deepcopy(fact)},
        FakeFs(dirs={CACHE}),
        gen=gen,
        stack=stack,
        sources=sources or (venv_decide.Source("wheelhouse", str(house)),),
        host_cache=CACHE,
        installer=installer_choice,
    )


def uploads(result) -> list[str]:
    """Where wheels were pushed: each lands as `<name>.part` and takes its name once its sha256 checks out."""
    out = []
    for c in result.commands:
        if isinstance(c, tuple) and c[0] == "put":
            assert c[2].endswith(".part") or ".tools" in c[2] or "/uv-" in c[2], c
            out.append(c[2].removesuffix(".part"))
    return out


def installs(result) -> list[str]:
    # The command line only: a remote script's text (a heredoc: the index write after each install) is not one.
    return [c for c in result.commands if isinstance(c, str) and " install " in c.split("<<'PYEOF'")[0]]


# Generations -------------------------------------------------------------------------------


def test_generation_id_names_the_stack_and_changes_with_any_pin_or_patch_set(stack, house):
    gen = gen_of(stack)
    assert gen.id.startswith("demo-") and gen.path == f"{LIVE}.generations/{gen.id}"
    assert venv_read.generation(LIVE, stack, {}) == gen
    repinned = Stack(stack.name, stack.python, (*stack.packages[:2], Package("torch", "2.11.0+cu128")), stack.path)
    assert venv_read.generation(LIVE, repinned, {}).id != gen.id
    assert venv_read.generation(LIVE, stack, {"ddtree": "abc"}).id != gen.id
    assert venv_read.generation(LIVE, stack, {"ddtree": "abd"}).id != venv_read.generation(LIVE, stack, {"ddtree": "abc"}).id


def test_converged_generation_yields_nothing(stack, house):
    gen = gen_of(stack)
    result = run_env(facts(gen, wanted=venv_facts(gen.path)), stack, house)
    assert result.commands == []
    assert result.noops == [f"venv generation {gen.id} holds stack demo (3 distributions; checked: size, mtime)"]


def test_converged_generation_does_not_need_the_wheelhouse(stack, tmp_path):
    gen = gen_of(stack)
    assert run_env(facts(gen, wanted=venv_facts(gen.path)), stack, tmp_path / "no-such-dir").commands == []


def test_new_generation_is_a_copy_of_the_live_one_with_only_the_changed_pin_installed(stack, house):
    gen = gen_of(stack)
    old = f"{LIVE}.generations/demo-0000000000"
    result = run_env(facts(gen, live_state=venv_facts(old, torch="2.10.0+cu130")), stack, house)

    clone = result.commands[0]
    assert clone.startswith("{ command -v python3.11 >/dev/null || ")
    # A copy (extents shared only where the filesystem copies on write), never hard links.
    assert f'partial=$(mktemp -d {gen.path}.partial-XXXXXX)' in clone and f'cp -a --reflink=auto {old} "$partial"' in clone
    assert f'mv -T "$partial" {gen.path}' in clone
    assert "--link" not in clone.replace("--link-mode copy", "")
    assert uploads(result) == [f"{CACHE}/{WHEELS['torch']}"]
    assert installs(result) == [f"{UV('install', gen.python)} --no-deps --no-index --offline {CACHE}/{WHEELS['torch']}"]
    assert f"venv {LIVE}: torch 2.10.0+cu130 -> 2.11.0+cu130" in result.logs
    # The stamp a later fast check compares mtimes with is written last, once everything is in.
    assert result.commands[-1] == f"mkdir -p {gen.path}/.sglang-deploy && touch {gen.path}/{venv.STAMP}"


def test_first_generation_is_a_fresh_venv_built_by_uv(stack, house):
    gen = gen_of(stack)
    (house / installer.UV_WHEELS["x86_64"].file).write_bytes(b"uv wheel")
    result = run_env(facts(gen, live="absent", uv=False), stack, house)

    assert result.commands[0].endswith(f"&& mkdir -p {LIVE}.generations && rm -rf {gen.path} && (cd / && exec python3.11 -I -m venv --without-pip {gen.path})")
    assert f"{CACHE}/{installer.UV_WHEELS['x86_64'].file}" in uploads(result)
    assert any(c.startswith("(cd / && exec python3 -I -c ") and "zipfile" in c for c in result.commands if isinstance(c, str))
    assert sorted(uploads(result)[1:]) == sorted(f"{CACHE}/{w}" for w in WHEELS.values())


def test_without_a_uv_wheel_pip_installs(stack, house):
    gen = gen_of(stack)
    result = run_env(facts(gen, live="absent", uv=False), stack, house)
    assert result.commands[0].endswith(f"(cd / && exec python3.11 -I -m venv {gen.path})")
    assert installs(result)[0].startswith(f"(cd / && exec {gen.python} -I -m pip install --quiet --no-index --no-deps --force-reinstall")


def test_installer_uv_without_a_uv_wheel_is_refused_before_any_change(stack, house):
    gen = gen_of(stack)
    with pytest.raises(OperationError, match="installer: uv, but no uv .* wheel for x86_64"):
        run_env(facts(gen, wanted=venv_facts(gen.path, torch=None), uv=False), stack, house, installer_choice="uv")


def test_host_checks_the_sha256_of_what_it_installs(stack, house):
    gen = gen_of(stack)
    result = run_env(facts(gen, wanted=venv_facts(gen.path, torch=None)), stack, house)
    check = next(c for c in result.commands if isinstance(c, str) and "sha256sum" in c)
    assert f"{stack.packages[2].sha256}  {CACHE}/{WHEELS['torch']}.part" in check
    assert check.endswith(f"&& mv -f {CACHE}/{WHEELS['torch']}.part {CACHE}/{WHEELS['torch']}")


def test_wheel_already_cached_on_the_host_with_its_size_is_not_pushed(stack, house):
    gen = gen_of(stack)
    size = (house / WHEELS["torch"]).stat().st_size
    result = run_env(facts(gen, wanted=venv_facts(gen.path, torch=None), cache={WHEELS["torch"]: size}), stack, house)
    assert uploads(result) == [] and len(installs(result)) == 1
    result = run_env(facts(gen, wanted=venv_facts(gen.path, torch=None), cache={WHEELS["torch"]: size - 1}), stack, house)
    assert uploads(result) == [f"{CACHE}/{WHEELS['torch']}"]


def test_extra_distributions_are_removed_before_anything_is_installed(stack, house):
    gen = gen_of(stack)
    result = run_env(facts(gen, wanted=venv_facts(gen.path, torch="2.10.0", vllm="0.9")), stack, house)
    strings = [c for c in result.commands if isinstance(c, str)]
    assert strings[0] == f"{UV('uninstall', gen.python)} vllm"
    assert f"venv {LIVE}: remove vllm (not in stack demo)" in result.logs


def test_a_file_missing_from_an_installed_distribution_reinstalls_it(stack, house):
    gen = gen_of(stack)
    state = venv_facts(gen.path)
    state["dists"]["torch"].update(damaged=["torch/_C.so"], damaged_count=1)
    size = (house / WHEELS["torch"]).stat().st_size
    result = run_env(facts(gen, wanted=state, cache={WHEELS["torch"]: size}), stack, house)
    # Re-extracted from the wheel: its cache entry dropped first, the cached wheel checked against its pin.
    clean = f"UV_CACHE_DIR={CACHE}/.uv-cache {CACHE}/.tools/uv-{installer.UV_VERSION}/uv cache clean --quiet --no-config torch && "
    assert installs(result) == [f"{clean}{UV('install', gen.python)} --no-deps --no-index --offline --reinstall-package torch {CACHE}/{WHEELS['torch']}"]
    check = next(c for c in result.commands if isinstance(c, str) and "sha256sum" in c)
    assert f"{stack.packages[2].sha256}  {CACHE}/{WHEELS['torch']}'" in check and ".part" not in check
    assert any("torch 2.11.0+cu130: 1 installed file(s) missing or altered (torch/_C.so): reinstalling" in line for line in result.logs)


def test_files_sharing_their_inode_with_the_cache_are_reinstalled_as_copies(stack, house):
    gen = gen_of(stack)
    state = venv_facts(gen.path)
    state["dists"]["torch"].update(linked=["torch/_C.so"], linked_count=1)
    result = run_env(facts(gen, wanted=state), stack, house)
    assert "--reinstall-package torch" in installs(result)[0] and "--link-mode copy" in installs(result)[0]
    assert any("torch 2.11.0+cu130: 1 installed file(s) share their inode with another path" in line for line in result.logs)


def test_a_donor_whose_files_differ_from_their_record_is_not_copied(stack, house):
    donor_state = venv_facts("/root/venv_sglang.generations/d")
    donor_state["dists"]["torch"].update(damaged=["certifi/cacert.pem"], damaged_count=1)
    torch = next(p for p in stack.packages if p.name == "torch")
    donor = venv_decide.Source("donor", "gpu-old")
    with pytest.raises(OperationError, match=r"donor gpu-old \(1 of its installed file\(s\) differ from their RECORD: certifi/cacert.pem\)"):
        venv_decide.resolve(stack, [torch], (donor,), {"gpu-old": donor_state})
    chosen = venv_decide.resolve(stack, [torch], (donor, venv_decide.Source("wheelhouse", str(house))), {"gpu-old": donor_state})
    assert chosen["torch"][0].kind == "wheelhouse"


def test_verify_env_full_reads_the_fact_in_full_mode_and_says_so(stack, house):
    gen = gen_of(stack)
    seen = []
    fact = facts(gen, wanted={**venv_facts(gen.path), "checked": "sha256", "hashed": 812})

    def record(**kw):
        seen.append(kw)
        return copy.deepcopy(fact)

    result = run(venv.environment, {venv_read.VenvState: record}, FakeFs(dirs={CACHE}), verify="full",
                 gen=gen, stack=stack, sources=(venv_decide.Source("wheelhouse", str(house)),), host_cache=CACHE)
    assert seen[0]["verify"] == "full"
    assert result.noops == [f"venv generation {gen.id} holds stack demo (3 distributions; checked: sha256, 812 file(s) hashed)"]
    # The data's `verify_env` is validated with the rest of it (tests/unit/bad_data/crashes/verify-env-*.yml): the host
    # never reads it, the deploy passes the validated value.
    with pytest.raises(ValueError, match="verify must be one of"):
        run(venv.environment, {venv_read.VenvState: record}, FakeFs(dirs={CACHE}), data={"verify_env": "full"}, verify="sha1",
            gen=gen, stack=stack, sources=(venv_decide.Source("wheelhouse", str(house)),), host_cache=CACHE)


def test_a_fact_lost_with_the_connection_stops_the_host_with_a_message(stack, house):
    gen = gen_of(stack)
    with pytest.raises(OperationError, match="could not read the serving venv .*the connection dropped"):
        run(venv.environment, {venv_read.VenvState: lambda **kw: None}, FakeFs(dirs={CACHE}),
            gen=gen, stack=stack, sources=(venv_decide.Source("wheelhouse", str(house)),), host_cache=CACHE)


def test_two_kernels_owning_one_package_are_refused_when_both_stay(stack, house):
    gen = gen_of(stack)
    state = venv_facts(gen.path, sgl_kernel="0.3.1")
    state["shared"] = {"sgl_kernel": ["sgl-kernel", "sglang-kernel"]}
    # sgl-kernel is not in the stack: it is removed first, then nothing else overlaps.
    result = run_env(facts(gen, wanted=state), stack, house)
    assert [c for c in result.commands if isinstance(c, str)][0] == f"{UV('uninstall', gen.python)} sgl-kernel"

    both = Stack(stack.name, stack.python, (*stack.packages, Package("sgl-kernel", "0.3.1")), stack.path)
    with pytest.raises(OperationError, match=r"sgl_kernel/ is installed by both sgl-kernel and sglang-kernel"):
        run_env(facts(venv_read.generation(LIVE, both, {}), wanted=state), both, house)


def _with_cutlass(stack, house, *which) -> Stack:
    """`stack` plus libs-base and/or libs-cu13 4.5.2 in small (tests/unit/test_wheel_overlap.py): they share files."""
    files = {"nvidia-cutlass-dsl-libs-base": BASE, "nvidia-cutlass-dsl-libs-cu13": CU13}
    extra = [pin(make_wheel(house, name, "4.5.2", files[name]), name, "4.5.2") for name in which]
    return Stack(stack.name, stack.python, tuple(sorted((*stack.packages, *extra), key=lambda p: p.name)), stack.path)


def test_two_wheels_of_one_file_are_refused_before_anything_is_installed(stack, house):
    both = _with_cutlass(stack, house, "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-cu13")
    gen = gen_of(both)
    # A fresh generation: the venv holds neither yet, so its own `shared` is empty; the wheels' RECORDs say it.
    with pytest.raises(OperationError) as caught:
        run_env(facts(gen, wanted=None, live="absent"), both, house)
    message = str(caught.value)
    assert "nvidia_cutlass_dsl/ is installed by both nvidia-cutlass-dsl-libs-base 4.5.2 and nvidia-cutlass-dsl-libs-cu13 4.5.2" in message
    assert "2 file(s) are in both wheels, 1 of them differ (e.g. nvidia_cutlass_dsl/lib/libcute_dsl_runtime.so)" in message
    assert "read from their wheels' RECORD" in message and "nothing was installed" in message
    assert "drop the other from files/stacks/demo.yml" in message

    # One installed already and staying, the other to add: its wheel is compared with the staying one's pinned wheel.
    state = venv_facts(gen.path, **{"nvidia-cutlass-dsl-libs-base": "4.5.2"})
    with pytest.raises(OperationError, match="installed by both nvidia-cutlass-dsl-libs-base 4.5.2 and nvidia-cutlass-dsl-libs-cu13 4.5.2"):
        run_env(facts(gen, wanted=state), both, house)


def test_the_stack_with_one_of_them_builds(stack, house):
    one = _with_cutlass(stack, house, "nvidia-cutlass-dsl-libs-cu13")
    gen = gen_of(one)
    # cu13 to add beside an installed libs-base the stack no longer names: removed first, then nothing overlaps.
    state = venv_facts(gen.path, **{"nvidia-cutlass-dsl-libs-base": "4.5.2"})
    result = run_env(facts(gen, wanted=state), one, house)
    assert f"{UV('uninstall', gen.python)} nvidia-cutlass-dsl-libs-base" in result.commands
    assert any("nvidia_cutlass_dsl_libs_cu13-4.5.2" in c for c in installs(result))


def test_a_converged_venv_opens_no_wheel(stack, house, monkeypatch):
    both = _with_cutlass(stack, house, "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-cu13")
    gen = gen_of(both)
    state = venv_facts(gen.path, **{"nvidia-cutlass-dsl-libs-base": "4.5.2", "nvidia-cutlass-dsl-libs-cu13": "4.5.2"})
    monkeypatch.setattr(venv_decide.wheels, "wheel_files", lambda path: pytest.fail(f"{path} opened on the converged path"))
    result = run_env(facts(gen, wanted=state), both, house)
    assert result.commands == [] and len(result.noops) == 1


def test_a_donor_holding_both_is_refused_before_anything_is_copied(stack, house, monkeypatch):
    both = _with_cutlass(stack, house, "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-cu13")
    gen = gen_of(both)
    # Neither wheel in the wheelhouse: both would come from the donor, whose venv shows them owning one directory.
    for p in both.packages:
        if "cutlass" in p.name:
            (house / p.file).unlink()
    donor_state = venv_facts("/root/venv_sglang", **{"nvidia-cutlass-dsl-libs-base": "4.5.2", "nvidia-cutlass-dsl-libs-cu13": "4.5.2"})
    donor_state["shared"] = {"nvidia_cutlass_dsl": ["nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-cu13"]}
    sources = (venv_decide.Source("wheelhouse", str(house)), venv_decide.Source("donor", "gpu-old"))
    monkeypatch.setattr(venv_decide, "_donor_state", lambda source, verify="fast": donor_state)
    with pytest.raises(OperationError, match=r"nvidia_cutlass_dsl/ is installed by both nvidia-cutlass-dsl-libs-base and nvidia-cutlass-dsl-libs-cu13 \(as donor gpu-old's venv holds them\)"):
        run_env(facts(gen, wanted=None, live="absent"), both, house, sources=sources)


def test_a_file_in_no_source_fails_naming_the_file_and_every_source_tried(stack, house):
    gen = gen_of(stack)
    (house / WHEELS["torch"]).unlink()
    sources = (venv_decide.Source("wheelhouse", str(house)), venv_decide.Source("index", "https://example.invalid/simple"))
    no_hash = Stack(stack.name, stack.python, (*stack.packages[:2], Package("torch", "2.11.0+cu130", WHEELS["torch"])), stack.path)
    with pytest.raises(OperationError) as caught:
        run_env(facts(gen, wanted=venv_facts(gen.path, torch=None)), no_hash, house, sources=sources)
    message = str(caught.value)
    assert WHEELS["torch"] in message
    assert f"wheelhouse {house} (no such file)" in message and "index https://example.invalid/simple (needs a sha256 pin in the stack)" in message


def test_altered_wheel_fails_naming_both_hashes(stack, house):
    gen = gen_of(stack)
    wheel = house / WHEELS["torch"]
    wheel.write_bytes(b"altered")
    with pytest.raises(OperationError) as caught:
        run_env(facts(gen, wanted=venv_facts(gen.path, torch=None)), stack, house)
    assert f"{wheel} has sha256 {hashlib.sha256(b'altered').hexdigest()}, the stack pins {stack.packages[2].sha256}" in str(caught.value)


def test_index_source_installs_with_required_hashes(stack, house):
    gen = gen_of(stack)
    (house / WHEELS["torch"]).unlink()
    sources = (venv_decide.Source("wheelhouse", str(house)), venv_decide.Source("index", "http://10.0.0.1:8080/simple"))
    result = run_env(facts(gen, wanted=venv_facts(gen.path, torch=None)), stack, house, sources=sources)
    reqs = f"{CACHE}/requirements-{gen.id}.txt"
    assert any(f"torch==2.11.0+cu130 --hash=sha256:{stack.packages[2].sha256}" in c and reqs in c for c in result.commands if isinstance(c, str))
    assert installs(result) == [f"{UV('install', gen.python)} --no-deps --reinstall --require-hashes --index-url http://10.0.0.1:8080/simple -r {reqs}"]


def test_wanted_generation_with_another_python_is_refused(stack, house):
    gen = gen_of(stack)
    with pytest.raises(OperationError, match="holds Python 3.10.12, stack demo needs 3.11"):
        run_env(facts(gen, wanted=venv_facts(gen.path, python="3.10.12")), stack, house)


def test_live_venv_of_another_python_is_not_cloned(stack, house):
    gen = gen_of(stack)
    result = run_env(facts(gen, live_state=venv_facts(LIVE, python="3.10.12"), live="dir"), stack, house)
    assert "python3.11 -I -m venv" in result.commands[0] and "cp -a" not in result.commands[0]
    assert len(uploads(result)) == 3


# Switching -----------------------------------------------------------------------------------


def run_switch(was, stack) -> Result:
    return run(venv.switched, {}, gen=gen_of(stack), live_target=was)


def test_probe_runs_the_probe_script_with_the_generation_python_as_a_throwaway_user_in_the_sandbox(stack):
    """Issue 46 item 8: the probe imports the engine, so it runs as the preflight does: a transient unit, never root
    (DynamicUser: the service account is made after the environments), the services' protections, the generation
    bound read-only into an empty home, nothing of the caller's environment."""
    import shlex

    gen = gen_of(stack)
    (probe,) = run(venv_probe.probed, {}, gen=gen, probe={"kernels": ["sglang-kernel"]}).commands
    assert probe.startswith("cd / && probe_out=$(systemd-run --wait --pipe --collect ") and "ABI probe failed" in probe
    words = shlex.split(probe.split("<<'PYEOF'")[0])
    properties = [words[i + 1] for i, w in enumerate(words) if w == "-p"]
    assert properties[:2] == ["DynamicUser=yes", "ProtectHome=tmpfs"] and f"BindReadOnlyPaths={gen.path}" in properties
    assert not any(p.startswith("User=") for p in properties)
    argv = words[words.index("--") + 1:]
    from operations.environment import transient

    assert argv[:4] == ["/usr/bin/env", "-i", f"PATH={transient.SYSTEM_PATH}", "HOME=/tmp"]
    assert argv[-4:-1] == [gen.python, "-I", "-"] and '"kernels": ["sglang-kernel"]' in argv[-1]


def test_root_compiles_what_the_probe_imported_inside_the_generation_only(tmp_path):
    """The bytecode the service user cannot write beside the engine's sources is written by root after the probe,
    from the probe's list: only root's regular .py files inside the generation, never by importing them."""
    gen = tmp_path / "gen"
    (gen / "lib").mkdir(parents=True)
    (tmp_path / "elsewhere.py").write_text("x = 1\n")
    inside, writable = gen / "lib" / "engine.py", gen / "lib" / "shared.py"
    inside.write_text("raise SystemExit('IMPORTED')\n")  # compiling it runs nothing
    writable.write_text("y = 2\n")
    writable.chmod(0o666)
    (gen / "lib" / "link.py").symlink_to(tmp_path / "elsewhere.py")
    listed = [inside, writable, gen / "lib" / "link.py", tmp_path / "elsewhere.py", gen / "lib" / "missing.py"]
    ran = subprocess.run([sys.executable, "-I", "-S", "-c", venv_probe.COMPILE_IMPORTED, str(gen)], capture_output=True,
                         text=True, input="".join(f"{p}\n" for p in listed), timeout=60)
    assert ran.returncode == 0 and "IMPORTED" not in ran.stdout + ran.stderr, ran
    compiled = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.pyc"))
    assert compiled == [f"gen/lib/__pycache__/engine.{sys.implementation.cache_tag}.pyc"], compiled
    # Run again over a source edited in place with its mtime kept: the bytecode current for that mtime stays, as the
    # import system would keep it (the engine runs what it ran; the venv check finds the edit by its digest).
    pyc = tmp_path / compiled[0]
    before, stat = pyc.read_bytes(), inside.stat()
    inside.write_text("raise SystemExit('EDITED')\n")
    os.utime(inside, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    subprocess.run([sys.executable, "-I", "-S", "-c", venv_probe.COMPILE_IMPORTED, str(gen)], input=f"{inside}\n", text=True,
                   timeout=60, check=True)
    assert pyc.read_bytes() == before


def test_the_probe_line_passes_its_output_on_and_compiles_only_once_it_passed(tmp_path):
    """The whole line, with systemd-run replaced by a stand-in that runs its command: the probe's JSON and failure
    line reach the caller, its list of imports goes to root's compiler, and a failed probe compiles nothing."""
    gen = venv_read.Generation(live=str(tmp_path / "venv"), id="g1")
    gen_dir = Path(gen.path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(gen_dir)], check=True, timeout=120)
    site = next(gen_dir.glob("lib/python*/site-packages"))
    (site / "servedmod.py").write_text("VALUE = 1\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemd-run").write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done; shift; exec "$@"\n')
    (bin_dir / "systemd-run").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    good = subprocess.run(["sh", "-c", venv_probe.probe_command(gen, {"torch": False, "kernels": [], "modules": ["servedmod"]})],
                          capture_output=True, text=True, timeout=120, env=env)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout.strip())["python"] and venv_probe.IMPORTED_MARK not in good.stdout
    assert [p.name for p in site.rglob("*.pyc")] == [f"servedmod.{sys.implementation.cache_tag}.pyc"]
    for pyc in site.rglob("*.pyc"):
        pyc.unlink()
    bad = subprocess.run(["sh", "-c", venv_probe.probe_command(gen, {"torch": False, "kernels": [], "modules": ["nomod"]})],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 1 and bad.stderr.startswith("ABI probe failed: "), bad
    assert list(site.rglob("*.pyc")) == []


def test_switch_points_the_live_path_at_the_generation(stack):
    gen = gen_of(stack)
    result = run_switch(f"{LIVE}.generations/old", stack)
    (switch,) = result.commands
    assert switch.startswith(f"(cd / && exec python3 -I - {LIVE} {gen.id} <<'PYEOF'")
    assert any("switching from" in line and "kept for rollback" in line for line in result.logs)


def test_switch_when_already_live_is_a_noop(stack):
    gen = gen_of(stack)
    result = run_switch(gen.path, stack)
    assert result.commands == [] and result.noops == [f"{LIVE} is generation {gen.id}"]


# The host scripts, run here on real directories ------------------------------------------


def _remote(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-", *args], input=remote.script(name), capture_output=True, text=True)


def _fake_venv(root: Path, dists: dict[str, list[str]]) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(sys.executable)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    site = root / "lib/python3.11/site-packages"
    site.mkdir(parents=True)
    for name, files in dists.items():
        info = site / f"{name.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n\nbody\n")
        (info / "INSTALLER").write_text("uv\n")
        rows = []
        for rel in files:
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_text(f"{name} {rel}\n")
            rows.append(f"{rel},sha256=x,{len(f'{name} {rel}') + 1}")
        (info / "RECORD").write_text("\n".join(rows + [f"{info.name}/RECORD,,"]) + "\n")
    return root


def test_state_script_finds_deleted_files_and_shared_packages(tmp_path):
    gens = tmp_path / "venv.generations"
    wanted = _fake_venv(gens / "g1", {"torch": ["torch/__init__.py", "torch/_C.so"], "sgl-kernel": ["sgl_kernel/__init__.py"], "sglang-kernel": ["sgl_kernel/__init__.py"]})
    (wanted / "lib/python3.11/site-packages/torch/_C.so").unlink()
    (tmp_path / "venv").symlink_to(wanted)
    out = json.loads(_remote("venv_state", str(tmp_path / "venv"), str(wanted), str(tmp_path / "cache"), "/nonexistent/uv").stdout)

    assert out["live"] == {"kind": "link", "target": str(wanted)}
    assert out["live_state"] is None  # the live generation is the wanted one
    torch = out["wanted"]["dists"]["torch"]
    assert (torch["version"], torch["installer"], torch["damaged"]) == ("1.0", "uv", ["torch/_C.so"])
    assert out["wanted"]["shared"] == {"sgl_kernel": ["sgl-kernel", "sglang-kernel"]}
    assert out["uv"] is False and out["cache"] == {}


def test_switch_script_replaces_a_plain_venv_and_keeps_one_previous_generation(tmp_path):
    live = tmp_path / "venv"
    _fake_venv(live, {"torch": ["torch/__init__.py"]})
    gens = Path(f"{live}.generations")
    for name in ("g1", "g3"):
        _fake_venv(gens / name, {})

    first = _remote("venv_switch", str(live), "g1")
    assert first.returncode == 0, first.stderr
    state = json.loads(first.stdout)
    assert live.is_symlink() and live.resolve() == gens / "g1"
    legacy = state["previous"]
    assert legacy.startswith("legacy-") and (gens / legacy / "lib/python3.11/site-packages/torch/__init__.py").is_file()
    assert not (gens / "g3").exists()  # neither live nor previous: pruned

    _fake_venv(gens / "g2", {})

    assert _remote("venv_switch", str(live), "g2").returncode == 0
    assert live.resolve() == gens / "g2"
    assert sorted(p.name for p in gens.iterdir()) == ["g1", "g2", "state.json"]  # the legacy venv pruned
    assert json.loads((gens / "state.json").read_text())["previous"] == "g1"
    # Rolling back is switching to the previous generation.
    assert _remote("venv_switch", str(live), "g1").returncode == 0
    assert live.resolve() == gens / "g1" and json.loads((gens / "state.json").read_text())["previous"] == "g2"
    missing = _remote("venv_switch", str(live), "nope")
    assert missing.returncode != 0 and "does not exist" in missing.stderr


def test_switch_script_keeps_a_generation_a_unit_of_ours_still_runs(tmp_path):
    """A replica kept on its old version (its rollout held) runs the generation its unit names: the switch that
    makes a newer one live prunes every other, never that one."""
    live, units = tmp_path / "venv", tmp_path / "units"
    gens = Path(f"{live}.generations")
    for name in ("g1", "g2", "g3"):
        _fake_venv(gens / name, {})
    units.mkdir()
    (units / "sglang-held.service").write_text(f"[Service]\nExecStart={gens}/g1/bin/python -m sglang.launch_server \\\n"
                                               "    --port 30000\n")
    (units / "other.service").write_text(f"ExecStart={gens}/g2/bin/python\n")  # not ours: it keeps nothing
    script = remote.script("venv_switch").replace('UNIT_DIR = "/etc/systemd/system"', f'UNIT_DIR = "{units}"')
    for wanted in ("g3", "g3"):  # the second switch finds g3 live and no previous: only the unit keeps g1
        done = subprocess.run([sys.executable, "-", str(live), wanted], input=script, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in gens.iterdir()) == ["g1", "g3", "state.json"]
    (units / "sglang-held.service").unlink()
    subprocess.run([sys.executable, "-", str(live), "g3"], input=script, check=True, capture_output=True, text=True)
    assert sorted(p.name for p in gens.iterdir()) == ["g3", "state.json"]


def test_clone_command_rewrites_scripts_without_touching_the_source(tmp_path):
    source = tmp_path / "venv.generations" / "old"
    _fake_venv(source, {"torch": ["torch/__init__.py"]})
    script = source / "bin" / "torchrun"
    script.write_text(f"#!{source}/bin/python\nimport torch\n")
    gen = venv_read.Generation(str(tmp_path / "venv"), "new")
    result = subprocess.run(["bash", "-c", venv_copy.clone_command(str(source), gen, [str(source)])], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    clone = Path(gen.path)
    assert (clone / "bin/torchrun").read_text().startswith(f"#!{clone}/bin/python\n")
    assert script.read_text().startswith(f"#!{source}/bin/python\n")  # the live one is untouched
    site = "lib/python3.11/site-packages/torch/__init__.py"
    # A copy of its own: an edit in one generation never reaches the other.
    assert (clone / site).stat().st_ino != (source / site).stat().st_ino and (clone / site).stat().st_nlink == 1
    assert not list(Path(gen.path).parent.glob("new.partial*"))
    # An attempt that finds the generation already complete (a killed run's copy finished first) leaves it.
    again = subprocess.run(["bash", "-c", venv_copy.clone_command(str(source), gen, [str(source)])], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert not list(Path(gen.path).parent.glob("new.partial*")) and (clone / site).is_file()
    assert shlex.split(venv_copy.clone_command(str(source), gen, [str(source)]))[0] == "mkdir"


def test_a_missing_file_stops_the_host_before_the_first_command(stack, house):
    """Building beside the live venv would change the host: the sources are resolved before anything is yielded."""
    from types import SimpleNamespace

    gen = gen_of(stack)
    (house / WHEELS["torch"]).unlink()
    yielded = []

    def recording(**kwargs):
        for command in venv.environment._inner(**kwargs):
            yielded.append(command)
            yield command

    fact = facts(gen, live_state=venv_facts(f"{LIVE}.generations/old", torch="2.10.0+cu130"))
    with pytest.raises(OperationError, match=WHEELS["torch"].replace("+", r"\+")):
        run(SimpleNamespace(_inner=recording), {venv_read.VenvState: lambda **kw: copy.deepcopy(fact)}, FakeFs(dirs={CACHE}),
            gen=gen, stack=stack, sources=(venv_decide.Source("wheelhouse", str(house)),), host_cache=CACHE, installer="auto")
    assert yielded == []


def _recorded_venv(root: Path, files: dict[str, bytes]) -> Path:
    """A venv with one distribution `demo` whose RECORD carries each file's real sha256 and size."""
    import base64

    _fake_venv(root, {})
    site = root / "lib/python3.11/site-packages"
    info = site / "demo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n\nbody\n")
    rows = []
    for rel, data in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{rel},sha256={digest},{len(data)}")
    (info / "RECORD").write_text("\n".join(rows + ["demo-1.0.dist-info/RECORD,,"]) + "\n")
    return site


def _venv_state(root: Path, mode: str, workers: str = "1") -> dict:
    out = subprocess.run([sys.executable, "-", str(root), str(root), "/nonexistent", "/nonexistent/uv", mode],
                         input=remote.script("venv_state"), capture_output=True, text=True,
                         env={**os.environ, "SGLANG_DEPLOY_STAT_WORKERS": workers})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _state(root: Path, mode: str) -> dict:
    """The script's answer for `root`, the same whether its files are stat'ed here or by forked workers
    (a GPU host's many CPUs split the pass; SGLANG_DEPLOY_STAT_WORKERS forces either way here), and whether
    its RECORDs are read or their index is (written here for the second pair of answers, removed after)."""
    index = root / INDEX
    index.unlink(missing_ok=True)
    answers = [_venv_state(root, mode, workers)["wanted"] for workers in ("1", "3")]
    assert _venv_state(root, "write-index") == {"written": True, "why": ""}
    answers += [_venv_state(root, mode, workers)["wanted"] for workers in ("1", "3")]
    index.unlink()
    used = [answer.pop("index") for answer in answers]
    assert used == (["missing"] * 2 + ["used"] * 2 if mode == "fast" else ["not used"] * 4)
    assert answers[0] == answers[1], "the stat pass split among workers answers otherwise than one pass"
    assert answers[0] == answers[2] == answers[3], "read from the index, the answer differs from the RECORDs'"
    return answers[0]


INDEX = ".sglang-deploy/record-index.json"


def test_state_script_fast_hashes_only_files_modified_after_the_install_stamp_full_hashes_all(tmp_path):
    import os

    root = tmp_path / "g"
    site = _recorded_venv(root, {"demo/a.py": b"alpha\n", "demo/b.py": b"bravo\n", "demo/c.py": b"charlie\n", "../../../bin/demo": b"#!python\n"})
    (root / ".sglang-deploy").mkdir()
    stamp = root / venv.STAMP
    stamp.write_text("")
    old = stamp.stat().st_mtime_ns - 10**9
    for rel in ("demo/a.py", "demo/b.py", "demo/c.py"):
        os.utime(site / rel, ns=(old, old))
    assert _state(root, "fast")["dists"]["demo"]["damaged_count"] == 0
    assert _state(root, "fast")["checked"] == "size, mtime" and _state(root, "full")["checked"] == "sha256"

    (site / "demo/a.py").write_bytes(b"alphA\n")  # same size, mtime now: after the stamp
    (site / "demo/b.py").write_bytes(b"brAvo\n")
    os.utime(site / "demo/b.py", ns=(old, old))  # same size, mtime put back: only a full check sees it
    os.utime(site / "demo/c.py")  # touched, content unchanged: hashed, not damaged
    (root / "bin/demo").write_bytes(b"#!/other/python\n")  # a rewritten script: presence only
    fast = _state(root, "fast")
    assert fast["dists"]["demo"]["damaged"] == ["demo/a.py"] and fast["hashed"] == 2
    assert sorted(_state(root, "full")["dists"]["demo"]["damaged"]) == ["demo/a.py", "demo/b.py"]

    # Without the deploy's stamp (a venv it did not build) fast compares sizes only, and says so.
    stamp.unlink()
    unstamped = _state(root, "fast")
    assert unstamped["checked"] == "size" and unstamped["dists"]["demo"]["damaged_count"] == 0


def test_state_script_reports_files_sharing_an_inode_and_leaves_patched_files_to_their_patch_set(tmp_path):
    import os

    root = tmp_path / "g"
    site = _recorded_venv(root, {"demo/a.py": b"alpha\n", "demo/p.py": b"patched\n"})
    os.link(site / "demo/a.py", tmp_path / "cache-copy")  # what uv's hardlink mode leaves
    patches_dir = root / ".sglang-deploy/patches/x"
    patches_dir.mkdir(parents=True)
    (patches_dir / "applied.json").write_text(json.dumps({"files": {"demo/p.py": "sha"}}))
    (site / "demo/p.py").write_bytes(b"patched by the patch set, another size\n")
    state = _state(root, "full")["dists"]["demo"]
    assert (state["linked"], state["linked_count"]) == (["demo/a.py"], 1)
    assert state["damaged_count"] == 0


def test_state_script_sees_every_kind_of_damage_through_its_per_directory_stat_pass(tmp_path):
    """Files are stat'ed relative to their directory, in one pass: a directory gone, a file turned into a
    symlink, an unnormalised RECORD path, a missing script outside site-packages, and a file that two wheels
    ship (right when it matches either) all read as a per-file lstat would read them."""
    import os
    import shutil

    root = tmp_path / "g"
    site = _recorded_venv(root, {
        "demo/__init__.py": b"init\n", "demo/sub/x.py": b"x\n", "demo/sub/y.py": b"y\n", "demo/link.py": b"target\n",
        "demo/./dotted.py": b"dotted\n", "../../../bin/demo-tool": b"#!python\n", "shared_top.py": b"mine\n",
    })
    other = site / "other-1.0.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: other\nVersion: 1.0\n\nbody\n")
    # `other` ships shared_top.py too, a longer copy; the one on disk is demo's: right for demo.
    (other / "RECORD").write_text("shared_top.py,sha256=x,99\nother-1.0.dist-info/RECORD,,\n")
    assert _state(root, "fast")["dists"]["demo"]["damaged_count"] == 0

    shutil.rmtree(site / "demo/sub")  # a whole directory gone
    (site / "demo/link.py").unlink()
    (site / "demo/link.py").symlink_to("/etc/hostname")  # another kind of file, another size
    (root / "bin/demo-tool").unlink()
    state = _state(root, "fast")
    demo = state["dists"]["demo"]
    assert demo["damaged_count"] == 4
    assert sorted(demo["damaged"]) == sorted(["demo/sub/x.py", "demo/sub/y.py", "demo/link.py", "../../../bin/demo-tool"])
    # shared_top.py matches demo's RECORD; for `other` it has another size but matches a claimant: not damaged.
    assert state["dists"]["other"]["damaged_count"] == 0
    assert state["shared"] == {}  # a loose top-level file two wheels ship is no package conflict
    os.unlink(site / "demo/./dotted.py")
    assert "demo/./dotted.py" in _state(root, "fast")["dists"]["demo"]["damaged"]


@pytest.mark.parametrize("workers", ["2", "3", "7"])
def test_a_stat_pass_split_among_workers_sees_each_damaged_file_wherever_the_split_falls(tmp_path, monkeypatch, workers):
    """Rows split in runs among workers: a damaged file first or last in a run, or in a directory two runs
    share, is seen exactly as one pass sees it (every file of three distributions, damage in each)."""
    import random

    root = tmp_path / "g"
    _fake_venv(root, {})
    site = root / "lib/python3.11/site-packages"
    files = {}
    for dist in ("alpha", "beta", "gamma"):
        info = site / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n\nbody\n")
        rows = []
        for n in range(23):
            rel = f"{dist}/d{n % 4}/f{n}.py" if n % 5 else f"shared_dir/{dist}_{n}.py"  # shared_dir: three wheels' files
            data = f"{dist} {n}\n".encode()
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_bytes(data)
            rows.append(f"{rel},sha256=unchecked,{len(data)}")
            files[rel] = dist
        (info / "RECORD").write_text("\n".join(rows) + "\n")  # no RECORD row: a dist's last row is one of its files
    rels = list(files)
    rng = random.Random(int(workers))
    damaged = set(rng.sample(rels, 9)) | {rels[0], rels[-1], rels[len(rels) // 2]}
    for rel in sorted(damaged):
        if rng.random() < 0.5:
            (site / rel).unlink()
        else:
            (site / rel).write_bytes(b"another size\n")
    monkeypatch.setenv("SGLANG_DEPLOY_STAT_WORKERS", workers)
    out = _remote("venv_state", str(root), str(root), "/nonexistent", "/nonexistent/uv", "fast")
    assert out.returncode == 0, out.stderr
    state = json.loads(out.stdout)["wanted"]
    expected = {dist: sum(files[rel] == dist for rel in damaged) for dist in ("alpha", "beta", "gamma")}
    assert {name: dist["damaged_count"] for name, dist in state["dists"].items()} == expected
    assert {rel for dist in state["dists"].values() for rel in dist["damaged"]} <= damaged  # (the first 5 of each)
    assert state.pop("index") == "missing"
    assert state == _state(root, "fast")  # and the same answer as one pass


# The RECORD index -------------------------------------------------------------------------------


def _two_dist_venv(root: Path) -> Path:
    """A venv of `demo` (real sizes and hashes) and `other`, stamped, its files older than the stamp."""
    site = _recorded_venv(root, {"demo/a.py": b"alpha\n", "demo/b.py": b"bravo\n", "shared.py": b"mine\n"})
    other = site / "other-1.0.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: other\nVersion: 1.0\n\nbody\n")
    (other / "INSTALLER").write_text("uv\n")
    (site / "other").mkdir()
    (site / "other/o.py").write_bytes(b"other\n")
    (other / "RECORD").write_text("other/o.py,sha256=x,6\nshared.py,sha256=y,5\nother-1.0.dist-info/RECORD,,\n")
    (root / ".sglang-deploy").mkdir(exist_ok=True)
    (root / venv.STAMP).write_text("")
    return site


def _keep_mtime(path: Path, change) -> None:
    """`change(path)`, then its mtime put back: what a fast check of the files would not see."""
    before = path.stat()
    change(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _edit_record(path: Path) -> None:
    # Same length: demo/a.py's size in RECORD becomes 7 (it is 6 on disk): a damaged file, once RECORD is read.
    path.write_text(path.read_text().replace(",6\n", ",7\n", 1))


STALE = {
    "a RECORD edited, its mtime put back": lambda site: _keep_mtime(site / "demo-1.0.dist-info/RECORD", _edit_record),
    "a version changed in METADATA, its mtime put back": lambda site: _keep_mtime(
        site / "demo-1.0.dist-info/METADATA", lambda p: p.write_text(p.read_text().replace("Version: 1.0", "Version: 9.0"))),
    "an INSTALLER removed": lambda site: (site / "other-1.0.dist-info/INSTALLER").unlink(),
    "an INSTALLER replaced by another file of the same text": lambda site: (
        (site / "other-1.0.dist-info/INSTALLER.new").write_text("uv\n"),
        os.replace(site / "other-1.0.dist-info/INSTALLER.new", site / "other-1.0.dist-info/INSTALLER")),
    "a distribution added": lambda site: (
        (site / "late-2.0.dist-info").mkdir(),
        (site / "late-2.0.dist-info/METADATA").write_text("Name: late\nVersion: 2.0\n\n"),
        (site / "late-2.0.dist-info/RECORD").write_text("late.py,sha256=z,3\n")),
    "a distribution's .dist-info removed": lambda site: __import__("shutil").rmtree(site / "other-1.0.dist-info"),
    "the index cut short": lambda site: (site.parents[2] / INDEX).write_text(
        (site.parents[2] / INDEX).read_text()[:100]),
    "the index of another format": lambda site: (site.parents[2] / INDEX).write_text(
        json.dumps({**json.loads((site.parents[2] / INDEX).read_text()), "format": 0})),
    "the index's columns disagree": lambda site: (site.parents[2] / INDEX).write_text(
        json.dumps({**json.loads((site.parents[2] / INDEX).read_text()), "sizes": ["1"]})),
}


@pytest.mark.parametrize("change", list(STALE), ids=list(STALE))
def test_an_index_no_longer_matching_its_dist_info_files_is_not_used_and_the_answer_is_the_records(tmp_path, change):
    """Any change to what the listing is read from (a .dist-info file written, replaced, added or removed, even with
    its mtime put back), or an index that cannot be read, makes the fast check read the RECORDs again: its answer
    is then exactly that of a check with no index."""
    root = tmp_path / "g"
    site = _two_dist_venv(root)
    assert _venv_state(root, "write-index") == {"written": True, "why": ""}
    assert _venv_state(root, "fast")["wanted"]["index"] == "used"
    STALE[change](site)
    answers = [_venv_state(root, "fast", workers)["wanted"] for workers in ("1", "3")]
    assert [answer.pop("index") for answer in answers] == ["stale", "stale"]
    (root / INDEX).unlink()
    unindexed = _venv_state(root, "fast")["wanted"]
    assert unindexed.pop("index") == "missing"
    assert answers[0] == answers[1] == unindexed
    if change.startswith("a RECORD"):
        assert unindexed["dists"]["demo"]["damaged"] == ["demo/a.py"]  # what the edited RECORD says now
    if change.startswith("a version"):
        assert unindexed["dists"]["demo"]["version"] == "9.0"


def test_an_index_copied_with_its_generation_is_stale_there(tmp_path):
    """A new generation starts as a copy of the live one (`cp -a`): the copy's index names other files."""
    root = tmp_path / "g1"
    _two_dist_venv(root)
    assert _venv_state(root, "write-index")["written"] is True
    copy_root = tmp_path / "g2"
    subprocess.run(["cp", "-a", str(root), str(copy_root)], check=True)
    assert _venv_state(copy_root, "fast")["wanted"]["index"] == "stale"
    assert _venv_state(root, "fast")["wanted"]["index"] == "used"


def test_files_damaged_after_the_index_was_written_are_found_through_it(tmp_path):
    """The index lists what each RECORD says, not the state of the files: damage done after it is seen."""
    root = tmp_path / "g"
    site = _two_dist_venv(root)
    assert _venv_state(root, "write-index")["written"] is True
    (site / "demo/a.py").unlink()
    (site / "other/o.py").write_bytes(b"longer than before\n")
    state = _venv_state(root, "fast")["wanted"]
    assert state["index"] == "used"
    assert (state["dists"]["demo"]["damaged"], state["dists"]["other"]["damaged"]) == (["demo/a.py"], ["other/o.py"])


def test_a_record_with_quotes_answers_the_same_through_its_index(tmp_path):
    """A RECORD with quoted fields (a path with a comma; one quoting a line break, which read_record reads as the
    lines it splits into) is indexed exactly as it is read."""
    root = tmp_path / "g"
    site = _two_dist_venv(root)
    (site / "odd,name.py").write_bytes(b"odd\n")
    record = site / "other-1.0.dist-info/RECORD"
    record.write_text(record.read_text() + '"odd,name.py",sha256=q,4\n"odd\nbreak.py",sha256=r,5\n')
    state = _state(root, "fast")["dists"]["other"]
    assert "odd,name.py" in state["damaged"]  # read whole (written after the stamp, and not the hash RECORD gives)


def test_the_index_is_written_after_each_install_and_before_the_stamp(stack, house):
    gen = gen_of(stack)
    result = run_env(facts(gen, wanted=venv_facts(gen.path, torch="2.10.0+cu130")), stack, house)
    index_write, stamp = result.commands[-2:]
    assert index_write.startswith(f"(cd / && exec python3 -I - {LIVE} {gen.path} {CACHE} ") and " write-index <<'PYEOF'" in index_write
    assert stamp.endswith(f"touch {gen.path}/{venv.STAMP}")


def _record_index(fact) -> Result:
    stack_gen = venv_read.Generation(LIVE, "demo-0000000000")
    return run(venv.record_index, {venv_read.VenvState: lambda **kw: copy.deepcopy(fact)}, FakeFs(dirs={CACHE}),
               gen=stack_gen, host_cache=CACHE)


@pytest.mark.parametrize("index, writes", [("missing", True), ("stale", True), ("used", False), ("not used", False)])
def test_the_index_operation_writes_an_index_only_where_the_check_found_none_it_could_use(index, writes):
    """Written where missing or stale; never where used, or where a full check did not look at it."""
    gen_path = f"{LIVE}.generations/demo-0000000000"
    fact = facts(venv_read.Generation(LIVE, "demo-0000000000"), wanted={**venv_facts(gen_path), "index": index})
    result = _record_index(fact)
    assert bool(result.commands) is writes
    if writes:
        assert len(result.commands) == 1 and " write-index <<'PYEOF'" in result.commands[0]
        assert any(f"its RECORD index is {index}" in line for line in result.logs)


def test_the_index_operation_leaves_a_host_without_the_generation_alone():
    assert _record_index(facts(venv_read.Generation(LIVE, "demo-0000000000"), wanted=None, live="absent")).commands == []


def test_a_venv_without_site_packages_asks_for_no_index(tmp_path):
    """Nothing to index: a check must not ask for one, which the deploy would then try to write on every run."""
    root = tmp_path / "g"
    root.mkdir()
    (root / "pyvenv.cfg").write_text("version = 3.11.7\n")
    assert _venv_state(root, "fast")["wanted"]["index"] == "not used"
    assert _venv_state(root, "write-index") == {"written": False, "why": "no site-packages"}


def test_a_donor_is_read_at_its_path_else_at_its_hosts_validated_venv_path():
    """deploys/environments.py gives a donor named without `path` its host's validated `venv_path` (HostConfig.peer_venvs)."""
    assert venv_decide.donor_path(venv_decide.Source("donor", "gpu-old", live_venv="/srv/venv")) == "/srv/venv"
    assert venv_decide.donor_path(venv_decide.Source("donor", "gpu-old", "/opt/v", live_venv="/srv/venv")) == "/opt/v"
    assert str(venv_decide.Source("donor", "gpu-old", live_venv="/srv/venv")) == "donor gpu-old"
