"""The lab's stand-in kernel (lab/standin_kernel): deterministic wheels, and its import under a matching or another torch.

No network: a tiny fake `torch` module stands in for torch (only `__version__` and `version.cuda` are read).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_build():
    spec = importlib.util.spec_from_file_location("standin_kernel_build", ROOT / "lab" / "standin_kernel" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build = _load_build()
UNDEFINED = "common_ops.abi3.so: undefined symbol: _ZN3c1017RegisterOperatorsD1Ev"


def _site(tmp_path: Path, version: str, torch_version: str) -> Path:
    """A directory holding the unpacked wheel (package and dist-info, as installed) and a fake torch."""
    site = tmp_path / "site"
    with zipfile.ZipFile(build.build_wheel(tmp_path / "out", version)) as wheel:
        wheel.extractall(site)
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(f"__version__ = {torch_version!r}\nfrom torch import version\n")
    (site / "torch" / "version.py").write_text("cuda = None\n")
    info = site / f"torch-{torch_version}.dist-info"  # what the ABI probe reads torch's version from
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_version}\n")
    return site


def _python(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-s", *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("version", sorted(build.VERSIONS))
def test_the_wheel_is_deterministic_and_holds_the_package_and_its_placeholder(tmp_path, version):
    first = build.build_wheel(tmp_path / "a", version)
    again = build.build_wheel(tmp_path / "b", version)
    assert first.name == f"sglang_kernel-{version}-py3-none-any.whl"
    assert first.read_bytes() == again.read_bytes()
    with zipfile.ZipFile(first) as wheel:
        names = wheel.namelist()
        assert {"sgl_kernel/__init__.py", "sgl_kernel/_build_info.py", "sgl_kernel/common_ops.abi3.so"} <= set(names)
        so = wheel.read("sgl_kernel/common_ops.abi3.so")
        assert not so.startswith(b"\x7fELF") and b"stand-in" in so
        assert f'TORCH_BUILT_AGAINST = "{build.VERSIONS[version]}"' in wheel.read("sgl_kernel/_build_info.py").decode()
        assert wheel.read(f"sglang_kernel-{version}.dist-info/top_level.txt") == b"sgl_kernel\n"
        record = wheel.read(f"sglang_kernel-{version}.dist-info/RECORD").decode()
        assert "sgl_kernel/common_ops.abi3.so,sha256=" in record


def test_the_builds_and_their_torch():
    assert build.VERSIONS == {"0.4.10+cpu": "2.13.0", "0.4.11+cpu": "2.13.0", "0.4.9+cpu": "2.12.0"}
    with pytest.raises(ValueError, match="no stand-in sglang-kernel 0.1"):
        build.wheel_entries("0.1")


def test_it_imports_under_the_torch_it_was_built_against(tmp_path):
    site = _site(tmp_path, "0.4.10+cpu", "2.13.0+cpu")
    out = _python(site, "-c", "import sgl_kernel; print(sgl_kernel.__version__, sgl_kernel.TORCH_BUILT_AGAINST)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0.4.10+cpu", "2.13.0"]


def test_ops_are_missing_attributes_so_from_imports_fail_as_import_errors(tmp_path):
    site = _site(tmp_path, "0.4.10+cpu", "2.13.0+cpu")
    code = (
        "import sgl_kernel\n"
        "print(hasattr(sgl_kernel, 'rmsnorm'))\n"
        "try:\n    from sgl_kernel import rmsnorm\nexcept ImportError as exc:\n    print('ImportError', exc)\n"
        "try:\n    sgl_kernel.rmsnorm\nexcept AttributeError as exc:\n    print(exc)\n"
    )
    out = _python(site, "-c", code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "False" and lines[1].startswith("ImportError cannot import name 'rmsnorm'")
    assert "stand-in sglang-kernel 0.4.10+cpu (built against torch 2.13.0), which has no compiled ops" in lines[2]


def test_under_another_torch_it_fails_like_a_kernel_built_against_another_libtorch(tmp_path):
    site = _site(tmp_path, "0.4.9+cpu", "2.13.0+cpu")
    out = _python(site, "-c", "import sgl_kernel")
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last == f"ImportError: {site.resolve() / 'sgl_kernel' / UNDEFINED}"


def test_the_abi_probe_names_the_mismatched_kernel_in_one_line(tmp_path):
    site = _site(tmp_path, "0.4.9+cpu", "2.13.0+cpu")
    probe = ROOT / "operations" / "environment" / "on_host" / "abi_probe.py"
    out = _python(site, str(probe), json.dumps({"kernels": ["sglang-kernel"], "modules": []}))
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "ABI probe failed: sglang-kernel 0.4.9+cpu (common_ops.abi3.so) was built against another torch than torch "
        "2.13.0+cpu: undefined symbol _ZN3c1017RegisterOperatorsD1Ev; install the sglang-kernel build made for torch "
        "2.13.0+cpu (one stack, one ABI set)"
    ]


def test_the_abi_probe_passes_the_matching_kernel(tmp_path):
    site = _site(tmp_path, "0.4.10+cpu", "2.13.0+cpu")
    probe = ROOT / "operations" / "environment" / "on_host" / "abi_probe.py"
    out = _python(site, str(probe), json.dumps({"kernels": ["sglang-kernel"], "modules": []}))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["sglang-kernel"] == "0.4.10+cpu"
